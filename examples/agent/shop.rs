//! The order workflow: five tools, one per idem class, against the fake
//! providers of `idem-testkit` (real HTTP over 127.0.0.1).
//!
//! This file is what an idem user writes. The demo (`cargo run --example
//! agent`), the torture harness and the torture tests all drive these exact
//! tools, so what they prove is proved about ordinary `#[idem::tool]` code.
//!
//! | step | tool | class | why this class |
//! |---|---|---|---|
//! | 1 | `lookup_order` | `read_only` | reading twice duplicates nothing |
//! | 2 | `charge` | `provider` | the payments API deduplicates on `Idempotency-Key` (Stripe) |
//! | 3 | `send_email` | `journal` | email has no dedupe, but sent mail can be searched by a key header |
//! | 4 | `open_ticket` | `journal` | tickets have no dedupe, but can be looked up by external reference |
//! | 5 | `refund_wire` | `at_most_once` | a wire can neither be deduplicated nor looked up: never re-sent blindly |
//!
//! A second workflow, `ship_order`, is a saga of free-function tools:
//! `book_courier` (journal, undone by `cancel_courier`), `pay` (provider,
//! undone by `refund`), then `pay_supplier` (at_most_once), which the bank
//! refuses. `book_courier` and `pay` say `commit = "eventual"`: their
//! COMMITTED records ride the next fsync instead of waiting for their own.

// Shared by several targets (the demo, the torture example, the tests); each
// uses a different part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use idem::{tool, ArgSchema, Ctx, ToolError, Verdict};
use idem_testkit::{
    CancelTicket, Cancellation, Charge, ChargeOutcome, ChargeRequest, ClientConfig, Clients,
    EmailMessage, NewTicket, ProviderAddrs, ProviderError, Providers, Refund, RefundRequest,
    SentMessage, Ticket, WireReceipt, WireRequest,
};
use serde::{Deserialize, Serialize};

/// An order, as the (read-only) order book has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The order's number.
    pub id: u64,
    /// Who ordered.
    pub customer: String,
    /// Where the confirmation goes.
    pub email: String,
    /// What it costs, in cents.
    pub amount_cents: u64,
    /// In which currency.
    pub currency: String,
    /// Where a refund goes.
    pub iban: String,
    /// The goodwill refund the support agent grants (late delivery).
    pub refund_cents: u64,
}

/// The schema MCP clients and models are shown for an `Order` argument
/// (`charge` takes the order that `lookup_order` returned).
impl ArgSchema for Order {
    fn arg_schema() -> serde_json::Value {
        let (int, text) = (u64::arg_schema(), String::arg_schema());
        let fields = [
            "id",
            "customer",
            "email",
            "amount_cents",
            "currency",
            "iban",
            "refund_cents",
        ];
        serde_json::json!({
            "type": "object",
            "description": "an order, as lookup_order returns it",
            "properties": {
                "id": int, "customer": text, "email": text, "amount_cents": int,
                "currency": text, "iban": text, "refund_cents": int,
            },
            "required": fields,
        })
    }
}

/// The order book: deterministic, so every process (and every restart) sees
/// the same order for the same id. Order 4711 is the demo's customer.
pub fn order_book(id: u64) -> Order {
    let (customer, email) = if id == 4711 {
        ("cus_ann".to_string(), "ann@example.com".to_string())
    } else {
        // One recipient per order: the email ledger can then be checked per
        // order, independently of the idempotency keys under test.
        (format!("cus_{id}"), format!("customer-{id}@example.com"))
    };
    Order {
        id,
        customer,
        email,
        amount_cents: if id == 4711 { 4999 } else { 1000 + id % 9000 },
        currency: "eur".into(),
        iban: format!("DE89370400440532{:06}", id % 1_000_000),
        refund_cents: 500,
    }
}

/// The email subject of an order's receipt; also how the ledger check finds it.
pub fn receipt_subject(order_id: u64) -> String {
    format!("receipt for order {order_id}")
}

/// The title of an order's support ticket; also how the ledger check finds it.
pub fn ticket_title(order_id: u64) -> String {
    format!("late delivery, order {order_id}")
}

