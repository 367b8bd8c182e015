//! cluster/replicate end to end, in process: three bricks (storage/posix ->
//! features/locks -> debug/io-stats) under cluster/replicate, built from a
//! volfile with the options GlusterFS generates for a replica 3 client, and
//! driven through the client API. The foundation workload runs over it and
//! every brick must then hold the same tree; a pgbench-like workload shows
//! the lock and xattrop fops per lock-contention policy in io-stats.

#[allow(dead_code)]
#[path = "kit/workload.rs"]
mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

use xlfs_runtime::client::Client;
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;

const BRICKS: usize = 3;

fn volfile(bricks: &[PathBuf], afr_options: &[(&str, &str)]) -> String {
    let mut v = String::new();
    for (i, b) in bricks.iter().enumerate() {
        v += &format!(
            "volume rep3-posix-{i}\n    type storage/posix\n    option directory {}\nend-volume\n\n\
             volume rep3-locks-{i}\n    type features/locks\n    subvolumes rep3-posix-{i}\nend-volume\n\n\
             volume rep3-client-{i}\n    type debug/io-stats\n    subvolumes rep3-locks-{i}\nend-volume\n\n",
            b.display()
        );
    }
    v += "volume rep3-replicate-0\n    type cluster/replicate\n";
    // What GlusterFS 10 writes for a replica 3 client (fixtures/gluster-volfiles/replica3-client.vol).
    for (k, val) in [
        ("use-anonymous-inode", "yes"),
        ("use-compound-fops", "off"),
        ("granular-entry-heal", "on"),
        ("volume-id", "76b60fc5-d0c8-4fd8-9174-bf87139f7df3"),
        ("afr-pending-xattr", "rep3-client-0,rep3-client-1,rep3-client-2"),
    ]
    .iter()
    .chain(afr_options)
    {
        v += &format!("    option {k} {val}\n");
    }
    v += "    subvolumes rep3-client-0 rep3-client-1 rep3-client-2\nend-volume\n\n";
    v += "volume rep3\n    type debug/io-stats\n    subvolumes rep3-replicate-0\nend-volume\n";
    v
}

struct Setup {
    _tmp: tempfile::TempDir,
    bricks: Vec<PathBuf>,
    graph: Graph,
}

async fn setup(afr_options: &[(&str, &str)]) -> Setup {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bricks: Vec<PathBuf> = (0..BRICKS).map(|i| tmp.path().join(format!("b{i}"))).collect();
    for b in &bricks {
        std::fs::create_dir(b).expect("brick dir");
    }
    let graph =
        Graph::from_str(&volfile(&bricks, afr_options), "replica3.vol", &Registry::builtin()).expect("graph builds");
    graph.activate();
    graph.wait_up(Duration::from_secs(10)).await.expect("graph comes up");
    Setup { _tmp: tmp, bricks, graph }
}

use workload::brick_tree as tree;
use workload::{dump_value, quiesce};

fn pending(path: &Path, j: usize) -> [i32; 3] {
    workload::afr_counters(path, &format!("trusted.afr.rep3-client-{j}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foundation_workload_over_replica3_leaves_identical_bricks() {
    let s = setup(&[]).await;
    let c = Client::new(s.graph.top());
    workload::client_api(&c, &s.graph, &s.bricks[0]).await;
    quiesce(&s.graph).await;
    let want = tree(&s.bricks[0]);
    assert!(want.len() > 5, "{want:?}");
    for b in &s.bricks[1..] {
        assert_eq!(tree(b), want, "names on {}", b.display());
        for rel in &want {
            let (p0, p) = (s.bricks[0].join(rel), b.join(rel));
            let (m0, m) = (p0.symlink_metadata().expect("lstat"), p.symlink_metadata().expect("lstat"));
            assert_eq!(m0.file_type(), m.file_type(), "{}", rel.display());
            assert_eq!(
                xlfs_sdk::testing::xattr(&p0, "trusted.gfid"),
                xlfs_sdk::testing::xattr(&p, "trusted.gfid"),
                "gfid of {}",
                rel.display()
            );
            if m0.is_file() {
                assert_eq!(
                    std::fs::read(&p0).expect("read"),
                    std::fs::read(&p).expect("read"),
                    "data of {}",
                    rel.display()
                );
            }
            if m0.file_type().is_symlink() {
                assert_eq!(std::fs::read_link(&p0).expect("readlink"), std::fs::read_link(&p).expect("readlink"));
            }
        }
    }
    for b in &s.bricks {
        for rel in want.iter().filter(|r| !b.join(r).symlink_metadata().expect("lstat").file_type().is_symlink()) {
            for j in 0..BRICKS {
                assert_eq!(pending(&b.join(rel), j), [0, 0, 0], "{} on {} blames {j}", rel.display(), b.display());
            }
        }
    }
    assert_eq!(dump_value(&s.graph, "rep3-replicate-0.lock-domain").as_deref(), Some("rep3-replicate-0"));
    s.graph.shutdown();
}

/// A pgbench-like workload through the client API under `policy`; returns the
/// INODELK+FINODELK and XATTROP+FXATTROP calls io-stats saw on the bricks.
async fn pgbench_like(policy: &str) -> (u64, u64) {
    let s = setup(&[("lock-contention-policy", policy)]).await;
    let c = Client::new(s.graph.top());
    workload::pgbench_like(&c, "/table").await;
    quiesce(&s.graph).await;
    let calls = |kind: &str| -> u64 {
        (0..BRICKS)
            .filter_map(|i| dump_value(&s.graph, &format!("rep3-client-{i}.fop.{kind}")))
            .filter_map(|v| {
                v.split_whitespace().find_map(|w| w.strip_prefix("calls=")).and_then(|n| n.parse::<u64>().ok())
            })
            .sum()
    };
    let on_disk: Vec<Vec<u8>> = s.bricks.iter().map(|b| std::fs::read(b.join("table")).expect("table")).collect();
    assert!(on_disk.iter().all(|d| *d == on_disk[0]), "{policy}: bricks differ");
    s.graph.shutdown();
    (calls("INODELK") + calls("FINODELK"), calls("XATTROP") + calls("FXATTROP"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_like_lock_and_xattrop_calls_per_policy_in_io_stats() {
    let mut totals = Vec::new();
    for policy in ["fd-count", "inodelk-count", "notify"] {
        let (locks, xops) = pgbench_like(policy).await;
        println!(
            "replica 3 via volfile, 4 fds x 10 rounds of 3 x 8 KiB writes + fsync: {policy:>13}: INODELK+FINODELK {locks:>4}  XATTROP+FXATTROP {xops:>4}"
        );
        totals.push(locks + xops);
    }
    assert!(totals[1] * 3 < totals[0] && totals[2] * 3 < totals[0], "{totals:?}");
}
