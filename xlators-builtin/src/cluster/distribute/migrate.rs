//! Rebalance's work inside distribute (GlusterFS's `dht-rebalance.c`,
//! `dht_migrate_file`), asked for by a rebalance process through virtual
//! setxattrs on the distribute node of its own client graph:
//!
//! - [`FIX_LAYOUT_KEY`] on a directory: its layout rewritten, under the
//!   layout heal lock, to spread over every subvolume
//!   ([`Layout::fixed`]); a layout whose ranges moved is written
//!   unsettled, so lookups of names missing on their hashed subvolume
//!   look everywhere until the directory is settled.
//! - [`MIGRATE_KEY`] on a file (parent + name): the file moved to the
//!   subvolume its name hashes to, when it is elsewhere ([`decide`]). The
//!   reply's xdata says what happened: [`MIGRATED_KEY`] (bytes copied) or
//!   [`SKIPPED_KEY`] (why not).
//! - [`SETTLE_KEY`] on a directory whose files all are where their names
//!   hash: its layout written committed again.
//!
//! **Migration of a file** from subvolume `S` (holding the data) to `D`
//! (where the name hashes):
//! 1. open the source by gfid and take a write inodelk on the whole file
//!    through that fd, in the domain of `S`'s name: the domain
//!    cluster/replicate takes its own transaction locks in, so every
//!    writer's replicate finishes what it has under way and waits for the
//!    lock before its next write, setattr or other change. The lock is
//!    tried (for 1 s), not waited for: a file whose lock stays taken (a
//!    writer's eager lock that is not let go) is skipped as [`BUSY`] and
//!    left where it is, whole;
//! 2. make the destination on `D` as a link file pointing at `S` (or
//!    reuse the link file `D` already holds for that gfid), so the name
//!    still leads to the data on `S`;
//! 3. copy: truncate the destination to the source's size, copy it in
//!    1 MiB reads and writes;
//! 4. switch the destination to a data file: mode, owner and times of the
//!    source, its linkto xattr kept. A lookup that finds a data file still
//!    naming a source looks there, and takes the data from the source
//!    while the source is not marked;
//! 5. mark the source migrated: linkto xattr naming `D`, then mode
//!    [`LINK_MODE`] (from here a lookup of the name finds the data on
//!    `D`); then remove the source's name on `S` (the inode lives on while
//!    fds are open on it; on a subvolume being removed the name stays, a
//!    link file, until the commit) and last the destination's linkto
//!    xattr;
//! 6. unlock through the fd and close it.
//!
//! **Why no write is lost.** A write reaches the source only under
//! replicate's lock on `S`, so each write either completed before step 1
//! granted the lock (and is in the copy) or starts after step 6 (step 5
//! is done). Any fop on the source after step 5 answers with attributes
//! of mode [`LINK_MODE`] (an fd still open on the old inode) or with
//! ESTALE/ENOENT (by gfid, the name being gone); distribute then finds
//! the file again by gfid (link files are not data), reopens the fd there
//! with its flags and sends the fop again (see `inode.rs`), so the write
//! lands on `D` and what it did to the dead source is discarded.
//!
//! **Why no lookup misses the file.** From step 2 to step 4 the name
//! leads to the source's data, from step 4 on to the destination's: at
//! every instant one of them is data. A lookup on every subvolume (by
//! gfid, or by name in an unsettled directory) takes its answers at
//! different instants, though, and may see the destination before step 4
//! and the source after step 5 (marked, or its name gone): no data. Such
//! a lookup is sent once more (`lookup.rs`); its answers all come after
//! the first's, so the destination is data by then.
//!
//! **A migration cut short** (a replica set losing quorum, a crash) is
//! finished by the next rebalance. Before step 5 the source is still the
//! data (writes after the unlock land there, and lookups go there): the
//! file is copied again into the same destination. After it, the data is
//! on `D`: the next run finds the file in place with a linkto xattr left
//! and ends the switch.

use std::sync::atomic::Ordering;

use xlfs_sdk::dict::keys::AFR_CALLER_LOCKED;
use xlfs_sdk::{
    CallCtx, Dict, Errno, Fd, FdId, FileType, Flock, Fop, FopResult, Gfid, Iatt, LkCmd, Loc, LockType, Reply, Request,
    Response, SetAttr, TimeSet, Value,
};

