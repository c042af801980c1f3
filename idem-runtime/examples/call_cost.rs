//! The runtime's own cost per call, for instruction counts: `n` calls of a
//! no-op `provider` tool on a journal that costs next to nothing and the
//! same at every size (records in a hash map, events in a vector: no
//! barrier copies, no I/O), so that what a profiler counts is the
//! runtime's work, not storage's.
//!
//! ```text
//! cargo run --release -p idem-runtime --example call_cost -- MODE N
//! ```
//!
//! MODE is `fresh` (N fresh calls, one after the other), `fresh64` (N
//! fresh calls from 64 tasks), `replay` (2000 fresh calls, then N replays
//! of them, answered by the replay cache) or `replay-journal` (the same,
//! the replays from a second runtime on the same journal without a replay
//! cache: read from the journal). Add `mt` for tokio's multi-thread
//! scheduler with two workers (the default is a current-thread one, which
//! counts the same on every run). Per-call counts come from the difference
//! of two runs with different N (`valgrind --tool=callgrind`), which
//! cancels the set-up; `CALL_COST_SIZES=1` prints the size of a call's
//! future. `CALL_COST_SLED=DIR` puts the calls on the embedded journal in
//! DIR instead (for profiles of the whole; fresh modes only).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem::{tool, Classify, Ctx, Failure, Runtime};
use idem_runtime::journal::{
    BoxFuture, ClaimChange, Digest, Durability, EventRows, Expect, Journal, Loaded, NewEvent,
    Space, Write, Written,
};
use idem_runtime::Error;

#[derive(Debug)]
struct Never;

impl Classify for Never {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "n")]
async fn charge_noop(ctx: &Ctx, n: u64) -> Result<u64, Never> {
    let _ = ctx.idempotency_key();
    Ok(n)
}

struct Rec {
    version: u64,
    epoch: u64,
    body: Vec<u8>,
}

/// Folds what is hashed a word at a time: the journal here should cost
/// little next to the runtime (keys are SHA-256 digests, no adversary).
#[derive(Default)]
struct Fold(u64);

impl std::hash::Hasher for Fold {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
}

#[derive(Default)]
struct State {
    records: HashMap<(Space, Digest), Rec, std::hash::BuildHasherDefault<Fold>>,
    events: Vec<Vec<u8>>,
    next_version: u64,
}

/// One process's journal in memory: everything is durable at once.
#[derive(Default)]
struct Cheap {
    state: Mutex<State>,
}

fn ready<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, T> {
    Box::pin(std::future::ready(v))
}

impl Journal for Cheap {
    fn location(&self) -> &str {
        "memory (call_cost)"
    }

    fn load<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Loaded>, Error>> {
        let st = self.state.lock().unwrap();
        ready(Ok(st.records.get(&(space, *key)).map(|r| Loaded {
            version: r.version,
            epoch: r.epoch,
            body: r.body.clone(),
            claim: None,
        })))
    }

    fn write<'a>(&'a self, w: Write<'a>) -> BoxFuture<'a, Result<Written, Error>> {
        let mut st = self.state.lock().unwrap();
        let current = st
            .records
            .get(&(w.space, *w.key))
            .map(|r| (r.version, r.epoch));
        let holds = match (w.expect, current) {
            (Expect::Absent, None) => true,
            (Expect::Version(v), Some((at, _))) => v == at,
            _ => false,
        };
        if !holds {
            return ready(Ok(Written::Conflict));
        }
        st.next_version += 1;
        let version = st.next_version;
        let epoch =
            current.map_or(0, |(_, e)| e) + u64::from(matches!(w.claim, ClaimChange::Take(_)));
        st.records.insert(
            (w.space, *w.key),
            Rec {
                version,
                epoch,
                body: w.body.to_vec(),
            },
        );
        let mut seqs = Vec::with_capacity(w.events.len());
        for e in w.events {
            seqs.push(st.events.len() as u64);
            st.events.push(e.bytes.to_vec());
        }
        ready(Ok(Written::Done {
            version,
            epoch,
            seqs,
        }))
    }

