//! Idempotency keys: canonical encoding of key fields ([`KeyPart`]), key
//! derivation ([`IdemKey`]) and the full-argument fingerprint used to detect
//! drift.
//!
//! # Canonical encoding
//!
//! Every value is written as a one-byte type tag followed by a fixed-width or
//! length-prefixed payload, so two different values (or the same bytes read
//! as two different types) can never produce the same stream:
//!
//! | type | tag | payload |
//! |---|---|---|
//! | `bool` | `0x01` | one byte, 0 or 1 |
//! | `u8` `u16` `u32` `u64` `u128` | `0x02`..`0x06` | big-endian, fixed width |
//! | `usize` | `0x07` | as `u64`, big-endian (same on every platform) |
//! | `i8` `i16` `i32` `i64` `i128` | `0x12`..`0x16` | big-endian two's complement |
//! | `isize` | `0x17` | as `i64` |
//! | `char` | `0x20` | scalar value as `u32` |
//! | `str`, `String` | `0x21` | `u64` byte length, UTF-8 bytes |
//! | `Option<T>` | `0x30` | `0` for `None`; `1` then `T` |
//! | slices, arrays, `Vec`, `VecDeque` | `0x31` | `u64` count, elements |
//! | tuples, `()` | `0x32` | `u8` arity, elements |
//! | `BTreeMap` | `0x33` | `u64` count, key/value pairs in key order |
//! | `BTreeSet` | `0x34` | `u64` count, elements in order |
//! | named record ([`KeyEncoder::record`]) | `0x40` | name as `str`, `u8` field count |
//!
//! References, `Box`, `Rc`, `Arc` and `Cow` encode as what they point to, so
//! `&str` and `String` give the same key.
//!
//! # Key derivation
//!
//! An operation's digest is SHA-256 over the canonical encoding of, in
//! order: the domain tag `"idem.key"` (str), [`KEY_VERSION`] (`u16`), the
//! root run id (str), the scope path (a sequence of str), the tool name
//! (str), each key field in declared order, and the number of key fields
//! (`u32`). Child contexts add nothing: a subagent's keys are its root's.
//!
//! Changing any of this changes every key ever issued: the golden vectors in
//! `tests/keys.rs` pin it (and were checked against an independent
//! implementation of this paragraph).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use idem_journal::key::IdemKey;

/// Version of the key derivation. Part of every key.
pub const KEY_VERSION: u16 = 1;

/// A value that can be part of an idempotency key: it has one stable,
/// canonical byte encoding on every platform and every release.
///
/// Implemented for integers, `bool`, `char`, strings, `Option`, sequences,
/// tuples, `BTreeMap`/`BTreeSet`, and smart pointers to those. Deliberately
/// **not** implemented for floats (`NaN`, `-0.0` and formatting make equal
/// amounts encode differently), `HashMap`/`HashSet` (iteration order changes
/// between runs) and `SystemTime`/`Instant` (a key that changes with the
/// clock deduplicates nothing).
///
/// Implement it for your own types by delegating to their fields:
///
/// ```
/// use idem_runtime::{KeyEncoder, KeyPart};
///
/// struct OrderRef { shop: String, number: u64 }
///
/// impl KeyPart for OrderRef {
///     fn encode_key(&self, enc: &mut KeyEncoder) {
///         enc.record("OrderRef", 2);
///         self.shop.encode_key(enc);
///         self.number.encode_key(enc);
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key: it has no stable canonical encoding",
    label = "this key field's type does not implement `idem::KeyPart`",
    note = "keys must be identical on every attempt, after a restart and on every platform; floats (NaN, -0.0), HashMap/HashSet (random iteration order) and SystemTime/Instant (change every call) cannot guarantee that",
    note = "use integers (amounts in minor units), strings, BTreeMap/BTreeSet, or implement `idem::KeyPart` for your own type"
)]
pub trait KeyPart {
    /// Writes this value's canonical encoding.
    fn encode_key(&self, enc: &mut KeyEncoder);

