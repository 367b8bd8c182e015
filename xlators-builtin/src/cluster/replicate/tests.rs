//! cluster/replicate over three real bricks (storage/posix under
//! features/locks in temporary directories), each child reached through
//! debug/io-stats (to count fops) and a test gate that can take the child
//! down or make chosen fops fail. Two replicate nodes can share the same
//! bricks, as two clients of one volume.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, EventSink, Fd, FdId, Fop, FopFuture, FopKind, FopResult, Gfid,
    InitCtx, Loc, Options, Reply, Request, Xlator,
};

use super::pending::{self, Kind};
use super::*;
use crate::debug::io_stats::IoStats;
use xlfs_sdk::Iatt;

/// A test translator between AFR and a brick: "down" answers ENOTCONN to
/// everything; `fail` makes the listed fops fail with an errno.
struct Gate {
    child: Child,
    down: AtomicBool,
    fail: Mutex<Option<(Vec<FopKind>, Errno)>>,
}

impl Xlator for Gate {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        if self.down.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(Err(Errno::ENOTCONN)));
        }
        if let Some((kinds, e)) = &*self.fail.lock()
            && kinds.contains(&req.fop.kind())
        {
            return Box::pin(std::future::ready(Err(*e)));
        }
        self.child.call(ctx, req)
    }
}

struct Brick {
    dir: PathBuf,
    locks: Arc<dyn Xlator>,
    sink: EventSink,
}

struct Cluster {
    _tmp: tempfile::TempDir,
    bricks: Vec<Brick>,
}

struct Node {
    afr: Arc<Replicate>,
    stats: Vec<Arc<IoStats>>,
    gates: Vec<Arc<Gate>>,
    ctx: CallCtx,
    next_fd: AtomicU64,
}

const N: usize = 3;

fn opts(decls: &[xlfs_sdk::OptionDecl], given: &[(&str, &str)]) -> Options {
    Options::resolve(decls, given.iter().copied()).expect("valid options")
}

impl Cluster {
    fn new() -> Cluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let bricks = (0..N)
            .map(|i| {
                let dir = tmp.path().join(format!("b{i}"));
                std::fs::create_dir(&dir).expect("brick dir");
                let d = dir.display().to_string();
                let posix = (crate::storage::posix::TYPE.build)(InitCtx {
                    name: format!("posix-{i}"),
                    options: opts(crate::storage::posix::TYPE.options, &[("directory", &d)]),
                    children: vec![],
                    events: EventSink::new(),
                })
                .expect("posix");
                let sink = EventSink::new();
                let locks = (crate::features::locks::TYPE.build)(InitCtx {
                    name: format!("locks-{i}"),
                    options: opts(crate::features::locks::TYPE.options, &[("notify-contention-delay", "0")]),
                    children: vec![Child { name: Arc::from(format!("posix-{i}")), xl: posix }],
                    events: sink.clone(),
                })
                .expect("locks");
                // features/index above locks (in memory), as on a brick.
                let locks = (crate::features::index::TYPE.build)(InitCtx {
                    name: format!("index-{i}"),
                    options: opts(crate::features::index::TYPE.options, &[]),
                    children: vec![Child { name: Arc::from(format!("locks-{i}")), xl: locks }],
                    events: EventSink::new(),
                })
                .expect("index");
                Brick { dir, locks, sink }
            })
            .collect();
        Cluster { _tmp: tmp, bricks }
    }

    /// A replicate node (a client) over the bricks, all children up.
    fn node(&self, client: &str, afr_opts: &[(&str, &str)]) -> Node {
        let afr_sink = EventSink::new();
        let mut children = Vec::new();
        let mut stats = Vec::new();
        let mut gates = Vec::new();
        let mut links = Vec::new();
        for (i, b) in self.bricks.iter().enumerate() {
            let gate = Arc::new(Gate {
                child: Child { name: Arc::from(format!("locks-{i}")), xl: b.locks.clone() },
                down: AtomicBool::new(false),
                fail: Mutex::new(None),
            });
            let gate_sink = EventSink::new();
            let name = format!("test-client-{i}");
            let st_sink = EventSink::new();
            let st = Arc::new(
                IoStats::new(InitCtx {
                    name: name.clone(),
                    options: opts(crate::debug::io_stats::TYPE.options, &[]),
                    children: vec![Child { name: Arc::from(format!("gate-{i}")), xl: gate.clone() }],
                    events: st_sink.clone(),
                })
                .expect("io-stats"),
            );
            let gate_dyn: Arc<dyn Xlator> = gate.clone();
            b.sink.attach_parent(Arc::downgrade(&gate_dyn), 0, gate_sink.clone());
            let st_dyn: Arc<dyn Xlator> = st.clone();
            gate_sink.attach_parent(Arc::downgrade(&st_dyn), 0, st_sink.clone());
            links.push(st_sink);
            children.push(Child { name: Arc::from(name), xl: st_dyn });
            stats.push(st);
            gates.push(gate);
        }
        let afr = Arc::new(
            Replicate::new(InitCtx {
                name: "test-afr".into(),
                options: opts(TYPE.options, afr_opts),
                children,
                events: afr_sink.clone(),
            })
            .expect("replicate"),
        );
        let afr_dyn: Arc<dyn Xlator> = afr.clone();
        for (i, s) in links.iter().enumerate() {
            s.attach_parent(Arc::downgrade(&afr_dyn), i, afr_sink.clone());
        }
        for i in 0..N {
            afr.notify(Event::ChildUp, EventFrom::Child(i));
        }
        // Distinct fd numbers per node: the bricks key fds by id.
        let base = 1 + 1_000_000 * (client.bytes().map(u64::from).sum::<u64>() % 1000);
        Node { afr, stats, gates, ctx: CallCtx::root(client), next_fd: AtomicU64::new(base) }
    }

    fn read(&self, i: usize, name: &str) -> Vec<u8> {
        std::fs::read(self.bricks[i].dir.join(name)).unwrap_or_default()
    }

    /// The counters `trusted.afr.test-client-<j>` on brick `i` for `path`.
    fn pending(&self, i: usize, path: &str, j: usize) -> [i32; 3] {
        let p = self.bricks[i].dir.join(path);
        xattr(&p, &format!("trusted.afr.test-client-{j}")).and_then(|v| pending::decode(&v)).unwrap_or([0; 3])
    }

    fn gfid_on(&self, i: usize, path: &str) -> Option<Vec<u8>> {
        xattr(&self.bricks[i].dir.join(path), "trusted.gfid")
    }
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let n = std::ffi::CString::new(name).expect("name");
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

impl Node {
    async fn call(&self, fop: Fop) -> FopResult {
        self.afr.call(self.ctx.clone(), Request::new(fop)).await
    }

    fn fd_id(&self) -> FdId {
        FdId(self.next_fd.fetch_add(1, Ordering::Relaxed))
    }

    async fn create(&self, name: &str) -> Result<Fd, Errno> {
        let id = self.fd_id();
        let fop = Fop::Create {
            loc: Loc::entry(Gfid::ROOT, name),
            flags: libc::O_RDWR as u32,
            mode: 0o644,
            umask: 0,
            fd: id,
        };
        match self.call(fop).await?.reply {
            Reply::Entry { iatt, .. } => Ok(Fd { id, gfid: iatt.gfid }),
            r => panic!("create answered {r:?}"),
        }
    }

    async fn open(&self, gfid: Gfid) -> Fd {
        let id = self.fd_id();
        self.call(Fop::Open { loc: Loc::gfid(gfid), flags: libc::O_RDWR as u32, fd: id }).await.expect("open");
        Fd { id, gfid }
    }

