//! quick-read over a recording mock child, and quick-read over open-behind
//! over a real storage/posix brick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::{
    CallCtx, Child, Dict, Event, EventFrom, Fd, FdId, Fop, FopKind, FopResult, Gfid, Iatt, Loc, Options, Reply,
    Request, Response, SetAttr, Timespec, Upcall, Value, Xlator,
};

use super::*;
use xlfs_sdk::testing::{Gate, MockChild, ctx, init, init_named, now};

const G: Gfid = Gfid([0x51; 16]);
const H: Gfid = Gfid([0x52; 16]);
const K: Gfid = Gfid([0x53; 16]);

struct T {
    qr: Arc<QuickRead>,
    mock: Arc<MockChild>,
    clock: Arc<Mutex<Instant>>,
}

fn setup(opts: &[(&str, &str)]) -> T {
    let mock = MockChild::new();
    let (ictx, _sent) = init(OPTIONS, opts, &[mock.child()]);
    let clock = Arc::new(Mutex::new(Instant::now()));
    let c = clock.clone();
    let qr = Arc::new(QuickRead::new(ictx, Arc::new(move || *c.lock())).expect("build"));
    T { qr, mock, clock }
}

fn file_iatt(gfid: Gfid, size: u64, mtime: i64) -> Iatt {
    let t = Timespec { sec: mtime, nsec: 0 };
    Iatt { gfid, mode: 0o100644, size, mtime: t, ctime: t, ..Iatt::default() }
}

/// Makes the child answer lookups with `iatt` and, if given, `content`.
fn lookup_answer(mock: &MockChild, iatt: Iatt, content: Option<&[u8]>) {
    let mut xdata = Dict::new();
    if let Some(c) = content {
        xdata.set_bytes(CONTENT, Bytes::copy_from_slice(c));
    }
    mock.answer(FopKind::Lookup, Ok(Response { reply: Reply::Entry { iatt, postparent: Iatt::default() }, xdata }));
}

impl T {
    fn call(&self, fop: Fop) -> FopResult {
        now(self.qr.call(ctx("c", 1), Request::new(fop)))
    }
    fn lookup(&self, gfid: Gfid) -> Response {
        self.call(Fop::Lookup { loc: Loc::gfid(gfid) }).expect("lookup")
    }
    fn read(&self, gfid: Gfid, offset: u64, size: u32) -> Bytes {
        match self.call(Fop::Readv { fd: Fd { id: FdId(1), gfid }, size, offset, flags: 0 }) {
            Ok(Response { reply: Reply::Read { data, .. }, .. }) => data,
            r => panic!("read: {r:?}"),
        }
    }
    fn child_reads(&self) -> usize {
        self.mock.kinds().iter().filter(|k| **k == FopKind::Readv).count()
    }
    fn dump(&self, key: &str) -> String {
        self.qr.dump().into_iter().find(|(k, _)| k == key).map(|(_, v)| v).unwrap_or_default()
    }
    fn advance(&self, d: Duration) {
        *self.clock.lock() += d;
    }
    /// Lookup that caches `content` for `gfid`; returns the lookup reply.
    fn cache(&self, gfid: Gfid, content: &[u8], mtime: i64) -> Response {
        lookup_answer(&self.mock, file_iatt(gfid, content.len() as u64, mtime), Some(content));
        self.lookup(gfid)
    }
}

#[test]
fn a_read_after_lookup_is_served_from_the_cache() {
    let t = setup(&[]);
    let r = t.cache(G, b"hello world", 5);
    // The lookup asked for the content with max-file-size, and the key is
    // not passed up to a caller that did not ask.
    let (_, sent) = t.mock.calls().pop().expect("lookup sent");
    assert_eq!(sent.xdata.get(CONTENT), Some(&Value::U64(64 * 1024)));
    assert!(!r.xdata.contains(CONTENT));
    assert_eq!(t.dump("files"), "1");
    assert_eq!(t.dump("bytes-cached"), "11");
    assert_eq!(t.read(G, 0, 4096), Bytes::from_static(b"hello world"));
    assert_eq!(t.read(G, 6, 3), Bytes::from_static(b"wor"));
    assert_eq!(t.read(G, 8, 100), Bytes::from_static(b"rld"), "short read at the end");
    assert!(t.read(G, 100, 10).is_empty(), "past the end");
    assert_eq!(t.child_reads(), 0, "no read reached the child");
    assert_eq!((t.dump("hits").as_str(), t.dump("misses").as_str()), ("4", "0"));
    // Slices of the cached bytes, not copies.
    let a = t.read(G, 0, 11);
    let b = t.read(G, 6, 5);
    assert_eq!(b.as_ptr(), a[6..].as_ptr());
    // The reply iatt is the cached one.
    match t.call(Fop::Readv { fd: Fd { id: FdId(9), gfid: G }, size: 4, offset: 0, flags: 0 }) {
        Ok(Response { reply: Reply::Read { iatt, .. }, .. }) => assert_eq!(iatt, file_iatt(G, 11, 5)),
        r => panic!("{r:?}"),
    }
}

