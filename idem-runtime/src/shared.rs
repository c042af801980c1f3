//! [`Runtime`] and what every handle of it shares ([`Shared`]): the open
//! journal, the clock, the audit log, the leader table, this process's
//! identity as a claim owner. The operator's methods are in `runtime.rs`,
//! the builder in `builder.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditLog;
use crate::class::{self, ToolDescriptor};
use crate::leaders::Local;
use crate::machine::policy::Setup;
use crate::replays::Replays;
use crate::retry::Jitter;
use idem_journal::clock::Clock;
use idem_journal::journal::{Journal, Owner};

/// The idem runtime: an open journal and everything that acts on it.
///
/// Cheap to clone; every clone and every [`Ctx`](crate::Ctx) made from it share one
/// journal, which is released when the last of them is dropped.
///
/// A long-running server opens one at start and hands a [`Ctx`](crate::Ctx) per
/// workflow to its tools:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// # let dir = tempfile::tempdir().unwrap();
/// use idem_runtime::Runtime;
///
/// let rt = Runtime::open(dir.path())?;          // once, at start
/// for order in ["order-1", "order-2"] {          // per request / workflow
///     let ctx = rt.run(order);                   // durable workflow id
///     // ... call #[tool]s with &ctx ...
///     # let _ = ctx;
/// }
/// for e in rt.escalations().await? {             // the operator's side
///     println!("{}: {}", e.key, e.reason);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("journal", &self.shared.journal.location())
            .field("owner", &self.shared.owner)
            .finish()
    }
}

/// What every handle of a runtime shares.
pub(crate) struct Shared {
    pub(crate) journal: Arc<dyn Journal>,
    /// The calls being driven in this process on this journal (shared by
    /// every runtime built on it).
    pub(crate) local: Arc<Local>,
    /// What the engine's machines are told about this runtime.
    pub(crate) setup: Setup,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) audit: AuditLog,
    pub(crate) jitter: Jitter,
    /// Who this runtime's claims belong to.
    pub(crate) owner: Owner,
    pub(crate) retention: Duration,
    /// Renews the leases of the claims this process drives, for journals
    /// whose claims expire.
    pub(crate) renewer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Tools called through this runtime that are not registered by
    /// `#[tool]` (hand-built descriptors), by name: what operators may need
    /// to check a resolution against.
    pub(crate) called: std::sync::Mutex<std::collections::HashMap<&'static str, Called>>,
    /// Committed results seen by this runtime (a replay without a read).
    pub(crate) replays: Replays,
    /// The admin API server, while this runtime serves one.
    #[cfg(feature = "admin")]
    pub(crate) admin: std::sync::Mutex<Option<idem_admin::Running>>,
}

/// A tool seen making a call, with the result check its call carried.
#[derive(Clone, Copy)]
pub(crate) struct Called {
    pub(crate) tool: &'static ToolDescriptor,
    pub(crate) check_landed: Option<class::LandedCheck>,
}

impl Shared {
    /// Remembers a tool that made a call: the first call of each name is
    /// recorded, and marked in the name's metrics slot (which the call has
    /// at hand), so later calls of the name take no lock.
    pub(crate) fn saw(
        &self,
        slot: &crate::metrics::ToolMetrics,
        tool: &'static ToolDescriptor,
        check_landed: Option<class::LandedCheck>,
    ) {
        use std::sync::atomic::Ordering::{Acquire, Release};
        if slot.recorded.load(Acquire) {
            return;
        }
        let mut called = self.called.lock().unwrap_or_else(|p| p.into_inner());
        if !called.contains_key(tool.name) {
            called.insert(tool.name, Called { tool, check_landed });
        }
        slot.recorded.store(true, Release);
    }

    /// How to check a `Landed` result for the tool `name` of `class`: its
    /// descriptor's check, else the one its calls in this process carried.
    pub(crate) fn landed_check(
        &self,
        name: &str,
        class: idem_journal::class::Class,
    ) -> Option<class::LandedCheck> {
        class::tools()
            .find(|t| t.name == name && t.class == class)
            .and_then(|t| t.check_landed)
            .or_else(|| {
                let called = self.called.lock().unwrap_or_else(|p| p.into_inner());
                called
                    .get(name)
                    .filter(|c| c.tool.class == class)
                    .and_then(|c| c.check_landed.or(c.tool.check_landed))
            })
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // First, while the journal is still held: stop serving and remove
        // the address file, so it never names a process that is gone.
        #[cfg(feature = "admin")]
        drop(self.admin.get_mut().ok().and_then(Option::take));
        if let Some(task) = self.renewer.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
        self.audit.close(&self.journal);
    }
}
