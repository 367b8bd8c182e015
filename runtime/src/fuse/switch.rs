//! Graph switch: a mount moves from one translator graph to another while
//! it serves (GlusterFS's `fuse_graph_switch`), without failing the I/O
//! in flight.
//!
//! Every fop goes to the *active* graph (`Active`): the bridge reads it
//! through a lock held only long enough to clone an `Arc` and count the
//! fop as in flight on that graph, so a switch is one pointer store and a
//! fop is counted on exactly the graph it runs on.
//!
//! Each active graph knows which of the mount's fds are open on it. A fop
//! on an fd that is not open there yet reopens it first, by gfid, with the
//! same [`xlfs_sdk::FdId`] and `O_*` flags (less O_CREAT, O_EXCL and
//! O_TRUNC), as protocol/client does after a reconnect; FUSE passes the
//! offset with every read and write, so nothing else of the fd needs to
//! move. The inodes' gfids stay valid (same bricks); the new graph's
//! per-inode state starts empty.
//!
//! `Core::switch`, given a new graph that is already up:
//! 1. drains the old graph's delayed work, then reopens every open fd on
//!    the new one while the old graph still serves (a file created on the
//!    old graph meanwhile, answered before it reached the bricks, waits
//!    for step 5);
//! 2. stops the lock fops (getlk/setlk, and flush and release, which drop
//!    locks) at a gate; blocked SETLKW waits on the old graph are told to
//!    let go and wait again afterwards;
//! 3. makes the new graph active (new fops go there from now on);
//! 4. moves the POSIX locks and flocks the mount holds (`HeldLocks`):
//!    unlocks each on the old graph and takes it again on the new one;
//! 5. opens the gate, reopens fds opened on the old graph meanwhile;
//! 6. waits for the old graph's fops in flight to finish (bounded), drains
//!    it again and reopens what they opened (the last pass: until it, a fop
//!    on an fd whose file is not found on the new graph waits for it),
//!    sends Release for every fd open on it, shuts it down and lets it go.
//!
//! Between unlocking on the old graph and locking on the new one another
//! client can take a lock: the lock is then lost, which is logged and
//! counted (GlusterFS moves lock ownership inside the locks translator
//! instead; ours has no such fop yet).
//!

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;
use xlfs_sdk::{CallCtx, Child, Dict, Errno, Fd, FdId, Fop, Gfid, Loc, Reply, Request};

use super::{Core, InFlight};
use crate::graph::Graph;

/// How long a switch waits for the old graph's fops in flight.
pub const DRAIN: Duration = Duration::from_secs(60);

/// Where an fd stands on a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FdState {
    /// Its open, create or opendir is in flight on this graph (a reopen
    /// must not send a second one with the same id).
    Opening,
    /// Open.
    Open,
    /// A reopen failed: EBADF from then on.
    Bad,
}

/// An fd as a graph knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FdOn {
    gfid: Gfid,
    dir: bool,
    state: FdState,
}

/// A graph the mount sends fops to (or did).
pub(crate) struct Active {
    /// Counts up from 1 with each switch.
    pub(crate) generation: u64,
    pub(crate) top: Child,
    /// The graph, when the mount owns it (it shuts it down once retired).
    pub(crate) graph: Option<Arc<Graph>>,
    pub(crate) inflight: InFlight,
    /// The mount's fds open on this graph.
    fds: Mutex<HashMap<u64, FdOn>>,
    /// One reopen at a time.
    reopen: tokio::sync::Mutex<()>,
    /// Set when a switch away from this graph begins.
    retired: watch::Sender<bool>,
    /// Set once the switch to this graph is over (at once for the first):
    /// until then a file created on the old graph may not have reached
    /// the bricks, and a reopen that does not find it is not final.
    settled: watch::Sender<bool>,
}

impl Active {
    pub(crate) fn new(generation: u64, top: Child, graph: Option<Arc<Graph>>) -> Active {
        Active {
            generation,
            top,
            graph,
            inflight: InFlight::default(),
            fds: Mutex::new(HashMap::new()),
            reopen: tokio::sync::Mutex::new(()),
            retired: watch::channel(false).0,
            settled: watch::channel(generation == 1).0,
        }
    }

    fn is_settled(&self) -> bool {
        *self.settled.borrow()
    }

