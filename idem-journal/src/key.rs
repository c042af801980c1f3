//! An operation's key as text ([`IdemKey`]): what a provider sees, what
//! escalations, audit events and errors name. How a key is derived from a
//! tool's fields is the runtime's; this is the part storage and operators
//! need.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

/// Longest tool-name prefix kept in a key's text.
const NAME_PREFIX_MAX: usize = 64;

/// The idempotency key of one logical operation.
///
/// Derived once, before the first attempt, from the root run, the scope path,
/// the tool name and the declared key fields; identical on every attempt and
/// after a restart. Its text (what [`IdemKey::as_str`] returns and what a
/// provider sees) is `"{tool}-{sha256 hex}-g{generation}"`, at most 141
/// characters whatever the inputs (Stripe accepts 255). The generation
/// changes only after the provider rejected the operation, so a provider
/// that cached the rejection sees a fresh key for the next decision.
///
/// One reference-counted pointer: cloning it, and carrying it in errors,
/// is cheap.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdemKey(Arc<Parts>);

#[derive(PartialEq, Eq, Hash)]
struct Parts {
    digest: [u8; 32],
    generation: u32,
    text: Box<str>,
}

/// A text that is not an idem key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an idem key: {key:?}: {reason}")]
pub struct BadKey {
    /// The text (its first 300 characters).
    pub key: String,
    /// Why it is not a key.
    pub reason: String,
}

impl IdemKey {
    fn new(tool: &str, digest: [u8; 32], generation: u32) -> Self {
        // Built at its final size: the text is ASCII whatever the tool's
        // name (anything else becomes `_`), so its length is known first.
        let prefix = tool.chars().take(NAME_PREFIX_MAX).count();
        let prefix = if prefix == 0 { 4 } else { prefix };
        let mut generation_digits = [0u8; 10];
        let generation_digits = decimal(generation, &mut generation_digits);
        let mut text = String::with_capacity(prefix + 1 + 64 + 2 + generation_digits.len());
        for c in tool.chars().take(NAME_PREFIX_MAX) {
            text.push(if c.is_ascii_alphanumeric() || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '_'
            });
        }
        if text.is_empty() {
            text.push_str("tool");
        }
        text.push('-');
        push_hex(&mut text, &digest);
        text.push_str("-g");
        text.push_str(generation_digits);
        IdemKey(Arc::new(Parts {
            digest,
            generation,
            text: text.into_boxed_str(),
        }))
    }

    /// The key as the provider sees it (e.g. Stripe's `Idempotency-Key`).
    pub fn as_str(&self) -> &str {
        &self.0.text
    }

    /// The generation: 0 until the provider rejects the operation, then one
    /// more for each new decision.
    pub fn generation(&self) -> u32 {
        self.0.generation
    }

    /// The SHA-256 digest that identifies the operation in the journal
    /// (the same for every generation).
    pub fn digest(&self) -> &[u8; 32] {
        &self.0.digest
    }

    /// The tool-name prefix of the key's text.
    pub fn tool_prefix(&self) -> &str {
        let end = self.0.text.len() - 64 - 3 - digits(self.0.generation);
        &self.0.text[..end]
    }

    /// A key from its parts: a tool's name, the digest of its key fields
    /// and a generation (as a record stores them).
    #[doc(hidden)]
    pub fn from_parts(tool: &str, digest: [u8; 32], generation: u32) -> IdemKey {
        IdemKey::new(tool, digest, generation)
    }

    /// The same operation under another generation.
    #[doc(hidden)]
    pub fn with_generation(&self, generation: u32) -> IdemKey {
        if generation == self.0.generation {
            return self.clone();
        }
        IdemKey::new(self.tool_prefix(), self.0.digest, generation)
    }

    /// Parses a key's text (as shown in escalations, audit events and
    /// provider logs).
    pub fn parse(text: &str) -> Result<IdemKey, BadKey> {
        let bad = |why: &str| BadKey {
            key: text.chars().take(300).collect(),
            reason: why.to_string(),
        };
        let (rest, gen) = text
            .rsplit_once("-g")
            .ok_or_else(|| bad("no `-g<generation>` suffix"))?;
        let generation: u32 = gen
            .parse()
            .map_err(|_| bad("the generation is not a number"))?;
        if generation.to_string() != gen {
            return Err(bad("the generation is not in canonical form"));
        }
        let (tool, hex) = rest
            .rsplit_once('-')
            .ok_or_else(|| bad("no `-<digest>` part"))?;
        // ASCII first: the digest is sliced two bytes at a time below, and
        // a multi-byte character there would be cut in half (a panic).
        if hex.len() != 64 || !hex.is_ascii() || tool.is_empty() {
            return Err(bad("the digest is not 64 hex digits"));
        }
        let mut digest = [0u8; 32];
        for (i, byte) in digest.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| bad("the digest is not 64 hex digits"))?;
        }
        let key = IdemKey::new(tool, digest, generation);
        if key.as_str() != text {
            return Err(bad("not in canonical form (lowercase hex and tool prefix)"));
        }
        Ok(key)
    }
}

