//! readdir-ahead over a directory-listing mock child (cookies that survive
//! creates and unlinks, per-entry xattrs as storage/posix returns them,
//! failures and held replies on demand), and md-cache over readdir-ahead
//! over a real storage/posix brick.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use xlfs_sdk::{
    CallCtx, Child, Dict, DirEntry, Errno, Event, EventFrom, Fd, FdId, FileType, Fop, FopFuture, FopKind, Gfid, Iatt,
    Loc, Options, Reply, Request, Response, Upcall, Value, Xlator,
};

use super::*;
use xlfs_sdk::testing::{Gate, init_named, now};

const DIR: Gfid = Gfid([0xd1; 16]);
const SELINUX: &str = "security.selinux";
const TAG: &str = "user.tag";

struct Ent {
    name: String,
    gfid: Gfid,
    size: u64,
    xattrs: Vec<(String, Bytes)>,
}

/// A child holding one directory, [`DIR`]. Entries are listed in cookie
/// order; a cookie is given once, so offsets stay valid across creates
/// and unlinks, as a real file system's do.
#[derive(Default)]
struct DirChild {
    ents: Mutex<BTreeMap<u64, Ent>>,
    next: Mutex<u64>,
    /// Readdirps at offsets at or past this fail with that errno.
    fail_from: Mutex<Option<(u64, Errno)>>,
    /// Readdirps seen: (offset, size, xdata).
    readdirps: Mutex<Vec<(u64, u32, Dict)>>,
    calls: Mutex<Vec<FopKind>>,
    /// When set, a readdirp takes its snapshot, then waits for a permit.
    gate: Mutex<Option<Arc<Semaphore>>>,
}

fn gfid_of(n: u64) -> Gfid {
    let mut g = [0x77u8; 16];
    g[8..].copy_from_slice(&n.to_be_bytes());
    Gfid(g)
}

impl DirChild {
    fn with(n: usize) -> Arc<DirChild> {
        let c = Arc::new(DirChild::default());
        for i in 0..n {
            c.add(&format!("e{i:04}"));
        }
        c
    }

    fn add(&self, name: &str) -> Gfid {
        let mut next = self.next.lock();
        *next += 1;
        let n = *next;
        let mut xattrs = vec![(TAG.to_string(), Bytes::from(format!("t{n}")))];
        if n.is_multiple_of(3) {
            xattrs.push((SELINUX.to_string(), Bytes::from_static(b"system_u:object_r:x")));
        }
        self.ents.lock().insert(n, Ent { name: name.to_string(), gfid: gfid_of(n), size: 0, xattrs });
        gfid_of(n)
    }

    fn remove(&self, name: &str) {
        self.ents.lock().retain(|_, e| e.name != name);
    }

    fn gfid(&self, name: &str) -> Gfid {
        self.ents.lock().values().find(|e| e.name == name).map(|e| e.gfid).expect("entry exists")
    }

    fn readdirp_count(&self) -> usize {
        self.readdirps.lock().len()
    }

    fn list(&self, offset: u64, size: u32, xdata: &Dict, plus: bool) -> Response {
        let names: Vec<&String> = xdata.keys().filter(|k| k.contains('.')).collect();
        let ents = self.ents.lock();
        let (mut used, mut out, mut x) = (0usize, Vec::new(), Dict::new());
        for (cookie, e) in ents.range(offset + 1..) {
            let cost = ENTRY_OVERHEAD + e.name.len() + 1;
            if !out.is_empty() && used + cost > size as usize {
                break;
            }
            used += cost;
            for (k, v) in &e.xattrs {
                if names.contains(&k) {
                    x.set_bytes(keys::dirent_xattr(&e.name, k), v.clone());
                }
            }
            let iatt = if plus {
                Iatt { gfid: e.gfid, mode: 0o100644, size: e.size, ..Iatt::default() }
            } else {
                Iatt::default()
            };
            out.push(DirEntry { name: e.name.clone(), d_off: *cookie, d_type: FileType::Regular, iatt });
        }
        if plus && !names.is_empty() {
            x.set_u64(keys::DIRENT_XATTRS, names.len() as u64);
        }
        Response { reply: Reply::Dirents(out), xdata: x }
    }
}

