//! The sled journal's directory and its own small files: `idem-meta` (what the directory is,
//! written once, before anything else), `idem-checkpoint` (what sled
//! held at the last checkpoint) and `idem-log-end` (how far the log was
//! durable at the last clean close). Both are replaced atomically: written to a
//! temporary name, fsynced, renamed, and the directory fsynced.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use idem_journal::error::Error;
use idem_journal::files as private_files;
use idem_journal::record::{self, Kind};

pub(super) const META: &str = "idem-meta";
pub(super) const CHECKPOINT: &str = "idem-checkpoint";
pub(super) const LOG_END: &str = "idem-log-end";

pub(super) const MAGIC: &str = "idem-journal";
/// Version of the journal's directory format written by this build: 3
/// stores the audit stream in buckets of 128 sequence numbers, compressed
/// (`events.rs`).
pub(super) const FORMAT: u32 = 3;
/// The previous format, which this build opens, converts and marks
/// [`FORMAT`]: the same files, with audit buckets of 32 numbers,
/// uncompressed.
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

/// The admin API's bearer token and address (the admin API of idem). They
/// are accepted in every build, not only with feature `admin`, so that a
/// journal once served by the admin API still opens in a program without it.
const ADMIN: [&str; 2] = ["idem-admin-token", "idem-admin-addr"];

/// Whether a file name is one of these files (or their temporaries).
pub(super) fn is_own(name: &str) -> bool {
    [
        META,
        CHECKPOINT,
        LOG_END,
        crate::image::IMAGE,
        ADMIN[0],
        ADMIN[1],
    ]
    .iter()
    .any(|f| name == *f || name.strip_suffix(".tmp") == Some(f))
}

/// Files sled 0.34 keeps in its directory.
pub(super) fn is_sled_file(name: &str) -> bool {
    name == "conf" || name == "db" || name == "blobs" || name.starts_with("snap.")
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
