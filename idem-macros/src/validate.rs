//! Meaning and consistency of the attribute against the function it is on.
//!
//! Every problem found is collected and reported together (one
//! `compile_error!` each, spanned on the token at fault), so a user fixing a
//! tool sees the whole list at once instead of one error per build.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{Expr, ExprLit, Ident, ItemFn, Lit, LitStr, Member};

use crate::duration;
use crate::errors::Errors;
pub(crate) use crate::model::{
    Approve, Class, Dispatch, KeyField, Parts, Retry, Tool, Verify, CLASSES,
};
use crate::parse::{Arg, Value};
use crate::signature::check_fn;
use crate::suggest::closest;
use crate::types::{contains_impl_trait, names_one_of};

const ARGS: &[&str] = &[
    "class",
    "key",
    "name",
    "verify",
    "dedupe_window",
    "retry",
    "timeout",
    "on_drift",
    "redact",
    "dispatch",
    "schema",
    "destructive",
    "approve",
    "approval_wait",
    "commit",
    "compensate",
    "crate",
];

/// Set by `#[tool]` on an `impl` block on each of its tool methods: the
/// block's self type, which prefixes the default name. Not listed among the
/// accepted arguments (users write `#[tool]` on the block instead).
pub(crate) const IMPL_TYPE_ARG: &str = "__impl_type";

/// Set by `#[tool]` on a generic `impl` block on each of its tool methods:
/// the block's type and const parameters, comma-separated, so that a result
/// type naming one is refused with what to write instead (the attribute on
/// a method cannot see the block's parameters otherwise).
pub(crate) const IMPL_GENERICS_ARG: &str = "__impl_generics";

const RETRY_ARGS: &[&str] = &[
    "max_attempts",
    "initial",
    "backoff",
    "max_interval",
    "max_elapsed",
    "jitter",
];

/// Stripe v1's retention of idempotency keys; mirrors
/// `ToolDescriptor::DEFAULT_DEDUPE_WINDOW`, needed here to check `max_elapsed`
/// against it at compile time.
const DEFAULT_DEDUPE_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Mirrors `RetryPolicy::DEFAULT`, for the same reason.
const DEFAULT_RETRY: Retry = Retry {
    max_attempts: 5,
    initial: Duration::from_secs(1),
    backoff: 2.0,
    max_interval: Duration::from_secs(100),
    max_elapsed: Some(Duration::from_secs(3600)),
    jitter: true,
};

/// Raw values of the known arguments, each with the name token that
/// introduced it.
#[derive(Default)]
struct Raw {
    class: Option<(Ident, Value)>,
    key: Option<(Ident, Value)>,
    name: Option<(Ident, Value)>,
    verify: Option<(Ident, Value)>,
    dedupe_window: Option<(Ident, Value)>,
    retry: Option<(Ident, Value)>,
    timeout: Option<(Ident, Value)>,
    on_drift: Option<(Ident, Value)>,
    redact: Option<(Ident, Value)>,
    dispatch: Option<(Ident, Value)>,
    schema: Option<(Ident, Value)>,
    destructive: Option<(Ident, Value)>,
    approve: Option<(Ident, Value)>,
    approval_wait: Option<(Ident, Value)>,
    commit: Option<(Ident, Value)>,
    compensate: Option<(Ident, Value)>,
    krate: Option<(Ident, Value)>,
    impl_type: Option<(Ident, Value)>,
    impl_generics: Option<(Ident, Value)>,
}

