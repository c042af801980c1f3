//! The embedded journal at scale (issue 21): where the bytes and the memory
//! go as the journal grows, each figure printed beside the baseline it is
//! judged against, measured in the same run on the journal's own disk.
//!
//! One process, N operations: 64 concurrent tasks make fresh calls of a
//! `provider` tool with a short string result (one fresh key each), then
//! every `Runtime` is dropped, the journal reopened, and replays drawn
//! uniformly from the whole journal are timed. It prints:
//!
//! - **the floor**: one 128-byte append + fdatasync, and two back to back,
//!   on the journal's file system, before and after the writes;
//! - **writing**: ops/s per window of N/10 operations (does the rate fall
//!   with size?), per-call latency under load, log fdatasyncs per
//!   operation (group commit), RSS and disk at every window boundary, RSS
//!   sampled every 100 ms (max), bytes the process made the block layer
//!   write (`/proc/self/io`) per operation;
//! - **memory** (`/proc/self/status` VmRSS, VmHWM, RssAnon, RssFile, and
//!   glibc's `mallinfo2`: heap in use vs. freed but kept by the allocator)
//!   after writing, after dropping every `Runtime` and the journal, after a
//!   reopen, during and after the replays;
//! - **close** time (the last barrier and checkpoint) and **reopen** time
//!   (page cache warm: the files were just written);
//! - **replay** p50/p99 of keys drawn uniformly from the journal (this
//!   runtime committed none of them, so its replay cache cannot answer: a
//!   journal read each), and cached replay p50/p99 (keys this runtime just
//!   committed, answered by its replay cache); a sequential fresh call
//!   against one and two fdatasyncs on the full journal;
//! - **bytes on disk per operation** (the whole directory / N, audit
//!   events, image and kept log included) and where they go: every file of
//!   the directory (the tables `idem-table.*` of settled records, the
//!   audit files `idem-audit.*`, sled's `db`, `conf`, `blobs/`, `snap.*`
//!   holding what can still change; the journal's `idem-image`, log
//!   segments `idem-wal.*`, small files), apparent and allocated; the log
//!   written in all (segments are deleted once an image covers them, so
//!   the sampler records each segment's largest size); and, from the
//!   records themselves (a scan after the run): the key, sled-journal
//!   header, record frame and every field of the operation record's
//!   encoding, audit events per operation with their bytes and the fields
//!   that fill them, and what compression makes of them (the tables
//!   against the records' bytes, the audit files against the events').
//!
//! Run: `cargo bench --bench scale` (20,000 operations: a quick check),
//! `cargo bench --bench scale -- --ops 1000000` for the scale.
//! Options: `--ops N`, `--tasks T` (64), `--replays R` (20,000),
//! `--cache-mib M` (sled's `cache_capacity`, default the journal's 64 MiB),
//! `--replay-cache K` (the runtime's cache of committed results, default
//! 4096), `--no-inspect` (skip the record scan), `--trim` (after the
//! drop, `malloc_trim(0)`: shows how much of the RSS is freed memory the
//! allocator kept), `--keep` (leave the journal directory). `IDEM_BENCH_DIR`
//! chooses where the journal lives (default: a temporary directory under
//! `target/`). For a heap profile, run the built binary under heaptrack:
//! `heaptrack target/release/deps/scale-<hash> --ops 200000 --no-inspect`.
//! Nothing here asserts: the figures are for people to read; the targets
//! (DESIGN.md, "Scale of the embedded journal") are shown in brackets.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::journal::{Journal, Space};
use idem::{tool, Classify, Ctx, Failure, Runtime, SledJournal, SledOptions};

/// The tool's error type; never produced.
#[derive(Debug)]
struct Never;

impl Classify for Never {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// A provider call with a short string result (what a payment API's id
/// looks like).
#[tool(class = "provider", key = "n")]
async fn charge(ctx: &Ctx, n: u64) -> Result<String, Never> {
    let _ = ctx.idempotency_key();
    Ok(format!("ch_{n:010}"))
}

/// The same call with `commit = "eventual"` (`--eventual`): the COMMITTED
/// record rides the next group commit instead of its own fdatasync.
#[tool(class = "provider", key = "n", commit = "eventual")]
async fn charge_eventual(ctx: &Ctx, n: u64) -> Result<String, Never> {
    let _ = ctx.idempotency_key();
    Ok(format!("ch_{n:010}"))
}

/// Set once, before any call: which of the two tools the bench calls.
static EVENTUAL: AtomicBool = AtomicBool::new(false);

async fn call(ctx: &Ctx, n: u64) -> Result<String, idem::ToolError<Never>> {
    if EVENTUAL.load(Ordering::Relaxed) {
        charge_eventual(ctx, n).await
    } else {
        charge(ctx, n).await
    }
}

// ---------------------------------------------------------------- options

struct Options {
    ops: u64,
    tasks: u64,
    replays: usize,
    cache_mib: Option<u64>,
    replay_cache: Option<usize>,
    inspect: bool,
    trim: bool,
    keep: bool,
    exit_after_drop: bool,
    eventual: bool,
}

fn options() -> Options {
    let mut o = Options {
        ops: 20_000,
        tasks: 64,
        replays: 20_000,
        cache_mib: None,
        replay_cache: None,
        inspect: true,
        trim: false,
        keep: false,
        exit_after_drop: false,
        eventual: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.replace('_', "").parse().ok())
                .unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match a.as_str() {
            "--ops" => o.ops = num("--ops").max(1),
            "--tasks" => o.tasks = num("--tasks").max(1),
            "--replays" => o.replays = num("--replays").max(1) as usize,
            "--cache-mib" => o.cache_mib = Some(num("--cache-mib")),
            "--replay-cache" => o.replay_cache = Some(num("--replay-cache") as usize),
            "--no-inspect" => o.inspect = false,
            "--trim" => o.trim = true,
            "--keep" => o.keep = true,
            "--exit-after-drop" => o.exit_after_drop = true,
            "--eventual" => o.eventual = true,
            // What `cargo bench` passes to every bench binary.
            "--bench" => {}
            other => eprintln!("scale: ignoring argument {other:?}"),
        }
    }
    o
}

