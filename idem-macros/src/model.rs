//! What a validated `#[tool]` is: the class, the tool with its key fields,
//! verify and retry, and the parts of the function the wrapper is built
//! from. `validate` builds it; `expand`, `dispatch` and `eligible` read it.

use std::time::Duration;

use proc_macro2::Span;
use syn::{Ident, Member, Type};

/// The four classes, as written in `class = "..."`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Class {
    ReadOnly,
    Provider,
    Journal,
    AtMostOnce,
}

pub(crate) const CLASSES: &[(&str, Class)] = &[
    ("read_only", Class::ReadOnly),
    ("provider", Class::Provider),
    ("journal", Class::Journal),
    ("at_most_once", Class::AtMostOnce),
];

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
    /// `on_drift(reject = "a, b")`: the parameters whose change refuses a
    /// drifted call.
    pub(crate) drift_reject: Vec<String>,
    pub(crate) redact: Vec<String>,
    /// Whether a JSON dispatcher is generated (see `crate::dispatch`).
    pub(crate) dispatch: Dispatch,
    /// Where `dispatch` was written, for errors about it.
    pub(crate) dispatch_span: Option<Span>,
    /// `schema = path`: the arguments' schema, replacing the generated one.
    pub(crate) schema: Option<syn::Path>,
    /// `destructive = ...`.
    pub(crate) destructive: Option<bool>,
    /// `approve = ...`.
    pub(crate) approve: Approve,
    /// `approval_wait = ...` (zero: return at once).
    pub(crate) approval_wait: Duration,
    /// `commit = "eventual"`.
    pub(crate) commit_eventual: bool,
    /// `compensate = path`: the tool that undoes a completed call inside a
    /// saga.
    pub(crate) compensate: Option<syn::Path>,
    pub(crate) shape: Shape,
}

/// `approve = ...`.
pub(crate) enum Approve {
    /// Not given: no call needs a person's approval.
    Never,
    /// `approve = "always"`.
    Always,
    /// `approve = path`: `fn(&Ctx, &A, ..) -> Option<String>` over the
    /// tool's parameters after the context.
    Path(syn::Path),
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

/// The parts of the function the wrapper is built from, of a function
/// that passed every check: nothing in it is missing.
pub(crate) struct Shape {
    pub(crate) method: bool,
    /// The `self` token of the receiver, for a method.
    pub(crate) receiver: Option<Span>,
    pub(crate) ctx: CtxParam,
    pub(crate) params: Vec<Param>,
    /// The returned `Result<T, E>` as written, and its `T` and `E`.
    pub(crate) ret: Type,
    pub(crate) ok: Type,
    pub(crate) err: Type,
}

/// What `signature` made out of a function, as far as it could even when
/// something is wrong (a missing context, a result that is not
/// `Result<T, E>`): what the other checks look at. A complete one becomes
/// the [`Shape`].
pub(crate) struct Parts {
    pub(crate) method: bool,
    pub(crate) receiver: Option<Span>,
    pub(crate) ctx: Option<CtxParam>,
    pub(crate) params: Vec<Param>,
    pub(crate) ret: Option<Type>,
    pub(crate) ok: Option<Type>,
    pub(crate) err: Option<Type>,
}

impl Parts {
    /// The shape, when nothing is missing.
    pub(crate) fn complete(self) -> Option<Shape> {
        let (Some(ctx), Some(ret), Some(ok), Some(err)) = (self.ctx, self.ret, self.ok, self.err)
        else {
            return None;
        };
        Some(Shape {
            method: self.method,
            receiver: self.receiver,
            ctx,
            params: self.params,
            ret,
            ok,
            err,
        })
    }

    /// What the dispatch rules look at.
    pub(crate) fn view(&self) -> View<'_> {
        View {
            method: self.method,
            ctx: self.ctx.as_ref(),
            params: &self.params,
            ok: self.ok.as_ref(),
            err: self.err.as_ref(),
        }
    }
}

impl Shape {
    /// What the dispatch rules look at.
    pub(crate) fn view(&self) -> View<'_> {
        View {
            method: self.method,
            ctx: Some(&self.ctx),
            params: &self.params,
            ok: Some(&self.ok),
            err: Some(&self.err),
        }
    }
}

/// The parts of a function (complete or not) the dispatch rules judge.
pub(crate) struct View<'a> {
    pub(crate) method: bool,
    pub(crate) ctx: Option<&'a CtxParam>,
    pub(crate) params: &'a [Param],
    pub(crate) ok: Option<&'a Type>,
    pub(crate) err: Option<&'a Type>,
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
