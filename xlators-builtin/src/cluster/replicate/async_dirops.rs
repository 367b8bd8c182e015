//! Asynchronous directory operations (CephFS's async dirops; no GlusterFS
//! release has them).
//!
//! While this client holds a directory's delegation (`entry_lock`) and
//! knows its names, nobody else can add or remove a name there. So a
//! create or mkdir of a name known absent, an unlink of a name known to be
//! a non-directory, and an rmdir of a directory this client also holds
//! and knows empty, cannot fail for a reason another client causes: with
//! `async-dirops` on they are answered at once, with the gfid this client
//! chose and the attributes storage/posix will give the inode (mode less
//! umask, the caller's uid, the caller's gid or the directory's if it is
//! set-group-ID), and sent to the children behind, in the order they were
//! answered.
//!
//! **Order.** Queued operations are sent in the order they were answered,
//! up to [`IN_FLIGHT`] at once: one that depends on an earlier one still
//! running (the same name, a name in a directory an earlier one makes or
//! removes, the lock of a directory's promised delegation) waits for it, so
//! every child applies dependent operations in one order, and operations
//! on different names, which commute, overlap. An operation is sent only
//! after every earlier one was: if this client dies, the bricks get a
//! prefix of the queue (the operations it had sent), never a later one
//! without an earlier one. Every other entry operation of this client (any
//! directory) waits until the queue is empty, so it too lands after the
//! earlier ones. Any other fop on an inode a queued operation makes or
//! removes (write, setattr, open, lookup by gfid, a lookup of a queued
//! name, release of a create's fd) waits for that operation first, and a
//! readdir or setattr of a directory waits for the operations queued in
//! it (the mtime a setattr gives must not be overwritten by a create
//! answered before it: tar sets a directory's times after extracting into
//! it). A create's fd is usable at once: its writes wait for the create.
//!
//! **Rmdir.** `rm -r` of a tree this client holds unlinks every name of a
//! directory (each answered early) and then removes it. When the
//! directory's own delegation is held with no names left, the rmdir is
//! answered at once too and queued behind the unlinks in it; the
//! directory's delegation is retired (nothing joins it any more) but its
//! lock, the whole-directory entrylk an rmdir takes, is kept until the
//! rmdir has run, and the parent keeps its delegation and names. An rmdir
//! that cannot be answered here is sent at once: under the parent's
//! delegation when this client holds the directory's with nothing running
//! in it (`entry_txn`), else after both delegations are returned, under
//! per-name locks.
//!
//! **Setattr of a delegated directory.** tar restores each directory's
//! owner, mode and times after filling it; each such setattr used to wait
//! for the creates queued in the directory and then take the directory's
//! inode lock, set, and unlock on every child (84 % of an untar's time
//! once the files' own setattrs went behind their writes). When this
//! client holds the directory's delegation with its attributes known, the
//! setattr is stamped (features/utime) and its outcome can be told here
//! ([`xlfs_sdk::SetAttr::predictable`]: root, or the owner changing times
//! or a mode without set-id bits), it is answered at once with the
//! attributes the bricks will give (mode, owner and times as set, the
//! stamp as the ctime) and queued behind the operations in the directory;
//! it runs as any setattr does (a metadata transaction under the inode
//! lock, which orders it with other clients' changes). The next setattr of
//! the directory by the same caller is taken into it while it waits
//! (unless a new owner would follow a mode: the brick clears set-id bits
//! on chown), so tar's three cost one transaction. Until it lands, a fop
//! on the directory waits for it, and a lookup or listing that returns
//! the directory shows the attributes answered. A failure is logged and
//! returned by the next fsync of the directory.
//!
//! **Failures are never silent.** A queued operation that fails (a brick
//! error, ENOSPC, EEXIST if the name was made behind the volume's back) is
//! logged, its directory's delegation forgets its names, and the error is
//! returned by every later fop on the inode it made (write, fsync, flush,
//! setattr, lookup by gfid...) until the inode is forgotten, and once by the
//! next fsyncdir of its directory.
//!
//! **Bounds.** At most `async-dirops-queue` operations wait; beyond, the
//! next one waits for room. The queue is drained before the mount unmounts
//! or switches graphs (`IPC_DRAIN`) and when the graph goes away.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;
use xlfs_sdk::dict::Value;
use xlfs_sdk::dict::keys::{GFID_REQ, UTIME};
use xlfs_sdk::{CallCtx, Errno, Fop, Gfid, Iatt, Reply, Request, Timespec, Upcall};