// ---------------------------------------------------------------- figures

struct Summary {
    p50: Duration,
    p99: Duration,
}

fn summarize(mut samples: Vec<Duration>) -> Summary {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    Summary {
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// Latencies in logarithmic buckets 1 % wide: the writing phase times
/// every call, and keeping ten million samples would be the bench's own
/// 160 MiB in the process whose memory it measures.
#[derive(Clone)]
struct Hist {
    counts: Vec<u64>,
}

impl Hist {
    const GROWTH: f64 = 1.01;
    const BUCKETS: usize = 2600; // 1.01^2600 ns: far beyond any latency here

    fn new() -> Hist {
        Hist {
            counts: vec![0; Self::BUCKETS],
        }
    }

    fn record(&mut self, d: Duration) {
        let ns = d.as_nanos().max(1) as f64;
        let i = (ns.ln() / Self::GROWTH.ln()) as usize;
        self.counts[i.min(Self::BUCKETS - 1)] += 1;
    }

    fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    fn quantile(&self, q: f64) -> Duration {
        let total: u64 = self.counts.iter().sum();
        let rank = ((total as f64 * q) as u64).min(total.saturating_sub(1));
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > rank {
                // The bucket's middle.
                return Duration::from_nanos(Self::GROWTH.powf(i as f64 + 0.5) as u64);
            }
        }
        Duration::ZERO
    }

    fn summary(&self) -> Summary {
        Summary {
            p50: self.quantile(0.50),
            p99: self.quantile(0.99),
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// What `/proc/self/status` says about memory, in KiB.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss: u64,
    hwm: u64,
    anon: u64,
    file: u64,
    threads: u64,
}

fn mem() -> Mem {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Mem {
        rss: field("VmRSS:"),
        hwm: field("VmHWM:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
        threads: field("Threads:"),
    }
}

/// glibc's view of the heap: bytes in use, and bytes freed but kept.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    /// `struct mallinfo2` (glibc 2.33+).
    #[repr(C)]
    #[derive(Default)]
    pub struct Mallinfo2 {
        pub arena: usize,
        pub ordblks: usize,
        pub smblks: usize,
        pub hblks: usize,
        pub hblkhd: usize,
        pub usmblks: usize,
        pub fsmblks: usize,
        pub uordblks: usize,
        pub fordblks: usize,
        pub keepcost: usize,
    }

    extern "C" {
        fn mallinfo2() -> Mallinfo2;
        fn malloc_trim(pad: usize) -> i32;
    }

    /// (in use, freed but held) in bytes, over every arena.
    pub fn heap() -> Option<(u64, u64)> {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let m = unsafe { mallinfo2() };
        Some(((m.uordblks + m.hblkhd) as u64, m.fordblks as u64))
    }

    pub fn trim() {
        // SAFETY: returns free memory at the top of each heap to the OS.
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod glibc {
    pub fn heap() -> Option<(u64, u64)> {
        None
    }
    pub fn trim() {}
}

fn mem_line(what: &str) -> Mem {
    let m = mem();
    let heap = match glibc::heap() {
        Some((used, free)) => format!(
            "heap in use {:>7.1} MiB, freed but held {:>7.1} MiB",
            mib(used),
            mib(free)
        ),
        None => "heap: no mallinfo2 here".into(),
    };
    println!(
        "  {what:<34} RSS {:>7.1} MiB (anon {:>7.1}, file {:>5.1}), HWM {:>7.1} MiB, {heap}, {} threads",
        m.rss as f64 / 1024.0,
        m.anon as f64 / 1024.0,
        m.file as f64 / 1024.0,
        m.hwm as f64 / 1024.0,
        m.threads
    );
    m
}

/// Bytes the process has had the block layer write (`/proc/self/io`).
fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("write_bytes:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A sampler thread: RSS every 100 ms (its maximum), and each log
/// segment's largest size (segments an image covers are deleted later).
struct Sampler {
    stop: Arc<AtomicBool>,
    max_rss: Arc<AtomicU64>,
    segments: Arc<Mutex<BTreeMap<String, u64>>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(dir: PathBuf) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max_rss = Arc::new(AtomicU64::new(0));
        let segments = Arc::new(Mutex::new(BTreeMap::new()));
        let (s, m, g) = (stop.clone(), max_rss.clone(), segments.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(mem().rss, Ordering::Relaxed);
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    let mut g = g.lock().unwrap();
                    for e in entries.flatten() {
                        let name = e.file_name().to_string_lossy().into_owned();
                        if name.starts_with("idem-wal.") {
                            let len = e.metadata().map_or(0, |m| m.len());
                            let slot = g.entry(name).or_insert(0);
                            *slot = (*slot).max(len);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler {
            stop,
            max_rss,
            segments,
            handle: Some(handle),
        }
    }

    /// Stops; returns the maximum RSS in KiB.
    fn finish(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.max_rss.load(Ordering::Relaxed).max(mem().rss)
    }

    fn log_written(&self) -> u64 {
        self.segments.lock().unwrap().values().sum()
    }
}

// ---------------------------------------------------------------- the floor

/// fdatasyncs of 128-byte appends to a probe file beside the journal.
struct Floor {
    file: std::fs::File,
    path: PathBuf,
}

impl Floor {
    fn new(dir: &Path) -> Floor {
        let path = dir.join("fdatasync-probe");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("probe file");
        Floor { file, path }
    }

    fn sync(&mut self) -> Duration {
        self.file.write_all(&[0xA5; 128]).expect("append");
        let t = Instant::now();
        self.file.sync_data().expect("fdatasync");
        t.elapsed()
    }

    /// `n` samples of one fdatasync, and `n` of two back to back.
    fn measure(&mut self, n: usize) -> (Vec<Duration>, Vec<Duration>) {
        let mut one = Vec::with_capacity(n);
        let mut two = Vec::with_capacity(n);
        for _ in 0..n {
            one.push(self.sync());
            two.push(self.sync() + self.sync());
        }
        (one, two)
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

// ---------------------------------------------------------------- the disk

/// One file (or directory, summed) of the journal directory.
#[derive(Debug, Default, Clone)]
struct Entry {
    files: u64,
    apparent: u64,
    allocated: u64,
}

fn walk(path: &Path, into: &mut Entry) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        if let Ok(entries) = std::fs::read_dir(path) {
            for e in entries.flatten() {
                walk(&e.path(), into);
            }
        }
    } else {
        into.files += 1;
        into.apparent += meta.len();
        into.allocated += meta.blocks() * 512;
    }
}

/// The directory's files, grouped: the tables, the audit files, sled's,
/// the image, the log, the rest.
fn disk(dir: &Path) -> BTreeMap<String, Entry> {
    let mut out: BTreeMap<String, Entry> = BTreeMap::new();
    let mut segments: Vec<String> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "fdatasync-probe" {
                continue;
            }
            if name.starts_with("idem-wal.") {
                segments.push(name);
                continue;
            }
            let group = match name.as_str() {
                n if n.starts_with("idem-table.") => "journal/tables (idem-table.*)".into(),
                n if n.starts_with("idem-audit.") => "journal/audit files (idem-audit.*)".into(),
                "db" | "conf" | "blobs" => format!("sled/{name}"),
                "idem-image" => "journal/idem-image".into(),
                n if n.starts_with("snap.") => "sled/snap.*".into(),
                _ => format!("small/{name}"),
            };
            walk(&e.path(), out.entry(group).or_default());
        }
    }
    // The newest segment is the one being written; the others are the
    // kept log (applied to sled, kept until an image covers them).
    segments.sort();
    if let Some(newest) = segments.pop() {
        walk(
            &dir.join(&newest),
            out.entry("journal/log (current segment)".into())
                .or_default(),
        );
    }
    let kept = out.entry("journal/log (kept segments)".into()).or_default();
    for s in &segments {
        walk(&dir.join(s), kept);
    }
    out
}

fn total(d: &BTreeMap<String, Entry>) -> (u64, u64) {
    d.values()
        .fold((0, 0), |(a, b), e| (a + e.apparent, b + e.allocated))
}

// ---------------------------------------------------------------- records

/// A cursor over bincode 2's standard encoding (varint integers).
struct Bin<'a> {
    b: &'a [u8],
}

impl Bin<'_> {
    fn take(&mut self, n: usize) -> Option<usize> {
        if self.b.len() < n {
            return None;
        }
        self.b = &self.b[n..];
        Some(n)
    }
    /// A varint: its value and its length.
    fn varint(&mut self) -> Option<(u64, usize)> {
        let first = *self.b.first()?;
        let (v, n) = match first {
            0..=250 => (u64::from(first), 1),
            251 => (
                u64::from(u16::from_le_bytes(self.b.get(1..3)?.try_into().ok()?)),
                3,
            ),
            252 => (
                u64::from(u32::from_le_bytes(self.b.get(1..5)?.try_into().ok()?)),
                5,
            ),
            253 => (u64::from_le_bytes(self.b.get(1..9)?.try_into().ok()?), 9),
            _ => return None,
        };
        self.take(n)?;
        Some((v, n))
    }
    /// A string or byte string: its whole length (prefix included).
    fn bytes(&mut self) -> Option<usize> {
        let (len, n) = self.varint()?;
        Some(n + self.take(len as usize)?)
    }
    /// `Option<T>` where T is a varint.
    fn opt_varint(&mut self) -> Option<usize> {
        let tag = *self.b.first()?;
        self.take(1)?;
        match tag {
            0 => Some(1),
            1 => Some(1 + self.varint()?.1),
            _ => None,
        }
    }
    /// `Option<_>` that must be `None` here.
    fn none(&mut self) -> Option<usize> {
        (*self.b.first()? == 0).then_some(())?;
        self.take(1)
    }
}

/// The byte cost of each field of an operation record, summed.
#[derive(Default)]
struct Fields {
    parsed: u64,
    unparsed: u64,
    sums: BTreeMap<&'static str, u64>,
}

impl Fields {
    /// `value` is what sled holds under the record's key.
    fn add(&mut self, value: &[u8]) {
        let mut local: Vec<(&'static str, usize)> = Vec::new();
        let ok = (|| -> Option<()> {
            // The sled journal's header (stored.rs): version, epoch, flags,
            // and an owner while claimed.
            let flags = *value.get(16)?;
            let mut head = 17;
            if flags & 1 != 0 {
                let len = u16::from_le_bytes(value.get(25..27)?.try_into().ok()?) as usize;
                head += 10 + len;
            }
            local.push(("sled-journal header (version, epoch, flags, owner)", head));
            let frame = value.get(head..)?;
            local.push(("record frame (kind, format, crc32)", 6));
            let mut r = Bin { b: frame.get(6..)? };
            local.push(("tool name", r.bytes()?));
            local.push(("class", r.varint()?.1));
            local.push(("root run", r.bytes()?));
            let (scopes, n) = r.varint()?;
            let mut scope = n;
            for _ in 0..scopes {
                scope += r.bytes()?;
            }
            local.push(("scope", scope));
            local.push(("generation", r.varint()?.1));
            let (state, n) = r.varint()?;
            let mut st = n;
            match state {
                // Committed { result, via }
                2 => {
                    let result = r.bytes()?;
                    local.push(("state: result (MessagePack)", result));
                    st += r.varint()?.1;
                }
                // Rejected / Failed { error }, NotApproved { note }
                3 | 4 | 10 => st += r.bytes()?,
                0 | 1 | 5..=9 => {}
                _ => return None,
            }
            local.push(("state (tag, via)", st));
            local.push(("attempts", r.varint()?.1));
            local.push(("first_attempt_ms", r.varint()?.1));
            local.push(("key_first_sent_ms", r.opt_varint()?));
            local.push(("updated_ms", r.varint()?.1));
            local.push(("maybe_landed", r.take(1)?));
            local.push(("fingerprint (SHA-256)", r.take(32)?));
            local.push(("args (canonical JSON)", r.bytes()?));
            let mut tail = 0;
            for _ in 0..5 {
                tail += r.none()?;
            }
            local.push(("last_error, verify, escalation, resolution, approval", tail));
            r.b.is_empty().then_some(())
        })();
        if ok.is_some() {
            self.parsed += 1;
            for (name, n) in local {
                *self.sums.entry(name).or_default() += n as u64;
            }
        } else {
            self.unparsed += 1;
        }
    }
}

/// What a scan of the journal's records found.
#[derive(Default)]
struct Census {
    ops: u64,
    op_key_bytes: u64,
    op_value_bytes: u64,
    steps: u64,
    step_bytes: u64,
    events: u64,
    event_bytes: u64,
    fields: Fields,
    /// Per kind: how many, and their stored bytes.
    kinds: BTreeMap<String, (u64, u64)>,
    /// Bytes of each string field of the audit events decoded.
    event_fields: BTreeMap<&'static str, u64>,
    events_decoded: u64,
}

async fn census(journal: &SledJournal, rt: &Runtime) -> Census {
    let mut c = Census::default();
    let mut after = None;
    loop {
        let page = journal
            .scan(Space::Ops, after.as_ref(), 4096)
            .await
            .expect("scan ops");
        let Some(last) = page.last().map(|p| p.0) else {
            break;
        };
        for (key, loaded) in &page {
            c.ops += 1;
            c.op_key_bytes += key.len() as u64;
            // What sled holds: the header stored.rs puts in front, then the
            // body. Rebuild the header's length from what `Loaded` says.
            let head = 17
                + loaded
                    .claim
                    .as_ref()
                    .map_or(0, |cl| 10 + cl.owner.worker.len());
            c.op_value_bytes += (head + loaded.body.len()) as u64;
            let mut value = vec![0u8; 17];
            value[16] = u8::from(loaded.claim.is_some());
            if let Some(cl) = &loaded.claim {
                value.extend_from_slice(&cl.owner.incarnation.to_le_bytes());
                value.extend_from_slice(&(cl.owner.worker.len() as u16).to_le_bytes());
                value.extend_from_slice(cl.owner.worker.as_bytes());
            }
            value.extend_from_slice(&loaded.body);
            c.fields.add(&value);
        }
        after = Some(last);
    }
    let mut after = None;
    loop {
        let page = journal
            .scan(Space::Steps, after.as_ref(), 4096)
            .await
            .expect("scan steps");
        let Some(last) = page.last().map(|p| p.0) else {
            break;
        };
        for (key, loaded) in &page {
            c.steps += 1;
            c.step_bytes += (key.len() + 17 + loaded.body.len()) as u64;
        }
        after = Some(last);
    }
    // Every event, raw (its stored bytes) and decoded (its kind and the
    // text fields that fill it), page by page in step.
    let mut from = 0;
    loop {
        let raw = journal.events(from, 4096).await.expect("events");
        let Some(last) = raw.last().map(|e| e.0) else {
            break;
        };
        let typed = rt.audit_page(from, raw.len()).await.expect("audit page");
        let kinds: HashMap<u64, String> = typed
            .iter()
            .map(|e| {
                let kind = format!("{:?}", e.kind);
                let name = kind
                    .split(|ch: char| !ch.is_alphanumeric())
                    .next()
                    .unwrap_or("?")
                    .to_string();
                (e.seq, name)
            })
            .collect();
        for (seq, bytes) in &raw {
            c.events += 1;
            c.event_bytes += bytes.len() as u64;
            let kind = kinds.get(seq).cloned().unwrap_or_else(|| "?".into());
            let slot = c.kinds.entry(kind).or_default();
            slot.0 += 1;
            slot.1 += bytes.len() as u64;
        }
        for e in &typed {
            c.events_decoded += 1;
            let mut f =
                |n: &'static str, len: usize| *c.event_fields.entry(n).or_default() += len as u64;
            f("tool", e.tool.len());
            f(
                "key (provider-facing)",
                e.key.as_ref().map_or(0, |k| k.len()),
            );
            f("root_run", e.root_run.len());
            f("agent", e.agent.len());
            f("worker", e.worker.as_ref().map_or(0, |w| w.len()));
            f(
                "kind and its fields (as JSON, a proxy)",
                serde_json::to_string(&e.kind).map_or(0, |s| s.len()),
            );
        }
        from = last + 1;
    }
    c
}

// ---------------------------------------------------------------- calls

/// Fresh calls of keys `base..base+n` from `tasks` tasks; returns the
/// per-call latencies and the (completed, time, RSS KiB, disk bytes) at
/// every window boundary.
#[allow(clippy::type_complexity)]
async fn write_phase(
    ctx: &Ctx,
    dir: &Path,
    base: u64,
    n: u64,
    tasks: u64,
    window: u64,
) -> (Hist, Vec<(u64, Instant, Mem, u64)>) {
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let marks = Arc::new(Mutex::new(Vec::new()));
    let dir = Arc::new(dir.to_path_buf());
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (ctx, next, done, marks, dir) = (
            ctx.clone(),
            next.clone(),
            done.clone(),
            marks.clone(),
            dir.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut lat = Hist::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return lat;
                }
                let t = Instant::now();
                call(&ctx, base + i).await.expect("fresh call");
                lat.record(t.elapsed());
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                if d % window == 0 || d == n {
                    let now = Instant::now();
                    let m = mem();
                    let bytes = total(&disk(&dir)).0;
                    marks.lock().unwrap().push((d, now, m, bytes));
                }
            }
        }));
    }
    let mut lat = Hist::new();
    for h in handles {
        lat.merge(&h.await.expect("task"));
    }
    let mut marks = std::mem::take(&mut *marks.lock().unwrap());
    marks.sort_by_key(|m| m.0);
    (lat, marks)
}

