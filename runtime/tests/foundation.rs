//! The foundation's end-to-end test: a posix -> locks -> io-stats graph built
//! from a volfile string, driven through the in-process client API
//! ([`kit::workload::client_api`]), then the brick directory checked on disk.
//! `tests/network.rs` runs the same workload over protocol/client.

mod kit;

use std::path::Path;
use std::time::Duration;

use xlfs_runtime::client::Client;

fn volfile(brick: &Path) -> String {
    format!(
        "volume test-posix\n    type storage/posix\n    option directory {}\nend-volume\n\n\
         volume test-locks\n    type features/locks\n    subvolumes test-posix\nend-volume\n\n\
         volume test\n    type debug/io-stats\n    subvolumes test-locks\nend-volume\n",
        brick.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_locks_iostats_through_client_api() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let brick = tmp.path().join("brick");
    std::fs::create_dir(&brick).expect("brick dir");
    let graph = xlfs_runtime::graph::Graph::from_str(
        &volfile(&brick),
        "test.vol",
        &xlfs_runtime::registry::Registry::builtin(),
    )
    .expect("graph builds");
    graph.activate();
    graph.wait_up(Duration::from_secs(10)).await.expect("graph comes up");
    let c = Client::new(graph.top());
    kit::workload::client_api(&c, &graph, &brick).await;
    graph.shutdown();
}
