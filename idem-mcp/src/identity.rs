//! Which run (and scope) an MCP tool call belongs to.
//!
//! Keys belong to a root run: the same call in the same run is one
//! operation, replayed on repetition; in another run it is another
//! operation. An MCP request does not say which run it belongs to, so the
//! client says it in the request's `_meta` (`"idem/run"`, optionally
//! `"idem/scope"`), or the server derives it with a resolver. A call with
//! neither is refused: guessing would silently merge or split operations.
//!
//! `_meta` is written by the client: whoever can call the server can name
//! any run, and so replay another run's results (a committed charge) or
//! pre-empt its next call (which then replays the first caller's result).
//! It is no tenant boundary. A server that serves more than one party sets
//! a [`Resolver`]: then the resolver decides every call, seeing what the
//! client asked for ([`CallInfo::requested`]) next to what the server
//! knows (the HTTP request's head, say, with the identity an
//! authenticating proxy put there), and accepts it, replaces it or refuses
//! the call ([`Decision`]). `_meta` alone is taken only by a server
//! without a resolver.

use serde_json::{Map, Value};

/// The `_meta` key of the run id.
pub const META_RUN: &str = "idem/run";
/// The `_meta` key of the scope: a string, or an array of strings for a
/// nested scope path.
pub const META_SCOPE: &str = "idem/scope";

/// The run (and scope path) a call belongs to: `rt.run(run)`, then
/// `.scope(s)` for each element of `scope`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// The root run id (a durable workflow id).
    pub run: String,
    /// The scope path below it.
    pub scope: Vec<String>,
}

impl RunIdentity {
    /// Run `run`, no scope.
    pub fn new(run: impl Into<String>) -> RunIdentity {
        RunIdentity {
            run: run.into(),
            scope: Vec::new(),
        }
    }

    /// The same, one scope deeper.
    pub fn scope(mut self, name: impl Into<String>) -> RunIdentity {
        self.scope.push(name.into());
        self
    }
}

/// What a resolver sees of a call. Everything here but `http` is written
/// by the client.
#[derive(Debug)]
#[non_exhaustive]
pub struct CallInfo<'a> {
    /// The tool's name, as idem knows it.
    pub tool: &'a str,
    /// The call's arguments.
    pub arguments: &'a Map<String, Value>,
    /// The request's `_meta`.
    pub meta: &'a Map<String, Value>,
    /// The identity the client asked for in `_meta` (`"idem/run"`,
    /// `"idem/scope"`), `None` when it sent none. (A malformed one is
    /// refused before the resolver is asked.)
    pub requested: Option<&'a RunIdentity>,
    /// The HTTP request's head, on the streamable HTTP transport.
    pub http: Option<&'a http::request::Parts>,
}

/// What a [`Resolver`] decides about a call.
///
/// A resolver may also return `Option<RunIdentity>` (what resolvers
/// returned before they saw every call): `Some(id)` is
/// [`Replace`](Decision::Replace), `None` is [`Decline`](Decision::Decline).
/// Such a resolver that wants the client's identity returns
/// `call.requested.cloned()`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Run the call under the identity the client sent in `_meta`
    /// ([`CallInfo::requested`]); a call that sent none is refused as
    /// having no identity (`no_run_identity`).
    Accept,
    /// Run the call under this identity, whatever `_meta` said.
    Replace(RunIdentity),
    /// Refuse the call: nothing is run, and the client's error result says
    /// `reason` (`run_identity_refused`).
    Refuse(String),
    /// The resolver cannot tell which run the call belongs to: refused,
    /// nothing is run (`no_run_identity` when `_meta` had no identity
    /// either, else `run_identity_refused`: with a resolver, `_meta` alone
    /// is never taken).
    Decline,
}

impl From<Option<RunIdentity>> for Decision {
    fn from(id: Option<RunIdentity>) -> Decision {
        match id {
            Some(id) => Decision::Replace(id),
            None => Decision::Decline,
        }
    }
}

impl From<RunIdentity> for Decision {
    fn from(id: RunIdentity) -> Decision {
        Decision::Replace(id)
    }
}

