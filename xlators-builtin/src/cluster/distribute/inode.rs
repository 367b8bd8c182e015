//! Fops on an inode or an open fd: sent to the subvolume holding the file,
//! or for a directory to every subvolume (changes) or the first one that
//! has it (reads); opens remember their subvolume for the fd's later fops.
//!
//! A path fop that fails with ESTALE or ENOENT on the remembered subvolume
//! looks the inode up everywhere and, when it is now elsewhere, runs again
//! there once.

use std::sync::atomic::Ordering;

use xlfs_sdk::dict::keys;
use xlfs_sdk::{CallCtx, Dict, Errno, Fd, Fop, FopResult, Gfid, Loc, Reply, Request, Value};

use super::{Inner, LINKTO_XATTR, Where, fd_id_of, first_error, merge_dir, migrate, strip_private};

/// Fops on a directory that change it: sent to every subvolume.
fn dir_change(fop: &Fop) -> bool {
    matches!(
        fop,
        Fop::Setattr { .. }
            | Fop::Fsetattr { .. }
            | Fop::Setxattr { .. }
            | Fop::Fsetxattr { .. }
            | Fop::Removexattr { .. }
            | Fop::Fremovexattr { .. }
            | Fop::Fsyncdir { .. }
            | Fop::Releasedir { .. }
    )
}

impl Inner {
    /// Every fop not handled by name: by the inode's (or fd's) location.
    pub(super) async fn inode_fop(&self, ctx: &CallCtx, req: Request) -> FopResult {
        if let Some(fd) = req.fop.fd().copied() {
            return self.fd_fop(ctx, fd, req).await;
        }
        if let Fop::Entrylk { loc, name, .. } = &req.fop
            && !name.is_empty()
        {
            // A name lock goes where the name hashes (GlusterFS's dht_entrylk).
            let dir = self.layout_of(ctx, loc.gfid).await?;
            let i = dir.layout.hashed(name).unwrap_or(0);
            return self.wind(i, ctx, req).await;
        }
        let loc = req.fop.loc().cloned().ok_or(Errno::EINVAL)?;
        let gfid = self.gfid_of(ctx, &loc).await?;
        let mut req = req;
        set_gfid(&mut req.fop, gfid);
        if matches!(req.fop, Fop::Open { .. }) {
            // Not a migrated source's dead copy: ESTALE, so found again.
            req.xdata.set(keys::OPEN_DATA_ONLY, Value::Str(LINKTO_XATTR.to_string()));
        }
        let open_id = fd_id_of(&req.fop);
        let w = self.locate(ctx, gfid).await?;
        let r = self.on_inode(ctx, w, &req).await;
        let moved = match &r {
            Err(Errno::ESTALE | Errno::ENOENT) => true,
            Ok(rsp) => migrate::shows_migrated(rsp),
            Err(_) => false,
        };
        let r = match r {
            _ if moved && matches!(w, Where::File(_)) => {
                // Moved, or a stale memory: find it again and retry there once.
                self.inodes.remove(&gfid);
                match self.lookup_gfid(ctx, gfid, &Dict::new()).await {
                    Ok((w2, _)) if w2 != w => {
                        self.stats.relocated.fetch_add(1, Ordering::Relaxed);
                        self.on_inode(ctx, w2, &req).await.inspect(|_| {
                            if let Some(id) = open_id {
                                let _ = self.fds.insert(id, w2);
                            }
                        })
                    }
                    // Marked migrated, not to be found: an error, never
                    // the dead copy's success.
                    Err(e) if r.is_ok() && e != Errno::ENOENT && e != Errno::ESTALE => Err(e),
                    found => {
                        tracing::debug!(volume = %self.name, %gfid, fop = ?req.fop.kind(), "moved, not found elsewhere: {:?}", found.map(|f| f.0));
                        r
                    }
                }
            }
            r => {
                if let (Some(id), true) = (open_id, r.is_ok()) {
                    let _ = self.fds.insert(id, w);
                }
                r
            }
        };
        r.map(|mut rsp| {
            rsp.xdata = strip_private(rsp.xdata);
            if let Reply::Xattrs(d) = rsp.reply {
                rsp.reply = Reply::Xattrs(strip_private(d));
            }
            rsp
        })
    }

