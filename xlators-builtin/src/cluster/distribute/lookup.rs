//! Lookup (GlusterFS's `dht_lookup`) and the self-heal of directories it
//! runs: a name is asked of its hashed subvolume and a link file followed;
//! a directory is looked up on every subvolume, made where it is missing
//! and its layout repaired when it has a hole or an overlap.
//!
//! The repair holds an inodelk on the directory (domain
//! [`HEAL_DOMAIN`](super::HEAL_DOMAIN), on the first subvolume that has
//! it), reads the ranges again under it and writes only if they are still
//! broken, so two clients repairing at once write once; both would write
//! the same layout anyway (`Layout::fresh` depends only on the gfid).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use xlfs_sdk::dict::keys::GFID_REQ;
use xlfs_sdk::{
    CallCtx, Dict, Errno, Flock, Fop, FopResult, Gfid, Iatt, LkCmd, Loc, LockType, Request, Response, Value,
};

use super::layout::{LAYOUT_XATTR, Layout, Range};
use super::{
    DirInfo, HEAL_DOMAIN, Inner, Where, entry_iatt, first_error, linkto_of, linkto_xattr, merge_dir, strip_private,
    with_private_keys,
};

/// A name found by [`Inner::find`].
pub(super) struct Found {
    /// The subvolume the name hashes to (None: the layout has a hole).
    pub hashed: Option<usize>,
    /// The subvolume holding the inode (a directory: the answering one).
    pub cached: usize,
    /// The hashed subvolume holds a link file for it.
    pub linked: bool,
    /// The answer (from `cached`), private xattrs still in its xdata.
    pub rsp: Response,
}

impl Found {
    pub(super) fn iatt(&self) -> Iatt {
        entry_iatt(&self.rsp).unwrap_or_default()
    }
}

impl Inner {
    /// The lookup fop.
    pub(super) async fn lookup(&self, ctx: &CallCtx, loc: Loc, xdata: Dict) -> FopResult {
        let mut rsp = if loc.is_entry() {
            self.find(ctx, &loc, &xdata).await?.rsp
        } else if !loc.gfid.is_null() {
            self.lookup_gfid(ctx, loc.gfid, &xdata).await?.1
        } else {
            return Err(Errno::EINVAL);
        };
        rsp.xdata = strip_private(rsp.xdata);
        Ok(rsp)
    }