impl Xlator for DirChild {
    fn call(&self, _ctx: CallCtx, req: Request) -> FopFuture<'_> {
        self.calls.lock().push(req.fop.kind());
        Box::pin(async move {
            match req.fop {
                Fop::Readdirp { size, offset, .. } => {
                    self.readdirps.lock().push((offset, size, req.xdata.clone()));
                    let fail = *self.fail_from.lock();
                    let res = match fail {
                        Some((from, e)) if offset >= from => Err(e),
                        _ => Ok(self.list(offset, size, &req.xdata, true)),
                    };
                    let gate = self.gate.lock().clone();
                    if let Some(g) = gate {
                        g.acquire().await.expect("gate open").forget();
                    }
                    res
                }
                Fop::Readdir { size, offset, .. } => Ok(self.list(offset, size, &req.xdata, false)),
                Fop::Create { loc, .. } => {
                    let gfid = self.add(&loc.name);
                    Ok(Response::from(Reply::Entry {
                        iatt: Iatt { gfid, ..Iatt::default() },
                        postparent: Iatt::default(),
                    }))
                }
                Fop::Unlink { loc, .. } => {
                    self.remove(&loc.name);
                    Ok(Response::from(Reply::Parent { pre: Iatt::default(), post: Iatt::default() }))
                }
                Fop::Writev { fd, data, offset, .. } => {
                    let mut ents = self.ents.lock();
                    let e = ents.values_mut().find(|e| e.gfid == fd.gfid).ok_or(Errno::ENOENT)?;
                    let pre = Iatt { gfid: e.gfid, size: e.size, ..Iatt::default() };
                    e.size = e.size.max(offset + data.len() as u64);
                    Ok(Response::from(Reply::PrePost { pre, post: Iatt { size: e.size, ..pre } }))
                }
                Fop::Setxattr { loc, xattrs, .. } => {
                    let mut ents = self.ents.lock();
                    let e = ents.values_mut().find(|e| e.gfid == loc.gfid).ok_or(Errno::ENOENT)?;
                    for (k, v) in xattrs {
                        if let Value::Bytes(b) = v {
                            e.xattrs.retain(|(n, _)| *n != k);
                            e.xattrs.push((k, b));
                        }
                    }
                    Ok(Response::from(Reply::Empty))
                }
                _ => Ok(Response::from(Reply::Empty)),
            }
        })
    }
}

fn rda_over(child: Arc<dyn Xlator>, opts: &[(&str, &str)]) -> Arc<ReaddirAhead> {
    let (init, _) = init_named("rda", OPTIONS, opts, &[Child { name: Arc::from("dir"), xl: child }]);
    Arc::new(ReaddirAhead::new(init).expect("build"))
}

fn c() -> CallCtx {
    CallCtx::root("t")
}

fn fd(id: u64) -> Fd {
    Fd { id: FdId(id), gfid: DIR }
}

/// The xdata md-cache sends with its readdirps (xattr names set to 0).
fn md_xdata() -> Dict {
    let mut d = Dict::new();
    d.set_u64(SELINUX, 0);
    d.set_u64(TAG, 0);
    d
}

fn dump(x: &dyn Xlator, key: &str) -> u64 {
    x.dump().into_iter().find(|(k, _)| k == key).and_then(|(_, v)| v.parse().ok()).unwrap_or(u64::MAX)
}

async fn opendir(x: &dyn Xlator, id: u64, hint: bool) {
    let mut req = Request::new(Fop::Opendir { loc: Loc::gfid(DIR), fd: FdId(id) });
    if hint {
        req.xdata.set_str(keys::MDC_LOADED_KEY_NAMES, format!("{SELINUX} {TAG}"));
    }
    x.call(c(), req).await.expect("opendir");
}

async fn readdirp(x: &dyn Xlator, id: u64, size: u32, offset: u64, xdata: &Dict) -> Result<Response, Errno> {
    x.call(c(), Request::with_xdata(Fop::Readdirp { fd: fd(id), size, offset }, xdata.clone())).await
}

