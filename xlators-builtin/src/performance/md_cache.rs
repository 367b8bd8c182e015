//! performance/md-cache: caches inode attributes, chosen xattrs and
//! directory entries (also negative ones) on the client, as GlusterFS's
//! md-cache and nl-cache do, so that `ls -l` and small-file workloads stop
//! paying a brick round trip for each stat, lookup and
//! `getxattr(security.selinux)` / `getxattr(system.posix_acl_access)`.
//!
//! It sits near the top of a client graph (below debug/io-stats, above
//! write-behind and cluster/replicate).
//!
//! What is cached, per gfid, with the time it was filled:
//! - **attributes** from every reply that carries them (lookup, stat,
//!   fstat, readdirp entries, readv, readlink, the entry replies of
//!   create/mkdir/mknod/symlink/link and their parents, the post
//!   attributes of setattr, truncate, write, fsync, fallocate...). Stat,
//!   fstat and lookup by gfid are answered from fresh attributes.
//! - **xattrs**: per cached name a value or "known absent" (getxattr then
//!   answers ENODATA). Filled by getxattr replies (ENODATA included) and by
//!   *prefetch*: lookup and readdirp requests get an xdata key for each
//!   prefetched name (`security.selinux`, `security.capability`, the two
//!   POSIX ACLs, `xattr-cache-list`); storage/posix returns each value the
//!   inode has in the lookup reply's xdata, and per entry in a readdirp
//!   reply's xdata under
//!   [`xlfs_sdk::dict::keys::dirent_xattr`]; a key
//!   missing from the reply means absent (for readdirp only when the reply
//!   carries [`keys::DIRENT_XATTRS`], i.e. the brick knows the
//!   convention). The keys md-cache added are removed from the reply. An
//!   opendir carries the same names under [`keys::MDC_LOADED_KEY_NAMES`], so performance/readdir-ahead below asks for them in the readdirps it
//!   sends ahead.
//! - **directory entries**: (parent, name) -> gfid from lookup, readdirp and
//!   create-type replies, so a revalidating lookup is answered when the
//!   entry, the inode's and the parent's attributes are all fresh; and
//!   (parent, name) -> absent (nl-cache) from a lookup's ENOENT and from
//!   unlink, rmdir and rename through this client.
//! - **statfs** with `md-cache-statfs`.
//!
//! Keeping it true. A modifying fop updates the cache from its reply:
//! pre/post replies replace the attributes only if the cached ones are the
//! reply's `pre` (otherwise another change raced it, and the attributes are
//! dropped, as GlusterFS's md-cache does); setxattr stores the new `user.*`
//! / `trusted.*` values (and drops `security.*` / `system.*` ones, which the
//! kernel may rewrite), removexattr marks the name absent; create-type fops
//! replace a negative entry by the new one; unlink, rmdir and rename drop
//! the entries and the parents' attributes. A modifying fop that fails
//! drops what it touched. An `Upcall::Invalidate` from below drops the
//! inode's attributes and xattrs and every entry under it (a null gfid:
//! everything) and is passed on upward, to the FUSE bridge; so do ChildUp
//! and ChildDown (a brick that comes back may have changed meanwhile). A
//! Forget drops the inode.
//!
//! Races: every fill from a read reply carries the generation current when
//! the fop was wound; an inode (or, for entries, their parent) changed or
//! invalidated since has a later generation and the fill is dropped, so a
//! slow reply never overwrites newer knowledge.
//!
//! Bounds: `md-cache-max-entries` inodes and as many directory entries (the
//! least recently filled go first); per inode at most
//! [`MAX_XATTRS_PER_INODE`] xattrs of at most [`MAX_XATTR_VALUE`] bytes,
//! and [`MAX_XATTR_BYTES`] of xattr names and values in all (beyond, a
//! value is simply not cached).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::dict::keys;
use xlfs_sdk::options::{OptType, OptionDecl};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, Fd, FdId, Fop, FopFuture, FopResult, Gfid, Iatt, InitCtx, InitError,
    Loc, Options, Reply, Request, Response, Statvfs, Upcall, Value, Xlator, XlatorType, rename_flags,
};

/// The SELinux label xattr.
pub const SELINUX: &str = "security.selinux";
/// The file capabilities xattr.
pub const CAPABILITY: &str = "security.capability";
/// The POSIX access ACL xattr.
pub const ACL_ACCESS: &str = "system.posix_acl_access";
/// The POSIX default ACL xattr (directories).
pub const ACL_DEFAULT: &str = "system.posix_acl_default";

/// Largest xattr value cached; a longer one is left to the bricks.
pub const MAX_XATTR_VALUE: usize = 4096;
/// Most xattr names cached per inode.
pub const MAX_XATTRS_PER_INODE: usize = 16;
/// Most bytes of cached xattr names and values in all.
pub const MAX_XATTR_BYTES: usize = 32 << 20;
/// Most inodes outside the table whose generation is remembered exactly
/// (beyond, the oldest are folded into one bound, which only makes some
/// fills from fops in flight be dropped).
const RECENT_ABSENT: usize = 4096;
/// `md-cache-timeout` when `cache-invalidation` is on and the timeout is
/// not given (GlusterFS's metadata-cache profile).
const INVALIDATION_TIMEOUT: Duration = Duration::from_secs(600);

const OPTIONS: &[OptionDecl] = &[
    OptionDecl::new("md-cache-timeout", OptType::Time).default("1").range(0.0, 600.0).desc(
        "How long a cached attribute, xattr or directory entry is trusted after the reply that filled it \
         (seconds, or e.g. 500ms). 0 turns caching off. When cache-invalidation is on and this option is not \
         given, 600.",
    ),
    OptionDecl::new("cache-selinux", OptType::Bool).default("on").desc(
        "Cache security.selinux, prefetched on lookup and readdirp: the kernel asks for it for every file \
         `ls -l` shows, and the answer is nearly always 'none' (ENODATA).",
    ),
    OptionDecl::new("cache-capability-xattrs", OptType::Bool)
        .default("on")
        .desc("Cache security.capability (prefetched), which the kernel asks for around writes."),
    OptionDecl::new("cache-posix-acl", OptType::Bool).default("on").desc(
        "Cache system.posix_acl_access and system.posix_acl_default (prefetched); `ls -l` asks for the first \
         for every file.",
    ),
    OptionDecl::new("cache-xattrs", OptType::Bool)
        .default("on")
        .desc("Also cache the user.* xattrs getxattr reads (not prefetched: their names are not known in advance)."),
    OptionDecl::new("xattr-cache-list", OptType::List).desc(
        "Further xattr names to prefetch on lookup and readdirp and answer getxattr from, comma-separated \
         (e.g. user.swift.metadata,trusted.tag).",
    ),
    OptionDecl::new("cache-invalidation", OptType::Bool).default("off").desc(
        "Say that the bricks send invalidation upcalls (features/upcall) when another client changes an inode, \
         so entries may be trusted until an invalidation arrives or md-cache-timeout passes: md-cache-timeout \
         then defaults to 600. Invalidations that arrive are honoured whatever this says.",
    ),
    OptionDecl::new("md-cache-statfs", OptType::Bool)
        .default("off")
        .desc("Cache statfs replies for md-cache-timeout (df on a busy mount)."),
    OptionDecl::new("nl-cache", OptType::Bool).default("on").desc(
        "Negative entry cache: remember that a name does not exist (a lookup's ENOENT; unlink, rmdir or rename \
         through this client) and answer a lookup of it with ENOENT while fresh. Dropped when this client \
         creates the name and when the directory is invalidated. Saves the lookups of search paths and of \
         create-after-lookup.",
    ),
    OptionDecl::new("nl-cache-timeout", OptType::Time)
        .range(0.0, 600.0)
        .desc("How long a negative entry is trusted; by default md-cache-timeout. 0 turns nl-cache off."),
    OptionDecl::new("dir-prefetch", OptType::Bool).default("on").desc(
        "With cache-invalidation on: the first lookup that misses in a directory not listed lately also reads \
         the whole directory (readdirp with the cached xattrs, at most 8192 entries) in the background, so later \
         lookups there (`stat`, `ls -l`, a build's probes) are answered from the cache, and, once it is listed \
         whole, lookups of names it does not have are answered ENOENT. The bricks' invalidations keep it true. \
         xlfs only.",
    ),
    OptionDecl::new("md-cache-max-entries", OptType::Int)
        .default("65536")
        .range(16.0, 16_777_216.0)
        .desc("Most inodes cached, and separately most directory entries; when full, the least recently filled go."),
];

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "performance/md-cache",
    description: "caches attributes, xattrs (selinux, ACLs) and negative entries on the client",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

