//! The engine's decisions, without I/O: no journal handle, no clock read,
//! no tokio. Each machine is a value that takes an input (what the last
//! action brought back), the tool's policy, the time and a jitter draw,
//! and answers the next action; the async driver (`engine.rs`) executes
//! actions and feeds their results back, and decides nothing itself.
//!
//! - `call.rs`: one journaled call (the decision tables of the engine);
//! - `step.rs`: a memoized step (`Ctx::step`);
//! - `resolve.rs`: an operator's resolution of an escalated operation;
//! - `read_only.rs`: the retries of a read-only call;
//! - `saga.rs`: when a saga rolls back, and what each compensation's
//!   answer leads to (`Ctx::saga`);
//! - `drift.rs`: which arguments differ from the recorded ones;
//! - `policy.rs`: what the machines are told about a tool and a journal;
//! - `check/`: the exhaustive checker of the call machine (tests and
//!   `examples/model_check.rs`).

pub mod call;
#[cfg(any(test, feature = "model-check"))]
pub mod check;
pub mod drift;
pub mod policy;
pub mod read_only;
pub mod resolve;
pub mod saga;
pub mod step;
#[cfg(test)]
mod vectors;
