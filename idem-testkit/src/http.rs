//! Just enough HTTP/1.1 for one request per connection.
//!
//! Both ends always send `Content-Length` and `Connection: close`, so there
//! is no chunked coding, no keep-alive and no pipelining to get wrong. Every
//! size is bounded and every parse error is a value, never a panic: the
//! torture harness kills clients mid-write and the server must shrug.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest request or response head (start line plus headers) accepted.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// Most header lines accepted in one message.
const MAX_HEADERS: usize = 64;

/// Why a message could not be read. `status` is what a server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// The peer closed (or broke) the connection before a full message.
    Closed(String),
    /// The bytes are not a message we accept; the server answers `status`.
    Invalid { status: u16, reason: &'static str },
}

impl ReadError {
    fn bad(reason: &'static str) -> Self {
        ReadError::Invalid {
            status: 400,
            reason,
        }
    }
}

/// The parts of a message head that both directions share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    /// The three space-separated parts of the first line.
    pub start: [String; 3],
    /// Header names lower-cased, values trimmed, in arrival order.
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The declared body length, or `None` when absent.
    fn content_length(&self, max_body: usize) -> Result<Option<usize>, ReadError> {
        let mut found: Option<usize> = None;
        for (name, value) in &self.headers {
            if name != "content-length" {
                continue;
            }
            if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) || value.len() > 12 {
                return Err(ReadError::bad("invalid Content-Length"));
            }
            let n: usize = value
                .parse()
                .map_err(|_| ReadError::bad("invalid Content-Length"))?;
            if found.is_some_and(|f| f != n) {
                return Err(ReadError::bad("conflicting Content-Length headers"));
            }
            found = Some(n);
        }
        match found {
            Some(n) if n > max_body => Err(ReadError::Invalid {
                status: 413,
                reason: "body too large",
            }),
            other => Ok(other),
        }
    }
}

/// Looks a header up by case-insensitive name.
pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Parses a head without its terminating blank line.
pub(crate) fn parse_head(bytes: &[u8]) -> Result<Head, ReadError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ReadError::bad("head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.splitn(3, ' ');
    let a = parts.next().unwrap_or_default();
    let b = parts.next().ok_or(ReadError::bad("malformed start line"))?;
    // A response's reason phrase may be empty or contain spaces; a request's
    // version never does, which parse_request checks.
    let c = parts.next().unwrap_or_default();
    if a.is_empty() || b.is_empty() {
        return Err(ReadError::bad("malformed start line"));
    }
    let mut headers = Vec::new();
    for line in lines {
        if line.starts_with([' ', '\t']) {
            return Err(ReadError::bad("obsolete header folding"));
        }
        let (name, value) = line
            .split_once(':')
            .ok_or(ReadError::bad("header line without colon"))?;
        if !is_token(name) {
            return Err(ReadError::bad("invalid header name"));
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(ReadError::bad("invalid header value"));
        }
        if headers.len() == MAX_HEADERS {
            return Err(ReadError::Invalid {
                status: 431,
                reason: "too many headers",
            });
        }
        headers.push((
            name.to_ascii_lowercase(),
            value.trim_matches([' ', '\t']).to_string(),
        ));
    }
    Ok(Head {
        start: [a.to_string(), b.to_string(), c.to_string()],
        headers,
    })
}

/// Reads until the blank line ending the head. Returns the head bytes and
/// whatever body bytes arrived in the same reads.
async fn read_head<R: AsyncRead + Unpin>(r: &mut R) -> Result<(Vec<u8>, Vec<u8>), ReadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let searched_from = buf.len().saturating_sub(3);
        let n = r
            .read(&mut chunk)
            .await
            .map_err(|e| ReadError::Closed(e.to_string()))?;
        if n == 0 {
            return Err(ReadError::Closed(if buf.is_empty() {
                "connection closed before any byte".into()
            } else {
                "connection closed inside the head".into()
            }));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = find(&buf[searched_from..], b"\r\n\r\n") {
            let end = searched_from + at;
            if end > MAX_HEAD {
                break;
            }
            let rest = buf.split_off(end + 4);
            buf.truncate(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            break;
        }
    }
    Err(ReadError::Invalid {
        status: 431,
        reason: "head too large",
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads exactly `len` body bytes, `already` being those read with the head.
async fn read_body<R: AsyncRead + Unpin>(
    r: &mut R,
    mut already: Vec<u8>,
    len: usize,
) -> Result<Vec<u8>, ReadError> {
    // Bytes beyond the declared length would be a pipelined request, which
    // one-request-per-connection ignores.
    already.truncate(len);
    let missing = len - already.len();
    if missing > 0 {
        let start = already.len();
        already.resize(len, 0);
        r.read_exact(&mut already[start..])
            .await
            .map_err(|e| ReadError::Closed(format!("body cut short: {e}")))?;
    }
    Ok(already)
}

/// A request as the server sees it.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub method: String,
    /// The path without the query string, still percent-encoded.
    pub path: String,
    /// Decoded query parameters in order.
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request, refusing heads over [`MAX_HEAD`] and bodies over
/// `max_body`.
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: usize,
) -> Result<Request, ReadError> {
    let (head_bytes, rest) = read_head(r).await?;
    let head = parse_head(&head_bytes)?;
    let [method, target, version] = head.start.clone();
    if !is_token(&method) {
        return Err(ReadError::bad("invalid method"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(ReadError::Invalid {
            status: 505,
            reason: "unsupported HTTP version",
        });
    }
    if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(ReadError::bad("invalid request target"));
    }
    if head.header("transfer-encoding").is_some() {
        return Err(ReadError::Invalid {
            status: 411,
            reason: "send a Content-Length, chunked bodies are not supported",
        });
    }
    let len = head.content_length(max_body)?.unwrap_or(0);
    let body = read_body(r, rest, len).await?;
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), parse_query(q)?),
        None => (target, Vec::new()),
    };
    Ok(Request {
        method,
        path,
        query,
        headers: head.headers,
        body,
    })
}

