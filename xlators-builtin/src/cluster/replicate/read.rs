//! Lookups and reads (GlusterFS's `afr-read-txn.c` and read-subvolume
//! choice).
//!
//! Lookup goes to every child that is up, asking each for the pending
//! counters of the inode; from them AFR learns which copies are stale
//! (see `pending`) and answers from a good copy. A copy that lacks an
//! entry the others have is stale in every kind; when the parent's entry
//! counters blame a child, that child's word on the entry is not taken.
//! A file's content asked for with `glusterfs.content` (quick-read) is
//! passed up only when the chosen reply comes from a copy a data read
//! would use; otherwise the key is taken out.
//!
//! Reads go to one child: among the children up, holding the fd (for fd
//! fops) and not known stale for what the fop reads, the one chosen by:
//! `read-subvolume` / `read-subvolume-index` when set, else a local child
//! when `choose-local` (a child is local when its root lookup reply says
//! so with [`IS_LOCAL`]; when none says, none is preferred), else
//! `read-hash-mode`: 0 the first, 1 a hash of the gfid (every client reads
//! a file from the same child), 2 a hash of the gfid and the caller's pid,
//! 3 the fewest reads outstanding, 4 the lowest read latency (a moving
//! average of this client's reads; GlusterFS uses the network ping time),
//! 5 latency times outstanding reads. A read that fails with an error
//! that can be the child's own (ENOTCONN, EIO, EBADF, ESTALE, ENOENT, ...)
//! is tried on the next child in turn.
//!
//! After a child comes up, an inode's staleness is looked up again before
//! it is read from (AFR's event generation).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use xlfs_sdk::dict::keys::{self, CONTENT, INDEX_COUNT, IS_LOCAL, OPEN_FD_COUNT, READDIRP_CONTENT};
use xlfs_sdk::{CallCtx, Dict, Errno, Fd, Fop, FopResult, Gfid, Loc, Reply, Request, Response, Value};

use super::Inner;
use super::lock::Target;
use super::pending::{self, Kind, Mask, all, bit, members};
use super::quorum::QUORUM_ERRNO;
use super::transaction::{Outcome, evaluate};

/// Readdirp entries looked up at once when their attributes are vetted.
const VET_BATCH: usize = 64;

/// Per-child read statistics for the load-based read modes.
#[derive(Default)]
pub struct ReadStats {
    outstanding: AtomicU32,
    latency_us: AtomicU64,
}

impl ReadStats {
    fn sample(&self, us: u64) {
        let old = self.latency_us.load(Ordering::Relaxed);
        let new = if old == 0 { us.max(1) } else { (old * 7 + us.max(1)) / 8 };
        self.latency_us.store(new, Ordering::Relaxed);
    }
}

/// Counts a read outstanding while it lives (also if the read is dropped).
struct Outstanding<'a>(&'a AtomicU32);

