//! POSIX locks (getlk, setlk, setlkw) and flock, as `lk` fops.
//!
//! FUSE's lock owner becomes the fop's `lk_owner`: for fcntl locks the
//! kernel names the process's file table, for flock (and OFD locks) the open
//! file. flock arrives as a whole-file lock (the mount asks for
//! FUSE_FLOCK_LOCKS) marked FUSE_LK_FLOCK (our fuser patch passes the mark
//! on) and goes to the bricks with [`LK_FLOCK`]: a lock space of its own,
//! so a flock and an fcntl or OFD lock never conflict, as on a local file
//! system. A flock is released with the fd (Release); fcntl locks are
//! released by the flush of each close.
//!
//! **Waiting without blocking.** A SETLKW waits in a task, never on a
//! reader thread. fuser 0.18 answers FUSE_INTERRUPT itself with ENOSYS, after
//! which the kernel sends no more interrupts and a process waiting for a
//! lock could not be signalled. So while a SETLKW waits, the bridge looks at
//! the caller's `/proc/PID/status` every [`SIGNAL_POLL`]: once a signal is
//! pending that the caller neither blocks nor ignores (or the caller is
//! gone), an unlock marked [`LK_CANCEL`] takes the request off the bricks'
//! wait queues (dropping the fop alone would leave it there, to be granted
//! later and held until close), and the request's own answer decides: EINTR
//! once cancelled (the kernel restarts the call if the signal's handler
//! asks for that), success if the bricks granted it before the cancel came.
//!
//! **Unlock by release, in order.** The kernel keeps no flock of its own
//! for a FUSE file and sends no unlock when the last fd closes: the
//! release says "drop the flock" (FUSE_RELEASE_FLOCK_UNLOCK), and the kernel
//! does not wait for its answer. The bridge runs fops concurrently, so the
//! flock of the next process (`flock f cmd1; flock -n f cmd2`) could reach
//! the bricks before the release that frees it and fail with EWOULDBLOCK
//! (seen in the FUSE suite on 2 x 3, where a release waits for
//! write-behind and three copies). So a release of an fd that holds locks
//! is noted when it is read from the device ([`Unlocking`]), and a lock fop
//! on the same inode waits until the releases noted before it are done.
//!
//! **Locks across a graph switch.** The bricks know a lock by the
//! connection it came on, so a new graph (new connections) holds none of
//! the old one's. The bridge therefore remembers the locks it was granted
//! ([`HeldLocks`]: per inode and lock owner, the ranges and their types,
//! kept as POSIX merges and splits them; dropped by the flush of each
//! close for the owner, and by release for the fd) and a switch moves them
//! ([`Core::move_locks`]). Lock fops, flush and release pass a gate
//! (`lk_gate`) that the switch closes while it moves them; a SETLKW waiting
//! on the old graph gives up there and waits again on the new one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fuser::FileHandle;
use parking_lot::Mutex;
use xlfs_sdk::dict::keys::{LK_CANCEL, LK_FLOCK};
use xlfs_sdk::{CallCtx, Dict, Errno, Fd, FdId, Flock, Fop, Gfid, LkCmd, LockType, Value};

use super::switch::Active;
use super::{Caller, Core};

/// How often a waiting SETLKW checks its caller for pending signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// How long an interrupted SETLKW waits for the bricks to answer its
/// cancel and the request itself (both come at once from a brick that is
/// up) before it gives up on them.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// FUSE's `OFFSET_MAX`: a lock to the end of the file.
const OFFSET_MAX: u64 = i64::MAX as u64;

/// A lock as FUSE describes it: an inclusive byte range and an `F_*` type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FuseLock {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    pub pid: u32,
}

fn to_flock(l: &FuseLock, owner: u64) -> Result<Flock, Errno> {
    let ty = match l.typ {
        libc::F_RDLCK => LockType::Read,
        libc::F_WRLCK => LockType::Write,
        libc::F_UNLCK => LockType::Unlock,
        _ => return Err(Errno::EINVAL),
    };
    let len = if l.end >= OFFSET_MAX {
        0
    } else if l.end < l.start {
        return Err(Errno::EINVAL);
    } else {
        l.end - l.start + 1
    };
    Ok(Flock { ty, start: l.start, len, pid: l.pid, owner })
}

