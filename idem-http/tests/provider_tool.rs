//! `#[tool]`s whose body is `idem::http::send`, run through the real
//! runtime against a provider on 127.0.0.1 that deduplicates by key.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem::http::{self, HttpError, KeyHeader, RequestBuilderExt};
use idem::{tool, AuditEvent, Ctx, EventKind, Runtime, ToolError, Verdict};
use serde::{Deserialize, Serialize};
use support::{runtime, Answer, Seen, Server};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: u64,
}

struct Payments {
    client: reqwest::Client,
    base: String,
}

#[tool]
impl Payments {
    fn new(server: &Server) -> Payments {
        Payments {
            client: http::client_builder().build().unwrap(),
            base: server.url(""),
        }
    }

    /// The provider tool as a user writes it: the body is the helper.
    #[tool(
        class = "provider",
        key = "order_id",
        retry(initial = "1ms", jitter = false)
    )]
    async fn charge(&self, ctx: &Ctx, order_id: u64, cents: u64) -> Result<Charge, HttpError> {
        let request = self
            .client
            .post(format!("{}/v1/charges", self.base))
            .json(&serde_json::json!({ "order": order_id, "amount": cents }));
        Ok(http::send(ctx, request).await?.json().await?)
    }

    /// The same, with the key in the IETF draft's quoted form; returns the
    /// key it was called with.
    #[tool(class = "provider", key = "order_id")]
    async fn quoted(&self, ctx: &Ctx, order_id: u64) -> Result<String, HttpError> {
        self.client
            .post(format!("{}/v1/charges", self.base))
            .idempotency_key_as(ctx, KeyHeader::Quoted)
            .send_idem(ctx)
            .await?;
        Ok(ctx.idempotency_key().to_string())
    }

    #[tool(class = "provider", key = "order_id")]
    async fn stripe(&self, ctx: &Ctx, order_id: u64) -> Result<String, HttpError> {
        self.client
            .post(format!("{}/v1/charges", self.base))
            .send_idem(ctx)
            .await?;
        Ok(ctx.idempotency_key().to_string())
    }

    #[tool(class = "journal", timeout = "30s", key = "order_id", verify = charge_landed, retry(initial = "1ms"))]
    async fn journaled(&self, ctx: &Ctx, order_id: u64) -> Result<String, HttpError> {
        let request = self.client.post(format!("{}/v1/charges", self.base));
        Ok(http::send(ctx, request).await?.text().await?)
    }

    async fn charge_landed(&self, _ctx: &Ctx) -> Result<Verdict<String>, HttpError> {
        Ok(Verdict::Landed("found by verify".into()))
    }

    #[tool(class = "at_most_once", key = "order_id")]
    async fn once(&self, ctx: &Ctx, order_id: u64) -> Result<String, HttpError> {
        let request = self.client.post(format!("{}/v1/charges", self.base));
        Ok(http::send(ctx, request).await?.text().await?)
    }
}

/// A Stripe-like provider: applies a charge once per key and stores its
/// response; a request with a stored key gets that response back with
/// `Idempotent-Replayed: true`. `first` is what the first request of a key
/// is answered with once applied (its stored response is the 200).
#[derive(Default)]
struct Provider {
    applied: Mutex<HashMap<String, String>>,
}

impl Provider {
    fn answer(&self, seen: &Seen, first: &Answer) -> Answer {
        let key = seen.header("idempotency-key").expect("no key").to_string();
        let mut applied = self.applied.lock().unwrap();
        if let Some(stored) = applied.get(&key) {
            return Answer::with(200, &[("idempotent-replayed", "true")], stored);
        }
        let id = format!("ch_{}", applied.len() + 1);
        applied.insert(key, format!("{{\"id\":\"{id}\",\"amount\":1999}}"));
        first.clone()
    }

    fn effects(&self) -> usize {
        self.applied.lock().unwrap().len()
    }
}

/// Every event of the audit stream.
async fn audit(rt: &Runtime) -> Vec<AuditEvent> {
    rt.audit(0).await.unwrap()
}

