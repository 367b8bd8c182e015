//! The native plugin panic contract (`sdk/PLUGIN-ABI.md` section 8), each
//! behaviour shown:
//!
//! - A plugin built with the guest SDK that panics in a fop handler: the
//!   SDK catches it, that fop gets EIO, the instance is made again and the
//!   client keeps being served. That is `dylib_plugin_that_panics_is_caught_and_restarted`
//!   in `plugins.rs` (plugins/hostile/misbehave, mode `trap`).
//! - A plugin built without the SDK that unwinds out of an export aborts the
//!   process that loaded it, whatever the host does: a Rust cdylib with
//!   hand-written `extern "C"` exports (plugins/hostile/unwind) and a C++
//!   library that throws (plugins/c-passthrough/throwing.cpp, built here
//!   with g++), each panicking in `xlfs_describe`, which `xlfs volfile
//!   check` reaches. The child `xlfs` dies by SIGABRT with the failure named
//!   on its stderr (Rust's "panic in a function that cannot unwind" with
//!   the plugin's message; "Rust cannot catch foreign exceptions" for the
//!   C++ exception); this test process, which only spawned it, is unaffected
//!   and can still load and describe a well-behaved native plugin.

mod kit;
mod plugin_kit;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use plugin_kit::volume;
use xlfs_runtime::graph::GraphSpec;
use xlfs_runtime::registry::Registry;
use xlfs_runtime::volfile::Volfile;

/// A volfile with one `plugin/dylib` node on `module` over posix.
fn volfile_on(dir: &Path, module: &Path) -> PathBuf {
    let text = [
        volume("np-posix", "storage/posix", &[("directory", dir.join("brick").display().to_string())], &[]),
        volume("np-plugin", "plugin/dylib", &[("module", module.display().to_string())], &["np-posix"]),
    ]
    .concat();
    kit::volfile_file(dir, &text)
}

/// Runs `xlfs volfile check` on a volfile naming `module` in a child
/// process: asserts it was killed by SIGABRT and its stderr says `needles`.
fn assert_check_aborts(module: &Path, needles: &[&str]) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let vol = volfile_on(tmp.path(), module);
    let out = kit::run_xlfs(&["volfile".as_ref(), "check".as_ref(), vol.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "xlfs volfile check on {} must abort ({}); stderr:\n{stderr}",
        module.display(),
        out.status
    );
    for n in needles {
        assert!(stderr.contains(n), "stderr of the aborted xlfs lacks {n:?}:\n{stderr}");
    }
}

/// The process that ran the test is fine: it loads and describes a
/// well-behaved native plugin (the SDK-built passthrough) in-process.
fn this_process_still_loads_plugins() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(tmp.path().join("brick")).expect("brick dir");
    let vol = volfile_on(tmp.path(), &plugin_kit::dylib("passthrough"));
    let parsed = Volfile::load(&vol).expect("volfile parses");
    GraphSpec::validate(&parsed, &Registry::builtin()).expect("a well-behaved plugin still validates here");
}

#[test]
fn a_rust_plugin_without_the_sdk_that_panics_aborts_the_process_that_loads_it() {
    assert_check_aborts(
        &plugin_kit::dylib("unwind"),
        &[
            "xlfs test plugin: panic in xlfs_describe, outside the SDK's guard",
            "panic in a function that cannot unwind",
        ],
    );
    this_process_still_loads_plugins();
}

/// plugins/c-passthrough/throwing.cpp, built with g++ (once per process).
fn cxx_throwing() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            plugin_kit::native("CXX", "g++", "plugins/c-passthrough/throwing.cpp", "libxlfs_cxx_throwing.so")
        })
        .clone()
}

#[test]
fn a_cxx_plugin_that_throws_out_of_an_export_aborts_the_process_that_loads_it() {
    assert_check_aborts(
        &cxx_throwing(),
        // The exception leaves the extern "C" export; the first Rust frame
        // that would handle an unwind (the process's own catch around
        // main) cannot take a foreign exception and aborts.
        &["Rust cannot catch foreign exceptions"],
    );
    this_process_still_loads_plugins();
}