fn from_flock(f: &Flock) -> FuseLock {
    let typ = match f.ty {
        LockType::Read => libc::F_RDLCK,
        LockType::Write => libc::F_WRLCK,
        LockType::Unlock => libc::F_UNLCK,
    };
    let end = if f.len == 0 { OFFSET_MAX } else { f.start.saturating_add(f.len - 1).min(OFFSET_MAX) };
    FuseLock { start: f.start, end, typ, pid: f.pid }
}

/// Most (inode, owner) pairs whose locks are remembered, and most ranges
/// per pair; locks past these are not moved by a graph switch (logged).
const MAX_HELD: usize = 65_536;
const MAX_RANGES: usize = 1024;

/// One locked byte range, `end` inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    start: u64,
    end: u64,
    ty: LockType,
}

/// The locks one owner holds on one inode.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Held {
    /// The fd they were taken through (the last one).
    fd: Option<FdId>,
    pid: u32,
    /// Disjoint, by start.
    ranges: Vec<Range>,
}

impl Held {
    /// Applies a granted lock or unlock as POSIX does: the range takes the
    /// new type (or is freed), splitting what it overlaps.
    fn apply(&mut self, f: &Flock) -> bool {
        let start = f.start;
        let end = if f.len == 0 { u64::MAX } else { f.start.saturating_add(f.len - 1) };
        let mut out = Vec::with_capacity(self.ranges.len() + 2);
        for r in self.ranges.drain(..) {
            if r.end < start || r.start > end {
                out.push(r);
                continue;
            }
            if r.start < start {
                out.push(Range { end: start - 1, ..r });
            }
            if r.end > end {
                out.push(Range { start: end + 1, ..r });
            }
        }
        if f.ty != LockType::Unlock {
            out.push(Range { start, end, ty: f.ty });
        }
        out.sort_by_key(|r| r.start);
        self.ranges = out;
        self.ranges.len() <= MAX_RANGES
    }
}

/// Whose locks: (inode, lock owner, in the flock space). An open file is
/// the owner of its flocks and of its OFD locks, which are apart all the same.
type HeldKey = (Gfid, u64, bool);

/// The locks the mount was granted, by [`HeldKey`].
#[derive(Default)]
pub(super) struct HeldLocks(Mutex<HashMap<HeldKey, Held>>);

/// The xdata of a lock fop: marked [`LK_FLOCK`] for a flock.
fn space(flock: bool) -> Dict {
    if flock { Dict::new().with(LK_FLOCK, Value::U64(1)) } else { Dict::new() }
}

impl HeldLocks {
    /// Records a granted SETLK/SETLKW (or unlock).
    fn record(&self, fd: Fd, pid: u32, lock: &Flock, flock: bool) {
        let mut m = self.0.lock();
        let key = (fd.gfid, lock.owner, flock);
        if !m.contains_key(&key) && (lock.ty == LockType::Unlock || m.len() >= MAX_HELD) {
            if lock.ty != LockType::Unlock {
                tracing::warn!(gfid = %fd.gfid, "too many lock owners to remember: this lock will not survive a graph switch");
            }
            return;
        }
        let h = m.entry(key).or_default();
        h.fd = Some(fd.id);
        h.pid = pid;
        if !h.apply(lock) {
            tracing::warn!(gfid = %fd.gfid, "too many locked ranges to remember: these locks will not survive a graph switch");
            m.remove(&key);
            return;
        }
        if h.ranges.is_empty() {
            m.remove(&key);
        }
    }

    /// The fd (and pid) through which `owner`'s POSIX locks on `gfid` were
    /// taken, if any.
    fn taken_through(&self, gfid: Gfid, owner: u64) -> Option<(FdId, u32)> {
        self.0.lock().get(&(gfid, owner, false)).and_then(|h| h.fd.map(|fd| (fd, h.pid)))
    }

    /// The flush of a close: the bricks drop the owner's POSIX locks on the
    /// inode (not its flocks).
    fn drop_owner(&self, gfid: Gfid, owner: u64) {
        self.0.lock().remove(&(gfid, owner, false));
    }

