//! The embedded journal (format 5; format 4 is read and marked 5 at open,
//! see `files.rs`): settled records live in tables (`table.rs`), the
//! audit stream in audit files (`audit.rs`), what can still change in
//! sled 0.34, all named by a manifest; a write-ahead log (`wal.rs`) holds
//! everything since the last checkpoint, and the store (`store.rs`)
//! serves the lot. The log segments a checkpoint settled stay,
//! with an image of sled (`image.rs`), as a second copy of sled's content:
//! sled alone does not survive power loss intact.
//!
//! Opening, in order, changes nothing until it knows the directory is a
//! journal of this format and its log is readable:
//! 1. the directory: created `0700` if missing; refused if it holds files a
//!    journal never has, or if it is not ours (another user's, or writable
//!    by group or others; through a symlink, its target); a warning if
//!    others can read it;
//! 2. `idem-meta`: written first when the journal is created, so a
//!    directory without it holds nothing acknowledged; a newer format is
//!    refused untouched; formats 2 and 3 are opened the old way and
//!    converted first (`legacy.rs`);
//! 3. the manifest, and the log segments since the checkpoint it records,
//!    read under the damage rules (only a torn tail of the newest segment
//!    may be dropped);
//! 4. the tables and audit files the manifest names, checked (footers,
//!    indexes, filters); files it does not name are leftovers, removed;
//! 5. sled, then the segments applied to it, then sled's content checked
//!    against the manifest's digest plus the segments' changes (see
//!    `digest.rs`): damage in sled's files is never absence; it is
//!    repaired from the image and the kept log when they are whole, and
//!    refused otherwise (`repair.rs`);
//! 6. a checkpoint of the log (`settle.rs`), and a fresh segment; then a
//!    low-priority scrub of every page and chunk (`store.rs`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::apply;
use crate::files::{self, Checkpoint, Manifest, Meta};
use crate::memory;
use crate::store::{Store, Tuning};
use crate::table::{self, Table};
use crate::wal::{self, Tree, Unit};
use crate::{audit, image, legacy, repair, settle};
use idem_journal::error::Error;
use idem_journal::journal::{
    BoxFuture, Digest, Durability, EventRows, Journal, Loaded, NewEvent, Space, Write, Written,
};
use idem_journal::record::Kind;

/// Options of [`SledJournal::open_with`].
#[derive(Debug, Clone)]
pub struct SledOptions {
    /// sled's page cache size in bytes (default 64 MiB). sled holds only
    /// what can still change (calls in flight, escalations, approvals
    /// waiting), so the cache holds all of it in most journals and reaches
    /// this bound only when that is large. An open journal's memory is
    /// this, the changes since the last checkpoint (at most about three
    /// times `checkpoint_bytes`: under a load that outruns checkpoints,
    /// writers wait for them), and what grows with the history: each
    /// table's Bloom filter and page index, about 2.75 MB per million
    /// settled records (settled records and the audit stream themselves
    /// stay on disk). sled counts a page by its size on disk; in memory it
    /// takes up to about twice that.
    pub cache_capacity: u64,
    /// How often sled writes its buffers in the background. Durability
    /// never depends on it (the write-ahead log provides it, and sled only
    /// receives changes at checkpoints), so the default is never.
    pub flush_every_ms: Option<u64>,
    /// A checkpoint settles the log (into a table, an audit file and sled)
    /// once the current log segment holds this many bytes (default 8 MiB).
    /// The changes since the last checkpoint are also held in memory (as a
    /// bounded overlay), so this bounds that memory too: while a checkpoint
    /// runs, at most two more segments' worth of log is accepted before
    /// writers wait for it.
    pub checkpoint_bytes: u64,
    /// Writes made with [`Durability::Eventual`] (dedupe hits, retries,
    /// verify verdicts...) are durable at the latest this long after they
    /// are made (default 100 ms), or once 1 MiB of them is pending.
    pub eventual_delay: Duration,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            cache_capacity: 64 << 20,
            flush_every_ms: None,
            checkpoint_bytes: 8 << 20,
            eventual_delay: Duration::from_millis(100),
        }
    }
}

/// The embedded journal on sled 0.34.7.
///
/// sled holds an exclusive lock on the directory's data file: one process
/// (and one open journal) per directory; a second gets [`Error::InUse`].
/// Runtimes that share one open `SledJournal` (through
/// `Runtime::builder().journal(..)`) share its table of calls in flight, so
/// none of them mistakes another's live call for a crash.
pub struct SledJournal {
    /// `None` only while dropping.
    store: Option<Arc<Store>>,
    location: String,
    path: PathBuf,
}

impl std::fmt::Debug for SledJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledJournal")
            .field("path", &self.path)
            .finish()
    }
}