/// A response, as written by the server and read back by the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header names lower-cased, in arrival order, without the framing
    /// headers (`content-length`, `connection`) on the server side.
    pub headers: Vec<(String, String)>,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub(crate) fn json(status: u16, body: &impl serde::Serialize) -> Self {
        HttpResponse {
            status,
            headers: Vec::new(),
            // Serializing our own plain structs cannot fail; an empty body
            // would still be a well-formed (if useless) answer.
            body: serde_json::to_vec(body).unwrap_or_default(),
        }
    }

    pub(crate) fn with_header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    /// A header by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The body as text, lossily.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        out.push_str("content-type: application/json\r\n");
        for (n, v) in &self.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str(&format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// Reads one response, refusing bodies over `max_body`. Without a
/// `Content-Length` the body runs to end of stream.
pub(crate) async fn read_response<R: AsyncRead + Unpin>(
    r: &mut R,
    max_body: usize,
) -> Result<HttpResponse, ReadError> {
    let (head_bytes, rest) = read_head(r).await?;
    let head = parse_head(&head_bytes)?;
    let [version, code, _reason] = &head.start;
    if !version.starts_with("HTTP/1.") {
        return Err(ReadError::bad("not an HTTP/1 response"));
    }
    let status: u16 = match code.parse() {
        Ok(s) if code.len() == 3 && (100..=599).contains(&s) => s,
        _ => return Err(ReadError::bad("invalid status code")),
    };
    let body = match head.content_length(max_body)? {
        Some(len) => read_body(r, rest, len).await?,
        None => {
            let mut body = rest;
            let limit = (max_body + 1) as u64;
            let mut more = Vec::new();
            r.take(limit)
                .read_to_end(&mut more)
                .await
                .map_err(|e| ReadError::Closed(e.to_string()))?;
            body.extend_from_slice(&more);
            if body.len() > max_body {
                return Err(ReadError::Invalid {
                    status: 413,
                    reason: "body too large",
                });
            }
            body
        }
    };
    let headers = head
        .headers
        .into_iter()
        .filter(|(n, _)| n != "content-length" && n != "connection")
        .collect();
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        402 => "Payment Required",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Status",
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub(crate) fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode_component(s: &str) -> Result<String, ReadError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or(ReadError::bad("invalid percent escape"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| ReadError::bad("query is not UTF-8"))
}

fn parse_query(q: &str) -> Result<Vec<(String, String)>, ReadError> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode_component(k)?, decode_component(v)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn req(bytes: &[u8]) -> Result<Request, ReadError> {
        let mut r = bytes;
        block_on(read_request(&mut r, 1024))
    }

    #[test]
    fn parses_a_request_with_query_and_body() {
        let r = req(b"POST /x?key=a%20b&to=c+d HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nX-A:  v \r\n\r\nabcEXTRA").unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/x");
        assert_eq!(r.query("key"), Some("a b"));
        assert_eq!(r.query("to"), Some("c d"));
        assert_eq!(r.header("x-a"), Some("v"));
        assert_eq!(r.body, b"abc");
    }

    #[test]
    fn rejects_malformed_heads_with_statuses() {
        let status = |b: &[u8]| match req(b) {
            Err(ReadError::Invalid { status, .. }) => status,
            other => panic!("expected Invalid, got {other:?}"),
        };
        assert_eq!(status(b"GARBAGE\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/2.0\r\n\r\n"), 505);
        assert_eq!(status(b"GET nope HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\r\nNoColon\r\n\r\n"), 400);
        assert_eq!(status(b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n"), 400);
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            400
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: 99999\r\n\r\n"),
            413
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            411
        );
        assert_eq!(status(b"GET /?k=%zz HTTP/1.1\r\n\r\n"), 400);
        let mut huge = b"GET / HTTP/1.1\r\nX: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        huge.extend_from_slice(b"\r\n\r\n");
        assert_eq!(status(&huge), 431);
    }

    #[test]
    fn truncated_input_is_closed_not_a_panic() {
        assert!(matches!(req(b""), Err(ReadError::Closed(_))));
        assert!(matches!(
            req(b"GET / HTTP/1.1\r\n"),
            Err(ReadError::Closed(_))
        ));
        assert!(matches!(
            req(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"),
            Err(ReadError::Closed(_))
        ));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = SplitMix64::new(1);
        let alphabet = b"GETPOST /?%=&:\r\n HTTP/1.1 Content-Length 0123456789\xff\x00";
        for _ in 0..2_000 {
            let len = rng.below(200) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            let _ = req(&bytes);
            let mut r = bytes.as_slice();
            let _ = block_on(read_response(&mut r, 1024));
        }
    }

    #[test]
    fn response_round_trips() {
        let resp = HttpResponse::json(402, &serde_json::json!({"a": 1})).with_header("X-Y", "z");
        let bytes = resp.to_bytes();
        let mut r = bytes.as_slice();
        let back = block_on(read_response(&mut r, 1024)).unwrap();
        assert_eq!(back.status, 402);
        assert_eq!(back.header("x-y"), Some("z"));
        assert_eq!(back.body, resp.body);
    }

    #[test]
    fn encoding_round_trips() {
        let s = "a b/c?d=e&f%g+h€";
        let q = format!("k={}", encode_component(s));
        assert_eq!(parse_query(&q).unwrap(), vec![("k".into(), s.into())]);
    }
}
