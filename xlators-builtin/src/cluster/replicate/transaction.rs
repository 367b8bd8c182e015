//! Transactions (GlusterFS's `afr-transaction.c`): lock, pre-op, the fop on
//! every participating child, post-op, unlock.
//!
//! - Metadata transactions (setattr, xattrs) take an inodelk on the
//!   metadata range; data transactions without eager lock take one on the
//!   whole file (with eager lock they go through `eager_lock`).
//! - Entry transactions (create, mknod, mkdir, symlink, link, unlink,
//!   rmdir, rename) take entrylks on the parent directory and name (both
//!   for rename, and the directory itself for rmdir), keep their counters
//!   on the parent directories, and give new inodes the same gfid on every
//!   child (`gfid-req`, generated when the caller sent none).
//!
//! The pending-counter arithmetic is described in `pending`. A fop that
//! fails on every child changes nothing and blames no one; one that fails
//! on some children blames them. With quorum on, the locked children and
//! the successful ones must each make a quorum, else the fop fails with
//! ENOTCONN; a quorum lost before the fop leaves nothing applied.

use std::sync::Arc;

use xlfs_sdk::dict::keys::{GFID_REQ, INODELK_COUNT, OPEN_FD_COUNT};
use xlfs_sdk::{CallCtx, Dict, Errno, Fd, Fop, FopResult, Gfid, Loc, Reply, Request, Response, Value, XattropOp};

use super::Inner;
use super::lock::Target;
use super::pending::{self, Kind, Mask, all, bit, members};
use super::quorum::QUORUM_ERRNO;

/// One pre-op .. post-op span: where the counters live, who took part, who
/// failed.
#[derive(Clone, Debug)]
pub struct Changelog {
    /// Which counter.
    pub kind: Kind,
    /// The inodes holding the counters (the inode itself, or the parent
    /// directories of an entry fop).
    pub inodes: Vec<Gfid>,
    /// Do the xattrops through this fd (data windows) when set.
    pub fd: Option<Fd>,
    /// Children taking part (pre-op done, or locked when optimistic).
    pub members: Mask,
    /// True when the pre-op raised the counters.
    pub preop: bool,
    /// Members that failed a fop in the span.
    pub failed: Mask,
}

/// Most deferred blames kept; beyond, the oldest is dropped (logged).
const MAX_DEFERRED: usize = 4096;

/// A blame that could not be written on any copy holding the change: an
/// entry fop sent without a pre-op (optimistic changelog) that reached
/// some copies only, the client cut off from all of them before its
/// post-op; or one that may have reached any copy (`on` and `blamed` both
/// every child, see `mark_uncertain`). Nothing on the bricks records it,
/// so heal would never find the copies differing; it is written when a
/// child comes back.
#[derive(Clone, Debug)]
pub struct Deferred {
    ctx: CallCtx,
    kind: Kind,
    inodes: Vec<Gfid>,
    /// The copies that have the change.
    on: Mask,
    /// The copies that missed it.
    blamed: Mask,
}

/// How the children answered a fop.
pub struct Outcome {
    /// Children where it succeeded.
    pub ok: Mask,
    /// Children to blame (failed where others succeeded).
    pub failed: Mask,
    /// The answer for the caller.
    pub result: FopResult,
    /// The highest inodelk count in the replies.
    pub inodelk_count: u32,
    /// The error of the children that failed (ENOTCONN only if no other).
    pub error: Option<Errno>,
    /// Children that answered ENOTCONN: the connection went while the fop
    /// was out (or before), so it may or may not have run there.
    pub unknown: Mask,
}

/// Sums up the children's answers to a fop sent to `targets`.
pub fn evaluate(results: Vec<(usize, FopResult)>) -> Outcome {
    let mut ok: Mask = 0;
    let mut tried: Mask = 0;
    let mut best: Option<Response> = None;
    let mut err: Option<Errno> = None;
    let mut inodelk_count = 0;
    let mut unknown: Mask = 0;
    for (i, r) in results {
        tried |= bit(i);
        match r {
            Ok(mut rsp) => {
                ok |= bit(i);
                super::lock::note_count(&mut inodelk_count, &rsp.xdata);
                rsp.xdata.remove(INODELK_COUNT);
                best.get_or_insert(rsp);
            }
            Err(e) => {
                if e == Errno::ENOTCONN {
                    unknown |= bit(i);
                }
                if err.is_none_or(|p| p == Errno::ENOTCONN) {
                    err = Some(e);
                }
            }
        }
    }
    // Nothing applied anywhere: no copy is behind another.
    let failed = if ok == 0 { 0 } else { tried & !ok };
    let result = match best {
        Some(r) => Ok(r),
        None => Err(err.unwrap_or(Errno::ENOTCONN)),
    };
    Outcome { ok, failed, result, inodelk_count, error: err, unknown }
}

