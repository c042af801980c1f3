//! This runtime's metrics, and their Prometheus text rendering (served by
//! the admin API as `GET /metrics`).
//!
//! Everything counted here is this worker's: the calls made through one
//! `Runtime` (and its clones and `Ctx`s) since it was opened, which for a
//! worker process is since it started. Nothing is read back from the
//! journal's history: other workers sharing a PostgreSQL journal count
//! their own calls. The one exception is `idem_escalations_open`, the
//! journal's count at the moment of the scrape (the same from every worker
//! of a journal).
//!
//! The hot path is lock-free: a call resolves its tool's slot by a hash of
//! the tool's name in an insert-only table of lazily filled cells
//! ([`Metrics::tool`]), then counts with relaxed atomics.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use idem_journal::audit::EventKind;
use idem_journal::class::Class;
use idem_journal::error::Error;
use idem_journal::journal::Durability;

use crate::class::ToolDescriptor;
use crate::error::ToolError;

/// Upper bounds of `idem_call_duration_seconds`' buckets: from a replay
/// (microseconds) to a slow provider with retries (a minute).
const CALL_BUCKETS: [(u64, &str); 19] = [
    (10_000, "0.00001"),
    (50_000, "0.00005"),
    (100_000, "0.0001"),
    (500_000, "0.0005"),
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (50_000_000, "0.05"),
    (100_000_000, "0.1"),
    (250_000_000, "0.25"),
    (500_000_000, "0.5"),
    (1_000_000_000, "1"),
    (2_500_000_000, "2.5"),
    (5_000_000_000, "5"),
    (10_000_000_000, "10"),
    (30_000_000_000, "30"),
    (60_000_000_000, "60"),
];

/// Upper bounds of `idem_journal_commit_seconds`' buckets: from a write
/// that rides a later flush (microseconds) to a slow fsync (a second).
const COMMIT_BUCKETS: [(u64, &str); 15] = [
    (10_000, "0.00001"),
    (50_000, "0.00005"),
    (100_000, "0.0001"),
    (250_000, "0.00025"),
    (500_000, "0.0005"),
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (50_000_000, "0.05"),
    (100_000_000, "0.1"),
    (250_000_000, "0.25"),
    (500_000_000, "0.5"),
    (1_000_000_000, "1"),
];

/// How a call ended, as `idem_calls_total`'s `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    ToolError,
    Escalated,
    InFlight,
    ArgsMismatch,
    Abandoned,
    AwaitingApproval,
    NotApproved,
    TimedOut,
    Rejected,
    Failed,
    Error,
    /// The call's future was dropped before it returned.
    Cancelled,
}

impl Outcome {
    pub(crate) const ALL: [Outcome; 13] = [
        Outcome::Ok,
        Outcome::ToolError,
        Outcome::Escalated,
        Outcome::InFlight,
        Outcome::ArgsMismatch,
        Outcome::Abandoned,
        Outcome::AwaitingApproval,
        Outcome::NotApproved,
        Outcome::TimedOut,
        Outcome::Rejected,
        Outcome::Failed,
        Outcome::Error,
        Outcome::Cancelled,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::Escalated => "escalated",
            Outcome::InFlight => "in_flight",
            Outcome::ArgsMismatch => "args_mismatch",
            Outcome::Abandoned => "abandoned",
            Outcome::AwaitingApproval => "awaiting_approval",
            Outcome::NotApproved => "not_approved",
            Outcome::TimedOut => "timed_out",
            Outcome::Rejected => "rejected",
            Outcome::Failed => "failed",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }

    pub(crate) fn of<T, E>(result: &Result<T, ToolError<E>>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(ToolError::Tool(_) | ToolError::Compensated { .. }) => Outcome::ToolError,
            Err(ToolError::Escalated { .. }) => Outcome::Escalated,
            Err(ToolError::InFlight { .. }) => Outcome::InFlight,
            Err(ToolError::ArgsMismatch { .. }) => Outcome::ArgsMismatch,
            Err(ToolError::Abandoned { .. }) => Outcome::Abandoned,
            Err(ToolError::AwaitingApproval { .. }) => Outcome::AwaitingApproval,
            Err(ToolError::NotApproved { .. }) => Outcome::NotApproved,
            Err(ToolError::Journal(Error::TimedOut { .. })) => Outcome::TimedOut,
            Err(ToolError::Journal(Error::Rejected { .. })) => Outcome::Rejected,
            Err(ToolError::Journal(Error::Failed { .. })) => Outcome::Failed,
            Err(ToolError::Journal(_)) => Outcome::Error,
        }
    }
}

