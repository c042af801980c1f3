//! The listener and connection handling shared by every provider, and the
//! order in which injected faults strike a request.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::faults::{Fault, FaultControl, ListenCmd, OpKind, Stage};
use crate::http::{self, HttpResponse, ReadError, Request};

/// Limits of the server side of every provider.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// How long a client may take to send its whole request.
    pub read_timeout: Duration,
    /// Longest a "timeout" fault keeps a connection open when the client
    /// never gives up; a bound so nothing lives forever.
    pub hang_limit: Duration,
    /// Largest request body accepted (bigger: 413).
    pub max_body: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            read_timeout: Duration::from_secs(10),
            hang_limit: Duration::from_secs(120),
            max_body: 64 * 1024,
        }
    }
}

/// How a handled request ends.
pub(crate) enum Reply {
    Respond(HttpResponse),
    /// Say nothing and keep the connection open until the client leaves.
    Hang,
    /// Close without a word.
    Disconnect,
}

/// What a provider does with one request; the server adds faults around it.
pub(crate) trait Service: Send + Sync + 'static {
    /// Which fault queue the request draws from; `None` for requests that
    /// match no route (they get a 404 and no fault).
    fn op_kind(&self, req: &Request) -> Option<OpKind>;

    fn handle(&self, req: Request, fault: Injected) -> impl Future<Output = Reply> + Send;
}

/// A JSON error body in Stripe's shape.
pub(crate) fn error_response(status: u16, kind: &str, message: &str) -> HttpResponse {
    HttpResponse::json(
        status,
        &json!({ "error": { "type": kind, "message": message } }),
    )
}

/// A 400 in Stripe's error shape.
pub(crate) fn bad_request(message: &str) -> Reply {
    Reply::Respond(error_response(400, "invalid_request_error", message))
}

/// The request's JSON body, or the 400 that refuses it.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(req: &Request) -> Result<T, Reply> {
    serde_json::from_slice(&req.body).map_err(|e| bad_request(&e.to_string()))
}

/// A required query parameter, or the 400 that asks for it.
pub(crate) fn required_query<'a>(req: &'a Request, name: &str) -> Result<&'a str, Reply> {
    req.query(name)
        .ok_or_else(|| bad_request(&format!("query parameter `{name}` is required")))
}

pub(crate) fn not_found() -> HttpResponse {
    error_response(404, "invalid_request_error", "unrecognized request URL")
}

/// What an after-apply fault does to the real answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterApply {
    Answer,
    Fail(u16),
    Hang,
    Disconnect,
}

impl AfterApply {
    /// The answer the provider considers given (payments saves this one).
    pub fn response(self, real: HttpResponse) -> HttpResponse {
        match self {
            AfterApply::Fail(status) => {
                error_response(status, "api_error", "the server failed after processing")
            }
            _ => real,
        }
    }

    /// How that answer reaches (or fails to reach) the client.
    pub fn reply(self, response: HttpResponse) -> Reply {
        match self {
            AfterApply::Hang => Reply::Hang,
            AfterApply::Disconnect => Reply::Disconnect,
            AfterApply::Answer | AfterApply::Fail(_) => Reply::Respond(response),
        }
    }

    pub fn finish(self, real: HttpResponse) -> Reply {
        self.reply(self.response(real))
    }
}

/// The fault drawn for one request, consumed stage by stage by the service:
/// [`Injected::before_apply`], then [`Injected::processing`], then (after
/// applying) [`Injected::after_apply`]. The service drops it when it is done
/// with the request, which is when a held request counts as handled.
pub(crate) struct Injected {
    fault: Option<Fault>,
    shutdown: watch::Receiver<bool>,
}

impl Drop for Injected {
    fn drop(&mut self) {
        if let Some(Fault::Hold(gate)) = &self.fault {
            gate.mark_handled();
        }
    }
}

/// How many requests a provider has accepted and not finished handling
/// (effect applied or refused, answer decided). Shared by the accept loop,
/// the connection tasks and the provider's handle.
#[derive(Clone, Debug)]
pub(crate) struct Busy(Arc<watch::Sender<usize>>);

impl Busy {
    fn new() -> Self {
        Busy(Arc::new(watch::Sender::new(0)))
    }

    /// Counts one more request until the guard is dropped.
    fn enter(&self) -> BusyGuard {
        self.0.send_modify(|n| *n += 1);
        BusyGuard(self.clone())
    }

