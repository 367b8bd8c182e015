//! cluster/replicate's option declarations (GlusterFS's afr.c option
//! table) and the [`Config`] read from them, swapped whole by reconfigure.

use super::*;
use xlfs_sdk::options::{Opt, kind};

pub(super) const NO_EFFECT: &str = "Accepted for GlusterFS volfiles; no effect in xlfs.";

const LOCK_CONTENTION_POLICY: Opt<kind::Module> = Opt::module("lock-contention-policy", lock_contention::DEFAULT).desc(
    "When to give up the eager lock for another client: 'notify' releases on the locks translator's \
         contention upcall (as GlusterFS's erasure-coding translator); 'inodelk-count' when a brick reports more \
         than one inodelk on the inode with a lock or write reply (GlusterFS since 2018); 'fd-count' whenever the \
         file has more than one open fd (GlusterFS before 2018, for experiments); or '<scheme>:<module>' for a \
         plugin policy. Default notify: on the pgbench-like workload (several fds per file, small writes and \
         fsyncs) notify and inodelk-count send the same few lock and xattrop fops, over 20x fewer than fd-count; \
         with two clients on one file notify hands the lock over as soon as the other waits, even while the \
         holder is idle in its post-op delay, where inodelk-count only learns of the waiter from its next write \
         (so an idle holder keeps the waiter waiting up to post-op-delay-secs).",
);
const POST_OP_DELAY_SECS: Opt<kind::Int> = Opt::int("post-op-delay-secs", "1").range(0.0, 86400.0).desc(
    "How long the eager lock and the delayed post-op wait for the next write on the inode before the post-op \
         is written and the lock released. 0: post-op and release after every transaction.",
);
const EAGER_LOCK: Opt<kind::Bool> = Opt::bool("eager-lock", true)
    .desc("Keep the inode lock and delay the post-op across back-to-back data transactions on an inode.");
const ENTRY_EAGER_LOCK: Opt<kind::Bool> = Opt::bool("entry-eager-lock", true).desc(
    "Directory delegation: the first entry transaction (create, mknod, mkdir, symlink, link, unlink, rename \
         within one directory) locks the whole directory on every child and keeps the lock for \
         post-op-delay-secs, so later ones in that directory cost one round trip instead of three. Another \
         client's (or rmdir's, or heal's) entry lock in the directory makes it return the lock at once \
         (contention upcall). Needs optimistic-change-log; xlfs only.",
);
const ASYNC_DIROPS: Opt<kind::Bool> = Opt::bool("async-dirops", true).desc(
    "Asynchronous directory operations: while this client holds a directory's delegation and knows its \
         names, a create or mkdir of an absent name and an unlink of a known file are answered at once and \
         sent to the bricks behind, in order, one at a time. A later failure is logged and returned by the next \
         operation on that inode (write, fsync, close...) and the next fsync of the directory. Needs \
         entry-eager-lock; xlfs only (CephFS's async dirops).",
);
const ASYNC_DIROPS_QUEUE: Opt<kind::Int> = Opt::int("async-dirops-queue", "4096")
    .range(1.0, 1_000_000.0)
    .desc("Most directory operations answered early and not yet done on the bricks; beyond, the next waits.");
const OPTIMISTIC_CHANGE_LOG: Opt<kind::Bool> = Opt::bool("optimistic-change-log", true).desc(
    "Metadata and entry transactions that lock every child skip the pre-op and write counters only when the \
         fop failed somewhere (as GlusterFS).",
);
const ENSURE_DURABILITY: Opt<kind::Bool> = Opt::bool("ensure-durability", true).desc(
    "Before the post-op clears the counters of a window that saw writes, make its writes durable on its \
         children (through the window's fd, if one is still open), so a cleared counter never hides unflushed \
         data. Windows ending at the same time share one syncfs per child (group commit) instead of an fsync \
         per file.",
);
const QUORUM_TYPE: Opt<kind::Str> = Opt::optional("quorum-type").words(&["none", "auto", "fixed"]).desc(
    "Client quorum for modifying fops: 'auto' needs more than half of the children up, locked and successful \
         (exactly half if the first is among them), 'fixed' needs quorum-count. Default: auto with more than two \
         children, none with one or two, as GlusterFS. Without quorum, modifying fops fail with ENOTCONN and \
         change nothing.",
);
const QUORUM_COUNT: Opt<kind::Int> = Opt::optional("quorum-count")
    .range(1.0, MAX_CHILDREN as f64)
    .desc("The number of children quorum-type 'fixed' needs.");