impl Inner {
    /// A fresh lock owner for AFR's own locks.
    pub fn new_owner(&self) -> u64 {
        self.owner_base ^ self.next_owner.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends `req` to every child in `targets` at once.
    pub async fn fan(&self, ctx: &CallCtx, targets: Mask, req: &Request) -> Vec<(usize, FopResult)> {
        let futs = members(targets).map(|i| {
            let (c, r) = (ctx.clone(), req.clone());
            async move { (i, self.wind(i, c, r).await) }
        });
        super::join_all(futs.collect()).await
    }

    /// Adds `dict` to the counters of every inode of `cl` on `on`; returns
    /// the children where every xattrop succeeded and the highest open fd
    /// count reported.
    async fn xattrop(&self, ctx: &CallCtx, cl: &Changelog, on: Mask, dict: &Dict, want_fds: bool) -> (Mask, u32) {
        let mut good = on;
        let mut fds = 0u32;
        for g in &cl.inodes {
            let mut xdata = Dict::new();
            if want_fds {
                xdata.set_u64(OPEN_FD_COUNT, 0);
            }
            let fop = match cl.fd {
                Some(fd) if fd.gfid == *g => Fop::Fxattrop { fd, op: XattropOp::AddArray, xattrs: dict.clone() },
                _ => Fop::Xattrop { loc: Loc::gfid(*g), op: XattropOp::AddArray, xattrs: dict.clone() },
            };
            for (i, r) in self.fan(ctx, good, &Request::with_xdata(fop, xdata)).await {
                match r {
                    Ok(rsp) => {
                        let n = rsp.xdata.get_u64(OPEN_FD_COUNT).unwrap_or(0);
                        fds = fds.max(u32::try_from(n).unwrap_or(u32::MAX));
                    }
                    Err(e) => {
                        tracing::debug!(volume = %self.name, child = %self.children[i].name, gfid = %g, %e, "changelog xattrop failed");
                        good &= !bit(i);
                    }
                }
            }
        }
        (good, fds)
    }

    /// Pre-op: raises the dirty counter (every child's at once) on every
    /// member; members where that fails are dropped. Returns the highest
    /// open fd count reported.
    pub async fn pre_op(&self, ctx: &CallCtx, cl: &mut Changelog, want_fds: bool) -> u32 {
        cl.preop = true;
        let Some(d) = pending::changelog(&self.keys, cl.kind, 1, |_| 0) else { return 0 };
        let (good, fds) = self.xattrop(ctx, cl, cl.members, &d, want_fds).await;
        cl.members = good;
        fds
    }

    /// Post-op: leaves exactly the failed children and the non-members
    /// blamed (or, with `undo`, takes the pre-op back entirely). Returns
    /// the members it was written on.
    pub async fn post_op(&self, ctx: &CallCtx, cl: &Changelog, undo: bool) -> Mask {
        let blamed = !cl.members | cl.failed;
        let delta = |j: usize| i32::from(!undo && blamed & bit(j) != 0);
        match pending::changelog(&self.keys, cl.kind, -i32::from(cl.preop), delta) {
            Some(d) => self.xattrop(ctx, cl, cl.members, &d, false).await.0,
            None => cl.members,
        }
    }

    /// Keeps a blame to write when a child comes back (see [`Deferred`]).
    fn defer(&self, d: Deferred) {
        tracing::warn!(volume = %self.name, inodes = ?d.inodes, on = d.on, blamed = d.blamed,
            "no copy could record a change that reached some copies only: recording it when a child returns");
        let mut list = self.deferred.lock();
        if list.len() >= MAX_DEFERRED {
            let old = list.remove(0);
            tracing::error!(volume = %self.name, inodes = ?old.inodes, "too many unrecorded changes: one is dropped (a full heal finds it)");
        }
        list.push(d);
    }

    /// Writes the deferred blames on the copies up now; keeps those that
    /// still reach none.
    pub async fn write_deferred(&self) {
        let list = std::mem::take(&mut *self.deferred.lock());
        for d in list {
            let on = d.on & self.up_mask();
            let cl = Changelog {
                kind: d.kind,
                inodes: d.inodes.clone(),
                fd: None,
                members: on,
                preop: false,
                failed: d.blamed,
            };
            let written = match pending::changelog(&self.keys, d.kind, 0, |j| i32::from(d.blamed & bit(j) != 0)) {
                Some(dict) if on != 0 => self.xattrop(&d.ctx, &cl, on, &dict, false).await.0,
                _ => 0,
            };
            if written == 0 {
                self.deferred.lock().push(d);
            } else {
                tracing::info!(volume = %self.name, inodes = ?d.inodes, on = written, blamed = d.blamed, "recorded a change that reached some copies only");
            }
        }
    }

    /// Blames `blamed` for `kind` changes of `gfid` on the children `on`,
    /// outside any transaction (an fsync that failed on some children).
    /// If no copy holding the change (`on` but not `blamed`) could be
    /// told, the blame is kept for later ([`Deferred`]).
    pub async fn blame(&self, ctx: &CallCtx, gfid: Gfid, kind: Kind, on: Mask, blamed: Mask) {
        let cl = Changelog { kind, inodes: vec![gfid], fd: None, members: on, preop: false, failed: blamed };
        if let Some(d) = pending::changelog(&self.keys, kind, 0, |j| i32::from(blamed & bit(j) != 0)) {
            let (written, _) = self.xattrop(ctx, &cl, on, &d, false).await;
            // Data changes raised their counters in a pre-op already, which
            // stay raised (and tell heal) when this does not land.
            let holders = on & !blamed;
            if kind != Kind::Data && holders != 0 && written & holders == 0 {
                self.defer(Deferred { ctx: ctx.clone(), kind, inodes: vec![gfid], on: holders, blamed });
            }
        }
        self.mark_stale(gfid, kind, blamed);
    }

    /// Records that a `kind` change of `inodes` may have reached any copy
    /// or none (every child failed it, some by losing the connection while
    /// it was out): the dirty counter is raised on every copy, as by a
    /// pre-op never followed by its post-op, so heal finds the inodes and,
    /// no copy being known better, compares them all (for a directory:
    /// every copy gets the names any copy has). Written on the children up
    /// now; when none is, when one comes back ([`Deferred`]).
    pub async fn mark_uncertain(&self, ctx: &CallCtx, kind: Kind, inodes: Vec<Gfid>) {
        let n = self.children.len();
        let Some(d) = pending::changelog(&self.keys, kind, 1, |_| 0) else { return };
        let up = self.up_mask();
        let cl = Changelog { kind, inodes: inodes.clone(), fd: None, members: up, preop: false, failed: 0 };
        let written = if up == 0 { 0 } else { self.xattrop(ctx, &cl, up, &d, false).await.0 };
        tracing::info!(volume = %self.name, ?inodes, kind = ?kind, written,
            "a change failed on every child, some of which lost the connection while it was out: marked for heal");
        if written == 0 {
            self.defer(Deferred { ctx: ctx.clone(), kind, inodes, on: all(n), blamed: all(n) });
        }
    }

    /// Checks quorum on `m`.
    fn has_quorum(&self, m: Mask) -> bool {
        self.cfg().quorum.met(m, self.children.len())
    }

    /// Fails an outcome whose successes do not make a quorum, with the
    /// error the other children gave (ENOSPC from full bricks reaches the
    /// writer as ENOSPC), else the quorum errno (as GlusterFS's
    /// `afr_handle_quorum`).
    pub fn check_fop_quorum(&self, out: &mut Outcome) {
        if out.ok != 0 && self.cfg().quorum.enabled() && !self.has_quorum(out.ok) {
            let e = out.error.filter(|e| *e != Errno::ENOTCONN).unwrap_or(QUORUM_ERRNO);
            tracing::warn!(volume = %self.name, ok = out.ok, error = %e, "failing fop: it succeeded on too few children for quorum");
            out.result = Err(e);
        }
    }

    /// Refuses a modifying fop when the children up do not make a quorum.
    pub fn require_quorum(&self) -> Result<Mask, Errno> {
        let up = self.up_mask();
        if up == 0 {
            return Err(Errno::ENOTCONN);
        }
        if !self.has_quorum(up) {
            return Err(QUORUM_ERRNO);
        }
        Ok(up)
    }

    /// A transaction without eager lock: lock, pre-op, fop, post-op,
    /// unlock. `locks` and the counters' inodes describe what it changes;
    /// the fop goes to the locked children (where `fd` is open, if given).
    pub async fn txn(
        self: &Arc<Self>,
        ctx: &CallCtx,
        kind: Kind,
        locks: Vec<Target>,
        inodes: Vec<Gfid>,
        fd: Option<Fd>,
        req: Request,
    ) -> (Outcome, Mask) {
        let fail = |e| (Outcome { ok: 0, failed: 0, result: Err(e), inodelk_count: 0, error: Some(e), unknown: 0 }, 0);
        let up = match self.require_quorum() {
            Ok(up) => up,
            Err(e) => return fail(e),
        };
        let lctx = if req.xdata.get(xlfs_sdk::dict::keys::AFR_CALLER_LOCKED).is_some() {
            ctx.clone()
        } else {
            ctx.with_lk_owner(self.new_owner())
        };
        let held = match self.lock(lctx, locks, up, false).await {
            Ok(h) => h,
            Err(e) => return fail(e),
        };
        if !self.has_quorum(held.locked) {
            self.unlock(&held).await;
            return fail(QUORUM_ERRNO);
        }
        let n = self.children.len();
        let optimistic = kind != Kind::Data && self.cfg().optimistic && held.locked == all(n);
        let mut cl = Changelog { kind, inodes, fd: None, members: held.locked, preop: false, failed: 0 };
        if !optimistic {
            self.pre_op(&held.ctx, &mut cl, false).await;
            if cl.members == 0 || !self.has_quorum(cl.members) {
                self.post_op(&held.ctx, &cl, true).await;
                self.unlock(&held).await;
                return fail(QUORUM_ERRNO);
            }
        }
        let targets = match fd {
            Some(fd) => self.fd_targets(ctx, &fd, cl.members).await,
            None => cl.members,
        };
        let mut out = evaluate(self.fan(ctx, targets, &req).await);
        if out.ok != 0 {
            out.failed |= cl.members & !targets;
        }
        self.check_fop_quorum(&mut out);
        cl.failed = out.failed;
        if out.ok == 0 && out.unknown != 0 {
            // It failed everywhere, but some connections went while it was
            // out: it may have run there. The pre-op stays raised on every
            // copy (no copy known better: heal compares them all), or,
            // without one, the same is written now.
            if !cl.preop {
                self.mark_uncertain(&held.ctx, kind, cl.inodes.clone()).await;
            }
        } else {
            // A fop that failed everywhere changed nothing: take the pre-op back.
            let recorded = self.post_op(&held.ctx, &cl, out.ok == 0).await;
            if optimistic && out.ok != 0 && cl.failed != 0 && recorded & out.ok == 0 {
                let d =
                    Deferred { ctx: held.ctx.clone(), kind, inodes: cl.inodes.clone(), on: out.ok, blamed: cl.failed };
                self.defer(d);
            }
        }
        self.unlock(&held).await;
        let blamed = if out.ok == 0 { 0 } else { !cl.members | cl.failed };
        (out, blamed & all(n))
    }

    /// A metadata or (without eager lock) data transaction on one inode.
    pub async fn inode_txn(
        self: &Arc<Self>,
        ctx: &CallCtx,
        kind: Kind,
        gfid: Gfid,
        fd: Option<Fd>,
        req: Request,
    ) -> FopResult {
        let gfid = self.resolve_gfid(ctx, gfid, &req).await?;
        let lock = Target::Inode { gfid, fd: None, metadata: kind == Kind::Metadata };
        let (out, blamed) = self.txn(ctx, kind, vec![lock], vec![gfid], fd, req).await;
        self.mark_stale(gfid, kind, blamed);
        out.result
    }

    /// An entry transaction. `names` are the (directory, name) pairs it
    /// locks; `whole_dir` an extra directory locked as a whole (rmdir).
    pub async fn entry_txn(
        self: &Arc<Self>,
        ctx: &CallCtx,
        names: Vec<(Gfid, String)>,
        whole_dir: Option<Gfid>,
        mut req: Request,
    ) -> FopResult {
        let mut locks: Vec<Target> =
            names.iter().map(|(dir, name)| Target::Entry { dir: *dir, name: name.clone() }).collect();
        locks.sort_by(|a, b| match (a, b) {
            (Target::Entry { dir: d1, name: n1 }, Target::Entry { dir: d2, name: n2 }) => (d1, n1).cmp(&(d2, n2)),
            _ => std::cmp::Ordering::Equal,
        });
        locks.dedup();
        if let Some(d) = whole_dir.filter(|d| !d.is_null()) {
            locks.push(Target::Entry { dir: d, name: String::new() });
        }
        let mut parents: Vec<Gfid> = names.iter().map(|(d, _)| *d).collect();
        parents.dedup();
        if matches!(req.fop, Fop::Create { .. } | Fop::Mknod { .. } | Fop::Mkdir { .. } | Fop::Symlink { .. })
            && !matches!(req.xdata.get(GFID_REQ), Some(Value::Gfid(g)) if !g.is_null())
        {
            let parent = req.fop.parent();
            req.xdata.set(GFID_REQ, Value::Gfid(Gfid::random_in(parent)));
        }
        if let Some(r) = self.try_early(ctx, &req).await {
            return r;
        }
        self.after_early(&req).await?;
        let created = matches!(req.xdata.get(GFID_REQ), Some(Value::Gfid(g)) if !g.is_null());
        let mkdir_in = match &req.fop {
            Fop::Mkdir { loc, .. } => Some(loc.parent),
            _ => None,
        };
        let create_fd = match &req.fop {
            Fop::Create { fd, flags, .. } => Some((*fd, *flags)),
            _ => None,
        };
        let in_dir = || names.iter().map(|(_, n)| n.clone()).collect::<Vec<String>>();
        let delegated = match (parents.as_slice(), whole_dir) {
            ([dir], None) => self.delegated_txn(ctx, *dir, in_dir(), &req).await,
            // An rmdir of a directory whose delegation this client holds
            // (rm -r unlinked its names under it): that lock is the
            // whole-directory entrylk the rmdir needs, and the parent's
            // delegation covers the name. Without one, both delegations
            // are returned and per-name locks taken below.
            ([dir], Some(sub)) => match self.retire_dir(sub, false) {
                Some(t) => {
                    let r = self.delegated_txn(ctx, *dir, in_dir(), &req).await;
                    self.leave_retired(t);
                    r
                }
                None => None,
            },
            _ => None,
        };
        let (out, blamed) = match delegated {
            Some(r) => r,
            None => {
                // Per-name locks would wait behind this client's own
                // delegation of these directories: return it first.
                for d in parents.iter().chain(whole_dir.iter()) {
                    self.surrender_delegation(*d).await;
                }
                self.txn(ctx, Kind::Entry, locks, parents.clone(), None, req).await
            }
        };
        for p in &parents {
            self.mark_stale(*p, Kind::Entry, blamed);
        }
        if let Ok(Response { reply: Reply::Entry { iatt, .. }, .. }) = &out.result {
            if let (Some(parent), 0) = (mkdir_in, blamed) {
                self.promise_after(ctx, parent, *iatt);
            }
            if created && blamed != 0 {
                for k in Kind::ALL {
                    self.mark_stale(iatt.gfid, k, blamed);
                }
            }
            if let Some((id, flags)) = create_fd {
                let f = super::fds::FdCtx { gfid: iatt.gfid, flags, dir: false, opened: out.ok, readdir_child: None };
                if let Err(e) = self.fds.insert(id, f) {
                    tracing::warn!(volume = %self.name, "fd table full: {e}");
                }
                self.fd_opened_on(iatt.gfid);
            }
        }
        out.result
    }

    /// The gfid a path-based fop acts on, looked up when the location only
    /// names an entry.
    pub async fn resolve_gfid(self: &Arc<Self>, ctx: &CallCtx, gfid: Gfid, req: &Request) -> Result<Gfid, Errno> {
        if !gfid.is_null() {
            return Ok(gfid);
        }
        let Some(loc) = req.fop.loc().filter(|l| l.is_entry()) else { return Err(Errno::EINVAL) };
        match self.lookup(ctx, loc.clone(), Dict::new()).await?.reply {
            Reply::Entry { iatt, .. } if !iatt.gfid.is_null() => Ok(iatt.gfid),
            _ => Err(Errno::EINVAL),
        }
    }
}
