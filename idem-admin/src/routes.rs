//! Requests to answers: authentication, routing, the handlers, and the
//! mapping of runtime errors to HTTP statuses with a JSON body that says
//! what was wrong.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use tokio::sync::watch;

use crate::body::Body;
use crate::files::token_matches;
use crate::follow::{self, From};
use crate::inbox;
use crate::operator::Operator;
use crate::proof;
use crate::wire::{
    ApiError, Decided, DecisionRequest, ExampleResult, OperationView, PruneView, ResolveRequest,
    Resolved, StatsView, ToolInfo,
};
use idem_journal::audit::EventKind;
use idem_journal::error::Error;
use idem_journal::key::IdemKey;

/// Largest request body accepted: a `Landed` result may be a large
/// document, but not an unbounded one.
const MAX_BODY: usize = 64 << 20;

/// The server's state, shared by its connections.
pub(crate) struct App {
    operator: Arc<dyn Operator>,
    token: String,
    instance: String,
    /// The address the server is bound to (what its proofs are bound to).
    addr: std::net::SocketAddr,
    stop: watch::Receiver<bool>,
    /// The `Host` headers a request may carry (`None`: any, for a server
    /// that allows remote clients behind a proxy).
    hosts: Option<Vec<String>>,
    /// `GET /metrics` is served without the token.
    public_metrics: bool,
    /// The latest committed operation of each tool, learned by reading the
    /// audit stream once and then only what is new.
    latest: tokio::sync::Mutex<Latest>,
}

#[derive(Default)]
struct Latest {
    /// The next audit sequence number to read.
    next: u64,
    /// Tool name to the key of its latest commit.
    commits: HashMap<String, String>,
}

type Answer = Response<Body>;

impl App {
    pub(crate) fn new(
        operator: Arc<dyn Operator>,
        token: String,
        instance: String,
        addr: std::net::SocketAddr,
        stop: watch::Receiver<bool>,
        hosts: Option<Vec<String>>,
        public_metrics: bool,
    ) -> App {
        App {
            operator,
            token,
            instance,
            addr,
            stop,
            hosts,
            public_metrics,
            latest: tokio::sync::Mutex::new(Latest::default()),
        }
    }

