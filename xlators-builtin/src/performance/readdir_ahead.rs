//! performance/readdir-ahead: reads a directory ahead of its reader in large
//! readdirp requests, so that a listing (`ls`, `find`, the kernel's 4 KiB
//! FUSE readdir buffers) is answered from the client instead of a brick
//! round trip per batch, like GlusterFS's readdir-ahead.
//!
//! **Fill.** An OPENDIR that succeeds starts a background *fill* on the new
//! fd: readdirp from offset 0 in requests of `rda-request-size` bytes, each
//! continuing at the last entry's `d_off`, until the fd holds
//! `rda-high-wmark` bytes of entries (or the end of the directory, an
//! error, or the cache limit). Serving entries to the reader brings the
//! buffer down; at `rda-low-wmark` or below the fill resumes. A READDIRP at
//! the fd's sequential offset (0 first, then the `d_off` of the last entry
//! it was given) is answered from the buffer: as many entries as fit in its
//! `size` (counted as storage/posix counts them), at least one; when the
//! buffer is empty it waits for the fill in flight (or starts one).
//!
//! **Exact replies.** Entries are served with the attributes and the reply
//! xdata the child sent with them: per-entry xattr values under
//! [`keys::dirent_xattr`] keys and the batch's other keys (such as
//! [`keys::DIRENT_XATTRS`]) pass through unchanged, and a reply never mixes
//! entries of two child batches, so performance/md-cache above sees what a
//! direct readdirp would have returned. The fill sends the xattr requests
//! md-cache would add to its readdirps: md-cache names them on OPENDIR
//! under [`keys::MDC_LOADED_KEY_NAMES`] (taken out here, as GlusterFS's
//! readdir-ahead does); a READDIRP whose xdata differs from what the fill
//! sent restarts the fill at its offset with that xdata.
//!
//! **Falls through.** A READDIRP at another offset (seekdir) makes the fd
//! pass every later readdirp to the child, until one at offset 0
//! (rewinddir) starts over. READDIR (without attributes) always goes to the
//! child. When the cache is full, the readdirp is wound to the child at its
//! offset and the fd stays in sequence.
//!
//! **Kept true.** A listing never shows an entry, or attributes, older than
//! a change this translator saw complete before the READDIRP arrived:
//! - create, mkdir, mknod, symlink, link, unlink, rmdir and rename (either
//!   parent) drop the buffered entries of every fd open on the parent
//!   directory when they return (success or not); a fill in flight is
//!   discarded and the next readdirp reads afresh from its offset;
//! - a change to an inode (setattr, truncate, write, fallocate, discard,
//!   zerofill, copy_file_range, setxattr, removexattr, xattrop, open with
//!   `O_TRUNC`, and the inodes a link, unlink, rmdir or rename touch)
//!   records the inode as changed. An entry read by a fill wound before
//!   the change completed is not served to a readdirp that arrived after
//!   it: the buffer is dropped at that entry and read again (a fill wound
//!   after the readdirp arrived is served as is: it is no older than a
//!   readdirp sent straight to the child). GlusterFS drops the entry's
//!   stat instead; xlfs has no "no attributes" form of an entry, so it
//!   reads it again;
//! - an invalidation upcall for a directory does both; for any other inode,
//!   the latter; ChildUp, ChildDown and an upcall for the null gfid drop
//!   everything.
//!
//! **Errors.** An error from the fill is kept and returned to the readdirp
//! that would have used the entries it was fetching (after the entries
//! already buffered); the fd then passes through to the child.
//!
//! **Bounds.** `rda-cache-limit` bytes of buffered entries across all
//! directories (entries that do not fit are dropped and read again later;
//! a fill starts only with room for a whole request); at most [`MAX_FDS`]
//! directory fds tracked; at most [`MAX_RECENT`] changed inodes remembered
//! individually (past that, every buffered entry counts as changed).
//!
//! `parallel-readdir` is accepted and does nothing: it asks GlusterFS's
//! DHT to list all its subvolumes at once, and an xlfs volume has one.
//! `pass-through` (or `readdir-ahead-pass-through`) turns the translator
//! into a pass-through.