    /// The canonical bytes of this value alone (for inspection and tests).
    fn canonical_bytes(&self) -> Vec<u8> {
        let mut enc = KeyEncoder::bytes();
        self.encode_key(&mut enc);
        enc.into_bytes()
    }
}

/// Receives the canonical encoding of key parts; see the module docs for the
/// format.
pub struct KeyEncoder {
    sink: Sink,
}

enum Sink {
    Hash(Sha256),
    Bytes(Vec<u8>),
}

impl KeyEncoder {
    fn hashing() -> Self {
        KeyEncoder {
            sink: Sink::Hash(Sha256::new()),
        }
    }

    fn bytes() -> Self {
        KeyEncoder {
            sink: Sink::Bytes(Vec::new()),
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        match self.sink {
            Sink::Bytes(b) => b,
            Sink::Hash(_) => unreachable!("a hashing encoder has no bytes"),
        }
    }

    fn digest(self) -> [u8; 32] {
        match self.sink {
            Sink::Hash(h) => h.finalize().into(),
            Sink::Bytes(b) => Sha256::digest(&b).into(),
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        match &mut self.sink {
            Sink::Hash(h) => h.update(bytes),
            Sink::Bytes(b) => b.extend_from_slice(bytes),
        }
    }

    fn tagged(&mut self, tag: u8, payload: &[u8]) {
        self.write(&[tag]);
        self.write(payload);
    }

    fn len(&mut self, n: usize) {
        self.write(&(n as u64).to_be_bytes());
    }

    /// Starts a string (tag, length, bytes).
    pub fn str(&mut self, s: &str) {
        self.write(&[0x21]);
        self.len(s.len());
        self.write(s.as_bytes());
    }

    /// Starts a sequence of `count` elements; write the elements next.
    pub fn seq(&mut self, count: usize) {
        self.write(&[0x31]);
        self.len(count);
    }

    /// Starts a named record of `fields` fields; write the fields next, in a
    /// fixed order. Use it for your own types so that two types with the same
    /// field values still encode differently.
    pub fn record(&mut self, name: &str, fields: u8) {
        self.write(&[0x40]);
        self.str(name);
        self.write(&[fields]);
    }

    fn tuple(&mut self, arity: u8) {
        self.write(&[0x32, arity]);
    }
}

macro_rules! key_part_int {
    ($($t:ty => $tag:expr, $as:ty;)*) => {$(
        impl KeyPart for $t {
            fn encode_key(&self, enc: &mut KeyEncoder) {
                enc.tagged($tag, &(*self as $as).to_be_bytes());
            }
        }
    )*};
}

key_part_int! {
    u8 => 0x02, u8;
    u16 => 0x03, u16;
    u32 => 0x04, u32;
    u64 => 0x05, u64;
    u128 => 0x06, u128;
    usize => 0x07, u64;
    i8 => 0x12, i8;
    i16 => 0x13, i16;
    i32 => 0x14, i32;
    i64 => 0x15, i64;
    i128 => 0x16, i128;
    isize => 0x17, i64;
}

impl KeyPart for bool {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.tagged(0x01, &[u8::from(*self)]);
    }
}

impl KeyPart for char {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.tagged(0x20, &u32::from(*self).to_be_bytes());
    }
}

impl KeyPart for str {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.str(self);
    }
}

impl KeyPart for String {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.str(self);
    }
}

impl<T: KeyPart> KeyPart for Option<T> {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        match self {
            None => enc.tagged(0x30, &[0]),
            Some(v) => {
                enc.tagged(0x30, &[1]);
                v.encode_key(enc);
            }
        }
    }
}

impl<T: KeyPart> KeyPart for [T] {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.seq(self.len());
        for v in self {
            v.encode_key(enc);
        }
    }
}

impl<T: KeyPart, const N: usize> KeyPart for [T; N] {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        self.as_slice().encode_key(enc);
    }
}

