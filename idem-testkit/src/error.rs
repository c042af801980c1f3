//! What can go wrong when calling a provider, and what each failure means
//! for the real world.

use std::fmt;
use std::time::Duration;

use idem_runtime::{Classify, Failure};
use serde::{Deserialize, Serialize};

use crate::http::HttpResponse;

/// The error object of a provider's JSON error body (Stripe's shape:
/// `{"error": {"type": ..., "code": ..., "message": ...}}`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ApiError {
    /// Error family, e.g. `card_error`, `idempotency_error`,
    /// `rate_limit_error`, `api_error`, `invalid_request_error`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// A finer reason, e.g. `card_declined`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Human-readable explanation.
    #[serde(default)]
    pub message: String,
    /// For a declined payment: the id of the failed charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ApiError,
}

/// A failed provider call.
///
/// Every variant says how far the request got, which is what
/// [`Classify`] needs: see each variant for its [`Failure`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProviderError {
    /// No TCP connection (refused, unreachable). Nothing was sent:
    /// `NotSent`.
    Connect {
        /// The provider address.
        addr: String,
        /// The OS error.
        reason: String,
    },
    /// The TCP handshake did not finish within the connect timeout. No
    /// request byte was written: `NotSent`.
    ConnectTimeout {
        /// The provider address.
        addr: String,
        /// The timeout that passed, in milliseconds.
        after_ms: u64,
    },
    /// No complete answer within the request timeout, after the request
    /// started to be written: `Ambiguous`.
    Timeout {
        /// The timeout that passed, in milliseconds.
        after_ms: u64,
    },
    /// The connection broke (reset, closed) after the request started to
    /// be written and before a complete answer: `Ambiguous`.
    Connection {
        /// What happened.
        reason: String,
    },
    /// The provider answered with an error status. 429 and 409 are
    /// `NotSent` (the provider documents them as not processed), 5xx is
    /// `Ambiguous`, any other 4xx is `Semantic`.
    Status {
        /// The HTTP status.
        status: u16,
        /// The `Retry-After` header, in seconds.
        retry_after_secs: Option<u64>,
        /// The decoded error body (`kind` is `unknown` if the body was not
        /// the expected JSON).
        error: ApiError,
        /// The answer carried `Idempotent-Replayed: true`: it is the saved
        /// result of an earlier request with the same key.
        replayed: bool,
    },
    /// The answer could not be understood (bad HTTP or an unexpected
    /// success body): the request may have been applied, `Ambiguous`.
    Malformed {
        /// What was wrong.
        reason: String,
    },
    /// The request could not be built (e.g. a header value with a line
    /// break). Nothing was sent, and sending it again would fail the same
    /// way: `Semantic`.
    InvalidRequest {
        /// What was wrong.
        reason: String,
    },
}

impl ProviderError {
    /// Builds the error for a non-success answer.
    pub(crate) fn from_response(resp: &HttpResponse) -> Self {
        let error = serde_json::from_slice::<ErrorEnvelope>(&resp.body)
            .map(|e| e.error)
            .unwrap_or_else(|_| ApiError {
                kind: "unknown".into(),
                code: None,
                message: resp.text().chars().take(200).collect(),
                charge: None,
            });
        ProviderError::Status {
            status: resp.status,
            retry_after_secs: resp.header("retry-after").and_then(|v| v.parse().ok()),
            error,
            replayed: is_replayed(resp),
        }
    }

    /// The HTTP status, if the provider answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ProviderError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the answer was a replay of a saved result.
    pub fn is_replayed(&self) -> bool {
        matches!(self, ProviderError::Status { replayed: true, .. })
    }

    /// The provider's error object, if it answered with one.
    pub fn api_error(&self) -> Option<&ApiError> {
        match self {
            ProviderError::Status { error, .. } => Some(error),
            _ => None,
        }
    }
}