    pub(crate) async fn handle(&self, req: Request<Incoming>) -> Answer {
        // DNS rebinding: a page on evil.example whose name now resolves to
        // 127.0.0.1 reaches this port with its own name as the Host; only
        // the names this server is reached by are served (the page and
        // /healthz included).
        if let Some(hosts) = &self.hosts {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            if !hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
                return error(
                    StatusCode::MISDIRECTED_REQUEST,
                    "bad_host",
                    "this admin API answers only requests addressed to its loopback address \
                     (Host: 127.0.0.1:PORT, localhost:PORT or [::1]:PORT)",
                );
            }
        }
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        match path.as_str() {
            "/" | "/index.html" => return only_get(&method, || inbox::page(inbox::Asset::Html)),
            "/inbox.js" => return only_get(&method, || inbox::page(inbox::Asset::Js)),
            "/inbox.css" => return only_get(&method, || inbox::page(inbox::Asset::Css)),
            "/healthz" => {
                return only_get(&method, || self.health(req.uri().query().unwrap_or("")))
            }
            _ => {}
        }
        let route = match path.strip_prefix("/v1/") {
            Some(route) => route,
            None if path == "/metrics" => "metrics",
            None => return not_found(&path),
        };
        let public = path == "/metrics" && self.public_metrics;
        if !public && !self.authorized(&req) {
            let mut answer = error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token: send `Authorization: Bearer TOKEN` with the \
                 token from the journal directory's idem-admin-token file (or the process's \
                 IDEM_ADMIN_TOKEN)",
            );
            answer
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return answer;
        }
        if !self.operator.alive() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the runtime is shutting down",
            );
        }
        let rt = &*self.operator;
        let segments: Vec<&str> = route.split('/').collect();
        if path == "/metrics" {
            return if method == Method::GET {
                metrics(rt).await
            } else {
                method_not_allowed("GET")
            };
        }
        match (segments.as_slice(), &method) {
            (["tools"], &Method::GET) => self.tools(rt).await,
            (["escalations"], &Method::GET) => match rt.escalations().await {
                Ok(list) => json(StatusCode::OK, &list),
                Err(e) => runtime_error(&e),
            },
            (["ops", key], &Method::GET) => match parse_key(key) {
                Ok(key) => operation(rt, &key).await,
                Err(answer) => answer,
            },
            (["ops", key, "resolve"], &Method::POST) => match parse_key(key) {
                Ok(key) => resolve(rt, &key, req).await,
                Err(answer) => answer,
            },
            (["approvals"], &Method::GET) => match rt.approvals().await {
                Ok(list) => json(StatusCode::OK, &list),
                Err(e) => runtime_error(&e),
            },
            (["sagas"], &Method::GET) => match rt.sagas().await {
                Ok(list) => json(StatusCode::OK, &list),
                Err(e) => runtime_error(&e),
            },
            (["ops", key, verb @ ("approve" | "reject")], &Method::POST) => match parse_key(key) {
                Ok(key) => decide(rt, &key, *verb == "approve", req).await,
                Err(answer) => answer,
            },
            (["audit"], &Method::GET) => self.audit(req.uri().query()).await,
            (["stats"], &Method::GET) => {
                let stats = match rt.stats().await {
                    Ok(s) => s,
                    Err(e) => return runtime_error(&e),
                };
                match rt.size_on_disk().await {
                    Ok(journal_bytes) => json(
                        StatusCode::OK,
                        &StatsView {
                            stats,
                            journal_bytes,
                        },
                    ),
                    Err(e) => runtime_error(&e),
                }
            }
            (["prune"], &Method::POST) => match rt.prune().await {
                Ok(report) => json(StatusCode::OK, &PruneView::from(report)),
                Err(e) => runtime_error(&e),
            },
            (
                ["tools"]
                | ["escalations"]
                | ["approvals"]
                | ["sagas"]
                | ["ops", _]
                | ["audit"]
                | ["stats"],
                _,
            ) => method_not_allowed("GET"),
            (["ops", _, "resolve" | "approve" | "reject"] | ["prune"], _) => {
                method_not_allowed("POST")
            }
            _ => not_found(&path),
        }
    }

    /// `GET /healthz`: that the server runs and, given a client's
    /// challenge, the proof that it holds the token (see [`crate::proof`]).
    /// It says nothing else: neither the instance id nor the pid helps
    /// anyone pose as this server.
    fn health(&self, query: &str) -> Answer {
        let param = |name: &str| {
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v)
        };
        let Some(challenge) = param(proof::CHALLENGE_PARAM) else {
            return json(StatusCode::OK, &serde_json::json!({"status": "ok"}));
        };
        if !proof::is_challenge(challenge) {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "a challenge is 32 random bytes as 64 lowercase hex digits",
            );
        }
        let binding = match param(proof::BIND_PARAM) {
            None => proof::Binding::Server {
                addr: self.addr,
                instance: &self.instance,
            },
            Some("any") => proof::Binding::Any,
            Some(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "bind is `any` or absent (a proof of this server's address and instance)",
                )
            }
        };
        let answer = proof::prove(&self.token, challenge, binding);
        json(
            StatusCode::OK,
            &serde_json::json!({"status": "ok", "proof": answer}),
        )
    }

    pub(crate) fn authorized(&self, req: &Request<Incoming>) -> bool {
        let Some(value) = req.headers().get(header::AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes();
        let Some(presented) = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
        else {
            return false;
        };
        token_matches(presented, self.token.as_bytes())
    }

    async fn tools(&self, rt: &dyn Operator) -> Answer {
        let mut tools: Vec<ToolInfo> = rt.tools();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let commits = match self.latest_commits(rt).await {
            Ok(c) => c,
            Err(e) => return runtime_error(&e),
        };
        for tool in &mut tools {
            let Some(key) = commits.get(&tool.name) else {
                continue;
            };
            let Ok(key) = IdemKey::parse(key) else {
                continue;
            };
            match rt.operation(&key).await {
                Ok(Some(op)) => {
                    if let Some(result) = op.result {
                        tool.example_result = Some(ExampleResult {
                            key: op.key.to_string(),
                            result,
                        });
                    }
                }
                // Pruned since: no example.
                Ok(None) => {}
                Err(e) => return runtime_error(&e),
            }
        }
        json(StatusCode::OK, &tools)
    }

    /// Reads the audit stream from where the last call stopped; returns
    /// each tool's latest commit.
    async fn latest_commits(&self, rt: &dyn Operator) -> Result<HashMap<String, String>, Error> {
        let mut latest = self.latest.lock().await;
        self.catch_up(rt, &mut latest).await?;
        Ok(latest.commits.clone())
    }

    async fn catch_up(&self, rt: &dyn Operator, latest: &mut Latest) -> Result<(), Error> {
        loop {
            let page = rt.audit_page(latest.next, 4096).await?;
            let Some(last) = page.last().map(|e| e.seq) else {
                return Ok(());
            };
            for e in page {
                if let (EventKind::Committed { .. }, Some(key)) = (&e.kind, e.key) {
                    latest.commits.insert(e.tool, key);
                }
            }
            latest.next = last + 1;
        }
    }

    async fn audit(&self, query: Option<&str>) -> Answer {
        let rt = &*self.operator;
        let params = match AuditQuery::parse(query.unwrap_or("")) {
            Ok(p) => p,
            Err(message) => return error(StatusCode::BAD_REQUEST, "bad_request", &message),
        };
        // Subscribed before the position is fixed: whatever is written after
        // it wakes the follower, and the durable stream has the rest.
        let live = if params.follow {
            match rt.subscribe() {
                Some(live) => Some(live),
                None => {
                    return error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        "the runtime is shutting down",
                    )
                }
            }
        } else {
            None
        };
        let from = match params.from {
            From::Seq(n) => n,
            From::End => {
                let mut latest = self.latest.lock().await;
                if let Err(e) = rt.sync().await {
                    return runtime_error(&e);
                }
                if let Err(e) = self.catch_up(rt, &mut latest).await {
                    return runtime_error(&e);
                }
                latest.next
            }
        };
        if live.is_none() {
            // A snapshot holds everything written so far.
            if let Err(e) = rt.sync().await {
                return runtime_error(&e);
            }
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(follow::stream(
            self.operator.clone(),
            from,
            params.limit,
            live,
            tx,
            self.stop.clone(),
        ));
        let mut answer = Response::new(Body::Stream(rx));
        answer.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        );
        answer
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Ok(v) = HeaderValue::from_str(&from.to_string()) {
            answer.headers_mut().insert("idem-audit-from", v);
        }
        answer
    }
}

