//! A payments provider with Stripe's idempotency contract on
//! `POST /v1/charges`.
//!
//! - `Idempotency-Key` of 1 to 255 characters (otherwise 400, nothing
//!   applied); without one every request charges.
//! - The first answer of a request that started executing (status and body,
//!   including a 402 decline and a 5xx after applying) is saved under the
//!   key and replayed to any repeat with `Idempotent-Replayed: true`.
//! - A repeat while the first is still executing: 409, nothing applied.
//! - A repeat with different parameters: 400 `idempotency_error`.
//! - Answers of requests that never started executing are not saved: 429,
//!   5xx before applying, validation errors.
//! - Keys are kept for [`PaymentsConfig::key_window`] from their first use,
//!   measured on the provider's injectable [`Clock`]; after that a repeat is
//!   a new request.
//!
//! `POST /v1/refunds` refunds a succeeded charge, with the same key rules
//! (a saved answer per key, replayed with `Idempotent-Replayed: true`); a
//! refund of a charge the provider does not know, or of more than was
//! charged, is a 400 and refunds nothing. Every refund executed is in
//! [`crate::Providers::refunds`]: two for one charge is a double refund.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::client::{ClientConfig, HttpClient};
use crate::clock::Clock;
use crate::error::ProviderError;
use crate::faults::OpKind;
use crate::http::{HttpResponse, Request};
use crate::ledger::{Effect, Ledger};
use crate::server::{bad_request, error_response, not_found, Injected, Reply, Service};

/// Longest idempotency key Stripe accepts, in characters.
pub const MAX_KEY_LEN: usize = 255;

/// The body of `POST /v1/charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeRequest {
    /// Amount in minor units (cents), at least 1.
    pub amount: u64,
    /// ISO currency code, three lower-case letters.
    pub currency: String,
    /// The order being paid; the unit of duplicate detection.
    pub order_id: u64,
    /// Customer id; see [`PaymentsConfig::declined_customers`].
    pub customer: String,
}

/// A successful charge, as answered by the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// Provider-assigned id, `ch_…`.
    pub id: String,
    /// Amount in minor units.
    pub amount: u64,
    /// Currency code.
    pub currency: String,
    /// The order paid.
    pub order_id: u64,
    /// The customer charged.
    pub customer: String,
    /// Always `succeeded` (a declined charge is a 402 error).
    pub status: String,
    /// Provider time of the charge, ms since the epoch.
    pub created_ms: u64,
    /// Set by [`PaymentsClient`] when the answer carried
    /// `Idempotent-Replayed: true`; never part of the provider's body.
    #[serde(default, skip_serializing_if = "is_false")]
    pub replayed: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Whether an applied charge moved money.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeOutcome {
    /// The card was charged.
    Succeeded,
    /// The card was declined (402); no money moved.
    Declined,
}

/// One charge the provider executed (ledger record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeRecord {
    /// The charge id.
    pub charge_id: String,
    /// The idempotency key it was made under, if any.
    pub idempotency_key: Option<String>,
    /// The order paid.
    pub order_id: u64,
    /// Amount in minor units.
    pub amount: u64,
    /// Currency code.
    pub currency: String,
    /// The customer.
    pub customer: String,
    /// Whether money moved.
    pub outcome: ChargeOutcome,
    /// Provider time, ms since the epoch.
    pub at_ms: u64,
}

/// Orders are the logical operation: two succeeded charges for one order is
/// a double charge, whatever keys they came with.
impl Effect for ChargeRecord {
    type Operation = OrderId;

    fn operation(&self) -> Option<OrderId> {
        (self.outcome == ChargeOutcome::Succeeded).then_some(OrderId(self.order_id))
    }
}

/// An order id, the unit of duplicate detection for payments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OrderId(pub u64);

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "order_id={}", self.0)
    }
}

/// The body of `POST /v1/refunds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// The charge refunded, `ch_…`.
    pub charge: String,
    /// Amount in minor units, at least 1 and at most the charge's.
    pub amount: u64,
}

/// A refund, as answered by the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// Provider-assigned id, `re_…`.
    pub id: String,
    /// The charge refunded.
    pub charge: String,
    /// Amount in minor units.
    pub amount: u64,
    /// Provider time of the refund, ms since the epoch.
    pub created_ms: u64,
    /// Set by [`PaymentsClient`] when the answer carried
    /// `Idempotent-Replayed: true`; never part of the provider's body.
    #[serde(default, skip_serializing_if = "is_false")]
    pub replayed: bool,
}

