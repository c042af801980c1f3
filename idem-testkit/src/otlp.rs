//! A real OTLP/HTTP trace receiver for tests: an HTTP/1.1 server on a free
//! port of 127.0.0.1 that takes `POST /v1/traces` with a protobuf body,
//! decodes it as the official `ExportTraceServiceRequest` (the
//! `opentelemetry-proto` crate's generated prost types), hands it to the
//! test and answers as a collector does (`200`, an empty
//! `ExportTraceServiceResponse`). A body that does not decode is answered
//! `400` and recorded as an error ([`Receiver::errors`]).
//!
//! The server runs on a thread and a tokio runtime of its own, so that an
//! exporter's blocking flush from the test's own runtime thread cannot
//! starve it. It stops when the [`Receiver`] is dropped.
//!
//! ```no_run
//! # fn demo() -> std::io::Result<()> {
//! let receiver = idem_testkit::otlp::Receiver::start()?;
//! // Point the exporter at receiver.endpoint(), export, flush, then:
//! let spans = receiver.spans();
//! # Ok(()) }
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use prost::Message as _;

pub use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
pub use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
pub use opentelemetry_proto::tonic::trace::v1::Span;

/// The path OTLP/HTTP exporters post traces to.
pub const TRACES_PATH: &str = "/v1/traces";

/// A running receiver; stops when dropped.
pub struct Receiver {
    addr: SocketAddr,
    received: Mutex<mpsc::Receiver<ExportTraceServiceRequest>>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Starts a receiver on a free port of 127.0.0.1.
    pub fn start() -> io::Result<Receiver> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let (tx, rx) = mpsc::channel();
        let errors = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn({
                let errors = Arc::clone(&errors);
                move || runtime.block_on(serve(listener, tx, errors, stopped))
            })?;
        Ok(Receiver {
            addr,
            received: Mutex::new(rx),
            errors,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its traces URL, `http://127.0.0.1:PORT/v1/traces`: what an
    /// exporter's endpoint is set to.
    pub fn endpoint(&self) -> String {
        format!("http://{}{TRACES_PATH}", self.addr)
    }

    /// The requests received since the last call, without waiting.
    pub fn requests(&self) -> Vec<ExportTraceServiceRequest> {
        self.lock().try_iter().collect()
    }

    /// Waits up to `timeout` for the next request (a failsafe for tests
    /// that flush their exporter first: a flushed request has arrived
    /// when the flush returns).
    pub fn recv(&self, timeout: Duration) -> Option<ExportTraceServiceRequest> {
        self.lock().recv_timeout(timeout).ok()
    }

    /// The spans of the requests received since the last call, without
    /// waiting, in the order they were sent.
    pub fn spans(&self) -> Vec<Span> {
        spans_of(self.requests())
    }

    /// Why bodies were refused (they did not decode), in order.
    pub fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, mpsc::Receiver<ExportTraceServiceRequest>> {
        self.received.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every span of `requests`, in order (resources and scopes flattened).
pub fn spans_of(requests: impl IntoIterator<Item = ExportTraceServiceRequest>) -> Vec<Span> {
    requests
        .into_iter()
        .flat_map(|r| r.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect()
}

/// The attribute `key` of `span` as text (strings as they are; booleans,
/// integers and doubles as Rust displays them), or `None` without it.
pub fn attribute(span: &Span, key: &str) -> Option<String> {
    let kv = span.attributes.iter().find(|kv| kv.key == key)?;
    let value = kv.value.as_ref()?.value.as_ref()?;
    Some(match value {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::BoolValue(b) => b.to_string(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

async fn serve(
    listener: std::net::TcpListener,
    tx: mpsc::Sender<ExportTraceServiceRequest>,
    errors: Arc<Mutex<Vec<String>>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("listening: {e}"));
            return;
        }
    };
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let tx = tx.clone();
        let errors = Arc::clone(&errors);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let tx = tx.clone();
                let errors = Arc::clone(&errors);
                async move { Ok::<_, std::convert::Infallible>(handle(req, &tx, &errors).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    tx: &mpsc::Sender<ExportTraceServiceRequest>,
    errors: &Mutex<Vec<String>>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::POST || req.uri().path() != TRACES_PATH {
        return reply(StatusCode::NOT_FOUND, Bytes::new());
    }
    let refuse = |why: String| {
        errors.lock().unwrap_or_else(|p| p.into_inner()).push(why);
        reply(StatusCode::BAD_REQUEST, Bytes::new())
    };
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return refuse(format!("reading the body: {e}")),
    };
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            let _ = tx.send(request);
            let answer = ExportTraceServiceResponse::default().encode_to_vec();
            reply(StatusCode::OK, Bytes::from(answer))
        }
        Err(e) => refuse(format!("decoding ExportTraceServiceRequest: {e}")),
    }
}

fn reply(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-protobuf"),
    );
    response
}