/// The settings, from the options.
#[derive(Clone, Debug)]
struct Config {
    /// Attribute, xattr and entry timeout in ns (0: off).
    timeout: u64,
    /// Negative entry timeout in ns (0: off).
    nl_timeout: u64,
    statfs: bool,
    invalidation: bool,
    user_xattrs: bool,
    /// Names prefetched on lookup and readdirp.
    prefetch: Arc<[String]>,
    max_entries: usize,
    /// Read a directory whole on the first lookup miss in it.
    dir_prefetch: bool,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn config(o: &Options) -> Config {
    let invalidation = o.bool("cache-invalidation").unwrap_or(false);
    let timeout = if invalidation && !o.is_set("md-cache-timeout") {
        INVALIDATION_TIMEOUT
    } else {
        o.time("md-cache-timeout").unwrap_or(Duration::from_secs(1))
    };
    let nl_timeout =
        if o.bool("nl-cache").unwrap_or(true) { o.time("nl-cache-timeout").unwrap_or(timeout) } else { Duration::ZERO };
    let mut prefetch: Vec<String> = Vec::new();
    let on = |k: &str| o.bool(k).unwrap_or(true);
    if on("cache-selinux") {
        prefetch.push(SELINUX.into());
    }
    if on("cache-capability-xattrs") {
        prefetch.push(CAPABILITY.into());
    }
    if on("cache-posix-acl") {
        prefetch.push(ACL_ACCESS.into());
        prefetch.push(ACL_DEFAULT.into());
    }
    for n in o.list("xattr-cache-list").unwrap_or(&[]) {
        if !prefetch.contains(n) {
            prefetch.push(n.clone());
        }
    }
    Config {
        timeout: ns(timeout),
        nl_timeout: ns(nl_timeout),
        statfs: o.bool("md-cache-statfs").unwrap_or(false),
        invalidation,
        user_xattrs: o.bool("cache-xattrs").unwrap_or(true),
        prefetch: prefetch.into(),
        max_entries: usize::try_from(o.int("md-cache-max-entries").unwrap_or(65536)).unwrap_or(65536).max(1),
        dir_prefetch: invalidation && o.bool("dir-prefetch").unwrap_or(true),
    }
}

impl Config {
    /// True for the xattr names getxattr may be answered from the cache.
    fn cacheable(&self, name: &str) -> bool {
        !name.is_empty() && ((self.user_xattrs && name.starts_with("user.")) || self.prefetch.iter().any(|p| p == name))
    }
}

/// md-cache's monotonic clock in nanoseconds from an arbitrary start; a
/// trait so that tests move time by hand.
trait Clock: Send + Sync + 'static {
    fn now_ns(&self) -> u64;
}

struct MonoClock(std::time::Instant);

impl Clock for MonoClock {
    fn now_ns(&self) -> u64 {
        ns(self.0.elapsed())
    }
}

struct XattrVal {
    name: Box<str>,
    /// None: known absent.
    value: Option<Bytes>,
    at: u64,
}

impl XattrVal {
    fn bytes(&self) -> usize {
        self.name.len() + self.value.as_ref().map_or(0, Bytes::len)
    }
}

#[derive(Default)]
struct Ino {
    attr: Option<(Iatt, u64)>,
    xattrs: Vec<XattrVal>,
    /// Generation of the last change or invalidation seen.
    epoch: u64,
    /// Place in the eviction order.
    tick: u64,
}

impl Ino {
    fn xattr_bytes(&self) -> usize {
        self.xattrs.iter().map(XattrVal::bytes).sum()
    }
}

struct Dentry {
    /// None: the name is known not to exist.
    gfid: Option<Gfid>,
    at: u64,
    tick: u64,
}

#[derive(Default, Clone, Copy)]
struct Stats {
    stat_hits: u64,
    stat_misses: u64,
    lookup_hits: u64,
    lookup_misses: u64,
    negative_hits: u64,
    getxattr_hits: u64,
    absent_hits: u64,
    getxattr_misses: u64,
    statfs_hits: u64,
    statfs_misses: u64,
    invalidations: u64,
    evictions: u64,
    stale_fills: u64,
    dirs_prefetched: u64,
}

struct State {
    cfg: Config,
    inodes: HashMap<Gfid, Ino>,
    /// (tick, gfid) in fill order; entries whose tick moved on are stale.
    inode_order: VecDeque<(u64, Gfid)>,
    dirs: HashMap<Gfid, HashMap<String, Dentry>>,
    dentries: usize,
    dentry_order: VecDeque<(u64, Gfid, String)>,
    tick: u64,
    epoch: u64,
    /// Generations of inodes not in the table (evicted, forgotten, or
    /// invalidated while absent), the most recent [`RECENT_ABSENT`] of them.
    recent: HashMap<Gfid, u64>,
    recent_order: VecDeque<Gfid>,
    /// The latest generation among absent inodes no longer in `recent`
    /// (and of a flush): a fill of an inode in neither, from a fop wound
    /// before it, is dropped.
    lost_epoch: u64,
    xattr_bytes: usize,
    statfs: Option<(Statvfs, u64)>,
    stats: Stats,
    /// Directories read whole by `dir-prefetch`: when it started, and
    /// whether every name of the directory is in `dirs` (none evicted or
    /// dropped by an invalidation since).
    listed: HashMap<Gfid, (u64, bool)>,
    /// Directories being read whole now: lookups there wait for the read
    /// (bounded by [`PREFETCH_WAIT`]) rather than ask the bricks meanwhile.
    prefetching: HashMap<Gfid, Arc<tokio::sync::Notify>>,
}