/// The payment reference of an order's refund wire: the bank's only handle
/// on it, and what an operator searches the bank statement for.
pub fn wire_reference(order_id: u64) -> String {
    format!("refund-{order_id}")
}

/// The receipt's text.
fn receipt_body(order: &Order) -> String {
    format!(
        "Hello {}, we received {}.{:02} EUR for order {}. Thank you!",
        order.customer,
        order.amount_cents / 100,
        order.amount_cents % 100,
        order.id
    )
}

const TICKET_TOPIC: &str = "late delivery";
const TICKET_BODY: &str =
    "Parcel arrived four days late; customer asked for a refund of the shipping fee.";

/// How many times the effect of `tool` for `order` was applied, by the
/// provider's own ledger and by business identity (order, recipient,
/// reference), never by idempotency key: a key that changed between
/// attempts or restarts shows up here as a second effect.
pub fn effects(providers: &Providers, tool: &str, order: u64) -> usize {
    match tool {
        "charge" => providers
            .payments()
            .ledger()
            .iter()
            .filter(|c| c.order_id == order && c.outcome == ChargeOutcome::Succeeded)
            .count(),
        "send_email" => {
            let to = order_book(order).email;
            providers
                .email()
                .ledger()
                .iter()
                .filter(|m| m.to == to && m.subject == receipt_subject(order))
                .count()
        }
        "open_ticket" => providers
            .tickets()
            .ledger()
            .iter()
            .filter(|t| t.title == ticket_title(order))
            .count(),
        "refund_wire" => providers
            .wire()
            .ledger()
            .iter()
            .filter(|w| w.reference == wire_reference(order))
            .count(),
        other => panic!("not an effect tool: {other}"),
    }
}

/// Where a request stands, for [`Hook`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// The request is about to go out (its INTENT is durable).
    Sending,
    /// The provider confirmed the effect; idem has not written COMMIT yet.
    /// The worst moment to die.
    Landed,
}

