//! Keeping buffered entries true: which fops change which inodes and
//! directories, the sequence of changes seen complete (so an entry read
//! before a change is read again rather than served), and dropping the
//! buffers of directories whose entries changed.

use super::*;

/// Changes seen complete, by inode.
#[derive(Default)]
pub(super) struct Changes {
    pub(super) seq: u64,
    pub(super) recent: HashMap<Gfid, u64>,
    /// Every inode counts as changed at this sequence number.
    pub(super) floor: u64,
}

impl Changes {
    pub(super) fn changed(&mut self, g: Gfid) {
        self.seq += 1;
        if g.is_null() {
            self.recent.clear();
            self.floor = self.seq;
            return;
        }
        if self.recent.len() >= MAX_RECENT && !self.recent.contains_key(&g) {
            self.recent.clear();
            self.floor = self.seq;
        }
        self.recent.insert(g, self.seq);
    }

    pub(super) fn last(&self, g: Gfid) -> u64 {
        let own = if g.is_null() { 0 } else { self.recent.get(&g).copied().unwrap_or(0) };
        own.max(self.floor)
    }
}

impl Inner {
    /// Records completed changes: inodes changed, and directories whose
    /// entries changed (their fds' buffers are dropped).
    pub(super) fn changed(&self, inodes: &[Gfid], dirs: &[Gfid]) {
        {
            let mut ch = self.changes.lock();
            for g in inodes.iter().chain(dirs) {
                if !g.is_null() {
                    ch.changed(*g);
                }
            }
        }
        for dir in dirs.iter().filter(|g| !g.is_null()) {
            let ids = self.by_dir.lock().get(dir).cloned().unwrap_or_default();
            for id in ids {
                if let Some(d) = self.fds.get(&id) {
                    let mut st = d.st.lock();
                    if !st.entries.is_empty() || st.filling || st.eod.is_some() {
                        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    self.drop_buffer(&mut st);
                    drop(st);
                    d.wake.notify_waiters();
                }
            }
        }
    }

    /// Everything may have changed.
    pub(super) fn changed_all(&self) {
        self.changes.lock().changed(Gfid::NULL);
        let mut all = Vec::new();
        self.fds.retain(|_, d| {
            all.push(d.clone());
            true
        });
        for d in all {
            let mut st = d.st.lock();
            self.drop_buffer(&mut st);
            drop(st);
            d.wake.notify_waiters();
        }
    }

    /// Winds a fop that changes entries or inodes, and records the change
    /// when it returns.
    pub(super) fn changing(
        self: &Arc<Self>,
        ctx: CallCtx,
        req: Request,
        inodes: Vec<Gfid>,
        dirs: Vec<Gfid>,
    ) -> FopFuture<'static> {
        let inner = self.clone();
        Box::pin(async move {
            let res = inner.child.call(ctx, req).await;
            let mut inodes = inodes;
            match &res {
                Ok(Response { reply: Reply::PrePost { post, .. }, .. }) => inodes.push(post.gfid),
                Ok(Response { reply: Reply::Rename { iatt }, .. }) => inodes.push(iatt.gfid),
                Ok(Response { reply: Reply::Copied { post, .. }, .. }) => inodes.push(post.gfid),
                _ => {}
            }
            inner.changed(&inodes, &dirs);
            res
        })
    }
}

/// The inodes and directories (entries) a fop changes, known before it is
/// wound; None for fops that change neither.
pub(super) fn changes_of(fop: &Fop) -> Option<(Vec<Gfid>, Vec<Gfid>)> {
    // A location without a gfid changes an inode known only by its parent
    // and name: count the parent as changed, which makes its entries stale.
    let inode = |l: &xlfs_sdk::Loc| if l.gfid.is_null() { (vec![], vec![l.parent]) } else { (vec![l.gfid], vec![]) };
    Some(match fop {
        Fop::Create { loc, .. } | Fop::Mknod { loc, .. } | Fop::Mkdir { loc, .. } | Fop::Symlink { loc, .. } => {
            (vec![], vec![loc.parent])
        }
        Fop::Unlink { loc, .. } | Fop::Rmdir { loc, .. } => (vec![loc.gfid], vec![loc.parent]),
        Fop::Link { old, new } => (vec![old.gfid], vec![new.parent, old.parent]),
        Fop::Rename { old, new, .. } => (vec![old.gfid, new.gfid], vec![old.parent, new.parent]),
        Fop::Setattr { loc, .. }
        | Fop::Truncate { loc, .. }
        | Fop::Setxattr { loc, .. }
        | Fop::Removexattr { loc, .. }
        | Fop::Xattrop { loc, .. } => inode(loc),
        Fop::Open { loc, flags, .. } if flags & libc::O_TRUNC as u32 != 0 => inode(loc),
        Fop::Fsetattr { fd, .. }
        | Fop::Ftruncate { fd, .. }
        | Fop::Writev { fd, .. }
        | Fop::Fallocate { fd, .. }
        | Fop::Discard { fd, .. }
        | Fop::Zerofill { fd, .. }
        | Fop::Fsetxattr { fd, .. }
        | Fop::Fremovexattr { fd, .. }
        | Fop::Fxattrop { fd, .. } => (vec![fd.gfid], vec![]),
        Fop::CopyFileRange { fd_out, .. } => (vec![fd_out.gfid], vec![]),
        _ => return None,
    })
}