fn same_attrs(a: &Iatt, b: &Iatt) -> bool {
    (a.gfid, a.size, a.mtime, a.ctime, a.mode, a.nlink, a.uid, a.gid)
        == (b.gfid, b.size, b.mtime, b.ctime, b.mode, b.nlink, b.uid, b.gid)
}

fn is_dot(name: &str) -> bool {
    name == "." || name == ".."
}

fn xattr_value(v: &Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b.clone()),
        Value::Str(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        _ => None,
    }
}

fn is_xattr_name(k: &str) -> bool {
    ["trusted.", "user.", "security.", "system."].iter().any(|p| k.starts_with(p))
}

impl State {
    fn new(cfg: Config) -> State {
        State {
            cfg,
            inodes: HashMap::new(),
            inode_order: VecDeque::new(),
            dirs: HashMap::new(),
            dentries: 0,
            dentry_order: VecDeque::new(),
            tick: 0,
            epoch: 0,
            recent: HashMap::new(),
            recent_order: VecDeque::new(),
            lost_epoch: 0,
            listed: HashMap::new(),
            prefetching: HashMap::new(),
            xattr_bytes: 0,
            statfs: None,
            stats: Stats::default(),
        }
    }

    fn enabled(&self) -> bool {
        self.cfg.timeout > 0
    }

    fn nl_enabled(&self) -> bool {
        self.cfg.nl_timeout > 0
    }

    fn fresh(&self, at: u64, now: u64) -> bool {
        now.saturating_sub(at) < self.cfg.timeout
    }

    fn next_epoch(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }

    fn attr(&self, g: Gfid, now: u64) -> Option<Iatt> {
        let (a, at) = self.inodes.get(&g)?.attr?;
        self.fresh(at, now).then_some(a)
    }

    fn xattr(&self, g: Gfid, name: &str, now: u64) -> Option<Option<Bytes>> {
        let x = self.inodes.get(&g)?.xattrs.iter().find(|x| &*x.name == name)?;
        self.fresh(x.at, now).then(|| x.value.clone())
    }

    /// May a reply to a fop wound at generation `start` fill `g`?
    fn may_fill(&mut self, g: Gfid, start: u64) -> bool {
        let ok = match self.inodes.get(&g) {
            Some(i) => i.epoch <= start,
            None => self.absent_epoch(g) <= start,
        };
        if !ok {
            self.stats.stale_fills += 1;
        }
        ok
    }

    /// The entry of `g`, made if absent (evicting the least recently
    /// filled when full), moved to the back of the eviction order.
    fn ino_mut(&mut self, g: Gfid) -> &mut Ino {
        if !self.inodes.contains_key(&g) {
            while self.inodes.len() >= self.cfg.max_entries && self.evict_inode() {}
        }
        self.tick += 1;
        let tick = self.tick;
        self.inode_order.push_back((tick, g));
        if self.inode_order.len() > 2 * self.cfg.max_entries + 64 {
            let inodes = &self.inodes;
            self.inode_order.retain(|(t, g)| inodes.get(g).is_some_and(|i| i.tick == *t));
        }
        let epoch = self.absent_epoch(g);
        if self.recent.remove(&g).is_some() {
            self.recent_order.retain(|r| *r != g);
        }
        let i = self.inodes.entry(g).or_insert_with(|| Ino { epoch, ..Ino::default() });
        i.tick = tick;
        i
    }

    fn evict_inode(&mut self) -> bool {
        while let Some((t, g)) = self.inode_order.pop_front() {
            if self.inodes.get(&g).is_some_and(|i| i.tick == t) {
                self.remove_inode(g);
                self.stats.evictions += 1;
                return true;
            }
        }
        false
    }

    fn remove_inode(&mut self, g: Gfid) {
        if let Some(i) = self.inodes.remove(&g) {
            self.xattr_bytes = self.xattr_bytes.saturating_sub(i.xattr_bytes());
            self.forgot(g, i.epoch);
        }
    }

    /// The generation of an inode not in the table.
    fn absent_epoch(&self, g: Gfid) -> u64 {
        self.recent.get(&g).map_or(self.lost_epoch, |e| (*e).max(self.lost_epoch))
    }

    /// Remembers the generation of an inode leaving (or not in) the table.
    fn forgot(&mut self, g: Gfid, epoch: u64) {
        if epoch <= self.lost_epoch {
            return;
        }
        if self.recent.insert(g, epoch).is_none() {
            self.recent_order.push_back(g);
        }
        while self.recent_order.len() > RECENT_ABSENT {
            if let Some(old) = self.recent_order.pop_front()
                && let Some(e) = self.recent.remove(&old)
            {
                self.lost_epoch = self.lost_epoch.max(e);
            }
        }
    }

    /// Attributes from a read reply.
    fn fill_attr(&mut self, g: Gfid, iatt: Iatt, start: u64, now: u64) {
        if g.is_null() || iatt.gfid != g || !self.enabled() || !self.may_fill(g, start) {
            return;
        }
        self.ino_mut(g).attr = Some((iatt, now));
    }

    /// Attributes after a change made through this client: kept only if
    /// the cached ones are `pre` (or, without `pre`, if none are cached);
    /// otherwise another change raced this one and they are dropped.
    fn update_attr(&mut self, g: Gfid, pre: Option<Iatt>, post: Iatt, now: u64) {
        if g.is_null() || !self.enabled() {
            return;
        }
        let epoch = self.next_epoch();
        let i = self.ino_mut(g);
        i.epoch = epoch;
        // A reply without real attributes (a translator below that answered
        // early, e.g. write-behind) says nothing.
        let keep = post.gfid == g
            && match (&i.attr, pre) {
                (None, _) => true,
                (Some((c, _)), Some(p)) => same_attrs(c, &p),
                (Some(_), None) => false,
            };
        i.attr = keep.then_some((post, now));
    }

    /// Attributes after a change made through this client, given without
    /// the attributes before (a directory after a create): kept unless the
    /// cached ones are newer (changed later, by a reply that overtook this).
    fn advance_attr(&mut self, g: Gfid, post: Iatt, now: u64) {
        let pre = match self.inodes.get(&g).and_then(|i| i.attr) {
            Some((c, _)) if c.ctime <= post.ctime => Some(c),
            Some(_) => None,
            None => None,
        };
        match pre {
            Some(c) => self.update_attr(g, Some(c), post, now),
            None if self.inodes.get(&g).is_some_and(|i| i.attr.is_some()) => self.drop_attr(g),
            None => self.update_attr(g, None, post, now),
        }
    }

    /// Marks `g` changed (so fills from fops wound before are dropped) and
    /// returns the inode if cached.
    fn touch(&mut self, g: Gfid) -> Option<&mut Ino> {
        let epoch = self.next_epoch();
        if !self.inodes.contains_key(&g) {
            self.forgot(g, epoch);
            return None;
        }
        let i = self.inodes.get_mut(&g)?;
        i.epoch = epoch;
        Some(i)
    }

