//! Code generation for a validated tool.
//!
//! The wrapper keeps the user's signature (error type wrapped in
//! `ToolError`), derives the key and records the arguments before the
//! first attempt, and hands the engine a closure that runs the original
//! body once per attempt on fresh copies of the arguments.
//!
//! Generated tokens resolve at the call site but are *located* on the
//! user's tokens where an error can arise (a key field's type, an argument
//! that is not `Clone`, `E: Classify`), so rustc underlines the user's code,
//! while lints still see them as macro output.

use std::time::Duration;

use proc_macro2::{Group, Ident, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, ToTokens};
use syn::ext::IdentExt;
use syn::{FnArg, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Type};

use crate::validate::{ends, Class, Tool, Verify};

pub(crate) fn expand(tool: &Tool, item: ItemFn) -> TokenStream {
    let krate = &tool.krate;
    let p = quote!(#krate::__private);
    let shape = &tool.shape;
    let (Some(ctx), Some(ok), Some(err)) = (&shape.ctx, &shape.ok, &shape.err) else {
        unreachable!("validate() only returns a Tool for a complete signature")
    };

    let ItemFn {
        attrs,
        vis,
        mut sig,
        block,
    } = item;
    let user_ret = match &sig.output {
        ReturnType::Type(_, ty) => (**ty).clone(),
        ReturnType::Default => unreachable!("validated: returns Result<T, E>"),
    };

    // The outer signature: `mut` belongs to the per-attempt copies, not to
    // the parameters the wrapper only reads; `_: &Ctx` needs a name.
    let ctx_index = usize::from(shape.method);
    let ctx_outer = match &ctx.ident {
        Some(i) => i.clone(),
        None => format_ident!("__idem_ctx_param"),
    };
    for (i, input) in sig.inputs.iter_mut().enumerate() {
        let FnArg::Typed(pt) = input else { continue };
        if i == ctx_index && ctx.ident.is_none() {
            *pt.pat = syn::parse_quote!(#ctx_outer);
        } else if let Pat::Ident(pi) = &mut *pt.pat {
            pi.mutability = None;
        }
    }
    if let ReturnType::Type(_, ty) = &mut sig.output {
        wrap_error(ty, krate);
    }

    // A static cannot name the function's generic parameters: the result
    // check goes into the descriptor only when the result type names none
    // (nor `Self` or `impl`, which a method's impl may make generic); the
    // call passes it along either way, for the runtime to remember.
    let static_check = sig.generics.type_params().next().is_none() && !names_self_or_impl(ok);
    let descriptor = descriptor(tool, &p, &sig.ident, ok, static_check);

    // Ahead of the engine's own bounds, so that the first error about `E`
    // or `T` lands on the user's type. (rustc repeats an unmet bound of the
    // engine call at the attribute; no placement of that call avoids it,
    // because the bound is checked both at the call and at its `.await`.)
    let assert_classify = located_call(quote!(#p::assert_classify::<), err, quote!(>();));
    let assert_journaled = if tool.class == Class::ReadOnly {
        TokenStream::new()
    } else {
        located_call(quote!(#p::assert_journaled::<), ok, quote!(>();))
    };

    let (_, ctx_hi) = ends(&ctx.ty);
    // Uses of the user's parameters resolve like the user's tokens but carry
    // the macro's context, so lints about how they are used (e.g. clippy's
    // `used_underscore_binding` on `_ctx`) stay quiet.
    let root_value = at_call_site(&ctx_outer, ctx_hi);
    let root = quote!(let __idem_root: &#p::Ctx = #root_value;);

    let params = &shape.params;
    let journaled = tool.class != Class::ReadOnly;
    let record = if journaled {
        let fields = tool.key.iter().map(|k| {
            let param = &params[k.param];
            let (lo, hi) = if k.members.is_empty() {
                (param.ident.span(), ends(&param.ty).1)
            } else {
                (k.span, k.span)
            };
            let ident = at_call_site(&param.ident, hi);
            let members = k.members.iter();
            let access = located(quote!(#(.#members)*), hi);
            let head = located(quote!(#p::key_part), lo);
            let amp = located(quote!(&), lo);
            let args = paren(quote!(#amp #ident #access), hi);
            quote!(.field(#head #args))
        });
        let captures = params.iter().map(|param| {
            let ident = at_call_site(&param.ident, param.ident.span());
            let name = param.ident.unraw().to_string();
            if tool.redact.contains(&name) {
                quote!(__idem_args.redacted(#name);)
            } else {
                quote!((&&#p::Capture(&#ident)).capture(&mut __idem_args, #name);)
            }
        });
        let mutability = (!params.is_empty()).then(|| quote!(mut));
        quote! {
            let __idem_key = #p::key(__idem_root, &__IDEM_TOOL) #(#fields)* .finish();
            let #mutability __idem_args = #p::Args::new();
            {
                #[allow(unused_imports)]
                use #p::{CaptureOpaque as _, CaptureSerialize as _};
                #(#captures)*
            }
        }
    } else {
        TokenStream::new()
    };

    let copies = params.iter().map(|param| {
        let ident = &param.ident;
        let mutability = param.mutable.then(|| quote!(mut));
        let (lo, hi) = (ident.span(), ends(&param.ty).1);
        let head = located(quote!(#p::AttemptArg::for_attempt), lo);
        let amp = located(quote!(&), lo);
        let arg = at_call_site(ident, hi);
        let args = paren(quote!(#amp #arg), hi);
        // A parameter the body does not use is still part of the call (key,
        // evidence); its copy must not warn.
        quote!(#[allow(unused_variables)] let #mutability #ident = #head #args;)
    });
    let ctx_bind = ctx
        .ident
        .as_ref()
        .map(|i| quote!(#[allow(unused_variables)] let #i: &#p::Ctx = &__idem_ctx;));
    let attempt = quote! {
        move |__idem_ctx: #p::Ctx| {
            #(#copies)*
            async move {
                // Fixes the block's output type before the body is checked,
                // so `?` and `return` in the body convert into it.
                if let ::core::option::Option::Some(__idem_ret) =
                    ::core::option::Option::None::<#user_ret>
                {
                    return __idem_ret;
                }
                #ctx_bind
                #block
            }
        }
    };

    let call = if journaled {
        let verify = match &tool.verify {
            Verify::Path(path) => verify_closure(path, shape.method, &p, ok, err),
            Verify::Absent | Verify::Disabled => quote!(#p::no_verify::<#ok, #err>()),
        };
        // The error's `Display` for operators when it has one, and sharing
        // the leader's error with concurrent duplicates when it can be
        // cloned: picked by method resolution on what `E` implements.
        let hooks = quote! {{
            #[allow(unused_imports)]
            use #p::{DescribeDebug as _, DescribeDisplay as _, DescribeName as _, ShareClone as _, ShareNone as _};
            #p::hooks::<#err>(
                (&&&#p::Probe::<#err>::new()).describe(),
                (&&#p::Probe::<#err>::new()).sharing(),
                #p::landed::<#ok>,
            )
        }};
        quote! {
            #p::call_with(__idem_root, &__IDEM_TOOL, __idem_key, __idem_args, __idem_attempt, #verify, #hooks).await
        }
    } else {
        quote!(#p::call_read_only(__idem_root, &__IDEM_TOOL, __idem_attempt).await)
    };

    quote! {
        #(#attrs)*
        #vis #sig {
            #descriptor
            #assert_classify
            #assert_journaled
            #root
            #record
            let __idem_attempt = #attempt;
            #call
        }
    }
}

/// `Result<T, E>` becomes `Result<T, ToolError<E>>`.
fn wrap_error(ty: &mut Type, krate: &syn::Path) {
    let Type::Path(tp) = ty else { return };
    let Some(last) = tp.path.segments.last_mut() else {
        return;
    };
    let PathArguments::AngleBracketed(args) = &mut last.arguments else {
        return;
    };
    if let Some(GenericArgument::Type(err)) = args.args.iter_mut().nth(1) {
        let inner = err.clone();
        *err = syn::parse_quote!(#krate::ToolError<#inner>);
    }
}

/// The static descriptor and its registration, both inside the function
/// body so that no name can collide with the user's items.
/// Whether a type mentions `Self` or an `impl Trait`.
fn names_self_or_impl(ty: &Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|t| match t {
            TokenTree::Ident(i) => i == "Self" || i == "impl",
            TokenTree::Group(g) => walk(g.stream()),
            _ => false,
        })
    }
    walk(ty.to_token_stream())
}

fn descriptor(
    tool: &Tool,
    p: &TokenStream,
    fn_ident: &Ident,
    ok: &Type,
    static_check: bool,
) -> TokenStream {
    let name = &tool.name;
    let class = match tool.class {
        Class::ReadOnly => quote!(ReadOnly),
        Class::Provider => quote!(Provider),
        Class::Journal => quote!(Journal),
        Class::AtMostOnce => quote!(AtMostOnce),
    };
    let key_fields = tool.key.iter().map(|k| &k.text);
    let dur = |d: Duration| {
        let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
        quote!(#p::Duration::new(#secs, #nanos))
    };
    let opt = |d: Option<Duration>| match d {
        Some(d) => {
            let d = dur(d);
            quote!(::core::option::Option::Some(#d))
        }
        None => quote!(::core::option::Option::None),
    };
    let window = dur(tool.dedupe_window);
    let r = &tool.retry;
    let (max_attempts, backoff, jitter) = (r.max_attempts, r.backoff, r.jitter);
    let (initial, max_interval, max_elapsed) =
        (dur(r.initial), dur(r.max_interval), opt(r.max_elapsed));
    let timeout = opt(tool.timeout);
    let on_drift = if tool.on_drift_reject {
        quote!(Reject)
    } else {
        quote!(Replay)
    };
    let redact = &tool.redact;
    let verify = match &tool.verify {
        Verify::Path(path) => {
            let text = path.to_token_stream().to_string().replace(' ', "");
            quote!(::core::option::Option::Some(#text))
        }
        Verify::Disabled => quote!(::core::option::Option::Some("none")),
        Verify::Absent => quote!(::core::option::Option::None),
    };
    let check_landed = if tool.class == Class::ReadOnly || !static_check {
        quote!(::core::option::Option::None)
    } else {
        quote!(::core::option::Option::Some(#p::landed::<#ok>))
    };
    // Located on the function's name, so `line!()` reports its line rather
    // than the attribute's.
    // (`line!()` follows its tokens' expansion context up to the first
    // root one, so the tokens take the name's context, not just its place.)
    let here = quote::quote_spanned!(fn_ident.span()=> ::core::file!(), line: ::core::line!());
    quote! {
        static __IDEM_TOOL: #p::ToolDescriptor = #p::ToolDescriptor {
            name: #name,
            class: #p::Class::#class,
            key_fields: &[#(#key_fields),*],
            dedupe_window: #window,
            retry: #p::RetryPolicy {
                max_attempts: #max_attempts,
                initial: #initial,
                backoff: #backoff,
                max_interval: #max_interval,
                max_elapsed: #max_elapsed,
                jitter: #jitter,
            },
            timeout: #timeout,
            on_drift: #p::OnDrift::#on_drift,
            redact: &[#(#redact),*],
            verify: #verify,
            check_landed: #check_landed,
            module_path: ::core::module_path!(),
            file: #here,
        };
        #p::inventory::submit! { #p::RegisteredTool(&__IDEM_TOOL) }
    }
}

/// `Some(closure)` calling the verify function for an attempt's `Ctx`. In
/// a method tool a bare name is a method of `self`; a path with `::` is a
/// free function.
fn verify_closure(
    path: &syn::Path,
    method: bool,
    p: &TokenStream,
    ok: &Type,
    err: &Type,
) -> TokenStream {
    let (lo, hi) = ends(path);
    let is_method = method && path.leading_colon.is_none() && path.segments.len() == 1;
    let head = if is_method {
        let recv = located(quote!(self.), lo);
        quote!(#recv #path)
    } else {
        quote!(#path)
    };
    let tail = located(quote!((&__idem_vctx).await), hi);
    quote! {
        ::core::option::Option::Some(move |__idem_vctx: #p::Ctx| async move {
            let __idem_verdict: ::core::result::Result<#p::Verdict<#ok>, #err> = #head #tail;
            __idem_verdict
        })
    }
}

/// `head <ty> tail`, with `head` located on the start of `ty` and `tail` on
/// its end, so an error about the whole expression underlines `ty`.
fn located_call(head: TokenStream, ty: &Type, tail: TokenStream) -> TokenStream {
    let (lo, hi) = ends(ty);
    let head = located(head, lo);
    let tail = located(tail, hi);
    quote!(#head #ty #tail)
}

/// The same tokens, resolving as before but reported at `at`.
fn located(tokens: TokenStream, at: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut t| {
            if let TokenTree::Group(g) = &t {
                let mut inner = Group::new(g.delimiter(), located(g.stream(), at));
                inner.set_span(g.span().located_at(at));
                t = TokenTree::Group(inner);
            } else {
                t.set_span(t.span().located_at(at));
            }
            t
        })
        .collect()
}

/// The parameter `ident`, resolved at the call site (as the user's own
/// tokens are) but located at `at`. Both ends of an expression must share
/// one expansion context for rustc to underline the range between them.
fn at_call_site(ident: &Ident, at: Span) -> TokenStream {
    let mut ident = ident.clone();
    ident.set_span(Span::call_site().located_at(at));
    ident.into_token_stream()
}

/// `( tokens )` with the parentheses located at `at`.
fn paren(tokens: TokenStream, at: Span) -> TokenStream {
    let mut g = Group::new(proc_macro2::Delimiter::Parenthesis, tokens);
    g.set_span(Span::call_site().located_at(at));
    TokenTree::Group(g).into()
}