/// `verify`'s answers, as `idem_verify_total`'s `verdict` label says them
/// (an error's text is not a label: it would make a series per message).
const VERDICTS: [&str; 4] = ["landed", "not_landed", "unknown", "error"];

fn verdict_index(verdict: &str) -> usize {
    match verdict {
        "landed" => 0,
        "not_landed" => 1,
        "unknown" => 2,
        _ => 3,
    }
}

/// A histogram of durations: a count per bucket (not cumulative; the
/// last is above every bound) and the sum.
struct Histogram {
    bounds: &'static [(u64, &'static str)],
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [(u64, &'static str)]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    fn observe(&self, elapsed: std::time::Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = self
            .bounds
            .iter()
            .position(|(bound, _)| ns <= *bound)
            .unwrap_or(self.bounds.len());
        self.counts[bucket].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Its `_bucket`, `_sum` and `_count` lines; `labels` are the series'
    /// other labels, rendered (`tool="x",` or empty).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, (_, le)) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {cumulative}");
        }
        cumulative += self.counts[self.bounds.len()].load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}");
        let braces = |labels: &str| {
            let labels = labels.trim_end_matches(',');
            if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            }
        };
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {cumulative}", braces(labels));
    }
}

/// One tool's counters.
pub(crate) struct ToolMetrics {
    name: Box<str>,
    hash: u64,
    /// Set by its first call (events of tools not called here, such as an
    /// operator's resolution of an older escalation, leave it unset).
    class: OnceLock<Class>,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    attempts: AtomicU64,
    dedupe_hits: AtomicU64,
    provider_replays: AtomicU64,
    verdicts: [AtomicU64; VERDICTS.len()],
    escalations_opened: AtomicU64,
    escalations_settled: AtomicU64,
    /// Calls begun: journaled ones, then read-only ones. Those in flight
    /// are the begun ones that have no outcome yet, and a read-only call's
    /// first attempt is counted by its beginning: one atomic add per call
    /// instead of three (a read-only call's whole overhead is a few of
    /// them).
    begun: [AtomicU64; 2],
    duration: Histogram,
    /// The runtime has recorded a call of this tool in `Shared::called`
    /// (so that later calls need not take its lock to find it there).
    pub(crate) recorded: AtomicBool,
}

impl ToolMetrics {
    fn new(name: &str, hash: u64) -> ToolMetrics {
        ToolMetrics {
            name: name.into(),
            hash,
            class: OnceLock::new(),
            outcomes: Default::default(),
            attempts: AtomicU64::new(0),
            dedupe_hits: AtomicU64::new(0),
            provider_replays: AtomicU64::new(0),
            verdicts: Default::default(),
            escalations_opened: AtomicU64::new(0),
            escalations_settled: AtomicU64::new(0),
            begun: Default::default(),
            duration: Histogram::new(&CALL_BUCKETS),
            recorded: AtomicBool::new(false),
        }
    }

    /// Counts a read-only attempt after the first (the first is counted
    /// when the call begins; journaled calls' attempts are counted from
    /// their `Attempt` events).
    pub(crate) fn retried(&self) {
        self.attempts.fetch_add(1, Relaxed);
    }

    /// Attempts made: journaled ones from their events, read-only ones
    /// from the calls begun and their retries.
    fn attempts(&self) -> u64 {
        self.attempts.load(Relaxed) + self.begun[1].load(Relaxed)
    }

    /// Calls begun and not returned yet. The counters are read one after
    /// the other without ordering, so a reading taken while calls begin and
    /// end may be off by those calls (never below zero).
    fn in_flight(&self) -> u64 {
        let ended = self.calls();
        let begun = self.begun[0].load(Relaxed) + self.begun[1].load(Relaxed);
        begun.saturating_sub(ended)
    }

