//! Fixtures for engine tests: a scripted provider that keeps its own ledger
//! (what the effects really were), and shorthands that drive
//! `__private::call` the way the code `#[tool]` generates does. Shared by
//! idem-runtime's engine tests and the backend [conformance
//! suite](crate::conformance).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[allow(unused_imports)]
use idem_runtime::__private::{self, Args, Capture, CaptureOpaque as _, CaptureSerialize as _};
use idem_runtime::{
    Class, Classify, Ctx, EventKind, Failure, IdemKey, OnDrift, RetryPolicy, Runtime,
    ToolDescriptor, ToolError, Verdict,
};
use tokio::sync::watch;

/// The tool error of the scripted provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestError {
    /// Never reached the provider (connection refused).
    Refused,
    /// May have landed.
    Timeout,
    /// The provider said no.
    Declined,
}

impl std::fmt::Display for TestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TestError::Refused => "the provider refused the connection",
            TestError::Timeout => "the provider did not answer in time",
            TestError::Declined => "the provider declined the request",
        })
    }
}

impl Classify for TestError {
    fn classify(&self) -> Failure {
        match self {
            TestError::Refused => Failure::not_sent(),
            TestError::Timeout => Failure::ambiguous(),
            TestError::Declined => Failure::Semantic,
        }
    }
}

/// What the fake provider does with the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Applies the effect and answers.
    Ok,
    /// Never reached the provider.
    Refuse,
    /// Applies the effect, then the answer is lost.
    LandThenTimeout,
    /// Does not apply, but the caller cannot know.
    LoseThenTimeout,
    /// Refuses semantically.
    Decline,
    /// Applies the effect, then never answers (the future stays pending).
    LandThenHang,
    /// Never answers, applies nothing.
    Hang,
    /// Never answers; the provider applies the effect this many seconds
    /// later (a request still being processed when its caller is gone).
    LandAfter(u64),
    /// Applies the effect, then answers `Ok` once [`ScriptedProvider::release`]
    /// is called (a provider that is slow to answer).
    LandThenHeld,
    /// Waits for [`ScriptedProvider::release`], then applies and answers.
    Held,
}

/// A provider with a ledger of effects, a script of behaviours and, when
/// `dedupe` is on, Stripe-like replay on the key.
#[derive(Clone)]
pub struct ScriptedProvider {
    inner: Arc<Mutex<ProviderState>>,
    /// Requests received so far, to wait on.
    received: watch::Sender<usize>,
    /// Whether held requests may answer.
    released: watch::Sender<bool>,
}

impl Default for ScriptedProvider {
    fn default() -> Self {
        ScriptedProvider {
            inner: Arc::default(),
            received: watch::channel(0).0,
            released: watch::channel(false).0,
        }
    }
}

#[derive(Default)]
struct ProviderState {
    script: VecDeque<Step>,
    dedupe: bool,
    /// Every effect applied: (key, payload).
    ledger: Vec<(String, String)>,
    /// Every request received: (key, attempt).
    requests: Vec<(String, u32)>,
    log: Option<Arc<Mutex<Vec<String>>>>,
    /// How long each request takes before the provider acts on it.
    delay: Duration,
}

impl ScriptedProvider {
    /// A provider that plays `script`, then answers `Ok`.
    pub fn new(script: &[Step]) -> Self {
        let p = ScriptedProvider::default();
        p.inner.lock().unwrap().script = script.iter().copied().collect();
        p
    }

    /// A provider that takes `delay` (tokio time) before acting on each
    /// request, so that concurrent callers really overlap.
    pub fn slow(script: &[Step], delay: Duration) -> Self {
        let p = ScriptedProvider::new(script);
        p.inner.lock().unwrap().delay = delay;
        p
    }

    /// A provider that also replays a key it has seen (Stripe's
    /// idempotency keys).
    pub fn deduping(script: &[Step]) -> Self {
        let p = ScriptedProvider::new(script);
        p.inner.lock().unwrap().dedupe = true;
        p
    }

    /// Appends to the script.
    pub fn push(&self, steps: &[Step]) {
        self.inner
            .lock()
            .unwrap()
            .script
            .extend(steps.iter().copied());
    }

