//! The `#[tool]` attribute of [idem](https://docs.rs/idem). Use it through
//! the `idem` crate (`#[idem::tool(...)]`), which documents every argument
//! with examples; this crate only generates code.
//!
//! The work is split like serde_derive and tokio-macros: `parse` reads the
//! argument syntax, `validate` gives it meaning against the function and
//! collects every problem, `expand` writes the wrapper. Any problem leaves
//! the user's function as written, next to one `compile_error!` per
//! problem, so the rest of the crate still type-checks and IDEs keep
//! working. On an `impl` block, `impl_block` completes the block's method
//! attributes with the type's name (the default `Type::method`), and each
//! method is then expanded on its own. `dispatch` writes each tool's JSON
//! dispatcher and argument schema: next to a free function, and after the
//! block for methods (only the block knows their type).
//!
//! `validate` is split by concern: the attribute's arguments and their
//! cross-checks (`validate`), the function's shape (`signature`), questions
//! about types (`types`), which signatures can be dispatched (`eligible`),
//! the collected errors (`errors`) and what a validated tool is (`model`).
//! The arrows point one way: `model`, `types` and `errors` depend on
//! nothing here; `expand`, `dispatch` and `impl_block` read the model.

#![warn(missing_docs)]

mod dispatch;
mod duration;
mod eligible;
mod errors;
mod expand;
mod impl_block;
mod model;
mod parse;
mod signature;
mod suggest;
mod types;
mod validate;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;

/// *Implemented by the `idem-macros` crate and re-exported as `idem::tool`,
/// where every argument is documented with examples.*
#[proc_macro_attribute]
pub fn tool(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    match tool_impl(args.into(), item.clone()) {
        Ok(expanded) => expanded.into(),
        Err(errors) => {
            let mut out = item;
            out.extend(errors.to_compile_error());
            out.into()
        }
    }
}

fn tool_impl(args: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    let func = match syn::parse2::<syn::ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(e) => {
            if let Ok(block) = syn::parse2::<syn::ItemImpl>(item.clone()) {
                return Ok(impl_block::expand(args, block));
            }
            return Err(not_a_fn(item, e));
        }
    };
    let args = syn::parse2::<parse::Args>(args)?;
    let tool = validate::validate(args.0, &func)?;
    Ok(expand::expand(&tool, func))
}

/// Why the item is not something `#[tool]` can wrap. An item that does not
/// parse at all gets rustc's own syntax error, not a second one from here.
fn not_a_fn(item: TokenStream2, parse_error: syn::Error) -> syn::Error {
    match syn::parse2::<syn::Item>(item) {
        Ok(syn::Item::Verbatim(tokens)) => syn::Error::new_spanned(
            tokens,
            "#[tool] needs the function's body: it applies to async functions and methods, not \
             to declarations",
        ),
        Ok(other) => syn::Error::new_spanned(
            item_head(&other),
            "#[tool] applies to async functions and `&self` methods (and to an `impl` block, to \
             name its tool methods `Type::method`)",
        ),
        Err(_) => parse_error,
    }
}

/// An item up to its body (`pub struct Mailer`), to point at it without
/// underlining every line.
fn item_head(item: &syn::Item) -> TokenStream2 {
    use quote::ToTokens;
    item.to_token_stream()
        .into_iter()
        .take_while(|t| !matches!(t, proc_macro2::TokenTree::Group(_)))
        .collect()
}

#[cfg(test)]
mod tests;
