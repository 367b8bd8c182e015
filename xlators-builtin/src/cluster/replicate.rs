//! cluster/replicate: synchronous replication over its children (GlusterFS's
//! AFR, "automatic file replication").
//!
//! Every modifying fop runs as a transaction on all children that are up
//! (`transaction`): AFR's own lock (domain: this volume's name), a pre-op
//! raising pending counters kept in `trusted.afr.<child>` xattrs
//! (`pending`), the fop, a post-op leaving the counters raised only
//! against children that failed, and the unlock. Data transactions keep
//! the lock and delay the post-op between back-to-back writes
//! (`eager_lock`); a lock-contention policy
//! ([`xlfs_sdk::policy::lock_contention`]) decides when another client's
//! need ends that. Reads go to one good child and fail over (`read`);
//! client quorum refuses modifying fops when too few children are up
//! (`quorum`). Fds are opened on every child under the same id (`fds`).
//!
//! Up and down: AFR follows each child's ChildUp / ChildDown, says ChildUp
//! to its parents when the first child is up and ChildDown when none is.
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
mod eager_lock;
mod entry_lock;
mod fds;
mod group_commit;
pub mod heal;
mod lock;
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
use xlfs_sdk::policy::lock_contention::{self, LockContentionPolicy};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, EntrylkCmd, Errno, Event, EventFrom, Fd, Fop, FopFlags, FopFuture, FopKind, FopResult, InitCtx,
    InitError, LkCmd, LockType, OptType, OptionDecl, Options, Reply, Request, Response, Upcall, Xlator, XlatorType,
};

use self::eager_lock::{Inodes, Why};
use self::fds::{FdCtx, Fds};
use self::pending::{Kind, Mask, all, bit, members};
use self::quorum::Quorum;
use self::read::ReadStats;

pub use self::read::IS_LOCAL;

// The request xdata key asking storage/posix for the number of fds open
// on the inode (for the fd-count policy).
use crate::storage::posix::OPEN_FD_COUNT;

/// Most children AFR takes.
pub const MAX_CHILDREN: usize = 64;

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "cluster/replicate",
    description: "synchronous replication (AFR): transactions with pending counters, eager lock, quorum, read-child choice",
    options: OPTIONS,
    min_children: 1,
    max_children: MAX_CHILDREN,
    build,
};

const NO_EFFECT: &str = "Accepted for GlusterFS volfiles; no effect in xlfs.";