    /// Calls made (returned, or dropped before they did) of every class,
    /// whatever their outcome (for `Runtime::stats` and the calls in
    /// flight).
    pub(crate) fn calls(&self) -> u64 {
        self.outcomes.iter().map(|c| c.load(Relaxed)).sum()
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn class(&self) -> Option<Class> {
        self.class.get().copied()
    }
}

/// Cells of one table; a table that has no room in a name's probe window
/// goes on in the next one.
const TABLE_CELLS: usize = 64;
const PROBES: usize = 8;

struct Table {
    cells: Box<[OnceLock<Box<ToolMetrics>>]>,
    next: OnceLock<Box<Table>>,
}

impl Table {
    fn new() -> Table {
        Table {
            cells: (0..TABLE_CELLS).map(|_| OnceLock::new()).collect(),
            next: OnceLock::new(),
        }
    }
}

/// A runtime's metrics.
pub(crate) struct Metrics {
    tools: Table,
    /// Record writes, by durability (immediate, eventual).
    commits: [Histogram; 2],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            tools: Table::new(),
            commits: [
                Histogram::new(&COMMIT_BUCKETS),
                Histogram::new(&COMMIT_BUCKETS),
            ],
        }
    }
}

/// FxHash's mixing over 8-byte words: names are short, and this is on
/// every call's path. The last word is read without a copy through the
/// stack (a copy there, then an 8-byte load of it, stalls the load: it
/// was half of this function's time).
fn hash(name: &str) -> u64 {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mix = |h: u64, word: u64| (h.rotate_left(5) ^ word).wrapping_mul(K);
    let bytes = name.as_bytes();
    let mut h: u64 = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        h = mix(h, word(chunk));
    }
    let last = match bytes.len() {
        // The last eight bytes, overlapping the words already mixed.
        n if n >= 8 => word(&bytes[n - 8..]),
        _ => chunks
            .remainder()
            .iter()
            .rev()
            .fold(0, |w, &b| (w << 8) | u64::from(b)),
    };
    h = mix(h, last);
    h ^ (h >> 29)
}

/// The first eight bytes of `bytes` as a little-endian word.
fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(w)
}

impl Metrics {
    /// The slot of the tool `name`, made on first use. Lock-free: cells are
    /// filled once and never emptied, so a name's cell is the first one of
    /// its probe window that is empty or holds it.
    pub(crate) fn tool(&self, name: &str) -> &ToolMetrics {
        let h = hash(name);
        let mut table = &self.tools;
        loop {
            for probe in 0..PROBES {
                let cell = &table.cells[(h as usize).wrapping_add(probe) % TABLE_CELLS];
                let m = cell.get_or_init(|| Box::new(ToolMetrics::new(name, h)));
                if m.hash == h && *m.name == *name {
                    return m;
                }
            }
            table = table.next.get_or_init(|| Box::new(Table::new()));
        }
    }

    /// Every tool slot, in no order.
    pub(crate) fn tools(&self) -> Vec<&ToolMetrics> {
        let mut out = Vec::new();
        let mut table = Some(&self.tools);
        while let Some(t) = table {
            out.extend(t.cells.iter().filter_map(|c| c.get().map(|b| &**b)));
            table = t.next.get().map(|b| &**b);
        }
        out
    }

