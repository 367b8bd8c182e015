//! cluster/distribute over three real bricks (storage/posix under
//! features/locks in temporary directories), so layouts and link files are
//! real xattrs. Each child passes through a test hold (stops fops of a
//! chosen kind until released, and can fake a statfs answer) and a
//! `Faulty` (fails chosen fops). Several distribute nodes over the same
//! bricks act as several clients.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::testing::{Faulty, init_named, remove_xattr, set_xattr, until, xattr};
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, Fd, FdId, Fop, FopFuture, FopKind, FopResult, Gfid, Iatt, Loc,
    Reply, Request, Response, Statvfs, Xlator,
};

use super::layout::{COMMITTED, Layout, Range, UNSETTLED};
use super::*;

const N: usize = 3;

/// Which fops of the chosen kind a [`Hold`] stops.
#[derive(Clone, Copy, PartialEq)]
enum Stop {
    All,
    Next,
    None,
}

/// Holds fops of one kind until released (all of them, or only the next
/// one), counting those that came and those answered; can answer statfs
/// itself.
struct Hold {
    inner: Arc<dyn Xlator>,
    kind: Mutex<Option<(FopKind, Stop)>>,
    gate: tokio::sync::Semaphore,
    arrived: AtomicUsize,
    answered: AtomicUsize,
    statfs: Mutex<Option<Statvfs>>,
}

impl Hold {
    fn new(inner: Arc<dyn Xlator>) -> Arc<Hold> {
        Arc::new(Hold {
            inner,
            kind: Mutex::new(None),
            gate: tokio::sync::Semaphore::new(0),
            arrived: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
            statfs: Mutex::new(None),
        })
    }
    fn set(&self, kind: Option<(FopKind, Stop)>) {
        *self.kind.lock() = kind;
        self.arrived.store(0, Ordering::SeqCst);
        self.answered.store(0, Ordering::SeqCst);
    }
    /// Holds every fop of `kind` (None: none).
    fn hold(&self, kind: Option<FopKind>) {
        self.set(kind.map(|k| (k, Stop::All)));
    }
    /// Holds the next fop of `kind` only.
    fn hold_next(&self, kind: FopKind) {
        self.set(Some((kind, Stop::Next)));
    }
    /// Counts the fops of `kind`, holding none.
    fn count(&self, kind: FopKind) {
        self.set(Some((kind, Stop::None)));
    }
    fn release(&self) {
        self.gate.add_permits(1);
    }
}

impl Xlator for Hold {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        if let (Fop::Statfs { .. }, Some(st)) = (&req.fop, *self.statfs.lock()) {
            return Box::pin(std::future::ready(Ok(Response::from(Reply::Statfs(st)))));
        }
        let stop = {
            let mut k = self.kind.lock();
            match *k {
                Some((kind, stop)) if kind == req.fop.kind() => {
                    if stop == Stop::Next {
                        *k = Some((kind, Stop::None));
                    }
                    Some(stop)
                }
                _ => None,
            }
        };
        Box::pin(async move {
            if stop.is_some() {
                self.arrived.fetch_add(1, Ordering::SeqCst);
            }
            if stop.is_some_and(|s| s != Stop::None)
                && let Ok(p) = self.gate.acquire().await
            {
                p.forget();
            }
            let r = self.inner.call(ctx, req).await;
            if stop.is_some() {
                self.answered.fetch_add(1, Ordering::SeqCst);
            }
            r
        })
    }
}

struct Cluster {
    _tmp: tempfile::TempDir,
    dirs: Vec<PathBuf>,
    holds: Vec<Arc<Hold>>,
    faults: Vec<Arc<Faulty>>,
}

struct Node {
    dht: Arc<Distribute>,
    ctx: CallCtx,
}

static NEXT_FD: AtomicU64 = AtomicU64::new(1);

fn name_of(i: usize) -> String {
    format!("vol-client-{i}")
}

impl Cluster {
    fn new() -> Cluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut dirs = Vec::new();
        let mut bricks = Vec::new();
        for i in 0..N {
            let dir = tmp.path().join(format!("b{i}"));
            std::fs::create_dir(&dir).expect("brick dir");
            let d = dir.display().to_string();
            let (pctx, _) =
                init_named(&format!("posix-{i}"), crate::storage::posix::TYPE.options, &[("directory", &d)], &[]);
            let posix = (crate::storage::posix::TYPE.build)(pctx).expect("posix");
            let (lctx, _) = init_named(
                &format!("locks-{i}"),
                crate::features::locks::TYPE.options,
                &[],
                &[Child { name: Arc::from(format!("posix-{i}")), xl: posix }],
            );
            bricks.push((crate::features::locks::TYPE.build)(lctx).expect("locks"));
            dirs.push(dir);
        }
        let holds: Vec<Arc<Hold>> = bricks.iter().map(|b| Hold::new(b.clone())).collect();
        let faults = holds
            .iter()
            .enumerate()
            .map(|(i, h)| Faulty::new(Child { name: Arc::from(format!("hold-{i}")), xl: h.clone() }))
            .collect();
        Cluster { _tmp: tmp, dirs, holds, faults }
    }

    /// A distribute node (a client) through the holds and faults.
    fn node(&self, opts: &[(&str, &str)]) -> Node {
        let children: Vec<Child> =
            self.faults.iter().enumerate().map(|(i, f)| Child { name: Arc::from(name_of(i)), xl: f.clone() }).collect();
        let (ictx, _) = init_named("test-dht", TYPE.options, opts, &children);
        let dht = Arc::new(Distribute::new(ictx).expect("distribute"));
        for i in 0..N {
            dht.notify(Event::ChildUp, EventFrom::Child(i));
        }
        Node { dht, ctx: CallCtx::root("test") }
    }

    fn path(&self, i: usize, rel: &str) -> PathBuf {
        self.dirs[i].join(rel)
    }

    fn exists(&self, i: usize, rel: &str) -> bool {
        self.path(i, rel).symlink_metadata().is_ok()
    }

    /// The layout of directory `rel` as stored on the bricks.
    fn layout(&self, rel: &str) -> Layout {
        Layout {
            ranges: (0..N).map(|i| xattr(&self.path(i, rel), LAYOUT_XATTR).and_then(|v| Range::decode(&v))).collect(),
        }
    }

    /// Where `rel` has data (not a link file) and where a link file.
    fn places(&self, rel: &str) -> (Vec<usize>, Vec<usize>) {
        let (mut data, mut links) = (Vec::new(), Vec::new());
        for i in 0..N {
            if !self.exists(i, rel) {
                continue;
            }
            if xattr(&self.path(i, rel), LINKTO_XATTR).is_some() {
                links.push(i);
            } else {
                data.push(i);
            }
        }
        (data, links)
    }

    /// A name (with `prefix`) in directory `rel` hashing to subvolume `i`.
    fn name_on(&self, rel: &str, i: usize, prefix: &str) -> String {
        let l = self.layout(rel);
        (0..).map(|k| format!("{prefix}{k}")).find(|n| l.hashed(n) == Some(i)).expect("some name hashes there")
    }
}

