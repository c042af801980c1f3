//! Shapes of valid Rust that must stay valid under `#[tool]` (issue 13),
//! built with every warning denied: the attribute adds no error and no
//! warning to code that compiles without it. One section per shape; the
//! runtime behaviour of the same shapes is asserted in
//! `tests/macro_hygiene.rs`.

#![deny(warnings)]

use idem::{tool, Classify, Ctx, Failure, Runtime, Verdict};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// Shape 1: Parameter names supplied by a `macro_rules!`: the wrapper refers to
/// them with the caller's hygiene, not the attribute's.
mod from_macro_rules {
    use super::*;

    macro_rules! keyed_tool {
        ($name:ident, $cx:ident, $p:ident: $t:ty) => {
            #[tool(class = "provider", key = "order_id")]
            pub async fn $name($cx: &Ctx, $p: $t) -> Result<String, E> {
                Ok(format!("{}:{}", $p, $cx.idempotency_key()))
            }
        };
    }

    keyed_tool!(charge, ctx, order_id: u64);

    macro_rules! journal_tool {
        ($name:ident, $verify:ident, $cx:ident, $p:ident) => {
            #[tool(class = "journal", timeout = "30s", key = "ticket", verify = $verify)]
            pub async fn $name($cx: &Ctx, $p: String) -> Result<usize, E> {
                let _ = $cx;
                Ok($p.len())
            }
        };
    }

    journal_tool!(open_ticket, found, ctx, ticket);

    pub async fn found(_ctx: &Ctx) -> Result<Verdict<usize>, E> {
        Ok(Verdict::NotLanded)
    }
}

/// Shape 2: A verify function named like a parameter: the verify call is not
/// resolved where the parameters are in scope.
mod verify_like_a_param {
    use super::*;

    #[tool(class = "journal", timeout = "30s", key = "ticket", verify = ticket)]
    pub async fn open(ctx: &Ctx, ticket: String) -> Result<usize, E> {
        let _ = ctx;
        Ok(ticket.len())
    }

    pub async fn ticket(_ctx: &Ctx) -> Result<Verdict<usize>, E> {
        Ok(Verdict::NotLanded)
    }
}

/// Shape 3: Parameters named like the wrapper's own variables are the user's
/// parameters inside the body, nothing else.
mod wrapper_names {
    use super::*;

    #[tool(class = "provider", key = "__idem_key, __idem_root")]
    #[allow(clippy::too_many_arguments)]
    pub async fn clash(
        __idem_ctx: &Ctx,
        __idem_key: String,
        __idem_root: String,
        __idem_args: Vec<u8>,
        __idem_attempt: u32,
        __idem_ret: u8,
        __idem_arg0: u8,
        __idem_ctx_param: u8,
    ) -> Result<String, E> {
        let _ = __idem_ctx.idempotency_key();
        Ok(format!(
            "{__idem_key}/{__idem_root}/{}/{__idem_attempt}/{__idem_ret}/{__idem_arg0}/{__idem_ctx_param}",
            __idem_args.len()
        ))
    }

    #[tool(class = "journal", timeout = "30s", key = "__idem_vctx", verify = __idem_verdict)]
    pub async fn clash_verify(
        ctx: &Ctx,
        __idem_vctx: u64,
        __idem_verdict: u64,
    ) -> Result<u64, E> {
        let _ = ctx;
        Ok(__idem_vctx + __idem_verdict)
    }

    pub async fn __idem_verdict(_ctx: &Ctx) -> Result<Verdict<u64>, E> {
        Ok(Verdict::NotLanded)
    }
}

/// Shape 4: a body that is one expression, on one line: no "unnecessary
/// braces" warning (rustc gives it for a one-line block in tail position).
mod one_expression {
    use super::*;

    #[rustfmt::skip]
    #[tool(class = "read_only")]
    pub async fn double(_ctx: &Ctx, a: u32) -> Result<u32, E> { Ok(a * 2) }

    #[rustfmt::skip]
    #[tool(class = "provider", key = "a")]
    pub async fn echo(_: &Ctx, a: u32) -> Result<u32, E> { Ok(a) }

    pub struct Doubler;

    #[tool]
    impl Doubler {
        #[rustfmt::skip]
        #[tool(class = "read_only")]
        pub async fn double(&self, _ctx: &Ctx, a: u32) -> Result<u32, E> { Ok(a * 2) }
    }
}

/// Shape 5: Inner attributes at the top of the body apply to the function.
mod inner_attributes {
    use super::*;

    #[tool(class = "provider", key = "a")]
    pub async fn tolerant(_ctx: &Ctx, a: u32) -> Result<u32, E> {
        #![allow(unused_variables)]
        let unused = a;
        Ok(a)
    }
}

/// Shape 6: A parameter configured out exists nowhere in the wrapper.
mod cfg_params {
    use super::*;

    #[tool(class = "provider", key = "order_id", redact = "secret")]
    pub async fn configured(
        _ctx: &Ctx,
        order_id: u64,
        #[cfg(any())] debug_note: NotEvenAType,
        #[cfg(not(any()))] note: String,
        #[cfg(any())] secret: NotEvenAType,
    ) -> Result<String, E> {
        Ok(format!("{order_id}:{note}"))
    }
}

/// A read-only tool may return an `impl Trait`: nothing is stored.
mod impl_trait_result {
    use super::*;

    #[tool(class = "read_only")]
    pub async fn evens(_ctx: &Ctx, below: u32) -> Result<impl Iterator<Item = u32>, E> {
        Ok((0..below).filter(|n| n % 2 == 0))
    }
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("shapes");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let charged = from_macro_rules::charge(&ctx, 7).await.unwrap();
        assert!(charged.starts_with("7:charge-"), "{charged}");
        assert_eq!(from_macro_rules::open_ticket(&ctx, "abc".into()).await.unwrap(), 3);
        assert_eq!(
            verify_like_a_param::open(&ctx, "abcd".into()).await.unwrap(),
            4
        );
        let clash =
            wrapper_names::clash(&ctx, "k".into(), "r".into(), vec![1, 2], 9, 3, 4, 5).await;
        assert_eq!(clash.unwrap(), "k/r/2/9/3/4/5");
        assert_eq!(wrapper_names::clash_verify(&ctx, 1, 2).await.unwrap(), 3);
        assert_eq!(one_expression::double(&ctx, 21).await.unwrap(), 42);
        assert_eq!(one_expression::echo(&ctx, 5).await.unwrap(), 5);
        assert_eq!(one_expression::Doubler.double(&ctx, 4).await.unwrap(), 8);
        assert_eq!(inner_attributes::tolerant(&ctx, 6).await.unwrap(), 6);
        let configured = cfg_params::configured(&ctx, 8, "n".into()).await;
        assert_eq!(configured.unwrap(), "8:n");
        let evens: Vec<u32> = impl_trait_result::evens(&ctx, 7).await.unwrap().collect();
        assert_eq!(evens, [0, 2, 4, 6]);
    });
}
