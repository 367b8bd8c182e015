//! The FUSE bridge: the kernel's FUSE requests turned into fops sent to the
//! top of a translator graph (GlusterFS's `fuse-bridge.c`), over fuser 0.18.
//!
//! **Threads.** fuser reads requests on [`MountOptions::reader_threads`]
//! threads, each on its own cloned `/dev/fuse` fd. A reader thread decodes
//! the request, copies what the fop needs and polls the fop once: one
//! answered at once (from a cache, or acknowledged by write-behind) is
//! replied to from the reader thread; one that has to wait becomes a task
//! on the tokio runtime, which answers through fuser's reply object (which
//! is `Send`). No reader thread ever waits on a fop, so a slow brick or a
//! blocked lock never stalls other requests. `forget` and
//! `batch_forget` need no fop and run on the reader thread.
//!
//! **Inodes.** The kernel's node ids come from the [`InodeTable`]: every
//! entry reply (lookup, create, mkdir, mknod, symlink, link and each
//! readdirplus entry) adds one lookup, `forget` and `batch_forget` remove
//! them; inodes the
//! kernel forgot stay on a bounded LRU list and, once evicted, the graph
//! is sent [`Fop::Forget`]. The root is node 1 and [`Gfid::ROOT`].
//!
//! **Open files.** A FUSE file handle is the [`FdId`] the [`FdTable`] gives
//! the open (bounded: EMFILE beyond); open, create and opendir send the fop
//! with that id, release and releasedir send Release and Releasedir.
//!
//! **Callers.** The request's uid, gid and pid go into the [`CallCtx`], with
//! the caller's supplementary groups read from `/proc/PID/status` (cached
//! for a second) for the fops where the bricks use them; FUSE's lock owner
//! becomes `lk_owner`.
//!
//! The per-group code is in [`entry`](self) (names and attributes),
//! `io` (files), `dir` (directories), `locks` (POSIX locks and flock) and
//! `upcall` (invalidations from the bricks); [`options`] holds the mount
//! options. [`Mount`] mounts, serves and unmounts.
//!
//! **Graph switch.** Fops go to the mount's active graph, which
//! [`Mount::switch`] replaces while the mount serves: open fds are reopened
//! on the new graph, the locks the mount holds move with them, and the old
//! graph drains before it is shut down (see [`switch`]).

mod data_cache;
mod dir;
mod entry;
mod io;
mod locks;
pub mod options;
pub mod switch;
mod upcall;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, CopyFileRangeFlags, FileAttr, FileHandle, Filesystem, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request as FuseRequest, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{Notify, broadcast, watch};
use xlfs_sdk::{CallCtx, Child, Dict, Errno, Fd, FdId, FileType, Fop, Gfid, Iatt, Reply, Timespec, Upcall};

use crate::fd::FdTable;
use crate::graph::Graph;
use crate::inode::InodeTable;

pub use options::{MountOptions, OptionsError};
pub use switch::SwitchReport;

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    /// The mount point cannot be used.
    #[error("mount point {}: {source}", path.display())]
    MountPoint {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Mounting (or the FUSE handshake) failed.
    #[error("mounting {} failed: {source}", path.display())]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The session thread could not be started.
    #[error("starting the FUSE session: {0}")]
    Session(std::io::Error),
    /// Unmounting failed.
    #[error("unmounting {}: {source}", path.display())]
    Unmount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Counts fops in flight so an unmount can wait for them.
#[derive(Default)]
pub(crate) struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

struct InFlightGuard<'a>(&'a InFlight);

impl InFlight {
    fn enter(&self) -> InFlightGuard<'_> {
        self.begin();
        InFlightGuard(self)
    }

    /// Counts one more in flight, without a guard: [`InFlight::leave`] ends it.
    fn begin(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
    }

    /// Ends what [`InFlight::begin`] (or a guard) began.
    fn leave(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    async fn drained(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.count.load(Ordering::Acquire) == 0;
            }
        }
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// Supplementary groups of callers, from `/proc/PID/status`, kept for
/// [`GROUPS_TTL`]; at most [`GROUPS_MAX`] processes.
struct GroupCache(Mutex<HashMap<u32, Groups>>);

/// A caller's groups and when they were read.
type Groups = (Instant, Arc<[u32]>);

const GROUPS_TTL: Duration = Duration::from_secs(1);
const GROUPS_MAX: usize = 4096;

