//! Tests of data transactions' eager lock: one lock and pre-op per window,
//! the post-op delay, the lock-contention policies, group commit and
//! durable sync writes.

use super::*;

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
async fn a_plugin_policy_is_consulted() {
    use xlfs_sdk::policy::Policies;
    use xlfs_sdk::policy::lock_contention::{Decision, LockContentionPolicy, LockEvent, LockView};
    struct EveryTxn;
    impl LockContentionPolicy for EveryTxn {
        fn name(&self) -> &str {
            "every-txn"
        }
        fn decide(&self, event: LockEvent, _: &LockView) -> Decision {
            if event == LockEvent::TxnEnd { Decision::ReleaseNow } else { Decision::Keep }
        }
    }
    let policies = Policies::default()
        .with_lock_contention("afrtest", Arc::new(|_: &str| Ok(Arc::new(EveryTxn) as Arc<dyn LockContentionPolicy>)));
    let c = Cluster::new();
    let n = c.node_with("client-a", &[("lock-contention-policy", "afrtest:every")], policies);
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
    assert!(n.dump("group-commit.syncfs").parse::<u64>().expect("count") >= 1, "{:?}", n.afr.dump());
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
    // Without it, the window's end syncs what it wrote: that file alone,
    // not the brick's whole file system.
    let fd = n.create("g").await.expect("create");
    n.write(fd, 0, b"plain").await.expect("write");
    n.close(fd).await;
    n.quiesce().await;
    for i in 0..N {
        assert_eq!(n.seen(i, &[FopKind::Fsync]), 1, "child {i}");
    }
    assert_eq!((n.dump("group-commit.file-syncs").as_str(), n.dump("group-commit.syncfs").as_str()), ("3", "0"));
}
