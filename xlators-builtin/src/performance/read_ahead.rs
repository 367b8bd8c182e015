//! performance/read-ahead: prefetches the pages a sequential reader will
//! ask for next and answers its reads from them, like GlusterFS's
//! read-ahead on a client.
//!
//! Each fd that reads gets a stream of the chosen read-ahead policy
//! (`xlfs_sdk::policy::read_ahead`, option `policy`). Every read is shown to
//! the stream first; its advice says which page-aligned ranges to prefetch
//! (one READ of `page-size` bytes per page, wound to the child in the
//! background) and which cached pages to drop. A read whose pages are all
//! cached is answered from them; a read whose pages are all cached or
//! still being fetched waits for those prefetches to land (as GlusterFS's
//! page faults wait on a pending page) instead of reading the same bytes a
//! second time; otherwise it goes to the child unchanged.
//!
//! It stays out of the kernel's way: a read that arrives while another
//! read of the same fd is still in flight from above shows that the
//! kernel is reading ahead itself (FUSE's asynchronous readahead keeps up
//! to `max-readahead` in flight), so that read's advice to prefetch is not
//! followed (counted as `deferred-to-kernel`): prefetching what the kernel
//! already asked for only reads it twice. Read-ahead works for the readers
//! the kernel does not read ahead for: O_DIRECT and `direct-io-mode`
//! readers, and mounts with a small `max-readahead`. A read served from
//! one page is a slice of it, not a copy.
//!
//! Bounds: at most `2 * page-count + 2` pages per fd (prefetches past that
//! are skipped) and [`MAX_FDS`] fds (later fds read without read-ahead).
//! A write, truncate, fallocate, discard, zerofill or copy into an inode
//! empties the cache of every fd on it, before the fop is wound and again
//! when it returns; each emptying bumps the fd's generation, so a prefetch
//! that was in flight meanwhile is thrown away when it lands.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use xlfs_sdk::options::{Opt, OptionDecl, kind};
use xlfs_sdk::policy::Policies;
use xlfs_sdk::policy::read_ahead::{self as policy, Advice, Geometry, ReadAheadPolicy, ReadAheadStream, ReadInfo};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Fd, FdId, Fop, FopFuture, Gfid, Iatt, InitCtx, InitError, Options, Reply, Request, Response,
    Xlator, XlatorType,
};

/// Most fds with read-ahead state at once.
pub const MAX_FDS: usize = 4096;

const PAGE_SIZE: Opt<kind::Size> = Opt::size("page-size", "128KB")
    .range(4096.0, 16777216.0)
    .desc("Bytes per cached page; each prefetch is one READ of this size.");
const PAGE_COUNT: Opt<kind::Int> = Opt::int("page-count", "4")
    .range(1.0, 16.0)
    .desc("Pages kept prefetched ahead of a sequential reader, per fd (GlusterFS's default is 4).");
const POLICY: Opt<kind::Module> = Opt::module("policy", policy::DEFAULT).desc(
    "The read-ahead policy: 'tolerant' (a sequential stream survives reordered requests), \
     'gluster-strict' (GlusterFS's old rule: any read not at the previous read's end resets the window), \
     or a policy plugin module (plugin ABI v1.1) as 'wasm:/abs/path/ra.wasm' or 'dylib:/abs/path/libra.so'; \
     if the module fails, 'tolerant' decides for it.",
);

const OPTIONS: &[OptionDecl] = &[PAGE_SIZE.decl, PAGE_COUNT.decl, POLICY.decl];

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "performance/read-ahead",
    description: "prefetches pages ahead of sequential readers and serves reads from them",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

enum Page {
    Pending,
    Ready { data: Bytes, iatt: Iatt },
}

struct FdRa {
    gfid: Gfid,
    stream: Box<dyn ReadAheadStream>,
    pages: BTreeMap<u64, Page>,
    generation: u64,
    /// Reads from above in flight (not answered from the cache at once).
    inflight: u32,
}

impl FdRa {
    fn empty(&mut self, geo: Geometry) {
        self.pages.clear();
        self.generation += 1;
        self.stream.reset_cache(geo);
    }
}

#[derive(Default, Clone, Copy)]
struct Stats {
    hits: u64,
    misses: u64,
    resets: u64,
    prefetches: u64,
    untracked: u64,
    deferred: u64,
}

struct State {
    geo: Geometry,
    policy: Arc<dyn ReadAheadPolicy>,
    fds: HashMap<FdId, FdRa>,
    stats: Stats,
}