    /// Resolves once the switch to this graph is over (or after `limit`).
    async fn until_settled(&self, limit: Duration) {
        let mut rx = self.settled.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|s| *s)).await;
    }

    /// Resolves once a switch away from this graph has begun.
    pub(crate) async fn retiring(&self) {
        let mut rx = self.retired.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Where the fd stands here (`None`: not known here).
    fn fd_state(&self, id: FdId) -> Option<FdState> {
        self.fds.lock().get(&id.0).map(|f| f.state)
    }

    fn set_fd(&self, id: FdId, f: FdOn) {
        self.fds.lock().insert(id.0, f);
    }
}

/// A fop counted in flight on the graph it runs on.
pub(crate) struct Entered(pub(crate) Arc<Active>);

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.inflight.leave();
    }
}

/// What a switch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchReport {
    /// The new graph's generation.
    pub generation: u64,
    /// Fds reopened on the new graph.
    pub fds_reopened: usize,
    /// Fds whose reopen failed (EBADF from now on).
    pub fds_failed: usize,
    /// Locks taken again on the new graph.
    pub locks_moved: usize,
    /// Locks that could not be taken again (someone else got them).
    pub locks_lost: usize,
    /// How long lock fops were held at the gate.
    pub lock_pause: Duration,
    /// False if the old graph still had fops in flight after [`DRAIN`].
    pub drained: bool,
    /// Fds released on the old graph.
    pub old_fds_released: usize,
    /// The whole switch, from the first reopen to the old graph's end.
    pub took: Duration,
}

impl std::fmt::Display for SwitchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "generation {}: {} fds reopened ({} failed), {} locks moved ({} lost), lock fops paused {:?}, old graph {} \
             ({} fds released), {:?} in all",
            self.generation,
            self.fds_reopened,
            self.fds_failed,
            self.locks_moved,
            self.locks_lost,
            self.lock_pause,
            if self.drained { "drained" } else { "NOT drained in time" },
            self.old_fds_released,
            self.took
        )
    }
}

impl Core {
    /// The active graph, with this fop counted in flight on it.
    pub(crate) fn enter(&self) -> Entered {
        let a = self.active.read();
        a.inflight.begin();
        Entered(a.clone())
    }

    /// The active graph.
    pub(crate) fn current(&self) -> Arc<Active> {
        self.active.read().clone()
    }

    /// Sends one fop to graph `a`, keeping its fd bookkeeping: opens are
    /// recorded, releases of fds not open there are answered at once, and
    /// any other fd is reopened there first if needed.
    pub(crate) async fn call_on(&self, a: &Active, ctx: CallCtx, fop: Fop, xdata: Dict) -> Result<Reply, Errno> {
        let opened = match &fop {
            Fop::Open { loc, fd, .. } => Some((*fd, loc.gfid, false)),
            Fop::Create { loc, fd, .. } => Some((*fd, loc.gfid, false)),
            Fop::Opendir { loc, fd } => Some((*fd, loc.gfid, true)),
            _ => None,
        };
        match &fop {
            Fop::Release { fd } | Fop::Releasedir { fd } => {
                // Under the reopen lock: a reopen racing with this release
                // either came first (and is released here) or finds the fd
                // gone from the table (release removed it first).
                let _one = a.reopen.lock().await;
                match a.fds.lock().remove(&fd.id.0) {
                    Some(FdOn { state: FdState::Open, .. }) => {}
                    _ => return Ok(Reply::Empty),
                }
            }
            Fop::Open { loc, fd, .. } | Fop::Create { loc, fd, .. } | Fop::Opendir { loc, fd } => {
                let dir = matches!(fop, Fop::Opendir { .. });
                a.set_fd(*fd, FdOn { gfid: loc.gfid, dir, state: FdState::Opening });
            }
            _ => {
                for fd in fop.fds() {
                    match self.ensure_open(a, fd, !a.is_settled()).await {
                        // Created on the old graph, maybe not sent yet: once
                        // the switch is over it is there, or never will be.
                        Err(Errno::ENOENT | Errno::ESTALE) if !a.is_settled() => {
                            a.until_settled(DRAIN * 2).await;
                            self.ensure_open(a, fd, false).await?;
                        }
                        r => r?,
                    }
                }
            }
        }
        let r = a.top.call(ctx, Request::with_xdata(fop, xdata)).await.map(|r| r.reply);
        match (opened, &r) {
            (Some((id, gfid, dir)), Ok(reply)) => {
                let gfid = match reply {
                    Reply::Entry { iatt, .. } if gfid.is_null() => iatt.gfid,
                    _ => gfid,
                };
                a.set_fd(id, FdOn { gfid, dir, state: FdState::Open });
            }
            (Some((id, ..)), Err(_)) => {
                a.fds.lock().remove(&id.0);
            }
            _ => {}
        }
        r
    }

