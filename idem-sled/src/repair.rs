//! Opening sled's files, checking them, and repairing them.
//!
//! sled is opened, the log since the last checkpoint applied to it, and its
//! whole content checked against the checkpoint's digest plus the log's
//! changes (from format 4 on, sled holds only what can still change, so
//! this reads little; a journal of format 2 or 3 is opened the old way,
//! everything checked, before its conversion, `legacy.rs`). Damage (sled panics or reports corruption, a value does not
//! decode, the digest differs) is repaired when the journal holds a full
//! second copy (`image.rs`): the image and every log segment after it,
//! each intact. sled's damaged files are set aside in
//! `sled-damaged.<unix ms>` (never deleted: they are the evidence), a fresh
//! sled is built from the copy and checked against the same digest. Without
//! a whole copy, or if the rebuilt content does not match either, opening
//! is refused with what was found; nothing is deleted.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::apply::{self, Applied, Trees};
use crate::digest::Digest as ContentDigest;
use crate::image;
use crate::legacy;
use crate::wal::{self, Unit};
use idem_journal::error::Error;

/// The name prefix of a directory holding sled files set aside.
pub(super) const SET_ASIDE: &str = "sled-damaged.";

/// How sled is opened (from the journal's options).
#[derive(Debug, Clone, Copy)]
pub(super) struct SledSettings {
    pub cache_capacity: u64,
    pub flush_every_ms: Option<u64>,
}

/// sled's files of a journal, opened and checked.
pub(super) struct Opened {
    pub trees: Trees,
    /// The log since the checkpoint, applied.
    pub applied: Applied,
    /// What sled now holds (checked).
    pub digest: ContentDigest,
    pub last_seq: Option<u64>,
}

/// What the open found on disk before sled: where, with which settings,
/// the last checkpoint, every log segment in the directory, and the log's
/// units since the checkpoint.
pub(super) struct Found<'a> {
    pub path: &'a Path,
    pub location: &'a str,
    pub settings: SledSettings,
    /// What the last checkpoint recorded: the generation it covers, the
    /// lsn after it, and sled's digest then.
    pub checkpoint: Covered,
    pub segments: &'a [(u64, PathBuf)],
    pub units: &'a [Unit],
    pub mode: Mode,
}

/// What the last checkpoint recorded (see [`Found`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Covered {
    pub gen: u64,
    pub next_lsn: u64,
    pub digest: ContentDigest,
}

/// Which format's rules sled is opened under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Format 4: sled holds what can still change. `purge`: a converted
    /// journal's sled still holds its old copies (`legacy::convert`),
    /// removed before the check.
    Current { purge: bool },
    /// Formats 2 and 3: sled holds everything. `regroup`: format 2, whose
    /// audit buckets are rewritten ([`legacy::regroup`]) before the log is
    /// applied to them.
    Legacy { regroup: bool },
}

/// Opens sled, applies the log since the checkpoint and checks the result;
/// repairs damage from the image and the kept log.
pub(super) fn open(found: &Found<'_>) -> Result<Opened, Error> {
    // sled writes a snapshot as `snap.<lsn>.generating`, then renames it; a
    // process killed in between leaves the partial file, which sled 0.34
    // would pick (it sorts last) and report as corruption. It is never
    // anything but garbage: sled rebuilds snapshots from its log.
    remove_partial_snapshots(found.path)
        .map_err(|e| Error::storage("remove a partial snapshot", found.location, e))?;
    let first = catch_sled_panic(found.path, || {
        let trees = found.open_sled()?;
        if found.mode == (Mode::Current { purge: true }) {
            let removed = apply::purge_legacy(&trees)
                .map_err(|f| found.failed("remove what a converted journal left in sled", f))?;
            tracing::info!(
                target: "idem::journal",
                location = %found.location,
                entries = removed,
                "converted journal: its old copies removed from sled"
            );
        }
        if found.mode == (Mode::Legacy { regroup: true }) {
            let written = legacy::regroup(&trees)
                .map_err(|f| found.failed("rewrite the audit buckets of format 2", f))?;
            tracing::info!(
                target: "idem::journal",
                location = %found.location,
                buckets = written,
                "journal of format 2: audit buckets rewritten compressed"
            );
        }
        let applied = found.apply(&trees, found.units, "replay the write-ahead log")?;
        found.check(trees, applied)
    });
    match first {
        Err(why @ Error::Damaged { .. }) => {
            wait_until_sled_lets_go(found.path);
            found.rebuild(why)
        }
        other => other,
    }
}