    /// Also writes `provider call KEY` to `log` on every request (e.g. a
    /// `FaultyJournal`'s log, to order calls against barriers).
    pub fn log_to(&self, log: Arc<Mutex<Vec<String>>>) {
        self.inner.lock().unwrap().log = Some(log);
    }

    /// Effects applied.
    pub fn effects(&self) -> usize {
        self.inner.lock().unwrap().ledger.len()
    }

    /// Effects applied under `key` (more than one: a duplicate).
    pub fn effects_for(&self, key: &str) -> usize {
        let s = self.inner.lock().unwrap();
        s.ledger.iter().filter(|(k, _)| k == key).count()
    }

    /// Requests received under `key`.
    pub fn requests_for(&self, key: &str) -> usize {
        let s = self.inner.lock().unwrap();
        s.requests.iter().filter(|(k, _)| k == key).count()
    }

    /// Requests received.
    pub fn requests(&self) -> Vec<(String, u32)> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// How many requests it received.
    pub fn calls(&self) -> usize {
        self.inner.lock().unwrap().requests.len()
    }

    /// What `verify` would find: the effect recorded under `key`.
    pub fn find(&self, key: &str) -> Option<String> {
        self.inner
            .lock()
            .unwrap()
            .ledger
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    /// The provider side of one request made by a tool call.
    pub async fn handle(&self, ctx: &Ctx, payload: &str) -> Result<String, TestError> {
        let key = ctx.idempotency_key().as_str().to_string();
        let (out, replayed) = self.handle_raw(key, ctx.attempt(), payload).await;
        if replayed {
            ctx.mark_provider_replay();
        }
        out
    }

    /// The provider side of one request; also says whether it was a replay.
    pub async fn handle_raw(
        &self,
        key: String,
        attempt: u32,
        payload: &str,
    ) -> (Result<String, TestError>, bool) {
        let delay = self.inner.lock().unwrap().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let step = {
            let mut s = self.inner.lock().unwrap();
            s.requests.push((key.clone(), attempt));
            let n = s.requests.len();
            self.received.send_replace(n);
            if let Some(log) = &s.log {
                log.lock().unwrap().push(format!("provider call {key}"));
            }
            let step = s.script.pop_front().unwrap_or(Step::Ok);
            if step == Step::Refuse {
                return (Err(TestError::Refused), false);
            }
            if s.dedupe {
                if let Some((_, v)) = s.ledger.iter().find(|(k, _)| *k == key) {
                    return (Ok(format!("done:{v}")), true);
                }
            }
            let lands = matches!(
                step,
                Step::Ok | Step::LandThenTimeout | Step::LandThenHang | Step::LandThenHeld
            );
            if lands {
                s.ledger.push((key.clone(), payload.to_string()));
            }
            if let Step::LandAfter(secs) = step {
                let (inner, key, payload) = (self.inner.clone(), key.clone(), payload.to_string());
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(secs)).await;
                    inner.lock().unwrap().ledger.push((key, payload));
                });
            }
            step
        };
        let out = match step {
            Step::Ok => Ok(format!("done:{payload}")),
            Step::LandThenTimeout | Step::LoseThenTimeout => Err(TestError::Timeout),
            Step::Decline => Err(TestError::Declined),
            Step::LandThenHang | Step::Hang | Step::LandAfter(_) => std::future::pending().await,
            Step::LandThenHeld => {
                self.held().await;
                Ok(format!("done:{payload}"))
            }
            Step::Held => {
                self.held().await;
                let mut s = self.inner.lock().unwrap();
                if s.dedupe {
                    if let Some((_, v)) = s.ledger.iter().find(|(k, _)| *k == key) {
                        return (Ok(format!("done:{v}")), true);
                    }
                }
                s.ledger.push((key.clone(), payload.to_string()));
                Ok(format!("done:{payload}"))
            }
            Step::Refuse => unreachable!(),
        };
        (out, false)
    }

    async fn held(&self) {
        let mut rx = self.released.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Lets every held request answer, now and from now on.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Held requests wait again, from now on, for the next
    /// [`ScriptedProvider::release`] (a test that holds requests more than
    /// once).
    pub fn hold(&self) {
        self.released.send_replace(false);
    }

    /// Waits until it has received `n` requests in all.
    pub async fn wait_requests(&self, n: usize) {
        let mut rx = self.received.subscribe();
        let _ = rx.wait_for(|c| *c >= n).await;
    }

    /// `verify` against this provider.
    pub fn verdict(&self, ctx: &Ctx) -> Verdict<String> {
        match self.find(ctx.idempotency_key().as_str()) {
            Some(p) => Verdict::Landed(format!("done:{p}")),
            None => Verdict::NotLanded,
        }
    }
}

