//! A minimal HTTP/1.1 client with the two timeouts that decide whether a
//! failure is "never sent" or "maybe applied".

use std::net::SocketAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::error::ProviderError;
use crate::http::{self, HttpResponse, ReadError};

/// Largest response body the client accepts.
const MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// Client timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// How long the TCP handshake may take. Running out is `NotSent`.
    pub connect_timeout: Duration,
    /// How long writing the request and reading the whole answer may take,
    /// once connected. Running out is `Ambiguous`.
    pub request_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// One connection per request, `Connection: close`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HttpClient {
    addr: SocketAddr,
    config: ClientConfig,
}

impl HttpClient {
    /// A client of the server at `addr` with default timeouts.
    pub fn new(addr: SocketAddr) -> Self {
        Self::with_config(addr, ClientConfig::default())
    }

    /// A client with explicit timeouts.
    pub fn with_config(addr: SocketAddr, config: ClientConfig) -> Self {
        HttpClient { addr, config }
    }

    /// The server address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The timeouts in use.
    pub fn config(&self) -> ClientConfig {
        self.config
    }

    /// Sends one request and returns the answer whatever its status; only
    /// transport failures are errors. `target` is the path with its query,
    /// already encoded.
    pub async fn request(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<HttpResponse, ProviderError> {
        let bytes = self.encode(method, target, headers, body)?;
        let connect = TcpStream::connect(self.addr);
        let mut stream = match tokio::time::timeout(self.config.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                return Err(ProviderError::Connect {
                    addr: self.addr.to_string(),
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                return Err(ProviderError::ConnectTimeout {
                    addr: self.addr.to_string(),
                    after_ms: self.config.connect_timeout.as_millis() as u64,
                })
            }
        };
        let _ = stream.set_nodelay(true);
        let exchange = async {
            stream
                .write_all(&bytes)
                .await
                .map_err(|e| ProviderError::Connection {
                    reason: format!("while sending: {e}"),
                })?;
            http::read_response(&mut stream, MAX_RESPONSE_BODY)
                .await
                .map_err(|e| match e {
                    ReadError::Closed(reason) => ProviderError::Connection { reason },
                    ReadError::Invalid { reason, .. } => ProviderError::Malformed {
                        reason: reason.to_string(),
                    },
                })
        };
        match tokio::time::timeout(self.config.request_timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(ProviderError::Timeout {
                after_ms: self.config.request_timeout.as_millis() as u64,
            }),
        }
    }

    fn encode(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Vec<u8>, ProviderError> {
        let invalid = |reason: String| Err(ProviderError::InvalidRequest { reason });
        if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return invalid(format!("bad request target {target:?}"));
        }
        let mut out = format!(
            "{method} {target} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-length: {}\r\n",
            self.addr,
            body.len()
        );
        if !body.is_empty() {
            out.push_str("content-type: application/json\r\n");
        }
        for (name, value) in headers {
            // A line break in a value would smuggle a header (or a second
            // request) past the provider.
            if name.is_empty()
                || name.bytes().any(|b| b <= b' ' || b == b':' || b >= 0x7f)
                || value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
            {
                return invalid(format!("bad header {name:?}"));
            }
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(body);
        Ok(bytes)
    }

    /// Sends JSON (or nothing) and decodes a 2xx JSON answer. Returns the
    /// decoded value and whether it was a replay of a saved result.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: Option<&impl Serialize>,
    ) -> Result<(T, bool), ProviderError> {
        let body = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| ProviderError::InvalidRequest {
                reason: e.to_string(),
            })?,
            None => Vec::new(),
        };
        let resp = self.request(method, target, headers, &body).await?;
        if !(200..300).contains(&resp.status) {
            return Err(ProviderError::from_response(&resp));
        }
        let value = serde_json::from_slice(&resp.body).map_err(|e| ProviderError::Malformed {
            reason: format!("unexpected {} body: {e}", resp.status),
        })?;
        Ok((value, crate::error::is_replayed(&resp)))
    }
}

/// Builds `path?name=value` with the value percent-encoded.
pub(crate) fn with_query(path: &str, name: &str, value: &str) -> String {
    format!("{path}?{name}={}", http::encode_component(value))
}

/// `None` as a JSON body, for typed calls without one.
pub(crate) const NO_BODY: Option<&()> = None;