    /// Opens `fd` on graph `a` if it is open in the mount but not there.
    /// `early`: the old graph still serves, so a file just created there
    /// may not have reached the bricks yet (replicate's async-dirops):
    /// ENOENT leaves the fd for the pass after the old graph is drained
    /// instead of failing it for good.
    async fn ensure_open(&self, a: &Active, fd: Fd, early: bool) -> Result<(), Errno> {
        let known = |a: &Active| match a.fd_state(fd.id) {
            // An fd is used only once its open returned; a reopen pass
            // leaves an open in flight alone.
            Some(FdState::Open | FdState::Opening) => Some(Ok(())),
            Some(FdState::Bad) => Some(Err(Errno::EBADF)),
            None => None,
        };
        if let Some(r) = known(a) {
            return r;
        }
        let _one = a.reopen.lock().await;
        if let Some(r) = known(a) {
            return r;
        }
        // Not (or no longer) open in the mount: nothing to reopen.
        let Some(e) = self.fds.get(fd.id) else { return Err(Errno::EBADF) };
        let gfid = if e.gfid.is_null() { fd.gfid } else { e.gfid };
        if gfid.is_null() {
            return Err(Errno::EBADF);
        }
        let no_create = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32;
        let fop = match e.is_dir {
            true => Fop::Opendir { loc: Loc::gfid(gfid), fd: fd.id },
            false => Fop::Open { loc: Loc::gfid(gfid), flags: e.flags & !no_create, fd: fd.id },
        };
        let ctx = CallCtx::root(self.client_id.clone());
        match a.top.call(ctx, Request::new(fop)).await {
            Ok(_) => {
                tracing::debug!(fd = fd.id.0, %gfid, generation = a.generation, "fd reopened on the new graph");
                a.set_fd(fd.id, FdOn { gfid, dir: e.is_dir, state: FdState::Open });
                Ok(())
            }
            // The graph lost its bricks for now: the fd may reopen later.
            Err(Errno::ENOTCONN) => Err(Errno::ENOTCONN),
            Err(err @ (Errno::ENOENT | Errno::ESTALE)) if early => {
                tracing::debug!(fd = fd.id.0, %gfid, generation = a.generation, error = %err,
                    "fd not reopened yet: its file may still be on its way to the bricks");
                Err(err)
            }
            Err(err) => {
                tracing::warn!(fd = fd.id.0, %gfid, generation = a.generation, error = %err,
                    "fd could not be reopened on the new graph: EBADF from now on");
                a.set_fd(fd.id, FdOn { gfid, dir: e.is_dir, state: FdState::Bad });
                Err(Errno::EBADF)
            }
        }
    }

    /// Reopens on `a` every fd the mount has open that is not open there
    /// (`early`: see [`Core::ensure_open`]); returns (reopened, failed).
    async fn reopen_all(&self, a: &Active, early: bool) -> (usize, usize) {
        let (mut ok, mut failed) = (0, 0);
        for (id, e) in self.fds.entries() {
            if e.gfid.is_null() || a.fd_state(id).is_some() {
                continue;
            }
            match self.ensure_open(a, Fd { id, gfid: e.gfid }, early).await {
                Ok(()) => ok += 1,
                // Released meanwhile, or left for the next pass.
                Err(_) if self.fds.get(id).is_none() => {}
                Err(Errno::ENOENT | Errno::ESTALE) if early => {}
                Err(_) => failed += 1,
            }
        }
        (ok, failed)
    }