const OPTIONS: &[OptionDecl] = &[
    OptionDecl::new("lock-contention-policy", OptType::Str).default("notify").desc(
        "When to give up the eager lock for another client: 'notify' releases on the locks translator's \
         contention upcall (as GlusterFS's erasure-coding translator); 'inodelk-count' when a brick reports more \
         than one inodelk on the inode with a lock or write reply (GlusterFS since 2018); 'fd-count' whenever the \
         file has more than one open fd (GlusterFS before 2018, for experiments); or '<scheme>:<module>' for a \
         plugin policy. Default notify: on the pgbench-like workload (several fds per file, small writes and \
         fsyncs) notify and inodelk-count send the same few lock and xattrop fops, over 20x fewer than fd-count; \
         with two clients on one file notify hands the lock over as soon as the other waits, even while the \
         holder is idle in its post-op delay, where inodelk-count only learns of the waiter from its next write \
         (so an idle holder keeps the waiter waiting up to post-op-delay-secs).",
    ),
    OptionDecl::new("post-op-delay-secs", OptType::Int).default("1").range(0.0, 86400.0).desc(
        "How long the eager lock and the delayed post-op wait for the next write on the inode before the post-op \
         is written and the lock released. 0: post-op and release after every transaction.",
    ),
    OptionDecl::new("eager-lock", OptType::Bool)
        .default("on")
        .desc("Keep the inode lock and delay the post-op across back-to-back data transactions on an inode."),
    OptionDecl::new("entry-eager-lock", OptType::Bool).default("on").desc(
        "Directory delegation: the first entry transaction (create, mknod, mkdir, symlink, link, unlink, rename \
         within one directory) locks the whole directory on every child and keeps the lock for \
         post-op-delay-secs, so later ones in that directory cost one round trip instead of three. Another \
         client's (or rmdir's, or heal's) entry lock in the directory makes it return the lock at once \
         (contention upcall). Needs optimistic-change-log; xlfs only.",
    ),
    OptionDecl::new("async-dirops", OptType::Bool).default("on").desc(
        "Asynchronous directory operations: while this client holds a directory's delegation and knows its \
         names, a create or mkdir of an absent name and an unlink of a known file are answered at once and \
         sent to the bricks behind, in order, one at a time. A later failure is logged and returned by the next \
         operation on that inode (write, fsync, close...) and the next fsync of the directory. Needs \
         entry-eager-lock; xlfs only (CephFS's async dirops).",
    ),
    OptionDecl::new("async-dirops-queue", OptType::Int)
        .default("4096")
        .range(1.0, 1_000_000.0)
        .desc("Most directory operations answered early and not yet done on the bricks; beyond, the next waits."),
    OptionDecl::new("optimistic-change-log", OptType::Bool).default("on").desc(
        "Metadata and entry transactions that lock every child skip the pre-op and write counters only when the \
         fop failed somewhere (as GlusterFS).",
    ),
    OptionDecl::new("ensure-durability", OptType::Bool).default("on").desc(
        "Before the post-op clears the counters of a window that saw writes, make its writes durable on its \
         children (through the window's fd, if one is still open), so a cleared counter never hides unflushed \
         data. Windows ending at the same time share one syncfs per child (group commit) instead of an fsync \
         per file.",
    ),
    OptionDecl::new("quorum-type", OptType::Enum(&["none", "auto", "fixed"])).default("none").desc(
        "Client quorum for modifying fops: 'auto' needs more than half of the children up, locked and successful \
         (exactly half if the first is among them), 'fixed' needs quorum-count. When not given: auto with more \
         than two children, as GlusterFS. Without quorum, modifying fops fail with ENOTCONN and change nothing.",
    ),
    OptionDecl::new("quorum-count", OptType::Int)
        .range(1.0, MAX_CHILDREN as f64)
        .desc("The number of children quorum-type 'fixed' needs."),
    OptionDecl::new("quorum-reads", OptType::Bool).default("off").desc(
        "Also refuse reads (with ENOTCONN) without quorum. Off: reads are served by any good child (GlusterFS now \
         always refuses them; xlfs keeps them available).",
    ),
    OptionDecl::new("read-subvolume", OptType::Str)
        .desc("Read from this child (by volume name) when it is up and not stale."),
    OptionDecl::new("read-subvolume-index", OptType::Int)
        .default("-1")
        .range(-1.0, (MAX_CHILDREN - 1) as f64)
        .desc("Read from the child with this index when it is up and not stale; -1: chosen by read-hash-mode."),
    OptionDecl::new("read-hash-mode", OptType::Int).default("1").range(0.0, 5.0).desc(
        "How the read child is chosen: 0 first good child, 1 hash of the gfid (all clients read a file from the \
         same child), 2 hash of the gfid and the caller's pid, 3 fewest reads outstanding, 4 lowest read \
         latency (this client's moving average), 5 latency times outstanding reads.",
    ),
    OptionDecl::new("choose-local", OptType::Bool).default("true").desc(
        "Prefer children that say they are local (xlfs.is-local in their root lookup reply) when read-subvolume \
         is not set.",
    ),
    OptionDecl::new("afr-pending-xattr", OptType::List).desc(
        "One name per child, in order: child i's pending counters are kept in trusted.afr.<name i>. Default: the \
         children's volume names.",
    ),
    OptionDecl::new("volume-id", OptType::Str).desc("The volume's id, shown in dumps."),
    OptionDecl::new("arbiter-count", OptType::Int).range(0.0, 0.0).desc("Arbiter bricks are not supported: 0 only."),
    OptionDecl::new("data-change-log", OptType::Bool).default("on").desc("Accepted for GlusterFS volfiles; no effect."),
    OptionDecl::new("metadata-change-log", OptType::Bool)
        .default("on")
        .desc("Accepted for GlusterFS volfiles; no effect."),
    OptionDecl::new("entry-change-log", OptType::Bool)
        .default("on")
        .desc("Accepted for GlusterFS volfiles; no effect."),
    OptionDecl::new("use-compound-fops", OptType::Bool)
        .default("off")
        .desc("Accepted for GlusterFS volfiles; no effect."),
    OptionDecl::new("use-anonymous-inode", OptType::Bool).default("off").desc(NO_EFFECT),
    OptionDecl::new("granular-entry-heal", OptType::Bool)
        .default("off")
        .desc("Accepted for GlusterFS volfiles; entry heal always compares whole directories in xlfs."),
    OptionDecl::new("iam-self-heal-daemon", OptType::Bool).default("off").desc(
        "Accepted for GlusterFS volfiles; xlfs's heal daemon is `xlfs heal --daemon`, which drives any client graph.",
    ),
    OptionDecl::new("self-heal-daemon", OptType::Bool)
        .default("on")
        .desc("Accepted for GlusterFS volfiles (whether glusterd runs a heal daemon); no effect in the client."),
    OptionDecl::new("entry-self-heal", OptType::Bool)
        .default("on")
        .desc("A lookup that finds a directory's entries stale on a child starts a background entry heal of it."),
    OptionDecl::new("data-self-heal", OptType::Bool)
        .default("on")
        .desc("A lookup that finds a file's data stale on a child starts a background data heal of it."),
    OptionDecl::new("metadata-self-heal", OptType::Bool)
        .default("on")
        .desc("A lookup that finds an inode's metadata stale on a child starts a background metadata heal of it."),
    OptionDecl::new("background-self-heal-count", OptType::Int).default("8").range(0.0, 256.0).desc(
        "Background heals started by lookups that run at once (0: lookups start none). Taken at start; a \
         reconfigure changes only the queue bound below.",
    ),
    OptionDecl::new("heal-wait-queue-length", OptType::Int).default("128").range(0.0, 10000.0).desc(
        "Background heals that may wait beyond those running; more are not started (the heal daemon finds them).",
    ),
    OptionDecl::new("data-self-heal-algorithm", OptType::Enum(&["full", "diff"])).desc(
        "How data is healed: 'full' copies every block, 'diff' compares checksums (rchecksum) per 128 KiB block \
         and copies only the blocks that differ. Not set: full when every stale copy is empty, else diff \
         (as GlusterFS).",
    ),
    OptionDecl::new("data-self-heal-window-size", OptType::Int)
        .default("8")
        .range(1.0, 1024.0)
        .desc("128 KiB blocks a data heal reads, compares and writes at once."),
    OptionDecl::new("heal-timeout", OptType::Int).default("600").range(5.0, 2_147_483_647.0).desc(
        "Accepted for GlusterFS volfiles (the heal daemon's crawl interval); `xlfs heal --daemon --interval` \
         sets it in xlfs.",
    ),
    OptionDecl::new("shd-max-threads", OptType::Int)
        .default("1")
        .range(1.0, 64.0)
        .desc("Inodes the heal daemon's index heal heals at once."),
    OptionDecl::new("shd-wait-qlength", OptType::Int).default("1024").range(1.0, 655_536.0).desc(NO_EFFECT),
    OptionDecl::new("favorite-child-policy", OptType::Enum(&["none", "size", "ctime", "mtime", "majority"]))
        .default("none")
        .desc(
            "Resolve data and metadata split-brains automatically during any heal: 'size' takes the biggest file, \
             'mtime' / 'ctime' the latest modification / change time, 'majority' a copy more than half of the \
             children agree with (data: same size and mtime; metadata: same mode and owner); a tie leaves the \
             split-brain. 'none': split-brains wait for `xlfs heal split-brain`.",
        ),
    OptionDecl::new("metadata-splitbrain-forced-heal", OptType::Bool).default("off").desc(NO_EFFECT),
    OptionDecl::new("node-uuid", OptType::Str).desc(NO_EFFECT),
];

