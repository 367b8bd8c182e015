//! performance/quick-read: caches the whole content of small files, fetched
//! with the lookup the kernel does anyway, and answers reads from it, like
//! GlusterFS's quick-read.
//!
//! A lookup of an inode with nothing cached asks for the content
//! ([`CONTENT`] with `max-file-size` in the request xdata, unless the
//! caller asked itself); storage/posix adds the bytes of a regular file no
//! larger than that to the reply, and cluster/replicate passes them up only
//! from a good copy. The content is cached with the reply's attributes
//! (the validator: size, mtime, ctime) and the key is taken out of the
//! reply unless the caller asked for it.
//!
//! A READ on any fd of a cached inode is answered from the cache
//! (zero-copy slices; a short read at the end) while the entry is fresh:
//! validated less than `cache-timeout` seconds ago, or, with
//! `cache-invalidation`, until invalidated. A later lookup, stat or read
//! reply whose attributes match revalidates the entry; one that differs
//! drops it. Writes, truncates, setattrs, fallocate, discard, zerofill,
//! copies into the inode and opens with `O_TRUNC` drop it before they are
//! wound and again when they return, and an invalidation upcall or a
//! forget drops it too. A lookup's content is cached only if the inode was
//! not invalidated while that lookup was in flight (a sequence number per
//! bucket of inodes), so a reply racing a write never caches old bytes.
//!
//! Bounds: entries of at most `max-file-size` bytes, `cache-size` bytes in
//! all; the least recently used entries are evicted to make room.
//!
//! With performance/open-behind below, a small-file read costs only the
//! lookup: the open is deferred, the read answered here, and flush and
//! release of the never-opened fd are absorbed by open-behind.
//!
//! The whole-directory reads md-cache makes ahead of lookups
//! ([`keys::DIR_PREFETCH`] on their readdirps) ask for
//! [`keys::READDIRP_CONTENT`] too: storage/posix adds each small regular
//! entry's bytes, cluster/replicate keeps them only where no copy can be
//! behind another, and they are cached here as a lookup's content is (and
//! taken out of the reply). After a remount, the `stat` of every file in a
//! directory then also brings what a later `cat` reads.
//!
//! With `fetch-on-read`, a read at offset 0 of a file not cached (md-cache
//! above answered its lookups, so none came here) fetches the content with
//! a lookup by gfid first, then answers from it: one round trip instead of open, read,
//! flush and release. Files found too big are remembered (at most
//! [`MAX_BIG`]) and read directly after that.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::dict::keys::{self, CONTENT};
use xlfs_sdk::options::{Opt, OptionDecl, kind};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Event, EventFrom, FileType, Fop, FopFuture, Gfid, Iatt, InitCtx, InitError, Loc, Options, Reply,
    Request, Response, Upcall, Value, Xlator, XlatorType,
};

/// Buckets of inodes for the invalidation sequence numbers.
const BUCKETS: usize = 256;

const MAX_FILE_SIZE: Opt<kind::Size> = Opt::size("max-file-size", "64KB")
        .range(0.0, 1048576.0)
        .desc("Files up to this size are cached whole (fetched with their lookup); larger files are not cached. 0 disables caching.");
const CACHE_SIZE: Opt<kind::Size> = Opt::size("cache-size", "128MB")
    .range(0.0, 34359738368.0)
    .desc("Bytes of file content cached in all; the least recently used files are evicted past it.");
const CACHE_TIMEOUT: Opt<kind::Int> = Opt::int("cache-timeout", "1")
    .range(0.0, 60.0)
    .desc("Seconds a cached file is trusted after a lookup or stat last validated it (unless cache-invalidation).");
const CACHE_INVALIDATION: Opt<kind::Bool> = Opt::bool("cache-invalidation", false).desc(
    "Trust cached content until an invalidation upcall, a forget or changed attributes drop it, ignoring \
         cache-timeout (turn on only with upcalls from the bricks, features.cache-invalidation).",
);
const FETCH_ON_READ: Opt<kind::Bool> = Opt::bool("fetch-on-read", false).desc(
    "A read at offset 0 of a file not cached fetches its content with a lookup by gfid first and answers from \
         it (one round trip instead of open, read, flush and release, with open-behind below). Useful when \
         md-cache above answers the lookups that would have brought the content; the generated client graph \
         turns it on. xlfs only.",
);
const DIR_PREFETCH_CONTENT: Opt<kind::Bool> = Opt::bool("dir-prefetch-content", true).desc(
    "When md-cache above reads a whole directory ahead of lookups (its dir-prefetch), ask for the content of \
         every regular entry up to max-file-size with it and cache it, as a lookup's would be: after a remount, \
         reading the small files of a directory that was listed or stat'ed costs no round trip. Costs the bricks \
         a read of those files in the background. xlfs only.",
);

