//! The byte-stream transports (stdio, pipes, sockets): rmcp's line-framed
//! JSON-RPC behind a reader that bounds each message and answers the ones
//! it refuses, which rmcp would drop without a reply.
//!
//! rmcp's reader drops a line over its limit and goes on, so the client's
//! request is never answered and it waits until its own timeout. Here the
//! lines reach rmcp through [`Guarded`]: a line within
//! [`MAX_MESSAGE_BYTES`] passes unchanged; a longer one is read to its end
//! without being kept (only its top-level `"id"` and `"method"` are picked
//! out on the way), and rmcp is handed in its place a small request of the
//! same id, method [`OVERSIZED_METHOD`], which the server answers with the
//! reason (see `McpServer::on_custom_request`). A line without an id is a
//! notification (or no JSON-RPC at all) and gets no answer, as JSON-RPC
//! says.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use serde_json::{json, Value};
use tokio::io::{AsyncRead, ReadBuf};

/// The largest message (one line, its line end included) the stdio
/// transport reads: rmcp's own limit, 16 MiB. A longer request is answered
/// with an error that says so, and nothing is run.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// The method of the request that stands in for one too large to read.
pub(crate) const OVERSIZED_METHOD: &str = "idem/oversized";

/// How much of the input is read at a time.
const CHUNK: usize = 64 << 10;

/// A reader of JSON-RPC lines that hands on those within `limit` and
/// replaces each longer one by an [`OVERSIZED_METHOD`] request.
pub(crate) struct Guarded<R> {
    inner: R,
    limit: usize,
    input: Box<[u8]>,
    start: usize,
    end: usize,
    /// The line being read, while it is within the limit.
    line: Vec<u8>,
    /// A whole line (or the stand-in) being handed on, from `sent`.
    out: Vec<u8>,
    sent: usize,
    /// The line being skipped, once it is over the limit.
    skipping: Option<Skipped>,
    eof: bool,
}

struct Skipped {
    scan: Scan,
    bytes: u64,
}

impl<R> Guarded<R> {
    pub(crate) fn new(inner: R, limit: usize) -> Guarded<R> {
        Guarded {
            inner,
            limit,
            input: vec![0; CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
            line: Vec::new(),
            out: Vec::new(),
            sent: 0,
            skipping: None,
            eof: false,
        }
    }

    /// Takes the input up to and including the next line end (or all of
    /// it), into the line, the skipped line, or out.
    fn process(&mut self) {
        let chunk = &self.input[self.start..self.end];
        let newline = chunk.iter().position(|b| *b == b'\n');
        let take = newline.map_or(chunk.len(), |i| i + 1);
        let piece = &chunk[..take];
        self.start += take;
        if let Some(skipped) = &mut self.skipping {
            skipped.scan.feed(piece);
            skipped.bytes += take as u64;
        } else if self.line.len() + take > self.limit {
            let mut scan = Scan::default();
            scan.feed(&self.line);
            scan.feed(piece);
            let bytes = (self.line.len() + take) as u64;
            self.line = Vec::new();
            self.skipping = Some(Skipped { scan, bytes });
        } else {
            self.line.extend_from_slice(piece);
            if newline.is_some() {
                self.out = std::mem::take(&mut self.line);
            }
            return;
        }
        if newline.is_some() {
            let skipped = self.skipping.take().expect("skipping");
            self.out = self.stand_in(skipped);
        }
    }

    /// The request that stands in for a skipped line, or nothing when it
    /// had no id to answer.
    fn stand_in(&self, skipped: Skipped) -> Vec<u8> {
        let Some(id) = skipped
            .scan
            .id
            .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        else {
            tracing::warn!(
                bytes = skipped.bytes,
                limit = self.limit,
                "dropped an MCP message over the size limit that has no id to answer"
            );
            return Vec::new();
        };
        let request = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": OVERSIZED_METHOD,
            "params": {
                "method": skipped.scan.method,
                "bytes": skipped.bytes,
                "limit": self.limit,
            },
        });
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        line
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Guarded<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.sent < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.sent);
                buf.put_slice(&this.out[this.sent..this.sent + n]);
                this.sent += n;
                if this.sent == this.out.len() {
                    this.out.clear();
                    this.sent = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.start < this.end {
                this.process();
                continue;
            }
            if this.eof {
                // An unterminated last line is handed on as it is (rmcp
                // drops it); then the end.
                if !this.line.is_empty() {
                    this.out = std::mem::take(&mut this.line);
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.input);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                this.eof = true;
            } else {
                (this.start, this.end) = (0, n);
            }
        }
    }
}

