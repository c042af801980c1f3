//! The disk behind the power-cut filesystem: every file and directory in
//! two layers, what a reader sees now (the volatile cache) and what is on
//! the platter (the durable image), and the rules that move state from the
//! first to the second (fsync, fdatasync, fsync of a directory) or throw it
//! away (a cut).
//!
//! Pure data, no FUSE, no I/O: the adapter in `fuse.rs` translates kernel
//! requests into these calls, and the model's own tests drive it directly.
//! Errors are errnos, because that is what the adapter answers with.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

use crate::rng::SplitMix64;

/// An inode number. Never reused while the disk lives, so the kernel's
/// caches of an old mount can never confuse two files.
pub(crate) type Ino = u64;
/// The root directory.
pub(crate) const ROOT: Ino = 1;

/// An errno, as answered to the kernel.
pub(crate) type Errno = i32;
pub(crate) type Res<T> = Result<T, Errno>;

/// What survives a cut besides everything that was synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Survival {
    /// Nothing that was not covered by a sync: the worst case, and the one
    /// most failures show up in.
    SyncedOnly,
    /// Also, drawn from this seed: for each file, a prefix of its unsynced
    /// writes in the order they were made, the last one kept possibly torn
    /// (only a prefix of its bytes); and a prefix of the unsynced directory
    /// changes, in order. Real disks write back part of their cache before
    /// the power goes; this is what finds code that trusts a file whose
    /// tail is half written.
    SeededPrefix(u64),
}

/// What a cut did, for the caller's statistics and post-mortems.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Unsynced writes and truncations (of all files) that were lost.
    pub changes_lost: u64,
    /// Unsynced writes and truncations that survived (seeded prefix only).
    pub changes_kept: u64,
    /// Kept writes of which only a strict prefix of the bytes survived.
    pub torn_writes: u64,
    /// Unsynced directory changes (create, mkdir, rename, unlink, rmdir)
    /// that were undone.
    pub entries_lost: u64,
    /// Unsynced directory changes that survived (seeded prefix only).
    pub entries_kept: u64,
    /// Files and directories that no longer exist after the cut.
    pub inodes_freed: u64,
    /// What was lost, one line per file or directory change, by the paths
    /// they had before the cut: `journal/db: 3 of 5 unsynced changes lost`,
    /// `undone: create journal/conf`.
    pub lost: Vec<String>,
}

/// The kind of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
}

/// What `stat` reports of an inode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stat {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    pub nlink: u32,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
}

/// Owner, permissions and times: not modelled across cuts (they keep their
/// current values), because nothing idem or sled does depends on them.
#[derive(Debug, Clone, Copy)]
struct Attrs {
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    crtime: SystemTime,
}

impl Attrs {
    fn new(perm: u16, uid: u32, gid: u32) -> Attrs {
        let now = SystemTime::now();
        Attrs {
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        }
    }

    fn touch(&mut self) {
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
    }
}