fn digits(mut n: u32) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// Appends `bytes` as lowercase hex.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // A block of digits at a time, not a `push` per digit.
    let mut block = [0u8; 128];
    for chunk in bytes.chunks(block.len() / 2) {
        for (pair, b) in block.chunks_exact_mut(2).zip(chunk) {
            pair[0] = HEX[(b >> 4) as usize];
            pair[1] = HEX[(b & 15) as usize];
        }
        let digits = &block[..chunk.len() * 2];
        out.push_str(std::str::from_utf8(digits).expect("hex digits are ASCII"));
    }
}

/// `n` in decimal, written into `buf`.
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[at..]).expect("decimal digits are ASCII")
}

/// `bytes` as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

impl fmt::Display for IdemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for IdemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdemKey({})", self.as_str())
    }
}

impl AsRef<str> for IdemKey {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::str::FromStr for IdemKey {
    type Err = BadKey;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IdemKey::parse(s)
    }
}

impl Serialize for IdemKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for IdemKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        IdemKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_pointer() {
        assert_eq!(std::mem::size_of::<IdemKey>(), std::mem::size_of::<usize>());
    }

    /// The text, as the type's documentation says it is made, for names
    /// of every kind and generations of every width.
    #[test]
    fn text_is_name_digest_and_generation() {
        let digest: [u8; 32] = std::array::from_fn(|i| (i * 37 + 5) as u8);
        let hex_digest: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let long = "x".repeat(70);
        for (tool, prefix) in [
            ("charge", "charge"),
            ("Send Email", "send_email"),
            ("", "tool"),
            ("zahlung-über", "zahlung__ber"),
            ("日本", "__"),
            (&long[..], &long[..64]),
        ] {
            for generation in [0, 7, 10, 99, 100, 65_536, u32::MAX] {
                let key = IdemKey::from_parts(tool, digest, generation);
                assert_eq!(
                    key.as_str(),
                    format!("{prefix}-{hex_digest}-g{generation}"),
                    "{tool:?} {generation}"
                );
                assert_eq!(key.tool_prefix(), prefix);
                assert_eq!(IdemKey::parse(key.as_str()).unwrap(), key);
            }
        }
        let bytes: Vec<u8> = (0..=255).collect();
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&bytes), expected);
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn text_round_trips_and_names_its_parts() {
        let key = IdemKey::from_parts("Send Email", [0xab; 32], 12);
        assert_eq!(key.tool_prefix(), "send_email");
        assert_eq!(key.generation(), 12);
        assert_eq!(IdemKey::parse(key.as_str()).unwrap(), key);
        assert_eq!(key.with_generation(3).generation(), 3);
        assert_eq!(key.with_generation(3).digest(), key.digest());
        let err = IdemKey::parse("send_email-xyz-g0").unwrap_err();
        assert_eq!(err.reason, "the digest is not 64 hex digits");
    }
}
