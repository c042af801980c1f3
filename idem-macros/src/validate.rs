//! Meaning and consistency of the attribute against the function it is on.
//!
//! Every problem found is collected and reported together (one
//! `compile_error!` each, spanned on the token at fault), so a user fixing a
//! tool sees the whole list at once instead of one error per build.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{
    Expr, ExprLit, FnArg, GenericArgument, Ident, ItemFn, Lit, LitStr, Member, Pat, PathArguments,
    Type,
};

use crate::duration;
use crate::parse::{Arg, Value};
use crate::suggest::closest;

/// The four classes, as written in `class = "..."`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Class {
    ReadOnly,
    Provider,
    Journal,
    AtMostOnce,
}

const CLASSES: &[(&str, Class)] = &[
    ("read_only", Class::ReadOnly),
    ("provider", Class::Provider),
    ("journal", Class::Journal),
    ("at_most_once", Class::AtMostOnce),
];

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

impl Class {
    pub(crate) fn name(self) -> &'static str {
        CLASSES
            .iter()
            .find(|(_, c)| *c == self)
            .map_or("", |(n, _)| n)
    }

    pub(crate) fn is_journaled(self) -> bool {
        self != Class::ReadOnly
    }

    /// "a provider", "an at_most_once": for messages.
    pub(crate) fn with_article(self) -> String {
        let name = self.name();
        let article = if name.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        format!("{article} {name}")
    }
}

/// A validated tool: everything `expand` needs, nothing left to check.
pub(crate) struct Tool {
    pub(crate) krate: syn::Path,
    pub(crate) name: String,
    pub(crate) class: Class,
    pub(crate) key: Vec<KeyField>,
    pub(crate) verify: Verify,
    pub(crate) dedupe_window: Duration,
    pub(crate) retry: Retry,
    pub(crate) timeout: Option<Duration>,
    pub(crate) on_drift_reject: bool,
    pub(crate) redact: Vec<String>,
    /// Whether a JSON dispatcher is generated (see `crate::dispatch`).
    pub(crate) dispatch: Dispatch,
    /// Where `dispatch` was written, for errors about it.
    pub(crate) dispatch_span: Option<Span>,
    /// `schema = path`: the arguments' schema, replacing the generated one.
    pub(crate) schema: Option<syn::Path>,
    /// `destructive = ...`.
    pub(crate) destructive: Option<bool>,
    pub(crate) shape: Shape,
}

/// `dispatch = ...`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dispatch {
    /// Not given: a dispatcher where the types allow one.
    Auto,
    /// `dispatch = true`: required; its absence is a compile error.
    Required,
    /// `dispatch = false`: none.
    Off,
}

/// One entry of `key`: a parameter and an optional field path under it.
pub(crate) struct KeyField {
    pub(crate) text: String,
    /// Index into `Shape::params`.
    pub(crate) param: usize,
    pub(crate) members: Vec<Member>,
    /// The `key` literal, where a field path's errors belong.
    pub(crate) span: Span,
}

pub(crate) enum Verify {
    /// Not a journal tool.
    Absent,
    /// `verify = "none"`.
    Disabled,
    Path(syn::Path),
}

#[derive(Clone, Copy)]
pub(crate) struct Retry {
    pub(crate) max_attempts: u32,
    pub(crate) initial: Duration,
    pub(crate) backoff: f64,
    pub(crate) max_interval: Duration,
    pub(crate) max_elapsed: Option<Duration>,
    pub(crate) jitter: bool,
}

/// The parts of the function the wrapper is built from.
pub(crate) struct Shape {
    pub(crate) method: bool,
    /// The `self` token of the receiver, for a method.
    pub(crate) receiver: Option<Span>,
    pub(crate) ctx: Option<CtxParam>,
    pub(crate) params: Vec<Param>,
    /// `T` and `E` of the returned `Result<T, E>`.
    pub(crate) ok: Option<Type>,
    pub(crate) err: Option<Type>,
}

pub(crate) struct CtxParam {
    /// `None` for `_: &Ctx`.
    pub(crate) ident: Option<Ident>,
    pub(crate) ty: Type,
}