/// Settings from the options (swapped whole by reconfigure).
struct Config {
    policy: Arc<dyn LockContentionPolicy>,
    post_op_delay: Duration,
    eager_lock: bool,
    entry_eager_lock: bool,
    async_dirops: bool,
    async_queue: usize,
    optimistic: bool,
    ensure_durability: bool,
    quorum: Quorum,
    quorum_reads: bool,
    read_child: Option<usize>,
    hash_mode: i64,
    choose_local: bool,
    data_heal: bool,
    metadata_heal: bool,
    entry_heal: bool,
    bg_count: usize,
    wait_qlen: usize,
    heal_algo: heal::Algo,
    heal_window: usize,
    shd_threads: usize,
    favorite: Option<heal::Choice>,
}

impl Config {
    fn from_options(o: &Options, children: &[Child]) -> Result<Config, String> {
        let n = children.len();
        let policy =
            lock_contention::resolve(o.str("lock-contention-policy").unwrap_or("notify")).map_err(|e| e.to_string())?;
        let qtype = if o.is_set("quorum-type") { o.str("quorum-type") } else { None };
        let quorum = Quorum::from_options(qtype, o.int("quorum-count"), n);
        if let Quorum::Fixed(k) = quorum
            && k as usize > n
        {
            return Err(format!("quorum-count {k} is more than the {n} children"));
        }
        if qtype == Some("fixed") && o.int("quorum-count").is_none() {
            return Err("quorum-type fixed needs quorum-count".into());
        }
        let read_child = match o.str("read-subvolume") {
            Some(name) => Some(children.iter().position(|c| &*c.name == name).ok_or_else(|| {
                format!(
                    "read-subvolume '{name}' is not a child ({})",
                    children.iter().map(|c| &*c.name).collect::<Vec<_>>().join(", ")
                )
            })?),
            None => match o.int("read-subvolume-index").unwrap_or(-1) {
                i if i < 0 => None,
                i if (i as usize) < n => Some(i as usize),
                i => return Err(format!("read-subvolume-index {i} is not below the {n} children")),
            },
        };
        Ok(Config {
            policy,
            post_op_delay: Duration::from_secs(u64::try_from(o.int("post-op-delay-secs").unwrap_or(1)).unwrap_or(1)),
            eager_lock: o.bool("eager-lock").unwrap_or(true),
            optimistic: o.bool("optimistic-change-log").unwrap_or(true),
            entry_eager_lock: o.bool("entry-eager-lock").unwrap_or(true)
                && o.bool("optimistic-change-log").unwrap_or(true),
            async_dirops: o.bool("async-dirops").unwrap_or(true)
                && o.bool("entry-eager-lock").unwrap_or(true)
                && o.bool("optimistic-change-log").unwrap_or(true),
            async_queue: usize::try_from(o.int("async-dirops-queue").unwrap_or(4096)).unwrap_or(4096).max(1),
            ensure_durability: o.bool("ensure-durability").unwrap_or(true),
            quorum,
            quorum_reads: o.bool("quorum-reads").unwrap_or(false),
            read_child,
            hash_mode: o.int("read-hash-mode").unwrap_or(1),
            choose_local: o.bool("choose-local").unwrap_or(true),
            data_heal: o.bool("data-self-heal").unwrap_or(true),
            metadata_heal: o.bool("metadata-self-heal").unwrap_or(true),
            entry_heal: o.bool("entry-self-heal").unwrap_or(true),
            bg_count: usize::try_from(o.int("background-self-heal-count").unwrap_or(8)).unwrap_or(8),
            wait_qlen: usize::try_from(o.int("heal-wait-queue-length").unwrap_or(128)).unwrap_or(128),
            heal_algo: match o.str("data-self-heal-algorithm") {
                Some("full") => heal::Algo::Full,
                Some("diff") => heal::Algo::Diff,
                _ => heal::Algo::Auto,
            },
            heal_window: usize::try_from(o.int("data-self-heal-window-size").unwrap_or(8)).unwrap_or(8),
            shd_threads: usize::try_from(o.int("shd-max-threads").unwrap_or(1)).unwrap_or(1),
            favorite: o.str("favorite-child-policy").and_then(heal::Choice::from_favorite),
        })
    }
}

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
    /// `trusted.afr.<name i>` per child.
    keys: Vec<String>,
    pending_names: Vec<String>,
    volume_id: Option<String>,
    cfg: RwLock<Arc<Config>>,
    up: AtomicU64,
    /// Children that have said up or down at least once, and whether this
    /// volume told its parents it is up (see `notify`).
    announce: Mutex<(Mask, bool)>,
    local: AtomicU64,
    /// Bumped whenever a child comes up: staleness learned before is
    /// looked up again.
    generation: AtomicU64,
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
}

