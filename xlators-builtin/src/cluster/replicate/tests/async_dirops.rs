//! Tests of async dirops: entry fops answered early under a delegation.

use super::*;

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
    assert!(answered(&n) >= 25, "{:?}", n.afr.dump());
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

/// Operations answered early so far.
fn answered(n: &Node) -> u64 {
    n.dump("async-dirops.answered").parse().unwrap_or(0)
}

/// A child that holds every CREATE and UNLINK for a while and records how
/// many were in flight at once, and whether two ops on one name ever were.
struct Slow {
    inner: Arc<dyn Xlator>,
    st: parking_lot::Mutex<SlowState>,
}

#[derive(Default)]
struct SlowState {
    in_flight: Vec<String>,
    most: usize,
    same_name_overlap: bool,
}

impl Xlator for Slow {
    fn call(&self, ctx: CallCtx, req: Request) -> xlfs_sdk::FopFuture<'_> {
        let name = match &req.fop {
            Fop::Create { loc, .. } | Fop::Unlink { loc, .. } => loc.name.clone(),
            _ => return self.inner.call(ctx, req),
        };
        Box::pin(async move {
            {
                let mut s = self.st.lock();
                s.same_name_overlap |= s.in_flight.contains(&name);
                s.in_flight.push(name.clone());
                s.most = s.most.max(s.in_flight.len());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            let r = self.inner.call(ctx, req).await;
            let mut s = self.st.lock();
            if let Some(p) = s.in_flight.iter().position(|n| *n == name) {
                s.in_flight.remove(p);
            }
            r
        })
    }
}

/// Queued operations on different names overlap at the bricks; two on one
/// name are never in flight at once (a name with an operation queued is not
/// answered early again), and names in a directory made by an earlier one
/// land there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_operations_on_different_names_overlap_and_dependent_ones_wait() {
    let c = Cluster::new();
    let slow: Vec<Arc<Slow>> =
        c.bricks.iter().map(|b| Arc::new(Slow { inner: b.locks.clone(), st: Default::default() })).collect();
    let children = slow.iter().map(|s| s.clone() as Arc<dyn Xlator>).collect();
    let afr = Arc::new(replicate_over(children, &[("post-op-delay-secs", "3600")]));
    let n = Node {
        afr,
        stats: Vec::new(),
        gates: Vec::new(),
        ctx: CallCtx::root("client-a"),
        next_fd: std::sync::atomic::AtomicU64::new(1),
    };
    // A directory this client makes is delegated at once, its names known.
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let sub = entry_gfid(n.call(mkdir_req(d, "sub")).await);
    // (A release waits for its create: the fds are released at the end.)
    let mut fds = Vec::new();
    for k in 0..6 {
        fds.push(create_in(&n, d, &format!("f{k}")).await.expect("create").0);
    }
    fds.push(create_in(&n, sub, "inner").await.expect("create in the new subdirectory").0);
    for round in 0..3 {
        fds.push(create_in(&n, d, "x").await.expect("create x").0);
        n.call(Fop::Unlink { loc: Loc::entry(d, "x"), flags: 0 })
            .await
            .unwrap_or_else(|e| panic!("unlink {round}: {e}"));
    }
    assert!(answered(&n) >= 10, "{:?}", n.afr.dump());
    for fd in fds {
        n.call(Fop::Release { fd }).await.expect("release");
    }
    drain(&n).await;
    assert_eq!(n.dump("async-dirops.failed"), "0");
    let want: Vec<String> = (0..6).map(|k| format!("f{k}")).chain(["sub".to_string()]).collect();
    for (i, s) in slow.iter().enumerate() {
        let st = s.st.lock();
        assert!(st.most >= 2, "brick {i}: creates of different names overlapped (at most {} at once)", st.most);
        assert!(!st.same_name_overlap, "brick {i}: two operations on one name were in flight at once");
        assert_eq!(names_on(&c, i, "d"), want, "brick {i}");
        assert_eq!(names_on(&c, i, "d/sub"), vec!["inner".to_string()], "brick {i}");
    }
}

/// A child that panics on a CREATE of the name "boom" (a bug below
/// replicate), after yielding once.
struct Boom {
    inner: Arc<dyn Xlator>,
}