use super::Inner;
use super::entry_lock::{Early, Name, SELF, Ticket, set_by_setattr};
use super::fds::FdCtx;
use super::pending::{Kind, all};

/// Most inodes whose failed operation is remembered (oldest dropped).
const MAX_FAILED: usize = 4096;

/// How long the graph going away waits for the queue.
const DRAIN_AT_SHUTDOWN: Duration = Duration::from_secs(60);

/// Most queued operations sent at once.
pub const IN_FLIGHT: usize = 8;

/// What a queued operation touches, to order it after those it depends on.
struct Key {
    dir: Gfid,
    name: String,
    /// The inode it makes or removes (null: not known).
    gfid: Gfid,
    /// The lock of a promised delegation: after everything before it,
    /// before everything after it.
    barrier: bool,
}

impl Key {
    /// Whether an operation with this key must wait for one with `earlier`
    /// to finish: the same name; a name in a directory the other makes or
    /// removes (either way round); the same inode; or a barrier. Operations
    /// on different names of existing directories commute: every child
    /// ends with the same names whatever order it applies them in.
    fn depends_on(&self, earlier: &Key) -> bool {
        let on = |g: Gfid, h: Gfid| !g.is_null() && g == h;
        self.barrier
            || earlier.barrier
            || (self.dir == earlier.dir && self.name == earlier.name)
            || on(earlier.gfid, self.dir)
            || on(self.gfid, earlier.dir)
            || on(self.gfid, earlier.gfid)
    }
}

/// One queued operation.
struct Op {
    ctx: CallCtx,
    /// The fop, or None for the lock of a promised delegation
    /// (`Inner::take_promised`) of directory `gfid`.
    req: Option<Request>,
    ticket: Ticket,
    /// An rmdir's hold on the delegation of the directory it removes
    /// ([`Inner::retire_dir`]).
    retired: Option<Ticket>,
    dir: Gfid,
    name: String,
    /// The inode made or removed.
    gfid: Gfid,
}

impl Op {
    fn new(ctx: &CallCtx, req: Option<Request>, ticket: Ticket, dir: Gfid, name: String, gfid: Gfid) -> Op {
        Op { ctx: ctx.clone(), req, ticket, retired: None, dir, name, gfid }
    }

    fn key(&self) -> Key {
        Key { dir: self.dir, name: self.name.clone(), gfid: self.gfid, barrier: self.req.is_none() }
    }

    /// Whether it makes its inode (a create or mkdir).
    fn makes(&self) -> bool {
        matches!(self.req.as_ref().map(|r| &r.fop), Some(Fop::Create { .. } | Fop::Mkdir { .. }))
    }

    /// Takes in a later setattr of directory `dir` (`then`, stamped `at`,
    /// by `ctx`) if this one, not started yet, is a setattr of it by the
    /// same caller and the two make one ([`xlfs_sdk::SetAttr::then`]).
    fn merge_setattr(&mut self, ctx: &CallCtx, dir: Gfid, then: &xlfs_sdk::SetAttr, at: Timespec) -> bool {
        let same_caller = (self.ctx.uid, self.ctx.gid, &self.ctx.groups) == (ctx.uid, ctx.gid, &ctx.groups);
        let Some(req) = self.req.as_mut().filter(|_| same_caller && self.gfid == dir && self.name == SELF) else {
            return false;
        };
        let Some(first_at) = req.xdata.get_u64(UTIME).map(Timespec::from_nanos) else { return false };
        let Fop::Setattr { attr, .. } = &mut req.fop else { return false };
        let Some(m) = attr.at(first_at).then(then) else { return false };
        *attr = m;
        req.xdata.set(UTIME, Value::U64(at.to_nanos()));
        true
    }
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    /// Queued or running.
    len: usize,
    worker: bool,
    /// Operations not finished, per inode made or removed, per directory,
    /// per (directory, name).
    gfids: HashMap<Gfid, usize>,
    dirs: HashMap<Gfid, usize>,
    names: HashMap<(Gfid, String), usize>,
    /// Inodes whose operation failed, and the error.
    failed: HashMap<Gfid, Errno>,
    failed_order: VecDeque<Gfid>,
    /// Directories with a failed operation not yet reported by fsyncdir.
    dir_errors: HashMap<Gfid, Errno>,
    /// Directories with a setattr answered early and not yet landed: the
    /// attributes it answered with.
    views: HashMap<Gfid, Iatt>,
    /// Who waits for the operations on an inode or in a directory (woken
    /// when one of those finishes; the queue's own `changed` wakes those
    /// waiting for all of it or for room).
    waiters: HashMap<Gfid, Arc<Notify>>,
}

