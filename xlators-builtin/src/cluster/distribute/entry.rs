//! Entry fops: mkdir and rmdir on every subvolume; create, mknod, symlink
//! and link on the hashed subvolume (or elsewhere with a link file);
//! unlink of a file and its link file; rename.
//!
//! **Rename of a file** `old` -> `new`, the file held by subvolume `C`,
//! `new` hashing to `DH` (GlusterFS's order, `dht-rename.c`):
//! 1. when `DH != C`, make `new` on `DH` route to `C`: a new link file, or
//!    the existing link file of an old `new` repointed to `C`;
//! 2. rename `old` -> `new` on `C` (atomic on that subvolume);
//! 3. remove what is left: `old`'s link file on its hashed subvolume, and
//!    an old `new`'s data on another subvolume.
//!
//! Until step 2, a lookup of `new` on `DH` follows the link to `C`, finds
//! nothing there and looks everywhere, where only link files (skipped) or
//! an old `new` are: the file is visible as `old` only, and an old `new`
//! as `new`. From step 2 on, `new` resolves through `DH` to `C` and `old`
//! no longer exists on `C` (its link file, if any, dangles until step 3
//! and is skipped): the file is visible as `new` only. Step 2 is the single
//! switch, so exactly one of the two names shows the file at every moment.
//! A failure of step 2 undoes step 1 (best effort) and is reported.
//!
//! When an old `new` has its data on `DH` (and `C` is another subvolume),
//! the switch is on `DH` instead, as in GlusterFS: the file first gets the
//! name `new` on `C` as well (a hard link, not seen while `DH` answers for
//! `new`), then a link file to `C`, made under a hidden name on `DH`, is
//! renamed over the old `new` there, replacing it in one step; then `old`
//! is unlinked on `C`. Until that rename `new` is the old file, after it
//! the renamed one (`old` shows it too until the unlink, as a hard link
//! would); a failure before it takes the hard link back and leaves both
//! files as they were.
//!
//! **Rename of a directory** runs on the subvolume `new` hashes to, then on
//! the others; it is not atomic across subvolumes (GlusterFS locks the
//! namespace around it; xlfs does not yet). `RENAME_EXCHANGE` is refused
//! (EINVAL); `RENAME_NOREPLACE` checks the name first.

use std::sync::atomic::Ordering;

use xlfs_sdk::dict::keys::GFID_REQ;
use xlfs_sdk::{
    CallCtx, Dict, Errno, Fd, FdId, Fop, FopResult, Gfid, Loc, Reply, Request, Response, Value, rename_flags,
};

use super::layout::{COMMITTED, Layout};
use super::lookup::Found;
use super::{DirInfo, Inner, LINK_MODE, LINKTO_XATTR, Where, entry_iatt, first_error, linkto_of, with_private_keys};

/// Most stale link files an rmdir removes to let a directory go (more:
/// ENOTEMPTY, as before).
const MAX_STALE_LINKS: usize = 1024;

/// The gfid a creating fop asked for, or a new one.
fn gfid_for(xdata: &Dict) -> Gfid {
    match xdata.get(GFID_REQ) {
        Some(Value::Gfid(g)) if !g.is_null() => *g,
        Some(Value::Bytes(b)) => <[u8; 16]>::try_from(b.as_ref()).map(Gfid).unwrap_or_else(|_| Gfid::random()),
        Some(Value::Str(s)) => Gfid::parse(s).unwrap_or_else(Gfid::random),
        _ => Gfid::random(),
    }
}

impl Inner {
    /// The subvolume `loc`'s name hashes to in its parent. A remembered
    /// layout that hashes it to a subvolume being removed is read again
    /// first: a rebalance may have moved the directory off it since (a
    /// new name made there now would be left behind, and hold up
    /// remove-brick's commit). Not yet moved, the name goes there and the
    /// rebalance takes it along.
    async fn hashed_of(&self, ctx: &CallCtx, loc: &Loc) -> Result<usize, Errno> {
        if !loc.is_entry() {
            return Err(Errno::EINVAL);
        }
        let mut dir = self.layout_of(ctx, loc.parent).await?;
        if dir.layout.hashed(&loc.name).is_some_and(|h| self.leaving(h)) {
            self.dirs.remove(&loc.parent);
            dir = self.layout_of(ctx, loc.parent).await?;
        }
        dir.layout.hashed(&loc.name).ok_or_else(|| {
            tracing::warn!(volume = %self.name, name = %loc.name, "no subvolume holds the name's hash");
            Errno::EIO
        })
    }

