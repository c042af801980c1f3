//! The embedded journal: sled 0.34 holds the state, one tree per
//! [`Space`]; a write-ahead log (`wal.rs`) makes it durable with one
//! fdatasync per group commit.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::events;
use super::wal::{self, Entry, Waiter, Wal};
use super::{Cas, Journal, ScanIter, Space, SyncFuture};
use crate::error::Error;
use crate::record::{self, Kind, Meta};

/// Options of [`SledJournal::open_with`].
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// sled's page cache size in bytes. Bounds the journal's memory whatever
    /// the number of records.
    pub cache_capacity: u64,
    /// How often sled writes its buffers in the background. Durability
    /// does not depend on it (the write-ahead log provides it), so the
    /// default is never: sled then writes when a buffer fills and at each
    /// checkpoint, and its writes stop competing with the log's fdatasyncs
    /// for the device (15 % off a fresh call here).
    pub flush_every_ms: Option<u64>,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            cache_capacity: 64 << 20,
            flush_every_ms: None,
        }
    }
}

/// The embedded journal on sled 0.34.7.
///
/// sled holds an exclusive lock on the directory's data file: one process
/// (and one open journal) per directory; a second gets [`Error::InUse`].
pub struct SledJournal {
    /// `None` only while dropping.
    open: Option<Open>,
    location: String,
    path: PathBuf,
}

struct Open {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    wal: Arc<Wal>,
}

impl std::fmt::Debug for SledJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledJournal")
            .field("path", &self.path)
            .finish()
    }
}

/// Files a journal directory holds: sled 0.34's and the log's segments.
fn is_journal_file(name: &str) -> bool {
    name == "conf"
        || name == "db"
        || name == "blobs"
        || name.starts_with("snap.")
        || wal::is_segment(name)
}

