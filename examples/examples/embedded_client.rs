//! The in-process client API: build a posix -> locks -> io-stats graph over a
//! temporary brick directory, write and read a few files through it, and
//! print what io-stats counted. No network or FUSE involved.
//!
//! Run: `cargo run -p xlfs-examples --example embedded_client`

use std::time::Duration;

use xlfs_runtime::client::Client;
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let brick = tempfile::tempdir()?;
    let volfile = format!(
        "volume demo-posix\n  type storage/posix\n  option directory {}\nend-volume\n\
         volume demo-locks\n  type features/locks\n  subvolumes demo-posix\nend-volume\n\
         volume demo\n  type debug/io-stats\n  subvolumes demo-locks\nend-volume\n",
        brick.path().display()
    );
    let graph = Graph::from_str(&volfile, "demo.vol", &Registry::builtin())?;
    graph.activate();
    graph.wait_up(Duration::from_secs(5)).await?;
    println!("graph:\n{}", graph.describe());

    let client = Client::new(graph.top());
    client.mkdir("/docs", 0o755).await?;
    let f = client.create("/docs/hello.txt", libc::O_RDWR, 0o644).await?;
    f.write(0, &b"hello from xlfs\n"[..]).await?;
    let back = f.read(0, 64).await?;
    f.close().await?;
    print!("read back: {}", String::from_utf8_lossy(&back));
    for e in client.readdir("/docs").await? {
        println!("entry: {} ({:?}, {} bytes)", e.name, e.d_type, e.iatt.size);
    }
    println!("on the brick: {}", brick.path().join("docs/hello.txt").display());

    println!("io-stats:");
    for (k, v) in graph.dump().iter().filter(|(k, _)| k.starts_with("demo.")) {
        println!("  {k} = {v}");
    }
    graph.shutdown();
    Ok(())
}