/// Picks the top-level `"id"` and `"method"` out of a JSON object read in
/// pieces, without keeping the rest.
#[derive(Default)]
struct Scan {
    /// Nesting: 0 before the object, 1 inside it.
    depth: usize,
    in_string: bool,
    escaped: bool,
    at: At,
    /// The current top-level key, quotes included (while short).
    key: Vec<u8>,
    /// The value being kept, when it belongs to a wanted key.
    value: Option<(Wanted, Vec<u8>)>,
    id: Option<Value>,
    method: Option<String>,
    /// Not an object, or the object ended.
    done: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum At {
    #[default]
    Key,
    InKey,
    Colon,
    Value,
    InValue,
}

#[derive(Clone, Copy)]
enum Wanted {
    Id,
    Method,
}

/// The longest key and value kept.
const KEPT: usize = 1024;

impl Scan {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.done {
                return;
            }
            self.byte(b);
        }
    }

    fn keep(&mut self, b: u8) {
        if self.at == At::InKey {
            if self.key.len() < KEPT {
                self.key.push(b);
            }
        } else if let Some((_, value)) = &mut self.value {
            if value.len() < KEPT {
                value.push(b);
            } else {
                // Too long to be an id or a method worth answering.
                self.value = None;
            }
        }
    }

    fn byte(&mut self, b: u8) {
        if self.depth == 0 {
            match b {
                b'{' => self.depth = 1,
                b' ' | b'\t' | b'\r' | b'\n' => {}
                // A UTF-8 byte order mark, which rmcp skips.
                0xEF | 0xBB | 0xBF => {}
                _ => self.done = true,
            }
            return;
        }
        if self.depth == 1 && self.at == At::Value && !b.is_ascii_whitespace() {
            self.at = At::InValue;
        }
        if self.in_string {
            self.keep(b);
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
                if self.depth == 1 && self.at == At::InKey {
                    self.at = At::Colon;
                }
            }
            return;
        }
        match b {
            b'"' => {
                if self.depth == 1 && self.at == At::Key {
                    self.at = At::InKey;
                    self.key.clear();
                }
                self.in_string = true;
                self.keep(b);
            }
            b':' if self.depth == 1 && self.at == At::Colon => {
                self.at = At::Value;
                let key: Option<String> = serde_json::from_slice(&self.key).ok();
                self.value = match key.as_deref() {
                    Some("id") if self.id.is_none() => Some((Wanted::Id, Vec::new())),
                    Some("method") if self.method.is_none() => Some((Wanted::Method, Vec::new())),
                    _ => None,
                };
            }
            b',' if self.depth == 1 => {
                self.end_value();
                self.at = At::Key;
            }
            b'}' | b']' if self.depth == 1 => {
                self.end_value();
                self.done = true;
            }
            b'{' | b'[' => {
                self.depth += 1;
                self.keep(b);
            }
            b'}' | b']' => {
                self.depth -= 1;
                self.keep(b);
            }
            _ => self.keep(b),
        }
    }

    fn end_value(&mut self) {
        let Some((wanted, text)) = self.value.take() else {
            return;
        };
        let Ok(value) = serde_json::from_slice::<Value>(&text) else {
            return;
        };
        match wanted {
            Wanted::Id => self.id = Some(value),
            Wanted::Method => self.method = value.as_str().map(str::to_string),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn scan(text: &str, piece: usize) -> (Option<Value>, Option<String>) {
        let mut s = Scan::default();
        for chunk in text.as_bytes().chunks(piece) {
            s.feed(chunk);
        }
        (s.id, s.method)
    }

    #[test]
    fn the_top_level_id_and_method_are_found_wherever_they_are() {
        for piece in [1, 3, 1000] {
            let front = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"id":9}}"#;
            assert_eq!(
                scan(front, piece),
                (Some(json!(7)), Some("tools/call".into()))
            );
            let back = r#" {"params":{"id":9,"a":["}",{"method":"x"}]},"method" : "tools/call" , "id":"a\"b"}"#;
            assert_eq!(
                scan(back, piece),
                (Some(json!("a\"b")), Some("tools/call".into()))
            );
            let escaped_key = r#"{"\u0069d":3,"params":{}}"#;
            assert_eq!(scan(escaped_key, piece).0, Some(json!(3)));
            assert_eq!(
                scan(r#"{"method":"notifications/x","params":{}}"#, piece).0,
                None
            );
            assert_eq!(scan(r#"[{"id":1}]"#, piece), (None, None));
        }
    }

    async fn through(input: &[u8], limit: usize) -> Vec<u8> {
        let mut out = Vec::new();
        Guarded::new(input, limit)
            .read_to_end(&mut out)
            .await
            .unwrap();
        out
    }

    #[tokio::test]
    async fn lines_within_the_limit_pass_and_longer_ones_are_replaced() {
        let small = b"{\"id\":1}\n{\"id\":2}\r\n";
        assert_eq!(through(small, 10).await, small);
        let long = format!("{{\"id\":3,\"x\":\"{}\"}}\n{{\"id\":4}}\n", "y".repeat(100));
        let out = String::from_utf8(through(long.as_bytes(), 64).await).unwrap();
        let mut lines = out.lines();
        let stand_in: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(stand_in["id"], 3);
        assert_eq!(stand_in["method"], OVERSIZED_METHOD);
        assert_eq!(stand_in["params"]["bytes"], 116);
        assert_eq!(stand_in["params"]["limit"], 64);
        assert_eq!(lines.next(), Some("{\"id\":4}"));
        assert_eq!(lines.next(), None);
        // No id: dropped, nothing stands in.
        let note = format!(
            "{{\"method\":\"n\",\"x\":\"{}\"}}\n{{\"id\":5}}\n",
            "y".repeat(100)
        );
        assert_eq!(through(note.as_bytes(), 64).await, b"{\"id\":5}\n");
    }
}
