//! The `#[tool]` attribute of [idem](https://docs.rs/idem). Use it through
//! the `idem` crate (`#[idem::tool(...)]`), which documents every argument
//! with examples; this crate only generates code.
//!
//! The work is split like serde_derive and tokio-macros: `parse` reads the
//! argument syntax, `validate` gives it meaning against the function and
//! collects every problem, `expand` writes the wrapper. Any problem leaves
//! the user's function as written, next to one `compile_error!` per
//! problem, so the rest of the crate still type-checks and IDEs keep
//! working.

#![warn(missing_docs)]

mod duration;
mod expand;
mod parse;
mod suggest;
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
        Err(e) => return Err(not_a_fn(item, e)),
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
            "#[tool] applies to async functions and `&self` methods",
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
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    fn expand(args: TokenStream, item: TokenStream) -> String {
        super::tool_impl(args, item).unwrap().to_string()
    }

    fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
        let err = super::tool_impl(args, item).expect_err("expected errors");
        err.into_iter().map(|e| e.to_string()).collect()
    }

    fn tool_fn() -> TokenStream {
        quote!(
            async fn send(ctx: &Ctx, to: String, order_id: u64) -> Result<(), E> {
                Ok(())
            }
        )
    }

    #[test]
    fn every_path_goes_through_the_crate_override() {
        let out = expand(
            quote!(class = "provider", key = "to", crate = "my::rt"),
            tool_fn(),
        );
        assert!(!out.contains(":: idem"), "{out}");
        assert!(out.contains("my :: rt :: __private :: call"), "{out}");
        assert!(out.contains("my :: rt :: ToolError < E >"), "{out}");
    }

    #[test]
    fn retry_defaults_follow_temporal() {
        let out = expand(
            quote!(class = "provider", key = "to", retry(initial = "2s")),
            tool_fn(),
        );
        assert!(out.contains("initial : :: idem :: __private :: Duration :: new (2u64 , 0u32)"));
        assert!(
            out.contains("max_interval : :: idem :: __private :: Duration :: new (200u64 , 0u32)")
        );
        assert!(out.contains("max_attempts : 5u32"));
        let out = expand(quote!(class = "provider", key = "to"), tool_fn());
        assert!(
            out.contains("max_interval : :: idem :: __private :: Duration :: new (100u64 , 0u32)")
        );
        assert!(out
            .contains("dedupe_window : :: idem :: __private :: Duration :: new (86400u64 , 0u32)"));
    }

    #[test]
    fn key_fields_keep_declared_order() {
        let out = expand(quote!(class = "provider", key = "order_id , to"), tool_fn());
        assert!(
            out.contains(r#"key_fields : & ["order_id" , "to"]"#),
            "{out}"
        );
        let order = out.find("key_part (& order_id)").unwrap();
        let to = out.find("key_part (& to)").unwrap();
        assert!(order < to);
        // The key is derived before the attempt closure exists.
        assert!(out.find("let __idem_key").unwrap() < out.find("let __idem_attempt").unwrap());
    }

    #[test]
    fn read_only_is_not_journaled() {
        let out = expand(quote!(class = "read_only"), tool_fn());
        assert!(out.contains("call_read_only"));
        assert!(!out.contains("__idem_key"));
        assert!(!out.contains("assert_journaled"));
    }

    #[test]
    fn all_argument_errors_are_reported_together() {
        let errs = errors(
            quote!(
                class = "journal",
                key = "nope",
                timeout = "1x",
                clas = "x",
                redact = "to, zz"
            ),
            quote!(
                fn send(ctx: &Ctx, to: String) -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        assert_eq!(errs.len(), 6, "{errs:#?}");
        assert!(errs.iter().any(|e| e.contains("must be `async`")));
        assert!(errs.iter().any(|e| e.contains("`nope` in `key`")));
        assert!(errs.iter().any(|e| e.contains("unknown unit `x`")));
        assert!(errs.iter().any(|e| e.contains("did you mean `class`")));
        assert!(errs.iter().any(|e| e.contains("`zz` in `redact`")));
        assert!(errs.iter().any(|e| e.contains("missing `verify`")));
    }

    #[test]
    fn non_functions_are_refused() {
        let errs = errors(
            quote!(class = "read_only"),
            quote!(
                struct S;
            ),
        );
        assert!(errs[0].contains("applies to async functions"), "{errs:?}");
        let errs = errors(
            quote!(class = "read_only"),
            quote!(
                fn f(ctx: &Ctx) -> Result<(), E>;
            ),
        );
        assert!(errs[0].contains("needs the function's body"), "{errs:?}");
    }
}
