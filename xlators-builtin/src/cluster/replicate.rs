//! cluster/replicate: synchronous replication over its children (GlusterFS's
//! AFR, "automatic file replication").
//!
//! Every modifying fop runs as a transaction on all children that are up
//! (`transaction`): AFR's own lock (domain: this volume's name), a pre-op
//! raising the inode's dirty counter (`trusted.afr.dirty`, `pending`), the
//! fop, a post-op lowering it and raising the pending counters of the
//! children that failed (`trusted.afr.<child>` xattrs), and the unlock. Data transactions keep
//! the lock and delay the post-op between back-to-back writes
//! (`eager_lock`); a lock-contention policy
//! ([`xlfs_sdk::policy::lock_contention`]) decides when another client's
//! need ends that. Reads go to one good child and fail over (`read`);
//! client quorum refuses modifying fops when too few children are up
//! (`quorum`). Fds are opened on every child under the same id (`fds`).
//!
//! Up and down: AFR follows each child's ChildUp / ChildDown, says ChildUp
//! to its parents once every child has said up or down and one is up (or
//! `UP_GRACE`, 2 s, after the children up made a quorum, for a child that says
//! nothing) and ChildDown when none is.
//! A contention upcall for one of its eager locks is consumed here.
//!
//! Self-heal (`heal`): a lookup that finds a copy stale starts a
//! background heal of the inode (data-, metadata-, entry-self-heal); the
//! heal daemon (`xlfs heal`) heals what the bricks' indices
//! (features/index) list through virtual xattrs on the root, and resolves
//! split-brains by policy. The keys and their values:
//! - setxattr on the root `xlfs.heal.run` = `index` | `full`: heal what the
//!   indices list, or crawl the whole tree;
//! - setxattr on the root `xlfs.heal.gfid` = `<gfid>`: heal one inode;
//! - both reply with xdata `xlfs.heal.healed`, `xlfs.heal.failed`,
//!   `xlfs.heal.split-brain`, `xlfs.heal.remaining` (decimal strings) and
//!   `xlfs.heal.report` (lines `<gfid> failed <ERRNO>` or
//!   `<gfid> split-brain <kinds>`);
//! - getxattr on the root `xlfs.heal.info`: lines `child <name> up <n>` or
//!   `child <name> down`, each followed by `  <gfid> <kinds|->` lines,
//!   with ` split-brain <kinds>` appended where no copy can be trusted, or
//!   `  <gfid> gone`;
//! - setxattr on an inode `xlfs.split-brain.resolve` = `bigger-file` |
//!   `latest-mtime` | `source-brick:<child>`: heal it choosing that source;
//!   reply xdata as above plus `xlfs.heal.result` (`resolved`,
//!   `not in split-brain`, `unresolved: ...`).
//!
//! Data reads of a file in data split-brain, and metadata reads of an
//! inode in metadata split-brain, fail with EIO; lookup still works.
//!
//! `dump()` counts the lock and xattrop fops AFR itself sent, the eager-lock
//! windows opened and why they ended, settles, upcalls and read failovers.

mod async_dirops;
pub use async_dirops::IN_FLIGHT as ASYNC_DIROPS_IN_FLIGHT;
mod eager_lock;
mod entry_lock;
mod fds;
mod group_commit;
pub mod heal;
mod lock;
mod options;
pub mod pending;
pub mod quorum;
mod read;
mod transaction;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use xlfs_sdk::policy::Policies;
use xlfs_sdk::policy::lock_contention::{self, LockContentionPolicy};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, EntrylkCmd, Errno, Event, EventFrom, Fd, Fop, FopFlags, FopFuture, FopKind, FopResult, InitCtx,
    InitError, LkCmd, LockType, OptType, OptionDecl, Options, Reply, Request, Response, Upcall, Xlator, XlatorType,
};

use self::eager_lock::{Inodes, Why};
use self::fds::{FdCtx, Fds};
use self::options::*;
use self::pending::{Kind, Mask, all, bit, members};
use self::quorum::Quorum;
use self::read::ReadStats;

// The request xdata key asking storage/posix for the number of fds open
// on the inode (for the fd-count policy).

/// Most children AFR takes.
pub const MAX_CHILDREN: usize = 64;