/// Checks the arguments against the function and builds the [`Tool`].
pub(crate) fn validate(args: Vec<Arg>, item: &ItemFn) -> syn::Result<Tool> {
    let mut errors = Errors::default();
    let shape = check_fn(item, &mut errors);

    let mut raw = Raw::default();
    // Arguments a typo was taken for: their "missing" errors would only
    // repeat the "did you mean" one.
    let mut suggested: Vec<&str> = Vec::new();
    for Arg { name, value } in args {
        let text = name.to_string();
        let slot = match text.as_str() {
            "class" => &mut raw.class,
            "key" => &mut raw.key,
            "name" => &mut raw.name,
            "verify" => &mut raw.verify,
            "dedupe_window" => &mut raw.dedupe_window,
            "retry" => &mut raw.retry,
            "timeout" => &mut raw.timeout,
            "on_drift" => &mut raw.on_drift,
            "redact" => &mut raw.redact,
            "dispatch" => &mut raw.dispatch,
            "schema" => &mut raw.schema,
            "destructive" => &mut raw.destructive,
            "approve" => &mut raw.approve,
            "approval_wait" => &mut raw.approval_wait,
            "commit" => &mut raw.commit,
            "compensate" => &mut raw.compensate,
            "crate" => &mut raw.krate,
            IMPL_TYPE_ARG => &mut raw.impl_type,
            IMPL_GENERICS_ARG => &mut raw.impl_generics,
            _ => {
                suggested.extend(closest(&text, ARGS.iter().copied()));
                errors.at(name.span(), unknown("argument", &text, ARGS, "#[tool]"));
                continue;
            }
        };
        if slot.is_some() {
            errors.at(
                name.span(),
                format!("duplicate argument `{text}`: it is already given above"),
            );
            continue;
        }
        *slot = Some((name, value));
    }

    let krate = match &raw.krate {
        None => syn::parse_quote!(::idem),
        Some((_, value)) => crate_path(value, &mut errors),
    };

    let class = match &raw.class {
        None if suggested.contains(&"class") => None,
        None => {
            errors.at(
                Span::call_site(),
                "missing `class`: every tool declares what a retry can do to the real world: \
                 #[tool(class = \"read_only\" | \"provider\" | \"journal\" | \"at_most_once\", ...)]",
            );
            None
        }
        Some((name, value)) => class(name, value, &mut errors),
    };

    let impl_type = raw
        .impl_type
        .as_ref()
        .and_then(|(_, value)| value.as_str())
        .map(|s| s.value());
    if let (Some(ok), Some((_, value))) = (&shape.ok, &raw.impl_generics) {
        let generics = value.as_str().map(|s| s.value()).unwrap_or_default();
        let generics: Vec<&str> = generics.split(',').filter(|g| !g.is_empty()).collect();
        if let Some(used) = names_one_of(ok, &generics) {
            let ty_name = impl_type.as_deref().unwrap_or("Type");
            errors.at(
                used.span(),
                format!(
                    "a tool's result cannot be the `impl` block's parameter `{used}`: the \
                     tool is one name, one key space and one result type in the journal for \
                     every `{ty_name}<..>`, so a result recorded for one `{used}` would be \
                     replayed as another, and no result check can be registered for it; give \
                     each result type its own tool in a block that is not generic over it, \
                     e.g. `#[idem::tool] impl {ty_name}<Order> {{ #[tool(...)] async fn \
                     get_order(&self, ctx: &Ctx, ..) -> Result<Order, E> {{ .. }} }}`"
                ),
            );
        }
    }
    let fn_name = item.sig.ident.unraw().to_string();
    let tool_name = match &raw.name {
        None => match &impl_type {
            Some(ty) => format!("{ty}::{fn_name}"),
            None if shape.method => {
                errors.on(
                    &item.sig.ident,
                    format!(
                        "a method tool needs a name that includes its type: two types with a \
                         `{fn_name}` tool would otherwise be one tool and share keys, and the \
                         attribute on a method cannot see its type; write name = \
                         \"Type::{fn_name}\", or put #[idem::tool] on the `impl` block, which \
                         names its tools `Type::method`"
                    ),
                );
                String::new()
            }
            None => fn_name,
        },
        Some((name, value)) => match value.as_str() {
            Some(s) if !s.value().trim().is_empty() => s.value(),
            Some(s) => {
                errors.on(
                    s,
                    "`name` is empty; it is part of every key, give the tool a stable id",
                );
                String::new()
            }
            None => {
                errors.at(
                    value.span(name),
                    "`name` takes a string: name = \"send_email\"",
                );
                String::new()
            }
        },
    };

    let key = raw
        .key
        .as_ref()
        .and_then(|(name, value)| match value.as_str() {
            Some(lit) => Some(key_fields(&lit, &shape, item, &mut errors)),
            None => {
                errors.at(
                    value.span(name),
                    "`key` takes a string listing parameters: key = \"to, order_id\"",
                );
                None
            }
        });

    let verify = raw
        .verify
        .as_ref()
        .and_then(|(name, value)| verify(name, value, &mut errors));

    let dedupe_window = raw
        .dedupe_window
        .as_ref()
        .and_then(|(name, value)| duration_arg(name, value, &mut errors));

    let retry = raw
        .retry
        .as_ref()
        .map(|(name, value)| retry(name, value, &mut errors));

    let timeout = raw
        .timeout
        .as_ref()
        .and_then(|(name, value)| duration_arg(name, value, &mut errors));

    // `on_drift(reject = "a, b")`: its list, checked once `redact` is known.
    let mut drift_list: Option<LitStr> = None;
    let on_drift_reject = match &raw.on_drift {
        None => false,
        Some((name, Value::List(_, args))) => {
            for Arg { name: n, value: v } in args {
                let text = n.to_string();
                if text != "reject" {
                    errors.at(
                        n.span(),
                        unknown("argument", &text, &["reject"], "on_drift(...)"),
                    );
                    continue;
                }
                if drift_list.is_some() {
                    errors.at(
                        n.span(),
                        "duplicate argument `reject`: it is already given above",
                    );
                    continue;
                }
                match v.as_str() {
                    Some(lit) => drift_list = Some(lit),
                    None => errors.at(
                        v.span(n),
                        "`reject` takes a string listing parameters: on_drift(reject = \"amount, iban\")",
                    ),
                }
            }
            if args.is_empty() {
                errors.at(
                    name.span(),
                    "`on_drift(...)` takes the parameters whose change refuses a call: \
                     on_drift(reject = \"amount, iban\")",
                );
            }
            false
        }
        Some((name, value)) => {
            match value.as_str() {
                Some(s) if s.value() == "replay" => false,
                Some(s) if s.value() == "reject" => true,
                Some(s) => {
                    let v = s.value();
                    let hint = closest(&v, ["replay", "reject"])
                        .map_or_else(String::new, |c| format!(" (did you mean \"{c}\"?)"));
                    errors.on(
                    &s,
                    format!("unknown on_drift policy \"{v}\"{hint}; expected \"replay\" or \"reject\""),
                );
                    false
                }
                None => {
                    errors.at(
                        value.span(name),
                        "`on_drift` takes \"replay\", \"reject\", or reject = \"a, b\" in parentheses",
                    );
                    false
                }
            }
        }
    };

    let redact = match &raw.redact {
        None => Vec::new(),
        Some((name, value)) => match value.as_str() {
            Some(lit) => redact(&lit, &shape, &mut errors),
            None => {
                errors.at(
                    value.span(name),
                    "`redact` takes a string listing parameters: redact = \"body, card\"",
                );
                Vec::new()
            }
        },
    };
    let drift_reject = drift_list
        .map(|lit| drift_fields(&lit, &shape, &redact, &mut errors))
        .unwrap_or_default();

    let dispatch = match &raw.dispatch {
        None => Dispatch::Auto,
        Some((name, value)) => match bool_arg(name, value, &mut errors) {
            Some(true) => Dispatch::Required,
            Some(false) => Dispatch::Off,
            None => Dispatch::Auto,
        },
    };
    let schema = raw.schema.as_ref().and_then(|(name, value)| match value {
        Value::Expr(Expr::Path(p)) if p.qself.is_none() => Some(p.path.clone()),
        _ => {
            errors.at(
                value.span(name),
                "`schema` takes a path to a function returning the arguments' JSON schema: \
                 schema = charge_schema (a `fn() -> serde_json::Value`)",
            );
            None
        }
    });
    if let (Some((name, _)), Dispatch::Off) = (&raw.schema, dispatch) {
        errors.at(
            name.span(),
            "`schema` with `dispatch = false`: the schema describes the arguments of the JSON \
             dispatcher, and this tool has none; remove one of the two",
        );
    }
    let destructive = raw
        .destructive
        .as_ref()
        .and_then(|(name, value)| bool_arg(name, value, &mut errors));
    if dispatch == Dispatch::Required {
        if let Some(why) =
            crate::eligible::fn_ineligible(&item.sig, shape.view(), impl_type.is_some())
        {
            let at = raw
                .dispatch
                .as_ref()
                .map_or(Span::call_site(), |(name, _)| name.span());
            errors.at(
                at,
                format!("`dispatch = true`, but this tool cannot have a JSON dispatcher: {why}"),
            );
        }
    }

    let approve = match &raw.approve {
        None => Approve::Never,
        Some((name, value)) => approve(name, value, &mut errors),
    };
    let approval_wait = match &raw.approval_wait {
        None => Duration::ZERO,
        Some((name, _)) if raw.approve.is_none() => {
            errors.at(
                name.span(),
                "`approval_wait` without `approve`: no call of this tool asks a person, so \
                 nothing would be waited for; add approve = \"always\" (or a policy function), \
                 or remove approval_wait",
            );
            Duration::ZERO
        }
        Some((name, value)) => wait_arg(name, value, &mut errors).unwrap_or_default(),
    };
    let commit_eventual = match &raw.commit {
        None => false,
        Some((name, value)) => match value.as_str() {
            Some(s) if s.value() == "immediate" => false,
            Some(s) if s.value() == "eventual" => true,
            _ => {
                errors.at(
                    value.span(name),
                    "`commit` takes \"immediate\" (the default) or \"eventual\"",
                );
                false
            }
        },
    };
    if let (Approve::Path(_), true) = (&approve, shape.params.iter().any(|p| !p.cfg.is_empty())) {
        if let Some((name, _)) = &raw.approve {
            errors.at(
                name.span(),
                "`approve = path` on a tool with `#[cfg]` parameters: the policy function takes \
                 every parameter, and a configured-out one would change its signature; use \
                 approve = \"always\", or move the condition into the function",
            );
        }
    }

    let compensate = match &raw.compensate {
        None => None,
        Some((name, value)) => match value {
            Value::Expr(Expr::Path(p)) if p.qself.is_none() => Some(p.path.clone()),
            _ => {
                errors.at(
                    value.span(name),
                    "`compensate` takes a path to the #[tool] that undoes this one: compensate = \
                     refund (its parameters after `ctx` are this tool's result by reference, \
                     then optionally every argument of this tool by reference)",
                );
                None
            }
        },
    };
    if let (Some((name, _)), true) = (
        &raw.compensate,
        shape.params.iter().any(|p| !p.cfg.is_empty()),
    ) {
        errors.at(
            name.span(),
            "`compensate` on a tool with `#[cfg]` parameters: its compensation may take every \
             argument, and a configured-out one would change what it is handed; move the \
             condition into the tool's body",
        );
    }

    // Rules that depend on the class; skipped when the class itself is in
    // error, so one mistake does not cascade into several.
    if let Some(class) = class {
        if let (Some((name, _)), Class::ReadOnly) = (&raw.compensate, class) {
            errors.at(
                name.span(),
                "`compensate` on a read_only tool: a read_only call changes nothing, so there \
                 is nothing to undo; remove `compensate`, or choose the side-effecting class \
                 the tool really has",
            );
        }
        if let (Some((name, _)), Class::ReadOnly) = (&raw.approve, class) {
            errors.at(
                name.span(),
                "`approve` on a read_only tool: a read_only call changes nothing and is never \
                 journaled, so there is nothing for a person to approve and no record to wait \
                 on; remove `approve`, or choose the side-effecting class the tool really has",
            );
        }
        if let (Some((name, _)), Class::ReadOnly | Class::AtMostOnce, true) =
            (&raw.commit, class, commit_eventual)
        {
            errors.at(
                name.span(),
                format!(
                    "`commit = \"eventual\"` on {a} tool: {why}; it applies only to class = \
                     \"provider\" (a lost COMMIT is re-sent under the same key) or \"journal\" \
                     (a lost COMMIT is found by verify)",
                    a = class.with_article(),
                    why = if class == Class::ReadOnly {
                        "a read_only tool commits nothing"
                    } else {
                        "an at_most_once tool whose COMMIT were lost would be escalated to a \
                         human instead of answered"
                    }
                ),
            );
        }
        let a_cname = class.with_article();
        match (&raw.key, class) {
            (Some((name, _)), Class::ReadOnly) => errors.at(
                name.span(),
                "`key` on a read_only tool: read_only tools are never journaled and a retry \
                 duplicates nothing, so they have no idempotency key; remove `key`, or choose a \
                 side-effecting class",
            ),
            (None, Class::Provider | Class::Journal | Class::AtMostOnce)
                if !suggested.contains(&"key") =>
            {
                errors.at(
                    Span::call_site(),
                    format!(
                        "missing `key`: {a_cname} tool needs the parameters that identify one \
                     real-world operation, e.g. key = \"order_id\" (they derive the idempotency \
                     key, identical on every attempt and after a restart)"
                    ),
                )
            }
            _ => {}
        }
        match (&raw.verify, class) {
            (None, Class::Journal) if !suggested.contains(&"verify") => errors.at(
                Span::call_site(),
                "missing `verify`: a journal tool must say how to find out whether an unknown \
                 outcome landed before it is re-run: verify = path::to::async_fn (called with the \
                 call's &Ctx, returning Result<Verdict<T>, E>), or verify = \"none\" to escalate \
                 every unknown outcome to a human",
            ),
            (Some((name, _)), Class::ReadOnly | Class::Provider | Class::AtMostOnce) => {
                let why = match class {
                    Class::ReadOnly => "a read_only tool is retried freely",
                    Class::Provider => "a provider tool is re-run with the same key, which the provider deduplicates",
                    _ => "an at_most_once tool escalates every unknown outcome to a human",
                };
                errors.at(
                    name.span(),
                    format!(
                        "`verify` applies only to class = \"journal\": {why}, so nothing would \
                         ever call it"
                    ),
                );
            }
            _ => {}
        }
        // A journal tool's recovery asks `verify` about an attempt nobody
        // drives any more only once that attempt can no longer land: its
        // start, plus its timeout, plus the backoff. Without a timeout no
        // such moment exists (the request may still be inside the provider
        // when the question is asked), so the answer "not landed" would not
        // license a re-run. With verify = "none" nothing is asked.
        if class == Class::Journal
            && matches!(verify, Some(Verify::Path(_)))
            && raw.timeout.is_none()
            && !suggested.contains(&"timeout")
        {
            let at = raw
                .verify
                .as_ref()
                .map_or(Span::call_site(), |(name, _)| name.span());
            errors.at(
                at,
                "missing `timeout`: a journal tool must bound how long one attempt may take \
                 (timeout = \"30s\"): when a process dies mid-call, recovery asks `verify` only \
                 after the dead attempt's timeout and backoff, once its request can no longer \
                 land; without a bound, verify could hear \"not landed\" just before the request \
                 lands, and the call would run twice",
            );
        }
        if let (Some((name, _)), true) = (&raw.dedupe_window, class != Class::Provider) {
            errors.at(
                name.span(),
                format!(
                    "`dedupe_window` applies only to class = \"provider\" (how long the provider \
                     remembers our keys); {}",
                    if class == Class::ReadOnly {
                        "a read_only tool is never deduplicated: a retry of it duplicates nothing"
                    } else if class == Class::Journal {
                        "a journal tool is deduplicated by idem's journal"
                    } else {
                        "an at_most_once tool is deduplicated by idem's journal"
                    }
                ),
            );
        }
        if let (Some((name, _)), Class::AtMostOnce) = (&raw.retry, class) {
            errors.at(
                name.span(),
                "`retry(...)` on an at_most_once tool: once a request may have reached the \
                 provider, an at_most_once tool is never retried (the unknown outcome goes to a \
                 human); remove `retry`, or choose class = \"provider\" or \"journal\" if a retry \
                 can be made safe",
            );
        }
        if let (Some((name, _)), Class::ReadOnly) = (&raw.destructive, class) {
            errors.at(
                name.span(),
                "`destructive` on a read_only tool: a read_only tool changes nothing, so it is \
                 never destructive (MCP's readOnlyHint says so)",
            );
        }
        if class == Class::ReadOnly {
            for (arg, what) in [(&raw.on_drift, "on_drift"), (&raw.redact, "redact")] {
                if let Some((name, _)) = arg {
                    errors.at(
                        name.span(),
                        format!(
                            "`{what}` on a read_only tool: read_only calls are never journaled, \
                             so there are no recorded arguments for it to act on"
                        ),
                    );
                }
            }
        }
        if class == Class::Provider {
            check_window(&raw, retry.as_ref(), dedupe_window, &mut errors);
        }
        if let (Some(ok), true) = (&shape.ok, class.is_journaled()) {
            if contains_impl_trait(ok) {
                errors.on(
                    ok,
                    format!(
                        "{a_cname} tool stores its result in the journal and replays it, so the \
                         result type must be a concrete type (Serialize + DeserializeOwned), not \
                         `impl Trait`; only a read_only tool may return `impl Trait`"
                    ),
                );
            }
        }
    }

    let (Some(class), Some(shape)) = (class, shape.complete()) else {
        // Already reported: a missing or unknown class, a missing context
        // or a result that is not `Result<T, E>`.
        return Err(errors.into_error());
    };
    let verify = match (class, verify) {
        (Class::Journal, Some(v)) => v,
        _ => Verify::Absent,
    };
    let retry = match retry {
        Some(Some(r)) => r,
        _ => DEFAULT_RETRY,
    };
    errors.finish(Tool {
        krate,
        name: tool_name,
        class,
        key: key.unwrap_or_default(),
        verify,
        dedupe_window: dedupe_window.unwrap_or(DEFAULT_DEDUPE_WINDOW),
        retry,
        timeout,
        on_drift_reject,
        drift_reject,
        redact,
        dispatch,
        dispatch_span: raw.dispatch.as_ref().map(|(name, _)| name.span()),
        schema,
        destructive,
        approve,
        approval_wait,
        commit_eventual,
        compensate,
        shape,
    })
}

