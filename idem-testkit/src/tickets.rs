//! A ticketing provider: `POST /tickets` opens a ticket every time (no
//! deduplication), and `GET /tickets?external_ref=…` finds tickets by the
//! caller's own reference, which is what a `verify` uses.
//!
//! `POST /tickets/cancel` cancels a ticket (every request it gets: each
//! one notifies the courier again), and `GET
//! /tickets/cancellations?reference=…` finds cancellations by the caller's
//! reference. Every cancellation is in [`crate::Providers::cancellations`]:
//! two of one ticket is a duplicate.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::client::{with_query, ClientConfig, HttpClient, NO_BODY};
use crate::clock::Clock;
use crate::error::ProviderError;
use crate::faults::OpKind;
use crate::http::{HttpResponse, Request};
use crate::ledger::{Effect, Ledger};
use crate::server::{bad_request, json_body, not_found, required_query, Injected, Reply, Service};

/// The body of `POST /tickets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewTicket {
    /// The caller's reference (e.g. its idempotency key or order number).
    pub external_ref: String,
    /// Ticket title.
    pub title: String,
    /// Ticket body.
    pub body: String,
}

/// An opened ticket (answer and ledger record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ticket {
    /// Provider-assigned id, `T-…`.
    pub id: String,
    /// The caller's reference.
    pub external_ref: String,
    /// Ticket title.
    pub title: String,
    /// Ticket body.
    pub body: String,
    /// Provider time of creation, ms since the epoch.
    pub created_at_ms: u64,
}

/// The external reference is the logical operation.
impl Effect for Ticket {
    type Operation = String;

    fn operation(&self) -> Option<String> {
        Some(self.external_ref.clone())
    }
}

/// The body of `POST /tickets/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelTicket {
    /// The ticket to cancel, `T-…`.
    pub ticket_id: String,
    /// The caller's reference for this cancellation (its idempotency key).
    pub reference: String,
}

/// A cancellation (answer and ledger record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancellation {
    /// Provider-assigned id, `C-…`.
    pub id: String,
    /// The ticket cancelled.
    pub ticket_id: String,
    /// The caller's reference.
    pub reference: String,
    /// Provider time, ms since the epoch.
    pub at_ms: u64,
}

/// The ticket is the logical operation of a cancellation.
impl Effect for Cancellation {
    type Operation = String;

    fn operation(&self) -> Option<String> {
        Some(self.ticket_id.clone())
    }
}

/// The server side of tickets.
pub(crate) struct Tickets {
    clock: Clock,
    ledger: Ledger<Ticket>,
    cancellations: Ledger<Cancellation>,
}

impl Tickets {
    pub(crate) fn new(
        clock: Clock,
        ledger: Ledger<Ticket>,
        cancellations: Ledger<Cancellation>,
    ) -> Self {
        Tickets {
            clock,
            ledger,
            cancellations,
        }
    }
}

impl Service for Tickets {
    fn op_kind(&self, req: &Request) -> Option<OpKind> {
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/tickets") | ("POST", "/tickets/cancel") => Some(OpKind::Write),
            ("GET", "/tickets") | ("GET", "/tickets/cancellations") => Some(OpKind::Read),
            _ => None,
        }
    }

    async fn handle(&self, req: Request, mut fault: Injected) -> Reply {
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/tickets") => {
                if let Some(reply) = fault.before_apply() {
                    return reply;
                }
                let new: NewTicket = match json_body(&req) {
                    Ok(t) => t,
                    Err(reply) => return reply,
                };
                fault.processing().await;
                let now = self.clock.now_ms();
                let ticket = self.ledger.push_with(|n| Ticket {
                    id: format!("T-{}", n + 1),
                    external_ref: new.external_ref,
                    title: new.title,
                    body: new.body,
                    created_at_ms: now,
                });
                fault.after_apply().finish(HttpResponse::json(201, &ticket))
            }
            ("GET", "/tickets") => {
                if let Some(reply) = fault.before_apply() {
                    return reply;
                }
                let reference = match required_query(&req, "external_ref") {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                fault.processing().await;
                let found = self.ledger.filter(|t| t.external_ref == reference);
                fault.after_apply().finish(HttpResponse::json(200, &found))
            }
            ("POST", "/tickets/cancel") => {
                if let Some(reply) = fault.before_apply() {
                    return reply;
                }
                let cancel: CancelTicket = match json_body(&req) {
                    Ok(c) => c,
                    Err(reply) => return reply,
                };
                if self.ledger.filter(|t| t.id == cancel.ticket_id).is_empty() {
                    return bad_request(&format!("no ticket {}", cancel.ticket_id));
                }
                fault.processing().await;
                let now = self.clock.now_ms();
                let done = self.cancellations.push_with(|n| Cancellation {
                    id: format!("C-{}", n + 1),
                    ticket_id: cancel.ticket_id,
                    reference: cancel.reference,
                    at_ms: now,
                });
                fault.after_apply().finish(HttpResponse::json(200, &done))
            }
            ("GET", "/tickets/cancellations") => {
                if let Some(reply) = fault.before_apply() {
                    return reply;
                }
                let reference = match required_query(&req, "reference") {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                fault.processing().await;
                let found = self.cancellations.filter(|c| c.reference == reference);
                fault.after_apply().finish(HttpResponse::json(200, &found))
            }
            _ => Reply::Respond(not_found()),
        }
    }
}

/// Client of the tickets provider. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TicketsClient {
    http: HttpClient,
}

impl TicketsClient {
    /// A client of the provider at `addr` with default timeouts.
    pub fn new(addr: SocketAddr) -> Self {
        TicketsClient {
            http: HttpClient::new(addr),
        }
    }

    /// A client with explicit timeouts.
    pub fn with_config(addr: SocketAddr, config: ClientConfig) -> Self {
        TicketsClient {
            http: HttpClient::with_config(addr, config),
        }
    }

    /// The underlying HTTP client, for raw requests.
    pub fn http(&self) -> &HttpClient {
        &self.http
    }

    /// Opens a ticket. Not deduplicated.
    pub async fn create(&self, ticket: &NewTicket) -> Result<Ticket, ProviderError> {
        let (created, _) = self
            .http
            .call("POST", "/tickets", &[], Some(ticket))
            .await?;
        Ok(created)
    }

    /// Every ticket opened with `external_ref`, oldest first.
    pub async fn find_by_ref(&self, external_ref: &str) -> Result<Vec<Ticket>, ProviderError> {
        let target = with_query("/tickets", "external_ref", external_ref);
        let (found, _) = self.http.call("GET", &target, &[], NO_BODY).await?;
        Ok(found)
    }

    /// Cancels a ticket. Not deduplicated: every request that arrives
    /// cancels (and notifies the courier) again.
    pub async fn cancel(&self, cancel: &CancelTicket) -> Result<Cancellation, ProviderError> {
        let (done, _) = self
            .http
            .call("POST", "/tickets/cancel", &[], Some(cancel))
            .await?;
        Ok(done)
    }

    /// Every cancellation made with `reference`, oldest first.
    pub async fn find_cancellations(
        &self,
        reference: &str,
    ) -> Result<Vec<Cancellation>, ProviderError> {
        let target = with_query("/tickets/cancellations", "reference", reference);
        let (found, _) = self.http.call("GET", &target, &[], NO_BODY).await?;
        Ok(found)
    }
}