fn entries(r: &Response) -> &[DirEntry] {
    match &r.reply {
        Reply::Dirents(v) => v,
        other => panic!("not entries: {other:?}"),
    }
}

/// A whole listing from `offset` in readdirps of `size`: the entries and
/// every reply key, each reply checked to carry DIRENT_XATTRS when xattrs
/// were asked for.
async fn list_from(x: &dyn Xlator, id: u64, size: u32, mut offset: u64, xdata: &Dict) -> (Vec<DirEntry>, Dict) {
    let (mut all, mut keys_seen) = (Vec::new(), Dict::new());
    loop {
        let r = readdirp(x, id, size, offset, xdata).await.expect("readdirp");
        let v = entries(&r);
        if v.is_empty() {
            return (all, keys_seen);
        }
        if !xdata.is_empty() {
            assert_eq!(r.xdata.get_u64(keys::DIRENT_XATTRS), Some(2), "a reply with entries carries DIRENT_XATTRS");
        }
        for (k, v) in r.xdata.iter() {
            keys_seen.set(k.clone(), v.clone());
        }
        offset = v.last().map(|e| e.d_off).unwrap_or(offset);
        all.extend(v.iter().cloned());
    }
}

async fn list(x: &dyn Xlator, id: u64, size: u32, xdata: &Dict) -> (Vec<DirEntry>, Dict) {
    list_from(x, id, size, 0, xdata).await
}