/// `approve = "always"` or `approve = path`.
fn approve(name: &Ident, value: &Value, errors: &mut Errors) -> Approve {
    match value {
        Value::Expr(Expr::Path(p)) if p.qself.is_none() => Approve::Path(p.path.clone()),
        _ => match value.as_str() {
            Some(s) if s.value() == "always" => Approve::Always,
            _ => {
                errors.at(
                    value.span(name),
                    "`approve` takes \"always\" or a path to a policy function: approve = \
                     needs_approval (a `fn(&Ctx, &A, ..) -> Option<String>` over the tool's \
                     parameters after the context; Some(reason) asks a person)",
                );
                Approve::Never
            }
        },
    }
}

/// A duration that may be zero (`approval_wait = "0s"`: return at once).
fn wait_arg(name: &Ident, value: &Value, errors: &mut Errors) -> Option<Duration> {
    let Some(lit) = value.as_str() else {
        errors.at(
            value.span(name),
            format!("`{name}` takes a duration string, e.g. {name} = \"10m\" (\"0s\": at once)"),
        );
        return None;
    };
    match duration::parse(&lit.value()) {
        Ok(d) => Some(d),
        Err(why) => {
            errors.on(&lit, format!("bad duration for `{name}`: {why}"));
            None
        }
    }
}