/// Decides the run identity of every call, when configured
/// ([`McpServer::with_resolver`](crate::McpServer::with_resolver)).
pub type Resolver = dyn Fn(&CallInfo<'_>) -> Decision + Send + Sync;

/// Why a call has no usable identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Neither `_meta` nor the resolver gave one.
    #[error(
        "no run identity for `{tool}`: idem keys every effect to a run, and this call did not \
         say which. Send it in the request's _meta: {{\"idem/run\": \"<workflow id>\"}} (the \
         same id on every retry and after a restart), optionally with \"idem/scope\": \"<name>\" \
         for a deliberately distinct operation"
    )]
    Missing {
        /// The tool.
        tool: String,
    },
    /// `_meta` has the keys, with values of the wrong kind (or the resolver
    /// gave an empty run id).
    #[error("bad run identity in _meta for `{tool}`: {detail}")]
    Invalid {
        /// The tool.
        tool: String,
        /// What is wrong.
        detail: String,
    },
    /// The server's resolver refused the call.
    #[error("the server refused the run identity of this call of `{tool}`: {reason}")]
    Refused {
        /// The tool.
        tool: String,
        /// Why (the resolver's words).
        reason: String,
    },
}

impl IdentityError {
    /// A stable label: `no_run_identity`, `bad_run_identity` or
    /// `run_identity_refused`.
    pub fn kind(&self) -> &'static str {
        match self {
            IdentityError::Missing { .. } => "no_run_identity",
            IdentityError::Invalid { .. } => "bad_run_identity",
            IdentityError::Refused { .. } => "run_identity_refused",
        }
    }

    /// What the caller may do, in a sentence a model can follow.
    pub fn advice(&self) -> &'static str {
        match self {
            IdentityError::Missing { .. } | IdentityError::Invalid { .. } => {
                "Send the run identity in the request's _meta: {\"idem/run\": \"<workflow id>\"}, \
                 optionally with \"idem/scope\"; nothing was run."
            }
            IdentityError::Refused { .. } => {
                "This server decides which run a call belongs to and refused this one; nothing \
                 was run. Do not repeat the call unchanged."
            }
        }
    }
}

/// The identity a call's `_meta` asks for: `None` without one, an error
/// for a malformed one.
pub(crate) fn requested(
    tool: &str,
    meta: &Map<String, Value>,
) -> Result<Option<RunIdentity>, IdentityError> {
    from_meta(tool, meta)
}

/// The identity a call runs under: without a resolver, the one `_meta`
/// asked for; with one, what the resolver decides.
pub(crate) fn decide(
    info: &CallInfo<'_>,
    resolver: Option<&Resolver>,
) -> Result<RunIdentity, IdentityError> {
    let tool = || info.tool.to_string();
    let requested = || {
        info.requested
            .cloned()
            .ok_or_else(|| IdentityError::Missing { tool: tool() })
    };
    let Some(resolver) = resolver else {
        return requested();
    };
    match resolver(info) {
        Decision::Accept => requested(),
        Decision::Replace(id)
            if id.run.trim().is_empty() || id.scope.iter().any(String::is_empty) =>
        {
            Err(IdentityError::Invalid {
                tool: tool(),
                detail: "the server's resolver gave an empty run id or scope name".into(),
            })
        }
        Decision::Replace(id) => Ok(id),
        Decision::Refuse(reason) => Err(IdentityError::Refused {
            tool: tool(),
            reason,
        }),
        Decision::Decline if info.requested.is_none() => {
            Err(IdentityError::Missing { tool: tool() })
        }
        Decision::Decline => Err(IdentityError::Refused {
            tool: tool(),
            reason: "its resolver gave no run identity for this call, and the run named in \
                     _meta is not taken on its own"
                .into(),
        }),
    }
}