fn open_sled(path: &Path, location: &str, settings: SledSettings) -> Result<Trees, Error> {
    let db = sled::Config::new()
        .path(path)
        .cache_capacity(settings.cache_capacity)
        .flush_every_ms(settings.flush_every_ms)
        .open()
        .map_err(|e| map_open_error(e, path))?;
    Trees::open(db).map_err(|e| Error::storage("open sled's trees", location, e))
}

impl Found<'_> {
    fn open_sled(&self) -> Result<Trees, Error> {
        open_sled(self.path, self.location, self.settings)
    }

    /// sled may open its files cleanly and report their damage only when
    /// the log is replayed into it or when its entries are read.
    fn failed(&self, op: &'static str, f: apply::Failed) -> Error {
        match f {
            apply::Failed::Damaged(detail) => Error::Damaged {
                file: self.path.join("db"),
                offset: None,
                detail: format!("{op}: {detail}"),
            },
            apply::Failed::Io(detail) => Error::storage(op, self.location, detail),
        }
    }

    fn apply(&self, trees: &Trees, units: &[Unit], op: &'static str) -> Result<Applied, Error> {
        match self.mode {
            Mode::Current { .. } => apply::apply(trees, units),
            Mode::Legacy { .. } => legacy::apply(trees, units),
        }
        .map_err(|f| self.failed(op, f))
    }

    /// Reads every entry of sled and compares with what the checkpoint and
    /// the log since it say sled holds.
    fn check(&self, trees: Trees, applied: Applied) -> Result<Opened, Error> {
        let (found, last_seq) = match self.mode {
            Mode::Current { .. } => apply::scan_digest(&trees).map(|d| (d, None)),
            Mode::Legacy { .. } => legacy::scan_digest(&trees),
        }
        .map_err(|f| self.failed("check sled's content", f))?;
        let mut expected = self.checkpoint.digest;
        expected.apply(applied.delta.xor, applied.delta.count);
        if found != expected {
            return Err(damaged_sled(self.path, found, expected));
        }
        Ok(Opened {
            trees,
            applied,
            digest: expected,
            last_seq,
        })
    }

    fn rebuild(&self, why: Error) -> Result<Opened, Error> {
        // Everything the copy needs is read, and checked, before anything
        // moves.
        let image = match image::read(self.path) {
            Ok(image) => image,
            Err(e) => return Err(unrepaired(why, format!("the image is damaged too ({e})"))),
        };
        let kept = match kept_log(image.as_ref(), &self.checkpoint, self.segments) {
            Ok(kept) => kept,
            Err(e) => return Err(unrepaired(why, e)),
        };
        let aside = match set_aside(self.path) {
            Ok(aside) => aside,
            Err(e) => {
                return Err(unrepaired(
                    why,
                    format!("setting sled's files aside failed ({e})"),
                ))
            }
        };
        let rebuilt = catch_sled_panic(self.path, || {
            let trees = self.open_sled()?;
            if let Some(image) = &image {
                self.apply(&trees, &image.units, "rebuild sled from the image")?;
            }
            self.apply(&trees, &kept, "rebuild sled from the log")?;
            let applied = self.apply(&trees, self.units, "rebuild sled from the log")?;
            self.check(trees, applied)
        });
        match rebuilt {
            Ok(opened) => {
                tracing::warn!(
                    target: "idem::journal",
                    location = %self.location,
                    damage = %why,
                    set_aside = %aside.display(),
                    "sled's files were damaged; rebuilt them from the journal's image and log (the damaged files are kept aside)"
                );
                Ok(opened)
            }
            Err(e) => {
                // Its own refusal's wording once is enough: what it found.
                let found = match &e {
                    Error::Damaged { detail, .. } => detail.clone(),
                    other => other.to_string(),
                };
                Err(unrepaired(
                    why,
                    format!(
                        "rebuilding from the image and the log failed too ({found}); sled's \
                         files are in {}",
                        aside.display()
                    ),
                ))
            }
        }
    }
}

/// Adds to a refusal why it could not be repaired.
fn unrepaired(why: Error, because: String) -> Error {
    match why {
        Error::Damaged {
            file,
            offset,
            detail,
        } => Error::Damaged {
            file,
            offset,
            detail: format!(
                "{detail}; not repaired: {because}. Restore the directory from a backup"
            ),
        },
        other => other,
    }
}