impl SledJournal {
    /// Opens (or creates) the journal in directory `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<SledJournal, Error> {
        SledJournal::open_with(path, &SledOptions::default())
    }

    /// Opens (or creates) the journal with options.
    pub fn open_with(path: impl AsRef<Path>, options: &SledOptions) -> Result<SledJournal, Error> {
        let path = path.as_ref().to_path_buf();
        let location = path.display().to_string();
        let not_journal = |detail: String| Error::NotAJournal {
            path: path.clone(),
            detail,
        };
        let fresh = match fs::read_dir(&path) {
            Ok(entries) => {
                let mut foreign = Vec::new();
                let mut any = false;
                for entry in entries {
                    let entry = entry.map_err(|e| Error::storage("open", &location, e))?;
                    any = true;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if !is_journal_file(&name) {
                        foreign.push(name);
                    }
                }
                if !foreign.is_empty() {
                    foreign.sort();
                    foreign.truncate(5);
                    return Err(not_journal(format!(
                        "it holds files a journal never has: {}",
                        foreign.join(", ")
                    )));
                }
                !any
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(not_journal("it is a file, not a directory".to_string()));
            }
            Err(e) => return Err(Error::storage("open", &location, e)),
        };
        if !fresh && !path.join("db").is_file() {
            // sled writes its `conf` before its data file: a process killed
            // in between leaves a journal whose creation never finished, and
            // nothing can have been written to it. Log segments without a
            // data file, though, would mean the data file was lost.
            let has_segments = fs::read_dir(&path)
                .map_err(|e| Error::storage("open", &location, e))?
                .filter_map(Result::ok)
                .any(|e| wal::is_segment(&e.file_name().to_string_lossy()));
            if has_segments {
                return Err(not_journal(
                    "it has write-ahead log segments but no sled data file".to_string(),
                ));
            }
            // sled writes `conf` in two parts (text, then checksum) and
            // would refuse a torn one as corrupt; with no data file there is
            // nothing it could describe, so start over.
            let _ = fs::remove_file(path.join("conf"));
        }

        // sled writes a snapshot as `snap.<lsn>.generating`, then renames
        // it; a process killed in between leaves the partial file, and sled
        // 0.34 picks it (it sorts last) and reports the journal corrupt. It
        // is never anything but garbage: sled rebuilds it from its log.
        if !fresh {
            for entry in fs::read_dir(&path)
                .map_err(|e| Error::storage("open", &location, e))?
                .filter_map(Result::ok)
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("snap.") && name.ends_with(".generating") {
                    fs::remove_file(entry.path())
                        .map_err(|e| Error::storage("remove a partial snapshot", &location, e))?;
                }
            }
        }

        let db = sled::Config::new()
            .path(&path)
            .cache_capacity(options.cache_capacity)
            .flush_every_ms(options.flush_every_ms)
            .open()
            .map_err(|e| map_open_error(e, &path))?;

        let mut trees = Vec::with_capacity(Space::ALL.len());
        for space in Space::ALL {
            trees.push(
                db.open_tree(space.name())
                    .map_err(|e| Error::storage("open tree", &location, e))?,
            );
        }
        // Whatever the log holds was acknowledged as durable; sled may not
        // have written all of it before the last process ended.
        let mut replayed_events = Vec::new();
        let (last_gen, replayed) = wal::replay(&path, |e| {
            if e.space == Space::Audit {
                if let (Ok(seq), Some(v)) = (<[u8; 8]>::try_from(e.key), e.value) {
                    replayed_events.push((u64::from_be_bytes(seq), v.to_vec()));
                }
                return;
            }
            let tree = &trees[e.space as usize];
            let _ = match e.value {
                Some(v) => tree.insert(e.key, v).map(|_| ()),
                None => tree.remove(e.key).map(|_| ()),
            };
        })
        .map_err(|e| Error::storage("replay the write-ahead log", &location, e))?;
        let audit_tree = &trees[Space::Audit as usize];
        let stored = events::last_seq(audit_tree)
            .map_err(|e| Error::storage("read the audit stream", &location, e))?;
        replayed_events.retain(|(seq, _)| stored.is_none_or(|last| *seq > last));
        for chunk in replayed_events.chunks(4096) {
            audit_tree
                .insert(chunk[0].0.to_be_bytes(), events::encode_batch(chunk))
                .map_err(|e| Error::storage("replay the audit stream", &location, e))?;
        }
        let next_seq = replayed_events
            .last()
            .map(|e| e.0)
            .max(stored)
            .map_or(0, |last| last + 1);
        let meta_tree = &trees[Space::Meta as usize];
        match meta_tree
            .get(b"meta")
            .map_err(|e| Error::storage("read metadata", &location, e))?
        {
            Some(bytes) => {
                let meta: Meta = record::decode(Kind::Meta, &bytes, &location, b"meta")?;
                if meta.magic != record::MAGIC {
                    return Err(not_journal(format!("metadata names {:?}", meta.magic)));
                }
                if meta.format != record::FORMAT {
                    return Err(Error::UnsupportedFormat {
                        path,
                        found: meta.format,
                        supported: record::FORMAT,
                    });
                }
            }
            None => {
                // No metadata: either we are creating it, or a creation died
                // before writing it. Anything else (a foreign sled database)
                // holds data we must not adopt.
                let foreign_trees: Vec<String> = db
                    .tree_names()
                    .into_iter()
                    .map(|n| String::from_utf8_lossy(&n).into_owned())
                    .filter(|n| n != "__sled__default" && !Space::ALL.iter().any(|s| s.name() == n))
                    .collect();
                let has_data = !db.is_empty() || trees.iter().any(|t| !t.is_empty());
                if !fresh && (has_data || !foreign_trees.is_empty()) {
                    return Err(not_journal(
                        "a sled database without idem metadata".to_string(),
                    ));
                }
                let meta = Meta {
                    magic: record::MAGIC.to_string(),
                    format: record::FORMAT,
                    created_ms: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as u64)
                        .unwrap_or(0),
                };
                meta_tree
                    .insert(b"meta", record::encode(Kind::Meta, &meta)?)
                    .map_err(|e| Error::storage("write metadata", &location, e))?;
                db.flush()
                    .map_err(|e| Error::storage("flush metadata", &location, e))?;
            }
        }

        let db_file = File::open(path.join("db"))
            .map_err(|e| Error::storage("open data file", &location, e))?;
        if last_gen > 0 {
            // Make what was replayed durable in sled before the segments go.
            if replayed > 0 {
                db.flush()
                    .map_err(|e| Error::storage("flush replayed log", &location, e))?;
                db_file
                    .sync_data()
                    .map_err(|e| Error::storage("flush replayed log", &location, e))?;
            }
            wal::remove_up_to(&path, last_gen)
                .map_err(|e| Error::storage("remove replayed log", &location, e))?;
        }
        let wal = Wal::start(
            &path,
            last_gen,
            db.clone(),
            db_file,
            trees[Space::Audit as usize].clone(),
            next_seq,
        )
        .map_err(|e| Error::storage("start the write-ahead log", &location, e))?;

        Ok(SledJournal {
            open: Some(Open {
                db,
                trees,
                wal: Arc::new(wal),
            }),
            location,
            path,
        })
    }

    /// The journal directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn state(&self) -> &Open {
        self.open
            .as_ref()
            .expect("the journal is open until dropped")
    }

    fn wal(&self) -> &Arc<Wal> {
        &self.state().wal
    }

    fn tree(&self, space: Space) -> &sled::Tree {
        &self.state().trees[space as usize]
    }

    fn err(&self, op: &'static str, e: impl std::fmt::Display) -> Error {
        Error::storage(op, &self.location, e)
    }
}