impl<T: KeyPart> KeyPart for Vec<T> {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        self.as_slice().encode_key(enc);
    }
}

impl<T: KeyPart> KeyPart for VecDeque<T> {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.seq(self.len());
        for v in self {
            v.encode_key(enc);
        }
    }
}

impl<K: KeyPart, V: KeyPart> KeyPart for BTreeMap<K, V> {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.tagged(0x33, &(self.len() as u64).to_be_bytes());
        for (k, v) in self {
            k.encode_key(enc);
            v.encode_key(enc);
        }
    }
}

impl<T: KeyPart> KeyPart for BTreeSet<T> {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.tagged(0x34, &(self.len() as u64).to_be_bytes());
        for v in self {
            v.encode_key(enc);
        }
    }
}

macro_rules! key_part_deref {
    ($($t:ty),*) => {$(
        impl<T: KeyPart + ?Sized> KeyPart for $t {
            fn encode_key(&self, enc: &mut KeyEncoder) {
                (**self).encode_key(enc);
            }
        }
    )*};
}

key_part_deref!(&T, &mut T, Box<T>, Rc<T>, Arc<T>);

impl<T: KeyPart + ToOwned + ?Sized> KeyPart for Cow<'_, T> {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        (**self).encode_key(enc);
    }
}

impl KeyPart for () {
    fn encode_key(&self, enc: &mut KeyEncoder) {
        enc.tuple(0);
    }
}

macro_rules! key_part_tuple {
    ($($n:expr => ($($name:ident),+);)*) => {$(
        impl<$($name: KeyPart),+> KeyPart for ($($name,)+) {
            #[allow(non_snake_case)]
            fn encode_key(&self, enc: &mut KeyEncoder) {
                enc.tuple($n);
                let ($($name,)+) = self;
                $($name.encode_key(enc);)+
            }
        }
    )*};
}

key_part_tuple! {
    1 => (A);
    2 => (A, B);
    3 => (A, B, C);
    4 => (A, B, C, D);
    5 => (A, B, C, D, E);
    6 => (A, B, C, D, E, F);
    7 => (A, B, C, D, E, F, G);
    8 => (A, B, C, D, E, F, G, H);
}

/// The part of a key that a context contributes: domain, version, root run
/// and scope path, already absorbed into a hash state so that each call only
/// hashes its tool name and fields.
#[derive(Clone)]
pub(crate) struct KeyPrefix {
    hasher: Sha256,
}

impl KeyPrefix {
    pub(crate) fn new(domain: &str, root: &str, scope: &[Arc<str>]) -> Self {
        let mut enc = KeyEncoder::hashing();
        enc.str(domain);
        KEY_VERSION.encode_key(&mut enc);
        enc.str(root);
        enc.seq(scope.len());
        for s in scope {
            enc.str(s);
        }
        match enc.sink {
            Sink::Hash(hasher) => KeyPrefix { hasher },
            Sink::Bytes(_) => unreachable!(),
        }
    }
}

/// Builds the key of one call: the context's prefix, the tool name, then the
/// key fields in declared order. Used by the code `#[tool]` generates.
pub struct KeyBuilder {
    enc: KeyEncoder,
    tool: &'static str,
    fields: u32,
}

impl KeyBuilder {
    pub(crate) fn new(prefix: &KeyPrefix, tool: &'static str) -> Self {
        let mut enc = KeyEncoder {
            sink: Sink::Hash(prefix.hasher.clone()),
        };
        enc.str(tool);
        KeyBuilder {
            enc,
            tool,
            fields: 0,
        }
    }

    /// Adds the next key field.
    pub fn field<K: KeyPart + ?Sized>(mut self, value: &K) -> Self {
        value.encode_key(&mut self.enc);
        self.fields += 1;
        self
    }