/// Lets a harness act at a precise point of a tool call: log it, or kill the
/// process right there. Arguments: the moment, the tool name, the order id.
pub type Hook = Arc<dyn Fn(Moment, &'static str, u64) + Send + Sync>;

/// Client timeouts short enough that a provider that hangs (an injected
/// fault) costs a fraction of a second, not the default 5 s. The tools'
/// `timeout` (600 ms) bounds how long a request can be in flight: it is also
/// how long a recovery waits before asking `verify` whether a dead process's
/// request landed.
pub const CLIENT_CONFIG: ClientConfig = ClientConfig {
    connect_timeout: Duration::from_millis(250),
    request_timeout: Duration::from_millis(500),
};

/// The agent's tools, with the provider clients they use.
pub struct Shop {
    clients: Clients,
    hook: Option<Hook>,
}

// `#[tool]` on the block registers the tool methods for JSON dispatch
// (`idem::Toolbox::with_methods`), which serves them over MCP
// (examples/mcp_server.rs).
#[tool]
impl Shop {
    /// Tools talking to the providers at `addrs`.
    pub fn new(addrs: ProviderAddrs) -> Shop {
        Shop {
            clients: addrs.clients_with(CLIENT_CONFIG),
            hook: None,
        }
    }

    /// The same, calling `hook` around every provider request.
    pub fn with_hook(addrs: ProviderAddrs, hook: Hook) -> Shop {
        Shop {
            hook: Some(hook),
            ..Shop::new(addrs)
        }
    }

    fn at(&self, moment: Moment, tool: &'static str, order_id: u64) {
        if let Some(hook) = &self.hook {
            hook(moment, tool, order_id);
        }
    }

    // Each tool names itself (`name = "charge"`): without a `name`, the
    // `#[tool]` on the block would make these `Shop::charge` etc. The name is
    // part of every key, and the journals, audit logs and checks of the demo
    // and the torture harness know the tools by these short names. The doc
    // comments are the descriptions MCP clients and models are shown.

    /// Step 1, read-only: no key, no journal, retried freely.
    #[tool(
        class = "read_only",
        name = "lookup_order",
        retry(max_attempts = 3, initial = "10ms")
    )]
    pub async fn lookup_order(&self, ctx: &Ctx, order_id: u64) -> Result<Order, ProviderError> {
        Ok(order_book(order_id))
    }

    /// Step 2, provider class: the payments API deduplicates on the key we
    /// send, so after an unknown outcome idem simply retries with the same
    /// key and the provider replays its saved answer instead of charging
    /// again. The key is the order: one charge per order, ever.
    #[tool(
        class = "provider",
        name = "charge",
        key = "order.id",
        retry(
            max_attempts = 10,
            initial = "10ms",
            max_interval = "200ms",
            max_elapsed = "1m"
        ),
        timeout = "600ms"
    )]
    pub async fn charge(&self, ctx: &Ctx, order: Order) -> Result<Charge, ProviderError> {
        let request = ChargeRequest {
            amount: order.amount_cents,
            currency: order.currency.clone(),
            order_id: order.id,
            customer: order.customer.clone(),
        };
        self.at(Moment::Sending, "charge", order.id);
        let key = ctx.idempotency_key().as_str();
        let charge = self.clients.payments.charge(key, &request).await?;
        if charge.replayed {
            // Stripe said `Idempotent-Replayed: true`: on the audit record.
            ctx.mark_provider_replay();
        }
        self.at(Moment::Landed, "charge", order.id);
        Ok(charge)
    }

    /// Step 3, journal class: the email API sends every request it gets, so
    /// idem journals the call and, when an outcome is unknown (a timeout, a
    /// crash mid-call), asks `Shop::email_landed` before sending again.
    /// The body is redacted: never written to the journal or the audit log.
    #[tool(
        class = "journal",
        name = "send_email",
        destructive = false,
        key = "to, template, order_id",
        verify = email_landed,
        redact = "body",
        retry(max_attempts = 10, initial = "10ms", max_interval = "200ms"),
        timeout = "600ms"
    )]
    pub async fn send_email(
        &self,
        ctx: &Ctx,
        to: String,
        template: String,
        order_id: u64,
        body: String,
    ) -> Result<SentMessage, ProviderError> {
        let message = EmailMessage {
            to,
            subject: format!("{template} for order {order_id}"),
            body,
        };
        self.at(Moment::Sending, "send_email", order_id);
        // The key travels in a header (X-Idem-Key) that the sent-mail
        // search can filter on: that is what makes `verify` possible.
        let key = ctx.idempotency_key().as_str();
        let sent = self.clients.email.send(key, &message).await?;
        self.at(Moment::Landed, "send_email", order_id);
        Ok(sent)
    }

    /// Read-before-retry for `send_email`: search the sent mail for our key.
    async fn email_landed(&self, ctx: &Ctx) -> Result<Verdict<SentMessage>, ProviderError> {
        let key = ctx.idempotency_key().as_str();
        let found = self.clients.email.find_by_key(key).await?;
        Ok(match found.into_iter().next() {
            Some(message) => Verdict::Landed(message),
            None => Verdict::NotLanded,
        })
    }

    /// Step 4, journal class: tickets are not deduplicated either, but can
    /// be found by the external reference we give them (our key).
    #[tool(
        class = "journal",
        name = "open_ticket",
        destructive = false,
        key = "order_id, topic",
        verify = ticket_landed,
        retry(max_attempts = 10, initial = "10ms", max_interval = "200ms"),
        timeout = "600ms"
    )]
    pub async fn open_ticket(
        &self,
        ctx: &Ctx,
        order_id: u64,
        topic: String,
        body: String,
    ) -> Result<Ticket, ProviderError> {
        let ticket = NewTicket {
            external_ref: ctx.idempotency_key().to_string(),
            title: format!("{topic}, order {order_id}"),
            body,
        };
        self.at(Moment::Sending, "open_ticket", order_id);
        let created = self.clients.tickets.create(&ticket).await?;
        self.at(Moment::Landed, "open_ticket", order_id);
        Ok(created)
    }

    /// Read-before-retry for `open_ticket`: look the ticket up by reference.
    async fn ticket_landed(&self, ctx: &Ctx) -> Result<Verdict<Ticket>, ProviderError> {
        let found = self
            .clients
            .tickets
            .find_by_ref(ctx.idempotency_key().as_str())
            .await?;
        Ok(match found.into_iter().next() {
            Some(ticket) => Verdict::Landed(ticket),
            None => Verdict::NotLanded,
        })
    }

    /// Step 5, at-most-once: the bank neither deduplicates nor lets us look
    /// a wire up. A request that may have reached it is never re-sent by
    /// idem: it is escalated, and a human checks the bank statement and
    /// answers with `Runtime::resolve`.
    #[tool(
        class = "at_most_once",
        name = "refund_wire",
        key = "order_id",
        timeout = "600ms"
    )]
    pub async fn refund_wire(
        &self,
        ctx: &Ctx,
        order_id: u64,
        iban: String,
        amount_cents: u64,
    ) -> Result<WireReceipt, ProviderError> {
        let wire = WireRequest {
            to_account: iban,
            amount: amount_cents,
            reference: wire_reference(order_id),
        };
        self.at(Moment::Sending, "refund_wire", order_id);
        let receipt = self.clients.wire.send(&wire).await?;
        self.at(Moment::Landed, "refund_wire", order_id);
        Ok(receipt)
    }

    /// The whole workflow for one order, as a scripted agent would run it.
    /// `on_step` hears of each completed step (the demo prints them).
    ///
    /// Safe to run again from the top after a crash, under the same run
    /// (`ctx`): finished steps are replayed from the journal, unfinished
    /// ones recovered by their class's rules.
    pub async fn process_order(
        &self,
        ctx: &Ctx,
        order_id: u64,
        on_step: &mut (dyn FnMut(Step<'_>) + Send),
    ) -> Result<Processed, Stopped> {
        let order = self
            .lookup_order(ctx, order_id)
            .await
            .map_err(|e| Stopped::at("lookup_order", e))?;
        on_step(Step::Order(&order));

        let charge = self
            .charge(ctx, order.clone())
            .await
            .map_err(|e| Stopped::at("charge", e))?;
        on_step(Step::Charge(&charge));

        let email = self
            .send_email(
                ctx,
                order.email.clone(),
                "receipt".into(),
                order.id,
                receipt_body(&order),
            )
            .await
            .map_err(|e| Stopped::at("send_email", e))?;
        on_step(Step::Email(&email));

        let ticket = self
            .open_ticket(ctx, order.id, TICKET_TOPIC.into(), TICKET_BODY.into())
            .await
            .map_err(|e| Stopped::at("open_ticket", e))?;
        on_step(Step::Ticket(&ticket));

        let wire = self
            .refund_wire(ctx, order.id, order.iban.clone(), order.refund_cents)
            .await
            .map_err(|e| Stopped::at("refund_wire", e))?;
        on_step(Step::Wire(&wire));

        Ok(Processed {
            order,
            charge,
            email,
            ticket,
            wire,
        })
    }
}

impl Shop {
    /// One side-effecting step of the workflow on its own, with the
    /// workflow's arguments for `order_id`; its result as JSON.
    pub async fn run_step(
        &self,
        ctx: &Ctx,
        tool: &str,
        order_id: u64,
    ) -> Result<serde_json::Value, ToolError<ProviderError>> {
        let order = order_book(order_id);
        let json = |v: Result<serde_json::Value, serde_json::Error>| {
            v.unwrap_or_else(|e| serde_json::Value::String(e.to_string()))
        };
        Ok(match tool {
            "charge" => json(serde_json::to_value(self.charge(ctx, order).await?)),
            "send_email" => {
                let body = receipt_body(&order);
                let sent = self
                    .send_email(ctx, order.email, "receipt".into(), order.id, body)
                    .await?;
                json(serde_json::to_value(sent))
            }
            "open_ticket" => {
                let ticket = self
                    .open_ticket(ctx, order.id, TICKET_TOPIC.into(), TICKET_BODY.into())
                    .await?;
                json(serde_json::to_value(ticket))
            }
            "refund_wire" => {
                let wire = self
                    .refund_wire(ctx, order.id, order.iban, order.refund_cents)
                    .await?;
                json(serde_json::to_value(wire))
            }
            other => panic!("not an effect tool: {other}"),
        })
    }
}

/// A completed step of [`Shop::process_order`].
#[derive(Debug)]
pub enum Step<'a> {
    /// The order was read.
    Order(&'a Order),
    /// The card was charged.
    Charge(&'a Charge),
    /// The confirmation was sent.
    Email(&'a SentMessage),
    /// The fulfilment ticket was opened.
    Ticket(&'a Ticket),
    /// The refund wire was sent.
    Wire(&'a WireReceipt),
}

/// Everything a processed order produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Processed {
    /// The order.
    pub order: Order,
    /// Its charge.
    pub charge: Charge,
    /// Its confirmation.
    pub email: SentMessage,
    /// Its ticket.
    pub ticket: Ticket,
    /// Its refund wire.
    pub wire: WireReceipt,
}

/// Why [`Shop::process_order`] stopped: which step, and what idem said.
#[derive(Debug)]
pub struct Stopped {
    /// The step's tool.
    pub tool: &'static str,
    /// What idem said.
    pub error: ToolError<ProviderError>,
}

impl Stopped {
    fn at(tool: &'static str, error: ToolError<ProviderError>) -> Stopped {
        Stopped { tool, error }
    }
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.tool, self.error)
    }
}

/// Names of the four side-effecting tools, in workflow order.
pub const EFFECT_TOOLS: [&str; 4] = ["charge", "send_email", "open_ticket", "refund_wire"];

/// Names of the saga's side-effecting tools: its steps in order, then
/// their compensations in the order they run.
pub const SAGA_TOOLS: [&str; 5] = [
    "book_courier",
    "pay",
    "pay_supplier",
    "refund",
    "cancel_courier",
];

/// [`effects`] for the saga's tools ([`SAGA_TOOLS`]): how many times the
/// effect of `tool` for the shipped `order` was applied, by the provider's
/// own ledger and by business identity (the courier's title, the order of
/// the charge, the refunded charge, the supplier's reference, the cancelled
/// ticket).
pub fn saga_effects(providers: &Providers, tool: &str, order: u64) -> usize {
    let couriers = || {
        providers
            .tickets()
            .ledger()
            .into_iter()
            .filter(|t| t.title == courier_title(order))
            .map(|t| t.id)
            .collect::<Vec<_>>()
    };
    let charges = || {
        providers
            .payments()
            .ledger()
            .into_iter()
            .filter(|c| c.order_id == order && c.outcome == ChargeOutcome::Succeeded)
            .map(|c| c.charge_id)
            .collect::<Vec<_>>()
    };
    match tool {
        "book_courier" => couriers().len(),
        "pay" => charges().len(),
        "refund" => {
            let charges = charges();
            providers
                .refunds()
                .iter()
                .filter(|r| charges.contains(&r.charge_id))
                .count()
        }
        "pay_supplier" => providers
            .wire()
            .ledger()
            .iter()
            .filter(|w| w.reference == supplier_reference(order))
            .count(),
        "cancel_courier" => {
            let couriers = couriers();
            providers
                .cancellations()
                .iter()
                .filter(|c| couriers.contains(&c.ticket_id))
                .count()
        }
        other => panic!("not a saga tool: {other}"),
    }
}

/// Dies the way a power cut or the OOM killer kills: SIGKILL, no destructor,
/// no flush, nothing written after this point.
pub fn sigkill_self() -> ! {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    // `kill` missing, or the signal not delivered yet: abort is as abrupt.
    std::process::abort()
}

/// Runs a worker's `work` on a single-threaded tokio runtime and returns its
/// exit code; a worker still running after `deadline` gives up with `stuck`,
/// so a hang becomes a reported failure instead of a hung parent.
pub fn run_worker(
    deadline: Duration,
    stuck: i32,
    work: impl std::future::Future<Output = i32>,
) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            return stuck;
        }
    };
    runtime.block_on(async {
        tokio::time::timeout(deadline, work)
            .await
            .unwrap_or_else(|_| {
                eprintln!("worker stuck for {deadline:?}; giving up");
                stuck
            })
    })
}

