//! Binding, accepting and shutting down. The server holds only a weak
//! reference to the runtime: it never keeps the journal open, and it stops
//! when the last `Runtime` handle is dropped.

use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{watch, Semaphore};

use crate::files::{self, AddressFile};
use crate::operator::Operator;
use crate::options::AdminOptions;
use crate::routes::App;
use idem_journal::error::Error;

/// Connections that have sent the token, served at once; a connection
/// whose request carries the right token waits for one of these slots.
const MAX_CONNECTIONS: usize = 256;

/// Connections that have not (yet) sent the token: new ones, and those
/// that only ask for `/healthz`, the inbox page or are refused. When all
/// are taken, a new connection closes the one that has waited longest, so
/// idle or slow connections can never keep an operator's new connection
/// (which sends its request at once) from being read.
const MAX_UNAUTHENTICATED: usize = 128;

/// How long a client may take to send a request's head: a client that
/// opens connections and sends nothing holds a slot this long at most.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The running server, owned by the runtime: dropping it (when the last
/// handle goes) stops the server and removes the address file.
pub struct Running {
    /// The address the server is bound to.
    pub addr: SocketAddr,
    /// Its base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    dir: PathBuf,
    file: AddressFile,
    shutdown: watch::Sender<bool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // Everything waiting on the signal (the accept loop, connections,
        // followers) stops; the listener closes with the accept loop.
        self.shutdown.send_replace(true);
        self.file.remove_if_ours(&self.dir);
    }
}

/// Fails unless called inside a tokio runtime, which the server runs on.
pub fn require_tokio() -> Result<tokio::runtime::Handle, Error> {
    tokio::runtime::Handle::try_current().map_err(|_| {
        Error::Usage(
            "RuntimeBuilder::admin(..) serves the admin API on the tokio runtime that \
             calls open(), and open() was called outside one: call it from async code \
             (under #[tokio::main]) or inside `tokio_runtime.enter()`"
                .into(),
        )
    })
}

/// Binds, writes the address file and starts serving `operator` on the
/// current tokio runtime, with the token and address files in `dir`.
pub fn serve(
    operator: Arc<dyn Operator>,
    options: AdminOptions,
    dir: &Path,
) -> Result<Running, Error> {
    let handle = require_tokio()?;
    let addr = resolve(&options)?;
    let token = files::load_or_create_token(dir, options.token.as_deref())?;
    let bind_error = |e: std::io::Error| Error::storage("bind the admin API", &addr.to_string(), e);
    let std_listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    std_listener.set_nonblocking(true).map_err(bind_error)?;
    let local = std_listener.local_addr().map_err(bind_error)?;
    let listener = {
        let _inside = handle.enter();
        tokio::net::TcpListener::from_std(std_listener).map_err(bind_error)?
    };
    let instance = {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| Error::storage("start the admin API", "getrandom", e))?;
        idem_journal::key::hex(&bytes)
    };
    let connect = match local.ip() {
        // A wildcard bind is reached on loopback from this machine.
        ip if ip.is_unspecified() && ip.is_ipv4() => {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), local.port())
        }
        ip if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), local.port())
        }
        _ => local,
    };
    let url = format!("http://{connect}");
    let file = AddressFile {
        url: url.clone(),
        addr: local,
        pid: std::process::id(),
        instance: instance.clone(),
    };
    file.write(dir)?;
    let (shutdown, stop) = watch::channel(false);
    // Remote clients come through a proxy whose name is not known here.
    let hosts = (!options.allow_remote).then(|| {
        let port = local.port();
        let mut hosts = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
            connect.to_string(),
        ];
        hosts.dedup();
        hosts
    });
    let app = Arc::new(App::new(
        operator,
        token,
        instance,
        local,
        stop.clone(),
        hosts,
        options.public_metrics,
    ));
    handle.spawn(accept_loop(listener, app, stop));
    tracing::info!(target: "idem::admin", %url, dir = %dir.display(), "admin API listening");
    Ok(Running {
        addr: local,
        url,
        dir: dir.to_path_buf(),
        file,
        shutdown,
    })
}