/// `true` or `false`.
fn bool_arg(name: &Ident, value: &Value, errors: &mut Errors) -> Option<bool> {
    match value {
        Value::Expr(Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        })) => Some(b.value),
        _ => {
            errors.at(
                value.span(name),
                format!("`{name}` takes `true` or `false`: {name} = false"),
            );
            None
        }
    }
}

/// A provider's key must outlive every retry of it: a retry sent after the
/// provider forgot the key is a fresh request.
fn check_window(
    raw: &Raw,
    retry: Option<&Option<Retry>>,
    window: Option<Duration>,
    errors: &mut Errors,
) {
    let policy = match retry {
        None => DEFAULT_RETRY,
        Some(Some(p)) => *p,
        Some(None) => return,
    };
    let window = match (&raw.dedupe_window, window) {
        (Some(_), None) => return,
        (_, w) => w.unwrap_or(DEFAULT_DEDUPE_WINDOW),
    };
    if policy.max_elapsed.is_some_and(|e| e < window) {
        return;
    }
    // Durations as the user wrote them ("48h", not "2d").
    let written = |arg: Option<(&Ident, &Value)>, default: Duration| match arg {
        Some((_, value)) => value
            .as_str()
            .map_or_else(|| duration::display(default), |s| s.value()),
        None => duration::display(default),
    };
    let elapsed_arg = match &raw.retry {
        Some((_, Value::List(_, items))) => items.iter().find(|a| a.name == "max_elapsed"),
        _ => None,
    };
    let window_arg = raw.dedupe_window.as_ref().map(|(n, v)| (n, v));
    let window_text = match window_arg {
        Some(_) => format!("dedupe_window (\"{}\")", written(window_arg, window)),
        None => format!(
            "default dedupe_window (\"{}\", Stripe's retention)",
            written(None, window)
        ),
    };
    let (span, message) = match (elapsed_arg, policy.max_elapsed) {
        (Some(a), None) => (
            a.value.span(&a.name),
            format!(
                "retry(max_elapsed = \"none\") never stops retrying, but the provider forgets \
                 our key after its {window_text}: a retry sent after that would repeat the \
                 effect; give max_elapsed a duration shorter than the window"
            ),
        ),
        (Some(a), Some(e)) => (
            a.value.span(&a.name),
            format!(
                "retry(max_elapsed = \"{}\") must be shorter than the provider's {window_text}: \
                 a retry sent after the provider has forgotten the key would repeat the effect; \
                 shorten max_elapsed or lengthen dedupe_window",
                written(Some((&a.name, &a.value)), e)
            ),
        ),
        (None, e) => (
            window_arg.map_or_else(Span::call_site, |(n, v)| v.span(n)),
            format!(
                "the provider's {window_text} must be longer than the default retry max_elapsed \
                 (\"{}\"): a retry sent after the provider has forgotten the key would repeat \
                 the effect; lengthen the window or set a shorter retry(max_elapsed = ...)",
                duration::display(e.unwrap_or_default())
            ),
        ),
    };
    errors.at(span, message);
}