fn bump<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: K) {
    *m.entry(k).or_insert(0) += 1;
}

fn drop_one<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: &K) {
    if let Some(n) = m.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            m.remove(k);
        }
    }
}

/// The queue of one replicate translator.
#[derive(Default)]
pub struct AsyncDirops {
    q: Mutex<Queue>,
    changed: Notify,
    /// Tells the running queue that more was queued.
    queued: Notify,
    /// Queued or running (read without the lock on every fop).
    len: AtomicUsize,
    pub answered: AtomicU64,
    /// Setattrs answered early and taken into one queued before them.
    pub setattrs_merged: AtomicU64,
    pub failed: AtomicU64,
    pub waits: AtomicU64,
}

impl AsyncDirops {
    /// Operations queued or running.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Blocks the calling (non-async) thread until the queue is empty or
    /// `timeout` passed; true when empty.
    pub fn wait_empty_blocking(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while self.len() != 0 {
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }
}

/// What a fop must wait for.
enum Wait<'a> {
    Nothing,
    /// The whole queue.
    All,
    /// Operations on these inodes, this directory's, or this name.
    On {
        gfids: Vec<Gfid>,
        dir: Option<Gfid>,
        name: Option<(Gfid, &'a str)>,
    },
}

/// The attributes storage/posix gives a new inode made by `ctx` in a
/// directory with attributes `parent`.
fn new_iatt(ctx: &CallCtx, parent: &Iatt, gfid: Gfid, ty: u32, perm: u32) -> Iatt {
    let sgid = parent.mode & libc::S_ISGID != 0;
    let dir = ty == libc::S_IFDIR;
    let now = Timespec::now();
    Iatt {
        gfid,
        ino: gfid.ino(),
        dev: parent.dev,
        mode: ty | (perm & 0o7777) | if dir && sgid { libc::S_ISGID } else { 0 },
        nlink: if dir { 2 } else { 1 },
        uid: ctx.uid,
        gid: if sgid { parent.gid } else { ctx.gid },
        rdev: 0,
        size: if dir { parent.size.max(4096) } else { 0 },
        blksize: parent.blksize,
        blocks: if dir { parent.blocks } else { 0 },
        atime: now,
        mtime: now,
        ctime: now,
    }
}

impl Inner {
    /// Answers an entry fop at once and queues it, when `async-dirops`
    /// allows (see the module doc). `None`: run it as usual.
    pub async fn try_early(self: &Arc<Self>, ctx: &CallCtx, req: &Request) -> Option<super::FopResult> {
        let cfg = self.cfg();
        if !cfg.async_dirops {
            return None;
        }
        if let Fop::Rmdir { loc, flags } = &req.fop {
            return self.try_early_rmdir(ctx, req, loc, *flags, cfg.async_queue).await;
        }
        let (loc, what, ty, perm) = match &req.fop {
            Fop::Create { loc, mode, umask, .. } => (loc, true, libc::S_IFREG, mode & !umask),
            Fop::Mkdir { loc, mode, umask } => (loc, true, libc::S_IFDIR, mode & !umask),
            Fop::Unlink { loc, .. } => (loc, false, 0, 0),
            _ => return None,
        };
        if !loc.is_entry() {
            return None;
        }
        let gfid = match req.xdata.get(GFID_REQ) {
            Some(Value::Gfid(g)) if !g.is_null() => *g,
            _ if what => return None,
            _ => Gfid::default(),
        };
        self.room_in_queue(cfg.async_queue).await;
        self.wait_listing(loc.parent).await;
        let early = if what { Early::Add(Name { gfid, dir: ty == libc::S_IFDIR }) } else { Early::Remove };
        let (ticket, parent, post, removed) = self.join_early(loc.parent, &loc.name, early)?;
        let target = if what { gfid } else { removed.unwrap_or_default() };
        let reply = if what {
            Reply::Entry { iatt: new_iatt(ctx, &parent, gfid, ty, perm), postparent: post }
        } else {
            Reply::Parent { pre: parent, post }
        };
        if let Fop::Create { fd, flags, .. } = &req.fop {
            let f = FdCtx { gfid, flags: *flags, dir: false, opened: all(self.children.len()), readdir_child: None };
            if self.fds.insert(*fd, f).is_err() {
                tracing::warn!(volume = %self.name, "fd table full");
            } else {
                self.fd_opened_on(gfid);
            }
        }
        // The name was answered as absent: the bricks must make it, not
        // open one made behind this client's back (that is EEXIST, reported).
        let mut sent = req.clone();
        if let Fop::Create { flags, .. } = &mut sent.fop {
            *flags |= libc::O_EXCL as u32;
        }
        let op = Op::new(ctx, Some(sent), ticket, loc.parent, loc.name.clone(), target);
        self.enqueue(op);
        if let Reply::Entry { iatt, .. } = &reply
            && ty == libc::S_IFDIR
        {
            self.promise_after(ctx, loc.parent, *iatt);
        }
        self.early.answered.fetch_add(1, Ordering::Relaxed);
        Some(Ok(reply.into()))
    }

