//! Questions about types as written: `impl Trait` in them, `Result<T, E>`'s
//! parts, a type's first and last tokens, the identifiers it names.

use proc_macro2::{Ident, Span, TokenStream};
use quote::ToTokens;
use syn::{GenericArgument, PathArguments, Type};

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

pub(crate) fn last_segment_is(ty: &Type, name: &str) -> bool {
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
pub(crate) fn names_one_of(ty: &Type, names: &[&str]) -> Option<Ident> {
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
