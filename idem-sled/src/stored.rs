//! The bytes the sled journal keeps per record: a small header (version,
//! epoch, claim, escalation flag) in front of the engine's record.
//!
//! `[version: u64 LE][epoch: u64 LE][flags: u8]`, then, if claimed,
//! `[incarnation: u64 LE][worker length: u16 LE][worker]`, then the body.

use std::sync::Arc;

use idem_journal::journal::{Claim, Loaded, Owner};

const CLAIMED: u8 = 1;
const ESCALATED: u8 = 2;

/// A record's header, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header {
    pub version: u64,
    pub epoch: u64,
    pub owner: Option<Owner>,
    pub escalated: bool,
}

#[cfg(any(test, feature = "fuzzing"))]
pub(super) fn encode(h: &Header, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&h.view(), body, &mut out);
    out
}

/// Appends a record's stored bytes to `out`: the header `h`, then `body`.
pub(super) fn encode_into(h: &View<'_>, body: &[u8], out: &mut Vec<u8>) {
    let worker = h.owner.map_or(&[][..], |(_, w)| w.as_bytes());
    out.reserve(17 + 10 + worker.len() + body.len());
    out.extend_from_slice(&h.version.to_le_bytes());
    out.extend_from_slice(&h.epoch.to_le_bytes());
    let mut flags = 0;
    if h.owner.is_some() {
        flags |= CLAIMED;
    }
    if h.escalated {
        flags |= ESCALATED;
    }
    out.push(flags);
    if let Some((incarnation, _)) = h.owner {
        out.extend_from_slice(&incarnation.to_le_bytes());
        out.extend_from_slice(&(worker.len() as u16).to_le_bytes());
        out.extend_from_slice(worker);
    }
    out.extend_from_slice(body);
}

/// A record's header read in place: what [`decode`] gives, with the
/// owner's worker name borrowed from the bytes instead of copied (the
/// write path needs no owned copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct View<'a> {
    pub version: u64,
    pub epoch: u64,
    /// The claim's owner: its incarnation and worker name.
    pub owner: Option<(u64, &'a str)>,
    pub escalated: bool,
}

#[cfg(any(test, feature = "fuzzing"))]
impl Header {
    /// This header, borrowed.
    pub(super) fn view(&self) -> View<'_> {
        View {
            version: self.version,
            epoch: self.epoch,
            owner: self.owner.as_ref().map(|o| (o.incarnation, &*o.worker)),
            escalated: self.escalated,
        }
    }
}

impl View<'_> {
    /// Whether the record can still change (claimed or escalated): it
    /// stays in sled rather than going to a table.
    pub(super) fn unsettled(&self) -> bool {
        self.owner.is_some() || self.escalated
    }

    /// The header with its own copy of the owner.
    pub(super) fn to_header(self) -> Header {
        Header {
            version: self.version,
            epoch: self.epoch,
            owner: self.owner.map(|(incarnation, worker)| Owner {
                worker: Arc::from(worker),
                incarnation,
            }),
            escalated: self.escalated,
        }
    }
}

/// Splits stored bytes into header and body.
pub(super) fn decode(bytes: &[u8]) -> Result<(Header, &[u8]), String> {
    let (view, body) = parse(bytes)?;
    Ok((view.to_header(), body))
}

/// Splits stored bytes into a borrowed header and the body; the same
/// checks as [`decode`], no allocation but for an error's text.
pub(super) fn parse(bytes: &[u8]) -> Result<(View<'_>, &[u8]), String> {
    let short = || format!("{} bytes is too short for a record header", bytes.len());
    let head = bytes.get(..17).ok_or_else(short)?;
    let version = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
    let epoch = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
    let flags = head[16];
    if flags & !(CLAIMED | ESCALATED) != 0 {
        return Err(format!("unknown record header flags {flags:#04x}"));
    }
    let mut rest = &bytes[17..];
    let owner = if flags & CLAIMED != 0 {
        let fixed = rest.get(..10).ok_or_else(short)?;
        let incarnation = u64::from_le_bytes(fixed[..8].try_into().unwrap_or_default());
        let len = u16::from_le_bytes(fixed[8..10].try_into().unwrap_or_default()) as usize;
        let worker = rest.get(10..10 + len).ok_or_else(short)?;
        let worker = std::str::from_utf8(worker).map_err(|e| format!("owner is not UTF-8: {e}"))?;
        rest = &rest[10 + len..];
        Some((incarnation, worker))
    } else {
        None
    };
    Ok((
        View {
            version,
            epoch,
            owner,
            escalated: flags & ESCALATED != 0,
        },
        rest,
    ))
}

/// The record as the trait hands it out. Claims in the sled journal are
/// never live: one process owns the journal, and the runtime's `Local`
/// table lists every driver.
pub(super) fn loaded(h: Header, body: &[u8]) -> Loaded {
    Loaded {
        version: h.version,
        epoch: h.epoch,
        body: body.to_vec(),
        claim: h.owner.map(|owner| Claim { owner, live: false }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claimed record's header.
    fn claimed(
        version: u64,
        epoch: u64,
        worker: &str,
        incarnation: u64,
        escalated: bool,
    ) -> Header {
        Header {
            version,
            epoch,
            owner: Some(Owner {
                worker: Arc::from(worker),
                incarnation,
            }),
            escalated,
        }
    }

    #[test]
    fn headers_round_trip_and_damage_is_an_error() {
        let h = claimed(9, 3, "pod-7", 42, true);
        let bytes = encode(&h, b"body");
        let (back, body) = decode(&bytes).unwrap();
        assert_eq!((back, body), (h.clone(), &b"body"[..]));
        let plain = Header {
            owner: None,
            escalated: false,
            ..h
        };
        assert_eq!(decode(&encode(&plain, b"")).unwrap().0, plain);
        for cut in 0..17 + 10 + 5 {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[16] = 0x80;
        assert!(decode(&bad).is_err());
    }

    #[test]
    fn a_header_read_in_place_is_the_decoded_header_and_encodes_after_other_bytes() {
        let h = claimed(7, 2, "worker-b", 5, false);
        let bytes = encode(&h, b"the record");
        let (view, body) = parse(&bytes).unwrap();
        assert_eq!(view, h.view());
        assert_eq!(view.owner, Some((5, "worker-b")));
        assert_eq!((view.to_header(), body), (h.clone(), &b"the record"[..]));
        // Encoding appends: what the buffer held before stays in front.
        let mut out = b"kept".to_vec();
        encode_into(&view, body, &mut out);
        assert_eq!((&out[..4], &out[4..]), (&b"kept"[..], &bytes[..]));
        // The same refusals as `decode`.
        for cut in 0..17 + 10 + 8 {
            assert!(parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[16] = 0x04;
        assert!(parse(&bad).is_err());
        let mut not_utf8 = bytes.clone();
        not_utf8[17 + 10] = 0xff;
        assert!(parse(&not_utf8).is_err());
    }
}
