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
//!
//! The cache is `state`; what each fop reads from it and does to it is
//! `fops`; this file holds the options, prefetching and the Xlator impl.

mod fops;
mod state;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::dict::keys;
use xlfs_sdk::options::{Opt, OptionDecl, kind};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, Fd, FdId, Fop, FopFuture, FopResult, Gfid, Iatt, InitCtx, InitError,
    Loc, Options, Reply, Request, Response, Statvfs, Upcall, Value, Xlator, XlatorType, rename_flags,
};

use state::*;

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

const MD_CACHE_TIMEOUT: Opt<kind::Time> = Opt::time("md-cache-timeout", "1").range(0.0, 600.0).desc(
    "How long a cached attribute, xattr or directory entry is trusted after the reply that filled it \
         (seconds, or e.g. 500ms). 0 turns caching off. When cache-invalidation is on and this option is not \
         given, 600.",
);
const CACHE_XATTRS: Opt<kind::Bool> = Opt::bool("cache-xattrs", true)
    .desc("Also cache the user.* xattrs getxattr reads (not prefetched: their names are not known in advance).");
const XATTR_CACHE_LIST: Opt<kind::List> = Opt::optional("xattr-cache-list").desc(
    "Further xattr names to prefetch on lookup and readdirp and answer getxattr from, comma-separated \
         (e.g. user.swift.metadata,trusted.tag).",
);
const CACHE_INVALIDATION: Opt<kind::Bool> = Opt::bool("cache-invalidation", false).desc(
    "Say that the bricks send invalidation upcalls (features/upcall) when another client changes an inode, \
         so entries may be trusted until an invalidation arrives or md-cache-timeout passes: md-cache-timeout \
         then defaults to 600. Invalidations that arrive are honoured whatever this says.",
);
const MD_CACHE_STATFS: Opt<kind::Bool> =
    Opt::bool("md-cache-statfs", false).desc("Cache statfs replies for md-cache-timeout (df on a busy mount).");
const NL_CACHE: Opt<kind::Bool> = Opt::bool("nl-cache", true).desc(
    "Negative entry cache: remember that a name does not exist (a lookup's ENOENT; unlink, rmdir or rename \
         through this client) and answer a lookup of it with ENOENT while fresh. Dropped when this client \
         creates the name and when the directory is invalidated. Saves the lookups of search paths and of \
         create-after-lookup.",
);
const NL_CACHE_TIMEOUT: Opt<kind::Time> = Opt::optional("nl-cache-timeout")
    .range(0.0, 600.0)
    .desc("How long a negative entry is trusted; by default md-cache-timeout. 0 turns nl-cache off.");
const DIR_PREFETCH: Opt<kind::Bool> = Opt::bool("dir-prefetch", true).desc(
    "With cache-invalidation on: the first lookup that misses in a directory not listed lately also reads \
         the whole directory (readdirp with the cached xattrs, at most 8192 entries) in the background, so later \
         lookups there (`stat`, `ls -l`, a build's probes) are answered from the cache, and, once it is listed \
         whole, lookups of names it does not have are answered ENOENT. The bricks' invalidations keep it true. \
         xlfs only.",
);
const MD_CACHE_MAX_ENTRIES: Opt<kind::Int> = Opt::int("md-cache-max-entries", "65536")
    .range(16.0, 16_777_216.0)
    .desc("Most inodes cached, and separately most directory entries; when full, the least recently filled go.");

const CACHE_SELINUX: Opt<kind::Bool> = Opt::bool("cache-selinux", true).desc(
    "Cache security.selinux, prefetched on lookup and readdirp: the kernel asks for it for every file \
     `ls -l` shows, and the answer is nearly always 'none' (ENODATA).",
);
const CACHE_CAPABILITY: Opt<kind::Bool> = Opt::bool("cache-capability-xattrs", true)
    .desc("Cache security.capability (prefetched), which the kernel asks for around writes.");
const CACHE_ACL: Opt<kind::Bool> = Opt::bool("cache-posix-acl", true).desc(
    "Cache system.posix_acl_access and system.posix_acl_default (prefetched); `ls -l` asks for the first \
     for every file.",
);

const OPTIONS: &[OptionDecl] = &[
    MD_CACHE_TIMEOUT.decl,
    CACHE_SELINUX.decl,
    CACHE_CAPABILITY.decl,
    CACHE_ACL.decl,
    CACHE_XATTRS.decl,
    XATTR_CACHE_LIST.decl,
    CACHE_INVALIDATION.decl,
    MD_CACHE_STATFS.decl,
    NL_CACHE.decl,
    NL_CACHE_TIMEOUT.decl,
    DIR_PREFETCH.decl,
    MD_CACHE_MAX_ENTRIES.decl,
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
    let invalidation = CACHE_INVALIDATION.get(o);
    let timeout = if invalidation && MD_CACHE_TIMEOUT.given(o).is_none() {
        INVALIDATION_TIMEOUT
    } else {
        MD_CACHE_TIMEOUT.get(o)
    };
    let nl_timeout = if NL_CACHE.get(o) { NL_CACHE_TIMEOUT.given(o).unwrap_or(timeout) } else { Duration::ZERO };
    let mut prefetch: Vec<String> = Vec::new();
    if CACHE_SELINUX.get(o) {
        prefetch.push(SELINUX.into());
    }
    if CACHE_CAPABILITY.get(o) {
        prefetch.push(CAPABILITY.into());
    }
    if CACHE_ACL.get(o) {
        prefetch.push(ACL_ACCESS.into());
        prefetch.push(ACL_DEFAULT.into());
    }
    for n in XATTR_CACHE_LIST.get(o) {
        if !prefetch.iter().any(|p| p == n) {
            prefetch.push(n.to_string());
        }
    }
    Config {
        timeout: ns(timeout),
        nl_timeout: ns(nl_timeout),
        statfs: MD_CACHE_STATFS.get(o),
        invalidation,
        user_xattrs: CACHE_XATTRS.get(o),
        prefetch: prefetch.into(),
        max_entries: usize::try_from(MD_CACHE_MAX_ENTRIES.get(o)).unwrap_or(65536).max(1),
        dir_prefetch: invalidation && DIR_PREFETCH.get(o),
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
/// readdirp does; marks it listed whole if every entry fit (and nothing
/// below said the listing may miss names: [`keys::WHOLE_LISTING`]), and wakes the
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
            Some((state, _)) => {
                req.xdata.set_u64(keys::WHOLE_LISTING, 1);
                state.lock().plan(&mut req)
            }
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
        // The end of the listing, which a translator below may say cannot
        // be trusted to hold every name.
        let trusted = res.as_ref().is_ok_and(|r| r.xdata.get_u64(keys::WHOLE_LISTING) != Some(0));
        if let (Some(plan), Some((state, clock))) = (plan, cache) {
            state.lock().after(plan, &mut res, clock.now_ns());
        }
        match (res.is_ok(), last) {
            (true, None) => {
                whole = trusted;
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
