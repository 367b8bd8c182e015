//! Policies from plugin modules (plugin ABI v1.1) end to end: the policy
//! plugins under `plugins/` are built from source (`plugin_kit`) and named
//! by options as `wasm:<path>` / `dylib:<path>`.
//!
//! - performance/read-ahead with `policy` = the ra-tolerant module keeps a
//!   sequential stream read out of order (no resets, prefetches), where the
//!   built-in gluster-strict resets it (read-ahead's dump counters).
//! - cluster/replicate with `lock-contention-policy` = the lock-fd-count
//!   module gives up its eager lock like the built-in `fd-count` under a
//!   pgbench-like workload (lock and xattrop counts in io-stats).
//! - A policy module that traps (read-ahead) or loops (lock contention)
//!   never fails a fop: the built-in default decides, the failure is
//!   logged, and a crash loop disables the module.

#[path = "kit/logs.rs"]
mod logs;
mod plugin_kit;
#[allow(dead_code)]
#[path = "kit/workload.rs"]
mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

use xlfs_runtime::client::Client;
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;

use logs::{capture_logs, log_lines};

// ---- helpers -------------------------------------------------------------

fn module(kind: &str, name: &str) -> PathBuf {
    match kind {
        "wasm" => plugin_kit::wasm(name),
        _ => plugin_kit::dylib(name),
    }
}

/// The option value naming a policy module.
fn policy_value(kind: &str, name: &str) -> String {
    format!("{kind}:{}", module(kind, name).display())
}

/// [`plugin_kit::up`] with the built-in registry.
async fn up(volfile: &str) -> Graph {
    plugin_kit::up(volfile, &Registry::builtin()).await
}

use workload::dump_value;

