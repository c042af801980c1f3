//! Which run (and scope) an MCP tool call belongs to.
//!
//! Keys belong to a root run: the same call in the same run is one
//! operation, replayed on repetition; in another run it is another
//! operation. An MCP request does not say which run it belongs to, so the
//! client says it in the request's `_meta` (`"idem/run"`, optionally
//! `"idem/scope"`), or the server derives it with a resolver. A call with
//! neither is refused: guessing would silently merge or split operations.

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

/// What a resolver sees of a call.
#[derive(Debug)]
#[non_exhaustive]
pub struct CallInfo<'a> {
    /// The tool's name, as idem knows it.
    pub tool: &'a str,
    /// The call's arguments.
    pub arguments: &'a Map<String, Value>,
    /// The request's `_meta`.
    pub meta: &'a Map<String, Value>,
    /// The HTTP request's head, on the streamable HTTP transport.
    pub http: Option<&'a http::request::Parts>,
}

/// Derives a call's run identity when its `_meta` has none.
pub type Resolver = dyn Fn(&CallInfo<'_>) -> Option<RunIdentity> + Send + Sync;

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
    /// `_meta` has the keys, with values of the wrong kind.
    #[error("bad run identity in _meta for `{tool}`: {detail}")]
    Invalid {
        /// The tool.
        tool: String,
        /// What is wrong.
        detail: String,
    },
}

impl IdentityError {
    /// A stable label: `no_run_identity` or `bad_run_identity`.
    pub fn kind(&self) -> &'static str {
        match self {
            IdentityError::Missing { .. } => "no_run_identity",
            IdentityError::Invalid { .. } => "bad_run_identity",
        }
    }
}

/// The identity of a call: from its `_meta` first, else from `resolver`.
pub(crate) fn resolve(
    info: &CallInfo<'_>,
    resolver: Option<&Resolver>,
) -> Result<RunIdentity, IdentityError> {
    if let Some(id) = from_meta(info.tool, info.meta)? {
        return Ok(id);
    }
    resolver
        .and_then(|r| r(info))
        .ok_or_else(|| IdentityError::Missing {
            tool: info.tool.into(),
        })
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

    fn info<'a>(meta: &'a Map<String, Value>, args: &'a Map<String, Value>) -> CallInfo<'a> {
        CallInfo {
            tool: "charge",
            arguments: args,
            meta,
            http: None,
        }
    }

    #[test]
    fn meta_comes_first_then_the_resolver() {
        let args = Map::new();
        let m = meta(json!({"idem/run": "order-1", "idem/scope": ["a", "b"]}));
        let fallback = |_: &CallInfo<'_>| Some(RunIdentity::new("fallback"));
        let id = resolve(&info(&m, &args), Some(&fallback)).unwrap();
        assert_eq!(id, RunIdentity::new("order-1").scope("a").scope("b"));
        let empty = Map::new();
        let id = resolve(&info(&empty, &args), Some(&fallback)).unwrap();
        assert_eq!(id.run, "fallback");
    }

    #[test]
    fn no_identity_is_refused_with_how_to_send_one() {
        let (args, empty) = (Map::new(), Map::new());
        let err = resolve(&info(&empty, &args), None).unwrap_err();
        assert_eq!(err.kind(), "no_run_identity");
        assert!(
            err.to_string()
                .contains("{\"idem/run\": \"<workflow id>\"}"),
            "{err}"
        );
        let nobody = |_: &CallInfo<'_>| None;
        assert!(resolve(&info(&empty, &args), Some(&nobody)).is_err());
    }

    #[test]
    fn malformed_identities_are_refused() {
        let args = Map::new();
        for bad in [
            json!({"idem/run": 7}),
            json!({"idem/run": " "}),
            json!({"idem/run": "r", "idem/scope": 3}),
            json!({"idem/run": "r", "idem/scope": ["ok", ""]}),
            json!({"idem/scope": "s"}),
        ] {
            let m = meta(bad.clone());
            let err = resolve(&info(&m, &args), None).unwrap_err();
            assert_eq!(err.kind(), "bad_run_identity", "{bad}: {err}");
        }
    }
}
