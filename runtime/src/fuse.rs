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
//! `bridge` is the `fuser::Filesystem` impl; the per-group code is in
//! [`entry`](self) (names and attributes), `io` (files), `dir`
//! (directories), `locks` (POSIX locks and flock) and `upcall`
//! (invalidations from the bricks); `attr` converts attributes, `caller`
//! makes a request's identity into a [`CallCtx`]; [`options`] holds the
//! mount options. [`Mount`] (`mount`) mounts, serves and unmounts.
//!
//! **Graph switch.** Fops go to the mount's active graph, which
//! [`Mount::switch`] replaces while the mount serves: open fds are reopened
//! on the new graph, the locks the mount holds move with them, and the old
//! graph drains before it is shut down (see [`switch`]).

mod attr;
mod bridge;
mod caller;
mod data_cache;
mod dir;
mod entry;
mod io;
mod locks;
mod mount;
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

use attr::*;
use bridge::*;
use caller::*;
pub use mount::{FuseError, Mount, lazy_unmount, umount};
pub use options::{MountOptions, OptionsError};
pub use switch::SwitchReport;

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

/// What the bridge shares between reader threads and tasks.
pub(crate) struct Core {
    /// The graph fops go to (replaced by a switch).
    active: parking_lot::RwLock<Arc<switch::Active>>,
    /// Lock fops, flush and release pass here; a switch closes it while
    /// it moves the locks.
    lk_gate: tokio::sync::RwLock<()>,
    held: locks::HeldLocks,
    /// Releases on their way that drop locks, which later lock fops wait for.
    unlocking: Arc<locks::Unlocking>,
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
/// The errno handed to the kernel for `e`. The kernel refuses a reply
/// whose error is not in 1..512 and leaves the request (and the
/// application) waiting for good; whatever a translator, a plugin or a
/// brick answered, such a value becomes EIO, logged.
fn fuse_errno(e: Errno) -> fuser::Errno {
    match e.raw() {
        n @ 1..512 => fuser::Errno::from_i32(n),
        n => {
            warn_bad_reply(format_args!("error {n} is not an errno the kernel takes: EIO instead"));
            fuser::Errno::EIO
        }
    }
}

/// Logs a reply the bridge refused to hand to the kernel (the first ten,
/// then one in a thousand: a translator that does it does it often).
fn warn_bad_reply(what: std::fmt::Arguments<'_>) {
    static SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if n < 10 || n.is_multiple_of(1000) {
        tracing::warn!(refused_so_far = n + 1, "the graph answered the kernel wrongly: {what}");
    }
}

/// A name from the kernel as the fop model's UTF-8 string (EILSEQ if not).
fn name_str(name: &OsStr) -> Result<String, Errno> {
    name.to_str().map(str::to_string).ok_or(Errno(libc::EILSEQ))
}

impl Core {
    fn new(active: Arc<switch::Active>, rt: Handle, opts: MountOptions, client_id: Arc<str>) -> Core {
        Core {
            active: parking_lot::RwLock::new(active),
            lk_gate: tokio::sync::RwLock::new(()),
            held: locks::HeldLocks::default(),
            unlocking: Arc::default(),
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
        match r {
            // A success of the wrong kind (a WRITE answered with nothing)
            // would tell the application that what did not happen did.
            Ok(reply) if reply.kind() != kind.reply() => {
                warn_bad_reply(format_args!(
                    "{} answered with a {:?} reply, not {:?}: EIO",
                    kind.name(),
                    reply.kind(),
                    kind.reply()
                ));
                Err(Errno::EIO)
            }
            r => r,
        }
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
        // An entry is neither the root nor its own parent, and has a gfid:
        // taken as given, such an answer would alias the root (every later
        // fop through it fails) or loop the tree.
        let aliased = (iatt.gfid == Gfid::ROOT || iatt.gfid == parent) && name != "." && name != "..";
        if iatt.gfid.is_null() || aliased {
            warn_bad_reply(format_args!("{name:?} under {parent} answered with gfid {}: EIO", iatt.gfid));
            return Err(Errno::EIO);
        }
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

    /// Runs `f` for a request, counted as in flight: polled once right here
    /// on the reader thread, so a fop that does not wait (answered from a
    /// cache, or acknowledged by write-behind) is answered without waking a
    /// worker thread (a wake-up costs more than such a fop); one that waits
    /// becomes a task when it is woken (`task::run_here`), and the reader
    /// goes on.
    fn spawn(self: &Arc<Self>, f: impl Future<Output = ()> + Send + 'static) {
        let c = self.clone();
        xlfs_xlators::task::run_here(&self.rt, async move {
            let _g = c.inflight.enter();
            f.await;
        });
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

#[cfg(test)]
mod tests {
    use super::mount::mountinfo_device;
    use super::*;

    #[test]
    fn errnos_the_kernel_refuses_become_eio() {
        for (given, sent) in [
            (libc::ENOENT, libc::ENOENT),
            (511, 511),
            (512, libc::EIO),
            (600, libc::EIO),
            (0, libc::EIO),
            (-5, libc::EIO),
        ] {
            assert_eq!(i32::from(fuse_errno(Errno(given))), sent, "{given}");
        }
    }

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
