//! Per-inode state (the `state` submodule, re-exported here), and the
//! eager lock with delayed post-op for data transactions.
//!
//! The first data transaction on an inode takes the inodelk (whole file,
//! AFR's domain) on the children and does the pre-op; it then keeps both:
//! later transactions on the inode join the held lock and the raised
//! counters ("window") without any lock or xattrop fop of their own.
//! Transactions whose byte ranges overlap one still running wait for it,
//! so every child applies overlapping writes in the same order.
//!
//! The window ends (post-op, then unlock) when:
//! - no transaction arrived for `post-op-delay-secs` (0: at once),
//! - the lock-contention policy says so (see
//!   [`xlfs_sdk::policy::lock_contention`]: it is consulted on acquisition,
//!   transaction start and end, fd opens and closes, brick-reported counts
//!   and contention upcalls),
//! - a transaction failed on some child (its blame is written at once),
//! - the last fd this client had open on the inode is released.
//!
//! flush, and an fsync that failed somewhere, *settle* the window before
//! they answer: they wait for the transactions running, write the post-op
//! (so the counters on disk are clear, or blame whoever failed), and keep
//! the lock; the next write does a new pre-op under the same lock. An
//! fsync that succeeded on every child only records which writes it made
//! durable and leaves the window open: every copy then holds the same
//! durable data, and the raised counters say no more than "a transaction
//! was in flight everywhere", which heal reads as no copy being stale. This
//! halves the rounds of a write+fsync loop (a database's WAL) against
//! settling on every fsync, as GlusterFS does. With `ensure-durability`, a
//! window that saw writes not covered by such an fsync is fsynced on its
//! children before its post-op.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;
use xlfs_sdk::dict::keys::INODELK_COUNT;
use xlfs_sdk::policy::lock_contention::{Decision, LockEvent, LockView};
use xlfs_sdk::{CallCtx, Errno, Fd, Fop, FopResult, Gfid, Request, Value};

mod state;

pub use state::*;

use super::Inner;
use super::lock::{Held, Target};
use super::pending::{Kind, Mask, all};
use super::quorum::QUORUM_ERRNO;
use super::transaction::{Changelog, evaluate};

/// Why a window ended (counted in dumps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The policy asked.
    Policy,
    /// No transaction for post-op-delay-secs.
    Idle,
    /// A transaction failed on some child.
    Failure,
    /// The last local fd was released.
    Close,
    /// The graph is going away.
    Shutdown,
}

/// A window to end: its post-op and unlock.
struct Job {
    held: Option<Held>,
    changelog: Option<Changelog>,
    unstable: bool,
    why: Why,
}

/// A transaction's place in a window.
pub struct Token {
    st: Arc<InodeState>,
    /// Children taking part in the window.
    pub members: Mask,
    range: (u64, u64),
}

enum Next {
    Joined(Token),
    Wait,
    Acquire,
    PreOp(Held, Option<Fd>),
    Release(Job),
}

fn overlaps(ranges: &[(u64, u64)], r: (u64, u64)) -> bool {
    ranges.iter().any(|&(s, e)| s <= r.1 && r.0 <= e)
}