fn names(v: &[DirEntry]) -> Vec<&str> {
    v.iter().map(|e| e.name.as_str()).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn prefetched_entries_and_their_xattrs_equal_the_childs_listing() {
    let child = DirChild::with(1500);
    let rda = rda_over(child.clone(), &[]);
    opendir(&*rda, 1, true).await;
    let (got, got_keys) = list(&*rda, 1, 4096, &md_xdata()).await;
    let by_rda = child.readdirp_count();
    // Every readdirp readdir-ahead sent was a full-size one asking for the
    // xattrs md-cache named on opendir.
    for (_, size, x) in child.readdirps.lock().iter() {
        assert_eq!((*size, x), (128 << 10, &md_xdata()));
    }
    let (want, want_keys) = list(&*child, 9, 4096, &md_xdata()).await;
    assert_eq!(got.len(), 1500);
    assert_eq!(got, want, "entries, offsets and attributes");
    assert_eq!(got_keys, want_keys, "per-entry xattr keys pass through");
    assert!(got_keys.contains(&keys::dirent_xattr("e0002", SELINUX)));
    let caller_calls = 1500 * (ENTRY_OVERHEAD + 6) / 4096;
    assert!(by_rda <= 6 && caller_calls > 50, "{by_rda} readdirps below for some {caller_calls} above");
    assert!(dump(&*rda, "hits") >= caller_calls as u64, "{:?}", rda.dump());
    assert_eq!(dump(&*rda, "misses"), 0);
}

#[test]
fn without_a_runtime_the_readdirp_fills_itself() {
    let child = DirChild::with(700);
    let rda = rda_over(child.clone(), &[]);
    now(opendir(&*rda, 1, false));
    let (got, _) = now(list(&*rda, 1, 4096, &Dict::new()));
    let below = child.readdirp_count();
    let (want, _) = now(list(&*child, 9, 4096, &Dict::new()));
    assert_eq!(got, want);
    assert!(below <= 3, "{below} readdirps below");
    assert!(dump(&*rda, "hits") > 30);
}

#[tokio::test(flavor = "current_thread")]
async fn a_create_or_unlink_in_the_directory_is_in_the_next_listing() {
    let child = DirChild::with(300);
    let rda = rda_over(child.clone(), &[]);
    opendir(&*rda, 1, false).await;
    let first = readdirp(&*rda, 1, 4096, 0, &Dict::new()).await.expect("readdirp");
    let off = entries(&first).last().expect("entries").d_off;
    assert!(dump(&*rda, "bytes-cached") > 0, "the rest is buffered");
    // e0200 is buffered, not yet served; remove it and create another.
    let call = |fop: Fop| rda.call(c(), Request::new(fop));
    call(Fop::Unlink { loc: Loc::entry(DIR, "e0200"), flags: 0 }).await.expect("unlink");
    call(Fop::Create { loc: Loc::entry(DIR, "new"), flags: 0, mode: 0o644, umask: 0, fd: FdId(50) })
        .await
        .expect("create");
    let (rest, _) = list_from(&*rda, 1, 4096, off, &Dict::new()).await;
    let all: Vec<&str> = names(entries(&first)).into_iter().chain(names(&rest)).collect();
    assert!(!all.contains(&"e0200"), "no stale entry");
    assert!(all.contains(&"new"), "the new entry is listed");
    assert_eq!(all.len(), 300);
    // rewinddir: a whole listing again, equal to the child's.
    let (again, _) = list(&*rda, 1, 4096, &Dict::new()).await;
    assert_eq!(again, list(&*child, 9, 4096, &Dict::new()).await.0);
    // Changed by another client: the invalidation upcall drops the buffer.
    let before = readdirp(&*rda, 1, 4096, 0, &Dict::new()).await.expect("readdirp");
    let off = entries(&before).last().expect("entries").d_off;
    child.remove("e0250");
    child.add("other");
    rda.notify(Event::Upcall(Upcall::Invalidate { gfid: DIR }), EventFrom::Child(0));
    let (rest, _) = list_from(&*rda, 1, 4096, off, &Dict::new()).await;
    assert!(!names(&rest).contains(&"e0250") && names(&rest).contains(&"other"), "{:?}", names(&rest));
}

#[tokio::test(flavor = "current_thread")]
async fn an_entry_whose_inode_changed_is_read_again() {
    let child = DirChild::with(300);
    let rda = rda_over(child.clone(), &[]);
    opendir(&*rda, 1, true).await;
    let first = readdirp(&*rda, 1, 4096, 0, &md_xdata()).await.expect("readdirp");
    let off = entries(&first).last().expect("entries").d_off;
    let (g, h) = (child.gfid("e0200"), child.gfid("e0201"));
    let write =
        Fop::Writev { fd: Fd { id: FdId(60), gfid: g }, data: Bytes::from_static(&[1; 4096]), offset: 0, flags: 0 };
    rda.call(c(), Request::new(write)).await.expect("write");
    let x = Dict::new().with(TAG, Value::Bytes(Bytes::from_static(b"changed")));
    rda.call(c(), Request::new(Fop::Setxattr { loc: Loc::gfid(h), xattrs: x, flags: 0 })).await.expect("setxattr");
    let (rest, keys_seen) = list_from(&*rda, 1, 4096, off, &md_xdata()).await;
    let e = rest.iter().find(|e| e.name == "e0200").expect("listed");
    assert_eq!(e.iatt.size, 4096, "attributes after the write");
    assert_eq!(keys_seen.get_bytes(&keys::dirent_xattr("e0201", TAG)).as_deref(), Some(&b"changed"[..]));
    assert!(dump(&*rda, "stale-refetches") >= 1);
}

/// Lets spawned tasks run until they wait.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_fill_in_flight_across_a_change_is_not_served() {
    let child = DirChild::with(50);
    let gate = Arc::new(Semaphore::new(0));
    *child.gate.lock() = Some(gate.clone());
    let rda = rda_over(child.clone(), &[]);
    opendir(&*rda, 1, false).await;
    settle().await;
    assert_eq!(child.readdirp_count(), 1, "the fill took its snapshot and waits");
    // Both complete while the fill's reply (with the old state) is held.
    let g = child.gfid("e0007");
    let write =
        Fop::Writev { fd: Fd { id: FdId(60), gfid: g }, data: Bytes::from_static(&[1; 100]), offset: 0, flags: 0 };
    rda.call(c(), Request::new(write)).await.expect("write");
    let gone = "e0009";
    rda.call(c(), Request::new(Fop::Unlink { loc: Loc::entry(DIR, gone), flags: 0 })).await.expect("unlink");
    gate.add_permits(1000);
    let (got, _) = list(&*rda, 1, 4096, &Dict::new()).await;
    assert!(!names(&got).contains(&gone));
    assert_eq!(got.iter().find(|e| e.name == "e0007").map(|e| e.iatt.size), Some(100));
    assert_eq!(got, list(&*child, 9, 4096, &Dict::new()).await.0);
    assert!(dump(&*rda, "fills-discarded") >= 1, "{:?}", rda.dump());
}

