//! A FUSE file system that loses what a power cut loses (feature
//! `powercut`).
//!
//! SIGKILL cannot test durability: the kernel's page cache outlives the
//! process, so a missing fsync is invisible to it. [`PowerCutFs`] serves a
//! mount point from this process and keeps two layers of every file and
//! directory: what readers see now (the volatile cache), and what is on the
//! platter (the durable image). [`PowerCutFs::cut`] throws the first away,
//! as a power loss does, and mounts the second afresh for the next boot.
//!
//! # What is modelled (what POSIX guarantees, and no more)
//!
//! - File contents and size are durable once an `fsync` or `fdatasync` of
//!   that file returned, or a write through a descriptor opened `O_SYNC`
//!   or `O_DSYNC` returned. Nothing else makes them durable: not `close`,
//!   not `sync_file_range` (no durability barrier: it never reaches a FUSE
//!   server), not `sync`/`syncfs` (not forwarded to FUSE servers, and
//!   treated as doing nothing).
//! - A directory entry (create, mkdir, rename, unlink, rmdir) is durable
//!   once an `fsync` of that directory returned, together with the earlier
//!   changes it depends on (same entry, or the same file moved). An fsync of
//!   a file does *not* make its name durable, though ext4 usually would: a
//!   new file whose directory was never synced is gone after a cut even if
//!   its data was synced, and so is a new directory whose parent was never
//!   synced, with everything in it. A rename or unlink not covered by a sync
//!   of its directory is undone.
//! - A rename is atomic across a cut (all or nothing), as on every
//!   journaling file system.
//! - What a cut keeps of the unsynced state ([`Survival`]): nothing, or a
//!   seeded-random prefix of each file's unsynced writes in the order they
//!   were made, the last one possibly torn (only a prefix of its bytes), and
//!   a prefix of the unsynced directory changes. A cut is deterministic for
//!   a given history and seed.
//!
//! # What is not modelled
//!
//! `mmap` (writes through a shared mapping reach the server only when the
//! kernel writes the page back), `O_DIRECT` (refused with EINVAL),
//! `fallocate` (refused with EOPNOTSUPP; glibc's `posix_fallocate` then
//! writes zeros, which is modelled), extended attributes (ENOSYS), hard
//! links, symlinks and device nodes (EPERM), reordering of unsynced writes
//! other than a prefix, garbage (rather than old bytes) in a torn sector,
//! and the durability of owners, permissions and times (they keep their
//! current values). File locks (`flock`, `fcntl`) are the kernel's own:
//! this server does not take part, so they work across the processes of
//! one mount and are released when a process dies, as on a local disk.
//!
//! # A cut
//!
//! [`PowerCutFs::power_off`] is the instant the power goes: from then on
//! every request to the mount fails with EIO, so nothing written after it
//! can reach the disk. The caller then SIGKILLs every process using the
//! mount (it knows them; this server does not kill anything), and
//! [`PowerCutFs::restart`] computes what survived, unmounts, and mounts
//! the survivors at the same place with empty kernel caches: the machine
//! rebooted. [`PowerCutFs::cut`] is both in one call, for when no process
//! needs killing in between. [`PowerCutFs::save_durable`] writes what a
//! cut with [`Survival::SyncedOnly`] would leave to an ordinary directory,
//! for a post-mortem.
//!
//! The disk lives in this process's memory; a mount needs `/dev/fuse` and
//! the right to mount (root, or `fusermount3` from Debian's `fuse3`).

mod disk;
mod fuse;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use self::disk::Disk;
pub use self::disk::{CutReport, Survival};
use self::fuse::{lock, Adapter};

/// A mounted power-cut file system; see the [module](self) documentation.
/// Dropping it unmounts it (its state is lost with it).
pub struct PowerCutFs {
    disk: Arc<Mutex<Disk>>,
    mountpoint: PathBuf,
    session: Option<fuser::BackgroundSession>,
    cuts: u64,
}

impl std::fmt::Debug for PowerCutFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerCutFs")
            .field("mountpoint", &self.mountpoint)
            .field("cuts", &self.cuts)
            .finish()
    }
}

