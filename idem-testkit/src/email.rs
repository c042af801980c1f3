//! An email provider that deduplicates nothing, like most real ones: every
//! `POST /send` that arrives sends a message. Callers stamp their key in the
//! `X-Idem-Key` header, and `GET /sent?key=…` finds what was sent under it,
//! which is how a read-before-retry `verify` learns whether a timed-out send
//! landed.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::client::{with_query, ClientConfig, HttpClient};
use crate::clock::Clock;
use crate::error::ProviderError;
use crate::faults::OpKind;
use crate::http::{HttpResponse, Request};
use crate::ledger::{Effect, Ledger};
use crate::server::{json_body, not_found, required_query, Injected, Reply, Service};

/// The header the key travels in.
pub const KEY_HEADER: &str = "X-Idem-Key";

/// The body of `POST /send`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmailMessage {
    /// Recipient address.
    pub to: String,
    /// Subject line (or template name).
    pub subject: String,
    /// Message body.
    pub body: String,
}

/// A message the provider sent (answer and ledger record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentMessage {
    /// Provider-assigned id, `msg_…`.
    pub id: String,
    /// Recipient address.
    pub to: String,
    /// Subject line.
    pub subject: String,
    /// Message body.
    pub body: String,
    /// The `X-Idem-Key` header it was sent with.
    pub key: Option<String>,
    /// Provider time of sending, ms since the epoch.
    pub sent_at_ms: u64,
}

/// The unit of duplicate detection for email: one recipient, one key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EmailOp {
    /// Recipient address.
    pub to: String,
    /// The key the message carried.
    pub key: Option<String>,
}

impl fmt::Display for EmailOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "to={} key={}",
            self.to,
            self.key.as_deref().unwrap_or("-")
        )
    }
}

impl Effect for SentMessage {
    type Operation = EmailOp;

    fn operation(&self) -> Option<EmailOp> {
        Some(EmailOp {
            to: self.to.clone(),
            key: self.key.clone(),
        })
    }
}

/// The server side of email.
pub(crate) struct Email {
    clock: Clock,
    ledger: Ledger<SentMessage>,
}

impl Email {
    pub(crate) fn new(clock: Clock, ledger: Ledger<SentMessage>) -> Self {
        Email { clock, ledger }
    }
}

impl Service for Email {
    fn op_kind(&self, req: &Request) -> Option<OpKind> {
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/send") => Some(OpKind::Write),
            ("GET", "/sent") => Some(OpKind::Read),
            _ => None,
        }
    }

    async fn handle(&self, req: Request, mut fault: Injected) -> Reply {
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/send") => {
                if let Some(reply) = fault.before_apply() {
                    return reply;
                }
                let msg: EmailMessage = match json_body(&req) {
                    Ok(m) => m,
                    Err(reply) => return reply,
                };
                fault.processing().await;
                let key = req.header(KEY_HEADER).map(str::to_string);
                let now = self.clock.now_ms();
                let sent = self.ledger.push_with(|n| SentMessage {
                    id: format!("msg_{:08}", n + 1),
                    to: msg.to,
                    subject: msg.subject,
                    body: msg.body,
                    key,
                    sent_at_ms: now,
                });
                fault.after_apply().finish(HttpResponse::json(200, &sent))
            }
            ("GET", "/sent") => {
                if let Some(reply) = fault.before_apply() {
                    return reply;
                }
                let key = match required_query(&req, "key") {
                    Ok(key) => key,
                    Err(reply) => return reply,
                };
                fault.processing().await;
                let found = self.ledger.filter(|m| m.key.as_deref() == Some(key));
                fault.after_apply().finish(HttpResponse::json(200, &found))
            }
            _ => Reply::Respond(not_found()),
        }
    }
}

/// Client of the email provider. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EmailClient {
    http: HttpClient,
}

impl EmailClient {
    /// A client of the provider at `addr` with default timeouts.
    pub fn new(addr: SocketAddr) -> Self {
        EmailClient {
            http: HttpClient::new(addr),
        }
    }

    /// A client with explicit timeouts.
    pub fn with_config(addr: SocketAddr, config: ClientConfig) -> Self {
        EmailClient {
            http: HttpClient::with_config(addr, config),
        }
    }

    /// The underlying HTTP client, for raw requests.
    pub fn http(&self) -> &HttpClient {
        &self.http
    }

    /// Sends `message` stamped with `key`. Not deduplicated: a retry after
    /// an unknown outcome may send it twice; check [`EmailClient::find_by_key`]
    /// first.
    pub async fn send(
        &self,
        key: &str,
        message: &EmailMessage,
    ) -> Result<SentMessage, ProviderError> {
        let (sent, _) = self
            .http
            .call("POST", "/send", &[(KEY_HEADER, key)], Some(message))
            .await?;
        Ok(sent)
    }

    /// Every message sent with `key`, oldest first.
    pub async fn find_by_key(&self, key: &str) -> Result<Vec<SentMessage>, ProviderError> {
        let (found, _) = self
            .http
            .call(
                "GET",
                &with_query("/sent", "key", key),
                &[],
                crate::client::NO_BODY,
            )
            .await?;
        Ok(found)
    }
}
