//! Spans of tool calls arrive at a real OTLP/HTTP receiver (started here,
//! decoding the official protobuf messages) with their attributes, and a
//! retry's attempts are children of their call's span.

use std::collections::BTreeMap;
use std::time::Duration;

use idem_otel::Exporter;
use idem_runtime::{Class, Ctx, ToolError};
use idem_testkit::engine::{call, key, tool, ScriptedProvider, Step, TestError, VerifyMode};
use idem_testkit::otlp::{attribute, Receiver, Span};
use tracing_subscriber::layer::SubscriberExt as _;

/// The spans of everything flushed so far. `Guard::flush` returns once
/// the collector has answered, so they are here when it returns; the wait
/// is a failsafe that turns a flush that did not deliver into a failure
/// that says so, instead of a hang.
fn received(receiver: &Receiver, guard: &idem_otel::Guard) -> Vec<Span> {
    guard.flush().expect("flush the exporter");
    let spans = receiver.spans();
    assert!(receiver.errors().is_empty(), "{:?}", receiver.errors());
    if spans.is_empty() {
        let late = receiver.recv(Duration::from_secs(10));
        panic!(
            "Guard::flush returned before its spans reached the receiver; {}",
            match late {
                Some(_) => "they came later (a batch timer, not the flush, sent them)",
                None => "none came in 10 s",
            }
        );
    }
    spans
}

fn attrs(span: &Span) -> BTreeMap<String, String> {
    span.attributes
        .iter()
        .filter(|kv| kv.key.starts_with("idem."))
        .filter_map(|kv| Some((kv.key.clone(), attribute(span, &kv.key)?)))
        .collect()
}

