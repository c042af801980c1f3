//! Human-readable output: tables and evidence, the way an operator reads
//! them to decide.

use std::fmt::Write as _;

use idem_runtime::admin::{OperationView, PruneView, Resolved, StatsView, ToolInfo};
use idem_runtime::{AuditEvent, Escalation, EventKind};

use crate::backend::ToolName;

/// `2024-05-01 12:00:00.123Z` for a time in ms since the epoch (UTC).
pub fn time(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's algorithm, in eras of 400 years).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `3 min ago`, relative to `now_ms`.
pub fn ago(ms: u64, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(ms) / 1000;
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

/// Now, in ms since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn duration(ms: u64) -> String {
    match ms {
        0 => "0".into(),
        ms if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// `idem tools`, with a running process.
pub fn tools(tools: &[ToolInfo]) -> String {
    let mut out = String::new();
    if tools.is_empty() {
        out.push_str("no tools in the running program\n");
        return out;
    }
    let width = tools.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(
        out,
        "{:<width$}  {:<12}  {:<24}  {:<8}  {:<7}  verify",
        "TOOL", "CLASS", "KEY", "ATTEMPTS", "TIMEOUT"
    );
    for t in tools {
        let _ = writeln!(
            out,
            "{:<width$}  {:<12}  {:<24}  {:<8}  {:<7}  {}",
            t.name,
            t.class.as_str(),
            if t.key_fields.is_empty() {
                "-".to_string()
            } else {
                t.key_fields.join(", ")
            },
            t.retry.max_attempts,
            t.timeout_ms.map_or("-".into(), duration),
            t.verify.as_deref().unwrap_or("-"),
        );
    }
    let examples: Vec<&ToolInfo> = tools
        .iter()
        .filter(|t| t.example_result.is_some())
        .collect();
    if !examples.is_empty() {
        out.push_str("\nlatest committed result per tool (the shape a --landed result takes):\n");
        for t in examples {
            if let Some(e) = &t.example_result {
                let _ = writeln!(out, "  {:<width$}  {}", t.name, e.result);
            }
        }
    }
    out
}

/// `idem tools`, with the journal opened by this process: `why` says why
/// only names are known (see [`Backend::no_registry`](crate::Backend::no_registry)).
pub fn tool_names(names: &[ToolName], why: &str) -> String {
    let mut out = format!("{why};\nthese are the tools the journal's audit stream names\n\n");
    let width = names.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(out, "{:<width$}  CALLS", "TOOL");
    for t in names {
        let _ = writeln!(out, "{:<width$}  {}", t.name, t.calls);
    }
    out
}

/// `idem escalations`: each with the evidence to decide on.
pub fn escalations(list: &[Escalation], now_ms: u64) -> String {
    let mut out = String::new();
    match list.len() {
        0 => {
            out.push_str("no escalations: nothing waits for an operator\n");
            return out;
        }
        1 => out.push_str("1 escalation waits for an operator\n"),
        n => {
            let _ = writeln!(out, "{n} escalations wait for an operator (newest first)");
        }
    }
    let mut list: Vec<&Escalation> = list.iter().collect();
    list.sort_by_key(|e| std::cmp::Reverse(e.escalated_ms));
    for e in list {
        out.push('\n');
        out.push_str(&escalation(e, now_ms));
    }
    out
}

/// One escalation's evidence.
pub fn escalation(e: &Escalation, now_ms: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", e.key);
    let _ = writeln!(out, "  tool         {} ({})", e.tool, e.class);
    let scope = if e.scope.is_empty() {
        String::new()
    } else {
        format!(", scope {}", e.scope.join("/"))
    };
    let _ = writeln!(out, "  run          {}{scope}", e.root_run);
    out.push_str(&arguments(&e.args));
    let _ = writeln!(out, "  attempts     {}", e.attempts);
    let _ = writeln!(
        out,
        "  last error   {}",
        e.last_error.as_deref().unwrap_or("-")
    );
    let _ = writeln!(
        out,
        "  verify said  {}",
        e.verify_answer.as_deref().unwrap_or(match e.class {
            idem_runtime::Class::AtMostOnce => "- (at_most_once: nothing can look it up)",
            _ => "- (not asked)",
        })
    );
    let _ = writeln!(out, "  first try    {}", time(e.first_attempt_ms));
    let _ = writeln!(
        out,
        "  escalated    {} ({})",
        time(e.escalated_ms),
        ago(e.escalated_ms, now_ms)
    );
    let _ = writeln!(out, "  reason       {}", e.reason);
    out
}

fn arguments(args: &serde_json::Value) -> String {
    let mut out = String::new();
    match args.as_object() {
        Some(map) if !map.is_empty() => {
            let width = map.keys().map(String::len).max().unwrap_or(0);
            for (i, (name, value)) in map.iter().enumerate() {
                let label = if i == 0 { "arguments" } else { "" };
                let _ = writeln!(out, "  {label:<11}  {name:<width$} = {value}");
            }
        }
        _ => {
            let _ = writeln!(out, "  arguments    {args}");
        }
    }
    out
}

/// `idem show KEY`.
pub fn operation(view: &OperationView) -> String {
    let op = &view.operation;
    let mut out = String::new();
    let _ = writeln!(out, "{}", op.key);
    let _ = writeln!(out, "  tool         {} ({})", op.tool, op.class);
    let _ = writeln!(out, "  state        {}", op.state);
    let scope = if op.scope.is_empty() {
        String::new()
    } else {
        format!(", scope {}", op.scope.join("/"))
    };
    let _ = writeln!(out, "  run          {}{scope}", op.root_run);
    out.push_str(&arguments(&op.args));
    let _ = writeln!(out, "  generation   {}", op.generation);
    let _ = writeln!(out, "  attempts     {}", op.attempts);
    if let Some(result) = &op.result {
        let _ = writeln!(
            out,
            "  result       {result} (via {})",
            op.committed_via.as_deref().unwrap_or("?")
        );
    }
    for (label, value) in [
        ("error", &op.error),
        ("last error", &op.last_error),
        ("verify said", &op.verify_answer),
        ("escalated", &op.escalation_reason),
        ("claimed by", &op.claimed_by),
    ] {
        if let Some(v) = value {
            let _ = writeln!(out, "  {label:<11}  {v}");
        }
    }
    if let Some(r) = &op.resolution {
        let _ = writeln!(
            out,
            "  resolution   {} at {}{}: {}",
            r.kind,
            time(r.at_ms),
            if r.amendments > 0 {
                format!(" (amended {} time(s))", r.amendments)
            } else {
                String::new()
            },
            r.note
        );
    }
    let _ = writeln!(out, "  first try    {}", time(op.first_attempt_ms));
    let _ = writeln!(out, "  updated      {}", time(op.updated_ms));
    let _ = writeln!(out, "\nhistory ({} events):", view.history.len());
    out.push_str(&audit_header());
    for e in &view.history {
        out.push_str(&audit_line(e));
    }
    out
}

/// The header of `idem audit`.
pub fn audit_header() -> String {
    format!(
        "{:>8}  {:<24}  {:<14}  {:<8}  event\n",
        "SEQ", "TIME", "TOOL", "BY"
    )
}

/// One line of `idem audit`.
pub fn audit_line(e: &AuditEvent) -> String {
    format!(
        "{:>8}  {:<24}  {:<14}  {:<8}  {}{}\n",
        e.seq,
        time(e.at_ms),
        e.tool,
        if e.agent == "operator" {
            "operator"
        } else {
            "agent"
        },
        event(&e.kind),
        e.key
            .as_deref()
            .map(|k| format!("  [{}]", abbreviate(k)))
            .unwrap_or_default()
    )
}

/// What an event says, in a few words.
pub fn event(kind: &EventKind) -> String {
    match kind {
        EventKind::Intent { generation, .. } => format!("intent (generation {generation})"),
        EventKind::Attempt { attempt } => format!("attempt {attempt}"),
        EventKind::Retry {
            attempt,
            delay_ms,
            failure,
            error,
        } => format!("attempt {attempt} failed ({failure}: {error}); retry in {delay_ms} ms"),
        EventKind::Committed { attempt, via } => match via.as_str() {
            "call" => format!("committed (attempt {attempt})"),
            other => format!("committed via {other}"),
        },
        EventKind::Rejected { error } => format!("rejected by the provider: {error}"),
        EventKind::Failed { error } => format!("failed: {error}"),
        EventKind::DedupeHit => "replayed from the journal (no call)".into(),
        EventKind::ProviderReplay { attempt } => {
            format!("the provider replayed its answer (attempt {attempt})")
        }
        EventKind::Recovered { state, attempts } => {
            format!("recovered from {state} after {attempts} attempt(s)")
        }
        EventKind::Verified { verdict } => format!("verify: {verdict}"),
        EventKind::ArgsDrift { policy } => format!("arguments drifted ({policy:?})"),
        EventKind::Escalated { reason } => format!("ESCALATED: {reason}"),
        EventKind::Amended {
            previous,
            resolution,
            note,
        } => format!("amended {previous} -> {resolution}: {note}"),
        EventKind::Fenced { attempt, outcome } => {
            format!("fenced off (attempt {attempt}, learned {outcome})")
        }
        EventKind::Settling { wait_ms } => format!("settling {wait_ms} ms before verify"),
        EventKind::Resolved { resolution, note } => format!("resolved {resolution}: {note}"),
        EventKind::Refused { reason } => format!("refused: {reason}"),
        EventKind::StepRecorded => "step recorded".into(),
        EventKind::StepReplayed => "step replayed".into(),
    }
}

/// `charge-1a2b3c4d…-g0`.
fn abbreviate(key: &str) -> String {
    match key.rsplit_once("-g") {
        Some((head, generation)) if head.len() > 64 => {
            format!("{}…-g{generation}", &head[..head.len() - 56])
        }
        _ => key.to_string(),
    }
}

/// `idem stats`.
pub fn stats(view: &StatsView) -> String {
    let mut out = String::new();
    let width = view
        .stats
        .tools
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<width$}  {:>6} {:>8} {:>7} {:>7} {:>8} {:>8} {:>6} {:>7} {:>9}",
        "TOOL",
        "CALLS",
        "ATTEMPTS",
        "RETRIES",
        "DEDUPE",
        "REPLAYED",
        "RECOVERED",
        "VERIFY",
        "COMMITS",
        "ESCALATED"
    );
    for (tool, s) in &view.stats.tools {
        let _ = writeln!(
            out,
            "{:<width$}  {:>6} {:>8} {:>7} {:>7} {:>8} {:>8} {:>6} {:>7} {:>9}",
            tool,
            s.calls,
            s.attempts,
            s.retries,
            s.dedupe_hits,
            s.provider_replays,
            s.recoveries,
            s.verifications,
            s.commits,
            s.escalations
        );
    }
    let _ = writeln!(out, "\njournal size on disk: {} bytes", view.journal_bytes);
    out
}

/// `idem migrate`.
pub fn migrated(done: &crate::pg::Migrated) -> String {
    if done.created {
        format!(
            "created the idem journal's tables at {} (schema version {})\n",
            done.location, done.schema_version
        )
    } else {
        format!(
            "the idem journal at {} has schema version {}, the one this build reads: nothing \
             to do\n",
            done.location, done.schema_version
        )
    }
}

/// `idem prune`.
pub fn prune(view: &PruneView) -> String {
    format!(
        "pruned what finished before {}: {} of {} operations removed ({} kept: not finished), \
         {} steps and {} audit events removed{}\n",
        time(view.cutoff_ms),
        view.ops_removed,
        view.ops_scanned,
        view.ops_kept_open,
        view.steps_removed,
        view.events_removed,
        if view.undecodable > 0 {
            format!("; {} undecodable records left alone", view.undecodable)
        } else {
            String::new()
        }
    )
}

/// `idem resolve`.
pub fn resolved(r: &Resolved) -> String {
    let op = &r.operation;
    let mut out = format!("resolved {} as {}", r.key, r.resolution);
    if let Some(res) = &op.resolution {
        if res.amendments > 0 {
            let _ = write!(out, " (amending an earlier resolution)");
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "  the operation is now {}; {}",
        op.state,
        match r.resolution.as_str() {
            "landed" => "later calls replay the given result",
            "reissue" => "the next call runs it again, with the same key",
            _ => "later calls return Abandoned",
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(time(0), "-");
        assert_eq!(time(1), "1970-01-01 00:00:00.001Z");
        assert_eq!(time(951_782_400_000), "2000-02-29 00:00:00.000Z");
        assert_eq!(time(1_717_243_200_123), "2024-06-01 12:00:00.123Z");
        assert_eq!(time(4_102_444_799_999), "2099-12-31 23:59:59.999Z");
    }

    #[test]
    fn ages_and_durations_read_naturally() {
        assert_eq!(ago(1_000, 61_000), "1 min ago");
        assert_eq!(ago(5_000, 1_000), "0 s ago");
        assert_eq!(duration(600), "600ms");
        assert_eq!(duration(86_400_000), "1d");
        assert_eq!(duration(30_000), "30s");
    }
}
