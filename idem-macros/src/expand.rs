//! Code generation for a validated tool.
//!
//! The wrapper keeps the user's signature (error type wrapped in
//! `ToolError`), derives the key and records the arguments before the
//! first attempt, and hands the engine a closure that runs the original
//! body once per attempt on fresh copies of the arguments.
//!
//! Hygiene: the generated code shares no name and no scope with the
//! user's.
//! - The user's identifiers (parameters, the receiver, a verify path) keep
//!   their own spans, so they resolve exactly as the user wrote them, even
//!   when a `macro_rules!` supplied them. Each parameter is named so once,
//!   moved into a local of the wrapper that everything else reads.
//! - The wrapper's locals (`__idem_*`) are [`Span::mixed_site`]
//!   identifiers: invisible to the body, and never confused with a
//!   parameter of the same name.
//! - The descriptor static lives in a block of its own; the verify path is
//!   resolved with mixed-site hygiene, so a parameter named like the
//!   verify function does not shadow it.
//! - The body keeps its own block, with braces marked as generated so
//!   lints about them (`unused_braces`) do not fire on the user's code.
//!
//! Generated tokens are *located* on the user's tokens where an error can
//! arise (a key field's type, an argument that is not `Clone`,
//! `E: Classify`), so rustc underlines the user's code.

use std::time::Duration;