fn map_open_error(e: sled::Error, path: &Path) -> Error {
    let text = e.to_string();
    if text.contains("could not acquire lock") {
        Error::InUse {
            path: path.to_path_buf(),
        }
    } else if let sled::Error::Corruption { .. } = e {
        Error::NotAJournal {
            path: path.to_path_buf(),
            detail: format!("sled reports corruption: {text}"),
        }
    } else {
        Error::storage("open", &path.display().to_string(), text)
    }
}

impl Journal for SledJournal {
    fn location(&self) -> &str {
        &self.location
    }

    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.tree(space)
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| self.err("read", e))
    }

    fn compare_and_swap(
        &self,
        space: Space,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<Cas, Error> {
        self.compare_and_swap_with_events(space, key, expected, new, &[])
            .map(|(cas, _)| cas)
    }

    fn compare_and_swap_with_events(
        &self,
        space: Space,
        key: &[u8],
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        events: &[Vec<u8>],
    ) -> Result<(Cas, Vec<u64>), Error> {
        let tree = self.tree(space);
        let (outcome, seqs) = self.wal().logged_with_events(
            || tree.compare_and_swap(key, expected, new),
            |r| {
                matches!(r, Ok(Ok(()))).then_some(Entry {
                    space,
                    key,
                    value: new,
                })
            },
            events,
        );
        match outcome.map_err(|e| self.err("compare-and-swap", e))? {
            Ok(()) => Ok((Cas::Swapped, seqs)),
            Err(conflict) => Ok((
                Cas::Conflict {
                    current: conflict.current.map(|v| v.to_vec()),
                },
                seqs,
            )),
        }
    }

    fn insert(&self, space: Space, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let tree = self.tree(space);
        self.wal()
            .logged(
                || tree.insert(key, value),
                |r| {
                    r.is_ok().then_some(Entry {
                        space,
                        key,
                        value: Some(value),
                    })
                },
            )
            .map(|_| ())
            .map_err(|e| self.err("write", e))
    }

    fn remove(&self, space: Space, key: &[u8]) -> Result<(), Error> {
        let tree = self.tree(space);
        self.wal()
            .logged(
                || tree.remove(key),
                |r| {
                    r.is_ok().then_some(Entry {
                        space,
                        key,
                        value: None,
                    })
                },
            )
            .map(|_| ())
            .map_err(|e| self.err("remove", e))
    }

    fn append(&self, space: Space, value: &[u8]) -> Result<u64, Error> {
        if space == Space::Audit {
            return Ok(self.wal().append_audit(value));
        }
        let seq = self
            .state()
            .db
            .generate_id()
            .map_err(|e| self.err("generate sequence number", e))?;
        self.insert(space, &seq.to_be_bytes(), value)?;
        Ok(seq)
    }

    fn truncate(&self, space: Space, before: &[u8]) -> Result<u64, Error> {
        let tree = self.tree(space);
        let mut keys = Vec::new();
        for key in tree.range(..before.to_vec()).keys() {
            keys.push(key.map_err(|e| self.err("truncate", e))?);
        }
        let mut removed = 0;
        if space == Space::Audit {
            // Batch i holds sequence numbers [key i, key i+1): it is wholly
            // older than `before` only if the next batch starts at or before
            // it. The last batch below `before` may hold newer events; keep it.
            let next_after = tree
                .range(before.to_vec()..)
                .keys()
                .next()
                .transpose()
                .map_err(|e| self.err("truncate", e))?;
            for (i, key) in keys.iter().enumerate() {
                let next = keys.get(i + 1).or(next_after.as_ref());
                if next.is_some_and(|n| n.as_ref() <= before) {
                    if let Some(v) = tree.get(key).map_err(|e| self.err("truncate", e))? {
                        removed += events::decode_batch(&v).map_or(0, |e| e.len() as u64);
                    }
                    self.remove(space, key)?;
                }
            }
        } else {
            for key in &keys {
                self.remove(space, key)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    fn scan(&self, space: Space, from: &[u8]) -> ScanIter<'_> {
        let location = self.location.clone();
        if space == Space::Audit {
            let mut seq = [0u8; 8];
            let n = from.len().min(8);
            seq[..n].copy_from_slice(&from[..n]);
            let tail = self.wal().audit_tail();
            return Box::new(events::scan(
                self.tree(space),
                tail,
                u64::from_be_bytes(seq),
                location,
            ));
        }
        Box::new(self.tree(space).range(from.to_vec()..).map(move |item| {
            item.map(|(k, v)| (k.to_vec(), v.to_vec()))
                .map_err(|e| Error::storage("scan", &location, e))
        }))
    }

    fn sync(&self) -> SyncFuture {
        let (tx, rx) = oneshot::channel();
        if self.wal().enqueue(Waiter::Async(tx)) {
            let wal = self.wal().clone();
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => drop(handle.spawn_blocking(move || wal.flush_loop())),
                // Outside tokio: flush on this thread.
                Err(_) => wal.flush_loop(),
            }
        }
        let location = self.location.clone();
        Box::pin(async move {
            match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::storage("sync", &location, e)),
                Err(_) => Err(Error::storage("sync", &location, "the flusher stopped")),
            }
        })
    }

    fn sync_blocking(&self) -> Result<(), Error> {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.wal().enqueue(Waiter::Blocking(tx)) {
            self.wal().clone().flush_loop();
        }
        match rx.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.err("sync", e)),
            Err(_) => Err(self.err("sync", "the flusher stopped")),
        }
    }

    fn size_on_disk(&self) -> Result<u64, Error> {
        let open = self.state();
        let sled = open.db.size_on_disk().map_err(|e| self.err("measure", e))?;
        Ok(sled + open.wal.size())
    }
}