impl Inner {
    fn cfg(&self) -> Arc<Config> {
        self.cfg.read().clone()
    }

    /// The children up now.
    fn up_mask(&self) -> Mask {
        self.up.load(Ordering::Acquire)
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

    /// Runs a fop to completion on the runtime even if the caller stops
    /// waiting: a transaction dropped halfway would leave brick locks held
    /// and counters unsettled.
    async fn detached(self: Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let Some(h) = self.handle() else { return self.dispatch(ctx, req).await };
        let me = self.clone();
        h.spawn(async move { me.dispatch(ctx, req).await }).await.unwrap_or_else(|e| {
            tracing::error!(volume = %self.name, "replicate task failed: {e}");
            Err(Errno::EIO)
        })
    }

    async fn dispatch(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let whole = (0, u64::MAX);
        if heal::is_control(&req.fop) {
            return self.control(&ctx, &req).await;
        }
        if !is_entry_fop(&req.fop) {
            self.after_early(&req).await?;
        }
        match &req.fop {
            Fop::Ipc { op } if *op == xlfs_sdk::IPC_DRAIN => Ok(Reply::Empty.into()),
            Fop::Lookup { loc } => {
                let loc = loc.clone();
                self.lookup(&ctx, loc, req.xdata).await
            }
            Fop::Stat { .. } | Fop::Fstat { .. } | Fop::Readv { .. } | Fop::Seek { .. } | Fop::Rchecksum { .. } => {
                self.read(&ctx, req, Kind::Data).await
            }
            Fop::Access { .. }
            | Fop::Readlink { .. }
            | Fop::Getxattr { .. }
            | Fop::Fgetxattr { .. }
            | Fop::Statfs { .. } => self.read(&ctx, req, Kind::Metadata).await,
            Fop::Readdir { .. } | Fop::Readdirp { .. } => self.readdir(&ctx, req).await,
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
            Fop::Setattr { loc, .. }
            | Fop::Setxattr { loc, .. }
            | Fop::Removexattr { loc, .. }
            | Fop::Xattrop { loc, .. } => {
                let g = loc.gfid;
                self.inode_txn(&ctx, Kind::Metadata, g, None, req).await
            }
            Fop::Fsetattr { fd, .. }
            | Fop::Fsetxattr { fd, .. }
            | Fop::Fremovexattr { fd, .. }
            | Fop::Fxattrop { fd, .. } => {
                let fd = *fd;
                self.inode_txn(&ctx, Kind::Metadata, fd.gfid, Some(fd), req).await
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
                let fd = *fd;
                self.on_fd(&ctx, fd, req).await
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

    /// Open or opendir on every child up.
    async fn open(self: &Arc<Self>, ctx: &CallCtx, mut req: Request, dir: bool) -> FopResult {
        let (id, flags, gfid) = match &req.fop {
            Fop::Open { loc, flags, fd } => (*fd, *flags, loc.gfid),
            Fop::Opendir { loc, fd } => (*fd, 0, loc.gfid),
            _ => return Err(Errno::EINVAL),
        };
        let gfid = self.resolve_gfid(ctx, gfid, &req).await?;
        if let Fop::Open { loc, .. } | Fop::Opendir { loc, .. } = &mut req.fop {
            loc.gfid = gfid;
        }
        let up = self.up_mask();
        if up == 0 {
            return Err(Errno::ENOTCONN);
        }
        let out = transaction::evaluate(self.fan(ctx, up, &req).await);
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
        }
        out.result
    }

    /// A fop sent to every child the fd is open on (flush, fsyncdir).
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
        let mut undo = Undo { inner: self.clone(), ctx: ctx.clone(), req: Some(Request::new(undo)), got: 0 };
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

fn pending_names(o: &Options, children: &[Child]) -> Result<Vec<String>, String> {
    match o.list("afr-pending-xattr") {
        Some(names) if names.len() == children.len() => Ok(names.to_vec()),
        Some(names) => {
            Err(format!("afr-pending-xattr names {} children, the volume has {}", names.len(), children.len()))
        }
        None => Ok(children.iter().map(|c| c.name.to_string()).collect()),
    }
}

impl Replicate {
    /// Builds the translator from its init context.
    pub fn new(init: InitCtx) -> Result<Replicate, InitError> {
        let InitCtx { name, options, children, events } = init;
        let err = |m: String| InitError::new(format!("{name}: {m}"));
        if children.is_empty() || children.len() > MAX_CHILDREN {
            return Err(err(format!("cluster/replicate takes 1 to {MAX_CHILDREN} subvolumes, got {}", children.len())));
        }
        let cfg = Config::from_options(&options, &children).map_err(err)?;
        let bg = cfg.bg_count;
        let names = pending_names(&options, &children).map_err(err)?;
        let mut base = [0u8; 8];
        base.copy_from_slice(&xlfs_sdk::Gfid::random().0[..8]);
        let n = children.len();
        let inner = Inner {
            keys: names.iter().map(|s| pending::key(s)).collect(),
            pending_names: names,
            volume_id: options.str("volume-id").map(str::to_string),
            cfg: RwLock::new(Arc::new(cfg)),
            up: AtomicU64::new(0),
            announce: Mutex::new((0, false)),
            local: AtomicU64::new(0),
            generation: AtomicU64::new(1),
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
            children,
            name,
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
            // The volume says it is up once its children up make a quorum
            // (so that a mount that waited for it can write at once), or,
            // short of that, once every child has said up or down and one
            // is up (reads work; writes are refused for quorum). It says
            // down when the last child up goes.
            Event::ChildUp | Event::ChildDown => {
                let mut a = me.announce.lock();
                let up = if event == Event::ChildUp {
                    let before = me.up.fetch_or(bit(i), Ordering::AcqRel);
                    if before & bit(i) == 0 {
                        me.generation.fetch_add(1, Ordering::AcqRel);
                        tracing::info!(volume = %me.name, child = %me.children[i].name, "child up");
                    }
                    before | bit(i)
                } else {
                    let before = me.up.fetch_and(!bit(i), Ordering::AcqRel);
                    if before & bit(i) != 0 {
                        tracing::warn!(volume = %me.name, child = %me.children[i].name, "child down");
                    }
                    before & !bit(i)
                };
                a.0 |= bit(i);
                let n = me.children.len();
                let ready = up != 0 && (me.cfg().quorum.met(up, n) || a.0 == all(n));
                if !a.1 && ready {
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
        let cfg = Config::from_options(options, &me.children).map_err(ReconfigureError::Invalid)?;
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
        for ((_, why), n) in WHY.iter().zip(&me.stats.released) {
            out.push((format!("eager-lock.released.{why}"), n.load(Ordering::Relaxed).to_string()));
        }
        out.push(("entry-eager-lock.held".into(), me.dirs.held().to_string()));
        for (k, v) in [
            ("taken", &me.dirs.taken),
            ("joined", &me.dirs.joined),
            ("returned", &me.dirs.returned),
            ("listed", &me.dirs.listed),
            ("absent-hits", &me.dirs.absent_hits),
        ] {
            out.push((format!("entry-eager-lock.{k}"), v.load(Ordering::Relaxed).to_string()));
        }
        for (k, v) in [("answered", &me.early.answered), ("failed", &me.early.failed), ("waits", &me.early.waits)] {
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