struct ReadAhead {
    child: Child,
    state: Arc<Mutex<State>>,
    /// Woken whenever a prefetch lands (or is thrown away).
    landed: Arc<tokio::sync::Notify>,
    /// The graph's policy loaders, for a policy named on reconfigure.
    policies: Policies,
}

fn settings(options: &Options, policies: &Policies) -> Result<(Geometry, Arc<dyn ReadAheadPolicy>), String> {
    let page_size = PAGE_SIZE.get(options);
    let page_count = PAGE_COUNT.get(options).clamp(1, 16) as u32;
    let p = policies.read_ahead(POLICY.get(options)).map_err(|e| e.to_string())?;
    Ok((Geometry { page_size, page_count }, p))
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let (geo, policy) = settings(&init.options, &init.policies).map_err(InitError::new)?;
    let child = init.children.into_iter().next().ok_or_else(|| InitError::new("needs one child"))?;
    let state = State { geo, policy, fds: HashMap::new(), stats: Stats::default() };
    Ok(Arc::new(ReadAhead {
        child,
        state: Arc::new(Mutex::new(state)),
        landed: Arc::new(tokio::sync::Notify::new()),
        policies: init.policies,
    }))
}

impl State {
    fn max_pages(&self) -> usize {
        2 * self.geo.page_count as usize + 2
    }

    /// Shows the read to the fd's stream, applies its advice, and answers
    /// from the cache when it can. Returns the cached reply (if any), the
    /// pages to fetch and the fd's generation. A read not answered here is
    /// counted in flight on its fd (an [`InFlight`] must take it back).
    fn read(&mut self, fd: Fd, info: ReadInfo) -> (Option<Reply>, Vec<u64>, u64) {
        let (geo, max_pages) = (self.geo, self.max_pages());
        if !self.fds.contains_key(&fd.id) {
            if self.fds.len() >= MAX_FDS {
                self.stats.untracked += 1;
                return (None, Vec::new(), 0);
            }
            let stream = self.policy.open(geo);
            let f = FdRa { gfid: fd.gfid, stream, pages: BTreeMap::new(), generation: 0, inflight: 0 };
            self.fds.insert(fd.id, f);
        }
        let Some(f) = self.fds.get_mut(&fd.id) else { return (None, Vec::new(), 0) };
        let mut advice = f.stream.on_read(info);
        // Another read of this fd still in flight: the kernel reads ahead.
        let deferred = f.inflight > 0 && !advice.prefetch.is_empty();
        if deferred {
            advice.prefetch.clear();
        }
        // Serve before dropping: the advice may drop the pages this read
        // consumes (gluster-strict keeps nothing behind the reader).
        let plan = serve(&f.pages, info, geo);
        // A read that will wait for its pages being fetched keeps them.
        let keep = (plan.is_none() && fetching(&f.pages, info, geo)).then_some(info);
        apply_drops(&mut f.pages, &advice, geo, keep);
        let fetch = plan_prefetch(&mut f.pages, &advice, geo, max_pages);
        let generation = f.generation;
        if plan.is_none() {
            f.inflight += 1;
        }
        let st = &mut self.stats;
        st.deferred += u64::from(deferred);
        st.resets += u64::from(advice.reset);
        st.prefetches += fetch.len() as u64;
        match plan {
            Some(_) => st.hits += 1,
            None => st.misses += 1,
        }
        (plan, fetch, generation)
    }

    /// See [`fetching`].
    fn fetching(&self, fd: Fd, info: ReadInfo) -> bool {
        self.fds.get(&fd.id).is_some_and(|f| fetching(&f.pages, info, self.geo))
    }

    fn invalidate(&mut self, gfid: Gfid) {
        let geo = self.geo;
        for f in self.fds.values_mut().filter(|f| gfid.is_null() || f.gfid == gfid) {
            f.empty(geo);
        }
    }
}

fn apply_drops(pages: &mut BTreeMap<u64, Page>, advice: &Advice, geo: Geometry, keep: Option<ReadInfo>) {
    let kept = |k: u64| {
        keep.is_some_and(|i| k.saturating_add(geo.page_size) > i.offset && k < i.offset.saturating_add(i.size))
    };
    for r in &advice.drop {
        let doomed: Vec<u64> = pages
            .range(r.offset..r.end())
            .map(|(k, _)| *k)
            .filter(|k| k.saturating_add(geo.page_size) <= r.end() && !kept(*k))
            .collect();
        for k in doomed {
            pages.remove(&k);
        }
    }
}

