//! What of a request and a response may go into messages, the journal and
//! the audit stream.

use reqwest::Url;

/// The most bytes of an error body kept for operators.
pub const BODY_EXCERPT_LIMIT: usize = 512;

/// `url` fit for logs: no user name or password, no fragment, and the
/// query's names kept but every value replaced by `…` (API keys, tokens and
/// personal data travel in query strings; their names say enough to tell
/// requests apart). The path is kept as it is.
pub fn redact_url(url: &Url) -> String {
    let mut shown = url.clone();
    // Only fails on URLs that cannot have credentials: nothing to remove.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_fragment(None);
    shown.set_query(None);
    let mut out = String::from(shown);
    if let Some(query) = url.query() {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((name, _)) => {
                    out.push_str(name);
                    out.push_str("=…");
                }
                // A bare `?flag` is a name, not a value.
                None => out.push_str(pair),
            }
        }
    }
    out
}

/// At most [`BODY_EXCERPT_LIMIT`] bytes of `body` as one line of text:
/// invalid UTF-8 replaced, control characters (newlines included) shown as
/// spaces, cut on a character boundary with `…` when longer. `complete`
/// says whether `body` is all of it.
pub(crate) fn excerpt(body: &[u8], complete: bool) -> String {
    let cut = body.len() > BODY_EXCERPT_LIMIT;
    let kept = if cut {
        without_split_char(&body[..BODY_EXCERPT_LIMIT])
    } else {
        body
    };
    let mut out: String = String::from_utf8_lossy(kept)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    if cut || !complete {
        out.push('…');
    }
    out
}

/// `bytes` without a UTF-8 sequence the cut left incomplete at its end, so
/// the excerpt does not show a replacement character the body never held.
fn without_split_char(bytes: &[u8]) -> &[u8] {
    let continuation = |b: u8| b & 0b1100_0000 == 0b1000_0000;
    let tail = bytes
        .iter()
        .rev()
        .take(4)
        .take_while(|b| continuation(**b))
        .count();
    let Some(start) = bytes.len().checked_sub(tail + 1) else {
        return bytes;
    };
    let needed = match bytes[start] {
        b if b >= 0b1111_0000 => 4,
        b if b >= 0b1110_0000 => 3,
        b if b >= 0b1100_0000 => 2,
        _ => return bytes,
    };
    if tail + 1 < needed {
        &bytes[..start]
    } else {
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redacted(url: &str) -> String {
        redact_url(&Url::parse(url).unwrap())
    }

    #[test]
    fn urls_lose_credentials_query_values_and_fragment() {
        assert_eq!(
            redacted("https://user:secret@api.example.com/v1/charges?api_key=sk_live_1&amount=5#x"),
            "https://api.example.com/v1/charges?api_key=…&amount=…"
        );
        assert_eq!(
            redacted("http://127.0.0.1:8080/v1/pay?dry_run"),
            "http://127.0.0.1:8080/v1/pay?dry_run"
        );
        assert_eq!(redacted("http://example.com/a/b"), "http://example.com/a/b");
        assert_eq!(redacted("http://example.com/?"), "http://example.com/?");
    }

    #[test]
    fn excerpts_are_bounded_single_lines() {
        assert_eq!(
            excerpt(b"{\"error\":\n\"declined\"}\n", true),
            "{\"error\": \"declined\"}"
        );
        assert_eq!(excerpt(b"partial", false), "partial…");
        let long = "é".repeat(BODY_EXCERPT_LIMIT); // two bytes each
        let e = excerpt(long.as_bytes(), true);
        assert_eq!(e, format!("{}…", "é".repeat(BODY_EXCERPT_LIMIT / 2)));
        let odd = format!("a{long}");
        let e = excerpt(odd.as_bytes(), true);
        assert!(!e.contains('\u{FFFD}'), "{e}");
        assert_eq!(e.chars().count(), 1 + (BODY_EXCERPT_LIMIT - 1) / 2 + 1);
        assert_eq!(excerpt(b"\xff\xfe", true), "\u{FFFD}\u{FFFD}");
    }
}