impl PowerCutFs {
    /// Mounts an empty disk at `mountpoint` (an existing, empty directory).
    /// Fails with a message saying what is missing if FUSE is unusable
    /// here.
    pub fn mount(mountpoint: impl AsRef<Path>) -> io::Result<PowerCutFs> {
        check_fuse()?;
        let mountpoint = mountpoint.as_ref().to_path_buf();
        // SAFETY: geteuid and getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let mut fs = PowerCutFs {
            disk: Arc::new(Mutex::new(Disk::new(uid, gid))),
            mountpoint,
            session: None,
            cuts: 0,
        };
        fs.attach()?;
        Ok(fs)
    }

    fn attach(&mut self) -> io::Result<()> {
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("idem-powercut".into()),
            fuser::MountOption::Subtype("powercut".into()),
            fuser::MountOption::NoAtime,
        ];
        let adapter = Adapter::new(self.disk.clone());
        let session = fuser::spawn_mount(adapter, &self.mountpoint, &config).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot mount the power-cut file system at {}: {e} (FUSE needs /dev/fuse \
                     and root, or fusermount3 from the fuse3 package)",
                    self.mountpoint.display()
                ),
            )
        })?;
        self.session = Some(session);
        Ok(())
    }

    /// Where the file system is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// How many cuts this file system went through.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// The instant the power goes: every request from now on fails with
    /// EIO. Kill the processes using the mount, then [`restart`].
    ///
    /// [`restart`]: PowerCutFs::restart
    pub fn power_off(&self) {
        lock(&self.disk).power_off();
    }

    /// Reboots after a [`power_off`](PowerCutFs::power_off) (powering off
    /// first if that was not done): keeps what `survival` says, unmounts,
    /// and mounts the survivors at the same mount point. Every process
    /// that used the old mount must be dead by now; a file still open on
    /// it only ever gets EIO.
    pub fn restart(&mut self, survival: Survival) -> io::Result<CutReport> {
        self.power_off();
        self.detach()?;
        let report = lock(&self.disk).restart(survival);
        self.cuts += 1;
        self.attach()?;
        Ok(report)
    }

    /// [`power_off`](PowerCutFs::power_off) and
    /// [`restart`](PowerCutFs::restart) in one call.
    pub fn cut(&mut self, survival: Survival) -> io::Result<CutReport> {
        self.restart(survival)
    }

    fn detach(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        match session.umount_and_join() {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                // Something still holds a file open on the mount (it only
                // gets EIO now): detach the mount lazily; its server thread
                // ends when the last holder lets go.
                lazy_unmount(&self.mountpoint)
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
                // The server thread's read of /dev/fuse saw the connection
                // aborted rather than unmounted (seen once in a thousand
                // cuts on a loaded machine): the server is gone either way.
                // Make sure the mount is too; "not mounted" is that.
                match lazy_unmount(&self.mountpoint) {
                    Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(()),
                    other => other,
                }
            }
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("unmount {}: {e}", self.mountpoint.display()),
            )),
        }
    }

    /// Writes the durable image (what a cut keeping nothing unsynced would
    /// leave) into the directory `to`, which must not exist yet.
    pub fn save_durable(&self, to: impl AsRef<Path>) -> io::Result<()> {
        let to = to.as_ref();
        let tree = lock(&self.disk).durable_tree();
        std::fs::create_dir(to)?;
        for (path, contents) in tree {
            let at = to.join(path);
            match contents {
                Some(bytes) => std::fs::write(at, bytes)?,
                None => std::fs::create_dir(at)?,
            }
        }
        Ok(())
    }
}

impl Drop for PowerCutFs {
    fn drop(&mut self) {
        self.power_off();
        let _ = self.detach();
    }
}

fn lazy_unmount(mountpoint: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a valid NUL-terminated path; umount2 reads it only.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(
            e.kind(),
            format!("unmount {}: {e}", mountpoint.display()),
        ))
    }
}

/// Whether this machine can serve a FUSE mount: `/dev/fuse` exists and
/// opens. The error says what to install or change.
pub fn check_fuse() -> io::Result<()> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "/dev/fuse is not usable ({e}): the power-cut file system needs the fuse \
                 kernel module and /dev/fuse (and root, or fusermount3 from Debian's fuse3)"
            ),
        )),
    }
}