/// Replays of `n` keys drawn uniformly (splitmix64) from `0..population`
/// (plus `base`).
async fn replays(ctx: &Ctx, base: u64, population: u64, n: usize, seed: u64) -> Vec<Duration> {
    let mut state = seed;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let key = base + (z ^ (z >> 31)) % population;
        let t = Instant::now();
        let out = call(ctx, key).await.expect("replay");
        samples.push(t.elapsed());
        std::hint::black_box(out);
    }
    samples
}

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("IDEM_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&base).expect("bench dir");
    base
}

// ---------------------------------------------------------------- main

fn main() {
    let o = options();
    EVENTUAL.store(o.eventual, Ordering::Relaxed);
    let n = o.ops;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let tmp = tempfile::Builder::new()
        .prefix("idem-scale-")
        .tempdir_in(bench_dir())
        .expect("temp dir");
    let dir = tmp.path().join("journal");
    let mut sled = SledOptions::default();
    if let Some(m) = o.cache_mib {
        sled.cache_capacity = m << 20;
    }
    let open_journal = || Arc::new(SledJournal::open_with(&dir, &sled).expect("journal"));
    let runtime = |journal: &Arc<SledJournal>| {
        let mut b = Runtime::builder().journal(journal.clone());
        if let Some(k) = o.replay_cache {
            b = b.replay_cache(k);
        }
        b.open().expect("runtime")
    };

    println!("idem scale benchmark (issue 21)");
    println!(
        "machine: {} cores; journal in {}; {n} operations from {} tasks{}; sled cache_capacity {} MiB, \
         checkpoint_bytes {} MiB; replay cache {}",
        std::thread::available_parallelism().map_or(0, |c| c.get()),
        dir.display(),
        o.tasks,
        if o.eventual { " (commit = \"eventual\")" } else { "" },
        sled.cache_capacity >> 20,
        sled.checkpoint_bytes >> 20,
        o.replay_cache.map_or("default (4096)".into(), |k| k.to_string()),
    );
    println!();
    let m0 = mem_line("at start");

    // The floor, before the writes.
    let mut floor = Floor::new(tmp.path());
    floor.measure(20);
    let (one_a, two_a) = floor.measure(200);

    // ---- writing ----
    let journal = open_journal();
    let rt = runtime(&journal);
    let ctx = rt.run("bench");
    let mut sampler = Sampler::start(dir.clone());
    let window = n.div_ceil(10).max(1);
    let io0 = written_bytes();
    let fsyncs0 = journal.log_fsyncs();
    let started = Instant::now();
    let (lat, marks) = tokio.block_on(write_phase(&ctx, &dir, 0, n, o.tasks, window));
    let elapsed = started.elapsed();
    tokio.block_on(rt.sync()).expect("sync");
    let fsyncs = journal.log_fsyncs() - fsyncs0;
    let io_written = written_bytes() - io0;
    let max_rss_writing = sampler.finish();
    let log_written = sampler.log_written();
    let lat = lat.summary();
    println!(
        "writing: {n} fresh calls in {:.2} s = {:.0} ops/s [>= 50000/s]; per call under load p50 {:.0} us, p99 {:.0} us",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64(),
        us(lat.p50),
        us(lat.p99)
    );
    println!(
        "  {:.3} log fdatasyncs per operation ({fsyncs} in all); block-layer writes {:.0} B/op; \
         log written {:.0} B/op",
        fsyncs as f64 / n as f64,
        io_written as f64 / n as f64,
        log_written as f64 / n as f64
    );
    println!(
        "  {:>10} {:>10} {:>10} {:>10} {:>10}",
        "ops", "ops/s", "RSS MiB", "disk MiB", "disk B/op"
    );
    let mut prev = (0u64, started);
    let mut window_rates = Vec::new();
    for (d, t, m, bytes) in &marks {
        let rate = (d - prev.0) as f64 / t.duration_since(prev.1).as_secs_f64();
        window_rates.push(rate);
        println!(
            "  {d:>10} {rate:>10.0} {:>10.1} {:>10.1} {:>10.0}",
            m.rss as f64 / 1024.0,
            mib(*bytes),
            *bytes as f64 / *d as f64
        );
        prev = (*d, *t);
    }
    println!("memory");
    let m_written = mem_line("after writing (runtime open)");
    println!(
        "  {:<34} RSS max {:.1} MiB (sampled every 100 ms)",
        "while writing",
        max_rss_writing as f64 / 1024.0
    );
    let disk_after = disk(&dir);
    // A clean close: the last barrier, and the last checkpoint (the log
    // since the previous one applied to sled, so the reopen replays none).
    let t = Instant::now();
    drop(ctx);
    drop(rt);
    drop(journal);
    let close = t.elapsed();
    let m_dropped = mem_line("after dropping every Runtime");
    std::thread::sleep(Duration::from_secs(2));
    let m_dropped_later = mem_line("  ... 2 s later");
    if o.exit_after_drop {
        // Under heaptrack: what is still allocated now is reported as
        // "leaked", i.e. what outlives every Runtime and the journal.
        std::process::exit(0);
    }
    let m_trimmed = o.trim.then(|| {
        glibc::trim();
        mem_line("  ... after malloc_trim(0)")
    });

    // ---- reopen and replays ----
    let t = Instant::now();
    let journal = open_journal();
    let reopen = t.elapsed();
    let rt = runtime(&journal);
    let ctx = rt.run("bench");
    let m_reopened = mem_line("after reopen");
    let mut sampler = Sampler::start(dir.clone());
    let cold = summarize(tokio.block_on(replays(&ctx, 0, n, o.replays, 1)));
    let max_rss_replaying = sampler.finish();
    let m_replayed = mem_line("after uniform replays");
    println!(
        "  {:<34} RSS max {:.1} MiB",
        "during uniform replays",
        max_rss_replaying as f64 / 1024.0
    );
    // Cached: keys this runtime commits now, replayed from its cache.
    let cached_keys = 2000u64.min(o.replay_cache.unwrap_or(4096) as u64).max(1);
    tokio.block_on(async {
        for k in 0..cached_keys {
            call(&ctx, n + 1_000_000 + k).await.expect("fresh");
        }
    });
    let cached = summarize(tokio.block_on(replays(&ctx, n + 1_000_000, cached_keys, o.replays, 2)));
    // A sequential fresh call on the full journal, against the floor.
    let mut seq = Vec::new();
    let mut one_b = Vec::new();
    let mut two_b = Vec::new();
    for b in 0..10u64 {
        let (o1, o2) = floor.measure(20);
        one_b.extend(o1);
        two_b.extend(o2);
        tokio.block_on(async {
            for k in 0..30 {
                let key = n + 2_000_000 + b * 100 + k;
                let t = Instant::now();
                call(&ctx, key).await.expect("fresh");
                seq.push(t.elapsed());
            }
        });
    }
    let seq = summarize(seq);
    let one_before = summarize(one_a);
    let two_before = summarize(two_a);
    let one = summarize(one_b);
    let two = summarize(two_b);
    println!("floor (128-byte append + fdatasync, this file system)");
    println!(
        "  before the writes: one p50 {:.0} us p99 {:.0} us, two p50 {:.0} us; after: one p50 {:.0} us p99 {:.0} us, two p50 {:.0} us",
        us(one_before.p50),
        us(one_before.p99),
        us(two_before.p50),
        us(one.p50),
        us(one.p99),
        us(two.p50)
    );
    println!("latency");
    println!(
        "  close {:.3} s (every Runtime and the journal dropped) []",
        close.as_secs_f64()
    );
    println!("  reopen {:.3} s [<= 0.5 s at 1 M]", reopen.as_secs_f64());
    println!(
        "  replay uniform over {n}: p50 {:.1} us, p99 {:.1} us [p99 <= 50 us]",
        us(cold.p50),
        us(cold.p99)
    );
    println!(
        "  replay cached ({cached_keys} keys): p50 {:.2} us, p99 {:.2} us [p50 <= 2 us]",
        us(cached.p50),
        us(cached.p99)
    );
    println!(
        "  fresh call, one task, full journal: p50 {:.0} us = {:.2} x one fdatasync, {:.2} x two [<= 1.3 x two; eventual commit: <= 1.2 x one]",
        us(seq.p50),
        us(seq.p50) / us(one.p50),
        us(seq.p50) / us(two.p50)
    );

    // ---- where the bytes go ----
    let (apparent, allocated) = total(&disk_after);
    println!("bytes on disk after writing: {:.1} MiB apparent ({:.0} B/op) [<= 400 B/op], {:.1} MiB allocated ({:.0} B/op)",
        mib(apparent),
        apparent as f64 / n as f64,
        mib(allocated),
        allocated as f64 / n as f64
    );
    println!(
        "  {:<34} {:>6} {:>10} {:>8} {:>10} {:>6}",
        "file", "files", "MiB", "B/op", "alloc MiB", "share"
    );
    for (name, e) in &disk_after {
        println!(
            "  {name:<34} {:>6} {:>10.1} {:>8.0} {:>10.1} {:>5.1}%",
            e.files,
            mib(e.apparent),
            e.apparent as f64 / n as f64,
            mib(e.allocated),
            100.0 * e.apparent as f64 / apparent.max(1) as f64
        );
    }
    drop(ctx);
    drop(rt);
    drop(journal);

    let mut census_out = None;
    if o.inspect {
        // Reopened, the log is settled (the open checkpoints it): the
        // tables and audit files hold everything that settled, so they
        // compare like with like with the live bytes.
        let journal = open_journal();
        let disk_now = disk(&dir);
        let rt = runtime(&journal);
        let c = tokio.block_on(census(&journal, &rt));
        drop(rt);
        drop(journal);
        let ops = c.ops.max(1) as f64;
        let per = |x: u64| x as f64 / ops;
        let (hits, hit_bytes) = c.kinds.get("DedupeHit").copied().unwrap_or((0, 0));
        let write_events = c.events - hits;
        println!(
            "the records (a scan after the run: {} operations, {} steps, {} audit events, {hits} of them \
             the replays' DedupeHit)",
            c.ops, c.steps, c.events
        );
        println!(
            "  per operation: key {:.0} B + stored value {:.0} B = {:.0} B; the calls' own audit events: \
             {:.2} of {:.0} B = {:.0} B (+12 B of framing each in an audit file, before compression)",
            per(c.op_key_bytes),
            per(c.op_value_bytes),
            per(c.op_key_bytes + c.op_value_bytes),
            write_events as f64 / ops,
            (c.event_bytes - hit_bytes) as f64 / write_events.max(1) as f64,
            per(c.event_bytes - hit_bytes)
        );
        let live = c.op_key_bytes
            + c.op_value_bytes
            + c.step_bytes
            + c.event_bytes
            + 12 * c.events
            + 8 * c.events.div_ceil(128);
        let sled_files: u64 = ["sled/db", "sled/blobs", "sled/snap.*", "sled/conf"]
            .iter()
            .map(|k| disk_now.get(*k).map_or(0, |e| e.apparent))
            .sum();
        let group = |k: &str| disk_now.get(k).map_or(0, |e| e.apparent);
        let tables = group("journal/tables (idem-table.*)");
        let audit_files = group("journal/audit files (idem-audit.*)");
        let records = c.op_key_bytes + c.op_value_bytes + c.step_bytes;
        println!(
            "  live keys and values (uncompressed): {:.0} B/op; tables now {:.0} B/op = {:.2} x the \
             records' bytes, audit files {:.0} B/op = {:.2} x the events' bytes; sled's files {:.0} \
             B/op; image now {:.0} B/op, log now {:.0} B/op",
            per(live),
            per(tables),
            tables as f64 / records.max(1) as f64,
            per(audit_files),
            audit_files as f64 / c.event_bytes.max(1) as f64,
            per(sled_files),
            per(disk_now.get("journal/idem-image").map_or(0, |e| e.apparent)),
            per(disk_now
                .iter()
                .filter(|(k, _)| k.starts_with("journal/log"))
                .map(|(_, e)| e.apparent)
                .sum::<u64>())
        );
        println!(
            "  operation record, field by field ({} decoded, {} not):",
            c.fields.parsed, c.fields.unparsed
        );
        let mut f: Vec<(&str, f64)> = c
            .fields
            .sums
            .iter()
            .map(|(k, v)| (*k, *v as f64 / c.fields.parsed.max(1) as f64))
            .collect();
        f.push(("key (SHA-256 of the operation key)", per(c.op_key_bytes)));
        f.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, avg) in f {
            println!("    {name:<54} {avg:>6.1} B");
        }
        println!("  audit events by kind:");
        for (k, (count, bytes)) in &c.kinds {
            println!(
                "    {k:<54} {:>6.2} per op, {:>5.0} B each",
                *count as f64 / ops,
                *bytes as f64 / (*count).max(1) as f64
            );
        }
        println!("  what fills an audit event (average bytes of its fields' text):");
        for (name, sum) in &c.event_fields {
            println!(
                "    {name:<54} {:>6.1} B",
                *sum as f64 / c.events_decoded.max(1) as f64
            );
        }
        census_out = Some((
            per(c.op_key_bytes + c.op_value_bytes),
            write_events as f64 / ops,
            (c.event_bytes - hit_bytes) as f64 / write_events.max(1) as f64,
            tables as f64 / records.max(1) as f64,
            audit_files as f64 / c.event_bytes.max(1) as f64,
        ));
    }

    // ---- the table ----
    let first = window_rates.first().copied().unwrap_or(0.0);
    let last = window_rates.last().copied().unwrap_or(0.0);
    let mib_k = |k: u64| k as f64 / 1024.0;
    println!();
    println!("summary at {n} operations (targets in brackets; baselines from this run)");
    let rows: Vec<(String, String, &str)> = vec![
        (
            "bytes on disk per op".into(),
            format!(
                "{:.0} B ({:.1} MiB)",
                apparent as f64 / n as f64,
                mib(apparent)
            ),
            "<= 400 B",
        ),
        (
            "  of which tables / audit files / sled / image / log".into(),
            format!(
                "{:.0} / {:.0} / {:.0} / {:.0} / {:.0} B",
                disk_after
                    .get("journal/tables (idem-table.*)")
                    .map_or(0, |e| e.apparent) as f64
                    / n as f64,
                disk_after
                    .get("journal/audit files (idem-audit.*)")
                    .map_or(0, |e| e.apparent) as f64
                    / n as f64,
                ["sled/db", "sled/blobs", "sled/snap.*"]
                    .iter()
                    .map(|k| disk_after.get(*k).map_or(0, |e| e.apparent))
                    .sum::<u64>() as f64
                    / n as f64,
                disk_after
                    .get("journal/idem-image")
                    .map_or(0, |e| e.apparent) as f64
                    / n as f64,
                disk_after
                    .iter()
                    .filter(|(k, _)| k.starts_with("journal/log"))
                    .map(|(_, e)| e.apparent)
                    .sum::<u64>() as f64
                    / n as f64
            ),
            "",
        ),
        (
            "  record / events per op / event size / tables per record byte / audit files per event byte".into(),
            census_out.map_or("(--no-inspect)".into(), |(r, e, s, t, a)| {
                format!("{r:.0} B / {e:.2} / {s:.0} B / {t:.2} x / {a:.2} x")
            }),
            "",
        ),
        (
            "RSS at start / max while writing".into(),
            format!("{:.1} / {:.1} MiB", mib_k(m0.rss), mib_k(max_rss_writing)),
            "<= 128 MiB",
        ),
        (
            "RSS after writing / after the drop (+2 s)".into(),
            format!(
                "{:.1} / {:.1} ({:.1}) MiB{}",
                mib_k(m_written.rss),
                mib_k(m_dropped.rss),
                mib_k(m_dropped_later.rss),
                m_trimmed.map_or(String::new(), |m| format!(", trimmed {:.1}", mib_k(m.rss)))
            ),
            "returned",
        ),
        (
            "RSS after reopen / max during replays".into(),
            format!(
                "{:.1} / {:.1} MiB",
                mib_k(m_reopened.rss),
                mib_k(max_rss_replaying.max(m_replayed.rss))
            ),
            "<= 128 MiB",
        ),
        (
            "close / reopen".into(),
            format!("{:.3} / {:.3} s", close.as_secs_f64(), reopen.as_secs_f64()),
            "reopen <= 0.5 s at 1 M",
        ),
        (
            "replay uniform p50 / p99".into(),
            format!("{:.1} / {:.1} us", us(cold.p50), us(cold.p99)),
            "p99 <= 50 us",
        ),
        (
            "replay cached p50".into(),
            format!("{:.2} us", us(cached.p50)),
            "<= 2 us",
        ),
        (
            "write rate: all / first window / last window".into(),
            format!(
                "{:.0} / {first:.0} / {last:.0} ops/s",
                n as f64 / elapsed.as_secs_f64()
            ),
            ">= 50000, flat",
        ),
        (
            "log fdatasyncs per op".into(),
            format!("{:.3}", fsyncs as f64 / n as f64),
            "",
        ),
        (
            "fdatasync p50: one / two".into(),
            format!("{:.0} / {:.0} us", us(one.p50), us(two.p50)),
            "baseline",
        ),
        (
            "fresh call p50, one task / two fdatasyncs".into(),
            format!("{:.0} us = {:.2} x", us(seq.p50), us(seq.p50) / us(two.p50)),
            "<= 1.3 x",
        ),
    ];
    for (what, value, target) in rows {
        println!("  {what:<58} {value:<30} [{target}]");
    }
    if o.keep {
        let kept = tmp.keep();
        println!("journal kept in {}", kept.display());
    }
}
