//! Human-readable output: tables and evidence, the way an operator reads
//! them to decide.
//!
//! Everything printed here that did not come from this program (tool
//! names, run ids and scopes an MCP client chose, arguments, providers'
//! error texts, verify's answers, operators' notes, the admin API's error
//! messages) goes through [`escape`] first, so that no control character
//! reaches the terminal: a newline cannot start a forged `verify said`
//! line, and an escape sequence cannot recolour, move the cursor or
//! rewrite what is shown. `--json` output is JSON, escaped by its encoder.

use std::borrow::Cow;
use std::fmt::Write as _;

use idem_runtime::admin::{Decided, OperationView, PruneView, Resolved, StatsView, ToolInfo};
use idem_runtime::{Approval, AuditEvent, Escalation, EventKind, SagaState, SagaStep, SagaView};

/// Tools as a journal opened directly knows them: only by name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolName {
    /// The tool's name, as its audit events carry it.
    pub name: String,
    /// Calls counted in the audit stream.
    pub calls: u64,
}

/// Text that came from outside this program, made safe to print on a
/// terminal: every control character (C0 such as `\n`, `\r`, ESC and BEL,
/// DEL, and the C1 range U+0080..U+009F that some terminals read as CSI),
/// the bidirectional formatting characters (U+061C, U+200E, U+200F,
/// U+202A..U+202E, U+2066..U+2069: they reorder what is displayed) and the
/// line and paragraph separators U+2028, U+2029 are written as escapes:
/// `\n`, `\r`, `\t`, else `\u{..}` with the code point in hex. All other
/// text, backslashes included, is kept as is, so ordinary text reads as it
/// was written (an escape in the output shows that the text held that
/// character, or a backslash followed by the same letters).
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Whether [`escape`] rewrites `c`.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// A JSON value as one escaped line (serde_json escapes C0 controls in
/// strings, not DEL, C1 or bidi controls).
fn json(value: &serde_json::Value) -> String {
    escape(&value.to_string()).into_owned()
}

/// The width of the widest of `names` once escaped, at least `min`.
fn width<'a>(names: impl Iterator<Item = &'a str>, min: usize) -> usize {
    names
        .map(|n| escape(n).chars().count())
        .max()
        .unwrap_or(min)
        .max(min)
}

/// A failed command as the binary prints it on stderr: `idem: error: ...`
/// and, when there is one, `idem: hint: ...`, both escaped (the message
/// may quote the admin API, a database or a provider).
pub fn error(e: &crate::CliError) -> String {
    let mut out = format!("idem: error: {}\n", escape(&e.message));
    if let Some(hint) = &e.hint {
        let _ = writeln!(out, "idem: hint: {}", escape(hint));
    }
    out
}

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
    let width = width(tools.iter().map(|t| t.name.as_str()), 4);
    let _ = writeln!(
        out,
        "{:<width$}  {:<12}  {:<24}  {:<8}  {:<7}  verify",
        "TOOL", "CLASS", "KEY", "ATTEMPTS", "TIMEOUT"
    );
    for t in tools {
        let _ = writeln!(
            out,
            "{:<width$}  {:<12}  {:<24}  {:<8}  {:<7}  {}",
            escape(&t.name),
            t.class.as_str(),
            if t.key_fields.is_empty() {
                "-".to_string()
            } else {
                escape(&t.key_fields.join(", ")).into_owned()
            },
            t.retry.max_attempts,
            t.timeout_ms.map_or("-".into(), duration),
            escape(t.verify.as_deref().unwrap_or("-")),
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
                let _ = writeln!(out, "  {:<width$}  {}", escape(&t.name), json(&e.result));
            }
        }
    }
    out
}