    /// Drops `g`'s attributes.
    fn drop_attr(&mut self, g: Gfid) {
        if g.is_null() {
            return;
        }
        if let Some(i) = self.touch(g) {
            i.attr = None;
        }
    }

    /// Drops `g`'s attributes and xattrs.
    fn invalidate(&mut self, g: Gfid) {
        if g.is_null() {
            return;
        }
        if let Some(i) = self.touch(g) {
            i.attr = None;
            let freed = i.xattr_bytes();
            i.xattrs.clear();
            self.xattr_bytes = self.xattr_bytes.saturating_sub(freed);
        }
    }

    /// What a new inode `g` made in `parent` is known to lack: a
    /// capability and user xattrs always; a security label, and ACLs, when
    /// the parent is known to have no label, or no default ACL (the kernel
    /// asks for the capability before the first write of every new file).
    fn new_inode_xattrs(&mut self, parent: Gfid, g: Gfid, now: u64) {
        let names = self.cfg.prefetch.clone();
        let epoch = self.epoch;
        for n in names.iter() {
            let absent = match n.as_str() {
                CAPABILITY => true,
                SELINUX => self.xattr(parent, SELINUX, now) == Some(None),
                ACL_ACCESS | ACL_DEFAULT => self.xattr(parent, ACL_DEFAULT, now) == Some(None),
                other => other.starts_with("user."),
            };
            if absent {
                self.set_xattr(g, n, None, epoch, now);
            }
        }
    }

    /// Drops cached xattrs of `g` whose names `which` selects.
    fn drop_xattrs(&mut self, g: Gfid, which: impl Fn(&str) -> bool) {
        let Some(i) = self.inodes.get_mut(&g) else { return };
        let before = i.xattr_bytes();
        i.xattrs.retain(|x| !which(&x.name));
        let freed = before - i.xattr_bytes();
        self.xattr_bytes = self.xattr_bytes.saturating_sub(freed);
    }

    /// Caches xattr `name` of `g` (None: known absent).
    fn set_xattr(&mut self, g: Gfid, name: &str, value: Option<Bytes>, start: u64, now: u64) {
        if g.is_null() || !self.enabled() || !self.may_fill(g, start) {
            return;
        }
        let (old, count) = match self.inodes.get(&g) {
            Some(i) => (i.xattrs.iter().find(|x| &*x.name == name).map(XattrVal::bytes), i.xattrs.len()),
            None => (None, 0),
        };
        let add = name.len() + value.as_ref().map_or(0, Bytes::len);
        let total = self.xattr_bytes - old.unwrap_or(0) + add;
        let too_big = value.as_ref().is_some_and(|v| v.len() > MAX_XATTR_VALUE) || total > MAX_XATTR_BYTES;
        if too_big || (old.is_none() && count >= MAX_XATTRS_PER_INODE) {
            self.drop_xattrs(g, |n| n == name);
            return;
        }
        self.xattr_bytes = total;
        let i = self.ino_mut(g);
        match i.xattrs.iter_mut().find(|x| &*x.name == name) {
            Some(x) => {
                x.value = value;
                x.at = now;
            }
            None => i.xattrs.push(XattrVal { name: name.into(), value, at: now }),
        }
    }

    fn dentry(&self, parent: Gfid, name: &str) -> Option<&Dentry> {
        self.dirs.get(&parent)?.get(name)
    }

    /// Caches entry `name` in `parent` as `gfid`, or as absent.
    fn set_dentry(&mut self, parent: Gfid, name: &str, gfid: Option<Gfid>, start: u64, now: u64) {
        let on = if gfid.is_some() { self.enabled() } else { self.nl_enabled() };
        if !on || is_dot(name) || parent.is_null() || gfid.is_some_and(|g| g.is_null()) {
            self.drop_dentry(parent, name);
            return;
        }
        if !self.may_fill(parent, start) {
            return;
        }
        let present = self.dentry(parent, name).is_some();
        if !present {
            while self.dentries >= self.cfg.max_entries && self.evict_dentry() {}
        }
        self.tick += 1;
        let tick = self.tick;
        self.dentry_order.push_back((tick, parent, name.to_string()));
        if self.dentry_order.len() > 2 * self.cfg.max_entries + 64 {
            let dirs = &self.dirs;
            self.dentry_order.retain(|(t, p, n)| dirs.get(p).and_then(|d| d.get(n)).is_some_and(|d| d.tick == *t));
        }
        let dir = self.dirs.entry(parent).or_default();
        match dir.get_mut(name) {
            Some(d) => *d = Dentry { gfid, at: now, tick },
            None => {
                dir.insert(name.to_string(), Dentry { gfid, at: now, tick });
                self.dentries += 1;
            }
        }
    }

    fn evict_dentry(&mut self) -> bool {
        while let Some((t, p, n)) = self.dentry_order.pop_front() {
            if self.dentry(p, &n).is_some_and(|d| d.tick == t) {
                self.drop_dentry(p, &n);
                self.listed.remove(&p);
                self.stats.evictions += 1;
                return true;
            }
        }
        false
    }

    /// Drops one entry; returns the gfid it named, if it was positive.
    fn drop_dentry(&mut self, parent: Gfid, name: &str) -> Option<Gfid> {
        let dir = self.dirs.get_mut(&parent)?;
        let d = dir.remove(name)?;
        if dir.is_empty() {
            self.dirs.remove(&parent);
        }
        self.dentries -= 1;
        d.gfid
    }

    /// True when `dir` was read whole lately and nothing of it was dropped.
    fn listed_whole(&self, dir: Gfid, now: u64) -> bool {
        self.cfg.dir_prefetch && self.listed.get(&dir).is_some_and(|(at, whole)| *whole && self.fresh(*at, now))
    }

    /// Whether a lookup miss in `dir` should read the directory whole: not
    /// read (or being read) lately. Marks it as being read.
    fn want_prefetch(&mut self, dir: Gfid, now: u64) -> bool {
        if !self.cfg.dir_prefetch || dir.is_null() || self.listed.get(&dir).is_some_and(|(at, _)| self.fresh(*at, now))
        {
            return false;
        }
        if self.listed.len() >= self.cfg.max_entries {
            self.listed.retain(|_, (at, _)| now.saturating_sub(*at) < self.cfg.timeout);
            if self.listed.len() >= self.cfg.max_entries {
                return false;
            }
        }
        self.listed.insert(dir, (now, false));
        true
    }

    /// A prefetch of `dir` started at `at` read every name.
    fn listed_done(&mut self, dir: Gfid, at: u64) {
        if let Some(e) = self.listed.get_mut(&dir)
            && e.0 == at
        {
            e.1 = true;
            self.stats.dirs_prefetched += 1;
        }
    }

    /// Drops every entry under `parent`.
    fn drop_dir(&mut self, parent: Gfid) {
        self.listed.remove(&parent);
        if let Some(d) = self.dirs.remove(&parent) {
            self.dentries -= d.len();
        }
    }

    /// The inode a location names, when known.
    fn loc_gfid(&self, loc: &Loc) -> Option<Gfid> {
        if !loc.gfid.is_null() {
            return Some(loc.gfid);
        }
        self.dentry(loc.parent, &loc.name).and_then(|d| d.gfid)
    }