    /// Answers an rmdir at once and queues it when this client holds the
    /// delegations of both the parent and the directory, knows the name as
    /// that directory and the directory as empty (every unlink in it
    /// answered): nobody else can add a name there meanwhile, and the
    /// queued rmdir runs after the unlinks queued in it. The directory's
    /// delegation is retired (its lock, the whole-directory entrylk an
    /// rmdir takes, is kept until the rmdir has run and then returned).
    async fn try_early_rmdir(
        self: &Arc<Self>,
        ctx: &CallCtx,
        req: &Request,
        loc: &xlfs_sdk::Loc,
        flags: u32,
        max: usize,
    ) -> Option<super::FopResult> {
        if flags != 0 || !loc.is_entry() {
            return None;
        }
        let gfid = self.known_subdir(loc.parent, &loc.name)?;
        if !loc.gfid.is_null() && loc.gfid != gfid {
            return None;
        }
        self.room_in_queue(max).await;
        let retired = self.retire_dir(gfid, true)?;
        let Some((ticket, pre, post, _)) = self.join_early(loc.parent, &loc.name, Early::RemoveDir(gfid)) else {
            // Named otherwise meanwhile: the usual path (which returns
            // the retired delegation as it would anyway).
            self.leave_retired(retired);
            return None;
        };
        let op = Op {
            retired: Some(retired),
            ..Op::new(ctx, Some(req.clone()), ticket, loc.parent, loc.name.clone(), gfid)
        };
        self.enqueue(op);
        self.early.answered.fetch_add(1, Ordering::Relaxed);
        Some(Ok(Reply::Parent { pre, post }.into()))
    }

    /// Waits for room in the queue (of `max` operations) rather than
    /// overtake it.
    async fn room_in_queue(&self, max: usize) {
        loop {
            let notified = self.early.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.early.len() < max {
                return;
            }
            self.early.waits.fetch_add(1, Ordering::Relaxed);
            notified.await;
        }
    }