impl Inner {
    /// A data transaction on `gfid` (through `fd` if given) covering bytes
    /// `range` (inclusive).
    pub async fn data_txn(
        self: &Arc<Self>,
        ctx: &CallCtx,
        gfid: Gfid,
        fd: Option<Fd>,
        range: (u64, u64),
        mut req: Request,
    ) -> FopResult {
        let gfid = self.resolve_gfid(ctx, gfid, &req).await?;
        let cfg = self.cfg();
        let st = match cfg.eager_lock.then(|| self.inodes.get_or_insert(gfid)).flatten() {
            Some(st) => st,
            None => return self.inode_txn(ctx, Kind::Data, gfid, fd, req).await,
        };
        let up = self.require_quorum()?;
        let tok = self.join(&st, ctx, fd, range).await?;
        let want = tok.members & up;
        let targets = match fd {
            Some(fd) => self.fd_targets(ctx, &fd, want).await,
            None => want,
        };
        let asked_count = req.xdata.contains(INODELK_COUNT);
        if cfg.policy.interest().inodelk_count && !asked_count {
            req.xdata.set(INODELK_COUNT, Value::Str(self.name.clone()));
        }
        // An O_SYNC / O_DSYNC write fsyncs the file after it on each child
        // (write-behind sends fsyncs that way): the writes finished before
        // it are then durable wherever it succeeded.
        let sync_mark =
            matches!(&req.fop, Fop::Writev { flags, .. } if *flags as i32 & (libc::O_SYNC | libc::O_DSYNC) != 0)
                .then(|| self.write_mark(gfid));
        let mut out = evaluate(self.fan(ctx, targets, &req).await);
        if out.ok != 0 {
            out.failed |= tok.members & !targets;
        }
        self.check_fop_quorum(&mut out);
        let synced = sync_mark.filter(|_| out.failed == 0 && out.ok == all(self.children.len()));
        let (failed, count) = (out.failed, out.inodelk_count);
        self.finish(tok, failed, count, out.ok != 0, synced).await;
        out.result
    }