    async fn write(&self, fd: Fd, offset: u64, data: &[u8]) -> FopResult {
        self.call(Fop::Writev { fd, data: Bytes::copy_from_slice(data), offset, flags: 0 }).await
    }

    async fn read(&self, fd: Fd, offset: u64, size: u32) -> Result<Bytes, Errno> {
        match self.call(Fop::Readv { fd, size, offset, flags: 0 }).await?.reply {
            Reply::Read { data, .. } => Ok(data),
            r => panic!("readv answered {r:?}"),
        }
    }

    async fn fsync(&self, fd: Fd) -> FopResult {
        self.call(Fop::Fsync { fd, datasync: false }).await
    }

    async fn close(&self, fd: Fd) {
        self.call(Fop::Flush { fd }).await.expect("flush");
        self.call(Fop::Release { fd }).await.expect("release");
    }

    async fn lookup(&self, name: &str) -> FopResult {
        self.call(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, name) }).await
    }

    fn down(&self, i: usize) {
        self.gates[i].down.store(true, Ordering::Release);
        self.afr.notify(Event::ChildDown, EventFrom::Child(i));
    }

    fn up(&self, i: usize) {
        self.gates[i].down.store(false, Ordering::Release);
        self.afr.notify(Event::ChildUp, EventFrom::Child(i));
    }

    fn fail(&self, i: usize, kinds: &[FopKind], e: Errno) {
        *self.gates[i].fail.lock() = Some((kinds.to_vec(), e));
    }

    fn heal_gate(&self, i: usize) {
        *self.gates[i].fail.lock() = None;
    }

    /// Calls of `kinds` seen by child `i`'s io-stats.
    fn seen(&self, i: usize, kinds: &[FopKind]) -> u64 {
        let snap = self.stats[i].snapshot();
        kinds.iter().filter_map(|k| snap.fop(*k)).map(|f| f.calls).sum()
    }

    /// Lock and changelog fops seen by all children.
    fn lock_and_xattrop(&self) -> (u64, u64) {
        let locks = (0..N).map(|i| self.seen(i, &[FopKind::Inodelk, FopKind::Finodelk])).sum();
        let xops = (0..N).map(|i| self.seen(i, &[FopKind::Xattrop, FopKind::Fxattrop])).sum();
        (locks, xops)
    }

    fn dump(&self, key: &str) -> String {
        self.afr.dump().into_iter().find(|(k, _)| k == key).map(|(_, v)| v).unwrap_or_default()
    }

    /// Waits until no eager lock is held (releases run in the background).
    async fn quiesce(&self) {
        for _ in 0..2000 {
            if self.afr.inner.windows_held() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("eager locks still held: {:?}", self.afr.dump());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_entries_land_on_every_child_with_one_gfid() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"hello ").await.expect("write");
    n.write(fd, 6, b"world").await.expect("write");
    n.fsync(fd).await.expect("fsync");
    n.close(fd).await;
    n.call(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 }).await.expect("mkdir");
    n.call(Fop::Symlink { target: "f".into(), loc: Loc::entry(Gfid::ROOT, "s"), umask: 0 }).await.expect("symlink");
    let d = match n.lookup("d").await.expect("lookup d").reply {
        Reply::Entry { iatt, .. } => iatt.gfid,
        r => panic!("{r:?}"),
    };
    n.call(Fop::Rename { old: Loc::entry(Gfid::ROOT, "s"), new: Loc::entry(d, "s2"), flags: 0 }).await.expect("rename");
    n.quiesce().await;
    for i in 0..N {
        assert_eq!(c.read(i, "f"), b"hello world", "brick {i}");
        assert_eq!(c.gfid_on(i, "f").as_deref(), Some(&fd.gfid.0[..]), "gfid on brick {i}");
        assert_eq!(c.gfid_on(i, "d"), c.gfid_on(0, "d"), "dir gfid on brick {i}");
        assert!(c.bricks[i].dir.join("d/s2").symlink_metadata().is_ok() && !c.bricks[i].dir.join("s").exists());
        for j in 0..N {
            assert_eq!(c.pending(i, "f", j), [0, 0, 0], "brick {i} blames {j}");
            assert_eq!(c.pending(i, "", j), [0, 0, 0], "root on brick {i} blames {j}");
        }
    }
    assert!(c.gfid_on(0, "d").is_some());
}

/// A node that prefers child 2 for reads, with file "f" written "one"
/// everywhere and then "two" while child 2 was down (it is still down).
async fn child_2_missed_a_write(c: &Cluster) -> (Node, Fd) {
    let n = c.node("client-a", &[("read-subvolume-index", "2")]);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"one").await.expect("write");
    n.fsync(fd).await.expect("fsync");
    n.down(2);
    n.write(fd, 0, b"two").await.expect("write with a child down");
    n.fsync(fd).await.expect("fsync");
    (n, fd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_child_is_blamed_and_not_read() {
    let c = Cluster::new();
    let (n, fd) = child_2_missed_a_write(&c).await;
    for i in 0..2 {
        assert_eq!(c.read(i, "f"), b"two");
        assert_eq!(c.pending(i, "f", 2), [1, 0, 0], "brick {i} blames the down child");
        assert_eq!(c.pending(i, "f", 0), [0, 0, 0]);
        assert_eq!(c.pending(i, "f", 1), [0, 0, 0]);
    }
    assert_eq!(c.read(2, "f"), b"one");
    // Back up: child 2 is the preferred read child, but it is stale.
    n.up(2);
    n.lookup("f").await.expect("lookup");
    assert_eq!(n.read(fd, 0, 3).await.expect("read"), Bytes::from_static(b"two"));
    assert_eq!(n.seen(2, &[FopKind::Readv]), 0, "no read from the stale child");
    // An entry created while child 2 is down is blamed on the parent.
    n.down(2);
    let g = n.create("g").await.expect("create with a child down");
    for i in 0..2 {
        assert_eq!(c.pending(i, "", 2), [0, 0, 1], "root on brick {i} blames child 2 for an entry");
    }
    assert!(!c.bricks[2].dir.join("g").exists());
    // A metadata change likewise, in the metadata counter.
    let mut x = Dict::new();
    x.set_bytes("user.k", b"v".to_vec());
    n.call(Fop::Setxattr { loc: Loc::gfid(g.gfid), xattrs: x, flags: 0 }).await.expect("setxattr");
    for i in 0..2 {
        assert_eq!(c.pending(i, "g", 2), [0, 1, 0], "brick {i} blames child 2 for metadata");
        assert_eq!(xattr(&c.bricks[i].dir.join("g"), "user.k").as_deref(), Some(&b"v"[..]));
    }
    n.close(g).await;
    n.close(fd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_failing_a_write_blames_itself_and_is_blamed() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"aaaa").await.expect("write");
    n.fsync(fd).await.expect("fsync");
    n.quiesce().await;
    for i in 0..N {
        for j in 0..N {
            assert_eq!(c.pending(i, "f", j), [0, 0, 0], "clean after success");
        }
    }
    n.fail(1, &[FopKind::Writev], Errno::ENOSPC);
    let r = n.write(fd, 0, b"bbbb").await.expect("write succeeds on the others");
    assert!(matches!(r.reply, Reply::PrePost { .. }));
    n.heal_gate(1);
    n.fsync(fd).await.expect("fsync");
    n.quiesce().await;
    for i in 0..N {
        assert_eq!(c.pending(i, "f", 1), [1, 0, 0], "brick {i} blames child 1");
        assert_eq!(c.pending(i, "f", 0), [0, 0, 0], "brick {i} on child 0");
        assert_eq!(c.pending(i, "f", 2), [0, 0, 0], "brick {i} on child 2");
    }
    assert_eq!(c.read(1, "f"), b"aaaa");
    // Failing everywhere blames no one and returns the error.
    for i in 0..N {
        n.fail(i, &[FopKind::Writev], Errno::ENOSPC);
    }
    assert_eq!(n.write(fd, 0, b"cccc").await.err(), Some(Errno::ENOSPC));
    n.fsync(fd).await.expect("fsync");
    n.quiesce().await;
    assert_eq!(c.pending(0, "f", 0), [0, 0, 0]);
    assert_eq!(c.pending(0, "f", 1), [1, 0, 0]);
    n.close(fd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_lock_one_lock_and_one_preop_for_many_writes_and_a_clean_fsync_keeps_the_window() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "30")]);
    let fd = n.create("f").await.expect("create");
    let before = n.lock_and_xattrop();
    for k in 0..20u64 {
        n.write(fd, k * 4, b"data").await.expect("write");
    }
    let (locks, xops) = n.lock_and_xattrop();
    assert_eq!(locks - before.0, N as u64, "one inodelk per child for 20 writes");
    assert_eq!(xops - before.1, N as u64, "one pre-op per child for 20 writes");
    for i in 0..N {
        assert_eq!(c.pending(i, "f", i), [1, 0, 0], "the delayed post-op leaves the counters raised");
    }
    // An fsync that succeeds everywhere leaves the window (and the
    // uniformly raised counters) as they are: no post-op, no new pre-op.
    n.fsync(fd).await.expect("fsync");
    for k in 0..5u64 {
        n.write(fd, k * 4, b"more").await.expect("write");
    }
    n.fsync(fd).await.expect("fsync");
    for i in 0..N {
        assert_eq!(c.pending(i, "f", i), [1, 0, 0], "still in the window on brick {i}");
    }
    let (locks, xops) = n.lock_and_xattrop();
    assert_eq!(locks - before.0, N as u64, "the lock is kept across fsync");
    assert_eq!(xops - before.1, N as u64, "still one pre-op");
    assert_eq!(n.dump("eager-lock.held"), "1");
    n.close(fd).await;
    n.quiesce().await;
    for i in 0..N {
        for j in 0..N {
            assert_eq!(c.pending(i, "f", j), [0, 0, 0], "the post-op at close cleared brick {i}");
        }
    }
    assert_eq!(n.dump("eager-lock.released.close"), "1");
    let (locks, xops) = n.lock_and_xattrop();
    assert_eq!(xops - before.1, 2 * N as u64, "one pre-op and one post-op");
    assert_eq!(locks - before.0, 2 * N as u64, "lock and unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_window_ends_after_the_post_op_delay() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "1")]);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"x").await.expect("write");
    assert_eq!(n.dump("eager-lock.held"), "1");
    n.quiesce().await;
    assert_eq!(n.dump("eager-lock.released.idle"), "1");
    for i in 0..N {
        assert_eq!(c.pending(i, "f", 0), [0, 0, 0]);
    }
    n.close(fd).await;
}