/// How long the volume waits for a child it has not heard from once the
/// children up make a quorum, before it says up without it (see `notify`).
const UP_GRACE: Duration = Duration::from_secs(2);

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "cluster/replicate",
    description: "synchronous replication (AFR): transactions with pending counters, eager lock, quorum, read-child choice",
    options: OPTIONS,
    min_children: 1,
    max_children: MAX_CHILDREN,
    build,
};

/// Counters for dump().
#[derive(Default)]
struct Stats {
    /// Lock and changelog fops AFR sent, by [`COUNTED`] position.
    sent: [AtomicU64; 6],
    windows: AtomicU64,
    settles: AtomicU64,
    upcalls: AtomicU64,
    failovers: AtomicU64,
    /// Windows ended, by [`Why`] position.
    released: [AtomicU64; 5],
}

/// The fops AFR counts when it sends them itself.
const COUNTED: [FopKind; 6] =
    [FopKind::Inodelk, FopKind::Finodelk, FopKind::Entrylk, FopKind::Fentrylk, FopKind::Xattrop, FopKind::Fxattrop];

const WHY: [(Why, &str); 5] = [
    (Why::Policy, "policy"),
    (Why::Idle, "idle"),
    (Why::Failure, "failure"),
    (Why::Close, "close"),
    (Why::Shutdown, "shutdown"),
];

impl Stats {
    fn released(&self, why: Why) {
        if let Some(p) = WHY.iter().position(|(w, _)| *w == why) {
            self.released[p].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The translator's shared state (tasks for timers and background
/// releases hold an `Arc` of it).
pub(crate) struct Inner {
    /// This volume's name: the lock domain.
    name: String,
    children: Vec<Child>,
    /// The graph's policy loaders, for a policy named on reconfigure.
    policies: Policies,
    /// `trusted.afr.<name i>` per child.
    keys: Vec<String>,
    pending_names: Vec<String>,
    volume_id: Option<String>,
    cfg: RwLock<Arc<Config>>,
    up: AtomicU64,
    /// Children that have said up or down at least once, whether this
    /// volume told its parents it is up, and whether the wait for the
    /// children not heard from started (see `notify`).
    announce: Mutex<(Mask, bool, bool)>,
    local: AtomicU64,
    /// Bumped whenever a child comes up: staleness learned before is
    /// looked up again.
    generation: AtomicU64,
    /// Child-down events seen (from then on a copy may miss changes), and
    /// the last of them after which every child's heal index was found
    /// empty: the volume may need heal while the second is behind (see
    /// [`Inner::need_heal`]).
    down_epoch: AtomicU64,
    clean_epoch: AtomicU64,
    inodes: Inodes,
    /// Directory delegations (`entry_lock`).
    dirs: entry_lock::Dirs,
    /// Entry fops answered early (`async_dirops`).
    early: async_dirops::AsyncDirops,
    /// To send upcalls to the parents.
    events: xlfs_sdk::EventSink,
    /// Shared syncfs per child for `ensure-durability` (`group_commit`).
    group_commit: group_commit::GroupCommit,
    fds: Fds,
    owner_base: u64,
    next_owner: AtomicU64,
    stats: Stats,
    reads: Vec<ReadStats>,
    rt: OnceLock<tokio::runtime::Handle>,
    heal: heal::HealState,
    /// Blames no copy holding the change could be told of yet (see
    /// [`transaction::Deferred`]), written when a child comes back.
    deferred: parking_lot::Mutex<Vec<transaction::Deferred>>,
}

impl Inner {
    fn cfg(&self) -> Arc<Config> {
        self.cfg.read().clone()
    }

    /// The children up now.
    fn up_mask(&self) -> Mask {
        self.up.load(Ordering::Acquire)
    }

    /// Says up to the parents, [`UP_GRACE`] after the children up made a
    /// quorum, if they still do and it was not said yet (a child was not
    /// heard from).
    fn announce_up_after_grace(&self) {
        let mut a = self.announce.lock();
        let up = self.up_mask();
        if a.1 || up == 0 || !self.cfg().quorum.met(up, self.children.len()) {
            a.2 = false;
            return;
        }
        a.1 = true;
        drop(a);
        tracing::warn!(volume = %self.name, up = up, "up without hearing from every child");
        self.events.send(Event::ChildUp);
    }

    /// The runtime to run background work on.
    fn handle(&self) -> Option<tokio::runtime::Handle> {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                let _ = self.rt.set(h.clone());
                Some(h)
            }
            Err(_) => self.rt.get().cloned(),
        }
    }

    /// Sends AFR's own fop to child `i`, counting lock and xattrop fops.
    fn wind(&self, i: usize, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let kind = req.fop.kind();
        if let Some(p) = COUNTED.iter().position(|k| *k == kind) {
            self.stats.sent[p].fetch_add(1, Ordering::Relaxed);
        }
        self.children[i].call(ctx, req)
    }

    /// Runs a fop to completion even if the caller stops waiting: a
    /// transaction dropped halfway would leave brick locks held and
    /// counters unsettled. It is polled in the caller's own task (a task
    /// of its own cost a spawn and two thread hand-offs on every write and
    /// fsync), and only what a dropped caller left is spawned.
    fn detached(self: Arc<Self>, ctx: CallCtx, req: Request) -> impl Future<Output = FopResult> + Send + 'static {
        let rt = self.handle();
        crate::task::run_to_end(rt, async move { self.dispatch(ctx, req).await })
    }