impl GroupCache {
    fn get(&self, pid: u32) -> Arc<[u32]> {
        let now = Instant::now();
        if let Some((at, g)) = self.0.lock().get(&pid)
            && now.duration_since(*at) < GROUPS_TTL
        {
            return g.clone();
        }
        let groups: Arc<[u32]> = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| parse_groups(&s))
            .unwrap_or_default()
            .into();
        let mut m = self.0.lock();
        if m.len() >= GROUPS_MAX {
            m.retain(|_, (at, _)| now.duration_since(*at) < GROUPS_TTL);
            if m.len() >= GROUPS_MAX {
                m.clear();
            }
        }
        m.insert(pid, (now, groups.clone()));
        groups
    }
}

/// The `Groups:` line of a `/proc/PID/status` text.
fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(line.split_whitespace().filter_map(|g| g.parse().ok()).collect())
}

/// What the bridge shares between reader threads and tasks.
pub(crate) struct Core {
    /// The graph fops go to (replaced by a switch).
    active: parking_lot::RwLock<Arc<switch::Active>>,
    /// Lock fops, flush and release pass here; a switch closes it while
    /// it moves the locks.
    lk_gate: tokio::sync::RwLock<()>,
    held: locks::HeldLocks,
    /// Set once the session runs: true when it ends.
    ended: OnceLock<watch::Receiver<bool>>,
    rt: Handle,
    inodes: InodeTable,
    fds: FdTable,
    opts: MountOptions,
    client_id: Arc<str>,
    inflight: InFlight,
    groups: GroupCache,
    notifier: OnceLock<Notifier>,
    dirs: dir::DirBuffers,
    data: data_cache::DataVersions,
}

/// The errno a fop failure is answered with.
fn fuse_errno(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.raw())
}

/// A name from the kernel as the fop model's UTF-8 string (EILSEQ if not).
fn name_str(name: &OsStr) -> Result<String, Errno> {
    name.to_str().map(str::to_string).ok_or(Errno(libc::EILSEQ))
}

fn system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec.min(999_999_999))
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec.min(999_999_999).into())
    }
}

fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let (sec, nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec == 0 { Timespec { sec, nsec: 0 } } else { Timespec { sec: sec - 1, nsec: 1_000_000_000 - nsec } }
        }
    }
}

fn fuse_kind(t: FileType) -> fuser::FileType {
    match t {
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::BlockDev => fuser::FileType::BlockDevice,
        FileType::CharDev => fuser::FileType::CharDevice,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
        FileType::Regular | FileType::Unknown => fuser::FileType::RegularFile,
    }
}

/// The kernel's view of an inode's attributes; `nodeid` is also `st_ino`.
fn file_attr(iatt: &Iatt, nodeid: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size: iatt.size,
        blocks: iatt.blocks,
        atime: system_time(iatt.atime),
        mtime: system_time(iatt.mtime),
        ctime: system_time(iatt.ctime),
        crtime: UNIX_EPOCH,
        kind: fuse_kind(iatt.file_type()),
        perm: (iatt.mode & 0o7777) as u16,
        nlink: iatt.nlink,
        uid: iatt.uid,
        gid: iatt.gid,
        rdev: iatt.rdev as u32,
        blksize: if iatt.blksize == 0 { 4096 } else { iatt.blksize },
        flags: 0,
    }
}

/// The caller as the kernel names it: copied off the request so a task can
/// own it.
#[derive(Clone, Copy)]
struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl From<&FuseRequest> for Caller {
    fn from(r: &FuseRequest) -> Caller {
        Caller { uid: r.uid(), gid: r.gid(), pid: r.pid() }
    }
}

impl Core {
    fn new(active: Arc<switch::Active>, rt: Handle, opts: MountOptions, client_id: Arc<str>) -> Core {
        Core {
            active: parking_lot::RwLock::new(active),
            lk_gate: tokio::sync::RwLock::new(()),
            held: locks::HeldLocks::default(),
            ended: OnceLock::new(),
            rt,
            inodes: InodeTable::new(opts.inode_lru_limit),
            fds: FdTable::new(opts.max_open_fds),
            client_id,
            inflight: InFlight::default(),
            groups: GroupCache(Mutex::new(HashMap::new())),
            notifier: OnceLock::new(),
            dirs: dir::DirBuffers::default(),
            data: data_cache::DataVersions::default(),
            opts,
        }
    }