impl Xlator for Boom {
    fn call(&self, ctx: CallCtx, req: Request) -> xlfs_sdk::FopFuture<'_> {
        if !matches!(&req.fop, Fop::Create { loc, .. } if loc.name == "boom") {
            return self.inner.call(ctx, req);
        }
        Box::pin(async move {
            tokio::task::yield_now().await;
            panic!("boom: a bug in a child");
        })
    }
}

/// A queued operation that panics fails with EIO, reported on its inode,
/// and the queue goes on: later operations are answered and land, the
/// queue drains, and the directory's delegation can still be handed to
/// another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_operation_that_panics_fails_and_the_queue_goes_on() {
    let c = Cluster::new();
    let n = c.node_wrapped("client-a", &[("post-op-delay-secs", "3600")], &|i, inner| {
        if i == 0 { Arc::new(Boom { inner }) } else { inner }
    });
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let (bad, _) = create_in(&n, d, "boom").await.expect("answered early");
    assert_eq!(n.dump("async-dirops.answered"), "1", "{:?}", n.afr.dump());
    assert_eq!(promptly("fsync", n.fsync(bad)).await.map(drop), Err(Errno::EIO), "the panicked create's error");
    let mut fds = Vec::new();
    for k in 0..3 {
        fds.push(promptly("create after", create_in(&n, d, &format!("after{k}"))).await.expect("create after").0);
    }
    for fd in fds {
        promptly("close", n.close(fd)).await;
    }
    drain(&n).await;
    assert_eq!(n.dump("async-dirops.queued"), "0");
    assert_eq!(n.dump("async-dirops.failed"), "1");
    let after: Vec<String> = (0..3).map(|k| format!("after{k}")).collect();
    for i in 0..N {
        let names: Vec<String> = names_on(&c, i, "d").into_iter().filter(|n| n != "boom").collect();
        assert_eq!(names, after, "brick {i}");
    }
    // Another client's create in d needs this client's delegation back.
    let b = c.node("client-b", &[]);
    let (fd, _) = promptly("client b's create", create_in(&b, d, "from-b")).await.expect("client b creates in d");
    b.close(fd).await;
    for i in 0..N {
        assert!(names_on(&c, i, "d").contains(&"from-b".to_string()), "brick {i}");
    }
}

/// A child that holds every CREATE until `gate` gives a permit.
struct HeldCreates {
    inner: Arc<dyn Xlator>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Xlator for HeldCreates {
    fn call(&self, ctx: CallCtx, req: Request) -> xlfs_sdk::FopFuture<'_> {
        if !matches!(req.fop, Fop::Create { .. }) {
            return self.inner.call(ctx, req);
        }
        Box::pin(async move {
            self.gate.acquire().await.map_err(|_| Errno::EIO)?.forget();
            self.inner.call(ctx, req).await
        })
    }
}