/// "unknown argument `x` (did you mean `y`?); ... accepts: ...".
fn unknown(what: &str, text: &str, valid: &[&str], owner: &str) -> String {
    let hint = closest(text, valid.iter().copied())
        .map_or_else(String::new, |c| format!(" (did you mean `{c}`?)"));
    format!(
        "unknown {what} `{text}`{hint}; {owner} accepts: {}",
        valid.join(", ")
    )
}

fn crate_path(value: &Value, errors: &mut Errors) -> syn::Path {
    let fallback: syn::Path = syn::parse_quote!(::idem);
    match value {
        Value::Expr(Expr::Path(p)) if p.qself.is_none() => p.path.clone(),
        _ => match value.as_str() {
            Some(s) => s.parse::<syn::Path>().unwrap_or_else(|_| {
                errors.on(&s, format!("`crate` must be a path to the idem crate, e.g. crate = \"::idem\"; \"{}\" is not a path", s.value()));
                fallback
            }),
            None => {
                errors.on(value_tokens(value), "`crate` takes a path: crate = \"::idem\"");
                fallback
            }
        },
    }
}

fn value_tokens(value: &Value) -> TokenStream {
    match value {
        Value::Expr(e) => e.to_token_stream(),
        _ => TokenStream::new(),
    }
}

