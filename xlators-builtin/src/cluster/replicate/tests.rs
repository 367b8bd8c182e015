//! cluster/replicate over three real bricks (storage/posix under
//! features/locks in temporary directories), each child reached through
//! debug/io-stats (to count fops) and a test gate that can take the child
//! down or make chosen fops fail. Two replicate nodes can share the same
//! bricks, as two clients of one volume.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, EventSink, Fd, FdId, Fop, FopKind, FopResult, Gfid, InitCtx, Loc,
    Options, Reply, Request, Xlator,
};

use super::pending::{self, Kind};
use super::*;
use crate::debug::io_stats::IoStats;
use xlfs_sdk::Iatt;
use xlfs_sdk::testing::{Faulty, init_named, xattr};

mod async_dirops;
mod eager_lock;
mod entry_lock;
mod quorum;
mod read;

struct Brick {
    dir: PathBuf,
    locks: Arc<dyn Xlator>,
    /// features/locks itself (`locks` is features/index over it).
    lock_server: Arc<dyn Xlator>,
    sink: EventSink,
}

struct Cluster {
    _tmp: tempfile::TempDir,
    bricks: Vec<Brick>,
}

struct Node {
    afr: Arc<Replicate>,
    stats: Vec<Arc<IoStats>>,
    gates: Vec<Arc<Faulty>>,
    ctx: CallCtx,
    next_fd: AtomicU64,
}

const N: usize = 3;

fn opts(decls: &[xlfs_sdk::OptionDecl], given: &[(&str, &str)]) -> Options {
    Options::resolve(decls, given.iter().copied()).expect("valid options")
}

/// The context of a node `name` of a translator with declarations `decls`.
fn ictx(name: &str, decls: &[xlfs_sdk::OptionDecl], given: &[(&str, &str)], children: Vec<Child>) -> InitCtx {
    init_named(name, decls, given, &children).0
}

