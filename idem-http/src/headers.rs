//! The `Idempotency-Key` request header and the `Idempotent-Replayed`
//! response header.

use idem_runtime::{Ctx, IdemKey};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// `Idempotency-Key`, the request header carrying [`Ctx::idempotency_key`].
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// `Idempotent-Replayed`, the response header with which a provider (Stripe)
/// says it answered with the stored outcome of an earlier request.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How the key is written in the `Idempotency-Key` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyHeader {
    /// The key as it is: `Idempotency-Key: charge-3f1e…-g0`, as Stripe and
    /// most payment APIs expect.
    #[default]
    Stripe,
    /// A structured-field string (RFC 8941), as the IETF draft
    /// `draft-ietf-httpapi-idempotency-key-header` defines the header:
    /// `Idempotency-Key: "charge-3f1e…-g0"`.
    Quoted,
}

impl KeyHeader {
    /// The header value for `key` in this form.
    pub fn value(self, key: &IdemKey) -> HeaderValue {
        let text = key.as_str();
        let value = match self {
            KeyHeader::Stripe => HeaderValue::from_str(text),
            KeyHeader::Quoted => HeaderValue::from_str(&sf_string(text)),
        };
        // An IdemKey is lower-case ASCII letters, digits, `_` and `-`
        // (see IdemKey), which both forms carry as they are.
        value.expect("an IdemKey is visible ASCII")
    }
}

/// `text` as an RFC 8941 sf-string: quoted, with `"` and `\` escaped.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Whether the response says it is a replay: `Idempotent-Replayed: true`
/// (the value compared without case, surrounding spaces ignored).
pub fn is_replayed(headers: &HeaderMap) -> bool {
    headers.get_all(IDEMPOTENT_REPLAYED).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
    })
}

/// Calls [`Ctx::mark_provider_replay`] when the response headers say
/// `Idempotent-Replayed: true`; returns whether they did. [`crate::send`]
/// does this for you; call it when you send requests yourself.
pub fn mark_if_replayed(ctx: &Ctx, headers: &HeaderMap) -> bool {
    let replayed = is_replayed(headers);
    if replayed {
        ctx.mark_provider_replay();
    }
    replayed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sf_string_quotes_and_escapes() {
        assert_eq!(sf_string("charge-ab12-g0"), "\"charge-ab12-g0\"");
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string(""), "\"\"");
    }

    fn replay_headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDEMPOTENT_REPLAYED, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn replayed_only_on_true() {
        assert!(is_replayed(&replay_headers(&["true"])));
        assert!(is_replayed(&replay_headers(&["True "])));
        assert!(is_replayed(&replay_headers(&["false", "true"])));
        assert!(!is_replayed(&replay_headers(&[])));
        assert!(!is_replayed(&replay_headers(&["false"])));
        assert!(!is_replayed(&replay_headers(&["1"])));
        assert!(!is_replayed(&replay_headers(&["yes"])));
        assert!(!is_replayed(&replay_headers(&["truely"])));
    }
}