/// A stamped setattr of a delegated directory (tar restoring a
/// directory's times and mode after extracting into it) is answered at
/// once with the attributes the bricks then give, shown by a listing of
/// its parent until it lands, and lands after the creates in the
/// directory answered before it: its mtime is the directory's in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_setattr_is_answered_early_and_lands_after_the_creates_in_it() {
    let c = Cluster::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let n = Arc::new(c.node_wrapped("client-a", &[("post-op-delay-secs", "3600")], &move |_, inner| {
        Arc::new(HeldCreates { inner, gate: g.clone() })
    }));
    gate.add_permits(3);
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let mut fds = Vec::new();
    for k in 0..4 {
        fds.push(create_in(&n, d, &format!("f{k}")).await.expect("answered early").0);
    }
    assert_eq!(n.dump("async-dirops.answered"), "4", "{:?}", n.afr.dump());
    let when = xlfs_sdk::Timespec { sec: 946_684_800, nsec: 0 };
    let stamp = xlfs_sdk::Timespec { sec: 1_700_000_000, nsec: 5 };
    let attr = xlfs_sdk::SetAttr { mode: Some(0o750), mtime: Some(xlfs_sdk::TimeSet::At(when)), ..Default::default() };
    let (pre, post) = stamped_setattr(&n, d, attr, stamp).await;
    assert_eq!(n.dump("async-dirops.answered"), "5", "answered while the creates wait: {:?}", n.afr.dump());
    assert_eq!((pre.gfid, post.gfid), (d, d));
    assert_eq!((post.mode, post.mtime, post.ctime), (libc::S_IFDIR | 0o750, when, stamp));
    assert_eq!((post.nlink, post.uid, post.gid), (pre.nlink, pre.uid, pre.gid));
    // The next one is taken into it (one transaction on the bricks); a
    // new owner after a mode is not (the order matters to set-id bits).
    let later = xlfs_sdk::Timespec { sec: 1_700_000_001, nsec: 0 };
    let atime = xlfs_sdk::SetAttr { atime: Some(xlfs_sdk::TimeSet::At(when)), ..Default::default() };
    let (_, post) = stamped_setattr(&n, d, atime, later).await;
    assert_eq!((post.mode, post.atime, post.mtime, post.ctime), (libc::S_IFDIR | 0o750, when, when, later));
    assert_eq!(n.dump("async-dirops.setattrs-merged"), "1", "{:?}", n.afr.dump());
    let chown = xlfs_sdk::SetAttr { uid: Some(1000), gid: Some(1000), ..Default::default() };
    let (_, post) = stamped_setattr(&n, d, chown, later).await;
    assert_eq!((post.uid, post.gid, post.mode), (1000, 1000, libc::S_IFDIR | 0o750));
    assert_eq!(n.dump("async-dirops.setattrs-merged"), "1", "{:?}", n.afr.dump());
    assert_eq!(n.dump("async-dirops.answered"), "7", "{:?}", n.afr.dump());
    // A listing and a lookup in the parent show what was answered, not
    // the bricks' old mode.
    let id = n.fd_id();
    n.call(Fop::Opendir { loc: Loc::gfid(Gfid::ROOT), fd: id }).await.expect("opendir");
    let fd = Fd { id, gfid: Gfid::ROOT };
    let listed = n.call(Fop::Readdirp { fd, size: 65536, offset: 0 }).await.expect("readdirp").reply;
    let Reply::Dirents(listed) = listed else { panic!("{listed:?}") };
    let shown = listed.iter().find(|e| e.name == "d").expect("d listed");
    assert_eq!((shown.iatt.mode, shown.iatt.mtime), (post.mode, when), "the listing shows the setattr answered");
    n.call(Fop::Releasedir { fd }).await.expect("releasedir");
    let Reply::Entry { iatt, .. } = n.lookup("d").await.expect("lookup").reply else { panic!("lookup") };
    assert_eq!((iatt.mode, iatt.mtime), (post.mode, when), "a lookup shows the setattr answered");
    gate.add_permits(1000);
    for fd in fds {
        n.close(fd).await;
    }
    drain(&n).await;
    assert_eq!(n.dump("async-dirops.failed"), "0");
    for i in 0..N {
        let m = std::fs::metadata(c.bricks[i].dir.join("d")).expect("d on the brick");
        use std::os::unix::fs::MetadataExt;
        assert_eq!((m.mtime(), m.atime(), m.mode()), (when.sec, when.sec, libc::S_IFDIR | 0o750), "d on brick {i}");
        assert_eq!((m.uid(), m.gid()), (1000, 1000), "d's owner on brick {i}");
        assert_eq!(names_on(&c, i, "d").len(), 4);
    }
}

/// A setattr of directory `d` stamped `stamp`, as features/utime does.
fn stamped(d: Gfid, attr: xlfs_sdk::SetAttr, stamp: xlfs_sdk::Timespec) -> Request {
    let mut req = Request::new(Fop::Setattr { loc: Loc::gfid(d), attr });
    req.xdata.set(xlfs_sdk::dict::keys::UTIME, xlfs_sdk::Value::U64(stamp.to_nanos()));
    req
}

/// [`stamped`], sent by `n`'s caller, answered with `(pre, post)`.
async fn stamped_setattr(n: &Node, d: Gfid, attr: xlfs_sdk::SetAttr, stamp: xlfs_sdk::Timespec) -> (Iatt, Iatt) {
    let r = promptly("setattr", n.afr.call(n.ctx.clone(), stamped(d, attr, stamp))).await.expect("setattr");
    match r.reply {
        Reply::PrePost { pre, post } => (pre, post),
        r => panic!("{r:?}"),
    }
}