    async fn dispatch(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let whole = (0, u64::MAX);
        if heal::is_control(&req.fop) {
            return self.control(&ctx, &req).await;
        }
        if let Fop::Setattr { .. } = &req.fop
            && let Some(r) = self.try_early_setattr(&ctx, &req).await
        {
            return r;
        }
        if !is_entry_fop(&req.fop) {
            self.after_early(&req).await?;
        }
        match &req.fop {
            Fop::Ipc { op } if *op == xlfs_sdk::IPC_DRAIN => Ok(Reply::Empty.into()),
            Fop::Lookup { loc } => {
                let loc = loc.clone();
                let mut r = self.lookup(&ctx, loc, req.xdata).await;
                self.show_early_setattrs(&mut r);
                r
            }
            Fop::Stat { .. } | Fop::Fstat { .. } | Fop::Readv { .. } | Fop::Seek { .. } | Fop::Rchecksum { .. } => {
                self.read(&ctx, req, Kind::Data).await
            }
            Fop::Access { .. }
            | Fop::Readlink { .. }
            | Fop::Getxattr { .. }
            | Fop::Fgetxattr { .. }
            | Fop::Statfs { .. } => self.read(&ctx, req, Kind::Metadata).await,
            Fop::Readdir { .. } | Fop::Readdirp { .. } => {
                let mut r = self.readdir(&ctx, req).await;
                self.show_early_setattrs(&mut r);
                r
            }
            Fop::Open { .. } => self.open(&ctx, req, false).await,
            Fop::Opendir { .. } => self.open(&ctx, req, true).await,
            Fop::Create { loc, .. }
            | Fop::Mknod { loc, .. }
            | Fop::Mkdir { loc, .. }
            | Fop::Symlink { loc, .. }
            | Fop::Unlink { loc, .. } => {
                let names = vec![entry_of(loc)?];
                self.entry_txn(&ctx, names, None, req).await
            }
            Fop::Rmdir { loc, .. } => {
                let (names, dir) = (vec![entry_of(loc)?], Some(loc.gfid));
                self.entry_txn(&ctx, names, dir, req).await
            }
            Fop::Link { new, .. } => {
                let names = vec![entry_of(new)?];
                self.entry_txn(&ctx, names, None, req).await
            }
            Fop::Rename { old, new, .. } => {
                let names = vec![entry_of(old)?, entry_of(new)?];
                self.entry_txn(&ctx, names, None, req).await
            }
            Fop::Writev { fd, data, offset, .. } => {
                let end = offset.saturating_add((data.len() as u64).max(1) - 1);
                let (fd, range) = (*fd, (*offset, end));
                self.data_txn(&ctx, fd.gfid, Some(fd), range, req).await
            }
            Fop::CopyFileRange { fd_out, off_out, len, .. } => {
                let (fd, range) = (*fd_out, (*off_out, off_out.saturating_add((*len).max(1) - 1)));
                self.data_txn(&ctx, fd.gfid, Some(fd), range, req).await
            }
            Fop::Truncate { loc, .. } => {
                let g = loc.gfid;
                self.data_txn(&ctx, g, None, whole, req).await
            }
            Fop::Ftruncate { fd, .. }
            | Fop::Fallocate { fd, .. }
            | Fop::Discard { fd, .. }
            | Fop::Zerofill { fd, .. } => {
                let fd = *fd;
                self.data_txn(&ctx, fd.gfid, Some(fd), whole, req).await
            }
            Fop::Setattr { .. }
            | Fop::Setxattr { .. }
            | Fop::Removexattr { .. }
            | Fop::Xattrop { .. }
            | Fop::Fsetattr { .. }
            | Fop::Fsetxattr { .. }
            | Fop::Fremovexattr { .. }
            | Fop::Fxattrop { .. } => {
                let (g, fd) = (req.fop.gfid(), req.fop.fd().copied());
                let r = self.inode_txn(&ctx, Kind::Metadata, g, fd, req).await;
                if let Ok(Response { reply: Reply::PrePost { post, .. }, .. }) = &r {
                    self.note_dir_attr(g, post);
                }
                r
            }
            Fop::Fsync { fd, .. } => {
                let fd = *fd;
                self.fsync(&ctx, fd, req).await
            }
            Fop::Flush { fd } => {
                let fd = *fd;
                self.settle(fd.gfid, 0, None).await;
                // On the bricks flush only drops the caller's POSIX locks
                // (features/locks): without any, it has nothing to do there.
                let locked = self.inodes.get(&fd.gfid).is_none_or(|st| st.s.lock().posix_locked);
                if !locked && self.fds.get(fd.id).is_some() {
                    return Ok(Reply::Empty.into());
                }
                self.on_fd(&ctx, fd, req).await
            }
            Fop::Fsyncdir { fd, .. } => {
                // Every child, opening the directory where it is not yet.
                let targets = self.fd_targets(&ctx, fd, self.up_mask()).await;
                transaction::evaluate(self.fan(&ctx, targets, &req).await).result
            }
            Fop::Lk { .. }
            | Fop::Inodelk { .. }
            | Fop::Finodelk { .. }
            | Fop::Entrylk { .. }
            | Fop::Fentrylk { .. } => self.caller_lock(&ctx, req).await,
            Fop::Lease { .. } | Fop::Ipc { .. } => match members(self.up_mask()).next() {
                Some(i) => self.children[i].call(ctx, req).await,
                None => Err(Errno::ENOTCONN),
            },
            Fop::Release { fd } | Fop::Releasedir { fd } => {
                let fd = *fd;
                self.release(&ctx, fd, req).await
            }
            Fop::Forget { gfid } => {
                let g = *gfid;
                self.fan(&ctx, all(self.children.len()), &req).await;
                self.inodes.forget(&g);
                Ok(Reply::Empty.into())
            }
        }
    }

