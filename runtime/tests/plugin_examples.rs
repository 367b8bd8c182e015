//! The example plugins end to end, each loaded from a volfile and driven
//! through the in-process client API:
//!
//! - `plugins/c-passthrough`: a translator written in C against
//!   `sdk/include/xlfs_plugin.h`, built here with `cc` as a shared library,
//!   runs the foundation's workload.
//! - `plugins/fault-inject` (wasm and dylib): fails the chosen fops at the
//!   chosen rate with the chosen errno.
//! - `plugins/first-translator`: the steps of
//!   `examples/first-translator/README.md` (build to .wasm, add to a
//!   volfile, use it).
//! - performance/read-ahead (built in) over posix: sequential reads of a
//!   file written through it come back intact, under both policies.

mod kit;
mod plugin_kit;

use plugin_kit::{dump_value, volume};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use xlfs_runtime::client::Client;
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;
use xlfs_sdk::{Dict, Errno, Fop, Loc, XattropOp};

fn opts(module: &Path, more: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut o = vec![("module", module.display().to_string())];
    o.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
    o
}

/// [`plugin_kit::up`] with the built-in registry.
async fn up(volfile: &str) -> Graph {
    plugin_kit::up(volfile, &Registry::builtin()).await
}

/// posix on a fresh directory, then `plugin` on top (named `top`).
fn on_posix(dir: &Path, tag: &str, ty: &str, options: &[(&'static str, String)]) -> String {
    let posix = format!("{tag}-posix");
    [
        volume(&posix, "storage/posix", &[("directory", dir.display().to_string())], &[]),
        volume(tag, ty, options, &[&posix]),
    ]
    .concat()
}

/// Builds plugins/c-passthrough with the system C compiler (once per process).
fn c_passthrough() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            plugin_kit::native("CC", "cc", "plugins/c-passthrough/passthrough.c", "libxlfs_c_passthrough.so")
        })
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_passthrough_runs_the_foundation_workload() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let brick = tmp.path().join("brick");
    std::fs::create_dir(&brick).expect("brick dir");
    let volfile = [
        volume("c-posix", "storage/posix", &[("directory", brick.display().to_string())], &[]),
        volume("c-locks", "features/locks", &[], &["c-posix"]),
        volume("c-pass", "plugin/dylib", &opts(&c_passthrough(), &[]), &["c-locks"]),
        volume("c-top", "debug/io-stats", &[], &["c-pass"]),
    ]
    .concat();
    let graph = up(&volfile).await;
    let c = Client::new(graph.top());
    kit::workload::client_api(&c, &graph, &brick).await;
    let entered: u64 = dump_value(&graph, "c-pass.plugin.fops-entered").parse().expect("a number");
    assert!(entered > 50, "the C plugin entered {entered} fops");
    assert_eq!(dump_value(&graph, "c-pass.plugin.crashes"), "0");
    // A v1.0 plugin loads and runs on this v1.4 host; it has no dump export,
    // so its node dumps the host's counters only.
    assert_eq!(dump_value(&graph, "c-pass.plugin.abi"), "v1.0");
    assert!(
        graph
            .dump()
            .iter()
            .filter(|(k, _)| k.starts_with("c-pass."))
            .all(|(k, _)| k.starts_with("c-pass.plugin.") || k == "c-pass.type")
    );
    graph.shutdown();
}

