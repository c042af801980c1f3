//! The power-cut file system through a real FUSE mount, driven with
//! `std::fs` the way sled and idem's journal drive it. These tests need
//! `/dev/fuse` and fail (they do not skip) where FUSE is unusable.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use idem_testkit::powercut::{PowerCutFs, Survival};

struct Mounted {
    fs: PowerCutFs,
    // Dropped after `fs` (fields drop in order): unmount, then remove.
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn new() -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let fs = PowerCutFs::mount(dir.path())
            .unwrap_or_else(|e| panic!("FUSE must work on this machine: {e}"));
        Mounted { fs, _dir: dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.fs.mountpoint().join(rel)
    }

    fn cut(&mut self) {
        self.fs.cut(Survival::SyncedOnly).unwrap();
    }
}

fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

fn read(path: &Path) -> Option<Vec<u8>> {
    fs::read(path).ok()
}

#[test]
fn unsynced_writes_are_lost_and_synced_ones_survive() {
    let mut m = Mounted::new();
    let root = m.path("");
    let mut f = File::create(m.path("log")).unwrap();
    sync_dir(&root);
    f.write_all(b"synced").unwrap();
    f.sync_data().unwrap();
    f.write_all(b" lost").unwrap();
    assert_eq!(read(&m.path("log")).unwrap(), b"synced lost");
    drop(f);
    m.cut();
    assert_eq!(read(&m.path("log")).unwrap(), b"synced");

    // fsync (not only fdatasync) and set_len, likewise.
    let f = OpenOptions::new().write(true).open(m.path("log")).unwrap();
    f.set_len(2).unwrap();
    f.sync_all().unwrap();
    f.set_len(100).unwrap();
    drop(f);
    m.cut();
    assert_eq!(read(&m.path("log")).unwrap(), b"sy");
}

#[test]
fn a_new_file_is_gone_unless_its_directory_was_synced() {
    let mut m = Mounted::new();
    let mut f = File::create(m.path("new")).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.cut();
    assert!(read(&m.path("new")).is_none(), "its name was never synced");

    fs::create_dir(m.path("dir")).unwrap();
    let mut f = File::create(m.path("dir/file")).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_all().unwrap();
    sync_dir(&m.path("dir"));
    m.cut();
    assert!(
        !m.path("dir").exists(),
        "a directory whose parent was never synced vanishes with its contents"
    );

    fs::create_dir(m.path("dir")).unwrap();
    sync_dir(&m.path(""));
    let mut f = File::create(m.path("dir/file")).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_all().unwrap();
    sync_dir(&m.path("dir"));
    m.cut();
    assert_eq!(read(&m.path("dir/file")).unwrap(), b"data");
}

#[test]
fn rename_and_unlink_without_a_directory_sync_are_undone() {
    let mut m = Mounted::new();
    for (name, body) in [("a", "A"), ("b", "B"), ("c", "C")] {
        let mut f = File::create(m.path(name)).unwrap();
        f.write_all(body.as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    sync_dir(&m.path(""));
    fs::rename(m.path("a"), m.path("b")).unwrap();
    fs::remove_file(m.path("c")).unwrap();
    assert_eq!(read(&m.path("b")).unwrap(), b"A");
    m.cut();
    assert_eq!(read(&m.path("a")).unwrap(), b"A");
    assert_eq!(read(&m.path("b")).unwrap(), b"B");
    assert_eq!(read(&m.path("c")).unwrap(), b"C");

    fs::rename(m.path("a"), m.path("b")).unwrap();
    fs::remove_file(m.path("c")).unwrap();
    sync_dir(&m.path(""));
    m.cut();
    assert!(read(&m.path("a")).is_none());
    assert_eq!(read(&m.path("b")).unwrap(), b"A");
    assert!(read(&m.path("c")).is_none());
}

/// The same history, cut with the same seed, leaves the same bytes; other
/// seeds keep other prefixes, some of them torn.
#[test]
fn a_seeded_cut_keeps_a_deterministic_prefix_of_unsynced_writes() {
    let history = |seed: u64| -> Vec<u8> {
        let mut m = Mounted::new();
        let mut f = File::create(m.path("log")).unwrap();
        sync_dir(&m.path(""));
        f.write_all(b"head").unwrap();
        f.sync_data().unwrap();
        for i in 0..12u8 {
            f.write_all(&[b'a' + i; 100]).unwrap();
        }
        drop(f);
        m.fs.cut(Survival::SeededPrefix(seed)).unwrap();
        read(&m.path("log")).unwrap()
    };
    let mut lengths = std::collections::BTreeSet::new();
    for seed in 0..12 {
        let bytes = history(seed);
        assert_eq!(history(seed), bytes, "seed {seed}");
        assert!(bytes.starts_with(b"head"));
        for (i, b) in bytes.iter().enumerate().skip(4) {
            assert_eq!(*b, b'a' + ((i - 4) / 100) as u8, "seed {seed}: in order");
        }
        lengths.insert(bytes.len());
    }
    assert!(lengths.len() >= 6, "{lengths:?}");
    assert!(
        lengths.iter().any(|l| (l - 4) % 100 != 0),
        "some write torn: {lengths:?}"
    );
}

#[test]
fn what_sled_and_std_need_works() {
    let m = Mounted::new();
    let dir = m.path("j");
    fs::create_dir_all(dir.join("blobs")).unwrap();

    // create, pwrite at offsets (with a hole), pread, stat, append.
    let f = OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(false)
        .open(dir.join("db"))
        .unwrap();
    f.write_all_at(b"world", 10).unwrap();
    f.write_all_at(b"hello", 0).unwrap();
    let mut buf = [0u8; 15];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"hello\0\0\0\0\0world");
    assert_eq!(f.metadata().unwrap().len(), 15);
    assert!(f.metadata().unwrap().is_file());
    f.sync_data().unwrap();
    f.sync_all().unwrap();

    let mut a = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("wal"))
        .unwrap();
    a.write_all(b"one").unwrap();
    a.write_all(b"two").unwrap();
    assert_eq!(fs::read(dir.join("wal")).unwrap(), b"onetwo");

    // seek + read, truncate.
    let mut r = File::open(dir.join("db")).unwrap();
    r.seek(SeekFrom::Start(10)).unwrap();
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    assert_eq!(s, "world");
    f.set_len(5).unwrap();
    assert_eq!(fs::read(dir.join("db")).unwrap(), b"hello");

    // flock as sled takes it: exclusive, non-blocking, per open file.
    let other = File::open(dir.join("db")).unwrap();
    // SAFETY: flock on descriptors this test owns.
    unsafe {
        assert_eq!(libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB), 0);
        assert_eq!(
            libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB),
            -1
        );
        assert_eq!(libc::flock(f.as_raw_fd(), libc::LOCK_UN), 0);
        assert_eq!(
            libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB),
            0
        );
    }

    // readdir, rename, unlink (an open file stays readable), rmdir.
    fs::write(dir.join("snap.1.generating"), b"snap").unwrap();
    fs::rename(dir.join("snap.1.generating"), dir.join("snap.1")).unwrap();
    let mut names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["blobs", "db", "snap.1", "wal"]);
    let mut held = File::open(dir.join("snap.1")).unwrap();
    fs::remove_file(dir.join("snap.1")).unwrap();
    assert!(!dir.join("snap.1").exists());
    let mut s = String::new();
    held.read_to_string(&mut s).unwrap();
    assert_eq!(s, "snap");
    assert_eq!(
        fs::remove_dir(&dir).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::remove_dir(dir.join("blobs")).unwrap();
    assert!(fs::metadata(dir.join("blobs")).is_err());
}

