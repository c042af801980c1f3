//! A wire-transfer provider with neither deduplication nor look-up: once a
//! transfer's outcome is unknown, only a human can find out. This is the
//! `at_most_once` case.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::client::{ClientConfig, HttpClient};
use crate::clock::Clock;
use crate::error::ProviderError;
use crate::faults::OpKind;
use crate::http::{HttpResponse, Request};
use crate::ledger::{Effect, Ledger};
use crate::server::{bad_request, json_body, not_found, Injected, Reply, Service};

/// The body of `POST /wires`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireRequest {
    /// Destination account (IBAN or similar).
    pub to_account: String,
    /// Amount in minor units, at least 1.
    pub amount: u64,
    /// The payment reference; the unit of duplicate detection.
    pub reference: String,
}

/// A sent wire (answer and ledger record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireReceipt {
    /// Provider-assigned id, `wire_…`.
    pub id: String,
    /// Destination account.
    pub to_account: String,
    /// Amount in minor units.
    pub amount: u64,
    /// The payment reference.
    pub reference: String,
    /// Provider time of sending, ms since the epoch.
    pub sent_at_ms: u64,
}

/// The payment reference is the logical operation.
impl Effect for WireReceipt {
    type Operation = String;

    fn operation(&self) -> Option<String> {
        Some(self.reference.clone())
    }
}

/// The server side of wires.
pub(crate) struct Wires {
    clock: Clock,
    ledger: Ledger<WireReceipt>,
}

impl Wires {
    pub(crate) fn new(clock: Clock, ledger: Ledger<WireReceipt>) -> Self {
        Wires { clock, ledger }
    }
}

impl Service for Wires {
    fn op_kind(&self, req: &Request) -> Option<OpKind> {
        (req.method == "POST" && req.path == "/wires").then_some(OpKind::Write)
    }

    async fn handle(&self, req: Request, mut fault: Injected) -> Reply {
        if req.method != "POST" || req.path != "/wires" {
            return Reply::Respond(not_found());
        }
        if let Some(reply) = fault.before_apply() {
            return reply;
        }
        let wire: WireRequest = match json_body(&req) {
            Ok(w) => w,
            Err(reply) => return reply,
        };
        if wire.amount == 0 {
            return bad_request("amount must be at least 1");
        }
        // No country has the code XX: the bank refuses such an account.
        if wire.to_account.starts_with("XX") {
            return bad_request(&format!("invalid IBAN {}", wire.to_account));
        }
        fault.processing().await;
        let now = self.clock.now_ms();
        let receipt = self.ledger.push_with(|n| WireReceipt {
            id: format!("wire_{:08}", n + 1),
            to_account: wire.to_account,
            amount: wire.amount,
            reference: wire.reference,
            sent_at_ms: now,
        });
        fault
            .after_apply()
            .finish(HttpResponse::json(200, &receipt))
    }
}

/// Client of the wire provider. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WireClient {
    http: HttpClient,
}

impl WireClient {
    /// A client of the provider at `addr` with default timeouts.
    pub fn new(addr: SocketAddr) -> Self {
        WireClient {
            http: HttpClient::new(addr),
        }
    }

    /// A client with explicit timeouts.
    pub fn with_config(addr: SocketAddr, config: ClientConfig) -> Self {
        WireClient {
            http: HttpClient::with_config(addr, config),
        }
    }

    /// The underlying HTTP client, for raw requests.
    pub fn http(&self) -> &HttpClient {
        &self.http
    }

    /// Sends a wire. Not deduplicated and not searchable.
    pub async fn send(&self, wire: &WireRequest) -> Result<WireReceipt, ProviderError> {
        let (receipt, _) = self.http.call("POST", "/wires", &[], Some(wire)).await?;
        Ok(receipt)
    }
}