/// Files a journal directory holds.
fn is_journal_file(name: &str) -> bool {
    files::is_sled_file(name)
        || wal::is_segment(name)
        || files::is_own(name)
        || name.starts_with(repair::SET_ASIDE)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
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
        let storage = |op: &'static str| {
            let location = location.clone();
            move |e: std::io::Error| Error::storage(op, &location, e)
        };
        let not_journal = |detail: String| Error::NotAJournal {
            path: path.clone(),
            detail,
        };

        // 1. The directory.
        let names = match fs::read_dir(&path) {
            Ok(entries) => {
                let mut names = Vec::new();
                for entry in entries {
                    names.push(
                        entry
                            .map_err(storage("open"))?
                            .file_name()
                            .to_string_lossy()
                            .into_owned(),
                    );
                }
                names
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                files::create_private_dir(&path)
                    .map_err(storage("create the journal directory"))?;
                Vec::new()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(not_journal("it is a file, not a directory".to_string()));
            }
            Err(e) => return Err(Error::storage("open", &location, e)),
        };
        let mut foreign: Vec<&String> = names.iter().filter(|n| !is_journal_file(n)).collect();
        if !foreign.is_empty() {
            foreign.sort();
            foreign.truncate(5);
            let list: Vec<&str> = foreign.iter().map(|s| s.as_str()).collect();
            return Err(not_journal(format!(
                "it holds files a journal never has: {}",
                list.join(", ")
            )));
        }
        // Ours, or not touched: a directory another user owns or can
        // write could hold anything they planted.
        idem_journal::files::check_ours(&path, "the journal directory", false)?;
        warn_if_readable_by_others(&path);

        // 2. What the directory is.
        let mut legacy = None;
        let mut format_4 = None;
        match files::read::<Meta>(&path, files::META, Kind::Meta)? {
            Some(meta) => {
                if meta.magic != files::MAGIC {
                    return Err(not_journal(format!("its metadata names {:?}", meta.magic)));
                }
                if meta.format == files::FORMAT_2 || meta.format == files::FORMAT_3 {
                    legacy = Some(meta);
                } else if meta.format == files::FORMAT_4 {
                    format_4 = Some(meta);
                } else if meta.format != files::FORMAT {
                    return Err(Error::UnsupportedFormat {
                        path,
                        found: meta.format,
                        supported: files::FORMAT,
                    });
                }
            }
            None => {
                // Written before anything else: without it, nothing was
                // ever acknowledged here, unless the files are someone
                // else's (sled's own without our metadata: a foreign
                // database, or a journal of idem's first format).
                if names.iter().any(|n| n == "db" || wal::is_segment(n)) {
                    return Err(not_journal(
                        "a sled database or write-ahead log without idem metadata (a foreign \
                         database, or a journal of an older idem format, which this build does \
                         not read)"
                            .to_string(),
                    ));
                }
                clear_unfinished_creation(&path)
                    .map_err(storage("clear an unfinished creation"))?;
                files::write(
                    &path,
                    files::META,
                    Kind::Meta,
                    &Meta {
                        magic: files::MAGIC.to_string(),
                        format: files::FORMAT,
                        created_ms: now_ms(),
                    },
                )?;
            }
        }
        // The cleanups below (a partial image, a partial sled snapshot,
        // leftover tables) would pull files from under a process that has
        // the journal open: check sled's lock first, as sled would.
        if repair::sled_is_held(&path) {
            return Err(Error::InUse { path });
        }
        let settings = repair::SledSettings {
            cache_capacity: options.cache_capacity,
            flush_every_ms: options.flush_every_ms,
        };
        if let Some(meta) = legacy {
            // Opened and checked the old way, then converted; the open
            // below finishes the conversion (`legacy.rs`).
            open_legacy(&path, &location, settings, meta)?;
        }

        // 3. The log since the last checkpoint.
        let manifest = files::read::<Manifest>(&path, files::MANIFEST, Kind::Checkpoint)?;
        let segments = wal::segments(&path).map_err(storage("list the write-ahead log"))?;
        let manifest = match manifest {
            Some(m) => m,
            None if segments.is_empty() => {
                // No open ever finished (the first one writes a manifest
                // before it logs anything): sled's files, if any, hold
                // nothing acknowledged. Start sled afresh.
                clear_unfinished_creation(&path)
                    .map_err(storage("clear an unfinished creation"))?;
                Manifest {
                    next_lsn: 1,
                    next_file: 1,
                    ..Manifest::default()
                }
            }
            None => {
                return Err(Error::Damaged {
                    file: path.join(files::MANIFEST),
                    offset: None,
                    detail: "missing, but write-ahead log segments exist".into(),
                })
            }
        };
        let (units, tail) = read_log(&path, &segments, manifest.gen, manifest.next_lsn)?;
        check_log_end(&path, &segments, &units, manifest.gen, manifest.next_lsn)?;
        trim_tail(tail, &location)?;
        let last_gen = segments
            .last()
            .map_or(manifest.gen, |s| s.0)
            .max(manifest.gen);

        // 4. The tables and audit files the manifest names, checked (their
        // pages are checked where they are read); any other is what a
        // checkpoint or merge cut short left, never named, and goes.
        let tables = open_files(&path, &manifest)?;

        // 5. sled, the log applied to it, and the check; damage repaired from
        // the image and the kept log when they are whole (`repair.rs`).
        let image_gen = image_gen(&path, &location);
        let _ = fs::remove_file(path.join(format!("{}.tmp", image::IMAGE)));
        let opened = repair::open(&repair::Found {
            path: &path,
            location: &location,
            settings,
            checkpoint: repair::Covered {
                gen: manifest.gen,
                next_lsn: manifest.next_lsn,
                digest: manifest.digest(),
            },
            segments: &segments,
            units: &units,
            mode: repair::Mode::Current {
                purge: manifest.legacy_sled,
            },
        })?;
        let trees = opened.trees;
        stop_here("Purged")?;
        if let Some(meta) = format_4 {
            // Nothing to convert: this build reads format 4's tables as
            // they are. Marked before the first table of this build is
            // written (just below, or by the store's checkpoints and
            // merges), so that a build of format 4 refuses the journal as
            // newer than it reads instead of calling that table damaged.
            files::mark_current_format(&path, &meta)?;
            tracing::info!(
                target: "idem::journal",
                location = %location,
                from = files::FORMAT_4,
                to = files::FORMAT,
                "journal marked as the current format: its tables are read as they are, new \
                 ones get blocked Bloom filters"
            );
        }

        // 6. A checkpoint of the log, then a fresh segment. The segments
        // stay (the copy that repairs sled) except those an image covers,
        // whose removal was cut short.
        let mut next_file = manifest.next_file;
        let fold = settle::Fold::of(units);
        let settled = settle::write(&path, &trees, fold, manifest.floor, &mut next_file).map_err(
            |f| match f {
                apply::Failed::Damaged(detail) => Error::Damaged {
                    file: path.join("db"),
                    offset: None,
                    detail,
                },
                apply::Failed::Io(detail) => {
                    Error::storage("settle the write-ahead log", &location, detail)
                }
            },
        )?;
        let (mut next, dropped) = settle::next_manifest(&manifest, &settled, last_gen, next_file);
        next.legacy_sled = false;
        let mut tables = tables;
        if let Some(t) = settled.table {
            tables.push(Arc::new(
                Table::open(&path, t.id, Some(t.bytes)).map_err(|e| table_error(&path, t.id, e))?,
            ));
        }
        files::write(&path, files::MANIFEST, Kind::Checkpoint, &next)?;
        settle::remove_files(&path, &dropped, &[]);
        wal::remove_up_to(&path, image_gen)
            .map_err(storage("remove log segments the image covers"))?;
        restrict_sled_files(&path);
        let image_bytes = fs::metadata(path.join(image::IMAGE)).map_or(0, |m| m.len());
        let store = Store::start(
            path.clone(),
            location.clone(),
            trees,
            next,
            tables,
            (image_gen, image_bytes),
            Tuning {
                checkpoint_bytes: options.checkpoint_bytes,
                eventual_delay: options.eventual_delay,
                eventual_bytes: 1 << 20,
            },
        )
        .map_err(storage("start the write-ahead log"))?;
        store.start_scrub();
        memory::release();
        Ok(SledJournal {
            store: Some(store),
            location,
            path,
        })
    }

    /// The journal directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn store(&self) -> &Arc<Store> {
        self.store
            .as_ref()
            .expect("the journal is open until dropped")
    }

    /// Makes every write so far durable, blocking (for callers outside
    /// async code).
    pub fn sync_blocking(&self) -> Result<(), Error> {
        self.store().barrier_blocking()
    }

    /// How many fdatasyncs of the write-ahead log this handle has made (a
    /// measure of group commit, for tests and benchmarks).
    #[doc(hidden)]
    pub fn log_fsyncs(&self) -> u64 {
        self.store().fsyncs()
    }

    /// The largest a write-ahead log segment has grown in this handle (the
    /// backlog a checkpoint leaves, for tests and benchmarks).
    #[doc(hidden)]
    pub fn log_peak_segment_bytes(&self) -> u64 {
        self.store().peak_segment_bytes()
    }
}

fn tree_of(space: Space) -> Tree {
    match space {
        Space::Ops => Tree::Ops,
        Space::Steps => Tree::Steps,
    }
}

/// The newest log segment and where its units end, when bytes follow
/// them (see [`read_log`]).
type Tail = Option<(PathBuf, u64)>;

/// Reads the segments after generation `gen` (whose first unit is
/// `next_lsn`), under the damage rules. Also returns the newest segment
/// and where its units end, when bytes follow them (a torn tail, or the
/// zeros it was prepared with): [`trim_tail`] cuts them once the log's end
/// is checked.
fn read_log(
    path: &Path,
    segments: &[(u64, PathBuf)],
    gen: u64,
    next_lsn: u64,
) -> Result<(Vec<Unit>, Tail), Error> {
    let mut tail = None;
    let mut units = Vec::new();
    let mut expected_gen = gen + 1;
    let mut min_lsn = next_lsn;
    let newest = segments.last().map(|s| s.0);
    for (g, file) in segments {
        if *g <= gen {
            // Settled by that checkpoint; kept as the copy that repairs
            // sled, until an image covers them.
            continue;
        }
        if *g != expected_gen {
            return Err(Error::Damaged {
                file: wal::segment_path(path, expected_gen),
                offset: None,
                detail: format!(
                    "log segment missing (found generation {g} after {})",
                    expected_gen - 1
                ),
            });
        }
        expected_gen += 1;
        let bytes = fs::read(file).map_err(|e| {
            Error::storage("read the write-ahead log", &file.display().to_string(), e)
        })?;
        let seg = wal::read_segment(&bytes, *g, Some(*g) == newest, min_lsn).map_err(|d| {
            Error::Damaged {
                file: file.clone(),
                offset: Some(d.offset as u64),
                detail: d.detail,
            }
        })?;
        if seg.torn > 0 {
            tracing::info!(
                target: "idem::journal",
                file = %file.display(),
                offset = seg.valid_len,
                bytes = seg.torn,
                "dropping the torn tail of the newest log segment (never acknowledged)"
            );
        }
        if seg.valid_len < bytes.len() {
            tail = Some((file.clone(), seg.valid_len as u64));
        }
        if let Some(u) = seg.units.last() {
            min_lsn = u.lsn + 1;
        }
        units.extend(seg.units);
    }
    Ok((units, tail))
}

/// Cuts the newest segment after its last unit, durably, before the open
/// starts the next segment: a segment that is not the newest must end at
/// its last unit (what follows would read as damage there).
fn trim_tail(tail: Tail, location: &str) -> Result<(), Error> {
    let Some((file, end)) = tail else {
        return Ok(());
    };
    files::open_own_rw(&file)
        .and_then(|f| wal::trim_segment(&f, end))
        .map_err(|e| {
            Error::storage(
                "cut the log after its last unit",
                &format!("{location} ({})", file.display()),
                e,
            )
        })
}

/// A log that ends before the end the last clean close recorded lost units
/// that were acknowledged: damage, never a torn tail.
fn check_log_end(
    path: &Path,
    segments: &[(u64, PathBuf)],
    units: &[Unit],
    gen: u64,
    next_lsn: u64,
) -> Result<(), Error> {
    let Some(end) = files::read::<files::LogEnd>(path, files::LOG_END, Kind::LogEnd)? else {
        return Ok(());
    };
    let found = units.last().map_or(next_lsn, |u| u.lsn + 1);
    if found < end.next_lsn {
        let newest = segments.last().map_or(end.gen.max(gen), |s| s.0);
        return Err(Error::Damaged {
            file: wal::segment_path(path, newest),
            offset: None,
            detail: format!(
                "the write-ahead log ends before unit {} (its last readable unit is {}), \
                 but every unit before {} was durable when the journal was last closed \
                 ({}): acknowledged writes are missing, so the end cannot be a torn tail",
                end.next_lsn - 1,
                found.saturating_sub(1),
                end.next_lsn,
                files::LOG_END
            ),
        });
    }
    Ok(())
}

