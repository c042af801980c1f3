//! The sled journal's directory and its own small files: `idem-meta` (what
//! the directory is, written once, before anything else), `idem-manifest`
//! (formats 4 and 5: what the journal holds as of the last checkpoint: sled's
//! digest, its tables and audit files) and `idem-log-end` (how far the log
//! was durable at the last clean close). A journal of format 2 or 3 has
//! `idem-checkpoint` instead of the manifest, until it is converted. Each
//! is replaced atomically: written to a temporary name, fsynced, renamed,
//! and the directory fsynced.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use idem_journal::error::Error;
use idem_journal::files as private_files;
use idem_journal::record::{self, Kind};

pub(super) const META: &str = "idem-meta";
pub(super) const CHECKPOINT: &str = "idem-checkpoint";
pub(super) const MANIFEST: &str = "idem-manifest";
pub(super) const LOG_END: &str = "idem-log-end";

pub(super) const MAGIC: &str = "idem-journal";
/// Version of the journal's directory format written by this build: 5
/// keeps settled records in tables and the audit stream in audit files,
/// sled only what can still change (`settle.rs`), under a manifest, as 4
/// did; its tables' Bloom filters are blocked (`table.rs`, `IDEMTBL2`).
pub(super) const FORMAT: u32 = 5;
/// The previous format: the same files, tables with classic filters only
/// (`IDEMTBL1`). This build reads those tables as they are (merges rewrite
/// them in time) and marks the journal [`FORMAT`] at open, before it
/// writes a table of its own, so that a build of format 4 refuses it
/// clearly instead of calling the new tables damaged.
pub(super) const FORMAT_4: u32 = 4;
/// The format before, which this build opens and converts to [`FORMAT`]
/// (`legacy.rs`): everything in sled, the audit stream in compressed
/// buckets of 128 numbers, under `idem-checkpoint`.
pub(super) const FORMAT_3: u32 = 3;
/// The format before it, converted the same way: audit buckets of 32
/// numbers, uncompressed.
pub(super) const FORMAT_2: u32 = 2;

/// What identifies a journal directory as ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Meta {
    pub magic: String,
    pub format: u32,
    pub created_ms: u64,
}

/// What sled held when the last checkpoint finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Checkpoint {
    /// Every log segment up to this generation is in sled (and kept until
    /// an image covers it).
    pub gen: u64,
    /// Digest of everything sled holds.
    pub xor: u64,
    pub count: i64,
    /// The next audit sequence number and log sequence number to hand out.
    pub next_seq: u64,
    pub next_lsn: u64,
}

impl Checkpoint {
    pub(super) fn digest(&self) -> Digest {
        Digest {
            xor: self.xor,
            count: self.count,
        }
    }
}

/// A table the manifest names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct TableMeta {
    pub id: u64,
    pub entries: u64,
    /// Of the entries, how many are removals.
    pub removals: u64,
    pub bytes: u64,
}

/// An audit file the manifest names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct AuditMeta {
    pub id: u64,
    /// Its first and last sequence numbers.
    pub first: u64,
    pub last: u64,
    pub events: u64,
    pub bytes: u64,
}

/// What the journal holds as of its last checkpoint (format 4): the root
/// of everything durable besides the log after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Manifest {
    /// Every log segment up to this generation is settled (and kept until
    /// an image covers it).
    pub gen: u64,
    /// Digest of what sled holds (records that can still change, and the
    /// escalation index).
    pub xor: u64,
    pub count: i64,
    /// The next audit sequence number and log sequence number to hand out.
    pub next_seq: u64,
    pub next_lsn: u64,
    /// Audit events below this number are truncated.
    pub floor: u64,
    /// The next id a table or audit file gets.
    pub next_file: u64,
    /// Tables, oldest first: a key's newest entry is in the last table
    /// that holds it (after sled and the log).
    pub tables: Vec<TableMeta>,
    /// Audit files, in sequence order.
    pub audit: Vec<AuditMeta>,
    /// sled may still hold what a journal of format 3 kept there (settled
    /// records, audit buckets), all of it already in this manifest's
    /// files: removed from sled before its content is checked.
    pub legacy_sled: bool,
}

impl Manifest {
    pub(super) fn digest(&self) -> Digest {
        Digest {
            xor: self.xor,
            count: self.count,
        }
    }
}

/// How far the write-ahead log was durable when the journal was last
/// closed cleanly: every unit below `next_lsn` had been acknowledged at a
/// barrier. A log that ends before it lost acknowledged units (a cut that
/// would otherwise read as a torn tail), and is refused as damaged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LogEnd {
    /// The segment that was being written.
    pub gen: u64,
    /// One past the last durable unit's lsn.
    pub next_lsn: u64,
}

