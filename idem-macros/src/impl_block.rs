//! `#[tool]` on an `impl` block: names the block's tool methods after the
//! block's type.
//!
//! An attribute on a method cannot see the type it is implemented on, so
//! by itself it cannot give `Mailer::send` and `Sms::send` different
//! default names. On the block it can: each inner `#[tool(...)]` gets the
//! self type's name as a hidden argument and, without a `name` of its own,
//! becomes `Type::method`. Nothing else changes; the inner attributes still
//! expand the methods one by one.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::ext::IdentExt;
use syn::{Attribute, ImplItem, ItemImpl, Meta, Type};

use crate::errors::Errors;
use crate::parse::{Args, Value};
use crate::validate::{IMPL_GENERICS_ARG, IMPL_TYPE_ARG};

/// The block with its tool methods' attributes completed, and one
/// `compile_error!` per problem: the methods are completed even when the
/// block's own arguments are wrong, so one mistake does not also make every
/// method nameless.
pub(crate) fn expand(args: TokenStream, mut block: ItemImpl) -> TokenStream {
    let mut errors = Errors::default();
    let args = match syn::parse2::<Args>(args) {
        Ok(args) => args,
        Err(e) => {
            errors.push(e);
            Args(Vec::new())
        }
    };
    let mut krate: Option<TokenStream> = None;
    for arg in args.0 {
        if arg.name == "crate" && krate.is_none() {
            krate = Some(match &arg.value {
                Value::Expr(e) => e.to_token_stream(),
                _ => TokenStream::new(),
            });
        } else {
            errors.at(
                arg.name.span(),
                format!(
                    "on an `impl` block, #[tool] takes no tool arguments (only `crate = \"...\"`): \
                     it names the block's tools `Type::method`; `{}` belongs on each method's own \
                     #[tool(...)]",
                    arg.name
                ),
            );
        }
    }

    let type_name = match self_type_name(&block.self_ty) {
        Some(name) => name,
        None => {
            errors.on(
                &block.self_ty,
                format!(
                    "#[tool] on this `impl` block cannot name its tools after `{}`: it takes the \
                     last segment of a type path (`impl Mailer`, `impl<T> Svc<T>`); give each \
                     tool method a `name = \"...\"` and remove #[tool] from the block",
                    block.self_ty.to_token_stream()
                ),
            );
            let mut out = block.into_token_stream();
            out.extend(errors.into_error().to_compile_error());
            return out;
        }
    };

    // The block's own type and const parameters (not lifetimes: a result
    // cannot borrow anyway), which no tool's result may name.
    let generics: Vec<String> = block
        .generics
        .params
        .iter()
        .filter_map(|g| match g {
            syn::GenericParam::Type(t) => Some(t.ident.unraw().to_string()),
            syn::GenericParam::Const(c) => Some(c.ident.unraw().to_string()),
            syn::GenericParam::Lifetime(_) => None,
        })
        .collect();
    let mut tools = 0;
    for item in &mut block.items {
        let ImplItem::Fn(method) = item else { continue };
        for attr in &mut method.attrs {
            if is_tool_attr(attr) {
                tools += 1;
                complete(attr, &type_name, &generics, krate.as_ref());
            }
        }
    }
    // The dispatchers of the methods that validate; the others' errors
    // come from their own attributes.
    let validated: Vec<(crate::validate::Tool, &syn::ImplItemFn)> = block
        .items
        .iter()
        .filter_map(|item| match item {
            ImplItem::Fn(method) => Some(method),
            _ => None,
        })
        .filter_map(|method| {
            let attr = method.attrs.iter().find(|a| is_tool_attr(a))?;
            let Meta::List(list) = &attr.meta else {
                return None;
            };
            let args = syn::parse2::<Args>(list.tokens.clone()).ok()?;
            let item = syn::ItemFn {
                attrs: Vec::new(),
                vis: method.vis.clone(),
                sig: method.sig.clone(),
                block: Box::new(method.block.clone()),
            };
            let tool = crate::validate::validate(args.0, &item).ok()?;
            Some((tool, method))
        })
        .collect();
    let dispatchers = crate::dispatch::methods(&block, &validated);
    if tools == 0 {
        errors.at(
            Span::call_site(),
            format!(
                "#[tool] on `impl {type_name}` names the block's #[tool(...)] methods, and this \
                 block has none: mark each tool method with its own #[tool(class = ...)], or \
                 remove #[tool] from the block"
            ),
        );
    }
    let mut out = block.into_token_stream();
    if let Err(e) = errors.finish(()) {
        out.extend(e.to_compile_error());
    }
    out.extend(dispatchers);
    out
}

/// `Mailer` for `Mailer`, `crate::mail::Mailer<T>` and `&Mailer`.
fn self_type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) if p.qself.is_none() => {
            p.path.segments.last().map(|s| s.ident.unraw().to_string())
        }
        Type::Reference(r) => self_type_name(&r.elem),
        Type::Paren(p) => self_type_name(&p.elem),
        Type::Group(g) => self_type_name(&g.elem),
        _ => None,
    }
}

/// An attribute whose path ends in `tool`: `#[tool]`, `#[idem::tool]`,
/// `#[framework::rt::tool]` for a re-export, or `#[idem_tool]` for the
/// import renamed next to rmcp's own `tool` (a macro cannot see what name
/// it was imported under, so these are the spellings it recognizes).
fn is_tool_attr(attr: &Attribute) -> bool {
    matches!(attr.style, syn::AttrStyle::Outer)
        && attr.path().segments.last().is_some_and(|s| {
            let name = s.ident.unraw().to_string();
            name == "tool" || name.ends_with("_tool")
        })
}

/// Adds the type's name, the block's type and const parameters (when it
/// has any) and the block's `crate` (unless the method gives its own) to a
/// method's `#[tool(...)]`.
fn complete(
    attr: &mut Attribute,
    type_name: &str,
    generics: &[String],
    krate: Option<&TokenStream>,
) {
    let path = attr.path().clone();
    let existing = match &attr.meta {
        Meta::List(list) => list.tokens.clone(),
        _ => TokenStream::new(),
    };
    let has_crate = syn::parse2::<Args>(existing.clone())
        .map(|a| a.0.iter().any(|a| a.name == "crate"))
        .unwrap_or(false);
    let ends_with_comma = existing
        .clone()
        .into_iter()
        .last()
        .is_some_and(|t| matches!(&t, proc_macro2::TokenTree::Punct(p) if p.as_char() == ','));
    let sep = (!existing.is_empty() && !ends_with_comma).then(|| quote!(,));
    let hidden = syn::Ident::new(IMPL_TYPE_ARG, Span::call_site());
    let krate = match krate {
        Some(k) if !has_crate => quote!(, crate = #k),
        _ => TokenStream::new(),
    };
    let generics = if generics.is_empty() {
        TokenStream::new()
    } else {
        let names = generics.join(",");
        let hidden = syn::Ident::new(IMPL_GENERICS_ARG, Span::call_site());
        quote!(, #hidden = #names)
    };
    attr.meta = syn::parse_quote!(#path(#existing #sep #hidden = #type_name #generics #krate));
}
