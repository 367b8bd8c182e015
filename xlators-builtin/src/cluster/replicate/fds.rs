//! Open fds: AFR opens each file fd on every child that is up, and a
//! directory fd on the child its listing is read from
//! ([`Inner::open_dir`]), under the same [`FdId`] (each brick keeps its own
//! table), and remembers where it is open. Fd-based fops go to those
//! children; a child that lacks the fd (down at open time, or not where
//! the directory was opened) gets it opened lazily (by gfid) when a fop
//! needs it. An fd AFR did not see opened (for example one opened before a graph
//! switch) is taken to be open on every child.

use xlfs_sdk::slots::FdSlots;
use xlfs_sdk::{CallCtx, Errno, Fd, FdId, Fop, Gfid, Loc, Request};

use super::Inner;
use super::pending::{Mask, bit, members};

/// Most fds tracked at once.
pub const MAX_FDS: usize = 1 << 20;

/// Flags an fd is reopened without.
const REOPEN_STRIP: u32 = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32;

/// What AFR keeps per open fd.
#[derive(Clone, Debug)]
pub struct FdCtx {
    /// The inode.
    pub gfid: Gfid,
    /// Open flags (file fds).
    pub flags: u32,
    /// A directory fd.
    pub dir: bool,
    /// Children the fd is open on.
    pub opened: Mask,
    /// The child a directory listing reads from (offsets are per child).
    pub readdir_child: Option<usize>,
}

/// The fd table.
pub struct Fds {
    slots: FdSlots<FdCtx>,
}

impl Fds {
    /// An empty table.
    pub fn new() -> Fds {
        Fds { slots: FdSlots::with_capacity(MAX_FDS) }
    }

    /// Records an fd open on `opened`.
    pub fn insert(&self, id: FdId, ctx: FdCtx) -> Result<(), Errno> {
        self.slots.insert(id, ctx).map(|_| ())
    }

    /// The fd's record.
    pub fn get(&self, id: FdId) -> Option<FdCtx> {
        self.slots.get(&id)
    }

    /// Changes the fd's record.
    pub fn update(&self, id: FdId, f: impl FnOnce(&mut FdCtx)) {
        self.slots.with(&id, f);
    }

    /// Forgets the fd.
    pub fn remove(&self, id: FdId) -> Option<FdCtx> {
        self.slots.remove(&id)
    }

    /// Number of fds tracked.
    pub fn len(&self) -> usize {
        self.slots.len()
    }
}

impl Inner {
    /// The children among `want` where `fd` is open, opening it lazily on
    /// those that are up but lack it.
    pub async fn fd_targets(&self, ctx: &CallCtx, fd: &Fd, want: Mask) -> Mask {
        let Some(f) = self.fds.get(fd.id) else { return want };
        let missing = want & !f.opened & self.up_mask();
        if missing == 0 {
            return want & f.opened;
        }
        let futs = members(missing).map(|i| {
            let fop = if f.dir {
                Fop::Opendir { loc: Loc::gfid(fd.gfid), fd: fd.id }
            } else {
                Fop::Open { loc: Loc::gfid(fd.gfid), flags: f.flags & !REOPEN_STRIP, fd: fd.id }
            };
            let c = ctx.clone();
            async move { (i, self.children[i].call(c, Request::new(fop)).await.is_ok()) }
        });
        let mut added: Mask = 0;
        for (i, ok) in super::join_all(futs.collect()).await {
            if ok {
                added |= bit(i);
            }
        }
        if added != 0 {
            tracing::debug!(volume = %self.name, fd = fd.id.0, children = added, "fd reopened lazily");
            self.fds.update(fd.id, |c| c.opened |= added);
        }
        want & (f.opened | added)
    }

    /// Where `fd` is open (all children for an fd AFR does not know).
    pub fn fd_opened(&self, fd: &Fd) -> Mask {
        self.fds.get(fd.id).map_or(super::pending::all(self.children.len()), |f| f.opened)
    }
}
