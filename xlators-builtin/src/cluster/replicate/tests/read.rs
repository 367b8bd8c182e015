//! Tests of reads: one child read and failed over, and the content a
//! lookup or readdirp passes up only from copies nobody accuses.

use super::*;

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
async fn a_copy_known_stale_is_not_read_when_the_recheck_fails() {
    let c = Cluster::new();
    let (n, fd) = child_2_missed_a_write(&c).await;
    // Child 2 (the preferred one) comes back; the lookup that would look
    // at the copies again fails everywhere. What was known still holds.
    n.up(2);
    for i in 0..N {
        n.fail(i, &[FopKind::Lookup], Errno::EIO);
    }
    assert_eq!(n.read(fd, 0, 3).await.expect("read"), Bytes::from_static(b"two"));
    assert_eq!(n.seen(2, &[FopKind::Readv]), 0, "no read from the stale child");
    n.close(fd).await;
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
        let p = c.bricks[i].dir.join("f");
        for j in 0..N {
            let v = pending::encode(if j == (i + 1) % N { [1, 0, 0] } else { [0, 0, 0] });
            xlfs_sdk::testing::set_xattr(&p, &format!("trusted.afr.test-client-{j}"), &v)
                .unwrap_or_else(|e| panic!("set pending on brick {i}: {e}"));
        }
    }
    let r = lookup(ask).await.expect("lookup answers in split-brain");
    assert!(!r.xdata.contains(CONTENT), "no content from a split-brain: {:?}", r.xdata.keys().collect::<Vec<_>>());
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

/// The attributes a readdirp brings come from the child listing the
/// directory. When that child missed writes (it was down; a heal will
/// rebuild it), a client that had not looked the file up gets the size
/// a good copy has, not the stale one's (seen through FUSE after a
/// partition: a file read back short). With every copy clean again, the
/// listing's attributes pass as they are, with no lookup of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_from_a_child_that_missed_writes_shows_the_good_size() {
    let c = Cluster::new();
    let (n, fd) = child_2_missed_a_write(&c).await;
    n.write(fd, 0, b"two, and longer").await.expect("write with a child down");
    n.fsync(fd).await.expect("fsync");
    n.close(fd).await;
    n.up(2);
    // Another client, listing from child 2, never looked f up.
    let b = c.node("client-b", &[("read-subvolume-index", "2")]);
    promptly("root lookup", b.call(Fop::Lookup { loc: Loc::root() })).await.expect("root");
    assert!(b.afr.inner.need_heal(), "the bricks' indices list f");
    assert_eq!(promptly("listing b", size_listed(&b)).await, 15, "client b: the good copies' size");
    assert_eq!(b.seen(2, &[FopKind::Readdirp]), 1, "listed from child 2");
    assert_eq!(promptly("listing a", size_listed(&n)).await, 15, "client a, which knows child 2 is stale");
    n.close(n.create("g").await.expect("create")).await;
}

/// With every copy clean (every brick's heal index empty), a listing's
/// attributes pass as they are, with no lookup of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_a_clean_volume_is_taken_as_it_is() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fd = n.create("f").await.expect("create");
    n.write(fd, 0, b"fifteen bytes!!").await.expect("write");
    n.close(fd).await;
    n.quiesce().await;
    let b = c.node("client-b", &[("read-subvolume-index", "2")]);
    assert!(b.afr.inner.need_heal(), "not known clean before a lookup");
    promptly("root lookup", b.call(Fop::Lookup { loc: Loc::root() })).await.expect("root");
    assert!(!b.afr.inner.need_heal(), "clean: every index is empty");
    let lookups = b.seen(2, &[FopKind::Lookup]);
    assert_eq!(promptly("listing", size_listed(&b)).await, 15);
    assert_eq!(b.seen(2, &[FopKind::Lookup]), lookups, "no lookup of the listed entries");
    // A child going down makes the volume one that may need heal again.
    b.down(0);
    assert!(b.afr.inner.need_heal());
}

