//! Fake external providers for idem's tests, torture harness and demo.
//!
//! Four HTTP/1.1 servers on `127.0.0.1`, run inside the test (or demo)
//! process while the code under test runs in worker processes that may be
//! SIGKILLed. The providers outlive their callers and keep their own
//! [ledger](Provider::ledger) of every effect: the ground truth for "was
//! anything duplicated or lost".
//!
//! | provider | dedupe | look-up | idem class it exercises |
//! |---|---|---|---|
//! | payments (`POST /v1/charges`) | Stripe idempotency keys | — | `provider` |
//! | email (`POST /send`) | none | `GET /sent?key=` | `journal` |
//! | tickets (`POST /tickets`) | none | `GET /tickets?external_ref=` | `journal` |
//! | wire (`POST /wires`) | none | none | `at_most_once` |
//!
//! Faults are injected per provider through [`FaultControl`]: scripted
//! ([`FaultControl::push`]), random and seeded ([`Chaos`]), or real
//! connection refusal ([`FaultControl::refuse_connections`]). The clients
//! ([`PaymentsClient`], [`EmailClient`], [`TicketsClient`], [`WireClient`])
//! return [`ProviderError`], which implements [`idem_runtime::Classify`]
//! by how far each request provably got.
//!
//! With the `powercut` feature, `powercut::PowerCutFs` is a FUSE file
//! system that loses what a power cut loses, for testing durability (the
//! journal under power loss) where SIGKILL cannot. With the `otlp`
//! feature, `otlp::Receiver` is a real OTLP/HTTP trace receiver.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_testkit::{Fault, ProviderAddrs, Providers};
//!
//! // Parent process.
//! let providers = Providers::start().await?;
//! providers.email().faults().push(Fault::timeout_after_apply());
//! let mut worker = std::process::Command::new("worker");
//! worker.envs(providers.addrs().to_env());
//! // ... spawn, SIGKILL, respawn ...
//! assert!(providers.duplicates().is_empty());
//!
//! // Worker process.
//! let clients = ProviderAddrs::from_env()?.clients();
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod addrs;
mod client;
mod clock;
pub mod conformance;
mod email;
pub mod engine;
mod error;
mod faults;
mod http;
mod journal;
mod ledger;
#[cfg(feature = "otlp")]
pub mod otlp;
mod payments;
pub mod pg;
pub mod pg_replica;
pub mod pgbouncer;
#[cfg(feature = "powercut")]
pub mod powercut;
#[cfg(unix)]
pub mod prometheus;
mod providers;
mod rng;
mod server;
mod tickets;
mod wire;

pub use addrs::{
    AddrsEnvError, Clients, ProviderAddrs, EMAIL_ENV, PAYMENTS_ENV, TICKETS_ENV, WIRE_ENV,
};
pub use client::{ClientConfig, HttpClient};
pub use clock::{Clock, ManualClock};
pub use email::{EmailClient, EmailMessage, EmailOp, SentMessage, KEY_HEADER};
pub use error::{ApiError, ProviderError};
pub use faults::{Chaos, Fault, FaultControl, Gate, Stage};
pub use http::HttpResponse;
pub use journal::{overwrite_record, FaultyJournal, MemJournal, ProcessView, StorageFault};
pub use ledger::{Duplicate, Effect};
pub use payments::{
    Charge, ChargeOutcome, ChargeRecord, ChargeRequest, OrderId, PaymentsClient, PaymentsConfig,
    Refund, RefundRecord, RefundRequest, MAX_KEY_LEN,
};
pub use providers::{
    EmailProvider, PaymentsProvider, Provider, Providers, ProvidersConfig, TicketsProvider,
    WireProvider,
};
pub use rng::SplitMix64;
pub use server::ServerConfig;
pub use tickets::{CancelTicket, Cancellation, NewTicket, Ticket, TicketsClient};
pub use wire::{WireClient, WireReceipt, WireRequest};