async fn fault_inject(kind: &str) {
    let module = if kind == "wasm" { plugin_kit::wasm("fault-inject") } else { plugin_kit::dylib("fault-inject") };
    let ty = format!("plugin/{kind}");
    // Every MKDIR fails with ENOSPC; nothing else does.
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = opts(&module, &[("fops", "MKDIR"), ("failure", "100%"), ("error-no", "ENOSPC")]);
    let graph = up(&on_posix(tmp.path(), &format!("fi-all-{kind}"), &ty, &o)).await;
    let c = Client::new(graph.top());
    assert_eq!(c.mkdir("/d", 0o755).await.expect_err("mkdir is chosen"), Errno::ENOSPC, "{kind}");
    let f = c.create("/f", libc::O_RDWR, 0o644).await.expect("create is not chosen");
    f.write(0, Bytes::from_static(b"ok")).await.expect("write");
    f.close().await.expect("close");
    assert_eq!(c.stat("/d").await.expect_err("never made"), Errno::ENOENT);
    graph.shutdown();

    // Half the FSTATs fail with EIO (a fixed seed: the same ones every run).
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = opts(&module, &[("fops", "FSTAT"), ("failure", "50%"), ("seed", "7")]);
    let graph = up(&on_posix(tmp.path(), &format!("fi-half-{kind}"), &ty, &o)).await;
    let c = Client::new(graph.top());
    let f = c.create("/f", libc::O_RDWR, 0o644).await.expect("create");
    let mut failed = 0;
    for _ in 0..200 {
        match f.stat().await {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e, Errno::EIO, "{kind}");
                failed += 1;
            }
        }
    }
    assert!((60..=140).contains(&failed), "{kind}: {failed} of 200 stats failed at 50%");
    graph.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_inject_fails_chosen_fops_at_its_rate_on_both_hosts() {
    fault_inject("wasm").await;
    fault_inject("dylib").await;
}

/// The walkthrough's last step: the plugin in a volfile, used through the
/// in-process client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_translator_walkthrough() {
    let module = plugin_kit::wasm("first-translator");
    for (quiet, errno) in [("off", Errno::EROFS), ("on", Errno::EPERM)] {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join("hello.txt"), b"hi").expect("seed a file");
        let graph =
            up(&on_posix(tmp.path(), &format!("ro-{quiet}"), "plugin/wasm", &opts(&module, &[("quiet", quiet)]))).await;
        let c = Client::new(graph.top());
        assert_eq!(c.mkdir("/d", 0o755).await.expect_err("read-only"), errno);
        assert_eq!(c.create("/new", libc::O_RDWR, 0o644).await.err(), Some(errno));
        assert_eq!(c.unlink("/hello.txt").await.expect_err("read-only"), errno);
        // FopSet::MODIFYING covers every modifying fop, xattrop included.
        let xattrop = Fop::Xattrop { loc: Loc::root(), op: XattropOp::AddArray, xattrs: Dict::new() };
        assert_eq!(c.call(xattrop).await.err(), Some(errno));
        // Reads pass through.
        let names: Vec<String> = c.readdir("/").await.expect("readdir").into_iter().map(|e| e.name).collect();
        assert!(names.iter().any(|n| n == "hello.txt"), "{names:?}");
        assert!(c.stat("/").await.is_ok());
        graph.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_serves_sequential_reads_intact_under_both_policies() {
    for policy in ["tolerant", "gluster-strict"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let o = [("page-size", "16KB".to_string()), ("page-count", "4".to_string()), ("policy", policy.to_string())];
        let graph = up(&on_posix(tmp.path(), &format!("ra-{policy}"), "performance/read-ahead", &o)).await;
        let c = Client::new(graph.top());
        let content: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        let f = c.create("/big", libc::O_RDWR, 0o644).await.expect("create");
        f.write(0, Bytes::from(content.clone())).await.expect("write");
        let mut got = Vec::new();
        let mut off = 0u64;
        loop {
            let chunk = f.read(off, 16 * 1024).await.expect("read");
            if chunk.is_empty() {
                break;
            }
            off += chunk.len() as u64;
            got.extend_from_slice(&chunk);
            if got.len() > content.len() {
                break;
            }
        }
        assert_eq!(got.len(), content.len(), "{policy}");
        assert!(got == content, "{policy}: the data read back differs");
        // Rewrite the middle through another fd: the cache must not serve old bytes.
        let g = c.open("/big", libc::O_RDWR).await.expect("open");
        g.write(500_000, Bytes::from(vec![0xEE; 100])).await.expect("overwrite");
        assert_eq!(&f.read(500_000, 100).await.expect("read")[..], &[0xEE; 100][..], "{policy}");
        let hits: u64 = dump_value(&graph, &format!("ra-{policy}.hits")).parse().expect("hits");
        assert!(hits > 0, "{policy}: no read was served from prefetched pages: {:?}", graph.dump());
        g.close().await.expect("close");
        f.close().await.expect("close");
        graph.shutdown();
    }
}
