//! Tests of quorum: refused writes apply nothing, a majority's error wins,
//! and when the volume is announced up or down.

use super::*;

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

/// With quorum auto the volume says it is up once two of three children
/// are, so a mount that waited for it can write at once; with only one
/// child left to come, it says so once the others have said down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_is_announced_at_quorum_or_when_every_child_has_reported() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fresh = |name: &str| {
        Replicate::new(ictx(name, TYPE.options, &[("quorum-type", "auto")], n.afr.inner.children.clone()))
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
