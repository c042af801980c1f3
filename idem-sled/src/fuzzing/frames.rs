//! Entry points for the fuzz targets in `fuzz/` (a cargo-fuzz project
//! outside the workspace) and for the regression tests that replay what
//! they found. Not an API: compiled only with the `fuzzing` feature (and in
//! this crate's own tests), hidden from the docs.
//!
//! Each target is one function taking the fuzzer's bytes. It panics when a
//! property fails (that is how libFuzzer learns of a bug) and otherwise
//! returns an [`Outcome`], so that tests can also check that the inputs of
//! the seed corpus actually reach the decoders instead of bouncing off a
//! checksum. The properties live here rather than in `fuzz/` so that
//! `cargo test --workspace`, which never builds libFuzzer, replays the
//! committed crash inputs through exactly the code the fuzzer ran.
//!
//! Checksums are not what is being tested, and a fuzzer cannot forge a
//! crc32 by mutation, so each target has modes in which the harness frames
//! the fuzzer's bytes with a correct checksum itself: what is behind the
//! checksum (bincode, the log's unit bodies) is exercised as if a damaged
//! record had collided with its crc, which is rare but not impossible.

use std::fmt::Debug;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::files::{Checkpoint, LogEnd, Meta, FORMAT, MAGIC};
use idem_journal::audit::{self as stored, AuditEvent, Draft};
use idem_journal::error::Error;
use idem_journal::journal::Owner;
use idem_journal::key::IdemKey;
use idem_journal::record::{self, Kind, OpRecord, State, StepRecord, StepState};

/// What an input did once every property held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The input decoded (and the properties of a decoded value held).
    Decoded,
    /// The decoder refused it with the kind of error the contract names.
    Rejected,
}

/// The frame kinds, in the order the selector byte of [`record()`] picks
/// them.
const KINDS: [Kind; 6] = [
    Kind::Op,
    Kind::Step,
    Kind::Event,
    Kind::Meta,
    Kind::Checkpoint,
    Kind::LogEnd,
];

/// Selector bit of [`record()`]: the harness writes the right kind byte and
/// checksum into the frame.
pub const FIX_FRAME: u8 = 0x80;

/// The record decoder (`record::decode`) for every kind of frame.
///
/// Input: `[selector][frame]`; `selector & 0x7f` picks the kind (modulo
/// 6: operation, step, audit event, journal metadata, checkpoint, log
/// end), and
/// [`FIX_FRAME`] makes the harness write the kind byte and the checksum.
///
/// Properties: no panic; a refusal is `Corrupt` or `RecordVersion`, never
/// another error; a decoded value encodes again and decodes to an equal
/// value; what operators are shown of a decoded record (escalation,
/// result as JSON, key text) is built without panicking, and key texts
/// rebuilt from stored parts parse back to the same key.
pub fn record(data: &[u8]) -> Outcome {
    let Some((&selector, frame)) = data.split_first() else {
        return Outcome::Rejected;
    };
    let kind = KINDS[usize::from(selector & 0x7f) % KINDS.len()];
    let mut frame = frame.to_vec();
    if selector & FIX_FRAME != 0 && frame.len() >= 6 {
        fix_frame(kind, &mut frame);
    }
    match kind {
        Kind::Op => op_frame(&frame),
        Kind::Step => frame_round_trip::<StepRecord>(kind, &frame, |s| {
            if let StepState::Done { value } = &s.state {
                let _ = idem_journal::codec::to_json(&value.0);
            }
        }),
        Kind::Event => event(&frame),
        Kind::Meta | Kind::Checkpoint | Kind::LogEnd => file_frame(kind, &frame),
    }
}

/// Writes `kind` and the checksum of the body into a frame.
fn fix_frame(kind: Kind, frame: &mut [u8]) {
    frame[0] = kind as u8;
    let crc = record::frame_checksum(frame[1], &frame[6..]);
    frame[2..6].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a frame as `T`; a decoded value must survive encode + decode.
pub(crate) fn frame_round_trip<T>(kind: Kind, frame: &[u8], views: impl FnOnce(&T)) -> Outcome
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    match record::decode::<T>(kind, frame, "fuzz", b"k") {
        Ok(value) => {
            views(&value);
            let again = record::encode(kind, &value).expect("a decoded value encodes again");
            let back: T = record::decode(kind, &again, "fuzz", b"k")
                .expect("a re-encoded value decodes again");
            assert_eq!(back, value, "decode(encode(v)) != v");
            Outcome::Decoded
        }
        Err(e) => refused(e),
    }
}