    /// Answers a setattr of a delegated directory at once and queues it,
    /// when `async-dirops` allows and its outcome is known here (see the
    /// module doc). `None`: run it as usual.
    pub async fn try_early_setattr(self: &Arc<Self>, ctx: &CallCtx, req: &Request) -> Option<super::FopResult> {
        let cfg = self.cfg();
        let Fop::Setattr { loc, attr } = &req.fop else { return None };
        // The bricks keep the stamp as the ctime: without one the answer
        // could not say the ctime they give.
        let at = Timespec::from_nanos(req.xdata.get_u64(UTIME)?);
        // Checked again when joined; here only so that no other setattr
        // waits for room in the queue.
        if !cfg.async_dirops || !self.knows_dir(loc.gfid) {
            return None;
        }
        self.room_in_queue(cfg.async_queue).await;
        let (ticket, pre, post) = self.join_early_setattr(ctx.uid, loc.gfid, attr, at)?;
        let dir = loc.gfid;
        let merged = {
            let mut q = self.early.q.lock();
            q.views.insert(dir, post);
            // tar's chown, chmod and utimensat of a directory, back to
            // back: one transaction on the bricks.
            q.ops.back_mut().is_some_and(|last| last.merge_setattr(ctx, dir, attr, at))
        };
        if merged {
            self.leave_early_setattr(ticket, true);
            self.early.setattrs_merged.fetch_add(1, Ordering::Relaxed);
        } else {
            let op = Op::new(ctx, Some(req.clone()), ticket, dir, SELF.to_string(), dir);
            self.enqueue(op);
        }
        self.early.answered.fetch_add(1, Ordering::Relaxed);
        Some(Ok(Reply::PrePost { pre, post }.into()))
    }

    /// Gives the attributes in a reply (a lookup's, a listing's entries)
    /// of a directory with a setattr answered early and not yet landed the
    /// mode, owner and times that setattr answered with.
    pub fn show_early_setattrs(&self, res: &mut super::FopResult) {
        let Ok(rsp) = res else { return };
        if self.early.len() == 0 {
            return;
        }
        let q = self.early.q.lock();
        if q.views.is_empty() {
            return;
        }
        let show = |ia: &mut Iatt| {
            if let Some(v) = q.views.get(&ia.gfid) {
                set_by_setattr(ia, v);
            }
        };
        match &mut rsp.reply {
            Reply::Entry { iatt, postparent } => {
                show(iatt);
                show(postparent);
            }
            Reply::Attr(a) => show(a),
            Reply::Dirents(entries) => entries.iter_mut().for_each(|e| show(&mut e.iatt)),
            _ => {}
        }
    }

    /// Sets up the delegation of a directory this client just made
    /// (`iatt`, in `parent`) and queues the taking of its lock.
    pub fn promise_after(self: &Arc<Self>, ctx: &CallCtx, parent: Gfid, iatt: Iatt) {
        if !self.cfg().async_dirops {
            return;
        }
        if let Some(ticket) = self.promise_delegation(ctx, iatt.gfid, iatt) {
            let op = Op::new(ctx, None, ticket, parent, String::new(), iatt.gfid);
            self.enqueue(op);
        }
    }

    fn enqueue(self: &Arc<Self>, op: Op) {
        let start = {
            let mut q = self.early.q.lock();
            if !op.gfid.is_null() {
                bump(&mut q.gfids, op.gfid);
            }
            bump(&mut q.dirs, op.dir);
            bump(&mut q.names, (op.dir, op.name.clone()));
            q.ops.push_back(op);
            q.len += 1;
            self.early.len.store(q.len, Ordering::Release);
            !std::mem::replace(&mut q.worker, true)
        };
        if !start {
            self.early.queued.notify_one();
        } else {
            match self.handle() {
                Some(h) => {
                    let me = self.clone();
                    h.spawn(async move { me.run_queue().await });
                }
                None => {
                    self.early.q.lock().worker = false;
                    tracing::error!(volume = %self.name, "no runtime for queued directory operations");
                }
            }
        }
    }

