//! cluster/replicate's option declarations (GlusterFS's afr.c option
//! table) and the [`Config`] read from them, swapped whole by reconfigure.

use super::*;

pub(super) const NO_EFFECT: &str = "Accepted for GlusterFS volfiles; no effect in xlfs.";

pub(super) const OPTIONS: &[OptionDecl] = &[
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
    pub(super) fn from_options(o: &Options, children: &[Child]) -> Result<Config, String> {
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

pub(super) fn pending_names(o: &Options, children: &[Child]) -> Result<Vec<String>, String> {
    match o.list("afr-pending-xattr") {
        Some(names) if names.len() == children.len() => Ok(names.to_vec()),
        Some(names) => {
            Err(format!("afr-pending-xattr names {} children, the volume has {}", names.len(), children.len()))
        }
        None => Ok(children.iter().map(|c| c.name.to_string()).collect()),
    }
}