    fn is_empty(&self) -> bool {
        self.inodes.is_empty() && self.dentries == 0 && self.statfs.is_none()
    }

    /// Forgets everything; fills of fops in flight are dropped.
    fn flush_all(&mut self) {
        self.inodes.clear();
        self.inode_order.clear();
        self.dirs.clear();
        self.dentries = 0;
        self.dentry_order.clear();
        self.xattr_bytes = 0;
        self.statfs = None;
        self.recent.clear();
        self.recent_order.clear();
        self.listed.clear();
        self.lost_epoch = self.next_epoch();
    }

    /// Invalidates what a location names; when it cannot be told (an entry
    /// location not cached), everything.
    fn invalidate_loc(&mut self, loc: &Loc) {
        match self.loc_gfid(loc) {
            Some(g) => self.invalidate(g),
            None if !self.is_empty() => self.flush_all(),
            None => {}
        }
    }

    /// An inode's invalidation: its attributes, xattrs and the entries
    /// under it; a null gfid means everything.
    fn upcall(&mut self, g: Gfid) {
        self.stats.invalidations += 1;
        if g.is_null() {
            self.flush_all();
        } else {
            self.invalidate(g);
            self.drop_dir(g);
        }
    }

    /// Answers `req` from the cache when it can (counting hits and misses).
    fn answer(&mut self, req: &Request, now: u64) -> Option<FopResult> {
        match &req.fop {
            Fop::Stat { loc } if !loc.gfid.is_null() && req.xdata.is_empty() && self.enabled() => {
                self.answer_attr(loc.gfid, now)
            }
            Fop::Fstat { fd } if req.xdata.is_empty() && self.enabled() => self.answer_attr(fd.gfid, now),
            Fop::Lookup { loc } if req.xdata.is_empty() => self.answer_lookup(loc, now),
            Fop::Getxattr { loc, name } if !loc.gfid.is_null() && req.xdata.is_empty() => {
                self.answer_xattr(loc.gfid, name, now)
            }
            Fop::Fgetxattr { fd, name } if req.xdata.is_empty() => self.answer_xattr(fd.gfid, name, now),
            Fop::Statfs { .. } if self.cfg.statfs && self.enabled() => match self.statfs {
                Some((s, at)) if self.fresh(at, now) => {
                    self.stats.statfs_hits += 1;
                    Some(Ok(Reply::Statfs(s).into()))
                }
                _ => {
                    self.stats.statfs_misses += 1;
                    None
                }
            },
            _ => None,
        }
    }

    fn answer_attr(&mut self, g: Gfid, now: u64) -> Option<FopResult> {
        match self.attr(g, now) {
            Some(a) => {
                self.stats.stat_hits += 1;
                Some(Ok(Reply::Attr(a).into()))
            }
            None => {
                self.stats.stat_misses += 1;
                None
            }
        }
    }

    fn answer_lookup(&mut self, loc: &Loc, now: u64) -> Option<FopResult> {
        if loc.is_entry() {
            if let Some((gfid, at)) = self.dentry(loc.parent, &loc.name).map(|d| (d.gfid, d.at)) {
                match gfid {
                    None if loc.gfid.is_null() && now.saturating_sub(at) < self.cfg.nl_timeout => {
                        self.stats.negative_hits += 1;
                        return Some(Err(Errno::ENOENT));
                    }
                    Some(g) if self.fresh(at, now) && (loc.gfid.is_null() || loc.gfid == g) => {
                        if let (Some(iatt), Some(postparent)) = (self.attr(g, now), self.attr(loc.parent, now)) {
                            self.stats.lookup_hits += 1;
                            return Some(Ok(Reply::Entry { iatt, postparent }.into()));
                        }
                    }
                    _ => {}
                }
            } else if loc.gfid.is_null() && self.listed_whole(loc.parent, now) {
                self.stats.negative_hits += 1;
                return Some(Err(Errno::ENOENT));
            }
        } else if !loc.gfid.is_null()
            && let Some(iatt) = self.attr(loc.gfid, now)
        {
            self.stats.lookup_hits += 1;
            return Some(Ok(Reply::Entry { iatt, postparent: Iatt::default() }.into()));
        }
        if self.enabled() || self.nl_enabled() {
            self.stats.lookup_misses += 1;
        }
        None
    }

    fn answer_xattr(&mut self, g: Gfid, name: &str, now: u64) -> Option<FopResult> {
        if !self.enabled() || !self.cfg.cacheable(name) {
            return None;
        }
        match self.xattr(g, name, now) {
            Some(Some(v)) => {
                self.stats.getxattr_hits += 1;
                let mut d = Dict::new();
                d.set(name, Value::Bytes(v));
                Some(Ok(Reply::Xattrs(d).into()))
            }
            Some(None) => {
                self.stats.absent_hits += 1;
                Some(Err(Errno::ENODATA))
            }
            None => {
                self.stats.getxattr_misses += 1;
                None
            }
        }
    }

    /// What to do with the reply of a fop the cache did not answer; None
    /// when it needs nothing. Adds the prefetch keys to lookup and readdirp.
    fn plan(&mut self, req: &mut Request) -> Option<Plan> {
        use Fop::*;
        match &req.fop {
            Forget { gfid } => {
                self.remove_inode(*gfid);
                self.drop_dir(*gfid);
                return None;
            }
            Open { flags, .. } if *flags & libc::O_TRUNC as u32 == 0 => return None,
            Opendir { .. } => {
                // performance/readdir-ahead below reads ahead with these.
                if self.enabled() && !self.cfg.prefetch.is_empty() && !req.xdata.contains(keys::MDC_LOADED_KEY_NAMES) {
                    req.xdata.set_str(keys::MDC_LOADED_KEY_NAMES, self.cfg.prefetch.join(" "));
                }
                return None;
            }
            Statfs { .. } if !self.cfg.statfs => return None,
            Access { .. }
            | Flush { .. }
            | Readdir { .. }
            | Release { .. }
            | Releasedir { .. }
            | Lk { .. }
            | Inodelk { .. }
            | Finodelk { .. }
            | Entrylk { .. }
            | Fentrylk { .. }
            | Seek { .. }
            | Rchecksum { .. }
            | Lease { .. }
            | Ipc { .. }
            | Fsyncdir { .. } => return None,
            _ => {}
        }
        if !self.enabled() && !self.nl_enabled() {
            return None;
        }
        let (mut names, mut added, mut asked) = (Vec::new(), Vec::new(), false);
        if matches!(req.fop, Lookup { .. } | Readdirp { .. }) && self.enabled() {
            asked = req.xdata.keys().any(|k| is_xattr_name(k));
            for n in self.cfg.prefetch.iter() {
                if !req.xdata.contains(n) {
                    req.xdata.set_u64(n.clone(), 0);
                    added.push(n.clone());
                }
                names.push(n.clone());
            }
            for k in req.xdata.keys() {
                if self.cfg.cacheable(k) && !names.contains(k) {
                    names.push(k.clone());
                }
            }
        }
        Some(Plan { fop: req.fop.clone(), start: self.epoch, names, added, asked })
    }