    /// The key, generation 0.
    pub fn finish(mut self) -> IdemKey {
        self.fields.encode_key(&mut self.enc);
        IdemKey::from_parts(self.tool, self.enc.digest(), 0)
    }
}

/// The arguments of one call as the journal records them: canonical JSON of
/// every non-redacted argument, and a SHA-256 fingerprint over them that
/// detects a later call with the same key but different arguments (drift).
#[derive(Debug, Clone, Default)]
pub struct Args {
    json: serde_json::Map<String, serde_json::Value>,
    /// Why the call needs a person's approval, if it does: not an
    /// argument (never recorded as one, never fingerprinted).
    approval: Option<String>,
}

/// Stand-in recorded for a redacted argument.
pub const REDACTED: &str = "<redacted>";

impl Args {
    /// No arguments yet.
    pub fn new() -> Self {
        Args::default()
    }

    /// Records an argument by its serde representation.
    pub fn serialized<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) {
        let v = serde_json::to_value(value)
            .unwrap_or_else(|e| serde_json::Value::String(format!("<unserializable: {e}>")));
        self.json.insert(name.to_string(), v);
    }

    /// Records an argument whose type cannot be serialized: only its type
    /// name appears in evidence, and it does not take part in drift
    /// detection.
    pub fn opaque(&mut self, name: &str, type_name: &str) {
        self.json.insert(
            name.to_string(),
            serde_json::Value::String(format!("<{type_name}>")),
        );
    }

    /// Records that an argument is redacted: never written, never
    /// fingerprinted.
    pub fn redacted(&mut self, name: &str) {
        self.json.insert(
            name.to_string(),
            serde_json::Value::String(REDACTED.to_string()),
        );
    }

    /// The recorded arguments, as canonical JSON (object keys sorted at
    /// every depth).
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(64);
        canonical_json(&self.json, &mut out);
        // Only valid UTF-8 is ever written.
        String::from_utf8(out).unwrap_or_default()
    }

    /// SHA-256 over the canonical JSON of the recorded arguments. Object
    /// keys are sorted explicitly (not left to serde_json's map type, which a
    /// feature elsewhere in the build can turn into insertion order), so a
    /// `HashMap` argument fingerprints the same on every call.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.canonical().1
    }

    /// The canonical JSON and its fingerprint, computing the JSON once.
    pub(crate) fn canonical(&self) -> (String, [u8; 32]) {
        let json = self.to_json();
        let mut h = Sha256::new();
        h.update(b"idem.args.v1");
        h.update(json.as_bytes());
        (json, h.finalize().into())
    }

    /// The argument map.
    pub fn as_map(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.json
    }

    /// Says that this call needs a person's approval before it runs, and
    /// why (`None`: it needs none). `#[tool(approve = ...)]` sets it from
    /// the tool's policy.
    pub fn needs_approval(&mut self, reason: Option<String>) {
        self.approval = reason;
    }

    /// Why the call needs approval, if it does.
    pub fn approval(&self) -> Option<&str> {
        self.approval.as_deref()
    }
}

fn canonical_json(map: &serde_json::Map<String, serde_json::Value>, out: &mut Vec<u8>) {
    canonical_object(map.iter(), out);
}

/// An object's entries with their keys in order. serde_json's map yields
/// them sorted unless its `preserve_order` feature is on somewhere in the
/// build: only then are they copied and sorted.
fn canonical_object<'a, I>(entries: I, out: &mut Vec<u8>)
where
    I: Iterator<Item = (&'a String, &'a serde_json::Value)> + Clone,
{
    if entries.clone().map(|(k, _)| k).is_sorted() {
        canonical_entries(entries, out);
    } else {
        let mut sorted: Vec<_> = entries.collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        canonical_entries(sorted.into_iter(), out);
    }
}

fn canonical_entries<'a>(
    entries: impl Iterator<Item = (&'a String, &'a serde_json::Value)>,
    out: &mut Vec<u8>,
) {
    out.push(b'{');
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing a string or a scalar into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, k);
        out.push(b':');
        canonical_value(v, out);
    }
    out.push(b'}');
}