    /// Makes a link file at `loc` on subvolume `on`, for the inode `gfid`
    /// held by subvolume `to`.
    pub(super) async fn make_link(&self, ctx: &CallCtx, on: usize, loc: &Loc, gfid: Gfid, to: usize) -> FopResult {
        let mut x = Dict::new().with(GFID_REQ, Value::Gfid(gfid));
        x.set_bytes(LINKTO_XATTR, self.children[to].name.as_bytes().to_vec());
        let fop = Fop::Mknod {
            loc: Loc::entry(loc.parent, loc.name.clone()),
            mode: libc::S_IFREG | LINK_MODE,
            rdev: 0,
            umask: 0,
        };
        let r = self.wind(on, ctx, Request::with_xdata(fop, x)).await;
        if r.is_ok() {
            self.stats.links_made.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// A link file of `gfid` (to subvolume `to`) named `at` on `on`. When
    /// `on` already holds an inode of that gfid (a link file of the same
    /// file under another name: a brick has one inode per gfid), `at`
    /// becomes another name of it, as GlusterFS links the source's link
    /// file in a rename or link.
    async fn link_file(&self, ctx: &CallCtx, on: usize, at: &Loc, gfid: Gfid, to: usize) -> Result<(), Errno> {
        match self.make_link(ctx, on, at, gfid, to).await {
            Ok(_) => Ok(()),
            Err(Errno::EEXIST) => {
                let req = Request::new(Fop::Link { old: Loc::gfid(gfid), new: Loc::entry(at.parent, at.name.clone()) });
                self.wind(on, ctx, req).await.map(|_| ())
            }
            Err(e) => Err(e),
        }
    }

    /// Removes the entry `name` in `parent` on subvolume `on` if it still
    /// has `gfid`; ENOENT is fine.
    async fn remove_on(&self, ctx: &CallCtx, on: usize, parent: Gfid, name: &str, gfid: Gfid) -> Result<(), Errno> {
        let fop = Fop::Unlink { loc: Loc::entry(parent, name).with_gfid(gfid), flags: 0 };
        match self.wind(on, ctx, Request::new(fop)).await {
            Ok(_) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// create, mknod, symlink.
    pub(super) async fn make_file(&self, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        let loc = fop.loc().cloned().ok_or(Errno::EINVAL)?;
        let h = self.hashed_of(ctx, &loc).await?;
        let gfid = gfid_for(&xdata);
        let mut xdata = xdata;
        xdata.set(GFID_REQ, Value::Gfid(gfid));
        let at = match fop {
            Fop::Create { .. } | Fop::Mknod { .. } => self.placement(ctx, h).await,
            _ => h,
        };
        let fd = super::fd_id_of(&fop);
        // A create is always exclusive below: without O_EXCL, an existing
        // name must be opened where its data is, not as the link file a
        // subvolume may hold for it.
        let mut fop = fop;
        let excl = match &mut fop {
            Fop::Create { flags, .. } => {
                let asked = *flags & libc::O_EXCL as u32 != 0;
                *flags |= libc::O_EXCL as u32;
                Some(asked)
            }
            _ => None,
        };
        let req = Request::with_xdata(fop, xdata);
        if !self.layout_of(ctx, loc.parent).await?.settled() || !self.cfg().lookup_optimize {
            // Files may be away from where their names hash (a rebalance
            // is spreading the directory): the name may be data elsewhere
            // with nothing on `h`, where an exclusive create would make it
            // a second time. (The kernel sends a create without a lookup
            // before it when the name is not in its cache.)
            match self.find(ctx, &loc, &Dict::new()).await {
                Ok(_) if excl == Some(false) => return self.open_existing(ctx, &loc, &req).await,
                Ok(_) => return Err(Errno::EEXIST),
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        if at == h {
            let r = match self.wind(h, ctx, req.clone()).await {
                Err(Errno::EEXIST) if excl == Some(false) => return self.open_existing(ctx, &loc, &req).await,
                r => r?,
            };
            self.created(gfid, h, fd);
            return Ok(r);
        }
        // Link first: until the data file exists the link leads nowhere,
        // and the name is never data on two subvolumes.
        self.stats.redirected_creates.fetch_add(1, Ordering::Relaxed);
        match self.make_link(ctx, h, &loc, gfid, at).await {
            Err(Errno::EEXIST) if excl == Some(false) => return self.open_existing(ctx, &loc, &req).await,
            r => r?,
        };
        match self.wind(at, ctx, req).await {
            Ok(r) => {
                self.created(gfid, at, fd);
                Ok(r)
            }
            Err(e) => {
                if let Err(e2) = self.remove_on(ctx, h, loc.parent, &loc.name, gfid).await {
                    tracing::warn!(volume = %self.name, name = %loc.name, "cannot remove a link file after a failed create: {e2}");
                }
                Err(e)
            }
        }
    }

    /// A non-exclusive create of a name that exists: opens the file where
    /// its data is (O_CREAT and O_EXCL dropped), answering as create does.
    async fn open_existing(&self, ctx: &CallCtx, loc: &Loc, create: &Request) -> FopResult {
        let Fop::Create { flags, fd, .. } = create.fop else { return Err(Errno::EINVAL) };
        let f = self.find(ctx, loc, &Dict::new()).await?;
        let iatt = f.iatt();
        if iatt.is_dir() {
            return Err(Errno::EISDIR);
        }
        let flags = flags & !((libc::O_CREAT | libc::O_EXCL) as u32);
        let open = Request::new(Fop::Open { loc: Loc::gfid(iatt.gfid), flags, fd });
        self.wind(f.cached, ctx, open).await?;
        self.created(iatt.gfid, f.cached, Some(fd));
        let postparent = match &f.rsp.reply {
            Reply::Entry { postparent, .. } => *postparent,
            _ => xlfs_sdk::Iatt::default(),
        };
        Ok(Reply::Entry { iatt, postparent }.into())
    }

    fn created(&self, gfid: Gfid, at: usize, fd: Option<xlfs_sdk::FdId>) {
        self.remember(gfid, Where::File(at));
        if let Some(fd) = fd
            && self.fds.insert(fd, Where::File(at)).is_err()
        {
            tracing::debug!(volume = %self.name, "fd table full");
        }
    }

    /// mkdir: on the hashed subvolume, then the others, then the layout.
    pub(super) async fn mkdir(&self, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        let loc = fop.loc().cloned().ok_or(Errno::EINVAL)?;
        let h = self.hashed_of(ctx, &loc).await?;
        let gfid = gfid_for(&xdata);
        let mut xdata = xdata;
        xdata.set(GFID_REQ, Value::Gfid(gfid));
        let req = Request::with_xdata(fop, xdata);
        let first = self.wind(h, ctx, req.clone()).await?;
        let others: Vec<usize> = self.all().into_iter().filter(|i| *i != h).collect();
        let res = self.fan(&others, ctx, &req).await;
        if let Some(e) = first_error(&res, &[]) {
            let made: Vec<usize> =
                others.iter().zip(&res).filter(|(_, r)| r.is_ok()).map(|(i, _)| *i).chain([h]).collect();
            let rm = Request::new(Fop::Rmdir { loc: loc.clone().with_gfid(gfid), flags: 0 });
            for (i, r) in made.iter().zip(self.fan(&made, ctx, &rm).await) {
                if let Err(e2) = r {
                    tracing::warn!(volume = %self.name, child = %self.children[*i].name, "mkdir undo: {e2}");
                }
            }
            return Err(e);
        }
        let layout = Layout::fresh_on(gfid, &self.active(), COMMITTED);
        self.write_layout(ctx, gfid, &layout, &self.all()).await?;
        self.remember(gfid, Where::Dir);
        let info = DirInfo { layout, present: vec![true; self.n()] };
        if self.dirs.insert(gfid, std::sync::Arc::new(info)).is_err() {
            tracing::debug!(volume = %self.name, "directory layout table full");
        }
        Ok(first)
    }

    /// rmdir: the other subvolumes, then the hashed one (so the name stays
    /// found until the end); a failure anywhere is reported (a lookup makes
    /// the copies again). Where the directory holds only stale link files,
    /// they go first ([`Inner::clear_stale_links`]).
    pub(super) async fn rmdir(&self, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        let loc = fop.loc().cloned().ok_or(Errno::EINVAL)?;
        let f = self.find(ctx, &loc, &Dict::new()).await?;
        let iatt = f.iatt();
        if !iatt.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let h = f.hashed.unwrap_or(f.cached);
        let Fop::Rmdir { flags, .. } = fop else { return Err(Errno::EINVAL) };
        let req = Request::with_xdata(Fop::Rmdir { loc: loc.clone().with_gfid(iatt.gfid), flags }, xdata);
        let others: Vec<usize> = self.all().into_iter().filter(|i| *i != h).collect();
        let res = self.fan(&others, ctx, &req).await;
        let mut err = first_error(&res, &[Errno::ENOENT]);
        if err == Some(Errno::ENOTEMPTY) {
            let full: Vec<usize> =
                others.iter().zip(&res).filter(|(_, r)| matches!(r, Err(Errno::ENOTEMPTY))).map(|(i, _)| *i).collect();
            if self.clear_stale_links(ctx, iatt.gfid, &full, h).await {
                err = first_error(&self.fan(&full, ctx, &req).await, &[Errno::ENOENT]);
            }
        }
        if let Some(e) = err {
            self.dirs.remove(&iatt.gfid);
            return Err(e);
        }
        let r = self.wind(h, ctx, req).await;
        self.dirs.remove(&iatt.gfid);
        self.inodes.remove(&iatt.gfid);
        r
    }

    /// When every entry left in directory `dir` on the subvolumes `full`
    /// (whose rmdir found it not empty) and on its hashed subvolume `h` is
    /// a link file (left by a client that died between a file's unlink
    /// and its link file's), removes them so that the directory can go,
    /// as GlusterFS's rmdir does. False, removing nothing, when some entry
    /// is anything else or a listing fails.
    async fn clear_stale_links(&self, ctx: &CallCtx, dir: Gfid, full: &[usize], h: usize) -> bool {
        let mut links = Vec::new();
        for &i in full.iter().chain(std::iter::once(&h)) {
            let Ok(entries) = self.list_on(ctx, i, dir).await else { return false };
            for e in entries.into_iter().filter(|e| e.name != "." && e.name != "..") {
                let link = e.iatt.file_type() == xlfs_sdk::FileType::Regular
                    && e.iatt.mode & 0o7777 == LINK_MODE
                    && e.iatt.size == 0;
                if !link || links.len() >= MAX_STALE_LINKS {
                    return false;
                }
                links.push((i, e.name, e.iatt.gfid));
            }
        }
        for (i, name, gfid) in links {
            if let Err(e) = self.remove_on(ctx, i, dir, &name, gfid).await {
                tracing::warn!(volume = %self.name, %dir, name = %name, "rmdir: removing a stale link file: {e}");
                return false;
            }
            tracing::info!(volume = %self.name, %dir, name = %name, subvolume = %self.children[i].name, "rmdir: removed a stale link file");
        }
        true
    }

    /// Every entry of directory `dir` on subvolume `i`.
    async fn list_on(&self, ctx: &CallCtx, i: usize, dir: Gfid) -> Result<Vec<xlfs_sdk::DirEntry>, Errno> {
        let fd = Fd { id: FdId(self.owner()), gfid: dir };
        self.wind(i, ctx, Request::new(Fop::Opendir { loc: Loc::gfid(dir), fd: fd.id })).await?;
        let (mut out, mut offset) = (Vec::new(), 0);
        let r = loop {
            match self.wind(i, ctx, Request::new(Fop::Readdirp { fd, size: 64 << 10, offset })).await {
                Ok(Response { reply: Reply::Dirents(v), .. }) => {
                    let Some(last) = v.last() else { break Ok(()) };
                    offset = last.d_off;
                    out.extend(v);
                    if out.len() > MAX_STALE_LINKS + 2 {
                        break Err(Errno::ENOTEMPTY);
                    }
                }
                Ok(_) => break Err(Errno::EIO),
                Err(e) => break Err(e),
            }
        };
        let _ = self.wind(i, ctx, Request::new(Fop::Releasedir { fd })).await;
        r.map(|()| out)
    }

    /// unlink: the data file, then its link file.
    pub(super) async fn unlink(&self, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        let Fop::Unlink { loc, flags } = fop else { return Err(Errno::EINVAL) };
        let f = self.find(ctx, &loc, &Dict::new()).await?;
        let iatt = f.iatt();
        if iatt.is_dir() {
            return Err(Errno::EISDIR);
        }
        let req = Request::with_xdata(Fop::Unlink { loc: loc.clone().with_gfid(iatt.gfid), flags }, xdata);
        let r = self.wind(f.cached, ctx, req).await?;
        if let Some(h) = f.hashed.filter(|h| f.linked && *h != f.cached) {
            self.remove_on(ctx, h, loc.parent, &loc.name, iatt.gfid).await?;
        }
        Ok(r)
    }

    /// link: the new name on the file's subvolume, with a link file on the
    /// new name's hashed subvolume first when that is another.
    pub(super) async fn link(&self, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        let Fop::Link { old, new } = fop else { return Err(Errno::EINVAL) };
        // FUSE names the old inode by gfid alone.
        let (c, iatt) = if old.name.is_empty() {
            match self.lookup_gfid(ctx, old.gfid, &Dict::new()).await? {
                (Where::File(i), rsp) => (i, entry_iatt(&rsp)?),
                (Where::Dir, _) => return Err(Errno::EPERM),
            }
        } else {
            let f = self.find(ctx, &old, &Dict::new()).await?;
            (f.cached, f.iatt())
        };
        if iatt.is_dir() {
            return Err(Errno::EPERM);
        }
        let nh = self.hashed_of(ctx, &new).await?;
        if nh != c {
            self.link_file(ctx, nh, &new, iatt.gfid, c).await?;
        }
        let req = Request::with_xdata(Fop::Link { old: old.with_gfid(iatt.gfid), new: new.clone() }, xdata);
        let r = self.wind(c, ctx, req).await;
        if r.is_err()
            && nh != c
            && let Err(e) = self.remove_on(ctx, nh, new.parent, &new.name, iatt.gfid).await
        {
            tracing::warn!(volume = %self.name, name = %new.name, "cannot remove a link file after a failed link: {e}");
        }
        r
    }

    /// rename (see the module docs for the order).
    pub(super) async fn rename(&self, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        let Fop::Rename { old, new, flags } = fop else { return Err(Errno::EINVAL) };
        if flags & rename_flags::EXCHANGE != 0 {
            return Err(Errno::EINVAL);
        }
        let src = self.find(ctx, &old, &Dict::new()).await?;
        let si = src.iatt();
        let dst = match self.find(ctx, &new, &Dict::new()).await {
            Ok(f) => Some(f),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(e),
        };
        if flags & rename_flags::NOREPLACE != 0 && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if dst.as_ref().is_some_and(|d| d.iatt().gfid == si.gfid) {
            // Two names of one inode: rename does nothing.
            return Ok(Reply::Rename { iatt: si }.into());
        }
        if si.is_dir() {
            return self.rename_dir(ctx, old, new, flags, xdata).await;
        }
        if dst.as_ref().is_some_and(|d| d.iatt().is_dir()) {
            return Err(Errno::EISDIR);
        }
        let c = src.cached;
        let dh = self.hashed_of(ctx, &new).await?;
        if let Some(d) = dst.as_ref().filter(|d| dh != c && d.cached == dh) {
            return self.rename_over_data(ctx, &old, &new, &src, d, dh, xdata).await;
        }
        // Step 1: `new` on its hashed subvolume routes to C.
        let undo = if dh != c { self.route_new(ctx, &new, si.gfid, dst.as_ref(), dh, c).await? } else { Undo::None };
        // Step 2: the switch.
        let req =
            Request::with_xdata(Fop::Rename { old: old.clone().with_gfid(si.gfid), new: new.clone(), flags }, xdata);
        let r = match self.wind(c, ctx, req).await {
            Ok(r) => r,
            Err(e) => {
                self.undo_route(ctx, &new, dh, undo).await;
                return Err(e);
            }
        };
        // Step 3: what is left.
        let mut err = self.drop_source_link(ctx, &old, &src).await.err();
        if let Some(d) = &dst {
            let dg = d.iatt().gfid;
            if d.cached != c
                && let Err(e) = self.remove_on(ctx, d.cached, new.parent, &new.name, dg).await
            {
                err.get_or_insert(e);
            }
            self.inodes.remove(&dg);
        }
        self.cleaned_up(&new, err).map(|()| r)
    }

    /// A file rename over a destination whose data is on its hashed
    /// subvolume `dh`, the source's data being elsewhere (GlusterFS renames
    /// on `dh` in this case too). The source first gets the new name where
    /// its data is (a hard link); then on `dh` a link file to it replaces
    /// the destination in one rename there: the switch, before which the
    /// name shows the old destination and after which the source. A
    /// failure up to the switch leaves both files as they were (the hard
    /// link is taken back). Last the old name goes.
    #[allow(clippy::too_many_arguments)]
    async fn rename_over_data(
        &self,
        ctx: &CallCtx,
        old: &Loc,
        new: &Loc,
        src: &Found,
        dst: &Found,
        dh: usize,
        xdata: Dict,
    ) -> FopResult {
        let (c, si) = (src.cached, src.iatt());
        let gfid = si.gfid;
        let link = Request::with_xdata(Fop::Link { old: old.clone().with_gfid(gfid), new: new.clone() }, xdata.clone());
        let linked = match self.wind(c, ctx, link.clone()).await {
            // A link file left on C under the new name (it is not where the
            // name hashes): it goes, and the link is tried again.
            Err(Errno::EEXIST) => {
                let req = Request::with_xdata(Fop::Lookup { loc: new.clone() }, with_private_keys(&Dict::new()));
                let stale = self.wind(c, ctx, req).await?;
                let st = entry_iatt(&stale)?;
                if linkto_of(&st, &stale.xdata).is_none() {
                    return Err(Errno::EEXIST);
                }
                self.remove_on(ctx, c, new.parent, &new.name, st.gfid).await?;
                self.wind(c, ctx, link).await
            }
            r => r,
        };
        let mut iatt = linked?.reply.into_entry()?;
        // The hard link is gone again below: the file keeps its own count.
        iatt.nlink = si.nlink;
        if let Err(e) = self.replace_link(ctx, dh, new, gfid, c).await {
            if let Err(u) = self.remove_on(ctx, c, new.parent, &new.name, gfid).await {
                tracing::warn!(volume = %self.name, name = %new.name, "rename undo: {u}");
            }
            return Err(e);
        }
        self.inodes.remove(&dst.iatt().gfid);
        let unlink = Request::with_xdata(Fop::Unlink { loc: old.clone().with_gfid(gfid), flags: 0 }, xdata);
        let mut err = match self.wind(c, ctx, unlink).await {
            Ok(_) | Err(Errno::ENOENT) => None,
            Err(e) => Some(e),
        };
        if let Err(e) = self.drop_source_link(ctx, old, src).await {
            err.get_or_insert(e);
        }
        self.cleaned_up(new, err).map(|()| Reply::Rename { iatt }.into())
    }

    /// Removes the link file the source's old name had on its hashed
    /// subvolume, if any.
    async fn drop_source_link(&self, ctx: &CallCtx, old: &Loc, src: &Found) -> Result<(), Errno> {
        match src.hashed.filter(|sh| src.linked && *sh != src.cached) {
            Some(sh) => self.remove_on(ctx, sh, old.parent, &old.name, src.iatt().gfid).await,
            None => Ok(()),
        }
    }

    /// A rename's outcome once switched: a cleanup that failed is logged
    /// and reported.
    fn cleaned_up(&self, new: &Loc, err: Option<Errno>) -> Result<(), Errno> {
        match err {
            Some(e) => {
                tracing::warn!(volume = %self.name, name = %new.name, "rename done, cleanup failed: {e}");
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Step 1 of a file rename: `new` on `dh` leads to `c`.
    async fn route_new(
        &self,
        ctx: &CallCtx,
        new: &Loc,
        gfid: Gfid,
        dst: Option<&Found>,
        dh: usize,
        c: usize,
    ) -> Result<Undo, Errno> {
        match dst {
            Some(d) if d.linked && d.hashed == Some(dh) => {
                // The old `new`'s link file names the old `new`'s gfid: a
                // link file of the source's gfid replaces it, at once.
                self.replace_link(ctx, dh, new, gfid, c).await?;
                Ok(Undo::Replace { old: d.iatt().gfid, to: d.cached })
            }
            _ => {
                self.link_file(ctx, dh, new, gfid, c).await?;
                Ok(Undo::Remove { gfid })
            }
        }
    }

    /// Makes `new` on subvolume `on` a link file of `gfid` to subvolume
    /// `to`, replacing the link file there: made under a hidden name
    /// (link files are never listed), then renamed over `new`, so that
    /// `new` never goes missing on `on`.
    async fn replace_link(&self, ctx: &CallCtx, on: usize, new: &Loc, gfid: Gfid, to: usize) -> Result<(), Errno> {
        let tmp = Loc::entry(new.parent, format!(".xlfs-link-{gfid}"));
        self.remove_on(ctx, on, tmp.parent, &tmp.name, gfid).await?;
        self.link_file(ctx, on, &tmp, gfid, to).await?;
        let swap =
            Fop::Rename { old: tmp.clone().with_gfid(gfid), new: Loc::entry(new.parent, new.name.clone()), flags: 0 };
        if let Err(e) = self.wind(on, ctx, Request::new(swap)).await {
            let _ = self.remove_on(ctx, on, tmp.parent, &tmp.name, gfid).await;
            return Err(e);
        }
        Ok(())
    }

    async fn undo_route(&self, ctx: &CallCtx, new: &Loc, dh: usize, undo: Undo) {
        let r = match undo {
            Undo::None => Ok(()),
            Undo::Remove { gfid } => self.remove_on(ctx, dh, new.parent, &new.name, gfid).await,
            Undo::Replace { old, to } => self.replace_link(ctx, dh, new, old, to).await,
        };
        if let Err(e) = r {
            tracing::warn!(volume = %self.name, name = %new.name, "rename undo: {e}");
        }
    }

    /// A directory rename: the new name's hashed subvolume first, then the
    /// others.
    async fn rename_dir(&self, ctx: &CallCtx, old: Loc, new: Loc, flags: u32, xdata: Dict) -> FopResult {
        let dh = self.hashed_of(ctx, &new).await?;
        let req = Request::with_xdata(Fop::Rename { old, new, flags }, xdata);
        let first = self.wind(dh, ctx, req.clone()).await?;
        let others: Vec<usize> = self.all().into_iter().filter(|i| *i != dh).collect();
        let res = self.fan(&others, ctx, &req).await;
        if let Some(e) = first_error(&res, &[]) {
            tracing::warn!(volume = %self.name, "directory rename failed on some subvolumes: {e}");
            return Err(e);
        }
        if let Reply::Rename { iatt } = &first.reply {
            self.dirs.remove(&iatt.gfid);
        }
        Ok(first)
    }
}

/// What undoes step 1 of a rename.
enum Undo {
    None,
    /// The link file made for `new`.
    Remove {
        gfid: Gfid,
    },
    /// The old `new`'s link file (gfid `old`, to subvolume `to`), replaced
    /// by one of the source's gfid: to be put back.
    Replace {
        old: Gfid,
        to: usize,
    },
}