    /// Finds the name `loc` (parent + name) as lookup does.
    pub(super) async fn find(&self, ctx: &CallCtx, loc: &Loc, xdata: &Dict) -> Result<Found, Errno> {
        let dir = self.layout_of(ctx, loc.parent).await?;
        let xd = with_private_keys(xdata);
        let req = Request::with_xdata(Fop::Lookup { loc: loc.clone() }, xd.clone());
        let hashed = dir.layout.hashed(&loc.name);
        if let Some(h) = hashed {
            match self.wind(h, ctx, req.clone()).await {
                Ok(rsp) => {
                    let iatt = entry_iatt(&rsp)?;
                    if iatt.is_dir() {
                        let rsp = self.dir_everywhere(ctx, loc, &xd, h, rsp).await?;
                        return Ok(Found { hashed, cached: h, linked: false, rsp });
                    }
                    let Some(target) = linkto_xattr(&iatt, &rsp.xdata) else {
                        self.remember(iatt.gfid, Where::File(h));
                        return Ok(Found { hashed, cached: h, linked: false, rsp });
                    };
                    // A data file that still names where it came from: a
                    // migration's switch is under way or was cut short. The
                    // data is where it came from while the source is not yet
                    // marked migrated, and here afterwards.
                    let switching = linkto_of(&iatt, &rsp.xdata).is_none();
                    if let Some(t) = self.index_of(&target).filter(|t| *t != h) {
                        self.stats.links_followed.fetch_add(1, Ordering::Relaxed);
                        match self.wind(t, ctx, req.clone()).await {
                            Ok(r) => {
                                let ia = entry_iatt(&r)?;
                                let ours = !switching || ia.gfid == iatt.gfid;
                                if !ia.is_dir() && linkto_of(&ia, &r.xdata).is_none() && ours {
                                    self.remember(ia.gfid, Where::File(t));
                                    return Ok(Found { hashed, cached: t, linked: true, rsp: r });
                                }
                            }
                            Err(Errno::ENOENT | Errno::ESTALE) => {}
                            Err(e) => return Err(e),
                        }
                    } else {
                        tracing::warn!(volume = %self.name, name = %loc.name, %target, "link file names no other subvolume");
                    }
                    if switching {
                        self.remember(iatt.gfid, Where::File(h));
                        return Ok(Found { hashed, cached: h, linked: false, rsp });
                    }
                }
                Err(Errno::ENOENT) if dir.settled() && self.cfg().lookup_optimize => {
                    tracing::debug!(volume = %self.name, name = %loc.name, hashed = h, "not on its hashed subvolume, layout settled");
                    return Err(Errno::ENOENT);
                }
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        self.find_everywhere(ctx, loc, &xd, hashed).await
    }

    /// Looks the name up on every subvolume: the data file (or directory)
    /// wherever it is.
    async fn find_everywhere(
        &self,
        ctx: &CallCtx,
        loc: &Loc,
        xd: &Dict,
        hashed: Option<usize>,
    ) -> Result<Found, Errno> {
        self.stats.lookups_everywhere.fetch_add(1, Ordering::Relaxed);
        let req = Request::with_xdata(Fop::Lookup { loc: loc.clone() }, xd.clone());
        let mut again = false;
        loop {
            let res = self.fan(&self.all(), ctx, &req).await;
            if let Some(e) = first_error(&res, &[Errno::ENOENT, Errno::ESTALE]) {
                return Err(e);
            }
            match pick_by_name(res, hashed)? {
                Picked::Dir(i, rsp) => {
                    let rsp = self.dir_everywhere(ctx, loc, xd, i, rsp).await?;
                    return Ok(Found { hashed, cached: i, linked: false, rsp });
                }
                Picked::File(i, rsp, linked) => {
                    self.remember(entry_iatt(&rsp)?.gfid, Where::File(i));
                    return Ok(Found { hashed, cached: i, linked, rsp });
                }
                // Only link files or ENOENT: a migration may have switched
                // the name between two of the answers (see `lookup_gfid`).
                Picked::Nothing if !std::mem::replace(&mut again, true) => {
                    self.stats.lookups_again.fetch_add(1, Ordering::Relaxed);
                }
                Picked::Nothing => {
                    tracing::debug!(volume = %self.name, name = %loc.name, "not found on any subvolume, twice");
                    return Err(Errno::ENOENT);
                }
            }
        }
    }

    /// A directory found on subvolume `first` (answer `rsp`): looked up on
    /// the others, made where missing, its layout repaired if broken.
    async fn dir_everywhere(
        &self,
        ctx: &CallCtx,
        loc: &Loc,
        xd: &Dict,
        first: usize,
        rsp: Response,
    ) -> Result<Response, Errno> {
        let iatt = entry_iatt(&rsp)?;
        let mut l = loc.clone();
        l.gfid = iatt.gfid;
        let others: Vec<usize> = self.all().into_iter().filter(|i| *i != first).collect();
        let req = Request::with_xdata(Fop::Lookup { loc: l.clone() }, xd.clone());
        let res = self.fan(&others, ctx, &req).await;
        let mut replies: Vec<Option<FopResult>> = (0..self.n()).map(|_| None).collect();
        replies[first] = Some(Ok(rsp.clone()));
        for (i, r) in others.into_iter().zip(res) {
            replies[i] = Some(r);
        }
        let mut replies: Vec<FopResult> = replies.into_iter().map(|r| r.unwrap_or(Err(Errno::EIO))).collect();
        let mut rsp = rsp;
        merge_dir(&mut rsp, &mut replies);
        self.settle_dir(ctx, Some(&l), iatt, replies).await?;
        Ok(rsp)
    }

    /// Looks an inode up by gfid on every subvolume: (where, answer).
    pub(super) async fn lookup_gfid(
        &self,
        ctx: &CallCtx,
        gfid: Gfid,
        xdata: &Dict,
    ) -> Result<(Where, Response), Errno> {
        let xd = with_private_keys(xdata);
        let req = Request::with_xdata(Fop::Lookup { loc: Loc::gfid(gfid) }, xd);
        // A migration makes the destination a data file before it marks
        // the source (migrate.rs, steps 4 and 5), but the answers of one
        // fan are not taken at one instant: the destination's can come
        // before the switch and the source's after it, and neither is data
        // then. A second fan, sent after every answer of the first, finds
        // the destination switched.
        let mut again = false;
        let (i, iatt, mut rsp, mut res) = loop {
            let res = self.fan(&self.all(), ctx, &req).await;
            if let Some(e) = first_error(&res, &[Errno::ENOENT, Errno::ESTALE]) {
                return Err(e);
            }
            // Not a link file; of two data files (a migration's switch cut
            // short before the source was marked), the one that names no source.
            let found = res
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let rsp = r.as_ref().ok()?;
                    let iatt = entry_iatt(rsp).ok()?;
                    (iatt.is_dir() || linkto_of(&iatt, &rsp.xdata).is_none()).then_some((i, iatt, rsp.clone()))
                })
                .min_by_key(|(_, iatt, rsp)| linkto_xattr(iatt, &rsp.xdata).is_some());
            match found {
                Some((i, iatt, rsp)) => break (i, iatt, rsp, res),
                None if !std::mem::replace(&mut again, true) => {
                    self.stats.lookups_again.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    tracing::debug!(volume = %self.name, %gfid, "no data on any subvolume, twice");
                    return Err(Errno::ENOENT);
                }
            }
        };
        if iatt.is_dir() {
            merge_dir(&mut rsp, &mut res);
            self.settle_dir(ctx, None, iatt, res).await?;
            return Ok((Where::Dir, rsp));
        }
        self.remember(gfid, Where::File(i));
        Ok((Where::File(i), rsp))
    }

