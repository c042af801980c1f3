//! What a saga's body records while it runs: its completed compensable
//! calls, in order, each with what undoes it.
//!
//! Kept apart from the saga's driver so that a context ([`crate::ctx`])
//! can carry a saga's log without depending on the driver: the log is
//! generic over the context its compensations are handed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use crate::machine::saga::{StepRef, Undo};
use idem_journal::error::Error;

/// What a saga's body recorded; `C` is the context a compensation runs in.
pub(crate) struct Log<C> {
    pub(super) name: String,
    pub(super) steps: Mutex<Vec<Done<C>>>,
    pub(super) aborted: Mutex<Option<String>>,
    /// The body runs again only to hand over the compensations of the
    /// calls it completed before: a rollback is decided, so a call that
    /// is not a replay of a completed one is refused before it runs.
    pub(super) replay_only: AtomicBool,
}

/// A completed compensable call.
pub(super) struct Done<C> {
    pub(super) step: StepRef,
    pub(super) undo: Option<UndoFn<C>>,
}

/// Runs a step's compensation in the context it is given.
pub(super) type UndoFn<C> =
    Box<dyn FnOnce(C) -> Pin<Box<dyn Future<Output = Undone> + Send>> + Send>;

/// What a compensation's call came to, with the journal's error kept.
#[doc(hidden)]
pub struct Undone {
    pub(super) undo: Undo,
    pub(super) fault: Option<Error>,
}