fn class(name: &Ident, value: &Value, errors: &mut Errors) -> Option<Class> {
    let Some(lit) = value.as_str() else {
        let written = value_tokens(value).to_string();
        let hint = if CLASSES.iter().any(|(n, _)| *n == written) {
            format!(": write class = \"{written}\"")
        } else {
            String::new()
        };
        errors.at(
            value.span(name),
            format!(
                "`class` takes a string: one of \"read_only\", \"provider\", \"journal\", \
                 \"at_most_once\"{hint}"
            ),
        );
        return None;
    };
    let v = lit.value();
    if let Some((_, c)) = CLASSES.iter().find(|(n, _)| *n == v) {
        return Some(*c);
    }
    let hint = closest(&v, CLASSES.iter().map(|(n, _)| *n))
        .map_or_else(String::new, |c| format!(" (did you mean \"{c}\"?)"));
    errors.on(
        &lit,
        format!(
            "unknown class \"{v}\"{hint}; the four classes are:\n  \"read_only\"    - reads only; \
             retried freely, never journaled\n  \"provider\"     - the provider deduplicates on \
             our key (Stripe's Idempotency-Key); retried with the same key\n  \"journal\"      - \
             idem's journal deduplicates; `verify` is asked before an unknown outcome is re-run\n  \
             \"at_most_once\" - never retried once the request may have been sent; unknown \
             outcomes go to a human"
        ),
    );
    None
}

fn verify(name: &Ident, value: &Value, errors: &mut Errors) -> Option<Verify> {
    match value {
        Value::Expr(Expr::Path(p)) if p.qself.is_none() => Some(Verify::Path(p.path.clone())),
        _ => match value.as_str() {
            Some(s) if s.value() == "none" => Some(Verify::Disabled),
            Some(s) => match s.parse::<syn::Path>() {
                Ok(p) => Some(Verify::Path(p)),
                Err(_) => {
                    errors.on(
                        &s,
                        format!(
                            "`verify` takes a path to an async fn (verify = email_landed) or \
                             \"none\"; \"{}\" is neither",
                            s.value()
                        ),
                    );
                    None
                }
            },
            None => {
                errors.at(
                    value.span(name),
                    "`verify` takes a path to an async fn (verify = email_landed) or \"none\"",
                );
                None
            }
        },
    }
}

/// A strictly positive human duration.
fn duration_arg(name: &Ident, value: &Value, errors: &mut Errors) -> Option<Duration> {
    let Some(lit) = value.as_str() else {
        errors.at(
            value.span(name),
            format!(
                "`{name}` takes a duration string, e.g. {name} = \"30s\" (units: ms, s, m, h, d)"
            ),
        );
        return None;
    };
    match duration::parse(&lit.value()) {
        Ok(d) if d.is_zero() => {
            errors.on(&lit, format!("`{name}` must be longer than zero"));
            None
        }
        Ok(d) => Some(d),
        Err(why) => {
            errors.on(&lit, format!("bad duration for `{name}`: {why}"));
            None
        }
    }
}