    /// True when locks are held through the fd.
    fn through(&self, fd: FdId) -> bool {
        self.0.lock().values().any(|h| h.fd == Some(fd))
    }

    /// A release: the bricks drop the locks taken through the fd.
    fn drop_fd(&self, fd: FdId) {
        self.0.lock().retain(|_, h| h.fd != Some(fd));
    }

    fn snapshot(&self) -> Vec<(HeldKey, Held)> {
        self.0.lock().iter().map(|(k, h)| (*k, h.clone())).collect()
    }

    fn forget(&self, key: HeldKey) {
        self.0.lock().remove(&key);
    }

    /// How many (inode, owner) pairs hold locks.
    pub(super) fn len(&self) -> usize {
        self.0.lock().len()
    }
}

/// Releases on their way that drop locks, per inode (see the module doc).
#[derive(Default)]
pub(super) struct Unlocking {
    pending: Mutex<HashMap<Gfid, u32>>,
    done: tokio::sync::Notify,
}

/// A release noted in [`Unlocking`]; done when dropped.
pub(super) struct ReleaseUnlocks {
    of: Arc<Unlocking>,
    gfid: Gfid,
}

impl Drop for ReleaseUnlocks {
    fn drop(&mut self) {
        let mut m = self.of.pending.lock();
        if let Some(n) = m.get_mut(&self.gfid) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.gfid);
            }
        }
        drop(m);
        self.of.done.notify_waiters();
    }
}

impl Unlocking {
    fn begin(self: &Arc<Self>, gfid: Gfid) -> ReleaseUnlocks {
        *self.pending.lock().entry(gfid).or_insert(0) += 1;
        ReleaseUnlocks { of: self.clone(), gfid }
    }

    /// Waits until no release that drops locks on `gfid` is on its way.
    async fn settled(&self, gfid: Gfid) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if !self.pending.lock().contains_key(&gfid) {
                return;
            }
            done.await;
        }
    }
}

/// Parses one hexadecimal signal mask line of `/proc/PID/status`.
fn mask(status: &str, key: &str) -> u64 {
    status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0)
}

/// True if the status text shows a signal that would interrupt a wait: one
/// pending for the thread or the process, not blocked and not ignored.
fn signal_pending(status: &str) -> bool {
    let pending = mask(status, "SigPnd:") | mask(status, "ShdPnd:");
    let kill = 1u64 << (libc::SIGKILL - 1);
    pending & (kill | !(mask(status, "SigBlk:") | mask(status, "SigIgn:"))) != 0
}

/// Resolves once the thread `pid` has a signal pending that would interrupt
/// it, or is gone.
async fn interrupted(pid: u32) {
    if pid == 0 {
        return std::future::pending().await;
    }
    let path = format!("/proc/{pid}/status");
    loop {
        tokio::time::sleep(SIGNAL_POLL).await;
        match tokio::fs::read_to_string(&path).await {
            Ok(s) if !signal_pending(&s) => {}
            _ => return,
        }
    }
}

impl Core {
    /// Notes a release of `fh` that drops locks (None if it holds none):
    /// lock fops on its inode read from the device after it wait for it.
    pub(super) fn release_unlocks(&self, fh: FileHandle) -> Option<ReleaseUnlocks> {
        let fd = self.fd(fh).ok()?;
        self.held.through(fd.id).then(|| self.unlocking.begin(fd.gfid))
    }

    pub(super) async fn getlk(
        self: Arc<Self>,
        who: Caller,
        fh: FileHandle,
        owner: u64,
        lk: FuseLock,
    ) -> Result<FuseLock, Errno> {
        let fd = self.fd(fh)?;
        let lock = to_flock(&lk, owner)?;
        self.unlocking.settled(fd.gfid).await;
        let _gate = self.lk_gate.read().await;
        let f = self.call(self.ctx(who, owner, false), Fop::Lk { fd, cmd: LkCmd::GetLk, lock }).await?.into_lock()?;
        if f.ty == LockType::Unlock { Ok(FuseLock { typ: libc::F_UNLCK, pid: 0, ..lk }) } else { Ok(from_flock(&f)) }
    }

