//! `GET /metrics`: the token it needs (unless `public_metrics(true)`), and
//! a real Prometheus server scraping a worker through a known workload,
//! whose counts it must report exactly.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use idem::admin::AdminOptions;
use idem::{tool, Ctx, Resolution, Runtime, ToolError, Verdict};
use idem_testkit::prometheus::{Prometheus, ScrapeTarget};
use idem_testkit::{
    ChargeRequest, EmailClient, EmailMessage, Fault, PaymentsClient, ProviderError, Providers,
    SentMessage, WireClient,
};
use support::{park_a_wire, Bank, ACCOUNT, TOKEN};

/// A shop whose tools cover the classes: a provider charge, a journaled
/// email with `verify`, and a read-only look-up.
#[derive(Clone)]
struct Shop {
    payments: PaymentsClient,
    email: EmailClient,
}

impl Shop {
    #[tool(
        class = "provider",
        name = "metrics_charge",
        key = "order_id",
        retry(max_attempts = 3, initial = "1ms", max_interval = "5ms")
    )]
    async fn charge(
        &self,
        ctx: &Ctx,
        order_id: u64,
        customer: String,
    ) -> Result<u64, ProviderError> {
        let request = ChargeRequest {
            amount: 100,
            currency: "eur".into(),
            order_id,
            customer,
        };
        let charge = self
            .payments
            .charge(ctx.idempotency_key().as_str(), &request)
            .await?;
        if charge.replayed {
            ctx.mark_provider_replay();
        }
        Ok(charge.amount)
    }

    #[tool(
        class = "journal",
        name = "metrics_email",
        destructive = false,
        key = "order_id",
        verify = email_landed,
        timeout = "2s",
        retry(max_attempts = 3, initial = "1ms", max_interval = "5ms")
    )]
    async fn send_email(&self, ctx: &Ctx, order_id: u64) -> Result<SentMessage, ProviderError> {
        let message = EmailMessage {
            to: "ada@example.com".into(),
            subject: format!("order {order_id}"),
            body: "thanks".into(),
        };
        self.email
            .send(ctx.idempotency_key().as_str(), &message)
            .await
    }

    async fn email_landed(&self, ctx: &Ctx) -> Result<Verdict<SentMessage>, ProviderError> {
        let found = self
            .email
            .find_by_key(ctx.idempotency_key().as_str())
            .await?;
        Ok(match found.into_iter().next() {
            Some(m) => Verdict::Landed(m),
            None => Verdict::NotLanded,
        })
    }

    #[tool(class = "read_only", name = "metrics_lookup")]
    async fn lookup(&self, ctx: &Ctx, n: u64) -> Result<u64, ProviderError> {
        let _ = ctx;
        Ok(n * 2)
    }
}

fn open(dir: &std::path::Path, options: AdminOptions) -> Runtime {
    Runtime::builder()
        .path(dir)
        .admin_with(options)
        .open()
        .expect("open with the admin API")
}