#[tokio::test(flavor = "current_thread")]
async fn the_cache_limit_holds_across_directories() {
    let child = DirChild::with(2000);
    let limit = 100 * 1024;
    let opts = [("rda-request-size", "16KB"), ("rda-high-wmark", "64KB"), ("rda-cache-limit", "100KB")];
    let rda = rda_over(child.clone(), &opts);
    for id in 1..=6 {
        opendir(&*rda, id, true).await;
    }
    settle().await;
    let cached = dump(&*rda, "bytes-cached");
    assert!(cached > 0 && cached <= limit, "{cached}");
    // Six listings read round robin: all complete and exact, the bound held
    // at every step.
    let want = list(&*child, 99, 4096, &md_xdata()).await.0;
    let mut got: Vec<Vec<DirEntry>> = vec![Vec::new(); 6];
    let mut off = [0u64; 6];
    let mut done = [false; 6];
    while done.iter().any(|d| !d) {
        for i in 0..6 {
            if done[i] {
                continue;
            }
            let r = readdirp(&*rda, i as u64 + 1, 4096, off[i], &md_xdata()).await.expect("readdirp");
            let v = entries(&r);
            match v.last() {
                None => done[i] = true,
                Some(l) => off[i] = l.d_off,
            }
            got[i].extend(v.iter().cloned());
            let cached = dump(&*rda, "bytes-cached");
            assert!(cached <= limit, "{cached} over {limit}");
        }
    }
    for g in got {
        assert_eq!(g, want);
    }
    for id in 1..=6 {
        rda.call(c(), Request::new(Fop::Releasedir { fd: fd(id) })).await.expect("releasedir");
    }
    assert_eq!((dump(&*rda, "bytes-cached"), dump(&*rda, "fds")), (0, 0));
}

