//! The FUSE side: kernel requests in, [`Disk`] calls, errnos out.
//!
//! Every request takes the disk's lock for its whole duration, so a
//! power-off (which takes the same lock) falls between two requests: a
//! request either happened entirely before the cut or fails with EIO.

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::disk::{Disk, Kind, Res, Stat};

/// How long the kernel may cache names and attributes. Nothing changes the
/// disk behind the kernel's back except a cut, and every cut is followed by
/// a fresh mount (with empty caches), so this can be long.
const TTL: Duration = Duration::from_secs(3600);

/// One mount's view of the disk.
pub(crate) struct Adapter {
    disk: Arc<Mutex<Disk>>,
    /// The boot this mount belongs to; after a restart its requests fail.
    boot: u64,
}

impl Adapter {
    pub(crate) fn new(disk: Arc<Mutex<Disk>>) -> Adapter {
        let boot = lock(&disk).boot();
        Adapter { disk, boot }
    }

    /// The disk, if it is powered and this mount is current.
    fn disk(&self) -> Res<MutexGuard<'_, Disk>> {
        let disk = lock(&self.disk);
        disk.check(self.boot)?;
        Ok(disk)
    }
}

pub(crate) fn lock(disk: &Mutex<Disk>) -> MutexGuard<'_, Disk> {
    disk.lock().unwrap_or_else(|p| p.into_inner())
}

fn attr(s: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(s.ino),
        size: s.size,
        blocks: s.size.div_ceil(512),
        atime: s.atime,
        mtime: s.mtime,
        ctime: s.ctime,
        crtime: s.crtime,
        kind: match s.kind {
            Kind::File => FileType::RegularFile,
            Kind::Dir => FileType::Directory,
        },
        perm: s.perm,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

/// Answers a request whose only result is success or an errno.
fn done(reply: ReplyEmpty, result: Res<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// O_SYNC includes O_DSYNC's bit on Linux; either makes every write durable
/// before it returns.
fn sync_writes(flags: i32) -> bool {
    flags & libc::O_DSYNC != 0
}

impl Filesystem for Adapter {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self.disk().and_then(|d| {
            let ino = d.lookup(parent.0, name)?;
            d.stat(ino)
        });
        match result {
            Ok(s) => reply.entry(&TTL, &attr(&s), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.disk().and_then(|d| d.stat(ino.0)) {
            Ok(s) => reply.attr(&TTL, &attr(&s)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = self.disk().and_then(|mut d| {
            if let Some(len) = size {
                d.set_len(ino.0, len)?;
            }
            d.set_attrs(
                ino.0,
                mode.map(|m| (m & 0o7777) as u16),
                uid,
                gid,
                atime.map(time),
                mtime.map(time),
            )?;
            d.stat(ino.0)
        });
        match result {
            Ok(s) => reply.attr(&TTL, &attr(&s)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Devices, fifos and sockets are not modelled.
            reply.error(Errno::EPERM);
            return;
        }
        let perm = (mode & !umask & 0o7777) as u16;
        let result = self.disk().and_then(|mut d| {
            let ino = d.create(parent.0, name, perm, req.uid(), req.gid())?;
            d.stat(ino)
        });
        match result {
            Ok(s) => reply.entry(&TTL, &attr(&s), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        let result = self.disk().and_then(|mut d| {
            let ino = d.mkdir(parent.0, name, perm, req.uid(), req.gid())?;
            d.stat(ino)
        });
        match result {
            Ok(s) => reply.entry(&TTL, &attr(&s), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(
            reply,
            self.disk().and_then(|mut d| d.unlink(parent.0, name)),
        )
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        done(reply, self.disk().and_then(|mut d| d.rmdir(parent.0, name)))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            reply.error(Errno::EINVAL);
            return;
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        done(
            reply,
            self.disk()
                .and_then(|mut d| d.rename(parent.0, name, newparent.0, newname, no_replace)),
        )
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // Hard links are not modelled.
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_DIRECT != 0 {
            // O_DIRECT bypasses the page cache this file system models.
            reply.error(Errno::EINVAL);
            return;
        }
        match self
            .disk()
            .and_then(|mut d| d.open(ino.0, sync_writes(flags.0)))
        {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if flags & libc::O_DIRECT != 0 {
            reply.error(Errno::EINVAL);
            return;
        }
        let perm = (mode & !umask & 0o7777) as u16;
        let result = self.disk().and_then(|mut d| {
            let ino = d.create(parent.0, name, perm, req.uid(), req.gid())?;
            let fh = d.open(ino, sync_writes(flags))?;
            Ok((d.stat(ino)?, fh))
        });
        match result {
            Ok((s, fh)) => reply.created(
                &TTL,
                &attr(&s),
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.disk().and_then(|d| d.read(ino.0, offset, size)) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let result = self.disk().and_then(|mut d| {
            let n = d.write(ino.0, offset, data)?;
            if sync_writes(flags.0) || d.sync_writes(fh.0) {
                d.sync_file(ino.0)?;
            }
            Ok(n)
        });
        match result {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) is no durability barrier.
        done(reply, self.disk().map(drop))
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Ok(mut d) = self.disk() {
            d.release(fh.0);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // fsync and fdatasync alike: the data and the size it needs; the
        // attributes that differ between them are not modelled.
        done(reply, self.disk().and_then(|mut d| d.sync_file(ino.0)))
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.disk().and_then(|d| d.list(ino.0).map(|_| ())) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // Offsets are positions in the sorted listing; a listing that
        // changes between calls may skip or repeat a name, which POSIX
        // allows for entries added or removed meanwhile.
        match self.disk().and_then(|d| d.list(ino.0)) {
            Ok(entries) => {
                for (i, (child, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
                    let kind = match kind {
                        Kind::File => FileType::RegularFile,
                        Kind::Dir => FileType::Directory,
                    };
                    if reply.add(INodeNo(*child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        done(reply, self.disk().and_then(|mut d| d.sync_dir(ino.0)))
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.disk() {
            // A nominal 1 TiB of 4 KiB blocks, all free: the disk is memory.
            Ok(_) => reply.statfs(1 << 28, 1 << 28, 1 << 28, 1 << 20, 1 << 20, 4096, 255, 4096),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        done(reply, self.disk().and_then(|d| d.stat(ino.0)).map(drop))
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        // Not modelled; callers (posix_fallocate in glibc) fall back to
        // writing zeros, which is.
        reply.error(Errno::EOPNOTSUPP);
    }
}