    /// Joins (or opens) the window of `st`.
    async fn join(
        self: &Arc<Self>,
        st: &Arc<InodeState>,
        ctx: &CallCtx,
        fd: Option<Fd>,
        range: (u64, u64),
    ) -> Result<Token, Errno> {
        loop {
            let notified = st.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let mut s = st.s.lock();
                match s.phase {
                    Phase::Held if s.release => {
                        if s.in_flight == 0 && s.settling == 0 {
                            Next::Release(s.take_job(Why::Policy))
                        } else {
                            Next::Wait
                        }
                    }
                    Phase::Held if s.settling > 0 || overlaps(&s.ranges, range) => Next::Wait,
                    Phase::Held => match s.changelog.as_ref().map(|c| c.members) {
                        Some(members) => {
                            s.in_flight += 1;
                            s.txns += 1;
                            s.ranges.push(range);
                            self.consult(st.gfid, &mut s, LockEvent::TxnStart);
                            Next::Joined(Token { st: st.clone(), members, range })
                        }
                        None => {
                            s.phase = Phase::Busy;
                            match s.held.clone() {
                                Some(h) => Next::PreOp(h, fd),
                                None => Next::Acquire,
                            }
                        }
                    },
                    Phase::Unlocked => {
                        s.phase = Phase::Busy;
                        Next::Acquire
                    }
                    Phase::Busy => Next::Wait,
                }
            };
            match next {
                Next::Joined(t) => return Ok(t),
                Next::Wait => notified.await,
                Next::Release(job) => self.run_job(st, job).await,
                Next::PreOp(held, fd) => {
                    self.window_pre_op(st, held, fd, None).await?;
                }
                Next::Acquire => return self.acquire(st, ctx, fd, range).await,
            }
        }
    }

    /// Takes the eager lock and opens a window with the caller as its first
    /// transaction.
    async fn acquire(
        self: &Arc<Self>,
        st: &Arc<InodeState>,
        ctx: &CallCtx,
        fd: Option<Fd>,
        range: (u64, u64),
    ) -> Result<Token, Errno> {
        let gfid = st.gfid;
        let back = |e: Errno| {
            let mut s = st.s.lock();
            s.phase = Phase::Unlocked;
            s.owner = None;
            drop(s);
            st.changed.notify_waiters();
            Err(e)
        };
        let up = self.up_mask();
        let lock_fd = fd.filter(|f| self.fd_opened(f) & up == up);
        let interest = self.cfg().policy.interest();
        let lctx = ctx.with_lk_owner(self.new_owner());
        {
            // From here on a contention upcall naming this owner counts,
            // even one that comes while the locks are being taken.
            let mut s = st.s.lock();
            s.owner = Some((lctx.client_id.clone(), lctx.lk_owner));
            s.acquired_at = Instant::now();
            s.txns = 0;
            s.contended = false;
            s.release = false;
            s.deadline = None;
            s.inodelk_count = 0;
        }
        let target = Target::Inode { gfid, fd: lock_fd, metadata: false };
        let held = match self.lock(lctx, vec![target], up, interest.inodelk_count).await {
            Ok(h) => h,
            Err(e) => return back(e),
        };
        if !self.cfg().quorum.met(held.locked, self.children.len()) {
            self.unlock(&held).await;
            return back(QUORUM_ERRNO);
        }
        self.stats.windows.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        st.s.lock().inodelk_count = held.inodelk_count;
        let members = self.window_pre_op(st, held, lock_fd, Some(range)).await?;
        Ok(Token { st: st.clone(), members, range })
    }

    /// Raises the counters under a held lock (phase is Busy); leaves the
    /// window Held with a changelog (and, with `first`, the caller's
    /// transaction in it: a new acquisition), or releases the lock on
    /// failure. Returns the window's members.
    async fn window_pre_op(
        self: &Arc<Self>,
        st: &Arc<InodeState>,
        held: Held,
        fd: Option<Fd>,
        first: Option<(u64, u64)>,
    ) -> Result<Mask, Errno> {
        let want_fds = self.cfg().policy.interest().open_fd_count;
        let fd = fd.filter(|f| self.fd_opened(f) & held.locked == held.locked);
        let mut cl =
            Changelog { kind: Kind::Data, inodes: vec![st.gfid], fd, members: held.locked, preop: true, failed: 0 };
        let fds = self.pre_op(&held.ctx, &mut cl, want_fds).await;
        if cl.members == 0 || !self.cfg().quorum.met(cl.members, self.children.len()) {
            self.post_op(&held.ctx, &cl, true).await;
            self.unlock(&held).await;
            let mut s = st.s.lock();
            s.phase = Phase::Unlocked;
            s.owner = None;
            s.held = None;
            s.changelog = None;
            drop(s);
            st.changed.notify_waiters();
            return Err(QUORUM_ERRNO);
        }
        let members = cl.members;
        let mut s = st.s.lock();
        s.held = Some(held);
        s.changelog = Some(cl);
        s.phase = Phase::Held;
        if let Some(range) = first {
            s.in_flight += 1;
            s.txns += 1;
            s.ranges.push(range);
            self.consult(st.gfid, &mut s, LockEvent::Acquired);
            if s.inodelk_count > 0 {
                self.consult(st.gfid, &mut s, LockEvent::InodelkCount);
            }
        }
        if want_fds && fds > 0 {
            s.brick_open_fds = fds;
            self.consult(st.gfid, &mut s, LockEvent::OpenFdCount);
        }
        drop(s);
        st.changed.notify_waiters();
        Ok(members)
    }

    /// Ends a transaction of the window. `synced`: it was a write that
    /// fsynced the file on every child after it, sent when
    /// [`Inner::write_mark`] was this: those writes are durable, and so is
    /// this one unless others finished while it ran.
    async fn finish(self: &Arc<Self>, tok: Token, failed: Mask, inodelk_count: u32, wrote: bool, synced: Option<u64>) {
        let st = tok.st;
        let job = {
            let mut s = st.s.lock();
            s.in_flight = s.in_flight.saturating_sub(1);
            if let Some(p) = s.ranges.iter().position(|r| *r == tok.range) {
                s.ranges.swap_remove(p);
            }
            let alone = synced == Some(s.writes);
            if wrote {
                s.writes += 1;
            }
            if let Some(mark) = synced {
                s.synced = s.synced.max(if alone { s.writes } else { mark });
            }
            s.idle_since = Instant::now();
            let mut why = Why::Policy;
            if failed != 0 {
                if let Some(cl) = s.changelog.as_mut() {
                    cl.failed |= failed;
                }
                s.stale[Kind::Data as usize] |= failed;
                s.release = true;
                why = Why::Failure;
            }
            if inodelk_count > 0 {
                s.inodelk_count = inodelk_count;
                self.consult(st.gfid, &mut s, LockEvent::InodelkCount);
            }
            self.consult(st.gfid, &mut s, LockEvent::TxnEnd);
            if s.in_flight == 0 && s.phase == Phase::Held && s.settling == 0 {
                if s.release {
                    Some(s.take_job(why))
                } else if self.cfg().post_op_delay.is_zero() || !self.ensure_timer(&st, &mut s) {
                    Some(s.take_job(Why::Idle))
                } else {
                    None
                }
            } else {
                None
            }
        };
        st.changed.notify_waiters();
        if let Some(job) = job {
            self.run_job(&st, job).await;
        }
    }

    /// Writes the post-op of the window now (fsync, flush), keeping the
    /// lock. `blame` are children to blame (an fsync failed there);
    /// `synced_at`: an fsync covered the writes counted by [`Inner::write_mark`]
    /// then. Returns false if there was no window to put the blame in.
    pub async fn settle(self: &Arc<Self>, gfid: Gfid, blame: Mask, synced_at: Option<u64>) -> bool {
        let Some(st) = self.inodes.get(&gfid) else { return false };
        let mut registered = false;
        let mut blamed = false;
        loop {
            let notified = st.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let work = {
                let mut s = st.s.lock();
                if blame != 0
                    && !blamed
                    && let Some(cl) = s.changelog.as_mut()
                {
                    cl.failed |= blame;
                    blamed = true;
                    s.stale[Kind::Data as usize] |= blame;
                    s.release = true;
                }
                match (s.phase, s.changelog.is_some()) {
                    (Phase::Held, true) => {
                        if !registered {
                            s.settling += 1;
                            registered = true;
                        }
                        if s.in_flight == 0 {
                            s.phase = Phase::Busy;
                            let cl = s.changelog.take();
                            let unstable = s.take_unstable(synced_at);
                            Some((cl, s.held.clone(), unstable))
                        } else {
                            None
                        }
                    }
                    (Phase::Busy, _) => None,
                    _ => {
                        if registered {
                            s.settling -= 1;
                        }
                        drop(s);
                        st.changed.notify_waiters();
                        return blamed;
                    }
                }
            };
            let Some((cl, held, unstable)) = work else {
                notified.await;
                continue;
            };
            if let (Some(cl), Some(h)) = (cl, held) {
                self.stats.settles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.window_post_op(&h.ctx, cl, unstable).await;
            }
            let job = {
                let mut s = st.s.lock();
                s.phase = Phase::Held;
                s.settling -= 1;
                if s.in_flight > 0 || s.settling > 0 {
                    None
                } else if s.release {
                    Some(s.take_job(if blamed { Why::Failure } else { Why::Policy }))
                } else if self.cfg().post_op_delay.is_zero() || !self.ensure_timer(&st, &mut s) {
                    Some(s.take_job(Why::Idle))
                } else {
                    None
                }
            };
            st.changed.notify_waiters();
            if let Some(job) = job {
                self.run_job(&st, job).await;
            }
            return blamed;
        }
    }

    /// The post-op of a window, after an fsync of its members when writes
    /// may not be stable yet and `ensure-durability` is on.
    async fn window_post_op(&self, ctx: &CallCtx, mut cl: Changelog, unstable: bool) {
        if unstable
            && self.cfg().ensure_durability
            && let Some(fd) = cl.fd
        {
            let targets = cl.members & !cl.failed;
            cl.failed |= self.group_sync(ctx, fd, targets).await;
        }
        self.post_op(ctx, &cl, false).await;
    }

    /// Ends a window: post-op, unlock, wake the waiters.
    async fn run_job(self: &Arc<Self>, st: &Arc<InodeState>, job: Job) {
        if let (Some(cl), Some(h)) = (job.changelog, &job.held) {
            self.window_post_op(&h.ctx, cl, job.unstable).await;
        }
        if let Some(h) = &job.held {
            self.unlock(h).await;
        }
        self.stats.released(job.why);
        {
            let mut s = st.s.lock();
            s.phase = Phase::Unlocked;
            s.owner = None;
            s.release = false;
            s.deadline = None;
            s.contended = false;
            s.inodelk_count = 0;
            s.ranges.clear();
        }
        st.changed.notify_waiters();
    }

    /// Acts on the policy's answer outside a transaction's end: runs the
    /// window's release in the background when it is due and no
    /// transaction runs (contention upcall, fd close, brick counts,
    /// shutdown), or starts the timer for a deadline.
    fn after_event(self: &Arc<Self>, st: &Arc<InodeState>, s: &mut State, why: Why) {
        if s.phase == Phase::Held && s.release && s.in_flight == 0 && s.settling == 0 {
            let Some(h) = self.handle() else {
                tracing::warn!(volume = %self.name, "no async runtime to release an eager lock on; left for the next fop");
                return;
            };
            let job = s.take_job(why);
            let (me, st2) = (self.clone(), st.clone());
            h.spawn(async move { me.run_job(&st2, job).await });
        } else if s.deadline.is_some() {
            self.ensure_timer(st, s);
        }
    }

    /// Asks the policy about `event` and applies its answer.
    fn consult(&self, gfid: Gfid, s: &mut State, event: LockEvent) {
        if s.phase == Phase::Unlocked {
            return;
        }
        match self.cfg().policy.decide(event, &s.view(gfid)) {
            Decision::Keep => {}
            Decision::ReleaseNow => s.release = true,
            Decision::ReleaseAfter { ms } => {
                let at = Instant::now() + Duration::from_millis(ms);
                s.deadline = Some(s.deadline.map_or(at, |d| d.min(at)));
            }
        }
    }

    /// Makes sure the window's timer runs; false if it cannot.
    fn ensure_timer(self: &Arc<Self>, st: &Arc<InodeState>, s: &mut State) -> bool {
        if s.timer {
            return true;
        }
        let Some(h) = self.handle() else { return false };
        let (me, st2) = (self.clone(), st.clone());
        h.spawn(async move { me.timer(st2).await });
        s.timer = true;
        true
    }

    /// Ends the window when it has been idle for post-op-delay-secs or its
    /// policy deadline passed.
    async fn timer(self: Arc<Self>, st: Arc<InodeState>) {
        loop {
            let delay = self.cfg().post_op_delay;
            let (job, wake) = {
                let mut s = st.s.lock();
                if s.phase == Phase::Unlocked {
                    s.timer = false;
                    return;
                }
                let now = Instant::now();
                if s.deadline.is_some_and(|d| now >= d) {
                    s.release = true;
                }
                let idle_end = s.idle_since + delay;
                if s.phase == Phase::Held && s.in_flight == 0 && s.settling == 0 && (s.release || now >= idle_end) {
                    s.timer = false;
                    let why = if s.release { Why::Policy } else { Why::Idle };
                    (Some(s.take_job(why)), now)
                } else {
                    let next = if s.in_flight > 0 || s.phase == Phase::Busy {
                        now + delay.max(Duration::from_millis(10))
                    } else {
                        idle_end
                    };
                    (None, s.deadline.map_or(next, |d| d.min(next)))
                }
            };
            if let Some(job) = job {
                self.run_job(&st, job).await;
                return;
            }
            tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await;
        }
    }

    /// A contention upcall for a lock AFR may hold. The holder is known by
    /// its lock owner (unique per lock: [`Inner::new_owner`]): the client id
    /// a brick names is the one it gave this connection (`client-id#N`),
    /// not the caller's this translator locked with, and a brick sends the
    /// upcall to the holder's connection only. An in-process child names
    /// the caller's id, which matches too.
    pub fn contention(self: &Arc<Self>, gfid: Gfid, holder_client: &str, holder_owner: u64) {
        let Some(st) = self.inodes.get(&gfid) else { return };
        let mut s = st.s.lock();
        let ours = s.owner.as_ref().is_some_and(|(_, o)| *o == holder_owner);
        tracing::trace!(%gfid, holder_client, ours, "inodelk contention");
        if !ours {
            return;
        }
        self.stats.upcalls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        s.contended = true;
        self.consult(gfid, &mut s, LockEvent::Contention);
        self.after_event(&st, &mut s, Why::Policy);
    }

    /// An fd was opened on `gfid` through this AFR.
    pub fn fd_opened_on(self: &Arc<Self>, gfid: Gfid) {
        let Some(st) = self.inodes.get_or_insert(gfid) else { return };
        let mut s = st.s.lock();
        s.local_open_fds = s.local_open_fds.saturating_add(1);
        self.consult(gfid, &mut s, LockEvent::FdOpened);
        self.after_event(&st, &mut s, Why::Policy);
    }

    /// An fd on `gfid` was released through this AFR; the last one ends the
    /// window.
    pub fn fd_closed_on(self: &Arc<Self>, gfid: Gfid, fd: Fd) {
        let Some(st) = self.inodes.get(&gfid) else { return };
        let mut s = st.s.lock();
        s.local_open_fds = s.local_open_fds.saturating_sub(1);
        if let Some(cl) = s.changelog.as_mut()
            && cl.fd == Some(fd)
        {
            cl.fd = None;
        }
        if let Some(h) = s.held.as_mut() {
            for t in h.targets.iter_mut() {
                if let Target::Inode { fd: f, .. } = t
                    && *f == Some(fd)
                {
                    *f = None;
                }
            }
        }
        self.consult(gfid, &mut s, LockEvent::FdClosed);
        let why = if s.local_open_fds == 0 && s.phase != Phase::Unlocked {
            s.release = true;
            Why::Close
        } else {
            Why::Policy
        };
        self.after_event(&st, &mut s, why);
    }

    /// A brick reported its open fd count on `gfid` (lookup).
    pub fn brick_fds(self: &Arc<Self>, st: &Arc<InodeState>, count: u32) {
        let mut s = st.s.lock();
        s.brick_open_fds = count;
        self.consult(st.gfid, &mut s, LockEvent::OpenFdCount);
        self.after_event(st, &mut s, Why::Policy);
    }

    /// Ends every window not in use (graph going away).
    pub fn release_all(self: &Arc<Self>) {
        for st in self.inodes.all() {
            let mut s = st.s.lock();
            if s.phase == Phase::Held {
                s.release = true;
                self.after_event(&st, &mut s, Why::Shutdown);
            }
        }
    }

    /// The number of writes finished on `gfid` under eager locks so far
    /// (fsync reads it before it syncs).
    pub fn write_mark(&self, gfid: Gfid) -> u64 {
        self.inodes.get(&gfid).map_or(0, |st| st.s.lock().writes)
    }

    /// An fsync that succeeded on every child covered the writes counted
    /// by `mark` (from [`Inner::write_mark`]): the window's post-op need
    /// not fsync them again.
    pub fn note_synced(&self, gfid: Gfid, mark: u64) {
        if let Some(st) = self.inodes.get(&gfid) {
            let mut s = st.s.lock();
            s.synced = s.synced.max(mark);
        }
    }

    /// Records `blamed` children as stale for `kind` of `gfid`.
    pub fn mark_stale(&self, gfid: Gfid, kind: Kind, blamed: Mask) {
        if blamed == 0 || gfid.is_null() {
            return;
        }
        if let Some(st) = self.inodes.get_or_insert(gfid) {
            st.s.lock().stale[kind as usize] |= blamed & all(self.children.len());
        }
    }

    /// Eager-lock windows held now.
    pub fn windows_held(&self) -> usize {
        self.inodes.all().iter().filter(|st| st.s.lock().phase != Phase::Unlocked).count()
    }
}