/// An operation record, through the decoder the runtime uses (this format
/// and the older ones): a decoded record re-encodes in this format and
/// decodes to an equal record.
fn op_frame(frame: &[u8]) -> Outcome {
    match OpRecord::decode(frame, "fuzz", b"k") {
        Ok(rec) => {
            op_views(&rec);
            let again = record::encode(Kind::Op, &rec).expect("a decoded record encodes again");
            let back =
                OpRecord::decode(&again, "fuzz", b"k").expect("a re-encoded record decodes again");
            assert_eq!(back, rec, "decode(encode(v)) != v");
            Outcome::Decoded
        }
        Err(e) => refused(e),
    }
}

/// The errors the record decoder may refuse a frame with.
fn refused(e: Error) -> Outcome {
    match e {
        Error::Corrupt { .. } | Error::RecordVersion { .. } => Outcome::Rejected,
        other => panic!("a bad frame must be Corrupt or RecordVersion, got: {other}"),
    }
}

/// What the runtime builds from a decoded operation record for operators.
fn op_views(rec: &OpRecord) {
    let digest = [0x5a; 32];
    key_text_round_trips(&IdemKey::from_parts(&rec.tool, digest, rec.generation));
    let esc = idem_journal::views::escalation_of(&digest, rec);
    let _ = serde_json::to_string(&esc);
    if let State::Committed { result, .. } = &rec.state {
        let _ = idem_journal::codec::to_json(&result.0);
    }
}

/// The worker an event's `worker#incarnation` names.
fn worker_of(name: &str) -> Owner {
    let (worker, hex) = name
        .rsplit_once('#')
        .unwrap_or_else(|| panic!("a decoded event's worker {name:?} has no incarnation"));
    let incarnation = u64::from_str_radix(hex, 16)
        .unwrap_or_else(|e| panic!("a decoded event's incarnation {hex:?} is not hex: {e}"));
    assert_eq!(hex.len(), 16, "incarnations are written in 16 hex digits");
    Owner {
        worker: worker.into(),
        incarnation,
    }
}

/// An audit event, decoded as the stream reader does, and written back as
/// the engine would write it.
fn event(frame: &[u8]) -> Outcome {
    let ev = match stored::decode("fuzz", 7, frame) {
        Ok(ev) => ev,
        Err(e) => return refused(e),
    };
    let _ = ev.to_json_line();
    let key = ev.key.as_deref().map(|text| {
        IdemKey::parse(text)
            .unwrap_or_else(|e| panic!("a key rebuilt from a stored event does not parse: {e}"))
    });
    if let Some(k) = &key {
        key_text_round_trips(k);
    }
    // An event of format 2 names no worker; the engine writes one into
    // every event now, so it comes back with the one written.
    let worker = match ev.worker.as_deref() {
        Some(name) => worker_of(name),
        None => Owner {
            worker: "fuzz".into(),
            incarnation: 1,
        },
    };
    let bytes = stored::encode(&Draft {
        at_ms: ev.at_ms,
        tool: &ev.tool,
        key: key.as_ref(),
        root_run: &ev.root_run,
        agent: &ev.agent,
        worker: &worker,
        kind: ev.kind.clone(),
    })
    .expect("a decoded event encodes again");
    let back = stored::decode("fuzz", 7, &bytes).expect("a re-encoded event decodes again");
    // The key's tool prefix is rebuilt from the stored tool name, so only
    // the key text may legitimately differ in form; it must not.
    let expected = AuditEvent {
        worker: Some(worker.to_string()),
        ..ev
    };
    assert_eq!(back, expected, "decode(encode(event)) != event");
    Outcome::Decoded
}