impl Node {
    async fn call(&self, fop: Fop) -> FopResult {
        self.dht.call(self.ctx.clone(), Request::new(fop)).await
    }
    async fn lookup(&self, parent: Gfid, name: &str) -> Result<Iatt, Errno> {
        Ok(self.call(Fop::Lookup { loc: Loc::entry(parent, name) }).await?.reply.into_entry()?)
    }
    async fn root(&self) -> Iatt {
        self.call(Fop::Lookup { loc: Loc::root() }).await.expect("root lookup").reply.into_entry().expect("entry")
    }
    async fn create(&self, parent: Gfid, name: &str) -> Result<Fd, Errno> {
        let id = FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed));
        let fop =
            Fop::Create { loc: Loc::entry(parent, name), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id };
        let iatt = self.call(fop).await?.reply.into_entry()?;
        Ok(Fd { id, gfid: iatt.gfid })
    }
    async fn mkdir(&self, parent: Gfid, name: &str) -> Result<Iatt, Errno> {
        Ok(self.call(Fop::Mkdir { loc: Loc::entry(parent, name), mode: 0o755, umask: 0 }).await?.reply.into_entry()?)
    }
    async fn rename(&self, from: &str, to: &str) -> FopResult {
        self.call(Fop::Rename { old: Loc::entry(Gfid::ROOT, from), new: Loc::entry(Gfid::ROOT, to), flags: 0 }).await
    }
    /// Opens file `gfid` by gfid with `flags`.
    async fn open(&self, gfid: Gfid, flags: i32) -> Fd {
        let fd = Fd { id: FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed)), gfid };
        self.call(Fop::Open { loc: Loc::gfid(gfid), flags: flags as u32, fd: fd.id }).await.expect("open");
        fd
    }
    async fn release(&self, fd: Fd) {
        self.call(Fop::Release { fd }).await.expect("release");
    }
    /// Every name of directory `gfid`, page by page (`size` bytes each).
    async fn list(&self, gfid: Gfid, size: u32, plus: bool) -> Vec<String> {
        let id = FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed));
        self.call(Fop::Opendir { loc: Loc::gfid(gfid), fd: id }).await.expect("opendir");
        let fd = Fd { id, gfid };
        let (mut names, mut off, mut pages) = (Vec::new(), 0u64, 0);
        loop {
            let fop =
                if plus { Fop::Readdirp { fd, size, offset: off } } else { Fop::Readdir { fd, size, offset: off } };
            let rsp = self.call(fop).await.expect("readdir");
            assert!(rsp.xdata.keys().all(|k| !k.contains(LAYOUT_XATTR)), "private keys hidden");
            let batch = rsp.reply.into_dirents().expect("dirents");
            let Some(last) = batch.last() else { break };
            off = last.d_off;
            names.extend(batch.into_iter().map(|e| e.name));
            pages += 1;
            assert!(pages < 100_000, "listing does not end");
        }
        self.call(Fop::Releasedir { fd }).await.expect("releasedir");
        names
    }
}