/// One refund the provider executed (ledger record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRecord {
    /// The refund id.
    pub refund_id: String,
    /// The charge refunded.
    pub charge_id: String,
    /// The order of that charge.
    pub order_id: u64,
    /// The idempotency key it was made under, if any.
    pub idempotency_key: Option<String>,
    /// Amount in minor units.
    pub amount: u64,
    /// Provider time, ms since the epoch.
    pub at_ms: u64,
}

/// A charge is the logical operation of a refund: two refunds of one
/// charge is a double refund.
impl Effect for RefundRecord {
    type Operation = String;

    fn operation(&self) -> Option<String> {
        Some(self.charge_id.clone())
    }
}

/// Options of the payments provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentsConfig {
    /// How long a key and its saved answer are kept (Stripe: 24 h).
    pub key_window: Duration,
    /// Customers whose cards are declined (402).
    pub declined_customers: Vec<String>,
    /// Amounts that are declined (402) whoever pays.
    pub declined_amounts: Vec<u64>,
}

impl Default for PaymentsConfig {
    fn default() -> Self {
        PaymentsConfig {
            key_window: Duration::from_secs(24 * 60 * 60),
            declined_customers: vec!["cus_declined".into()],
            declined_amounts: Vec::new(),
        }
    }
}

enum KeyState {
    /// A request with this key is executing.
    InFlight,
    /// Its answer is saved.
    Done(HttpResponse),
}

struct KeyEntry {
    params: ChargeRequest,
    first_used_ms: u64,
    state: KeyState,
}

type RefundKey = (u64, RefundRequest, Option<HttpResponse>);

/// The server side of payments.
pub(crate) struct Payments {
    config: PaymentsConfig,
    clock: Clock,
    ledger: Ledger<ChargeRecord>,
    keys: Mutex<HashMap<String, KeyEntry>>,
    refunds: Ledger<RefundRecord>,
    /// Refund keys: first use, request, and the saved answer (`None`
    /// while the first request with the key executes).
    refund_keys: Mutex<HashMap<String, RefundKey>>,
}

enum Claim<'a> {
    Fresh(KeyClaim<'a>),
    Replay(HttpResponse),
    InFlight,
    Mismatch,
}

/// Ownership of an in-flight key. Dropped without [`KeyClaim::complete`]
/// (the provider shut down mid-request), it frees the key: nothing was
/// saved, so a repeat must be allowed to execute.
struct KeyClaim<'a> {
    payments: &'a Payments,
    key: String,
    completed: bool,
}

impl KeyClaim<'_> {
    fn complete(mut self, answer: HttpResponse) {
        if let Some(entry) = self.payments.keys().get_mut(&self.key) {
            entry.state = KeyState::Done(answer);
        }
        self.completed = true;
    }
}

impl Drop for KeyClaim<'_> {
    fn drop(&mut self) {
        if !self.completed {
            let mut keys = self.payments.keys();
            if matches!(keys.get(&self.key), Some(e) if matches!(e.state, KeyState::InFlight)) {
                keys.remove(&self.key);
            }
        }
    }
}

impl Payments {
    pub(crate) fn new(
        config: PaymentsConfig,
        clock: Clock,
        ledger: Ledger<ChargeRecord>,
        refunds: Ledger<RefundRecord>,
    ) -> Self {
        Payments {
            config,
            clock,
            ledger,
            keys: Mutex::default(),
            refunds,
            refund_keys: Mutex::default(),
        }
    }