#[test]
fn a_caller_that_asks_for_the_content_keeps_its_limit_and_gets_the_key() {
    let t = setup(&[]);
    lookup_answer(&t.mock, file_iatt(G, 3, 1), Some(b"abc"));
    let x = Dict::new().with(CONTENT, Value::U64(10));
    let r = now(t.qr.call(ctx("c", 1), Request::with_xdata(Fop::Lookup { loc: Loc::gfid(G) }, x))).expect("lookup");
    assert_eq!(r.xdata.get_bytes(CONTENT).as_deref(), Some(&b"abc"[..]));
    let (_, sent) = t.mock.calls().pop().expect("lookup sent");
    assert_eq!(sent.xdata.get(CONTENT), Some(&Value::U64(10)));
    assert_eq!(t.read(G, 0, 10), Bytes::from_static(b"abc"));
    assert_eq!(t.child_reads(), 0);
}

#[test]
fn files_over_max_file_size_are_not_cached() {
    let t = setup(&[("max-file-size", "16")]);
    t.cache(G, &[1u8; 32], 1);
    let (_, sent) = t.mock.calls().pop().expect("lookup sent");
    assert_eq!(sent.xdata.get(CONTENT), Some(&Value::U64(16)));
    assert_eq!(t.dump("files"), "0");
    t.read(G, 0, 32);
    assert_eq!(t.child_reads(), 1, "a miss goes to the child");
    assert_eq!(t.dump("misses"), "1");
    // Content that does not match the reply's size is not cached either.
    lookup_answer(&t.mock, file_iatt(H, 10, 1), Some(b"short"));
    t.lookup(H);
    assert_eq!(t.dump("files"), "0");
    // Not a regular file: nothing cached.
    let mut dir = file_iatt(K, 0, 1);
    dir.mode = 0o040755;
    lookup_answer(&t.mock, dir, Some(b""));
    t.lookup(K);
    assert_eq!(t.dump("files"), "0");
}

#[test]
fn writes_truncates_and_upcalls_drop_the_content() {
    let t = setup(&[]);
    let fd = Fd { id: FdId(3), gfid: G };
    let changes = [
        Fop::Writev { fd, data: Bytes::from_static(b"x"), offset: 0, flags: 0 },
        Fop::Truncate { loc: Loc::gfid(G), offset: 0 },
        Fop::Ftruncate { fd, offset: 1 },
        Fop::Setattr { loc: Loc::gfid(G), attr: SetAttr::default() },
        Fop::Fallocate { fd, mode: 0, offset: 0, len: 10 },
        Fop::Discard { fd, offset: 0, len: 1 },
        Fop::Zerofill { fd, offset: 0, len: 1 },
        Fop::CopyFileRange { fd_in: Fd { id: FdId(4), gfid: H }, off_in: 0, fd_out: fd, off_out: 0, len: 1, flags: 0 },
        Fop::Open { loc: Loc::gfid(G), flags: (libc::O_WRONLY | libc::O_TRUNC) as u32, fd: FdId(5) },
        Fop::Forget { gfid: G },
    ];
    for (n, fop) in changes.into_iter().enumerate() {
        t.cache(G, b"cached", 1);
        assert_eq!(t.dump("files"), "1");
        let kind = fop.kind();
        let _ = t.call(fop);
        assert_eq!(t.dump("files"), "0", "{kind:?} drops the content");
        let before = t.child_reads();
        t.read(G, 0, 6);
        assert_eq!(t.child_reads(), before + 1, "{kind:?}: the next read goes down");
        assert_eq!(t.dump("invalidations"), (n + 1).to_string());
    }
    // Changes that are not to the data leave it alone.
    t.cache(G, b"cached", 1);
    let _ = t.call(Fop::Open { loc: Loc::gfid(G), flags: libc::O_RDONLY as u32, fd: FdId(6) });
    let _ = t.call(Fop::Setxattr { loc: Loc::gfid(G), xattrs: Dict::new(), flags: 0 });
    assert_eq!(t.dump("files"), "1");
    // An invalidation upcall drops it and is passed on up.
    let ev = Event::Upcall(Upcall::Invalidate { gfid: G });
    assert_eq!(t.qr.notify(ev.clone(), EventFrom::Child(0)), Some(ev));
    assert_eq!(t.dump("files"), "0");
}