use super::layout::{COMMITTED, LAYOUT_XATTR, Layout, Range};
use super::lookup::layout_lock;
use super::{DirInfo, Inner, LINK_MODE, LINKTO_XATTR, Where, linkto_of, linkto_xattr};

/// Setxattr key: rewrite this directory's layout over every subvolume.
pub const FIX_LAYOUT_KEY: &str = "xlfs.dht.fix-layout";
/// Setxattr key: move this file (parent + name) where its name hashes.
pub const MIGRATE_KEY: &str = "xlfs.dht.migrate";
/// Setxattr key: mark this directory's layout settled (every file in it
/// is where its name hashes).
pub const SETTLE_KEY: &str = "xlfs.dht.settle";
/// Reply key of [`MIGRATE_KEY`]: the file moved; bytes copied (u64).
pub const MIGRATED_KEY: &str = "xlfs.dht.migrated";
/// Reply key of [`MIGRATE_KEY`]: the file stayed; why (string).
pub const SKIPPED_KEY: &str = "xlfs.dht.skipped";

/// True for the virtual keys above.
pub(super) fn is_rebalance_key(key: &str) -> bool {
    matches!(key, FIX_LAYOUT_KEY | MIGRATE_KEY | SETTLE_KEY)
}

/// [`SKIPPED_KEY`]'s reason for a file whose lock stayed taken.
pub const BUSY: &str = "in use: its lock stayed taken";
/// Attempts at the migration lock before a file is left as busy.
const LOCK_TRIES: u32 = 20;
/// The pause between two attempts (the holder's replicate releases an
/// eager lock on the contention notice of an attempt).
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// Bytes per read and write while copying a file.
const CHUNK: u32 = 1 << 20;

/// What rebalance does with one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// It is where its name hashes.
    Stay,
    /// Move it from subvolume `from` to `to`.
    Move {
        /// Where the data is.
        from: usize,
        /// Where the name hashes.
        to: usize,
    },
    /// Leave it, for this reason.
    Skip(&'static str),
}

/// The decision for a file whose name hashes to `hashed` and whose data is
/// on `cached`, with attributes `iatt`.
pub fn decide(hashed: Option<usize>, cached: usize, iatt: &Iatt) -> Decision {
    match hashed {
        None => Decision::Skip("no subvolume holds the name's hash"),
        Some(h) if h == cached => Decision::Stay,
        Some(_) if iatt.file_type() != FileType::Regular => Decision::Skip("only regular files are migrated"),
        Some(_) if iatt.mode & 0o7777 == LINK_MODE => Decision::Skip("being migrated"),
        Some(h) => Decision::Move { from: cached, to: h },
    }
}

/// True when a reply carries the attributes of a migrated source (a
/// regular file of mode [`LINK_MODE`]).
pub(super) fn shows_migrated(rsp: &Response) -> bool {
    let iatt = match &rsp.reply {
        Reply::Attr(i) | Reply::Read { iatt: i, .. } | Reply::Entry { iatt: i, .. } => i,
        Reply::PrePost { post, .. } => post,
        _ => return false,
    };
    iatt.file_type() == FileType::Regular && iatt.mode & 0o7777 == LINK_MODE && !iatt.gfid.is_null()
}

fn skipped(why: &str) -> FopResult {
    Ok(Response { reply: Reply::Empty, xdata: Dict::new().with(SKIPPED_KEY, Value::Str(why.to_string())) })
}

impl Inner {
    /// A setxattr of one of the rebalance keys.
    pub(super) async fn rebalance_op(&self, ctx: &CallCtx, loc: Loc, key: &str) -> FopResult {
        match key {
            MIGRATE_KEY => self.migrate(ctx, loc).await,
            FIX_LAYOUT_KEY | SETTLE_KEY => {
                let gfid =
                    if loc.gfid.is_null() { self.find(ctx, &loc, &Dict::new()).await?.iatt().gfid } else { loc.gfid };
                self.relayout(ctx, gfid, key == SETTLE_KEY).await?;
                Ok(Reply::Empty.into())
            }
            _ => Err(Errno::EINVAL),
        }
    }