mod changes;

use std::collections::{HashMap, VecDeque};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;
use xlfs_sdk::dict::keys;
use xlfs_sdk::options::{Opt, OptionDecl, kind};
use xlfs_sdk::slots::FdSlots;
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Dict, DirEntry, Errno, Event, EventFrom, Fd, FdId, Fop, FopFuture, FopResult, Gfid, InitCtx,
    InitError, Options, Reply, Request, Response, Upcall, Value, Xlator, XlatorType,
};

use changes::*;

use crate::storage::posix::ENTRY_OVERHEAD;

/// Most directory fds tracked at once; later ones pass through.
pub const MAX_FDS: usize = 65536;
/// Most changed inodes remembered one by one (see the module docs).
pub const MAX_RECENT: usize = 8192;

const RDA_REQUEST_SIZE: Opt<kind::Size> = Opt::size("rda-request-size", "128KB").range(4096.0, 131072.0).desc(
    "Size of the readdirp requests readdir-ahead sends (entries counted as the bricks count them: about 216 \
         bytes plus the name each, some 550 entries for 128KB).",
);
const RDA_LOW_WMARK: Opt<kind::Size> = Opt::size("rda-low-wmark", "4096")
    .range(0.0, 10485760.0)
    .desc("When serving entries brings a directory's buffer down to this many bytes, the background fill resumes.");
const RDA_HIGH_WMARK: Opt<kind::Size> = Opt::size("rda-high-wmark", "128KB")
    .range(0.0, 104857600.0)
    .desc("The background fill of a directory pauses once its buffer holds this many bytes of entries.");
const RDA_CACHE_LIMIT: Opt<kind::Size> = Opt::size("rda-cache-limit", "10MB").range(0.0, 1073741824.0).desc(
    "Bytes of entries buffered across all directories; memory stays under it whatever the number and size \
         of the directories listed. When it is reached, readdirps go to the bricks.",
);
const PARALLEL_READDIR: Opt<kind::Bool> = Opt::bool("parallel-readdir", false).desc(
    "GlusterFS: list all of DHT's subvolumes in parallel. An xlfs volume has one subvolume below its caches: \
         accepted for volfile compatibility, no effect.",
);
const PASS_THROUGH: Opt<kind::Bool> = Opt::bool("pass-through", false).desc(
    "Pass every fop to the child, reading nothing ahead (GlusterFS's volume-set name: readdir-ahead-pass-through).",
);
const READDIR_AHEAD_PASS_THROUGH: Opt<kind::Bool> = Opt::bool("readdir-ahead-pass-through", false)
    .desc("The same as pass-through (either one on passes every fop through).");

const OPTIONS: &[OptionDecl] = &[
    RDA_REQUEST_SIZE.decl,
    RDA_LOW_WMARK.decl,
    RDA_HIGH_WMARK.decl,
    RDA_CACHE_LIMIT.decl,
    PARALLEL_READDIR.decl,
    PASS_THROUGH.decl,
    READDIR_AHEAD_PASS_THROUGH.decl,
];

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "performance/readdir-ahead",
    description: "reads directories ahead in large readdirp requests and serves sequential readdirps from them",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cfg {
    request_size: u32,
    low: u64,
    high: u64,
    limit: u64,
    parallel: bool,
    pass_through: bool,
}

fn settings(o: &Options) -> Cfg {
    Cfg {
        request_size: u32::try_from(RDA_REQUEST_SIZE.get(o)).unwrap_or(128 << 10),
        low: RDA_LOW_WMARK.get(o),
        high: RDA_HIGH_WMARK.get(o),
        limit: RDA_CACHE_LIMIT.get(o),
        parallel: PARALLEL_READDIR.get(o),
        pass_through: PASS_THROUGH.get(o) || READDIR_AHEAD_PASS_THROUGH.get(o),
    }
}

/// What an entry costs of a readdirp's `size` (as storage/posix counts).
fn entry_size(e: &DirEntry) -> u64 {
    (ENTRY_OVERHEAD + e.name.len() + 1) as u64
}