    /// The call context for a caller; `groups` reads its supplementary
    /// groups (for fops whose result depends on them).
    fn ctx(&self, c: Caller, lk_owner: u64, groups: bool) -> CallCtx {
        let groups = if groups && c.pid != 0 { self.groups.get(c.pid) } else { Arc::from(Vec::new()) };
        CallCtx {
            uid: c.uid,
            gid: c.gid,
            groups,
            pid: c.pid,
            lk_owner,
            client_id: self.client_id.clone(),
            frame: Default::default(),
        }
    }

    /// Sends one fop to the top of the graph.
    async fn call(&self, ctx: CallCtx, fop: Fop) -> Result<Reply, Errno> {
        self.call_x(ctx, fop, Dict::new()).await
    }

    /// Sends one fop with xdata to the active graph.
    async fn call_x(&self, ctx: CallCtx, fop: Fop, xdata: Dict) -> Result<Reply, Errno> {
        let kind = fop.kind();
        let entered = self.enter();
        let r = self.call_on(&entered.0, ctx, fop, xdata).await;
        tracing::trace!(fop = kind.name(), ok = r.is_ok(), "fop");
        r
    }

    /// The gfid of a node id the kernel holds (ESTALE if unknown).
    fn gfid(&self, nodeid: INodeNo) -> Result<Gfid, Errno> {
        self.inodes.by_nodeid(nodeid.0).map(|i| i.gfid()).ok_or(Errno::ESTALE)
    }

    /// The open fd behind a FUSE file handle (EBADF if not open).
    fn fd(&self, fh: FileHandle) -> Result<Fd, Errno> {
        let id = FdId(fh.0);
        self.fds.get(id).map(|e| Fd { id, gfid: e.gfid }).ok_or(Errno::EBADF)
    }

    /// The node id of a gfid as the kernel knows it, without taking a
    /// lookup (the gfid's own number when it is not cached).
    fn nodeid_of(&self, gfid: Gfid) -> u64 {
        self.inodes.get(gfid).map_or_else(|| gfid.ino(), |i| i.nodeid())
    }

    /// Records an entry handed to the kernel (one more lookup) and returns
    /// its attributes.
    fn entry_attr(&self, parent: Gfid, name: &str, iatt: &Iatt) -> Result<FileAttr, Errno> {
        let inode = self.inodes.lookup_reply(parent, name, iatt.gfid).map_err(|_| Errno::EIO)?;
        Ok(self.kernel_attr(iatt, inode.nodeid()))
    }

    /// Attributes of node `nodeid` as handed to the kernel; with
    /// `auto-invalidation`, a change this mount did not make drops the
    /// file's cached pages (see `data_cache`).
    fn kernel_attr(&self, iatt: &Iatt, nodeid: u64) -> FileAttr {
        if self.opts.auto_invalidation
            && nodeid != 0
            && self.data.saw(iatt)
            && let Some(n) = self.notifier.get().cloned()
        {
            // After the reply: the kernel may hold page locks while it waits.
            self.rt.spawn_blocking(move || {
                if let Err(e) = n.inval_inode(INodeNo(nodeid), 0, 0) {
                    tracing::debug!(nodeid, error = %e, "inval_inode after a change seen in attributes");
                }
            });
        }
        file_attr(iatt, nodeid)
    }

    /// The kernel forgets `n` lookups of `nodeid`; evicted inodes are
    /// forgotten by the graph too.
    fn forget(self: &Arc<Self>, nodeid: u64, n: u64) {
        for gfid in self.inodes.forget(nodeid, n) {
            self.data.forget(gfid);
            let c = self.clone();
            self.spawn(async move {
                let ctx = CallCtx::root(c.client_id.clone());
                if let Err(e) = c.call(ctx, Fop::Forget { gfid }).await {
                    tracing::debug!(%gfid, error = %e, "forget");
                }
            });
        }
    }

    /// Runs `f` on the runtime, counted as in flight.
    /// Runs `f` for a request: polled once right here on the reader
    /// thread, so a fop that does not wait (answered from a cache, or
    /// acknowledged by write-behind) is answered without waking a worker
    /// thread (a wake-up costs more than such a fop); only if it has to
    /// wait is it spawned as a task, and the reader goes on.
    fn spawn(self: &Arc<Self>, f: impl Future<Output = ()> + Send + 'static) {
        let c = self.clone();
        let mut task = Box::pin(async move {
            let _g = c.inflight.enter();
            f.await;
        });
        let _rt = self.rt.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if task.as_mut().poll(&mut cx).is_pending() {
            self.rt.spawn(task);
        }
    }