    /// Runs the queued operations in order: each starts once every earlier
    /// one it depends on has finished ([`Key::depends_on`]), at most
    /// [`IN_FLIGHT`] at once, all polled in this one task. An operation
    /// that panics fails with EIO, reported as any failed one, and the
    /// queue goes on: a bug below must not leave every later entry fop
    /// waiting for a queue nobody runs.
    async fn run_queue(self: Arc<Self>) {
        type Running<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;
        let mut running: Vec<(Key, bool, Running<'_>)> = Vec::new();
        loop {
            let queued = self.early.queued.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            // Start what may start now.
            while running.len() < IN_FLIGHT {
                let next = {
                    let mut q = self.early.q.lock();
                    match q.ops.front().map(Op::key) {
                        Some(key) if running.iter().any(|(k, ..)| key.depends_on(k)) => None,
                        Some(key) => q.ops.pop_front().map(|op| (key, op)),
                        None if running.is_empty() => {
                            q.worker = false;
                            return;
                        }
                        None => None,
                    }
                };
                let Some((key, op)) = next else { break };
                running.push((key, op.makes(), Box::pin(self.run_one(op))));
            }
            // Then wait for one to finish, or for more to be queued.
            std::future::poll_fn(|cx| {
                let before = running.len();
                running.retain_mut(|(key, made, f)| {
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.as_mut().poll(cx))) {
                        Ok(p) => p.is_pending(),
                        Err(_) => {
                            self.panicked(key, *made);
                            false
                        }
                    }
                });
                if running.len() < before || queued.as_mut().poll(cx).is_ready() {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            })
            .await;
        }
    }

    /// A queued operation panicked: it failed with EIO (its ticket, dropped
    /// with it, left the delegation with the names unknown).
    fn panicked(&self, key: &Key, made: bool) {
        self.early.failed.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            volume = %self.name, dir = %key.dir, name = %key.name, gfid = %key.gfid,
            "a directory operation answered early panicked before it finished on the bricks (a bug): it failed \
             with EIO, returned by the next operations on it and the next fsync of its directory; the bricks \
             may differ on this name until it is looked up and healed"
        );
        self.upcall_invalidate(key.gfid);
        self.upcall_invalidate(key.dir);
        self.done(key.dir, key.name.clone(), key.gfid, Some((Errno::EIO, made)));
    }

    /// Sends one queued operation and records how it went.
    async fn run_one(self: &Arc<Self>, op: Op) {
        let made = op.makes();
        let Op { ctx, req, ticket, retired, dir, name, gfid } = op;
        let Some(req) = req else {
            self.take_promised(ticket).await;
            self.done(dir, name, gfid, None);
            return;
        };
        let setattr = matches!(req.fop, Fop::Setattr { .. });
        let fop = req.fop.kind().name();
        let err = if setattr {
            // A metadata transaction like any setattr (the directory's
            // inode lock orders it with other clients' changes); its
            // delegation only kept the directory's names and attributes.
            let r = self.inode_txn(&ctx, Kind::Metadata, gfid, None, req).await;
            self.leave_early_setattr(ticket, r.is_ok());
            r.err()
        } else {
            let (out, blamed) = self.run_early(&ctx, ticket, &req).await;
            self.mark_stale(dir, Kind::Entry, blamed);
            if made && blamed != 0 {
                for k in Kind::ALL {
                    self.mark_stale(gfid, k, blamed);
                }
            }
            if let Fop::Create { fd, .. } = &req.fop {
                // Release sends to these only; nothing if it failed everywhere.
                self.fds.update(*fd, |f| f.opened = out.ok);
            }
            if let Some(t) = retired {
                self.leave_retired(t);
            }
            out.result.as_ref().err().copied()
        };
        if let Some(e) = err {
            self.early.failed.fetch_add(1, Ordering::Relaxed);
            // A setattr's directory is its own inode (`dir` is `gfid`).
            let returned = if setattr {
                "the next fsync of the directory"
            } else {
                "the next operations on it and the next fsync of its directory"
            };
            tracing::error!(
                volume = %self.name, %dir, %name, %gfid, fop,
                "a directory operation answered early failed on the bricks: {e}; the error is returned by {returned}"
            );
            self.upcall_invalidate(gfid);
            self.upcall_invalidate(dir);
        }
        self.done(dir, name, gfid, err.map(|e| (e, made)));
    }