#[tokio::test(flavor = "current_thread")]
async fn an_error_of_the_fill_reaches_the_readdirp_that_needed_it() {
    let child = DirChild::with(300);
    // The first fill (16KB, about 70 entries) succeeds; the next fails.
    *child.fail_from.lock() = Some((60, Errno::EIO));
    let rda = rda_over(child.clone(), &[("rda-request-size", "16KB"), ("rda-high-wmark", "16KB")]);
    opendir(&*rda, 1, false).await;
    settle().await;
    assert_eq!(dump(&*rda, "fill-errors"), 1, "the second fill failed");
    // The brick recovers; the error the fill got is still the answer of
    // the readdirp that needed those entries.
    *child.fail_from.lock() = None;
    let (mut off, mut got) = (0, Vec::new());
    let err = loop {
        match readdirp(&*rda, 1, 4096, off, &Dict::new()).await {
            Ok(r) => {
                let v = entries(&r);
                assert!(!v.is_empty(), "no end of directory before the error");
                off = v.last().map(|e| e.d_off).unwrap_or(off);
                got.extend(v.iter().cloned());
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err, Errno::EIO);
    let buffered = child.readdirps.lock()[0].1;
    assert_eq!(buffered, 16 << 10);
    let want = child.list(0, 16 << 10, &Dict::new(), true);
    assert_eq!(got, entries(&want), "every entry fetched before the error was served, in order");
    // Then the fd passes through: the child answers, in sequence.
    let (rest, _) = list_from(&*rda, 1, 4096, off, &Dict::new()).await;
    assert_eq!(got.len() + rest.len(), 300);
    assert!(dump(&*rda, "bypassed") >= 1);
}

#[tokio::test(flavor = "current_thread")]
async fn seekdir_and_readdir_go_to_the_child() {
    let child = DirChild::with(400);
    let rda = rda_over(child.clone(), &[]);
    opendir(&*rda, 1, false).await;
    let a = readdirp(&*rda, 1, 4096, 0, &Dict::new()).await.expect("readdirp");
    let b = readdirp(&*rda, 1, 4096, entries(&a).last().expect("a").d_off, &Dict::new()).await.expect("readdirp");
    let n = child.readdirp_count();
    // Back to the middle of the first batch.
    let mid = entries(&a)[5].d_off;
    let s = readdirp(&*rda, 1, 2048, mid, &Dict::new()).await.expect("seek");
    assert_eq!(child.readdirps.lock().last().map(|(o, sz, _)| (*o, *sz)), Some((mid, 2048)), "wound as asked");
    assert_eq!(s, child.list(mid, 2048, &Dict::new(), true));
    // Later ones go down too, until a rewind.
    let next = entries(&s).last().expect("s").d_off;
    readdirp(&*rda, 1, 4096, next, &Dict::new()).await.expect("readdirp");
    assert_eq!(child.readdirp_count(), n + 2);
    assert!(dump(&*rda, "bytes-cached") == 0, "the buffer is dropped");
    let (again, _) = list(&*rda, 1, 4096, &Dict::new()).await;
    assert_eq!(again, list(&*child, 9, 4096, &Dict::new()).await.0);
    assert!(entries(&b).len() > 1);
    // Plain readdir is not read ahead.
    let r = rda.call(c(), Request::new(Fop::Readdir { fd: fd(1), size: 4096, offset: 0 })).await.expect("readdir");
    assert_eq!(child.calls.lock().last(), Some(&FopKind::Readdir));
    assert_eq!(r, child.list(0, 4096, &Dict::new(), false));
}

#[tokio::test(flavor = "current_thread")]
async fn releasedir_frees_and_pass_through_reads_nothing_ahead() {
    let child = DirChild::with(100);
    let rda = rda_over(child.clone(), &[]);
    opendir(&*rda, 1, false).await;
    settle().await;
    assert!(dump(&*rda, "bytes-cached") > 0);
    rda.call(c(), Request::new(Fop::Releasedir { fd: fd(1) })).await.expect("releasedir");
    assert_eq!((dump(&*rda, "bytes-cached"), dump(&*rda, "fds")), (0, 0));
    assert_eq!(child.calls.lock().last(), Some(&FopKind::Releasedir));

    // Turned on live: an fd tracked before is still freed by its releasedir.
    opendir(&*rda, 2, false).await;
    settle().await;
    let o = Options::resolve(OPTIONS, [("pass-through", "on")]).expect("options");
    rda.reconfigure(&o).expect("reconfigure");
    assert_eq!(dump(&*rda, "bytes-cached"), 0);
    rda.call(c(), Request::new(Fop::Releasedir { fd: fd(2) })).await.expect("releasedir");
    assert_eq!(dump(&*rda, "fds"), 0);

    let child = DirChild::with(100);
    let rda = rda_over(child.clone(), &[("readdir-ahead-pass-through", "on")]);
    opendir(&*rda, 1, true).await;
    settle().await;
    assert_eq!(child.readdirp_count(), 0);
    let r = readdirp(&*rda, 1, 4096, 0, &Dict::new()).await.expect("readdirp");
    assert_eq!(r, child.list(0, 4096, &Dict::new(), true));
    assert_eq!(child.readdirp_count(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn other_xattrs_than_the_fill_asked_for_restart_it() {
    let child = DirChild::with(200);
    let rda = rda_over(child.clone(), &[]);
    opendir(&*rda, 1, false).await;
    let (got, keys_seen) = list(&*rda, 1, 4096, &md_xdata()).await;
    assert_eq!(got.len(), 200);
    assert!(keys_seen.contains(&keys::dirent_xattr("e0001", TAG)), "the xattrs asked for are there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md_cache_over_readdir_ahead_over_posix_gets_every_entry_and_xattr() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().display().to_string();
    let posix = (crate::storage::posix::TYPE.build)(
        init_named("posix", crate::storage::posix::TYPE.options, &[("directory", dir.as_str())], &[]).0,
    )
    .expect("posix");
    let ctx = CallCtx::root("t");
    let mut gfids = Vec::new();
    for i in 0..400u64 {
        let name = format!("file-with-a-longer-name-{i:04}");
        let fop = Fop::Mknod { loc: Loc::entry(Gfid::ROOT, &name), mode: 0o100644, rdev: 0, umask: 0 };
        let Ok(Response { reply: Reply::Entry { iatt, .. }, .. }) = posix.call(ctx.clone(), Request::new(fop)).await
        else {
            panic!("mknod {name}")
        };
        if i % 2 == 0 {
            let x = Dict::new().with(TAG, Value::Bytes(Bytes::from(format!("v{i}"))));
            posix
                .call(ctx.clone(), Request::new(Fop::Setxattr { loc: Loc::gfid(iatt.gfid), xattrs: x, flags: 0 }))
                .await
                .expect("tag");
        }
        gfids.push((i, iatt.gfid));
    }
    // Counts the fops that reach posix.
    let count = Gate::passing(posix.clone());
    let rda: Arc<dyn Xlator> = rda_over(count.clone(), &[]);
    let md_opts = [("md-cache-timeout", "600"), ("xattr-cache-list", TAG), ("dir-prefetch", "off")];
    let md_ctx = init_named(
        "md",
        crate::performance::md_cache::TYPE.options,
        &md_opts,
        &[Child { name: Arc::from("rda"), xl: rda }],
    );
    let md = (crate::performance::md_cache::TYPE.build)(md_ctx.0).expect("md-cache");
    let root = Fd { id: FdId(1), gfid: Gfid::ROOT };
    md.call(ctx.clone(), Request::new(Fop::Opendir { loc: Loc::gfid(Gfid::ROOT), fd: root.id }))
        .await
        .expect("opendir");
    let (mut off, mut got) = (0, Vec::new());
    loop {
        let r = md
            .call(ctx.clone(), Request::new(Fop::Readdirp { fd: root, size: 4096, offset: off }))
            .await
            .expect("readdirp");
        let v = entries(&r).to_vec();
        let Some(l) = v.last() else { break };
        off = l.d_off;
        got.extend(v);
    }
    md.call(ctx.clone(), Request::new(Fop::Releasedir { fd: root })).await.expect("releasedir");
    // The same listing straight from posix.
    let pfd = Fd { id: FdId(2), gfid: Gfid::ROOT };
    posix
        .call(ctx.clone(), Request::new(Fop::Opendir { loc: Loc::gfid(Gfid::ROOT), fd: pfd.id }))
        .await
        .expect("opendir");
    let (mut off, mut want) = (0, Vec::new());
    loop {
        let r = posix
            .call(ctx.clone(), Request::new(Fop::Readdirp { fd: pfd, size: 4096, offset: off }))
            .await
            .expect("readdirp");
        let v = entries(&r).to_vec();
        let Some(l) = v.last() else { break };
        off = l.d_off;
        want.extend(v);
    }
    assert_eq!(got, want);
    let readdirps = count.arrived().iter().filter(|k| **k == FopKind::Readdirp).count();
    assert!(readdirps <= 3, "posix saw {readdirps} readdirps for {} listed through 4 KiB ones", got.len());
    // md-cache got each entry's user.tag (or its absence) from the listing.
    let mark = count.arrived().len();
    for (i, g) in gfids {
        let r = md.call(ctx.clone(), Request::new(Fop::Getxattr { loc: Loc::gfid(g), name: TAG.into() })).await;
        match r {
            Ok(Response { reply: Reply::Xattrs(d), .. }) => {
                assert_eq!(d.get_bytes(TAG), Some(Bytes::from(format!("v{i}"))))
            }
            Err(Errno::ENODATA) => assert!(i % 2 == 1, "file {i} has the tag"),
            other => panic!("{other:?}"),
        }
    }
    let later = &count.arrived()[mark..];
    assert!(!later.contains(&FopKind::Getxattr), "answered by md-cache: {later:?}");
}