/// `IdemKey::parse` and everything built on it: `FromStr` and serde.
///
/// Input: `[mode][rest]`. Mode even: `rest` (lossily made UTF-8) is parsed
/// as a key's text. Mode odd: a key is built from parts, as the journal
/// rebuilds stored keys (`rest` = 32 digest bytes, 4 generation bytes,
/// then the tool name), and its text must parse back to it.
///
/// Properties: no panic; `parse`, `FromStr` and
/// serde agree; a parsed key prints as exactly the text it came from and
/// parses again to an equal key, under every generation.
pub fn key(data: &[u8]) -> Outcome {
    let Some((&mode, rest)) = data.split_first() else {
        return Outcome::Rejected;
    };
    if mode & 1 == 1 {
        let Some((digest, rest)) = rest.split_first_chunk::<32>() else {
            return Outcome::Rejected;
        };
        let Some((gen, tool)) = rest.split_first_chunk::<4>() else {
            return Outcome::Rejected;
        };
        let tool = String::from_utf8_lossy(tool);
        let key = IdemKey::from_parts(&tool, *digest, u32::from_le_bytes(*gen));
        key_text_round_trips(&key);
        return Outcome::Decoded;
    }
    let text = String::from_utf8_lossy(rest);
    let parsed = IdemKey::parse(&text);
    let from_str = text.parse::<IdemKey>();
    let json = serde_json::to_string(&*text).expect("a string serializes");
    let from_serde = serde_json::from_str::<IdemKey>(&json);
    match parsed {
        Ok(key) => {
            assert_eq!(key.as_str(), text, "a parsed key prints differently");
            assert_eq!(from_str.ok().as_ref(), Some(&key), "FromStr disagrees");
            assert_eq!(from_serde.ok().as_ref(), Some(&key), "serde disagrees");
            key_text_round_trips(&key);
            Outcome::Decoded
        }
        // A refusal is a `BadKey` by its type now.
        Err(_) => {
            assert!(from_str.is_err(), "FromStr accepts what parse refuses");
            assert!(from_serde.is_err(), "serde accepts what parse refuses");
            Outcome::Rejected
        }
    }
}

/// `parse(key.to_string()) == key`, for the key and for another generation.
fn key_text_round_trips(key: &IdemKey) {
    let text = key.to_string();
    assert!(text.len() <= 141, "key text of {} bytes", text.len());
    let back = IdemKey::parse(&text).unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
    assert_eq!(&back, key);
    assert_eq!(back.tool_prefix(), key.tool_prefix());
    let other = key.with_generation(key.generation().wrapping_add(1));
    let back =
        IdemKey::parse(other.as_str()).unwrap_or_else(|e| panic!("{other:?} does not parse: {e}"));
    assert_eq!(back, other);
    assert_eq!(back.digest(), key.digest());
}

pub(crate) fn record_seeds() -> Vec<(String, Vec<u8>)> {
    use idem_journal::audit::EventKind;
    use idem_journal::class::Class;
    use idem_journal::record::{
        ApprovalDecision, ApprovalInfo, Blob, EscalationInfo, ResolutionInfo, Via,
    };

    let op = |state: State| OpRecord {
        tool: "send_email".into(),
        class: Class::Journal,
        root_run: "order-1".into(),
        scope: vec!["billing".into(), "child".into()],
        generation: 1,
        state,
        attempts: 2,
        first_attempt_ms: 1_700_000_000_000,
        key_first_sent_ms: Some(1_700_000_000_100),
        updated_ms: 1_700_000_000_500,
        maybe_landed: true,
        fingerprint: [7; 32],
        args: r#"{"to":"a@example.com"}"#.into(),
        last_error: Some("timeout".into()),
        verify_answer: Some("not found".into()),
        escalation: Some(EscalationInfo {
            reason: "ambiguous".into(),
            at_ms: 5,
        }),
        resolution: Some(ResolutionInfo {
            kind: "landed".into(),
            note: "checked the ledger".into(),
            at_ms: 6,
            amendments: 1,
        }),
        approval: Some(ApprovalInfo {
            reason: "above 1000 EUR".into(),
            requested_ms: 3,
            generation: 1,
            fingerprint: [7; 32],
            decision: Some(ApprovalDecision {
                approved: true,
                note: "checked the invoice".into(),
                at_ms: 4,
                via: "inbox".into(),
            }),
        }),
    };
    let result = idem_journal::codec::encode(&serde_json::json!({"id": "msg_1", "n": [1, 2.5]}))
        .expect("a JSON value encodes");
    let mut frames = vec![
        (
            "op-committed",
            Kind::Op,
            record::encode(
                Kind::Op,
                &op(State::Committed {
                    result: Blob(result.clone()),
                    via: Via::Verify,
                }),
            ),
        ),
        (
            "op-intent",
            Kind::Op,
            record::encode(Kind::Op, &op(State::Intent)),
        ),
        (
            "op-failed",
            Kind::Op,
            record::encode(
                Kind::Op,
                &op(State::Failed {
                    error: "refused".into(),
                }),
            ),
        ),
        (
            "op-not-approved",
            Kind::Op,
            record::encode(
                Kind::Op,
                &op(State::NotApproved {
                    note: "not this vendor".into(),
                }),
            ),
        ),
        (
            "step-done",
            Kind::Step,
            record::encode(
                Kind::Step,
                &StepRecord {
                    name: "plan".into(),
                    root_run: "order-1".into(),
                    state: StepState::Done {
                        value: Blob(result),
                    },
                    at_ms: 9,
                },
            ),
        ),
    ];
    let key = IdemKey::from_parts("send_email", [3; 32], 2);
    for (name, kind) in [
        (
            "event-intent",
            EventKind::Intent {
                generation: 2,
                fingerprint: "ab".repeat(32),
            },
        ),
        ("event-attempt", EventKind::Attempt { attempt: 1 }),
    ] {
        frames.push((
            name,
            Kind::Event,
            stored::encode(&Draft {
                at_ms: 11,
                tool: "send_email",
                key: Some(&key),
                root_run: "order-1",
                agent: "order-1/child",
                worker: &Owner {
                    worker: "pod-7".into(),
                    incarnation: 0x5eed,
                },
                kind,
            }),
        ));
    }
    let mut out: Vec<(String, Vec<u8>)> = frames
        .into_iter()
        .map(|(name, kind, frame)| {
            let frame = frame.expect("a seed encodes");
            (name.to_string(), framed_input(kind, frame))
        })
        .collect();
    out.extend(file_seeds());
    out
}