    /// The gfid of a location: given, or that of the name it names.
    async fn gfid_of(&self, ctx: &CallCtx, loc: &Loc) -> Result<Gfid, Errno> {
        if !loc.gfid.is_null() {
            return Ok(loc.gfid);
        }
        if !loc.is_entry() {
            return Err(Errno::EINVAL);
        }
        Ok(self.find(ctx, loc, &Dict::new()).await?.iatt().gfid)
    }

    /// A path fop on an inode at `w`.
    async fn on_inode(&self, ctx: &CallCtx, w: Where, req: &Request) -> FopResult {
        match w {
            Where::File(i) => self.wind(i, ctx, req.clone()).await,
            Where::Dir if dir_change(&req.fop) => self.on_all(ctx, req).await,
            Where::Dir => self.first_having(ctx, req).await,
        }
    }

    /// Sends to every subvolume; the first error fails it, else the first
    /// subvolume's answer.
    async fn on_all(&self, ctx: &CallCtx, req: &Request) -> FopResult {
        let mut res = self.fan(&self.all(), ctx, req).await;
        if let Some(e) = first_error(&res, &[]) {
            return Err(e);
        }
        let mut first = res.first().cloned().unwrap_or(Err(Errno::ENOTCONN))?;
        merge_dir(&mut first, &mut res);
        Ok(first)
    }

    /// A directory read: a stat asks every copy and merges their
    /// attributes ([`merge_dir`]); anything else goes to subvolume 0, then
    /// on ENOENT to the next ones (any copy answers).
    async fn first_having(&self, ctx: &CallCtx, req: &Request) -> FopResult {
        if matches!(req.fop, Fop::Stat { .. } | Fop::Fstat { .. }) {
            let mut res = self.fan(&self.all(), ctx, req).await;
            let Some(i) = res.iter().position(Result::is_ok) else {
                return res.into_iter().next().unwrap_or(Err(Errno::ENOENT));
            };
            let mut first = res[i].clone()?;
            merge_dir(&mut first, &mut res);
            return Ok(first);
        }
        let mut last = Err(Errno::ENOENT);
        for i in 0..self.n() {
            last = self.wind(i, ctx, req.clone()).await;
            if !matches!(last, Err(Errno::ENOENT | Errno::ESTALE)) {
                return last;
            }
        }
        last
    }

    /// An fd fop: where the fd was opened.
    async fn fd_fop(&self, ctx: &CallCtx, fd: Fd, req: Request) -> FopResult {
        if let Fop::CopyFileRange { fd_in, fd_out, .. } = &req.fop
            && self.fds.get(&fd_in.id) != self.fds.get(&fd_out.id)
        {
            return Err(Errno::EXDEV);
        }
        let release = matches!(req.fop, Fop::Release { .. } | Fop::Releasedir { .. });
        let w = match self.fds.get(&fd.id) {
            Some(w) => w,
            // An fd not opened through this translator (or forgotten when
            // the table was full): by its inode.
            None => self.locate(ctx, fd.gfid).await?,
        };
        if release {
            self.fds.remove(&fd.id);
            self.fd_flags.remove(&fd.id);
            self.listings.remove(&fd.id);
        }
        let r = match w {
            Where::File(i) if !release => {
                let r = self.wind(i, ctx, req.clone()).await;
                let moved = match &r {
                    Err(Errno::ESTALE | Errno::ENOENT | Errno::EBADF) => true,
                    Ok(rsp) => migrate::shows_migrated(rsp),
                    Err(_) => false,
                };
                if !moved {
                    return self.finish_fd(r);
                }
                let marked = matches!(&r, Ok(rsp) if migrate::shows_migrated(rsp));
                match self.move_fd(ctx, fd, i).await {
                    Ok(Some(j)) => self.wind(j, ctx, req).await,
                    // The fop reached a migrated source and cannot follow
                    // the file: an error, never the dead copy's success.
                    Err(e) if marked => Err(e),
                    Ok(None) | Err(_) => r,
                }
            }
            Where::File(i) => self.wind(i, ctx, req).await,
            Where::Dir if dir_change(&req.fop) => self.on_all(ctx, &req).await,
            // A directory's fstat: every copy, merged.
            Where::Dir if matches!(req.fop, Fop::Fstat { .. }) => self.first_having(ctx, &req).await,
            // Directory reads and locks through an fd: the first subvolume.
            Where::Dir => self.wind(0, ctx, req).await,
        };
        if release {
            return Ok(Reply::Empty.into());
        }
        self.finish_fd(r)
    }

