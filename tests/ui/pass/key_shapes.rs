//! Key fields of every everyday shape: references, `Vec`, `Option`,
//! tuples, arrays, `BTreeMap`, field paths (named and tuple index), smart
//! pointers, and a user type implementing `KeyPart`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use idem::{tool, Classify, Ctx, Failure, KeyEncoder, KeyPart};

#[derive(Debug)]
struct E;
impl Classify for E {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[derive(Clone)]
struct Customer {
    id: u64,
    address: Address,
}

#[derive(Clone)]
struct Address {
    country: String,
}

#[derive(Clone)]
struct Sku(String);

impl KeyPart for Sku {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.record("Sku", 1);
        self.0.encode_key(enc);
    }
}

#[tool(
    class = "provider",
    key = "to, lines, coupon, pair, pair.0, customer.id, customer.address.country, skus, tags, sku, shared, set, bytes"
)]
#[allow(clippy::too_many_arguments)]
async fn order(
    ctx: &Ctx,
    to: &str,
    lines: Vec<(String, u32)>,
    coupon: Option<String>,
    pair: (u8, char),
    customer: Customer,
    skus: [u16; 3],
    tags: BTreeMap<String, bool>,
    sku: Sku,
    shared: Arc<str>,
    set: BTreeSet<i64>,
    bytes: &[u8],
) -> Result<(), E> {
    let _ = (
        ctx,
        to,
        lines,
        coupon,
        pair,
        customer.id,
        skus,
        tags,
        sku.0,
        shared,
        set,
        bytes,
    );
    Ok(())
}

fn main() {}