impl Cluster {
    fn new() -> Cluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let bricks = (0..N)
            .map(|i| {
                let dir = tmp.path().join(format!("b{i}"));
                std::fs::create_dir(&dir).expect("brick dir");
                let d = dir.display().to_string();
                let posix = (crate::storage::posix::TYPE.build)(ictx(
                    &format!("posix-{i}"),
                    crate::storage::posix::TYPE.options,
                    &[("directory", &d)],
                    vec![],
                ))
                .expect("posix");
                let locks_ctx = ictx(
                    &format!("locks-{i}"),
                    crate::features::locks::TYPE.options,
                    &[("notify-contention-delay", "0")],
                    vec![Child { name: Arc::from(format!("posix-{i}")), xl: posix }],
                );
                let sink = locks_ctx.events.clone();
                let lock_server = (crate::features::locks::TYPE.build)(locks_ctx).expect("locks");
                // features/index above locks (in memory), as on a brick.
                let locks = (crate::features::index::TYPE.build)(ictx(
                    &format!("index-{i}"),
                    crate::features::index::TYPE.options,
                    &[],
                    vec![Child { name: Arc::from(format!("locks-{i}")), xl: lock_server.clone() }],
                ))
                .expect("index");
                Brick { dir, locks, lock_server, sink }
            })
            .collect();
        Cluster { _tmp: tmp, bricks }
    }

    /// Node `n` loses brick `i` as a real disconnect does: the child goes
    /// down for it, and the brick drops the locks that client held there
    /// (protocol/server's `ClientGone`). [`Node::down`] alone is a
    /// partition the brick does not see: its locks stay.
    fn disconnect(&self, n: &Node, i: usize) {
        n.down(i);
        let gone = Event::ClientGone { client_id: n.ctx.client_id.to_string() };
        self.bricks[i].lock_server.notify(gone, EventFrom::Graph);
    }

    /// A replicate node (a client) over the bricks, all children up.
    fn node(&self, client: &str, afr_opts: &[(&str, &str)]) -> Node {
        self.node_with(client, afr_opts, Default::default())
    }

    /// [`Cluster::node`] whose graph offers `policies`.
    fn node_with(&self, client: &str, afr_opts: &[(&str, &str)], policies: xlfs_sdk::policy::Policies) -> Node {
        self.build(client, afr_opts, policies, &|_, xl| xl)
    }

    /// [`Cluster::node`] with brick `i`'s translator wrapped by `wrap(i, ..)`.
    fn node_wrapped(&self, client: &str, afr_opts: &[(&str, &str)], wrap: &Wrap) -> Node {
        self.build(client, afr_opts, Default::default(), wrap)
    }

    fn build(
        &self,
        client: &str,
        afr_opts: &[(&str, &str)],
        policies: xlfs_sdk::policy::Policies,
        wrap: &Wrap,
    ) -> Node {
        let mut children = Vec::new();
        let mut stats = Vec::new();
        let mut gates = Vec::new();
        let mut links = Vec::new();
        for (i, b) in self.bricks.iter().enumerate() {
            let gate = Faulty::new(Child { name: Arc::from(format!("locks-{i}")), xl: wrap(i, b.locks.clone()) });
            let gate_sink = EventSink::new();
            let name = format!("test-client-{i}");
            let st_ctx = ictx(
                &name,
                crate::debug::io_stats::TYPE.options,
                &[],
                vec![Child { name: Arc::from(format!("gate-{i}")), xl: gate.clone() }],
            );
            let st_sink = st_ctx.events.clone();
            let st = Arc::new(IoStats::new(st_ctx).expect("io-stats"));
            let gate_dyn: Arc<dyn Xlator> = gate.clone();
            b.sink.attach_parent(Arc::downgrade(&gate_dyn), 0, gate_sink.clone());
            let st_dyn: Arc<dyn Xlator> = st.clone();
            gate_sink.attach_parent(Arc::downgrade(&st_dyn), 0, st_sink.clone());
            links.push(st_sink);
            children.push(Child { name: Arc::from(name), xl: st_dyn });
            stats.push(st);
            gates.push(gate);
        }
        let mut afr_ctx = ictx("test-afr", TYPE.options, afr_opts, children);
        afr_ctx.policies = policies;
        let afr_sink = afr_ctx.events.clone();
        let afr = Arc::new(Replicate::new(afr_ctx).expect("replicate"));
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

    /// The counters stored in xattr `key` of brick `i`'s copy of `path`
    /// (zeros when absent).
    fn stored(&self, i: usize, path: &str, key: &str) -> [i32; 3] {
        xattr(&self.bricks[i].dir.join(path), key).and_then(|v| pending::decode(&v)).unwrap_or([0; 3])
    }

    /// What brick `i`'s copy of `path` says of child `j`: the counters
    /// `trusted.afr.test-client-<j>` plus the dirty ones.
    fn pending(&self, i: usize, path: &str, j: usize) -> [i32; 3] {
        let (own, dirty) =
            (self.stored(i, path, &format!("trusted.afr.test-client-{j}")), self.stored(i, path, pending::DIRTY));
        std::array::from_fn(|x| own[x] + dirty[x])
    }

    fn gfid_on(&self, i: usize, path: &str) -> Option<Vec<u8>> {
        xattr(&self.bricks[i].dir.join(path), "trusted.gfid")
    }
}