const OPTIONS: &[OptionDecl] = &[
    MAX_FILE_SIZE.decl,
    CACHE_SIZE.decl,
    CACHE_TIMEOUT.decl,
    CACHE_INVALIDATION.decl,
    FETCH_ON_READ.decl,
    DIR_PREFETCH_CONTENT.decl,
];

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "performance/quick-read",
    description: "caches small files' content fetched with lookup and serves reads from it",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cfg {
    max_file_size: u64,
    cache_size: u64,
    timeout: Duration,
    invalidation: bool,
    fetch_on_read: bool,
    dir_content: bool,
}

fn settings(o: &Options) -> Cfg {
    Cfg {
        max_file_size: MAX_FILE_SIZE.get(o),
        cache_size: CACHE_SIZE.get(o),
        timeout: Duration::from_secs(CACHE_TIMEOUT.count(o) as u64),
        invalidation: CACHE_INVALIDATION.get(o),
        fetch_on_read: FETCH_ON_READ.get(o),
        dir_content: DIR_PREFETCH_CONTENT.get(o),
    }
}

struct Entry {
    data: Bytes,
    iatt: Iatt,
    validated: Instant,
    tick: u64,
}

/// The attributes that say the content is still the same.
fn same_content(a: &Iatt, b: &Iatt) -> bool {
    (a.size, a.mtime, a.ctime) == (b.size, b.mtime, b.ctime)
}

#[derive(Default, Clone, Copy)]
struct Stats {
    hits: u64,
    misses: u64,
    evictions: u64,
    invalidations: u64,
    stored: u64,
}

struct Cache {
    cfg: Cfg,
    map: HashMap<Gfid, Entry>,
    /// Use order: tick -> gfid, oldest first.
    lru: BTreeMap<u64, Gfid>,
    bytes: u64,
    tick: u64,
    /// Bumped on every invalidation; `dropped[bucket]` holds its value at
    /// the last invalidation of an inode in that bucket.
    seq: u64,
    dropped: Box<[u64; BUCKETS]>,
    stats: Stats,
}

fn bucket(g: &Gfid) -> usize {
    (g.0[15] ^ g.0[11].rotate_left(3) ^ g.0[3]) as usize % BUCKETS
}

impl Cache {
    fn new(cfg: Cfg) -> Cache {
        Cache {
            cfg,
            map: HashMap::new(),
            lru: BTreeMap::new(),
            bytes: 0,
            tick: 0,
            seq: 0,
            dropped: Box::new([0; BUCKETS]),
            stats: Stats::default(),
        }
    }

    fn remove(&mut self, gfid: &Gfid) -> bool {
        match self.map.remove(gfid) {
            Some(e) => {
                self.lru.remove(&e.tick);
                self.bytes -= e.data.len() as u64;
                true
            }
            None => false,
        }
    }

    /// Drops the inode's content and marks it changed for lookups in flight.
    fn invalidate(&mut self, gfid: Gfid) {
        if gfid.is_null() {
            return;
        }
        self.seq += 1;
        self.dropped[bucket(&gfid)] = self.seq;
        if self.remove(&gfid) {
            self.stats.invalidations += 1;
        }
    }

    fn fresh(&self, e: &Entry, now: Instant) -> bool {
        self.cfg.invalidation || now.saturating_duration_since(e.validated) < self.cfg.timeout
    }

    fn touch(&mut self, gfid: Gfid) {
        self.tick += 1;
        let t = self.tick;
        if let Some(e) = self.map.get_mut(&gfid) {
            self.lru.remove(&e.tick);
            e.tick = t;
            self.lru.insert(t, gfid);
        }
    }

    fn evict_for(&mut self, need: u64) {
        while self.bytes + need > self.cfg.cache_size {
            let Some((_, g)) = self.lru.pop_first() else { break };
            if let Some(e) = self.map.remove(&g) {
                self.bytes -= e.data.len() as u64;
                self.stats.evictions += 1;
            }
        }
    }

    fn store(&mut self, iatt: Iatt, data: Bytes, now: Instant) {
        let gfid = iatt.gfid;
        self.remove(&gfid);
        let len = data.len() as u64;
        if len > self.cfg.max_file_size || len > self.cfg.cache_size {
            return;
        }
        self.evict_for(len);
        self.tick += 1;
        self.lru.insert(self.tick, gfid);
        self.map.insert(gfid, Entry { data, iatt, validated: now, tick: self.tick });
        self.bytes += len;
        self.stats.stored += 1;
    }

    /// Attributes seen in a reply: revalidate the entry or drop it.
    fn validate(&mut self, iatt: &Iatt, now: Instant) {
        let Some(e) = self.map.get_mut(&iatt.gfid) else { return };
        if same_content(&e.iatt, iatt) {
            e.validated = now;
        } else {
            self.invalidate(iatt.gfid);
        }
    }