/// One unsynced change of a file's contents.
#[derive(Debug, Clone)]
enum Change {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

impl Change {
    fn apply(&self, data: &mut Vec<u8>) {
        match self {
            Change::Write { offset, bytes } => write_at(data, *offset, bytes),
            Change::SetLen(len) => data.resize(*len as usize, 0),
        }
    }
}

fn write_at(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    // A write of nothing does not extend the file (nor does a torn write
    // of which nothing survived).
    if bytes.is_empty() {
        return;
    }
    let start = offset as usize;
    let end = start + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[start..end].copy_from_slice(bytes);
}

#[derive(Debug)]
struct FileNode {
    /// What reads return.
    data: Vec<u8>,
    /// What the platter holds.
    durable: Vec<u8>,
    /// The changes that take `durable` to `data`, oldest first.
    pending: Vec<Change>,
    /// Directory entries naming it now (0 or 1: no hard links).
    links: u32,
}

#[derive(Debug)]
struct DirNode {
    entries: BTreeMap<OsString, Ino>,
    durable: BTreeMap<OsString, Ino>,
    /// For `..`.
    parent: Ino,
}

#[derive(Debug)]
enum Body {
    File(FileNode),
    Dir(DirNode),
}

#[derive(Debug)]
struct Node {
    body: Body,
    attrs: Attrs,
}

/// One entry of a directory changing: `dir/name` from `old` to `new`.
#[derive(Debug, Clone)]
struct EntryChange {
    dir: Ino,
    name: OsString,
    old: Option<Ino>,
    new: Option<Ino>,
}

/// One namespace operation, atomic on the platter (as a journaling file
/// system makes a rename): all of its entry changes survive, or none.
#[derive(Debug, Clone)]
struct NsOp {
    changes: Vec<EntryChange>,
}

impl NsOp {
    fn touches_dir(&self, dir: Ino) -> bool {
        self.changes.iter().any(|c| c.dir == dir)
    }
}

/// The whole disk. See the module's documentation.
#[derive(Debug)]
pub(crate) struct Disk {
    nodes: BTreeMap<Ino, Node>,
    next_ino: Ino,
    /// Namespace operations not yet on the platter, oldest first.
    ns_log: Vec<NsOp>,
    /// Open file handles: whether writes through each are synced before
    /// they return (O_SYNC, O_DSYNC).
    handles: HashMap<u64, bool>,
    next_fh: u64,
    /// False between a power-off and the restart: every request fails.
    powered: bool,
    /// Increases at every restart; requests from an older mount fail.
    boot: u64,
}

impl Disk {
    /// An empty disk: a root directory (durable) and nothing else.
    pub(crate) fn new(uid: u32, gid: u32) -> Disk {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            ROOT,
            Node {
                body: Body::Dir(DirNode {
                    entries: BTreeMap::new(),
                    durable: BTreeMap::new(),
                    parent: ROOT,
                }),
                attrs: Attrs::new(0o755, uid, gid),
            },
        );
        Disk {
            nodes,
            next_ino: ROOT + 1,
            ns_log: Vec::new(),
            handles: HashMap::new(),
            next_fh: 1,
            powered: true,
            boot: 0,
        }
    }

    pub(crate) fn boot(&self) -> u64 {
        self.boot
    }

    /// Fails every request made while the power is off, or through a mount
    /// of an earlier boot.
    pub(crate) fn check(&self, boot: u64) -> Res<()> {
        if self.powered && boot == self.boot {
            Ok(())
        } else {
            Err(libc::EIO)
        }
    }