const QUORUM_READS: Opt<kind::Bool> = Opt::bool("quorum-reads", false).desc(
    "Also refuse reads (with ENOTCONN) without quorum. Off: reads are served by any good child (GlusterFS now \
         always refuses them; xlfs keeps them available).",
);
const READ_SUBVOLUME: Opt<kind::Str> =
    Opt::optional("read-subvolume").desc("Read from this child (by volume name) when it is up and not stale.");
const READ_SUBVOLUME_INDEX: Opt<kind::Int> = Opt::int("read-subvolume-index", "-1")
    .range(-1.0, (MAX_CHILDREN - 1) as f64)
    .desc("Read from the child with this index when it is up and not stale; -1: chosen by read-hash-mode.");
const READ_HASH_MODE: Opt<kind::Int> = Opt::int("read-hash-mode", "1").range(0.0, 5.0).desc(
    "How the read child is chosen: 0 first good child, 1 hash of the gfid (all clients read a file from the \
         same child), 2 hash of the gfid and the caller's pid, 3 fewest reads outstanding, 4 lowest read \
         latency (this client's moving average), 5 latency times outstanding reads.",
);
const CHOOSE_LOCAL: Opt<kind::Bool> = Opt::bool("choose-local", true).desc(
    "Prefer children that say they are local (xlfs.is-local in their root lookup reply) when read-subvolume \
         is not set.",
);
const AFR_PENDING_XATTR: Opt<kind::List> = Opt::optional("afr-pending-xattr").desc(
    "One name per child, in order: child i's pending counters are kept in trusted.afr.<name i>. Default: the \
         children's volume names. 'dirty' is taken: trusted.afr.dirty is every inode's dirty counter.",
);
const ENTRY_SELF_HEAL: Opt<kind::Bool> = Opt::bool("entry-self-heal", true)
    .desc("A lookup that finds a directory's entries stale on a child starts a background entry heal of it.");
const DATA_SELF_HEAL: Opt<kind::Bool> = Opt::bool("data-self-heal", true)
    .desc("A lookup that finds a file's data stale on a child starts a background data heal of it.");
const METADATA_SELF_HEAL: Opt<kind::Bool> = Opt::bool("metadata-self-heal", true)
    .desc("A lookup that finds an inode's metadata stale on a child starts a background metadata heal of it.");
const BACKGROUND_SELF_HEAL_COUNT: Opt<kind::Int> = Opt::int("background-self-heal-count", "8").range(0.0, 256.0).desc(
    "Background heals started by lookups that run at once (0: lookups start none). Taken at start; a \
         reconfigure changes only the queue bound below.",
);
const HEAL_WAIT_QUEUE_LENGTH: Opt<kind::Int> = Opt::int("heal-wait-queue-length", "128")
    .range(0.0, 10000.0)
    .desc("Background heals that may wait beyond those running; more are not started (the heal daemon finds them).");
const DATA_SELF_HEAL_WINDOW_SIZE: Opt<kind::Int> = Opt::int("data-self-heal-window-size", "8")
    .range(1.0, 1024.0)
    .desc("128 KiB blocks a data heal reads, compares and writes at once.");
const SHD_MAX_THREADS: Opt<kind::Int> =
    Opt::int("shd-max-threads", "1").range(1.0, 64.0).desc("Inodes the heal daemon's index heal heals at once.");