#[test]
fn names_spread_evenly() {
    let l = Layout::fresh(Gfid::random(), N, COMMITTED);
    let mut count = [0usize; N];
    for k in 0..10_000 {
        count[l.hashed(&format!("file-{k}.dat")).expect("whole layout")] += 1;
    }
    for c in count {
        assert!((3_233..=3_433).contains(&c), "within 3 % of even: {count:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_land_on_their_hashed_subvolume() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let l = c.layout(".");
    assert!(l.anomalies(&[true; N]).none(), "the root got a whole layout: {l:?}");
    let mut seen = [0usize; N];
    for k in 0..60 {
        let name = format!("f{k}");
        let fd = node.create(Gfid::ROOT, &name).await.expect("create");
        node.release(fd).await;
        let h = l.hashed(&name).expect("hashed");
        assert_eq!(c.places(&name), (vec![h], vec![]), "{name}");
        seen[h] += 1;
    }
    assert!(seen.iter().all(|s| *s > 0), "{seen:?}");
    // The real spread over the root's layout: 10,000 names.
    let mut count = [0usize; N];
    for k in 0..10_000 {
        count[l.hashed(&format!("name-{k}")).expect("whole")] += 1;
    }
    assert!(count.iter().all(|c| (3_233..=3_433).contains(c)), "within 3 % of even: {count:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mkdir_makes_the_directory_everywhere_with_a_layout() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let d = node.mkdir(Gfid::ROOT, "d").await.expect("mkdir");
    let gfids: Vec<_> = (0..N).map(|i| xattr(&c.path(i, "d"), "trusted.gfid")).collect();
    assert!(gfids.iter().all(|g| g.as_deref() == Some(&d.gfid.0[..])), "same gfid everywhere");
    let l = c.layout("d");
    assert!(l.anomalies(&[true; N]).none() && l.settled(&[true; N]), "{l:?}");
    assert_eq!(l, Layout::fresh(d.gfid, N, COMMITTED));
    // A file in it, found by another client.
    let fd = node.create(d.gfid, "inner").await.expect("create in d");
    node.release(fd).await;
    let other = c.node(&[]);
    other.root().await;
    other.lookup(Gfid::ROOT, "d").await.expect("d");
    assert_eq!(other.lookup(d.gfid, "inner").await.expect("inner").gfid, fd.gfid);
    assert_eq!(node.mkdir(Gfid::ROOT, "d").await.err(), Some(Errno::EEXIST));
    node.call(Fop::Unlink { loc: Loc::entry(d.gfid, "inner"), flags: 0 }).await.expect("unlink");
    node.call(Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, "d"), flags: 0 }).await.expect("rmdir");
    assert!((0..N).all(|i| !c.exists(i, "d")), "rmdir removes every copy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_made_by_link_renames_to_where_its_link_file_is() {
    // git's pack: data on 0 under `tmp`, linked as `mid` (hashed to 1:
    // a link file there), `tmp` unlinked, then `mid` renamed to `fin`,
    // also hashed to 1, where `mid`'s link file already has the gfid.
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let (tmp, mid, fin) = (c.name_on(".", 0, "tmp"), c.name_on(".", 1, "mid"), c.name_on(".", 1, "fin"));
    let fd = node.create(Gfid::ROOT, &tmp).await.expect("create");
    node.call(Fop::Writev { fd, data: Bytes::from_static(b"pack"), offset: 0, flags: 0 }).await.expect("write");
    node.release(fd).await;
    node.call(Fop::Link { old: Loc::gfid(fd.gfid), new: Loc::entry(Gfid::ROOT, mid.clone()) }).await.expect("link");
    node.call(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, tmp.clone()), flags: 0 }).await.expect("unlink");
    node.rename(&mid, &fin).await.expect("rename onto the subvolume of the source's link file");
    // And a second hard link whose name hashes there too.
    let again = c.name_on(".", 1, "again");
    node.call(Fop::Link { old: Loc::gfid(fd.gfid), new: Loc::entry(Gfid::ROOT, again.clone()) }).await.expect("link 2");
    let other = c.node(&[]);
    other.root().await;
    for name in [&fin, &again] {
        assert_eq!(other.lookup(Gfid::ROOT, name).await.expect("lookup").gfid, fd.gfid, "{name}");
    }
    assert_eq!(other.lookup(Gfid::ROOT, &mid).await.err(), Some(Errno::ENOENT));
    assert_eq!(std::fs::read(c.path(0, &fin)).expect("data"), b"pack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_link_by_gfid_then_unlink_keeps_the_data() {
    // What git does with each object (and what FUSE sends: the old inode
    // by gfid alone): write a temporary file, link it to its final name,
    // unlink the temporary one.
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    for (tmp, obj) in
        [(c.name_on(".", 0, "tmp"), c.name_on(".", 1, "obj")), (c.name_on(".", 1, "t2"), c.name_on(".", 1, "o2"))]
    {
        let fd = node.create(Gfid::ROOT, &tmp).await.expect("create");
        node.call(Fop::Writev { fd, data: Bytes::from_static(b"object"), offset: 0, flags: 0 }).await.expect("write");
        node.release(fd).await;
        let link = Fop::Link { old: Loc::gfid(fd.gfid), new: Loc::entry(Gfid::ROOT, obj.clone()) };
        node.call(link).await.unwrap_or_else(|e| panic!("link {tmp} -> {obj}: {e}"));
        node.call(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, tmp.clone()), flags: 0 }).await.expect("unlink");
        let other = c.node(&[]);
        other.root().await;
        assert_eq!(other.lookup(Gfid::ROOT, &obj).await.expect("lookup").gfid, fd.gfid, "{obj}");
        assert_eq!(other.lookup(Gfid::ROOT, &tmp).await.err(), Some(Errno::ENOENT), "{tmp}");
        let (data, _) = c.places(&obj);
        assert_eq!(std::fs::read(c.path(data[0], &obj)).expect("data"), b"object");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renaming_over_a_name_again_and_again_keeps_it_found() {
    // What git and editors do: write `x.lock`, rename it over `x`, again
    // and again, with `x` hashing to another subvolume than `x.lock`.
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let lock = c.name_on(".", 0, "lock");
    let target = c.name_on(".", 1, "index");
    for round in 0..4u8 {
        let fd = node.create(Gfid::ROOT, &lock).await.expect("create");
        let data = Bytes::from(vec![b'a' + round; 3]);
        node.call(Fop::Writev { fd, data, offset: 0, flags: 0 }).await.expect("write");
        node.release(fd).await;
        node.rename(&lock, &target).await.unwrap_or_else(|e| panic!("round {round}: rename: {e}"));
        let other = c.node(&[]);
        other.root().await;
        let found = other.lookup(Gfid::ROOT, &target).await.unwrap_or_else(|e| panic!("round {round}: lookup: {e}"));
        assert_eq!(found.gfid, fd.gfid, "round {round}: the name leads to the file renamed last");
        assert_eq!(c.places(&target), (vec![0], vec![1]), "round {round}: data on 0, one link file on 1");
        assert_eq!(std::fs::read(c.path(0, &target)).expect("data"), vec![b'a' + round; 3]);
        assert_eq!(node.lookup(Gfid::ROOT, &lock).await.err(), Some(Errno::ENOENT));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_shows_the_latest_times_of_its_copies() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let d = node.mkdir(Gfid::ROOT, "d").await.expect("mkdir");
    // One copy changed last (a name made on its subvolume).
    let late = std::time::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    std::fs::File::open(c.path(1, "d"))
        .and_then(|f| f.set_times(std::fs::FileTimes::new().set_modified(late)))
        .expect("set a copy's mtime");
    let other = c.node(&[]);
    other.root().await;
    assert_eq!(other.lookup(Gfid::ROOT, "d").await.expect("lookup").mtime.sec, 2_000_000_000, "lookup by name");
    let Reply::Attr(st) = other.call(Fop::Stat { loc: Loc::gfid(d.gfid) }).await.expect("stat").reply else {
        panic!("stat reply")
    };
    assert_eq!(st.mtime.sec, 2_000_000_000, "stat");
    let id = FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed));
    other.call(Fop::Opendir { loc: Loc::gfid(Gfid::ROOT), fd: id }).await.expect("opendir");
    let fd = Fd { id, gfid: Gfid::ROOT };
    let Reply::Dirents(ents) =
        other.call(Fop::Readdirp { fd, size: 64 << 10, offset: 0 }).await.expect("readdirp").reply
    else {
        panic!("readdirp reply")
    };
    let e = ents.iter().find(|e| e.name == "d").expect("d listed");
    assert_eq!(e.iatt.mtime.sec, 2_000_000_000, "a listing's entry");
    other.call(Fop::Releasedir { fd }).await.expect("releasedir");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_follows_a_link_file_and_rename_keeps_one_name() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let a = c.name_on(".", 0, "a");
    let b = c.name_on(".", 1, "b");
    let fd = node.create(Gfid::ROOT, &a).await.expect("create");
    node.call(Fop::Writev { fd, data: Bytes::from_static(b"hello"), offset: 0, flags: 0 }).await.expect("write");
    node.release(fd).await;
    let watcher = c.node(&[]);
    watcher.root().await;
    // Count the names the file is visible under, from a client with no
    // memory of it and from the renaming one.
    let visible = |n: &'static Node, a: String, b: String| async move {
        let mut names = 0;
        for x in [&a, &b] {
            match n.lookup(Gfid::ROOT, x).await {
                Ok(i) if i.gfid == fd.gfid => names += 1,
                Ok(i) => panic!("{x} is another inode {i:?}"),
                Err(Errno::ENOENT) => {}
                Err(e) => panic!("lookup {x}: {e}"),
            }
        }
        names
    };
    let node: &'static Node = Box::leak(Box::new(node));
    let watcher: &'static Node = Box::leak(Box::new(watcher));
    // Step 1 (the link file on b's subvolume) and step 2 (the rename on
    // a's) are held in turn; the file shows under exactly one name at each.
    c.holds[1].hold(Some(FopKind::Mknod));
    c.holds[0].hold(Some(FopKind::Rename));
    let (a2, b2) = (a.clone(), b.clone());
    let task = tokio::spawn(async move { node.rename(&a2, &b2).await });
    until("link file made", Duration::from_secs(10), || c.holds[1].arrived.load(Ordering::SeqCst) == 1).await;
    assert_eq!(visible(watcher, a.clone(), b.clone()).await, 1, "before the link");
    c.holds[1].release();
    until("rename sent", Duration::from_secs(10), || c.holds[0].arrived.load(Ordering::SeqCst) == 1).await;
    assert_eq!(c.places(&b), (vec![], vec![1]), "the link file is there before the rename");
    assert_eq!(visible(watcher, a.clone(), b.clone()).await, 1, "link made, not renamed");
    assert_eq!(visible(node, a.clone(), b.clone()).await, 1, "link made, not renamed (renaming client)");
    assert!(watcher.lookup(Gfid::ROOT, &a).await.is_ok());
    c.holds[0].release();
    task.await.expect("task").expect("rename");
    c.holds[0].hold(None);
    c.holds[1].hold(None);
    assert_eq!(visible(watcher, a.clone(), b.clone()).await, 1, "after");
    assert_eq!(watcher.lookup(Gfid::ROOT, &a).await.err(), Some(Errno::ENOENT));
    assert_eq!(c.places(&b), (vec![0], vec![1]), "data stays on subvolume 0, link on 1");
    let link = c.path(1, &b).symlink_metadata().expect("link file");
    use std::os::unix::fs::MetadataExt;
    assert_eq!((link.mode() & 0o7777, link.len()), (LINK_MODE, 0));
    assert_eq!(xattr(&c.path(1, &b), LINKTO_XATTR).as_deref(), Some(name_of(0).as_bytes()));
    // A fresh client follows the link, and reads the data through it.
    let fresh = c.node(&[]);
    fresh.root().await;
    let got = fresh.lookup(Gfid::ROOT, &b).await.expect("b through its link");
    assert_eq!(got.gfid, fd.gfid);
    assert!(fresh.dht.dump().contains(&("links-followed".to_string(), "1".to_string())));
    let r = fresh.open(fd.gfid, libc::O_RDONLY).await;
    let rd = fresh.call(Fop::Readv { fd: r, size: 16, offset: 0, flags: 0 }).await;
    assert_eq!(rd.expect("read").reply.into_read().expect("data"), Bytes::from_static(b"hello"));
    fresh.release(r).await;

    // Renamed again to a third subvolume: the old link file (step 3) goes
    // last; while it is held the file is already only under the new name.
    let z = c.name_on(".", 2, "z");
    c.holds[1].hold(Some(FopKind::Unlink));
    let (b2, z2) = (b.clone(), z.clone());
    let task = tokio::spawn(async move { node.rename(&b2, &z2).await });
    until("cleanup sent", Duration::from_secs(10), || c.holds[1].arrived.load(Ordering::SeqCst) == 1).await;
    assert_eq!(visible(watcher, b.clone(), z.clone()).await, 1, "renamed, old link not yet removed");
    assert_eq!(watcher.lookup(Gfid::ROOT, &z).await.expect("z").gfid, fd.gfid);
    c.holds[1].release();
    task.await.expect("task").expect("rename");
    c.holds[1].hold(None);
    assert_eq!(c.places(&b), (vec![], vec![]), "the old link file is gone");
    assert_eq!(c.places(&z), (vec![0], vec![2]));

    // unlink removes the data and the link file.
    node.call(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, &z), flags: 0 }).await.expect("unlink");
    assert_eq!(c.places(&z), (vec![], vec![]));
    assert_eq!(fresh.lookup(Gfid::ROOT, &z).await.err(), Some(Errno::ENOENT));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_over_an_existing_file_elsewhere() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let a = c.name_on(".", 0, "a");
    let b = c.name_on(".", 1, "b");
    let fa = node.create(Gfid::ROOT, &a).await.expect("a");
    let fb = node.create(Gfid::ROOT, &b).await.expect("b");
    node.release(fa).await;
    node.release(fb).await;
    node.rename(&a, &b).await.expect("rename over b");
    assert_eq!(c.places(&b), (vec![0], vec![1]), "old b's data replaced by a link to a's data");
    assert_eq!(c.places(&a), (vec![], vec![]));
    let other = c.node(&[]);
    other.root().await;
    assert_eq!(other.lookup(Gfid::ROOT, &b).await.expect("b").gfid, fa.gfid);
}