    /// `POST /v1/refunds`: validated, deduplicated on its key, executed
    /// under the key's lock (a repeat waits for the first and replays it).
    async fn refund(&self, req: &Request, mut fault: Injected) -> Reply {
        if let Some(reply) = fault.before_apply() {
            return reply;
        }
        let key = req.header("idempotency-key").map(str::to_string);
        if key
            .as_ref()
            .is_some_and(|k| k.is_empty() || k.chars().count() > MAX_KEY_LEN)
        {
            return bad_request(
                "Keys for idempotent requests can only be 1 to 255 characters long",
            );
        }
        let params: RefundRequest = match serde_json::from_slice(&req.body) {
            Ok(p) => p,
            Err(e) => return bad_request(&e.to_string()),
        };
        let charge = self
            .ledger
            .filter(|c| c.charge_id == params.charge && c.outcome == ChargeOutcome::Succeeded)
            .into_iter()
            .next();
        let Some(charge) = charge else {
            return bad_request(&format!("No such charge: '{}'", params.charge));
        };
        if params.amount == 0 || params.amount > charge.amount {
            return bad_request(&format!(
                "Refund amount ({}) must be between 1 and the charge's {}",
                params.amount, charge.amount
            ));
        }
        let now = self.clock.now_ms();
        let window = self.config.key_window.as_millis() as u64;
        if let Some(k) = &key {
            let saved = {
                let mut keys = self.refund_keys.lock().unwrap_or_else(|e| e.into_inner());
                keys.retain(|_, (first, _, saved)| {
                    saved.is_none() || now.saturating_sub(*first) < window
                });
                match keys.get(k) {
                    Some((_, p, _)) if *p != params => {
                        return bad_request(&format!(
                        "Keys for idempotent requests can only be used with the same parameters \
                         they were first used with. Try using a key other than '{k}' if you meant \
                         to execute a different request."
                    ));
                    }
                    Some((_, _, None)) => {
                        return Reply::Respond(key_in_use());
                    }
                    Some((_, _, Some(saved))) => Some(saved.clone()),
                    None => {
                        keys.insert(k.clone(), (now, params.clone(), None));
                        None
                    }
                }
            };
            if let Some(saved) = saved {
                fault.processing().await;
                return fault
                    .after_apply()
                    .finish(saved.with_header("Idempotent-Replayed", "true"));
            }
        }
        fault.processing().await;
        let after = fault.after_apply();
        let record = self.refunds.push_with(|n| RefundRecord {
            refund_id: format!("re_{:08}", n + 1),
            charge_id: charge.charge_id.clone(),
            order_id: charge.order_id,
            idempotency_key: key.clone(),
            amount: params.amount,
            at_ms: now,
        });
        let answer = HttpResponse::json(
            200,
            &Refund {
                id: record.refund_id,
                charge: record.charge_id,
                amount: record.amount,
                created_ms: now,
                replayed: false,
            },
        );
        let saved = after.response(answer);
        if let Some(k) = key {
            self.refund_keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(k, (now, params, Some(saved.clone())));
        }
        after.reply(saved)
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, KeyEntry>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn claim(&self, key: &str, params: &ChargeRequest) -> Claim<'_> {
        let now = self.clock.now_ms();
        let window = self.config.key_window.as_millis() as u64;
        let mut keys = self.keys();
        // Expire lazily; an executing request's key never expires under it.
        keys.retain(|_, e| {
            matches!(e.state, KeyState::InFlight) || now.saturating_sub(e.first_used_ms) < window
        });
        match keys.get(key) {
            Some(KeyEntry {
                state: KeyState::InFlight,
                ..
            }) => Claim::InFlight,
            Some(e) if e.params != *params => Claim::Mismatch,
            Some(KeyEntry {
                state: KeyState::Done(answer),
                ..
            }) => Claim::Replay(answer.clone().with_header("Idempotent-Replayed", "true")),
            None => {
                keys.insert(
                    key.to_string(),
                    KeyEntry {
                        params: params.clone(),
                        first_used_ms: now,
                        state: KeyState::InFlight,
                    },
                );
                Claim::Fresh(KeyClaim {
                    payments: self,
                    key: key.to_string(),
                    completed: false,
                })
            }
        }
    }

    /// Executes the charge: records it and builds the answer.
    fn execute(&self, key: Option<&str>, p: &ChargeRequest) -> HttpResponse {
        let now = self.clock.now_ms();
        let declined = self.config.declined_customers.contains(&p.customer)
            || self.config.declined_amounts.contains(&p.amount);
        let record = self.ledger.push_with(|n| ChargeRecord {
            charge_id: format!("ch_{:08}", n + 1),
            idempotency_key: key.map(str::to_string),
            order_id: p.order_id,
            amount: p.amount,
            currency: p.currency.clone(),
            customer: p.customer.clone(),
            outcome: if declined {
                ChargeOutcome::Declined
            } else {
                ChargeOutcome::Succeeded
            },
            at_ms: now,
        });
        if declined {
            return HttpResponse::json(
                402,
                &json!({ "error": {
                    "type": "card_error",
                    "code": "card_declined",
                    "message": "Your card was declined.",
                    "charge": record.charge_id,
                }}),
            );
        }
        HttpResponse::json(
            200,
            &Charge {
                id: record.charge_id,
                amount: p.amount,
                currency: p.currency.clone(),
                order_id: p.order_id,
                customer: p.customer.clone(),
                status: "succeeded".into(),
                created_ms: now,
                replayed: false,
            },
        )
    }
}

/// The 409 of a repeat while the first request with its key executes:
/// turned away unprocessed.
fn key_in_use() -> HttpResponse {
    HttpResponse::json(
        409,
        &json!({ "error": {
            "type": "idempotency_error",
            "code": "idempotency_key_in_use",
            "message": "There is currently another in-progress request using this idempotency key. Retry later.",
        }}),
    )
}

fn parse_params(body: &[u8]) -> Result<ChargeRequest, String> {
    let p: ChargeRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if p.amount == 0 {
        return Err("amount must be at least 1".into());
    }
    if p.currency.len() != 3 || !p.currency.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(format!("invalid currency {:?}", p.currency));
    }
    if p.customer.is_empty() {
        return Err("customer is required".into());
    }
    Ok(p)
}