/// The generation the image on disk covers (0: none or unreadable).
fn image_gen(path: &Path, location: &str) -> u64 {
    match image::covered_gen(path) {
        Ok(gen) => gen.unwrap_or(0),
        Err(e) => {
            // Needed only to repair sled: a new one is written soon (the
            // log it covered counts as kept until then).
            tracing::warn!(target: "idem::journal", location = %location, error = %e, "the journal's image is unreadable; a new one will be written");
            0
        }
    }
}

/// The error for a table or audit file that cannot be read.
fn table_error(path: &Path, id: u64, e: table::ReadError) -> Error {
    file_error(table::path(path, id), e)
}

fn file_error(file: PathBuf, e: table::ReadError) -> Error {
    match e {
        table::ReadError::Damaged(d) => Error::Damaged {
            file,
            offset: Some(d.offset),
            detail: d.detail,
        },
        table::ReadError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => Error::Damaged {
            file,
            offset: None,
            detail: "missing, but the manifest names it".into(),
        },
        table::ReadError::Io(e) => Error::storage("open", &file.display().to_string(), e),
    }
}

/// Removes the tables and audit files the manifest does not name, then
/// opens and checks those it does: the tables kept open (oldest first),
/// the audit files' footers and directories checked, in sequence.
fn open_files(path: &Path, manifest: &Manifest) -> Result<Vec<Arc<Table>>, Error> {
    let named_tables: std::collections::HashSet<u64> =
        manifest.tables.iter().map(|t| t.id).collect();
    let named_audit: std::collections::HashSet<u64> = manifest.audit.iter().map(|a| a.id).collect();
    remove_unnamed(path, &named_tables, &named_audit)
        .map_err(|e| Error::storage("remove leftover files", &path.display().to_string(), e))?;
    let mut tables = Vec::with_capacity(manifest.tables.len());
    for t in &manifest.tables {
        let table =
            Table::open(path, t.id, Some(t.bytes)).map_err(|e| table_error(path, t.id, e))?;
        if table.entries != t.entries {
            return Err(Error::Damaged {
                file: table.path.clone(),
                offset: None,
                detail: format!(
                    "the table holds {} entries, the manifest says {}",
                    table.entries, t.entries
                ),
            });
        }
        tables.push(Arc::new(table));
    }
    let mut after = None::<u64>;
    for a in &manifest.audit {
        let file = audit::path(path, a.id);
        let opened = audit::AuditFile::open(path, a.id, Some(a.bytes))
            .map_err(|e| file_error(file.clone(), e))?;
        if (opened.first, opened.last, opened.events) != (a.first, a.last, a.events)
            || after.is_some_and(|l| a.first <= l)
        {
            return Err(Error::Damaged {
                file,
                offset: None,
                detail: format!(
                    "the audit file holds events {}..={} ({}), the manifest says {}..={} ({}) \
                     after {after:?}",
                    opened.first, opened.last, opened.events, a.first, a.last, a.events
                ),
            });
        }
        after = Some(a.last);
    }
    Ok(tables)
}

/// Removes the tables and audit files not named (leftovers of a checkpoint,
/// merge or conversion cut short), durably.
fn remove_unnamed(
    path: &Path,
    tables: &std::collections::HashSet<u64>,
    audit_files: &std::collections::HashSet<u64>,
) -> std::io::Result<()> {
    let mut removed = false;
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let doomed = match (table::id_of(&name), audit::id_of(&name)) {
            (Some(id), _) => !tables.contains(&id),
            (_, Some(id)) => !audit_files.contains(&id),
            _ => false,
        };
        if doomed {
            fs::remove_file(entry.path())?;
            removed = true;
        }
    }
    if removed {
        wal::sync_dir(path)?;
    }
    Ok(())
}

/// Tests: where an open stops as if the process died there (see
/// `stop_here`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The conversion's files are written, not yet named.
    Converted,
    /// The manifest names them; the metadata still says 2 or 3.
    ManifestWritten,
    /// The metadata says the current format; sled still holds the old
    /// copies.
    MarkedFormat4,
    /// sled's old copies are gone; the manifest still says they are there.
    Purged,
}

#[cfg(test)]
thread_local! {
    pub(super) static STOP: std::cell::Cell<Option<Stop>> = const { std::cell::Cell::new(None) };
}

/// Tests: fails the open at `here` if a test asked for it, leaving the
/// files as a crash there would (sled is closed by the unwinding).
fn stop_here(#[allow(unused_variables)] here: &'static str) -> Result<(), Error> {
    #[cfg(test)]
    {
        let wanted = STOP.with(|s| s.get());
        if wanted.is_some_and(|w| format!("{w:?}") == here) {
            STOP.with(|s| s.set(None));
            return Err(Error::Usage(format!("stopped at {here}")));
        }
    }
    Ok(())
}

/// Opens a journal of format 2 or 3 as those formats did (its log applied
/// to sled, sled's whole content checked and repaired if need be, a
/// checkpoint written), then converts it (`legacy.rs`): a table and an
/// audit file of what sled held, the manifest naming them, the metadata
/// marked the current format ([`files::FORMAT`]). sled is closed on
/// return; the open that follows removes sled's old copies and goes on as
/// for any journal of the current format.
fn open_legacy(
    path: &Path,
    location: &str,
    settings: repair::SledSettings,
    meta: Meta,
) -> Result<(), Error> {
    let storage = |op: &'static str| {
        let location = location.to_string();
        move |e: std::io::Error| Error::storage(op, &location, e)
    };
    // A conversion cut short left files that nothing names yet.
    remove_unnamed(path, &Default::default(), &Default::default())
        .map_err(storage("remove leftover files"))?;
    let _ = fs::remove_file(path.join(files::MANIFEST));
    let checkpoint = files::read::<Checkpoint>(path, files::CHECKPOINT, Kind::Checkpoint)?;
    let segments = wal::segments(path).map_err(storage("list the write-ahead log"))?;
    let Some(checkpoint) = checkpoint else {
        return Err(Error::Damaged {
            file: path.join(files::CHECKPOINT),
            offset: None,
            detail: format!(
                "missing from a journal of format {} (its first open writes it)",
                meta.format
            ),
        });
    };
    let (units, tail) = read_log(path, &segments, checkpoint.gen, checkpoint.next_lsn)?;
    check_log_end(path, &segments, &units, checkpoint.gen, checkpoint.next_lsn)?;
    trim_tail(tail, location)?;
    let last_gen = segments
        .last()
        .map_or(checkpoint.gen, |s| s.0)
        .max(checkpoint.gen);
    let _ = fs::remove_file(path.join(format!("{}.tmp", image::IMAGE)));
    let opened = repair::open(&repair::Found {
        path,
        location,
        settings,
        checkpoint: repair::Covered {
            gen: checkpoint.gen,
            next_lsn: checkpoint.next_lsn,
            digest: checkpoint.digest(),
        },
        segments: &segments,
        units: &units,
        mode: repair::Mode::Legacy {
            regroup: meta.format == files::FORMAT_2,
        },
    })?;
    let (trees, applied, expected, last_seq) =
        (opened.trees, opened.applied, opened.digest, opened.last_seq);
    apply::sync_sled(path, &trees).map_err(storage("make sled durable"))?;
    let cp = Checkpoint {
        gen: last_gen,
        xor: expected.xor,
        count: expected.count,
        // Sequence numbers never go back: past what the checkpoint
        // handed out, what sled holds, and every event the log
        // replayed, even those a later truncation removed.
        next_seq: [
            checkpoint.next_seq,
            last_seq.map_or(0, |s| s + 1),
            applied.last_seq.map_or(0, |s| s + 1),
        ]
        .into_iter()
        .max()
        .unwrap_or(0),
        next_lsn: applied
            .last_lsn
            .map_or(checkpoint.next_lsn, |l| (l + 1).max(checkpoint.next_lsn)),
    };
    files::write(path, files::CHECKPOINT, Kind::Checkpoint, &cp)?;
    let manifest = legacy::convert(path, &trees, &cp).map_err(|f| match f {
        apply::Failed::Damaged(detail) => Error::Damaged {
            file: path.join("db"),
            offset: None,
            detail: format!("convert the journal to format {}: {detail}", files::FORMAT),
        },
        apply::Failed::Io(detail) => {
            Error::storage("convert the journal to tables", location, detail)
        }
    })?;
    stop_here("Converted")?;
    files::write(path, files::MANIFEST, Kind::Checkpoint, &manifest)?;
    stop_here("ManifestWritten")?;
    files::mark_current_format(path, &meta)?;
    stop_here("MarkedFormat4")?;
    tracing::info!(
        target: "idem::journal",
        location = %location,
        from = meta.format,
        to = files::FORMAT,
        records = manifest.tables.first().map_or(0, |t| t.entries),
        events = manifest.audit.first().map_or(0, |a| a.events),
        "journal converted: settled records into a table, the audit stream into an audit file"
    );
    drop(trees);
    repair::wait_until_sled_lets_go(path);
    // The checkpoint file of the old format is not read any more.
    let _ = fs::remove_file(path.join(files::CHECKPOINT));
    memory::release();
    Ok(())
}

