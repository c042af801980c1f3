//! A scripted HTTP/1.1 provider on 127.0.0.1 for the tests: it reads each
//! request as far as the script says, then answers, stalls, closes or
//! resets, and reports every request it read, so a test waits on what the
//! server saw instead of on the clock.

#![allow(dead_code)] // each test binary uses its own part

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// What the server does with one request, decided once its head is read.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Read the body, then answer.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Read nothing past the head; keep the connection open, silent.
    StallAfterHead,
    /// Read the body; keep the connection open, silent.
    StallAfterBody,
    /// Read the body, then close the connection (FIN) without answering.
    CloseAfterBody,
    /// Read the body, then reset the connection (RST) without answering.
    ResetAfterBody,
    /// Read the body, answer 200 with a `Content-Length` longer than the
    /// body sent, then close.
    TruncatedBody,
    /// Read the body, answer `status` with the start of a longer body, then
    /// keep the connection open, silent.
    StallInBody { status: u16, start: String },
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer::Respond {
            status,
            headers: Vec::new(),
            body: String::new(),
        }
    }

    pub fn with(status: u16, headers: &[(&str, &str)], body: &str) -> Answer {
        Answer::Respond {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.to_string(),
        }
    }
}

/// A request as the server read it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    /// Header lines exactly as they arrived (name and value as sent).
    pub raw_headers: Vec<String>,
    /// Lower-cased names, trimmed values.
    pub headers: Vec<(String, String)>,
    /// The body, when the script read it.
    pub body: Option<Vec<u8>>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The raw line of header `name` (case-insensitive), as it arrived.
    pub fn raw_header(&self, name: &str) -> Option<&str> {
        self.raw_headers.iter().map(String::as_str).find(|l| {
            l.split_once(':')
                .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
        })
    }
}

type Script = dyn Fn(&Seen) -> Answer + Send + Sync;

pub struct Server {
    pub addr: SocketAddr,
    seen: mpsc::UnboundedReceiver<Seen>,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// A server that answers every request as `script` says.
    pub async fn start(script: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, seen) = mpsc::unbounded_channel();
        let requests = Arc::new(AtomicUsize::new(0));
        let script: Arc<Script> = Arc::new(script);
        let count = requests.clone();
        let task = tokio::spawn(async move {
            // Stalled connections are kept here, open, until the server is
            // dropped.
            let parked = Arc::new(Mutex::new(Vec::new()));
            while let Ok((socket, _)) = listener.accept().await {
                let (script, tx, count, parked) =
                    (script.clone(), tx.clone(), count.clone(), parked.clone());
                tokio::spawn(async move {
                    if let Some(socket) = serve(socket, &*script, &tx, &count).await {
                        parked.lock().unwrap().push(socket);
                    }
                });
            }
        });
        Server {
            addr,
            seen,
            requests,
            task,
        }
    }

    /// A server that answers every request with `answer`.
    pub async fn always(answer: Answer) -> Server {
        Server::start(move |_| answer.clone()).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next request the server read (waits for it).
    pub async fn next(&mut self) -> Seen {
        self.seen.recv().await.expect("server stopped")
    }

    /// How many request heads the server has read so far. Every request
    /// is counted before the server answers, closes or stalls it, so once
    /// the client has its outcome the count includes every request the
    /// client sent for it.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Serves one connection; returns it when the script says to keep it open.
async fn serve(
    mut socket: TcpStream,
    script: &Script,
    tx: &mpsc::UnboundedSender<Seen>,
    count: &AtomicUsize,
) -> Option<TcpStream> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        let mut chunk = [0u8; 4096];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut start = lines.next().unwrap_or_default().split(' ');
    let method = start.next().unwrap_or_default().to_string();
    let target = start.next().unwrap_or_default().to_string();
    let raw_headers: Vec<String> = lines.map(str::to_string).collect();
    let headers: Vec<(String, String)> = raw_headers
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut seen = Seen {
        method,
        target,
        raw_headers,
        headers,
        body: None,
    };
    count.fetch_add(1, Ordering::SeqCst);
    let answer = script(&seen);
    if let Answer::StallAfterHead = answer {
        let _ = tx.send(seen);
        return Some(socket);
    }

    let length: usize = seen
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; 64 * 1024];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    seen.body = Some(body);
    let _ = tx.send(seen);

    match answer {
        Answer::StallAfterHead => unreachable!(),
        Answer::StallAfterBody => Some(socket),
        Answer::CloseAfterBody => None,
        Answer::ResetAfterBody => {
            // SO_LINGER 0: close sends RST at once (it does not block).
            #[allow(deprecated)]
            socket.set_linger(Some(Duration::ZERO)).unwrap();
            drop(socket);
            None
        }
        Answer::TruncatedBody => {
            let _ = socket
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\n{\"id\":",
                )
                .await;
            None
        }
        Answer::StallInBody { status, start } => {
            let head = format!(
                "HTTP/1.1 {status} {}\r\ncontent-length: 100000\r\n\r\n",
                reason(status)
            );
            let _ = socket.write_all(format!("{head}{start}").as_bytes()).await;
            Some(socket)
        }
        Answer::Respond {
            status,
            headers,
            body,
        } => {
            let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status));
            for (name, value) in &headers {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
            out.push_str(&format!(
                "content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            ));
            let _ = socket.write_all(out.as_bytes()).await;
            let _ = socket.shutdown().await;
            None
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        402 => "Payment Required",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        425 => "Too Early",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

/// A runtime on a temporary directory, for a `Ctx`.
pub fn runtime() -> (tempfile::TempDir, idem::Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let rt = idem::Runtime::open(dir.path()).unwrap();
    (dir, rt)
}

/// A port on 127.0.0.1 nobody listens on: bound, then released.
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}