    /// Open or opendir on every child up. A writable open with O_TRUNC is
    /// an open without it, then a truncation to 0 as a data transaction (as
    /// GlusterFS's AFR does): quorum is checked and a child that missed it
    /// is blamed and healed, where a truncating open sent to the children
    /// up left a down child's old data standing for good.
    async fn open(self: &Arc<Self>, ctx: &CallCtx, mut req: Request, dir: bool) -> FopResult {
        let (id, flags, gfid) = match &req.fop {
            Fop::Open { loc, flags, fd } => (*fd, *flags, loc.gfid),
            Fop::Opendir { loc, fd } => (*fd, 0, loc.gfid),
            _ => return Err(Errno::EINVAL),
        };
        let gfid = self.resolve_gfid(ctx, gfid, &req).await?;
        let trunc = flags & libc::O_TRUNC as u32 != 0 && flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
        match &mut req.fop {
            Fop::Open { loc, flags, .. } => {
                loc.gfid = gfid;
                if trunc {
                    *flags &= !(libc::O_TRUNC as u32);
                }
            }
            Fop::Opendir { loc, .. } => loc.gfid = gfid,
            _ => {}
        }
        let up = self.up_mask();
        if up == 0 {
            return Err(Errno::ENOTCONN);
        }
        let out = if dir {
            self.open_dir(ctx, gfid, up, &req).await
        } else {
            transaction::evaluate(self.fan(ctx, up, &req).await)
        };
        if out.ok != 0 {
            let f = FdCtx { gfid, flags, dir, opened: out.ok, readdir_child: None };
            if let Err(e) = self.fds.insert(id, f) {
                tracing::warn!(volume = %self.name, "fd table full");
                let fd = Fd { id, gfid };
                let rel = if dir { Fop::Releasedir { fd } } else { Fop::Release { fd } };
                self.fan(ctx, out.ok, &Request::new(rel)).await;
                return Err(e);
            }
            if !dir {
                self.fd_opened_on(gfid);
            }
            if trunc && out.result.is_ok() {
                let fd = Fd { id, gfid };
                let truncate = Request::new(Fop::Ftruncate { fd, offset: 0 });
                if let Err(e) = self.data_txn(ctx, gfid, Some(fd), (0, u64::MAX), truncate).await {
                    self.release(ctx, fd, Request::new(Fop::Release { fd })).await?;
                    return Err(e);
                }
            }
        }
        out.result
    }

