//! The one write path of calls, steps and operator resolutions: a record,
//! the audit events that record its change and its escalation-index
//! membership, written as one unit; then the events' sequence numbers are
//! published to subscribers and `tracing`. A crash cannot keep the state
//! and lose its event (the stream would miss a commit), or keep the event
//! and lose the state.

use idem_journal::audit::{self as stored, Draft};
use idem_journal::error::Error;
use idem_journal::journal::{
    ClaimChange, Claimed, Digest, Durability, Expect, Loaded, NewEvent, Space, Write, Written,
};

use crate::shared::Shared;

/// One unit to write.
pub(crate) struct Unit<'a> {
    pub space: Space,
    pub key: &'a Digest,
    pub expect: Expect,
    pub body: &'a [u8],
    pub claim: ClaimChange<'a>,
    pub escalated: bool,
    pub durability: Durability,
    /// Written as a claim of a key never read (`Journal::claim`).
    pub unread: bool,
}

/// What a unit's write did.
pub(crate) enum Wrote {
    /// It happened: the record's new version and epoch.
    Done { version: u64, epoch: u64 },
    /// Its condition failed; a claim returns the record it found.
    Conflict(Option<Loaded>),
}

/// Writes `unit` with `drafts` (events about the record `unit.key` when
/// `keyed`), and publishes the events once written.
pub(crate) async fn write(
    shared: &Shared,
    unit: Unit<'_>,
    drafts: Vec<Draft<'_>>,
    keyed: bool,
) -> Result<Wrote, Error> {
    let encoded = drafts
        .iter()
        .map(stored::encode)
        .collect::<Result<Vec<_>, _>>()?;
    let events: Vec<NewEvent<'_>> = encoded
        .iter()
        .map(|bytes| NewEvent {
            key: keyed.then_some(unit.key),
            bytes,
        })
        .collect();
    let write = Write {
        space: unit.space,
        key: unit.key,
        expect: unit.expect,
        body: unit.body,
        claim: unit.claim,
        escalated: unit.escalated,
        events: &events,
        durability: unit.durability,
    };
    let journal = &*shared.journal;
    let timed = shared.audit.metrics.commit(unit.durability);
    let (version, epoch, seqs) = if unit.unread {
        match journal.claim(write).await? {
            Claimed::Done {
                version,
                epoch,
                seqs,
            } => (version, epoch, seqs),
            Claimed::Exists(found) => return Ok(Wrote::Conflict(found)),
        }
    } else {
        match journal.write(write).await? {
            Written::Done {
                version,
                epoch,
                seqs,
            } => (version, epoch, seqs),
            Written::Conflict => return Ok(Wrote::Conflict(None)),
        }
    };
    drop(timed);
    for (seq, draft) in seqs.into_iter().zip(drafts) {
        shared.audit.publish(seq, draft);
    }
    Ok(Wrote::Done { version, epoch })
}
