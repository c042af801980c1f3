//! Starting, observing and stopping the four providers together.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::addrs::ProviderAddrs;
use crate::client::HttpClient;
use crate::clock::Clock;
use crate::email::{Email, SentMessage};
use crate::faults::FaultControl;
use crate::ledger::{Duplicate, Effect, Ledger};
use crate::payments::{ChargeRecord, Payments, PaymentsConfig, RefundRecord};
use crate::server::{self, Busy, Running, ServerConfig, Service};
use crate::tickets::{Cancellation, Ticket, Tickets};
use crate::wire::{WireReceipt, Wires};

/// Options for [`Providers::start_with`].
#[derive(Debug, Clone, Default)]
pub struct ProvidersConfig {
    /// Time source of every provider (ledger timestamps, key expiry).
    pub clock: Clock,
    /// Payments options (key window, declines).
    pub payments: PaymentsConfig,
    /// Server limits shared by all providers.
    pub server: ServerConfig,
}

impl ProvidersConfig {
    /// Uses `clock` instead of the system clock.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the payments options.
    pub fn payments(mut self, payments: PaymentsConfig) -> Self {
        self.payments = payments;
        self
    }

    /// Sets the server limits.
    pub fn server(mut self, server: ServerConfig) -> Self {
        self.server = server;
        self
    }
}

/// The handle of one running provider: its address, its fault controls and
/// its ledger. Cheap to clone; the ledger stays readable after shutdown.
#[derive(Debug, Clone)]
pub struct Provider<E> {
    name: &'static str,
    addr: SocketAddr,
    faults: FaultControl,
    busy: Busy,
    ledger: Ledger<E>,
}

/// The payments provider's handle.
pub type PaymentsProvider = Provider<ChargeRecord>;
/// The email provider's handle.
pub type EmailProvider = Provider<SentMessage>;
/// The tickets provider's handle.
pub type TicketsProvider = Provider<Ticket>;
/// The wire provider's handle.
pub type WireProvider = Provider<WireReceipt>;

impl<E: Effect> Provider<E> {
    /// `payments`, `email`, `tickets` or `wire`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its fault controls.
    pub fn faults(&self) -> &FaultControl {
        &self.faults
    }

    /// Waits until every request sent to this provider before the call has
    /// been handled: its effect, if it applies one, is in the ledger. What
    /// a harness waits for after a client died with requests on the wire,
    /// instead of a fixed delay (a human operator would wait for the bank
    /// statement to settle the same way).
    ///
    /// A request held by a [`crate::Gate`] counts until it is released. A
    /// request whose connection the listener had not accepted yet is found
    /// with a probe: connections are accepted in the order they were made,
    /// so once the probe's own request is answered every earlier one is
    /// counted. (If the listener is closed, as in an outage, the connections
    /// it had not accepted were reset and apply nothing.)
    pub async fn settled(&self) {
        let probe = HttpClient::new(self.addr);
        // Any answer will do (404): it proves the accept loop got this far.
        let _ = probe.request("GET", "/__settled", &[], &[]).await;
        self.busy.idle().await;
    }

    /// A snapshot of every effect applied so far, in order.
    pub fn ledger(&self) -> Vec<E> {
        self.ledger.snapshot()
    }

    /// How many times each logical operation was applied (payments: per
    /// order, succeeded charges only; email: per recipient and key; tickets:
    /// per external reference; wire: per reference).
    pub fn counts(&self) -> BTreeMap<E::Operation, usize> {
        self.ledger.counts()
    }

    /// How many times one operation was applied.
    pub fn count(&self, operation: &E::Operation) -> usize {
        self.counts().get(operation).copied().unwrap_or(0)
    }

    /// Operations applied more than once, with their counts.
    pub fn duplicates(&self) -> Vec<(E::Operation, usize)> {
        self.ledger.duplicates()
    }

    /// The ledger as a JSON array.
    pub fn ledger_json(&self) -> serde_json::Value {
        serde_json::to_value(self.ledger.snapshot()).unwrap_or_default()
    }

    fn duplicate_report(&self) -> impl Iterator<Item = Duplicate> + '_ {
        self.duplicates().into_iter().map(|(op, count)| Duplicate {
            provider: self.name.to_string(),
            operation: op.to_string(),
            count,
        })
    }
}

/// What starting one provider needs from the others.
struct Starter<'a> {
    server: &'a ServerConfig,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Starter<'_> {
    async fn start<S: Service, E: Effect>(
        &mut self,
        name: &'static str,
        service: impl FnOnce(Ledger<E>) -> S,
    ) -> io::Result<Provider<E>> {
        let ledger = Ledger::default();
        let Running {
            addr,
            faults,
            busy,
            task,
        } = server::spawn(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            Arc::new(service(ledger.clone())),
            self.server.clone(),
            self.shutdown.subscribe(),
        )
        .await?;
        self.tasks.push(task);
        Ok(Provider {
            name,
            addr,
            faults,
            busy,
            ledger,
        })
    }
}