#[test]
fn the_cache_is_bounded_by_cache_size_with_lru_eviction() {
    let t = setup(&[("cache-size", "100"), ("max-file-size", "64")]);
    t.cache(G, &[1u8; 40], 1);
    t.cache(H, &[2u8; 40], 1);
    // G is used, so H is the least recently used.
    t.read(G, 0, 1);
    t.cache(K, &[3u8; 40], 1);
    assert_eq!(t.dump("evictions"), "1");
    assert_eq!(t.dump("bytes-cached"), "80");
    let reads = t.child_reads();
    t.read(G, 0, 1);
    t.read(K, 0, 1);
    assert_eq!(t.child_reads(), reads, "G and K are cached");
    t.read(H, 0, 1);
    assert_eq!(t.child_reads(), reads + 1, "H was evicted");
    // Shrinking the cache by reconfigure evicts down to the new size.
    let o = Options::resolve(OPTIONS, [("cache-size", "50"), ("max-file-size", "64")]).expect("options");
    t.qr.reconfigure(&o).expect("reconfigure");
    assert_eq!(t.dump("bytes-cached"), "40");
    assert_eq!(t.dump("cache-size"), "50");
    // A file larger than the whole cache is not cached.
    let o = Options::resolve(OPTIONS, [("cache-size", "10"), ("max-file-size", "64")]).expect("options");
    t.qr.reconfigure(&o).expect("reconfigure");
    t.cache(H, &[2u8; 40], 1);
    assert_eq!(t.dump("files"), "0");
}

#[test]
fn content_is_fresh_for_the_timeout_and_until_its_attributes_change() {
    let t = setup(&[("cache-timeout", "1")]);
    let read = Reply::Read { data: Bytes::from_static(b"data"), iatt: file_iatt(G, 4, 7) };
    t.mock.answer(FopKind::Readv, Ok(Response::from(read)));
    t.cache(G, b"data", 7);
    t.advance(Duration::from_millis(900));
    t.read(G, 0, 4);
    assert_eq!(t.child_reads(), 0, "fresh within the timeout");
    t.advance(Duration::from_millis(200));
    t.read(G, 0, 4);
    assert_eq!(t.child_reads(), 1, "expired: the read goes down");
    // A lookup while it is cached does not ask for the content again; the
    // same attributes revalidate it.
    lookup_answer(&t.mock, file_iatt(G, 4, 7), None);
    t.lookup(G);
    let (_, sent) = t.mock.calls().pop().expect("lookup");
    assert!(!sent.xdata.contains(CONTENT));
    t.read(G, 0, 4);
    assert_eq!(t.child_reads(), 1, "revalidated by the lookup");
    // A stat reply with another mtime drops it.
    t.mock.answer(FopKind::Stat, Ok(Response::from(Reply::Attr(file_iatt(G, 4, 8)))));
    let _ = t.call(Fop::Stat { loc: Loc::gfid(G) });
    assert_eq!(t.dump("files"), "0");
    t.read(G, 0, 4);
    assert_eq!(t.child_reads(), 2);
    // So does a lookup reply with another size.
    t.cache(G, b"data", 7);
    lookup_answer(&t.mock, file_iatt(G, 5, 7), None);
    t.lookup(G);
    assert_eq!(t.dump("files"), "0");
}

#[test]
fn with_cache_invalidation_content_is_trusted_until_invalidated() {
    let t = setup(&[("cache-invalidation", "on")]);
    t.cache(G, b"data", 7);
    t.advance(Duration::from_secs(3600));
    t.read(G, 0, 4);
    assert_eq!(t.child_reads(), 0);
    t.qr.notify(Event::Upcall(Upcall::Invalidate { gfid: G }), EventFrom::Child(0));
    t.read(G, 0, 4);
    assert_eq!(t.child_reads(), 1);
}

