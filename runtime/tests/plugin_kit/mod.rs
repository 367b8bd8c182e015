//! Builds the plugins under `plugins/` (their own Cargo workspace) for the
//! tests, as wasmtime's test-programs artifacts do: one `cargo build
//! --release` for `wasm32-unknown-unknown` and one for the host (cdylib),
//! into a target directory inside this test's own target directory
//! (`CARGO_TARGET_TMPDIR/plugins`). Cargo's own freshness check is the
//! cache: the first test of a run builds, later ones (other test processes
//! too; they wait on cargo's lock) find everything up to date in well under
//! a second, and a test process builds at most once.
//!
//! Needs the `wasm32-unknown-unknown` target (`rustup target add
//! wasm32-unknown-unknown`; `.ci/run` does it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;

/// The text of one volfile volume: `type`, options and subvolumes.
pub fn volume(name: &str, ty: &str, options: &[(&str, String)], subvolumes: &[&str]) -> String {
    let mut v = format!("volume {name}\n    type {ty}\n");
    for (k, val) in options {
        v.push_str(&format!("    option {k} {val}\n"));
    }
    if !subvolumes.is_empty() {
        v.push_str(&format!("    subvolumes {}\n", subvolumes.join(" ")));
    }
    v.push_str("end-volume\n\n");
    v
}

/// The plugins' workspace.
fn plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins")
}

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugins")
}

fn cargo() -> String {
    std::env::var("CARGO").ok().or_else(|| option_env!("CARGO").map(String::from)).unwrap_or_else(|| "cargo".into())
}

fn build(target: Option<&str>) {
    let mut cmd = Command::new(cargo());
    cmd.arg("build").arg("--release").arg("--quiet").arg("--manifest-path").arg(plugins_dir().join("Cargo.toml"));
    cmd.arg("--target-dir").arg(target_dir());
    if let Some(t) = target {
        cmd.arg("--target").arg(t);
    }
    // Settings meant for the outer build must not leak into this one.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let started = Instant::now();
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", cargo()));
    let what = target.unwrap_or("the host");
    assert!(
        out.status.success(),
        "building the plugins for {what} failed ({}){}:\n{}",
        out.status,
        if target == Some("wasm32-unknown-unknown") {
            " -- is the target installed? `rustup target add wasm32-unknown-unknown`"
        } else {
            ""
        },
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("plugins built for {what} in {:.1}s", started.elapsed().as_secs_f64());
}

/// Builds every plugin for both targets (once per test process).
pub fn ensure_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        build(Some("wasm32-unknown-unknown"));
        build(None);
    });
}

/// The `.wasm` file of the plugin crate `xlfs-plugin-<name>`.
pub fn wasm(name: &str) -> PathBuf {
    ensure_built();
    let p = target_dir()
        .join("wasm32-unknown-unknown/release")
        .join(format!("xlfs_plugin_{}.wasm", name.replace('-', "_")));
    assert!(p.is_file(), "{} was not built", p.display());
    p
}

/// The shared library of the plugin crate `xlfs-plugin-<name>`.
pub fn dylib(name: &str) -> PathBuf {
    ensure_built();
    let file = format!(
        "{}xlfs_plugin_{}{}",
        std::env::consts::DLL_PREFIX,
        name.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    );
    let p = target_dir().join("release").join(file);
    assert!(p.is_file(), "{} was not built", p.display());
    p
}

/// Builds the graph in `volfile` with `registry`, activates it and waits
/// until it is up (panics, showing the volfile, when it does not build).
pub async fn up(volfile: &str, registry: &Registry) -> Graph {
    let graph =
        Graph::from_str(volfile, "plugins.vol", registry).unwrap_or_else(|e| panic!("graph builds: {e}\n{volfile}"));
    graph.activate();
    graph.wait_up(Duration::from_secs(20)).await.expect("graph comes up");
    graph
}

/// The value of `key` in the graph's dump; panics, listing the dump, when
/// it is not there.
pub fn dump_value(graph: &Graph, key: &str) -> String {
    let dump = graph.dump();
    match dump.iter().find(|(k, _)| k == key) {
        Some((_, v)) => v.clone(),
        None => panic!("no {key} in {dump:?}"),
    }
}

/// Builds a native plugin from one C or C++ source under the repository
/// (`source`, relative to its root) into a shared library `out` in this
/// test's target directory, with the compiler `$env_var` names (default
/// `default`), warnings as errors and `sdk/include` on the path.
pub fn native(env_var: &str, default: &str, source: &str, out: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(out);
    let cc = std::env::var(env_var).unwrap_or_else(|_| default.into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("sdk/include"))
        .arg("-o")
        .arg(&out)
        .arg(root.join(source))
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc} (scripts/install-deps.sh installs gcc and g++): {e}"));
    assert!(status.success(), "{cc} failed on {source}: {status}");
    out
}
