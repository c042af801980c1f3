//! `GET /v1/audit`: the durable audit stream as JSON lines, and with
//! `follow=true` every event after it as it becomes durable.
//!
//! A follower subscribes before it reads, then only ever reads the durable
//! stream from the next sequence number it has not sent: live events serve
//! as wake-ups, never as data. So an event written between the read and
//! the subscription is not missed, a follower that lags re-reads what it
//! skipped, and an event that is published before it is durable is sent
//! once it is (the stream holds only durable events).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use crate::operator::{Live, Missed, Operator};

/// Where a read of the stream starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum From {
    /// At this sequence number.
    Seq(u64),
    /// After the last durable event: only what happens from now on.
    End,
}

/// How often a follower that is waiting for an event to become durable
/// looks again (events that record no decision are durable within about
/// 100 ms).
const DURABLE_POLL: Duration = Duration::from_millis(20);
/// How often an idle follower reads the stream anyway, in case a wake-up
/// was lost (another process's events in a shared journal, say).
const IDLE_POLL: Duration = Duration::from_secs(2);
const PAGE: usize = 512;

/// Sends the stream from `next` into `tx`; follows it when `live` is given.
/// Ends when the client goes, the runtime is dropped or the server stops.
pub(crate) async fn stream(
    rt: Arc<dyn Operator>,
    mut next: u64,
    limit: Option<u64>,
    mut live: Option<Box<dyn Live>>,
    tx: mpsc::Sender<Bytes>,
    mut stop: watch::Receiver<bool>,
) {
    let mut left = limit.unwrap_or(u64::MAX);
    // The highest sequence number seen live that may not be durable yet.
    let mut awaited: Option<u64> = None;
    loop {
        if !rt.alive() {
            return;
        }
        loop {
            if left == 0 {
                return;
            }
            let page_size = PAGE.min(usize::try_from(left).unwrap_or(PAGE));
            let page = match rt.audit_page(next, page_size).await {
                Ok(page) => page,
                Err(e) => {
                    // A line with "error" ends the stream.
                    let line = serde_json::json!({"error": "journal", "message": e.to_string()});
                    let _ = tx.send(Bytes::from(format!("{line}\n"))).await;
                    return;
                }
            };
            let Some(last) = page.last().map(|e| e.seq) else {
                break;
            };
            let mut chunk = String::new();
            for event in &page {
                chunk.push_str(&event.to_json_line());
                chunk.push('\n');
            }
            left = left.saturating_sub(page.len() as u64);
            next = last + 1;
            if tx.send(Bytes::from(chunk)).await.is_err() {
                return;
            }
        }
        let Some(sub) = live.as_mut() else {
            // A snapshot: done.
            return;
        };
        if awaited.is_some_and(|seq| seq < next) {
            awaited = None;
        }
        let wait = if awaited.is_some() {
            DURABLE_POLL
        } else {
            IDLE_POLL
        };
        tokio::select! {
            event = sub.recv() => match event {
                Ok(e) if e.seq >= next => awaited = Some(awaited.map_or(e.seq, |a| a.max(e.seq))),
                Ok(_) | Err(Missed::Lagged) => {}
                Err(Missed::Closed) => return,
            },
            _ = tokio::time::sleep(wait) => {}
            _ = tx.closed() => return,
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}