    /// Moves the mount to `top` (an active graph that is up; `graph` if the
    /// mount is to own it and shut it down once it is replaced) as the
    /// module documentation says.
    pub(crate) async fn switch(self: &Arc<Self>, top: Child, graph: Option<Arc<Graph>>) -> SwitchReport {
        let started = Instant::now();
        let old = self.current();
        let upcalls = graph.as_ref().map(|g| g.upcalls());
        let new = Arc::new(Active::new(old.generation + 1, top, graph));
        let mut report = SwitchReport { generation: new.generation, ..SwitchReport::default() };

        // Work the old graph delayed (queued writes, directory operations
        // answered early) reaches the bricks before the fds move.
        if !crate::graph::drain(&old.top, DRAIN).await {
            tracing::warn!(generation = old.generation, "the old graph's delayed work is not done after {DRAIN:?}");
        }
        let (ok, failed) = self.reopen_all(&new, true).await;
        old.retired.send_replace(true);
        let gate = self.lk_gate.write().await;
        let paused = Instant::now();
        *self.active.write() = new.clone();
        if let Some(rx) = upcalls {
            self.watch_upcalls(&new, rx);
        }
        let (moved, lost) = self.move_locks(&old, &new).await;
        drop(gate);
        report.lock_pause = paused.elapsed();
        // And what it delayed since, before the fds opened meanwhile move.
        crate::graph::drain(&old.top, DRAIN).await;
        let (ok2, failed2) = self.reopen_all(&new, true).await;
        (report.locks_moved, report.locks_lost) = (moved, lost);

        report.drained = old.inflight.drained(DRAIN).await;
        if !report.drained {
            tracing::warn!(
                left = old.inflight.count.load(Ordering::Acquire),
                generation = old.generation,
                "the old graph still has fops in flight after {DRAIN:?}; shutting it down anyway"
            );
        }
        // Creates still in flight on the old graph until now: their delayed
        // work too, then the last pass, which decides.
        crate::graph::drain(&old.top, DRAIN).await;
        let (ok3, failed3) = self.reopen_all(&new, false).await;
        new.settled.send_replace(true);
        (report.fds_reopened, report.fds_failed) = (ok + ok2 + ok3, failed + failed2 + failed3);
        let open: Vec<(u64, FdOn)> = old.fds.lock().drain().filter(|(_, f)| f.state == FdState::Open).collect();
        for (id, f) in open {
            let fd = Fd { id: FdId(id), gfid: f.gfid };
            let fop = if f.dir { Fop::Releasedir { fd } } else { Fop::Release { fd } };
            match old.top.call(CallCtx::root(self.client_id.clone()), Request::new(fop)).await {
                Ok(_) => report.old_fds_released += 1,
                Err(e) => tracing::debug!(fd = id, error = %e, "release on the old graph"),
            }
        }
        if let Some(g) = old.graph.clone() {
            let _ = tokio::task::spawn_blocking(move || g.shutdown()).await;
        }
        report.took = started.elapsed();
        tracing::info!(from = old.generation, "graph switched: {report}");
        report
    }