pub(crate) fn is_replayed(resp: &HttpResponse) -> bool {
    resp.header("idempotent-replayed")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

impl Classify for ProviderError {
    fn classify(&self) -> Failure {
        match self {
            ProviderError::Connect { .. } | ProviderError::ConnectTimeout { .. } => {
                Failure::not_sent()
            }
            ProviderError::Timeout { .. }
            | ProviderError::Connection { .. }
            | ProviderError::Malformed { .. } => Failure::ambiguous(),
            ProviderError::InvalidRequest { .. } => Failure::Semantic,
            ProviderError::Status {
                status,
                retry_after_secs,
                ..
            } => {
                let retry_after = retry_after_secs.map(Duration::from_secs);
                match status {
                    // 409: another request with this key was in progress, so
                    // this one was turned away unprocessed.
                    409 | 429 => Failure::NotSent { retry_after },
                    400..=499 => Failure::Semantic,
                    // 5xx and anything unexpected: it may have been applied.
                    _ => Failure::Ambiguous { retry_after },
                }
            }
        }
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProviderError::Connect { addr, reason } => {
                write!(f, "could not connect to {addr}: {reason} (nothing sent)")
            }
            ProviderError::ConnectTimeout { addr, after_ms } => {
                write!(
                    f,
                    "connecting to {addr} timed out after {after_ms} ms (nothing sent)"
                )
            }
            ProviderError::Timeout { after_ms } => write!(
                f,
                "no answer within {after_ms} ms after sending (outcome unknown)"
            ),
            ProviderError::Connection { reason } => {
                write!(
                    f,
                    "connection broke after sending: {reason} (outcome unknown)"
                )
            }
            ProviderError::Status {
                status,
                retry_after_secs,
                error,
                replayed,
            } => {
                write!(f, "provider answered {status}")?;
                if !error.kind.is_empty() {
                    write!(f, " {}", error.kind)?;
                }
                if let Some(code) = &error.code {
                    write!(f, "/{code}")?;
                }
                if !error.message.is_empty() {
                    write!(f, ": {}", error.message)?;
                }
                if let Some(secs) = retry_after_secs {
                    write!(f, " (retry after {secs} s)")?;
                }
                if *replayed {
                    write!(f, " (replayed)")?;
                }
                Ok(())
            }
            ProviderError::Malformed { reason } => {
                write!(f, "unintelligible answer: {reason} (outcome unknown)")
            }
            ProviderError::InvalidRequest { reason } => {
                write!(f, "request not sent, it is invalid: {reason}")
            }
        }
    }
}

impl std::error::Error for ProviderError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, retry_after_secs: Option<u64>) -> ProviderError {
        ProviderError::Status {
            status,
            retry_after_secs,
            error: ApiError::default(),
            replayed: false,
        }
    }

    #[test]
    fn statuses_classify_like_reality() {
        assert_eq!(
            status(429, Some(3)).classify(),
            Failure::NotSent {
                retry_after: Some(Duration::from_secs(3))
            }
        );
        assert_eq!(status(409, None).classify(), Failure::not_sent());
        assert_eq!(status(400, None).classify(), Failure::Semantic);
        assert_eq!(status(402, None).classify(), Failure::Semantic);
        assert_eq!(status(404, None).classify(), Failure::Semantic);
        assert_eq!(status(500, None).classify(), Failure::ambiguous());
        assert_eq!(
            status(503, Some(1)).classify(),
            Failure::Ambiguous {
                retry_after: Some(Duration::from_secs(1))
            }
        );
    }

    #[test]
    fn transport_failures_classify_by_how_far_the_request_got() {
        let connect = ProviderError::Connect {
            addr: "127.0.0.1:1".into(),
            reason: "refused".into(),
        };
        assert_eq!(connect.classify(), Failure::not_sent());
        let ct = ProviderError::ConnectTimeout {
            addr: "x".into(),
            after_ms: 1,
        };
        assert_eq!(ct.classify(), Failure::not_sent());
        assert_eq!(
            ProviderError::Timeout { after_ms: 5 }.classify(),
            Failure::ambiguous()
        );
        let reset = ProviderError::Connection {
            reason: "reset".into(),
        };
        assert_eq!(reset.classify(), Failure::ambiguous());
        let bad = ProviderError::Malformed { reason: "x".into() };
        assert_eq!(bad.classify(), Failure::ambiguous());
        let invalid = ProviderError::InvalidRequest { reason: "x".into() };
        assert_eq!(invalid.classify(), Failure::Semantic);
    }

    #[test]
    fn display_and_serde() {
        let e = ProviderError::Status {
            status: 402,
            retry_after_secs: None,
            error: ApiError {
                kind: "card_error".into(),
                code: Some("card_declined".into()),
                message: "Your card was declined.".into(),
                charge: Some("ch_1".into()),
            },
            replayed: true,
        };
        assert_eq!(
            e.to_string(),
            "provider answered 402 card_error/card_declined: Your card was declined. (replayed)"
        );
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<ProviderError>(&json).unwrap(), e);
    }
}