/// One buffered entry.
struct Cached {
    entry: DirEntry,
    /// Its per-entry reply keys ([`keys::dirent_xattr`]).
    xattrs: Vec<(String, Value)>,
    /// The other reply keys of the child batch it came in.
    common: Arc<Dict>,
    /// The change sequence number when the fill that read it was wound.
    read_at: u64,
    /// Bytes counted against `rda-cache-limit`.
    cost: u64,
}

impl Cached {
    fn new(entry: DirEntry, xattrs: Vec<(String, Value)>, common: Arc<Dict>, read_at: u64) -> Cached {
        let x: usize = xattrs.iter().map(|(k, v)| k.len() + value_len(v)).sum();
        let cost = entry_size(&entry) + x as u64;
        Cached { entry, xattrs, common, read_at, cost }
    }
}

fn value_len(v: &Value) -> usize {
    match v {
        Value::Bytes(b) => b.len(),
        Value::Str(s) => s.len(),
        _ => 8,
    }
}

/// Per open directory.
#[derive(Default)]
struct FdState {
    entries: VecDeque<Cached>,
    /// Bytes of `entries` (counted in [`Inner::cached`] too).
    bytes: u64,
    /// The offset the next sequential readdirp asks for.
    cur: u64,
    /// The offset the fill continues from.
    next: u64,
    /// The request xdata the fill sends (and a readdirp must carry to be
    /// served from the buffer).
    template: Dict,
    /// The fill reached the end; the xdata of that empty reply.
    eod: Option<Dict>,
    /// The fill failed; returned once the buffer is empty.
    error: Option<Errno>,
    /// Out of sequence: every readdirp goes to the child.
    bypass: bool,
    /// A fill is in flight.
    filling: bool,
    /// Bumped whenever the buffer is dropped; a fill reply for another
    /// generation is discarded.
    generation: u64,
    released: bool,
}

struct DirFd {
    fd: Fd,
    /// The opener's context, for the fill's readdirps.
    ctx: CallCtx,
    st: Mutex<FdState>,
    /// Woken after each fill reply.
    wake: Notify,
    /// One readdirp of the fd served at a time.
    turn: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Stats {
    hits: AtomicU64,
    waits: AtomicU64,
    misses: AtomicU64,
    bypassed: AtomicU64,
    fills: AtomicU64,
    fill_errors: AtomicU64,
    discarded: AtomicU64,
    dropped: AtomicU64,
    stale: AtomicU64,
    over_limit: AtomicU64,
}

struct Inner {
    child: Child,
    cfg: Mutex<Cfg>,
    fds: FdSlots<Arc<DirFd>>,
    /// Directory gfid -> its fds tracked here.
    by_dir: Mutex<HashMap<Gfid, Vec<FdId>>>,
    changes: Mutex<Changes>,
    /// Bytes buffered across all fds.
    cached: AtomicU64,
    stats: Stats,
}

/// The readdir-ahead translator.
pub struct ReaddirAhead {
    inner: Arc<Inner>,
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    Ok(Arc::new(ReaddirAhead::new(init)?))
}

/// What a readdirp does after looking at its fd.
// Short-lived, on the stack: boxing the reply would cost an allocation per hit.
#[allow(clippy::large_enum_variant)]
enum Step {
    Serve(Response),
    Fail(Errno),
    Wait,
    /// Run one fill here (no runtime to run it in the background).
    FillHere,
    /// Wind the readdirp to the child, staying in sequence (generation).
    Direct(u64),
    Pass,
}

/// Splits a child's readdirp reply into buffered entries.
fn split_reply(entries: Vec<DirEntry>, mut xdata: Dict, read_at: u64) -> Vec<Cached> {
    let index: HashMap<&str, usize> = entries.iter().enumerate().map(|(i, e)| (e.name.as_str(), i)).collect();
    let mut per: Vec<Vec<(String, Value)>> = vec![Vec::new(); entries.len()];
    let mut common = Dict::new();
    for (k, v) in std::mem::take(&mut xdata) {
        match keys::parse_dirent_xattr(&k).and_then(|(name, _)| index.get(name).copied()) {
            Some(i) => per[i].push((k, v)),
            None => common.set(k, v),
        }
    }
    let common = Arc::new(common);
    entries.into_iter().zip(per).map(|(e, x)| Cached::new(e, x, common.clone(), read_at)).collect()
}

/// The template a hint from md-cache (space-separated xattr names) stands for:
/// each name set to 0, as md-cache sets them on its readdirps.
fn template_from_hint(v: &Value) -> Dict {
    let s = match v {
        Value::Str(s) => s.as_str(),
        Value::Bytes(b) => std::str::from_utf8(b).unwrap_or(""),
        _ => "",
    };
    let mut d = Dict::new();
    for n in s.split(' ').filter(|n| !n.is_empty()) {
        d.set_u64(n, 0);
    }
    d
}

impl Inner {
    fn cfg(&self) -> Cfg {
        *self.cfg.lock()
    }

