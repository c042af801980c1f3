//! The exhaustive checker of the call machine: every interleaving of up
//! to three calls of one key (two at a time, in one process or two),
//! every attempt outcome, `verify` answer, journal fault, crash and
//! operator resolution, to a depth; each reached world checked against the
//! invariants (`world.rs`: `check_attempt`, `check_return`, `check_end`):
//!
//! - no attempt starts unless an INTENT covering it was acknowledged at
//!   `Immediate` durability (and is the durable record, claimed by its
//!   process);
//! - `at_most_once`: no attempt after one that may have reached the
//!   provider, unless an operator reissued;
//! - `provider`: no attempt past the budget, `max_elapsed` or (after an
//!   attempt that may have landed) the dedupe window; `journal`: never a
//!   re-run after `verify` said landed or could not tell, and never a
//!   second effect;
//! - a committed result never changes, except by an operator;
//! - every call returns what the record says (a value it holds, a
//!   refusal, an escalation), never a decision of its own;
//! - every end is one of the tables' rows, and no world is left with an
//!   action nobody can execute;
//! - no world is without a way out: from every world explored, an end (or
//!   a world cut off by the depth bound) can be reached, so a machine that
//!   reads, waits or retries in a loop forever is caught even though each
//!   of its moves is legal (`explore.rs`: `without_a_way_out`).
//!
//! `saga.rs` checks the saga machine the same way, completely (its worlds
//! are finite): see its own list of invariants.
//!
//! `cargo run --release --example model_check [-- --depth N]` runs both by
//! hand; a bounded run is a test.

pub mod explore;
pub mod saga;
pub mod world;

#[cfg(test)]
mod tests {
    use super::explore;

    #[test]
    fn the_call_machine_keeps_every_invariant_to_the_bounded_depth() {
        let report = explore::run(3, 10);
        for v in &report.violations {
            eprintln!("{v}");
        }
        println!(
            "configs={} states={} violations={}",
            report.configs,
            report.states,
            report.violations.len()
        );
        assert!(report.violations.is_empty(), "{}", report.violations[0]);
        assert!(report.states > 10_000, "{} states", report.states);
    }

    #[test]
    fn the_saga_machine_keeps_every_invariant_in_every_world() {
        let report = super::saga::run(5);
        for v in &report.violations {
            eprintln!("{v}");
        }
        println!(
            "saga configs={} states={} violations={}",
            report.configs,
            report.states,
            report.violations.len()
        );
        assert!(report.violations.is_empty(), "{}", report.violations[0]);
        assert!(report.states > 10_000, "{} states", report.states);
    }
}