    pub(super) async fn setlk(
        self: Arc<Self>,
        who: Caller,
        fh: FileHandle,
        owner: u64,
        lk: FuseLock,
        sleep: bool,
        flock: bool,
    ) -> Result<(), Errno> {
        let fd = self.fd(fh)?;
        let lock = to_flock(&lk, owner)?;
        let wait = sleep && lock.ty != LockType::Unlock;
        let cmd = if wait { LkCmd::SetLkw } else { LkCmd::SetLk };
        self.unlocking.settled(fd.gfid).await;
        loop {
            let gate = self.lk_gate.read().await;
            let entered = self.enter();
            let a = entered.0.clone();
            let mut fop =
                std::pin::pin!(self.call_on(&a, self.ctx(who, owner, false), Fop::Lk { fd, cmd, lock }, space(flock)));
            let r = if wait {
                tokio::select! {
                    biased;
                    r = &mut fop => r,
                    () = interrupted(who.pid) => {
                        tracing::debug!(pid = who.pid, "SETLKW interrupted by a signal");
                        // Dropping the fop would leave the request queued on
                        // the bricks (granted later, it would be held until
                        // close): cancel it there, then take the request's
                        // own answer. EINTR if the cancel took it off the
                        // queue; granted if the grant came first (then the
                        // lock is the caller's, as if the signal came just
                        // after). Past CANCEL_GRACE the fop is dropped and
                        // EINTR answered; replicate gives back what some
                        // bricks granted when its caller stops waiting.
                        let cancel = Fop::Lk { fd, cmd: LkCmd::SetLk, lock: Flock { ty: LockType::Unlock, ..lock } };
                        let x = space(flock).with(LK_CANCEL, Value::U64(1));
                        let cancelled = self.call_on(&a, self.ctx(who, owner, false), cancel, x);
                        let answer = tokio::time::timeout(CANCEL_GRACE, async {
                            if let Err(e) = cancelled.await {
                                tracing::debug!(gfid = %fd.gfid, %e, "cancelling an interrupted SETLKW");
                            }
                            fop.await
                        });
                        match answer.await {
                            Ok(Ok(_)) => {
                                self.held.record(fd, who.pid, &lock, flock);
                                return Ok(());
                            }
                            _ => return Err(Errno::EINTR),
                        }
                    }
                    () = a.retiring() => {
                        // A graph switch: wait again on the new graph.
                        drop(entered);
                        drop(gate);
                        continue;
                    }
                }
            } else {
                fop.await
            };
            if r.is_ok() {
                self.held.record(fd, who.pid, &lock, flock);
            }
            return r.map(drop);
        }
    }

    /// Flush of a close: the bricks drop `owner`'s POSIX locks on the file.
    pub(super) async fn flush_locks(self: &Arc<Self>, ctx: CallCtx, fd: Fd) -> Result<(), Errno> {
        let _gate = self.lk_gate.read().await;
        let owner = ctx.lk_owner;
        // POSIX: any close drops the process's locks on the file. A flush
        // of an fd the graph never opened below (performance/open-behind)
        // does not reach the bricks, so locks taken through another fd are
        // unlocked through that one.
        if let Some((id, pid)) = self.held.taken_through(fd.gfid, owner).filter(|(id, _)| *id != fd.id) {
            let all = Flock { ty: LockType::Unlock, start: 0, len: 0, pid, owner };
            let lk = Fop::Lk { fd: Fd { id, gfid: fd.gfid }, cmd: LkCmd::SetLk, lock: all };
            if let Err(e) = self.call(ctx.clone(), lk).await {
                tracing::debug!(gfid = %fd.gfid, %e, "unlock at close");
            }
        }
        let r = self.call(ctx, Fop::Flush { fd }).await.map(drop);
        self.held.drop_owner(fd.gfid, owner);
        r
    }

    /// Release (or releasedir): the bricks drop the locks taken through it.
    /// The fd leaves the table first, so no graph switch reopens it now.
    pub(super) async fn release_locks(self: &Arc<Self>, ctx: CallCtx, fd: Fd, dir: bool) -> Result<(), Errno> {
        let _gate = self.lk_gate.read().await;
        self.fds.release(fd.id);
        let fop = if dir { Fop::Releasedir { fd } } else { Fop::Release { fd } };
        let r = self.call(ctx, fop).await.map(drop);
        self.held.drop_fd(fd.id);
        r
    }