pub(crate) struct Param {
    pub(crate) ident: Ident,
    pub(crate) mutable: bool,
    pub(crate) ty: Type,
    /// The parameter's `#[cfg(...)]` attributes: every statement the
    /// wrapper writes about it is configured like the parameter itself.
    pub(crate) cfg: Vec<syn::Attribute>,
}

/// Collects errors instead of stopping at the first.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    pub(crate) fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }

    pub(crate) fn on(&mut self, tokens: impl ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    /// The collected errors; at least one must have been pushed.
    pub(crate) fn into_error(self) -> syn::Error {
        self.0
            .unwrap_or_else(|| syn::Error::new(Span::call_site(), "invalid #[tool]"))
    }

    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }
}

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

    let on_drift_reject = match &raw.on_drift {
        None => false,
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
                        "`on_drift` takes \"replay\" or \"reject\"",
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
        if let Some(why) = crate::dispatch::fn_ineligible(&item.sig, &shape, impl_type.is_some()) {
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

    // Rules that depend on the class; skipped when the class itself is in
    // error, so one mistake does not cascade into several.
    if let Some(class) = class {
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

    let (Some(class), true) = (class, shape.ctx.is_some()) else {
        // Already reported: a missing or unknown class, or a missing context.
        return Err(errors
            .0
            .unwrap_or_else(|| syn::Error::new(Span::call_site(), "invalid #[tool]")));
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
        redact,
        dispatch,
        dispatch_span: raw.dispatch.as_ref().map(|(name, _)| name.span()),
        schema,
        destructive,
        shape,
    })
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

fn param_list(shape: &Shape) -> String {
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

fn ctx_name(shape: &Shape) -> Option<String> {
    shape
        .ctx
        .as_ref()
        .and_then(|c| c.ident.as_ref())
        .map(|i| i.unraw().to_string())
}

fn key_fields(lit: &LitStr, shape: &Shape, item: &ItemFn, errors: &mut Errors) -> Vec<KeyField> {
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

fn redact(lit: &LitStr, shape: &Shape, errors: &mut Errors) -> Vec<String> {
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
            let names: Vec<String> = shape
                .params
                .iter()
                .map(|p| p.ident.unraw().to_string())
                .collect();
            let hint = closest(&entry, names.iter().map(String::as_str))
                .map_or_else(String::new, |c| format!(" (did you mean `{c}`?)"));
            let what = if entry.contains('.') {
                format!("`{entry}` in `redact`: redact names whole parameters, not field paths")
            } else if entry.is_empty() {
                "`redact` has an empty entry".to_string()
            } else {
                format!("`{entry}` in `redact` is not a parameter{hint}")
            };
            errors.on(
                lit,
                format!("{what}; the parameters are: {}", param_list(shape)),
            );
        }
    }
    out
}

/// Checks the function itself and extracts its [`Shape`], as far as it can
/// be made out even when something is wrong.
fn check_fn(item: &ItemFn, errors: &mut Errors) -> Shape {
    let sig = &item.sig;
    let fn_token = &sig.fn_token;
    let ident = &sig.ident;
    if let Some(c) = &sig.constness {
        errors.on(c, "a #[tool] function cannot be `const`");
    }
    if sig.asyncness.is_none() {
        errors.on(
            quote::quote!(#fn_token #ident),
            "a #[tool] function must be `async`: the generated wrapper awaits the journal and \
             the retry backoff; write `async fn`",
        );
    }
    if let Some(v) = &sig.variadic {
        errors.on(v, "a #[tool] function cannot be variadic");
    }

    let mut shape = Shape {
        method: false,
        receiver: None,
        ctx: None,
        params: Vec::new(),
        ok: None,
        err: None,
    };
    let mut inputs = sig.inputs.iter().enumerate().peekable();
    if let Some((_, FnArg::Receiver(r))) = inputs.peek() {
        shape.method = true;
        shape.receiver = Some(r.self_token.span);
        match &*r.ty {
            Type::Reference(t) if t.mutability.is_none() => {}
            Type::Reference(_) => errors.on(
                r,
                "#[tool] methods take `&self`, not `&mut self`: each attempt is a separate \
                 future made by the retry engine, and one exclusive borrow cannot be handed to \
                 each of them; keep mutable state behind a Mutex or atomics",
            ),
            _ => errors.on(
                r,
                "#[tool] methods take `&self`: the body runs once per attempt, so it cannot \
                 consume or box `self`; `self: &Arc<Self>` works where the body needs the `Arc` \
                 (to clone it into a task)",
            ),
        }
        inputs.next();
    }

    let ctx_hint = if shape.method {
        "right after `&self`"
    } else {
        "first"
    };
    match inputs.next() {
        None => errors.at(
            sig.paren_token.span.join(),
            format!(
                "missing context parameter: a #[tool] function takes the call context \
                 `ctx: &idem::Ctx` {ctx_hint}; it carries the run, the scope and, inside the \
                 call, the idempotency key"
            ),
        ),
        Some((_, FnArg::Receiver(r))) => errors.on(r, "`self` must be the first parameter"),
        Some((_, FnArg::Typed(pt))) => {
            let ident = match &*pt.pat {
                Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => Some(p.ident.clone()),
                Pat::Wild(_) => None,
                other => {
                    errors.on(
                        other,
                        "the context parameter must be a plain name: `ctx: &Ctx`",
                    );
                    None
                }
            };
            match &*pt.ty {
                Type::Reference(r) if r.mutability.is_none() => {
                    shape.ctx = Some(CtxParam {
                        ident,
                        ty: (*pt.ty).clone(),
                    });
                }
                Type::Reference(r) => errors.on(
                    r,
                    "the context is taken by shared reference, `ctx: &Ctx`: attempts and \
                     concurrent calls share it",
                ),
                ty if last_segment_is(ty, "Ctx") => errors.on(
                    ty,
                    "the context must be taken by reference: `ctx: &Ctx` (it is cheap to clone, \
                     and each attempt receives its own with the call's key)",
                ),
                ty => {
                    // Most likely the context was forgotten: keep this one
                    // as an ordinary parameter so `key` entries naming it
                    // are not reported as well.
                    if let Pat::Ident(p) = &*pt.pat {
                        shape.params.push(Param {
                            ident: p.ident.clone(),
                            mutable: p.mutability.is_some(),
                            ty: ty.clone(),
                            cfg: cfg_attrs(&pt.attrs),
                        });
                    }
                    let pat = pt.pat.to_token_stream();
                    errors.on(
                        pt,
                        format!(
                            "missing context parameter: a #[tool] function takes the call context \
                             `ctx: &idem::Ctx` {ctx_hint}, and `{pat}: {}` is not a reference",
                            ty.to_token_stream()
                        ),
                    );
                }
            }
        }
    }

    for (_, arg) in inputs {
        let FnArg::Typed(pt) = arg else {
            errors.on(arg, "`self` must be the first parameter");
            continue;
        };
        match &*pt.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => shape.params.push(Param {
                ident: p.ident.clone(),
                mutable: p.mutability.is_some(),
                ty: (*pt.ty).clone(),
                cfg: cfg_attrs(&pt.attrs),
            }),
            other => errors.on(
                other,
                "#[tool] parameters must be plain names (`order_id: u64`): arguments are \
                 recorded and keyed by name; destructure inside the body",
            ),
        }
    }

    match &sig.output {
        syn::ReturnType::Default => errors.at(
            sig.paren_token.span.close(),
            "a #[tool] function must return `Result<T, E>` with `E: idem::Classify`; this one \
             returns `()`",
        ),
        syn::ReturnType::Type(_, ty) => match result_args(ty) {
            Some((ok, err)) => {
                if contains_impl_trait(err) {
                    errors.on(
                        err,
                        "the error type of a #[tool] cannot be `impl Trait`: the wrapper \
                         classifies it and returns it inside `ToolError<E>`, so it needs a \
                         name; write the concrete type",
                    );
                }
                shape.ok = Some(ok.clone());
                shape.err = Some(err.clone());
            }
            None => {
                let alias = if last_segment_is(ty, "Result") {
                    "; a Result alias such as `io::Result<T>` hides the error type from the \
                     attribute, write `Result<T, E>` in full"
                } else {
                    ""
                };
                errors.on(
                    ty,
                    format!(
                        "a #[tool] function must return `Result<T, E>` with `E: idem::Classify` \
                         (the engine classifies E to decide whether to retry){alias}"
                    ),
                );
            }
        },
    }
    shape
}

/// The `#[cfg(...)]` attributes among a parameter's attributes.
fn cfg_attrs(attrs: &[syn::Attribute]) -> Vec<syn::Attribute> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .cloned()
        .collect()
}

/// Whether `ty` mentions `impl Trait` anywhere.
pub(crate) fn contains_impl_trait(ty: &Type) -> bool {
    fn tokens(ts: TokenStream) -> bool {
        ts.into_iter().any(|t| match t {
            proc_macro2::TokenTree::Ident(i) => i == "impl",
            proc_macro2::TokenTree::Group(g) => tokens(g.stream()),
            _ => false,
        })
    }
    tokens(ty.to_token_stream())
}

/// `ty` with every `impl Trait` replaced by `_`, for a type annotation
/// inside the wrapper (where `impl Trait` is not allowed) that leaves the
/// hidden type to inference.
pub(crate) fn impl_trait_as_infer(ty: &Type) -> Type {
    fn walk(ty: &mut Type) {
        match ty {
            Type::ImplTrait(_) => *ty = syn::parse_quote!(_),
            Type::Array(a) => walk(&mut a.elem),
            Type::Group(g) => walk(&mut g.elem),
            Type::Paren(p) => walk(&mut p.elem),
            Type::Ptr(p) => walk(&mut p.elem),
            Type::Reference(r) => walk(&mut r.elem),
            Type::Slice(s) => walk(&mut s.elem),
            Type::Tuple(t) => t.elems.iter_mut().for_each(walk),
            Type::Path(p) => {
                if let Some(q) = &mut p.qself {
                    walk(&mut q.ty);
                }
                for seg in &mut p.path.segments {
                    if let PathArguments::AngleBracketed(args) = &mut seg.arguments {
                        for arg in &mut args.args {
                            if let GenericArgument::Type(t) = arg {
                                walk(t);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let mut ty = ty.clone();
    walk(&mut ty);
    ty
}

fn last_segment_is(ty: &Type, name: &str) -> bool {
    match ty {
        Type::Path(p) if p.qself.is_none() => {
            p.path.segments.last().is_some_and(|s| s.ident == name)
        }
        _ => false,
    }
}

/// `T` and `E` of `Result<T, E>` (any path ending in `Result`).
pub(crate) fn result_args(ty: &Type) -> Option<(&Type, &Type)> {
    let Type::Path(p) = ty else { return None };
    if p.qself.is_some() {
        return None;
    }
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    });
    let ok = types.next()?;
    let err = types.next()?;
    if types.next().is_some() || args.args.len() != 2 {
        return None;
    }
    Some((ok, err))
}

/// A span helper: the span of a whole type, first token to last.
pub(crate) fn ends(tokens: &impl ToTokens) -> (Span, Span) {
    let mut iter = tokens.to_token_stream().into_iter();
    let first = iter.next().map_or_else(Span::call_site, |t| t.span());
    let last = iter.last().map_or(first, |t| t.span());
    (first, last)
}

/// The first identifier of `ty` that is one of `names` (a path of one
/// segment: `T`, `Vec<T>`'s `T`, `[u8; N]`'s `N`; not `T` in `a::T`).
fn names_one_of(ty: &Type, names: &[&str]) -> Option<Ident> {
    fn walk(tokens: TokenStream, names: &[&str]) -> Option<Ident> {
        let mut after_colons = false;
        let mut found = None;
        for t in tokens {
            match t {
                proc_macro2::TokenTree::Ident(i) => {
                    if !after_colons && found.is_none() && names.iter().any(|n| i == n) {
                        found = Some(i);
                    }
                    after_colons = false;
                }
                proc_macro2::TokenTree::Punct(p) => after_colons = p.as_char() == ':',
                proc_macro2::TokenTree::Group(g) => {
                    after_colons = false;
                    if found.is_none() {
                        found = walk(g.stream(), names);
                    }
                }
                proc_macro2::TokenTree::Literal(_) => after_colons = false,
            }
        }
        found
    }
    walk(ty.to_token_stream(), names)
}