    /// A fop sent to every child the fd is open on (flush).
    async fn on_fd(self: &Arc<Self>, ctx: &CallCtx, fd: Fd, req: Request) -> FopResult {
        let targets = self.fd_opened(&fd) & self.up_mask();
        transaction::evaluate(self.fan(ctx, targets, &req).await).result
    }

    /// fsync on every child holding the fd. When it succeeded on all of
    /// them the eager-lock window stays open (see `eager_lock`); when it
    /// failed somewhere the window is settled, blaming the failed children,
    /// before fsync answers.
    async fn fsync(self: &Arc<Self>, ctx: &CallCtx, fd: Fd, req: Request) -> FopResult {
        let targets = self.fd_targets(ctx, &fd, self.up_mask()).await;
        let mark = self.write_mark(fd.gfid);
        let out = transaction::evaluate(self.fan(ctx, targets, &req).await);
        if out.ok != 0 && out.failed == 0 && out.ok == all(self.children.len()) {
            self.note_synced(fd.gfid, mark);
            return out.result;
        }
        let synced = (out.ok != 0 && out.failed == 0).then_some(mark);
        let in_window = self.settle(fd.gfid, out.failed, synced).await;
        if out.failed != 0 && !in_window {
            self.blame(ctx, fd.gfid, Kind::Data, out.ok, out.failed).await;
        }
        out.result
    }

    async fn release(self: &Arc<Self>, ctx: &CallCtx, fd: Fd, req: Request) -> FopResult {
        let known = self.fds.remove(fd.id);
        let targets = known.as_ref().map_or(all(self.children.len()), |f| f.opened);
        self.fan(ctx, targets, &req).await;
        if let Some(f) = known
            && !f.dir
        {
            self.fd_closed_on(f.gfid, fd);
        }
        Ok(Reply::Empty.into())
    }

    /// The caller's own locks (lk, inodelk, entrylk): taken on every child
    /// one after the other in child order (so callers cannot deadlock on
    /// a partial set), given back if one child refuses; unlocks go to all.
    async fn caller_lock(self: &Arc<Self>, ctx: &CallCtx, req: Request) -> FopResult {
        if let Fop::Lk { fd, .. } = &req.fop
            && let Some(st) = self.inodes.get_or_insert(fd.gfid)
        {
            st.s.lock().posix_locked = true;
        }
        let up = self.up_mask();
        let targets = match req.fop.fd() {
            Some(fd) => self.fd_targets(ctx, fd, up).await,
            None => up,
        };
        if targets == 0 {
            return Err(Errno::ENOTCONN);
        }
        if let Fop::Lk { cmd: LkCmd::GetLk, .. } = req.fop {
            return self.read(ctx, req, Kind::Data).await;
        }
        let Some(undo) = unlock_of(&req.fop) else {
            return transaction::evaluate(self.fan(ctx, targets, &req).await).result;
        };
        // The same xdata: an undone flock is unlocked in the flock space.
        let undo = Request::with_xdata(undo, req.xdata.clone());
        let mut undo = Undo { inner: self.clone(), ctx: ctx.clone(), req: Some(undo), got: 0 };
        let mut first: Option<Response> = None;
        for i in members(targets) {
            match self.children[i].call(ctx.clone(), req.clone()).await {
                Ok(r) => {
                    undo.got |= bit(i);
                    first.get_or_insert(r);
                }
                Err(Errno::ENOTCONN) => {}
                Err(e) => return Err(e),
            }
        }
        undo.req = None;
        first.ok_or(Errno::ENOTCONN)
    }
}