    /// Runs a fop task and answers with `ok` or the errno.
    fn run<T, R>(
        self: &Arc<Self>,
        reply: R,
        fut: impl Future<Output = Result<T, Errno>> + Send + 'static,
        ok: impl FnOnce(R, T) + Send + 'static,
    ) where
        T: Send + 'static,
        R: ErrorReply + Send + 'static,
    {
        self.spawn(async move {
            match fut.await {
                Ok(v) => ok(reply, v),
                Err(e) => reply.error(fuse_errno(e)),
            }
        });
    }
}

/// A fuser reply that can carry an error.
trait ErrorReply {
    fn error(self, e: fuser::Errno);
}

macro_rules! error_reply {
    ($($t:ty),*) => {$(
        impl ErrorReply for $t {
            fn error(self, e: fuser::Errno) {
                <$t>::error(self, e)
            }
        }
    )*};
}

error_reply!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyLock,
    ReplyLseek,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr
);

/// The `Filesystem` fuser drives: thin glue from each request to a task.
struct Bridge {
    core: Arc<Core>,
}

impl Bridge {
    fn attr_ttl(&self) -> Duration {
        self.core.opts.attribute_timeout
    }
}

/// Answers an entry reply with the mount's timeouts.
fn reply_entry(reply: ReplyEntry, opts: &MountOptions, attr: Option<FileAttr>) {
    match attr {
        Some(a) => reply.entry_with_ttls(&opts.attribute_timeout, &opts.entry_timeout, &a, Generation(0)),
        None => {
            // A negative entry: node id 0, remembered for the negative timeout.
            let mut a = file_attr(&Iatt::default(), 0);
            a.kind = fuser::FileType::RegularFile;
            reply.entry_with_ttls(&Duration::ZERO, &opts.negative_timeout, &a, Generation(0))
        }
    }
}

impl Filesystem for Bridge {
    fn init(&mut self, _req: &FuseRequest, config: &mut KernelConfig) -> std::io::Result<()> {
        let o = &self.core.opts;
        let mut want = InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_FLOCK_LOCKS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES;
        if o.readdirplus {
            want |= InitFlags::FUSE_DO_READDIRPLUS;
        }
        // `auto-invalidation` is the bridge's own (`data_cache`): the kernel's
        // FUSE_AUTO_INVAL_DATA would drop a file's pages after each of its
        // writes. With HANDLE_KILLPRIV_V2 the bricks take set-user-ID and
        // set-group-ID away on writes and truncates (storage/posix), so the
        // kernel stops asking for security.capability before every write.
        want |= InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if o.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if o.direct_io {
            want |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        }
        let have = config.capabilities();
        if let Err(missing) = config.add_capabilities(want & have) {
            tracing::warn!(?missing, "kernel refused FUSE capabilities");
        }
        if !have.contains(want) {
            tracing::info!(missing = ?(want - have), "the kernel lacks some FUSE capabilities");
        }
        let _ = config.set_max_write(o.max_write).or_else(|max| config.set_max_write(max));
        let _ = config.set_max_readahead(o.max_readahead).or_else(|max| config.set_max_readahead(max));
        let _ = config.set_max_background(o.max_background);
        let _ = config.set_congestion_threshold((u32::from(o.max_background) * 3 / 4).max(1) as u16);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        tracing::debug!(?want, "FUSE init");
        Ok(())
    }

    fn destroy(&mut self) {
        tracing::debug!("FUSE session destroyed");
    }