/// Removes what a creation cut short may have left (sled's files, stale
/// temporaries): called only when nothing was ever acknowledged.
fn clear_unfinished_creation(path: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if files::is_sled_file(&name) || name.ends_with(".tmp") {
            if entry.file_type()?.is_dir() {
                fs::remove_dir_all(entry.path())?;
            } else {
                fs::remove_file(entry.path())?;
            }
        }
    }
    Ok(())
}

/// The journal holds every call's arguments: say so when others can read it.
fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = fs::metadata(path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    target: "idem::journal",
                    path = %path.display(),
                    mode = format!("{mode:o}"),
                    "the journal directory is accessible to other users, and it holds every \
                     call's non-redacted arguments; consider `chmod 700`"
                );
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// sled creates its files with the default mode; make them the owner's
/// alone (the directory already is).
fn restrict_sled_files(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(entries) = fs::read_dir(path) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !files::is_sled_file(&name) {
                continue;
            }
            let mode = if entry.path().is_dir() { 0o700 } else { 0o600 };
            let _ = fs::set_permissions(entry.path(), fs::Permissions::from_mode(mode));
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

impl Journal for SledJournal {
    fn location(&self) -> &str {
        &self.location
    }

    fn load<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
    ) -> BoxFuture<'a, Result<Option<Loaded>, Error>> {
        let out = self.store().load(tree_of(space), key);
        Box::pin(std::future::ready(out))
    }

    fn write<'a>(&'a self, write: Write<'a>) -> BoxFuture<'a, Result<Written, Error>> {
        let store = self.store();
        let outcome = store.write(tree_of(write.space), &write);
        Box::pin(async move {
            let written = outcome?;
            if matches!(written, Written::Done { .. }) {
                match write.durability {
                    Durability::Immediate => store.barrier().await?,
                    Durability::Eventual => store.eventually(),
                }
            }
            Ok(written)
        })
    }

    fn changed<'a>(&'a self, _space: Space, _key: &'a Digest, _version: u64) -> BoxFuture<'a, ()> {
        // Claims here are never live (see `Claim::live`), so the engine
        // never waits for another process; a poll interval is all this
        // needs to offer.
        Box::pin(tokio::time::sleep(Duration::from_millis(50)))
    }

    fn append<'a>(
        &'a self,
        events: &'a [NewEvent<'a>],
        durability: Durability,
    ) -> BoxFuture<'a, Result<Vec<u64>, Error>> {
        let store = self.store();
        let seqs = store.append(events);
        Box::pin(async move {
            let seqs = seqs?;
            match durability {
                Durability::Immediate => store.barrier().await?,
                Durability::Eventual => store.eventually(),
            }
            Ok(seqs)
        })
    }

    fn events<'a>(&'a self, from: u64, limit: usize) -> BoxFuture<'a, Result<EventRows, Error>> {
        Box::pin(std::future::ready(self.store().events(from, limit)))
    }

    fn truncate_events(&self, before: u64) -> BoxFuture<'_, Result<u64, Error>> {
        let store = self.store();
        Box::pin(async move {
            let n = store.truncate_events(before)?;
            store.barrier().await?;
            Ok(n)
        })
    }

    fn escalated(&self) -> BoxFuture<'_, Result<Vec<(Digest, Loaded)>, Error>> {
        let store = self.store();
        let out = (|| {
            let mut out = Vec::new();
            for key in store.escalated_keys()? {
                if let Some(rec) = store.load(Tree::Ops, &key)? {
                    out.push((key, rec));
                }
            }
            Ok(out)
        })();
        Box::pin(std::future::ready(out))
    }

    fn scan<'a>(
        &'a self,
        space: Space,
        after: Option<&'a Digest>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<(Digest, Loaded)>, Error>> {
        Box::pin(std::future::ready(self.store().scan(
            tree_of(space),
            after,
            limit,
        )))
    }

    fn remove<'a>(
        &'a self,
        space: Space,
        key: &'a Digest,
        version: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let store = self.store();
        let removed = store.remove(tree_of(space), key, version);
        Box::pin(async move {
            let removed = removed?;
            if removed {
                store.eventually();
            }
            Ok(removed)
        })
    }

    fn sync(&self) -> BoxFuture<'_, Result<(), Error>> {
        let store = self.store();
        Box::pin(async move { store.barrier().await })
    }

    fn size_on_disk(&self) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(std::future::ready(self.store().size_on_disk()))
    }
}