impl<'a> Outstanding<'a> {
    fn new(c: &'a AtomicU32) -> Self {
        c.fetch_add(1, Ordering::Relaxed);
        Outstanding(c)
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Errors that may be one child's own, worth trying another child for.
fn retryable(e: Errno) -> bool {
    matches!(
        e,
        Errno::ENOTCONN
            | Errno::EIO
            | Errno::EBADF
            | Errno::EBADFD
            | Errno::ESTALE
            | Errno::ENOENT
            | Errno::ECONNRESET
            | Errno::ECONNABORTED
            | Errno::ETIMEDOUT
            | Errno::ENODEV
            | Errno::ENETDOWN
    )
}

fn gfid_hash(g: &Gfid) -> u64 {
    let (a, b) = g.0.split_at(8);
    let a = u64::from_le_bytes(a.try_into().unwrap_or([0; 8]));
    let b = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    (a ^ b.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The kinds whose staleness matters for a read of `kind`.
fn bad_for(stale: &[Mask; 3], kind: Kind) -> Mask {
    match kind {
        Kind::Metadata => stale[Kind::Metadata as usize],
        k => stale[k as usize] | stale[Kind::Metadata as usize],
    }
}

/// The children answered a lookup with different gfids.
struct GfidsDiffer;

impl Inner {
    /// Lookup on every child up; see the module docs.
    ///
    /// Children that disagree on the gfid of a name are most often another
    /// client's entry transaction caught between its children (a rename
    /// replacing the name, done on one child and not yet on the next): the
    /// lookup then waits for that transaction's lock on the name (an
    /// entrylk, which conflicts with a directory delegation too) and looks
    /// again, as GlusterFS's lookup does before it calls a gfid split-brain.
    /// Only a disagreement that outlives the lock is EIO.
    pub async fn lookup(self: &Arc<Self>, ctx: &CallCtx, loc: Loc, xdata: Dict) -> FopResult {
        let answer = match self.lookup_once(ctx, &loc, &xdata).await {
            Err(GfidsDiffer) if loc.is_entry() => {
                let lctx = ctx.with_lk_owner(self.new_owner());
                let name = Target::Entry { dir: loc.parent, name: loc.name.clone() };
                let held = self.lock(lctx, vec![name], self.up_mask(), false).await;
                let second = self.lookup_once(ctx, &loc, &xdata).await;
                if let Ok(h) = &held {
                    self.unlock(h).await;
                }
                second
            }
            first => first,
        };
        answer.unwrap_or_else(|GfidsDiffer| {
            tracing::warn!(volume = %self.name, "lookup: children disagree on the gfid of an entry (gfid split-brain)");
            Err(Errno::EIO)
        })
    }

    /// One lookup round on every child up.
    async fn lookup_once(self: &Arc<Self>, ctx: &CallCtx, loc: &Loc, xdata: &Dict) -> Result<FopResult, GfidsDiffer> {
        let up = self.up_mask();
        if up == 0 {
            return Ok(Err(Errno::ENOTCONN));
        }
        // The directory is delegated to this client and has no such name.
        if loc.is_entry() && loc.gfid.is_null() && self.known_absent(loc.parent, &loc.name) {
            return Ok(Err(Errno::ENOENT));
        }
        let cfg = self.cfg();
        let mut x = xdata.clone();
        pending::request_keys(&self.keys, &mut x);
        let want_fds = cfg.policy.interest().open_fd_count;
        if want_fds && !x.contains(OPEN_FD_COUNT) {
            x.set_u64(OPEN_FD_COUNT, 0);
        }
        // While the volume may need heal, each lookup asks the bricks how
        // many inodes their heal index holds, to learn when it is clean.
        let epoch = self.need_heal().then(|| self.down_epoch.load(Ordering::Acquire));
        if epoch.is_some() && !x.contains(INDEX_COUNT) {
            x.set_str(INDEX_COUNT, "");
        }
        let root = loc.gfid == Gfid::ROOT && !loc.is_entry();
        if root && cfg.choose_local {
            x.set_u64(IS_LOCAL, 0);
        }
        let parent_bad = if loc.is_entry() {
            self.inodes.get(&loc.parent).map_or(0, |st| st.s.lock().stale[Kind::Entry as usize])
        } else {
            0
        };
        let (parent, parent_missing_heal) = (loc.parent, loc.is_entry());
        let results = self.fan(ctx, up, &Request::with_xdata(Fop::Lookup { loc: loc.clone() }, x)).await;
        let n = self.children.len();
        if let Some(e) = epoch
            && up == all(n)
            && results.iter().all(|(_, r)| matches!(r, Ok(rsp) if rsp.xdata.get_str(INDEX_COUNT) == Some("0")))
        {
            self.clean_epoch.fetch_max(e, Ordering::AcqRel);
        }
        let mut rows: Vec<Option<Vec<[i32; 3]>>> = vec![None; n];
        let mut ok: Vec<(usize, Response)> = Vec::new();
        let mut missing: Mask = 0;
        let mut err: Option<Errno> = None;
        for (i, r) in results {
            match r {
                Ok(rsp) => ok.push((i, rsp)),
                Err(e) => {
                    if matches!(e, Errno::ENOENT | Errno::ESTALE) {
                        missing |= bit(i);
                    }
                    if err.is_none_or(|p| p == Errno::ENOTCONN) {
                        err = Some(e);
                    }
                }
            }
        }
        // A child the parent's entry counters blame does not get a say when
        // a good child answered.
        let good_said = ok.iter().any(|(i, _)| parent_bad & bit(*i) == 0) || missing & !parent_bad != 0;
        if parent_bad != 0 && good_said {
            ok.retain(|(i, _)| parent_bad & bit(*i) == 0);
            missing &= !parent_bad;
            if ok.is_empty() {
                return Ok(Err(Errno::ENOENT));
            }
        }
        let Some(gfid) = ok.iter().map(|(_, r)| entry_gfid(r)).next() else {
            return Ok(Err(err.unwrap_or(Errno::ENOTCONN)));
        };
        if ok.iter().any(|(_, r)| entry_gfid(r) != gfid) {
            return Err(GfidsDiffer);
        }
        let mut fds = 0u32;
        for (i, r) in &ok {
            rows[*i] = Some(pending::row(&self.keys, &r.xdata));
            fds = fds.max(u32::try_from(r.xdata.get_u64(OPEN_FD_COUNT).unwrap_or(0)).unwrap_or(u32::MAX));
            if root && is_local(r.xdata.get(IS_LOCAL)) {
                self.local.fetch_or(bit(*i), Ordering::Relaxed);
            }
        }
        let mut stale = [0 as Mask; 3];
        let mut split = 0u8;
        for k in Kind::ALL {
            stale[k as usize] = (pending::stale(&rows, k) | missing) & all(n);
            if k != Kind::Entry && matches!(pending::verdict(&rows, k), pending::Verdict::SplitBrain { .. }) {
                split |= 1 << (k as u8);
            }
        }
        if split != 0 {
            tracing::warn!(volume = %self.name, %gfid, data = split & 1 != 0, metadata = split & 2 != 0, "lookup: split-brain");
        }
        let answered = ok.iter().fold(0, |m, (i, _)| m | bit(*i));
        let is_dir = ok.first().is_some_and(|(_, r)| matches!(&r.reply, Reply::Entry { iatt, .. } if iatt.is_dir()));
        if !gfid.is_null()
            && let Some(st) = self.inodes.get_or_insert(gfid)
        {
            {
                let mut s = st.s.lock();
                let window = s.window_failed();
                for k in Kind::ALL {
                    s.stale[k as usize] = stale[k as usize] | if k == Kind::Data { window } else { 0 };
                }
                s.split = split;
                s.seen_gen = self.generation.load(Ordering::Acquire);
            }
            // Copies that answered and are stale (or a split-brain a policy may
            // resolve): heal in the background; a copy missing the entry is
            // healed through its parent's entry heal.
            let stale_up = (stale[0] | stale[1] | stale[2]) & answered;
            if stale_up != 0 || (split != 0 && cfg.favorite.is_some()) {
                self.background_heal(ctx.client_id.clone(), gfid);
            }
            if missing != 0 && parent_missing_heal {
                self.background_heal(ctx.client_id.clone(), parent);
            }
            if want_fds && fds > 0 {
                self.brick_fds(&st, fds);
            }
        }
        let bad = if is_dir { bad_for(&stale, Kind::Entry) } else { bad_for(&stale, Kind::Data) };
        let good: Mask = ok.iter().filter(|(i, _)| bad & bit(*i) == 0).fold(0, |m, (i, _)| m | bit(*i));
        let pick =
            self.read_order(ctx, gfid, if good != 0 { good } else { ok.iter().fold(0, |m, (i, _)| m | bit(*i)) });
        let chosen = pick.first().copied();
        let (from, mut rsp) = match ok.iter().position(|(i, _)| Some(*i) == chosen) {
            Some(p) => ok.swap_remove(p),
            None => ok.swap_remove(0),
        };
        // Small-file content (quick-read) goes up only from a copy a read
        // would be served from: not blamed for data (nor in a window that
        // failed on it), and no data split-brain.
        if rsp.xdata.contains(CONTENT) {
            let blamed = (bad | self.known_bad(gfid, Kind::Data)) & bit(from) != 0;
            if is_dir || blamed || split & 1 != 0 {
                rsp.xdata.remove(CONTENT);
            }
        }
        for k in self.keys.iter().map(String::as_str).chain([pending::DIRTY, OPEN_FD_COUNT, IS_LOCAL, INDEX_COUNT]) {
            if !xdata.contains(k) {
                rsp.xdata.remove(k);
            }
        }
        Ok(Ok(rsp))
    }

    /// Children the last lookup of `gfid` found stale for a read of `kind`.
    fn known_bad(&self, gfid: Gfid, kind: Kind) -> Mask {
        self.inodes.get(&gfid).map_or(0, |st| bad_for(&st.s.lock().stale, kind))
    }

    /// Children stale for a read of `kind` on `gfid`, looked up again if
    /// a child came up since AFR last looked; and whether the answer comes
    /// from a lookup made now.
    async fn stale_for(self: &Arc<Self>, ctx: &CallCtx, gfid: Gfid, kind: Kind) -> (Mask, bool) {
        let current = self.generation.load(Ordering::Acquire);
        let known = self.inodes.get(&gfid).and_then(|st| {
            let s = st.s.lock();
            (s.seen_gen == current).then(|| bad_for(&s.stale, kind))
        });
        if let Some(bad) = known {
            return (bad, false);
        }
        // A failed lookup tells nothing new: what was known still holds
        // (a copy known to have missed a write is not read).
        let fresh = self.lookup(ctx, Loc::gfid(gfid), Dict::new()).await.is_ok();
        (self.known_bad(gfid, kind), fresh)
    }

    /// A read fop on one child, failing over to the next; returns the child
    /// that answered.
    pub async fn read_on(self: &Arc<Self>, ctx: &CallCtx, req: Request, kind: Kind) -> (Option<usize>, FopResult) {
        let up = self.up_mask();
        if up == 0 {
            return (None, Err(Errno::ENOTCONN));
        }
        let cfg = self.cfg();
        if cfg.quorum_reads && !cfg.quorum.met(up, self.children.len()) {
            return (None, Err(QUORUM_ERRNO));
        }
        // A directory fd is open where its listing was read (`open_dir`):
        // it is opened on another child only if the read goes there.
        let dir_fd = req.fop.fd().filter(|fd| self.fds.get(fd.id).is_some_and(|f| f.dir)).copied();
        let mut cands = match req.fop.fd() {
            Some(fd) if dir_fd.is_none() => self.fd_targets(ctx, fd, up).await,
            _ => up,
        };
        let gfid = req.fop.gfid();
        if !gfid.is_null() && !matches!(req.fop, Fop::Statfs { .. }) {
            let refused = |bad: Mask| {
                (cands & !bad == 0 && cands != 0)
                    || (split_brain_refuses(&req.fop, kind) && self.in_split_brain(gfid, kind))
            };
            let (mut bad, fresh) = self.stale_for(ctx, gfid, kind).await;
            if refused(bad) {
                // What this client knows may be old: another client or the
                // heal daemon may have healed or resolved the inode since.
                // Look again before refusing (AFR's inode refresh).
                if !fresh && self.lookup(ctx, Loc::gfid(gfid), Dict::new()).await.is_ok() {
                    bad = self.known_bad(gfid, kind);
                }
                if cands & !bad == 0 && cands != 0 {
                    tracing::warn!(volume = %self.name, %gfid, "read: every reachable copy is stale");
                    return (None, Err(Errno::EIO));
                }
                if refused(bad) {
                    tracing::warn!(volume = %self.name, %gfid, kind = ?kind, "read refused: split-brain");
                    return (None, Err(Errno::EIO));
                }
            }
            cands &= !bad;
        }
        let mut last = Errno::ENOTCONN;
        for (n, i) in self.read_order(ctx, gfid, cands).into_iter().enumerate() {
            if n > 0 {
                self.stats.failovers.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(fd) = &dir_fd
                && self.fd_targets(ctx, fd, bit(i)).await == 0
            {
                continue;
            }
            let rs = &self.reads[i];
            let _out = Outstanding::new(&rs.outstanding);
            let t0 = Instant::now();
            let r = self.children[i].call(ctx.clone(), req.clone()).await;
            rs.sample(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX));
            match r {
                Ok(rsp) => return (Some(i), Ok(rsp)),
                Err(e) if retryable(e) => {
                    tracing::debug!(volume = %self.name, child = %self.children[i].name, %e, "read failed; trying another child");
                    last = e;
                }
                Err(e) => return (Some(i), Err(e)),
            }
        }
        (None, Err(last))
    }

    /// A read fop (see [`Inner::read_on`]).
    pub async fn read(self: &Arc<Self>, ctx: &CallCtx, req: Request, kind: Kind) -> FopResult {
        self.read_on(ctx, req, kind).await.1
    }

    /// Readdir(p): a listing starts on the read child and stays on it, as
    /// offsets mean something only to the child that gave them.
    pub async fn readdir(self: &Arc<Self>, ctx: &CallCtx, req: Request) -> FopResult {
        let (Some(fd), offset) = (
            req.fop.fd().copied(),
            match req.fop {
                Fop::Readdir { offset, .. } | Fop::Readdirp { offset, .. } => offset,
                _ => 0,
            },
        ) else {
            return Err(Errno::EINVAL);
        };
        let (plus, content) = (matches!(req.fop, Fop::Readdirp { .. }), req.xdata.contains(READDIRP_CONTENT));
        let (from, mut r) = self.readdir_on(ctx, req, fd, offset).await;
        if let (Ok(rsp), Some(from)) = (&mut r, from.filter(|_| plus)) {
            self.vet_dirent_attrs(ctx, from, rsp).await;
        }
        if let (Ok(rsp), true) = (&mut r, content) {
            self.vet_dirent_content(ctx, rsp).await;
        }
        r
    }

    /// True while a copy may have missed changes: a child went down since
    /// every child's heal index was last found empty (GlusterFS's
    /// `need_heal`, which it learns from the bricks' index counts too).
    pub fn need_heal(&self) -> bool {
        self.clean_epoch.load(Ordering::Acquire) < self.down_epoch.load(Ordering::Acquire)
    }

    /// Readdirp entries carry their attributes from the one child `from`
    /// that lists the directory, and the kernel and md-cache keep them.
    /// That child's copy of an inode may be stale: it missed writes while
    /// it was away, or a heal is rebuilding it (seen as a file read back
    /// short after a partition healed). So an entry whose copy there is
    /// known stale, or, while the volume may need heal, whose inode this
    /// client has not looked up since a child came up, is looked up (which
    /// answers from a good copy and starts its heal); if that shows the
    /// listing's copy stale, the entry takes the lookup's attributes and
    /// its content for quick-read goes. GlusterFS
    /// drops such entries' attributes instead (`afr_readdir_transform_entries`),
    /// which costs the kernel a lookup of each later.
    async fn vet_dirent_attrs(self: &Arc<Self>, ctx: &CallCtx, from: usize, rsp: &mut Response) {
        let Response { reply: Reply::Dirents(entries), xdata } = rsp else { return };
        let (need_heal, current) = (self.need_heal(), self.generation.load(Ordering::Acquire));
        let suspect: Vec<usize> = (0..entries.len())
            .filter(|&k| {
                let e = &entries[k];
                if e.name == "." || e.name == ".." || e.iatt.gfid.is_null() {
                    return false;
                }
                let kind = if e.iatt.is_dir() { Kind::Entry } else { Kind::Data };
                match self.inodes.get(&e.iatt.gfid) {
                    Some(st) => {
                        let s = st.s.lock();
                        if s.seen_gen == current { bad_for(&s.stale, kind) & bit(from) != 0 } else { need_heal }
                    }
                    None => need_heal,
                }
            })
            .collect();
        for batch in suspect.chunks(VET_BATCH) {
            let looks = batch.iter().map(|&k| {
                let g = entries[k].iatt.gfid;
                async move { (k, self.lookup(ctx, Loc::gfid(g), Dict::new()).await) }
            });
            for (k, r) in super::join_all(looks.collect()).await {
                let e = &mut entries[k];
                let kind = if e.iatt.is_dir() { Kind::Entry } else { Kind::Data };
                let stale = r.is_err() || self.known_bad(e.iatt.gfid, kind) & bit(from) != 0;
                if !stale {
                    continue; // the listing's copy is a good one after all
                }
                xdata.remove(&keys::dirent_xattr(&e.name, CONTENT));
                if let Ok(Response { reply: Reply::Entry { iatt, .. }, .. }) = r
                    && iatt.gfid == e.iatt.gfid
                {
                    e.iatt = iatt;
                }
            }
        }
    }

    /// Content that came with a readdirp's entries ([`READDIRP_CONTENT`])
    /// is from one copy. It is passed on only when every child is up and
    /// no child's index lists the inode: then no copy accuses another, so
    /// every copy holds the same bytes (a transaction in flight raises
    /// counters in its pre-op, and lists the inode, before it writes).
    /// Otherwise it is removed and a read fetches the content as usual.
    async fn vet_dirent_content(&self, ctx: &CallCtx, rsp: &mut Response) {
        let Reply::Dirents(entries) = &rsp.reply else { return };
        let with: Vec<(String, Gfid)> = entries
            .iter()
            .filter(|e| rsp.xdata.contains(&keys::dirent_xattr(&e.name, CONTENT)))
            .map(|e| (keys::dirent_xattr(&e.name, CONTENT), e.iatt.gfid))
            .collect();
        if with.is_empty() {
            return;
        }
        let n = self.children.len();
        let mut listed: Option<HashSet<Gfid>> = (self.up_mask() == all(n)).then(HashSet::new);
        for i in 0..n {
            let Some(set) = listed.as_mut() else { break };
            match self.index_page(ctx, i, None).await {
                // The whole index fit in one page: it is all we need.
                Some((page, count)) if page.len() as u64 >= count => set.extend(page),
                _ => listed = None,
            }
        }
        for (key, gfid) in with {
            if listed.as_ref().is_none_or(|set| gfid.is_null() || set.contains(&gfid)) {
                rsp.xdata.remove(&key);
            }
        }
    }

    /// A listing's page, and the child that gave it.
    async fn readdir_on(
        self: &Arc<Self>,
        ctx: &CallCtx,
        req: Request,
        fd: Fd,
        offset: u64,
    ) -> (Option<usize>, FopResult) {
        let sticky = self.fds.get(fd.id).and_then(|f| f.readdir_child);
        match sticky {
            Some(i) if offset != 0 => {
                if self.up_mask() & bit(i) == 0 {
                    return (None, Err(Errno::ENOTCONN));
                }
                (Some(i), self.children[i].call(ctx.clone(), req).await)
            }
            _ => {
                let (child, r) = self.read_on(ctx, req, Kind::Entry).await;
                if let Some(i) = child {
                    self.fds.update(fd.id, |f| f.readdir_child = Some(i));
                }
                (child, r)
            }
        }
    }

    /// Opens a directory on the child its listing will be read from (the
    /// first a read of its entries would pick), and on the others only if
    /// that one refuses: a listing reads one child, so opening it on all
    /// of them (GlusterFS's way) cost two OPENDIRs and two RELEASEDIRs per
    /// listing for nothing. A fop that needs the fd elsewhere (fsyncdir,
    /// a read failing over) opens it there ([`Inner::fd_targets`]).
    pub async fn open_dir(self: &Arc<Self>, ctx: &CallCtx, gfid: Gfid, up: Mask, req: &Request) -> Outcome {
        let good = up & !self.known_bad(gfid, Kind::Entry);
        let Some(first) = self.read_order(ctx, gfid, if good != 0 { good } else { up }).first().copied() else {
            return evaluate(self.fan(ctx, up, req).await);
        };
        let out = evaluate(self.fan(ctx, bit(first), req).await);
        let rest = up & !bit(first);
        if out.ok != 0 || rest == 0 {
            return out;
        }
        evaluate(self.fan(ctx, rest, req).await)
    }

    /// The children of `cands` in the order to read from them.
    pub fn read_order(&self, ctx: &CallCtx, gfid: Gfid, cands: Mask) -> Vec<usize> {
        let list: Vec<usize> = members(cands).collect();
        if list.is_empty() {
            return list;
        }
        let first = self.pick(ctx, gfid, &list);
        let pos = list.iter().position(|&i| i == first).unwrap_or(0);
        list[pos..].iter().chain(&list[..pos]).copied().collect()
    }

    fn pick(&self, ctx: &CallCtx, gfid: Gfid, list: &[usize]) -> usize {
        let cfg = self.cfg();
        if let Some(r) = cfg.read_child.filter(|r| list.contains(r)) {
            return r;
        }
        let local = self.local.load(Ordering::Relaxed);
        let locals: Vec<usize> = list.iter().copied().filter(|&i| local & bit(i) != 0).collect();
        let list: &[usize] = if cfg.choose_local && !locals.is_empty() { &locals } else { list };
        let by = |f: &dyn Fn(usize) -> u64| list.iter().copied().min_by_key(|&i| f(i)).unwrap_or(list[0]);
        let lat = |i: usize| self.reads[i].latency_us.load(Ordering::Relaxed);
        let out = |i: usize| u64::from(self.reads[i].outstanding.load(Ordering::Relaxed));
        let len = list.len() as u64;
        match cfg.hash_mode {
            0 => list[0],
            1 => list[(gfid_hash(&gfid) % len) as usize],
            2 => list[((gfid_hash(&gfid) ^ u64::from(ctx.pid).wrapping_mul(0x2545_f491_4f6c_dd1d)) % len) as usize],
            3 => by(&out),
            4 => by(&lat),
            _ => by(&|i| lat(i).saturating_mul(out(i) + 1)),
        }
    }
}

/// Reads a split-brain of `kind` makes fail with EIO: data reads
/// (read, seek, rchecksum) for data, and getxattr, access and readlink
/// for metadata. Stat and lookup still answer.
fn split_brain_refuses(fop: &Fop, kind: Kind) -> bool {
    match kind {
        Kind::Data => matches!(fop, Fop::Readv { .. } | Fop::Seek { .. } | Fop::Rchecksum { .. }),
        Kind::Metadata => {
            matches!(fop, Fop::Getxattr { .. } | Fop::Fgetxattr { .. } | Fop::Access { .. } | Fop::Readlink { .. })
        }
        Kind::Entry => false,
    }
}

fn entry_gfid(r: &Response) -> Gfid {
    match &r.reply {
        Reply::Entry { iatt, .. } => iatt.gfid,
        _ => Gfid::NULL,
    }
}

fn is_local(v: Option<&Value>) -> bool {
    match v {
        Some(Value::U64(n)) => *n != 0,
        Some(Value::I64(n)) => *n != 0,
        Some(Value::Str(s)) => matches!(s.as_str(), "yes" | "true" | "1" | "on"),
        Some(Value::Bytes(b)) => matches!(b.as_ref(), b"yes" | b"true" | b"1" | b"on"),
        _ => false,
    }
}