    /// Starts timing a call of `tool`: in flight until the guard is
    /// finished or dropped.
    pub(crate) fn call(&self, tool: &'static ToolDescriptor) -> Metered<'_> {
        let slot = self.tool(tool.name);
        slot.class.get_or_init(|| tool.class);
        slot.begun[usize::from(!tool.class.is_journaled())].fetch_add(1, Relaxed);
        Metered {
            slot,
            started: tokio::time::Instant::now(),
            outcome: Outcome::Cancelled,
        }
    }

    /// Counts what an audit event records (called for every event
    /// published).
    pub(crate) fn event(&self, tool: &str, kind: &EventKind) {
        let counter = |f: fn(&ToolMetrics) -> &AtomicU64| {
            f(self.tool(tool)).fetch_add(1, Relaxed);
        };
        match kind {
            EventKind::Attempt { .. } => counter(|m| &m.attempts),
            EventKind::DedupeHit => counter(|m| &m.dedupe_hits),
            EventKind::ProviderReplay { .. } => counter(|m| &m.provider_replays),
            EventKind::Escalated { .. } => counter(|m| &m.escalations_opened),
            EventKind::Resolved { .. } => counter(|m| &m.escalations_settled),
            EventKind::Verified { verdict } => {
                self.tool(tool).verdicts[verdict_index(verdict)].fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }

    /// Times one record write at `durability`.
    pub(crate) fn commit(&self, durability: Durability) -> Timed<'_> {
        Timed {
            histogram: &self.commits[match durability {
                Durability::Immediate => 0,
                Durability::Eventual => 1,
            }],
            started: std::time::Instant::now(),
        }
    }

    /// The Prometheus text exposition (format 0.0.4) of these metrics, with
    /// the journal's open escalations.
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn render(&self, escalations_open: u64, approvals_pending: u64) -> String {
        let mut tools = self.tools();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = String::with_capacity(1024 + 2048 * tools.len());
        let tool_label = |m: &ToolMetrics| format!("tool=\"{}\"", escape(&m.name));
        let class_label = |m: &ToolMetrics| m.class().map_or("unknown", |c| c.as_str());

        header(
            &mut out,
            "idem_calls_total",
            "counter",
            "Calls made through this worker since it started, by how they ended.",
        );
        for m in &tools {
            for (outcome, n) in Outcome::ALL.iter().zip(&m.outcomes) {
                let n = n.load(Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "idem_calls_total{{{},class=\"{}\",outcome=\"{}\"}} {n}",
                        tool_label(m),
                        class_label(m),
                        outcome.label()
                    );
                }
            }
        }
        header(
            &mut out,
            "idem_attempts_total",
            "counter",
            "Attempts that called the provider.",
        );
        for m in &tools {
            let _ = writeln!(
                out,
                "idem_attempts_total{{{},class=\"{}\"}} {}",
                tool_label(m),
                class_label(m),
                m.attempts()
            );
        }
        let per_tool = |out: &mut String, name: &str, help: &str, f: fn(&ToolMetrics) -> u64| {
            header(out, name, "counter", help);
            for m in &tools {
                let _ = writeln!(out, "{name}{{{}}} {}", tool_label(m), f(m));
            }
        };
        per_tool(
            &mut out,
            "idem_dedupe_hits_total",
            "Calls answered from the journal without calling the provider.",
            |m| m.dedupe_hits.load(Relaxed),
        );
        per_tool(
            &mut out,
            "idem_provider_replays_total",
            "Responses the provider reported as replays of our key.",
            |m| m.provider_replays.load(Relaxed),
        );
        header(
            &mut out,
            "idem_verify_total",
            "counter",
            "Answers of verify about an unknown outcome.",
        );
        for m in &tools {
            for (verdict, n) in VERDICTS.iter().zip(&m.verdicts) {
                let n = n.load(Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "idem_verify_total{{{},verdict=\"{verdict}\"}} {n}",
                        tool_label(m)
                    );
                }
            }
        }
        per_tool(
            &mut out,
            "idem_escalations_opened_total",
            "Operations this worker parked for a human.",
            |m| m.escalations_opened.load(Relaxed),
        );
        per_tool(
            &mut out,
            "idem_escalations_settled_total",
            "Escalations settled by an operator through this worker.",
            |m| m.escalations_settled.load(Relaxed),
        );
        header(
            &mut out,
            "idem_escalations_open",
            "gauge",
            "Operations parked for a human in the journal now (every worker of a journal reports the same).",
        );
        let _ = writeln!(out, "idem_escalations_open {escalations_open}");
        header(
            &mut out,
            "idem_approvals_pending",
            "gauge",
            "Calls waiting for a person's approval in the journal now (every worker of a journal reports the same).",
        );
        let _ = writeln!(out, "idem_approvals_pending {approvals_pending}");
        header(
            &mut out,
            "idem_calls_in_flight",
            "gauge",
            "Calls being made through this worker now.",
        );
        let in_flight: u64 = tools.iter().map(|m| m.in_flight()).sum();
        let _ = writeln!(out, "idem_calls_in_flight {in_flight}");
        header(
            &mut out,
            "idem_call_duration_seconds",
            "histogram",
            "How long calls took, from the call to its return.",
        );
        for m in tools.iter().filter(|m| m.duration.count() > 0) {
            let labels = format!("{},class=\"{}\",", tool_label(m), class_label(m));
            m.duration
                .render(&mut out, "idem_call_duration_seconds", &labels);
        }
        header(
            &mut out,
            "idem_journal_commit_seconds",
            "histogram",
            "How long the journal took to write a record with its events.",
        );
        for (histogram, durability) in self.commits.iter().zip(["immediate", "eventual"]) {
            let labels = format!("durability=\"{durability}\",");
            histogram.render(&mut out, "idem_journal_commit_seconds", &labels);
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value as the text format quotes it: backslash, double quote
/// and line feed escaped.
pub(crate) fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.into()
}

/// A `# HELP` text: backslash and line feed escaped.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A call being timed; counted with its outcome when finished, as
/// `cancelled` when dropped before.
pub(crate) struct Metered<'a> {
    slot: &'a ToolMetrics,
    /// On tokio's clock, so that the call's driver can count its retry
    /// budget from the same reading (one clock read fewer per call; a
    /// paused test clock drives both).
    started: tokio::time::Instant,
    outcome: Outcome,
}

impl<'a> Metered<'a> {
    /// The call returned `result`; passes it through.
    pub(crate) fn finish<T, E>(
        mut self,
        result: Result<T, ToolError<E>>,
    ) -> Result<T, ToolError<E>> {
        self.outcome = Outcome::of(&result);
        result
    }