/// What [`Cluster::node_wrapped`] puts around a brick's translator.
type Wrap = dyn Fn(usize, Arc<dyn Xlator>) -> Arc<dyn Xlator>;

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
        self.gates[i].set_down(true);
        self.afr.notify(Event::ChildDown, EventFrom::Child(i));
    }

    fn up(&self, i: usize) {
        self.gates[i].set_down(false);
        self.afr.notify(Event::ChildUp, EventFrom::Child(i));
    }

    fn fail(&self, i: usize, kinds: &[FopKind], e: Errno) {
        self.gates[i].fail(Some((kinds.to_vec(), e)));
    }

    fn heal_gate(&self, i: usize) {
        self.gates[i].fail(None);
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

    /// Asks for a heal through the root's virtual xattr `key`
    /// (`HEAL_RUN` index/full, `HEAL_GFID`), as `xlfs heal` does.
    async fn heal(&self, key: &str, value: impl Into<Bytes>) -> FopResult {
        let mut run = Dict::new();
        run.set_bytes(key, value.into());
        self.call(Fop::Setxattr { loc: Loc::root(), xattrs: run, flags: 0 }).await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_whose_caller_stops_waiting_runs_to_its_end() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new();
    let a = c.node("client-a", &[]);
    let fd = a.create("f").await.expect("create");
    a.close(fd).await;
    a.quiesce().await;
    // A second client whose children hold every fop until released.
    let gates: Vec<Arc<xlfs_sdk::testing::Gate>> =
        c.bricks.iter().map(|b| xlfs_sdk::testing::Gate::new(b.locks.clone())).collect();
    let b = replicate_over(gates.iter().map(|g| g.clone() as Arc<dyn Xlator>).collect(), &[]);
    let attr = xlfs_sdk::SetAttr { mode: Some(0o600), ..Default::default() };
    let req = Request::new(Fop::Setattr { loc: Loc::gfid(fd.gfid), attr });
    let mut call = b.call(CallCtx::root("client-b"), req);
    let held = Instant::now();
    while gates.iter().any(|g| g.held() == 0) {
        assert!(xlfs_sdk::testing::poll(call.as_mut()).is_pending(), "waits for its locks");
        assert!(held.elapsed() < Duration::from_secs(10), "the lock calls reach every child");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(call);
    gates.iter().for_each(|g| g.open());
    xlfs_sdk::testing::until("the setattr on every brick", Duration::from_secs(10), || {
        (0..N).all(|i| {
            std::fs::metadata(c.bricks[i].dir.join("f")).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o600)
        })
    })
    .await;
    // Its locks are given back: the other client's transaction goes through.
    let attr = xlfs_sdk::SetAttr { mode: Some(0o640), ..Default::default() };
    let again = a.call(Fop::Setattr { loc: Loc::gfid(fd.gfid), attr });
    tokio::time::timeout(Duration::from_secs(10), again).await.expect("not blocked by a lock left").expect("setattr");
    for i in 0..N {
        for j in 0..N {
            assert_eq!(c.pending(i, "f", j), [0, 0, 0], "brick {i} blames {j}");
        }
    }
}

/// A replicate node (options `afr_opts`) over `children` (wrappers of the
/// bricks, in brick order), all up.
fn replicate_over(children: Vec<Arc<dyn Xlator>>, afr_opts: &[(&str, &str)]) -> Replicate {
    let children =
        children.into_iter().enumerate().map(|(i, xl)| Child { name: Arc::from(format!("test-client-{i}")), xl });
    let afr = Replicate::new(ictx("test-afr", TYPE.options, afr_opts, children.collect())).expect("replicate");
    for i in 0..N {
        afr.notify(Event::ChildUp, EventFrom::Child(i));
    }
    afr
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
            // The pre-op and post-op wrote the dirty counter only.
            let p = c.bricks[i].dir.join("f");
            assert!(xattr(&p, &format!("trusted.afr.test-client-{j}")).is_none(), "brick {i}: no counter of child {j}");
        }
        let dirty = xattr(&c.bricks[i].dir.join("f"), pending::DIRTY).and_then(|v| pending::decode(&v));
        assert_eq!(dirty, Some([0, 0, 0]), "brick {i}: the dirty counter raised and lowered");
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
    // A write that fails on child 2 blames it under the name given.
    n.fail(2, &[FopKind::Writev], Errno::ENOSPC);
    n.write(fd, 0, b"x").await.expect("write");
    n.heal_gate(2);
    n.fsync(fd).await.expect("fsync");
    n.quiesce().await;
    for i in 0..N {
        let v = xattr(&c.bricks[i].dir.join("f"), "trusted.afr.rep3-client-2").and_then(|v| pending::decode(&v));
        assert_eq!(v, Some([1, 0, 0]), "brick {i}: named by afr-pending-xattr");
    }
    n.close(fd).await;
    assert!(Options::resolve(TYPE.options, [("afr-pending-xattr", "a,b")]).is_ok());
    let bad = Replicate::new(ictx("x", TYPE.options, &[("afr-pending-xattr", "a,b")], n.afr.inner.children.clone()));
    assert!(bad.err().expect("wrong count").to_string().contains("names 2 children"));
    let bad =
        Replicate::new(ictx("x", TYPE.options, &[("afr-pending-xattr", "a,dirty,c")], n.afr.inner.children.clone()));
    assert!(bad.err().expect("the dirty counter's name").to_string().contains("'dirty' would be AFR's dirty counter"));
    let bad = Replicate::new(ictx(
        "x",
        TYPE.options,
        &[("lock-contention-policy", "sometimes")],
        n.afr.inner.children.clone(),
    ));
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
        let _ = xlfs_sdk::testing::poll(fut.as_mut());
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

/// An rmdir of `name` in `parent`, naming the directory's gfid as the
/// kernel does.
fn rmdir_req(parent: Gfid, name: &str, gfid: Gfid) -> Fop {
    Fop::Rmdir { loc: Loc { gfid, parent, name: name.into() }, flags: 0 }
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
    n.heal(xlfs_sdk::dict::keys::HEAL_RUN, bytes::Bytes::from_static(b"full")).await.expect("full heal");
    for i in 0..N {
        assert_eq!(c.gfid_on(i, "d/stray").as_deref(), Some(&g.0[..]), "stray on brick {i}");
    }
}

/// Distribute's link target removed while a child was down (a migration's
/// last step): heal removes it there too, or that copy stays a link file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_removes_a_dht_xattr_the_source_no_longer_has() {
    const LINKTO: &str = "trusted.glusterfs.dht.linkto";
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.close(fd).await;
    let mut x = Dict::new();
    x.set_bytes(LINKTO, bytes::Bytes::from_static(b"vol-replicate-0\0"));
    n.call(Fop::Setxattr { loc: Loc::gfid(fd.gfid), xattrs: x, flags: 0 }).await.expect("setxattr");
    assert!((0..N).all(|i| xattr(&c.bricks[i].dir.join("f"), LINKTO).is_some()));
    n.down(0);
    n.call(Fop::Removexattr { loc: Loc::gfid(fd.gfid), name: LINKTO.into() }).await.expect("removexattr");
    n.up(0);
    assert!(xattr(&c.bricks[0].dir.join("f"), LINKTO).is_some(), "child 0 missed the removal");
    n.heal(xlfs_sdk::dict::keys::HEAL_RUN, bytes::Bytes::from_static(b"index")).await.expect("heal");
    for i in 0..N {
        assert_eq!(xattr(&c.bricks[i].dir.join("f"), LINKTO), None, "the link target on brick {i}");
    }
}