    /// fix-layout (`settle` false) or settle (true) of directory `gfid`,
    /// under the layout heal lock.
    async fn relayout(&self, ctx: &CallCtx, gfid: Gfid, settle: bool) -> Result<(), Errno> {
        let dir = self.layout_of(ctx, gfid).await?;
        if !dir.present.iter().all(|p| *p) {
            // Missing somewhere: a lookup by name makes it there first.
            return Err(Errno::EAGAIN);
        }
        let all = self.all();
        let lctx = ctx.with_lk_owner(self.owner());
        let lock = |ty: LockType, cmd: LkCmd| layout_lock(gfid, lctx.lk_owner, ty, cmd);
        let locked = match self.wind(0, &lctx, lock(LockType::Write, LkCmd::SetLkw)).await {
            Ok(_) => true,
            Err(Errno::ENOSYS) => false,
            Err(e) => return Err(e),
        };
        let r = async {
            let now = self.read_layout(&lctx, gfid, &all).await?;
            let active = self.active();
            let new = if settle { now.settled_form_on(gfid, &active) } else { now.fixed_on(gfid, &active) };
            if let Some(new) = &new {
                self.write_layout(&lctx, gfid, new, &all).await?;
                tracing::info!(volume = %self.name, %gfid, settle, "layout rewritten");
            }
            Ok::<Layout, Errno>(new.unwrap_or(now))
        }
        .await;
        if locked && let Err(e) = self.wind(0, &lctx, lock(LockType::Unlock, LkCmd::SetLk)).await {
            tracing::warn!(volume = %self.name, %gfid, "layout unlock: {e}");
        }
        let layout = r?;
        let _ = self.dirs.insert(gfid, std::sync::Arc::new(DirInfo { layout, present: vec![true; self.n()] }));
        Ok(())
    }