impl Service for Payments {
    fn op_kind(&self, req: &Request) -> Option<OpKind> {
        (req.method == "POST" && (req.path == "/v1/charges" || req.path == "/v1/refunds"))
            .then_some(OpKind::Write)
    }

    async fn handle(&self, req: Request, mut fault: Injected) -> Reply {
        if req.method == "POST" && req.path == "/v1/refunds" {
            return self.refund(&req, fault).await;
        }
        if req.path != "/v1/charges" {
            return Reply::Respond(not_found());
        }
        if req.method != "POST" {
            return Reply::Respond(error_response(405, "invalid_request_error", "use POST"));
        }
        // Rate limiting and gateway errors happen in front of the API: the
        // idempotency layer never sees those requests.
        if let Some(reply) = fault.before_apply() {
            return reply;
        }
        let key = req.header("idempotency-key").map(str::to_string);
        if let Some(k) = &key {
            if k.is_empty() || k.chars().count() > MAX_KEY_LEN {
                return bad_request(
                    "Keys for idempotent requests can only be 1 to 255 characters long",
                );
            }
        }
        let params = match parse_params(&req.body) {
            Ok(p) => p,
            Err(message) => return bad_request(&message),
        };
        let Some(key) = key else {
            fault.processing().await;
            return fault.after_apply().finish(self.execute(None, &params));
        };
        let claim = match self.claim(&key, &params) {
            Claim::Fresh(claim) => claim,
            Claim::Replay(saved) => {
                fault.processing().await;
                // A fault after a replay only loses or replaces this answer;
                // the saved one stays as it was.
                return fault.after_apply().finish(saved);
            }
            Claim::InFlight => return Reply::Respond(key_in_use()),
            Claim::Mismatch => {
                return Reply::Respond(HttpResponse::json(
                    400,
                    &json!({ "error": {
                        "type": "idempotency_error",
                        "message": format!(
                            "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{key}' if you meant to execute a different request."
                        ),
                    }}),
                ))
            }
        };
        fault.processing().await;
        let after = fault.after_apply();
        let executed = self
            .execute(Some(&key), &params)
            .with_header("Idempotency-Key", key.clone());
        // Stripe saves whatever an executed request answered, a 500 included.
        let saved = after.response(executed);
        claim.complete(saved.clone());
        after.reply(saved)
    }
}

/// Client of the payments provider. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PaymentsClient {
    http: HttpClient,
}

impl PaymentsClient {
    /// A client of the provider at `addr` with default timeouts.
    pub fn new(addr: SocketAddr) -> Self {
        PaymentsClient {
            http: HttpClient::new(addr),
        }
    }

    /// A client with explicit timeouts.
    pub fn with_config(addr: SocketAddr, config: ClientConfig) -> Self {
        PaymentsClient {
            http: HttpClient::with_config(addr, config),
        }
    }

    /// The underlying HTTP client, for raw requests.
    pub fn http(&self) -> &HttpClient {
        &self.http
    }

    /// Charges under `idempotency_key`. A replayed success comes back with
    /// [`Charge::replayed`] set; a replayed failure with
    /// [`ProviderError::is_replayed`].
    pub async fn charge(
        &self,
        idempotency_key: &str,
        request: &ChargeRequest,
    ) -> Result<Charge, ProviderError> {
        self.send(&[("Idempotency-Key", idempotency_key)], request)
            .await
    }

    /// Charges without an idempotency key: every call that arrives charges.
    pub async fn charge_without_key(
        &self,
        request: &ChargeRequest,
    ) -> Result<Charge, ProviderError> {
        self.send(&[], request).await
    }

    /// Refunds under `idempotency_key`. A replayed refund comes back with
    /// [`Refund::replayed`] set.
    pub async fn refund(
        &self,
        idempotency_key: &str,
        request: &RefundRequest,
    ) -> Result<Refund, ProviderError> {
        let (mut refund, replayed): (Refund, bool) = self
            .http
            .call(
                "POST",
                "/v1/refunds",
                &[("Idempotency-Key", idempotency_key)],
                Some(request),
            )
            .await?;
        refund.replayed = replayed;
        Ok(refund)
    }

    async fn send(
        &self,
        headers: &[(&str, &str)],
        request: &ChargeRequest,
    ) -> Result<Charge, ProviderError> {
        let (mut charge, replayed): (Charge, bool) = self
            .http
            .call("POST", "/v1/charges", headers, Some(request))
            .await?;
        charge.replayed = replayed;
        Ok(charge)
    }
}
