//! Tests of directory delegation (the entry eager lock).

use super::*;

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
    assert_eq!(n.dump("entry-eager-lock.known-names"), "11", "f11..f19, g10 and d");
    let lookups = |n: &Node| (0..N).map(|i| n.seen(i, &[FopKind::Lookup])).sum::<u64>();
    let before = lookups(&n);
    assert_eq!(n.lookup("f3").await.map(drop), Err(Errno::ENOENT), "unlinked");
    assert_eq!(n.lookup("never").await.map(drop), Err(Errno::ENOENT));
    assert_eq!(n.lookup("f10").await.map(drop), Err(Errno::ENOENT), "renamed away");
    assert_eq!(lookups(&n), before, "absent names answered without the bricks");
    assert_eq!(n.dump("entry-eager-lock.absent-hits"), "3");
    n.lookup("g10").await.expect("a name it has is looked up");
    assert_eq!(lookups(&n), before + N as u64);
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
    // This client holds both delegations: d's lock is the whole-directory
    // lock the rmdir needs and the root's covers the name, so the rmdir
    // takes no lock and only d's is given back after it.
    let before = n.entrylks();
    promptly("rmdir", n.call(rmdir_req(Gfid::ROOT, "d", d))).await.expect("rmdir");
    for _ in 0..2000 {
        if n.dump("entry-eager-lock.returned") == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(n.dump("entry-eager-lock.returned"), "1", "d's delegation returned: {:?}", n.afr.dump());
    assert_eq!(n.entrylks() - before, N as u64, "d's unlock only");
    assert_eq!(n.dump("entry-eager-lock.held"), "1", "the root's delegation kept");
    assert_eq!(n.dump("entry-eager-lock.known-names"), "10", "d's name gone, and d's own names with it");
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
async fn a_create_that_reached_one_copy_only_is_recorded_once_a_child_returns() {
    let c = Cluster::new();
    let n = c.node("client-a", &[("async-dirops", "off")]);
    let fd = n.create("ok").await.expect("create");
    n.close(fd).await;
    // The client is cut off as the create goes out: it reaches child 0
    // only, and nothing after it (the blame on the directory) reaches
    // anyone. No brick records that child 0 has a name the others lack.
    n.fail(0, &[FopKind::Xattrop], Errno::ENOTCONN);
    for i in 1..N {
        n.fail(i, &[FopKind::Create, FopKind::Xattrop], Errno::ENOTCONN);
    }
    n.create("partial").await.expect_err("one copy of three is no quorum");
    assert!(c.bricks[0].dir.join("partial").exists() && !c.bricks[1].dir.join("partial").exists());
    for i in 0..N {
        assert_eq!(c.pending(i, "", 1), [0, 0, 0], "nothing could be recorded yet");
    }
    // The links come back: a child says up, and the blame is written on the
    // copy that has the name, so heal will find it.
    for i in 0..N {
        n.heal_gate(i);
    }
    n.down(1);
    n.up(1);
    for _ in 0..500 {
        if c.pending(0, "", 1) == [0, 0, 1] && c.pending(0, "", 2) == [0, 0, 1] {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("brick 0 does not blame children 1 and 2: {:?} {:?}", c.pending(0, "", 1), c.pending(0, "", 2));
}