/// Heal of a copy blamed by the others while their dirty counters are
/// raised too (a later transaction whose client died before its post-op)
/// leaves every counter at zero as stored, the dirty one included: the
/// reset lowers the dirty counter itself rather than offsetting it with
/// the children's (which would read as clean but keep the index listing
/// the inode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_resets_the_dirty_counter_and_the_blame_as_stored() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.down(2);
    n.write(fd, 0, b"after").await.expect("write");
    n.close(fd).await;
    n.quiesce().await;
    n.up(2);
    for i in 0..2 {
        assert_eq!(c.pending(i, "f", 2), [1, 0, 0], "brick {i} blames child 2");
        xlfs_sdk::testing::set_xattr(&c.bricks[i].dir.join("f"), pending::DIRTY, &pending::encode([1, 0, 0]))
            .expect("raise dirty");
    }
    n.heal(xlfs_sdk::dict::keys::HEAL_GFID, bytes::Bytes::from(fd.gfid.to_string())).await.expect("heal");
    assert_eq!(c.read(2, "f"), b"after", "child 2 healed from the others");
    for i in 0..N {
        assert_eq!(c.stored(i, "f", pending::DIRTY), [0; 3], "brick {i}: dirty");
        for j in 0..N {
            let own = c.stored(i, "f", &format!("trusted.afr.test-client-{j}"));
            assert_eq!(own, [0; 3], "brick {i}: counter of child {j}");
        }
    }
}

/// A copy healed after missing a stamped write shows the source's times
/// (storage/posix keeps the stamp the heal passes on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healed_copy_shows_the_sources_times() {
    use xlfs_sdk::dict::keys::UTIME;
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.down(0);
    let t = xlfs_sdk::Timespec { sec: 1_600_000_000, nsec: 42 };
    let w = Fop::Writev { fd, data: Bytes::from_static(b"data"), offset: 0, flags: 0 };
    let x = Dict::new().with(UTIME, xlfs_sdk::Value::U64(t.to_nanos()));
    n.afr.call(n.ctx.clone(), Request::with_xdata(w, x)).await.expect("stamped write");
    n.close(fd).await;
    n.up(0);
    n.heal(xlfs_sdk::dict::keys::HEAL_RUN, bytes::Bytes::from_static(b"index")).await.expect("heal");
    for i in 0..N {
        let st = c.bricks[i].locks.call(CallCtx::root("t"), Request::new(Fop::Stat { loc: Loc::gfid(fd.gfid) })).await;
        let Reply::Attr(ia) = st.expect("stat").reply else { panic!("attr") };
        assert_eq!((ia.mtime, ia.ctime, ia.size), (t, t, 4), "brick {i}");
    }
}

