//! The function under the attribute: what it must look like (async, a
//! `&Ctx`, `Result<T, E>`, no `&mut self`, ...), and its [`Parts`], made out
//! as far as it can be even when something is wrong.

use quote::ToTokens;
use syn::{FnArg, ItemFn, Pat, Type};

use crate::errors::Errors;
use crate::model::{CtxParam, Param, Parts};
use crate::types::{contains_impl_trait, last_segment_is, result_args};

/// Checks the function itself and extracts its [`Parts`], as far as they can
/// be made out even when something is wrong.
pub(crate) fn check_fn(item: &ItemFn, errors: &mut Errors) -> Parts {
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

    let mut shape = Parts {
        method: false,
        receiver: None,
        ctx: None,
        params: Vec::new(),
        ret: None,
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
                shape.ret = Some((**ty).clone());
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