// ---------------------------------------------------------------------------
// A second workflow, as a saga (`ship_order`): book a courier, charge the
// card, pay the supplier. When the supplier's bank refuses the payment (a
// semantic refusal: the account is closed), idem undoes the completed steps
// in reverse order: the charge is refunded, the courier cancelled.
//
// These tools are free functions: a compensation is handed the original
// call's result and arguments, not a receiver, so the `Shop` (its clients
// and hook) travels as an argument the key leaves out. A `verify` is handed
// only the context: it reaches the providers through the worker's
// configuration (`ProviderAddrs::from_env`).

/// The supplier's account: its bank has closed it.
pub const SUPPLIER_IBAN: &str = "XX00CLOSED0000000000";

/// The providers, as this process's environment names them.
fn configured() -> Result<Clients, ProviderError> {
    ProviderAddrs::from_env()
        .map(|a| a.clients_with(CLIENT_CONFIG))
        .map_err(|e| ProviderError::InvalidRequest {
            reason: format!("provider addresses: {e}"),
        })
}

/// Saga step 1, journal class: books the courier (a ticket with our key as
/// its reference); undone by [`cancel_courier`].
///
/// `commit = "eventual"`: the saga's body gets the ticket after the
/// INTENT's one fsync; the COMMITTED record rides the next group commit
/// (at the latest the INTENT of `pay`, the next step). A crash that loses
/// it finds the INTENT, and `courier_booked` finds the ticket by our key:
/// the same ticket, committed then, no second booking. (The torture
/// harness counts these lost commits and checks exactly that.)
#[tool(
    class = "journal",
    name = "book_courier",
    destructive = false,
    key = "order_id",
    verify = courier_booked,
    compensate = cancel_courier,
    commit = "eventual",
    retry(max_attempts = 10, initial = "10ms", max_interval = "200ms"),
    timeout = "600ms"
)]
pub async fn book_courier(
    ctx: &Ctx,
    order_id: u64,
    shop: Arc<Shop>,
) -> Result<Ticket, ProviderError> {
    let ticket = NewTicket {
        external_ref: ctx.idempotency_key().to_string(),
        title: courier_title(order_id),
        body: "pick up at the warehouse".into(),
    };
    shop.at(Moment::Sending, "book_courier", order_id);
    let booked = shop.clients.tickets.create(&ticket).await?;
    shop.at(Moment::Landed, "book_courier", order_id);
    Ok(booked)
}