fn only<'a>(spans: &'a [Span], what: &str, pred: impl Fn(&Span) -> bool) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| pred(s)).collect();
    assert_eq!(found.len(), 1, "one {what} expected in {spans:#?}");
    found[0]
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retried_call_and_its_replay_arrive_as_spans_with_their_attempts() {
    let receiver = Receiver::start().expect("start the OTLP receiver");
    let (layer, guard) = Exporter::to(receiver.endpoint())
        .service_name("idem-otel-test")
        .build()
        .expect("build the exporter");
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let dir = tempfile::tempdir().unwrap();
    let rt = idem_testkit::engine::open(dir.path());
    let ctx: Ctx = rt.run("run-otel");
    let charge = tool("charge", Class::Provider);
    // Refused once (retryable: it never reached the provider), then done.
    let provider = ScriptedProvider::new(&[Step::Refuse, Step::Ok]);
    let first = call(&ctx, charge, &provider, 7, "a", VerifyMode::None).await;
    assert_eq!(first.unwrap(), "done:a");
    assert_eq!(provider.calls(), 2);

    let spans = received(&receiver, &guard);
    let call_span = only(&spans, "call span", |s| s.name == "charge");
    let worker = rt.owner().to_string();
    let key = key(&ctx, charge, 7).to_string();
    let journal_us = attribute(call_span, "idem.journal_us").expect("idem.journal_us");
    journal_us
        .parse::<u64>()
        .unwrap_or_else(|e| panic!("idem.journal_us {journal_us:?}: {e}"));
    let mut got = attrs(call_span);
    got.remove("idem.journal_us");
    let want: BTreeMap<String, String> = [
        ("idem.tool", "charge"),
        ("idem.class", "provider"),
        ("idem.key", key.as_str()),
        ("idem.run", "run-otel"),
        ("idem.worker", worker.as_str()),
        ("idem.outcome", "ok"),
        ("idem.replayed", "false"),
        ("idem.attempt", "2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(got, want, "the call span's attributes");
    assert!(
        call_span.parent_span_id.is_empty(),
        "the call is a root span"
    );
    assert_eq!(call_span.trace_id.len(), 16);

    let mut attempts: Vec<&Span> = spans.iter().filter(|s| s.name == "idem.attempt").collect();
    attempts.sort_by_key(|s| attribute(s, "idem.attempt"));
    assert_eq!(attempts.len(), 2, "two attempts in {spans:#?}");
    for (n, (span, outcome)) in attempts.iter().zip(["tool_error", "ok"]).enumerate() {
        assert_eq!(
            span.parent_span_id,
            call_span.span_id,
            "attempt {} is a child of the call",
            n + 1
        );
        assert_eq!(span.trace_id, call_span.trace_id, "same trace");
        assert_eq!(
            attribute(span, "idem.attempt").as_deref(),
            Some((n + 1).to_string().as_str())
        );
        assert_eq!(attribute(span, "idem.outcome").as_deref(), Some(outcome));
    }

    // The same key again: answered from the journal, no attempt.
    let again = call(&ctx, charge, &provider, 7, "a", VerifyMode::None).await;
    assert_eq!(again.unwrap(), "done:a");
    assert_eq!(provider.calls(), 2, "a replay calls nobody");
    let spans = received(&receiver, &guard);
    let replay = only(&spans, "replay span", |s| s.name == "charge");
    assert_eq!(attribute(replay, "idem.outcome").as_deref(), Some("ok"));
    assert_eq!(attribute(replay, "idem.replayed").as_deref(), Some("true"));
    assert_eq!(attribute(replay, "idem.attempt").as_deref(), Some("0"));
    assert_eq!(attribute(replay, "idem.key"), Some(key));
    assert!(
        !spans.iter().any(|s| s.parent_span_id == replay.span_id),
        "a replay has no attempt: {spans:#?}"
    );
    assert_ne!(replay.trace_id, call_span.trace_id, "a call of its own");

    // A read-only call: a span of its own, keyless, its failed attempt
    // and its retry under it.
    let lookup = tool("lookup", Class::ReadOnly);
    let flaky = ScriptedProvider::new(&[Step::Refuse, Step::Ok]);
    let read: Result<String, ToolError<TestError>> = {
        let flaky = flaky.clone();
        idem_runtime::__private::call_read_only(&ctx, lookup, move |_c: Ctx| {
            let flaky = flaky.clone();
            async move { flaky.handle_raw("read-only".into(), 0, "b").await.0 }
        })
        .await
    };
    assert_eq!(read.unwrap(), "done:b");
    let spans = received(&receiver, &guard);
    let read_span = only(&spans, "read-only span", |s| s.name == "lookup");
    assert_eq!(
        attribute(read_span, "idem.class").as_deref(),
        Some("read_only")
    );
    assert_eq!(attribute(read_span, "idem.key"), None, "no key");
    assert_eq!(attribute(read_span, "idem.outcome").as_deref(), Some("ok"));
    assert_eq!(attribute(read_span, "idem.attempt").as_deref(), Some("2"));
    let children = spans
        .iter()
        .filter(|s| s.name == "idem.attempt" && s.parent_span_id == read_span.span_id)
        .count();
    assert_eq!(children, 2, "{spans:#?}");

    guard.shutdown().expect("shut the exporter down");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_declined_call_reports_the_tool_error() {
    let receiver = Receiver::start().expect("start the OTLP receiver");
    let (layer, guard) = Exporter::to(receiver.endpoint()).build().unwrap();
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    let dir = tempfile::tempdir().unwrap();
    let rt = idem_testkit::engine::open(dir.path());
    let refund = tool("refund", Class::Provider);
    let provider = ScriptedProvider::new(&[Step::Decline]);
    let err = call(&rt.run("r"), refund, &provider, 1, "x", VerifyMode::None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolError::Tool(TestError::Declined)),
        "{err:?}"
    );
    let spans = received(&receiver, &guard);
    let span = only(&spans, "call span", |s| s.name == "refund");
    assert_eq!(
        attribute(span, "idem.outcome").as_deref(),
        Some("tool_error")
    );
    assert_eq!(attribute(span, "idem.attempt").as_deref(), Some("1"));
    let attempt = only(&spans, "attempt", |s| s.name == "idem.attempt");
    assert_eq!(attempt.parent_span_id, span.span_id);
    assert_eq!(
        attribute(attempt, "idem.outcome").as_deref(),
        Some("tool_error")
    );
}