/// `idem tools`, with the journal opened by this process: `why` says why
/// only names are known (see [`Backend::no_registry`](crate::Backend::no_registry)).
pub fn tool_names(names: &[ToolName], why: &str) -> String {
    let mut out = format!(
        "{};\nthese are the tools the journal's audit stream names\n\n",
        escape(why)
    );
    let width = width(names.iter().map(|t| t.name.as_str()), 4);
    let _ = writeln!(out, "{:<width$}  CALLS", "TOOL");
    for t in names {
        let _ = writeln!(out, "{:<width$}  {}", escape(&t.name), t.calls);
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
    let _ = writeln!(out, "{}", escape(e.key.as_str()));
    let _ = writeln!(out, "  tool         {} ({})", escape(&e.tool), e.class);
    let _ = writeln!(out, "  run          {}", run(&e.root_run, &e.scope));
    out.push_str(&arguments(&e.args));
    let _ = writeln!(out, "  attempts     {}", e.attempts);
    let _ = writeln!(
        out,
        "  last error   {}",
        escape(e.last_error.as_deref().unwrap_or("-"))
    );
    let _ = writeln!(
        out,
        "  verify said  {}",
        escape(e.verify_answer.as_deref().unwrap_or(match e.class {
            idem_runtime::Class::AtMostOnce => "- (at_most_once: nothing can look it up)",
            _ => "- (not asked)",
        }))
    );
    let _ = writeln!(out, "  first try    {}", time(e.first_attempt_ms));
    let _ = writeln!(
        out,
        "  escalated    {} ({})",
        time(e.escalated_ms),
        ago(e.escalated_ms, now_ms)
    );
    let _ = writeln!(out, "  reason       {}", escape(&e.reason));
    out
}

/// `order-4711, scope a/b`: a run and its scope path, escaped.
fn run(root_run: &str, scope: &[String]) -> String {
    let mut out = escape(root_run).into_owned();
    if !scope.is_empty() {
        let path: Vec<Cow<'_, str>> = scope.iter().map(|s| escape(s)).collect();
        let _ = write!(out, ", scope {}", path.join("/"));
    }
    out
}

fn arguments(args: &serde_json::Value) -> String {
    let mut out = String::new();
    match args.as_object() {
        Some(map) if !map.is_empty() => {
            let width = width(map.keys().map(String::as_str), 0);
            for (i, (name, value)) in map.iter().enumerate() {
                let label = if i == 0 { "arguments" } else { "" };
                let name = escape(name);
                let _ = writeln!(out, "  {label:<11}  {name:<width$} = {}", json(value));
            }
        }
        _ => {
            let _ = writeln!(out, "  arguments    {}", json(args));
        }
    }
    out
}

/// `idem show KEY`.
pub fn operation(view: &OperationView) -> String {
    let op = &view.operation;
    let mut out = String::new();
    let _ = writeln!(out, "{}", escape(op.key.as_str()));
    let _ = writeln!(out, "  tool         {} ({})", escape(&op.tool), op.class);
    let _ = writeln!(out, "  state        {}", escape(&op.state));
    let _ = writeln!(out, "  run          {}", run(&op.root_run, &op.scope));
    out.push_str(&arguments(&op.args));
    let _ = writeln!(out, "  generation   {}", op.generation);
    let _ = writeln!(out, "  attempts     {}", op.attempts);
    if let Some(result) = &op.result {
        let _ = writeln!(
            out,
            "  result       {} (via {})",
            json(result),
            escape(op.committed_via.as_deref().unwrap_or("?"))
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
            let _ = writeln!(out, "  {label:<11}  {}", escape(v));
        }
    }
    if let Some(r) = &op.resolution {
        let _ = writeln!(
            out,
            "  resolution   {} at {}{}: {}",
            escape(&r.kind),
            time(r.at_ms),
            if r.amendments > 0 {
                format!(" (amended {} time(s))", r.amendments)
            } else {
                String::new()
            },
            escape(&r.note)
        );
    }
    if let Some(a) = &op.approval {
        let _ = writeln!(
            out,
            "  approval     asked at {}: {}",
            time(a.requested_ms),
            escape(&a.reason)
        );
        if let (Some(approved), Some(at)) = (a.approved, a.decided_ms) {
            let _ = writeln!(
                out,
                "  decision     {} at {} through {}: {}",
                if approved { "approved" } else { "refused" },
                time(at),
                escape(a.via.as_deref().unwrap_or("-")),
                escape(a.note.as_deref().unwrap_or(""))
            );
        }
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
        "{:>8}  {:<24}  {:<14}  {:<8}  {:<24}  event\n",
        "SEQ", "TIME", "TOOL", "BY", "WORKER"
    )
}

/// One line of `idem audit`.
pub fn audit_line(e: &AuditEvent) -> String {
    format!(
        "{:>8}  {:<24}  {:<14}  {:<8}  {:<24}  {}{}\n",
        e.seq,
        time(e.at_ms),
        escape(&e.tool),
        if e.agent == "operator" {
            "operator"
        } else {
            "agent"
        },
        // Events written before journals named their worker have none.
        e.worker.as_deref().map_or(Cow::Borrowed("-"), escape),
        event(&e.kind),
        e.key
            .as_deref()
            .map(|k| format!("  [{}]", escape(&abbreviate(k))))
            .unwrap_or_default()
    )
}

/// What an event says, in a few words (escaped: errors, reasons and notes
/// are outside text).
pub fn event(kind: &EventKind) -> String {
    escape(&event_text(kind)).into_owned()
}

fn event_text(kind: &EventKind) -> String {
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
        EventKind::ApprovalRequested { reason } => format!("AWAITS APPROVAL: {reason}"),
        EventKind::Approved { note, via } => format!("approved (through {via}): {note}"),
        EventKind::NotApproved { note, via } => format!("NOT APPROVED (through {via}): {note}"),
        EventKind::SagaStarted { saga } => format!("saga {saga} started"),
        EventKind::Compensating {
            saga,
            reason,
            steps,
        } => format!("saga {saga} COMPENSATING {} step(s): {reason}", steps.len()),
        EventKind::Compensated {
            saga,
            reason,
            undone,
        } => format!(
            "saga {saga} compensated ({} undone): {reason}",
            undone.len()
        ),
        EventKind::SagaEscalated { saga, reason } => format!("saga {saga} ESCALATED: {reason}"),
        // A kind newer than this renderer (the enum grows): its JSON form.
        other => serde_json::to_string(other).unwrap_or_else(|_| format!("{other:?}")),
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
    let width = width(view.stats.tools.keys().map(String::as_str), 4);
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
            escape(tool),
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

/// `idem workers`: one line per worker (and why, when it is not
/// running).
pub fn workers(found: &[crate::workers::WorkerView]) -> String {
    let mut out = String::new();
    if found.is_empty() {
        let place = idem_runtime::admin::workers::workers_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "no workers in {}: a worker without a journal directory (PostgreSQL) appears here \
             once it serves the admin API (.admin(\"127.0.0.1:0\"))",
            escape(&place)
        );
        return out;
    }
    let width = width(found.iter().map(|w| w.worker.as_str()), 6);
    let _ = writeln!(
        out,
        "{:<width$}  {:<8}  {:<24}  {:<8}  DIR",
        "WORKER", "STATE", "URL", "PID"
    );
    for w in found {
        let _ = writeln!(
            out,
            "{:<width$}  {:<8}  {:<24}  {:<8}  {}",
            escape(&w.worker),
            w.state,
            escape(w.url.as_deref().unwrap_or("-")),
            w.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            escape(&w.dir),
        );
        if let Some(why) = &w.why {
            let _ = writeln!(out, "{:<width$}  why: {}", "", escape(why));
        }
    }
    out
}

/// `idem migrate`.
pub fn migrated(done: &crate::pg::Migrated) -> String {
    if done.created {
        format!(
            "created the idem journal's tables at {} (schema version {})\n",
            escape(&done.location),
            done.schema_version
        )
    } else {
        format!(
            "the idem journal at {} has schema version {}, the one this build reads: nothing \
             to do\n",
            escape(&done.location),
            done.schema_version
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
/// `idem approvals`.
pub fn approvals(list: &[Approval], now_ms: u64) -> String {
    let mut out = String::new();
    match list.len() {
        0 => {
            out.push_str("no approvals: no call waits for a person\n");
            return out;
        }
        1 => out.push_str("1 call waits for a person's approval\n"),
        n => {
            let _ = writeln!(out, "{n} calls wait for a person's approval (oldest first)");
        }
    }
    for a in list {
        out.push('\n');
        let _ = writeln!(out, "{}", escape(a.key.as_str()));
        let _ = writeln!(out, "  tool         {} ({})", escape(&a.tool), a.class);
        let _ = writeln!(out, "  run          {}", run(&a.root_run, &a.scope));
        out.push_str(&arguments(&a.args));
        let _ = writeln!(
            out,
            "  asked        {} ({})",
            time(a.requested_ms),
            ago(a.requested_ms, now_ms)
        );
        let _ = writeln!(out, "  reason       {}", escape(&a.reason));
    }
    out.push_str(
        "\napprove with `idem approve KEY --note TEXT`, refuse with `idem reject KEY --note TEXT`\n",
    );
    out
}

/// `idem sagas`: a table of every saga (oldest start first), then the
/// evidence of those that need a look (escalated, compensating).
pub fn sagas(list: &[SagaView], now_ms: u64) -> String {
    let mut out = String::new();
    if list.is_empty() {
        out.push_str("no sagas: the journal holds no saga's record\n");
        return out;
    }
    let count = |state: SagaState| list.iter().filter(|s| s.state == state).count();
    let _ = writeln!(
        out,
        "{} saga{} (oldest start first): {} escalated, {} compensating, {} compensated, {} running",
        list.len(),
        if list.len() == 1 { "" } else { "s" },
        count(SagaState::Escalated),
        count(SagaState::Compensating),
        count(SagaState::Compensated),
        count(SagaState::Running),
    );
    let name_width = width(list.iter().map(|s| s.saga.as_str()), 4);
    let runs: Vec<String> = list.iter().map(|s| run(&s.root_run, &s.scope)).collect();
    let run_width = runs
        .iter()
        .map(|r| r.chars().count())
        .max()
        .unwrap_or(3)
        .max(3);
    out.push('\n');
    let _ = writeln!(
        out,
        "{:<12}  {:<name_width$}  {:<run_width$}  {:<24}  UPDATED",
        "STATE", "SAGA", "RUN", "STARTED"
    );
    for (s, r) in list.iter().zip(&runs) {
        let _ = writeln!(
            out,
            "{:<12}  {:<name_width$}  {:<run_width$}  {:<24}  {}",
            state(s),
            escape(&s.saga),
            r,
            time(s.started_ms),
            ago(s.updated_ms(), now_ms),
        );
    }
    for s in list
        .iter()
        .filter(|s| matches!(s.state, SagaState::Escalated | SagaState::Compensating))
    {
        out.push('\n');
        out.push_str(&saga(s, now_ms));
    }
    if count(SagaState::Escalated) > 0 {
        out.push_str(
            "\nESCALATED: for good, undo what is left by hand (see `left:`); ESCALATED*: for now, \
             settle the compensation's own escalation (`idem escalations`) and the saga's next \
             run resumes\n",
        );
    }
    out
}

/// `ESCALATED` for good, `ESCALATED*` for now, else the state's word.
fn state(s: &SagaView) -> &'static str {
    match (s.state, s.for_good) {
        (SagaState::Escalated, true) => "ESCALATED",
        (SagaState::Escalated, false) => "ESCALATED*",
        (state, _) => state.label(),
    }
}

/// One saga's evidence.
pub fn saga(s: &SagaView, now_ms: u64) -> String {
    let mut out = String::new();
    let how = match (s.state, s.for_good) {
        (SagaState::Escalated, true) => "escalated for good: a person must finish it",
        (SagaState::Escalated, false) => {
            "escalated for now: a compensation cannot be settled yet; its next run resumes"
        }
        (SagaState::Compensating, _) => "compensating: a rollback is decided and not finished",
        (SagaState::Compensated, _) => "compensated: every completed step was undone",
        (SagaState::Running, _) => "running: no rollback decided",
    };
    let _ = writeln!(out, "saga {} ({how})", escape(&s.saga));
    let _ = writeln!(out, "  key          {}", escape(s.key.as_str()));
    let _ = writeln!(out, "  run          {}", run(&s.root_run, &s.scope));
    let _ = writeln!(
        out,
        "  reason       {}",
        escape(s.reason.as_deref().unwrap_or("-"))
    );
    let _ = writeln!(out, "  steps        {}", step_list(&s.steps));
    let _ = writeln!(out, "  undone       {}", step_list(&s.undone));
    if let Some(evidence) = &s.escalation {
        let _ = writeln!(out, "  escalation   {}", escape(evidence));
    }
    let _ = writeln!(
        out,
        "  started      {} ({})",
        time(s.started_ms),
        ago(s.started_ms, now_ms)
    );
    if let Some(at) = s.decided_ms {
        let _ = writeln!(out, "  decided      {}", time(at));
    }
    if let Some(at) = s.ended_ms {
        let _ = writeln!(out, "  ended        {} ({})", time(at), ago(at, now_ms));
    }
    out
}

/// `charge KEY, book KEY`, escaped; `-` for none.
fn step_list(steps: &[SagaStep]) -> String {
    if steps.is_empty() {
        return "-".into();
    }
    steps
        .iter()
        .map(|s| format!("{} {}", escape(&s.tool), escape(&s.key)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `idem approve` / `idem reject`.
pub fn decided(d: &Decided) -> String {
    let approved = d.decision == "approved";
    format!(
        "{} {}\n  {}\n",
        if approved { "approved" } else { "refused" },
        escape(&d.key),
        if approved {
            "its next call runs it, once, with the arguments shown by `idem approvals`"
        } else {
            "it never runs; every call of its key returns NotApproved with your note"
        }
    )
}

pub fn resolved(r: &Resolved) -> String {
    let op = &r.operation;
    let mut out = format!("resolved {} as {}", escape(&r.key), escape(&r.resolution));
    if let Some(res) = &op.resolution {
        if res.amendments > 0 {
            let _ = write!(out, " (amending an earlier resolution)");
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "  the operation is now {}; {}",
        escape(&op.state),
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

    /// Every kind of character a terminal acts on: an SGR sequence, a
    /// carriage return, newlines that start a forged evidence line, BEL,
    /// RIGHT-TO-LEFT OVERRIDE, the C1 CSI (U+009B) and NEL (U+0085), DEL,
    /// a line separator.
    const HOSTILE: &str = "ok\u{1b}[31m red\r\n  verify said  landed: forged\n\u{7}\u{202e}evil\u{9b}2J\u{85}\u{7f}\u{2028}end";
    const FORGED: &str = "verify said  landed: forged";

    /// No character a terminal acts on except the line ends the rendering
    /// itself writes, no forged line, and the hostile text still visible.
    fn assert_safe(what: &str, out: &str) {
        for (i, c) in out.chars().enumerate() {
            assert!(
                c == '\n' || !needs_escape(c),
                "{what}: raw {c:?} at char {i} in:\n{}",
                out.escape_debug()
            );
        }
        for line in out.lines() {
            assert!(
                !line.trim_start().starts_with(FORGED),
                "{what}: a forged line {line:?} in:\n{out}"
            );
        }
        assert!(
            out.contains("\\u{1b}[31m") && out.contains("\\r\\n  verify said"),
            "{what}: the hostile text is not shown escaped:\n{out}"
        );
    }

    fn key() -> String {
        format!("t-{}-g0", "ab".repeat(32))
    }

    fn operation_json() -> serde_json::Value {
        serde_json::json!({
            "key": key(),
            "tool": HOSTILE,
            "class": "journal",
            "root_run": HOSTILE,
            "scope": [HOSTILE, "b"],
            "state": HOSTILE,
            "generation": 0,
            "attempts": 1,
            "maybe_landed": true,
            "args": { HOSTILE: HOSTILE, "n": 1 },
            "result": { "id": HOSTILE },
            "committed_via": HOSTILE,
            "error": HOSTILE,
            "last_error": HOSTILE,
            "verify_answer": HOSTILE,
            "escalation_reason": HOSTILE,
            "resolution": { "kind": HOSTILE, "note": HOSTILE, "at_ms": 1, "amendments": 0 },
            "first_attempt_ms": 1,
            "updated_ms": 2,
            "claimed_by": HOSTILE,
        })
    }

    fn event(kind: serde_json::Value) -> AuditEvent {
        serde_json::from_value(serde_json::json!({
            "seq": 1, "at_ms": 1, "tool": HOSTILE, "key": HOSTILE,
            "root_run": HOSTILE, "agent": HOSTILE, "worker": HOSTILE, "kind": kind,
        }))
        .unwrap()
    }

    /// Every event kind that carries text.
    fn hostile_events() -> Vec<AuditEvent> {
        let h = HOSTILE;
        [
            serde_json::json!({"retry": {"attempt": 1, "delay_ms": 1, "failure": h, "error": h}}),
            serde_json::json!({"committed": {"attempt": 1, "via": h}}),
            serde_json::json!({"rejected": {"error": h}}),
            serde_json::json!({"failed": {"error": h}}),
            serde_json::json!({"recovered": {"state": h, "attempts": 1}}),
            serde_json::json!({"verified": {"verdict": h}}),
            serde_json::json!({"escalated": {"reason": h}}),
            serde_json::json!({"amended": {"previous": h, "resolution": h, "note": h}}),
            serde_json::json!({"fenced": {"attempt": 1, "outcome": h}}),
            serde_json::json!({"resolved": {"resolution": h, "note": h}}),
            serde_json::json!({"refused": {"reason": h}}),
        ]
        .into_iter()
        .map(event)
        .collect()
    }

    #[test]
    fn escape_writes_every_terminal_control_as_text() {
        assert_eq!(
            escape("plain text, C:\\dir \u{e9}\u{4e2d}"),
            "plain text, C:\\dir \u{e9}\u{4e2d}"
        );
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape("a\u{1b}[31mb\rc\nd\te\u{7}f\u{202e}g\u{9b}h\u{0}i\u{7f}j\u{2066}k\u{85}"),
            "a\\u{1b}[31mb\\rc\\nd\\te\\u{7}f\\u{202e}g\\u{9b}h\\u{0}i\\u{7f}j\\u{2066}k\\u{85}"
        );
    }

    #[test]
    fn hostile_text_is_escaped_in_every_human_rendering() {
        let escalation: Escalation = serde_json::from_value(serde_json::json!({
            "key": key(), "tool": HOSTILE, "class": "journal", "root_run": HOSTILE,
            "scope": [HOSTILE], "reason": HOSTILE, "args": { HOSTILE: [HOSTILE] },
            "attempts": 1, "last_error": HOSTILE, "verify_answer": HOSTILE,
            "first_attempt_ms": 1, "escalated_ms": 2,
        }))
        .unwrap();
        assert_safe(
            "escalations",
            &escalations(std::slice::from_ref(&escalation), 3),
        );
        let mut no_args = escalation;
        no_args.args = serde_json::json!(HOSTILE);
        assert_safe("escalation", &self::escalation(&no_args, 3));

        let view: OperationView = serde_json::from_value(serde_json::json!({
            "operation": operation_json(),
            "history": [],
        }))
        .unwrap();
        let mut view = view;
        view.history = hostile_events();
        assert_safe("show", &operation(&view));

        for e in hostile_events() {
            assert_safe(&format!("audit {:?}", e.kind), &audit_line(&e));
        }

        let tool: ToolInfo = serde_json::from_value(serde_json::json!({
            "name": HOSTILE, "class": "provider", "key_fields": [HOSTILE],
            "verify": HOSTILE, "dedupe_window_ms": 1, "timeout_ms": null,
            "retry": { "max_attempts": 1, "initial_ms": 1, "backoff": 2.0,
                       "max_interval_ms": 1, "max_elapsed_ms": null, "jitter": false },
            "on_drift": "replay", "redact": [], "checks_landed": true,
            "defined_at": HOSTILE,
            "example_result": { "key": HOSTILE, "result": { "id": HOSTILE } },
        }))
        .unwrap();
        assert_safe("tools", &tools(&[tool]));
        let names = [ToolName {
            name: HOSTILE.into(),
            calls: 1,
        }];
        assert_safe("tools (names)", &tool_names(&names, HOSTILE));

        let mut stats = idem_runtime::Stats::default();
        stats.tools.insert(HOSTILE.into(), Default::default());
        let stats = StatsView {
            stats,
            journal_bytes: 1,
        };
        assert_safe("stats", &self::stats(&stats));

        let resolved: Resolved = serde_json::from_value(serde_json::json!({
            "key": HOSTILE, "resolution": HOSTILE, "operation": operation_json(),
        }))
        .unwrap();
        assert_safe("resolve", &self::resolved(&resolved));

        let done = crate::pg::Migrated {
            location: HOSTILE.into(),
            schema_version: 1,
            created: true,
        };
        assert_safe("migrate", &migrated(&done));

        let step = serde_json::json!({ "tool": HOSTILE, "key": HOSTILE });
        for (state, for_good) in [
            ("escalated", true),
            ("escalated", false),
            ("compensating", false),
        ] {
            let saga: SagaView = serde_json::from_value(serde_json::json!({
                "saga": HOSTILE, "key": key(), "root_run": HOSTILE, "scope": [HOSTILE],
                "state": state, "reason": HOSTILE, "escalation": HOSTILE, "for_good": for_good,
                "steps": [step], "undone": [step], "started_ms": 1, "decided_ms": 2,
                "ended_ms": 3,
            }))
            .unwrap();
            assert_safe(&format!("sagas {state}"), &sagas(&[saga], 4));
        }

        let e = crate::CliError::new(1, "unknown_key", HOSTILE).hint(HOSTILE);
        let printed = error(&e);
        assert_safe("error", &printed);
        assert_eq!(printed.lines().count(), 2, "{printed}");
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