    fn lookup(&self, req: &FuseRequest, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.lookup(who, parent, name?).await }, {
            let c = self.core.clone();
            move |r, a| reply_entry(r, &c.opts, a)
        });
    }

    fn forget(&self, _req: &FuseRequest, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    // batch_forget: fuser 0.18 does not export the type of its argument,
    // so its default (forget for each node) is what runs; that is this
    // `forget`, which needs no fop and no wait.

    fn getattr(&self, req: &FuseRequest, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let (c, who, ttl) = (self.core.clone(), Caller::from(req), self.attr_ttl());
        self.core.run(reply, async move { c.getattr(who, ino, fh).await }, move |r, a| r.attr(&ttl, &a));
    }

    fn setattr(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let (c, who, ttl) = (self.core.clone(), Caller::from(req), self.attr_ttl());
        let set = entry::SetattrArgs { mode, uid, gid, size, atime, mtime, fh };
        self.core.run(reply, async move { c.setattr(who, ino, set).await }, move |r, a| r.attr(&ttl, &a));
    }

    fn readlink(&self, req: &FuseRequest, ino: INodeNo, reply: ReplyData) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.readlink(who, ino).await }, |r, t| r.data(t.as_bytes()));
    }

    fn mknod(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        let fop = move |loc| Fop::Mknod { loc, mode, rdev: rdev.into(), umask };
        self.entry_op(reply, async move { c.make_entry(who, parent, name?, fop).await });
    }

    fn mkdir(&self, req: &FuseRequest, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        let fop = move |loc| Fop::Mkdir { loc, mode, umask };
        self.entry_op(reply, async move { c.make_entry(who, parent, name?, fop).await });
    }

    fn unlink(&self, req: &FuseRequest, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.remove(who, parent, name?, false).await }, |r, ()| r.ok());
    }

    fn rmdir(&self, req: &FuseRequest, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.remove(who, parent, name?, true).await }, |r, ()| r.ok());
    }

    fn symlink(&self, req: &FuseRequest, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(link_name));
        let target = name_str(target.as_os_str());
        self.entry_op(reply, async move {
            let target = target?;
            c.make_entry(who, parent, name?, move |loc| Fop::Symlink { target, loc, umask: 0 }).await
        });
    }

    fn rename(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let (name, newname) = (name_str(name), name_str(newname));
        self.core.run(
            reply,
            async move { c.rename(who, parent, name?, newparent, newname?, flags.bits()).await },
            |r, ()| r.ok(),
        );
    }

    fn link(&self, req: &FuseRequest, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(newname));
        self.entry_op(reply, async move { c.link(who, ino, newparent, name?).await });
    }

    fn open(&self, req: &FuseRequest, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.open(who, ino, flags.0).await }, |r, (fh, f)| r.opened(fh, f));
    }

    fn read(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let owner = lock_owner.map_or(0, |o| o.0);
        self.core.run(reply, async move { c.read(who, owner, fh, offset, size).await }, |r, d| r.data(&d));
    }

    fn write(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let owner = lock_owner.map_or(0, |o| o.0);
        let data = bytes::Bytes::copy_from_slice(data);
        self.core.run(reply, async move { c.write(who, owner, fh, offset, data).await }, |r, n| r.written(n));
    }

    fn flush(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.flush(who, fh, lock_owner.0).await }, |r, ()| r.ok());
    }

    fn release(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let owner = lock_owner.map(|o| o.0);
        self.core.run(reply, async move { c.release(who, fh, owner, flush).await }, |r, ()| r.ok());
    }

    fn fsync(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.fsync(who, fh, datasync, false).await }, |r, ()| r.ok());
    }

    fn opendir(&self, req: &FuseRequest, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.opendir(who, ino).await }, |r, (fh, f)| r.opened(fh, f));
    }

    fn readdir(&self, req: &FuseRequest, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.spawn(async move { c.readdir(who, ino, fh, offset, reply).await });
    }

    fn readdirplus(&self, req: &FuseRequest, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.spawn(async move { c.readdirplus(who, ino, fh, offset, reply).await });
    }

    fn releasedir(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.releasedir(who, fh).await }, |r, ()| r.ok());
    }

    fn fsyncdir(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.fsync(who, fh, datasync, true).await }, |r, ()| r.ok());
    }

    fn statfs(&self, req: &FuseRequest, ino: INodeNo, reply: ReplyStatfs) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.statfs(who, ino).await }, |r, s| {
            let (bsize, frsize) = (s.bsize.min(u32::MAX.into()) as u32, s.frsize.min(u32::MAX.into()) as u32);
            r.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, bsize, s.namemax.min(255) as u32, frsize)
        });
    }

    fn setxattr(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        let value = bytes::Bytes::copy_from_slice(value);
        self.core.run(reply, async move { c.setxattr(who, ino, name?, value, flags as u32).await }, |r, ()| r.ok());
    }

    fn getxattr(&self, req: &FuseRequest, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.getxattr(who, ino, name?).await }, move |r, v| xattr_reply(r, size, &v));
    }

    fn listxattr(&self, req: &FuseRequest, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.listxattr(who, ino).await }, move |r, v| xattr_reply(r, size, &v));
    }

    fn removexattr(&self, req: &FuseRequest, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.removexattr(who, ino, name?).await }, |r, ()| r.ok());
    }

    fn access(&self, req: &FuseRequest, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.access(who, ino, mask.bits() as u32).await }, |r, ()| r.ok());
    }

    fn create(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        let ttl = self.attr_ttl();
        self.core.run(
            reply,
            async move { c.create(who, parent, name?, mode, umask, flags as u32).await },
            move |r, (attr, fh, f)| r.created(&ttl, &attr, Generation(0), fh, f),
        );
    }

    fn getlk(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let lk = locks::FuseLock { start, end, typ, pid };
        self.core.run(reply, async move { c.getlk(who, fh, lock_owner.0, lk).await }, |r, l| {
            r.locked(l.start, l.end, l.typ, l.pid)
        });
    }

    fn setlk(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let lk = locks::FuseLock { start, end, typ, pid };
        self.core.run(reply, async move { c.setlk(who, fh, lock_owner.0, lk, sleep).await }, |r, ()| r.ok());
    }

    fn fallocate(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.fallocate(who, fh, offset, length, mode as u32).await }, |r, ()| r.ok());
    }

    fn lseek(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.lseek(who, fh, offset, whence).await }, |r, o| r.offset(o));
    }

    fn copy_file_range(
        &self,
        req: &FuseRequest,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let flags = flags.bits() as u32;
        self.core.run(
            reply,
            async move { c.copy_file_range(who, fh_in, offset_in, fh_out, offset_out, len, flags).await },
            |r, n| r.written(n),
        );
    }
}