async fn courier_booked(ctx: &Ctx) -> Result<Verdict<Ticket>, ProviderError> {
    let found = configured()?
        .tickets
        .find_by_ref(ctx.idempotency_key().as_str())
        .await?;
    Ok(found
        .into_iter()
        .next()
        .map_or(Verdict::NotLanded, Verdict::Landed))
}

/// Undoes [`book_courier`], journal class: cancellations are not
/// deduplicated, but can be found by our key.
#[tool(
    class = "journal",
    name = "cancel_courier",
    key = "ticket.id",
    verify = courier_cancelled,
    retry(max_attempts = 10, initial = "10ms", max_interval = "200ms"),
    timeout = "600ms"
)]
pub async fn cancel_courier(
    ctx: &Ctx,
    ticket: &Ticket,
    order_id: &u64,
    shop: &Arc<Shop>,
) -> Result<Cancellation, ProviderError> {
    let cancel = CancelTicket {
        ticket_id: ticket.id.clone(),
        reference: ctx.idempotency_key().to_string(),
    };
    shop.at(Moment::Sending, "cancel_courier", *order_id);
    let done = shop.clients.tickets.cancel(&cancel).await?;
    shop.at(Moment::Landed, "cancel_courier", *order_id);
    Ok(done)
}

async fn courier_cancelled(ctx: &Ctx) -> Result<Verdict<Cancellation>, ProviderError> {
    let found = configured()?
        .tickets
        .find_cancellations(ctx.idempotency_key().as_str())
        .await?;
    Ok(found
        .into_iter()
        .next()
        .map_or(Verdict::NotLanded, Verdict::Landed))
}