/// Heal keeps a sparse file sparse: the holes of the source are not
/// written as zeros on a sink that lacked the file, nor where a sink has
/// zeros already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_keeps_holes_as_holes() {
    use std::os::unix::fs::MetadataExt;
    const MIB: u64 = 1 << 20;
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.down(0);
    n.write(fd, 4 * MIB, &[b'x'; 4096]).await.expect("write");
    n.write(fd, 12 * MIB, &[b'y'; 4096]).await.expect("write");
    n.close(fd).await;
    n.up(0);
    n.heal(xlfs_sdk::dict::keys::HEAL_RUN, bytes::Bytes::from_static(b"index")).await.expect("heal");
    let (src, healed) = (c.bricks[1].dir.join("f"), c.bricks[0].dir.join("f"));
    assert!(std::fs::read(&healed).expect("healed copy") == std::fs::read(&src).expect("source"));
    let h = std::fs::metadata(&healed).expect("healed");
    assert_eq!(h.len(), 12 * MIB + 4096);
    // Two islands in 128 KiB heal blocks (and the file system's rounding),
    // not 12 MiB of zeros.
    assert!(h.blocks() * 512 <= 512 << 10, "{} bytes allocated of {}", h.blocks() * 512, h.len());
}

/// A file truncated while a child was away (after a write and fsync whose
/// eager lock that child still held when it went) is healed by the same
/// node: the disconnect frees the child's locks, as a brick does for a
/// client gone, so the heal's own lock is granted. (With a partition the
/// brick never sees, the stale lock kept the heal waiting forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_truncated_while_a_child_was_away_is_healed() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, &[b'x'; 300_000]).await.expect("write");
    n.fsync(fd).await.expect("fsync");
    c.disconnect(&n, 0);
    n.call(Fop::Ftruncate { fd, offset: 1000 }).await.expect("ftruncate");
    n.close(fd).await;
    n.up(0);
    promptly("heal", n.heal(xlfs_sdk::dict::keys::HEAL_RUN, bytes::Bytes::from_static(b"index"))).await.expect("heal");
    for i in 0..N {
        let data = std::fs::read(c.bricks[i].dir.join("f")).expect("copy");
        assert!(data.len() == 1000 && data.iter().all(|b| *b == b'x'), "brick {i}: {} bytes", data.len());
    }
}

/// A child whose answer to a CREATE of the name "lost" never arrives: the
/// connection goes while it is out (ENOTCONN), after the brick made the
/// file when `runs`, before it when not.
struct LostReply {
    inner: Arc<dyn Xlator>,
    runs: bool,
}

impl Xlator for LostReply {
    fn call(&self, ctx: CallCtx, req: Request) -> xlfs_sdk::FopFuture<'_> {
        if !matches!(&req.fop, Fop::Create { loc, .. } if loc.name == "lost") {
            return self.inner.call(ctx, req);
        }
        Box::pin(async move {
            if self.runs {
                self.inner.call(ctx, req).await?;
            }
            Err(Errno::ENOTCONN)
        })
    }
}

/// An entry fop that every child failed, some by losing the connection
/// after they had run it, is not taken for one that changed nothing: the
/// directory is marked, and index heal gives the name to every copy (the
/// copies agree again, whichever way). Through each entry path: a
/// transaction of its own, one under a delegation, one answered early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_replies_were_all_lost_is_healed_everywhere() {
    for (how, opts) in [
        ("own transaction", &[("entry-eager-lock", "off")][..]),
        ("delegation", &[("async-dirops", "off")][..]),
        ("answered early", &[("post-op-delay-secs", "3600")][..]),
    ] {
        let c = Cluster::new();
        let n = c.node_wrapped("client-a", opts, &|i, inner| Arc::new(LostReply { inner, runs: i < 2 }));
        let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
        let r = match create_in(&n, d, "lost").await {
            Ok((fd, _)) => n.fsync(fd).await.map(drop),
            Err(e) => Err(e),
        };
        assert_eq!(r, Err(Errno::ENOTCONN), "{how}: the create fails");
        drain(&n).await;
        assert!(c.bricks[0].dir.join("d/lost").exists() && !c.bricks[2].dir.join("d/lost").exists(), "{how}");
        n.heal(xlfs_sdk::dict::keys::HEAL_RUN, bytes::Bytes::from_static(b"index")).await.expect("heal");
        let g = c.gfid_on(0, "d/lost");
        for i in 0..N {
            assert_eq!(c.gfid_on(i, "d/lost"), g, "{how}: lost on brick {i}");
            for j in 0..N {
                assert_eq!(c.pending(i, "d", j), [0; 3], "{how}: counters of d on brick {i}");
            }
            // Reset as written: the dirty counter lowered, not offset by the children's.
            assert_eq!(c.stored(i, "d", pending::DIRTY), [0; 3], "{how}: dirty counter of d on brick {i}");
        }
    }
}