fn from_meta(tool: &str, meta: &Map<String, Value>) -> Result<Option<RunIdentity>, IdentityError> {
    let invalid = |detail: String| IdentityError::Invalid {
        tool: tool.into(),
        detail,
    };
    let run = match meta.get(META_RUN) {
        None => {
            if meta.contains_key(META_SCOPE) {
                return Err(invalid(format!(
                    "\"{META_SCOPE}\" without \"{META_RUN}\": a scope is a part of a run; send \
                     both"
                )));
            }
            return Ok(None);
        }
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(other) => {
            return Err(invalid(format!(
                "\"{META_RUN}\" must be a non-empty string (the workflow id), not {other}"
            )))
        }
    };
    let scope = match meta.get(META_SCOPE) {
        None => Vec::new(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                other => Err(invalid(format!(
                    "\"{META_SCOPE}\" must be a string or an array of non-empty strings; it has \
                     {other}"
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(invalid(format!(
                "\"{META_SCOPE}\" must be a string or an array of non-empty strings, not {other}"
            )))
        }
    };
    Ok(Some(RunIdentity { run, scope }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    /// `decide` for a call with `_meta` `m`, as the server calls it.
    fn decide_for(
        m: &Map<String, Value>,
        resolver: Option<&Resolver>,
    ) -> Result<RunIdentity, IdentityError> {
        let args = Map::new();
        let requested = requested("charge", m)?;
        let info = CallInfo {
            tool: "charge",
            arguments: &args,
            meta: m,
            requested: requested.as_ref(),
            http: None,
        };
        decide(&info, resolver)
    }

    fn boxed<D: Into<Decision>>(
        f: impl Fn(&CallInfo<'_>) -> D + Send + Sync + 'static,
    ) -> Box<Resolver> {
        Box::new(move |c| f(c).into())
    }

    #[test]
    fn without_a_resolver_meta_names_the_run() {
        let m = meta(json!({"idem/run": "order-1", "idem/scope": ["a", "b"]}));
        let id = decide_for(&m, None).unwrap();
        assert_eq!(id, RunIdentity::new("order-1").scope("a").scope("b"));
    }

    #[test]
    fn with_a_resolver_the_resolver_decides_even_over_meta() {
        let m = meta(json!({"idem/run": "tenant-a-order"}));
        let empty = Map::new();
        // It sees what the client asked for, and may replace it.
        let namespaced = boxed(|c: &CallInfo<'_>| {
            let asked = c.requested.map_or("none", |r| r.run.as_str());
            Decision::Replace(RunIdentity::new(format!("tenant-b:{asked}")))
        });
        assert_eq!(
            decide_for(&m, Some(&*namespaced)).unwrap().run,
            "tenant-b:tenant-a-order"
        );
        assert_eq!(
            decide_for(&empty, Some(&*namespaced)).unwrap().run,
            "tenant-b:none"
        );
        // Accept takes `_meta`'s; there must be one.
        let accept = boxed(|_: &CallInfo<'_>| Decision::Accept);
        assert_eq!(
            decide_for(&m, Some(&*accept)).unwrap().run,
            "tenant-a-order"
        );
        assert_eq!(
            decide_for(&empty, Some(&*accept)).unwrap_err().kind(),
            "no_run_identity"
        );
        // Refuse says why.
        let refuse = boxed(|_: &CallInfo<'_>| Decision::Refuse("not your run".into()));
        let err = decide_for(&m, Some(&*refuse)).unwrap_err();
        assert_eq!(err.kind(), "run_identity_refused");
        assert!(err.to_string().ends_with(": not your run"), "{err}");
        // An empty identity from the resolver is refused, not run.
        let empty_run = boxed(|_: &CallInfo<'_>| RunIdentity::new(" "));
        assert_eq!(
            decide_for(&m, Some(&*empty_run)).unwrap_err().kind(),
            "bad_run_identity"
        );
    }

    #[test]
    fn an_option_resolver_replaces_or_declines_and_never_lets_meta_through_alone() {
        let m = meta(json!({"idem/run": "someone-elses"}));
        let empty = Map::new();
        let nobody = boxed(|_: &CallInfo<'_>| None::<RunIdentity>);
        assert_eq!(
            decide_for(&empty, Some(&*nobody)).unwrap_err().kind(),
            "no_run_identity"
        );
        let err = decide_for(&m, Some(&*nobody)).unwrap_err();
        assert_eq!(err.kind(), "run_identity_refused", "{err}");
        // Returning the requested identity is how it accepts.
        let echo = boxed(|c: &CallInfo<'_>| c.requested.cloned());
        assert_eq!(decide_for(&m, Some(&*echo)).unwrap().run, "someone-elses");
        let fallback = boxed(|_: &CallInfo<'_>| Some(RunIdentity::new("fallback")));
        assert_eq!(decide_for(&m, Some(&*fallback)).unwrap().run, "fallback");
    }

    #[test]
    fn no_identity_is_refused_with_how_to_send_one() {
        let empty = Map::new();
        let err = decide_for(&empty, None).unwrap_err();
        assert_eq!(err.kind(), "no_run_identity");
        assert!(
            err.to_string()
                .contains("{\"idem/run\": \"<workflow id>\"}"),
            "{err}"
        );
    }

    #[test]
    fn malformed_identities_are_refused_before_the_resolver_is_asked() {
        let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        let resolver = boxed(move |_: &CallInfo<'_>| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Decision::Replace(RunIdentity::new("r"))
        });
        for bad in [
            json!({"idem/run": 7}),
            json!({"idem/run": " "}),
            json!({"idem/run": "r", "idem/scope": 3}),
            json!({"idem/run": "r", "idem/scope": ["ok", ""]}),
            json!({"idem/scope": "s"}),
        ] {
            let m = meta(bad.clone());
            for r in [None, Some(&*resolver)] {
                let err = decide_for(&m, r).unwrap_err();
                assert_eq!(err.kind(), "bad_run_identity", "{bad}: {err}");
            }
        }
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}