fn counter(graph: &Graph, key: &str) -> u64 {
    dump_value(graph, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no counter {key} in {:?}", graph.dump()))
}

// ---- read-ahead ----------------------------------------------------------

const PAGE: usize = 4096;
const PAGES: usize = 64;

fn byte_at(i: usize) -> u8 {
    (i % 251) as u8
}

/// What read-ahead (page 4 KiB, 4 pages) with `policy` counted over a file
/// of 64 pages read page by page in swapped pairs (1, 0, 3, 2, ...), as
/// (resets, prefetches, hits, policy name); every read's bytes are checked.
async fn reordered_reads(policy: &str) -> (u64, u64, u64, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data: Vec<u8> = (0..PAGES * PAGE).map(byte_at).collect();
    std::fs::write(tmp.path().join("f"), &data).expect("file");
    let volfile = format!(
        "{}{}",
        plugin_kit::volume("ra-posix", "storage/posix", &[("directory", tmp.path().display().to_string())], &[]),
        plugin_kit::volume(
            "ra",
            "performance/read-ahead",
            &[("page-size", "4KB".into()), ("page-count", "4".into()), ("policy", policy.to_string())],
            &["ra-posix"]
        ),
    );
    let graph = up(&volfile).await;
    let c = Client::new(graph.top());
    let f = c.open("/f", libc::O_RDONLY).await.expect("open");
    for pair in 0..PAGES / 2 {
        for i in [2 * pair + 1, 2 * pair] {
            let got = f.read((i * PAGE) as u64, PAGE as u32).await.expect("read");
            assert_eq!(&got[..], &data[i * PAGE..(i + 1) * PAGE], "{policy}: page {i}");
            // Let the prefetches this read started land (they are answered
            // by posix at once); the counters asserted on do not depend on it.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let name = dump_value(&graph, "ra.policy").expect("policy in dump");
    let counts = (counter(&graph, "ra.resets"), counter(&graph, "ra.prefetches"), counter(&graph, "ra.hits"));
    f.close().await.expect("close");
    graph.shutdown();
    (counts.0, counts.1, counts.2, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_policy_from_a_module_keeps_reordered_streams_on_both_hosts() {
    capture_logs();
    let (strict_resets, strict_prefetches, strict_hits, _) = reordered_reads("gluster-strict").await;
    assert!(strict_resets >= (PAGES as u64) - 4, "gluster-strict resets {strict_resets}");
    for kind in ["wasm", "dylib"] {
        let value = policy_value(kind, "ra-tolerant");
        let (resets, prefetches, hits, name) = reordered_reads(&value).await;
        assert_eq!(name, value, "the dump names the module");
        assert_eq!(resets, 0, "{kind}: the module's stream survives the reordering");
        // One window after the second read, then about a page per read.
        assert!(prefetches >= (PAGES as u64) - 4, "{kind}: prefetches {prefetches}");
        assert!(prefetches > strict_prefetches, "{kind}: {prefetches} vs gluster-strict {strict_prefetches}");
        assert!(hits > strict_hits, "{kind}: hits {hits} vs gluster-strict {strict_hits}");
        // The module decided: the host never fell back to its default.
        assert!(log_lines(&[&value, "policy module failed"]).is_empty(), "{kind}: {:?}", log_lines(&[&value]));
    }
}

// ---- lock contention -----------------------------------------------------

const BRICKS: usize = 3;

/// Replica 3 (posix -> locks -> io-stats per brick) under cluster/replicate
/// with `lock-contention-policy`, then io-stats on top.
fn replica3(bricks: &[PathBuf], policy: &str) -> String {
    let mut v = String::new();
    for (i, b) in bricks.iter().enumerate() {
        v += &plugin_kit::volume(
            &format!("rep3-posix-{i}"),
            "storage/posix",
            &[("directory", b.display().to_string())],
            &[],
        );
        v += &plugin_kit::volume(&format!("rep3-locks-{i}"), "features/locks", &[], &[&format!("rep3-posix-{i}")]);
        v += &plugin_kit::volume(&format!("rep3-client-{i}"), "debug/io-stats", &[], &[&format!("rep3-locks-{i}")]);
    }
    let clients: Vec<String> = (0..BRICKS).map(|i| format!("rep3-client-{i}")).collect();
    let subvolumes: Vec<&str> = clients.iter().map(String::as_str).collect();
    v += &plugin_kit::volume(
        "rep3-replicate-0",
        "cluster/replicate",
        &[("afr-pending-xattr", clients.join(",")), ("lock-contention-policy", policy.to_string())],
        &subvolumes,
    );
    v += &plugin_kit::volume("rep3", "debug/io-stats", &[], &["rep3-replicate-0"]);
    v
}

/// A pgbench-like workload (4 fds on one file, 10 rounds of 3 x 8 KiB
/// writes and an fsync each) under `policy`; returns the INODELK+FINODELK
/// and XATTROP+FXATTROP calls io-stats saw on the bricks, and the policy
/// name replicate dumps.
async fn pgbench_like(policy: &str) -> (u64, u64, String) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bricks: Vec<PathBuf> = (0..BRICKS).map(|i| tmp.path().join(format!("b{i}"))).collect();
    for b in &bricks {
        std::fs::create_dir(b).expect("brick dir");
    }
    let graph = up(&replica3(&bricks, policy)).await;
    let c = Client::new(graph.top());
    workload::pgbench_like(&c, "/table").await;
    workload::quiesce(&graph).await;
    let calls = |kind: &str| -> u64 {
        (0..BRICKS)
            .filter_map(|i| dump_value(&graph, &format!("rep3-client-{i}.fop.{kind}")))
            .filter_map(|v| {
                v.split_whitespace().find_map(|w| w.strip_prefix("calls=")).and_then(|n| n.parse::<u64>().ok())
            })
            .sum()
    };
    let on_disk: Vec<Vec<u8>> = bricks.iter().map(|b| std::fs::read(b.join("table")).expect("table")).collect();
    assert!(on_disk.iter().all(|d| *d == on_disk[0]), "{policy}: bricks differ");
    let name = dump_value(&graph, "rep3-replicate-0.lock-contention-policy").unwrap_or_default();
    graph.shutdown();
    (calls("INODELK") + calls("FINODELK"), calls("XATTROP") + calls("FXATTROP"), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_contention_policy_from_a_module_behaves_like_fd_count_on_both_hosts() {
    let (fd_locks, fd_xops, _) = pgbench_like("fd-count").await;
    let (notify_locks, notify_xops, _) = pgbench_like("notify").await;
    // fd-count loses the eager lock after every write with 4 fds open;
    // notify keeps it. The module must do what fd-count does.
    assert!(
        (fd_locks + fd_xops) > 3 * (notify_locks + notify_xops),
        "fd-count {fd_locks}+{fd_xops} notify {notify_locks}+{notify_xops}"
    );
    for kind in ["wasm", "dylib"] {
        let value = policy_value(kind, "lock-fd-count");
        let (locks, xops, name) = pgbench_like(&value).await;
        println!(
            "pgbench-like: fd-count {fd_locks}+{fd_xops}, notify {notify_locks}+{notify_xops}, {value} {locks}+{xops}"
        );
        assert_eq!(name, value, "replicate dumps the module as its policy");
        assert!(
            (locks + xops) > 3 * (notify_locks + notify_xops),
            "{kind}: module {locks}+{xops} notify {notify_locks}+{notify_xops}"
        );
        let (lo, hi) = ((fd_locks + fd_xops) * 3 / 4, (fd_locks + fd_xops) * 5 / 4);
        assert!((lo..=hi).contains(&(locks + xops)), "{kind}: module {locks}+{xops} vs fd-count {fd_locks}+{fd_xops}");
    }
}

// ---- faults --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_policy_module_falls_back_to_the_default_and_is_disabled() {
    capture_logs();
    // Read-ahead: the module panics on every read (a trap on WebAssembly, a
    // caught panic natively). Every read is still answered, the built-in
    // tolerant stream decides (no resets, prefetches), and five failures
    // disable the module.
    for kind in ["wasm", "dylib"] {
        let value = policy_value(kind, "bad-policy");
        let (resets, prefetches, _, name) = reordered_reads(&value).await;
        assert_eq!(name, value);
        assert_eq!(resets, 0, "{kind}: tolerant decided");
        assert!(prefetches >= (PAGES as u64) - 4, "{kind}: prefetches {prefetches}");
        let failed = log_lines(&["policy module failed", &value]);
        assert!(failed.len() >= 5, "{kind}: {failed:?}");
        assert!(failed.iter().any(|l| l.contains("DISABLED")), "{kind}: {failed:?}");
        assert!(
            failed.iter().any(|l| l.contains("bad-policy: refusing the read")),
            "{kind}: the plugin's panic is quoted: {failed:?}"
        );
    }
    // Lock contention: the module spins in every decision; the deadline
    // stops it, notify decides, the workload completes with identical bricks.
    let value = policy_value("wasm", "bad-policy");
    let (locks, xops, name) = pgbench_like(&value).await;
    assert_eq!(name, value);
    assert!(locks > 0 && xops > 0);
    let failed = log_lines(&["policy module failed", &value, "plugin-call-timeout"]);
    assert!(!failed.is_empty(), "{:?}", log_lines(&["xlfs::plugin"]));
    assert!(
        log_lines(&["policy module failed", &value, "DISABLED"]).len() >= 2,
        "read-ahead and lock instances each disabled"
    );
}

#[test]
fn a_module_without_the_policy_asked_for_is_refused_and_bad_values_are_named() {
    let registry = Registry::builtin(); // offers the wasm: and dylib: loaders
    let policies = registry.policies();
    let ra = policy_value("wasm", "ra-tolerant");
    let e = policies.lock_contention(&ra).err().expect("no lock policy in ra-tolerant");
    assert!(e.to_string().contains("exports no lock-contention policy"), "{e}");
    let e = policies.read_ahead("wasm:relative.wasm").err().expect("relative path");
    assert!(e.to_string().contains("not an absolute path"), "{e}");
    // A translator plugin (SDK-built: ABI v1.4) is not a policy module.
    let pass = policy_value("dylib", "passthrough");
    let e = policies.read_ahead(&pass).err().expect("no policies in passthrough");
    assert!(e.to_string().contains("exports no read-ahead policy") && e.to_string().contains("v1.4"), "{e}");
    let e = policies.read_ahead("nope").err().expect("unknown");
    assert!(e.to_string().contains("wasm") && e.to_string().contains("dylib"), "schemes listed: {e}");
    assert!(Path::new(&module("wasm", "lock-fd-count")).is_file());
}