    /// A queued operation finished (with its error, and whether it made
    /// the inode).
    fn done(&self, dir: Gfid, name: String, gfid: Gfid, err: Option<(Errno, bool)>) {
        {
            let mut q = self.early.q.lock();
            if let Some((e, made)) = err {
                if made && !gfid.is_null() {
                    q.failed.insert(gfid, e);
                    q.failed_order.push_back(gfid);
                    while q.failed_order.len() > MAX_FAILED {
                        if let Some(old) = q.failed_order.pop_front() {
                            q.failed.remove(&old);
                        }
                    }
                }
                q.dir_errors.insert(dir, e);
            }
            if !gfid.is_null() {
                drop_one(&mut q.gfids, &gfid);
                if !q.gfids.contains_key(&gfid) {
                    q.views.remove(&gfid);
                }
            }
            drop_one(&mut q.dirs, &dir);
            drop_one(&mut q.names, &(dir, name));
            q.len -= 1;
            self.early.len.store(q.len, Ordering::Release);
            for g in [gfid, dir] {
                let idle = !q.gfids.contains_key(&g) && !q.dirs.contains_key(&g);
                let w = if idle { q.waiters.remove(&g) } else { q.waiters.get(&g).cloned() };
                if let Some(w) = w {
                    w.notify_waiters();
                }
            }
        }
        self.early.changed.notify_waiters();
    }

    fn upcall_invalidate(&self, gfid: Gfid) {
        if !gfid.is_null() {
            self.events.send(xlfs_sdk::Event::Upcall(Upcall::Invalidate { gfid }));
        }
    }

    /// Before a fop runs: waits for the queued operations it depends on and
    /// returns the error of a failed one it acts on.
    pub async fn after_early(&self, req: &Request) -> Result<(), Errno> {
        // Nothing queued and nothing failed: nothing to wait for or report
        // (fsyncdir still reports a directory's failures below).
        if self.early.len() == 0 && !matches!(req.fop, Fop::Fsyncdir { .. }) && self.early.q.lock().failed.is_empty() {
            return Ok(());
        }
        let wait = match &req.fop {
            Fop::Forget { gfid } => {
                let mut q = self.early.q.lock();
                if q.failed.remove(gfid).is_some() {
                    q.failed_order.retain(|g| g != gfid);
                }
                return Ok(());
            }
            fop if super::is_entry_fop(fop) => Wait::All,
            Fop::Ipc { op } if *op == xlfs_sdk::IPC_DRAIN => Wait::All,
            Fop::Opendir { loc, .. } if !loc.gfid.is_null() => {
                Wait::On { gfids: vec![loc.gfid], dir: Some(loc.gfid), name: None }
            }
            Fop::Readdir { fd, .. } | Fop::Readdirp { fd, .. } | Fop::Fsyncdir { fd, .. } => {
                Wait::On { gfids: vec![fd.gfid], dir: Some(fd.gfid), name: None }
            }
            // The times a setattr gives a directory must not be overwritten
            // by an operation in it answered before (tar sets a directory's
            // mtime after extracting into it).
            Fop::Setattr { loc: xlfs_sdk::Loc { gfid: g, .. }, .. }
            | Fop::Fsetattr { fd: xlfs_sdk::Fd { gfid: g, .. }, .. }
                if !g.is_null() =>
            {
                Wait::On { gfids: vec![*g], dir: Some(*g), name: None }
            }
            // A fop by parent and name alone (a lookup; a stat or getxattr
            // through the client API) waits for what is queued on that name:
            // an unlink answered early must not be found again.
            fop => match fop.loc() {
                Some(loc) if loc.is_entry() && loc.gfid.is_null() => {
                    Wait::On { gfids: vec![loc.parent], dir: None, name: Some((loc.parent, &loc.name)) }
                }
                loc => {
                    let mut gfids: Vec<Gfid> = loc.map(|l| l.gfid).into_iter().collect();
                    gfids.extend(fop.fds().map(|f| f.gfid));
                    if gfids.is_empty() { Wait::Nothing } else { Wait::On { gfids, dir: None, name: None } }
                }
            },
        };
        loop {
            let global = self.early.changed.notified();
            tokio::pin!(global);
            global.as_mut().enable();
            let mut keyed: Option<(Gfid, Arc<Notify>)> = None;
            let (busy, failed) = {
                let mut q = self.early.q.lock();
                if let Wait::On { gfids, dir, .. } = &wait {
                    // Wait on the first inode or directory with operations
                    // not done (a queued name is in a queued directory).
                    let key = gfids
                        .iter()
                        .chain(dir.iter())
                        .chain(match &wait {
                            Wait::On { name: Some((d, _)), .. } => Some(d),
                            _ => None,
                        })
                        .find(|g| q.gfids.contains_key(g) || q.dirs.contains_key(g))
                        .copied();
                    if let Some(k) = key {
                        keyed = Some((k, q.waiters.entry(k).or_insert_with(|| Arc::new(Notify::new())).clone()));
                    }
                }
                match &wait {
                    Wait::Nothing => (false, None),
                    Wait::All => {
                        let mut check: Vec<Gfid> = req.fop.loc().map(|l| vec![l.parent, l.gfid]).unwrap_or_default();
                        if let Fop::Rename { new, .. } | Fop::Link { new, .. } = &req.fop {
                            check.push(new.parent);
                        }
                        (q.len != 0, check.iter().find_map(|g| q.failed.get(g).copied()))
                    }
                    Wait::On { gfids, dir, name } => {
                        let busy = gfids.iter().any(|g| q.gfids.contains_key(g))
                            || dir.is_some_and(|d| q.dirs.contains_key(&d))
                            || name.is_some_and(|(d, n)| q.names.contains_key(&(d, n.to_string())));
                        (busy, gfids.iter().find_map(|g| q.failed.get(g).copied()))
                    }
                }
            };
            if !busy {
                let releasing = matches!(req.fop, Fop::Release { .. } | Fop::Releasedir { .. });
                if let Some(e) = failed.filter(|_| !releasing) {
                    return Err(e);
                }
                if let Fop::Fsyncdir { fd, .. } = &req.fop {
                    return self.early.q.lock().dir_errors.remove(&fd.gfid).map_or(Ok(()), Err);
                }
                return Ok(());
            }
            match keyed {
                Some((k, w)) => {
                    let n = w.notified();
                    tokio::pin!(n);
                    n.as_mut().enable();
                    // Checked again once enabled: a finish in between is not missed.
                    let still = {
                        let q = self.early.q.lock();
                        q.gfids.contains_key(&k) || q.dirs.contains_key(&k)
                    };
                    if still {
                        n.await;
                    }
                }
                None => global.await,
            }
        }
    }

