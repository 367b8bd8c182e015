//! The last step of examples/first-translator/README.md: load a plugin
//! module into a posix graph and use it through the in-process client.
//!
//! Run (after building the plugin, see the README, or just run
//! `examples/first-translator/run.sh`):
//! `cargo run -p xlfs-examples --example first_translator -- <module.wasm>`

use std::time::Duration;

use xlfs_runtime::client::Client;
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let module = std::env::args().nth(1).ok_or("usage: first_translator <module.wasm | module.so>")?;
    let module = std::fs::canonicalize(module)?;
    let kind = if module.extension().is_some_and(|e| e == "wasm") { "wasm" } else { "dylib" };
    let brick = tempfile::tempdir()?;
    std::fs::write(brick.path().join("hello.txt"), b"hello\n")?;
    let volfile = format!(
        "volume ro-posix\n  type storage/posix\n  option directory {}\nend-volume\n\
         volume ro\n  type plugin/{kind}\n  option module {}\n  subvolumes ro-posix\nend-volume\n",
        brick.path().display(),
        module.display()
    );
    print!("volfile:\n{volfile}");
    let graph = Graph::from_str(&volfile, "first.vol", &Registry::builtin())?;
    graph.activate();
    graph.wait_up(Duration::from_secs(5)).await?;

    let client = Client::new(graph.top());
    let names: Vec<String> = client.readdir("/").await?.into_iter().map(|e| e.name).collect();
    println!("readdir / -> {names:?}");
    let mkdir = client.mkdir("/new", 0o755).await;
    println!("mkdir /new -> {mkdir:?}");
    let entered = graph.dump().into_iter().find(|(k, _)| k == "ro.plugin.fops-entered").map(|(_, v)| v);
    println!("fops that entered the plugin: {}", entered.unwrap_or_default());
    graph.shutdown();
    if mkdir.is_ok() {
        return Err("the read-only translator let a mkdir through".into());
    }
    Ok(())
}
