//! idem beside the peers that keep their state in PostgreSQL, on one
//! throwaway server (PostgreSQL from Debian's packages, fsync on, unix
//! socket) in one run, each in its own database: the same no-op call that
//! returns its key, through
//!
//! - idem (`class = "provider"`, the replay cache off, so that a replay
//!   reads the database as the peers' do),
//! - agent-effects 0.2.0 with agent-effects-postgres
//!   (`EffectKind::IrreversibleWrite`, `remote_idempotency(true)`: the
//!   promise of idem's provider class),
//! - DBOS Transact for Python (`dbos_bench.py`: a workflow with one step,
//!   started under `SetWorkflowID`), when a Python with `dbos` is given
//!   (`DBOS_PYTHON`, as `./run` sets up).
//!
//! For each: fresh calls one after the other, sampled in turn with
//! single-row commits on a plain connection (this disk's latency drifts,
//! and both must see the same); replays of committed calls; 64 concurrent
//! tasks of fresh calls. Counts: `SBS_CALLS` (default 1000) sequential
//! calls, `SBS_TASK_CALLS` (default 40) per concurrent task.

use std::time::{Duration, Instant};

use agent_effects::{EffectFailure, EffectKind, EffectOutcome};
use idem::{tool, Classify, Ctx, Failure, Runtime};
use idem_testkit::pg::{PgServer, PgServerOptions};

/// The no-op tool's error type; never produced.
#[derive(Debug)]
struct Never;

impl Classify for Never {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

#[tool(class = "provider", key = "n")]
async fn noop(ctx: &Ctx, n: u64) -> Result<u64, Never> {
    let _ = ctx;
    Ok(n)
}

/// One system's way to make the call.
#[derive(Clone)]
enum System {
    Idem(Ctx),
    AgentEffects(agent_effects::Runtime<agent_effects_postgres::PostgresStore>),
}

impl System {
    async fn call(&self, n: u64) {
        match self {
            System::Idem(ctx) => {
                assert_eq!(noop(ctx, n).await.expect("idem call"), n);
            }
            System::AgentEffects(rt) => {
                let out = rt
                    .effect("bench.noop", n)
                    .kind(EffectKind::IrreversibleWrite)
                    .remote_idempotency(true)
                    .input(&n)
                    .run(move |_ctx| async move { Ok::<u64, EffectFailure>(n) })
                    .await
                    .expect("agent-effects call");
                match out {
                    EffectOutcome::Committed(v) => assert_eq!(v, n),
                    other => panic!("agent-effects: {other:?}"),
                }
            }
        }
    }
}

/// A plain connection committing single rows: the floor.
struct Floor {
    client: tokio_postgres::Client,
    insert: tokio_postgres::Statement,
    next: i64,
}

impl Floor {
    async fn open(url: &str) -> Floor {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS floor (id bigint PRIMARY KEY, body bytea NOT NULL)",
            )
            .await
            .expect("the floor's table");
        let insert = client
            .prepare("INSERT INTO floor VALUES ($1, $2)")
            .await
            .expect("prepare");
        Floor {
            client,
            insert,
            next: 0,
        }
    }

    async fn commit(&mut self) -> Duration {
        self.next += 1;
        let body = [0xA5u8; 128];
        let t = Instant::now();
        self.client
            .execute(&self.insert, &[&self.next, &&body[..]])
            .await
            .expect("commit");
        t.elapsed()
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn count(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one system measured.
struct Figures {
    floor: Duration,
    fresh: Duration,
    replay: Duration,
    concurrent: f64,
}

async fn measure(system: &System, floor: &mut Floor, calls: u64, task_calls: u64) -> Figures {
    for n in 1_000_000..1_000_100 {
        system.call(n).await;
    }
    let (mut floors, mut fresh) = (Vec::new(), Vec::new());
    for n in 0..calls {
        floors.push(floor.commit().await);
        let t = Instant::now();
        system.call(n).await;
        fresh.push(t.elapsed());
    }
    let mut replays = Vec::new();
    for n in 0..calls {
        let t = Instant::now();
        system.call(n).await;
        replays.push(t.elapsed());
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..64u64)
        .map(|task| {
            let system = system.clone();
            tokio::spawn(async move {
                for i in 0..task_calls {
                    system.call(2_000_000 + task * task_calls + i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a concurrent task");
    }
    let concurrent = (64 * task_calls) as f64 / started.elapsed().as_secs_f64();
    Figures {
        floor: p50(floors),
        fresh: p50(fresh),
        replay: p50(replays),
        concurrent,
    }
}

fn row(name: &str, f: &Figures) {
    println!(
        "| {name} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} calls/s |",
        micros(f.floor),
        micros(f.fresh),
        micros(f.replay),
        f.concurrent
    );
}

fn main() {
    let calls = count("SBS_CALLS", 1000);
    let task_calls = count("SBS_TASK_CALLS", 40);
    let server = PgServer::start_with(&PgServerOptions {
        fsync: true,
        max_connections: 300,
    })
    .expect("start a PostgreSQL server (Debian's postgresql package)");
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    println!(
        "side by side: {} cores, PostgreSQL with fsync on at {}, {calls} sequential calls, 64 tasks x {task_calls}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        server.socket_dir().display()
    );
    println!();
    println!("| p50 unless said | floor (one commit) | fresh call | replay (uncached) | 64 concurrent, fresh |");
    println!("|---|---|---|---|---|");
    tokio.block_on(async {
        let url = server.create_database().expect("a database");
        let rt = Runtime::builder()
            .postgres(url.as_str())
            .worker_id("side-by-side")
            .replay_cache(0)
            .postgres_options(idem::PostgresOptions {
                pool_size: 64,
                ..idem::PostgresOptions::default()
            })
            .connect()
            .await
            .expect("connect idem's journal");
        let mut floor = Floor::open(&url).await;
        let idem = measure(
            &System::Idem(rt.run("bench")),
            &mut floor,
            calls,
            task_calls,
        )
        .await;
        row("idem", &idem);
        drop(rt);

        let url = server.create_database().expect("a database");
        let db = PgServer::database_of(&url).to_string();
        let sqlx_url = format!(
            "postgres://postgres@localhost:{}/{db}?host={}",
            server.port(),
            server.socket_dir().display()
        );
        let store = agent_effects_postgres::PostgresOptions::new()
            .max_connections(64)
            .connect(&sqlx_url)
            .await
            .expect("connect agent-effects' store");
        let ae = agent_effects::Runtime::new(store);
        let mut floor = Floor::open(&url).await;
        let peer = measure(&System::AgentEffects(ae), &mut floor, calls, task_calls).await;
        row("agent-effects-postgres 0.2.0", &peer);
    });

    match std::env::var_os("DBOS_PYTHON") {
        None => println!("| DBOS (Python) | skipped: DBOS_PYTHON names no Python with dbos (./run sets one up) | | | |"),
        Some(python) => {
            let url = server.create_database().expect("a database");
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/dbos_bench.py");
            let out = std::process::Command::new(python)
                .arg(script)
                .arg(&url)
                .arg(calls.to_string())
                .arg(task_calls.to_string())
                .output()
                .expect("run dbos_bench.py");
            if !out.status.success() {
                println!(
                    "| DBOS (Python) | failed: {} | | | |",
                    String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
                );
            } else {
                print!("{}", String::from_utf8_lossy(&out.stdout));
            }
        }
    }
}