/// Fops that change state AFR or the bricks must see through: everything
/// but lookups, reads and the caller's own locks (whose waits must stay
/// cancellable; see [`Inner::caller_lock`]).
fn runs_detached(kind: FopKind) -> bool {
    use FopKind::*;
    !(kind.flags().contains(FopFlags::READ_ONLY)
        || matches!(kind, Lk | Inodelk | Finodelk | Entrylk | Fentrylk | Lease | Ipc))
}

/// Gives back the caller's locks taken so far if the caller stops waiting
/// before all children granted theirs.
struct Undo {
    inner: Arc<Inner>,
    ctx: CallCtx,
    req: Option<Request>,
    got: Mask,
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let (Some(req), true) = (self.req.take(), self.got != 0)
            && let Some(h) = self.inner.handle()
        {
            let (me, ctx, got) = (self.inner.clone(), self.ctx.clone(), self.got);
            h.spawn(async move {
                me.fan(&ctx, got, &req).await;
            });
        }
    }
}

/// The unlock that undoes a lock request (None when `fop` is itself an
/// unlock).
fn unlock_of(fop: &Fop) -> Option<Fop> {
    let mut f = fop.clone();
    match &mut f {
        Fop::Lk { cmd, lock, .. } | Fop::Inodelk { cmd, lock, .. } | Fop::Finodelk { cmd, lock, .. } => {
            if lock.ty == LockType::Unlock {
                return None;
            }
            *cmd = LkCmd::SetLk;
            lock.ty = LockType::Unlock;
        }
        Fop::Entrylk { cmd, .. } | Fop::Fentrylk { cmd, .. } => {
            if *cmd == EntrylkCmd::Unlock {
                return None;
            }
            *cmd = EntrylkCmd::Unlock;
        }
        _ => return None,
    }
    Some(f)
}

/// Fops that add, remove or rename names (run as entry transactions).
fn is_entry_fop(fop: &Fop) -> bool {
    matches!(
        fop,
        Fop::Create { .. }
            | Fop::Mknod { .. }
            | Fop::Mkdir { .. }
            | Fop::Symlink { .. }
            | Fop::Link { .. }
            | Fop::Unlink { .. }
            | Fop::Rmdir { .. }
            | Fop::Rename { .. }
    )
}

fn entry_of(loc: &xlfs_sdk::Loc) -> Result<(xlfs_sdk::Gfid, String), Errno> {
    if loc.is_entry() { Ok((loc.parent, loc.name.clone())) } else { Err(Errno::EINVAL) }
}

/// Runs futures concurrently, returning their outputs in order.
pub(crate) async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending { Poll::Pending } else { Poll::Ready(out.iter_mut().filter_map(Option::take).collect()) }
    })
    .await
}

/// The translator: an `Arc` of its state, so timers can outlive a call.
pub struct Replicate {
    inner: Arc<Inner>,
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    Ok(Arc::new(Replicate::new(init)?))
}

