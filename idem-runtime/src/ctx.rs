//! `Ctx`: the handle a tool call runs under. It names the root run (whose
//! dedupe scope every key belongs to), the scope path, the agent path, and
//! inside a call, the call's key and attempt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::key::KeyPrefix;
use crate::shared::{Runtime, Shared};
use idem_journal::key::IdemKey;

/// Domain tag of operation keys.
pub(crate) const KEY_DOMAIN: &str = "idem.key";

/// The context of a run, cheap to clone and to send between tasks.
///
/// Obtained from `Runtime::run`, then narrowed with [`Ctx::child`] (a
/// subagent: same dedupe scope) or [`Ctx::scope`] (a deliberately distinct
/// operation). Tools receive it as their first parameter; inside a call it
/// also carries the call's [`IdemKey`] and attempt number.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) scope: Arc<Scope>,
    pub(crate) call: InCall,
}

/// Whether a context is inside a tool call, and which.
#[derive(Clone)]
pub(crate) enum InCall {
    /// Outside any call (a run's, child's or scope's context).
    No,
    /// Inside attempt `.0` of a read-only call: no key, nothing shared
    /// with the engine, so nothing is allocated (the read-only call is the
    /// cheapest there is, and measured so).
    ReadOnly(u32),
    /// Inside an attempt of a keyed call.
    Keyed(Arc<CallState>),
}

impl InCall {
    /// Whether this is inside a call of any class.
    pub(crate) fn is_some(&self) -> bool {
        !matches!(self, InCall::No)
    }
}

pub(crate) struct Scope {
    pub(crate) shared: Arc<Shared>,
    pub(crate) root: Arc<str>,
    pub(crate) path: Vec<Arc<str>>,
    pub(crate) agent: Arc<str>,
    pub(crate) prefix: KeyPrefix,
    /// The saga whose body this context runs in (`Saga::ctx`): completed
    /// calls of compensable tools are recorded in it.
    pub(crate) saga: Option<Arc<crate::saga::log::Log<Ctx>>>,
    /// A context a saga hands a compensation: the first tool called with
    /// it must be journaled.
    pub(crate) compensation: bool,
}

pub(crate) struct CallState {
    pub(crate) key: IdemKey,
    pub(crate) attempt: u32,
    pub(crate) provider_replay: AtomicBool,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Ctx");
        d.field("root", &&*self.scope.root)
            .field("scope", &self.scope.path)
            .field("agent", &&*self.scope.agent);
        match &self.call {
            InCall::No => {}
            InCall::ReadOnly(attempt) => {
                d.field("attempt", attempt);
            }
            InCall::Keyed(call) => {
                d.field("key", &call.key).field("attempt", &call.attempt);
            }
        }
        d.finish()
    }
}

impl Ctx {
    pub(crate) fn root(shared: Arc<Shared>, root: &str) -> Ctx {
        let root: Arc<str> = Arc::from(root);
        Ctx {
            scope: Arc::new(Scope {
                prefix: KeyPrefix::new(KEY_DOMAIN, &root, &[]),
                shared,
                agent: root.clone(),
                root,
                path: Vec::new(),
                saga: None,
                compensation: false,
            }),
            call: InCall::No,
        }
    }

    /// The provider-facing idempotency key of the call in progress:
    /// identical on every attempt and after a restart.
    ///
    /// # Panics
    /// Outside a tool call (a `Ctx` straight from `Runtime::run` has no
    /// key) and inside a `read_only` tool (which has none); use
    /// [`Ctx::try_idempotency_key`] where that can happen.
    pub fn idempotency_key(&self) -> &IdemKey {
        self.try_idempotency_key().expect(
            "Ctx::idempotency_key() called outside a tool call or in a read_only tool: only \
             the Ctx a provider, journal or at_most_once #[tool] (or its verify function) \
             receives carries a key",
        )
    }

    /// The call's key, or `None` outside a tool call and in `read_only` tools.
    pub fn try_idempotency_key(&self) -> Option<&IdemKey> {
        match &self.call {
            InCall::Keyed(call) => Some(&call.key),
            InCall::No | InCall::ReadOnly(_) => None,
        }
    }