/// True when every page a read needs is cached or being fetched, and at
/// least one is being fetched.
fn fetching(pages: &BTreeMap<u64, Page>, info: ReadInfo, geo: Geometry) -> bool {
    let end = info.offset.saturating_add(info.size);
    let mut page = geo.page_floor(info.offset);
    let mut pending = false;
    while page < end {
        match pages.get(&page) {
            Some(Page::Pending) => pending = true,
            Some(Page::Ready { data, .. }) if (data.len() as u64) < geo.page_size => break,
            Some(Page::Ready { .. }) => {}
            None => return false,
        }
        match page.checked_add(geo.page_size) {
            Some(n) => page = n,
            None => break,
        }
    }
    pending
}

/// Marks the advised pages not yet cached as pending, up to the bound.
fn plan_prefetch(pages: &mut BTreeMap<u64, Page>, advice: &Advice, geo: Geometry, max_pages: usize) -> Vec<u64> {
    let mut fetch = Vec::new();
    for r in &advice.prefetch {
        let mut p = geo.page_floor(r.offset);
        while p < r.end() && pages.len() < max_pages {
            pages.entry(p).or_insert_with(|| {
                fetch.push(p);
                Page::Pending
            });
            match p.checked_add(geo.page_size) {
                Some(n) => p = n,
                None => break,
            }
        }
    }
    fetch
}

/// The read's bytes from the cache, when every page it needs is there (a
/// short page is the end of the file).
fn serve(pages: &BTreeMap<u64, Page>, info: ReadInfo, geo: Geometry) -> Option<Reply> {
    let end = info.offset.saturating_add(info.size);
    if info.size == 0 {
        return None;
    }
    let mut parts = Vec::new();
    let mut pos = info.offset;
    let mut last = None;
    while pos < end {
        let page = geo.page_floor(pos);
        let Some(Page::Ready { data, iatt }) = pages.get(&page) else { return None };
        last = Some(*iatt);
        let from = (pos - page) as usize;
        if from >= data.len() {
            break; // end of file
        }
        let to = data.len().min((end - page) as usize);
        parts.push(data.slice(from..to));
        if data.len() < geo.page_size as usize {
            break;
        }
        pos = page.saturating_add(geo.page_size);
    }
    let data = match parts.len() {
        0 => Bytes::new(),
        1 => parts.swap_remove(0),
        _ => {
            let mut out = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
            parts.iter().for_each(|p| out.extend_from_slice(p));
            out.freeze()
        }
    };
    last.map(|iatt| Reply::Read { data, iatt })
}

/// A read from above counted in flight on its fd until it ends (or is
/// dropped).
struct InFlight<'a> {
    state: &'a Mutex<State>,
    fd: FdId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.state.lock().fds.get_mut(&self.fd) {
            f.inflight = f.inflight.saturating_sub(1);
        }
    }
}

impl ReadAhead {
    /// Waits until the prefetches a read needs have landed; the reply from
    /// the cache, or None if a page it needs went away (failed, dropped,
    /// invalidated by a write).
    async fn after_prefetch(&self, fd: Fd, info: ReadInfo) -> Option<Reply> {
        loop {
            let landed = self.landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            {
                let mut st = self.state.lock();
                let geo = st.geo;
                let f = st.fds.get(&fd.id)?;
                if let Some(reply) = serve(&f.pages, info, geo) {
                    st.stats.hits += 1;
                    st.stats.misses = st.stats.misses.saturating_sub(1);
                    return Some(reply);
                }
                if !st.fetching(fd, info) {
                    return None;
                }
            }
            landed.await;
        }
    }