impl Drop for SledJournal {
    fn drop(&mut self) {
        // Events that need no barrier of their own (dedupe hits, retries)
        // wait in memory for the next one; a clean close is one.
        let _ = self.sync_blocking();
        let Some(open) = self.open.take() else {
            return;
        };
        // A flusher on the blocking pool holds the log (and through it a
        // handle on the database): wait until it has let go.
        open.wal.wait_idle();
        while Arc::strong_count(&open.wal) > 1 {
            std::thread::yield_now();
        }
        drop(open);
        // sled's I/O threads may still hold its data file for a moment after
        // the last handle is gone. Wait (briefly, boundedly) until its lock
        // is free, so that dropping the journal means it can be reopened.
        let data = self.path.join("db");
        for _ in 0..2000 {
            match File::open(&data).map(|f| f.try_lock()) {
                Ok(Ok(())) | Err(_) => return,
                Ok(Err(_)) => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_format_version_is_refused_and_left_alone() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let j = SledJournal::open(dir.path()).unwrap();
            let meta = Meta {
                magic: record::MAGIC.to_string(),
                format: record::FORMAT + 1,
                created_ms: 0,
            };
            j.insert(
                Space::Meta,
                b"meta",
                &record::encode(Kind::Meta, &meta).unwrap(),
            )
            .unwrap();
            j.sync_blocking().unwrap();
        }
        let err = SledJournal::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedFormat { found, supported, .. } if found == record::FORMAT + 1 && supported == record::FORMAT),
            "{err}"
        );
        assert!(err.to_string().contains(&dir.path().display().to_string()));
        // Still refused: nothing was rewritten by the failed open.
        assert!(matches!(
            SledJournal::open(dir.path()),
            Err(Error::UnsupportedFormat { .. })
        ));
    }

    #[test]
    fn a_creation_killed_before_the_data_file_reopens() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("journal");
        // What a kill between sled's `conf` and its data file leaves: a
        // conf without its checksum, no data file.
        fs::create_dir_all(path.join("blobs")).unwrap();
        fs::write(
            path.join("conf"),
            b"segment_size: 524288\nuse_compression: false\nversion: 0.34\n",
        )
        .unwrap();
        drop(SledJournal::open(&path).unwrap());
        drop(SledJournal::open(&path).unwrap());
        // Log segments without a data file are another matter.
        let other = dir.path().join("other");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join("idem-wal.0000000000000001"), b"IDEMWAL1").unwrap();
        let err = SledJournal::open(&other).unwrap_err();
        assert!(matches!(err, Error::NotAJournal { .. }), "{err}");
    }

    #[test]
    fn a_snapshot_killed_while_generating_is_ignored() {
        let dir = tempfile::TempDir::new().unwrap();
        drop(SledJournal::open(dir.path()).unwrap());
        // Sorts after every real snapshot; sled 0.34 would read it.
        fs::write(
            dir.path().join("snap.FFFFFFFFFFFFFFFF.generating"),
            b"half a snapshot, no checksum",
        )
        .unwrap();
        drop(SledJournal::open(dir.path()).unwrap());
        assert!(!dir.path().join("snap.FFFFFFFFFFFFFFFF.generating").exists());
    }

    #[test]
    fn a_state_change_and_its_events_are_one_unit() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let j = SledJournal::open(dir.path()).unwrap();
            let events = vec![b"e1".to_vec(), b"e2".to_vec()];
            // A conflict writes nothing, events included.
            let (cas, seqs) = j
                .compare_and_swap_with_events(Space::Ops, b"k", Some(b"x"), Some(b"v1"), &events)
                .unwrap();
            assert!(matches!(cas, Cas::Conflict { current: None }));
            assert!(seqs.is_empty());
            assert_eq!(j.scan(Space::Audit, &[]).count(), 0);
            let (cas, seqs) = j
                .compare_and_swap_with_events(Space::Ops, b"k", None, Some(b"v1"), &events)
                .unwrap();
            assert_eq!((cas, seqs.len()), (Cas::Swapped, 2));
            j.sync_blocking().unwrap();
        }
        let j = SledJournal::open(dir.path()).unwrap();
        assert_eq!(
            j.get(Space::Ops, b"k").unwrap().as_deref(),
            Some(&b"v1"[..])
        );
        let stored: Vec<_> = j.scan(Space::Audit, &[]).map(|e| e.unwrap().1).collect();
        assert_eq!(stored, [b"e1".to_vec(), b"e2".to_vec()]);
    }

    #[test]
    fn corrupt_metadata_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let j = SledJournal::open(dir.path()).unwrap();
            j.insert(Space::Meta, b"meta", b"garbage").unwrap();
            j.sync_blocking().unwrap();
        }
        let err = SledJournal::open(dir.path()).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    }

    #[test]
    fn a_foreign_sled_database_is_not_adopted() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            db.insert(b"someone", b"else's data").unwrap();
            db.flush().unwrap();
        }
        let err = SledJournal::open(dir.path()).unwrap_err();
        assert!(matches!(err, Error::NotAJournal { .. }), "{err}");
        let db = sled::open(dir.path()).unwrap();
        assert_eq!(db.get(b"someone").unwrap().unwrap(), &b"else's data"[..]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_syncs_share_flushes() {
        let dir = tempfile::TempDir::new().unwrap();
        let j = Arc::new(SledJournal::open(dir.path()).unwrap());
        let mut tasks = Vec::new();
        for i in 0..64u32 {
            let j = j.clone();
            tasks.push(tokio::spawn(async move {
                j.insert(Space::Steps, &i.to_be_bytes(), b"x").unwrap();
                j.sync().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // Every sync answered; all writes are visible.
        assert_eq!(j.scan(Space::Steps, &[]).count(), 64);
    }
}