/// A rename over a file whose data is on the subvolume its name hashes
/// to, the source's data being on another: the name shows the old file
/// until the switch and the renamed one after it, and a failure at any
/// step before the switch leaves both files as they were. (It used to
/// remove the old file first: the name was missing meanwhile, and a
/// rename that then failed lost the old file.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_over_data_on_its_hashed_subvolume_is_all_or_nothing() {
    let c: &'static Cluster = Box::leak(Box::new(Cluster::new()));
    let node: &'static Node = Box::leak(Box::new(c.node(&[])));
    node.root().await;
    let watcher: &'static Node = Box::leak(Box::new(c.node(&[])));
    watcher.root().await;
    let pair = |k: usize| async move {
        let (a, b) = (c.name_on(".", 0, &format!("a{k}-")), c.name_on(".", 1, &format!("b{k}-")));
        let fa = node.create(Gfid::ROOT, &a).await.expect("a");
        let fb = node.create(Gfid::ROOT, &b).await.expect("b");
        node.release(fa).await;
        node.release(fb).await;
        (a, b, fa.gfid, fb.gfid)
    };
    let gfid_of = |name: String| async move { watcher.lookup(Gfid::ROOT, &name).await.map(|i| i.gfid) };
    // Failing before the switch (the hard link on a's subvolume, the link
    // file or the rename on b's): nothing changed. Failing where the old
    // order switched (a rename on a's subvolume) is no longer in the way.
    let faults = [(0, FopKind::Rename), (0, FopKind::Link), (1, FopKind::Mknod), (1, FopKind::Rename)];
    for (k, (sub, kind)) in faults.into_iter().enumerate() {
        let (a, b, ga, gb) = pair(k).await;
        c.faults[sub].fail(Some((vec![kind], Errno::EIO)));
        let r = node.rename(&a, &b).await;
        c.faults[sub].fail(None);
        if sub == 0 && kind == FopKind::Rename {
            r.expect("a rename on a's subvolume is not needed");
            assert_eq!(gfid_of(b.clone()).await, Ok(ga), "{kind:?} on {sub}: b is the renamed file");
            assert_eq!(gfid_of(a.clone()).await, Err(Errno::ENOENT), "{kind:?} on {sub}: a is gone");
            assert_eq!(c.places(&b), (vec![0], vec![1]));
            assert_eq!(c.places(&a), (vec![], vec![]));
        } else {
            assert_eq!(r.err(), Some(Errno::EIO), "{kind:?} on {sub}: the failure is reported");
            assert_eq!(gfid_of(b.clone()).await, Ok(gb), "{kind:?} on {sub}: b is still the old file");
            assert_eq!(gfid_of(a.clone()).await, Ok(ga), "{kind:?} on {sub}: a is still there");
            assert_eq!(c.places(&b), (vec![1], vec![]), "{kind:?} on {sub}: nothing left behind for b");
            assert_eq!(c.places(&a), (vec![0], vec![]), "{kind:?} on {sub}: nothing left behind for a");
        }
    }
    // Held at the switch: b is still the old file; released: the new one.
    let (a, b, ga, gb) = pair(faults.len()).await;
    c.holds[1].hold(Some(FopKind::Rename));
    let (a2, b2) = (a.clone(), b.clone());
    let task = tokio::spawn(async move { node.rename(&a2, &b2).await });
    until("switch sent", Duration::from_secs(10), || c.holds[1].arrived.load(Ordering::SeqCst) == 1).await;
    assert_eq!(gfid_of(b.clone()).await, Ok(gb), "before the switch");
    c.holds[1].release();
    task.await.expect("task").expect("rename");
    c.holds[1].hold(None);
    assert_eq!(gfid_of(b.clone()).await, Ok(ga), "after the switch");
    assert_eq!(gfid_of(a.clone()).await, Err(Errno::ENOENT));
    let nlink = c.path(0, &b).symlink_metadata().map(|m| std::os::unix::fs::MetadataExt::nlink(&m));
    assert_eq!(nlink.expect("data on 0"), 2, "one name and the brick's gfid handle");
}

/// A link file left behind (its client died after unlinking the data)
/// does not keep its directory from being removed; a directory that still
/// holds a file besides such links is not emptied of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmdir_removes_stale_link_files_but_never_a_file() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    for keep_a_file in [false, true] {
        let dname = format!("d{keep_a_file}");
        let d = node.mkdir(Gfid::ROOT, &dname).await.expect("mkdir");
        let a = c.name_on(&dname, 0, "a");
        let b = c.name_on(&dname, 1, "b");
        let fd = node.create(d.gfid, &a).await.expect("create");
        node.release(fd).await;
        let mv = Fop::Rename { old: Loc::entry(d.gfid, &a), new: Loc::entry(d.gfid, &b), flags: 0 };
        node.call(mv).await.expect("rename");
        assert_eq!(c.places(&format!("{dname}/{b}")), (vec![0], vec![1]));
        // The data goes; removing the link file fails (as if the client died).
        c.faults[1].fail(Some((vec![FopKind::Unlink], Errno::EIO)));
        assert!(node.call(Fop::Unlink { loc: Loc::entry(d.gfid, &b), flags: 0 }).await.is_err());
        c.faults[1].fail(None);
        assert_eq!(c.places(&format!("{dname}/{b}")), (vec![], vec![1]), "a stale link file is left");
        if keep_a_file {
            let fd = node.create(d.gfid, &a).await.expect("create");
            node.release(fd).await;
        }
        let r = node.call(Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, &dname), flags: 0 }).await;
        if keep_a_file {
            assert_eq!(r.err(), Some(Errno::ENOTEMPTY));
            assert_eq!(c.places(&format!("{dname}/{b}")), (vec![], vec![1]), "the link stays while a file is there");
        } else {
            r.expect("rmdir of a directory holding only a stale link file");
            for i in 0..N {
                assert!(!c.exists(i, &dname), "{dname} gone from subvolume {i}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_without_o_excl_opens_the_data_not_the_link_file() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let a = c.name_on(".", 0, "a");
    let b = c.name_on(".", 1, "b");
    let fd = node.create(Gfid::ROOT, &a).await.expect("create");
    node.release(fd).await;
    node.rename(&a, &b).await.expect("rename");
    assert_eq!(c.places(&b), (vec![0], vec![1]));
    let id = FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed));
    let fop =
        Fop::Create { loc: Loc::entry(Gfid::ROOT, &b), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id };
    let got = node.call(fop).await.expect("create of an existing name opens it").reply.into_entry().expect("entry");
    assert_eq!(got.gfid, fd.gfid);
    let f = Fd { id, gfid: fd.gfid };
    node.call(Fop::Writev { fd: f, data: Bytes::from_static(b"x"), offset: 0, flags: 0 }).await.expect("write");
    node.release(f).await;
    assert_eq!(std::fs::read(c.path(0, &b)).expect("data"), b"x");
    assert_eq!(std::fs::metadata(c.path(1, &b)).expect("link").len(), 0, "the link file stays empty");
    let excl = Fop::Create {
        loc: Loc::entry(Gfid::ROOT, &b),
        flags: (libc::O_RDWR | libc::O_EXCL) as u32,
        mode: 0o644,
        umask: 0,
        fd: FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed)),
    };
    assert_eq!(node.call(excl).await.err(), Some(Errno::EEXIST));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdir_merges_pages_without_duplicates_or_misses() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let mut want = BTreeSet::new();
    for k in 0..400 {
        let name = format!("entry-{k:04}");
        let fd = node.create(Gfid::ROOT, &name).await.expect("create");
        node.release(fd).await;
        want.insert(name);
    }
    for k in 0..5 {
        let name = format!("dir-{k}");
        node.mkdir(Gfid::ROOT, &name).await.expect("mkdir");
        want.insert(name);
    }
    // A link file (from a rename across subvolumes) is listed once.
    let a = c.name_on(".", 0, "moved-");
    let b = c.name_on(".", 2, "target-");
    let fd = node.create(Gfid::ROOT, &a).await.expect("create");
    node.release(fd).await;
    node.rename(&a, &b).await.expect("rename");
    want.insert(b.clone());
    assert_eq!(c.places(&b).1, vec![2]);
    want.insert(".".into());
    want.insert("..".into());
    for (size, plus) in [(2048, false), (4096, true), (64 << 10, true)] {
        let names = node.list(Gfid::ROOT, size, plus).await;
        let set: BTreeSet<String> = names.iter().cloned().collect();
        assert_eq!(names.len(), set.len(), "no duplicates (size {size})");
        assert_eq!(set, want, "every entry once (size {size})");
    }
    // Every subvolume contributed.
    let per: HashMap<usize, usize> =
        (0..N).map(|i| (i, std::fs::read_dir(&c.dirs[i]).expect("brick").count())).collect();
    assert!(per.values().all(|n| *n > 50), "{per:?}");
}