#[test]
fn a_lookup_racing_an_invalidation_does_not_cache_old_content() {
    let mut c = Cache::new(Cfg {
        max_file_size: 100,
        cache_size: 1000,
        timeout: Duration::from_secs(1),
        invalidation: false,
        fetch_on_read: false,
        dir_content: false,
    });
    let t0 = Instant::now();
    let seq = c.seq;
    // A write to G while the lookup was in flight.
    c.invalidate(G);
    c.on_lookup(&file_iatt(G, 3, 1), Some(Bytes::from_static(b"old")), seq, t0);
    assert!(c.map.is_empty());
    // A lookup wound after it caches.
    let seq = c.seq;
    c.on_lookup(&file_iatt(G, 3, 2), Some(Bytes::from_static(b"new")), seq, t0);
    assert_eq!(c.map.get(&G).map(|e| e.data.clone()), Some(Bytes::from_static(b"new")));
}

fn xl_over(ty: &xlfs_sdk::XlatorType, opts: &[(&str, &str)], child: Child) -> Arc<dyn Xlator> {
    (ty.build)(init_named(ty.name, ty.options, opts, &[child]).0).expect("build")
}

#[tokio::test(flavor = "current_thread")]
async fn over_open_behind_and_posix_a_small_file_read_costs_only_the_lookup() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().display().to_string();
    let posix = (crate::storage::posix::TYPE.build)(
        init_named("posix", crate::storage::posix::TYPE.options, &[("directory", dir.as_str())], &[]).0,
    )
    .expect("posix");
    let c = CallCtx::root("t");
    // Two files written straight on the brick: small, and over max-file-size.
    let mut files = Vec::new();
    for (i, (name, len)) in [("small", 100usize), ("big", 8192)].into_iter().enumerate() {
        let id = FdId(100 + i as u64);
        let fop = Fop::Create {
            loc: Loc::entry(Gfid::ROOT, name),
            flags: libc::O_RDWR as u32,
            mode: 0o644,
            umask: 0,
            fd: id,
        };
        let Ok(Response { reply: Reply::Entry { iatt, .. }, .. }) = posix.call(c.clone(), Request::new(fop)).await
        else {
            panic!("create {name}")
        };
        let data: Bytes = (0..len).map(|b| (b % 251) as u8).collect::<Vec<u8>>().into();
        let fd = Fd { id, gfid: iatt.gfid };
        posix
            .call(c.clone(), Request::new(Fop::Writev { fd, data: data.clone(), offset: 0, flags: 0 }))
            .await
            .expect("write");
        posix.call(c.clone(), Request::new(Fop::Release { fd })).await.expect("release");
        files.push((name, iatt.gfid, data));
    }
    // Records the kinds of the fops that reach posix.
    let count = Gate::passing(posix);
    let ob =
        xl_over(&crate::performance::open_behind::TYPE, &[], Child { name: Arc::from("count"), xl: count.clone() });
    // Without a lookup through quick-read first (md-cache above answered
    // it), fetch-on-read gets the content with one lookup by gfid.
    let fetching = xl_over(
        &TYPE,
        &[("max-file-size", "4KB"), ("fetch-on-read", "on")],
        Child { name: Arc::from("ob"), xl: ob.clone() },
    );
    for (n, (name, gfid, data)) in files.iter().enumerate() {
        let mark = count.arrived().len();
        let call = |fop: Fop| fetching.call(c.clone(), Request::new(fop));
        let fd = Fd { id: FdId(50 + n as u64), gfid: *gfid };
        call(Fop::Open { loc: Loc::gfid(*gfid), flags: libc::O_RDONLY as u32, fd: fd.id }).await.expect("open");
        for round in 0..2 {
            let got = match call(Fop::Readv { fd, size: 65536, offset: 0, flags: 0 }).await.expect("read").reply {
                Reply::Read { data, .. } => data,
                r => panic!("{r:?}"),
            };
            assert_eq!(&got, data, "{name} round {round}");
        }
        call(Fop::Flush { fd }).await.expect("flush");
        call(Fop::Release { fd }).await.expect("release");
        let seen = count.arrived().split_off(mark);
        if *name == "small" {
            assert_eq!(seen, [FopKind::Lookup], "posix sees only the content lookup of a small file");
        } else {
            let expect =
                [FopKind::Lookup, FopKind::Open, FopKind::Readv, FopKind::Readv, FopKind::Flush, FopKind::Release];
            assert_eq!(seen, expect, "a large file: one lookup, then it is remembered as too big");
        }
    }
    let qr = xl_over(&TYPE, &[("max-file-size", "4KB")], Child { name: Arc::from("ob"), xl: ob });
    for (n, (name, gfid, data)) in files.into_iter().enumerate() {
        let mark = count.arrived().len();
        let call = |fop: Fop| qr.call(c.clone(), Request::new(fop));
        let r = call(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, name) }).await.expect("lookup");
        assert!(!r.xdata.contains(CONTENT), "the content is not passed up unasked");
        let fd = Fd { id: FdId(1 + n as u64), gfid };
        call(Fop::Open { loc: Loc::gfid(gfid), flags: libc::O_RDONLY as u32, fd: fd.id }).await.expect("open");
        let got = match call(Fop::Readv { fd, size: 65536, offset: 0, flags: 0 }).await.expect("read").reply {
            Reply::Read { data, .. } => data,
            r => panic!("{r:?}"),
        };
        assert_eq!(got, data, "{name}");
        call(Fop::Flush { fd }).await.expect("flush");
        call(Fop::Release { fd }).await.expect("release");
        let seen = count.arrived().split_off(mark);
        if name == "small" {
            assert_eq!(seen, [FopKind::Lookup], "posix sees only the lookup of a small file");
        } else {
            let expect = [FopKind::Lookup, FopKind::Open, FopKind::Readv, FopKind::Flush, FopKind::Release];
            assert_eq!(seen, expect, "a large file is opened when read");
        }
    }
}