    fn node(&self, ino: Ino) -> Res<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: Ino) -> Res<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: Ino) -> Res<&DirNode> {
        match &self.node(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> Res<&mut DirNode> {
        match &mut self.node_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn file_mut(&mut self, ino: Ino) -> Res<&mut FileNode> {
        match &mut self.node_mut(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(libc::EISDIR),
        }
    }

    fn kind(&self, ino: Ino) -> Res<Kind> {
        Ok(match self.node(ino)?.body {
            Body::File(_) => Kind::File,
            Body::Dir(_) => Kind::Dir,
        })
    }

    pub(crate) fn stat(&self, ino: Ino) -> Res<Stat> {
        let node = self.node(ino)?;
        let (kind, size, nlink) = match &node.body {
            Body::File(f) => (Kind::File, f.data.len() as u64, f.links),
            Body::Dir(d) => {
                let subdirs = d
                    .entries
                    .values()
                    .filter(|i| self.kind(**i) == Ok(Kind::Dir))
                    .count();
                (Kind::Dir, 0, 2 + subdirs as u32)
            }
        };
        let a = node.attrs;
        Ok(Stat {
            ino,
            kind,
            size,
            nlink,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
            crtime: a.crtime,
        })
    }

    pub(crate) fn lookup(&self, parent: Ino, name: &OsStr) -> Res<Ino> {
        let dir = self.dir(parent)?;
        if name == "." {
            return Ok(parent);
        }
        if name == ".." {
            return Ok(dir.parent);
        }
        dir.entries.get(name).copied().ok_or(libc::ENOENT)
    }

    /// Every entry of a directory, `.` and `..` first.
    pub(crate) fn list(&self, dir: Ino) -> Res<Vec<(Ino, Kind, OsString)>> {
        let d = self.dir(dir)?;
        let mut out = vec![
            (dir, Kind::Dir, OsString::from(".")),
            (d.parent, Kind::Dir, OsString::from("..")),
        ];
        for (name, ino) in &d.entries {
            out.push((*ino, self.kind(*ino)?, name.clone()));
        }
        Ok(out)
    }

    fn check_name(name: &OsStr) -> Res<()> {
        if name.is_empty() || name == "." || name == ".." {
            return Err(libc::EINVAL);
        }
        if name.len() > 255 {
            return Err(libc::ENAMETOOLONG);
        }
        Ok(())
    }

    fn new_node(&mut self, body: Body, attrs: Attrs) -> Ino {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.nodes.insert(ino, Node { body, attrs });
        ino
    }

    /// Applies one namespace operation to the current view and logs it.
    fn record(&mut self, op: NsOp) -> Res<()> {
        for c in &op.changes {
            let dir = self.dir_mut(c.dir)?;
            match c.new {
                Some(ino) => {
                    dir.entries.insert(c.name.clone(), ino);
                }
                None => {
                    dir.entries.remove(&c.name);
                }
            }
            self.node_mut(c.dir)?.attrs.touch();
        }
        self.ns_log.push(op);
        Ok(())
    }

    /// A new, empty regular file `parent/name`.
    pub(crate) fn create(
        &mut self,
        parent: Ino,
        name: &OsStr,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Res<Ino> {
        let file = Body::File(FileNode {
            data: Vec::new(),
            durable: Vec::new(),
            pending: Vec::new(),
            links: 1,
        });
        self.add_entry(parent, name, file, Attrs::new(perm, uid, gid))
    }

    /// A new, empty directory `parent/name`.
    pub(crate) fn mkdir(
        &mut self,
        parent: Ino,
        name: &OsStr,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Res<Ino> {
        let dir = Body::Dir(DirNode {
            entries: BTreeMap::new(),
            durable: BTreeMap::new(),
            parent,
        });
        self.add_entry(parent, name, dir, Attrs::new(perm, uid, gid))
    }

    /// A new node under the new entry `parent/name`.
    fn add_entry(&mut self, parent: Ino, name: &OsStr, body: Body, attrs: Attrs) -> Res<Ino> {
        Self::check_name(name)?;
        if self.dir(parent)?.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.new_node(body, attrs);
        self.record_entry(parent, name, None, Some(ino))?;
        Ok(ino)
    }

    /// Records one entry of `dir` changing from `old` to `new`.
    fn record_entry(
        &mut self,
        dir: Ino,
        name: &OsStr,
        old: Option<Ino>,
        new: Option<Ino>,
    ) -> Res<()> {
        self.record(NsOp {
            changes: vec![EntryChange {
                dir,
                name: name.to_os_string(),
                old,
                new,
            }],
        })
    }

    /// Removes the file `parent/name`. Its data lives on while a handle is
    /// open, as POSIX requires.
    pub(crate) fn unlink(&mut self, parent: Ino, name: &OsStr) -> Res<()> {
        let ino = self.lookup(parent, name)?;
        self.file_mut(ino)?.links -= 1;
        self.record_entry(parent, name, Some(ino), None)
    }

    /// Removes the empty directory `parent/name`.
    pub(crate) fn rmdir(&mut self, parent: Ino, name: &OsStr) -> Res<()> {
        if name == "." {
            return Err(libc::EINVAL);
        }
        let ino = self.lookup(parent, name)?;
        if !self.dir(ino)?.entries.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.record_entry(parent, name, Some(ino), None)
    }

    /// rename(2), with RENAME_NOREPLACE if `no_replace`.
    pub(crate) fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        no_replace: bool,
    ) -> Res<()> {
        Self::check_name(new_name)?;
        let ino = self.lookup(parent, name)?;
        let kind = self.kind(ino)?;
        let target = self.dir(new_parent)?.entries.get(new_name).copied();
        if target == Some(ino) {
            return Ok(());
        }
        if let Some(t) = target {
            if no_replace {
                return Err(libc::EEXIST);
            }
            match (kind, self.kind(t)?) {
                (Kind::File, Kind::Dir) => return Err(libc::EISDIR),
                (Kind::Dir, Kind::File) => return Err(libc::ENOTDIR),
                (Kind::Dir, Kind::Dir) if !self.dir(t)?.entries.is_empty() => {
                    return Err(libc::ENOTEMPTY)
                }
                _ => {}
            }
        }
        if kind == Kind::Dir {
            // A directory cannot move below itself.
            let mut at = new_parent;
            loop {
                if at == ino {
                    return Err(libc::EINVAL);
                }
                if at == ROOT {
                    break;
                }
                at = self.dir(at)?.parent;
            }
        }
        if let Some(t) = target {
            if let Body::File(f) = &mut self.node_mut(t)?.body {
                f.links -= 1;
            }
        }
        self.record(NsOp {
            changes: vec![
                EntryChange {
                    dir: parent,
                    name: name.to_os_string(),
                    old: Some(ino),
                    new: None,
                },
                EntryChange {
                    dir: new_parent,
                    name: new_name.to_os_string(),
                    old: target,
                    new: Some(ino),
                },
            ],
        })?;
        if let Body::Dir(d) = &mut self.node_mut(ino)?.body {
            d.parent = new_parent;
        }
        Ok(())
    }

    pub(crate) fn read(&self, ino: Ino, offset: u64, size: u32) -> Res<Vec<u8>> {
        match &self.node(ino)?.body {
            Body::File(f) => {
                let start = (offset as usize).min(f.data.len());
                let end = start.saturating_add(size as usize).min(f.data.len());
                Ok(f.data[start..end].to_vec())
            }
            Body::Dir(_) => Err(libc::EISDIR),
        }
    }

    pub(crate) fn write(&mut self, ino: Ino, offset: u64, bytes: &[u8]) -> Res<u32> {
        let len = u32::try_from(bytes.len()).map_err(|_| libc::EINVAL)?;
        offset
            .checked_add(bytes.len() as u64)
            .filter(|end| *end <= isize::MAX as u64 / 2)
            .ok_or(libc::EFBIG)?;
        let file = self.file_mut(ino)?;
        let change = Change::Write {
            offset,
            bytes: bytes.to_vec(),
        };
        change.apply(&mut file.data);
        file.pending.push(change);
        self.node_mut(ino)?.attrs.touch();
        Ok(len)
    }

    pub(crate) fn set_len(&mut self, ino: Ino, len: u64) -> Res<()> {
        if len > isize::MAX as u64 / 2 {
            return Err(libc::EFBIG);
        }
        let file = self.file_mut(ino)?;
        if file.data.len() as u64 == len {
            return Ok(());
        }
        let change = Change::SetLen(len);
        change.apply(&mut file.data);
        file.pending.push(change);
        self.node_mut(ino)?.attrs.touch();
        Ok(())
    }

    pub(crate) fn set_attrs(
        &mut self,
        ino: Ino,
        perm: Option<u16>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> Res<()> {
        let a = &mut self.node_mut(ino)?.attrs;
        if let Some(p) = perm {
            a.perm = p;
        }
        if let Some(u) = uid {
            a.uid = u;
        }
        if let Some(g) = gid {
            a.gid = g;
        }
        if let Some(t) = atime {
            a.atime = t;
        }
        if let Some(t) = mtime {
            a.mtime = t;
        }
        a.ctime = SystemTime::now();
        Ok(())
    }

    /// fsync or fdatasync of a file: its contents and size are durable.
    /// Its name is not (that takes an fsync of its directory).
    pub(crate) fn sync_file(&mut self, ino: Ino) -> Res<()> {
        let file = self.file_mut(ino)?;
        for change in file.pending.drain(..) {
            change.apply(&mut file.durable);
        }
        debug_assert_eq!(file.durable, file.data);
        Ok(())
    }

    /// fsync of a directory: every change of its entries is durable, and
    /// with each, every earlier change it depends on (one on the same
    /// entry, or moving the same inode), as a journaling file system
    /// commits them in order.
    pub(crate) fn sync_dir(&mut self, dir: Ino) -> Res<()> {
        self.dir(dir)?;
        let mut chosen = vec![false; self.ns_log.len()];
        let mut keys: BTreeSet<(Ino, OsString)> = BTreeSet::new();
        let mut inos: BTreeSet<Ino> = BTreeSet::new();
        for (i, op) in self.ns_log.iter().enumerate().rev() {
            let depends = op.changes.iter().any(|c| {
                keys.contains(&(c.dir, c.name.clone()))
                    || c.old.is_some_and(|o| inos.contains(&o))
                    || c.new.is_some_and(|n| inos.contains(&n))
            });
            if op.touches_dir(dir) || depends {
                chosen[i] = true;
                for c in &op.changes {
                    keys.insert((c.dir, c.name.clone()));
                    inos.extend(c.old);
                    inos.extend(c.new);
                }
            }
        }
        let log = std::mem::take(&mut self.ns_log);
        for (op, chosen) in log.into_iter().zip(chosen) {
            if chosen {
                self.persist(&op);
            } else {
                self.ns_log.push(op);
            }
        }
        Ok(())
    }

    fn persist(&mut self, op: &NsOp) {
        for c in &op.changes {
            if let Some(Node {
                body: Body::Dir(d), ..
            }) = self.nodes.get_mut(&c.dir)
            {
                match c.new {
                    Some(ino) => {
                        d.durable.insert(c.name.clone(), ino);
                    }
                    None => {
                        d.durable.remove(&c.name);
                    }
                }
            }
        }
    }

    pub(crate) fn open(&mut self, ino: Ino, sync_writes: bool) -> Res<u64> {
        self.node(ino)?;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, sync_writes);
        Ok(fh)
    }

    /// Whether writes through `fh` are synced (O_SYNC, O_DSYNC).
    pub(crate) fn sync_writes(&self, fh: u64) -> bool {
        self.handles.get(&fh).copied().unwrap_or(false)
    }

    pub(crate) fn release(&mut self, fh: u64) {
        self.handles.remove(&fh);
    }

    /// Stops the machine: from now on every request fails with EIO, so
    /// nothing reaches the disk after this instant.
    pub(crate) fn power_off(&mut self) {
        self.powered = false;
    }

    /// What the machine finds when it boots again: the durable image, plus
    /// what `survival` lets through. Open handles are gone; inodes no
    /// longer reachable from the root are freed. Powers on.
    pub(crate) fn restart(&mut self, survival: Survival) -> CutReport {
        self.powered = false;
        let mut report = CutReport::default();
        let paths = self.current_paths();
        let path = |ino: Ino| {
            paths
                .get(&ino)
                .cloned()
                .unwrap_or_else(|| format!("<unlinked inode {ino}>"))
        };
        let entry = |dir: Ino, name: &OsStr| {
            let dir = path(dir);
            let name = name.to_string_lossy();
            if dir.is_empty() {
                name.into_owned()
            } else {
                format!("{dir}/{name}")
            }
        };
        let mut rng = match survival {
            Survival::SyncedOnly => None,
            Survival::SeededPrefix(seed) => Some(SplitMix64::new(seed)),
        };

        // The namespace first: a prefix of the unsynced operations.
        let log = std::mem::take(&mut self.ns_log);
        let keep = rng.as_mut().map_or(0, |r| r.below(log.len() as u64 + 1)) as usize;
        for op in &log[..keep] {
            self.persist(op);
        }
        for op in &log[keep..] {
            let what = match op.changes.as_slice() {
                [from, to] => format!(
                    "rename {} -> {}",
                    entry(from.dir, &from.name),
                    entry(to.dir, &to.name)
                ),
                [c] if c.new.is_some() => format!("create {}", entry(c.dir, &c.name)),
                [c] => format!("remove {}", entry(c.dir, &c.name)),
                _ => "a directory change".to_string(),
            };
            report.lost.push(format!("undone: {what}"));
        }
        report.entries_kept = keep as u64;
        report.entries_lost = (log.len() - keep) as u64;

        // Then each file's contents, in inode order (deterministic).
        for (ino, node) in self.nodes.iter_mut() {
            let Body::File(f) = &mut node.body else {
                continue;
            };
            let pending = std::mem::take(&mut f.pending);
            let mut torn = false;
            let keep = rng
                .as_mut()
                .map_or(0, |r| r.below(pending.len() as u64 + 1)) as usize;
            for (i, change) in pending[..keep].iter().enumerate() {
                match (change, i + 1 == keep, rng.as_mut()) {
                    (Change::Write { offset, bytes }, true, Some(r)) => {
                        let survived = r.below(bytes.len() as u64 + 1) as usize;
                        if survived < bytes.len() {
                            report.torn_writes += 1;
                            torn = true;
                        }
                        write_at(&mut f.durable, *offset, &bytes[..survived]);
                    }
                    _ => change.apply(&mut f.durable),
                }
            }
            report.changes_kept += keep as u64;
            report.changes_lost += (pending.len() - keep) as u64;
            if keep < pending.len() || torn {
                report.lost.push(format!(
                    "{}: {} of {} unsynced changes lost{} ({} bytes now, {} before the cut)",
                    path(*ino),
                    pending.len() - keep,
                    pending.len(),
                    if torn { ", the last kept one torn" } else { "" },
                    f.durable.len(),
                    f.data.len()
                ));
            }
            f.data = f.durable.clone();
        }

        // What the root reaches survives; the rest was never durably named.
        let mut reachable = BTreeSet::from([ROOT]);
        let mut queue = VecDeque::from([ROOT]);
        while let Some(at) = queue.pop_front() {
            if let Some(Node {
                body: Body::Dir(d), ..
            }) = self.nodes.get(&at)
            {
                for ino in d.durable.values() {
                    if reachable.insert(*ino) {
                        queue.push_back(*ino);
                    }
                }
            }
        }
        let before = self.nodes.len();
        self.nodes.retain(|ino, _| reachable.contains(ino));
        report.inodes_freed = (before - self.nodes.len()) as u64;

        // Directories as durable, files linked once each, `..` recomputed.
        let mut parents = Vec::new();
        for (ino, node) in &mut self.nodes {
            if let Body::Dir(d) = &mut node.body {
                d.entries = d.durable.clone();
                parents.extend(d.entries.values().map(|child| (*child, *ino)));
            }
        }
        for node in self.nodes.values_mut() {
            if let Body::File(f) = &mut node.body {
                f.links = 0;
            }
        }
        for (child, parent) in parents {
            match &mut self.nodes.get_mut(&child).expect("reachable").body {
                Body::File(f) => f.links += 1,
                Body::Dir(d) => d.parent = parent,
            }
        }

        self.handles.clear();
        self.boot += 1;
        self.powered = true;
        report
    }

    /// The current path of every inode the root reaches now.
    fn current_paths(&self) -> HashMap<Ino, String> {
        let mut paths = HashMap::from([(ROOT, String::new())]);
        let mut queue = VecDeque::from([ROOT]);
        while let Some(at) = queue.pop_front() {
            let Some(Node {
                body: Body::Dir(d), ..
            }) = self.nodes.get(&at)
            else {
                continue;
            };
            let base = paths[&at].clone();
            for (name, ino) in &d.entries {
                let name = name.to_string_lossy();
                let p = if base.is_empty() {
                    name.into_owned()
                } else {
                    format!("{base}/{name}")
                };
                if paths.insert(*ino, p).is_none() {
                    queue.push_back(*ino);
                }
            }
        }
        paths
    }

    /// The durable image as a tree of paths, for saving it to a real
    /// directory: `(relative path, Some(contents))` for files, `None` for
    /// directories, parents before children.
    pub(crate) fn durable_tree(&self) -> Vec<(std::path::PathBuf, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        let mut queue = VecDeque::from([(ROOT, std::path::PathBuf::new())]);
        while let Some((at, path)) = queue.pop_front() {
            let Some(Node {
                body: Body::Dir(d), ..
            }) = self.nodes.get(&at)
            else {
                continue;
            };
            for (name, ino) in &d.durable {
                let child = path.join(name);
                match self.nodes.get(ino).map(|n| &n.body) {
                    Some(Body::File(f)) => out.push((child, Some(f.durable.clone()))),
                    Some(Body::Dir(_)) => {
                        out.push((child.clone(), None));
                        queue.push_back((*ino, child));
                    }
                    None => {}
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    fn disk() -> Disk {
        Disk::new(0, 0)
    }

    fn contents(d: &Disk, parent: Ino, n: &str) -> Option<Vec<u8>> {
        let ino = d.lookup(parent, name(n)).ok()?;
        Some(d.read(ino, 0, u32::MAX).unwrap())
    }

    #[test]
    fn unsynced_data_is_lost_and_synced_data_survives() {
        let mut d = disk();
        let a = d.create(ROOT, name("a"), 0o644, 0, 0).unwrap();
        d.sync_dir(ROOT).unwrap();
        d.write(a, 0, b"durable").unwrap();
        d.sync_file(a).unwrap();
        d.write(a, 7, b" and volatile").unwrap();
        d.set_len(a, 3).unwrap();
        d.create(ROOT, name("b"), 0o644, 0, 0).unwrap();
        let report = d.restart(Survival::SyncedOnly);
        assert_eq!(contents(&d, ROOT, "a").unwrap(), b"durable");
        assert_eq!(report.changes_lost, 2);
        assert_eq!(report.changes_kept, 0);
        assert_eq!(
            report.lost,
            [
                "undone: create b",
                "a: 2 of 2 unsynced changes lost (7 bytes now, 3 before the cut)"
            ]
        );
    }

    #[test]
    fn a_file_synced_in_an_unsynced_directory_is_gone() {
        let mut d = disk();
        let a = d.create(ROOT, name("a"), 0o644, 0, 0).unwrap();
        d.write(a, 0, b"x").unwrap();
        d.sync_file(a).unwrap();
        let report = d.restart(Survival::SyncedOnly);
        assert_eq!(d.lookup(ROOT, name("a")), Err(libc::ENOENT));
        assert_eq!(report.entries_lost, 1);
        assert_eq!(report.inodes_freed, 1);
    }

    #[test]
    fn rename_and_unlink_without_a_directory_sync_are_undone() {
        let mut d = disk();
        for n in ["a", "b"] {
            let i = d.create(ROOT, name(n), 0o644, 0, 0).unwrap();
            d.write(i, 0, n.as_bytes()).unwrap();
            d.sync_file(i).unwrap();
        }
        d.sync_dir(ROOT).unwrap();
        d.rename(ROOT, name("a"), ROOT, name("b"), false).unwrap();
        d.create(ROOT, name("c"), 0o644, 0, 0).unwrap();
        assert_eq!(contents(&d, ROOT, "b").unwrap(), b"a");
        d.restart(Survival::SyncedOnly);
        assert_eq!(contents(&d, ROOT, "a").unwrap(), b"a");
        assert_eq!(contents(&d, ROOT, "b").unwrap(), b"b");
        assert!(contents(&d, ROOT, "c").is_none());

        d.unlink(ROOT, name("a")).unwrap();
        d.restart(Survival::SyncedOnly);
        assert_eq!(contents(&d, ROOT, "a").unwrap(), b"a");
        d.unlink(ROOT, name("a")).unwrap();
        d.sync_dir(ROOT).unwrap();
        d.restart(Survival::SyncedOnly);
        assert!(contents(&d, ROOT, "a").is_none());
    }

    #[test]
    fn a_directory_whose_parent_was_not_synced_vanishes_with_its_files() {
        let mut d = disk();
        let j = d.mkdir(ROOT, name("journal"), 0o755, 0, 0).unwrap();
        let f = d.create(j, name("log"), 0o644, 0, 0).unwrap();
        d.write(f, 0, b"entry").unwrap();
        d.sync_file(f).unwrap();
        d.sync_dir(j).unwrap();
        d.restart(Survival::SyncedOnly);
        assert_eq!(d.lookup(ROOT, name("journal")), Err(libc::ENOENT));
    }

    #[test]
    fn syncing_a_directory_takes_the_changes_it_depends_on() {
        let mut d = disk();
        let x = d.mkdir(ROOT, name("x"), 0o755, 0, 0).unwrap();
        let y = d.mkdir(ROOT, name("y"), 0o755, 0, 0).unwrap();
        d.sync_dir(ROOT).unwrap();
        // Created in x, moved to y: syncing y alone must not leave the
        // file named in both directories by a later prefix of x's log.
        d.create(x, name("f"), 0o644, 0, 0).unwrap();
        d.rename(x, name("f"), y, name("g"), false).unwrap();
        d.sync_dir(y).unwrap();
        d.restart(Survival::SeededPrefix(1));
        assert!(d.lookup(x, name("f")).is_err());
        assert!(d.lookup(y, name("g")).is_ok());
    }

    #[test]
    fn a_prefix_of_unsynced_writes_survives_deterministically_per_seed() {
        let run = |seed: u64| {
            let mut d = disk();
            let a = d.create(ROOT, name("a"), 0o644, 0, 0).unwrap();
            d.sync_dir(ROOT).unwrap();
            d.write(a, 0, b"base").unwrap();
            d.sync_file(a).unwrap();
            for i in 0..8u8 {
                d.write(a, 4 + u64::from(i) * 4, &[b'0' + i; 4]).unwrap();
            }
            let report = d.restart(Survival::SeededPrefix(seed));
            (contents(&d, ROOT, "a").unwrap(), report)
        };
        let mut outcomes = BTreeSet::new();
        for seed in 0..64 {
            let (bytes, report) = run(seed);
            assert_eq!(run(seed).0, bytes, "seed {seed} is not deterministic");
            // Always the synced part, then a prefix of the later writes in
            // order: byte i is b'0' + (i - 4) / 4 up to where it stops.
            assert!(bytes.starts_with(b"base"));
            for (i, b) in bytes.iter().enumerate().skip(4) {
                assert_eq!(*b, b'0' + ((i - 4) / 4) as u8, "seed {seed}: {bytes:?}");
            }
            assert_eq!(report.changes_kept + report.changes_lost, 8);
            let whole = 4 + 4 * report.changes_kept as usize;
            if report.torn_writes == 1 {
                assert!(bytes.len() < whole && bytes.len() > whole - 4 - 1);
            } else {
                assert_eq!(bytes.len(), whole, "seed {seed}");
            }
            outcomes.insert(bytes.len());
        }
        // The seeds reach short, long, and torn outcomes.
        assert!(outcomes.len() > 10, "{outcomes:?}");
        assert!(outcomes.contains(&4));
    }

    #[test]
    fn a_kept_prefix_of_directory_changes_is_in_order() {
        let mut lens = BTreeSet::new();
        for seed in 0..32 {
            let mut d = disk();
            for n in ["a", "b", "c", "d"] {
                d.create(ROOT, name(n), 0o644, 0, 0).unwrap();
            }
            let report = d.restart(Survival::SeededPrefix(seed));
            let names: Vec<_> = d
                .list(ROOT)
                .unwrap()
                .into_iter()
                .skip(2)
                .map(|e| e.2)
                .collect();
            let expected: Vec<OsString> = ["a", "b", "c", "d"][..report.entries_kept as usize]
                .iter()
                .map(OsString::from)
                .collect();
            assert_eq!(names, expected);
            lens.insert(names.len());
        }
        assert_eq!(lens.len(), 5);
    }

    #[test]
    fn o_sync_handles_and_requests_after_power_off() {
        let mut d = disk();
        let a = d.create(ROOT, name("a"), 0o644, 0, 0).unwrap();
        d.sync_dir(ROOT).unwrap();
        let boot = d.boot();
        d.power_off();
        assert_eq!(d.check(boot), Err(libc::EIO));
        d.restart(Survival::SyncedOnly);
        assert_eq!(d.check(boot), Err(libc::EIO), "an old mount stays dead");
        assert_eq!(d.check(d.boot()), Ok(()));
        let fh = d.open(a, true).unwrap();
        assert!(d.sync_writes(fh));
        assert!(d.lookup(ROOT, name("a")).is_ok());
    }

    #[test]
    fn rename_refuses_what_posix_refuses() {
        let mut d = disk();
        let x = d.mkdir(ROOT, name("x"), 0o755, 0, 0).unwrap();
        d.create(x, name("f"), 0o644, 0, 0).unwrap();
        d.create(ROOT, name("g"), 0o644, 0, 0).unwrap();
        assert_eq!(
            d.rename(ROOT, name("x"), x, name("sub"), false),
            Err(libc::EINVAL)
        );
        assert_eq!(
            d.rename(ROOT, name("g"), ROOT, name("x"), false),
            Err(libc::EISDIR)
        );
        assert_eq!(
            d.rename(ROOT, name("g"), x, name("f"), true),
            Err(libc::EEXIST)
        );
        assert_eq!(d.rmdir(ROOT, name("x")), Err(libc::ENOTEMPTY));
        d.rename(ROOT, name("g"), x, name("f"), false).unwrap();
        assert_eq!(d.list(x).unwrap().len(), 3);
    }
}