/// The `.glusterfs` handle of a gfid on a brick.
fn handle(dir: &Path, gfid: Gfid) -> PathBuf {
    let s = gfid.to_string();
    dir.join(".glusterfs").join(&s[0..2]).join(&s[2..4]).join(&s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_heals_a_missing_directory_and_a_layout_hole() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let d = node.mkdir(Gfid::ROOT, "d").await.expect("mkdir");
    let e = node.mkdir(Gfid::ROOT, "e").await.expect("mkdir");
    // Not on the subvolume "d" hashes to: there a missing directory is a
    // missing name (lookup-optimize), as in GlusterFS.
    let gone = (0..N).find(|i| c.layout(".").hashed("d") != Some(*i)).expect("another subvolume");
    std::fs::remove_dir(c.path(gone, "d")).expect("remove d on one brick");
    std::fs::remove_file(handle(&c.dirs[gone], d.gfid)).expect("and its handle");
    remove_xattr(&c.path(1, "e"), LAYOUT_XATTR).expect("a hole in e's layout");
    let other = c.node(&[]);
    other.root().await;
    assert_eq!(other.lookup(Gfid::ROOT, "d").await.expect("d").gfid, d.gfid);
    assert!(c.exists(gone, "d"), "d made again on brick {gone}");
    assert_eq!(xattr(&c.path(gone, "d"), "trusted.gfid").as_deref(), Some(&d.gfid.0[..]));
    assert!(c.layout("d").anomalies(&[true; N]).none(), "{:?}", c.layout("d"));
    other.lookup(Gfid::ROOT, "e").await.expect("e");
    assert_eq!(c.layout("e"), Layout::fresh(e.gfid, N, COMMITTED), "the same ranges written back: settled");
    // An overlap: repaired, and marked unsettled (ranges moved).
    let mut r0 = c.layout("e").ranges[0].expect("range");
    r0.start = 0;
    r0.stop = u32::MAX / 2;
    set_xattr(&c.path(0, "e"), LAYOUT_XATTR, &r0.encode()).expect("overlap");
    let third = c.node(&[]);
    third.root().await;
    third.lookup(Gfid::ROOT, "e").await.expect("e");
    let l = c.layout("e");
    assert!(l.anomalies(&[true; N]).none(), "{l:?}");
    assert!(l.ranges.iter().flatten().all(|r| r.commit == UNSETTLED), "{l:?}");
    let healed = third.dht.dump();
    assert!(healed.contains(&("layouts-healed".to_string(), "1".to_string())), "{healed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misplaced_files_are_found_only_when_the_layout_says_so() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let a = c.name_on(".", 0, "m");
    let fd = node.create(Gfid::ROOT, &a).await.expect("create");
    node.release(fd).await;
    // Move the data behind the volume's back to subvolume 1 (file and
    // its gfid handle).
    std::fs::rename(c.path(0, &a), c.path(1, &a)).expect("move");
    let h0 = handle(&c.dirs[0], fd.gfid);
    let h1 = handle(&c.dirs[1], fd.gfid);
    std::fs::create_dir_all(h1.parent().expect("parent")).expect("handle dir");
    std::fs::remove_file(&h0).expect("old handle");
    std::fs::hard_link(c.path(1, &a), &h1).expect("new handle");
    let settled = c.node(&[]);
    settled.root().await;
    assert_eq!(settled.lookup(Gfid::ROOT, &a).await.err(), Some(Errno::ENOENT), "settled layout: not looked for");
    let everywhere = c.node(&[("lookup-optimize", "off")]);
    everywhere.root().await;
    assert_eq!(everywhere.lookup(Gfid::ROOT, &a).await.expect("found elsewhere").gfid, fd.gfid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_free_disk_sends_new_files_elsewhere_with_a_link() {
    let c = Cluster::new();
    let node = c.node(&[("min-free-disk", "10%")]);
    node.root().await;
    let full = Statvfs {
        bsize: 4096,
        frsize: 4096,
        blocks: 1000,
        bfree: 10,
        bavail: 10,
        files: 100,
        ffree: 50,
        favail: 50,
        namemax: 255,
        ..Default::default()
    };
    let roomy = Statvfs { bfree: 900, bavail: 900, ..full };
    let roomier = Statvfs { bfree: 950, bavail: 950, ..full };
    *c.holds[0].statfs.lock() = Some(full);
    *c.holds[1].statfs.lock() = Some(roomy);
    *c.holds[2].statfs.lock() = Some(roomier);
    let a = c.name_on(".", 0, "big");
    let fd = node.create(Gfid::ROOT, &a).await.expect("create");
    assert_eq!(c.places(&a), (vec![2], vec![0]), "data on the roomiest, link on the hashed");
    node.call(Fop::Writev { fd, data: Bytes::from_static(b"data"), offset: 0, flags: 0 }).await.expect("write");
    node.release(fd).await;
    let other = c.node(&[]);
    other.root().await;
    assert_eq!(other.lookup(Gfid::ROOT, &a).await.expect("through the link").gfid, fd.gfid);
    assert!(std::fs::read(c.path(2, &a)).expect("data") == b"data");
    // A name hashing to a subvolume with room stays there.
    let b = c.name_on(".", 1, "small");
    let fb = node.create(Gfid::ROOT, &b).await.expect("create");
    node.release(fb).await;
    assert_eq!(c.places(&b), (vec![1], vec![]));
    // statfs sums the subvolumes.
    let st = node.call(Fop::Statfs { loc: Loc::root() }).await.expect("statfs").reply.into_statfs().expect("statfs");
    assert_eq!((st.blocks, st.bfree, st.bavail, st.files, st.ffree), (3000, 1860, 1860, 300, 150));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subvolume_error_is_reported() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let a = c.name_on(".", 1, "e");
    c.faults[1].fail(Some((vec![FopKind::Create], Errno::EIO)));
    assert_eq!(node.create(Gfid::ROOT, &a).await.err(), Some(Errno::EIO));
    c.faults[1].fail(None);
    c.faults[2].fail(Some((vec![FopKind::Mkdir], Errno::ENOSPC)));
    assert_eq!(node.mkdir(Gfid::ROOT, "d").await.err(), Some(Errno::ENOSPC));
    assert!((0..N).all(|i| !c.exists(i, "d")), "a failed mkdir leaves no copy");
    c.faults[2].fail(None);
    c.faults[0].fail(Some((vec![FopKind::Lookup], Errno::EIO)));
    let fresh = c.node(&[]);
    assert_eq!(fresh.call(Fop::Lookup { loc: Loc::root() }).await.err(), Some(Errno::EIO));
    c.faults[0].fail(None);
    c.faults[2].fail(Some((vec![FopKind::Statfs], Errno::ENOTCONN)));
    assert_eq!(node.call(Fop::Statfs { loc: Loc::root() }).await.err(), Some(Errno::ENOTCONN));
    c.faults[2].fail(None);
    c.faults[1].fail(Some((vec![FopKind::Readdirp], Errno::EIO)));
    let id = FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed));
    node.call(Fop::Opendir { loc: Loc::root(), fd: id }).await.expect("opendir");
    let mut off = 0;
    let err = loop {
        match node.call(Fop::Readdirp { fd: Fd { id, gfid: Gfid::ROOT }, size: 4096, offset: off }).await {
            Ok(r) => off = r.reply.into_dirents().expect("dirents").last().expect("not at end before the error").d_off,
            Err(e) => break e,
        }
    };
    assert_eq!(err, Errno::EIO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_xattrs_are_hidden() {
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    let d = node.mkdir(Gfid::ROOT, "d").await.expect("mkdir");
    let get = |name: &str| Fop::Getxattr { loc: Loc::gfid(d.gfid), name: name.into() };
    assert_eq!(node.call(get(LAYOUT_XATTR)).await.err(), Some(Errno::ENODATA));
    let all = node.call(get("")).await.expect("list").reply.into_xattrs().expect("xattrs");
    assert!(all.keys().all(|k| !k.starts_with("trusted.glusterfs.dht")), "{all:?}");
    let mut x = Dict::new();
    x.set_bytes(LAYOUT_XATTR, vec![0u8; 16]);
    assert_eq!(
        node.call(Fop::Setxattr { loc: Loc::gfid(d.gfid), xattrs: x, flags: 0 }).await.err(),
        Some(Errno::EPERM)
    );
    let mut rq = Dict::new();
    rq.set_u64(LAYOUT_XATTR, 0);
    let r = node.dht.call(node.ctx.clone(), Request::with_xdata(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "d") }, rq));
    assert!(!r.await.expect("lookup").xdata.contains(LAYOUT_XATTR));
    // A user xattr on a directory goes to every copy.
    let mut u = Dict::new();
    u.set_bytes("user.k", b"v".to_vec());
    node.call(Fop::Setxattr { loc: Loc::gfid(d.gfid), xattrs: u, flags: 0 }).await.expect("setxattr");
    assert!((0..N).all(|i| xattr(&c.path(i, "d"), "user.k").as_deref() == Some(&b"v"[..])));
}

#[test]
fn bad_min_free_disk_is_refused() {
    let mock = xlfs_sdk::testing::MockChild::new();
    let (ictx, _) = init_named("t", TYPE.options, &[("min-free-disk", "lots")], &[mock.child()]);
    let e = Distribute::new(ictx).err().expect("refused");
    assert!(e.to_string().contains("min-free-disk"), "{e}");
}

/// Distribute over two replica-3 sets (cluster/replicate over posix under
/// locks), as a distributed-replicate volume's client graph stacks them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_replica_sets() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut sets = Vec::new();
    for s in 0..2 {
        let mut kids = Vec::new();
        for b in 0..3 {
            let dir = tmp.path().join(format!("s{s}b{b}"));
            std::fs::create_dir(&dir).expect("dir");
            let d = dir.display().to_string();
            let (pctx, _) = init_named("posix", crate::storage::posix::TYPE.options, &[("directory", &d)], &[]);
            let posix = (crate::storage::posix::TYPE.build)(pctx).expect("posix");
            let (lctx, _) = init_named(
                "locks",
                crate::features::locks::TYPE.options,
                &[],
                &[Child { name: Arc::from("posix"), xl: posix }],
            );
            let locks = (crate::features::locks::TYPE.build)(lctx).expect("locks");
            kids.push(Child { name: Arc::from(format!("c-{s}-{b}")), xl: locks });
        }
        let (actx, _) = init_named(&format!("afr-{s}"), crate::cluster::replicate::TYPE.options, &[], &kids);
        let afr = Arc::new(crate::cluster::replicate::Replicate::new(actx).expect("afr"));
        for i in 0..3 {
            afr.notify(Event::ChildUp, EventFrom::Child(i));
        }
        sets.push(Child { name: Arc::from(format!("afr-{s}")), xl: afr });
    }
    let (ictx, _) = init_named("dht", TYPE.options, &[], &sets);
    let dht = Arc::new(Distribute::new(ictx).expect("dht"));
    let node = Node { dht, ctx: CallCtx::root("t") };
    node.root().await;
    let d = node.mkdir(Gfid::ROOT, "d").await.expect("mkdir").gfid;
    node.mkdir(d, "sub").await.expect("mkdir sub");
    for k in 0..40 {
        let fd = node.create(d, &format!("f{k}")).await.expect("create");
        node.call(Fop::Writev { fd, data: Bytes::from_static(b"x"), offset: 0, flags: 0 }).await.expect("write");
        node.call(Fop::Flush { fd }).await.expect("flush");
        node.release(fd).await;
    }
    for k in 0..40 {
        let (old, new) = (Loc::entry(d, format!("f{k}")), Loc::entry(d, format!("r{k}")));
        node.call(Fop::Rename { old, new, flags: 0 }).await.unwrap_or_else(|e| panic!("rename f{k}: {e}"));
        node.lookup(d, &format!("r{k}")).await.expect("renamed");
        assert_eq!(node.lookup(d, &format!("f{k}")).await.err(), Some(Errno::ENOENT));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layouts_are_written_without_a_locks_translator() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut kids = Vec::new();
    for i in 0..2 {
        let dir = tmp.path().join(format!("b{i}"));
        std::fs::create_dir(&dir).expect("dir");
        let d = dir.display().to_string();
        let (pctx, _) = init_named("posix", crate::storage::posix::TYPE.options, &[("directory", &d)], &[]);
        kids.push(Child {
            name: Arc::from(format!("p{i}")),
            xl: (crate::storage::posix::TYPE.build)(pctx).expect("posix"),
        });
    }
    let (ictx, _) = init_named("dht", TYPE.options, &[], &kids);
    let node = Node { dht: Arc::new(Distribute::new(ictx).expect("dht")), ctx: CallCtx::root("t") };
    node.root().await;
    let l = Layout {
        ranges: (0..2)
            .map(|i| xattr(&tmp.path().join(format!("b{i}")), LAYOUT_XATTR).and_then(|v| Range::decode(&v)))
            .collect(),
    };
    assert!(l.anomalies(&[true; 2]).none(), "{l:?}");
}

/// Asks `node` to move `name` (in the root) where it hashes.
async fn migrate(node: &Node, name: &str, gfid: Gfid) -> FopResult {
    let xattrs = Dict::new().with(MIGRATE_KEY, xlfs_sdk::Value::U64(1));
    node.call(Fop::Setxattr { loc: Loc::entry(Gfid::ROOT, name).with_gfid(gfid), xattrs, flags: 0 }).await
}

/// Reads (`data` None) or overwrites file `gfid` from its start through a
/// fresh client that finds it by `name`: what it holds after.
async fn through_fresh(c: &Cluster, name: &str, gfid: Gfid, data: Option<&'static [u8]>) -> Bytes {
    let n = c.node(&[]);
    n.root().await;
    assert_eq!(n.lookup(Gfid::ROOT, name).await.expect("lookup").gfid, gfid);
    let fd = n.open(gfid, libc::O_RDWR).await;
    if let Some(d) = data {
        n.call(Fop::Writev { fd, data: Bytes::from_static(d), offset: 0, flags: 0 }).await.expect("write");
    }
    let rd = n.call(Fop::Readv { fd, size: 64, offset: 0, flags: 0 }).await.expect("read");
    n.release(fd).await;
    rd.reply.into_read().expect("data")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_cut_short_is_finished_by_the_next_and_loses_no_write() {
    use std::os::unix::fs::MetadataExt;
    let c = Cluster::new();
    let node = c.node(&[]);
    node.root().await;
    // Two files whose data is on subvolume 0 under names that hash to 1
    // (renamed there: a link file on 1 leads to the data).
    let mut files = Vec::new();
    for p in ["a", "c"] {
        let from = c.name_on(".", 0, p);
        let to = c.name_on(".", 1, &format!("{p}-moved-"));
        let fd = node.create(Gfid::ROOT, &from).await.expect("create");
        node.call(Fop::Writev { fd, data: Bytes::from_static(b"hello"), offset: 0, flags: 0 }).await.expect("write");
        node.release(fd).await;
        node.rename(&from, &to).await.expect("rename");
        assert_eq!(c.places(&to), (vec![0], vec![1]));
        files.push((to, fd.gfid));
    }

    // Cut short before the source is marked: the source stays the data.
    let (b, g) = &files[0];
    c.faults[0].fail(Some((vec![FopKind::Setxattr], Errno::ENOTCONN)));
    assert_eq!(migrate(&node, b, *g).await.err(), Some(Errno::ENOTCONN));
    c.faults[0].fail(None);
    let dst = c.path(1, b).symlink_metadata().expect("destination");
    assert_eq!(dst.mode() & 0o7777, 0o644, "the destination was switched to a data file");
    assert!(xattr(&c.path(1, b), LINKTO_XATTR).is_some(), "still naming the source");
    // A write now (the lock is let go) lands where lookups find the data.
    assert_eq!(&through_fresh(&c, b, *g, Some(b"HELLO")).await[..], b"HELLO");
    assert_eq!(std::fs::read(c.path(0, b)).expect("source"), b"HELLO");
    let done = migrate(&node, b, *g).await.expect("the next run");
    assert!(done.xdata.contains(MIGRATED_KEY), "{:?}", done.xdata);
    assert_eq!(c.places(b), (vec![1], vec![]), "moved, source gone");
    assert_eq!(&through_fresh(&c, b, *g, None).await[..], b"HELLO", "the write after the cut is kept");

    // Cut short after the source is marked: the data is on 1 already.
    let (d, g) = &files[1];
    c.faults[1].fail(Some((vec![FopKind::Removexattr], Errno::ENOTCONN)));
    assert_eq!(migrate(&node, d, *g).await.err(), Some(Errno::ENOTCONN));
    c.faults[1].fail(None);
    assert!(!c.exists(0, d), "the marked source's name is removed");
    assert!(xattr(&c.path(1, d), LINKTO_XATTR).is_some());
    assert_eq!(&through_fresh(&c, d, *g, Some(b"WORLD")).await[..], b"WORLD");
    let again = migrate(&node, d, *g).await.expect("the next run");
    assert_eq!(again.xdata.get_str(SKIPPED_KEY), Some("in place"));
    assert_eq!(c.places(d), (vec![1], vec![]), "the switch was ended: no linkto xattr left");
    assert_eq!(&through_fresh(&c, d, *g, None).await[..], b"WORLD");
}

/// A remove-brick seen by one client (the rebalance's) before the others:
/// a client that has not taken `decommissioned-bricks` keeps looking
/// names up where its settled layout hashes them, and one that took it
/// may still remember the layout from before the directory was moved off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_behind_a_remove_brick_find_moved_files_and_create_off_the_leaving_subvolume() {
    let c = Cluster::new();
    let leaving = name_of(N - 1);
    let old = c.node(&[]);
    old.root().await;
    let name = c.name_on(".", N - 1, "f");
    let fd = old.create(Gfid::ROOT, &name).await.expect("create");
    old.call(Fop::Writev { fd, data: Bytes::from_static(b"hello"), offset: 0, flags: 0 }).await.expect("write");
    old.release(fd).await;
    let late = c.node(&[("decommissioned-bricks", &leaving)]);
    late.root().await;
    let fresh = c.name_on(".", N - 1, "g");

    let rb = c.node(&[("decommissioned-bricks", &leaving)]);
    rb.root().await;
    let fix = Dict::new().with(FIX_LAYOUT_KEY, xlfs_sdk::Value::U64(1));
    rb.call(Fop::Setxattr { loc: Loc::gfid(Gfid::ROOT), xattrs: fix, flags: 0 }).await.expect("fix-layout");
    let to = c.layout(".").hashed(&name).expect("hashed");
    assert_ne!(to, N - 1, "the leaving subvolume holds no range");
    let done = migrate(&rb, &name, fd.gfid).await.expect("migrate");
    assert!(done.xdata.contains(MIGRATED_KEY), "{:?}", done.xdata);
    assert_eq!(c.places(&name), (vec![to], vec![N - 1]), "the source's name stays, a link file");
    // Listed once, as the data (the kept source still holds its bytes).
    for plus in [false, true] {
        let names = old.list(Gfid::ROOT, 4096, plus).await;
        assert_eq!(names.iter().filter(|n| **n == name).count(), 1, "{names:?}");
    }

    // The client without the option still remembers the file on the
    // leaving subvolume: its truncating open there reaches the data, not
    // the link file the source became.
    let wr = old.open(fd.gfid, libc::O_WRONLY | libc::O_TRUNC).await;
    old.call(Fop::Writev { fd: wr, data: Bytes::from_static(b"HI"), offset: 0, flags: 0 }).await.expect("write");
    old.release(wr).await;
    assert_eq!(std::fs::read(c.path(to, &name)).expect("data"), b"HI", "truncated and written where the data is");
    // Its settled layout hashes the name to the leaving subvolume, whose
    // link file leads to the data.
    assert_eq!(old.lookup(Gfid::ROOT, &name).await.expect("found through the link").gfid, fd.gfid);
    let rd = old.open(fd.gfid, libc::O_RDONLY).await;
    let got = old.call(Fop::Readv { fd: rd, size: 64, offset: 0, flags: 0 }).await.expect("read");
    assert_eq!(&got.reply.into_read().expect("data")[..], b"HI");
    old.release(rd).await;

    // The client with the option but the old layout remembered: a new
    // name is made where the directory's new layout hashes it.
    let g = late.create(Gfid::ROOT, &fresh).await.expect("create");
    late.release(g).await;
    let want = c.layout(".").hashed(&fresh).expect("hashed");
    assert_eq!(c.places(&fresh), (vec![want], vec![]), "made off the leaving subvolume");
    // The brick that leaves holds link files only (what commit checks).
    assert!(!c.exists(N - 1, &fresh));
}

/// Files holding "hello", one per prefix, under names that hash to the
/// last subvolume; then that subvolume's remove-brick as the rebalance
/// sees it: the root's layout fixed over the others (unsettled). The
/// files' names and gfids, and the rebalance's client.
async fn files_then_remove_brick(c: &Cluster, prefixes: &[&str]) -> (Vec<(String, Gfid)>, Node) {
    files_then_removing(c, N - 1, prefixes).await
}

/// [`files_then_remove_brick`] of subvolume `from`.
async fn files_then_removing(c: &Cluster, from: usize, prefixes: &[&str]) -> (Vec<(String, Gfid)>, Node) {
    let maker = c.node(&[]);
    maker.root().await;
    let mut files = Vec::new();
    for p in prefixes {
        let name = c.name_on(".", from, p);
        let fd = maker.create(Gfid::ROOT, &name).await.expect("create");
        maker.call(Fop::Writev { fd, data: Bytes::from_static(b"hello"), offset: 0, flags: 0 }).await.expect("write");
        maker.release(fd).await;
        files.push((name, fd.gfid));
    }
    let rb = c.node(&[("decommissioned-bricks", &name_of(from))]);
    rb.root().await;
    let fix = Dict::new().with(FIX_LAYOUT_KEY, xlfs_sdk::Value::U64(1));
    rb.call(Fop::Setxattr { loc: Loc::gfid(Gfid::ROOT), xattrs: fix, flags: 0 }).await.expect("fix-layout");
    (files, rb)
}

/// A lookup everywhere (by gfid, or by name in an unsettled directory)
/// whose answers straddle a migration's switch: the destination answers
/// before it (no data there yet), the source after it (a link file now).
/// The file is found all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_whose_answers_straddle_a_migration_finds_the_file() {
    let c = Cluster::new();
    let (from, leaving) = (N - 1, name_of(N - 1));
    let (files, rb) = files_then_remove_brick(&c, &["f", "g"]).await;

    for (k, (name, gfid)) in files.iter().enumerate() {
        let by_name = k == 1;
        let to = c.layout(".").hashed(name).expect("hashed");
        // A client that reads the directory's unsettled layout.
        let client = Arc::new(c.node(&[("decommissioned-bricks", &leaving)]));
        client.root().await;
        c.holds[from].hold_next(FopKind::Lookup);
        c.holds[to].count(FopKind::Lookup);
        let asking = {
            let (client, name, gfid) = (client.clone(), name.clone(), *gfid);
            tokio::spawn(async move {
                let loc = if by_name { Loc::entry(Gfid::ROOT, name) } else { Loc::gfid(gfid) };
                client.call(Fop::Lookup { loc }).await
            })
        };
        // By name: the hashed subvolume first (nothing there), then the fan.
        let before = if by_name { 2 } else { 1 };
        until("the destination answered, the source not", Duration::from_secs(10), || {
            c.holds[from].arrived.load(Ordering::SeqCst) == 1 && c.holds[to].answered.load(Ordering::SeqCst) == before
        })
        .await;
        let done = migrate(&rb, name, *gfid).await.expect("migrate");
        assert!(done.xdata.contains(MIGRATED_KEY), "{:?}", done.xdata);
        c.holds[from].release();
        let found = asking.await.expect("lookup task").unwrap_or_else(|e| panic!("{name} (by name: {by_name}): {e}"));
        let iatt = found.reply.into_entry().expect("entry");
        assert_eq!((iatt.gfid, iatt.size), (*gfid, 5), "the data file, by name: {by_name}");
        assert!(client.dht.dump().contains(&("lookups-again".to_string(), "1".to_string())));
        c.holds[from].hold(None);
        c.holds[to].hold(None);
    }
}

/// In a directory a rebalance is spreading (unsettled layout), a name
/// whose data is not yet where it hashes: a create without O_EXCL opens
/// that file, with O_EXCL it fails, and neither makes a second file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_in_an_unsettled_directory_finds_the_name_elsewhere() {
    let c = Cluster::new();
    let (from, leaving) = (N - 1, name_of(N - 1));
    let (files, _rb) = files_then_remove_brick(&c, &["f"]).await;
    let (name, gfid) = files[0].clone();
    assert_ne!(c.layout(".").hashed(&name), Some(from));

    let client = c.node(&[("decommissioned-bricks", &leaving)]);
    client.root().await;
    let id = FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed));
    let create = |flags: i32, id| Fop::Create {
        loc: Loc::entry(Gfid::ROOT, &name),
        flags: flags as u32,
        mode: 0o644,
        umask: 0,
        fd: id,
    };
    let excl = client.call(create(libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, id)).await;
    assert_eq!(excl.err(), Some(Errno::EEXIST));
    let opened = client.call(create(libc::O_RDWR | libc::O_CREAT, id)).await.expect("create opens the file");
    assert_eq!(opened.reply.into_entry().expect("entry").gfid, gfid);
    let fd2 = Fd { id, gfid };
    let got = client.call(Fop::Readv { fd: fd2, size: 64, offset: 0, flags: 0 }).await.expect("read");
    assert_eq!(&got.reply.into_read().expect("data")[..], b"hello");
    client.release(fd2).await;
    assert_eq!(c.places(&name), (vec![from], vec![]), "one file, where it was");
}