/// Saga step 2, provider class: charges the card under our key; undone by
/// [`refund`].
///
/// `commit = "eventual"`, as `book_courier`: a COMMITTED record lost to a
/// crash leaves the INTENT, the charge is sent again under the same key,
/// and payments answers with the charge it saved, not a second one.
#[tool(
    class = "provider",
    name = "pay",
    key = "order.id",
    compensate = refund,
    commit = "eventual",
    retry(max_attempts = 10, initial = "10ms", max_interval = "200ms", max_elapsed = "1m"),
    timeout = "600ms"
)]
pub async fn pay(ctx: &Ctx, order: Order, shop: Arc<Shop>) -> Result<Charge, ProviderError> {
    let request = ChargeRequest {
        amount: order.amount_cents,
        currency: order.currency.clone(),
        order_id: order.id,
        customer: order.customer.clone(),
    };
    shop.at(Moment::Sending, "pay", order.id);
    let mut charge = shop
        .clients
        .payments
        .charge(ctx.idempotency_key().as_str(), &request)
        .await?;
    if charge.replayed {
        ctx.mark_provider_replay();
        // How this answer came (the `Idempotent-Replayed` header) is not
        // part of the charge, and the audit stream has it now. Returned,
        // it would make the result of a call sent again after a lost
        // eventual COMMIT differ from the one the caller was given.
        charge.replayed = false;
    }
    shop.at(Moment::Landed, "pay", order.id);
    Ok(charge)
}