    /// Forwards `a`'s upcalls to the kernel until it is retired.
    pub(crate) fn watch_upcalls(
        self: &Arc<Self>,
        a: &Arc<Active>,
        rx: tokio::sync::broadcast::Receiver<xlfs_sdk::Upcall>,
    ) {
        let Some(ended) = self.ended.get().cloned() else { return };
        let weak_core = Arc::downgrade(self);
        // A receiver, not the graph: the task must not keep it alive.
        let mut retired = a.retired.subscribe();
        self.rt.spawn(async move {
            tokio::select! {
                () = super::upcall::watch(weak_core, rx, ended) => {}
                _ = retired.wait_for(|r| *r) => {}
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use fuser::FileHandle;
    use tokio::sync::Notify;
    use xlfs_sdk::{FopFuture, Iatt, LkCmd, Response, Xlator};

    use super::super::locks::FuseLock;
    use super::super::{Caller, MountOptions};
    use super::*;

    /// A graph top that logs every fop as "NAME:what"; reads wait for
    /// `release_reads` when `slow_reads`, SETLKW never returns when
    /// `block_lkw`.
    struct Rec {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
        slow_reads: bool,
        release_reads: Arc<Notify>,
        block_lkw: bool,
    }

    impl Xlator for Rec {
        fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
            let what = match &req.fop {
                Fop::Open { flags, fd, .. } => format!("open fd{} trunc={}", fd.0, flags & libc::O_TRUNC as u32 != 0),
                Fop::Lk { cmd, lock, fd } => {
                    format!("lk fd{} {cmd:?} {:?} {}+{} owner {}", fd.id.0, lock.ty, lock.start, lock.len, ctx.lk_owner)
                }
                Fop::Readv { fd, .. } => format!("read fd{}", fd.id.0),
                Fop::Release { fd } => format!("release fd{}", fd.id.0),
                f => format!("{:?}", f.kind()),
            };
            self.log.lock().push(format!("{}:{what}", self.name));
            Box::pin(async move {
                match req.fop {
                    Fop::Readv { .. } => {
                        if self.slow_reads {
                            self.release_reads.notified().await;
                        }
                        let data = Bytes::from(self.name.as_bytes().to_vec());
                        Ok(Response::from(Reply::Read { data, iatt: Iatt::default() }))
                    }
                    Fop::Lk { cmd: LkCmd::SetLkw, .. } if self.block_lkw => std::future::pending().await,
                    _ => Ok(Response::from(Reply::Empty)),
                }
            })
        }
    }

    fn top(
        name: &'static str,
        log: &Arc<Mutex<Vec<String>>>,
        slow: &Arc<Notify>,
        slow_reads: bool,
        block_lkw: bool,
    ) -> Child {
        let xl = Rec { name, log: log.clone(), slow_reads, release_reads: slow.clone(), block_lkw };
        Child { name: Arc::from(name), xl: Arc::new(xl) }
    }

    fn lines(log: &Arc<Mutex<Vec<String>>>, prefix: &str) -> Vec<String> {
        log.lock().iter().filter(|l| l.starts_with(prefix)).cloned().collect()
    }

    const WHO: Caller = Caller { uid: 0, gid: 0, pid: 0 };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fds_and_locks_move_and_the_old_graph_drains() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let slow = Arc::new(Notify::new());
        let a = Arc::new(Active::new(1, top("A", &log, &slow, true, true), None));
        let core =
            Arc::new(Core::new(a.clone(), tokio::runtime::Handle::current(), MountOptions::default(), Arc::from("c")));
        let gfid = Gfid([9; 16]);
        let flags = (libc::O_RDWR | libc::O_TRUNC) as u32;
        let id = core.new_fd(gfid, flags, false).expect("fd");
        core.call(CallCtx::root("c"), Fop::Open { loc: Loc::gfid(gfid), flags, fd: id }).await.expect("open");
        let fh = FileHandle(id.0);
        let lk = FuseLock { start: 0, end: 99, typ: libc::F_WRLCK, pid: 0 };
        core.clone().setlk(WHO, fh, 42, lk, false, false).await.expect("lock");
        // A SETLKW waiting on A, and a read in flight on A.
        let waiter =
            tokio::spawn(core.clone().setlk(WHO, fh, 43, FuseLock { start: 200, end: 299, ..lk }, true, false));
        let read = tokio::spawn(core.clone().read(WHO, 0, fh, 0, 10));
        while lines(&log, "A:read").is_empty() || lines(&log, "A:lk fd1 SetLkw").is_empty() {
            tokio::task::yield_now().await;
        }

        let switch = tokio::spawn({
            let (c, t) = (core.clone(), top("B", &log, &slow, false, false));
            async move { c.switch(t, None).await }
        });
        // The waiting lock moves to B and is granted there.
        waiter.await.expect("join").expect("granted on B");
        assert_eq!(core.current().generation, 2);
        // New fops go to B while A drains.
        let got = core.clone().read(WHO, 0, fh, 0, 10).await.expect("read on B");
        assert_eq!(&got[..], b"B");
        assert!(!switch.is_finished(), "A still has a read in flight");
        slow.notify_waiters();
        assert_eq!(&read.await.expect("join").expect("the read in flight finishes on A")[..], b"A");
        let report = switch.await.expect("join");
        assert!(report.drained, "{report}");
        assert_eq!(
            (report.fds_reopened, report.locks_moved, report.locks_lost, report.old_fds_released),
            (1, 1, 0, 1),
            "{report}"
        );

        let b = lines(&log, "B:");
        assert_eq!(b[0], "B:open fd1 trunc=false", "reopened without O_TRUNC first: {b:?}");
        assert!(b.contains(&"B:lk fd1 SetLk Write 0+100 owner 42".to_string()), "{b:?}");
        assert!(b.contains(&"B:lk fd1 SetLkw Write 200+100 owner 43".to_string()), "{b:?}");
        let a_log = lines(&log, "A:");
        assert!(a_log.contains(&"A:lk fd1 SetLk Unlock 0+0 owner 42".to_string()), "{a_log:?}");
        assert_eq!(a_log.last().map(String::as_str), Some("A:release fd1"), "{a_log:?}");
        assert_eq!(core.held.len(), 2);

        // The old graph is no longer used by anything.
        drop(a);
        // Close: flush drops owner 42's locks, release the fd's.
        core.clone().flush(WHO, fh, 42).await.expect("flush");
        assert_eq!(core.held.len(), 1);
        core.clone().release(WHO, fh, None, false).await.expect("release");
        assert_eq!(core.held.len(), 0);
        assert_eq!(lines(&log, "B:").last().map(String::as_str), Some("B:release fd1"));
        // A second switch has nothing to move.
        let report = core.switch(top("C", &log, &slow, false, false), None).await;
        assert_eq!(
            (report.generation, report.fds_reopened, report.locks_moved, report.old_fds_released),
            (3, 0, 0, 0),
            "{report}"
        );
    }
}