    /// Updates the cache from a reply, and strips the keys the plan added.
    fn after(&mut self, p: Plan, res: &mut FopResult, now: u64) {
        let start = p.start;
        match (&p.fop, res) {
            (Fop::Lookup { loc }, Ok(rsp)) => {
                if let Reply::Entry { iatt, postparent } = &rsp.reply {
                    let g = iatt.gfid;
                    self.fill_attr(g, *iatt, start, now);
                    if loc.is_entry() {
                        if postparent.gfid == loc.parent {
                            self.fill_attr(loc.parent, *postparent, start, now);
                        }
                        self.set_dentry(loc.parent, &loc.name, Some(g), start, now);
                    }
                    for n in &p.names {
                        match rsp.xdata.get(n) {
                            None => self.set_xattr(g, n, None, start, now),
                            Some(v) => match xattr_value(v) {
                                Some(b) => self.set_xattr(g, n, Some(b), start, now),
                                None => self.drop_xattrs(g, |x| x == n.as_str()),
                            },
                        }
                    }
                }
                for a in &p.added {
                    rsp.xdata.remove(a);
                }
            }
            (Fop::Lookup { loc }, Err(e)) => {
                if *e == Errno::ENOENT && loc.is_entry() && loc.gfid.is_null() {
                    self.set_dentry(loc.parent, &loc.name, None, start, now);
                } else if matches!(*e, Errno::ENOENT | Errno::ESTALE) {
                    if loc.is_entry() {
                        self.drop_dentry(loc.parent, &loc.name);
                    }
                    self.invalidate(loc.gfid);
                }
            }
            (Fop::Readdirp { fd, .. }, Ok(rsp)) => {
                if let Reply::Dirents(entries) = &rsp.reply {
                    let covered = !p.names.is_empty() && rsp.xdata.contains(keys::DIRENT_XATTRS);
                    for e in entries {
                        let g = e.iatt.gfid;
                        if g.is_null() {
                            continue;
                        }
                        self.fill_attr(g, e.iatt, start, now);
                        if is_dot(&e.name) {
                            continue;
                        }
                        self.set_dentry(fd.gfid, &e.name, Some(g), start, now);
                        if covered {
                            for n in &p.names {
                                let v = rsp.xdata.get(&keys::dirent_xattr(&e.name, n)).map(xattr_value);
                                match v {
                                    None => self.set_xattr(g, n, None, start, now),
                                    Some(Some(b)) => self.set_xattr(g, n, Some(b), start, now),
                                    Some(None) => self.drop_xattrs(g, |x| x == n.as_str()),
                                }
                            }
                        }
                    }
                }
                if !p.added.is_empty() {
                    let x = std::mem::take(&mut rsp.xdata);
                    rsp.xdata = x
                        .into_iter()
                        .filter(|(k, _)| match keys::parse_dirent_xattr(k) {
                            Some((_, n)) => !p.added.iter().any(|a| a == n),
                            None => p.asked || k != keys::DIRENT_XATTRS,
                        })
                        .collect();
                }
            }
            (Fop::Stat { .. } | Fop::Fstat { .. }, r) => match r {
                Ok(Response { reply: Reply::Attr(a), .. }) => {
                    let g = if a.gfid.is_null() { p.fop.gfid() } else { a.gfid };
                    self.fill_attr(g, *a, start, now);
                }
                Err(Errno::ENOENT | Errno::ESTALE) => self.invalidate(p.fop.gfid()),
                _ => {}
            },
            (Fop::Readv { fd, .. }, Ok(Response { reply: Reply::Read { iatt, .. }, .. })) => {
                self.fill_attr(fd.gfid, *iatt, start, now);
            }
            (Fop::Readlink { loc, .. }, Ok(Response { reply: Reply::Readlink { iatt, .. }, .. })) => {
                let g = if iatt.gfid.is_null() { loc.gfid } else { iatt.gfid };
                self.fill_attr(g, *iatt, start, now);
            }
            (Fop::Getxattr { name, .. } | Fop::Fgetxattr { name, .. }, r) if self.cfg.cacheable(name) => {
                let g = p.fop.gfid();
                match r {
                    Ok(Response { reply: Reply::Xattrs(d), .. }) => {
                        if let Some(b) = d.get(name).and_then(xattr_value) {
                            self.set_xattr(g, name, Some(b), start, now);
                        }
                    }
                    Err(Errno::ENODATA) => self.set_xattr(g, name, None, start, now),
                    Err(Errno::ENOENT | Errno::ESTALE) => self.invalidate(g),
                    _ => {}
                }
            }
            (
                Fop::Setattr { .. }
                | Fop::Fsetattr { .. }
                | Fop::Truncate { .. }
                | Fop::Ftruncate { .. }
                | Fop::Writev { .. }
                | Fop::Fsync { .. }
                | Fop::Fallocate { .. }
                | Fop::Discard { .. }
                | Fop::Zerofill { .. },
                r,
            ) => match r {
                Ok(Response { reply: Reply::PrePost { pre, post }, .. }) => {
                    let g = match p.fop.gfid() {
                        g if g.is_null() => post.gfid,
                        g => g,
                    };
                    self.update_attr(g, Some(*pre), *post, now);
                    match p.fop {
                        // chmod rewrites the access ACL; chown drops capabilities.
                        Fop::Setattr { .. } | Fop::Fsetattr { .. } => {
                            self.drop_xattrs(g, |n| n.starts_with("security.") || n.starts_with("system."))
                        }
                        Fop::Fsync { .. } => {}
                        // A write may kill a capability the file has; one it
                        // is known not to have stays absent (the kernel asks
                        // before every write).
                        _ if self
                            .inodes
                            .get(&g)
                            .is_some_and(|i| i.xattrs.iter().any(|x| &*x.name == CAPABILITY && x.value.is_none())) => {}
                        _ => self.drop_xattrs(g, |n| n == CAPABILITY),
                    }
                }
                _ => match p.fop.loc() {
                    Some(loc) => self.invalidate_loc(loc),
                    None => self.invalidate(p.fop.gfid()),
                },
            },
            (Fop::CopyFileRange { fd_out, .. }, r) => match r {
                Ok(Response { reply: Reply::Copied { post, .. }, .. }) => {
                    self.update_attr(fd_out.gfid, None, *post, now);
                    self.drop_xattrs(fd_out.gfid, |n| n == CAPABILITY);
                }
                _ => self.invalidate(fd_out.gfid),
            },
            (
                Fop::Create { loc, .. }
                | Fop::Mknod { loc, .. }
                | Fop::Mkdir { loc, .. }
                | Fop::Symlink { loc, .. }
                | Fop::Link { new: loc, .. },
                r,
            ) => match r {
                Ok(Response { reply: Reply::Entry { iatt, postparent }, .. }) => {
                    if postparent.gfid == loc.parent {
                        self.advance_attr(loc.parent, *postparent, now);
                    } else {
                        self.drop_attr(loc.parent);
                    }
                    let epoch = self.epoch;
                    self.set_dentry(loc.parent, &loc.name, Some(iatt.gfid), epoch, now);
                    self.update_attr(iatt.gfid, None, *iatt, now);
                    if !matches!(p.fop, Fop::Link { .. }) {
                        self.new_inode_xattrs(loc.parent, iatt.gfid, now);
                    }
                    // A directory just made is empty: its names are all
                    // known (absent) until an invalidation says otherwise.
                    if matches!(p.fop, Fop::Mkdir { .. })
                        && self.cfg.dir_prefetch
                        && self.listed.len() < self.cfg.max_entries
                    {
                        self.listed.insert(iatt.gfid, (now, true));
                    }
                }
                _ => {
                    self.drop_dentry(loc.parent, &loc.name);
                    self.listed.remove(&loc.parent);
                    self.drop_attr(loc.parent);
                    if let Fop::Link { old, .. } = &p.fop {
                        self.invalidate_loc(old);
                    }
                }
            },
            (Fop::Unlink { loc, .. } | Fop::Rmdir { loc, .. }, r) => {
                let target = self.loc_gfid(loc);
                self.drop_dentry(loc.parent, &loc.name);
                match r {
                    Ok(Response { reply: Reply::Parent { pre, post }, .. }) => {
                        self.update_attr(loc.parent, Some(*pre), *post, now);
                        let epoch = self.epoch;
                        self.set_dentry(loc.parent, &loc.name, None, epoch, now);
                    }
                    _ => {
                        self.listed.remove(&loc.parent);
                        self.drop_attr(loc.parent);
                    }
                }
                match target {
                    Some(t) => {
                        self.invalidate(t);
                        self.drop_dir(t);
                    }
                    // Its attributes (nlink) may be cached by gfid.
                    None if !self.is_empty() => self.flush_all(),
                    None => {}
                }
            }
            (Fop::Rename { old, new, flags }, r) => {
                let src = self.loc_gfid(old);
                let dst = self.dentry(new.parent, &new.name).map(|d| d.gfid);
                let dst = if new.gfid.is_null() { dst } else { Some(Some(new.gfid)) };
                self.drop_dentry(old.parent, &old.name);
                self.drop_dentry(new.parent, &new.name);
                self.drop_attr(old.parent);
                self.drop_attr(new.parent);
                match r {
                    Ok(Response { reply: Reply::Rename { iatt }, .. }) => {
                        if flags & rename_flags::EXCHANGE == 0 {
                            let epoch = self.epoch;
                            self.set_dentry(new.parent, &new.name, Some(iatt.gfid), epoch, now);
                            self.set_dentry(old.parent, &old.name, None, epoch, now);
                        }
                        self.update_attr(iatt.gfid, None, *iatt, now);
                    }
                    _ => {
                        self.listed.remove(&old.parent);
                        self.listed.remove(&new.parent);
                        if let Some(s) = src {
                            self.invalidate(s);
                        }
                    }
                }
                match dst {
                    Some(Some(d)) if src != Some(d) => {
                        self.invalidate(d);
                        self.drop_dir(d);
                    }
                    Some(_) => {} // known absent, or the source itself
                    None if !self.is_empty() => self.flush_all(),
                    None => {}
                }
            }
            (Fop::Setxattr { xattrs, .. } | Fop::Fsetxattr { xattrs, .. }, r) => {
                let Some(g) = self.fop_gfid(&p.fop) else { return };
                if r.is_err() {
                    self.invalidate(g);
                    return;
                }
                self.drop_attr(g);
                let epoch = self.epoch;
                for (k, v) in xattrs.iter() {
                    if !self.cfg.cacheable(k) {
                        continue;
                    }
                    match xattr_value(v) {
                        Some(b) if k.starts_with("user.") || k.starts_with("trusted.") => {
                            self.set_xattr(g, k, Some(b), epoch, now)
                        }
                        _ => self.drop_xattrs(g, |n| n == k.as_str()),
                    }
                }
            }
            (Fop::Removexattr { name, .. } | Fop::Fremovexattr { name, .. }, r) => {
                let Some(g) = self.fop_gfid(&p.fop) else { return };
                match r {
                    Ok(_) | Err(Errno::ENODATA) => {
                        self.drop_attr(g);
                        let epoch = self.epoch;
                        if self.cfg.cacheable(name) {
                            self.set_xattr(g, name, None, epoch, now);
                        }
                    }
                    Err(_) => self.invalidate(g),
                }
            }
            (Fop::Xattrop { .. } | Fop::Fxattrop { .. } | Fop::Open { .. }, _) => {
                if let Some(g) = self.fop_gfid(&p.fop) {
                    self.invalidate(g);
                }
            }
            (Fop::Statfs { .. }, Ok(Response { reply: Reply::Statfs(s), .. })) if self.cfg.statfs && self.enabled() => {
                self.statfs = Some((*s, now));
            }
            _ => {}
        }
    }