/// `retry(...)`. `Some(None)`: given, but in error.
fn retry(name: &Ident, value: &Value, errors: &mut Errors) -> Option<Retry> {
    let Value::List(_, items) = value else {
        errors.at(
            value.span(name),
            "write `retry(...)` with any of: max_attempts = 5, initial = \"1s\", backoff = 2.0, \
             max_interval = \"100s\", max_elapsed = \"1h\", jitter = true",
        );
        return None;
    };
    let mut policy = DEFAULT_RETRY;
    let mut ok = true;
    let mut seen: Vec<String> = Vec::new();
    let mut max_interval: Option<(Duration, Span)> = None;
    let mut initial_given = false;
    for Arg { name, value } in items {
        let text = name.to_string();
        if !RETRY_ARGS.contains(&text.as_str()) {
            errors.at(
                name.span(),
                unknown("retry setting", &text, RETRY_ARGS, "retry(...)"),
            );
            ok = false;
            continue;
        }
        if seen.contains(&text) {
            errors.at(name.span(), format!("duplicate retry setting `{text}`"));
            ok = false;
            continue;
        }
        seen.push(text.clone());
        let lit = match value {
            Value::Expr(Expr::Lit(ExprLit { lit, .. })) => Some(lit),
            _ => None,
        };
        match (text.as_str(), lit) {
            ("max_attempts", Some(Lit::Int(i))) => match i.base10_parse::<u32>() {
                Ok(n) if n >= 1 => policy.max_attempts = n,
                _ => {
                    errors.on(i, "`max_attempts` counts every attempt, the first included: a whole number from 1 (never retry) up");
                    ok = false;
                }
            },
            ("max_attempts", _) => {
                errors.at(
                    value.span(name),
                    "`max_attempts` takes a whole number: max_attempts = 5",
                );
                ok = false;
            }
            ("backoff", Some(lit @ (Lit::Float(_) | Lit::Int(_)))) => {
                let parsed = match lit {
                    Lit::Float(f) => f.base10_parse::<f64>().ok(),
                    Lit::Int(i) => i.base10_parse::<f64>().ok(),
                    _ => None,
                };
                match parsed {
                    Some(b) if b.is_finite() && b >= 1.0 => policy.backoff = b,
                    _ => {
                        errors.on(lit, "`backoff` multiplies the delay after each retry: a number of at least 1.0");
                        ok = false;
                    }
                }
            }
            ("backoff", _) => {
                errors.at(value.span(name), "`backoff` takes a number: backoff = 2.0");
                ok = false;
            }
            ("jitter", Some(Lit::Bool(b))) => policy.jitter = b.value,
            ("jitter", _) => {
                errors.at(value.span(name), "`jitter` takes `true` or `false`");
                ok = false;
            }
            ("max_elapsed", Some(Lit::Str(s))) if s.value() == "none" => policy.max_elapsed = None,
            ("initial" | "max_interval" | "max_elapsed", _) => {
                match duration_arg(name, value, errors) {
                    Some(d) if text == "initial" => {
                        policy.initial = d;
                        initial_given = true;
                    }
                    Some(d) if text == "max_interval" => max_interval = Some((d, value.span(name))),
                    Some(d) => policy.max_elapsed = Some(d),
                    None => ok = false,
                }
            }
            _ => unreachable!("every retry setting is matched above"),
        }
    }
    // Temporal's rule: the cap follows the initial interval unless given.
    policy.max_interval = match max_interval {
        Some((d, span)) => {
            if d < policy.initial {
                errors.at(
                    span,
                    format!(
                        "`max_interval` (\"{}\") is shorter than `initial` (\"{}\"): it caps every delay, so it must be at least the first one",
                        duration::display(d),
                        duration::display(policy.initial)
                    ),
                );
                ok = false;
            }
            d
        }
        None if initial_given => policy.initial.saturating_mul(100),
        None => DEFAULT_RETRY.max_interval,
    };
    ok.then_some(policy)
}

/// The entries of a comma-separated list literal, trimmed. One trailing
/// comma is accepted, as in Rust lists (`"a, b,"`).
fn entries(lit: &LitStr) -> Vec<String> {
    let mut list: Vec<String> = lit
        .value()
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    if list.len() > 1 && list.last().is_some_and(String::is_empty) {
        list.pop();
    }
    list
}

