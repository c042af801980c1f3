//! What a reqwest error means for the real world.

use idem_runtime::Failure;
use reqwest::header::HeaderMap;

use crate::status::classify_status;

/// Classifies an error reqwest returned.
///
/// | error | failure | why |
/// |---|---|---|
/// | connect (refused, DNS, TLS handshake, connect timeout) | `NotSent` | no byte of the request left us |
/// | building the request (bad URL, bad header) | `Semantic` | nothing was sent, and a retry builds the same request |
/// | a status (`error_for_status`) | as [`classify_status`] on a keyed request | the status is all reqwest kept |
/// | a timeout after connecting, a reset, a body or decode error, a redirect loop, anything else | `Ambiguous` | the request was (or may have been) written: the provider may have applied it |
///
/// Connect is checked first: reqwest reports a connect timeout as both a
/// connect error and a timeout, and it is `NotSent`. A timeout after the
/// connection is up is `Ambiguous` even when the server had not read the
/// body yet: the bytes are on their way and may still be read and applied.
///
/// A status error has lost the response's headers and whether the request
/// carried a key; it is classified as keyed (so a 409 is `Ambiguous`, the
/// cautious reading) and without a `Retry-After` floor. [`crate::send`]
/// keeps both.
pub fn classify_error(err: &reqwest::Error) -> Failure {
    if err.is_connect() {
        Failure::not_sent()
    } else if err.is_builder() {
        Failure::Semantic
    } else if let Some(status) = err.status() {
        classify_status(status, &HeaderMap::new(), true)
    } else {
        Failure::ambiguous()
    }
}

/// A short word for what went wrong, for messages.
pub(crate) fn kind_of(err: &reqwest::Error) -> &'static str {
    if err.is_connect() {
        if err.is_timeout() {
            "connect timeout"
        } else {
            "connect error"
        }
    } else if err.is_builder() {
        "invalid request"
    } else if err.is_timeout() {
        "timeout"
    } else if err.is_redirect() {
        "redirect error"
    } else if err.is_decode() {
        "response decode error"
    } else if err.is_body() {
        "body error"
    } else if err.is_request() {
        "request error"
    } else if err.is_status() {
        "error status"
    } else {
        "error"
    }
}
