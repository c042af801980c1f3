//! `crate = "..."` for code that reaches idem through another path, e.g. a
//! framework re-exporting it. The framework here also replaces two of the
//! generated code's entry points with counting ones: the counts prove the
//! expansion goes through the path given, not through `::idem`.

use std::sync::atomic::{AtomicUsize, Ordering};

mod framework {
    pub mod rt {
        pub use ::idem::*;

        /// idem's, except for two counted entry points (a local item
        /// shadows the glob import).
        pub mod __private {
            pub use ::idem::__private::*;

            use crate::{CLASSIFY_CHECKS, KEYS};
            use std::sync::atomic::Ordering;

            pub fn key(ctx: &Ctx, tool: &'static ToolDescriptor) -> ::idem::KeyBuilder {
                KEYS.fetch_add(1, Ordering::SeqCst);
                ::idem::__private::key(ctx, tool)
            }

            #[allow(clippy::extra_unused_type_parameters)]
            pub fn assert_classify<E: ::idem::Classify + std::fmt::Debug>() {
                CLASSIFY_CHECKS.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

static KEYS: AtomicUsize = AtomicUsize::new(0);
static CLASSIFY_CHECKS: AtomicUsize = AtomicUsize::new(0);

use framework::rt::{Classify, Ctx, Failure};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[framework::rt::tool(class = "provider", key = "id", crate = "crate::framework::rt")]
async fn act(ctx: &Ctx, id: u64) -> Result<u64, E> {
    let _ = ctx;
    Ok(id)
}

#[framework::rt::tool(class = "read_only", crate = framework::rt)]
async fn look(ctx: &Ctx, id: u64) -> Result<u64, E> {
    let _ = ctx;
    Ok(id)
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let rt = framework::rt::Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("override");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert_eq!(act(&ctx, 1).await.unwrap(), 1);
        assert_eq!(look(&ctx, 2).await.unwrap(), 2);
    });
    assert_eq!(KEYS.load(Ordering::SeqCst), 1, "the provider tool's key");
    assert_eq!(CLASSIFY_CHECKS.load(Ordering::SeqCst), 2, "both tools");
}