    /// Moves the locks the mount holds from graph `old` to graph `new`
    /// (lock fops are held at the gate): each owner's locks on an inode are
    /// unlocked on the old graph, then each range is taken again (SETLK) on
    /// the new one. Returns (ranges moved, ranges lost).
    pub(super) async fn move_locks(&self, old: &Active, new: &Active) -> (usize, usize) {
        let (mut moved, mut lost) = (0, 0);
        for ((gfid, owner, flock), held) in self.held.snapshot() {
            let Some(id) = held.fd else { continue };
            let fd = Fd { id, gfid };
            let ctx = CallCtx { lk_owner: owner, pid: held.pid, ..CallCtx::root(self.client_id.clone()) };
            let all = Flock { ty: LockType::Unlock, start: 0, len: 0, pid: held.pid, owner };
            if let Err(e) =
                self.call_on(old, ctx.clone(), Fop::Lk { fd, cmd: LkCmd::SetLk, lock: all }, space(flock)).await
            {
                tracing::debug!(%gfid, owner, error = %e, "unlock on the old graph");
            }
            let mut kept = true;
            for r in &held.ranges {
                let len = if r.end == u64::MAX { 0 } else { r.end - r.start + 1 };
                let lock = Flock { ty: r.ty, start: r.start, len, pid: held.pid, owner };
                match self.call_on(new, ctx.clone(), Fop::Lk { fd, cmd: LkCmd::SetLk, lock }, space(flock)).await {
                    Ok(_) => moved += 1,
                    Err(e) => {
                        tracing::warn!(%gfid, owner, start = r.start, end = r.end, error = %e,
                            "a lock could not be taken again on the new graph: it is lost");
                        lost += 1;
                        kept = false;
                    }
                }
            }
            if !kept {
                self.held.forget((gfid, owner, flock));
            }
        }
        (moved, lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_convert_both_ways() {
        let l = FuseLock { start: 10, end: 19, typ: libc::F_WRLCK, pid: 7 };
        let f = to_flock(&l, 99).expect("valid");
        assert_eq!(f, Flock { ty: LockType::Write, start: 10, len: 10, pid: 7, owner: 99 });
        assert_eq!(from_flock(&f), l);
        let whole = FuseLock { start: 0, end: OFFSET_MAX, typ: libc::F_RDLCK, pid: 1 };
        let f = to_flock(&whole, 1).expect("valid");
        assert_eq!((f.len, f.ty), (0, LockType::Read));
        assert_eq!(from_flock(&f), whole);
        assert_eq!(to_flock(&FuseLock { start: 5, end: 4, typ: libc::F_RDLCK, pid: 0 }, 0), Err(Errno::EINVAL));
        assert_eq!(to_flock(&FuseLock { start: 0, end: 1, typ: 42, pid: 0 }, 0), Err(Errno::EINVAL));
        let one = FuseLock { start: 3, end: 3, typ: libc::F_UNLCK, pid: 0 };
        assert_eq!(to_flock(&one, 0).expect("valid").len, 1);
    }

    fn flock(ty: LockType, start: u64, len: u64) -> Flock {
        Flock { ty, start, len, pid: 1, owner: 7 }
    }

    #[test]
    fn held_ranges_split_and_merge_as_posix_does() {
        let mut h = Held::default();
        let r = |start, end, ty| Range { start, end, ty };
        assert!(h.apply(&flock(LockType::Write, 0, 100)));
        assert!(h.apply(&flock(LockType::Unlock, 10, 10)));
        assert_eq!(h.ranges, [r(0, 9, LockType::Write), r(20, 99, LockType::Write)]);
        assert!(h.apply(&flock(LockType::Read, 50, 0)));
        assert_eq!(h.ranges, [r(0, 9, LockType::Write), r(20, 49, LockType::Write), r(50, u64::MAX, LockType::Read)]);
        assert!(h.apply(&flock(LockType::Unlock, 0, 0)));
        assert!(h.ranges.is_empty());
    }

    #[test]
    fn held_locks_follow_flush_and_release() {
        let held = HeldLocks::default();
        let g = Gfid([1; 16]);
        let fd = |id| Fd { id: FdId(id), gfid: g };
        held.record(fd(1), 5, &flock(LockType::Write, 0, 10), false);
        held.record(fd(2), 5, &Flock { owner: 8, ..flock(LockType::Read, 0, 0) }, false);
        assert_eq!(held.len(), 2);
        // An unlock of everything forgets the owner; an unlock of an
        // unknown owner records nothing.
        held.record(fd(1), 5, &flock(LockType::Unlock, 0, 0), false);
        held.record(fd(1), 5, &Flock { owner: 99, ..flock(LockType::Unlock, 0, 0) }, false);
        assert_eq!(held.len(), 1);
        held.record(fd(1), 5, &flock(LockType::Write, 0, 10), false);
        // A flock of the same owner (an open file's OFD lock and its flock)
        // is kept apart, and a flush leaves it.
        held.record(fd(1), 5, &flock(LockType::Write, 0, 0), true);
        held.drop_owner(g, 7);
        assert_eq!(held.snapshot().len(), 2);
        assert!(held.snapshot().iter().any(|((_, owner, flock), h)| *owner == 7 && *flock && h.fd == Some(FdId(1))));
        held.drop_fd(FdId(2));
        held.drop_fd(FdId(1));
        assert_eq!(held.len(), 0);
    }

    #[test]
    fn pending_signals_are_read_from_status() {
        let status = |pnd: &str, shd: &str, blk: &str, ign: &str| {
            format!(
                "Name:\tx\nSigQ:\t0/1\nSigPnd:\t{pnd}\nShdPnd:\t{shd}\nSigBlk:\t{blk}\nSigIgn:\t{ign}\nSigCgt:\t0\n"
            )
        };
        let z = "0000000000000000";
        let usr1 = format!("{:016x}", 1u64 << (libc::SIGUSR1 - 1));
        let kill = format!("{:016x}", 1u64 << (libc::SIGKILL - 1));
        assert!(!signal_pending(&status(z, z, z, z)));
        assert!(signal_pending(&status(&usr1, z, z, z)), "thread-directed");
        assert!(signal_pending(&status(z, &usr1, z, z)), "process-directed");
        assert!(!signal_pending(&status(&usr1, z, &usr1, z)), "blocked");
        assert!(!signal_pending(&status(z, &usr1, z, &usr1)), "ignored");
        assert!(signal_pending(&status(z, &kill, "ffffffffffffffff", z)), "SIGKILL always counts");
        assert!(!signal_pending("garbage"));
    }

    #[tokio::test]
    async fn a_vanished_caller_counts_as_interrupted() {
        // No such process: resolves after the first poll.
        tokio::time::timeout(Duration::from_secs(10), interrupted(u32::MAX - 1)).await.expect("resolves");
        // Our own thread has nothing pending: does not resolve.
        let own = std::process::id();
        assert!(tokio::time::timeout(SIGNAL_POLL * 4, interrupted(own)).await.is_err());
    }

    /// features/locks over posix, under a top that can let owner 1's lock
    /// go just before it passes on a cancel (the grant racing the cancel).
    struct Racer {
        locks: xlfs_sdk::Child,
        release_first: std::sync::atomic::AtomicBool,
    }

    impl xlfs_sdk::Xlator for Racer {
        fn call(&self, ctx: CallCtx, req: xlfs_sdk::Request) -> xlfs_sdk::FopFuture<'_> {
            Box::pin(async move {
                if req.xdata.contains(LK_CANCEL)
                    && self.release_first.load(std::sync::atomic::Ordering::Relaxed)
                    && let Fop::Lk { fd, lock, .. } = &req.fop
                {
                    let unlock = Fop::Lk { fd: *fd, cmd: LkCmd::SetLk, lock: Flock { owner: 1, ..*lock } };
                    self.locks.call(CallCtx { lk_owner: 1, ..ctx.clone() }, unlock.into()).await?;
                }
                self.locks.call(ctx, req).await
            })
        }
    }

    /// An interrupted SETLKW answers what the bricks did: EINTR when the
    /// cancel took it off the queue (and nothing is held), success (and the
    /// lock recorded as held) when the grant came first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_interrupted_setlkw_answers_what_the_bricks_did() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            "volume p\n type storage/posix\n option directory {}\nend-volume\n\
             volume l\n type features/locks\n subvolumes p\nend-volume\n",
            dir.path().display()
        );
        let graph =
            crate::graph::Graph::from_str(&text, "t.vol", &crate::registry::Registry::builtin()).expect("graph");
        let racer = Arc::new(Racer { locks: graph.top(), release_first: false.into() });
        let top = xlfs_sdk::Child { name: Arc::from("racer"), xl: racer.clone() };
        let a = Arc::new(super::super::switch::Active::new(1, top, None));
        let core = Arc::new(Core::new(
            a,
            tokio::runtime::Handle::current(),
            super::super::MountOptions::default(),
            Arc::from("c"),
        ));
        let flags = libc::O_RDWR as u32;
        let create =
            Fop::Create { loc: xlfs_sdk::Loc::entry(Gfid::ROOT, "f"), flags, mode: 0o644, umask: 0, fd: FdId(1 << 40) };
        let gfid = match graph.top().call(CallCtx::root("t"), create.into()).await.expect("create").reply {
            xlfs_sdk::Reply::Entry { iatt, .. } => iatt.gfid,
            r => panic!("{r:?}"),
        };
        let id = core.new_fd(gfid, flags, false).expect("fd");
        core.call(CallCtx::root("c"), Fop::Open { loc: xlfs_sdk::Loc::gfid(gfid), flags, fd: id }).await.expect("open");
        let fh = FileHandle(id.0);
        let whole = FuseLock { start: 0, end: OFFSET_MAX, typ: libc::F_WRLCK, pid: 0 };
        let here = Caller { uid: 0, gid: 0, pid: 0 };
        // No such process: "interrupted" at the first look.
        let gone = Caller { pid: u32::MAX - 1, ..here };
        core.clone().setlk(here, fh, 1, whole, false, false).await.expect("owner 1 locks");