/// The [`record()`] input for a frame of `kind`: its selector, then the
/// frame (checksums left as the encoder wrote them).
pub(crate) fn framed_input(kind: Kind, frame: Vec<u8>) -> Vec<u8> {
    let selector = KINDS
        .iter()
        .position(|k| *k == kind)
        .expect("every kind is selectable") as u8;
    let mut input = vec![selector];
    input.extend(frame);
    input
}

pub(crate) fn key_seeds() -> Vec<(String, Vec<u8>)> {
    let key = IdemKey::from_parts("send_email", [0xab; 32], 3);
    let mut text = vec![0];
    text.extend(key.as_str().as_bytes());
    let mut parts = vec![1];
    parts.extend([0x11; 32]);
    parts.extend(7u32.to_le_bytes());
    parts.extend("Send Email/v2".as_bytes());
    vec![("text".into(), text), ("parts".into(), parts)]
}

/// The journal's own files (`idem-meta`, `idem-checkpoint`), as frames of
/// the record decoder.
fn file_frame(kind: Kind, frame: &[u8]) -> Outcome {
    match kind {
        Kind::Meta => frame_round_trip::<Meta>(kind, frame, |_| {}),
        Kind::LogEnd => frame_round_trip::<LogEnd>(kind, frame, |_| {}),
        _ => frame_round_trip::<Checkpoint>(kind, frame, |c| {
            let _ = c.digest();
        }),
    }
}

fn file_seeds() -> Vec<(String, Vec<u8>)> {
    let meta = Meta {
        magic: MAGIC.into(),
        format: FORMAT,
        created_ms: 1_700_000_000_000,
    };
    let checkpoint = Checkpoint {
        gen: 3,
        xor: 0xdead_beef,
        count: 12,
        next_seq: 40,
        next_lsn: 77,
    };
    vec![
        (
            "meta".into(),
            framed_input(
                Kind::Meta,
                record::encode(Kind::Meta, &meta).expect("encodes"),
            ),
        ),
        (
            "checkpoint".into(),
            framed_input(
                Kind::Checkpoint,
                record::encode(Kind::Checkpoint, &checkpoint).expect("encodes"),
            ),
        ),
        (
            "log_end".into(),
            framed_input(
                Kind::LogEnd,
                record::encode(
                    Kind::LogEnd,
                    &LogEnd {
                        gen: 4,
                        next_lsn: 78,
                    },
                )
                .expect("encodes"),
            ),
        ),
    ]
}