    /// Waits until no accepted request is being handled.
    pub(crate) async fn idle(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in self, so the channel cannot close under us.
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// One request (or connection not yet read) in [`Busy`]'s count.
struct BusyGuard(Busy);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0 .0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Injected {
    /// A reply that ends the request before anything is applied.
    pub fn before_apply(&mut self) -> Option<Reply> {
        let reply = match self.fault.as_ref()? {
            Fault::RateLimit { retry_after_secs } => Reply::Respond(
                error_response(429, "rate_limit_error", "too many requests, slow down")
                    .with_header("Retry-After", retry_after_secs.to_string()),
            ),
            Fault::Error {
                status,
                stage: Stage::BeforeApply,
            } => Reply::Respond(error_response(
                *status,
                "api_error",
                "the server failed before processing",
            )),
            Fault::Timeout {
                stage: Stage::BeforeApply,
            } => Reply::Hang,
            Fault::Disconnect {
                stage: Stage::BeforeApply,
            } => Reply::Disconnect,
            _ => return None,
        };
        self.fault = None;
        Some(reply)
    }

    /// Waits out a delay or a hold, if one was drawn.
    pub async fn processing(&mut self) {
        let wait = async {
            match &self.fault {
                Some(Fault::Delay(d)) => tokio::time::sleep(*d).await,
                Some(Fault::Hold(gate)) => gate.pass().await,
                _ => {}
            }
        };
        tokio::select! {
            () = wait => {}
            () = until_shutdown(self.shutdown.clone()) => {}
        }
    }

    /// What happens to the answer now that the effect is applied.
    pub fn after_apply(&self) -> AfterApply {
        match &self.fault {
            Some(Fault::Error {
                status,
                stage: Stage::AfterApply,
            }) => AfterApply::Fail(*status),
            Some(Fault::Timeout {
                stage: Stage::AfterApply,
            }) => AfterApply::Hang,
            Some(Fault::Disconnect {
                stage: Stage::AfterApply,
            }) => AfterApply::Disconnect,
            _ => AfterApply::Answer,
        }
    }
}

/// Resolves once the provider is shutting down (flag set or sender gone).
pub(crate) async fn until_shutdown(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// A bound listening socket that allows re-binding its port while accepted
/// connections (or their TIME_WAIT remains) still hold it.
fn listen_on(addr: SocketAddr) -> io::Result<TcpListener> {
    reserve(addr)?.listen(1024)
}

fn reserve(addr: SocketAddr) -> io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// A provider's server: its address and the task running it.
pub(crate) struct Running {
    pub addr: SocketAddr,
    pub faults: FaultControl,
    pub busy: Busy,
    pub task: JoinHandle<()>,
}

/// Binds `addr` (port 0 picks one) and serves `service` until shutdown.
pub(crate) async fn spawn<S: Service>(
    addr: SocketAddr,
    service: Arc<S>,
    config: ServerConfig,
    shutdown: watch::Receiver<bool>,
) -> io::Result<Running> {
    let listener = listen_on(addr)?;
    let addr = listener.local_addr()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let faults = FaultControl::new(tx);
    let busy = Busy::new();
    let task = tokio::spawn(accept_loop(
        listener,
        addr,
        rx,
        Conn {
            service,
            faults: faults.clone(),
            busy: busy.clone(),
            config: Arc::new(config),
            shutdown,
        },
    ));
    Ok(Running {
        addr,
        faults,
        busy,
        task,
    })
}

/// Everything a connection task needs.
struct Conn<S> {
    service: Arc<S>,
    faults: FaultControl,
    busy: Busy,
    config: Arc<ServerConfig>,
    shutdown: watch::Receiver<bool>,
}

impl<S> Clone for Conn<S> {
    fn clone(&self) -> Self {
        Conn {
            service: Arc::clone(&self.service),
            faults: self.faults.clone(),
            busy: self.busy.clone(),
            config: Arc::clone(&self.config),
            shutdown: self.shutdown.clone(),
        }
    }
}

/// Pause before retrying to listen when the port could not be taken back.
const RELISTEN_RETRY: Duration = Duration::from_millis(50);

enum Listening {
    Open(TcpListener),
    /// Not listening, so the kernel answers SYNs with RST (`ECONNREFUSED`).
    /// `reserved` keeps the port bound meanwhile so nobody else takes it.
    Closed {
        reserved: Option<TcpSocket>,
        reopen_after: Option<Duration>,
    },
}

async fn accept_loop<S: Service>(
    listener: TcpListener,
    addr: SocketAddr,
    mut cmds: mpsc::UnboundedReceiver<ListenCmd>,
    conn: Conn<S>,
) {
    let mut state = Listening::Open(listener);
    loop {
        let cmd = match &state {
            Listening::Open(listener) => tokio::select! {
                () = until_shutdown(conn.shutdown.clone()) => return,
                cmd = cmds.recv() => cmd,
                accepted = listener.accept() => {
                    match accepted {
                        Ok((stream, _)) => {
                            // Counted from the accept on, so that a request
                            // already on the wire is never missed by `idle`.
                            let busy = conn.busy.enter();
                            tokio::spawn(serve(stream, conn.clone(), busy));
                        }
                        // Out of descriptors and the like: back off instead
                        // of spinning, the listener itself is still fine.
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                    continue;
                }
            },
            Listening::Closed { reopen_after, .. } => {
                let reopen = async {
                    match reopen_after {
                        Some(d) => tokio::time::sleep(*d).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = until_shutdown(conn.shutdown.clone()) => return,
                    cmd = cmds.recv() => cmd,
                    () = reopen => {
                        let (next, _) = reopen_listener(state, addr);
                        state = next;
                        continue;
                    }
                }
            }
        };
        // `conn` holds a sender, so the channel only closes if the task is
        // being torn down anyway.
        let Some(cmd) = cmd else { return };
        match cmd {
            ListenCmd::Refuse { for_, ack } => {
                let (next, result) = close_listener(state, addr, for_);
                state = next;
                if let Some(ack) = ack {
                    let _ = ack.send(result);
                }
            }
            ListenCmd::Accept { ack } => {
                let (next, result) = reopen_listener(state, addr);
                state = next;
                let _ = ack.send(result);
            }
        }
    }
}

fn close_listener(
    state: Listening,
    addr: SocketAddr,
    reopen_after: Option<Duration>,
) -> (Listening, io::Result<()>) {
    let reserved = match state {
        Listening::Open(listener) => {
            drop(listener);
            // Failing to reserve only risks another socket taking the port;
            // connections are refused either way, which is what was asked.
            reserve(addr).ok()
        }
        Listening::Closed { reserved, .. } => reserved,
    };
    (
        Listening::Closed {
            reserved,
            reopen_after,
        },
        Ok(()),
    )
}

fn reopen_listener(state: Listening, addr: SocketAddr) -> (Listening, io::Result<()>) {
    match state {
        Listening::Open(l) => (Listening::Open(l), Ok(())),
        Listening::Closed { reserved, .. } => {
            let listened = match reserved {
                Some(socket) => socket.listen(1024),
                None => listen_on(addr),
            };
            match listened {
                Ok(l) => (Listening::Open(l), Ok(())),
                Err(e) => (
                    Listening::Closed {
                        reserved: None,
                        reopen_after: Some(RELISTEN_RETRY),
                    },
                    Err(e),
                ),
            }
        }
    }
}

async fn serve<S: Service>(stream: TcpStream, conn: Conn<S>, busy: BusyGuard) {
    tokio::select! {
        () = serve_inner(stream, &conn, busy) => {}
        () = until_shutdown(conn.shutdown.clone()) => {}
    }
}

async fn serve_inner<S: Service>(mut stream: TcpStream, conn: &Conn<S>, busy: BusyGuard) {
    let _ = stream.set_nodelay(true);
    let read = http::read_request(&mut stream, conn.config.max_body);
    let req = match tokio::time::timeout(conn.config.read_timeout, read).await {
        Ok(Ok(req)) => req,
        Ok(Err(ReadError::Invalid { status, reason })) => {
            let resp = error_response(status, "invalid_request_error", reason);
            return answer_and_linger(stream, &resp).await;
        }
        Ok(Err(ReadError::Closed(_))) => return,
        Err(_) => {
            let resp = error_response(408, "invalid_request_error", "request not received in time");
            return answer_and_linger(stream, &resp).await;
        }
    };
    let fault = conn
        .service
        .op_kind(&req)
        .and_then(|kind| conn.faults.draw(kind));
    let injected = Injected {
        fault,
        shutdown: conn.shutdown.clone(),
    };
    let reply = conn.service.handle(req, injected).await;
    // Handled: whatever it applied is in the ledger, whether or not the
    // answer reaches the client.
    drop(busy);
    match reply {
        Reply::Respond(resp) => {
            let _ = stream.write_all(&resp.to_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Reply::Disconnect => {}
        Reply::Hang => hang(stream, conn.config.hang_limit).await,
    }
}

/// Answers a request that was not read to its end. Closing with unread
/// input makes the kernel send RST, which can destroy the answer in the
/// client's receive buffer; so half-close, then drain (boundedly) first.
async fn answer_and_linger(mut stream: TcpStream, resp: &HttpResponse) {
    if stream.write_all(&resp.to_bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut left: usize = 1024 * 1024;
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 || n >= left {
                break;
            }
            left -= n;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Stays silent until the client closes its end (it gave up or died).
async fn hang(mut stream: TcpStream, limit: Duration) {
    let drain = async {
        let mut sink = [0u8; 1024];
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(limit, drain).await;
}