    /// The inode a fop acts on; None (after flushing everything, as it may
    /// be any cached inode) for an entry location not cached.
    fn fop_gfid(&mut self, fop: &Fop) -> Option<Gfid> {
        if let Some(fd) = fop.fd() {
            return Some(fd.gfid);
        }
        let loc = fop.loc()?;
        let g = self.loc_gfid(loc);
        if g.is_none() && !self.is_empty() {
            self.flush_all();
        }
        g
    }
}

/// What to do with a reply.
struct Plan {
    fop: Fop,
    /// The generation when the fop was wound.
    start: u64,
    /// The cacheable xattr names the request asks for (lookup, readdirp).
    names: Vec<String>,
    /// The names md-cache added to the request's xdata.
    added: Vec<String>,
    /// Whether the caller's own xdata named any xattr.
    asked: bool,
}

struct MdCache {
    child: Child,
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<State>>,
    next_fd: Arc<std::sync::atomic::AtomicU64>,
}

/// Fd ids of md-cache's own directory reads (apart from the FUSE bridge's
/// and replicate's heal ids on the bricks).
const PREFETCH_FD_BASE: u64 = 0x6d64_6300_0000_0000;

/// Longest a lookup waits for a whole-directory read of its parent.
const PREFETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Most entries a directory prefetch reads.
const PREFETCH_MAX: usize = 8192;

/// Reads directory `dir` whole through `child`, filling the cache as any
/// readdirp does; marks it listed whole if every entry fit, and wakes the
/// lookups waiting for it. Then reads it once more, marked
/// [`keys::DIR_PREFETCH`], for the translators below that bring more with
/// each entry (performance/quick-read: small files' content); that second
/// pass fills nothing here and nobody waits for it.
async fn prefetch_dir(
    child: Child,
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
    ctx: CallCtx,
    dir: Gfid,
    fd: FdId,
    at: u64,
) {
    let fd = Fd { id: fd, gfid: dir };
    let whole = read_dir(&child, Some((&state, &clock)), &ctx, fd).await;
    {
        let mut st = state.lock();
        if whole {
            st.listed_done(dir, at);
        }
        if let Some(n) = st.prefetching.remove(&dir) {
            n.notify_waiters();
        }
    }
    if whole {
        read_dir(&child, None, &ctx, fd).await;
    }
}