    /// Winds one READ per page in the background; a page lands only if
    /// the fd's generation did not move meanwhile.
    fn prefetch(&self, ctx: &CallCtx, fd: Fd, pages: Vec<u64>, generation: u64, page_size: u64) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            let mut st = self.state.lock();
            if let Some(f) = st.fds.get_mut(&fd.id) {
                f.pages.retain(|k, p| !(pages.contains(k) && matches!(p, Page::Pending)));
            }
            return;
        };
        for offset in pages {
            let (child, state, ctx, landed) =
                (self.child.clone(), self.state.clone(), ctx.clone(), self.landed.clone());
            let size = u32::try_from(page_size).unwrap_or(u32::MAX);
            rt.spawn(async move {
                let res = child.call(ctx, Request::new(Fop::Readv { fd, size, offset, flags: 0 })).await;
                {
                    let mut st = state.lock();
                    if let Some(f) = st.fds.get_mut(&fd.id)
                        && f.generation == generation
                        && matches!(f.pages.get(&offset), Some(Page::Pending))
                    {
                        match res {
                            Ok(Response { reply: Reply::Read { data, iatt }, .. }) => {
                                f.pages.insert(offset, Page::Ready { data, iatt });
                            }
                            other => {
                                tracing::debug!(offset, ?other, "read-ahead prefetch failed");
                                f.pages.remove(&offset);
                            }
                        }
                    }
                }
                landed.notify_waiters();
            });
        }
    }
}

/// The inode a fop changes the data of, if any.
fn written_inode(fop: &Fop) -> Option<Gfid> {
    match fop {
        Fop::Writev { fd, .. }
        | Fop::Ftruncate { fd, .. }
        | Fop::Fallocate { fd, .. }
        | Fop::Discard { fd, .. }
        | Fop::Zerofill { fd, .. } => Some(fd.gfid),
        Fop::CopyFileRange { fd_out, .. } => Some(fd_out.gfid),
        Fop::Truncate { loc, .. } => Some(loc.gfid),
        _ => None,
    }
}

