//! [`Operator`]: what the admin server asks of the runtime it serves. The
//! runtime implements it (feature `admin` of `idem-runtime`); the server
//! decides nothing about operations itself, it maps HTTP onto these calls.

use std::future::Future;
use std::pin::Pin;

use idem_journal::audit::{AuditEvent, Stats};
use idem_journal::error::Error;
use idem_journal::key::IdemKey;
use idem_journal::views::{Approval, Escalation, Operation, PruneReport, Resolution, SagaView};

use crate::wire::ToolInfo;

/// A boxed future, as the trait's methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The runtime's operator side, as the admin server sees it.
///
/// The server holds it without keeping the runtime alive: once the runtime
/// is gone, [`Operator::alive`] answers false and the server answers
/// `503`; a call that finds it gone returns an error.
pub trait Operator: Send + Sync + 'static {
    /// Whether the runtime is still there.
    fn alive(&self) -> bool;

    /// The tools the program knows, sorted by name (without example
    /// results; the server adds those).
    fn tools(&self) -> Vec<ToolInfo>;

    /// Every escalated operation, oldest first.
    fn escalations(&self) -> BoxFuture<'_, Result<Vec<Escalation>, Error>>;

    /// One operation, if the journal has it.
    fn operation<'a>(&'a self, key: &'a IdemKey)
        -> BoxFuture<'a, Result<Option<Operation>, Error>>;

    /// Every audit event about one operation, in order.
    fn history<'a>(&'a self, key: &'a IdemKey) -> BoxFuture<'a, Result<Vec<AuditEvent>, Error>>;

    /// Settles (or amends) an escalation.
    fn resolve<'a>(
        &'a self,
        key: &'a IdemKey,
        resolution: Resolution,
        note: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Every call awaiting a person's approval, oldest request first
    /// (none, for an operator without approvals).
    fn approvals(&self) -> BoxFuture<'_, Result<Vec<Approval>, Error>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Every saga the journal has a record of, oldest start first (none,
    /// for an operator without sagas).
    fn sagas(&self) -> BoxFuture<'_, Result<Vec<SagaView>, Error>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Approves (`approved`) or refuses a call awaiting approval, with the
    /// operator's note and the surface it came through (`api`, `cli`,
    /// `inbox`).
    fn decide<'a>(
        &'a self,
        key: &'a IdemKey,
        approved: bool,
        note: &'a str,
        via: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (approved, note, via);
        Box::pin(async move {
            Err(Error::NotAwaitingApproval {
                key: key.clone(),
                state: "unknown to this operator".into(),
            })
        })
    }

    /// Up to `limit` durable events from `from`.
    fn audit_page(&self, from: u64, limit: usize) -> BoxFuture<'_, Result<Vec<AuditEvent>, Error>>;

    /// Makes everything written so far durable.
    fn sync(&self) -> BoxFuture<'_, Result<(), Error>>;

    /// Live events from now on (wake-ups for followers of the stream);
    /// `None` once the runtime is gone.
    fn subscribe(&self) -> Option<Box<dyn Live>>;

    /// Per-tool counts.
    fn stats(&self) -> BoxFuture<'_, Result<Stats, Error>>;

    /// Bytes the journal uses on disk.
    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>>;

    /// Removes what retention allows.
    fn prune(&self) -> BoxFuture<'_, Result<PruneReport, Error>>;

    /// The runtime's metrics in Prometheus' text exposition format
    /// (version 0.0.4), served as `GET /metrics`.
    fn metrics(&self) -> BoxFuture<'_, Result<String, Error>>;
}

/// A live view of the audit stream.
pub trait Live: Send {
    /// The next event published.
    fn recv(&mut self) -> BoxFuture<'_, Result<AuditEvent, Missed>>;
}

/// Why [`Live::recv`] returned no event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// Events were dropped for a slow subscriber; the stream goes on (read
    /// them back from the durable stream).
    Lagged,
    /// The runtime is gone.
    Closed,
}