/// Reads and decodes one of the files; `None` if it does not exist.
pub(super) fn read<T: serde::de::DeserializeOwned>(
    dir: &Path,
    name: &str,
    kind: Kind,
) -> Result<Option<T>, Error> {
    let path = dir.join(name);
    match fs::read(&path) {
        Ok(bytes) => {
            record::decode(kind, &bytes, &path.display().to_string(), name.as_bytes()).map(Some)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::storage("read", &path.display().to_string(), e)),
    }
}

/// Replaces one of the files atomically and durably.
pub(super) fn write<T: Serialize>(
    dir: &Path,
    name: &str,
    kind: Kind,
    value: &T,
) -> Result<(), Error> {
    let bytes = record::encode(kind, value)?;
    private_files::replace(dir, name, &[&bytes], true)
        .map_err(|e| Error::storage("write", &dir.join(name).display().to_string(), e))
}

/// Marks the journal in `dir` as of this build's format ([`FORMAT`]),
/// atomically and durably, keeping what else `meta` says.
pub(super) fn mark_current_format(dir: &Path, meta: &Meta) -> Result<(), Error> {
    let marked = Meta {
        format: FORMAT,
        ..meta.clone()
    };
    write(dir, META, Kind::Meta, &marked)
}

/// The admin API's bearer token and address (the admin API of idem). They
/// are accepted in every build, not only with feature `admin`, so that a
/// journal once served by the admin API still opens in a program without it.
const ADMIN: [&str; 2] = ["idem-admin-token", "idem-admin-addr"];

/// Whether a file name is one of these files (or their temporaries).
pub(super) fn is_own(name: &str) -> bool {
    [
        META,
        CHECKPOINT,
        MANIFEST,
        LOG_END,
        crate::image::IMAGE,
        ADMIN[0],
        ADMIN[1],
    ]
    .iter()
    .any(|f| name == *f || name.strip_suffix(".tmp") == Some(f))
        || numbered(name, TABLE_PREFIX).is_some()
        || numbered(name, AUDIT_PREFIX).is_some()
}

/// The name prefix of table files (`table.rs`): the prefix, then the
/// table's id in 16 hex digits.
pub(super) const TABLE_PREFIX: &str = "idem-table.";
/// The name prefix of audit files (`audit.rs`), named as tables are.
pub(super) const AUDIT_PREFIX: &str = "idem-audit.";

/// The file numbered `id` under `prefix`.
pub(super) fn numbered_path(dir: &Path, prefix: &str, id: u64) -> PathBuf {
    dir.join(format!("{prefix}{id:016x}"))
}

/// The number a file name under `prefix` carries, if it is one.
pub(super) fn numbered(name: &str, prefix: &str) -> Option<u64> {
    let hex = name.strip_prefix(prefix)?;
    (hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// Files sled 0.34 keeps in its directory.
pub(super) fn is_sled_file(name: &str) -> bool {
    name == "conf" || name == "db" || name == "blobs" || name.starts_with("snap.")
}

/// Opens a file of the journal directory for reading, if it is ours: a
/// regular file (a symbolic link is refused, never followed), owned by
/// this process's user, which no other user can write. What the journal
/// reads from it decides what it answers, so a planted file is refused
/// with [`std::io::ErrorKind::PermissionDenied`] and says why.
pub(super) fn open_own(path: &Path) -> std::io::Result<fs::File> {
    open_checked(path, false)
}

/// [`open_own`], for writing as well (a log segment cut after its last
/// unit).
pub(super) fn open_own_rw(path: &Path) -> std::io::Result<fs::File> {
    open_checked(path, true)
}

fn open_checked(path: &Path, write: bool) -> std::io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.read(true).write(write);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let file = options.open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} is a symbolic link; refusing to follow it",
                    path.display()
                ),
            )
        } else {
            e
        }
    })?;
    let meta = file.metadata()?;
    let refuse = |why: String| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} {why}; refusing to trust it", path.display()),
        ))
    };
    if !meta.is_file() {
        return refuse("is not a regular file".into());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return refuse(format!("is owned by user {}, not {me}", meta.uid()));
        }
        if meta.mode() & 0o022 != 0 {
            return refuse(format!(
                "has mode {:o}: others can change it",
                meta.mode() & 0o777
            ));
        }
    }
    Ok(file)
}

/// Creates the journal directory, readable by its owner only, durably.
pub(super) fn create_private_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        private_files::sync_dir(parent)?;
    }
    Ok(())
}