fn param_list(shape: &Parts) -> String {
    if shape.params.is_empty() {
        "(none besides the context)".to_string()
    } else {
        shape
            .params
            .iter()
            .map(|p| p.ident.unraw().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn ctx_name(shape: &Parts) -> Option<String> {
    shape
        .ctx
        .as_ref()
        .and_then(|c| c.ident.as_ref())
        .map(|i| i.unraw().to_string())
}

fn key_fields(lit: &LitStr, shape: &Parts, item: &ItemFn, errors: &mut Errors) -> Vec<KeyField> {
    let fn_name = item.sig.ident.unraw().to_string();
    let ctx = ctx_name(shape);
    let mut out: Vec<KeyField> = Vec::new();
    let list = entries(lit);
    if list.iter().all(String::is_empty) {
        errors.on(
            lit,
            format!(
                "`key` is empty: list the parameters that identify one real-world operation; \
                 the parameters of `{fn_name}` are: {}",
                param_list(shape)
            ),
        );
        return out;
    }
    for entry in list {
        if entry.is_empty() {
            errors.on(
                lit,
                "`key` has an empty entry: separate parameter names with single commas",
            );
            continue;
        }
        let mut segments = entry.split('.').map(str::trim);
        let root = segments.next().unwrap_or_default();
        if Some(root) == ctx.as_deref() {
            errors.on(
                lit,
                format!(
                    "`{entry}` in `key`: the context cannot be part of the key; the key already \
                     includes the root run and scope of the context, list only the tool's own \
                     parameters ({})",
                    param_list(shape)
                ),
            );
            continue;
        }
        if root == "self" {
            errors.on(
                lit,
                format!(
                    "`{entry}` in `key`: key fields are the tool's parameters, not `self`; pass \
                     the identifying value as a parameter (parameters of `{fn_name}`: {})",
                    param_list(shape)
                ),
            );
            continue;
        }
        let Some(param) = shape.params.iter().position(|p| p.ident.unraw() == root) else {
            let names: Vec<String> = shape
                .params
                .iter()
                .map(|p| p.ident.unraw().to_string())
                .collect();
            let hint = closest(root, names.iter().map(String::as_str))
                .map_or_else(String::new, |c| format!(" (did you mean `{c}`?)"));
            let what = if entry == root {
                format!("`{entry}` in `key` is not a parameter of `{fn_name}`{hint}")
            } else {
                format!("`{entry}` in `key`: `{root}` is not a parameter of `{fn_name}`{hint}")
            };
            errors.on(
                lit,
                format!(
                    "{what}; key fields are parameters, or field paths on them such as \
                     `args.order_id`; the parameters are: {}",
                    param_list(shape)
                ),
            );
            continue;
        };
        if !shape.params[param].cfg.is_empty() {
            errors.on(
                lit,
                format!(
                    "`{root}` in `key` is a `#[cfg(...)]` parameter: the key would differ between \
                     builds, and one operation run by two builds would not be deduplicated; key \
                     only on parameters every build has"
                ),
            );
            continue;
        }
        let mut members = Vec::new();
        let mut bad = false;
        for seg in segments {
            match syn::parse_str::<Member>(seg) {
                Ok(m) => members.push(m),
                Err(_) => {
                    errors.on(
                        lit,
                        format!(
                            "`{entry}` in `key` is not a field path: `{seg}` is not a field \
                             name or tuple index"
                        ),
                    );
                    bad = true;
                    break;
                }
            }
        }
        if bad {
            continue;
        }
        let normalized = std::iter::once(root.to_string())
            .chain(members.iter().map(|m| m.to_token_stream().to_string()))
            .collect::<Vec<_>>()
            .join(".");
        if out.iter().any(|k| k.text == normalized) {
            errors.on(lit, format!("`{normalized}` appears twice in `key`"));
            continue;
        }
        out.push(KeyField {
            text: normalized,
            param,
            members,
            span: lit.span(),
        });
    }
    out
}

/// The parameters of `on_drift(reject = "...")`: whole parameters that are
/// recorded (neither the context nor redacted), each once.
fn drift_fields(
    lit: &LitStr,
    shape: &Parts,
    redacted: &[String],
    errors: &mut Errors,
) -> Vec<String> {
    let ctx = ctx_name(shape);
    let mut out: Vec<String> = Vec::new();
    for entry in entries(lit) {
        let param = shape
            .params
            .iter()
            .find(|p| p.ident.unraw() == entry.as_str());
        if Some(entry.as_str()) == ctx.as_deref() {
            errors.on(
                lit,
                format!(
                    "`{entry}` in `on_drift(reject)`: the context is not an argument of the call, \
                     so it never drifts"
                ),
            );
        } else if param.is_some() && redacted.contains(&entry) {
            errors.on(
                lit,
                format!(
                    "`{entry}` in `on_drift(reject)` is redacted: it is never recorded, so a \
                     change of it cannot be seen; take it out of `redact` or out of `reject`"
                ),
            );
        } else if let Some(p) = param {
            let name = p.ident.unraw().to_string();
            if out.contains(&name) {
                errors.on(
                    lit,
                    format!("`{entry}` appears twice in `on_drift(reject)`"),
                );
            } else {
                out.push(name);
            }
        } else {
            not_a_parameter(lit, &entry, "on_drift(reject)", "it", shape, errors);
        }
    }
    out
}

fn redact(lit: &LitStr, shape: &Parts, errors: &mut Errors) -> Vec<String> {
    let ctx = ctx_name(shape);
    let mut out: Vec<String> = Vec::new();
    for entry in entries(lit) {
        if Some(entry.as_str()) == ctx.as_deref() {
            errors.on(
                lit,
                format!("`{entry}` in `redact`: the context is never recorded"),
            );
        } else if let Some(p) = shape
            .params
            .iter()
            .find(|p| p.ident.unraw() == entry.as_str())
        {
            let name = p.ident.unraw().to_string();
            if out.contains(&name) {
                errors.on(lit, format!("`{entry}` appears twice in `redact`"));
            } else {
                out.push(name);
            }
        } else {
            not_a_parameter(lit, &entry, "redact", "redact", shape, errors);
        }
    }
    out
}

/// The error for an entry of a list of parameters (`arg`, e.g. `redact`)
/// that names none: a field path, an empty entry or a misspelt name (with
/// the closest one); `subject` begins the field-path sentence.
fn not_a_parameter(
    lit: &LitStr,
    entry: &str,
    arg: &str,
    subject: &str,
    shape: &Parts,
    errors: &mut Errors,
) {
    let names: Vec<String> = shape
        .params
        .iter()
        .map(|p| p.ident.unraw().to_string())
        .collect();
    let hint = closest(entry, names.iter().map(String::as_str))
        .map_or_else(String::new, |c| format!(" (did you mean `{c}`?)"));
    let what = if entry.contains('.') {
        format!("`{entry}` in `{arg}`: {subject} names whole parameters, not field paths")
    } else if entry.is_empty() {
        format!("`{arg}` has an empty entry")
    } else {
        format!("`{entry}` in `{arg}` is not a parameter{hint}")
    };
    errors.on(
        lit,
        format!("{what}; the parameters are: {}", param_list(shape)),
    );
}