    /// A lookup reply: cache its content (if it came and nothing changed
    /// the inode since the lookup was wound at `seq`), else validate.
    fn on_lookup(&mut self, iatt: &Iatt, content: Option<Bytes>, seq: u64, now: Instant) {
        if iatt.gfid.is_null() {
            return;
        }
        if iatt.file_type() != FileType::Regular {
            self.invalidate(iatt.gfid);
            return;
        }
        match content {
            Some(data) if data.len() as u64 == iatt.size && self.dropped[bucket(&iatt.gfid)] <= seq => {
                self.store(*iatt, data, now);
            }
            _ => self.validate(iatt, now),
        }
    }

    fn read(&mut self, gfid: Gfid, offset: u64, size: u32, now: Instant) -> Option<Reply> {
        let reply = match self.map.get(&gfid) {
            Some(e) if self.fresh(e, now) => {
                let len = e.data.len() as u64;
                let from = offset.min(len);
                let to = offset.saturating_add(u64::from(size)).min(len);
                // Both are at most the content length, a usize.
                Some(Reply::Read { data: e.data.slice(from as usize..to as usize), iatt: e.iatt })
            }
            _ => None,
        };
        match reply {
            Some(r) => {
                self.stats.hits += 1;
                self.touch(gfid);
                Some(r)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    fn reconfigure(&mut self, cfg: Cfg) {
        self.cfg = cfg;
        let big: Vec<Gfid> =
            self.map.iter().filter(|(_, e)| e.data.len() as u64 > cfg.max_file_size).map(|(g, _)| *g).collect();
        for g in big {
            self.remove(&g);
        }
        self.evict_for(0);
    }
}

type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// The quick-read translator.
pub struct QuickRead {
    child: Child,
    cache: Mutex<Cache>,
    clock: Clock,
    /// Inodes a content lookup found too big (or not regular files).
    big: Mutex<std::collections::HashSet<Gfid>>,
}

/// Most inodes remembered as too big to fetch on a read miss.
pub const MAX_BIG: usize = 65536;

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    Ok(Arc::new(QuickRead::new(init, Arc::new(Instant::now))?))
}

/// The inode whose data a fop changes, known before it is wound.
fn changed_inode(fop: &Fop) -> Option<Gfid> {
    match fop {
        Fop::Writev { fd, .. }
        | Fop::Ftruncate { fd, .. }
        | Fop::Fsetattr { fd, .. }
        | Fop::Fallocate { fd, .. }
        | Fop::Discard { fd, .. }
        | Fop::Zerofill { fd, .. } => Some(fd.gfid),
        Fop::CopyFileRange { fd_out, .. } => Some(fd_out.gfid),
        Fop::Truncate { loc, .. } | Fop::Setattr { loc, .. } => Some(loc.gfid),
        Fop::Open { loc, flags, .. } if flags & libc::O_TRUNC as u32 != 0 => Some(loc.gfid),
        _ => None,
    }
}

impl QuickRead {
    fn new(init: InitCtx, clock: Clock) -> Result<QuickRead, InitError> {
        let cfg = settings(&init.options);
        let child = init.children.into_iter().next().ok_or_else(|| InitError::new("needs one child"))?;
        Ok(QuickRead { child, cache: Mutex::new(Cache::new(cfg)), clock, big: Mutex::new(Default::default()) })
    }

    fn now(&self) -> Instant {
        (self.clock)()
    }

    fn fetches_on_read(&self) -> bool {
        let c = self.cache.lock();
        c.cfg.fetch_on_read && c.cfg.max_file_size > 0
    }

    fn lookup(&self, ctx: CallCtx, mut req: Request) -> FopFuture<'_> {
        let caller_asked = req.xdata.contains(CONTENT);
        let (seq, max, known) = {
            let c = self.cache.lock();
            let gfid = req.fop.gfid();
            (c.seq, c.cfg.max_file_size, !gfid.is_null() && c.map.contains_key(&gfid))
        };
        // Nothing cached: fetch the content with this lookup. Cached: the
        // reply's attributes revalidate it.
        let we_ask = !caller_asked && !known && max > 0;
        if we_ask {
            req.xdata.set_u64(CONTENT, max);
        }
        Box::pin(async move {
            let mut res = self.child.call(ctx, req).await;
            if let Ok(rsp) = &mut res
                && let Reply::Entry { iatt, .. } = &rsp.reply
            {
                let content = if caller_asked {
                    rsp.xdata.get_bytes(CONTENT)
                } else {
                    match rsp.xdata.remove(CONTENT) {
                        Some(Value::Bytes(b)) => Some(b),
                        _ => None,
                    }
                };
                self.cache.lock().on_lookup(iatt, content, seq, self.now());
            }
            res
        })
    }

    /// A readdirp of md-cache's directory read: ask for the entries'
    /// content and cache what comes.
    fn prefetching(&self, ctx: CallCtx, mut req: Request) -> FopFuture<'_> {
        let (seq, max, on) = {
            let c = self.cache.lock();
            (c.seq, c.cfg.max_file_size, c.cfg.dir_content)
        };
        if max == 0 || !on {
            return self.child.call(ctx, req);
        }
        req.xdata.set_u64(keys::READDIRP_CONTENT, max);
        Box::pin(async move {
            let mut res = self.child.call(ctx, req).await;
            if let Ok(Response { reply: Reply::Dirents(entries), xdata }) = &mut res {
                let now = self.now();
                let mut c = self.cache.lock();
                for e in entries.iter() {
                    if let Some(Value::Bytes(data)) = xdata.remove(&keys::dirent_xattr(&e.name, CONTENT)) {
                        c.on_lookup(&e.iatt, Some(data), seq, now);
                    }
                }
            }
            res
        })
    }