    /// The attempt in progress, from 1; 0 outside a tool call. Counts
    /// survive restarts.
    pub fn attempt(&self) -> u32 {
        match &self.call {
            InCall::No => 0,
            InCall::ReadOnly(attempt) => *attempt,
            InCall::Keyed(call) => call.attempt,
        }
    }

    /// The root run id every key of this context belongs to.
    pub fn root_run(&self) -> &str {
        &self.scope.root
    }

    /// The scope path below the root run.
    pub fn scope_path(&self) -> impl Iterator<Item = &str> {
        self.scope.path.iter().map(|s| &**s)
    }

    /// The agent path: the root run, then each `child` name.
    pub fn agent(&self) -> &str {
        &self.scope.agent
    }

    /// A context for a subagent. Its keys stay in this run's dedupe scope:
    /// if the parent retries the whole subtask, the subagent's completed
    /// effects are replayed, not repeated. The name only labels audit events.
    pub fn child(&self, name: &str) -> Ctx {
        let s = &self.scope;
        Ctx {
            scope: Arc::new(Scope {
                shared: s.shared.clone(),
                root: s.root.clone(),
                path: s.path.clone(),
                agent: Arc::from(format!("{}/{}", s.agent, name)),
                prefix: s.prefix.clone(),
                saga: s.saga.clone(),
                compensation: false,
            }),
            call: InCall::No,
        }
    }

    /// A context for a deliberately distinct operation: the same tool with
    /// the same key fields under `scope("second-reminder")` is a new
    /// operation with a new key.
    pub fn scope(&self, name: &str) -> Ctx {
        let s = &self.scope;
        let mut path = s.path.clone();
        path.push(Arc::from(name));
        Ctx {
            scope: Arc::new(Scope {
                prefix: KeyPrefix::new(KEY_DOMAIN, &s.root, &path),
                shared: s.shared.clone(),
                root: s.root.clone(),
                agent: s.agent.clone(),
                path,
                saga: s.saga.clone(),
                compensation: false,
            }),
            call: InCall::No,
        }
    }

    /// Tells idem that the provider answered this attempt with a replay of
    /// an earlier response for our key (e.g. Stripe's
    /// `Idempotent-Replayed: true`). Recorded in the audit stream.
    pub fn mark_provider_replay(&self) {
        if let InCall::Keyed(call) = &self.call {
            call.provider_replay.store(true, Ordering::Relaxed);
        }
    }

    /// The runtime this context belongs to.
    pub fn runtime(&self) -> Runtime {
        Runtime {
            shared: self.scope.shared.clone(),
        }
    }

    /// This context with another saga log (or none) and compensation mark.
    pub(crate) fn with_saga(
        &self,
        saga: Option<Arc<crate::saga::log::Log<Ctx>>>,
        compensation: bool,
    ) -> Ctx {
        let s = &self.scope;
        Ctx {
            scope: Arc::new(Scope {
                shared: s.shared.clone(),
                root: s.root.clone(),
                path: s.path.clone(),
                agent: s.agent.clone(),
                prefix: s.prefix.clone(),
                saga,
                compensation,
            }),
            call: InCall::No,
        }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.scope.shared
    }

    pub(crate) fn prefix(&self) -> &KeyPrefix {
        &self.scope.prefix
    }

    /// This context, inside attempt `attempt` of the call keyed `key`.
    pub(crate) fn for_call(&self, key: &IdemKey, attempt: u32) -> Ctx {
        Ctx {
            scope: self.scope.clone(),
            call: InCall::Keyed(Arc::new(CallState {
                key: key.clone(),
                attempt,
                provider_replay: AtomicBool::new(false),
            })),
        }
    }

    /// This context, inside attempt `attempt` of a read-only call.
    pub(crate) fn for_read_only(&self, attempt: u32) -> Ctx {
        Ctx {
            scope: self.scope.clone(),
            call: InCall::ReadOnly(attempt),
        }
    }

    pub(crate) fn provider_replayed(&self) -> bool {
        match &self.call {
            InCall::Keyed(call) => call.provider_replay.load(Ordering::Relaxed),
            InCall::No | InCall::ReadOnly(_) => false,
        }
    }
}
