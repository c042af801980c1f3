//! The audit stream in PostgreSQL: one commit-ordered sequence across every
//! worker, holding only durable events.
//!
//! **Commit order.** A sequence number drawn from a database sequence is
//! not enough: transaction A draws 5, B draws 6 and commits first, a reader
//! sees 6, then A commits 5 — behind the reader's position, skipped
//! forever. So the number is derived from the inserting transaction's id
//! instead: `seq = xid << 16 | index`, and a reader only hands out events
//! below `pg_snapshot_xmin(pg_current_snapshot()) << 16`, the oldest
//! transaction still running at its snapshot. Every transaction with a
//! smaller id has finished (committed and visible, or aborted and gone);
//! every transaction that commits later has an id at or above that xmin,
//! so all its events number above everything handed out. The cut is a
//! plain range on the primary key.
//!
//! **Durability.** Events of synchronously committed transactions are
//! durable once visible. Those of asynchronous ones ([`Durability::Eventual`])
//! are visible before they are durable, so a reader that is about to hand
//! one out first makes it durable with a barrier (a synchronous commit,
//! which flushes the WAL past every earlier commit). A process remembers
//! below which number it knows everything durable, so a follower pays for
//! at most one barrier per page, and none when nothing was asynchronous.

use std::sync::atomic::Ordering;

use crate::journal::PostgresJournal;
use crate::rows::{pg, run, Type};
use idem_journal::error::Error;
use idem_journal::journal::{Digest, Durability, EventRows, NewEvent};

/// The horizon below which events may be handed out, in sequence numbers.
const HORIZON: &str = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 16";

impl PostgresJournal {
    pub(super) async fn append_events(
        &self,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<Vec<u64>, Error> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        if events.len() >= 1 << 16 {
            return Err(Error::TooLarge {
                what: "an append of audit events",
                size: events.len() as u64,
                limit: (1 << 16) - 1,
            });
        }
        let client = self.client().await?;
        let keys: Vec<Option<&[u8]>> = events.iter().map(|e| e.key.map(|k| &k[..])).collect();
        let bytes: Vec<&[u8]> = events.iter().map(|e| e.bytes).collect();
        let eventual = durability == Durability::Eventual;
        let rows = run(
            &client,
            self.pooler,
            "WITH ev AS (
                    INSERT INTO idem_events (seq, op_key, durable, bytes)
                    SELECT (pg_current_xact_id()::text::bigint << 16) + e.ord, e.k, $3::boolean, e.b
                    FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS e(k, b, ord)
                    RETURNING seq
                 )
                 SELECT ARRAY(SELECT seq FROM ev ORDER BY seq),
                        set_config('synchronous_commit', $4::text, true)",
            &[
                (&keys, Type::BYTEA_ARRAY),
                (&bytes, Type::BYTEA_ARRAY),
                (&!eventual, Type::BOOL),
                (&if eventual { "off" } else { "on" }, Type::TEXT),
            ],
        )
        .await
        .map_err(pg("append audit events", &self.location))?;
        let row = rows.first().ok_or_else(|| {
            Error::storage("append audit events", &self.location, "no row returned")
        })?;
        if eventual {
            self.async_pending.store(true, Ordering::SeqCst);
        }
        let seqs: Vec<i64> = row.get(0);
        self.wrote(&seqs);
        Ok(seqs.into_iter().map(|s| s as u64).collect())
    }

    pub(super) async fn read_events(&self, from: u64, limit: usize) -> Result<EventRows, Error> {
        let client = self.client().await?;
        let rows = run(
            &client,
            self.pooler,
            &format!(
                "WITH h AS (SELECT {HORIZON} AS horizon)
                 SELECT e.seq, e.bytes, e.durable FROM h, LATERAL (
                    SELECT seq, bytes, durable FROM idem_events
                    WHERE seq >= $1 AND seq < h.horizon ORDER BY seq LIMIT $2
                 ) e"
            ),
            &[
                (&(from.min(i64::MAX as u64) as i64), Type::INT8),
                (&(limit.min(i64::MAX as usize) as i64), Type::INT8),
            ],
        )
        .await
        .map_err(pg("read the audit stream", &self.location))?;
        drop(client);
        let rows: Vec<(u64, Vec<u8>, bool)> = rows
            .iter()
            .map(|r| (r.get::<_, i64>(0) as u64, r.get(1), r.get(2)))
            .collect();
        self.made_durable(&rows).await?;
        Ok(rows.into_iter().map(|(s, b, _)| (s, b)).collect())
    }

    pub(super) async fn read_events_for(&self, key: &Digest) -> Result<EventRows, Error> {
        let client = self.client().await?;
        let rows = run(
            &client,
            self.pooler,
            &format!(
                "WITH h AS (SELECT {HORIZON} AS horizon)
                 SELECT e.seq, e.bytes, e.durable FROM h, idem_events e
                 WHERE e.op_key = $1 AND e.seq < h.horizon ORDER BY e.seq"
            ),
            &[(&&key[..], Type::BYTEA)],
        )
        .await
        .map_err(pg("read an operation's audit events", &self.location))?;
        drop(client);
        let rows: Vec<(u64, Vec<u8>, bool)> = rows
            .iter()
            .map(|r| (r.get::<_, i64>(0) as u64, r.get(1), r.get(2)))
            .collect();
        self.made_durable(&rows).await?;
        Ok(rows.into_iter().map(|(s, b, _)| (s, b)).collect())
    }

    /// Makes sure every row about to be handed out is durable.
    async fn made_durable(&self, rows: &[(u64, Vec<u8>, bool)]) -> Result<(), Error> {
        let floor = self.durable_floor.load(Ordering::SeqCst);
        if rows
            .iter()
            .any(|(seq, _, durable)| !durable && *seq >= floor)
        {
            // Every row read was committed before the barrier's snapshot.
            self.barrier().await?;
        }
        Ok(())
    }
}