    /// The graph is going away: waits (blocking, bounded) for the queue.
    pub fn drain_early_blocking(&self) {
        if self.early.len() == 0 {
            return;
        }
        let wait = || {
            if !self.early.wait_empty_blocking(DRAIN_AT_SHUTDOWN) {
                tracing::error!(volume = %self.name, left = self.early.len(), "queued directory operations not sent");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread => {
                tracing::warn!(volume = %self.name, "cannot wait for queued directory operations here")
            }
            Ok(_) => tokio::task::block_in_place(wait),
            Err(_) => wait(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dir: u8, name: &str, gfid: u8, barrier: bool) -> Key {
        let g = |b: u8| if b == 0 { Gfid::default() } else { Gfid([b; 16]) };
        Key { dir: g(dir), name: name.into(), gfid: g(gfid), barrier }
    }

    #[test]
    fn what_a_queued_operation_waits_for() {
        let create = |name, gfid| key(1, name, gfid, false);
        assert!(!create("a", 2).depends_on(&create("b", 3)), "different names commute");
        assert!(create("a", 2).depends_on(&create("a", 3)), "the same name");
        assert!(key(1, "a", 0, false).depends_on(&create("a", 3)), "an unlink of a name made before");
        assert!(key(2, "x", 4, false).depends_on(&key(1, "d", 2, false)), "in a directory made before");
        assert!(key(1, "d", 2, false).depends_on(&key(2, "x", 4, false)), "a directory with a name queued in it");
        assert!(create("a", 2).depends_on(&key(5, "", 6, true)), "after a barrier");
        assert!(key(5, "", 6, true).depends_on(&create("a", 2)), "a barrier after anything");
        assert!(!key(1, "a", 0, false).depends_on(&key(3, "b", 0, false)), "unknown inodes of other names");
    }
}