/// Several fds on the same files, small writes and fsyncs, as pgbench's
/// backends do on a table; returns (lock fops, xattrop fops) over all
/// children.
async fn pgbench_like(policy: &str) -> (u64, u64, u64) {
    let c = Cluster::new();
    let n = Arc::new(c.node("client-a", &[("lock-contention-policy", policy)]));
    let mut fds = Vec::new();
    for f in 0..2 {
        let first = n.create(&format!("table{f}")).await.expect("create");
        fds.push(first);
        for _ in 1..4 {
            fds.push(n.open(first.gfid).await);
        }
    }
    let before = n.lock_and_xattrop();
    let page = vec![7u8; 512];
    for round in 0..20u64 {
        let futs = fds.iter().enumerate().map(|(k, fd)| {
            let (n, page) = (n.clone(), &page);
            async move {
                for w in 0..3u64 {
                    n.write(*fd, (k as u64 * 64 + round * 3 + w) * 512, page).await.expect("write");
                }
                n.fsync(*fd).await.expect("fsync");
            }
        });
        join_all(futs.collect()).await;
    }
    for fd in &fds {
        n.close(*fd).await;
    }
    n.quiesce().await;
    let after = n.lock_and_xattrop();
    for f in 0..2 {
        let name = format!("table{f}");
        let want = c.read(0, &name);
        assert!(!want.is_empty());
        for i in 1..N {
            assert_eq!(c.read(i, &name), want, "{name} on brick {i}");
        }
        for i in 0..N {
            for j in 0..N {
                assert_eq!(c.pending(i, &name, j), [0, 0, 0], "{policy}: {name} brick {i} blames {j}");
            }
        }
    }
    let windows = n.dump("eager-lock.windows").parse().unwrap_or(0);
    (after.0 - before.0, after.1 - before.1, windows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_like_workload_lock_and_xattrop_counts_per_policy() {
    let mut counts = Vec::new();
    for policy in ["fd-count", "inodelk-count", "notify"] {
        let (locks, xops, windows) = pgbench_like(policy).await;
        println!(
            "pgbench-like (2 files x 4 fds, 20 rounds of 3 writes + fsync per fd, 3 children): {policy:>13}: \
             INODELK+FINODELK {locks:>5}  XATTROP+FXATTROP {xops:>5}  total {:>5}  windows {windows}",
            locks + xops
        );
        counts.push((policy, locks + xops));
    }
    let fd_count = counts[0].1;
    for (policy, total) in &counts[1..] {
        assert!(total * 3 < fd_count, "{policy}: {total} lock+xattrop fops against fd-count's {fd_count}");
    }
}

/// Two clients writing the same file at once, each through its own
/// replicate node over the same bricks; both must finish.
async fn two_clients(policy: &str) -> (Duration, u64, u64) {
    let c = Cluster::new();
    let opts = [("lock-contention-policy", policy)];
    let a = Arc::new(c.node("client-a", &opts));
    let b = Arc::new(c.node("client-b", &opts));
    let fa = a.create("shared").await.expect("create");
    let fb = b.open(fa.gfid).await;
    let t0 = Instant::now();
    let run = |n: Arc<Node>, fd: Fd, base: u64| async move {
        for k in 0..30u64 {
            n.write(fd, base + k * 8, &base.to_be_bytes()).await.expect("write");
            if k % 5 == 4 {
                n.fsync(fd).await.expect("fsync");
            }
        }
    };
    let both = join_all(vec![
        Box::pin(run(a.clone(), fa, 0)) as Pin<Box<dyn Future<Output = ()> + Send>>,
        Box::pin(run(b.clone(), fb, 4096)),
    ]);
    tokio::time::timeout(Duration::from_secs(300), both).await.expect("both clients finish (no starvation)");
    let took = t0.elapsed();
    a.close(fa).await;
    b.close(fb).await;
    a.quiesce().await;
    b.quiesce().await;
    let want = c.read(0, "shared");
    assert_eq!(want.len(), 4096 + 30 * 8);
    assert_eq!(&want[..8], &0u64.to_be_bytes());
    assert_eq!(&want[4096..4104], &4096u64.to_be_bytes());
    for i in 1..N {
        assert_eq!(c.read(i, "shared"), want, "brick {i}");
    }
    for i in 0..N {
        for j in 0..N {
            assert_eq!(c.pending(i, "shared", j), [0, 0, 0], "{policy}: brick {i} blames {j}");
        }
    }
    let wa = a.dump("eager-lock.windows").parse().unwrap_or(0);
    let wb = b.dump("eager-lock.windows").parse().unwrap_or(0);
    (took, wa, wb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_on_one_file_both_progress_under_every_policy() {
    for policy in ["fd-count", "inodelk-count", "notify"] {
        let (took, wa, wb) = two_clients(policy).await;
        println!("two clients, 30 writes each on one file: {policy:>13}: windows a {wa} b {wb}, {took:?}");
        assert!(wa >= 1 && wb >= 1);
    }
}

/// Client a writes once and goes idle inside its post-op delay; client b
/// then writes. Returns how a's window ended and how long b waited.
async fn idle_holder(policy: &str) -> (String, String, Duration) {
    let c = Cluster::new();
    let opts = [("lock-contention-policy", policy), ("post-op-delay-secs", "2")];
    let a = c.node("client-a", &opts);
    let b = c.node("client-b", &opts);
    let fa = a.create("f").await.expect("create");
    let fb = b.open(fa.gfid).await;
    a.write(fa, 0, b"a").await.expect("a writes");
    assert_eq!(a.dump("eager-lock.held"), "1");
    let t0 = Instant::now();
    b.write(fb, 1, b"b").await.expect("b writes");
    let waited = t0.elapsed();
    a.quiesce().await;
    let out = (a.dump("eager-lock.released.policy"), a.dump("eager-lock.released.idle"), waited);
    a.close(fa).await;
    b.close(fb).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_holder_hands_over_at_once_only_with_notify() {
    let (policy, idle, waited) = idle_holder("notify").await;
    println!("idle holder, notify: a's window ended by policy {policy} / idle {idle}; b waited {waited:?}");
    assert_eq!((policy.as_str(), idle.as_str()), ("1", "0"), "the upcall ends the idle window");
    let (policy, idle, waited) = idle_holder("inodelk-count").await;
    println!("idle holder, inodelk-count: a's window ended by policy {policy} / idle {idle}; b waited {waited:?}");
    assert_eq!((policy.as_str(), idle.as_str()), ("0", "1"), "no write, no count: the window runs out its delay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_one_child_and_fail_over() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("read-hash-mode", "0")]);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"content").await.expect("write");
    n.fsync(fd).await.expect("fsync");
    for _ in 0..5 {
        assert_eq!(n.read(fd, 0, 7).await.expect("read"), Bytes::from_static(b"content"));
    }
    assert_eq!((n.seen(0, &[FopKind::Readv]), n.seen(1, &[FopKind::Readv]), n.seen(2, &[FopKind::Readv])), (5, 0, 0));
    n.fail(0, &[FopKind::Readv], Errno::EIO);
    assert_eq!(n.read(fd, 0, 7).await.expect("read fails over"), Bytes::from_static(b"content"));
    assert_eq!(n.seen(1, &[FopKind::Readv]), 1);
    assert_eq!(n.dump("read-failovers"), "1");
    n.heal_gate(0);
    n.down(0);
    assert_eq!(n.read(fd, 0, 7).await.expect("read with child 0 down"), Bytes::from_static(b"content"));
    assert_eq!(n.seen(1, &[FopKind::Readv]), 2);
    // Hash mode 1: one child per file, the same for every read of it.
    let h = c.node("client-h", &[("read-hash-mode", "1")]);
    let before: Vec<u64> = (0..N).map(|i| h.seen(i, &[FopKind::Stat])).collect();
    for _ in 0..4 {
        h.call(Fop::Stat { loc: Loc::gfid(fd.gfid) }).await.expect("stat");
    }
    let per: Vec<u64> = (0..N).map(|i| h.seen(i, &[FopKind::Stat]) - before[i]).collect();
    assert_eq!(per.iter().filter(|&&x| x == 4).count(), 1, "{per:?}");
    n.close(fd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_lost_refuses_writes_without_applying_anything() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"before").await.expect("write");
    n.fsync(fd).await.expect("fsync");
    n.close(fd).await;
    n.quiesce().await;
    let fd = n.open(fd.gfid).await;
    n.down(1);
    n.down(2);
    assert_eq!(n.write(fd, 0, b"after!").await.err(), Some(Errno::ENOTCONN));
    assert_eq!(n.create("g").await.err(), Some(Errno::ENOTCONN));
    assert_eq!(
        n.call(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 }).await.err(),
        Some(Errno::ENOTCONN)
    );
    let mut x = Dict::new();
    x.set_bytes("user.k", b"v".to_vec());
    assert_eq!(
        n.call(Fop::Setxattr { loc: Loc::gfid(fd.gfid), xattrs: x, flags: 0 }).await.err(),
        Some(Errno::ENOTCONN)
    );
    assert_eq!(c.read(0, "f"), b"before");
    assert!(!c.bricks[0].dir.join("g").exists() && !c.bricks[0].dir.join("d").exists());
    for j in 0..N {
        assert_eq!(c.pending(0, "f", j), [0, 0, 0], "nothing half applied");
        assert_eq!(c.pending(0, "", j), [0, 0, 0]);
    }
    assert_eq!(n.read(fd, 0, 6).await.expect("reads still work"), Bytes::from_static(b"before"));
    n.lookup("f").await.expect("lookup still works");
    // quorum-type none writes to the one child left.
    let m = c.node("client-m", &[("quorum-type", "none")]);
    m.down(1);
    m.down(2);
    let fm = m.open(fd.gfid).await;
    m.write(fm, 0, b"after!").await.expect("write without quorum");
    m.fsync(fm).await.expect("fsync");
    assert_eq!(c.read(0, "f"), b"after!");
    assert_eq!(c.pending(0, "f", 1), [1, 0, 0]);
    assert_eq!(c.pending(0, "f", 2), [1, 0, 0]);
    m.close(fm).await;
    n.close(fd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_and_down_events() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    n.afr.notify(Event::ChildDown, EventFrom::Child(0));
    n.afr.notify(Event::ChildDown, EventFrom::Child(1));
    assert_eq!(n.afr.notify(Event::ChildDown, EventFrom::Child(2)), Some(Event::ChildDown), "none up");
    assert_eq!(n.afr.notify(Event::ChildUp, EventFrom::Child(1)), Some(Event::ChildUp), "first up");
    assert_eq!(n.afr.notify(Event::ChildUp, EventFrom::Child(2)), None);
    assert_eq!(n.afr.notify(Event::ChildDown, EventFrom::Child(1)), None);
    assert_eq!(n.dump("children-up"), "1/3");
    assert_eq!(n.afr.notify(Event::ParentUp, EventFrom::Graph), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gluster_volfile_options_are_accepted() {
    let given = [
        ("use-anonymous-inode", "yes"),
        ("use-compound-fops", "off"),
        ("granular-entry-heal", "on"),
        ("volume-id", "76b60fc5-d0c8-4fd8-9174-bf87139f7df3"),
        ("afr-pending-xattr", "rep3-client-0,rep3-client-1,rep3-client-2"),
        ("iam-self-heal-daemon", "yes"),
        ("self-heal-daemon", "enable"),
        ("entry-self-heal", "on"),
        ("data-self-heal", "on"),
        ("metadata-self-heal", "on"),
        ("background-self-heal-count", "0"),
    ];
    let c = Cluster::new();
    let n = c.node("client-a", &given);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"x").await.expect("write");
    for i in 0..N {
        assert!(xattr(&c.bricks[i].dir.join("f"), "trusted.afr.rep3-client-2").is_some(), "named by afr-pending-xattr");
    }
    n.close(fd).await;
    assert!(Options::resolve(TYPE.options, [("afr-pending-xattr", "a,b")]).is_ok());
    let bad = Replicate::new(InitCtx {
        name: "x".into(),
        options: opts(TYPE.options, &[("afr-pending-xattr", "a,b")]),
        children: n.afr.inner.children.clone(),
        events: EventSink::new(),
    });
    assert!(bad.err().expect("wrong count").to_string().contains("names 2 children"));
    let bad = Replicate::new(InitCtx {
        name: "x".into(),
        options: opts(TYPE.options, &[("lock-contention-policy", "sometimes")]),
        children: n.afr.inner.children.clone(),
        events: EventSink::new(),
    });
    assert!(bad.err().expect("unknown policy").to_string().contains("fd-count, inodelk-count, notify"));
    // Reconfigure swaps the policy; the pending names cannot change.
    let mut changed = given.to_vec();
    changed.push(("lock-contention-policy", "fd-count"));
    n.afr.reconfigure(&opts(TYPE.options, &changed)).expect("reconfigure");
    assert_eq!(n.dump("lock-contention-policy"), "fd-count");
    let e = n.afr.reconfigure(&opts(TYPE.options, &[("afr-pending-xattr", "x,y,z")])).expect_err("names are fixed");
    assert!(e.to_string().contains("afr-pending-xattr"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_policy_is_consulted() {
    use xlfs_sdk::policy::lock_contention::{Decision, LockContentionPolicy, LockEvent, LockView, register_loader};
    struct EveryTxn;
    impl LockContentionPolicy for EveryTxn {
        fn name(&self) -> &str {
            "every-txn"
        }
        fn decide(&self, event: LockEvent, _: &LockView) -> Decision {
            if event == LockEvent::TxnEnd { Decision::ReleaseNow } else { Decision::Keep }
        }
    }
    register_loader("afrtest", Arc::new(|_: &str| Ok(Arc::new(EveryTxn) as Arc<dyn LockContentionPolicy>)))
        .expect("register");
    let c = Cluster::new();
    let n = c.node("client-a", &[("lock-contention-policy", "afrtest:every")]);
    assert_eq!(n.dump("lock-contention-policy"), "every-txn");
    let fd = n.create("f").await.expect("create");
    for k in 0..4u64 {
        n.write(fd, k, b"z").await.expect("write");
    }
    assert_eq!(n.dump("eager-lock.windows"), "4");
    assert_eq!(n.dump("eager-lock.released.policy"), "4");
    n.close(fd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_caller_gives_up_still_completes_and_releases() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "0")]);
    let fd = n.create("f").await.expect("create");
    {
        let fut = n.afr.call(
            n.ctx.clone(),
            Request::new(Fop::Writev { fd, data: Bytes::from_static(b"late"), offset: 0, flags: 0 }),
        );
        let mut fut = std::pin::pin!(fut);
        // Started, then abandoned.
        let _ = crate::test_util::poll(fut.as_mut());
    }
    for _ in 0..2000 {
        if (0..N).all(|i| c.read(i, "f") == b"late") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The data is on the bricks while the window is still open; it ends
    // in the same task.
    n.quiesce().await;
    for i in 0..N {
        assert_eq!(c.read(i, "f"), b"late", "brick {i}");
        assert_eq!(c.pending(i, "f", i), [0, 0, 0], "brick {i} settled");
    }
    // Nothing is left locked: another client gets the lock at once.
    let b = c.node("client-b", &[]);
    let fb = b.open(fd.gfid).await;
    b.write(fb, 0, b"next").await.expect("write");
    b.close(fb).await;
    n.close(fd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_inodelks_go_to_every_child_and_conflict() {
    use xlfs_sdk::{Flock, LkCmd, LockType};
    let c = Cluster::new();
    let a = c.node("client-a", &[]);
    let b = c.node("client-b", &[]);
    let fd = a.create("f").await.expect("create");
    let lk = |cmd, ty| Fop::Inodelk { domain: "app".into(), loc: Loc::gfid(fd.gfid), cmd, lock: Flock::whole(ty, 0) };
    a.call(lk(LkCmd::SetLk, LockType::Write)).await.expect("a locks");
    assert_eq!((0..N).map(|i| a.seen(i, &[FopKind::Inodelk])).collect::<Vec<_>>(), vec![1, 1, 1]);
    assert_eq!(b.call(lk(LkCmd::SetLk, LockType::Write)).await.err(), Some(Errno::EAGAIN));
    a.call(lk(LkCmd::SetLk, LockType::Unlock)).await.expect("a unlocks");
    b.call(lk(LkCmd::SetLk, LockType::Write)).await.expect("b locks");
    b.call(lk(LkCmd::SetLk, LockType::Unlock)).await.expect("b unlocks");
    // a holds children 1 and 2 only; b gets child 0, is refused on child 1
    // and must give child 0 back.
    a.down(0);
    a.call(lk(LkCmd::SetLk, LockType::Write)).await.expect("a locks on two children");
    assert_eq!(b.call(lk(LkCmd::SetLk, LockType::Write)).await.err(), Some(Errno::EAGAIN));
    a.call(lk(LkCmd::SetLk, LockType::Unlock)).await.expect("a unlocks");
    let c3 = c.node("client-c", &[]);
    let mut got = Err(Errno::EAGAIN);
    for _ in 0..400 {
        got = c3.call(lk(LkCmd::SetLk, LockType::Write)).await;
        if got.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    got.expect("b's partial lock on child 0 was given back");
    a.close(fd).await;
}

#[test]
fn unlocks_undo_locks() {
    let lk = xlfs_sdk::Flock::whole(xlfs_sdk::LockType::Write, 1);
    let fd = Fd { id: FdId(1), gfid: Gfid::ROOT };
    match unlock_of(&Fop::Lk { fd, cmd: xlfs_sdk::LkCmd::SetLkw, lock: lk }) {
        Some(Fop::Lk { cmd: xlfs_sdk::LkCmd::SetLk, lock, .. }) => assert_eq!(lock.ty, xlfs_sdk::LockType::Unlock),
        o => panic!("{o:?}"),
    }
    let e = Fop::Entrylk {
        domain: "d".into(),
        loc: Loc::root(),
        name: "n".into(),
        cmd: xlfs_sdk::EntrylkCmd::Unlock,
        ty: xlfs_sdk::EntrylkType::Write,
    };
    assert!(unlock_of(&e).is_none());
    let _ = Kind::Data;
}

/// The names in brick `i`'s directory `rel` (without AFR's and posix's own).
fn names_on(c: &Cluster, i: usize, rel: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(c.bricks[i].dir.join(rel))
        .expect("brick dir")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| !n.starts_with(".glusterfs"))
        .collect();
    v.sort();
    v
}

impl Node {
    fn entrylks(&self) -> u64 {
        (0..N).map(|i| self.seen(i, &[FopKind::Entrylk, FopKind::Fentrylk])).sum()
    }
}

/// Guards a step that must not wait out a long post-op delay.
async fn promptly<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: still waiting after 60 s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_fops_in_one_directory_share_one_delegation() {
    let c = Cluster::new();
    // Each fop waits for the bricks here (async-dirops has its own tests).
    let n = c.node("client-a", &[("post-op-delay-secs", "3600"), ("async-dirops", "off")]);
    let mut gfids = Vec::new();
    for k in 0..20 {
        let fd = n.create(&format!("f{k}")).await.expect("create");
        gfids.push(fd.gfid);
        n.close(fd).await;
    }
    for k in 0..10 {
        n.call(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, format!("f{k}")), flags: 0 }).await.expect("unlink");
    }
    let (old, new) = (Loc::entry(Gfid::ROOT, "f10"), Loc::entry(Gfid::ROOT, "g10"));
    n.call(Fop::Rename { old, new, flags: 0 }).await.expect("rename within the directory");
    n.call(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 }).await.expect("mkdir");
    assert_eq!(n.entrylks(), N as u64, "one whole-directory entrylk per child for 32 entry fops");
    assert_eq!(n.dump("entry-eager-lock.taken"), "1");
    assert_eq!(n.dump("entry-eager-lock.joined"), "32", "{:?}", n.afr.dump());
    let mut want: Vec<String> = (11..20).map(|k| format!("f{k}")).collect();
    want.extend(["d".to_string(), "g10".to_string()]);
    want.sort();
    for i in 0..N {
        assert_eq!(names_on(&c, i, ""), want, "brick {i}");
        for (k, g) in gfids.iter().enumerate().skip(11) {
            assert_eq!(c.gfid_on(i, &format!("f{k}")).as_deref(), Some(&g.0[..]), "gfid of f{k} on brick {i}");
        }
        for j in 0..N {
            assert_eq!(c.pending(i, "", j), [0, 0, 0], "root on brick {i} blames {j}");
        }
    }
    // The directory's names are known while it is delegated: a lookup of
    // a name it does not have is answered without the bricks.
    for _ in 0..2000 {
        if n.dump("entry-eager-lock.listed") == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(n.dump("entry-eager-lock.listed"), "1", "{:?}", n.afr.dump());
    let lookups = |n: &Node| (0..N).map(|i| n.seen(i, &[FopKind::Lookup])).sum::<u64>();
    let before = lookups(&n);
    assert_eq!(n.lookup("f3").await.map(drop), Err(Errno::ENOENT), "unlinked");
    assert_eq!(n.lookup("never").await.map(drop), Err(Errno::ENOENT));
    assert_eq!(n.lookup("f10").await.map(drop), Err(Errno::ENOENT), "renamed away");
    assert_eq!(lookups(&n), before, "absent names answered without the bricks");
    assert_eq!(n.dump("entry-eager-lock.absent-hits"), "3");
    n.lookup("g10").await.expect("a name it has is looked up");
    assert_eq!(lookups(&n), before + N as u64);
    // rmdir locks the removed directory as a whole and its name per name:
    // this client's own delegations are returned first, not waited out.
    let d = match n.lookup("d").await.expect("lookup d").reply {
        Reply::Entry { iatt, .. } => iatt.gfid,
        r => panic!("{r:?}"),
    };
    let fd = n
        .call(Fop::Create { loc: Loc::entry(d, "x"), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: n.fd_id() })
        .await
        .expect("create in d");
    drop(fd);
    n.call(Fop::Unlink { loc: Loc::entry(d, "x"), flags: 0 }).await.expect("unlink in d");
    promptly("rmdir", n.call(Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, "d"), flags: 0 })).await.expect("rmdir");
    assert!(n.dump("entry-eager-lock.returned").parse::<u64>().unwrap_or(0) >= 1, "{:?}", n.afr.dump());
    for i in 0..N {
        assert!(!c.bricks[i].dir.join("d").exists(), "d gone on brick {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_creating_in_one_directory_hand_the_delegation_over() {
    let c = Cluster::new();
    let opts = [("post-op-delay-secs", "3600")];
    let a = Arc::new(c.node("client-a", &opts));
    let b = Arc::new(c.node("client-b", &opts));
    let fd = a.create("a-first").await.expect("create");
    a.close(fd).await;
    assert_eq!(a.dump("entry-eager-lock.held"), "1");
    // b's entry lock makes a return its idle delegation at once.
    let fd = promptly("b's create behind a's idle delegation", b.create("b-first")).await.expect("create");
    b.close(fd).await;
    assert_eq!(a.dump("entry-eager-lock.returned"), "1");
    // Both creating and removing in the directory at once: both progress.
    let run = |n: Arc<Node>, who: &'static str| async move {
        for k in 0..15 {
            let name = format!("{who}{k}");
            let fd = n.create(&name).await.expect("create");
            n.close(fd).await;
            if k % 3 == 0 {
                n.call(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, name), flags: 0 }).await.expect("unlink");
            }
        }
    };
    let both = join_all(vec![
        Box::pin(run(a.clone(), "a")) as Pin<Box<dyn Future<Output = ()> + Send>>,
        Box::pin(run(b.clone(), "b")),
    ]);
    promptly("two clients creating in one directory", both).await;
    let want = names_on(&c, 0, "");
    assert_eq!(want.len(), 2 + 2 * 10, "{want:?}");
    for i in 1..N {
        assert_eq!(names_on(&c, i, ""), want, "brick {i}");
        for name in &want {
            assert_eq!(c.gfid_on(i, name), c.gfid_on(0, name), "gfid of {name} on brick {i}");
        }
    }
    for i in 0..N {
        for j in 0..N {
            assert_eq!(c.pending(i, "", j), [0, 0, 0], "root on brick {i} blames {j}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegated_create_failing_on_one_child_blames_it_on_the_directory() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "3600"), ("async-dirops", "off")]);
    let fd = n.create("ok").await.expect("create");
    n.close(fd).await;
    n.fail(2, &[FopKind::Create], Errno::EIO);
    let fd = n.create("partial").await.expect("create succeeds on two children");
    n.heal_gate(2);
    assert_eq!(n.dump("entry-eager-lock.taken"), "1", "the second create used the delegation");
    for i in 0..2 {
        assert_eq!(c.pending(i, "", 2), [0, 0, 1], "root on brick {i} blames child 2 for an entry");
        assert!(c.bricks[i].dir.join("partial").exists());
    }
    assert!(!c.bricks[2].dir.join("partial").exists());
    n.close(fd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_eager_lock_off_takes_a_lock_per_fop() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("entry-eager-lock", "off")]);
    for k in 0..5 {
        let fd = n.create(&format!("f{k}")).await.expect("create");
        n.close(fd).await;
    }
    assert_eq!(n.entrylks(), 2 * 5 * N as u64, "a lock and an unlock per create per child");
    assert_eq!(n.dump("entry-eager-lock.taken"), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_ending_together_share_a_syncfs_per_child() {
    let c = Cluster::new();
    let n = Arc::new(c.node("client-a", &[]));
    // Writers that all hold their windows open, then close at once.
    let mut fds = Vec::new();
    for k in 0..16u8 {
        let fd = n.create(&format!("f{k}")).await.expect("create");
        n.write(fd, 0, &[k; 100]).await.expect("write");
        fds.push(fd);
    }
    let closes = fds.iter().map(|fd| {
        let (n, fd) = (n.clone(), *fd);
        Box::pin(async move { n.close(fd).await }) as Pin<Box<dyn Future<Output = ()> + Send>>
    });
    join_all(closes.collect()).await;
    n.quiesce().await;
    for i in 0..N {
        let syncs = n.seen(i, &[FopKind::Fsync]);
        assert!((1..16).contains(&syncs), "child {i}: {syncs} syncs for 16 windows ending together");
        for k in 0..16u8 {
            assert_eq!(c.read(i, &format!("f{k}")), vec![k; 100], "brick {i}");
            for j in 0..N {
                assert_eq!(c.pending(i, &format!("f{k}"), j), [0, 0, 0], "f{k} on brick {i} blames {j}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_a_majority_refuses_fails_with_their_error() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    // Two full bricks out of three: quorum is lost, and the writer learns
    // why (ENOSPC), not ENOTCONN.
    n.fail(1, &[FopKind::Writev], Errno::ENOSPC);
    n.fail(2, &[FopKind::Writev], Errno::ENOSPC);
    assert_eq!(n.write(fd, 0, b"x").await.err(), Some(Errno::ENOSPC));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_write_makes_its_window_durable_without_another_fsync() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    // A plain write, then an O_DSYNC one (write-behind's fsync): the
    // window ends without a sync of its own.
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"plain").await.expect("write");
    let sync = Fop::Writev { fd, data: Bytes::from_static(b"+sync"), offset: 5, flags: libc::O_DSYNC as u32 };
    n.call(sync).await.expect("sync write");
    n.close(fd).await;
    n.quiesce().await;
    for i in 0..N {
        assert_eq!(n.seen(i, &[FopKind::Fsync]), 0, "child {i}");
        assert_eq!(c.read(i, "f"), b"plain+sync");
    }
    // Without it, the window's end syncs what it wrote.
    let fd = n.create("g").await.expect("create");
    n.write(fd, 0, b"plain").await.expect("write");
    n.close(fd).await;
    n.quiesce().await;
    for i in 0..N {
        assert_eq!(n.seen(i, &[FopKind::Fsync]), 1, "child {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_content_comes_only_from_a_copy_a_read_would_use() {
    use xlfs_sdk::Value;
    use xlfs_sdk::dict::keys::CONTENT;
    let c = Cluster::new();
    let (n, fd) = child_2_missed_a_write(&c).await;
    n.up(2);
    assert_eq!(c.read(2, "f"), b"one");
    let lookup =
        |x: Dict| n.afr.call(n.ctx.clone(), Request::with_xdata(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "f") }, x));
    let ask = Dict::new().with(CONTENT, Value::U64(1024));
    let r = lookup(ask.clone()).await.expect("lookup");
    assert_eq!(r.xdata.get_bytes(CONTENT).as_deref(), Some(&b"two"[..]), "content from a good copy, not the stale one");
    assert!(!lookup(Dict::new()).await.expect("lookup").xdata.contains(CONTENT), "not asked, not given");
    n.close(fd).await;
    n.quiesce().await;
    // A data split-brain (each copy blames the next): lookup still answers,
    // without content, as a read would fail.
    for i in 0..N {
        let p = std::ffi::CString::new(c.bricks[i].dir.join("f").as_os_str().as_encoded_bytes()).expect("path");
        for j in 0..N {
            let v = pending::encode(if j == (i + 1) % N { [1, 0, 0] } else { [0, 0, 0] });
            let name = std::ffi::CString::new(format!("trusted.afr.test-client-{j}")).expect("name");
            // SAFETY: valid C strings and a value of the given length.
            let rc = unsafe { libc::lsetxattr(p.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
            assert_eq!(rc, 0, "set pending on brick {i}");
        }
    }
    let r = lookup(ask).await.expect("lookup answers in split-brain");
    assert!(!r.xdata.contains(CONTENT), "no content from a split-brain: {:?}", r.xdata.keys().collect::<Vec<_>>());
}

/// Waits until `dir`'s delegation knows its names (the listing runs in the
/// background once the delegation is taken).
async fn until_listed(n: &Node, count: &str) {
    for _ in 0..2000 {
        if n.dump("entry-eager-lock.listed") == count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("directory never listed: {:?}", n.afr.dump());
}

async fn drain(n: &Node) {
    promptly("drain", n.call(Fop::Ipc { op: xlfs_sdk::IPC_DRAIN })).await.expect("drain");
}

fn mkdir_req(parent: Gfid, name: &str) -> Fop {
    Fop::Mkdir { loc: Loc::entry(parent, name), mode: 0o755, umask: 0o022 }
}

async fn create_in(n: &Node, dir: Gfid, name: &str) -> Result<(Fd, Iatt), Errno> {
    let id = n.fd_id();
    let fop = Fop::Create { loc: Loc::entry(dir, name), flags: libc::O_RDWR as u32, mode: 0o666, umask: 0o022, fd: id };
    match n.call(fop).await?.reply {
        Reply::Entry { iatt, .. } => Ok((Fd { id, gfid: iatt.gfid }, iatt)),
        r => panic!("create answered {r:?}"),
    }
}

fn entry_gfid(r: FopResult) -> Gfid {
    match r.expect("entry fop").reply {
        Reply::Entry { iatt, .. } => iatt.gfid,
        r => panic!("{r:?}"),
    }
}

/// A delegated directory with its names known: creates, mkdirs and unlinks
/// there are answered before the bricks see them, with the attributes the
/// bricks then give, and reach every brick in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_fops_answered_early_land_in_order_with_the_same_attributes() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "3600")]);
    let fd = n.create("first").await.expect("create");
    n.close(fd).await;
    until_listed(&n, "1").await;
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let mut made = Vec::new();
    for k in 0..20 {
        let (fd, iatt) = create_in(&n, d, &format!("f{k}")).await.expect("create in the new directory");
        assert_eq!((iatt.mode, iatt.nlink, iatt.size, iatt.uid), (libc::S_IFREG | 0o644, 1, 0, 0));
        n.write(fd, 0, format!("data {k}").as_bytes()).await.expect("write to a file answered early");
        made.push((fd, iatt));
    }
    for k in 0..5 {
        n.call(Fop::Unlink { loc: Loc::entry(d, format!("f{k}")), flags: 0 }).await.expect("unlink");
    }
    assert!(n.dump("async-dirops.answered").parse::<u64>().unwrap_or(0) >= 25, "{:?}", n.afr.dump());
    for (fd, _) in &made {
        n.close(*fd).await;
    }
    drain(&n).await;
    assert_eq!(n.dump("async-dirops.queued"), "0");
    assert_eq!(n.dump("async-dirops.failed"), "0");
    let mut want: Vec<String> = (5..20).map(|k| format!("f{k}")).collect();
    want.sort();
    for i in 0..N {
        assert_eq!(names_on(&c, i, "d"), want, "brick {i}");
        for (k, (_, iatt)) in made.iter().enumerate().skip(5) {
            let p = c.bricks[i].dir.join(format!("d/f{k}"));
            assert_eq!(c.gfid_on(i, &format!("d/f{k}")).as_deref(), Some(&iatt.gfid.0[..]), "gfid of f{k} on {i}");
            let m = std::fs::metadata(&p).expect("on the brick");
            use std::os::unix::fs::MetadataExt;
            assert_eq!((m.mode(), m.uid(), m.gid()), (iatt.mode, iatt.uid, iatt.gid), "attributes of f{k} on {i}");
            assert_eq!(std::fs::read(&p).expect("read"), format!("data {k}").as_bytes());
        }
    }
}

/// An operation answered early that then fails on the bricks is not
/// silent: the next fops on its inode and the next fsync of its directory
/// return the error, and it is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_early_create_is_reported_on_the_next_fops() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "3600")]);
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    // The name is taken behind the volume's back (on every brick): the
    // client believes it absent.
    for b in &c.bricks {
        std::fs::write(b.dir.join("d/taken"), b"old").expect("write on the brick");
    }
    let (fd, _) = create_in(&n, d, "taken").await.expect("answered early");
    assert_eq!(n.dump("async-dirops.answered"), "1", "the create, in the directory just made: {:?}", n.afr.dump());
    assert_eq!(n.fsync(fd).await.map(drop), Err(Errno::EEXIST), "fsync of the failed create");
    assert_eq!(n.write(fd, 0, b"new").await.map(drop), Err(Errno::EEXIST), "write to the failed create");
    // The failure made d's names unknown: the next create there waits for
    // the bricks. In a new directory, ENOSPC comes after the answer.
    let d2 = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d2")).await);
    for i in 0..N {
        n.fail(i, &[FopKind::Create], Errno::ENOSPC);
    }
    let (fd2, _) =
        create_in(&n, d2, "full").await.map_err(|e| format!("{e} {:?}", n.afr.dump())).expect("answered early");
    assert_eq!(n.fsync(fd2).await.map(drop), Err(Errno::ENOSPC), "fsync of the other one");
    let dfd = Fd { id: n.fd_id(), gfid: d2 };
    n.call(Fop::Opendir { loc: Loc::gfid(d2), fd: dfd.id }).await.expect("opendir");
    assert_eq!(
        n.call(Fop::Fsyncdir { fd: dfd, datasync: false }).await.map(drop),
        Err(Errno::ENOSPC),
        "fsyncdir reports it"
    );
    n.call(Fop::Fsyncdir { fd: dfd, datasync: false }).await.expect("once");
    assert_eq!(n.dump("async-dirops.failed"), "2");
    for i in 0..N {
        n.heal_gate(i);
    }
    // Releases still clean up; the name that was there is untouched.
    n.call(Fop::Release { fd }).await.expect("release");
    n.call(Fop::Release { fd: fd2 }).await.expect("release");
    for b in &c.bricks {
        assert_eq!(std::fs::read(b.dir.join("d/taken")).expect("still there"), b"old");
        assert!(!b.dir.join("d2/full").exists());
    }
    drain(&n).await;
    assert_eq!(n.dump("async-dirops.queued"), "0");
}

/// create, write, rename and unlink of the same names in quick succession
/// end as if each had waited for the bricks; another client sees the
/// result once they are sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_successions_on_the_same_names_end_as_if_synchronous() {
    let c = Cluster::new();
    let a = c.node("client-a", &[("post-op-delay-secs", "3600")]);
    let d = entry_gfid(a.call(mkdir_req(Gfid::ROOT, "d")).await);
    for round in 0..5 {
        let (fd, _) = create_in(&a, d, "x").await.expect("create x");
        a.write(fd, 0, format!("round {round}").as_bytes()).await.expect("write");
        a.close(fd).await;
        let (old, new) = (Loc::entry(d, "x"), Loc::entry(d, "y"));
        a.call(Fop::Rename { old, new, flags: 0 }).await.expect("rename x y");
        let (fd, _) = create_in(&a, d, "x").await.expect("create x again");
        a.close(fd).await;
        a.call(Fop::Unlink { loc: Loc::entry(d, "x"), flags: 0 }).await.expect("unlink x");
    }
    drain(&a).await;
    let b = c.node("client-b", &[]);
    let y = b.call(Fop::Lookup { loc: Loc::entry(d, "y") }).await.expect("y seen by b");
    let Reply::Entry { iatt, .. } = y.reply else { panic!() };
    let fd = b.open(iatt.gfid).await;
    assert_eq!(&b.read(fd, 0, 100).await.expect("read")[..], b"round 4");
    for i in 0..N {
        assert_eq!(names_on(&c, i, "d"), vec!["y".to_string()], "brick {i}");
    }
}

/// A readdirp asking for the entries' content gets it only where no copy
/// can be behind another: every child up and no child's index listing the
/// inode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readdirp_content_passes_only_from_copies_nobody_accuses() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("async-dirops", "off")]);
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    for name in ["f", "g"] {
        let (fd, _) = create_in(&n, d, name).await.expect("create");
        n.write(fd, 0, name.as_bytes()).await.expect("write");
        n.close(fd).await;
    }
    n.quiesce().await;
    let both = content_listing(&n, d).await;
    assert_eq!(both[0].as_deref(), Some(&b"f"[..]));
    assert_eq!(both[1].as_deref(), Some(&b"g"[..]));
    // f misses a write on child 2: the others' indices list it.
    let f = entry_gfid(n.call(Fop::Lookup { loc: Loc::entry(d, "f") }).await);
    let fd = n.open(f).await;
    n.down(2);
    n.write(fd, 0, b"F").await.expect("write with a child down");
    n.close(fd).await;
    n.quiesce().await;
    assert!(content_listing(&n, d).await.iter().all(Option::is_none), "a child down: nothing can be vetted");
    n.up(2);
    let after = content_listing(&n, d).await;
    assert_eq!(after[0], None, "f is listed in an index");
    assert_eq!(after[1].as_deref(), Some(&b"g"[..]), "g is clean");
}

/// The content a readdirp asking for it brings for "f" and "g" in `d`.
async fn content_listing(n: &Node, d: Gfid) -> [Option<Bytes>; 2] {
    use xlfs_sdk::dict::keys;
    let fd = Fd { id: n.fd_id(), gfid: d };
    n.call(Fop::Opendir { loc: Loc::gfid(d), fd: fd.id }).await.expect("opendir");
    let mut req = Request::new(Fop::Readdirp { fd, size: 64 << 10, offset: 0 });
    req.xdata.set_u64(keys::READDIRP_CONTENT, 1000);
    let rsp = n.afr.call(n.ctx.clone(), req).await.expect("readdirp");
    n.call(Fop::Releasedir { fd }).await.expect("releasedir");
    ["f", "g"].map(|name| rsp.xdata.get_bytes(&keys::dirent_xattr(name, keys::CONTENT)))
}

/// A name on one child only, with no counter anywhere (an entry fop under
/// a delegation whose client died after one child made it): index heal
/// cannot see it, the full crawl gives it to every child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_heal_gives_every_child_a_name_only_one_has() {
    use xlfs_sdk::dict::keys::GFID_REQ;
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let g = Gfid::random();
    let x = Dict::new().with(GFID_REQ, xlfs_sdk::Value::Gfid(g));
    let fop = Fop::Mknod { loc: Loc::entry(d, "stray"), mode: 0o100644, rdev: 0, umask: 0 };
    c.bricks[0].locks.call(CallCtx::root("dead-client"), Request::with_xdata(fop, x)).await.expect("mknod on brick 0");
    assert!(!c.bricks[1].dir.join("d/stray").exists());
    let mut run = Dict::new();
    run.set_bytes(heal::RUN_KEY, bytes::Bytes::from_static(b"full"));
    n.call(Fop::Setxattr { loc: Loc::root(), xattrs: run, flags: 0 }).await.expect("full heal");
    for i in 0..N {
        assert_eq!(c.gfid_on(i, "d/stray").as_deref(), Some(&g.0[..]), "stray on brick {i}");
    }
}

/// With quorum auto the volume says it is up once two of three children
/// are, so a mount that waited for it can write at once; with only one
/// child left to come, it says so once the others have said down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_is_announced_at_quorum_or_when_every_child_has_reported() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fresh = |name: &str| {
        Replicate::new(InitCtx {
            name: name.into(),
            options: opts(TYPE.options, &[("quorum-type", "auto")]),
            children: n.afr.inner.children.clone(),
            events: EventSink::new(),
        })
        .expect("replicate")
    };
    let v = fresh("v");
    assert_eq!(v.notify(Event::ChildUp, EventFrom::Child(0)), None, "one of three: no quorum yet");
    assert_eq!(v.notify(Event::ChildUp, EventFrom::Child(2)), Some(Event::ChildUp), "quorum");
    assert_eq!(v.notify(Event::ChildUp, EventFrom::Child(1)), None, "already up");
    let w = fresh("w");
    assert_eq!(w.notify(Event::ChildUp, EventFrom::Child(1)), None);
    assert_eq!(w.notify(Event::ChildDown, EventFrom::Child(0)), None, "child 2 has not said yet");
    assert_eq!(w.notify(Event::ChildDown, EventFrom::Child(2)), Some(Event::ChildUp), "all said: reads work");
    assert_eq!(w.notify(Event::ChildDown, EventFrom::Child(1)), Some(Event::ChildDown), "none up");
}