    /// Where an inode is: remembered, else looked up everywhere.
    pub(super) async fn locate(&self, ctx: &CallCtx, gfid: Gfid) -> Result<Where, Errno> {
        if let Some(w) = self.inodes.get(&gfid) {
            return Ok(w);
        }
        if gfid.is_null() {
            return Err(Errno::EINVAL);
        }
        Ok(self.lookup_gfid(ctx, gfid, &Dict::new()).await?.0)
    }

    /// A directory's layout: remembered, else read (and repaired) by a
    /// lookup of the directory.
    pub(super) async fn layout_of(&self, ctx: &CallCtx, dir: Gfid) -> Result<Arc<DirInfo>, Errno> {
        if let Some(d) = self.dirs.get(&dir) {
            return Ok(d);
        }
        match self.lookup_gfid(ctx, dir, &Dict::new()).await?.0 {
            Where::Dir => self.dirs.get(&dir).ok_or(Errno::EIO),
            Where::File(_) => Err(Errno::ENOTDIR),
        }
    }

    /// Given every subvolume's lookup answer for a directory: makes it where
    /// it is missing (when its name is known), repairs its layout, and
    /// remembers it. A subvolume error other than ENOENT fails the lookup.
    async fn settle_dir(&self, ctx: &CallCtx, loc: Option<&Loc>, iatt: Iatt, res: Vec<FopResult>) -> Result<(), Errno> {
        if let Some(e) = first_error(&res, &[Errno::ENOENT, Errno::ESTALE]) {
            return Err(e);
        }
        let n = self.n();
        let mut present = vec![false; n];
        let mut layout = Layout::empty(n);
        for (i, r) in res.iter().enumerate() {
            if let Ok(rsp) = r
                && entry_iatt(rsp).is_ok_and(|a| a.is_dir())
            {
                present[i] = true;
                layout.ranges[i] = rsp.xdata.get_bytes(LAYOUT_XATTR).and_then(|b| Range::decode(&b));
            }
        }
        if let Some(loc) = loc.filter(|l| l.is_entry()) {
            for (i, p) in present.iter_mut().enumerate() {
                if !*p {
                    *p = self.make_missing_dir(ctx, i, loc, &iatt).await;
                }
            }
        }
        let gfid = iatt.gfid;
        if !layout.anomalies(&present).none() || present.iter().zip(&layout.ranges).any(|(p, r)| *p && r.is_none()) {
            layout = self.heal_layout(ctx, gfid, &present).await?;
        }
        self.remember(gfid, Where::Dir);
        if self.dirs.insert(gfid, Arc::new(DirInfo { layout, present })).is_err() {
            tracing::debug!(volume = %self.name, "directory layout table full");
        }
        Ok(())
    }

    /// Makes a directory missing on subvolume `i` with the gfid, mode and
    /// owner of the copies found; true when it is there afterwards.
    async fn make_missing_dir(&self, ctx: &CallCtx, i: usize, loc: &Loc, iatt: &Iatt) -> bool {
        let mut as_owner = ctx.clone();
        as_owner.uid = iatt.uid;
        as_owner.gid = iatt.gid;
        let fop = Fop::Mkdir { loc: Loc::entry(loc.parent, loc.name.clone()), mode: iatt.mode & 0o7777, umask: 0 };
        let req = Request::with_xdata(fop, Dict::new().with(GFID_REQ, Value::Gfid(iatt.gfid)));
        match self.wind(i, &as_owner, req).await {
            Ok(_) | Err(Errno::EEXIST) => {
                self.stats.dirs_healed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(volume = %self.name, child = %self.children[i].name, name = %loc.name, "directory made where it was missing");
                true
            }
            Err(e) => {
                tracing::warn!(volume = %self.name, child = %self.children[i].name, name = %loc.name, "cannot heal a missing directory: {e}");
                false
            }
        }
    }