/// Undoes [`pay`], provider class: payments deduplicates refunds on our
/// key, as it does charges.
#[tool(
    class = "provider",
    name = "refund",
    key = "charge.id",
    retry(
        max_attempts = 10,
        initial = "10ms",
        max_interval = "200ms",
        max_elapsed = "1m"
    ),
    timeout = "600ms"
)]
pub async fn refund(
    ctx: &Ctx,
    charge: &Charge,
    order: &Order,
    shop: &Arc<Shop>,
) -> Result<Refund, ProviderError> {
    let request = RefundRequest {
        charge: charge.id.clone(),
        amount: charge.amount,
    };
    shop.at(Moment::Sending, "refund", order.id);
    let refund = shop
        .clients
        .payments
        .refund(ctx.idempotency_key().as_str(), &request)
        .await?;
    if refund.replayed {
        ctx.mark_provider_replay();
    }
    shop.at(Moment::Landed, "refund", order.id);
    Ok(refund)
}

/// Supplier payments above this (in cents) wait for a person's approval.
pub const SUPPLIER_APPROVAL_CENTS: u64 = 3000;

/// `pay_supplier`'s approval policy: a person approves supplier payments
/// above [`SUPPLIER_APPROVAL_CENTS`]; smaller ones run at once.
fn supplier_approval(
    _ctx: &Ctx,
    _order_id: &u64,
    _iban: &String,
    amount_cents: &u64,
    _shop: &Arc<Shop>,
) -> Option<String> {
    (*amount_cents > SUPPLIER_APPROVAL_CENTS).then(|| {
        format!(
            "a supplier payment of {}.{:02} EUR is above {}.{:02} EUR",
            amount_cents / 100,
            amount_cents % 100,
            SUPPLIER_APPROVAL_CENTS / 100,
            SUPPLIER_APPROVAL_CENTS % 100
        )
    })
}

/// Whether `pay_supplier` for `order_id` (as [`ship_order_to`] calls it)
/// needs a person's approval.
pub fn supplier_needs_approval(order_id: u64) -> bool {
    supplier_amount(order_id) > SUPPLIER_APPROVAL_CENTS
}

/// What the supplier is paid for `order_id`: half the order.
pub fn supplier_amount(order_id: u64) -> u64 {
    order_book(order_id).amount_cents / 2
}

