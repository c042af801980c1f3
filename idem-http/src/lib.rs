//! HTTP providers for idem tools, over [`reqwest`] 0.13: the glue between
//! an HTTP API and idem's retry rules.
//!
//! Reached as `idem::http` with the facade's `http` feature:
//!
//! ```toml
//! idem = { version = "0.1", features = ["http"] }          # http:// only
//! idem = { version = "0.1", features = ["http-rustls"] }   # or "http-native-tls" for https://
//! ```
//!
//! - [`send`] (or [`.send_idem(ctx)`](RequestBuilderExt::send_idem)) sends a
//!   request with the call's `Idempotency-Key`, notes a provider's
//!   `Idempotent-Replayed: true` in the audit stream, and turns anything but
//!   a 2xx into an [`HttpError`]: an error type that implements
//!   [`Classify`](idem_runtime::Classify), so a provider tool's body is a
//!   couple of lines.
//! - [`classify_status`] and [`classify_error`] classify a status you decoded
//!   yourself and a [`reqwest::Error`]; [`retry_after`] reads `Retry-After`.
//! - [`send_unkeyed`] (or [`send_with`] and [`KeyMode::Omit`]) sends
//!   without the `Idempotency-Key` header: for APIs that do not take one
//!   and the GETs of a `verify` function.
//! - [`reqwest`] is re-exported: the version `send` takes.
//! - [`RequestBuilderExt::idempotency_key_as`] writes the key in Stripe's
//!   form or the IETF draft's quoted form ([`KeyHeader`]).
//! - [`client_builder`] is a `reqwest::ClientBuilder` with reqwest's own
//!   retries off: every attempt the engine makes is exactly one request.
//!
//! # A provider tool
//!
//! ```
//! use idem::http::{self, HttpError};
//! use idem::{tool, Ctx, Runtime};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Serialize, Deserialize)]
//! struct Charge {
//!     id: String,
//! }
//!
//! struct Payments {
//!     client: reqwest::Client,
//!     base: String,
//! }
//!
//! #[tool] // names its tools `Payments::charge`
//! impl Payments {
//!     #[tool(class = "provider", key = "order_id")]
//!     async fn charge(&self, ctx: &Ctx, order_id: u64, cents: u64) -> Result<Charge, HttpError> {
//!         let request = self.client.post(format!("{}/v1/charges", self.base))
//!             .json(&serde_json::json!({ "amount": cents, "currency": "eur" }));
//!         Ok(http::send(ctx, request).await?.json().await?)
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let base = provider().await?;
//! let rt = Runtime::open(dir.path())?;
//! let payments = Payments { client: http::client_builder().build()?, base };
//! let charge = payments.charge(&rt.run("order-4711"), 4711, 1999).await?;
//! assert_eq!(charge.id, "ch_1");
//! # Ok(())
//! # }
//! # /// A provider on 127.0.0.1 that answers every request with a charge.
//! # async fn provider() -> std::io::Result<String> {
//! #     use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! #     let base = format!("http://{}", listener.local_addr()?);
//! #     tokio::spawn(async move {
//! #         while let Ok((mut socket, _)) = listener.accept().await {
//! #             let mut buf = [0; 4096];
//! #             let _ = socket.read(&mut buf).await;
//! #             let body = r#"{"id":"ch_1"}"#;
//! #             let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
//! #             let _ = socket.write_all(format!("{head}{body}").as_bytes()).await;
//! #         }
//! #     });
//! #     Ok(base)
//! # }
//! ```
//!
//! (`.json` is reqwest's `json` feature, enabled in your own `Cargo.toml`.)
//!
//! What the engine then does, for this provider-class tool:
//!
//! | the provider | [`HttpError`] classifies as | the engine |
//! |---|---|---|
//! | cannot be reached (refused, DNS, TLS, connect timeout) | `NotSent` | backs off, sends again |
//! | answers 408, 425, 429 | `NotSent`, `Retry-After` as the floor | waits at least that long, sends again |
//! | answers 409 to our key (an earlier request with it is in flight) | `Ambiguous`, `Retry-After` as the floor | sends the same key again until the provider replays the outcome |
//! | answers 5xx, times out after connecting, resets the connection | `Ambiguous`, `Retry-After` as the floor | sends the same key again: the provider deduplicates |
//! | answers another 4xx (400, 402, 422, …) | `Semantic` | records the refusal and returns it |
//!
//! The same classification under a journal tool makes the engine ask
//! `verify` before re-running an ambiguous attempt, and under an
//! at-most-once tool escalates it; see `#[tool]`.
//!
//! # Your own error type
//!
//! Wrap [`HttpError`] and delegate, to add the provider's own meanings:
//!
//! ```
//! use idem::http::HttpError;
//! use idem::{Classify, Failure};
//!
//! #[derive(Debug)]
//! enum PayError {
//!     Http(HttpError),
//!     /// 200 OK, but the body says the card was declined.
//!     Declined(String),
//! }
//!
//! impl Classify for PayError {
//!     fn classify(&self) -> Failure {
//!         match self {
//!             PayError::Http(e) => e.classify(),
//!             PayError::Declined(_) => Failure::Semantic,
//!         }
//!     }
//! }
//! ```
//!
//! # Timeouts
//!
//! Set a request `timeout` on the client (or the tool's `timeout`): an
//! attempt that hangs after the request was sent is `Ambiguous` either way.
//! A connection that does not come up within the client's
//! `connect_timeout` ([`client_builder`] sets [`CONNECT_TIMEOUT`]) is
//! `NotSent`. The start of an error response's body is read for the
//! message under the same timeout; a body that stalls keeps what arrived,
//! and the status decides the classification.

#![warn(missing_docs)]

mod error;
mod headers;
mod redact;
mod retry_after;
mod send;
mod status;
mod transport;

pub use error::HttpError;
pub use headers::{is_replayed, mark_if_replayed, KeyHeader, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
pub use redact::{redact_url, BODY_EXCERPT_LIMIT};
pub use retry_after::{retry_after, MAX_RETRY_AFTER};
pub use send::{
    client_builder, send, send_unkeyed, send_with, KeyMode, RequestBuilderExt, CONNECT_TIMEOUT,
};

/// The reqwest this crate was built with (0.13): name its types through
/// `idem::http::reqwest` to be sure they are the ones [`send`] takes,
/// whatever version your own `Cargo.toml` has.
pub use reqwest;
pub use status::{classify_status, classify_status_at};
pub use transport::classify_error;