/// A listing asked for whole says at its end whether it can be trusted to
/// hold every name: not while the directory's layout is unsettled (files
/// may move between the reads of two subvolumes), read from the bricks
/// even when the client remembers the layout settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_listing_is_not_vouched_for_while_files_move() {
    use xlfs_sdk::dict::keys::WHOLE_LISTING;
    let c = Cluster::new();
    let client = c.node(&[]);
    client.root().await;
    let fd = client.create(Gfid::ROOT, "f").await.expect("create");
    client.release(fd).await;
    // Every page, and what the end of the listing says.
    let whole = |n: &Node| {
        let n = Node { dht: n.dht.clone(), ctx: n.ctx.clone() };
        async move {
            let id = FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed));
            n.call(Fop::Opendir { loc: Loc::root(), fd: id }).await.expect("opendir");
            let fd = Fd { id, gfid: Gfid::ROOT };
            let mut off = 0;
            let end = loop {
                let mut req = Request::new(Fop::Readdirp { fd, size: 4096, offset: off });
                req.xdata.set_u64(WHOLE_LISTING, 1);
                let rsp = n.dht.call(n.ctx.clone(), req).await.expect("readdirp");
                let xdata = rsp.xdata.clone();
                match rsp.reply.into_dirents().expect("dirents").last() {
                    Some(e) => off = e.d_off,
                    None => break xdata,
                }
            };
            n.call(Fop::Releasedir { fd }).await.expect("releasedir");
            end.get_u64(WHOLE_LISTING)
        }
    };
    assert_eq!(whole(&client).await, None, "settled: trusted");
    let rb = c.node(&[("decommissioned-bricks", &name_of(N - 1))]);
    rb.root().await;
    let fix = Dict::new().with(FIX_LAYOUT_KEY, xlfs_sdk::Value::U64(1));
    rb.call(Fop::Setxattr { loc: Loc::gfid(Gfid::ROOT), xattrs: fix, flags: 0 }).await.expect("fix-layout");
    assert_eq!(whole(&client).await, Some(0), "unsettled on the bricks, though remembered settled");
    let settle = Dict::new().with(SETTLE_KEY, xlfs_sdk::Value::U64(1));
    rb.call(Fop::Setxattr { loc: Loc::gfid(Gfid::ROOT), xattrs: settle, flags: 0 }).await.expect("settle");
    assert_eq!(whole(&client).await, None, "settled again");
}