    /// Its tool's slot.
    pub(crate) fn slot(&self) -> &'a ToolMetrics {
        self.slot
    }

    /// When the call began.
    pub(crate) fn started(&self) -> tokio::time::Instant {
        self.started
    }
}

impl Drop for Metered<'_> {
    fn drop(&mut self) {
        let slot = self.slot;
        slot.duration.observe(self.started.elapsed());
        slot.outcomes[self.outcome as usize].fetch_add(1, Relaxed);
    }
}

/// A record write being timed; observed when dropped.
pub(crate) struct Timed<'a> {
    histogram: &'a Histogram,
    started: std::time::Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("plain_tool"), "plain_tool");
        assert_eq!(escape(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape("two\nlines"), "two\\nlines");
        assert_eq!(escape_help("x\\y\nz"), "x\\\\y\\nz");
    }

    #[test]
    fn every_outcome_has_its_own_index_and_label() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{o:?}");
        }
        let labels: std::collections::BTreeSet<_> =
            Outcome::ALL.iter().map(|o| o.label()).collect();
        assert_eq!(labels.len(), Outcome::ALL.len());
    }

    #[test]
    fn many_tools_get_slots_of_their_own() {
        let m = Metrics::default();
        // More names than one table holds, so that later tables are used.
        for i in 0..500 {
            m.tool(&format!("tool_{i}")).retried();
            m.tool(&format!("tool_{i}")).retried();
        }
        let tools = m.tools();
        assert_eq!(tools.len(), 500);
        for t in tools {
            assert_eq!(t.attempts.load(Relaxed), 2, "{}", t.name());
        }
        assert!(std::ptr::eq(m.tool("tool_7"), m.tool("tool_7")));
    }

    #[test]
    fn names_that_differ_in_their_last_byte_hash_apart() {
        // Every length across the word boundaries: the last byte is mixed
        // in whether it is in a whole word, the overlapping last word or
        // a short remainder.
        for len in 1..=40 {
            let stem = "t".repeat(len - 1);
            let hashes: std::collections::BTreeSet<u64> = (b'a'..=b'z')
                .map(|c| hash(&format!("{stem}{}", c as char)))
                .collect();
            assert_eq!(hashes.len(), 26, "length {len}");
        }
        assert_ne!(hash(""), hash("\0"));
    }

    #[test]
    fn calls_in_flight_and_read_only_attempts_come_from_calls_begun() {
        static LOOKUP: ToolDescriptor = ToolDescriptor::new("lookup", Class::ReadOnly);
        static PAY: ToolDescriptor = ToolDescriptor::new("pay", Class::Provider);
        let m = Metrics::default();
        let value = |out: &str, series: &str| -> String {
            out.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {series} in\n{out}"))
                .to_string()
        };
        let lookup_attempts = "idem_attempts_total{tool=\"lookup\",class=\"read_only\"}";
        let pay_attempts = "idem_attempts_total{tool=\"pay\",class=\"provider\"}";

        let lookup = m.call(&LOOKUP);
        let pay = m.call(&PAY);
        let out = m.render(0, 0);
        assert_eq!(value(&out, "idem_calls_in_flight"), "2");
        // A read-only call's first attempt counts when it begins; a
        // journaled call's attempts come from its events.
        assert_eq!(value(&out, lookup_attempts), "1");
        assert_eq!(value(&out, pay_attempts), "0");

        lookup.slot().retried();
        drop(lookup);
        let out = m.render(0, 0);
        assert_eq!(value(&out, "idem_calls_in_flight"), "1");
        assert_eq!(value(&out, lookup_attempts), "2");

        let _ = pay.finish(Ok::<(), ToolError<()>>(()));
        let out = m.render(0, 0);
        assert_eq!(value(&out, "idem_calls_in_flight"), "0");
        assert_eq!(m.tool("pay").calls() + m.tool("lookup").calls(), 2);
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let h = Histogram::new(&COMMIT_BUCKETS);
        h.observe(std::time::Duration::from_micros(10)); // exactly a bound: in it
        h.observe(std::time::Duration::from_millis(3));
        h.observe(std::time::Duration::from_secs(2)); // above every bound
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "durability=\"immediate\",");
        let line = |le: &str| {
            let prefix = format!("x_seconds_bucket{{durability=\"immediate\",le=\"{le}\"}} ");
            out.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("no bucket {le} in\n{out}"))
                .to_string()
        };
        assert_eq!(line("0.00001"), "1");
        assert_eq!(line("0.0025"), "1");
        assert_eq!(line("0.005"), "2");
        assert_eq!(line("1"), "2");
        assert_eq!(line("+Inf"), "3");
        assert!(
            out.contains("x_seconds_count{durability=\"immediate\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_sum{durability=\"immediate\"} 2.00301\n"),
            "{out}"
        );
    }

    #[test]
    fn the_exposition_names_tools_escaped_and_counts_events() {
        let m = Metrics::default();
        let name = "evil\"} 1\nidem_fake{x=\"\\";
        m.event(name, &EventKind::DedupeHit);
        m.event(name, &EventKind::DedupeHit);
        m.event(
            name,
            &EventKind::Verified {
                verdict: "error: boom \"quoted\"".into(),
            },
        );
        m.event("mailer", &EventKind::Attempt { attempt: 1 });
        m.event("mailer", &EventKind::StepRecorded);
        let text = m.render(3, 0);
        let escaped = r#"tool="evil\"} 1\nidem_fake{x=\"\\""#;
        assert!(
            text.contains(&format!("idem_dedupe_hits_total{{{escaped}}} 2\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "idem_verify_total{{{escaped},verdict=\"error\"}} 1\n"
            )),
            "{text}"
        );
        assert!(
            text.contains("idem_attempts_total{tool=\"mailer\",class=\"unknown\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("idem_escalations_open 3\n"), "{text}");
        assert!(text.contains("idem_approvals_pending 0\n"), "{text}");
        // Every line is a comment or one sample: the tool's name broke no
        // line, and no sample of a made-up name appeared.
        for line in text.lines() {
            assert!(
                line.starts_with("# HELP idem_")
                    || line.starts_with("# TYPE idem_")
                    || line.starts_with("idem_"),
                "{line:?}"
            );
            assert!(!line.starts_with("idem_fake"), "{line:?}");
        }
    }
}