async fn provider_replays(rt: &Runtime) -> Vec<u32> {
    audit(rt)
        .await
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::ProviderReplay { attempt } => Some(attempt),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_500_after_applying_is_retried_with_the_same_key_and_replayed() {
    let provider = Arc::new(Provider::default());
    let p = provider.clone();
    let mut server = Server::start(move |seen| p.answer(seen, &Answer::status(500))).await;
    let (_dir, rt) = runtime();
    let payments = Payments::new(&server);

    let charge = payments
        .charge(&rt.run("order-4711"), 4711, 1999)
        .await
        .unwrap();

    assert_eq!(
        charge,
        Charge {
            id: "ch_1".into(),
            amount: 1999
        }
    );
    assert_eq!(provider.effects(), 1, "one charge at the provider");
    let (first, second) = (server.next().await, server.next().await);
    assert_eq!(server.requests(), 2);
    let key = first.header("idempotency-key").unwrap();
    assert_eq!(second.header("idempotency-key"), Some(key));
    assert!(key.starts_with("payments__charge-"), "{key}");
    assert_eq!(
        provider_replays(&rt).await,
        vec![2],
        "attempt 2 was the provider's replay"
    );
    assert_eq!(
        rt.stats().await.unwrap().tools["Payments::charge"].provider_replays,
        1
    );
}

#[tokio::test]
async fn a_fresh_answer_is_not_marked_as_a_replay() {
    let provider = Arc::new(Provider::default());
    let p = provider.clone();
    let stored = "{\"id\":\"ch_1\",\"amount\":1999}";
    let server = Server::start(move |seen| p.answer(seen, &Answer::with(200, &[], stored))).await;
    let (_dir, rt) = runtime();
    let payments = Payments::new(&server);
    payments.charge(&rt.run("order-1"), 1, 1999).await.unwrap();
    assert_eq!(provider.effects(), 1);
    assert_eq!(provider_replays(&rt).await, Vec::<u32>::new());
}

#[tokio::test]
async fn the_key_header_as_the_server_saw_it_in_both_forms() {
    let mut server = Server::always(Answer::status(200)).await;
    let (_dir, rt) = runtime();
    let payments = Payments::new(&server);
    let ctx = rt.run("order-7");

    let key = payments.stripe(&ctx, 7).await.unwrap();
    let seen = server.next().await;
    assert_eq!(
        seen.raw_header("idempotency-key"),
        Some(format!("idempotency-key: {key}").as_str())
    );

    let key = payments.quoted(&ctx, 7).await.unwrap();
    let seen = server.next().await;
    assert_eq!(
        seen.raw_header("idempotency-key"),
        Some(format!("idempotency-key: \"{key}\"").as_str())
    );
    assert_eq!(
        seen.headers
            .iter()
            .filter(|(n, _)| n == "idempotency-key")
            .count(),
        1
    );
}

/// 409 to the first request of each key (an earlier request with it is
/// still being processed), then the provider's answer.
fn conflict_then(provider: Arc<Provider>) -> impl Fn(&Seen) -> Answer + Send + Sync {
    let conflicted = Mutex::new(std::collections::HashSet::new());
    move |seen| {
        let key = seen.header("idempotency-key").expect("no key").to_string();
        if conflicted.lock().unwrap().insert(key) {
            Answer::with(
                409,
                &[("retry-after", "0")],
                "{\"error\":\"idempotency_key_in_use\"}",
            )
        } else {
            provider.answer(
                seen,
                &Answer::with(200, &[], "{\"id\":\"ch_1\",\"amount\":1999}"),
            )
        }
    }
}

#[tokio::test]
async fn a_conflict_on_our_key_is_retried_with_the_same_key_by_a_provider_tool() {
    let provider = Arc::new(Provider::default());
    let mut server = Server::start(conflict_then(provider.clone())).await;
    let (_dir, rt) = runtime();
    let payments = Payments::new(&server);
    let charge = payments.charge(&rt.run("order-9"), 9, 1999).await.unwrap();
    assert_eq!(charge.id, "ch_1");
    let (first, second) = (server.next().await, server.next().await);
    assert_eq!(
        first.header("idempotency-key"),
        second.header("idempotency-key")
    );
    assert_eq!(provider.effects(), 1);
}

#[tokio::test]
async fn a_conflict_on_our_key_is_never_re_run_blindly_by_journal_or_at_most_once() {
    let provider = Arc::new(Provider::default());
    let server = Server::start(conflict_then(provider.clone())).await;
    let (_dir, rt) = runtime();
    let payments = Payments::new(&server);

    // journal: verify is asked before anything is sent again.
    let result = payments.journaled(&rt.run("order-10"), 10).await.unwrap();
    assert_eq!(result, "found by verify");
    assert_eq!(server.requests(), 1);

    // at_most_once: the first request may still land; a human decides.
    let err = payments.once(&rt.run("order-11"), 11).await.unwrap_err();
    assert!(matches!(err, ToolError::Escalated { .. }), "{err:?}");
    assert_eq!(server.requests(), 2, "one request for each tool");
    let escalation = &rt.escalations().await.unwrap()[0];
    assert!(escalation.reason.contains("409"), "{}", escalation.reason);
}

#[tokio::test]
async fn a_refusal_is_returned_at_once_with_its_excerpt() {
    let server = Server::always(Answer::with(402, &[], "{\"error\":\"card_declined\"}")).await;
    let (_dir, rt) = runtime();
    let payments = Payments::new(&server);
    let err = payments
        .charge(&rt.run("order-12"), 12, 1999)
        .await
        .unwrap_err();
    let ToolError::Tool(err) = err else {
        panic!("{err:?}")
    };
    assert_eq!(err.body_excerpt(), Some("{\"error\":\"card_declined\"}"));
    assert_eq!(server.requests(), 1, "not retried");
}

/// A journal tool whose email API takes no key, and whose `verify` asks
/// with a GET: neither sends `Idempotency-Key`.
struct Mailer {
    /// The client, named through the re-export.
    client: http::reqwest::Client,
    base: String,
    /// How this tool's sends set the key.
    key: http::KeyMode,
}

#[tool]
impl Mailer {
    #[tool(class = "journal", timeout = "30s", key = "message_id", verify = mail_landed, retry(initial = "1ms", jitter = false))]
    async fn mail(&self, ctx: &Ctx, message_id: u64) -> Result<String, HttpError> {
        let request = self
            .client
            .post(format!("{}/v1/mail/{message_id}", self.base));
        Ok(http::send_with(ctx, request, self.key)
            .await?
            .text()
            .await?)
    }

    async fn mail_landed(&self, ctx: &Ctx) -> Result<Verdict<String>, HttpError> {
        let request = self.client.get(format!("{}/v1/mail", self.base));
        let _ = request.send_idem_unkeyed(ctx).await?;
        Ok(Verdict::Landed("found".into()))
    }
}

#[tokio::test]
async fn the_key_header_can_be_left_out_per_tool_and_per_request() {
    let mut server = Server::start(|seen| {
        // The first send of the mail is answered 503 (ambiguous): the
        // engine asks `verify` before sending again.
        if seen.method == "POST" && seen.target.ends_with("/2") {
            Answer::status(503)
        } else {
            Answer::with(200, &[], "sent")
        }
    })
    .await;
    let (_dir, rt) = runtime();
    let base = server.url("");
    let mailer = |key| Mailer {
        client: http::client_builder().build().unwrap(),
        base: base.clone(),
        key,
    };
    let ctx = rt.run("mail");
    let unkeyed = mailer(http::KeyMode::Omit);
    assert_eq!(unkeyed.mail(&ctx, 1).await.unwrap(), "sent");
    let seen = server.next().await;
    assert_eq!(seen.header("idempotency-key"), None, "{:?}", seen.headers);

    // An ambiguous send, then verify's GET: neither keyed.
    assert_eq!(unkeyed.mail(&ctx, 2).await.unwrap(), "found");
    let (post, get) = (server.next().await, server.next().await);
    assert_eq!((post.method.as_str(), get.method.as_str()), ("POST", "GET"));
    assert_eq!(post.header("idempotency-key"), None);
    assert_eq!(get.header("idempotency-key"), None);

    // The same tool with the header in the quoted form; and a header the
    // request set itself is removed under `Omit`.
    let quoted = mailer(http::KeyMode::Header(KeyHeader::Quoted));
    quoted.mail(&ctx, 3).await.unwrap();
    let seen = server.next().await;
    let key = seen.header("idempotency-key").expect("keyed");
    assert!(key.starts_with('"') && key.ends_with("-g0\""), "{key}");
    let request = reqwest::Client::new()
        .get(format!("{base}/v1/mail"))
        .header("idempotency-key", "set-by-hand");
    http::send_unkeyed(&ctx, request).await.unwrap();
    assert_eq!(server.next().await.header("idempotency-key"), None);
}