use proc_macro2::{Delimiter, Group, Ident, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::{FnArg, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Type};

use crate::model::{Approve, Class, Tool, Verify};
use crate::types::{ends, impl_trait_as_infer};

/// A local of the wrapper: mixed-site hygiene makes it invisible to the
/// user's tokens and keeps it from resolving to a user's binding.
fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

pub(crate) fn expand(tool: &Tool, item: ItemFn) -> TokenStream {
    let krate = &tool.krate;
    let p = quote!(#krate::__private);
    let shape = &tool.shape;
    let (ctx, ok, err) = (&shape.ctx, &shape.ok, &shape.err);

    // Next to a free function, its JSON dispatcher (a method's comes from
    // its `impl` block); computed on the signature as the user wrote it.
    let dispatcher = if shape.method {
        TokenStream::new()
    } else {
        crate::dispatch::free(tool, &item.sig, &item.attrs)
    };
    let ItemFn {
        attrs,
        vis,
        mut sig,
        block,
    } = item;
    // Inner attributes of the body (`#![allow(..)]`) belong to the
    // function: they open the wrapper's body, where they cover the same
    // code as before plus the generated code.
    let (inner_attrs, outer_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|a| matches!(a.style, syn::AttrStyle::Inner(_)));
    // The body's output type, with any `impl Trait` left to inference.
    let body_ret = impl_trait_as_infer(&shape.ret);

    // The outer signature: `mut` belongs to the per-attempt copies, not to
    // the parameters the wrapper only reads; `_: &Ctx` needs a name.
    let ctx_index = usize::from(shape.method);
    let ctx_outer = match &ctx.ident {
        Some(i) => i.clone(),
        None => format_ident!("__idem_unnamed_ctx", span = Span::mixed_site()),
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

    let tool_ref = local("__idem_tool");
    let root = local("__idem_root");
    let key = local("__idem_key");
    let args = local("__idem_args");
    let attempt_fn = local("__idem_attempt");
    let attempt_ctx = local("__idem_ctx");
    let ret = local("__idem_ret");

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

    // The parameters move into the wrapper's own locals first: the only
    // statements that name them as the user wrote them, which no error can
    // come from. Everything after refers to the locals, located on the
    // user's tokens, so diagnostics read as before and lints about using a
    // parameter (pedantic `used_underscore_binding` for `_ctx`) do not
    // blame the user for code they did not write.
    let quiet = quote!(#[allow(clippy::used_underscore_binding)]);
    let ctx_moved = local("__idem_ctx_param");
    let (_, ctx_hi) = ends(&ctx.ty);
    let mut moves = quote!(#quiet let #ctx_moved = #ctx_outer;);
    let params = &shape.params;
    let moved: Vec<Ident> = (0..params.len())
        .map(|i| local(&format!("__idem_arg{i}")))
        .collect();
    for (param, to) in params.iter().zip(&moved) {
        let (cfg, from) = (&param.cfg, &param.ident);
        moves.extend(quote!(#(#cfg)* #quiet let #to = #from;));
    }
    let ctx_value = at(&ctx_moved, ctx_hi);
    let root_bind = quote!(let #root: &#p::Ctx = #ctx_value;);

    let journaled = tool.class != Class::ReadOnly;
    let record = if journaled {
        let fields = tool.key.iter().map(|k| {
            let param = &params[k.param];
            let (lo, hi) = if k.members.is_empty() {
                (param.ident.span(), ends(&param.ty).1)
            } else {
                (k.span, k.span)
            };
            // All mixed-site tokens, like the local it reads: one expansion
            // context from the first token to the last, so rustc underlines
            // the whole `name: Type`, and reports the missing `KeyPart` once
            // (for `key_part` and `field` alike, as their spans are equal).
            let value = at(&moved[k.param], hi);
            let members = k.members.iter();
            let access = mixed(quote!(#(.#members)*), hi);
            let head = mixed(quote!(#p::key_part), lo);
            let amp = mixed(quote!(&), lo);
            let mut args = Group::new(Delimiter::Parenthesis, quote!(#amp #value #access));
            args.set_span(Span::mixed_site().located_at(hi));
            quote!(.field(#head #args))
        });
        let captures = params.iter().zip(&moved).map(|(param, value)| {
            let name = param.ident.unraw().to_string();
            let cfg = &param.cfg;
            if tool.redact.contains(&name) {
                quote!(#(#cfg)* #args.redacted(#name);)
            } else {
                let value = at(value, param.ident.span());
                quote!(#(#cfg)* (&&#p::Capture(&#value)).capture(&mut #args, #name);)
            }
        });
        quote! {
            let #key = #p::key(#root, #tool_ref) #(#fields)* .finish();
            // Not mutated when every parameter is configured out.
            #[allow(unused_mut)]
            let mut #args = #p::Args::new();
            {
                #[allow(unused_imports)]
                use #p::{CaptureOpaque as _, CaptureSerialize as _};
                #(#captures)*
            }
        }
    } else {
        TokenStream::new()
    };

    let approval = approval(tool, &p, &root, &args, &moved);

    let copies = params.iter().zip(&moved).map(|(param, value)| {
        let ident = &param.ident;
        let mutability = param.mutable.then(|| quote!(mut));
        let (lo, hi) = (ident.span(), ends(&param.ty).1);
        let head = located(quote!(#p::AttemptArg::for_attempt), lo);
        let amp = mixed(quote!(&), lo);
        let value = at(value, hi);
        let args = paren(quote!(#amp #value), hi);
        let cfg = &param.cfg;
        // A parameter the body does not use is still part of the call (key,
        // evidence); its copy must not warn.
        quote!(#(#cfg)* #[allow(unused_variables)] let #mutability #ident = #head #args;)
    });
    let ctx_bind = ctx
        .ident
        .as_ref()
        .map(|i| quote!(#[allow(unused_variables)] let #i: &#p::Ctx = &#attempt_ctx;));
    // The body's own block, its braces marked as generated: the block is
    // the tail of the attempt's future, where rustc would otherwise call
    // the braces of a one-expression body unnecessary.
    let body = {
        let mut braces = Group::new(
            Delimiter::Brace,
            block.stmts.iter().fold(TokenStream::new(), |mut ts, s| {
                s.to_tokens(&mut ts);
                ts
            }),
        );
        braces.set_span(Span::call_site().located_at(block.brace_token.span.join()));
        braces
    };
    let attempt = quote! {
        move |#attempt_ctx: #p::Ctx| {
            #(#copies)*
            async move {
                // Fixes the block's output type before the body is checked,
                // so `?` and `return` in the body convert into it.
                if let ::core::option::Option::Some(#ret) =
                    ::core::option::Option::None::<#body_ret>
                {
                    return #ret;
                }
                #ctx_bind
                #body
            }
        }
    };

    let call = if journaled {
        let verify = match &tool.verify {
            Verify::Path(path) => verify_closure(path, shape.receiver, &p, ok, err),
            Verify::Absent | Verify::Disabled => quote!(#p::no_verify::<#ok, #err>()),
        };
        // The error's `Display` for operators when it has one (else
        // `Debug`), sharing the leader's error with concurrent duplicates
        // when it can be cloned, and the result check: picked by method
        // resolution on what the types implement.
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
            #p::call_with(#root, #tool_ref, #key, #args, #attempt_fn, #verify, #hooks).await
        }
    } else {
        quote!(#p::call_read_only(#root, #tool_ref, #attempt_fn).await)
    };

    let (keep, call) = match (&tool.compensate, journaled) {
        (Some(path), true) => compensable(path, &p, &root, &key, &tool_ref, ok, &moved, call),
        _ => (TokenStream::new(), call),
    };

    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #moves
            let #tool_ref: &'static #p::ToolDescriptor = #descriptor;
            #assert_classify
            #assert_journaled
            #root_bind
            #record
            #approval
            #keep
            let #attempt_fn = #attempt;
            #call
        }
        #dispatcher
    }
}

/// `compensate = path`: inside a saga, copies of the arguments are kept
/// before the call, and a call that returned a value hands the saga its
/// compensation: `path` called on the result and (when it takes them) the
/// arguments, all by reference. Which of the two shapes `path` has is
/// told apart by its arity (`Compensation`'s marker), so a function of
/// another shape is a type error located on the path.
#[allow(clippy::too_many_arguments)]
fn compensable(
    path: &syn::Path,
    p: &TokenStream,
    root: &Ident,
    key: &Ident,
    tool_ref: &Ident,
    ok: &Type,
    moved: &[Ident],
    call: TokenStream,
) -> (TokenStream, TokenStream) {
    let (lo, hi) = ends(path);
    let kept = local("__idem_kept");
    let kept_key = local("__idem_kept_key");
    let out = local("__idem_out");
    let value = local("__idem_value");
    let cctx = local("__idem_cctx");
    let result = local("__idem_result");
    let names: Vec<Ident> = (0..moved.len())
        .map(|i| local(&format!("__idem_kept{i}")))
        .collect();
    let keep = quote! {
        let #kept = if #p::in_saga(#root) {
            ::core::option::Option::Some((#(#p::AttemptArg::for_attempt(&#moved),)*))
        } else {
            ::core::option::Option::None
        };
        let #kept_key = ::core::clone::Clone::clone(&#key);
    };
    let mut path = path.clone();
    if path.leading_colon.is_none() && path.segments.len() == 1 {
        let first = &mut path.segments[0].ident;
        first.set_span(Span::mixed_site().located_at(first.span()));
    }
    let start = located(quote!(#p::Compensation::start), lo);
    let args = paren(quote!(#path, &#cctx, &#result, (#(&#names,)*)), hi);
    let call = quote! {{
        let #out = #call;
        if let (::core::result::Result::Ok(#value), ::core::option::Option::Some(#kept)) = (&#out, #kept) {
            #p::compensable(#root, &#kept_key, #tool_ref, #value, move |#cctx: #p::Ctx, #result: #ok| -> #p::BoxFuture<'static, #p::Undone> {
                ::std::boxed::Box::pin(async move {
                    let (#(#names,)*) = #kept;
                    #p::undone(#start #args.await)
                })
            });
        }
        #out
    }};
    (keep, call)
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

/// A block evaluating to the tool's `&'static ToolDescriptor`: the static,
/// its registration and its link-time name guard, in a block of their own so
/// that none of their names is visible to the user's code.
/// Whether a type mentions `Self` or an `impl Trait`.
fn names_self_or_impl(ty: &Type) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|t| match t {
            proc_macro2::TokenTree::Ident(i) => i == "Self" || i == "impl",
            proc_macro2::TokenTree::Group(g) => walk(g.stream()),
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
    let drift_reject = &tool.drift_reject;
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
    let here = quote_spanned!(fn_ident.span()=> ::core::file!(), ::core::line!());
    let statik = format_ident!("__IDEM_TOOL", span = Span::mixed_site());
    let guard = name_guard(name, fn_ident.span());
    let commit = if tool.commit_eventual {
        quote!(Eventual)
    } else {
        quote!(Immediate)
    };
    let approve = match &tool.approve {
        Approve::Never => quote!(::core::option::Option::None),
        Approve::Always => quote!(::core::option::Option::Some("always")),
        Approve::Path(path) => {
            let text = path.to_token_stream().to_string().replace(' ', "");
            quote!(::core::option::Option::Some(#text))
        }
    };
    let approval_wait = dur(tool.approval_wait);
    quote! {
        {
            static #statik: #p::ToolDescriptor = #p::ToolDescriptor::new(#name, #p::Class::#class)
                .with_key_fields(&[#(#key_fields),*])
                .with_dedupe_window(#window)
                .with_retry(#p::RetryPolicy {
                    max_attempts: #max_attempts,
                    initial: #initial,
                    backoff: #backoff,
                    max_interval: #max_interval,
                    max_elapsed: #max_elapsed,
                    jitter: #jitter,
                })
                .with_timeout(#timeout)
                .with_on_drift(#p::OnDrift::#on_drift)
                .with_drift_reject(&[#(#drift_reject),*])
                .with_redact(&[#(#redact),*])
                .with_verify(#verify)
                .with_check_landed(#check_landed)
                .with_commit(#p::Durability::#commit)
                .with_approval(#approve, #approval_wait)
                .defined_at(::core::module_path!(), #here);
            #p::inventory::submit! { #p::RegisteredTool(&#statik) }
            #guard
            &#statik
        }
    }
}

/// One exported symbol per tool name, so that two tools of one name in one
/// binary do not link: rustc refuses a second definition of the symbol in
/// one crate, the linker one across crates. The symbol's text is what the
/// error shows, so it says what is wrong. (`Runtime::open` checks the same
/// at run time, for builds that get past this.)
fn name_guard(name: &str, at: Span) -> TokenStream {
    let symbol = format!(
        "idem: more than one #[tool] is named \"{}\"",
        name.escape_default()
    );
    let statik = format_ident!("__IDEM_TOOL_NAME", span = Span::mixed_site());
    quote_spanned! {at.resolved_at(Span::mixed_site())=>
        #[unsafe(export_name = #symbol)]
        static #statik: u8 = 0;
    }
}

/// `Some(closure)` calling the verify function for an attempt's `Ctx`. In
/// a method tool a bare name is a method of `self`; a path with `::` is a
/// free function.
fn verify_closure(
    path: &syn::Path,
    receiver: Option<Span>,
    p: &TokenStream,
    ok: &Type,
    err: &Type,
) -> TokenStream {
    let (lo, hi) = ends(path);
    let single = path.leading_colon.is_none() && path.segments.len() == 1;
    let head = match receiver {
        Some(self_span) if single => {
            // The receiver as the signature spells it, so it resolves to the
            // method's `self` whatever macro wrote the method.
            let recv = Ident::new("self", self_span.located_at(lo));
            let dot = located(quote!(.), lo);
            quote!(#recv #dot #path)
        }
        _ if single => {
            // Resolved as an item at the call site but blind to local
            // bindings: a parameter named like the function does not
            // shadow it.
            let mut path = path.clone();
            let first = &mut path.segments[0].ident;
            first.set_span(Span::mixed_site().located_at(first.span()));
            path.into_token_stream()
        }
        _ => path.into_token_stream(),
    };
    let vctx = local("__idem_vctx");
    let verdict = local("__idem_verdict");
    let call = located(quote!(#p::verify_future), lo);
    let arg = paren(quote!(#head(&#vctx)), hi);
    let tail = located(quote!(.await), hi);
    quote! {
        ::core::option::Option::Some(move |#vctx: #p::Ctx| async move {
            let #verdict: ::core::result::Result<#p::Verdict<#ok>, #err> = #call #arg #tail;
            #verdict
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

/// Tokens with mixed-site hygiene (the wrapper's locals'), reported at
/// `at`. Paths in them still resolve at the call site.
fn mixed(tokens: TokenStream, at: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut t| {
            if let TokenTree::Group(g) = &t {
                let mut inner = Group::new(g.delimiter(), mixed(g.stream(), at));
                inner.set_span(Span::mixed_site().located_at(at));
                t = TokenTree::Group(inner);
            } else {
                t.set_span(Span::mixed_site().located_at(at));
            }
            t
        })
        .collect()
}

/// The wrapper's local `ident`, reported at `at`.
fn at(ident: &Ident, at: Span) -> TokenStream {
    let mut ident = ident.clone();
    ident.set_span(ident.span().located_at(at));
    ident.into_token_stream()
}

/// `( tokens )` with the parentheses located at `at`.
fn paren(tokens: TokenStream, at: Span) -> TokenStream {
    let mut g = Group::new(Delimiter::Parenthesis, tokens);
    g.set_span(Span::call_site().located_at(at));
    TokenTree::Group(g).into()
}

/// The statement that tells the engine whether this call needs a person's
/// approval: the policy function called on the context and the arguments
/// by reference, through a function pointer of the promised signature (so
/// a function of another shape is a type error on the path).
fn approval(
    tool: &Tool,
    p: &TokenStream,
    root: &Ident,
    args: &Ident,
    moved: &[Ident],
) -> TokenStream {
    if tool.class == Class::ReadOnly {
        return TokenStream::new();
    }
    match &tool.approve {
        Approve::Never => TokenStream::new(),
        Approve::Always => quote! {
            #args.needs_approval(::core::option::Option::Some(
                ::std::string::String::from("every call of this tool needs a person's approval (approve = \"always\")"),
            ));
        },
        Approve::Path(path) => {
            let (lo, hi) = ends(path);
            let f = local("__idem_approve");
            let tys = tool.shape.params.iter().map(|param| &param.ty);
            let fn_ty = located(
                quote!(fn(&#p::Ctx #(, &#tys)*) -> ::core::option::Option<::std::string::String>),
                lo,
            );
            // Resolved as an item, blind to the wrapper's and the user's
            // local bindings (like a verify path).
            let mut path = path.clone();
            if path.leading_colon.is_none() && path.segments.len() == 1 {
                let first = &mut path.segments[0].ident;
                first.set_span(Span::mixed_site().located_at(first.span()));
            }
            let call_args = paren(quote!(#root #(, &#moved)*), hi);
            quote! {
                let #f: #fn_ty = #path;
                #args.needs_approval(#f #call_args);
            }
        }
    }
}