    /// Each subvolume's range of directory `gfid` as stored now.
    pub(super) async fn read_layout(&self, ctx: &CallCtx, gfid: Gfid, at: &[usize]) -> Result<Layout, Errno> {
        let mut now = Layout::empty(self.n());
        let read = Request::new(Fop::Getxattr { loc: Loc::gfid(gfid), name: LAYOUT_XATTR.to_string() });
        for (i, r) in at.iter().zip(self.fan(at, ctx, &read).await) {
            match r {
                Ok(rsp) => {
                    let d = rsp.reply.into_xattrs()?;
                    now.ranges[*i] = d.get_bytes(LAYOUT_XATTR).and_then(|b| Range::decode(&b));
                }
                Err(Errno::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(now)
    }

    /// Moves the file `loc` where its name hashes, if it is elsewhere.
    async fn migrate(&self, ctx: &CallCtx, loc: Loc) -> FopResult {
        if !loc.is_entry() {
            return Err(Errno::EINVAL);
        }
        let found = self.find(ctx, &loc, &Dict::new()).await?;
        let iatt = found.iatt();
        let (from, to) = match decide(found.hashed, found.cached, &iatt) {
            Decision::Stay => {
                if let Some(src) = linkto_xattr(&iatt, &found.rsp.xdata) {
                    self.end_switch(ctx, &loc, iatt.gfid, found.cached, &src).await?;
                }
                return skipped("in place");
            }
            Decision::Skip(why) => return skipped(why),
            Decision::Move { from, to } => (from, to),
        };
        let gfid = iatt.gfid;
        let lctx = ctx.with_lk_owner(self.owner());
        let src = Fd { id: FdId(self.owner()), gfid };
        self.wind(
            from,
            &lctx,
            Request::new(Fop::Open { loc: Loc::gfid(gfid), flags: libc::O_RDONLY as u32, fd: src.id }),
        )
        .await?;
        let lock = |ty: LockType, cmd: LkCmd| {
            Request::new(Fop::Finodelk {
                domain: self.children[from].name.to_string(),
                fd: src,
                cmd,
                lock: Flock::whole(ty, lctx.lk_owner),
            })
        };
        // Tried, not waited for: a waiting lock would hold back every
        // writer queued behind it (fairness) for as long as a holder keeps
        // its eager lock; a file kept busy is left for a later pass.
        let mut tries = 0;
        let granted = loop {
            match self.wind(from, &lctx, lock(LockType::Write, LkCmd::SetLk)).await {
                Ok(_) | Err(Errno::ENOSYS) => break Ok(true),
                Err(Errno::EAGAIN) if tries < LOCK_TRIES => {
                    tries += 1;
                    tokio::time::sleep(LOCK_RETRY).await;
                }
                Err(Errno::EAGAIN) => break Ok(false),
                Err(e) => break Err(e),
            }
        };
        let r = match granted {
            Ok(true) => self.migrate_locked(&lctx, &loc, src, from, to).await,
            Ok(false) => {
                let _ = self.wind(from, &lctx, Request::new(Fop::Release { fd: src })).await;
                return skipped(BUSY);
            }
            Err(e) => Err(e),
        };
        if let Err(e) = self.wind(from, &lctx, lock(LockType::Unlock, LkCmd::SetLk)).await
            && e != Errno::ENOSYS
        {
            tracing::warn!(volume = %self.name, name = %loc.name, "migration unlock: {e}");
        }
        let _ = self.wind(from, &lctx, Request::new(Fop::Release { fd: src })).await;
        let bytes = r?;
        let Some(bytes) = bytes else { return skipped("being migrated") };
        self.stats.migrated.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(volume = %self.name, name = %loc.name, from = %self.children[from].name, to = %self.children[to].name, bytes, "file migrated");
        Ok(Response { reply: Reply::Empty, xdata: Dict::new().with(MIGRATED_KEY, Value::U64(bytes)) })
    }

    /// Steps 2 to 5 of a migration, the source locked and open as `src`;
    /// the bytes copied, or None when someone else migrated it first.
    async fn migrate_locked(
        &self,
        ctx: &CallCtx,
        loc: &Loc,
        src: Fd,
        from: usize,
        to: usize,
    ) -> Result<Option<u64>, Errno> {
        let gfid = src.gfid;
        let st = self.wind(from, ctx, Request::new(Fop::Fstat { fd: src })).await?.reply.into_attr()?;
        if st.mode & 0o7777 == LINK_MODE {
            return Ok(None);
        }
        let entry = Loc::entry(loc.parent, loc.name.clone());
        match self.make_link(ctx, to, &entry, gfid, from).await {
            Ok(_) => {}
            Err(Errno::EEXIST) => {
                // The name's link file (a rename or a redirected create
                // made it): used as the destination if it is this file's.
                let rsp = self
                    .wind(
                        to,
                        ctx,
                        Request::with_xdata(Fop::Lookup { loc: entry.clone() }, super::with_private_keys(&Dict::new())),
                    )
                    .await?;
                let ia = super::entry_iatt(&rsp)?;
                // (Or this file's destination from a run whose switch was
                // cut short before the source was marked: copied again.)
                if ia.gfid != gfid || linkto_xattr(&ia, &rsp.xdata).is_none() {
                    return Err(Errno::EEXIST);
                }
            }
            Err(e) => return Err(e),
        }
        let dst = Fd { id: FdId(self.owner()), gfid };
        let copied = async {
            self.wind(
                to,
                ctx,
                Request::new(Fop::Open { loc: Loc::gfid(gfid), flags: libc::O_WRONLY as u32, fd: dst.id }),
            )
            .await?;
            let r = self.copy(ctx, src, from, dst, to, st.size).await;
            let _ = self.wind(to, ctx, Request::new(Fop::Release { fd: dst })).await;
            r
        }
        .await;
        if let Err(e) = copied {
            // Back to how it was: the name leads to the data on `from`.
            let un = Fop::Unlink { loc: entry.clone().with_gfid(gfid), flags: 0 };
            if let Err(e2) = self.wind(to, ctx, Request::new(un)).await {
                tracing::warn!(volume = %self.name, name = %loc.name, "removing a half-migrated copy: {e2}");
            }
            return Err(e);
        }
        // Switch: the destination becomes the data file (still naming the
        // source, so that until the source is marked a lookup goes on
        // finding the data there: an fd open on the source may write to
        // it once the lock is let go, if the switch is cut short).
        let attr = SetAttr {
            mode: Some(st.mode & 0o7777),
            uid: Some(st.uid),
            gid: Some(st.gid),
            atime: Some(TimeSet::At(st.atime)),
            mtime: Some(TimeSet::At(st.mtime)),
        };
        self.wind(to, ctx, Request::new(Fop::Setattr { loc: Loc::gfid(gfid), attr })).await?;
        // Mark the source migrated: from here the data is on `to`.
        let mut x = Dict::new();
        x.set_bytes(LINKTO_XATTR, self.children[to].name.as_bytes().to_vec());
        // Under this caller's lock (replicate locks with its owner).
        let held = || Dict::new().with(AFR_CALLER_LOCKED, Value::U64(1));
        let setx = Fop::Setxattr { loc: Loc::gfid(gfid), xattrs: x, flags: 0 };
        self.wind(from, ctx, Request::with_xdata(setx, held())).await?;
        let mark = SetAttr { mode: Some(LINK_MODE), ..SetAttr::default() };
        self.wind(from, ctx, Request::with_xdata(Fop::Setattr { loc: Loc::gfid(gfid), attr: mark }, held())).await?;
        self.remember(gfid, Where::File(to));
        let src = self.children[from].name.to_string();
        self.end_switch(ctx, &entry, gfid, to, &src).await?;
        Ok(Some(st.size))
    }

    /// The end of a switch (also of one cut short, found by a later
    /// run): the marked source's name `loc` on subvolume `src` removed,
    /// then the destination's linkto xattr on `at`. A source not yet marked
    /// (the data still there) is left alone: its file is moved again.
    ///
    /// A marked source on a subvolume being removed keeps its name, as the
    /// link file it now is: a client that has not yet taken the
    /// `decommissioned-bricks` option (or read the directory's new layout)
    /// still looks the name up there, trusts an ENOENT from it under a
    /// settled layout, and would lose the file until it does. The link
    /// leads it to the data; the brick leaves the volume, link files and
    /// all, at remove-brick's commit.
    async fn end_switch(&self, ctx: &CallCtx, loc: &Loc, gfid: Gfid, at: usize, src: &str) -> Result<(), Errno> {
        let entry = Loc::entry(loc.parent, loc.name.clone());
        if let Some(from) = self.index_of(src).filter(|f| *f != at && !self.leaving(*f)) {
            let look = Request::with_xdata(Fop::Lookup { loc: entry.clone() }, super::with_private_keys(&Dict::new()));
            match self.wind(from, ctx, look).await {
                Ok(rsp) => {
                    let ia = super::entry_iatt(&rsp)?;
                    if ia.gfid == gfid && linkto_of(&ia, &rsp.xdata).is_none() {
                        return Ok(());
                    }
                    if ia.gfid == gfid {
                        let un = Fop::Unlink { loc: entry.with_gfid(gfid), flags: 0 };
                        match self.wind(from, ctx, Request::new(un)).await {
                            Ok(_) | Err(Errno::ENOENT) => {}
                            // A stale link file is skipped by lookups: logged, not failed.
                            Err(e) => {
                                tracing::warn!(volume = %self.name, name = %loc.name, "removing the migrated source: {e}")
                            }
                        }
                    }
                }
                Err(Errno::ENOENT | Errno::ESTALE) => {}
                Err(e) => return Err(e),
            }
        }
        let rm = Fop::Removexattr { loc: Loc::gfid(gfid), name: LINKTO_XATTR.to_string() };
        self.wind(at, ctx, Request::new(rm)).await?;
        Ok(())
    }

    /// Copies `size` bytes from `src` on `from` to `dst` on `to`.
    async fn copy(&self, ctx: &CallCtx, src: Fd, from: usize, dst: Fd, to: usize, size: u64) -> Result<(), Errno> {
        self.wind(to, ctx, Request::new(Fop::Ftruncate { fd: dst, offset: size })).await?;
        let mut off = 0u64;
        while off < size {
            let want = u32::try_from((size - off).min(u64::from(CHUNK))).unwrap_or(CHUNK);
            let data = self
                .wind(from, ctx, Request::new(Fop::Readv { fd: src, size: want, offset: off, flags: 0 }))
                .await?
                .reply
                .into_read()?;
            if data.is_empty() {
                break;
            }
            let n = data.len() as u64;
            self.wind(to, ctx, Request::new(Fop::Writev { fd: dst, data, offset: off, flags: 0 })).await?;
            off += n;
        }
        Ok(())
    }
}

impl Layout {
    /// fix-layout's target for directory `gfid`: None when the ranges are
    /// already balanced ([`Layout::balanced_on`]); else the balanced
    /// layout, committed only when no subvolume that held a range would
    /// hold another one.
    pub fn fixed(&self, gfid: Gfid) -> Option<Layout> {
        self.fixed_on(gfid, &vec![true; self.ranges.len()])
    }

    /// [`Layout::fixed`] over the subvolumes `active` marks (the others
    /// being removed get empty ranges).
    pub fn fixed_on(&self, gfid: Gfid, active: &[bool]) -> Option<Layout> {
        let target = self.repaired_on(gfid, active);
        let same = |a: &Option<Range>, b: &Option<Range>| a.map(|r| (r.start, r.stop)) == b.map(|r| (r.start, r.stop));
        if self.ranges.iter().zip(&target.ranges).all(|(a, b)| same(a, b)) {
            return None;
        }
        Some(target)
    }

    /// settle's target: the same ranges committed, when they are whole
    /// and not committed yet; None otherwise.
    pub fn settled_form(&self, gfid: Gfid) -> Option<Layout> {
        self.settled_form_on(gfid, &vec![true; self.ranges.len()])
    }

    /// [`Layout::settled_form`] over the subvolumes `active` marks.
    pub fn settled_form_on(&self, gfid: Gfid, active: &[bool]) -> Option<Layout> {
        let all = vec![true; self.ranges.len()];
        if self.settled(&all) || self.fixed_on(gfid, active).is_some() || !self.anomalies(&all).none() {
            return None;
        }
        let mut l = self.clone();
        for r in l.ranges.iter_mut().flatten() {
            r.commit = COMMITTED;
        }
        Some(l)
    }
}

#[cfg(test)]
mod unit {
    use super::super::layout::UNSETTLED;
    use super::*;

    fn file(mode: u32) -> Iatt {
        Iatt { mode: libc::S_IFREG | mode, gfid: Gfid::random(), ..Iatt::default() }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(Some(1), 1, &file(0o644)), Decision::Stay);
        assert_eq!(decide(Some(2), 0, &file(0o644)), Decision::Move { from: 0, to: 2 });
        assert!(matches!(decide(None, 0, &file(0o644)), Decision::Skip(_)));
        assert!(matches!(decide(Some(1), 0, &file(LINK_MODE)), Decision::Skip(_)));
        let dir = Iatt { mode: libc::S_IFDIR | 0o755, ..Iatt::default() };
        assert!(matches!(decide(Some(1), 0, &dir), Decision::Skip(_)));
    }

    #[test]
    fn migrated_sources_are_recognised() {
        let rsp = |i: Iatt| Response::from(Reply::PrePost { pre: i, post: i });
        assert!(shows_migrated(&rsp(file(LINK_MODE))));
        assert!(!shows_migrated(&rsp(file(0o644))));
        assert!(!shows_migrated(&Response::from(Reply::Empty)));
    }

    #[test]
    fn fix_layout_spreads_over_a_new_subvolume_and_settle_commits() {
        let g = Gfid::random();
        // A directory laid out over 2 subvolumes, then a third added.
        let old = Layout::fresh(g, 2, COMMITTED);
        let mut grown = Layout::empty(3);
        grown.ranges[..2].copy_from_slice(&old.ranges);
        let fixed = grown.fixed(g).expect("ranges move");
        assert!(fixed.anomalies(&[true; 3]).none());
        assert!(fixed.ranges.iter().flatten().all(|r| r.commit == UNSETTLED), "files may be away: {fixed:?}");
        assert_eq!(fixed.fixed(g), None, "fixing twice changes nothing");
        let settled = fixed.settled_form(g).expect("settles");
        assert!(settled.settled(&[true; 3]));
        assert_eq!(settled.settled_form(g), None);
        assert_eq!(Layout::fresh(g, 3, COMMITTED).fixed(g), None);
        // A broken layout is not settled: fix it first.
        assert_eq!(grown.settled_form(g), None);
    }

    #[test]
    fn decommissioned_subvolumes_get_no_range() {
        let g = Gfid::random();
        let all = Layout::fresh(g, 3, COMMITTED);
        assert_eq!(Layout::fresh_on(g, &[true; 3], COMMITTED), all);
        let active = [true, false, true];
        let fixed = all.fixed_on(g, &active).expect("set 1 loses its range");
        assert!(fixed.ranges[1].is_some_and(|r| r.is_empty()));
        assert!(fixed.anomalies(&[true; 3]).none(), "{fixed:?}");
        for name in ["a", "b", "c", "d", "e", "f", "g"] {
            assert_ne!(fixed.hashed(name), Some(1), "{name}");
        }
        assert_eq!(fixed.fixed_on(g, &active), None);
        assert!(fixed.settled_form_on(g, &active).is_some_and(|l| l.settled(&[true; 3])));
    }
}