        // Cancelled while waiting: EINTR, and owner 3 then finds the lock
        // free once owner 1 lets go (owner 2's request is gone).
        let r = core.clone().setlk(gone, fh, 2, whole, true, false).await;
        assert_eq!(r, Err(Errno::EINTR));
        core.clone().setlk(here, fh, 1, FuseLock { typ: libc::F_UNLCK, ..whole }, false, false).await.expect("unlock");
        core.clone().setlk(here, fh, 3, whole, false, false).await.expect("owner 3: owner 2 holds nothing");
        core.clone().setlk(here, fh, 3, FuseLock { typ: libc::F_UNLCK, ..whole }, false, false).await.expect("unlock");

        // Granted just before the cancel arrived: the caller holds the lock,
        // and says so.
        core.clone().setlk(here, fh, 1, whole, false, false).await.expect("owner 1 locks again");
        racer.release_first.store(true, std::sync::atomic::Ordering::Relaxed);
        core.clone().setlk(gone, fh, 2, whole, true, false).await.expect("granted before the cancel: success");
        assert!(core.held.snapshot().iter().any(|((_, owner, _), _)| *owner == 2), "owner 2's lock is remembered");
        let r = core.clone().setlk(here, fh, 3, whole, false, false).await;
        assert_eq!(r, Err(Errno::EAGAIN), "owner 2 holds it");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lock_fop_waits_for_the_releases_noted_before_it() {
        let u = Arc::new(Unlocking::default());
        let (g, other) = (Gfid([1; 16]), Gfid([2; 16]));
        let (first, second) = (u.begin(g), u.begin(g));
        // Another inode is not held up.
        tokio::time::timeout(Duration::from_secs(5), u.settled(other)).await.expect("other inode");
        let waiter = {
            let u = u.clone();
            tokio::spawn(async move { u.settled(g).await })
        };
        tokio::task::yield_now().await;
        drop(first);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one release still on its way");
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("settled").expect("task");
        assert!(u.pending.lock().is_empty());
    }
}