fn resolve(options: &AdminOptions) -> Result<SocketAddr, Error> {
    let addr = options
        .addr
        .to_socket_addrs()
        .map_err(|e| Error::Usage(format!("admin address {:?}: {e}", options.addr)))?
        .next()
        .ok_or_else(|| {
            Error::Usage(format!(
                "admin address {:?} resolves to nothing",
                options.addr
            ))
        })?;
    if !addr.ip().is_loopback() && !options.allow_remote {
        return Err(Error::Usage(format!(
            "admin address {addr} is not a loopback address: the admin API speaks plain \
             HTTP and settles real-world effects, so it listens on 127.0.0.1 or ::1 unless \
             AdminOptions::allow_remote(true) says otherwise (then put TLS in front of it)"
        )));
    }
    Ok(addr)
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let waiting = Arc::new(Unauthenticated::default());
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                tracing::warn!(target: "idem::admin", error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (id, mut evicted) = waiting.admit();
        let connection = Arc::new(Connection {
            id,
            slot: tokio::sync::Mutex::new(None),
        });
        let app = app.clone();
        let slots = slots.clone();
        let waiting = waiting.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = {
                let connection = connection.clone();
                let waiting = waiting.clone();
                service_fn(move |req| {
                    let app = app.clone();
                    let connection = connection.clone();
                    let slots = slots.clone();
                    let waiting = waiting.clone();
                    async move {
                        if app.authorized(&req) {
                            connection.promote(&slots, &waiting).await;
                        }
                        Ok::<_, Infallible>(app.handle(req).await)
                    }
                })
            };
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = conn => {
                    if let Err(e) = result {
                        tracing::debug!(target: "idem::admin", error = %e, "admin connection ended with an error");
                    }
                }
                _ = stop.wait_for(|stopped| *stopped) => {}
                // Closed to make room for a newer connection, while it has
                // not sent the token (once it has, the sender is dropped:
                // `Err`, and this branch is off).
                Ok(()) = &mut evicted => {}
            }
            waiting.leave(connection.id);
        });
    }
}

/// One accepted connection: until a request of it carries the token it is
/// among the [`Unauthenticated`]; then it holds one of the served slots.
struct Connection {
    id: u64,
    slot: tokio::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
}

impl Connection {
    /// Moves it to a served slot (waiting for one), out of the
    /// unauthenticated ones, where it can no longer be closed for room.
    async fn promote(&self, slots: &Arc<Semaphore>, waiting: &Unauthenticated) {
        let mut slot = self.slot.lock().await;
        if slot.is_none() {
            // The semaphore is never closed.
            if let Ok(permit) = slots.clone().acquire_owned().await {
                *slot = Some(permit);
                waiting.leave(self.id);
            }
        }
    }
}

/// The connections that have not sent the token, oldest first, each with
/// the sender that closes it.
#[derive(Default)]
struct Unauthenticated {
    inner: std::sync::Mutex<UnauthenticatedInner>,
}

#[derive(Default)]
struct UnauthenticatedInner {
    next: u64,
    open: std::collections::BTreeMap<u64, tokio::sync::oneshot::Sender<()>>,
}

impl Unauthenticated {
    /// Counts a new connection in, closing the oldest one when all
    /// [`MAX_UNAUTHENTICATED`] places are taken; returns its id and what
    /// resolves when it is closed for room.
    fn admit(&self) -> (u64, tokio::sync::oneshot::Receiver<()>) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        while inner.open.len() >= MAX_UNAUTHENTICATED {
            if let Some((_, close)) = inner.open.pop_first() {
                let _ = close.send(());
            }
        }
        let id = inner.next;
        inner.next += 1;
        let (close, closed) = tokio::sync::oneshot::channel();
        inner.open.insert(id, close);
        (id, closed)
    }

    /// It sent the token, or ended.
    fn leave(&self, id: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.open.remove(&id);
    }
}