    /// An fd fop's answer without the translator's own xattrs.
    fn finish_fd(&self, r: FopResult) -> FopResult {
        r.map(|mut rsp| {
            rsp.xdata = strip_private(rsp.xdata);
            if let Reply::Xattrs(d) = rsp.reply {
                rsp.reply = Reply::Xattrs(strip_private(d));
            }
            rsp
        })
    }

    /// An fd open on subvolume `was` whose file migrated: opened again by
    /// gfid where the file is now (same fd id, its open flags less the
    /// creating ones), the old one released. The new subvolume, None
    /// when the file is not elsewhere (the original answer stands), or why
    /// it could not be followed.
    async fn move_fd(&self, ctx: &CallCtx, fd: Fd, was: usize) -> Result<Option<usize>, Errno> {
        let _one = self.fd_moves.lock().await;
        if let Some(Where::File(j)) = self.fds.get(&fd.id)
            && j != was
        {
            return Ok(Some(j)); // another fop on this fd moved it
        }
        self.inodes.remove(&fd.gfid);
        let j = match self.lookup_gfid(ctx, fd.gfid, &Dict::new()).await {
            Ok((Where::File(j), _)) if j != was => j,
            Ok(_) | Err(Errno::ENOENT | Errno::ESTALE) => return Ok(None),
            Err(e) => return Err(e),
        };
        let creating = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32;
        let flags = self.fd_flags.get(&fd.id).unwrap_or(libc::O_RDWR as u32) & !creating;
        let open = Request::new(Fop::Open { loc: Loc::gfid(fd.gfid), flags, fd: fd.id });
        if let Err(e) = self.wind(j, ctx, open).await {
            tracing::warn!(volume = %self.name, gfid = %fd.gfid, "reopening an fd where its file migrated: {e}");
            return Err(e);
        }
        let _ = self.fds.insert(fd.id, Where::File(j));
        self.stats.fds_moved.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(volume = %self.name, gfid = %fd.gfid, from = %self.children[was].name, to = %self.children[j].name, "fd follows its migrated file");
        let _ = self.wind(was, ctx, Request::new(Fop::Release { fd })).await;
        Ok(Some(j))
    }

    /// opendir: on every subvolume under the same fd id; a failure closes
    /// what was opened and is reported.
    pub(super) async fn opendir(&self, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        let Fop::Opendir { loc, fd } = fop else { return Err(Errno::EINVAL) };
        let gfid = self.gfid_of(ctx, &loc).await?;
        let mut loc = loc;
        loc.gfid = gfid;
        let req = Request::with_xdata(Fop::Opendir { loc, fd }, xdata);
        let res = self.fan(&self.all(), ctx, &req).await;
        if let Some(e) = first_error(&res, &[]) {
            let opened: Vec<usize> = (0..self.n()).filter(|i| res[*i].is_ok()).collect();
            let rel = Request::new(Fop::Releasedir { fd: Fd { id: fd, gfid } });
            self.fan(&opened, ctx, &rel).await;
            return Err(e);
        }
        if self.fds.insert(fd, Where::Dir).is_err() {
            tracing::debug!(volume = %self.name, "fd table full");
        }
        res.into_iter().next().unwrap_or(Err(Errno::ENOTCONN))
    }
}

/// Puts the resolved gfid into the fop's location.
fn set_gfid(fop: &mut Fop, gfid: Gfid) {
    match fop {
        Fop::Stat { loc }
        | Fop::Setattr { loc, .. }
        | Fop::Truncate { loc, .. }
        | Fop::Access { loc, .. }
        | Fop::Readlink { loc, .. }
        | Fop::Open { loc, .. }
        | Fop::Setxattr { loc, .. }
        | Fop::Getxattr { loc, .. }
        | Fop::Removexattr { loc, .. }
        | Fop::Inodelk { loc, .. }
        | Fop::Entrylk { loc, .. }
        | Fop::Xattrop { loc, .. }
        | Fop::Lease { loc, .. } => loc.gfid = gfid,
        _ => {}
    }
}
