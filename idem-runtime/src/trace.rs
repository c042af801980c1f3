//! The `tracing` spans of tool calls: one span per call (target
//! `idem::call`, level INFO), and a child span per attempt of the tool's
//! body and per `verify`, so that a retry's attempts sit under the call.
//!
//! Field names are a contract (exporters and dashboards filter on them):
//!
//! | field | on | value |
//! |---|---|---|
//! | `otel.name` | call | the tool's name (OpenTelemetry names the span after it) |
//! | `idem.tool` | call | the tool's name |
//! | `idem.class` | call | `read_only`, `provider`, `journal` or `at_most_once` |
//! | `idem.key` | call | the key (generation 0), as it displays; absent for `read_only` |
//! | `idem.run` | call | the root run id, when the context has one |
//! | `idem.worker` | call | this worker's claim owner, `id#incarnation` (as audit events name it) |
//! | `idem.outcome` | call, attempt | how it ended, in `idem_calls_total`'s `outcome` words (`ok`, `tool_error`, `timed_out`, ..., `cancelled`) |
//! | `idem.replayed` | call | `true` when the value came from the journal or the replay cache without an attempt |
//! | `idem.attempt` | call, attempt | on an attempt, its number (from 1; counts survive restarts); on the call, the number of its last attempt, 0 when it ran none |
//! | `idem.journal_us` | call | microseconds this call spent waiting on the journal (reads, writes, audit appends) |
//!
//! Nothing here puts arguments or results in a span (they may be
//! redacted). When no subscriber takes these spans, creating them is
//! `tracing`'s disabled-callsite check, and nothing is timed or formatted.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::time::Instant;

use tracing::field::Empty;
use tracing::Span;

use crate::class::ToolDescriptor;
use crate::ctx::Ctx;
use crate::error::ToolError;
use crate::metrics::Outcome;
use idem_journal::key::IdemKey;

/// The span of one call and what it records when the call ends (or its
/// future is dropped: then its outcome is `cancelled`).
pub(crate) struct Traced {
    span: Span,
    /// An index into `Outcome::ALL`. (Atomics, not cells: a `&Traced`
    /// is held across awaits by futures that must stay `Send`.)
    outcome: AtomicU8,
    replayed: AtomicBool,
    attempt: AtomicU32,
    journal_ns: AtomicU64,
}

impl Traced {
    /// Opens the span of a call of `tool` (not entered: instrument the
    /// call's future with [`Traced::span`]).
    pub(crate) fn call(ctx: &Ctx, tool: &ToolDescriptor, key: Option<&IdemKey>) -> Traced {
        let span = tracing::info_span!(
            target: "idem::call",
            "idem.call",
            otel.name = tool.name,
            idem.tool = tool.name,
            idem.class = tool.class.as_str(),
            idem.key = Empty,
            idem.run = Empty,
            idem.worker = %ctx.shared().owner,
            idem.outcome = Empty,
            idem.replayed = Empty,
            idem.attempt = Empty,
            idem.journal_us = Empty,
        );
        if !span.is_disabled() {
            if let Some(key) = key {
                span.record("idem.key", tracing::field::display(key));
            }
            let run = ctx.root_run();
            if !run.is_empty() {
                span.record("idem.run", run);
            }
        }
        Traced {
            span,
            outcome: AtomicU8::new(Outcome::Cancelled as u8),
            replayed: AtomicBool::new(false),
            attempt: AtomicU32::new(0),
            journal_ns: AtomicU64::new(0),
        }
    }

    /// The call's span.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// The call returned `result`; passes it through.
    pub(crate) fn finish<T, E>(&self, result: Result<T, ToolError<E>>) -> Result<T, ToolError<E>> {
        self.outcome.store(Outcome::of(&result) as u8, Relaxed);
        result
    }

    /// The value returned came from the journal or the replay cache.
    pub(crate) fn replayed(&self) {
        self.replayed.store(true, Relaxed);
    }

    /// Opens the span of attempt `n` (a child of the call's span).
    pub(crate) fn attempt(&self, n: u32) -> Span {
        self.attempt.store(n, Relaxed);
        if self.span.is_disabled() {
            return Span::none();
        }
        tracing::info_span!(
            target: "idem::call",
            parent: &self.span,
            "idem.attempt",
            idem.attempt = n,
            idem.outcome = Empty,
        )
    }

    /// Opens the span of `verify`'s question after attempt `n`.
    pub(crate) fn verify(&self, n: u32) -> Span {
        if self.span.is_disabled() {
            return Span::none();
        }
        tracing::info_span!(
            target: "idem::call",
            parent: &self.span,
            "idem.verify",
            idem.attempt = n,
            idem.verdict = Empty,
        )
    }

    /// A timer of a journal operation, when the span records one.
    pub(crate) fn journal_timer(&self) -> Option<Instant> {
        (!self.span.is_disabled()).then(Instant::now)
    }

    /// Adds the time since `started` to the call's journal time.
    pub(crate) fn journal_done(&self, started: Option<Instant>) {
        if let Some(started) = started {
            let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.journal_ns.fetch_add(ns, Relaxed);
        }
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if self.span.is_disabled() {
            return;
        }
        let span = &self.span;
        let outcome = Outcome::ALL[usize::from(self.outcome.load(Relaxed))];
        span.record("idem.outcome", outcome.label());
        span.record("idem.replayed", self.replayed.load(Relaxed));
        span.record("idem.attempt", self.attempt.load(Relaxed));
        span.record("idem.journal_us", self.journal_ns.load(Relaxed) / 1_000);
    }
}

/// An attempt's outcome, in the calls' words: `ok`, `tool_error` (the
/// tool's error, retried or not) or `timed_out`.
pub(crate) fn attempt_outcome<T, E, X>(span: &Span, result: &Result<Result<T, E>, X>) {
    span.record(
        "idem.outcome",
        match result {
            Ok(Ok(_)) => Outcome::Ok.label(),
            Ok(Err(_)) => Outcome::ToolError.label(),
            Err(_) => Outcome::TimedOut.label(),
        },
    );
}

/// `verify`'s answer, as `idem_verify_total`'s `verdict` label says it
/// (`timed_out` when it ran out of the tool's timeout).
pub(crate) fn verify_outcome<T, E>(
    span: &Span,
    answer: &Result<Result<crate::failure::Verdict<T>, E>, String>,
) {
    use crate::failure::Verdict;
    span.record(
        "idem.verdict",
        match answer {
            Ok(Ok(Verdict::Landed(_))) => "landed",
            Ok(Ok(Verdict::NotLanded)) => "not_landed",
            Ok(Ok(Verdict::Unknown)) => "unknown",
            Ok(Err(_)) => "error",
            Err(_) => "timed_out",
        },
    );
}