/// `GET /metrics` with an optional bearer token: status, content type,
/// body.
async fn get_metrics(rt: &Runtime, token: Option<&str>) -> (u16, String, String) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut req = http.get(format!("{}/metrics", rt.admin_url().unwrap()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let answer = req.send().await.unwrap();
    let status = answer.status().as_u16();
    let kind = answer
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, kind, answer.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_the_token_unless_they_are_public() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = open(
        &tmp.path().join("private"),
        AdminOptions::new("127.0.0.1:0").token(TOKEN),
    );
    for token in [None, Some("wrong"), Some("test-token-0123456789abcdeF")] {
        let (status, _, body) = get_metrics(&rt, token).await;
        assert_eq!(status, 401, "{token:?}: {body}");
        assert!(body.contains("\"unauthorized\""), "{body}");
        assert!(!body.contains("idem_calls_in_flight"), "{body}");
    }
    let (status, kind, body) = get_metrics(&rt, Some(TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(kind, "text/plain; version=0.0.4; charset=utf-8");
    assert!(body.contains("\nidem_calls_in_flight 0\n"), "{body}");
    drop(rt);

    let rt = open(
        &tmp.path().join("public"),
        AdminOptions::new("127.0.0.1:0")
            .token(TOKEN)
            .public_metrics(true),
    );
    let (status, _, body) = get_metrics(&rt, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\nidem_approvals_pending 0\n"), "{body}");
    // Only the metrics are public.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = rt.admin_url().unwrap();
    let tools = http.get(format!("{url}/v1/tools")).send().await.unwrap();
    assert_eq!(tools.status().as_u16(), 401);
    let post = http.post(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(post.status().as_u16(), 405);
}

/// The counters of this test's tools: (series, its labels but the
/// scraper's own) to value.
type Counts = BTreeMap<(String, BTreeMap<String, String>), f64>;

async fn counters(prometheus: &Prometheus) -> Counts {
    let samples = prometheus
        .query(r#"{__name__=~"idem_.*_total|idem_call_duration_seconds_count", tool=~"metrics_.*|send_wire"}"#)
        .await
        .expect("query prometheus");
    samples
        .into_iter()
        .map(|s| {
            let mut labels = s.labels;
            let name = labels.remove("__name__").unwrap();
            labels.remove("job");
            labels.remove("instance");
            ((name, labels), s.value)
        })
        .collect()
}

fn series(
    name: &str,
    labels: &[(&str, &str)],
    value: f64,
) -> ((String, BTreeMap<String, String>), f64) {
    let labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ((name.to_string(), labels), value)
}

async fn gauge(prometheus: &Prometheus, name: &str) -> f64 {
    let samples = prometheus.query(name).await.expect("query prometheus");
    assert_eq!(samples.len(), 1, "{name}: {samples:?}");
    samples[0].value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_exactly_the_workload() {
    let tmp = tempfile::tempdir().unwrap();
    let providers = Providers::start().await.expect("providers");
    let addrs = providers.addrs();
    let shop = Shop {
        payments: PaymentsClient::new(addrs.payments),
        email: EmailClient::new(addrs.email),
    };
    let bank = Bank {
        client: WireClient::new(addrs.wire),
    };
    let rt = open(
        &tmp.path().join("j"),
        AdminOptions::new("127.0.0.1:0").token(TOKEN),
    );
    let prometheus = Prometheus::start(&ScrapeTarget {
        addr: rt.admin_addr().unwrap(),
        path: "/metrics".into(),
        token: Some(TOKEN.into()),
        interval: Duration::from_millis(200),
    })
    .await
    .expect("start prometheus (Debian's `prometheus` package; .ci/run installs it)");

    let ctx = rt.run("metrics-workload");
    // Three fresh charges, two of them again (replays from the journal).
    for order in 1..=3 {
        shop.charge(&ctx, order, "cus_ada".into()).await.unwrap();
    }
    for order in 1..=2 {
        shop.charge(&ctx, order, "cus_ada".into()).await.unwrap();
    }
    // The connection cut after the charge landed: retried with the same
    // key, and the provider says it replayed its answer.
    providers
        .payments()
        .faults()
        .push(Fault::disconnect_after_apply());
    shop.charge(&ctx, 4, "cus_ada".into()).await.unwrap();
    // A declined card: the tool's own error.
    match shop.charge(&ctx, 5, "cus_declined".into()).await {
        Err(ToolError::Tool(_)) => {}
        other => panic!("expected the decline, got {other:?}"),
    }
    // An email whose answer was lost: verify finds it sent.
    providers
        .email()
        .faults()
        .push(Fault::error_after_apply(500));
    shop.send_email(&ctx, 1).await.unwrap();
    // Wires: order 1 goes through, 2 and 3 are cut off after the bank
    // applied them (escalated); an operator abandons 3.
    park_a_wire(&rt, &bank, &providers).await;
    providers
        .wire()
        .faults()
        .push(Fault::disconnect_after_apply());
    let parked = match bank
        .send_wire(&rt.run("refunds"), 3, ACCOUNT.into(), 7)
        .await
    {
        Err(ToolError::Escalated { key, .. }) => key,
        other => panic!("expected an escalation, got {other:?}"),
    };
    rt.resolve(&parked, Resolution::Abandon, "refunded by hand")
        .await
        .unwrap();
    // Four look-ups.
    for n in 0..4 {
        shop.lookup(&ctx, n).await.unwrap();
    }
    let done = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();

    prometheus
        .scraped_after(done, Duration::from_secs(30))
        .await
        .expect("a scrape after the workload");
    let charge = [("tool", "metrics_charge"), ("class", "provider")];
    let email = [("tool", "metrics_email"), ("class", "journal")];
    let wire = [("tool", "send_wire"), ("class", "at_most_once")];
    let lookup = [("tool", "metrics_lookup"), ("class", "read_only")];
    let with = |base: &[(&'static str, &'static str)], more: (&'static str, &'static str)| {
        let mut v = base.to_vec();
        v.push(more);
        v
    };
    let expected: Counts = [
        series("idem_calls_total", &with(&charge, ("outcome", "ok")), 6.0),
        series(
            "idem_calls_total",
            &with(&charge, ("outcome", "tool_error")),
            1.0,
        ),
        series("idem_calls_total", &with(&email, ("outcome", "ok")), 1.0),
        series("idem_calls_total", &with(&wire, ("outcome", "ok")), 1.0),
        series(
            "idem_calls_total",
            &with(&wire, ("outcome", "escalated")),
            2.0,
        ),
        series("idem_calls_total", &with(&lookup, ("outcome", "ok")), 4.0),
        // 3 fresh, 2 for order 4, 1 declined.
        series("idem_attempts_total", &charge, 6.0),
        series("idem_attempts_total", &email, 1.0),
        series("idem_attempts_total", &wire, 3.0),
        series("idem_attempts_total", &lookup, 4.0),
        series("idem_call_duration_seconds_count", &charge, 7.0),
        series("idem_call_duration_seconds_count", &email, 1.0),
        series("idem_call_duration_seconds_count", &wire, 3.0),
        series("idem_call_duration_seconds_count", &lookup, 4.0),
        series("idem_dedupe_hits_total", &charge[..1], 2.0),
        series("idem_provider_replays_total", &charge[..1], 1.0),
        series("idem_verify_total", &[email[0], ("verdict", "landed")], 1.0),
        series("idem_escalations_opened_total", &wire[..1], 2.0),
        series("idem_escalations_settled_total", &wire[..1], 1.0),
    ]
    .into_iter()
    .chain([&charge, &email, &wire, &lookup].into_iter().flat_map(|t| {
        let tool = &t[..1];
        let mut zeros = Vec::new();
        for name in [
            "idem_dedupe_hits_total",
            "idem_provider_replays_total",
            "idem_escalations_opened_total",
            "idem_escalations_settled_total",
        ] {
            zeros.push(series(name, tool, 0.0));
        }
        zeros
    }))
    .fold(Counts::new(), |mut m, (k, v)| {
        // The non-zero ones above win over the zeros of every tool.
        m.entry(k).or_insert(v);
        m
    });
    let scraped = counters(&prometheus).await;
    if scraped != expected {
        let missing: Vec<_> = expected
            .iter()
            .filter(|(k, v)| scraped.get(*k) != Some(v))
            .collect();
        let extra: Vec<_> = scraped
            .iter()
            .filter(|(k, v)| expected.get(*k) != Some(v))
            .collect();
        panic!("expected but not scraped: {missing:#?}\nscraped but not expected: {extra:#?}");
    }
    assert_eq!(gauge(&prometheus, "idem_escalations_open").await, 1.0);
    assert_eq!(gauge(&prometheus, "idem_calls_in_flight").await, 0.0);
    assert_eq!(gauge(&prometheus, "idem_approvals_pending").await, 0.0);
    // Every fresh call's INTENT was an immediate write.
    let commits = prometheus
        .query(r#"idem_journal_commit_seconds_count{durability="immediate"}"#)
        .await
        .unwrap();
    assert!(
        commits.len() == 1 && commits[0].value >= 10.0,
        "{commits:?}"
    );
    providers.shutdown().await;
}