/// The log kept after the image, up to the checkpoint: every segment
/// present, intact and in sequence, or why not.
fn kept_log(
    image: Option<&image::Image>,
    checkpoint: &Covered,
    segments: &[(u64, PathBuf)],
) -> Result<Vec<Unit>, String> {
    let (mut gen, mut lsn) = image.map_or((1, 1), |i| (i.gen + 1, i.next_lsn));
    if gen > checkpoint.gen + 1 {
        return Err(format!(
            "the image covers generation {} but the checkpoint only {}",
            gen - 1,
            checkpoint.gen
        ));
    }
    let mut units = Vec::new();
    for (g, file) in segments {
        if *g < gen || *g > checkpoint.gen {
            continue;
        }
        if *g != gen {
            break;
        }
        let bytes = fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let seg = wal::read_segment(&bytes, *g, false, lsn)
            .map_err(|d| format!("{} at offset {}: {}", file.display(), d.offset, d.detail))?;
        if let Some(u) = seg.units.last() {
            lsn = u.lsn + 1;
        }
        units.extend(seg.units);
        gen += 1;
    }
    if gen != checkpoint.gen + 1 {
        return Err(match image {
            Some(_) => format!("log segment {gen} after the image is gone"),
            None => format!(
                "no image, and the log no longer starts at its first segment (segment {gen} is \
                 gone)"
            ),
        });
    }
    if lsn != checkpoint.next_lsn {
        return Err(format!(
            "the kept log ends before unit {}, the checkpoint's next ({lsn})",
            checkpoint.next_lsn
        ));
    }
    Ok(units)
}

/// Moves sled's files into a new `sled-damaged.<ms>` directory, durably.
fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut aside = path.join(format!("{SET_ASIDE}{ms}"));
    let mut n = 0;
    while aside.exists() {
        n += 1;
        aside = path.join(format!("{SET_ASIDE}{ms}-{n}"));
    }
    crate::files::create_private_dir(&aside)?;
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if crate::files::is_sled_file(&name) {
            fs::rename(entry.path(), aside.join(&name))?;
        }
    }
    wal::sync_dir(&aside)?;
    wal::sync_dir(path)?;
    Ok(aside)
}

/// Whether a sled instance (in this process or another) holds the lock on
/// the directory's data file, as sled takes it (`flock`, exclusive).
pub(super) fn sled_is_held(dir: &Path) -> bool {
    matches!(
        fs::File::open(dir.join("db")).map(|f| f.try_lock()),
        Ok(Err(fs::TryLockError::WouldBlock))
    )
}