/// A directory setattr whose outcome this client cannot tell (a non-owner
/// changing the mode, which a brick may refuse), or without a stamp, is
/// not answered early: it goes to the bricks and returns what they say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_setattr_that_may_fail_goes_to_the_bricks() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "3600")]);
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let (fd, _) = create_in(&n, d, "f").await.expect("create");
    n.close(fd).await;
    let answered = n.dump("async-dirops.answered");
    let chmod = xlfs_sdk::SetAttr { mode: Some(0o700), ..Default::default() };
    let stranger = CallCtx { uid: 4242, gid: 4242, ..n.ctx.clone() };
    // Whatever the bricks say to the stranger (the kernel checks before
    // them on a mount), it is their answer, not one made up here.
    let stamp = xlfs_sdk::Timespec { sec: 1_700_000_000, nsec: 0 };
    let _ = promptly("setattr", n.afr.call(stranger, stamped(d, chmod, stamp))).await;
    assert_eq!(n.dump("async-dirops.answered"), answered, "a stranger's chmod is not answered early");
    promptly("setattr", n.call(Fop::Setattr { loc: Loc::gfid(d), attr: chmod }))
        .await
        .expect("an unstamped chmod by root");
    assert_eq!(n.dump("async-dirops.answered"), answered, "nor one without a stamp");
    drain(&n).await;
    for i in 0..N {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(c.bricks[i].dir.join("d")).expect("d on the brick");
        assert_eq!(m.mode() & 0o7777, 0o700, "d on brick {i}");
    }
}

/// A directory made set-group-ID and given another group while this
/// client holds its delegation: a create answered early after that is
/// answered with the group the bricks give it (the directory's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_answered_early_takes_the_group_of_a_directory_changed_meanwhile() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "3600")]);
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let (fd, _) = create_in(&n, d, "before").await.expect("create");
    n.close(fd).await;
    let attr = xlfs_sdk::SetAttr { mode: Some(0o2775), gid: Some(100), ..Default::default() };
    n.call(Fop::Setattr { loc: Loc::gfid(d), attr }).await.expect("chgrp and g+s");
    let (fd, iatt) = create_in(&n, d, "after").await.expect("create");
    assert_eq!(n.dump("async-dirops.answered"), "2", "{:?}", n.afr.dump());
    assert_eq!(iatt.gid, 100, "the group answered");
    n.close(fd).await;
    drain(&n).await;
    for i in 0..N {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(c.bricks[i].dir.join("d/after")).expect("on the brick");
        assert_eq!(m.gid(), 100, "the group on brick {i}");
    }
}

/// `rm -r` of a tree this client holds: an rmdir of a delegated directory
/// whose names are all unlinked (answered early too) is answered at once
/// and lands after those unlinks; the parent keeps its delegation and
/// names. A directory with names left goes to the bricks (ENOTEMPTY), and a
/// create in a directory removed early fails as the bricks say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_directory_is_removed_early_after_the_unlinks_in_it() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "3600")]);
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let sub = entry_gfid(n.call(mkdir_req(d, "sub")).await);
    for k in 0..3 {
        let (fd, _) = create_in(&n, sub, &format!("f{k}")).await.expect("create");
        n.write(fd, 0, b"data").await.expect("write");
        n.call(Fop::Release { fd }).await.expect("release");
    }
    for k in 0..3 {
        n.call(Fop::Unlink { loc: Loc::entry(sub, format!("f{k}")), flags: 0 }).await.expect("unlink");
    }
    let before = answered(&n);
    let r = n.call(rmdir_req(d, "sub", sub)).await;
    assert!(r.is_ok(), "rmdir of the emptied directory: {r:?}");
    assert_eq!(answered(&n), before + 1, "answered early: {:?}", n.afr.dump());
    assert_eq!(n.call(Fop::Lookup { loc: Loc::entry(d, "sub") }).await.map(drop), Err(Errno::ENOENT));
    // The parent kept its delegation and names: its next entry fops are
    // answered early as well.
    let full = entry_gfid(n.call(mkdir_req(d, "full")).await);
    let (fd, _) = create_in(&n, full, "x").await.expect("create in full");
    n.call(Fop::Release { fd }).await.expect("release");
    assert_eq!(answered(&n), before + 3, "mkdir and create after the rmdir: {:?}", n.afr.dump());
    let r = n.call(rmdir_req(d, "full", full)).await;
    assert_eq!(r.map(drop), Err(Errno::ENOTEMPTY), "a directory with a name left");
    assert!(create_in(&n, sub, "late").await.is_err(), "a create in the removed directory");
    drain(&n).await;
    assert_eq!(n.dump("async-dirops.failed"), "0");
    for i in 0..N {
        assert_eq!(names_on(&c, i, "d"), vec!["full".to_string()], "brick {i}");
        assert_eq!(names_on(&c, i, "d/full"), vec!["x".to_string()], "brick {i}");
    }
}

