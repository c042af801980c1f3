//! The streamable HTTP transport: rmcp's tower service, served by hyper on
//! a TCP listener, at `/mcp`.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::{Error, McpServer};

/// The path the server answers on.
pub const PATH: &str = "/mcp";

impl McpServer {
    /// rmcp's streamable HTTP service for this server (a tower service),
    /// to mount in a router of your own. Clients may only name the hosts
    /// `allowed_hosts` (DNS rebinding protection; rmcp's default is the
    /// loopback names).
    pub fn http_service(
        self,
        config: StreamableHttpServerConfig,
    ) -> StreamableHttpService<McpServer, LocalSessionManager> {
        StreamableHttpService::new(
            move || Ok(self.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        )
    }

    /// Serves MCP's streamable HTTP transport at `http://ADDR/mcp` on
    /// `listener` (e.g. `TcpListener::bind("127.0.0.1:0")`), until
    /// `shutdown` is cancelled. Only loopback host names are accepted;
    /// use [`McpServer::http_service`] to choose others.
    pub async fn serve_http(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), Error> {
        let config =
            StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
        let service = self.http_service(config);
        loop {
            let (stream, _) = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                accepted = listener.accept() => accepted.map_err(|e| Error::Transport(e.to_string()))?,
            };
            let service = service.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let routed = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let mut service = service.clone();
                    async move {
                        if req.uri().path() != PATH {
                            return Ok::<_, Infallible>(not_found());
                        }
                        service.call(req).await
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), routed);
                tokio::pin!(conn);
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!("mcp http connection: {e}");
                        }
                    }
                    _ = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
                }
            });
        }
    }
}

type Response = http::Response<BoxBody<Bytes, Infallible>>;

fn not_found() -> Response {
    let body = Full::new(Bytes::from_static(b"idem's MCP server answers at /mcp\n"))
        .map_err(|never| match never {})
        .boxed();
    let mut response = http::Response::new(body);
    *response.status_mut() = http::StatusCode::NOT_FOUND;
    response
}
