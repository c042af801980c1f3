//! One call: key header, send, classify, detect a replay; and a client
//! that leaves the retries to idem.

use std::time::Duration;

use idem_runtime::Ctx;
use reqwest::{ClientBuilder, RequestBuilder, Response};

use crate::error::HttpError;
use crate::headers::{mark_if_replayed, KeyHeader, IDEMPOTENCY_KEY};
use crate::redact::redact_url;

/// How long [`client_builder`] lets a connection attempt take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A [`reqwest::ClientBuilder`] fit for tools: reqwest's own retries off,
/// and a [`CONNECT_TIMEOUT`].
///
/// Retries belong to idem, which knows the tool's class and keeps the
/// budget across restarts; a retry underneath would be invisible to the
/// journal and the audit stream. reqwest 0.13 retries some failures on its
/// own by default (over HTTP/2 and HTTP/3, a stream the server refused), so
/// the policy is set to [`reqwest::retry::never`]. Add the same to a client
/// you build yourself.
///
/// The connect timeout lets a connection that never comes up be classified
/// `NotSent`: a request `timeout` alone that fires while still connecting
/// cannot be told apart from one that fires after sending, and is
/// `Ambiguous`.
///
/// ```
/// let client = idem::http::client_builder()
///     .timeout(std::time::Duration::from_secs(30))
///     .build()?;
/// # Ok::<(), reqwest::Error>(())
/// ```
pub fn client_builder() -> ClientBuilder {
    reqwest::Client::builder()
        .retry(reqwest::retry::never())
        .connect_timeout(CONNECT_TIMEOUT)
}

/// Whether and how [`send_with`] sets the `Idempotency-Key` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    /// Set it to the call's key in this form, unless the request already
    /// has the header ([`send`] is `KeyMode::Header(KeyHeader::Stripe)`).
    Header(KeyHeader),
    /// Send no `Idempotency-Key`: for an API that does not take one (many
    /// email APIs reject unknown headers, or key by their own field) and
    /// for the GETs of a `verify` function, which ask about an operation
    /// rather than perform one. A header already on the request is
    /// removed. (A default header of the client itself, set with
    /// `ClientBuilder::default_headers`, is added by reqwest when it sends,
    /// and is not seen here.)
    Omit,
}

impl Default for KeyMode {
    fn default() -> Self {
        KeyMode::Header(KeyHeader::Stripe)
    }
}

/// Sends `request` for the tool call `ctx` and returns the response if its
/// status is a success (2xx).
///
/// - Sets `Idempotency-Key` to [`Ctx::idempotency_key`] in Stripe's form,
///   unless the request already has the header (set it with
///   [`RequestBuilderExt::idempotency_key_as`](crate::RequestBuilderExt::idempotency_key_as)
///   for the quoted form). In a `read_only` tool there is no key and no
///   header. [`send_unkeyed`] and [`send_with`] can leave it out.
/// - Calls [`Ctx::mark_provider_replay`] when the response says
///   `Idempotent-Replayed: true`, whatever its status.
/// - Turns every other status into an [`HttpError`] classified by
///   [`classify_status`](crate::classify_status) (keyed when the request
///   carries the header), with the start of its body; and a failed send
///   into one classified by [`classify_error`](crate::classify_error).
///
/// The retries are the engine's: send through a client from
/// [`client_builder`] (or with reqwest's retries off) so that each attempt
/// is one request.
pub async fn send(ctx: &Ctx, request: RequestBuilder) -> Result<Response, HttpError> {
    send_with(ctx, request, KeyMode::default()).await
}

/// [`send`] without the `Idempotency-Key` header ([`KeyMode::Omit`]):
/// status classification and replay detection as always. A 409 of an
/// unkeyed request is a refusal (semantic), not a request in flight.
///
/// A tool whose API takes no key (a journal tool's email API, say) uses it
/// for all its requests; a `verify` function for its GETs.
pub async fn send_unkeyed(ctx: &Ctx, request: RequestBuilder) -> Result<Response, HttpError> {
    send_with(ctx, request, KeyMode::Omit).await
}

/// [`send`], with the key header as `mode` says. A tool that keeps its
/// `KeyMode` in a field (`http::send_with(ctx, request, self.key)`) decides
/// it once for all its requests.
pub async fn send_with(
    ctx: &Ctx,
    request: RequestBuilder,
    mode: KeyMode,
) -> Result<Response, HttpError> {
    let (client, request) = request.build_split();
    let mut request = request.map_err(|e| HttpError::from_reqwest(None, e))?;
    match mode {
        KeyMode::Header(form) => {
            if !request.headers().contains_key(IDEMPOTENCY_KEY) {
                if let Some(key) = ctx.try_idempotency_key() {
                    request
                        .headers_mut()
                        .insert(IDEMPOTENCY_KEY, form.value(key));
                }
            }
        }
        KeyMode::Omit => {
            request.headers_mut().remove(IDEMPOTENCY_KEY);
        }
    }
    let keyed = request.headers().contains_key(IDEMPOTENCY_KEY);
    let method = request.method().clone();
    let url = redact_url(request.url());
    let response = match client.execute(request).await {
        Ok(response) => response,
        Err(e) => return Err(HttpError::transport(Some(method), Some(url), e)),
    };
    mark_if_replayed(ctx, response.headers());
    if response.status().is_success() {
        Ok(response)
    } else {
        Err(HttpError::from_response(method, response, keyed).await)
    }
}

/// Idempotency for a [`reqwest::RequestBuilder`]: the key header and a send
/// that classifies. In scope with `use idem::http::RequestBuilderExt`.
pub trait RequestBuilderExt: Sized {
    /// Sets `Idempotency-Key` to the call's key in Stripe's form. Without a
    /// key (a `read_only` tool, or outside a tool call) the request is left
    /// as it is: there is nothing for the provider to deduplicate by.
    fn idempotency_key(self, ctx: &Ctx) -> RequestBuilder {
        self.idempotency_key_as(ctx, KeyHeader::Stripe)
    }

    /// Sets `Idempotency-Key` to the call's key in the given form (replacing
    /// any value set before); without a key, as [`idempotency_key`](Self::idempotency_key).
    fn idempotency_key_as(self, ctx: &Ctx, form: KeyHeader) -> RequestBuilder;

    /// [`crate::send`] this request: key header, send, status
    /// classification, replay detection.
    fn send_idem(
        self,
        ctx: &Ctx,
    ) -> impl std::future::Future<Output = Result<reqwest::Response, HttpError>> + Send;

    /// [`crate::send_unkeyed`] this request: as [`send_idem`](Self::send_idem),
    /// without the `Idempotency-Key` header.
    fn send_idem_unkeyed(
        self,
        ctx: &Ctx,
    ) -> impl std::future::Future<Output = Result<reqwest::Response, HttpError>> + Send;
}

impl RequestBuilderExt for RequestBuilder {
    fn idempotency_key_as(self, ctx: &Ctx, form: KeyHeader) -> RequestBuilder {
        match ctx.try_idempotency_key() {
            Some(key) => self.header(IDEMPOTENCY_KEY, form.value(key)),
            None => self,
        }
    }

    fn send_idem(
        self,
        ctx: &Ctx,
    ) -> impl std::future::Future<Output = Result<reqwest::Response, HttpError>> + Send {
        send(ctx, self)
    }

    fn send_idem_unkeyed(
        self,
        ctx: &Ctx,
    ) -> impl std::future::Future<Output = Result<reqwest::Response, HttpError>> + Send {
        send_unkeyed(ctx, self)
    }
}