impl Replicate {
    /// Builds the translator from its init context.
    pub fn new(init: InitCtx) -> Result<Replicate, InitError> {
        let InitCtx { name, options, children, events, policies } = init;
        let err = |m: String| InitError::new(format!("{name}: {m}"));
        if children.is_empty() || children.len() > MAX_CHILDREN {
            return Err(err(format!("cluster/replicate takes 1 to {MAX_CHILDREN} subvolumes, got {}", children.len())));
        }
        let cfg = Config::from_options(&options, &children, &policies).map_err(err)?;
        let bg = cfg.bg_count;
        let names = pending_names(&options, &children).map_err(err)?;
        let mut base = [0u8; 8];
        base.copy_from_slice(&xlfs_sdk::Gfid::random().0[..8]);
        let n = children.len();
        let inner = Inner {
            keys: names.iter().map(|s| pending::key(s)).collect(),
            pending_names: names,
            volume_id: VOLUME_ID.given(&options).map(str::to_string),
            cfg: RwLock::new(Arc::new(cfg)),
            up: AtomicU64::new(0),
            announce: Mutex::new((0, false, false)),
            local: AtomicU64::new(0),
            generation: AtomicU64::new(1),
            // Not known clean until a lookup finds every index empty.
            down_epoch: AtomicU64::new(1),
            clean_epoch: AtomicU64::new(0),
            inodes: Inodes::new(),
            dirs: entry_lock::Dirs::default(),
            early: async_dirops::AsyncDirops::default(),
            events,
            group_commit: group_commit::GroupCommit::new(n),
            fds: Fds::new(),
            owner_base: u64::from_le_bytes(base),
            next_owner: AtomicU64::new(1),
            stats: Stats::default(),
            reads: (0..n).map(|_| ReadStats::default()).collect(),
            rt: OnceLock::new(),
            heal: heal::HealState::new(bg),
            deferred: parking_lot::Mutex::new(Vec::new()),
            children,
            name,
            policies,
        };
        Ok(Replicate { inner: Arc::new(inner) })
    }
}