impl Bridge {
    /// Runs an entry-making fop and answers with the entry.
    fn entry_op(&self, reply: ReplyEntry, fut: impl Future<Output = Result<FileAttr, Errno>> + Send + 'static) {
        let c = self.core.clone();
        self.core.run(reply, fut, move |r, a| reply_entry(r, &c.opts, Some(a)));
    }
}

/// Answers getxattr/listxattr: the size when asked for it, ERANGE when the
/// value does not fit.
fn xattr_reply(r: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        r.size(v.len() as u32);
    } else if v.len() > size as usize {
        r.error(fuser::Errno::ERANGE);
    } else {
        r.data(v);
    }
}

/// A mounted graph: serves FUSE requests until unmounted.
pub struct Mount {
    core: Arc<Core>,
    mountpoint: PathBuf,
    ended: watch::Receiver<bool>,
    session: Mutex<Option<std::thread::JoinHandle<std::io::Result<()>>>>,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("mountpoint", &self.mountpoint).finish()
    }
}

/// How long an unmount waits for the kernel to let go of a busy mount
/// before it detaches it lazily.
const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

impl Mount {
    /// Mounts `top` (an active graph's top) on `mountpoint` and starts
    /// serving. `upcalls` carries the graph's upcalls (invalidations).
    /// The caller keeps the graph (and shuts it down); a later
    /// [`Mount::switch`] leaves it to the caller too.
    /// Blocks for the mount and the FUSE handshake: call it from a blocking
    /// context (such as `spawn_blocking`) inside a tokio runtime.
    pub fn new(
        top: Child,
        upcalls: Option<broadcast::Receiver<Upcall>>,
        mountpoint: &Path,
        opts: MountOptions,
        rt: Handle,
    ) -> Result<Mount, FuseError> {
        Mount::start(switch::Active::new(1, top, None), upcalls, mountpoint, opts, rt)
    }

    /// Mounts `graph` (activated and up), which the mount then owns: a
    /// [`Mount::switch`] away from it shuts it down once drained. Blocks as
    /// [`Mount::new`] does.
    pub fn with_graph(
        graph: Arc<Graph>,
        mountpoint: &Path,
        opts: MountOptions,
        rt: Handle,
    ) -> Result<Mount, FuseError> {
        let upcalls = graph.upcalls();
        Mount::start(switch::Active::new(1, graph.top(), Some(graph)), Some(upcalls), mountpoint, opts, rt)
    }