/// sled's I/O threads may still hold its data file (and the lock on it) for
/// a moment after the last handle is gone. Waits, briefly and boundedly,
/// until the lock is free, so that a dropped database can be reopened.
pub(super) fn wait_until_sled_lets_go(dir: &Path) {
    let data = dir.join("db");
    for _ in 0..2000 {
        match fs::File::open(&data).map(|f| f.try_lock()) {
            Ok(Ok(())) | Err(_) => return,
            Ok(Err(_)) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

fn damaged_sled(path: &Path, found: ContentDigest, expected: ContentDigest) -> Error {
    let what = match found.count.cmp(&expected.count) {
        std::cmp::Ordering::Less => format!("{} entries are missing", expected.count - found.count),
        std::cmp::Ordering::Greater => format!(
            "{} entries more than recorded",
            found.count - expected.count
        ),
        std::cmp::Ordering::Equal => "entries were changed".to_string(),
    };
    Error::Damaged {
        file: path.join("db"),
        offset: None,
        detail: format!(
            "sled's data does not match the last checkpoint and the write-ahead log: {what} \
             ({} entries found, {} recorded; digest {:016x}, recorded {:016x}); sled may have \
             dropped records after damage in its files",
            found.count, expected.count, found.xor, expected.xor
        ),
    }
}

/// Runs `f`, turning a panic inside sled into a refusal to open.
fn catch_sled_panic<T>(path: &Path, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(out) => out,
        Err(panic) => Err(Error::Damaged {
            file: path.join("db"),
            offset: None,
            detail: format!(
                "sled could not read its files ({})",
                apply::panic_text(&panic)
            ),
        }),
    }
}

fn remove_partial_snapshots(path: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn map_open_error(e: sled::Error, path: &Path) -> Error {
    let text = e.to_string();
    if text.contains("could not acquire lock") {
        Error::InUse {
            path: path.to_path_buf(),
        }
    } else if let sled::Error::Corruption { .. } = e {
        Error::Damaged {
            file: path.join("db"),
            offset: None,
            detail: format!("sled reports corruption: {text}"),
        }
    } else if let sled::Error::Unsupported(_) = e {
        // Our metadata already showed a journal of this format, written by
        // this sled: sled refusing its own settings file as another
        // version's means that file is damaged (it only warns on a bad
        // checksum there, then parses what it finds).
        Error::Damaged {
            file: path.join("conf"),
            offset: None,
            detail: format!("sled refuses its settings: {text}"),
        }
    } else {
        Error::storage("open", &path.display().to_string(), text)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use crate::journal::{SledJournal, SledOptions};
    use idem_journal::error::Error;
    use idem_journal::journal::{
        ClaimChange, Durability, Expect, Journal, NewEvent, Space, Write, Written,
    };

    use crate::fuzzing::sled::block_on as block;

    /// What a journal should hold: each key's last body (`None`: removed)
    /// and every event.
    #[derive(Default)]
    struct Truth {
        records: BTreeMap<[u8; 32], Option<(u64, Vec<u8>)>>,
        events: usize,
    }

    /// Writes, rewrites and removes records of round `round`'s own keys, of
    /// a few hundred bytes (some large enough for sled's blob files) with
    /// an event each, through
    /// enough small segments for checkpoints and images to run meanwhile.
    fn churn(j: &SledJournal, truth: &mut Truth, round: u8, n: u16) {
        block(async {
            for i in 0..n {
                // Each round its own keys: a later round leaves the earlier
                // ones where the image put them, not in the log after it.
                let mut key = [round; 32];
                key[..2].copy_from_slice(&(i % 97).to_be_bytes());
                let size = if i % 50 == 0 { 200 << 10 } else { 300 };
                // Incompressible, as results often are: the image is then
                // about the content's size, and the bounds below mean it.
                let mut x = u64::from(round) << 32 | u64::from(i) | 1;
                let body: Vec<u8> = (0..size)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                let ev = [round, i as u8];
                let events = [NewEvent {
                    key: Some(&key),
                    bytes: &ev,
                }];
                let expect = match truth.records.get(&key) {
                    Some(Some((version, _))) => Expect::Version(*version),
                    _ => Expect::Absent,
                };
                if i % 7 == 3 {
                    if let Expect::Version(v) = expect {
                        assert!(j.remove(Space::Ops, &key, v).await.unwrap());
                        truth.records.insert(key, None);
                        continue;
                    }
                }
                let w = Write {
                    space: Space::Ops,
                    key: &key,
                    expect,
                    body: &body,
                    claim: ClaimChange::Keep,
                    escalated: i % 5 == 0,
                    events: &events,
                    durability: Durability::Immediate,
                };
                match j.write(w).await.unwrap() {
                    Written::Done { version, .. } => {
                        truth.records.insert(key, Some((version, body)));
                        truth.events += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            j.sync().await.unwrap();
        });
    }

    fn assert_holds(j: &SledJournal, truth: &Truth) {
        block(async {
            for (key, want) in &truth.records {
                let got = j.load(Space::Ops, key).await.unwrap();
                assert_eq!(
                    got.map(|l| l.body),
                    want.as_ref().map(|w| w.1.clone()),
                    "record {:?}",
                    &key[..2]
                );
            }
            let events = j.events(0, usize::MAX).await.unwrap();
            assert_eq!(events.len(), truth.events);
        });
    }

    fn options() -> SledOptions {
        SledOptions {
            checkpoint_bytes: 32 << 10,
            ..SledOptions::default()
        }
    }

    fn set_aside(dir: &Path) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(super::SET_ASIDE)
            })
            .map(|e| e.path())
            .collect()
    }

    /// A journal whose image and log after it are both on disk: written,
    /// imaged, written more (in the log after the image, part of it past
    /// the last checkpoint), closed.
    fn imaged_journal(dir: &Path) -> (Truth, u64) {
        let mut truth = Truth::default();
        let j = SledJournal::open_with(dir, &options()).unwrap();
        churn(&j, &mut truth, 1, 1500);
        let gen = j.store().wait_for_image();
        assert!(gen > 0, "an image was written");
        churn(&j, &mut truth, 2, 300);
        drop(j);
        (truth, gen)
    }

    #[test]
    fn sled_files_lost_entirely_are_rebuilt_from_the_image_and_the_log() {
        let dir = tempfile::TempDir::new().unwrap();
        let (truth, gen) = imaged_journal(dir.path());
        // What the image covers is no longer in the log.
        let segments = super::wal::segments(dir.path()).unwrap();
        assert!(segments.iter().all(|(g, _)| *g > gen), "{segments:?}");
        remove_sled_files(dir.path());
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        assert_holds(&j, &truth);
        drop(j);
        // Found intact this time: opened without another repair.
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        assert_holds(&j, &truth);
        drop(j);
        assert_eq!(set_aside(dir.path()).len(), 1);
    }

    fn remove_sled_files(dir: &Path) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if crate::files::is_sled_file(&name) {
                if entry.path().is_dir() {
                    std::fs::remove_dir_all(entry.path()).unwrap();
                } else {
                    std::fs::remove_file(entry.path()).unwrap();
                }
            }
        }
    }

    #[test]
    fn prepared_segments_end_at_their_last_unit_once_older_and_still_repair_sled() {
        // Segments are extended with zeros ahead of their units. Rotations
        // (every 32 KiB here) and the open after a crash cut them, so that
        // the kept log, read as older segments, repairs sled.
        let dir = tempfile::TempDir::new().unwrap();
        let mut truth = Truth::default();
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        churn(&j, &mut truth, 1, 400);
        // A crash: no close checkpoint, no log end recorded.
        j.store()
            .no_close_checkpoint
            .store(true, std::sync::atomic::Ordering::Relaxed);
        drop(j);
        std::fs::remove_file(dir.path().join(crate::files::LOG_END)).unwrap();
        let segments = super::wal::segments(dir.path()).unwrap();
        let (gen, crashed) = segments.last().unwrap().clone();
        let len = std::fs::metadata(&crashed).unwrap().len();
        assert!(
            len > super::wal::PREPARE,
            "the crashed segment was prepared"
        );
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        assert_holds(&j, &truth);
        drop(j);
        for (g, file) in super::wal::segments(dir.path()).unwrap() {
            let bytes = std::fs::read(&file).unwrap();
            if g <= gen {
                // Older now: read as such, whole.
                let first = bytes
                    .get(28..36)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
                let seg = super::wal::read_segment(&bytes, g, false, first)
                    .unwrap_or_else(|d| panic!("segment {g}: {} at {}", d.detail, d.offset));
                assert_eq!(seg.valid_len, bytes.len(), "segment {g}");
            }
        }
        remove_sled_files(dir.path());
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        assert_holds(&j, &truth);
    }

    #[test]
    fn a_zeroed_sled_data_file_is_rebuilt_and_kept_aside() {
        let dir = tempfile::TempDir::new().unwrap();
        let (truth, _) = imaged_journal(dir.path());
        let db = dir.path().join("db");
        let len = std::fs::metadata(&db).unwrap().len();
        std::fs::write(&db, vec![0u8; len as usize]).unwrap();
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        assert_holds(&j, &truth);
        drop(j);
        // Kept aside as the failed open left it (that open had replayed
        // the log into it before the check found the damage).
        let aside = set_aside(dir.path());
        assert_eq!(aside.len(), 1);
        assert!(aside[0].join("db").is_file());
        assert!(aside[0].join("conf").is_file());
    }

    #[test]
    fn damage_with_a_damaged_image_is_refused_and_nothing_is_set_aside() {
        let dir = tempfile::TempDir::new().unwrap();
        imaged_journal(dir.path());
        let image = dir.path().join(super::image::IMAGE);
        let mut bytes = std::fs::read(&image).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x40;
        std::fs::write(&image, &bytes).unwrap();
        let db = dir.path().join("db");
        let len = std::fs::metadata(&db).unwrap().len();
        std::fs::write(&db, vec![0u8; len as usize]).unwrap();
        let err = SledJournal::open_with(dir.path(), &options())
            .map(drop)
            .unwrap_err();
        assert!(
            matches!(&err, Error::Damaged { detail, .. }
                if detail.contains("not repaired") && detail.contains("image is damaged")),
            "{err}"
        );
        assert!(set_aside(dir.path()).is_empty());
        assert_eq!(std::fs::read(&image).unwrap(), bytes);
        assert!(db.is_file());
    }

    #[test]
    fn damage_with_a_segment_after_the_image_gone_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        imaged_journal(dir.path());
        // A reopen checkpoints every segment there is: the one after the
        // image is then only needed by a repair.
        drop(SledJournal::open_with(dir.path(), &options()).unwrap());
        // Images may have been written after the one the test waited for.
        let gen = super::image::covered_gen(dir.path()).unwrap().unwrap();
        std::fs::remove_file(super::wal::segment_path(dir.path(), gen + 1)).unwrap();
        std::fs::remove_file(dir.path().join("db")).unwrap();
        let err = SledJournal::open_with(dir.path(), &options())
            .map(drop)
            .unwrap_err();
        assert!(
            matches!(&err, Error::Damaged { detail, .. }
                if detail.contains(&format!("log segment {} after the image is gone", gen + 1))),
            "{err}"
        );
        assert!(set_aside(dir.path()).is_empty());
    }

    #[test]
    fn the_log_kept_beside_the_image_stays_bounded() {
        // Images replace the log they cover: however much is written, the
        // log on disk stays within a few times the image's size plus the
        // segments an image waits for (and the ones written meanwhile).
        let dir = tempfile::TempDir::new().unwrap();
        let options = options();
        let mut truth = Truth::default();
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        let mut peak = 0u64;
        let mut images = 0;
        let mut last_gen = 0;
        for round in 0..8 {
            churn(&j, &mut truth, round, 1000);
            let gen = j.store().wait_for_image();
            if gen != last_gen {
                images += 1;
                last_gen = gen;
            }
            let log: u64 = super::wal::segments(dir.path())
                .unwrap()
                .iter()
                .map(|(_, p)| std::fs::metadata(p).unwrap().len())
                .sum();
            let image =
                std::fs::metadata(dir.path().join(super::image::IMAGE)).map_or(0, |m| m.len());
            peak = peak.max(log.saturating_sub(crate::store::LOG_PER_IMAGE * image));
        }
        drop(j);
        assert!(images >= 3, "{images} images");
        // Each round leaves about 97 records of 300 bytes plus two of
        // 200 KiB, and their events; each wrote far more than that.
        let bound =
            2 * (crate::store::IMAGE_AFTER + crate::store::BACKLOG + 1) * options.checkpoint_bytes
                + (1 << 20);
        assert!(
            peak <= bound,
            "{peak} bytes of log beyond twice the image's size"
        );
        let j = SledJournal::open_with(dir.path(), &options).unwrap();
        assert_holds(&j, &truth);
    }

    #[test]
    fn sled_panicking_in_a_checkpoint_breaks_the_journal_instead_of_wedging_it() {
        // Writers wait for a running checkpoint past the backlog; one that
        // died without saying so would hold them forever. Instead every
        // later write fails (nothing is sent on an INTENT that is not
        // durable) and a reopen has everything acknowledged before.
        let dir = tempfile::TempDir::new().unwrap();
        let mut truth = Truth::default();
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        churn(&j, &mut truth, 1, 50);
        j.store()
            .panic_in_checkpoint
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let failed = block(async {
            let body = [9u8; 1000];
            for i in 0..10_000u32 {
                let mut key = [0xee; 32];
                key[..4].copy_from_slice(&i.to_be_bytes());
                let w = Write {
                    space: Space::Ops,
                    key: &key,
                    expect: Expect::Absent,
                    body: &body,
                    claim: ClaimChange::Keep,
                    escalated: false,
                    events: &[],
                    durability: Durability::Immediate,
                };
                match j.write(w).await {
                    Ok(_) => {
                        truth.records.insert(key, Some((0, body.to_vec())));
                    }
                    Err(e) => return Some(e),
                }
            }
            None
        });
        let err = failed.expect("writes fail once the checkpoint died");
        assert!(
            err.to_string()
                .contains("sled failed while a checkpoint wrote to it"),
            "{err}"
        );
        drop(j);
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        assert_holds(&j, &truth);
    }

    #[test]
    fn a_second_open_of_a_journal_in_use_pulls_no_file_from_under_it() {
        // The open clears a partial image and a partial sled snapshot: only
        // when no one holds the journal (they may be the holder's, being
        // written).
        let dir = tempfile::TempDir::new().unwrap();
        let j = SledJournal::open_with(dir.path(), &options()).unwrap();
        let partial = [
            dir.path().join("idem-image.tmp"),
            dir.path().join("snap.00000000000000FF.generating"),
        ];
        for f in &partial {
            std::fs::write(f, b"being written").unwrap();
        }
        let err = SledJournal::open_with(dir.path(), &options())
            .map(drop)
            .unwrap_err();
        assert!(matches!(err, Error::InUse { .. }), "{err}");
        for f in &partial {
            assert!(f.exists(), "{} was removed", f.display());
        }
        drop(j);
        // Closed, the leftovers are garbage and go.
        drop(SledJournal::open_with(dir.path(), &options()).unwrap());
        for f in &partial {
            assert!(!f.exists(), "{} was kept", f.display());
        }
    }
}