const FAVORITE_CHILD_POLICY: Opt<kind::Str> =
    Opt::one_of("favorite-child-policy", &["none", "size", "ctime", "mtime", "majority"], "none").desc(
        "Resolve data and metadata split-brains automatically during any heal: 'size' takes the biggest file, \
             'mtime' / 'ctime' the latest modification / change time, 'majority' a copy more than half of the \
             children agree with (data: same size and mtime; metadata: same mode and owner); a tie leaves the \
             split-brain. 'none': split-brains wait for `xlfs heal split-brain`.",
    );

const HEAL_ALGORITHM: Opt<kind::Str> = Opt::optional("data-self-heal-algorithm").words(&["full", "diff"]).desc(
    "How data is healed: 'full' copies every block, 'diff' compares checksums (rchecksum) per 128 KiB block \
     and copies only the blocks that differ. Not set: full when every stale copy is empty, else diff \
     (as GlusterFS).",
);

pub(super) const VOLUME_ID: Opt<kind::Str> = Opt::optional("volume-id").desc("The volume's id, shown in dumps.");

pub(super) const OPTIONS: &[OptionDecl] = &[
    LOCK_CONTENTION_POLICY.decl,
    POST_OP_DELAY_SECS.decl,
    EAGER_LOCK.decl,
    ENTRY_EAGER_LOCK.decl,
    ASYNC_DIROPS.decl,
    ASYNC_DIROPS_QUEUE.decl,
    OPTIMISTIC_CHANGE_LOG.decl,
    ENSURE_DURABILITY.decl,
    QUORUM_TYPE.decl,
    QUORUM_COUNT.decl,
    QUORUM_READS.decl,
    READ_SUBVOLUME.decl,
    READ_SUBVOLUME_INDEX.decl,
    READ_HASH_MODE.decl,
    CHOOSE_LOCAL.decl,
    AFR_PENDING_XATTR.decl,
    VOLUME_ID.decl,
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
    ENTRY_SELF_HEAL.decl,
    DATA_SELF_HEAL.decl,
    METADATA_SELF_HEAL.decl,
    BACKGROUND_SELF_HEAL_COUNT.decl,
    HEAL_WAIT_QUEUE_LENGTH.decl,
    HEAL_ALGORITHM.decl,
    DATA_SELF_HEAL_WINDOW_SIZE.decl,
    OptionDecl::new("heal-timeout", OptType::Int).default("600").range(5.0, 2_147_483_647.0).desc(
        "Accepted for GlusterFS volfiles (the heal daemon's crawl interval); `xlfs heal --daemon --interval` \
         sets it in xlfs.",
    ),
    SHD_MAX_THREADS.decl,
    OptionDecl::new("shd-wait-qlength", OptType::Int).default("1024").range(1.0, 655_536.0).desc(NO_EFFECT),
    FAVORITE_CHILD_POLICY.decl,
    OptionDecl::new("metadata-splitbrain-forced-heal", OptType::Bool).default("off").desc(NO_EFFECT),
    OptionDecl::new("node-uuid", OptType::Str).desc(NO_EFFECT),
];

/// Settings from the options (swapped whole by reconfigure).
pub(super) struct Config {
    pub(super) policy: Arc<dyn LockContentionPolicy>,
    pub(super) post_op_delay: Duration,
    pub(super) eager_lock: bool,
    pub(super) entry_eager_lock: bool,
    pub(super) async_dirops: bool,
    pub(super) async_queue: usize,
    pub(super) optimistic: bool,
    pub(super) ensure_durability: bool,
    pub(super) quorum: Quorum,
    pub(super) quorum_reads: bool,
    pub(super) read_child: Option<usize>,
    pub(super) hash_mode: i64,
    pub(super) choose_local: bool,
    pub(super) data_heal: bool,
    pub(super) metadata_heal: bool,
    pub(super) entry_heal: bool,
    pub(super) bg_count: usize,
    pub(super) wait_qlen: usize,
    pub(super) heal_algo: heal::Algo,
    pub(super) heal_window: usize,
    pub(super) shd_threads: usize,
    pub(super) favorite: Option<heal::Choice>,
}