    fn start(
        active: switch::Active,
        upcalls: Option<broadcast::Receiver<Upcall>>,
        mountpoint: &Path,
        opts: MountOptions,
        rt: Handle,
    ) -> Result<Mount, FuseError> {
        let mountpoint = std::fs::canonicalize(mountpoint)
            .map_err(|source| FuseError::MountPoint { path: mountpoint.to_path_buf(), source })?;
        if !mountpoint.is_dir() {
            let source = std::io::Error::from_raw_os_error(libc::ENOTDIR);
            return Err(FuseError::MountPoint { path: mountpoint, source });
        }
        let client_id: Arc<str> =
            Arc::from(format!("fuse-{}-{}-{}", hostname(), std::process::id(), mountpoint.display()));
        let active = Arc::new(active);
        let core = Arc::new(Core::new(active.clone(), rt.clone(), opts, client_id));
        let config = core.opts.fuser_config();
        let session = fuser::Session::new(Bridge { core: core.clone() }, &mountpoint, &config)
            .map_err(|source| FuseError::Mount { path: mountpoint.clone(), source })?;
        let _ = core.notifier.set(session.notifier());
        let (tx, ended) = watch::channel(false);
        let _ = core.ended.set(ended.clone());
        let session = std::thread::Builder::new()
            .name("fuse-session".into())
            .spawn(move || {
                let r = session.run();
                let _ = tx.send(true);
                r
            })
            .map_err(FuseError::Session)?;
        set_readahead(&mountpoint, core.opts.max_readahead);
        if let Some(rx) = upcalls {
            core.watch_upcalls(&active, rx);
        }
        tracing::info!(mountpoint = %mountpoint.display(), options = %core.opts.to_option_string(), "mounted");
        Ok(Mount { core, mountpoint, ended, session: Mutex::new(Some(session)) })
    }

    /// Moves the mount to `graph` (activated, and up) while it serves:
    /// every open fd is reopened on it, the locks the mount holds move,
    /// new fops go to it, and the old graph drains; an old graph the mount
    /// owns is then shut down and dropped. The mount owns `graph` from now
    /// on. In-flight fops are not failed by the switch.
    pub async fn switch(&self, graph: Arc<Graph>) -> SwitchReport {
        self.core.switch(graph.top(), Some(graph)).await
    }

    /// The active graph's generation: 1 at mount, one more per switch.
    pub fn generation(&self) -> u64 {
        self.core.current().generation
    }

    /// The active graph, if the mount owns it.
    pub fn graph(&self) -> Option<Arc<Graph>> {
        self.core.current().graph.clone()
    }

    /// Locks the mount holds and would move in a switch, as (inode, owner)
    /// pairs (for diagnosis and tests).
    pub fn held_locks(&self) -> usize {
        self.core.held.len()
    }

    /// The mount point (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The client id fops carry ([`CallCtx::client_id`]).
    pub fn client_id(&self) -> &str {
        &self.core.client_id
    }

    /// Waits until the session ends (the file system was unmounted, by
    /// [`Mount::unmount`] or from outside).
    pub async fn ended(&self) {
        let mut rx = self.ended.clone();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// Unmounts: a plain unmount, or if the mount is busy, a lazy one (no
    /// new opens; the files still open keep working) followed by up to
    /// `UNMOUNT_WAIT` for their users to close them (past that, they see
    /// ENOTCONN once this process exits); then waits up to `drain` for the
    /// fops in flight. The graph is left to the caller to shut down.
    pub async fn unmount(&self, drain: Duration) -> Result<(), FuseError> {
        let mp = self.mountpoint.clone();
        if !*self.ended.borrow() {
            match umount(&mp, 0) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    tracing::info!(wait = ?UNMOUNT_WAIT, "mount busy: detached lazily; waiting for its files to close");
                    lazy_unmount(&mp).map_err(|source| FuseError::Unmount { path: mp.clone(), source })?;
                }
                // Unmounted meanwhile (from outside).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !is_mount_point(&mp) => {}
                Err(source) => return Err(FuseError::Unmount { path: mp, source }),
            }
        }
        if tokio::time::timeout(UNMOUNT_WAIT, self.ended()).await.is_err() {
            tracing::warn!("files still open on the detached mount; their users will see ENOTCONN");
        }
        if !self.core.inflight.drained(drain).await {
            tracing::warn!(left = self.core.inflight.count.load(Ordering::Acquire), "fops still in flight at unmount");
        }
        if *self.ended.borrow() {
            let handle = self.session.lock().take();
            if let Some(h) = handle {
                let joined = tokio::task::spawn_blocking(move || h.join()).await;
                if let Ok(Ok(Err(e))) = joined {
                    tracing::debug!(error = %e, "FUSE session ended with an error");
                }
            }
        }
        Ok(())
    }

    /// Inodes and open fds the bridge holds (for diagnosis and tests).
    pub fn table_sizes(&self) -> (usize, usize) {
        (self.core.inodes.len(), self.core.fds.len())
    }
}

/// Detaches a mount lazily (`umount -l`).
pub fn lazy_unmount(mountpoint: &Path) -> std::io::Result<()> {
    umount(mountpoint, libc::MNT_DETACH)
}