fn canonical_value(v: &serde_json::Value, out: &mut Vec<u8>) {
    match v {
        serde_json::Value::Object(m) => canonical_json(m, out),
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_value(item, out);
            }
            out.push(b']');
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_journal::key::hex;

    fn bytes<K: KeyPart + ?Sized>(k: &K) -> String {
        hex(&k.canonical_bytes())
    }

    #[test]
    fn integers_are_tagged_big_endian_fixed_width() {
        assert_eq!(bytes(&1u8), "0201");
        assert_eq!(bytes(&1u16), "030001");
        assert_eq!(bytes(&0x0102_0304u32), "0401020304");
        assert_eq!(bytes(&1u64), "050000000000000001");
        assert_eq!(bytes(&1usize), "070000000000000001");
        assert_eq!(bytes(&-1i32), "14ffffffff");
        assert_eq!(bytes(&-2isize), "17fffffffffffffffe");
        assert_eq!(bytes(&1u128), format!("06{}01", "00".repeat(15)));
    }

    #[test]
    fn same_value_different_width_differs() {
        assert_ne!(bytes(&7u32), bytes(&7u64));
        assert_ne!(bytes(&7u64), bytes(&7i64));
    }

    #[test]
    fn strings_are_length_prefixed_and_refs_are_transparent() {
        assert_eq!(bytes("ab"), "2100000000000000026162");
        assert_eq!(bytes(&String::from("ab")), bytes("ab"));
        assert_eq!(bytes(&&"ab"), bytes("ab"));
        assert_eq!(bytes(&Box::<str>::from("ab")), bytes("ab"));
        assert_eq!(bytes(&Arc::<str>::from("ab")), bytes("ab"));
        assert_eq!(bytes(&Cow::Borrowed("ab")), bytes("ab"));
    }

    #[test]
    fn concatenation_is_unambiguous() {
        // ("ab", "c") and ("a", "bc") must differ: lengths are prefixed.
        assert_ne!(bytes(&("ab", "c")), bytes(&("a", "bc")));
        assert_ne!(bytes(&vec!["a", "b"]), bytes(&vec!["ab"]));
        assert_ne!(bytes(&Some(0u8)), bytes(&None::<u8>));
        assert_ne!(bytes(&Some(Some(1u8))), bytes(&Some(1u8)));
    }

    #[test]
    fn collections() {
        assert_eq!(bytes(&vec![1u8, 2]), "31000000000000000202010202");
        assert_eq!(bytes(&[1u8, 2]), bytes(&vec![1u8, 2]));
        assert_eq!(bytes(&[1u8, 2][..]), bytes(&vec![1u8, 2]));
        assert_eq!(bytes(&(1u8, true)), "320202010101");
        assert_eq!(bytes(&()), "3200");
        assert_eq!(bytes(&true), "0101");
        assert_eq!(bytes(&'A'), "2000000041");
        let mut m = BTreeMap::new();
        m.insert("b", 2u8);
        m.insert("a", 1u8);
        assert_eq!(
            bytes(&m),
            "330000000000000002\
             21000000000000000161\
             0201\
             21000000000000000162\
             0202"
        );
        let s: BTreeSet<u8> = [3, 1].into_iter().collect();
        assert_eq!(bytes(&s), "34000000000000000202010203");
        assert_eq!(bytes(&VecDeque::from(vec![1u8, 2])), bytes(&vec![1u8, 2]));
    }

    #[test]
    fn key_text_round_trips_and_is_bounded() {
        let prefix = KeyPrefix::new("idem.key", "run", &[]);
        let long = Box::leak("x".repeat(10_000).into_boxed_str());
        let key = KeyBuilder::new(&prefix, long)
            .field(&"y".repeat(100_000))
            .finish();
        assert!(key.as_str().len() <= 255);
        assert_eq!(key.as_str().len(), 64 + 1 + 64 + 3);
        assert_eq!(IdemKey::parse(key.as_str()).unwrap(), key);
        let g7 = key.with_generation(7);
        assert_eq!(IdemKey::parse(g7.as_str()).unwrap(), g7);
        assert_eq!(g7.digest(), key.digest());
        assert_eq!(g7.tool_prefix(), key.tool_prefix());
        assert!(IdemKey::parse("nope").is_err());
        assert!(IdemKey::parse(&key.as_str().replace("-g0", "-g00")).is_err());
        assert!(IdemKey::parse(&key.as_str().to_uppercase()).is_err());
    }

    #[test]
    fn non_ascii_text_is_refused_not_a_panic() {
        // Found by the `key` fuzz target (fuzz/regressions/key/): a digest
        // of 64 bytes holding a multi-byte character was sliced inside it.
        let zeros = "0".repeat(61);
        for text in [
            format!("tool-0\u{e9}{zeros}-g0"),
            format!("tool-{}0-g1", "\u{20ac}".repeat(21)),
            format!("t\u{e9}-{}-g0", "0".repeat(64)),
            format!("tool-{}-g\u{665}", "0".repeat(64)),
            "\u{e9}-g0".to_string(),
        ] {
            let err = IdemKey::parse(&text).expect_err(&text);
            assert!(
                matches!(err, idem_journal::key::BadKey { .. }),
                "{text}: {err}"
            );
            assert!(text.parse::<IdemKey>().is_err());
            let json = serde_json::to_string(&text).unwrap();
            assert!(serde_json::from_str::<IdemKey>(&json).is_err());
        }
    }

    #[test]
    fn odd_tool_names_are_sanitized() {
        let prefix = KeyPrefix::new("idem.key", "run", &[]);
        let key = KeyBuilder::new(&prefix, "Send Email/v2").finish();
        assert!(key.as_str().starts_with("send_email_v2-"));
        let key = KeyBuilder::new(&prefix, "").finish();
        assert!(key.as_str().starts_with("tool-"));
        assert_eq!(IdemKey::parse(key.as_str()).unwrap(), key);
    }

    #[test]
    fn an_object_whose_entries_come_unsorted_is_written_sorted() {
        // What serde_json's map yields with `preserve_order` on: insertion
        // order. The canonical JSON must not depend on it.
        let (a, b, z) = ("a".to_string(), "b".to_string(), "z".to_string());
        let (one, two) = (serde_json::json!(1), serde_json::json!({"y": 2, "x": [3]}));
        let unsorted = [(&z, &one), (&a, &two), (&b, &one)];
        let mut out = Vec::new();
        canonical_object(unsorted.iter().copied(), &mut out);
        let sorted = [(&a, &two), (&b, &one), (&z, &one)];
        let mut expected = Vec::new();
        canonical_object(sorted.iter().copied(), &mut expected);
        let expected = String::from_utf8(expected).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), expected);
        assert_eq!(expected, r#"{"a":{"x":[3],"y":2},"b":1,"z":1}"#);
    }

    #[test]
    fn fingerprint_ignores_map_order_and_redacted_values() {
        use std::collections::HashMap;
        let mut a = HashMap::new();
        let mut b = HashMap::new();
        for i in 0..50u32 {
            a.insert(i.to_string(), i);
        }
        for i in (0..50u32).rev() {
            b.insert(i.to_string(), i);
        }
        let mut x = Args::new();
        x.serialized("m", &a);
        x.redacted("card");
        let mut y = Args::new();
        y.redacted("card");
        y.serialized("m", &b);
        assert_eq!(x.fingerprint(), y.fingerprint());
        let mut z = Args::new();
        z.serialized("m", &a);
        z.serialized("card", "4242");
        assert_ne!(x.fingerprint(), z.fingerprint());
        assert!(!x.to_json().contains("4242"));
    }
}