impl Config {
    pub(super) fn from_options(o: &Options, children: &[Child], policies: &Policies) -> Result<Config, String> {
        let n = children.len();
        let policy = policies.lock_contention(LOCK_CONTENTION_POLICY.get(o)).map_err(|e| e.to_string())?;
        let qtype = QUORUM_TYPE.given(o);
        let quorum = Quorum::from_options(qtype, QUORUM_COUNT.given(o), n);
        if let Quorum::Fixed(k) = quorum
            && k as usize > n
        {
            return Err(format!("quorum-count {k} is more than the {n} children"));
        }
        if qtype == Some("fixed") && QUORUM_COUNT.given(o).is_none() {
            return Err("quorum-type fixed needs quorum-count".into());
        }
        let read_child = match READ_SUBVOLUME.given(o) {
            Some(name) => Some(children.iter().position(|c| &*c.name == name).ok_or_else(|| {
                format!(
                    "read-subvolume '{name}' is not a child ({})",
                    children.iter().map(|c| &*c.name).collect::<Vec<_>>().join(", ")
                )
            })?),
            None => match READ_SUBVOLUME_INDEX.get(o) {
                i if i < 0 => None,
                i if (i as usize) < n => Some(i as usize),
                i => return Err(format!("read-subvolume-index {i} is not below the {n} children")),
            },
        };
        Ok(Config {
            policy,
            post_op_delay: Duration::from_secs(POST_OP_DELAY_SECS.count(o) as u64),
            eager_lock: EAGER_LOCK.get(o),
            optimistic: OPTIMISTIC_CHANGE_LOG.get(o),
            entry_eager_lock: ENTRY_EAGER_LOCK.get(o) && OPTIMISTIC_CHANGE_LOG.get(o),
            async_dirops: ASYNC_DIROPS.get(o) && ENTRY_EAGER_LOCK.get(o) && OPTIMISTIC_CHANGE_LOG.get(o),
            async_queue: ASYNC_DIROPS_QUEUE.count(o).max(1),
            ensure_durability: ENSURE_DURABILITY.get(o),
            quorum,
            quorum_reads: QUORUM_READS.get(o),
            read_child,
            hash_mode: READ_HASH_MODE.get(o),
            choose_local: CHOOSE_LOCAL.get(o),
            data_heal: DATA_SELF_HEAL.get(o),
            metadata_heal: METADATA_SELF_HEAL.get(o),
            entry_heal: ENTRY_SELF_HEAL.get(o),
            bg_count: BACKGROUND_SELF_HEAL_COUNT.count(o),
            wait_qlen: HEAL_WAIT_QUEUE_LENGTH.count(o),
            heal_algo: match HEAL_ALGORITHM.given(o) {
                Some("full") => heal::Algo::Full,
                Some("diff") => heal::Algo::Diff,
                _ => heal::Algo::Auto,
            },
            heal_window: DATA_SELF_HEAL_WINDOW_SIZE.count(o),
            shd_threads: SHD_MAX_THREADS.count(o),
            favorite: heal::Choice::from_favorite(FAVORITE_CHILD_POLICY.get(o)),
        })
    }
}

pub(super) fn pending_names(o: &Options, children: &[Child]) -> Result<Vec<String>, String> {
    let names: Vec<String> = match AFR_PENDING_XATTR.given(o) {
        Some(names) if names.len() == children.len() => Ok(names.into_iter().map(str::to_string).collect()),
        Some(names) => {
            Err(format!("afr-pending-xattr names {} children, the volume has {}", names.len(), children.len()))
        }
        None => Ok(children.iter().map(|c| c.name.to_string()).collect()),
    }?;
    match names.iter().find(|n| super::pending::key(n) == super::pending::DIRTY) {
        Some(n) => Err(format!(
            "pending name '{n}' would be AFR's dirty counter: rename that subvolume or give afr-pending-xattr"
        )),
        None => Ok(names),
    }
}