/// `umount2(2)`.
pub fn umount(mountpoint: &Path, flags: libc::c_int) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// True if something is mounted on `path` (from `/proc/self/mountinfo`).
fn is_mount_point(path: &Path) -> bool {
    mount_device(path).is_some()
}

/// Sets the mount's read-ahead window on its backing device
/// (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`): the kernel caps what INIT may
/// ask for at its default (128 KiB); root may raise it afterwards. The
/// device comes from `/proc/self/mountinfo`, not from a stat, which would
/// be a FUSE request of its own.
fn set_readahead(mountpoint: &Path, bytes: u32) {
    let Some(dev) = mount_device(mountpoint) else {
        tracing::info!("cannot find the mount's device; the kernel's read-ahead applies");
        return;
    };
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, format!("{}", bytes / 1024)) {
        Ok(()) => tracing::debug!(path, kb = bytes / 1024, "read-ahead set"),
        Err(e) => tracing::info!(path, error = %e, "cannot set read-ahead; the kernel's default applies"),
    }
}

/// The `MAJ:MIN` of the newest mount on `mountpoint`.
fn mount_device(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo_device(&info, &mountpoint.display().to_string())
}

fn mountinfo_device(info: &str, mountpoint: &str) -> Option<String> {
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && f[4] == mountpoint).then(|| f[2].to_string())
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_come_from_proc_status() {
        let s = "Name:\tx\nUid:\t0\t0\t0\t0\nGroups:\t4 24 27 \nNgid:\t0\n";
        assert_eq!(parse_groups(s), Some(vec![4, 24, 27]));
        assert_eq!(parse_groups("Groups:\n"), Some(vec![]));
        assert_eq!(parse_groups("Name: x\n"), None);
        // Our own process has a status file with a Groups line.
        let own = GroupCache(Mutex::new(HashMap::new())).get(std::process::id());
        let expect = parse_groups(&std::fs::read_to_string("/proc/self/status").expect("status")).expect("groups");
        assert_eq!(&own[..], &expect[..]);
    }

    #[test]
    fn mount_device_comes_from_mountinfo() {
        let info = "22 1 0:20 / /proc rw - proc proc rw\n\
                    90 25 0:53 / /mnt/x rw,nosuid - fuse xlfs rw\n\
                    91 90 0:54 / /mnt/x rw - fuse xlfs rw\n";
        assert_eq!(mountinfo_device(info, "/mnt/x").as_deref(), Some("0:54"), "the newest mount");
        assert_eq!(mountinfo_device(info, "/mnt"), None);
    }

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for t in
            [Timespec { sec: 0, nsec: 0 }, Timespec { sec: 1_700_000_000, nsec: 5 }, Timespec { sec: -2, nsec: 250 }]
        {
            assert_eq!(timespec(system_time(t)), t);
        }
    }

    #[test]
    fn attributes_carry_type_perms_and_node_id() {
        let iatt = Iatt {
            gfid: Gfid::ROOT,
            mode: libc::S_IFDIR | 0o1755,
            nlink: 3,
            uid: 7,
            gid: 8,
            size: 4096,
            blocks: 8,
            blksize: 0,
            mtime: Timespec { sec: 10, nsec: 1 },
            ..Iatt::default()
        };
        let a = file_attr(&iatt, 42);
        assert_eq!(
            (a.ino, a.kind, a.perm, a.nlink, a.uid, a.gid),
            (INodeNo(42), fuser::FileType::Directory, 0o1755, 3, 7, 8)
        );
        assert_eq!((a.size, a.blocks, a.blksize), (4096, 8, 4096));
        assert_eq!(a.mtime, UNIX_EPOCH + Duration::new(10, 1));
        assert_eq!(fuse_kind(FileType::Fifo), fuser::FileType::NamedPipe);
        assert_eq!(name_str(OsStr::new("ok")), Ok("ok".to_string()));
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(name_str(OsStr::from_bytes(b"\xff")), Err(Errno(libc::EILSEQ)));
    }

    #[tokio::test]
    async fn in_flight_drains() {
        let f = Arc::new(InFlight::default());
        assert!(f.drained(Duration::from_millis(1)).await);
        let g = f.enter();
        assert!(!f.drained(Duration::from_millis(20)).await);
        let f2 = f.clone();
        let waiter = tokio::spawn(async move { f2.drained(Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        drop(g);
        assert!(waiter.await.expect("joins"));
    }
}
