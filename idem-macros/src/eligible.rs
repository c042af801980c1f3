//! Which signatures can have a JSON dispatcher at all: no generics, no
//! `impl Trait`, nothing borrowed, no `Self`, no `#[cfg]` parameter, a
//! context written `&Ctx`; and which `impl` blocks can register their
//! methods. (`validate` asks it for `dispatch = true`; `dispatch` for
//! whether to write a dispatcher.)

use proc_macro2::{Ident, TokenStream};
use quote::ToTokens;
use syn::{ItemImpl, Signature, Type};

use crate::model::View;
use crate::types::contains_impl_trait;

/// Why a tool with this signature cannot have a dispatcher, if it cannot.
/// (For a method, what its block must allow is checked by the block.)
pub(crate) fn fn_ineligible(sig: &Signature, shape: View<'_>, in_block: bool) -> Option<String> {
    if shape.method && !in_block {
        return Some(
            "a method tool is registered for dispatch by `#[tool]` on its `impl` block, which \
             knows its type; put #[idem::tool] on the block"
                .into(),
        );
    }
    if !sig.generics.params.is_empty() {
        return Some("it is generic, and a dispatcher is one function for one set of types".into());
    }
    if shape.params.iter().any(|p| !p.cfg.is_empty()) {
        return Some("a parameter is under `#[cfg(...)]`".into());
    }
    // The dispatcher passes an `&idem::Ctx`; a context written otherwise
    // (or wrongly) is left to the wrapper's own error.
    let ctx_is_ctx = shape.ctx.is_some_and(|c| match &c.ty {
        Type::Reference(r) => {
            matches!(&*r.elem, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Ctx"))
        }
        _ => false,
    });
    if !ctx_is_ctx {
        return Some("its context is not written `&Ctx`".into());
    }
    let types = shape
        .params
        .iter()
        .map(|p| &p.ty)
        .chain(shape.ok)
        .chain(shape.err);
    for ty in types {
        if contains_impl_trait(ty) {
            return Some(format!(
                "`{}` is an `impl Trait`, which a dispatcher cannot name",
                written(ty)
            ));
        }
        if names(ty, |i| i == "Self") {
            return Some(format!(
                "`{}` names `Self`; write the type's name instead",
                written(ty)
            ));
        }
        // Also what the probes cannot judge: a bound that holds for some
        // lifetimes only (`&str: Deserialize<'de>` for one `'de`) passes
        // method resolution and fails later, so borrowed types never reach
        // them.
        if borrows(ty) {
            return Some(format!(
                "`{}` borrows; JSON arguments and results are owned values (take `String` \
                 for `&str`)",
                written(ty)
            ));
        }
    }
    None
}

/// A type as one would write it (`&str`, not `& str`).
fn written(ty: &Type) -> String {
    let text = ty.to_token_stream().to_string();
    [
        ("& ", "&"),
        (" :: ", "::"),
        (" <", "<"),
        ("< ", "<"),
        (" >", ">"),
        (" ,", ","),
    ]
    .iter()
    .fold(text, |t, (from, to)| t.replace(from, to))
}

/// Why a `#[tool]` impl block cannot register its methods for dispatch.
pub(crate) fn block_ineligible(block: &ItemImpl) -> Option<String> {
    if !block.generics.params.is_empty() {
        return Some("the `impl` block is generic".into());
    }
    if borrows(&block.self_ty) {
        return Some("the type borrows (a toolbox holds its instance as `Arc<Type>`)".into());
    }
    None
}

fn names(ty: &Type, pred: impl Fn(&Ident) -> bool + Copy) -> bool {
    fn walk(ts: TokenStream, pred: &dyn Fn(&Ident) -> bool) -> bool {
        ts.into_iter().any(|t| match t {
            proc_macro2::TokenTree::Ident(i) => pred(&i),
            proc_macro2::TokenTree::Group(g) => walk(g.stream(), pred),
            _ => false,
        })
    }
    walk(ty.to_token_stream(), &pred)
}

/// A reference, or a lifetime other than `'static`, anywhere in the type.
fn borrows(ty: &Type) -> bool {
    fn walk(ts: TokenStream) -> bool {
        let mut after_quote = false;
        for t in ts {
            match t {
                proc_macro2::TokenTree::Punct(p) if p.as_char() == '&' => return true,
                proc_macro2::TokenTree::Punct(p) if p.as_char() == '\'' => after_quote = true,
                proc_macro2::TokenTree::Ident(i) if after_quote => {
                    if i != "static" {
                        return true;
                    }
                    after_quote = false;
                }
                proc_macro2::TokenTree::Group(g) => {
                    if walk(g.stream()) {
                        return true;
                    }
                    after_quote = false;
                }
                _ => after_quote = false,
            }
        }
        false
    }
    walk(ty.to_token_stream())
}
