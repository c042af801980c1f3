//! The embedded journal: sled 0.34, one tree per [`Space`], and a group
//! commit thread that turns many concurrent `sync` requests into one flush.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
    syncer: Mutex<Option<mpsc::Sender<oneshot::Sender<Result<(), String>>>>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SledJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledJournal").field("path", &self.path).finish()
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
            File::open(path.join("db")).map_err(|e| Error::storage("open data file", &location, e))?,
        );

        let (tx, rx) = mpsc::channel::<oneshot::Sender<Result<(), String>>>();
        let thread_db = db.clone();
        let thread_file = data_file.clone();
        let thread = std::thread::Builder::new()
            .name("idem-group-commit".into())
            .spawn(move || group_commit(rx, thread_db, thread_file))
            .map_err(|e| Error::storage("start group commit", &location, e))?;

        Ok(SledJournal {
            db,
            trees,
            location,
            path,
            data_file,
            syncer: Mutex::new(Some(tx)),
            thread: Some(thread),
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

/// One physical flush serves every request that arrived before it started.
fn group_commit(
    rx: mpsc::Receiver<oneshot::Sender<Result<(), String>>>,
    db: sled::Db,
    file: Arc<File>,
) {
    let mut batch = Vec::new();
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let result = flush(&db, &file).map_err(|e| e.to_string());
        for waiter in batch.drain(..) {
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
        let sent = self
            .syncer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|s| s.send(tx).is_ok())
            .unwrap_or(false);
        let location = self.location.clone();
        Box::pin(async move {
            if !sent {
                return Err(Error::storage("sync", &location, "the group commit thread has stopped"));
            }
            match rx.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(Error::storage("sync", &location, e)),
                Err(_) => Err(Error::storage("sync", &location, "the group commit thread has stopped")),
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
        // Stop the group commit thread and wait for it, so that its clone of
        // the database is gone and the directory lock is released when the
        // caller's last handle is.
        self.syncer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
