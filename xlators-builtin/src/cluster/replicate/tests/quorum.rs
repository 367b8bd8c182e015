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

/// The volume says it is up once every child has said up or down and one
/// is up; a child that says nothing is waited for `UP_GRACE` once the
/// others make a quorum (with quorum auto, two of three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_is_announced_when_every_child_has_reported_or_after_a_grace_at_quorum() {
    let c = Cluster::new();
    let n = c.node("client-a", &[]);
    let fresh = |name: &str| {
        let ctx = ictx(name, TYPE.options, &[("quorum-type", "auto")], n.afr.inner.children.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        ctx.events.set_hook(move |e| {
            let _ = tx.lock().expect("hook").send(e.clone());
        });
        (Replicate::new(ctx).expect("replicate"), rx)
    };
    let (v, v_sent) = fresh("v");
    assert_eq!(v.notify(Event::ChildUp, EventFrom::Child(0)), None, "one of three: no quorum yet");
    assert_eq!(v.notify(Event::ChildUp, EventFrom::Child(2)), None, "quorum, child 1 not heard from");
    assert_eq!(v.notify(Event::ChildUp, EventFrom::Child(1)), Some(Event::ChildUp), "all up");
    let w = fresh("w").0;
    assert_eq!(w.notify(Event::ChildUp, EventFrom::Child(1)), None);
    assert_eq!(w.notify(Event::ChildDown, EventFrom::Child(0)), None, "child 2 has not said yet");
    assert_eq!(w.notify(Event::ChildDown, EventFrom::Child(2)), Some(Event::ChildUp), "all said: reads work");
    assert_eq!(w.notify(Event::ChildDown, EventFrom::Child(1)), Some(Event::ChildDown), "none up");
    // Child 1 never says: up after the grace, once.
    let (x, x_sent) = fresh("x");
    assert_eq!(x.notify(Event::ChildUp, EventFrom::Child(0)), None);
    assert_eq!(x.notify(Event::ChildUp, EventFrom::Child(2)), None, "quorum: the grace starts");
    let wait = UP_GRACE * 5;
    assert_eq!(x_sent.recv_timeout(wait), Ok(Event::ChildUp), "up without child 1 after the grace");
    assert_eq!(x.notify(Event::ChildUp, EventFrom::Child(1)), None, "already up");
    // v's grace ended after v was up: nothing more is said.
    std::thread::sleep(UP_GRACE / 4);
    assert!(v_sent.try_recv().is_err(), "v said up through the sink: {:?}", v_sent.try_recv());
}