#[test]
fn o_dsync_writes_are_durable_when_they_return() {
    let mut m = Mounted::new();
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_DSYNC)
        .open(m.path("sync"))
        .unwrap();
    sync_dir(&m.path(""));
    f.write_all(b"kept").unwrap();
    drop(f);
    m.cut();
    assert_eq!(read(&m.path("sync")).unwrap(), b"kept");
}

#[test]
fn after_power_off_nothing_reaches_the_disk() {
    let mut m = Mounted::new();
    let mut f = File::create(m.path("f")).unwrap();
    sync_dir(&m.path(""));
    f.write_all(b"before").unwrap();
    f.sync_all().unwrap();
    m.fs.power_off();
    let err = f.write_all(b"after").and_then(|()| f.sync_all());
    assert!(err.is_err(), "a dark disk accepted a write");
    assert!(File::create(m.path("g")).is_err());
    drop(f);
    m.fs.restart(Survival::SeededPrefix(3)).unwrap();
    assert_eq!(read(&m.path("f")).unwrap(), b"before");
    assert!(read(&m.path("g")).is_none());
    assert_eq!(m.fs.cuts(), 1);
}

/// sled itself on the mount: what it flushed (and idem's own fsyncs
/// aside) comes back after an unmount-and-mount with no loss.
#[test]
fn sled_opens_writes_and_reopens_on_the_mount() {
    let mut m = Mounted::new();
    let path = m.path("db");
    {
        let db = sled::open(&path).unwrap();
        db.insert(b"k", b"v".as_slice()).unwrap();
        db.flush().unwrap();
    }
    // Nothing is cut but the cache: every file sled synced is there.
    fs::read_dir(&path).unwrap().for_each(|e| {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            File::open(e.path()).unwrap().sync_all().unwrap();
        }
    });
    sync_dir(&path);
    sync_dir(&m.path(""));
    sync_dir(&path.join("blobs"));
    m.cut();
    let db = sled::open(&path).unwrap();
    assert_eq!(db.get(b"k").unwrap().as_deref(), Some(b"v".as_slice()));
}

#[test]
fn the_durable_image_saves_to_a_plain_directory() {
    let m = Mounted::new();
    fs::create_dir(m.path("d")).unwrap();
    sync_dir(&m.path(""));
    let mut f = File::create(m.path("d/kept")).unwrap();
    f.write_all(b"synced").unwrap();
    f.sync_all().unwrap();
    f.write_all(b"+lost").unwrap();
    File::create(m.path("d/unnamed")).unwrap();
    sync_dir(&m.path("d"));
    fs::remove_file(m.path("d/unnamed")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let saved = out.path().join("image");
    m.fs.save_durable(&saved).unwrap();
    assert_eq!(fs::read(saved.join("d/kept")).unwrap(), b"synced");
    assert_eq!(fs::read(saved.join("d/unnamed")).unwrap(), b"");
}