    fn changed<'a>(&'a self, _: Space, _: &'a Digest, _: u64) -> BoxFuture<'a, ()> {
        ready(())
    }

    fn append<'a>(
        &'a self,
        events: &'a [NewEvent<'a>],
        _: Durability,
    ) -> BoxFuture<'a, Result<Vec<u64>, Error>> {
        let mut st = self.state.lock().unwrap();
        let seqs = events
            .iter()
            .map(|e| {
                st.events.push(e.bytes.to_vec());
                st.events.len() as u64 - 1
            })
            .collect();
        ready(Ok(seqs))
    }

    fn events<'a>(&'a self, from: u64, limit: usize) -> BoxFuture<'a, Result<EventRows, Error>> {
        let st = self.state.lock().unwrap();
        ready(Ok(st
            .events
            .iter()
            .enumerate()
            .skip(from as usize)
            .take(limit)
            .map(|(i, b)| (i as u64, b.clone()))
            .collect()))
    }

    fn truncate_events(&self, _: u64) -> BoxFuture<'_, Result<u64, Error>> {
        ready(Ok(0))
    }

    fn escalated(&self) -> BoxFuture<'_, Result<Vec<(Digest, Loaded)>, Error>> {
        ready(Ok(Vec::new()))
    }

    fn scan<'a>(
        &'a self,
        _: Space,
        _: Option<&'a Digest>,
        _: usize,
    ) -> BoxFuture<'a, Result<Vec<(Digest, Loaded)>, Error>> {
        ready(Ok(Vec::new()))
    }

    fn remove<'a>(&'a self, _: Space, _: &'a Digest, _: u64) -> BoxFuture<'a, Result<bool, Error>> {
        ready(Ok(false))
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), Error>> {
        ready(Ok(()))
    }

    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>> {
        ready(Ok(0))
    }
}

async fn fresh(ctx: &Ctx, keys: std::ops::Range<u64>) {
    for n in keys {
        assert_eq!(charge_noop(ctx, n).await.expect("fresh call"), n);
    }
}

async fn fresh64(ctx: &Ctx, n: u64) {
    let per = n.div_ceil(64);
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let ctx = ctx.clone();
            tokio::spawn(async move { fresh(&ctx, t * per..(t + 1) * per).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
}

/// The operations replay modes replay (all in the replay cache).
const REPLAYED: u64 = 2000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("fresh", String::as_str).to_string();
    let n: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let tokio = if args.iter().any(|a| a == "mt") {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .expect("tokio");
    let cheap = Arc::new(Cheap::default());
    let journal: Arc<dyn Journal> = cheap.clone();
    let open = || {
        Runtime::builder()
            .journal(journal.clone())
            .seed(1)
            .open()
            .expect("runtime")
    };
    // For profiles of the whole: the embedded journal in this directory
    // (fresh modes only: a second runtime cannot open it).
    let rt = match std::env::var_os("CALL_COST_SLED") {
        Some(dir) => Runtime::open(dir).expect("sled journal"),
        None => open(),
    };
    let ctx = rt.run("bench");
    if std::env::var_os("CALL_COST_SIZES").is_some() {
        println!(
            "future of a call: {} bytes",
            std::mem::size_of_val(&charge_noop(&ctx, 0))
        );
    }
    tokio.block_on(async {
        match mode.as_str() {
            "fresh" => fresh(&ctx, 0..n).await,
            "fresh64" => fresh64(&ctx, n).await,
            "replay" | "replay-journal" => {
                fresh(&ctx, 0..REPLAYED).await;
                // A second runtime without a cache reads every replay
                // from the journal.
                let rt2 = Runtime::builder()
                    .journal(journal.clone())
                    .replay_cache(0)
                    .open()
                    .expect("runtime");
                let ctx = if mode == "replay" {
                    ctx.clone()
                } else {
                    rt2.run("bench")
                };
                for i in 0..n {
                    let k = i % REPLAYED;
                    assert_eq!(charge_noop(&ctx, k).await.expect("replay"), k);
                }
            }
            other => panic!("unknown mode {other}"),
        }
    });
    let events = cheap.state.lock().unwrap().events.len();
    println!("{mode}: {n} calls, {events} events");
}