impl Xlator for Replicate {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        if runs_detached(req.fop.kind()) {
            Box::pin(self.inner.clone().detached(ctx, req))
        } else {
            Box::pin(self.inner.dispatch(ctx, req))
        }
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        let me = &self.inner;
        let i = match from {
            EventFrom::Child(i) if i < me.children.len() => i,
            EventFrom::Child(_) => return None,
            EventFrom::Graph => {
                if event == Event::ParentDown {
                    me.drain_early_blocking();
                    me.release_all();
                    me.release_delegations();
                }
                return None;
            }
        };
        match event {
            // The volume says it is up once every child has said up or
            // down and one is up (short of a quorum, reads work and writes
            // are refused), as GlusterFS's AFR waits to have heard from
            // all. A child that says neither (a host that does not answer
            // the connect) is waited for [`UP_GRACE`] once the children up
            // make a quorum: announcing at the quorum alone let a fresh
            // mount's first writes reach two of three bricks while the
            // third was still connecting, leaving its copy to heal. It says
            // down when the last child up goes.
            Event::ChildUp | Event::ChildDown => {
                let mut a = me.announce.lock();
                let up = if event == Event::ChildUp {
                    let before = me.up.fetch_or(bit(i), Ordering::AcqRel);
                    if before & bit(i) == 0 {
                        me.generation.fetch_add(1, Ordering::AcqRel);
                        tracing::info!(volume = %me.name, child = %me.children[i].name, "child up");
                        if !me.deferred.lock().is_empty()
                            && let Some(h) = me.handle()
                        {
                            let me = me.clone();
                            h.spawn(async move { me.write_deferred().await });
                        }
                    }
                    before | bit(i)
                } else {
                    let before = me.up.fetch_and(!bit(i), Ordering::AcqRel);
                    if before & bit(i) != 0 {
                        me.down_epoch.fetch_add(1, Ordering::AcqRel);
                        tracing::warn!(volume = %me.name, child = %me.children[i].name, "child down");
                    }
                    before & !bit(i)
                };
                a.0 |= bit(i);
                let n = me.children.len();
                let heard_all = a.0 == all(n);
                if !a.1 && up != 0 && !heard_all && me.cfg().quorum.met(up, n) && !a.2 {
                    a.2 = true;
                    match me.handle() {
                        Some(h) => {
                            let me = me.clone();
                            h.spawn(async move {
                                tokio::time::sleep(UP_GRACE).await;
                                me.announce_up_after_grace();
                            });
                        }
                        None => {
                            a.1 = true;
                            return Some(Event::ChildUp);
                        }
                    }
                }
                if !a.1 && up != 0 && heard_all {
                    a.1 = true;
                    Some(Event::ChildUp)
                } else if a.1 && up == 0 {
                    a.1 = false;
                    Some(Event::ChildDown)
                } else {
                    None
                }
            }
            Event::ChildConnecting => (me.up_mask() == 0).then_some(Event::ChildConnecting),
            Event::Upcall(Upcall::InodelkContention { gfid, domain, holder_client, holder_owner }) => {
                if domain == me.name {
                    me.contention(gfid, &holder_client, holder_owner);
                    None
                } else {
                    Some(Event::Upcall(Upcall::InodelkContention { gfid, domain, holder_client, holder_owner }))
                }
            }
            Event::Upcall(Upcall::EntrylkContention { gfid, domain, .. }) if domain == me.name => {
                me.stats.upcalls.fetch_add(1, Ordering::Relaxed);
                me.entry_contention(gfid);
                None
            }
            e => Some(e),
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        let me = &self.inner;
        let names = pending_names(options, &me.children).map_err(ReconfigureError::Invalid)?;
        if names != me.pending_names {
            return Err(ReconfigureError::Invalid("afr-pending-xattr cannot change on a running volume".into()));
        }
        let cfg = Config::from_options(options, &me.children, &me.policies).map_err(ReconfigureError::Invalid)?;
        *me.cfg.write() = Arc::new(cfg);
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let me = &self.inner;
        let cfg = me.cfg();
        let up = me.up_mask();
        let mut out = vec![
            ("lock-domain".to_string(), me.name.clone()),
            ("lock-contention-policy".to_string(), cfg.policy.name().to_string()),
            ("quorum".to_string(), format!("{:?}", cfg.quorum)),
            ("children-up".to_string(), format!("{}/{}", up.count_ones(), me.children.len())),
        ];
        if let Some(v) = &me.volume_id {
            out.push(("volume-id".into(), v.clone()));
        }
        for (i, c) in me.children.iter().enumerate() {
            let state = if up & bit(i) != 0 { "up" } else { "down" };
            out.push((format!("child.{i}"), format!("{} {state} pending-xattr {}", c.name, me.keys[i])));
        }
        for (k, n) in COUNTED.iter().zip(&me.stats.sent) {
            out.push((format!("sent.{}", k.name()), n.load(Ordering::Relaxed).to_string()));
        }
        out.push(("eager-lock.windows".into(), me.stats.windows.load(Ordering::Relaxed).to_string()));
        out.push(("eager-lock.held".into(), me.windows_held().to_string()));
        for (key, n) in
            [("group-commit.syncfs", &me.group_commit.syncfs), ("group-commit.file-syncs", &me.group_commit.file_syncs)]
        {
            out.push((key.into(), n.load(Ordering::Relaxed).to_string()));
        }
        for ((_, why), n) in WHY.iter().zip(&me.stats.released) {
            out.push((format!("eager-lock.released.{why}"), n.load(Ordering::Relaxed).to_string()));
        }
        out.push(("entry-eager-lock.held".into(), me.dirs.held().to_string()));
        out.push(("entry-eager-lock.known-names".into(), me.dirs.known_names().to_string()));
        for (k, v) in [
            ("taken", &me.dirs.taken),
            ("joined", &me.dirs.joined),
            ("returned", &me.dirs.returned),
            ("listed", &me.dirs.listed),
            ("absent-hits", &me.dirs.absent_hits),
        ] {
            out.push((format!("entry-eager-lock.{k}"), v.load(Ordering::Relaxed).to_string()));
        }
        for (k, v) in [
            ("answered", &me.early.answered),
            ("setattrs-merged", &me.early.setattrs_merged),
            ("failed", &me.early.failed),
            ("waits", &me.early.waits),
        ] {
            out.push((format!("async-dirops.{k}"), v.load(Ordering::Relaxed).to_string()));
        }
        out.push(("async-dirops.queued".into(), me.early.len().to_string()));
        out.push(("eager-lock.settles".into(), me.stats.settles.load(Ordering::Relaxed).to_string()));
        out.push(("contention-upcalls".into(), me.stats.upcalls.load(Ordering::Relaxed).to_string()));
        out.push(("read-failovers".into(), me.stats.failovers.load(Ordering::Relaxed).to_string()));
        out.push(("inodes".into(), me.inodes.len().to_string()));
        out.push(("fds".into(), me.fds.len().to_string()));
        out.extend(me.heal.dump());
        out
    }

    fn fini(&self) {
        self.inner.release_all();
    }
}
