//! The embedded journal: sled 0.34, one tree per [`Space`], and a group
//! commit thread that turns many concurrent `sync` requests into one flush.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::oneshot;

use super::{Cas, Journal, ScanIter, Space, SyncFuture};
use crate::error::Error;
use crate::record::{self, Kind, Meta};

/// Options of [`SledJournal::open_with`].
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// sled's page cache size in bytes. Bounds the journal's memory whatever
    /// the number of records.
    pub cache_capacity: u64,
    /// How often sled writes its buffers in the background (not an fsync
    /// guarantee; idem's own `sync` is).
    pub flush_every_ms: Option<u64>,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            cache_capacity: 64 << 20,
            flush_every_ms: Some(500),
        }
    }
}

/// The embedded journal on sled 0.34.7.
///
/// sled holds an exclusive lock on the directory's data file: one process
/// (and one open journal) per directory; a second gets [`Error::InUse`].
pub struct SledJournal {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    location: String,
    path: PathBuf,
    data_file: Arc<File>,
    commit: Arc<GroupCommit>,
}

/// Group commit: callers queue a waiter; whoever finds no flusher running
/// starts one on tokio's blocking pool. The flusher takes every waiter queued
/// so far, flushes once, answers them all, and goes again until the queue is
/// empty. Callers arriving during a flush share the next one.
///
/// The blocking pool (rather than a thread of our own) matters for tests: a
/// paused tokio clock does not auto-advance while blocking work is running,
/// so timers cannot fire "during" an fsync.
#[derive(Default)]
struct GroupCommit {
    state: Mutex<CommitState>,
    idle: Condvar,
}

#[derive(Default)]
struct CommitState {
    flushing: bool,
    waiters: Vec<oneshot::Sender<Result<(), String>>>,
}

impl std::fmt::Debug for SledJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledJournal")
            .field("path", &self.path)
            .finish()
    }
}

/// Files sled 0.34 keeps in a database directory.
fn is_sled_file(name: &str) -> bool {
    name == "conf" || name == "db" || name == "blobs" || name.starts_with("snap.")
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
                    if !is_sled_file(&name) {
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
            return Err(not_journal("it has no sled data file".to_string()));
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

        // sled's own flush ends in sync_file_range, which neither flushes the
        // device's write cache nor the file size. An fdatasync on the same
        // inode closes that gap; any descriptor of the file will do.
        let data_file = Arc::new(
            File::open(path.join("db"))
                .map_err(|e| Error::storage("open data file", &location, e))?,
        );

        Ok(SledJournal {
            db,
            trees,
            location,
            path,
            data_file,
            commit: Arc::default(),
        })
    }

    /// The journal directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn tree(&self, space: Space) -> &sled::Tree {
        &self.trees[space as usize]
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

/// The flusher: runs on the blocking pool until no waiter is left.
fn flush_loop(commit: Arc<GroupCommit>, db: sled::Db, file: Arc<File>) {
    let mut resources = Some((db, file));
    loop {
        let batch = {
            let mut state = commit.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.waiters.is_empty() {
                // Release our handles on the database before saying we are
                // idle, so that dropping the journal releases its lock.
                drop(resources.take());
                state.flushing = false;
                commit.idle.notify_all();
                return;
            }
            std::mem::take(&mut state.waiters)
        };
        let result = match &resources {
            Some((db, file)) => flush(db, file).map_err(|e| e.to_string()),
            None => Err("the journal was closed".to_string()),
        };
        for waiter in batch {
            // A waiter whose call was dropped no longer listens; fine.
            let _ = waiter.send(result.clone());
        }
    }
}

fn flush(db: &sled::Db, file: &File) -> std::io::Result<()> {
    db.flush().map_err(std::io::Error::other)?;
    file.sync_data()
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
        match self
            .tree(space)
            .compare_and_swap(key, expected, new)
            .map_err(|e| self.err("compare-and-swap", e))?
        {
            Ok(()) => Ok(Cas::Swapped),
            Err(conflict) => Ok(Cas::Conflict {
                current: conflict.current.map(|v| v.to_vec()),
            }),
        }
    }

    fn insert(&self, space: Space, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.tree(space)
            .insert(key, value)
            .map(|_| ())
            .map_err(|e| self.err("write", e))
    }

    fn remove(&self, space: Space, key: &[u8]) -> Result<(), Error> {
        self.tree(space)
            .remove(key)
            .map(|_| ())
            .map_err(|e| self.err("remove", e))
    }

    fn append(&self, space: Space, value: &[u8]) -> Result<u64, Error> {
        let seq = self
            .db
            .generate_id()
            .map_err(|e| self.err("generate sequence number", e))?;
        self.insert(space, &seq.to_be_bytes(), value)?;
        Ok(seq)
    }

    fn scan(&self, space: Space, from: &[u8]) -> ScanIter<'_> {
        let location = self.location.clone();
        Box::new(self.tree(space).range(from.to_vec()..).map(move |item| {
            item.map(|(k, v)| (k.to_vec(), v.to_vec()))
                .map_err(|e| Error::storage("scan", &location, e))
        }))
    }

    fn sync(&self) -> SyncFuture {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = self.commit.state.lock().unwrap_or_else(|p| p.into_inner());
            state.waiters.push(tx);
            !std::mem::replace(&mut state.flushing, true)
        };
        let location = self.location.clone();
        let stopped = |location: &str| Error::storage("sync", location, "the flusher stopped");
        let started = if start {
            let (commit, db, file) = (self.commit.clone(), self.db.clone(), self.data_file.clone());
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn_blocking(move || flush_loop(commit, db, file));
                    Ok(())
                }
                Err(_) => {
                    // Outside tokio: flush on this thread.
                    flush_loop(commit, db, file);
                    Ok(())
                }
            }
        } else {
            Ok(())
        };
        Box::pin(async move {
            started?;
            match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::storage("sync", &location, e)),
                Err(_) => Err(stopped(&location)),
            }
        })
    }

    fn sync_blocking(&self) -> Result<(), Error> {
        flush(&self.db, &self.data_file).map_err(|e| self.err("sync", e))
    }

    fn size_on_disk(&self) -> Result<u64, Error> {
        self.db.size_on_disk().map_err(|e| self.err("measure", e))
    }
}

impl Drop for SledJournal {
    fn drop(&mut self) {
        // Wait for a running flusher to let go of its database handle, so
        // that the directory lock is released with the caller's last handle.
        let mut state = self.commit.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.flushing {
            state = self
                .commit
                .idle
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
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