/// An rmdir answered early that the bricks refuse (a name was put in the
/// directory behind the volume's back) is not silent: the next fsync of
/// its parent returns the error, and the directory is seen again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_early_rmdir_is_reported_by_the_parents_fsync() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("post-op-delay-secs", "3600")]);
    let d = entry_gfid(n.call(mkdir_req(Gfid::ROOT, "d")).await);
    let sub = entry_gfid(n.call(mkdir_req(d, "sub")).await);
    drain(&n).await;
    for b in &c.bricks {
        std::fs::write(b.dir.join("d/sub/stray"), b"behind").expect("write on the brick");
    }
    let before = answered(&n);
    let r = n.call(rmdir_req(d, "sub", sub)).await;
    assert!(r.is_ok(), "answered early: {r:?}");
    assert_eq!(answered(&n), before + 1);
    drain(&n).await;
    assert_eq!(n.dump("async-dirops.failed"), "1", "{:?}", n.afr.dump());
    let dfd = Fd { id: n.fd_id(), gfid: d };
    n.call(Fop::Opendir { loc: Loc::gfid(d), fd: dfd.id }).await.expect("opendir");
    assert_eq!(
        n.call(Fop::Fsyncdir { fd: dfd, datasync: false }).await.map(drop),
        Err(Errno::ENOTEMPTY),
        "fsyncdir reports it"
    );
    assert!(n.call(Fop::Lookup { loc: Loc::entry(d, "sub") }).await.is_ok(), "the directory is there again");
    for i in 0..N {
        assert_eq!(names_on(&c, i, "d/sub"), vec!["stray".to_string()], "brick {i}");
    }
}

/// A child that holds every OPENDIR for a while: the listing of a
/// delegation just taken takes that long.
struct SlowListing {
    inner: Arc<dyn Xlator>,
}

impl Xlator for SlowListing {
    fn call(&self, ctx: CallCtx, req: Request) -> xlfs_sdk::FopFuture<'_> {
        if !matches!(req.fop, Fop::Opendir { .. }) {
            return self.inner.call(ctx, req);
        }
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.inner.call(ctx, req).await
        })
    }
}

/// `rm -r` on a client that did not make the directory: the first unlink
/// takes the delegation (synchronously) and starts its listing; the next
/// ones wait for the listing and are answered early, instead of each
/// running synchronously while it is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlinks_wait_for_the_listing_of_a_delegation_just_taken() {
    let c = Cluster::new();
    let a = c.node("client-a", &[("post-op-delay-secs", "1")]);
    let d = entry_gfid(a.call(mkdir_req(Gfid::ROOT, "d")).await);
    for k in 0..4 {
        let (fd, _) = create_in(&a, d, &format!("f{k}")).await.expect("create");
        a.call(Fop::Release { fd }).await.expect("release");
    }
    drain(&a).await;
    // a returns its delegation of d once idle, so b takes it at once.
    xlfs_sdk::testing::until("a returns its delegation", Duration::from_secs(20), || {
        a.dump("entry-eager-lock.held") == "0"
    })
    .await;
    let b = c.node_wrapped("client-b", &[("post-op-delay-secs", "3600")], &|_, inner| Arc::new(SlowListing { inner }));
    for k in 0..4 {
        b.call(Fop::Unlink { loc: Loc::entry(d, format!("f{k}")), flags: 0 }).await.expect("unlink");
    }
    assert_eq!(answered(&b), 3, "every unlink after the first answered early: {:?}", b.afr.dump());
    drain(&b).await;
    assert_eq!(b.dump("async-dirops.failed"), "0");
    for i in 0..N {
        assert!(names_on(&c, i, "d").is_empty(), "brick {i}: {:?}", names_on(&c, i, "d"));
    }
}