    /// True when a whole fill request fits under the cache limit.
    fn room(&self, cfg: &Cfg) -> bool {
        self.cached.load(Ordering::Relaxed).saturating_add(u64::from(cfg.request_size)) <= cfg.limit
    }

    /// Takes `n` bytes of the cache limit; false if they do not fit.
    fn reserve(&self, n: u64, limit: u64) -> bool {
        self.cached
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(n).filter(|t| *t <= limit))
            .is_ok()
    }

    fn unreserve(&self, n: u64) {
        let _ = self.cached.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c.saturating_sub(n)));
    }

    /// Drops an fd's buffer: the fill in flight is discarded and the next
    /// one starts at the reader's offset.
    fn drop_buffer(&self, st: &mut FdState) {
        self.unreserve(st.bytes);
        st.entries.clear();
        st.bytes = 0;
        st.generation += 1;
        st.next = st.cur;
        st.eod = None;
        st.error = None;
        st.filling = false;
    }

    /// Whether the fill should run (again) on this fd now.
    fn wants_fill(&self, st: &FdState, cfg: &Cfg, threshold: u64) -> bool {
        !st.filling
            && !st.released
            && !st.bypass
            && st.eod.is_none()
            && st.error.is_none()
            && st.bytes <= threshold
            && self.room(cfg)
    }

    /// Starts the background fill if there is a runtime to run it; true if
    /// it was started.
    fn spawn_fill(self: &Arc<Self>, d: &Arc<DirFd>, st: &mut FdState) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return false };
        st.filling = true;
        let (inner, d) = (self.clone(), d.clone());
        rt.spawn(async move { while inner.fill_once(&d, true).await {} });
        true
    }

    /// Winds one fill readdirp and buffers its reply. In the background,
    /// returns whether to go on (else `filling` is cleared).
    async fn fill_once(&self, d: &DirFd, background: bool) -> bool {
        let cfg = self.cfg();
        let (req, generation, offset) = {
            let mut st = d.st.lock();
            if st.released || st.bypass || st.eod.is_some() || st.error.is_some() {
                st.filling = false;
                return false;
            }
            st.filling = true;
            let fop = Fop::Readdirp { fd: d.fd, size: cfg.request_size, offset: st.next };
            (Request::with_xdata(fop, st.template.clone()), st.generation, st.next)
        };
        let read_at = self.changes.lock().seq;
        self.stats.fills.fetch_add(1, Ordering::Relaxed);
        let res = self.child.call(d.ctx.clone(), req).await;
        let mut st = d.st.lock();
        let go = if st.generation != generation || st.released || st.next != offset {
            self.stats.discarded.fetch_add(1, Ordering::Relaxed);
            false
        } else {
            match res {
                Ok(Response { reply: Reply::Dirents(v), xdata }) if v.is_empty() => {
                    st.eod = Some(xdata);
                    false
                }
                Ok(Response { reply: Reply::Dirents(v), xdata }) => {
                    let mut stored = false;
                    for c in split_reply(v, xdata, read_at) {
                        if !self.reserve(c.cost, cfg.limit) {
                            self.stats.over_limit.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        st.bytes += c.cost;
                        st.next = c.entry.d_off;
                        st.entries.push_back(c);
                        stored = true;
                    }
                    stored && st.bytes < cfg.high && self.room(&cfg)
                }
                Ok(_) => {
                    tracing::warn!(fd = ?d.fd, "readdir-ahead: a readdirp was answered without entries");
                    self.stats.fill_errors.fetch_add(1, Ordering::Relaxed);
                    st.error = Some(Errno::EIO);
                    false
                }
                Err(e) => {
                    tracing::debug!(fd = ?d.fd, error = %e, "readdir-ahead: the fill failed; the next readdirp gets the error");
                    self.stats.fill_errors.fetch_add(1, Ordering::Relaxed);
                    st.error = Some(e);
                    false
                }
            }
        };
        // A discarded reply's generation was ended by whoever dropped the
        // buffer; they cleared `filling` or a new fill owns it.
        let go = go && background;
        if st.generation == generation && !go {
            st.filling = false;
        }
        drop(st);
        d.wake.notify_waiters();
        go
    }

    /// Takes the entries a readdirp of `size` arriving at change number
    /// `arrived` is served; None if the first one is stale.
    fn take(&self, st: &mut FdState, dir: Gfid, size: u32, arrived: u64) -> Option<Response> {
        let ch = self.changes.lock();
        let dir_changed = ch.last(dir);
        let (mut used, mut out, mut xdata, mut common) = (0u64, Vec::new(), Dict::new(), None::<Arc<Dict>>);
        let mut freed = 0u64;
        while let Some(c) = st.entries.front() {
            let fresh = c.read_at >= arrived || (dir_changed <= c.read_at && ch.last(c.entry.iatt.gfid) <= c.read_at);
            if !fresh {
                break;
            }
            if common.as_ref().is_some_and(|m| !Arc::ptr_eq(m, &c.common)) {
                break;
            }
            let need = entry_size(&c.entry);
            if !out.is_empty() && used + need > u64::from(size) {
                break;
            }
            let Some(c) = st.entries.pop_front() else { break };
            used += need;
            freed += c.cost;
            st.bytes -= c.cost;
            st.cur = c.entry.d_off;
            if common.is_none() {
                xdata = (*c.common).clone();
                common = Some(c.common);
            }
            for (k, v) in c.xattrs {
                xdata.set(k, v);
            }
            out.push(c.entry);
        }
        drop(ch);
        self.unreserve(freed);
        if out.is_empty() {
            return None;
        }
        Some(Response { reply: Reply::Dirents(out), xdata })
    }

    async fn readdirp(self: &Arc<Self>, ctx: CallCtx, req: Request, fd: Fd, size: u32, offset: u64) -> FopResult {
        let Some(d) = self.fds.get(&fd.id) else { return self.child.call(ctx, req).await };
        let _turn = d.turn.lock().await;
        let arrived = self.changes.lock().seq;
        let mut fills = 0u32;
        loop {
            let mut woken = pin!(d.wake.notified());
            woken.as_mut().enable();
            let cfg = self.cfg();
            let step = {
                let mut st = d.st.lock();
                self.step(&d, &mut st, &cfg, &req.xdata, size, offset, arrived, &mut fills)
            };
            match step {
                Step::Serve(rsp) => {
                    self.stats.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(rsp);
                }
                Step::Fail(e) => return Err(e),
                Step::Wait => {
                    self.stats.waits.fetch_add(1, Ordering::Relaxed);
                    woken.await;
                }
                Step::FillHere => {
                    self.fill_once(&d, false).await;
                }
                Step::Direct(generation) => {
                    self.stats.misses.fetch_add(1, Ordering::Relaxed);
                    let res = self.child.call(ctx, req).await;
                    let mut st = d.st.lock();
                    if st.generation == generation
                        && st.cur == offset
                        && let Ok(Response { reply: Reply::Dirents(v), .. }) = &res
                        && let Some(last) = v.last()
                    {
                        st.cur = last.d_off;
                        st.next = last.d_off;
                    }
                    return res;
                }
                Step::Pass => {
                    self.stats.bypassed.fetch_add(1, Ordering::Relaxed);
                    return self.child.call(ctx, req).await;
                }
            }
        }
    }

    /// Decides what a readdirp does now (under the fd's state lock).
    #[allow(clippy::too_many_arguments)]
    fn step(
        self: &Arc<Self>,
        d: &Arc<DirFd>,
        st: &mut FdState,
        cfg: &Cfg,
        xdata: &Dict,
        size: u32,
        offset: u64,
        arrived: u64,
        fills: &mut u32,
    ) -> Step {
        if st.released {
            return Step::Pass;
        }
        if offset != st.cur {
            if offset != 0 {
                // seekdir: out of the way until a rewind.
                if !st.bypass {
                    self.drop_buffer(st);
                    st.bypass = true;
                }
                return Step::Pass;
            }
            // rewinddir: start over.
            st.cur = 0;
            self.drop_buffer(st);
            st.bypass = false;
            st.template = xdata.clone();
        } else if st.bypass {
            return Step::Pass;
        } else if st.template != *xdata {
            // Asked for other xattrs than the fill: read again with them.
            self.drop_buffer(st);
            st.template = xdata.clone();
        }
        if !st.entries.is_empty() {
            match self.take(st, d.fd.gfid, size, arrived) {
                Some(rsp) => {
                    if self.wants_fill(st, cfg, cfg.low) {
                        self.spawn_fill(d, st);
                    }
                    return Step::Serve(rsp);
                }
                None => {
                    // Read before a change the reader has seen: read again.
                    self.stats.stale.fetch_add(1, Ordering::Relaxed);
                    self.drop_buffer(st);
                }
            }
        }
        if let Some(e) = st.error.take() {
            st.bypass = true;
            return Step::Fail(e);
        }
        if let Some(x) = &st.eod {
            return Step::Serve(Response { reply: Reply::Dirents(Vec::new()), xdata: x.clone() });
        }
        if st.filling {
            return Step::Wait;
        }
        if *fills >= 2 || !self.room(cfg) {
            return Step::Direct(st.generation);
        }
        *fills += 1;
        if self.spawn_fill(d, st) { Step::Wait } else { Step::FillHere }
    }

    fn opendir(self: &Arc<Self>, ctx: CallCtx, mut req: Request, dir: Gfid, id: FdId) -> FopFuture<'static> {
        let template = req.xdata.remove(keys::MDC_LOADED_KEY_NAMES).map(|v| template_from_hint(&v)).unwrap_or_default();
        let inner = self.clone();
        Box::pin(async move {
            let res = inner.child.call(ctx.clone(), req).await;
            if res.is_ok() && !dir.is_null() {
                inner.track(ctx, dir, id, template);
            }
            res
        })
    }

    fn track(self: &Arc<Self>, ctx: CallCtx, dir: Gfid, id: FdId, template: Dict) {
        let d = Arc::new(DirFd {
            fd: Fd { id, gfid: dir },
            ctx,
            st: Mutex::new(FdState { template, ..FdState::default() }),
            wake: Notify::new(),
            turn: tokio::sync::Mutex::new(()),
        });
        match self.fds.insert(id, d.clone()) {
            Ok(old) => {
                if let Some(old) = old {
                    self.forget_fd(&old);
                }
            }
            Err(_) => return,
        }
        self.by_dir.lock().entry(dir).or_default().push(id);
        let cfg = self.cfg();
        let mut st = d.st.lock();
        if self.wants_fill(&st, &cfg, u64::MAX) {
            self.spawn_fill(&d, &mut st);
        }
    }

    /// Frees what an fd holds (releasedir, or replaced).
    fn forget_fd(&self, d: &DirFd) {
        {
            let mut st = d.st.lock();
            self.drop_buffer(&mut st);
            st.released = true;
        }
        let mut by = self.by_dir.lock();
        if let Some(v) = by.get_mut(&d.fd.gfid) {
            v.retain(|i| *i != d.fd.id);
            if v.is_empty() {
                by.remove(&d.fd.gfid);
            }
        }
        drop(by);
        d.wake.notify_waiters();
    }
}