/// The size readdirp of the root lists for "f".
async fn size_listed(node: &Node) -> u64 {
    let fd = Fd { id: node.fd_id(), gfid: Gfid::ROOT };
    node.call(Fop::Opendir { loc: Loc::gfid(Gfid::ROOT), fd: fd.id }).await.expect("opendir");
    let rsp = node.call(Fop::Readdirp { fd, size: 64 << 10, offset: 0 }).await.expect("readdirp");
    node.call(Fop::Releasedir { fd }).await.expect("releasedir");
    let entries = rsp.reply.into_dirents().expect("dirents");
    entries.iter().find(|e| e.name == "f").map(|e| e.iatt.size).expect("f listed")
}

/// Another client's rename of `from` over `to`, done so far on `child`
/// only: its entry lock on `to` (held by `holder`, as replicate's own lock
/// is) and the rename on that brick.
async fn rename_on_one_child(c: &Cluster, holder: &CallCtx, child: usize, from: &str, to: &str, lock: bool) {
    let entrylk = |cmd| {
        Request::new(Fop::Entrylk {
            domain: "test-afr".into(),
            loc: Loc::gfid(Gfid::ROOT),
            name: to.into(),
            cmd,
            ty: xlfs_sdk::EntrylkType::Write,
        })
    };
    if lock {
        for b in &c.bricks {
            b.locks.call(holder.clone(), entrylk(xlfs_sdk::EntrylkCmd::Lock)).await.expect("entrylk");
        }
    }
    let rename = Fop::Rename { old: Loc::entry(Gfid::ROOT, from), new: Loc::entry(Gfid::ROOT, to), flags: 0 };
    c.bricks[child].locks.call(holder.clone(), Request::new(rename)).await.expect("rename on one child");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_caught_mid_rename_between_children_waits_for_the_rename() {
    let c = Cluster::new();
    let a = c.node("client-a", &[]);
    let mut gfid = std::collections::HashMap::new();
    for name in ["f", "g", "h", "k"] {
        let fd = a.create(name).await.expect("create");
        a.close(fd).await;
        gfid.insert(name, fd.gfid);
    }
    // Child 1 has g's file under the name f, children 0 and 2 still f's.
    let holder = CallCtx::root("client-c").with_lk_owner(77);
    rename_on_one_child(&c, &holder, 1, "g", "f", true).await;
    let b = c.node("client-b", &[]);
    let look = tokio::spawn(async move { entry_gfid(b.lookup("f").await) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!look.is_finished(), "the lookup waits for the rename's entry lock instead of failing");
    // The rename ends on the other children, and its lock is let go.
    for i in [0, 2] {
        let rename = Fop::Rename { old: Loc::entry(Gfid::ROOT, "g"), new: Loc::entry(Gfid::ROOT, "f"), flags: 0 };
        c.bricks[i].locks.call(holder.clone(), Request::new(rename)).await.expect("rename");
    }
    for br in &c.bricks {
        let unlock = Fop::Entrylk {
            domain: "test-afr".into(),
            loc: Loc::gfid(Gfid::ROOT),
            name: "f".into(),
            cmd: xlfs_sdk::EntrylkCmd::Unlock,
            ty: xlfs_sdk::EntrylkType::Write,
        };
        br.locks.call(holder.clone(), Request::new(unlock)).await.expect("unlock");
    }
    let got = promptly("the lookup after the rename", look).await.expect("lookup task");
    assert_eq!(got, gfid["g"], "f is g's file everywhere now");
    // A disagreement nobody's lock explains is a gfid split-brain: EIO.
    rename_on_one_child(&c, &holder, 1, "k", "h", false).await;
    let n = c.node("client-d", &[]);
    assert_eq!(n.lookup("h").await.err(), Some(Errno::EIO));
}

/// Records, per brick, the directory fd fops (opendir, fsyncdir,
/// releasedir) it sees, with their fd ids: replicate's own background work
/// (a delegation's listing) opens directories too.
struct DirFds {
    inner: Arc<dyn Xlator>,
    seen: DirFdLog,
}

/// What a [`DirFds`] saw: (fop, fd id).
type DirFdLog = Arc<parking_lot::Mutex<Vec<(FopKind, u64)>>>;

impl Xlator for DirFds {
    fn call(&self, ctx: CallCtx, req: Request) -> xlfs_sdk::FopFuture<'_> {
        let id = match &req.fop {
            Fop::Opendir { fd, .. } => Some(fd.0),
            Fop::Fsyncdir { fd, .. } | Fop::Releasedir { fd } => Some(fd.id.0),
            _ => None,
        };
        if let Some(id) = id {
            self.seen.lock().push((req.fop.kind(), id));
        }
        self.inner.call(ctx, req)
    }
}

/// A directory is opened on the child its listing comes from only;
/// fsyncdir opens it on the others and reaches every child; releasedir
/// goes where it is open; a listing whose child went down fails over to
/// another child, opening the fd there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_is_opened_where_it_is_listed() {
    let c = Cluster::new();
    let logs: Vec<DirFdLog> = (0..N).map(|_| Arc::default()).collect();
    let wrapped = logs.clone();
    let n = c.node_wrapped("client-a", &[("read-subvolume-index", "1")], &move |i, inner| {
        Arc::new(DirFds { inner, seen: wrapped[i].clone() })
    });
    n.close(n.create("f").await.expect("create")).await;
    // Calls of `kind` with fd `id` each child saw.
    let seen = |kind: FopKind, id: FdId| -> Vec<usize> {
        logs.iter().map(|l| l.lock().iter().filter(|(k, i)| *k == kind && *i == id.0).count()).collect()
    };
    let dfd = Fd { id: n.fd_id(), gfid: Gfid::ROOT };
    n.call(Fop::Opendir { loc: Loc::gfid(Gfid::ROOT), fd: dfd.id }).await.expect("opendir");
    let r = n.call(Fop::Readdirp { fd: dfd, size: 64 << 10, offset: 0 }).await.expect("readdirp");
    assert!(r.reply.into_dirents().expect("dirents").iter().any(|e| e.name == "f"));
    assert_eq!(seen(FopKind::Opendir, dfd.id), [0, 1, 0], "opened on the listing child only");
    n.call(Fop::Fsyncdir { fd: dfd, datasync: false }).await.expect("fsyncdir");
    assert_eq!(seen(FopKind::Fsyncdir, dfd.id), [1, 1, 1], "fsyncdir reaches every child");
    assert_eq!(seen(FopKind::Opendir, dfd.id), [1, 1, 1], "opened where fsyncdir needed it");
    n.call(Fop::Releasedir { fd: dfd }).await.expect("releasedir");
    assert_eq!(seen(FopKind::Releasedir, dfd.id), [1, 1, 1]);
    // The listing child goes down after the open: another child lists.
    let dfd = Fd { id: n.fd_id(), gfid: Gfid::ROOT };
    n.call(Fop::Opendir { loc: Loc::gfid(Gfid::ROOT), fd: dfd.id }).await.expect("opendir");
    n.down(1);
    let r = n.call(Fop::Readdirp { fd: dfd, size: 64 << 10, offset: 0 }).await.expect("readdirp fails over");
    assert!(r.reply.into_dirents().expect("dirents").iter().any(|e| e.name == "f"));
    let opened = seen(FopKind::Opendir, dfd.id);
    assert_eq!((opened[1], opened[0] + opened[2]), (1, 1), "opened on one other child for the listing: {opened:?}");
    n.up(1);
    n.call(Fop::Releasedir { fd: dfd }).await.expect("releasedir");
    assert_eq!(seen(FopKind::Releasedir, dfd.id), opened, "released where it was opened");
}