#[derive(Debug)]
struct AuditQuery {
    from: From,
    follow: bool,
    limit: Option<u64>,
}

impl AuditQuery {
    fn parse(query: &str) -> Result<AuditQuery, String> {
        let mut q = AuditQuery {
            from: From::Seq(0),
            follow: false,
            limit: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value).ok_or("a query value is not valid UTF-8")?;
            match name {
                "from" => {
                    q.from = match value.as_str() {
                        "end" => From::End,
                        n => From::Seq(n.parse().map_err(|_| {
                            format!("from={n:?}: expected a sequence number or `end`")
                        })?),
                    }
                }
                "follow" => {
                    q.follow = match value.as_str() {
                        "true" | "1" | "" => true,
                        "false" | "0" => false,
                        other => return Err(format!("follow={other:?}: expected true or false")),
                    }
                }
                "limit" => {
                    q.limit = Some(
                        value
                            .parse()
                            .map_err(|_| format!("limit={value:?}: expected a number"))?,
                    )
                }
                other => {
                    return Err(format!(
                        "unknown query parameter {other:?}: /v1/audit takes from, follow and limit"
                    ))
                }
            }
        }
        if q.follow && q.limit.is_some() {
            return Err("limit is for snapshots; a followed stream has no end".into());
        }
        Ok(q)
    }
}

/// `GET /metrics`: the runtime's metrics in Prometheus' text format.
async fn metrics(rt: &dyn Operator) -> Answer {
    match rt.metrics().await {
        Ok(text) => {
            let mut answer = Response::new(Body::full(text));
            let h = answer.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            answer
        }
        Err(e) => runtime_error(&e),
    }
}

async fn operation(rt: &dyn Operator, key: &IdemKey) -> Answer {
    let op = match rt.operation(key).await {
        Ok(Some(op)) => op,
        Ok(None) => return runtime_error(&Error::UnknownKey { key: key.clone() }),
        Err(e) => return runtime_error(&e),
    };
    match rt.history(key).await {
        Ok(history) => json(
            StatusCode::OK,
            &OperationView {
                operation: op,
                history,
            },
        ),
        Err(e) => runtime_error(&e),
    }
}

async fn resolve(rt: &dyn Operator, key: &IdemKey, req: Request<Incoming>) -> Answer {
    let bytes = match read_body(req).await {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let request: ResolveRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!(
                    "the body is not a resolution ({e}); send {{\"resolution\": \"landed\", \
                     \"result\": ..., \"note\": \"...\"}}, or \"reissue\" / \"abandon\" with a note"
                ),
            )
        }
    };
    let resolution = match request.to_resolution() {
        Ok(r) => r,
        Err(message) => return error(StatusCode::BAD_REQUEST, "bad_request", &message),
    };
    // Exactly what a program calling the runtime itself does.
    if let Err(e) = rt.resolve(key, resolution, &request.note).await {
        return runtime_error(&e);
    }
    match rt.operation(key).await {
        Ok(Some(operation)) => json(
            StatusCode::OK,
            &Resolved {
                key: operation.key.to_string(),
                resolution: request.resolution,
                operation,
            },
        ),
        Ok(None) => runtime_error(&Error::UnknownKey { key: key.clone() }),
        Err(e) => runtime_error(&e),
    }
}

