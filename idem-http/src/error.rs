//! The error of an HTTP call, classified and fit for operators.

use std::fmt;
use std::time::SystemTime;

use idem_runtime::{Classify, Failure};
use reqwest::header::HeaderMap;
use reqwest::{Method, Response, StatusCode};

use crate::headers::is_replayed;
use crate::redact::{excerpt, redact_url, BODY_EXCERPT_LIMIT};
use crate::status::classify_status_at;
use crate::transport::{classify_error, kind_of};

/// A failed HTTP call: the provider answered with a status that is not a
/// success, or the request failed on the way.
///
/// It implements [`Classify`] (decided when the error is made, so that a
/// `Retry-After` is measured from when the response arrived), and carries
/// what an operator needs to see in an escalation: the method, the URL with
/// credentials and query values removed, the status, and at most
/// [`BODY_EXCERPT_LIMIT`] bytes of the body. Its `Display` is one line:
///
/// ```text
/// POST http://127.0.0.1:4242/v1/charges?customer=…: 402 Payment Required: {"error":"card_declined"}
/// POST http://127.0.0.1:4242/v1/charges: connect error: Connection refused (os error 111)
/// ```
///
/// Use it as a tool's error type, or wrap it in your own (delegating
/// `classify`); `?` converts a [`reqwest::Error`] (from reading or decoding a
/// body, say) into it.
pub struct HttpError {
    method: Option<Method>,
    url: Option<String>,
    failure: Failure,
    what: What,
}

enum What {
    Status {
        status: StatusCode,
        headers: HeaderMap,
        excerpt: String,
        replayed: bool,
    },
    Transport(reqwest::Error),
}

impl HttpError {
    /// The error for a response whose status the caller does not accept:
    /// reads at most [`BODY_EXCERPT_LIMIT`] bytes of its body for the
    /// message, and classifies with [`crate::classify_status`]. `keyed`
    /// says whether the request carried an `Idempotency-Key`.
    pub async fn from_response(method: Method, response: Response, keyed: bool) -> HttpError {
        let arrived = SystemTime::now();
        let status = response.status();
        let url = redact_url(response.url());
        let headers = response.headers().clone();
        let failure = classify_status_at(status, &headers, keyed, arrived);
        let replayed = is_replayed(&headers);
        let excerpt = read_excerpt(response).await;
        HttpError {
            method: Some(method),
            url: Some(url),
            failure,
            what: What::Status {
                status,
                headers,
                excerpt,
                replayed,
            },
        }
    }

    /// The error for a request that failed on the way, classified with
    /// [`crate::classify_error`].
    pub fn from_reqwest(method: Option<Method>, err: reqwest::Error) -> HttpError {
        let url = err.url().map(redact_url);
        Self::transport(method, url, err)
    }

    /// As [`from_reqwest`](Self::from_reqwest), for a request whose URL is
    /// known (already redacted) even if the error does not carry it.
    pub(crate) fn transport(
        method: Option<Method>,
        url: Option<String>,
        err: reqwest::Error,
    ) -> HttpError {
        // The full URL, query values included, would reach messages through
        // reqwest's own Display: keep only the redacted one.
        let err = err.without_url();
        HttpError {
            method,
            url,
            failure: classify_error(&err),
            what: What::Transport(err),
        }
    }

    /// The request's method, when known (a [`reqwest::Error`] converted with
    /// `?` does not say).
    pub fn method(&self) -> Option<&Method> {
        self.method.as_ref()
    }

    /// The request's URL without user name, password, fragment or query
    /// values, when known.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// The status the provider answered, when it answered.
    pub fn status(&self) -> Option<StatusCode> {
        match &self.what {
            What::Status { status, .. } => Some(*status),
            What::Transport(e) => e.status(),
        }
    }

    /// The response's headers (e.g. the provider's request id), when it
    /// answered.
    pub fn headers(&self) -> Option<&HeaderMap> {
        match &self.what {
            What::Status { headers, .. } => Some(headers),
            What::Transport(_) => None,
        }
    }

    /// The start of the response body (one line, at most
    /// [`BODY_EXCERPT_LIMIT`] bytes, `…` when cut), when it answered.
    pub fn body_excerpt(&self) -> Option<&str> {
        match &self.what {
            What::Status { excerpt, .. } => Some(excerpt),
            What::Transport(_) => None,
        }
    }

    /// Whether the provider said this answer is a replay of an earlier one
    /// (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        matches!(&self.what, What::Status { replayed: true, .. })
    }

    /// The underlying reqwest error, for a request that failed on the way.
    pub fn reqwest_error(&self) -> Option<&reqwest::Error> {
        match &self.what {
            What::Status { .. } => None,
            What::Transport(e) => Some(e),
        }
    }
}

/// Reads the start of an error body; a body that fails midway keeps what
/// arrived (the status already decided the classification).
async fn read_excerpt(mut response: Response) -> String {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = BODY_EXCERPT_LIMIT + 1 - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() > BODY_EXCERPT_LIMIT {
                    // Enough to show and to know it was cut; the rest is
                    // not read (the connection is then not reused).
                    return excerpt(&body, true);
                }
            }
            Ok(None) => return excerpt(&body, true),
            Err(_) => return excerpt(&body, false),
        }
    }
}

// Not offered as an alternative in "does not implement Classify" errors on
// a user's own type: whether idem::http is linked must not change what
// rustc tells them about their type (nor the #[tool] compile-fail tests).
#[diagnostic::do_not_recommend]
impl Classify for HttpError {
    fn classify(&self) -> Failure {
        self.failure
    }
}

impl From<reqwest::Error> for HttpError {
    fn from(err: reqwest::Error) -> Self {
        HttpError::from_reqwest(None, err)
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.method, &self.url) {
            (Some(m), Some(u)) => write!(f, "{m} {u}: ")?,
            (None, Some(u)) => write!(f, "{u}: ")?,
            (Some(m), None) => write!(f, "{m}: ")?,
            (None, None) => {}
        }
        match &self.what {
            What::Status {
                status, excerpt, ..
            } => {
                write!(f, "{status}")?;
                if !excerpt.is_empty() {
                    write!(f, ": {excerpt}")?;
                }
                Ok(())
            }
            What::Transport(err) => {
                f.write_str(kind_of(err))?;
                // reqwest's own text is a generic wrapper ("error sending
                // request"); the innermost cause says what happened.
                let mut innermost = None;
                let mut next = std::error::Error::source(err);
                while let Some(cause) = next {
                    innermost = Some(cause);
                    next = cause.source();
                }
                match innermost {
                    Some(cause) => write!(f, ": {cause}"),
                    None => write!(f, ": {err}"),
                }
            }
        }
    }
}

impl fmt::Debug for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("HttpError");
        d.field("method", &self.method)
            .field("url", &self.url)
            .field("failure", &self.failure);
        match &self.what {
            What::Status {
                status,
                excerpt,
                replayed,
                ..
            } => d
                .field("status", status)
                .field("body", excerpt)
                .field("replayed", replayed),
            What::Transport(err) => d.field("error", err),
        };
        d.finish()
    }
}

impl std::error::Error for HttpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.what {
            What::Status { .. } => None,
            What::Transport(e) => Some(e),
        }
    }
}
