//! The JSON dispatcher and argument schema of a tool.
//!
//! Next to a free function the attribute emits, in an anonymous `const`
//! block, a dispatcher (JSON object in, the tool called through its
//! wrapper, JSON out), the schema of its arguments, an availability check
//! and their registration. Methods need their type, which only the
//! `#[tool]` impl block sees: the block emits the same for each of its
//! tool methods, after itself (`impl_block`).
//!
//! A dispatcher is generated only where the signature allows one at all:
//! no generic parameters, no `impl Trait`, nothing borrowed (`&`, lifetimes), no `Self`
//! in a type, no `#[cfg]` parameter. Whether the types then allow JSON
//! (`Deserialize` parameters, a `Serialize` result, a `Send` future) is
//! decided by method resolution on probes (`__private::ArgProbe` and
//! friends), so the generated code compiles for every tool and a tool
//! whose types do not allow it reports itself unavailable at run time.
//! `dispatch = true` turns those probes into bounds, spanned on the type
//! at fault; `dispatch = false` generates nothing.
//!
//! Nothing here is visible to the user's code: every item lives in the
//! anonymous block, every local is a mixed-site identifier, and the
//! user's types and function are named with their own tokens.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::{Attribute, Expr, ImplItemFn, ItemImpl, Meta, Signature, Type};

use crate::eligible::{block_ineligible, fn_ineligible};
use crate::model::{Dispatch, Tool};
use crate::types::ends;

fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// The `#[doc]` texts of `attrs`, as one `&'static str` expression.
fn doc(attrs: &[Attribute]) -> TokenStream {
    let parts: Vec<&Expr> = attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            Meta::NameValue(nv) => Some(&nv.value),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        quote!("")
    } else {
        quote!(::core::concat!(#(#parts, "\n"),*))
    }
}

/// The attributes that decide whether the item exists: the registration
/// exists exactly when the tool does.
fn cfgs(attrs: &[Attribute]) -> Vec<&Attribute> {
    attrs.iter().filter(|a| a.path().is_ident("cfg")).collect()
}

/// How the dispatcher reaches the tool.
enum Callee<'a> {
    /// A free function, by its name.
    Free(&'a Ident),
    /// A method of the block's type: `<Type>::m` or `<Type as Trait>::m`;
    /// `by_arc` for a `self: &Arc<Self>` receiver.
    Method {
        qualified: TokenStream,
        self_ty: &'a Type,
        by_arc: bool,
    },
}

/// The dispatcher of one tool, in its own anonymous block.
fn dispatcher(tool: &Tool, attrs: &[Attribute], callee: Callee<'_>) -> TokenStream {
    let krate = &tool.krate;
    let p = quote!(#krate::__private);
    let shape = &tool.shape;
    let (ok, err) = (&shape.ok, &shape.err);
    let name = &tool.name;
    let params = &shape.params;
    let json_names: Vec<String> = params.iter().map(|p| p.ident.unraw().to_string()).collect();
    let values: Vec<Ident> = (0..params.len())
        .map(|i| local(&format!("__idem_a{i}")))
        .collect();
    let types: Vec<&Type> = params.iter().map(|p| &p.ty).collect();

    let (ctx, args, reader, this) = (
        local("__idem_ctx"),
        local("__idem_json"),
        local("__idem_reader"),
        local("__idem_this"),
    );
    let (encode, describe, classify, ok_v, err_v, res) = (
        local("__idem_encode"),
        local("__idem_describe"),
        local("__idem_classify"),
        local("__idem_ok"),
        local("__idem_err"),
        local("__idem_result"),
    );
    let (schema_fn, available_fn, call_fn, make) = (
        local("__idem_schema"),
        local("__idem_available"),
        local("__idem_call"),
        local("__idem_make"),
    );
    let statik = format_ident!("__IDEM_DISPATCH", span = Span::mixed_site());

    // The call, with placeholders (for the type-only availability check)
    // or with the decoded arguments.
    let invoke = |ctx: TokenStream, args: &[TokenStream], this: TokenStream| match &callee {
        Callee::Free(f) => quote!(#f(#ctx, #(#args),*)),
        Callee::Method {
            qualified, by_arc, ..
        } => {
            let recv = if *by_arc {
                quote!(#this)
            } else {
                quote!(&**#this)
            };
            quote!(#qualified(#recv, #ctx, #(#args),*))
        }
    };
    let nevers: Vec<TokenStream> = params.iter().map(|_| quote!(#p::never())).collect();
    let placeholder_this = match &callee {
        Callee::Free(_) => TokenStream::new(),
        Callee::Method { self_ty, .. } => {
            quote!(let #this: &::std::sync::Arc<#self_ty> = #p::never();)
        }
    };
    let placeholder_call = invoke(quote!(#p::never()), &nevers, quote!(#this));
    let make_closure = quote! {
        let #make = || {
            #placeholder_this
            #placeholder_call
        };
    };

    let schema_body = match &tool.schema {
        Some(path) => quote!(#path()),
        None => {
            let entries = json_names.iter().zip(&types).map(|(n, ty)| {
                quote! {
                    (#n, (&&&&#p::ArgProbe::<#ty>::new()).schema(),
                     (&&&#p::ArgProbe::<#ty>::new()).optional())
                }
            });
            quote!(#p::args_schema(::std::vec![#(#entries),*]))
        }
    };
    let checks = json_names
        .iter()
        .zip(&types)
        .map(|(n, ty)| quote!((&&&#p::ArgProbe::<#ty>::new()).check(#n)?;));

    let decoded = json_names
        .iter()
        .zip(&types)
        .zip(&values)
        .map(|((n, ty), v)| {
            quote! {
                let #v: #ty = match (&&&#p::ArgProbe::<#ty>::new()).take(&mut #reader, #n) {
                    ::core::result::Result::Ok(#ok_v) => #ok_v,
                    ::core::result::Result::Err(#err_v) => return #p::ready_err(#err_v),
                };
            }
        });
    let value_tokens: Vec<TokenStream> = values.iter().map(|v| quote!(#v)).collect();
    let real_call = invoke(quote!(#ctx), &value_tokens, quote!(#this));

    let (call_sig, downcast, call_variant) = match &callee {
        Callee::Free(_) => (
            quote! {
                fn #call_fn<'a>(#ctx: &'a #p::Ctx, #args: #p::serde_json::Value)
                    -> #p::BoxFuture<'a, ::core::result::Result<#p::serde_json::Value, #p::DispatchError>>
            },
            TokenStream::new(),
            quote!(#p::Call::Free(#call_fn)),
        ),
        Callee::Method { self_ty, .. } => {
            let type_name = self_ty.to_token_stream().to_string().replace(' ', "");
            (
                quote! {
                    fn #call_fn<'a>(
                        #this: &'a (dyn ::core::any::Any + ::core::marker::Send + ::core::marker::Sync),
                        #ctx: &'a #p::Ctx,
                        #args: #p::serde_json::Value,
                    ) -> #p::BoxFuture<'a, ::core::result::Result<#p::serde_json::Value, #p::DispatchError>>
                },
                quote! {
                    let #this: &::std::sync::Arc<#self_ty> = match #this.downcast_ref() {
                        ::core::option::Option::Some(#ok_v) => #ok_v,
                        ::core::option::Option::None => return #p::ready_err(#p::DispatchError::Unavailable {
                            tool: #name.into(),
                            reason: ::std::format!("called on another type than `{}`", #type_name),
                        }),
                    };
                },
                quote! {
                    #p::Call::Method {
                        self_type: ::core::any::TypeId::of::<#self_ty>,
                        type_name: #type_name,
                        call: #call_fn,
                    }
                },
            )
        }
    };

    // `dispatch = true`: the probes' conditions as bounds, each spanned on
    // the user's type.
    let required = if tool.dispatch == Dispatch::Required {
        let args = types.iter().map(|ty| {
            let (lo, hi) = ends(ty);
            let head = quote_spanned!(lo=> #p::assert_dispatch_arg::<);
            let tail = quote_spanned!(hi=> >(););
            quote!(#head #ty #tail)
        });
        let (lo, hi) = ends(ok);
        let head = quote_spanned!(lo=> #p::assert_dispatch_result::<);
        let tail = quote_spanned!(hi=> >(););
        let send = quote_spanned!(tool_span(tool)=> #p::assert_dispatch_send(&#make););
        quote! {
            #[allow(dead_code, unreachable_code, clippy::diverging_sub_expression)]
            fn __idem_required() {
                #(#args)*
                #head #ok #tail
                #make_closure
                #send
            }
        }
    } else {
        TokenStream::new()
    };

    let doc = doc(attrs);
    let destructive = match tool.destructive {
        Some(b) => quote!(::core::option::Option::Some(#b)),
        None => quote!(::core::option::Option::None),
    };
    let cfgs = cfgs(attrs);
    let probes = quote! {
        #[allow(unused_imports)]
        use #p::{
            ArgDecode as _, ArgOpaque as _, Classified as _, DescribeDebug as _,
            DescribeDisplay as _, DescribeName as _, FutureLocal as _, FutureSend as _,
            ResultJson as _, ResultOpaque as _, SchemaAny as _, SchemaOwn as _,
            SchemaSchemars as _, Unclassified as _,
        };
    };
    quote! {
        #(#cfgs)*
        #[allow(deprecated, non_upper_case_globals, clippy::needless_borrow)]
        const _: () = {
            #probes

            fn #schema_fn() -> #p::serde_json::Value {
                #schema_body
            }

            #[allow(unreachable_code, clippy::diverging_sub_expression)]
            fn #available_fn() -> ::core::result::Result<(), ::std::string::String> {
                #(#checks)*
                (&&&#p::ResultProbe::<#ok>::new()).check()?;
                #make_closure
                (&&&#p::SendProbe::of(&#make)).check()
            }

            #call_sig {
                #downcast
                let mut #reader = match #p::ArgsReader::new(#name, &[#(#json_names),*], #args) {
                    ::core::result::Result::Ok(#ok_v) => #ok_v,
                    ::core::result::Result::Err(#err_v) => return #p::ready_err(#err_v),
                };
                #(#decoded)*
                let #encode = (&&&#p::ResultProbe::<#ok>::new()).encoder();
                let #describe = (&&&#p::Probe::<#err>::new()).describe();
                let #classify = (&&&#p::ClassifyProbe::<#err>::new()).classifier();
                (&&&#p::SendProbe::new(#real_call))
                    .boxed(move |#res| #p::outcome(#name, #res, #encode, #describe, #classify))
            }

            #required

            static #statik: #p::Dispatcher = #p::Dispatcher {
                name: #name,
                doc: #doc,
                destructive: #destructive,
                schema: #schema_fn,
                available: #available_fn,
                call: #call_variant,
            };
            #p::inventory::submit! { #p::RegisteredDispatch(&#statik) }
        };
    }
}

/// Where a `dispatch = true` error about the whole tool belongs.
fn tool_span(tool: &Tool) -> Span {
    tool.dispatch_span.unwrap_or_else(Span::call_site)
}

/// The dispatcher of a free function, or nothing.
pub(crate) fn free(tool: &Tool, sig: &Signature, attrs: &[Attribute]) -> TokenStream {
    if tool.dispatch == Dispatch::Off || fn_ineligible(sig, tool.shape.view(), false).is_some() {
        return TokenStream::new();
    }
    dispatcher(tool, attrs, Callee::Free(&sig.ident))
}

/// The dispatchers of a `#[tool]` block's methods (`tools`: each validated
/// method with its attributes), or the errors of those that require one
/// the block cannot register.
pub(crate) fn methods(block: &ItemImpl, tools: &[(Tool, &ImplItemFn)]) -> TokenStream {
    if let Some(why) = block_ineligible(block) {
        let mut out = TokenStream::new();
        for (tool, _) in tools {
            if tool.dispatch == Dispatch::Required {
                out.extend(
                    syn::Error::new(
                        tool_span(tool),
                        format!(
                            "`dispatch = true`, but this tool cannot have a JSON dispatcher: \
                             {why}"
                        ),
                    )
                    .to_compile_error(),
                );
            }
        }
        return out;
    }
    let self_ty = &*block.self_ty;
    let block_cfgs = cfgs(&block.attrs);
    let mut out = TokenStream::new();
    for (tool, method) in tools {
        if tool.dispatch == Dispatch::Off
            || fn_ineligible(&method.sig, tool.shape.view(), true).is_some()
        {
            continue;
        }
        let ident = &method.sig.ident;
        let qualified = match &block.trait_ {
            Some((_, path, _)) => quote!(<#self_ty as #path>::#ident),
            None => quote!(<#self_ty>::#ident),
        };
        let by_arc = match method.sig.receiver() {
            Some(r) => match &*r.ty {
                Type::Reference(t) => !matches!(&*t.elem, Type::Path(p) if p.path.is_ident("Self")),
                _ => true,
            },
            None => continue,
        };
        let item = dispatcher(
            tool,
            &method.attrs,
            Callee::Method {
                qualified,
                self_ty,
                by_arc,
            },
        );
        out.extend(quote!(#(#block_cfgs)* #item));
    }
    out
}