impl Drop for SledJournal {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        // Eventual writes wait in memory for a barrier; a clean close is
        // one. An error here (a broken log, a full disk) is reported, and
        // the next open recovers from what is durable.
        let synced = store.barrier_blocking();
        if let Err(e) = &synced {
            tracing::warn!(target: "idem::journal", location = %self.location, error = %e, "closing: the last writes could not be made durable");
        }
        store.join_checkpointer();
        // No new image from here on (one being written gives up): the
        // journal is going away.
        store.stop_background();
        if synced.is_ok() {
            store.checkpoint_at_close();
            // Where the log is durable now: the next open refuses a log that
            // ends before it (acknowledged units lost to a cut), instead of
            // reading the cut as a torn tail. Written after the barrier, so
            // it never names a unit that is not on disk.
            let (gen, next_lsn) = store.durable_end();
            let end = files::LogEnd { gen, next_lsn };
            if let Err(e) = files::write(&self.path, files::LOG_END, Kind::LogEnd, &end) {
                tracing::warn!(target: "idem::journal", location = %self.location, error = %e, "closing: could not record where the log ends");
            }
        }
        // A flusher on the blocking pool holds the store (and through it
        // sled): wait until it has let go.
        store.wait_idle();
        for _ in 0..10_000 {
            if Arc::strong_count(&store) == 1 {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        drop(store);
        repair::wait_until_sled_lets_go(&self.path);
        memory::release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events;
    use crate::stored::{self, Header};
    use idem_journal::journal::{ClaimChange, Expect, Owner};

    const K: Digest = [3; 32];

    fn put<'a>(expect: Expect, body: &'a [u8], events: &'a [NewEvent<'a>]) -> Write<'a> {
        Write {
            space: Space::Ops,
            key: &K,
            expect,
            body,
            claim: ClaimChange::Keep,
            escalated: false,
            events,
            durability: Durability::Immediate,
        }
    }

    use crate::fuzzing::sled::block_on as block;

    #[test]
    fn unknown_format_version_is_refused_and_left_alone() {
        let dir = tempfile::TempDir::new().unwrap();
        drop(SledJournal::open(dir.path()).unwrap());
        let meta = Meta {
            magic: files::MAGIC.to_string(),
            format: files::FORMAT + 1,
            created_ms: 0,
        };
        files::write(dir.path(), files::META, Kind::Meta, &meta).unwrap();
        let before = snapshot(dir.path());
        let err = SledJournal::open(dir.path()).unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedFormat { found, supported, .. } if found == files::FORMAT + 1 && supported == files::FORMAT),
            "{err}"
        );
        assert!(err.to_string().contains(&dir.path().display().to_string()));
        // Nothing was touched by the failed open: not sled, not the log.
        assert_eq!(snapshot(dir.path()), before);
    }

    /// A journal of `format` as the builds before format 4 left it after
    /// a clean close: `units` applied to sled the old way (every record
    /// and every event in sled), a checkpoint with their digest, no log
    /// after it.
    fn legacy_journal(dir: &Path, format: u32, units: &[Unit]) {
        let meta = Meta {
            magic: files::MAGIC.to_string(),
            format,
            created_ms: 1,
        };
        files::write(dir, files::META, Kind::Meta, &meta).unwrap();
        let trees = apply::Trees::open(sled::open(dir).unwrap()).unwrap();
        legacy::apply(&trees, units).unwrap();
        trees.db.flush().unwrap();
        let (digest, last_seq) = legacy::scan_digest(&trees).unwrap();
        let cp = Checkpoint {
            gen: 0,
            xor: digest.xor,
            count: digest.count,
            next_seq: last_seq.map_or(0, |s| s + 1),
            next_lsn: units.last().map_or(1, |u| u.lsn + 1),
        };
        files::write(dir, files::CHECKPOINT, Kind::Checkpoint, &cp).unwrap();
        drop(trees);
        repair::wait_until_sled_lets_go(dir);
    }

    /// Units of one event each, numbered from 0, lsns from 1.
    fn event_units(bodies: &[Vec<u8>]) -> Vec<Unit> {
        bodies
            .iter()
            .enumerate()
            .map(|(i, b)| Unit {
                lsn: i as u64 + 1,
                xor: 0,
                count: 0,
                changes: vec![wal::Change::Event {
                    seq: i as u64,
                    bytes: b.clone(),
                }],
            })
            .collect()
    }

    /// A journal with `n` events, all of them in sled, rewritten as format
    /// 2 stored them (buckets of 32 numbers, plain frames, metadata saying
    /// 2) except its first `converted` buckets of this build, as if a
    /// conversion had been cut short there. Returns the events' bodies.
    fn format_2_journal(dir: &Path, n: u32, converted: u64) -> Vec<Vec<u8>> {
        let bodies: Vec<Vec<u8>> = (0..n)
            .map(|i| format!("event {i} of run-7, tool send_email").into_bytes())
            .collect();
        legacy_journal(dir, files::FORMAT_2, &event_units(&bodies));
        let db = sled::open(dir).unwrap();
        let audit = db.open_tree("audit").unwrap();
        let mut all = Vec::new();
        for item in audit.iter() {
            let (k, v) = item.unwrap();
            assert_eq!(v[0], events::DEFLATED, "this build compresses");
            all.extend(events::decode_bucket(&v).unwrap());
            audit.remove(k).unwrap();
        }
        assert_eq!(all.len(), n as usize);
        for chunk in all.chunk_by(|a, b| a.0 / 32 == b.0 / 32) {
            let key = chunk[0].0 - chunk[0].0 % 32;
            if key < converted * events::BUCKET {
                let group = events::bucket_of(key);
                let mut bucket = match audit.get(group.to_be_bytes()).unwrap() {
                    Some(v) => events::decode_bucket(&v).unwrap(),
                    None => vec![],
                };
                events::merge(&mut bucket, chunk.to_vec());
                audit
                    .insert(group.to_be_bytes(), events::encode_bucket(&bucket))
                    .unwrap();
            } else {
                audit
                    .insert(key.to_be_bytes(), events::encode_frames(chunk))
                    .unwrap();
            }
        }
        db.flush().unwrap();
        drop((audit, db));
        repair::wait_until_sled_lets_go(dir);
        bodies
    }

    /// The audit tree's keys, and whether each value is compressed.
    fn audit_layout(dir: &Path) -> Vec<(u64, bool)> {
        repair::wait_until_sled_lets_go(dir);
        let db = sled::open(dir).unwrap();
        let audit = db.open_tree("audit").unwrap();
        let out = audit
            .iter()
            .map(|item| {
                let (k, v) = item.unwrap();
                let key = u64::from_be_bytes(k.as_ref().try_into().unwrap());
                (key, v[0] == events::DEFLATED)
            })
            .collect();
        drop((audit, db));
        repair::wait_until_sled_lets_go(dir);
        out
    }

    fn all_events(j: &SledJournal) -> Vec<Vec<u8>> {
        block(j.events(0, 10_000))
            .unwrap()
            .into_iter()
            .map(|e| e.1)
            .collect()
    }

    fn manifest(dir: &Path) -> Manifest {
        files::read(dir, files::MANIFEST, Kind::Checkpoint)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn a_format_2_journal_is_converted_read_whole_and_marked_format_4() {
        let dir = tempfile::TempDir::new().unwrap();
        let bodies = format_2_journal(dir.path(), 300, 0);
        let old = audit_layout(dir.path());
        assert_eq!(old.len(), 10, "{old:?}");
        assert!(old.iter().all(|(k, packed)| k % 32 == 0 && !packed));

        let j = SledJournal::open(dir.path()).unwrap();
        let meta: Meta = files::read(dir.path(), files::META, Kind::Meta)
            .unwrap()
            .unwrap();
        assert_eq!(meta.format, files::FORMAT);
        // Converted, not taken for damage and rebuilt from the image.
        let aside: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(repair::SET_ASIDE))
            .collect();
        assert!(aside.is_empty(), "sled was set aside: {aside:?}");
        assert_eq!(all_events(&j), bodies);
        // New events follow; all read after a reopen.
        let more = b"one more".to_vec();
        let e = [NewEvent {
            key: None,
            bytes: &more,
        }];
        block(j.append(&e, Durability::Immediate)).unwrap();
        drop(j);
        let j = SledJournal::open(dir.path()).unwrap();
        let stored = all_events(&j);
        let at = stored.iter().position(|e| *e == more);
        assert_eq!(
            (stored.len(), at),
            (301, Some(300)),
            "the new event's place"
        );
        assert!(stored[..300] == bodies[..], "the old events changed");
        drop(j);
        // The stream left sled for audit files; the old checkpoint file
        // went with the conversion.
        assert_eq!(audit_layout(dir.path()), []);
        let m = manifest(dir.path());
        assert_eq!(
            m.audit
                .iter()
                .map(|a| (a.first, a.last))
                .collect::<Vec<_>>(),
            [(0, 299), (300, 300)]
        );
        assert!(!m.legacy_sled);
        assert!(!dir.path().join(files::CHECKPOINT).exists());
    }

    /// A journal of format 3 with records of every kind: settled ops and
    /// steps, one claimed by a call in flight, one escalated, and events.
    fn format_3_journal(dir: &Path) -> Vec<(Space, Digest, Vec<u8>)> {
        let owner = Owner {
            worker: "pod-7".into(),
            incarnation: 9,
        };
        let mut units = Vec::new();
        let mut records = Vec::new();
        let mut lsn = 0;
        let mut unit = |changes| {
            lsn += 1;
            Unit {
                lsn,
                xor: 0,
                count: 0,
                changes,
            }
        };
        for i in 0..400u32 {
            let (tree, space) = if i % 5 == 4 {
                (Tree::Steps, Space::Steps)
            } else {
                (Tree::Ops, Space::Ops)
            };
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_le_bytes());
            let header = Header {
                version: u64::from(i) + 1,
                epoch: 1,
                owner: (i == 7).then(|| owner.clone()),
                escalated: i == 11,
            };
            let value = stored::encode(&header, format!("record {i}").as_bytes());
            let mut changes = vec![wal::Change::Put {
                tree,
                key: key.to_vec(),
                value: value.clone(),
            }];
            if i == 11 {
                changes.push(wal::Change::Put {
                    tree: Tree::Escalations,
                    key: key.to_vec(),
                    value: vec![],
                });
            }
            changes.push(wal::Change::Event {
                seq: u64::from(i),
                bytes: format!("event {i}").into_bytes(),
            });
            units.push(unit(changes));
            records.push((space, key, value));
        }
        legacy_journal(dir, files::FORMAT_3, &units);
        records
    }

    fn assert_format_3_content(j: &SledJournal, records: &[(Space, Digest, Vec<u8>)]) {
        for (space, key, value) in records {
            let (h, body) = stored::decode(value).unwrap();
            let got = block(j.load(*space, key)).unwrap();
            assert_eq!(got, Some(stored::loaded(h, body)), "{space:?} {key:?}");
        }
        let escalated = block(j.escalated()).unwrap();
        assert_eq!(escalated.len(), 1);
        assert_eq!(escalated[0].1.body, b"record 11");
        let scanned = block(j.scan(Space::Ops, None, 10_000)).unwrap();
        assert_eq!(scanned.len(), 320);
        assert!(scanned.windows(2).all(|w| w[0].0 < w[1].0));
        let events = all_events(j);
        assert_eq!(events.len(), 400);
        assert_eq!(events[399], b"event 399");
    }

    #[test]
    fn a_format_3_journal_converts_whole_wherever_its_conversion_is_cut_short() {
        for stop in [
            None,
            Some(Stop::Converted),
            Some(Stop::ManifestWritten),
            Some(Stop::MarkedFormat4),
            Some(Stop::Purged),
        ] {
            let dir = tempfile::TempDir::new().unwrap();
            let records = format_3_journal(dir.path());
            if let Some(stop) = stop {
                STOP.with(|s| s.set(Some(stop)));
                let err = SledJournal::open(dir.path()).unwrap_err();
                assert!(err.to_string().contains("stopped at"), "{stop:?}: {err}");
                repair::wait_until_sled_lets_go(dir.path());
            }
            let j = SledJournal::open(dir.path()).unwrap();
            assert_format_3_content(&j, &records);
            drop(j);
            // Settled records left sled for a table; what can still change
            // stayed.
            let m = manifest(dir.path());
            assert_eq!(
                m.tables.iter().map(|t| t.entries).sum::<u64>(),
                398,
                "{stop:?}"
            );
            assert!(!m.legacy_sled);
            repair::wait_until_sled_lets_go(dir.path());
            {
                let db = sled::open(dir.path()).unwrap();
                assert_eq!(db.open_tree("ops").unwrap().len(), 2, "{stop:?}");
                assert_eq!(db.open_tree("audit").unwrap().len(), 0, "{stop:?}");
            }
            repair::wait_until_sled_lets_go(dir.path());
            let j = SledJournal::open(dir.path()).unwrap();
            assert_format_3_content(&j, &records);
        }
    }

    #[test]
    fn a_conversion_cut_short_is_finished_by_the_next_open() {
        let dir = tempfile::TempDir::new().unwrap();
        // Two of three buckets converted, the third still in format 2's
        // buckets (a batch is atomic: no bucket is half converted).
        let bodies = format_2_journal(dir.path(), 300, 2);
        assert_eq!(
            audit_layout(dir.path()),
            [(0, true), (128, true), (256, false), (288, false)]
        );
        let j = SledJournal::open(dir.path()).unwrap();
        assert_eq!(all_events(&j), bodies);
        drop(j);
        assert_eq!(audit_layout(dir.path()), []);
    }

    #[cfg(unix)]
    #[test]
    fn a_journal_directory_others_can_write_is_refused_untouched_even_through_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::TempDir::new().unwrap();
        let j = dir.path().join("j");
        drop(SledJournal::open(&j).unwrap());
        fs::set_permissions(&j, fs::Permissions::from_mode(0o777)).unwrap();
        let before = snapshot(&j);
        let err = SledJournal::open(&j).unwrap_err();
        assert!(
            matches!(&err, Error::Untrusted(u) if u.why.contains("mode 777")),
            "{err}"
        );
        assert_eq!(snapshot(&j), before);
        // Through a symlink, the directory it points to is judged.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&j, &link).unwrap();
        let err = SledJournal::open(&link).unwrap_err();
        assert!(matches!(&err, Error::Untrusted(_)), "{err}");
        fs::set_permissions(&j, fs::Permissions::from_mode(0o700)).unwrap();
        drop(SledJournal::open(&link).unwrap());
        drop(SledJournal::open(&j).unwrap());
    }

    #[test]
    fn sequence_numbers_never_go_back_after_every_event_is_pruned() {
        let dir = tempfile::TempDir::new().unwrap();
        let j = SledJournal::open(dir.path()).unwrap();
        let ev = [NewEvent {
            key: None,
            bytes: b"e",
        }];
        let mut last = 0;
        for _ in 0..63 {
            last = block(j.append(&ev, Durability::Immediate)).unwrap()[0];
        }
        assert_eq!(last, 62);
        block(j.truncate_events(last + 1)).unwrap();
        assert!(block(j.events(0, 10)).unwrap().is_empty());
        let next = block(j.append(&ev, Durability::Immediate)).unwrap()[0];
        assert_eq!(next, 63);
        block(j.truncate_events(next + 1)).unwrap();
        drop(j);
        let j = SledJournal::open(dir.path()).unwrap();
        let after = block(j.append(&ev, Durability::Immediate)).unwrap()[0];
        assert!(
            after > next,
            "after a reopen the stream restarted at {after}"
        );
    }

    /// Writes records 0..20 (key `[i; 32]`, body `[i; 64]`), each durable.
    fn write_twenty(j: &SledJournal) {
        for i in 0..20u8 {
            let (key, body) = ([i; 32], [i; 64]);
            let w = Write {
                key: &key,
                ..put(Expect::Absent, &body, &[])
            };
            assert!(matches!(block(j.write(w)).unwrap(), Written::Done { .. }));
        }
    }

    fn assert_twenty(j: &SledJournal) {
        for i in 0..20u8 {
            let got = block(j.load(Space::Ops, &[i; 32])).unwrap().unwrap();
            assert_eq!(got.body, vec![i; 64], "record {i}");
        }
    }

    #[test]
    fn damage_in_a_table_page_is_found_by_the_scrub_and_never_read_as_absence() {
        let dir = tempfile::TempDir::new().unwrap();
        let j = SledJournal::open(dir.path()).unwrap();
        write_twenty(&j);
        drop(j);
        let m = manifest(dir.path());
        assert_eq!(m.tables.len(), 1, "{m:?}");
        let file = table::path(dir.path(), m.tables[0].id);
        let mut bytes = fs::read(&file).unwrap();
        // Inside the first page's packed bytes: the open reads only the
        // header, footer, index and filter, so it opens.
        bytes[40] ^= 0x01;
        fs::write(&file, &bytes).unwrap();
        let j = SledJournal::open(dir.path()).unwrap();
        assert_eq!(j.store().wait_for_scrub(), Some(1));
        for i in 0..20u8 {
            let err = block(j.load(Space::Ops, &[i; 32])).unwrap_err();
            assert!(
                matches!(&err, Error::Damaged { file: f, offset: Some(20), .. } if *f == file),
                "record {i}: {err}"
            );
        }
        drop(j);
        // Undamaged, the scrub finds nothing.
        bytes[40] ^= 0x01;
        fs::write(&file, &bytes).unwrap();
        let j = SledJournal::open(dir.path()).unwrap();
        assert_eq!(j.store().wait_for_scrub(), Some(0));
        assert_twenty(&j);
    }

    #[test]
    fn records_removed_by_retention_leave_the_tables_once_a_quarter_is_removals() {
        let dir = tempfile::TempDir::new().unwrap();
        let options = SledOptions {
            checkpoint_bytes: 4 << 10,
            ..SledOptions::default()
        };
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        let mut versions = Vec::new();
        for i in 0..300u16 {
            let mut key = [0u8; 32];
            key[..2].copy_from_slice(&i.to_be_bytes());
            let w = Write {
                key: &key,
                ..put(Expect::Absent, &[7; 100], &[])
            };
            let Written::Done { version, .. } = block(j.write(w)).unwrap() else {
                panic!("conflict")
            };
            versions.push((key, version));
        }
        drop(j);
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        j.store().wait_for_merges();
        let (entries, removals) = j.store().table_entries();
        assert_eq!((entries, removals), (300, 0));
        // Retention removes 100: a quarter of the 400 entries the tables
        // then hold, so everything merges.
        for (key, version) in &versions[..100] {
            assert!(block(j.remove(Space::Ops, key, *version)).unwrap());
        }
        drop(j);
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        j.store().wait_for_merges();
        let (entries, removals) = j.store().table_entries();
        assert_eq!(
            (entries, removals),
            (200, 0),
            "merged: the removals and what they hid went"
        );
        for (key, _) in &versions[..100] {
            assert_eq!(block(j.load(Space::Ops, key)).unwrap(), None);
        }
        for (key, _) in &versions[100..] {
            assert!(block(j.load(Space::Ops, key)).unwrap().is_some());
        }
    }

    #[test]
    fn a_read_that_a_checkpoint_overtakes_reads_again_instead_of_finding_nothing() {
        // The key was claimed (in sled) and checkpointed. A read misses it
        // in the overlay; before the read reaches sled, the key is written
        // settled and a checkpoint takes it out of sled, its table not yet
        // installed. Found in neither, it would read as absent.
        let dir = tempfile::TempDir::new().unwrap();
        let j = Arc::new(SledJournal::open(dir.path()).unwrap());
        let owner = Owner {
            worker: "w".into(),
            incarnation: 1,
        };
        let w = Write {
            claim: ClaimChange::Take(&owner),
            ..put(Expect::Absent, b"intent", &[])
        };
        let Written::Done { version, .. } = block(j.write(w)).unwrap() else {
            panic!("conflict")
        };
        j.store().checkpoint_now().join().unwrap();
        let store = j.store().clone();
        let (applied_tx, applied_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel();
        *store.pause_before_install.lock().unwrap() = Some((applied_tx, go_rx));
        let writer = j.clone();
        let checkpointer = std::sync::Arc::new(std::sync::Mutex::new(None));
        let handle = checkpointer.clone();
        *store.after_overlay_miss.lock().unwrap() = Some(Box::new(move || {
            let w = Write {
                claim: ClaimChange::Release,
                ..put(Expect::Version(version), b"committed", &[])
            };
            assert!(matches!(
                block(writer.write(w)).unwrap(),
                Written::Done { .. }
            ));
            *handle.lock().unwrap() = Some(writer.store().checkpoint_now());
            applied_rx.recv().unwrap();
        }));
        let got = block(j.load(Space::Ops, &K)).unwrap();
        go_tx.send(()).unwrap();
        checkpointer.lock().unwrap().take().unwrap().join().unwrap();
        assert_eq!(got.map(|l| l.body), Some(b"committed".to_vec()));
        assert_eq!(
            block(j.load(Space::Ops, &K)).unwrap().map(|l| l.body),
            Some(b"committed".to_vec())
        );
    }

    #[test]
    fn a_write_skips_the_tables_a_read_found_empty_only_until_a_table_is_installed() {
        // A read misses the key in the overlay; before it reaches sled and
        // the tables, another caller writes the key settled. The read finds
        // it in neither and notes that no table holds it. A checkpoint then
        // moves the key into a table (out of the overlay and sled): a write
        // expecting the key absent must find it there, not trust the note.
        let dir = tempfile::TempDir::new().unwrap();
        let j = Arc::new(SledJournal::open(dir.path()).unwrap());
        let writer = j.clone();
        *j.store().after_overlay_miss.lock().unwrap() = Some(Box::new(move || {
            let theirs = put(Expect::Absent, b"theirs", &[]);
            assert!(matches!(
                block(writer.write(theirs)).unwrap(),
                Written::Done { .. }
            ));
        }));
        assert_eq!(block(j.load(Space::Ops, &K)).unwrap(), None, "overtaken");
        j.store().checkpoint_now().join().unwrap();
        assert_eq!(j.store().table_entries(), (1, 0), "the key is in a table");
        let mine = put(Expect::Absent, b"mine", &[]);
        assert!(matches!(block(j.write(mine)).unwrap(), Written::Conflict));
        assert_eq!(
            block(j.load(Space::Ops, &K)).unwrap().map(|l| l.body),
            Some(b"theirs".to_vec())
        );

        // Without an install between, the note holds, and the write still
        // sees what the overlay and sled hold.
        let fresh = [7u8; 32];
        let w = |body: &'static [u8]| Write {
            key: &fresh,
            ..put(Expect::Absent, body, &[])
        };
        assert_eq!(block(j.load(Space::Ops, &fresh)).unwrap(), None);
        assert!(matches!(
            block(j.write(w(b"first"))).unwrap(),
            Written::Done { .. }
        ));
        assert!(matches!(
            block(j.write(w(b"second"))).unwrap(),
            Written::Conflict
        ));
    }

    #[test]
    fn a_clean_close_leaves_no_log_to_replay() {
        let dir = tempfile::TempDir::new().unwrap();
        let j = SledJournal::open(dir.path()).unwrap();
        write_twenty(&j);
        drop(j);
        // Every segment after the checkpoint is empty: the next open
        // applies nothing, and the records are in sled.
        let cp: Manifest = files::read(dir.path(), files::MANIFEST, Kind::Checkpoint)
            .unwrap()
            .unwrap();
        let after: Vec<u64> = wal::segments(dir.path())
            .unwrap()
            .into_iter()
            .filter(|(g, _)| *g > cp.gen)
            .map(|(_, p)| fs::metadata(p).unwrap().len())
            .collect();
        assert_eq!(
            after,
            vec![wal::HEADER_LEN as u64],
            "the log after the checkpoint"
        );
        let end: files::LogEnd = files::read(dir.path(), files::LOG_END, Kind::LogEnd)
            .unwrap()
            .unwrap();
        assert_eq!((end.gen, end.next_lsn), (cp.gen + 1, cp.next_lsn));
        let j = SledJournal::open(dir.path()).unwrap();
        assert_twenty(&j);
    }

    #[test]
    fn a_close_whose_last_checkpoint_fails_leaves_the_log_to_the_next_open() {
        // sled panics in the close's checkpoint (as on damage in its
        // files): the store breaks, the log stays, and the next open
        // replays it past the previous checkpoint.
        let dir = tempfile::TempDir::new().unwrap();
        let j = SledJournal::open(dir.path()).unwrap();
        write_twenty(&j);
        let before: Manifest = files::read(dir.path(), files::MANIFEST, Kind::Checkpoint)
            .unwrap()
            .unwrap();
        j.store()
            .panic_in_checkpoint
            .store(true, std::sync::atomic::Ordering::Relaxed);
        drop(j);
        let after: Manifest = files::read(dir.path(), files::MANIFEST, Kind::Checkpoint)
            .unwrap()
            .unwrap();
        assert_eq!(after, before, "the failed checkpoint recorded nothing");
        let j = SledJournal::open(dir.path()).unwrap();
        assert_twenty(&j);
    }

    #[test]
    fn a_log_cut_after_a_clean_close_is_damage_not_a_torn_tail() {
        // A clean close whose last checkpoint did not run (it failed):
        // the log after the checkpoint holds acknowledged units.
        let dir = tempfile::TempDir::new().unwrap();
        let write_twenty = |dir: &Path| {
            let j = SledJournal::open(dir).unwrap();
            write_twenty(&j);
            j.store()
                .no_close_checkpoint
                .store(true, std::sync::atomic::Ordering::Relaxed);
            // A clean close.
            drop(j);
        };
        let cut_newest_in_half = |dir: &Path| {
            let (_, newest) = wal::segments(dir).unwrap().pop().unwrap();
            // Half of its units (zeros follow them).
            let bytes = fs::read(&newest).unwrap();
            let len = bytes.iter().rposition(|&b| b != 0).unwrap() as u64 + 1;
            fs::OpenOptions::new()
                .write(true)
                .open(&newest)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        };
        write_twenty(dir.path());
        cut_newest_in_half(dir.path());
        let before = snapshot(dir.path());
        let err = SledJournal::open(dir.path()).unwrap_err();
        assert!(
            matches!(&err, Error::Damaged { detail, .. } if detail.contains("acknowledged writes are missing")),
            "{err}"
        );
        assert_eq!(snapshot(dir.path()), before, "a refused open changed files");

        // Without a clean close (a crash: no end recorded since), the same
        // cut is a torn tail: dropped, and what precedes it stays.
        let crashed = tempfile::TempDir::new().unwrap();
        write_twenty(crashed.path());
        fs::remove_file(crashed.path().join(files::LOG_END)).unwrap();
        cut_newest_in_half(crashed.path());
        let j = SledJournal::open(crashed.path()).unwrap();
        let kept = (0..20u8)
            .filter(|i| block(j.load(Space::Ops, &[*i; 32])).unwrap().is_some())
            .count();
        assert!((1..20).contains(&kept), "{kept} of 20 kept");
    }

    /// Every file of a directory with its bytes.
    fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    let name = e.path().strip_prefix(dir).unwrap().display().to_string();
                    out.push((name, fs::read(e.path()).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_creation_cut_short_starts_over_but_a_log_without_metadata_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("journal");
        // What a kill early in the first open leaves: metadata, a torn sled
        // conf, no checkpoint, no log. Nothing was ever acknowledged.
        fs::create_dir_all(path.join("blobs")).unwrap();
        files::write(
            &path,
            files::META,
            Kind::Meta,
            &Meta {
                magic: files::MAGIC.into(),
                format: files::FORMAT,
                created_ms: 0,
            },
        )
        .unwrap();
        fs::write(path.join("conf"), b"segment_size: 524288\nuse_compr").unwrap();
        drop(SledJournal::open(&path).unwrap());
        drop(SledJournal::open(&path).unwrap());
        // Log segments or a data file without metadata are someone's data.
        let other = dir.path().join("other");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join("idem-wal.0000000000000001"), b"IDEMWAL2").unwrap();
        let err = SledJournal::open(&other).unwrap_err();
        assert!(matches!(err, Error::NotAJournal { .. }), "{err}");
        assert!(other.join("idem-wal.0000000000000001").exists());
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
    fn a_record_and_its_events_are_one_unit() {
        let dir = tempfile::TempDir::new().unwrap();
        let events = [
            NewEvent {
                key: Some(&K),
                bytes: b"e1",
            },
            NewEvent {
                key: Some(&K),
                bytes: b"e2",
            },
        ];
        {
            let j = SledJournal::open(dir.path()).unwrap();
            // A refused condition writes nothing, events included.
            let out = block(j.write(put(Expect::Version(9), b"v1", &events))).unwrap();
            assert_eq!(out, Written::Conflict);
            assert!(block(j.events(0, 10)).unwrap().is_empty());
            let Written::Done { seqs, .. } =
                block(j.write(put(Expect::Absent, b"v1", &events))).unwrap()
            else {
                panic!("first write")
            };
            assert_eq!(seqs, [0, 1]);
        }
        let j = SledJournal::open(dir.path()).unwrap();
        assert_eq!(block(j.load(Space::Ops, &K)).unwrap().unwrap().body, b"v1");
        let stored: Vec<_> = block(j.events(0, 10))
            .unwrap()
            .into_iter()
            .map(|e| e.1)
            .collect();
        assert_eq!(stored, [b"e1".to_vec(), b"e2".to_vec()]);
    }

    #[test]
    fn corrupt_metadata_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        drop(SledJournal::open(dir.path()).unwrap());
        fs::write(dir.path().join(files::META), b"garbage").unwrap();
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
        // The foreign sled's own threads let go of its lock after the drop,
        // not at it (CI once raced here: the reopen below found it held).
        repair::wait_until_sled_lets_go(dir.path());
        let err = SledJournal::open(dir.path()).unwrap_err();
        assert!(matches!(err, Error::NotAJournal { .. }), "{err}");
        let db = sled::open(dir.path()).unwrap();
        assert_eq!(db.get(b"someone").unwrap().unwrap(), &b"else's data"[..]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_barriers_share_fdatasyncs_and_are_durable() {
        let dir = tempfile::TempDir::new().unwrap();
        {
            let j = Arc::new(SledJournal::open(dir.path()).unwrap());
            let start = Arc::new(tokio::sync::Barrier::new(64));
            let mut tasks = Vec::new();
            for i in 0..64u8 {
                let (j, start) = (j.clone(), start.clone());
                tasks.push(tokio::spawn(async move {
                    start.wait().await;
                    let (key, body) = ([i; 32], [i]);
                    let w = Write {
                        key: &key,
                        ..put(Expect::Absent, &body, &[])
                    };
                    assert!(matches!(j.write(w).await.unwrap(), Written::Done { .. }));
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let fsyncs = j.log_fsyncs();
            // Every write returned durable, and they shared barriers: 64
            // writers that arrived together took far fewer fdatasyncs.
            assert!(
                (1..32).contains(&fsyncs),
                "{fsyncs} fdatasyncs for 64 barriers"
            );
        }
        // Durable: a new handle (after a reopen, not a shared cache) has all.
        let j = SledJournal::open(dir.path()).unwrap();
        for i in 0..64u8 {
            let got = j
                .load(Space::Ops, &[i; 32])
                .await
                .unwrap()
                .expect("durable");
            assert_eq!(got.body, [i]);
        }
    }

    #[test]
    fn a_flush_cancelled_by_a_runtime_shutdown_still_answers_and_closing_returns() {
        // A barrier started in the context of a runtime that is shutting
        // down: tokio refuses the blocking task and drops it unrun (what a
        // call in flight at shutdown can meet). The flusher must still run.
        let dir = tempfile::TempDir::new().unwrap();
        let journal = Arc::new(SledJournal::open(dir.path()).unwrap());
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let handle = tokio.handle().clone();
        tokio.shutdown_background();
        {
            let _inside = handle.enter();
            let mut write = journal.write(put(Expect::Absent, b"v", &[]));
            let waker = std::task::Waker::noop();
            let _ = write
                .as_mut()
                .poll(&mut std::task::Context::from_waker(waker));
        }
        // Whatever became of the refused flusher, a barrier here and the
        // journal's close return, and the next handle finds the write.
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = journal.sync_blocking();
            drop(journal);
            let _ = done.send(());
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the journal wedged after its runtime shut down");
        let j = SledJournal::open(dir.path()).unwrap();
        assert_eq!(block(j.load(Space::Ops, &K)).unwrap().unwrap().body, b"v");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writers_that_outrun_checkpoints_wait_for_them() {
        // Small segments and 64 writers: barriers fill a segment far faster
        // than a checkpoint (sled's apply and its fsyncs) empties one.
        // Without backpressure each checkpoint covers more than the last
        // and the log since the last one (mirrored in memory) grows with
        // the load; with it, a segment stops near BACKLOG × its size.
        let dir = tempfile::TempDir::new().unwrap();
        let checkpoint_bytes = 16u64 << 10;
        let options = SledOptions {
            checkpoint_bytes,
            ..SledOptions::default()
        };
        let j = Arc::new(SledJournal::open_with(dir.path(), &options).unwrap());
        let mut tasks = Vec::new();
        for w in 0..64u16 {
            let j = j.clone();
            tasks.push(tokio::spawn(async move {
                let body = [7u8; 300];
                for n in 0..150u16 {
                    let mut key = [0u8; 32];
                    key[..2].copy_from_slice(&w.to_be_bytes());
                    key[2..4].copy_from_slice(&n.to_be_bytes());
                    let w = Write {
                        key: &key,
                        ..put(Expect::Absent, &body, &[])
                    };
                    assert!(matches!(j.write(w).await.unwrap(), Written::Done { .. }));
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // The flusher waits once the segment reaches the backlog; the
        // barrier that took it there holds at most one unit per writer
        // (64 of under 400 bytes).
        let bound = crate::store::BACKLOG * checkpoint_bytes + 32 * 1024;
        let peak = j.log_peak_segment_bytes();
        assert!(
            peak <= bound,
            "a log segment grew to {peak} bytes with checkpoints of {checkpoint_bytes}"
        );
        drop(j);
        let j = SledJournal::open(dir.path()).unwrap();
        let mut key = [0u8; 32];
        key[..2].copy_from_slice(&63u16.to_be_bytes());
        key[2..4].copy_from_slice(&149u16.to_be_bytes());
        assert!(j.load(Space::Ops, &key).await.unwrap().is_some());
    }

    #[test]
    fn scans_and_loads_agree_with_a_model_across_checkpoints_and_merges() {
        use std::collections::BTreeMap;
        let dir = tempfile::TempDir::new().unwrap();
        // Tiny segments: checkpoints run all along, on their own thread, and
        // merges on another, so records sit in the overlay, in sled (while
        // claimed), in tables, or move between them while the reads run.
        let options = SledOptions {
            checkpoint_bytes: 2 << 10,
            ..SledOptions::default()
        };
        let owner = Owner {
            worker: "w".into(),
            incarnation: 1,
        };
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        let mut model: BTreeMap<Digest, (u64, Vec<u8>, bool)> = BTreeMap::new();
        let mut seed = 7u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let check =
            |j: &SledJournal, model: &BTreeMap<Digest, (u64, Vec<u8>, bool)>, when: &str| {
                let mut seen = Vec::new();
                let mut after = None;
                loop {
                    let page = block(j.scan(Space::Ops, after.as_ref(), 7)).unwrap();
                    assert!(page.len() <= 7);
                    let Some(last) = page.last().map(|p| p.0) else {
                        break;
                    };
                    seen.extend(
                        page.into_iter()
                            .map(|(k, l)| (k, (l.version, l.body, l.claim.is_some()))),
                    );
                    after = Some(last);
                }
                let want: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
                assert_eq!(seen, want, "{when}");
                for k in 0..200u16 {
                    let mut key = [0u8; 32];
                    key[..2].copy_from_slice(&k.to_be_bytes());
                    let got = block(j.load(Space::Ops, &key))
                        .unwrap()
                        .map(|l| (l.version, l.body, l.claim.is_some()));
                    assert_eq!(got.as_ref(), model.get(&key), "{when}: key {k}");
                }
            };
        for round in 0..900u64 {
            let mut key = [0u8; 32];
            key[..2].copy_from_slice(&((next() % 200) as u16).to_be_bytes());
            match model.get(&key).cloned() {
                Some((version, _, _)) if next() % 3 == 0 => {
                    assert!(block(j.remove(Space::Ops, &key, version)).unwrap());
                    model.remove(&key);
                }
                found => {
                    let body = round.to_be_bytes().to_vec();
                    let expect = found.map_or(Expect::Absent, |(v, _, _)| Expect::Version(v));
                    // A quarter are claimed: they stay in sled until a later
                    // write releases them.
                    let claimed = next() % 4 == 0;
                    let w = Write {
                        key: &key,
                        durability: Durability::Eventual,
                        claim: if claimed {
                            ClaimChange::Take(&owner)
                        } else {
                            ClaimChange::Release
                        },
                        ..put(expect, &body, &[])
                    };
                    let Written::Done { version, .. } = block(j.write(w)).unwrap() else {
                        panic!("conflict")
                    };
                    model.insert(key, (version, body, claimed));
                }
            }
            if round % 50 == 49 {
                block(j.sync()).unwrap();
                check(&j, &model, &format!("round {round}"));
            }
        }
        let tables = j.store().table_count();
        assert!(tables >= 1, "nothing reached a table");
        drop(j);
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        check(&j, &model, "after a reopen");
    }

    #[test]
    fn the_directory_and_its_files_are_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("journal");
        drop(SledJournal::open(&path).unwrap());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o700);
        for e in fs::read_dir(&path).unwrap() {
            let e = e.unwrap();
            let want = if e.file_type().unwrap().is_dir() {
                0o700
            } else {
                0o600
            };
            assert_eq!(mode(&e.path()), want, "{}", e.path().display());
        }
    }
}
