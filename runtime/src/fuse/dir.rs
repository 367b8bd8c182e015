//! Directories: opendir, readdir, readdirplus, releasedir.
//!
//! Listings come from the bricks' readdirp in batches of [`BATCH`] bytes;
//! each entry's offset is the brick's `d_off`, so the kernel resumes from
//! any entry it got. The bricks return `.` and `..` (as GlusterFS's do) and
//! they are passed on; the bridge adds none of its own. What did not fit in
//! the kernel's buffer is kept per open directory and served first when the
//! kernel asks to resume right there, so no entry is fetched twice in a
//! sequential listing.
//!
//! In readdirplus each entry (but `.` and `..`, which the kernel does not
//! link) is an entry reply: it adds one lookup to the inode table, taken
//! back if the entry does not fit.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use fuser::{FileHandle, FopenFlags, INodeNo, ReplyDirectory, ReplyDirectoryPlus};
use parking_lot::Mutex;
use xlfs_sdk::{DirEntry, Errno, Fd, Fop, Loc};

use super::{Caller, Core, file_attr, fuse_errno, fuse_kind};

/// Bytes of brick readdirp asked for at a time (the brick counts about 216
/// bytes plus the name per entry: some 250 entries).
const BATCH: u32 = 64 << 10;

/// Entries fetched but not yet given to the kernel, per open directory.
#[derive(Default)]
pub(super) struct DirBuffers(Mutex<HashMap<u64, Leftover>>);

struct Leftover {
    /// The offset the kernel passes to continue right before `entries`.
    resume: u64,
    entries: VecDeque<DirEntry>,
}

fn is_dot(name: &str) -> bool {
    name == "." || name == ".."
}

impl Core {
    pub(super) async fn opendir(self: Arc<Self>, who: Caller, ino: INodeNo) -> Result<(FileHandle, FopenFlags), Errno> {
        let gfid = self.gfid(ino)?;
        let id = self.new_fd(gfid, libc::O_RDONLY as u32, true)?;
        match self.call(self.ctx(who, 0, true), Fop::Opendir { loc: Loc::gfid(gfid), fd: id }).await {
            Ok(_) => Ok((FileHandle(id.0), FopenFlags::empty())),
            Err(e) => {
                self.fds.release(id);
                Err(e)
            }
        }
    }

    pub(super) async fn releasedir(self: Arc<Self>, who: Caller, fh: FileHandle) -> Result<(), Errno> {
        let fd = self.fd(fh)?;
        self.dirs.0.lock().remove(&fh.0);
        self.release_locks(self.ctx(who, 0, false), fd, true).await
    }

    /// The entries from `offset` on: what is left from the last batch if
    /// the kernel resumes there, else a new batch from the bricks.
    async fn entries_from(&self, who: Caller, fd: Fd, offset: u64) -> Result<VecDeque<DirEntry>, Errno> {
        if let Some(left) = self.dirs.0.lock().remove(&fd.id.0)
            && left.resume == offset
            && !left.entries.is_empty()
        {
            return Ok(left.entries);
        }
        Ok(self.call(self.ctx(who, 0, false), Fop::Readdirp { fd, size: BATCH, offset }).await?.into_dirents()?.into())
    }

    /// Keeps what did not fit for the next call.
    fn keep(&self, fd: Fd, resume: u64, entries: VecDeque<DirEntry>) {
        if !entries.is_empty() {
            self.dirs.0.lock().insert(fd.id.0, Leftover { resume, entries });
        }
    }

    /// The node id shown for `.` (the directory) and `..` (its parent, when
    /// the brick names it).
    fn dot_ino(&self, dir: INodeNo, e: &DirEntry) -> u64 {
        if e.name == "." {
            dir.0
        } else if dir.0 == crate::inode::ROOT_NODEID || e.iatt.gfid.is_null() {
            crate::inode::ROOT_NODEID
        } else {
            self.nodeid_of(e.iatt.gfid)
        }
    }

    pub(super) async fn readdir(
        self: Arc<Self>,
        who: Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let fd = match self.fd(fh) {
            Ok(fd) => fd,
            Err(e) => return reply.error(fuse_errno(e)),
        };
        let mut entries = match self.entries_from(who, fd, offset).await {
            Ok(v) => v,
            Err(e) => return reply.error(fuse_errno(e)),
        };
        let mut resume = offset;
        while let Some(e) = entries.front() {
            let ino_out = if is_dot(&e.name) {
                self.dot_ino(ino, e)
            } else if e.iatt.gfid.is_null() {
                0
            } else {
                self.nodeid_of(e.iatt.gfid)
            };
            if reply.add(INodeNo(ino_out), e.d_off, fuse_kind(e.d_type), &e.name) {
                break;
            }
            resume = e.d_off;
            entries.pop_front();
        }
        self.keep(fd, resume, entries);
        reply.ok();
    }

    pub(super) async fn readdirplus(
        self: Arc<Self>,
        who: Caller,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let fd = match self.fd(fh) {
            Ok(fd) => fd,
            Err(e) => return reply.error(fuse_errno(e)),
        };
        let mut entries = match self.entries_from(who, fd, offset).await {
            Ok(v) => v,
            Err(e) => return reply.error(fuse_errno(e)),
        };
        let (attr_ttl, entry_ttl) = (self.opts.attribute_timeout, self.opts.entry_timeout);
        let ttl = attr_ttl.min(entry_ttl);
        let mut resume = offset;
        while let Some(e) = entries.front() {
            let (attr, counted) = if is_dot(&e.name) || e.iatt.gfid.is_null() {
                // Not linked by the kernel: no lookup is taken.
                let id = if is_dot(&e.name) { self.dot_ino(ino, e) } else { 0 };
                (self.kernel_attr(&e.iatt, id), None)
            } else {
                match self.inodes.lookup_reply(fd.gfid, &e.name, e.iatt.gfid) {
                    Ok(inode) => (self.kernel_attr(&e.iatt, inode.nodeid()), Some(inode.nodeid())),
                    Err(_) => (file_attr(&e.iatt, 0), None),
                }
            };
            if reply.add(attr.ino, e.d_off, &e.name, &ttl, &attr, fuser::Generation(0)) {
                if let Some(id) = counted {
                    self.forget(id, 1);
                }
                break;
            }
            resume = e.d_off;
            entries.pop_front();
        }
        self.keep(fd, resume, entries);
        reply.ok();
    }
}