/// A listing of a directory being rebalanced, with a file moved between
/// the reads of two subvolumes: from one read later to one read earlier
/// (it would be in neither), and the other way (it would be in both). It
/// is listed once, with the data's attributes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_moved_during_a_listing_is_listed_once() {
    for from in [N - 1, 0] {
        let c = Cluster::new();
        let (files, rb) = files_then_removing(&c, from, &["f"]).await;
        let (name, gfid) = files[0].clone();
        let to = c.layout(".").hashed(&name).expect("hashed");
        let client = Arc::new(c.node(&[("decommissioned-bricks", &name_of(from))]));
        client.root().await;
        // The listing stops at the later of the two subvolumes.
        let later = from.max(to);
        c.holds[later].hold_next(FopKind::Readdirp);
        let listing = {
            let client = client.clone();
            tokio::spawn(async move {
                let id = FdId(NEXT_FD.fetch_add(1, Ordering::Relaxed));
                client.call(Fop::Opendir { loc: Loc::root(), fd: id }).await.expect("opendir");
                let fd = Fd { id, gfid: Gfid::ROOT };
                let (mut all, mut off) = (Vec::new(), 0);
                loop {
                    let rsp = client.call(Fop::Readdirp { fd, size: 4096, offset: off }).await.expect("readdirp");
                    let batch = rsp.reply.into_dirents().expect("dirents");
                    let Some(last) = batch.last() else { break };
                    off = last.d_off;
                    all.extend(batch.into_iter().map(|e| (e.name, e.iatt)));
                }
                client.call(Fop::Releasedir { fd }).await.expect("releasedir");
                all
            })
        };
        until("the listing reached the later subvolume", Duration::from_secs(10), || {
            c.holds[later].arrived.load(Ordering::SeqCst) == 1
        })
        .await;
        let done = migrate(&rb, &name, gfid).await.expect("migrate");
        assert!(done.xdata.contains(MIGRATED_KEY), "{:?}", done.xdata);
        c.holds[later].release();
        let all = listing.await.expect("listing task");
        let found: Vec<&Iatt> = all.iter().filter(|(n, _)| *n == name).map(|(_, a)| a).collect();
        assert_eq!(found.len(), 1, "moved from {from} to {to}: {all:?}");
        assert_eq!((found[0].gfid, found[0].size, found[0].mode & 0o7777), (gfid, 5, 0o644));
        c.holds[later].hold(None);
    }
}
