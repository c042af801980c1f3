//! Golden vectors: the exact key strings for fixed inputs. Key derivation is
//! part of the contract with every provider that stored our keys and every
//! journal on disk; if one of these changes, every key ever issued changes.
//! Such a change must bump `KEY_VERSION` and these vectors together.
//!
//! These go through the runtime's key builder; tests/key_vectors.rs of the
//! `idem` crate pins the same derivation through `#[tool]` calls (what the
//! attribute feeds the builder). Both sets of literals were computed by an
//! independent implementation of the layout in the module docs of
//! src/key.rs, the `idem` crate's tests/key_vectors.py (Python 3, standard
//! library only). To check them again, from the workspace root:
//!
//! ```text
//! python3 tests/key_vectors.py
//! ```
//!
//! Its `keys.rs/N` lines are the vectors of `golden_vectors` in order, its
//! `bytes/...` lines those of `golden_canonical_bytes`.

use std::collections::{BTreeMap, BTreeSet};

use idem_runtime::__private;
use idem_runtime::{Class, Ctx, IdemKey, KeyPart, Runtime, ToolDescriptor, KEY_VERSION};
use tempfile::TempDir;

static SEND_EMAIL: ToolDescriptor = ToolDescriptor::new("send_email", Class::Journal);
static CHARGE: ToolDescriptor = ToolDescriptor::new("charge", Class::Provider);

fn with_ctx(f: impl FnOnce(&Runtime, Ctx)) {
    let dir = TempDir::new().unwrap();
    let rt = Runtime::open(dir.path()).unwrap();
    let ctx = rt.run("order-4711");
    f(&rt, ctx);
}

fn email_key(ctx: &Ctx, to: &str, template: &str, order: u64) -> IdemKey {
    __private::key(ctx, &SEND_EMAIL)
        .field(to)
        .field(template)
        .field(&order)
        .finish()
}

#[test]
fn golden_vectors() {
    assert_eq!(KEY_VERSION, 1);
    with_ctx(|_, ctx| {
        let cases: Vec<(IdemKey, &str)> = vec![
            (
                email_key(&ctx, "ada@example.com", "receipt", 4711),
                "send_email-c495dc1229273db8ae3425a4a7e11e65e0cdc48fbb16bc3c3e25a1548ea6c1a4-g0",
            ),
            (
                __private::key(&ctx, &CHARGE)
                    .field(&4711u64)
                    .field(&1999u32)
                    .finish(),
                "charge-a39ad6efd8993c709586fcad74956afbe36ca8430446371f8972c011ab04c995-g0",
            ),
            (
                email_key(
                    &ctx.scope("second-reminder"),
                    "ada@example.com",
                    "receipt",
                    4711,
                ),
                "send_email-f49924c804eaa18a49c977fb2abeb12a5b4542beb605bc3bc3dcddd8690578ce-g0",
            ),
            (
                __private::key(&ctx, &CHARGE).finish(),
                "charge-dc8fb3903350eef61cd1c31bfc5f7096224ac790e8821ffd7b32ecbb3607f2ff-g0",
            ),
            (
                __private::key(&ctx, &CHARGE)
                    .field(&Some(vec![("a", 1i64)]))
                    .field(&BTreeMap::from([("k", BTreeSet::from(['x', 'y']))]))
                    .field(&true)
                    .finish(),
                "charge-12bd1c9ca4922f3eae32214e33728f0605c8aa17eabcb1766912a2bfac970d4c-g0",
            ),
        ];
        for (i, (key, _)) in cases.iter().enumerate() {
            println!("GOLDEN {i} {key}");
        }
        for (i, (key, golden)) in cases.iter().enumerate() {
            assert_eq!(key.as_str(), *golden, "vector {i}");
        }
    });
}

#[test]
fn golden_canonical_bytes() {
    let bytes =
        |k: &dyn Fn() -> Vec<u8>| k().iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(bytes(&|| 4711u64.canonical_bytes()), "050000000000001267");
    assert_eq!(
        bytes(&|| "receipt".canonical_bytes()),
        "21000000000000000772656365697074"
    );
    assert_eq!(bytes(&|| Some(-1i8).canonical_bytes()), "300112ff");
}

#[test]
fn keys_depend_on_every_input_and_on_order() {
    with_ctx(|rt, ctx| {
        let base = email_key(&ctx, "ada@example.com", "receipt", 4711);
        assert_eq!(
            base,
            email_key(&ctx, "ada@example.com", "receipt", 4711),
            "stable"
        );
        // Each field matters, and so does their order.
        assert_ne!(base, email_key(&ctx, "bob@example.com", "receipt", 4711));
        assert_ne!(base, email_key(&ctx, "ada@example.com", "reminder", 4711));
        assert_ne!(base, email_key(&ctx, "ada@example.com", "receipt", 4712));
        let swapped = __private::key(&ctx, &SEND_EMAIL)
            .field("receipt")
            .field("ada@example.com")
            .field(&4711u64)
            .finish();
        assert_ne!(base, swapped, "field order is part of the key");
        // The root run, the scope and the tool name matter; a child does not.
        assert_ne!(
            base,
            email_key(&rt.run("order-4712"), "ada@example.com", "receipt", 4711)
        );
        assert_ne!(
            base,
            email_key(&ctx.scope("x"), "ada@example.com", "receipt", 4711)
        );
        assert_ne!(
            email_key(&ctx.scope("x").scope("y"), "a", "b", 1),
            email_key(&ctx.scope("x/y"), "a", "b", 1),
            "scope paths are length-prefixed, not joined"
        );
        assert_eq!(
            base,
            email_key(
                &ctx.child("sub").child("subsub"),
                "ada@example.com",
                "receipt",
                4711
            )
        );
        let other_tool = __private::key(&ctx, &CHARGE)
            .field("ada@example.com")
            .field("receipt")
            .field(&4711u64)
            .finish();
        assert_ne!(base.digest(), other_tool.digest());
        // Adding a trailing field is a different key, even an empty one.
        let extra = __private::key(&ctx, &SEND_EMAIL)
            .field("ada@example.com")
            .field("receipt")
            .field(&4711u64)
            .field("")
            .finish();
        assert_ne!(base, extra);
    });
}

#[test]
fn keys_never_exceed_255_characters() {
    with_ctx(|rt, _| {
        let long = "x".repeat(100_000);
        let ctx = rt.run(&long).scope(&long);
        let key = __private::key(&ctx, &SEND_EMAIL)
            .field(&long)
            .field(&vec![long.clone(); 10])
            .finish();
        assert!(key.as_str().len() <= 255, "{}", key.as_str().len());
        static LONG_NAME: ToolDescriptor = ToolDescriptor::new(
            "a_tool_name_that_goes_on_and_on_and_on_and_on_and_on_and_on_and_on_and_on_and_on_and_on_and_on",
            Class::Journal,
        );
        let key = __private::key(&ctx, &LONG_NAME).finish();
        assert!(key.as_str().len() <= 255);
        assert_eq!(IdemKey::parse(key.as_str()).unwrap(), key);
    });
}