/// The payment reference of the supplier's wire for `order_id`.
pub fn supplier_reference(order_id: u64) -> String {
    format!("supplier, order {order_id}")
}

/// The title of the courier ticket `book_courier` opens for `order_id`.
pub fn courier_title(order_id: u64) -> String {
    format!("courier, order {order_id}")
}

/// Saga step 3, at-most-once: pays the supplier by wire, after a person's
/// approval when the amount is large (`approve = supplier_approval`).
#[tool(
    class = "at_most_once",
    name = "pay_supplier",
    key = "order_id",
    approve = supplier_approval,
    timeout = "600ms"
)]
pub async fn pay_supplier(
    ctx: &Ctx,
    order_id: u64,
    iban: String,
    amount_cents: u64,
    shop: Arc<Shop>,
) -> Result<WireReceipt, ProviderError> {
    let _ = ctx;
    let wire = WireRequest {
        to_account: iban,
        amount: amount_cents,
        reference: supplier_reference(order_id),
    };
    shop.at(Moment::Sending, "pay_supplier", order_id);
    let receipt = shop.clients.wire.send(&wire).await?;
    shop.at(Moment::Landed, "pay_supplier", order_id);
    Ok(receipt)
}

/// What a shipped order produced.
#[derive(Debug, Clone)]
pub struct Shipped {
    /// The courier's ticket.
    pub courier: Ticket,
    /// The charge.
    pub charge: Charge,
    /// The supplier's payment.
    pub supplier: WireReceipt,
}

/// A call of the saga of [`ship_order_to`] that returned its result to the
/// saga's body (replayed from the journal or not).
#[derive(Debug)]
pub enum ShipStep<'a> {
    /// `book_courier` returned the courier's ticket.
    Courier(&'a Ticket),
    /// `pay` returned the charge.
    Charge(&'a Charge),
}

impl ShipStep<'_> {
    /// The tool that returned.
    pub fn tool(&self) -> &'static str {
        match self {
            ShipStep::Courier(_) => "book_courier",
            ShipStep::Charge(_) => "pay",
        }
    }

    /// What it returned, as JSON (as the journal keeps results).
    pub fn result(&self) -> serde_json::Result<serde_json::Value> {
        match self {
            ShipStep::Courier(t) => serde_json::to_value(t),
            ShipStep::Charge(c) => serde_json::to_value(c),
        }
    }
}

/// Ships `order_id` as the saga `ship` of `ctx`'s run, paying the supplier
/// at [`SUPPLIER_IBAN`]. A refusal of a step rolls the completed ones back:
/// `ToolError::Compensated` once every one is undone. Safe to run again
/// after a crash: a rollback under way resumes.
pub async fn ship_order(
    shop: &Arc<Shop>,
    ctx: &Ctx,
    order_id: u64,
) -> Result<Shipped, ToolError<ProviderError>> {
    ship_order_to(shop, ctx, order_id, SUPPLIER_IBAN, &|_| {}).await
}

/// [`ship_order`], paying the supplier at `supplier_iban`. `on_step`
/// hears of each of the first two steps as soon as its call returned a
/// result to the saga's body (the torture harness logs what it was given).
pub async fn ship_order_to(
    shop: &Arc<Shop>,
    ctx: &Ctx,
    order_id: u64,
    supplier_iban: &str,
    on_step: &(dyn Fn(ShipStep<'_>) + Send + Sync),
) -> Result<Shipped, ToolError<ProviderError>> {
    let order = order_book(order_id);
    ctx.saga("ship", |s| async move {
        let courier = book_courier(s.ctx(), order.id, shop.clone()).await?;
        on_step(ShipStep::Courier(&courier));
        let charge = pay(s.ctx(), order.clone(), shop.clone()).await?;
        on_step(ShipStep::Charge(&charge));
        let supplier = pay_supplier(
            s.ctx(),
            order.id,
            supplier_iban.to_string(),
            supplier_amount(order.id),
            shop.clone(),
        )
        .await?;
        Ok(Shipped {
            courier,
            charge,
            supplier,
        })
    })
    .await
}
