//! How a server proves that it holds the token before a client sends it.
//!
//! A worker killed with SIGKILL leaves its address file behind, and any
//! local user may bind the port it freed. A client that sent
//! `Authorization: Bearer TOKEN` to whatever answers there would hand the
//! token to that impostor. So a client first sends a random challenge to
//! `GET /healthz?challenge=HEX` (no token), and the server answers
//! `{"status":"ok","proof":HEX}`: an HMAC-SHA256, keyed by the token, of
//! the challenge and of what the server is (the address it is bound to and
//! the id of this start, both written in the address file). Only a server
//! that holds the token can answer; one that relays the challenge to the
//! real server on another port gets a proof of that other address, which
//! the client refuses. The client sends the token only after the proof
//! matched.
//!
//! A client that reaches the server through a tunnel (`idem --url`) does
//! not know the address the server is bound to; it asks for a proof bound
//! to nothing but the challenge ([`Binding::Any`]). Such a proof can be
//! relayed, which is why `--journal` never accepts one: the two kinds are
//! different messages under the same key.

use std::net::SocketAddr;

use sha2::{Digest, Sha256};

/// The query parameter of `GET /healthz` that carries the challenge.
pub const CHALLENGE_PARAM: &str = "challenge";
/// The query parameter (`bind=any`) that asks for a proof of the challenge
/// alone (see [`Binding::Any`]).
pub const BIND_PARAM: &str = "bind";
/// The challenge's length in bytes (sent as twice as many hex digits).
pub const CHALLENGE_BYTES: usize = 32;

/// What a proof is bound to besides the challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding<'a> {
    /// The server's bound address and the id of this start of it, as the
    /// address file gives them: what `idem --journal` asks for.
    Server {
        /// The address the server is bound to.
        addr: SocketAddr,
        /// The id of this start of the server.
        instance: &'a str,
    },
    /// Nothing: what a client asks for that reaches the server through an
    /// address the server does not know (a tunnel).
    Any,
}

/// A fresh random challenge, as hex.
pub fn challenge() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; CHALLENGE_BYTES];
    getrandom::fill(&mut bytes)?;
    Ok(idem_journal::key::hex(&bytes))
}

/// Whether `text` is a well-formed challenge: exactly
/// [`CHALLENGE_BYTES`] bytes as lowercase hex (a server refuses anything
/// else, so that it never signs text of someone else's choosing).
pub fn is_challenge(text: &str) -> bool {
    text.len() == 2 * CHALLENGE_BYTES
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The proof of `challenge` under `token`, bound to `binding`, as hex.
pub fn prove(token: &str, challenge: &str, binding: Binding<'_>) -> String {
    let mut message = Vec::with_capacity(128);
    message.extend_from_slice(b"idem-admin-proof/1\n");
    match binding {
        Binding::Server { addr, instance } => {
            message.extend_from_slice(b"server\n");
            message.extend_from_slice(addr.to_string().as_bytes());
            message.push(b'\n');
            message.extend_from_slice(instance.as_bytes());
        }
        Binding::Any => message.extend_from_slice(b"any"),
    }
    message.push(b'\n');
    message.extend_from_slice(challenge.as_bytes());
    idem_journal::key::hex(&hmac_sha256(token.as_bytes(), &message))
}

/// Whether `presented` is the proof of `challenge` under `token` bound to
/// `binding`, compared in time that does not depend on where they differ.
pub fn verify(token: &str, challenge: &str, binding: Binding<'_>, presented: &str) -> bool {
    let expected = prove(token, challenge, binding);
    if presented.len() != expected.len() {
        return false;
    }
    let diff = presented
        .bytes()
        .zip(expected.bytes())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(diff) == 0
}

/// HMAC (RFC 2104) over SHA-256.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| -> [u8; BLOCK] { std::array::from_fn(|i| block[i] ^ byte) };
    let inner: [u8; 32] = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize()
        .into();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 (a short key) and 6 (a key longer than a block).
        assert_eq!(
            idem_journal::key::hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            idem_journal::key::hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn a_proof_holds_only_for_its_token_challenge_and_binding() {
        let addr: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let other: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        let c = challenge().unwrap();
        assert!(is_challenge(&c));
        let here = Binding::Server {
            addr,
            instance: "i1",
        };
        let proof = prove("token-0123456789abcdef", &c, here);
        assert!(verify("token-0123456789abcdef", &c, here, &proof));
        assert!(!verify("token-0123456789abcdeF", &c, here, &proof));
        assert!(!verify(
            "token-0123456789abcdef",
            &challenge().unwrap(),
            here,
            &proof
        ));
        for binding in [
            Binding::Server {
                addr: other,
                instance: "i1",
            },
            Binding::Server {
                addr,
                instance: "i2",
            },
            Binding::Any,
        ] {
            assert!(
                !verify("token-0123456789abcdef", &c, binding, &proof),
                "{binding:?}"
            );
        }
        assert!(!verify("token-0123456789abcdef", &c, here, ""));
    }

    #[test]
    fn only_well_formed_challenges_are_signed() {
        assert!(!is_challenge(""));
        assert!(!is_challenge(&"a".repeat(63)));
        assert!(!is_challenge(&"A".repeat(64)));
        assert!(!is_challenge(&"g".repeat(64)));
        assert!(is_challenge(&"0f".repeat(32)));
    }
}