    /// Rewrites a broken layout under the heal lock; returns the layout in
    /// force afterwards.
    async fn heal_layout(&self, ctx: &CallCtx, gfid: Gfid, present: &[bool]) -> Result<Layout, Errno> {
        let at: Vec<usize> = (0..self.n()).filter(|i| present[*i]).collect();
        let Some(&lock_on) = at.first() else { return Err(Errno::ENOENT) };
        let lctx = ctx.with_lk_owner(self.owner());
        let lock = |ty: LockType, cmd: LkCmd| layout_lock(gfid, lctx.lk_owner, ty, cmd);
        match self.wind(lock_on, &lctx, lock(LockType::Write, LkCmd::SetLkw)).await {
            Ok(_) => {}
            // No features/locks below (a bare posix child): nobody else can
            // be repairing through these children's locks either.
            Err(Errno::ENOSYS) => {
                tracing::debug!(volume = %self.name, %gfid, "no inodelk below: layout repaired unlocked");
                return self.heal_layout_locked(&lctx, gfid, &at, present).await;
            }
            Err(e) => return Err(e),
        }
        let r = self.heal_layout_locked(&lctx, gfid, &at, present).await;
        if let Err(e) = self.wind(lock_on, &lctx, lock(LockType::Unlock, LkCmd::SetLk)).await {
            tracing::warn!(volume = %self.name, %gfid, "layout heal unlock: {e}");
        }
        r
    }

    async fn heal_layout_locked(
        &self,
        ctx: &CallCtx,
        gfid: Gfid,
        at: &[usize],
        present: &[bool],
    ) -> Result<Layout, Errno> {
        let now = self.read_layout(ctx, gfid, at).await?;
        let whole = now.anomalies(present).none() && at.iter().all(|i| now.ranges[*i].is_some());
        if whole {
            return Ok(now);
        }
        let new = now.repaired_on(gfid, &self.active());
        self.write_layout(ctx, gfid, &new, at).await?;
        self.stats.layouts_healed.fetch_add(1, Ordering::Relaxed);
        tracing::info!(volume = %self.name, %gfid, "layout repaired");
        let mut written = Layout::empty(self.n());
        for &i in at {
            written.ranges[i] = new.ranges[i];
        }
        Ok(written)
    }

    /// Writes each subvolume's range of `layout` on its copy of the
    /// directory.
    pub(super) async fn write_layout(
        &self,
        ctx: &CallCtx,
        gfid: Gfid,
        layout: &Layout,
        at: &[usize],
    ) -> Result<(), Errno> {
        let futs = at
            .iter()
            .filter_map(|&i| {
                let r = layout.ranges[i]?;
                let mut x = Dict::new();
                x.set_bytes(LAYOUT_XATTR, r.encode().to_vec());
                let req = Request::new(Fop::Setxattr { loc: Loc::gfid(gfid), xattrs: x, flags: 0 });
                Some(self.wind(i, ctx, req))
            })
            .collect();
        let res = crate::cluster::replicate::join_all(futs).await;
        match first_error(&res, &[]) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What the answers of every subvolume for a name show.
enum Picked {
    /// A directory, from the hashed subvolume if it has it.
    Dir(usize, Response),
    /// A data file, and whether the hashed subvolume holds a link file.
    File(usize, Response, bool),
    Nothing,
}

/// Picks the directory or data file among the answers for a name (the
/// `hashed` subvolume's preferred).
fn pick_by_name(res: Vec<FopResult>, hashed: Option<usize>) -> Result<Picked, Errno> {
    let mut linked = false;
    let mut data: Option<(usize, Response)> = None;
    let mut dir: Option<(usize, Response)> = None;
    for (i, r) in res.into_iter().enumerate() {
        let Ok(rsp) = r else { continue };
        let iatt = entry_iatt(&rsp)?;
        if iatt.is_dir() {
            if dir.is_none() || Some(i) == hashed {
                dir = Some((i, rsp));
            }
        } else if linkto_of(&iatt, &rsp.xdata).is_some() {
            linked |= Some(i) == hashed;
        } else if data.is_none() || Some(i) == hashed {
            data = Some((i, rsp));
        }
    }
    Ok(match (dir, data) {
        (Some((i, rsp)), _) => Picked::Dir(i, rsp),
        (None, Some((i, rsp))) => Picked::File(i, rsp, linked),
        (None, None) => Picked::Nothing,
    })
}

/// The whole-directory lock in the layout heal domain that layout heals
/// and migrations of a directory's files take.
pub(super) fn layout_lock(gfid: Gfid, owner: u64, ty: LockType, cmd: LkCmd) -> Request {
    Request::new(Fop::Inodelk {
        domain: HEAL_DOMAIN.to_string(),
        loc: Loc::gfid(gfid),
        cmd,
        lock: Flock::whole(ty, owner),
    })
}
