//! What the engine tells the caller of a dispatched call beside its value:
//! whether it was replayed, and which arguments drifted. A task-local slot
//! that [`reporting`] opens around a call and the engine fills when the
//! call returns, so that no tool's signature changes.
//!
//! Only the outermost tool call inside the slot reports: a tool whose body
//! calls other tools does not have its report overwritten by theirs (the
//! engine claims the slot when a call starts).

use std::cell::RefCell;
use std::future::Future;

use serde_json::Value;

tokio::task_local! {
    static SLOT: RefCell<Slot>;
}

struct Slot {
    /// No call has claimed the slot yet.
    armed: bool,
    report: CallReport,
}

/// What the engine said about one call: whether its result was replayed,
/// and which arguments differ from those its operation was recorded with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallReport {
    /// The result was recorded before this call (a committed operation,
    /// from the journal or this runtime's cache): the tool's body did not
    /// run for it. `false` for a read-only tool, for a result an attempt
    /// of this call produced, and for an error.
    pub replayed: bool,
    /// The names of the arguments (parameters after the context) whose
    /// values differ from those the operation was first recorded with,
    /// sorted; empty when they agree. Redacted arguments never appear.
    /// When the recorded arguments are unavailable (the record does not
    /// hold them), every argument of the call is listed: drift is never
    /// reported as absent when it cannot be ruled out.
    pub drift: Vec<String>,
}

/// Runs `fut` (a [`dispatch`](super::dispatch), a
/// [`ToolSet::dispatch`](super::ToolSet::dispatch), or a direct call of a
/// `#[tool]`) and returns its output with the report of the first tool
/// call it made. A future that called no journaled tool reports
/// `CallReport::default()`.
pub async fn reporting<F: Future>(fut: F) -> (F::Output, CallReport) {
    let slot = RefCell::new(Slot {
        armed: true,
        report: CallReport::default(),
    });
    let (out, slot) = SLOT
        .scope(slot, async move {
            let out = fut.await;
            let report = SLOT.with(|s| std::mem::take(&mut s.borrow_mut().report));
            (out, report)
        })
        .await;
    (out, slot)
}

/// Claims the slot for the call that is starting, if one is open and no
/// call has claimed it: that call's [`fill`] is the report.
pub(crate) fn claim() -> bool {
    SLOT.try_with(|s| std::mem::replace(&mut s.borrow_mut().armed, false))
        .unwrap_or(false)
}

/// Fills the slot a call claimed.
pub(crate) fn fill(report: CallReport) {
    let _ = SLOT.try_with(|s| s.borrow_mut().report = report);
}

/// A dispatched call's result with what the engine said about it (see
/// [`dispatch_reported`](super::dispatch_reported)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Dispatched {
    /// The tool's result, as [`dispatch`](super::dispatch) returns it.
    pub value: Value,
    /// The result was recorded before this call: see
    /// [`CallReport::replayed`].
    pub replayed: bool,
    /// The arguments that differ from those recorded: see
    /// [`CallReport::drift`].
    pub drift: Vec<String>,
}

impl Dispatched {
    pub(crate) fn new(value: Value, report: CallReport) -> Dispatched {
        Dispatched {
            value,
            replayed: report.replayed,
            drift: report.drift,
        }
    }
}