    fn changing(&self, ctx: CallCtx, req: Request, gfid: Gfid) -> FopFuture<'_> {
        self.cache.lock().invalidate(gfid);
        self.big.lock().remove(&gfid);
        Box::pin(async move {
            let res = self.child.call(ctx, req).await;
            let mut c = self.cache.lock();
            c.invalidate(gfid);
            if let Ok(Response { reply: Reply::PrePost { post, .. }, .. }) = &res {
                c.invalidate(post.gfid);
            }
            res
        })
    }

    /// Winds a fop whose reply carries attributes of the inode, and
    /// validates the cache with them.
    fn validating(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(async move {
            let res = self.child.call(ctx, req).await;
            if let Ok(Response { reply: Reply::Attr(iatt) | Reply::Read { iatt, .. }, .. }) = &res {
                self.cache.lock().validate(iatt, self.now());
            }
            res
        })
    }
}

impl Xlator for QuickRead {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        match &req.fop {
            Fop::Lookup { .. } => self.lookup(ctx, req),
            Fop::Readdirp { .. } if req.xdata.contains(keys::DIR_PREFETCH) => self.prefetching(ctx, req),
            Fop::Readv { fd, size, offset, .. } => {
                let (gfid, size, offset) = (fd.gfid, *size, *offset);
                let hit = self.cache.lock().read(gfid, offset, size, self.now());
                match hit {
                    Some(reply) => Box::pin(std::future::ready(Ok(Response::from(reply)))),
                    None if offset == 0 && self.fetches_on_read() && !self.big.lock().contains(&gfid) => {
                        Box::pin(async move {
                            let lookup = Request::new(Fop::Lookup { loc: Loc::gfid(gfid) });
                            let _ = self.lookup(ctx.clone(), lookup).await;
                            if let Some(reply) = self.cache.lock().read(gfid, offset, size, self.now()) {
                                return Ok(Response::from(reply));
                            }
                            {
                                let mut big = self.big.lock();
                                if big.len() >= MAX_BIG {
                                    big.clear();
                                }
                                big.insert(gfid);
                            }
                            self.validating(ctx, req).await
                        })
                    }
                    None => self.validating(ctx, req),
                }
            }
            Fop::Stat { .. } | Fop::Fstat { .. } => self.validating(ctx, req),
            Fop::Forget { gfid } => {
                self.cache.lock().invalidate(*gfid);
                self.child.call(ctx, req)
            }
            fop => match changed_inode(fop) {
                Some(gfid) => self.changing(ctx, req, gfid),
                None => self.child.call(ctx, req),
            },
        }
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        if let Event::Upcall(Upcall::Invalidate { gfid }) = &event {
            self.cache.lock().invalidate(*gfid);
        }
        match from {
            EventFrom::Child(_) => Some(event),
            EventFrom::Graph => None,
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        self.cache.lock().reconfigure(settings(options));
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let c = self.cache.lock();
        let s = c.stats;
        [
            ("max-file-size", c.cfg.max_file_size.to_string()),
            ("cache-size", c.cfg.cache_size.to_string()),
            ("cache-timeout", c.cfg.timeout.as_secs().to_string()),
            ("cache-invalidation", c.cfg.invalidation.to_string()),
            ("files", c.map.len().to_string()),
            ("bytes-cached", c.bytes.to_string()),
            ("hits", s.hits.to_string()),
            ("misses", s.misses.to_string()),
            ("stored", s.stored.to_string()),
            ("evictions", s.evictions.to_string()),
            ("invalidations", s.invalidations.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn fini(&self) {
        let mut c = self.cache.lock();
        c.map.clear();
        c.lru.clear();
        c.bytes = 0;
    }
}

#[cfg(test)]
mod tests;