impl ReaddirAhead {
    fn new(init: InitCtx) -> Result<ReaddirAhead, InitError> {
        let cfg = settings(&init.options);
        let child = init.children.into_iter().next().ok_or_else(|| InitError::new("needs one child"))?;
        Ok(ReaddirAhead {
            inner: Arc::new(Inner {
                child,
                cfg: Mutex::new(cfg),
                fds: FdSlots::with_capacity(MAX_FDS),
                by_dir: Mutex::new(HashMap::new()),
                changes: Mutex::new(Changes::default()),
                cached: AtomicU64::new(0),
                stats: Stats::default(),
            }),
        })
    }
}

impl Xlator for ReaddirAhead {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let inner = &self.inner;
        if let Fop::Releasedir { fd } = &req.fop {
            // Also in pass-through: an fd tracked before it was turned on.
            if let Some(d) = inner.fds.remove(&fd.id) {
                inner.forget_fd(&d);
            }
            return inner.child.call(ctx, req);
        }
        if inner.cfg.lock().pass_through {
            return inner.child.call(ctx, req);
        }
        match &req.fop {
            // md-cache's own whole-directory read: reading ahead of it
            // would read the directory twice.
            Fop::Opendir { .. } if req.xdata.contains(keys::DIR_PREFETCH) => inner.child.call(ctx, req),
            Fop::Opendir { loc, fd } => {
                let (dir, id) = (loc.gfid, *fd);
                inner.opendir(ctx, req, dir, id)
            }
            Fop::Readdirp { fd, size, offset } => {
                let (fd, size, offset) = (*fd, *size, *offset);
                let inner = inner.clone();
                Box::pin(async move { inner.readdirp(ctx, req, fd, size, offset).await })
            }
            fop => match changes_of(fop) {
                Some((inodes, dirs)) => inner.changing(ctx, req, inodes, dirs),
                None => inner.child.call(ctx, req),
            },
        }
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        match &event {
            Event::Upcall(Upcall::Invalidate { gfid }) if gfid.is_null() => self.inner.changed_all(),
            Event::Upcall(Upcall::Invalidate { gfid }) => self.inner.changed(&[], &[*gfid]),
            Event::ChildUp | Event::ChildDown if from != EventFrom::Graph => self.inner.changed_all(),
            _ => {}
        }
        match from {
            EventFrom::Child(_) => Some(event),
            EventFrom::Graph => None,
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        let cfg = settings(options);
        *self.inner.cfg.lock() = cfg;
        // Smaller limits or pass-through: start afresh.
        self.inner.changed_all();
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let i = &self.inner;
        let c = i.cfg();
        let s = &i.stats;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        vec![
            ("rda-request-size".into(), c.request_size.to_string()),
            ("rda-low-wmark".into(), c.low.to_string()),
            ("rda-high-wmark".into(), c.high.to_string()),
            ("rda-cache-limit".into(), c.limit.to_string()),
            ("parallel-readdir".into(), c.parallel.to_string()),
            ("pass-through".into(), c.pass_through.to_string()),
            ("fds".into(), i.fds.len().to_string()),
            ("bytes-cached".into(), i.cached.load(Ordering::Relaxed).to_string()),
            ("hits".into(), n(&s.hits)),
            ("waits".into(), n(&s.waits)),
            ("misses".into(), n(&s.misses)),
            ("bypassed".into(), n(&s.bypassed)),
            ("fills".into(), n(&s.fills)),
            ("fill-errors".into(), n(&s.fill_errors)),
            ("fills-discarded".into(), n(&s.discarded)),
            ("buffers-dropped".into(), n(&s.dropped)),
            ("stale-refetches".into(), n(&s.stale)),
            ("over-limit".into(), n(&s.over_limit)),
        ]
    }

    fn fini(&self) {
        self.inner.changed_all();
    }
}

#[cfg(test)]
mod tests;