/// A descriptor with Temporal's retry intervals and no jitter (for tests
/// under tokio's paused clock).
pub fn tool(name: &'static str, class: Class) -> &'static ToolDescriptor {
    tool_with(name, class, |_| {})
}

/// [`tool`], changed by `f`.
pub fn tool_with(
    name: &'static str,
    class: Class,
    f: impl FnOnce(&mut ToolDescriptor),
) -> &'static ToolDescriptor {
    let mut d = ToolDescriptor::new(name, class);
    d.retry = RetryPolicy {
        jitter: false,
        ..RetryPolicy::DEFAULT
    };
    d.on_drift = OnDrift::Replay;
    d.check_landed = Some(__private::landed::<String>);
    f(&mut d);
    Box::leak(Box::new(d))
}

/// Arguments as `#[tool]` records them.
pub fn args(order: u64, body: &str) -> Args {
    let mut a = Args::new();
    (&&Capture(&order)).capture(&mut a, "order");
    (&&Capture(&body)).capture(&mut a, "body");
    a
}

/// The key of a call of `tool` for `order` under `ctx`.
pub fn key(ctx: &Ctx, tool: &'static ToolDescriptor, order: u64) -> IdemKey {
    __private::key(ctx, tool).field(&order).finish()
}

/// How verify answers in a test.
#[derive(Clone)]
pub enum VerifyMode {
    /// Looks the key up at the provider.
    Provider,
    /// Answers `Unknown`.
    Unknown,
    /// Fails.
    Fails,
    /// The tool has no verify function (`verify = "none"`).
    None,
}

/// One call, as the code `#[tool]` generates would make it.
pub async fn call(
    ctx: &Ctx,
    tool: &'static ToolDescriptor,
    provider: &ScriptedProvider,
    order: u64,
    body: &str,
    verify: VerifyMode,
) -> Result<String, ToolError<TestError>> {
    let key = key(ctx, tool, order);
    let mut args = args(order, body);
    if tool.approve.is_some() {
        // As `approve = "always"` expands: every call asks.
        args.needs_approval(Some(format!("every call of {} needs a person", tool.name)));
    }
    let p = provider.clone();
    let attempt = move |c: Ctx| {
        let p = p.clone();
        let body = body.to_string();
        async move { p.handle(&c, &body).await }
    };
    let vp = provider.clone();
    let mode = verify.clone();
    let verify_fn = move |c: Ctx| {
        let vp = vp.clone();
        let mode = mode.clone();
        async move {
            match mode {
                VerifyMode::Provider => Ok(vp.verdict(&c)),
                VerifyMode::Unknown => Ok(Verdict::Unknown),
                VerifyMode::Fails => Err(TestError::Refused),
                VerifyMode::None => unreachable!(),
            }
        }
    };
    let verify_opt = match verify {
        VerifyMode::None => None,
        _ => Some(verify_fn),
    };
    __private::call(ctx, tool, key, args, attempt, verify_opt).await
}

/// The usual call of a test: root run "run", order 1, body "a".
pub async fn call1(
    rt: &Runtime,
    tool: &'static ToolDescriptor,
    provider: &ScriptedProvider,
    verify: VerifyMode,
) -> Result<String, ToolError<TestError>> {
    call(&rt.run("run"), tool, provider, 1, "a", verify).await
}

/// Opens a sled journal's runtime, panicking on failure.
pub fn open(dir: &std::path::Path) -> Runtime {
    Runtime::open(dir).expect("open journal")
}

/// The kinds of every event in `rt`'s audit stream, in order.
pub async fn events(rt: &Runtime) -> Vec<EventKind> {
    rt.audit(0)
        .await
        .expect("read the audit stream")
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

/// The reason of an escalation; panics, showing the error, on anything else.
pub fn escalation_reason<E: std::fmt::Debug>(err: ToolError<E>) -> String {
    match err {
        ToolError::Escalated { reason, .. } => reason,
        other => panic!("expected an escalation, got {other:?}"),
    }
}
