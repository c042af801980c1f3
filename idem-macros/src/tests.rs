//! What the attribute makes of its input, asserted on the validated model
//! (`validate::Tool`) and on the errors, never on the text of the
//! expansion: how the generated code behaves is asserted by running it
//! (tests/macro_tools.rs, tests/macro_hygiene.rs, the trybuild pass cases
//! in tests/ui/pass).

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};

use crate::model::{Class, Tool};
use crate::parse::Args;
use crate::types::{contains_impl_trait, impl_trait_as_infer};
use crate::validate;

fn model(args: TokenStream, item: TokenStream) -> Tool {
    match try_model(args, item) {
        Ok(tool) => tool,
        Err(e) => panic!("expected a valid tool: {e}"),
    }
}

fn try_model(args: TokenStream, item: TokenStream) -> syn::Result<Tool> {
    let func: syn::ItemFn = syn::parse2(item)?;
    let args: Args = syn::parse2(args)?;
    validate::validate(args.0, &func)
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

fn method() -> TokenStream {
    quote!(
        async fn send(&self, ctx: &Ctx, to: String) -> Result<(), E> {
            Ok(())
        }
    )
}

/// The `impl` block a block expansion starts with (its methods'
/// dispatchers follow it).
fn first_impl(out: TokenStream) -> syn::ItemImpl {
    let file: syn::File = syn::parse2(out).expect("items come out");
    match file.items.into_iter().next() {
        Some(syn::Item::Impl(block)) => block,
        other => panic!(
            "an impl block comes first, not {}",
            other.map_or_else(|| "nothing".into(), |i| i.to_token_stream().to_string())
        ),
    }
}

fn key_texts(tool: &Tool) -> Vec<&str> {
    tool.key.iter().map(|k| k.text.as_str()).collect()
}

#[test]
fn the_crate_override_is_the_path_given() {
    let tool = model(
        quote!(class = "provider", key = "to", crate = "my::rt"),
        tool_fn(),
    );
    assert_eq!(tool.krate.to_token_stream().to_string(), "my :: rt");
    let tool = model(
        quote!(class = "provider", key = "to", crate = my::rt),
        tool_fn(),
    );
    assert_eq!(tool.krate.to_token_stream().to_string(), "my :: rt");
    let tool = model(quote!(class = "provider", key = "to"), tool_fn());
    assert_eq!(tool.krate.to_token_stream().to_string(), ":: idem");
}

#[test]
fn retry_defaults_follow_temporal() {
    let tool = model(
        quote!(class = "provider", key = "to", retry(initial = "2s")),
        tool_fn(),
    );
    assert_eq!(tool.retry.initial, Duration::from_secs(2));
    assert_eq!(
        tool.retry.max_interval,
        Duration::from_secs(200),
        "100 × initial"
    );
    assert_eq!(tool.retry.max_attempts, 5);
    assert_eq!(tool.retry.backoff, 2.0);
    let tool = model(quote!(class = "provider", key = "to"), tool_fn());
    assert_eq!(tool.retry.max_interval, Duration::from_secs(100));
    assert_eq!(tool.retry.max_elapsed, Some(Duration::from_secs(3600)));
    assert_eq!(tool.dedupe_window, Duration::from_secs(24 * 3600));
    let tool = model(
        quote!(
            class = "provider",
            key = "to",
            retry(initial = "2s", max_interval = "5s")
        ),
        tool_fn(),
    );
    assert_eq!(
        tool.retry.max_interval,
        Duration::from_secs(5),
        "given, kept"
    );
}

#[test]
fn key_fields_keep_declared_order() {
    let tool = model(quote!(class = "provider", key = "order_id , to"), tool_fn());
    assert_eq!(key_texts(&tool), ["order_id", "to"]);
    let params: Vec<String> = tool
        .key
        .iter()
        .map(|k| tool.shape.params[k.param].ident.to_string())
        .collect();
    assert_eq!(params, ["order_id", "to"]);
    let tool = model(quote!(class = "provider", key = "to, order_id"), tool_fn());
    assert_eq!(key_texts(&tool), ["to", "order_id"]);
}

#[test]
fn one_trailing_comma_is_accepted_in_lists() {
    let tool = model(
        quote!(class = "provider", key = "to, order_id,", redact = "to,"),
        tool_fn(),
    );
    assert_eq!(key_texts(&tool), ["to", "order_id"]);
    assert_eq!(tool.redact, ["to"]);
    let errs = errors(quote!(class = "provider", key = "to,,order_id"), tool_fn());
    assert!(errs[0].contains("empty entry"), "{errs:?}");
    let errs = errors(quote!(class = "provider", key = ","), tool_fn());
    assert!(errs[0].contains("`key` is empty"), "{errs:?}");
}

#[test]
fn read_only_tools_have_no_key() {
    let tool = model(quote!(class = "read_only"), tool_fn());
    assert_eq!(tool.class, Class::ReadOnly);
    assert!(tool.key.is_empty());
    let errs = errors(quote!(class = "read_only", key = "to"), tool_fn());
    assert!(errs[0].contains("`key` on a read_only tool"), "{errs:?}");
}

#[test]
fn a_free_fn_is_named_after_itself_and_name_overrides() {
    assert_eq!(model(quote!(class = "read_only"), tool_fn()).name, "send");
    let tool = model(quote!(class = "read_only", name = "send_v1"), tool_fn());
    assert_eq!(tool.name, "send_v1");
    let raw = quote!(
        async fn r#match(ctx: &Ctx) -> Result<(), E> {
            Ok(())
        }
    );
    assert_eq!(model(quote!(class = "read_only"), raw).name, "match");
}

