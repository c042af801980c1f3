//! A client of a running process's admin API.

use std::path::Path;
use std::time::Duration;

use idem_runtime::admin::{
    proof, ApiError, Decided, DecisionRequest, OperationView, PruneView, ResolveRequest, Resolved,
    StatsView, ToolInfo,
};
use idem_runtime::{Approval, AuditEvent, Escalation, SagaView};
use serde::de::DeserializeOwned;

use crate::error::{exit, CliError};

/// How long a request other than a followed stream may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// What a server said when asked to prove it holds the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proof {
    /// It holds the token: the client may send it.
    Proven,
    /// Nothing answered, or not over HTTP (why).
    NoAnswer(String),
    /// Something answered without proving it holds the token (a wrong
    /// token here, or something else on the port): why.
    Unproven(String),
}

/// A connection to one admin API.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Client {
    /// A client of the admin API at `url` with `token`.
    pub fn new(url: impl Into<String>, token: impl Into<String>) -> Result<Client, CliError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .no_proxy()
            .build()
            .map_err(|e| CliError::unreachable(format!("cannot make an HTTP client: {e}")))?;
        Ok(Client {
            http,
            url: url.into().trim_end_matches('/').to_string(),
            token: token.into(),
        })
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The token: `IDEM_ADMIN_TOKEN` when set, else the journal's token file.
    pub fn token_for(dir: &Path) -> Result<String, CliError> {
        if let Ok(token) = std::env::var(idem_runtime::admin::TOKEN_ENV) {
            return Ok(token);
        }
        let path = idem_runtime::admin::token_path(dir);
        std::fs::read_to_string(&path)
            .map(|t| t.trim().to_string())
            .map_err(|e| {
                CliError::new(
                    exit::UNAUTHORIZED,
                    "no_token",
                    format!("cannot read the admin token {}: {e}", path.display()),
                )
                .hint(format!(
                    "run idem as a user who can read it, or set {}",
                    idem_runtime::admin::TOKEN_ENV
                ))
            })
    }

    /// Whether the server at this URL proves that it holds this client's
    /// token, bound as `binding` says (see [`proof`]): `GET
    /// /healthz?challenge=…`, which sends no token. Only after
    /// [`Proof::Proven`] may the token be sent.
    pub async fn proves(&self, binding: proof::Binding<'_>) -> Proof {
        let challenge = match proof::challenge() {
            Ok(c) => c,
            Err(e) => return Proof::NoAnswer(format!("cannot draw a random challenge: {e}")),
        };
        let mut url = format!(
            "{}/healthz?{}={challenge}",
            self.url,
            proof::CHALLENGE_PARAM
        );
        if binding == proof::Binding::Any {
            url.push_str(&format!("&{}=any", proof::BIND_PARAM));
        }
        let answer = match self
            .http
            .get(url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(answer) => answer,
            Err(e) => return Proof::NoAnswer(e.to_string()),
        };
        let status = answer.status();
        let Ok(bytes) = answer.bytes().await else {
            return Proof::NoAnswer("the answer broke off".into());
        };
        let presented = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("proof")?.as_str().map(str::to_string));
        match presented {
            Some(p) if proof::verify(&self.token, &challenge, binding, &p) => Proof::Proven,
            Some(_) => Proof::Unproven("its proof does not match this token".into()),
            None => Proof::Unproven(format!("it answered {status} without a proof")),
        }
    }

    /// `GET /v1/tools`.
    pub async fn tools(&self) -> Result<Vec<ToolInfo>, CliError> {
        self.get("/v1/tools").await
    }

    /// `GET /v1/escalations`.
    pub async fn escalations(&self) -> Result<Vec<Escalation>, CliError> {
        self.get("/v1/escalations").await
    }

    /// `GET /v1/ops/{key}`.
    pub async fn operation(&self, key: &str) -> Result<OperationView, CliError> {
        self.get(&format!("/v1/ops/{}", path_segment(key))).await
    }

    /// `POST /v1/ops/{key}/resolve`.
    pub async fn resolve(&self, key: &str, request: &ResolveRequest) -> Result<Resolved, CliError> {
        let body = serde_json::to_vec(request)
            .map_err(|e| CliError::usage(format!("cannot encode the resolution: {e}")))?;
        let req = self
            .http
            .post(format!("{}/v1/ops/{}/resolve", self.url, path_segment(key)))
            .header("content-type", "application/json")
            .body(body);
        self.send(req).await
    }

    /// `GET /v1/approvals`.
    pub async fn approvals(&self) -> Result<Vec<Approval>, CliError> {
        self.get("/v1/approvals").await
    }

    /// `GET /v1/sagas`.
    pub async fn sagas(&self) -> Result<Vec<SagaView>, CliError> {
        self.get("/v1/sagas").await
    }

    /// `POST /v1/ops/{key}/approve` (or `/reject`).
    pub async fn decide(
        &self,
        key: &str,
        approved: bool,
        request: &DecisionRequest,
    ) -> Result<Decided, CliError> {
        let body = serde_json::to_vec(request)
            .map_err(|e| CliError::usage(format!("cannot encode the decision: {e}")))?;
        let verb = if approved { "approve" } else { "reject" };
        let req = self
            .http
            .post(format!("{}/v1/ops/{}/{verb}", self.url, path_segment(key)))
            .header("content-type", "application/json")
            .body(body);
        self.send(req).await
    }

    /// `GET /v1/stats`.
    pub async fn stats(&self) -> Result<StatsView, CliError> {
        self.get("/v1/stats").await
    }

    /// `POST /v1/prune`.
    pub async fn prune(&self) -> Result<PruneView, CliError> {
        self.send(self.http.post(format!("{}/v1/prune", self.url)))
            .await
    }

    /// `GET /v1/audit`: calls `each` with every event (`from`: a number or
    /// `end`), until the stream ends (never, with `follow`, while the
    /// process runs).
    pub async fn audit(
        &self,
        from: &str,
        follow: bool,
        limit: Option<u64>,
        each: &mut dyn FnMut(AuditEvent) -> Result<(), CliError>,
    ) -> Result<(), CliError> {
        let mut url = format!("{}/v1/audit?from={from}", self.url);
        if follow {
            url.push_str("&follow=true");
        }
        if let Some(n) = limit {
            url.push_str(&format!("&limit={n}"));
        }
        let mut req = self.http.get(url).bearer_auth(&self.token);
        if !follow {
            req = req.timeout(REQUEST_TIMEOUT);
        }
        let mut answer = req.send().await.map_err(|e| self.transport(e))?;
        if !answer.status().is_success() {
            return Err(self.refusal(answer).await);
        }
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let chunk = answer.chunk().await.map_err(|e| self.transport(e))?;
            let Some(chunk) = chunk else { break };
            pending.extend_from_slice(&chunk);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let line = &line[..line.len() - 1];
                if line.is_empty() {
                    continue;
                }
                let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
                    CliError::new(exit::REFUSED, "protocol", format!("bad audit line: {e}"))
                })?;
                if value.get("error").is_some() {
                    let e: ApiError = serde_json::from_value(value).map_err(|e| {
                        CliError::new(exit::REFUSED, "protocol", format!("bad error line: {e}"))
                    })?;
                    return Err(CliError::new(exit::REFUSED, &e.error, e.message));
                }
                let event: AuditEvent = serde_json::from_value(value).map_err(|e| {
                    CliError::new(exit::REFUSED, "protocol", format!("bad audit event: {e}"))
                })?;
                each(event)?;
            }
        }
        Ok(())
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        self.send(self.http.get(format!("{}{path}", self.url)))
            .await
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T, CliError> {
        let answer = req
            .bearer_auth(&self.token)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        if !answer.status().is_success() {
            return Err(self.refusal(answer).await);
        }
        let bytes = answer.bytes().await.map_err(|e| self.transport(e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            CliError::new(
                exit::REFUSED,
                "protocol",
                format!(
                    "the admin API at {} answered something unexpected: {e}",
                    self.url
                ),
            )
        })
    }

    fn transport(&self, e: reqwest::Error) -> CliError {
        CliError::unreachable(format!("the admin API at {} did not answer: {e}", self.url))
    }

    async fn refusal(&self, answer: reqwest::Response) -> CliError {
        let status = answer.status();
        let bytes = answer.bytes().await.unwrap_or_default();
        let api: ApiError = serde_json::from_slice(&bytes).unwrap_or_else(|_| ApiError {
            error: "http".into(),
            message: format!(
                "{status}: {}",
                String::from_utf8_lossy(&bytes)
                    .chars()
                    .take(500)
                    .collect::<String>()
            ),
        });
        let code = match status.as_u16() {
            401 | 403 => exit::UNAUTHORIZED,
            503 => exit::UNREACHABLE,
            _ => exit::REFUSED,
        };
        let error = CliError::new(code, &api.error, api.message);
        if code == exit::UNAUTHORIZED {
            error.hint(format!(
                "the token comes from {} when set, else from the journal's {}; \
                 they must match the running process's",
                idem_runtime::admin::TOKEN_ENV,
                idem_runtime::admin::TOKEN_FILE
            ))
        } else {
            error
        }
    }
}

/// The error for a server that did not prove it holds the token.
pub(crate) fn unproven(url: &str, why: &str) -> CliError {
    CliError::new(
        exit::UNAUTHORIZED,
        "unproven",
        format!(
            "the admin API at {url} did not prove that it holds this token ({why}); \
             the token was not sent"
        ),
    )
    .hint(format!(
        "either the token here is not the running process's (it comes from {} when set, \
         else from the journal's {}), or something else answers on that port",
        idem_runtime::admin::TOKEN_ENV,
        idem_runtime::admin::TOKEN_FILE
    ))
}

/// A key is letters, digits, `_` and `-` in practice; anything else is
/// escaped.
fn path_segment(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
