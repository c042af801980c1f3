//! LISTEN/NOTIFY: a write of a record that a worker waits for notifies the
//! channel [`CHANNEL`] in its own transaction (so the notification is
//! delivered at commit, to every process), with the record's space and key
//! as payload.
//!
//! Only those writes: PostgreSQL serializes the commits of notifying
//! transactions (a database-wide lock from pre-commit until the commit is
//! flushed), which would undo its group commit if every write notified. So
//! a waiter first marks the record `watched` (in the statement that checks
//! its version; a row lock orders it against a concurrent writer, which
//! then sees the mark), and writers notify only for watched records.
//! One connection per journal listens and fans the notifications out to
//! the waiters of this process; the same connection measures the clock
//! offset now and then.
//!
//! The connection can fail (a restart of the database): the task reconnects
//! with backoff, and while it is down [`Listener::connected`] is false so
//! waiters poll at the short interval; after a reconnect every waiter is
//! woken once, since notifications sent meanwhile were lost.
//!
//! Behind a pooler in transaction mode a `LISTEN` would register in
//! whichever server session ran it, and its notifications would go to
//! whichever client that session serves next (or nowhere): there the
//! journal listens on a direct connection
//! ([`PostgresOptions::listen_url`](crate::PostgresOptions::listen_url())) if it
//! has one, else not at all ([`Source::Poll`]): [`Listener::connected`] stays
//! false, so waiters re-read at the polling interval (and at the lease's
//! expiry), and the clock's offset is measured through the pool.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::tokio_postgres::{self, AsyncMessage, NoTls};
use tokio::sync::broadcast;

use crate::clock::DbClock;
use idem_journal::journal::{Digest, Space};

/// The notification channel.
pub const CHANNEL: &str = "idem_changed";

/// What a waiter hears: a record that changed, or `None` (anything may
/// have changed: the listener reconnected).
pub type Change = Option<(Space, Digest)>;

/// The payload of a change: the space's name, a colon, the key in hex.
pub fn payload(space: Space, key: &Digest) -> String {
    let mut s = String::with_capacity(70);
    s.push_str(space.name());
    s.push(':');
    for b in key {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn parse(payload: &str) -> Option<(Space, Digest)> {
    let (space, hex) = payload.split_once(':')?;
    let space = Space::ALL.into_iter().find(|s| s.name() == space)?;
    if hex.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((space, key))
}

/// Where notifications come from.
pub enum Source {
    /// A connection of its own to this server, which `LISTEN`s.
    Direct(Box<tokio_postgres::Config>),
    /// Nowhere (behind a pooler, without a direct connection): waiters
    /// poll; the pool measures the clock.
    Poll(deadpool_postgres::Pool),
}

/// The fan-out of notifications to this process's waiters.
pub struct Listener {
    tx: broadcast::Sender<Change>,
    connected: AtomicBool,
}

impl Listener {
    /// A listener and the task that keeps its connection (abort it to stop
    /// listening; it also ends once the listener is dropped and its
    /// connection fails).
    pub fn start(
        source: Source,
        clock: Arc<DbClock>,
    ) -> (Arc<Listener>, tokio::task::JoinHandle<()>) {
        let (tx, _) = broadcast::channel(1024);
        let listener = Arc::new(Listener {
            tx,
            connected: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&listener);
        let config = match source {
            Source::Direct(config) => *config,
            Source::Poll(pool) => {
                let task = tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        if weak.strong_count() == 0 {
                            return;
                        }
                        if let Ok(client) = pool.get().await {
                            let _ = measure_offset(&client, &clock).await;
                        }
                    }
                });
                return (listener, task);
            }
        };
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(20);
            loop {
                let Some(this) = weak.upgrade() else { return };
                let ok = this.session(&config, &clock).await;
                this.connected.store(false, Ordering::SeqCst);
                drop(this);
                backoff = if ok {
                    Duration::from_millis(20)
                } else {
                    (backoff * 2).min(Duration::from_secs(1))
                };
                tokio::time::sleep(backoff).await;
            }
        });
        (listener, task)
    }

    /// One connection's life; true if it got as far as listening.
    async fn session(self: &Arc<Self>, config: &tokio_postgres::Config, clock: &DbClock) -> bool {
        let Ok((client, mut connection)) = config.connect(NoTls).await else {
            return false;
        };
        let tx = self.tx.clone();
        let driver = async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if let Some(change) = parse(n.payload()) {
                            let _ = tx.send(Some(change));
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => return,
                }
            }
        };
        let mut listening = false;
        let work = async {
            if client
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .await
                .is_err()
            {
                return;
            }
            listening = true;
            // Whatever changed while nobody listened: everyone waiting now
            // re-reads; who subscribes from here on hears every change.
            let _ = self.tx.send(None);
            self.connected.store(true, Ordering::SeqCst);
            loop {
                if measure_offset(&client, clock).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
        };
        tokio::select! {
            () = driver => {}
            () = work => {}
        }
        listening
    }

    /// A receiver of changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.tx.subscribe()
    }

    /// Whether notifications are being received now.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }
}

/// Measures the offset of the database's clock, keeping the sample with
/// the shortest round trip of three.
pub async fn measure_offset(
    client: &tokio_postgres::Client,
    clock: &DbClock,
) -> Result<(), tokio_postgres::Error> {
    let mut best: Option<(u64, u64, f64)> = None;
    for _ in 0..3 {
        let before = clock.local_ms();
        let row = client
            .query_typed_one(
                "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8",
                &[],
            )
            .await?;
        let after = clock.local_ms();
        let db: f64 = row.get(0);
        if best.is_none_or(|(b, a, _)| after - before < a - b) {
            best = Some((before, after, db));
        }
    }
    if let Some((before, after, db)) = best {
        clock.measured(before, db, after);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip() {
        let key = [0xab; 32];
        assert_eq!(
            parse(&payload(Space::Steps, &key)),
            Some((Space::Steps, key))
        );
        assert_eq!(parse("ops:zz"), None);
        assert_eq!(parse("nope:00"), None);
    }
}