#[test]
fn a_method_needs_its_type_in_its_name() {
    let errs = errors(quote!(class = "provider", key = "to"), method());
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("a method tool needs a name that includes its type"));
    assert!(errs[0].contains("name = \"Type::send\""), "{errs:?}");
    assert!(
        errs[0].contains("#[idem::tool] on the `impl` block"),
        "{errs:?}"
    );
    let tool = model(
        quote!(class = "provider", key = "to", name = "Mail::send"),
        method(),
    );
    assert_eq!(tool.name, "Mail::send");
    let tool = model(
        quote!(class = "provider", key = "to", __impl_type = "Mailer"),
        method(),
    );
    assert_eq!(tool.name, "Mailer::send");
    let tool = model(
        quote!(
            class = "provider",
            key = "to",
            __impl_type = "Mailer",
            name = "mail"
        ),
        method(),
    );
    assert_eq!(tool.name, "mail", "an explicit name wins");
}

#[test]
fn a_result_naming_the_blocks_parameters_is_refused() {
    let item = |ret: TokenStream| quote!(async fn get(&self, ctx: &Ctx, id: u64) -> Result<#ret, E> { todo!() });
    let args = quote!(
        class = "provider",
        key = "id",
        __impl_type = "Store",
        __impl_generics = "T,N"
    );
    for ret in [
        quote!(T),
        quote!(Vec<T>),
        quote!([u8; N]),
        quote!((u8, Option<T>)),
    ] {
        let errs = errors(args.clone(), item(ret.clone()));
        assert_eq!(errs.len(), 1, "{ret}: {errs:?}");
        assert!(
            errs[0].contains("cannot be the `impl` block's parameter"),
            "{ret}: {errs:?}"
        );
    }
    for ret in [quote!(u64), quote!(a::T), quote!(Tx), quote!(Vec<String>)] {
        model(args.clone(), item(ret));
    }
}

/// Runs `#[tool]` on an impl block, then validates each completed method
/// attribute as the inner expansion will.
fn names_in_impl(args: TokenStream, block: TokenStream) -> Vec<String> {
    let out = super::tool_impl(args, block).expect("the block is accepted");
    let block = first_impl(out);
    let mut names = Vec::new();
    for item in block.items {
        let syn::ImplItem::Fn(f) = item else { continue };
        let Some(attr) = f.attrs.iter().find(|a| a.path().is_ident("tool")) else {
            continue;
        };
        let args: Args = attr.parse_args().expect("completed arguments parse");
        let func = syn::ItemFn {
            attrs: Vec::new(),
            vis: f.vis,
            sig: f.sig,
            block: Box::new(f.block),
        };
        let tool = validate::validate(args.0, &func).expect("the method is valid");
        names.push(format!(
            "{} via {}",
            tool.name,
            tool.krate.to_token_stream()
        ));
    }
    names
}

#[test]
fn an_impl_block_names_its_tools_after_its_type() {
    let names = names_in_impl(
        quote!(),
        quote!(
            impl<T: Send> crate::mail::Mailer<T> {
                #[tool(class = "provider", key = "to")]
                async fn send(&self, ctx: &Ctx, to: String) -> Result<(), E> {
                    Ok(())
                }

                #[tool(class = "read_only", name = "peek")]
                async fn look(&self, ctx: &Ctx) -> Result<(), E> {
                    Ok(())
                }

                #[tool(class = "read_only")]
                async fn new_draft(ctx: &Ctx) -> Result<(), E> {
                    Ok(())
                }

                fn helper(&self) {}
            }
        ),
    );
    assert_eq!(
        names,
        [
            "Mailer::send via :: idem",
            "peek via :: idem",
            "Mailer::new_draft via :: idem"
        ]
    );
}

#[test]
fn an_impl_block_recognizes_the_renamed_import() {
    let out = super::tool_impl(
        quote!(),
        quote!(
            impl Mailer {
                #[idem_tool(class = "read_only")]
                async fn send(&self, ctx: &Ctx) -> Result<(), E> {
                    Ok(())
                }
            }
        ),
    )
    .unwrap();
    let block = first_impl(out);
    let syn::ImplItem::Fn(f) = &block.items[0] else {
        panic!("a method comes out")
    };
    let args: Args = f.attrs[0].parse_args().unwrap();
    let func = syn::ItemFn {
        attrs: Vec::new(),
        vis: f.vis.clone(),
        sig: f.sig.clone(),
        block: Box::new(f.block.clone()),
    };
    assert_eq!(
        validate::validate(args.0, &func).unwrap().name,
        "Mailer::send"
    );
}

#[test]
fn an_impl_block_passes_its_crate_unless_a_method_has_its_own() {
    let names = names_in_impl(
        quote!(crate = "my::rt"),
        quote!(
            impl Notifier for &Sms {
                #[tool(class = "read_only")]
                async fn send(&self, ctx: &Ctx) -> Result<(), E> {
                    Ok(())
                }

                #[tool(class = "read_only", crate = "other::rt")]
                async fn ping(&self, ctx: &Ctx) -> Result<(), E> {
                    Ok(())
                }
            }
        ),
    );
    assert_eq!(
        names,
        ["Sms::send via my :: rt", "Sms::ping via other :: rt"]
    );
}

#[test]
fn parameters_keep_their_cfg() {
    let tool = model(
        quote!(class = "provider", key = "id"),
        quote!(
            async fn send(
                ctx: &Ctx,
                id: u64,
                #[cfg(feature = "x")]
                #[allow(unused)]
                note: String,
            ) -> Result<(), E> {
                Ok(())
            }
        ),
    );
    let cfgs: Vec<usize> = tool.shape.params.iter().map(|p| p.cfg.len()).collect();
    assert_eq!(cfgs, [0, 1], "only the `cfg`, not the other attributes");
    let errs = errors(
        quote!(class = "provider", key = "id, note"),
        quote!(
            async fn send(ctx: &Ctx, id: u64, #[cfg(unix)] note: String) -> Result<(), E> {
                Ok(())
            }
        ),
    );
    assert!(
        errs[0].contains("`note` in `key` is a `#[cfg(...)]` parameter"),
        "{errs:?}"
    );
}

#[test]
fn impl_trait_results_only_on_read_only_tools() {
    let iter = quote!(
        async fn evens(ctx: &Ctx) -> Result<impl Iterator<Item = u32>, E> {
            Ok(0..2)
        }
    );
    let tool = model(quote!(class = "read_only"), iter.clone());
    let ok = &tool.shape.ok;
    assert!(contains_impl_trait(ok));
    let inferred = impl_trait_as_infer(ok);
    assert!(!contains_impl_trait(&inferred));
    assert_eq!(inferred.to_token_stream().to_string(), "_");
    let nested: syn::Type = syn::parse_quote!(Vec<(u8, Box<impl Fn()>)>);
    assert_eq!(
        impl_trait_as_infer(&nested).to_token_stream().to_string(),
        "Vec < (u8 , Box < _ >) >"
    );
    let errs = errors(quote!(class = "provider", key = ""), iter);
    assert!(
        errs.iter()
            .any(|e| e.contains("a provider tool stores its result in the journal")),
        "{errs:?}"
    );
}

#[test]
fn messages_use_the_right_article() {
    let errs = errors(quote!(class = "at_most_once"), tool_fn());
    assert!(errs[0].contains("an at_most_once tool needs"), "{errs:?}");
    let errs = errors(quote!(class = "provider"), tool_fn());
    assert!(errs[0].contains("a provider tool needs"), "{errs:?}");
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

/// Which signatures get a JSON dispatcher: the reason given is the one a
/// `dispatch = true` error shows.
#[test]
fn dispatchers_are_generated_only_where_the_signature_allows_one() {
    use crate::eligible::fn_ineligible;
    let why = |args: TokenStream, item: TokenStream| {
        let func: syn::ItemFn = syn::parse2(item.clone()).unwrap();
        let tool = model(args, item);
        fn_ineligible(&func.sig, tool.shape.view(), false)
    };
    let provider = quote!(class = "provider", key = "id");
    assert_eq!(
        why(
            provider.clone(),
            quote!(
                async fn f(ctx: &idem::Ctx, id: u64, note: Option<String>) -> Result<Vec<u8>, E> {
                    Ok(vec![])
                }
            )
        ),
        None
    );
    let cases = [
        (
            quote!(
                async fn f(ctx: &Ctx, id: u64, name: &str) -> Result<(), E> {
                    Ok(())
                }
            ),
            "`&str` borrows",
        ),
        (
            quote!(
                async fn f(
                    ctx: &Ctx,
                    id: u64,
                    c: std::borrow::Cow<'static, str>,
                    n: Wrap<'a>,
                ) -> Result<(), E> {
                    Ok(())
                }
            ),
            "`Wrap<'a>` borrows",
        ),
        (
            quote!(
                async fn f<T: Clone>(ctx: &Ctx, id: u64, t: T) -> Result<(), E> {
                    Ok(())
                }
            ),
            "it is generic",
        ),
        (
            quote!(
                async fn f(ctx: &Ctx, id: u64, #[cfg(test)] t: u8) -> Result<(), E> {
                    Ok(())
                }
            ),
            "`#[cfg(...)]`",
        ),
        (
            quote!(
                async fn f(ctx: &Ctx, id: u64, t: impl Clone) -> Result<(), E> {
                    Ok(())
                }
            ),
            "`impl Clone` is an `impl Trait`",
        ),
        (
            quote!(
                async fn f(ctx: &RunContext, id: u64) -> Result<(), E> {
                    Ok(())
                }
            ),
            "not written `&Ctx`",
        ),
    ];
    for (item, expected) in cases {
        let text = item.to_string();
        let reason = why(provider.clone(), item).unwrap_or_else(|| panic!("{text}: eligible"));
        assert!(reason.contains(expected), "{text}: {reason}");
    }
    // A method: only its `#[tool]` block registers it.
    let func: syn::ItemFn = syn::parse2(method()).unwrap();
    let tool = model(
        quote!(class = "provider", key = "to", name = "M::send"),
        method(),
    );
    assert!(fn_ineligible(&func.sig, tool.shape.view(), false).is_some());
    assert_eq!(fn_ineligible(&func.sig, tool.shape.view(), true), None);
}

#[test]
fn dispatch_arguments_are_read() {
    use crate::validate::Dispatch;
    let tool = model(quote!(class = "provider", key = "to"), tool_fn());
    assert!(tool.dispatch == Dispatch::Auto && tool.destructive.is_none() && tool.schema.is_none());
    let tool = model(
        quote!(
            class = "provider",
            key = "to",
            dispatch = true,
            destructive = false,
            schema = my::schema
        ),
        tool_fn(),
    );
    assert!(tool.dispatch == Dispatch::Required);
    assert_eq!(tool.destructive, Some(false));
    assert_eq!(tool.schema.to_token_stream().to_string(), "my :: schema");
    let tool = model(
        quote!(class = "provider", key = "to", dispatch = false),
        tool_fn(),
    );
    assert!(tool.dispatch == Dispatch::Off);
    let errs = errors(
        quote!(class = "provider", key = "to", dispatch = 1),
        tool_fn(),
    );
    assert!(
        errs[0].starts_with("`dispatch` takes `true` or `false`"),
        "{errs:?}"
    );
}