/// `POST /v1/ops/{key}/approve` or `/reject`.
async fn decide(
    rt: &dyn Operator,
    key: &IdemKey,
    approved: bool,
    req: Request<Incoming>,
) -> Answer {
    let bytes = match read_body(req).await {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let request: DecisionRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("the body is not a decision ({e}); send {{\"note\": \"...\"}}"),
            )
        }
    };
    let (note, via) = match request.checked() {
        Ok(checked) => checked,
        Err(message) => return error(StatusCode::BAD_REQUEST, "bad_request", &message),
    };
    if let Err(e) = rt.decide(key, approved, note, via).await {
        return runtime_error(&e);
    }
    match rt.operation(key).await {
        Ok(Some(operation)) => json(
            StatusCode::OK,
            &Decided {
                key: operation.key.to_string(),
                decision: if approved { "approved" } else { "not_approved" }.into(),
                operation,
            },
        ),
        Ok(None) => runtime_error(&Error::UnknownKey { key: key.clone() }),
        Err(e) => runtime_error(&e),
    }
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, Answer> {
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            &format!("the body exceeds {} MiB", MAX_BODY >> 20),
        )),
        Err(e) => Err(error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &format!("reading the body failed: {e}"),
        )),
    }
}

// The error is the answer itself, built once per refused request: boxing it
// would buy nothing.
#[allow(clippy::result_large_err)]
fn parse_key(segment: &str) -> Result<IdemKey, Answer> {
    let text = percent_decode(segment).ok_or_else(|| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the key is not valid UTF-8",
        )
    })?;
    IdemKey::parse(&text).map_err(|e| runtime_error(&Error::from(e)))
}

/// `%XX` escapes (and nothing else: `+` stays a plus).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The status and code for a runtime error.
fn runtime_error(e: &Error) -> Answer {
    let (status, code) = match e {
        Error::UnknownKey { .. } => (StatusCode::NOT_FOUND, "unknown_key"),
        Error::NotEscalated { .. } => (StatusCode::CONFLICT, "not_escalated"),
        Error::NotAwaitingApproval { .. } => (StatusCode::CONFLICT, "not_awaiting_approval"),
        Error::Conflict { .. } => (StatusCode::CONFLICT, "conflict"),
        Error::ResultType { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "result_type"),
        Error::BadKey { .. } => (StatusCode::BAD_REQUEST, "bad_key"),
        Error::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "journal"),
    };
    error(status, code, &e.to_string())
}

pub(crate) fn error(status: StatusCode, code: &str, message: &str) -> Answer {
    json(
        status,
        &ApiError {
            error: code.to_string(),
            message: message.to_string(),
        },
    )
}

fn not_found(path: &str) -> Answer {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!(
            "no route {path:?}: the API has /v1/tools, /v1/escalations, /v1/approvals, \
             /v1/sagas, /v1/ops/KEY, /v1/ops/KEY/resolve, /v1/ops/KEY/approve, /v1/ops/KEY/reject, \
             /v1/audit, /v1/stats, /v1/prune, /metrics and /healthz"
        ),
    )
}

fn method_not_allowed(allowed: &'static str) -> Answer {
    let mut answer = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &format!("this route takes {allowed}"),
    );
    answer
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allowed));
    answer
}

fn only_get(method: &Method, answer: impl FnOnce() -> Answer) -> Answer {
    if method == Method::GET {
        answer()
    } else {
        method_not_allowed("GET")
    }
}

pub(crate) fn json<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Answer {
    let mut bytes = serde_json::to_vec(value).unwrap_or_else(|e| {
        format!("{{\"error\":\"journal\",\"message\":\"encoding the answer failed: {e}\"}}")
            .into_bytes()
    });
    bytes.push(b'\n');
    let mut answer = Response::new(Body::full(bytes));
    *answer.status_mut() = status;
    let h = answer.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_escapes_decode_and_broken_ones_are_refused() {
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("plain-g0").as_deref(), Some("plain-g0"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%ff"), None);
        assert_eq!(percent_decode("%+1"), None);
        assert_eq!(percent_decode("a%2"), None);
    }

    #[test]
    fn audit_queries_are_checked() {
        let q = AuditQuery::parse("from=7&follow=true").unwrap();
        assert!(matches!(q.from, From::Seq(7)) && q.follow);
        assert!(matches!(
            AuditQuery::parse("from=end").unwrap().from,
            From::End
        ));
        assert!(AuditQuery::parse("form=7")
            .unwrap_err()
            .contains("unknown query parameter"));
        assert!(AuditQuery::parse("from=x").is_err());
        assert!(AuditQuery::parse("follow=maybe").is_err());
        assert!(AuditQuery::parse("follow=true&limit=3").is_err());
    }
}