/// The cache a directory read fills, and its clock.
type Fill<'a> = (&'a Arc<Mutex<State>>, &'a Arc<dyn Clock>);

/// Opens, reads whole (at most [`PREFETCH_MAX`] entries) and releases
/// directory `fd`, filling `cache` from the replies when given, else
/// marking the readdirps [`keys::DIR_PREFETCH`]. True if every entry came.
async fn read_dir(child: &Child, cache: Option<Fill<'_>>, ctx: &CallCtx, fd: Fd) -> bool {
    let mut open = Request::new(Fop::Opendir { loc: Loc::gfid(fd.gfid), fd: fd.id });
    open.xdata.set_u64(keys::DIR_PREFETCH, 1);
    if let Some((state, _)) = cache {
        let _ = state.lock().plan(&mut open);
    }
    if child.call(ctx.clone(), open).await.is_err() {
        return false;
    }
    let (mut offset, mut seen, mut whole) = (0u64, 0usize, false);
    loop {
        let mut req = Request::new(Fop::Readdirp { fd, size: 128 << 10, offset });
        let plan = match cache {
            Some((state, _)) => state.lock().plan(&mut req),
            None => {
                req.xdata.set_u64(keys::DIR_PREFETCH, 1);
                None
            }
        };
        let mut res = child.call(ctx.clone(), req).await;
        let last = match &res {
            Ok(Response { reply: Reply::Dirents(v), .. }) => v.last().map(|e| (e.d_off, v.len())),
            _ => None,
        };
        if let (Some(plan), Some((state, clock))) = (plan, cache) {
            state.lock().after(plan, &mut res, clock.now_ns());
        }
        match (res.is_ok(), last) {
            (true, None) => {
                whole = true;
                break;
            }
            (true, Some((off, n))) if seen + n <= PREFETCH_MAX => {
                seen += n;
                offset = off;
            }
            _ => break,
        }
    }
    let _ = child.call(ctx.clone(), Request::new(Fop::Releasedir { fd })).await;
    whole
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let cfg = config(&init.options);
    let child = init.children.into_iter().next().ok_or_else(|| InitError::new("needs one child"))?;
    Ok(Arc::new(MdCache::new(child, cfg, Arc::new(MonoClock(std::time::Instant::now())))))
}

impl MdCache {
    fn new(child: Child, cfg: Config, clock: Arc<dyn Clock>) -> MdCache {
        MdCache {
            child,
            clock,
            state: Arc::new(Mutex::new(State::new(cfg))),
            next_fd: Arc::new(std::sync::atomic::AtomicU64::new(1)),
        }
    }
}

impl MdCache {
    /// A lookup that waited for its directory's read: answered from what
    /// it brought, or sent down.
    async fn lookup_after_wait(&self, ctx: CallCtx, mut req: Request) -> FopResult {
        let now = self.clock.now_ns();
        let plan = {
            let mut st = self.state.lock();
            if let Some(res) = st.answer(&req, now) {
                return res;
            }
            st.plan(&mut req)
        };
        let mut res = self.child.call(ctx, req).await;
        if let Some(plan) = plan {
            self.state.lock().after(plan, &mut res, self.clock.now_ns());
        }
        res
    }
}

impl Xlator for MdCache {
    fn call(&self, ctx: CallCtx, mut req: Request) -> FopFuture<'_> {
        let now = self.clock.now_ns();
        let plan = {
            let mut st = self.state.lock();
            if let Some(res) = st.answer(&req, now) {
                return Box::pin(std::future::ready(res));
            }
            // A lookup in a directory being read waits for the read (the
            // one that starts it goes down at once).
            if let Fop::Lookup { loc } = &req.fop
                && loc.is_entry()
                && let Some(n) = st.prefetching.get(&loc.parent).cloned()
            {
                let parent = loc.parent;
                drop(st);
                return Box::pin(async move {
                    let woken = n.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    if self.state.lock().prefetching.contains_key(&parent) {
                        let _ = tokio::time::timeout(PREFETCH_WAIT, woken).await;
                    }
                    self.lookup_after_wait(ctx, req).await
                });
            }
            if let Fop::Lookup { loc } = &req.fop
                && loc.is_entry()
                && st.want_prefetch(loc.parent, now)
                && let Ok(h) = tokio::runtime::Handle::try_current()
            {
                let id = FdId(PREFETCH_FD_BASE | self.next_fd.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
                let pctx = CallCtx::root(ctx.client_id.clone());
                st.prefetching.insert(loc.parent, Arc::new(tokio::sync::Notify::new()));
                h.spawn(prefetch_dir(
                    self.child.clone(),
                    self.state.clone(),
                    self.clock.clone(),
                    pctx,
                    loc.parent,
                    id,
                    now,
                ));
            }
            st.plan(&mut req)
        };
        let Some(plan) = plan else { return self.child.call(ctx, req) };
        Box::pin(async move {
            let mut res = self.child.call(ctx, req).await;
            let now = self.clock.now_ns();
            self.state.lock().after(plan, &mut res, now);
            res
        })
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        if from == EventFrom::Graph {
            return None;
        }
        match &event {
            Event::Upcall(Upcall::Invalidate { gfid }) => self.state.lock().upcall(*gfid),
            Event::ChildUp | Event::ChildDown => self.state.lock().flush_all(),
            _ => {}
        }
        Some(event)
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        let cfg = config(options);
        let mut st = self.state.lock();
        st.cfg = cfg;
        // Cached names or timeouts may no longer hold: start afresh.
        st.flush_all();
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let st = self.state.lock();
        let s = st.stats;
        let ms = |n: u64| format!("{}ms", n / 1_000_000);
        [
            ("md-cache-timeout", ms(st.cfg.timeout)),
            ("nl-cache-timeout", ms(st.cfg.nl_timeout)),
            ("cache-invalidation", if st.cfg.invalidation { "on" } else { "off" }.to_string()),
            ("prefetch", st.cfg.prefetch.join(",")),
            ("inodes", st.inodes.len().to_string()),
            ("dentries", st.dentries.to_string()),
            ("xattr-bytes", st.xattr_bytes.to_string()),
            ("stat-hits", s.stat_hits.to_string()),
            ("stat-misses", s.stat_misses.to_string()),
            ("lookup-hits", s.lookup_hits.to_string()),
            ("lookup-misses", s.lookup_misses.to_string()),
            ("negative-lookup-hits", s.negative_hits.to_string()),
            ("getxattr-hits", s.getxattr_hits.to_string()),
            ("xattr-absent-hits", s.absent_hits.to_string()),
            ("getxattr-misses", s.getxattr_misses.to_string()),
            ("statfs-hits", s.statfs_hits.to_string()),
            ("statfs-misses", s.statfs_misses.to_string()),
            ("invalidations", s.invalidations.to_string()),
            ("evictions", s.evictions.to_string()),
            ("stale-fills-dropped", s.stale_fills.to_string()),
            ("dirs-prefetched", s.dirs_prefetched.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

#[cfg(test)]
mod tests;