impl Xlator for ReadAhead {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        match &req.fop {
            Fop::Readv { fd, size, offset, .. } => {
                let fd = *fd;
                let info = ReadInfo { offset: *offset, size: u64::from(*size), at_ns: now_ns() };
                let (plan, fetch, generation, page_size, wait) = {
                    let mut st = self.state.lock();
                    let (plan, fetch, generation) = st.read(fd, info);
                    let wait = plan.is_none() && st.fetching(fd, info);
                    (plan, fetch, generation, st.geo.page_size, wait)
                };
                if !fetch.is_empty() {
                    self.prefetch(&ctx, fd, fetch, generation, page_size);
                }
                if let Some(reply) = plan {
                    return Box::pin(async move { Ok(Response::from(reply)) });
                }
                let counted = InFlight { state: &self.state, fd: fd.id };
                Box::pin(async move {
                    let _counted = counted;
                    if wait && let Some(reply) = self.after_prefetch(fd, info).await {
                        return Ok(Response::from(reply));
                    }
                    self.child.call(ctx, req).await
                })
            }
            Fop::Release { fd } => {
                if let Some(mut f) = self.state.lock().fds.remove(&fd.id) {
                    f.stream.close();
                }
                self.child.call(ctx, req)
            }
            fop => match written_inode(fop) {
                Some(gfid) => Box::pin(async move {
                    self.state.lock().invalidate(gfid);
                    let res = self.child.call(ctx, req).await;
                    self.state.lock().invalidate(gfid);
                    res
                }),
                None => self.child.call(ctx, req),
            },
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        let (geo, policy) = settings(options, &self.policies).map_err(ReconfigureError::Invalid)?;
        let mut st = self.state.lock();
        let new_policy = policy.name() != st.policy.name();
        st.geo = geo;
        if new_policy {
            st.policy = policy;
        }
        let State { policy, fds, .. } = &mut *st;
        for f in fds.values_mut() {
            if new_policy {
                f.stream = policy.open(geo);
            }
            f.empty(geo);
        }
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let st = self.state.lock();
        let pages: usize = st.fds.values().map(|f| f.pages.len()).sum();
        let s = st.stats;
        [
            ("page-size", st.geo.page_size.to_string()),
            ("page-count", st.geo.page_count.to_string()),
            ("policy", st.policy.name().to_string()),
            ("fds", st.fds.len().to_string()),
            ("pages", pages.to_string()),
            ("hits", s.hits.to_string()),
            ("misses", s.misses.to_string()),
            ("resets", s.resets.to_string()),
            ("prefetches", s.prefetches.to_string()),
            ("untracked-reads", s.untracked.to_string()),
            ("deferred-to-kernel", s.deferred.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

fn now_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    u64::try_from(START.get_or_init(std::time::Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlfs_sdk::testing::init_named;
    use xlfs_sdk::{Errno, Loc};

    /// A file in memory that counts its reads.
    #[derive(Default)]
    struct MemFile {
        data: Mutex<Vec<u8>>,
        reads: Mutex<Vec<(u64, u32)>>,
    }

    impl Xlator for MemFile {
        fn call(&self, _ctx: CallCtx, req: Request) -> FopFuture<'_> {
            let res = match req.fop {
                Fop::Readv { fd, size, offset, .. } => {
                    self.reads.lock().push((offset, size));
                    let d = self.data.lock();
                    let from = (offset as usize).min(d.len());
                    let to = from.saturating_add(size as usize).min(d.len());
                    Ok(Reply::Read {
                        data: Bytes::copy_from_slice(&d[from..to]),
                        iatt: Iatt { gfid: fd.gfid, ..Iatt::default() },
                    })
                }
                Fop::Writev { data, offset, .. } => {
                    let mut d = self.data.lock();
                    let end = offset as usize + data.len();
                    if d.len() < end {
                        d.resize(end, 0);
                    }
                    d[offset as usize..end].copy_from_slice(&data);
                    Ok(Reply::PrePost { pre: Iatt::default(), post: Iatt::default() })
                }
                Fop::Release { .. } => Ok(Reply::Empty),
                _ => Err(Errno::ENOSYS),
            };
            Box::pin(async move { res.map(Response::from) })
        }
    }

    const GFID: Gfid = Gfid([7; 16]);
    const PS: usize = 4096;

    fn setup(opts: &[(&str, &str)], len: usize) -> (Arc<dyn Xlator>, Arc<MemFile>) {
        let file = Arc::new(MemFile::default());
        *file.data.lock() = (0..len).map(|i| (i % 251) as u8).collect();
        let (init, _) = init_named("ra", OPTIONS, opts, &[Child { name: Arc::from("mem"), xl: file.clone() }]);
        (build(init).expect("build"), file)
    }

    fn fd(id: u64) -> Fd {
        Fd { id: FdId(id), gfid: GFID }
    }

    async fn read(xl: &Arc<dyn Xlator>, fd: Fd, offset: u64, size: u32) -> Bytes {
        match xl.call(CallCtx::root("t"), Request::new(Fop::Readv { fd, size, offset, flags: 0 })).await {
            Ok(Response { reply: Reply::Read { data, .. }, .. }) => data,
            other => panic!("read: {other:?}"),
        }
    }

    /// Lets the spawned prefetches (answered at once by the file) land.
    async fn settle(_xl: &Arc<dyn Xlator>) {
        for _ in 0..64 {
            tokio::task::yield_now().await;
        }
    }

    fn dump(xl: &Arc<dyn Xlator>, key: &str) -> String {
        xl.dump().into_iter().find(|(k, _)| k == key).map(|(_, v)| v).unwrap_or_default()
    }

    fn expected(offset: usize, len: usize) -> Vec<u8> {
        (offset..offset + len).map(|i| (i % 251) as u8).collect()
    }

    fn opts(policy: &str) -> Vec<(&str, &str)> {
        vec![("page-size", "4KB"), ("page-count", "4"), ("policy", policy)]
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_read_waits_for_its_page_being_prefetched_instead_of_reading_it_again() {
        for policy in ["tolerant", "gluster-strict"] {
            let (xl, file) = setup(&opts(policy), 32 * PS);
            // No pause between reads: the prefetches are still in flight
            // when the next read comes.
            for i in 0..32 {
                assert_eq!(
                    read(&xl, fd(1), (i * PS) as u64, PS as u32).await,
                    expected(i * PS, PS),
                    "{policy} page {i}"
                );
            }
            let reads = file.reads.lock().clone();
            let mut offsets: Vec<u64> = reads.iter().map(|(o, _)| *o).collect();
            offsets.sort_unstable();
            let n = offsets.len();
            offsets.dedup();
            assert_eq!(offsets.len(), n, "{policy}: a page was read from the child twice: {reads:?}");
            let hits: u64 = dump(&xl, "hits").parse().expect("hits");
            assert!(hits >= 16, "{policy}: hits {hits}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sequential_reads_are_served_from_prefetched_pages() {
        let (xl, file) = setup(&opts("tolerant"), 64 * PS + 100);
        for i in 0..64 {
            assert_eq!(read(&xl, fd(1), (i * PS) as u64, PS as u32).await, expected(i * PS, PS), "page {i}");
            settle(&xl).await;
        }
        // Past the end of the file: short, then empty, from the cache or the child.
        assert_eq!(read(&xl, fd(1), (64 * PS) as u64, PS as u32).await, expected(64 * PS, 100));
        let hits: u64 = dump(&xl, "hits").parse().expect("hits");
        assert!(hits >= 60, "hits {hits}");
        assert_eq!(dump(&xl, "resets"), "0");
        // Every page was read from the child about once: prefetch, no double reads.
        let reads = file.reads.lock().len();
        assert!(reads <= 64 + 2 + 4 + 3, "child reads {reads}");
        let pages: usize = dump(&xl, "pages").parse().expect("pages");
        assert!(pages <= 2 * 4 + 2, "pages bounded: {pages}");
    }

    /// Reads of a sequential stream delivered reordered in pairs.
    async fn reordered_pairs(policy: &str) -> (u64, u64) {
        let (xl, _file) = setup(&opts(policy), 64 * PS);
        for pair in 0..32 {
            for i in [2 * pair + 1, 2 * pair] {
                assert_eq!(read(&xl, fd(1), (i * PS) as u64, PS as u32).await, expected(i * PS, PS));
                settle(&xl).await;
            }
        }
        (dump(&xl, "hits").parse().expect("hits"), dump(&xl, "resets").parse().expect("resets"))
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reordered_reads_keep_the_tolerant_window_and_reset_strict() {
        let (tolerant_hits, tolerant_resets) = reordered_pairs("tolerant").await;
        let (strict_hits, strict_resets) = reordered_pairs("gluster-strict").await;
        assert_eq!(tolerant_resets, 0);
        assert!(tolerant_hits >= 58, "tolerant hits {tolerant_hits}");
        assert!(strict_resets >= 60, "strict resets {strict_resets}");
        assert!(strict_hits < tolerant_hits / 2, "strict hits {strict_hits}");
        // In order, the strict policy is served from its pages as well.
        let (xl, _file) = setup(&opts("gluster-strict"), 16 * PS);
        for i in 0..16 {
            assert_eq!(read(&xl, fd(1), (i * PS) as u64, PS as u32).await, expected(i * PS, PS));
            settle(&xl).await;
        }
        assert_eq!((dump(&xl, "hits").as_str(), dump(&xl, "resets").as_str()), ("14", "0"));
    }

    /// The kernel reading ahead itself: four reads of the fd in flight at
    /// all times, as FUSE's asynchronous readahead sends them.
    #[tokio::test(flavor = "current_thread")]
    async fn reads_the_kernel_keeps_in_flight_are_not_prefetched_again() {
        let (xl, file) = setup(&opts("tolerant"), 64 * PS);
        let call = |i: usize| {
            let req = Request::new(Fop::Readv { fd: fd(1), size: PS as u32, offset: (i * PS) as u64, flags: 0 });
            xl.call(CallCtx::root("t"), req)
        };
        let mut pipe: std::collections::VecDeque<_> = (0..4).map(|i| (i, call(i))).collect();
        let mut next = 4;
        while let Some((i, oldest)) = pipe.pop_front() {
            match oldest.await {
                Ok(Response { reply: Reply::Read { data, .. }, .. }) => assert_eq!(data, expected(i * PS, PS)),
                other => panic!("read {i}: {other:?}"),
            }
            if next < 64 {
                pipe.push_back((next, call(next)));
                next += 1;
            }
            settle(&xl).await;
        }
        assert_eq!(next, 64);
        let deferred: u64 = dump(&xl, "deferred-to-kernel").parse().expect("deferred");
        let prefetches: u64 = dump(&xl, "prefetches").parse().expect("prefetches");
        // Only the first read, alone in flight, prefetched (its window).
        assert!(deferred >= 60, "deferred {deferred}");
        assert!(prefetches <= 4, "prefetches {prefetches}");
        let reads = file.reads.lock().len();
        assert!(reads <= 64 + 4, "child reads {reads}");
        // The reader goes on alone (O_DIRECT, or the kernel gave up): read-ahead works again.
        let before = dump(&xl, "hits").parse::<u64>().expect("hits");
        for i in 0..16 {
            assert_eq!(read(&xl, fd(2), (i * PS) as u64, PS as u32).await, expected(i * PS, PS));
            settle(&xl).await;
        }
        let hits = dump(&xl, "hits").parse::<u64>().expect("hits") - before;
        assert!(hits >= 14, "hits {hits}");
    }

    /// A read within one cached page is that page's bytes, not a copy.
    #[tokio::test(flavor = "current_thread")]
    async fn a_read_within_one_page_is_a_slice_of_it() {
        let (xl, _file) = setup(&opts("tolerant"), 16 * PS);
        read(&xl, fd(1), 0, PS as u32).await;
        settle(&xl).await;
        let a = read(&xl, fd(1), PS as u64, 100).await;
        let b = read(&xl, fd(1), PS as u64 + 100, 100).await;
        assert_eq!((a.clone(), b.clone()), (Bytes::from(expected(PS, 100)), Bytes::from(expected(PS + 100, 100))));
        assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 100, "both are slices of the same page");
        // Across two pages: the bytes of both.
        assert_eq!(read(&xl, fd(1), (2 * PS - 10) as u64, 20).await, expected(2 * PS - 10, 20));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_write_invalidates_every_fd_on_the_inode() {
        let (xl, _file) = setup(&opts("tolerant"), 16 * PS);
        for i in 0..3 {
            read(&xl, fd(1), (i * PS) as u64, PS as u32).await;
            settle(&xl).await;
        }
        assert!(dump(&xl, "pages").parse::<usize>().expect("pages") > 0);
        let w = Fop::Writev { fd: fd(2), data: Bytes::from(vec![0xAA; PS]), offset: (3 * PS) as u64, flags: 0 };
        xl.call(CallCtx::root("t"), Request::new(w)).await.expect("write");
        assert_eq!(dump(&xl, "pages"), "0");
        let got = read(&xl, fd(1), (3 * PS) as u64, PS as u32).await;
        assert_eq!(got, vec![0xAA; PS]);
        // A truncate by path with the inode's gfid empties it too.
        settle(&xl).await;
        let t = Fop::Truncate { loc: Loc { gfid: GFID, ..Loc::default() }, offset: 0 };
        let _ = xl.call(CallCtx::root("t"), Request::new(t)).await;
        assert_eq!(dump(&xl, "pages"), "0");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn release_forgets_the_fd_and_reconfigure_changes_geometry() {
        let (xl, _file) = setup(&opts("tolerant"), 64 * PS);
        for i in 0..4 {
            read(&xl, fd(1), (i * PS) as u64, PS as u32).await;
            settle(&xl).await;
        }
        let o = Options::resolve(OPTIONS, [("page-size", "8KB"), ("page-count", "2"), ("policy", "gluster-strict")])
            .expect("options");
        xl.reconfigure(&o).expect("reconfigure");
        assert_eq!((dump(&xl, "page-size").as_str(), dump(&xl, "page-count").as_str()), ("8192", "2"));
        assert_eq!((dump(&xl, "policy").as_str(), dump(&xl, "pages").as_str()), ("gluster-strict", "0"));
        for i in 2..10 {
            assert_eq!(read(&xl, fd(1), (i * 2 * PS) as u64, 2 * PS as u32).await, expected(i * 2 * PS, 2 * PS));
            settle(&xl).await;
        }
        let pages: usize = dump(&xl, "pages").parse().expect("pages");
        assert!(pages > 0 && pages <= 2 * 2 + 2, "{pages}");
        xl.call(CallCtx::root("t"), Request::new(Fop::Release { fd: fd(1) })).await.expect("release");
        assert_eq!((dump(&xl, "fds").as_str(), dump(&xl, "pages").as_str()), ("0", "0"));
        let bad = Options::resolve(OPTIONS, [("policy", "nope")]).expect("options");
        assert!(matches!(xl.reconfigure(&bad), Err(ReconfigureError::Invalid(m)) if m.contains("tolerant")));
    }

    #[test]
    fn unknown_policy_is_refused_at_build() {
        let mem = Child { name: Arc::from("mem"), xl: Arc::new(MemFile::default()) };
        let (init, _) = init_named("ra", OPTIONS, &[("policy", "nope")], &[mem]);
        let e = build(init).err().expect("refused");
        assert!(e.to_string().contains("gluster-strict"), "{e}");
    }

    #[test]
    fn hostile_reads_do_not_panic() {
        let (xl, _file) = setup(&opts("tolerant"), PS);
        for (off, size) in [(u64::MAX, u32::MAX), (u64::MAX - 1, 1), (0, 0), (u64::MAX - 4096, 4096)] {
            let _ = xlfs_sdk::testing::now(
                xl.call(CallCtx::root("t"), Request::new(Fop::Readv { fd: fd(1), size, offset: off, flags: 0 })),
            );
        }
    }
}
