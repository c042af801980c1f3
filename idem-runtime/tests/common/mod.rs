//! Test fixtures for the engine, from idem-testkit (shared with the backend
//! conformance suite): the scripted provider with its own ledger, the
//! journal wrappers, and shorthands for driving `__private::call` the way
//! `#[tool]` does.
#![allow(dead_code)]
#![allow(unused_imports)]

use std::time::Duration;

pub use idem_testkit::engine::{
    args, call, call1, escalation_reason, events, key, open, tool, tool_with,
    ScriptedProvider as Provider, Step, TestError, VerifyMode,
};
pub use idem_testkit::{FaultyJournal, MemJournal, StorageFault};

pub const SECOND: Duration = Duration::from_secs(1);