/// md-cache's whole-directory read asks for the entries' content; what
/// comes is cached (and taken out of the reply) and answers reads.
#[test]
fn content_from_a_directory_prefetch_answers_reads() {
    let t = setup(&[("cache-invalidation", "on")]);
    let entry =
        |name: &str, iatt: Iatt| xlfs_sdk::DirEntry { name: name.into(), d_off: 1, d_type: iatt.file_type(), iatt };
    let (g, h) = (file_iatt(G, 5, 10), file_iatt(H, 3, 10));
    let mut xdata = Dict::new();
    xdata.set_bytes(keys::dirent_xattr("g", CONTENT), Bytes::from_static(b"hello"));
    // h's content did not come (replicate removed it): h is not cached.
    t.mock.answer(FopKind::Readdirp, Ok(Response { reply: Reply::Dirents(vec![entry("g", g), entry("h", h)]), xdata }));
    let dir = Fd { id: FdId(9), gfid: K };
    let mut req = Request::new(Fop::Readdirp { fd: dir, size: 4096, offset: 0 });
    req.xdata.set_u64(keys::DIR_PREFETCH, 1);
    let rsp = now(t.qr.call(ctx("c", 1), req)).expect("readdirp");
    assert!(!rsp.xdata.contains(&keys::dirent_xattr("g", CONTENT)), "taken out of the reply");
    let (_, sent) = t.mock.calls().into_iter().find(|(_, r)| r.fop.kind() == FopKind::Readdirp).expect("sent");
    assert_eq!(sent.xdata.get_u64(keys::READDIRP_CONTENT), Some(64 * 1024), "asked with max-file-size");
    assert_eq!(&t.read(G, 0, 100)[..], b"hello");
    assert_eq!(t.child_reads(), 0, "from the cache");
    t.read(H, 0, 100);
    assert_eq!(t.child_reads(), 1, "not cached");
    // A kernel readdirp (no DIR_PREFETCH) asks for nothing.
    now(t.qr.call(ctx("c", 1), Request::new(Fop::Readdirp { fd: dir, size: 4096, offset: 0 }))).expect("readdirp");
    let last = t.mock.calls().into_iter().rev().find(|(_, r)| r.fop.kind() == FopKind::Readdirp).expect("sent");
    assert!(!last.1.xdata.contains(keys::READDIRP_CONTENT));
}

#[test]
fn dir_prefetch_content_off_asks_for_nothing() {
    let t = setup(&[("dir-prefetch-content", "off")]);
    let mut req = Request::new(Fop::Readdirp { fd: Fd { id: FdId(9), gfid: K }, size: 4096, offset: 0 });
    req.xdata.set_u64(keys::DIR_PREFETCH, 1);
    now(t.qr.call(ctx("c", 1), req)).expect("readdirp");
    let (_, sent) = t.mock.calls().into_iter().next().expect("sent");
    assert!(!sent.xdata.contains(keys::READDIRP_CONTENT));
}
