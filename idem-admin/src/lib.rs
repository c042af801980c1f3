//! The operators' side of [idem](https://docs.rs/idem) over HTTP.
//!
//! Always: the JSON the admin API speaks ([`wire`]) and the two files it
//! keeps beside the journal ([`files`]: the bearer token and where the
//! running process listens) and how a server proves it holds the token
//! before a client sends it ([`proof`]), and where a worker without a
//! journal directory keeps those files ([`workers`]), which is all a client
//! such as the `idem` CLI needs. With feature `server`: the server itself ([`serve`]), its routes
//! and the escalation inbox, serving any runtime through the [`Operator`]
//! trait (the runtime implements it; `RuntimeBuilder::admin` starts it).

#![warn(missing_docs)]

pub mod files;
#[cfg(feature = "server")]
mod operator;
#[cfg(feature = "server")]
mod options;
pub mod proof;
pub mod wire;
pub mod workers;

#[cfg(feature = "server")]
mod body;
#[cfg(feature = "server")]
mod follow;
#[cfg(feature = "server")]
mod inbox;
#[cfg(feature = "server")]
mod routes;
#[cfg(feature = "server")]
mod server;

#[cfg(feature = "server")]
pub use operator::{BoxFuture, Live, Missed, Operator};
#[cfg(feature = "server")]
pub use options::AdminOptions;
#[cfg(feature = "server")]
pub use server::{require_tokio, serve, Running};