/// The four providers, each on its own `127.0.0.1` port, served by tasks of
/// the current tokio runtime.
///
/// Dropping the handle (or [`Providers::shutdown`]) stops every listener
/// and connection; [`Provider`] handles cloned out of it keep their ledgers.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use idem_testkit::{ChargeRequest, Fault, Providers};
///
/// let providers = Providers::start().await?;
/// providers.payments().faults().push(Fault::timeout_after_apply());
/// let clients = providers.addrs().clients();
/// let req = ChargeRequest { amount: 1999, currency: "eur".into(), order_id: 4711, customer: "cus_1".into() };
/// let _ = clients.payments.charge("key-1", &req).await; // times out after 5 s, but charged
/// assert_eq!(providers.payments().ledger().len(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Providers {
    payments: PaymentsProvider,
    email: EmailProvider,
    tickets: TicketsProvider,
    wire: WireProvider,
    refunds: Ledger<RefundRecord>,
    cancellations: Ledger<Cancellation>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Providers {
    /// Starts all providers with default options.
    pub async fn start() -> io::Result<Providers> {
        Self::start_with(ProvidersConfig::default()).await
    }

    /// Starts all providers.
    pub async fn start_with(config: ProvidersConfig) -> io::Result<Providers> {
        let mut starter = Starter {
            server: &config.server,
            shutdown: watch::channel(false).0,
            tasks: Vec::new(),
        };
        let clock = &config.clock;
        // On an early return the dropped shutdown sender stops whatever
        // already started.
        let refunds = Ledger::default();
        let cancellations = Ledger::default();
        let payments = starter
            .start("payments", |ledger| {
                Payments::new(
                    config.payments.clone(),
                    clock.clone(),
                    ledger,
                    refunds.clone(),
                )
            })
            .await?;
        let email = starter
            .start("email", |ledger| Email::new(clock.clone(), ledger))
            .await?;
        let tickets = starter
            .start("tickets", |ledger| {
                Tickets::new(clock.clone(), ledger, cancellations.clone())
            })
            .await?;
        let wire = starter
            .start("wire", |ledger| Wires::new(clock.clone(), ledger))
            .await?;
        Ok(Providers {
            payments,
            email,
            tickets,
            wire,
            refunds,
            cancellations,
            shutdown: starter.shutdown,
            tasks: starter.tasks,
        })
    }

    /// Every provider's address, e.g. for [`ProviderAddrs::to_env`].
    pub fn addrs(&self) -> ProviderAddrs {
        ProviderAddrs {
            payments: self.payments.addr,
            email: self.email.addr,
            tickets: self.tickets.addr,
            wire: self.wire.addr,
        }
    }

    /// The payments provider.
    pub fn payments(&self) -> &PaymentsProvider {
        &self.payments
    }

    /// The email provider.
    pub fn email(&self) -> &EmailProvider {
        &self.email
    }

    /// The tickets provider.
    pub fn tickets(&self) -> &TicketsProvider {
        &self.tickets
    }

    /// The wire provider.
    pub fn wire(&self) -> &WireProvider {
        &self.wire
    }

    /// Every refund payments executed (`POST /v1/refunds`), in order.
    pub fn refunds(&self) -> Vec<RefundRecord> {
        self.refunds.snapshot()
    }

    /// Every ticket cancellation (`POST /tickets/cancel`), in order.
    pub fn cancellations(&self) -> Vec<Cancellation> {
        self.cancellations.snapshot()
    }

    /// Every operation applied more than once, across all providers
    /// (refunds per charge and cancellations per ticket included). Empty
    /// is what a harness asserts.
    pub fn duplicates(&self) -> Vec<Duplicate> {
        let mut all: Vec<Duplicate> = self.payments.duplicate_report().collect();
        all.extend(self.email.duplicate_report());
        all.extend(self.tickets.duplicate_report());
        all.extend(self.wire.duplicate_report());
        for (operation, count) in self.refunds.duplicates() {
            all.push(Duplicate {
                provider: "payments".into(),
                operation: format!("refund of {operation}"),
                count,
            });
        }
        for (operation, count) in self.cancellations.duplicates() {
            all.push(Duplicate {
                provider: "tickets".into(),
                operation: format!("cancellation of {operation}"),
                count,
            });
        }
        all
    }

    /// [`Provider::settled`] for all four: every request sent to any of them
    /// before the call has been handled.
    pub async fn settled(&self) {
        tokio::join!(
            self.payments.settled(),
            self.email.settled(),
            self.tickets.settled(),
            self.wire.settled()
        );
    }

    /// All ledgers as one JSON object keyed by provider name.
    pub fn ledgers_json(&self) -> serde_json::Value {
        json!({
            "payments": self.payments.ledger_json(),
            "email": self.email.ledger_json(),
            "tickets": self.tickets.ledger_json(),
            "wire": self.wire.ledger_json(),
        })
    }

    /// Stops every provider and waits for the listeners to close. Held and
    /// hanging connections are dropped.
    pub async fn shutdown(mut self) {
        self.shutdown.send_replace(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for Providers {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}
