//! Plugin ABI v1.2 end to end, on a real FUSE mount (`xlfs mount` of
//! protocol/client -> plugins/fault-inject -> debug/io-stats, over a real
//! brick process), for the WebAssembly and the native build of the plugin:
//!
//! - `xlfs status --dump MOUNT` shows the plugin's own pairs
//!   (`fi.fault-inject.*`, from its `xlfs_dump`) beside the host's counters
//!   for the node (`fi.plugin.*`);
//! - `xlfs reload MOUNT` after a change of the plugin's options gives them
//!   to the running instance (`xlfs_reconfigure`): its behaviour changes
//!   (mkdir starts failing with the new errno) while its counters carry on
//!   from where they were, the host made no new instance and the graph's
//!   generation is the same (no rebuild, no switch);
//! - a value the plugin refuses fails the reload, naming the volume and
//!   the option, and the old options stay in force;
//! - reloads to ever new versions of a module leave the mount's memory flat.

mod kit;
mod plugin_kit;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kit::fuse_mount::FuseMount;
use plugin_kit::volume;

/// The client volfile: the brick, the fault-inject plugin (`kind`) failing
/// `failure` of the MKDIRs with `errno`, io-stats on top.
fn volfile(brick: &kit::Brick, kind: &str, module: &Path, failure: &str, errno: &str) -> String {
    [
        volume(
            "client-0",
            "protocol/client",
            &[
                ("remote-host", "127.0.0.1".to_string()),
                ("remote-port", brick.port().to_string()),
                ("remote-subvolume", brick.subvolume()),
            ],
            &[],
        ),
        volume(
            "fi",
            &format!("plugin/{kind}"),
            &[
                ("module", module.display().to_string()),
                ("fops", "MKDIR".to_string()),
                ("failure", failure.to_string()),
                ("error-no", errno.to_string()),
                ("seed", "7".to_string()),
            ],
            &["client-0"],
        ),
        volume("top", "debug/io-stats", &[], &["fi"]),
    ]
    .concat()
}

/// Replaces the mount's volfile atomically.
fn rewrite(m: &FuseMount, text: &str) {
    let tmp = m.dir().join("client.vol.new");
    std::fs::write(&tmp, text).expect("write volfile");
    std::fs::rename(&tmp, m.volfile()).expect("replace volfile");
}

/// `xlfs CMD MOUNTPOINT`: (success, stdout, stderr).
fn xlfs(m: &FuseMount, args: &[&str]) -> (bool, String, String) {
    let mut all: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    all.push(m.path().as_os_str());
    let out = kit::run_xlfs(&all);
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// `xlfs status --dump MOUNTPOINT`: the `key = value` lines, and the text.
fn dump(m: &FuseMount) -> (HashMap<String, String>, String) {
    let (ok, out, err) = xlfs(m, &["status", "--dump"]);
    assert!(ok, "xlfs status --dump failed: {err}");
    let pairs = out
        .lines()
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    (pairs, out)
}

fn get<'a>(d: &'a (HashMap<String, String>, String), key: &str) -> &'a str {
    d.0.get(key).unwrap_or_else(|| panic!("no {key} in xlfs status --dump:\n{}", d.1))
}

/// The running graph's generation, from the status lines of a dump.
fn generation(d: &(HashMap<String, String>, String)) -> String {
    let line = d.1.lines().find_map(|l| l.strip_prefix("generation: "));
    line.unwrap_or_else(|| panic!("no generation in:\n{}", d.1)).trim().to_string()
}

fn num(d: &(HashMap<String, String>, String), key: &str) -> u64 {
    get(d, key).parse().unwrap_or_else(|_| panic!("{key} is not a number:\n{}", d.1))
}

fn errno_of(r: std::io::Result<()>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn dump_and_reconfigure_in_place(kind: &str, module: PathBuf) {
    let brick = kit::Brick::start();
    // The watcher off: this test's reloads are its own `xlfs reload`s.
    let m = FuseMount::start_args(&volfile(&brick, kind, &module, "0%", "EIO"), "", &["--watch-interval", "0"]);
    let mnt = m.path().to_path_buf();

    // Fops through the plugin; nothing fails yet.
    std::fs::create_dir(mnt.join("a")).expect("mkdir a: failure 0%");
    std::fs::write(mnt.join("a/f"), b"data").expect("write a/f");
    assert_eq!(std::fs::read(mnt.join("a/f")).expect("read a/f"), b"data");

    // The plugin's own pairs beside the host's counters for its node.
    let before = dump(&m);
    assert_eq!(get(&before, "fi.type"), format!("plugin/{kind}"));
    assert_eq!(get(&before, "fi.plugin.abi"), "v1.4");
    assert_eq!(num(&before, "fi.plugin.instances"), 1, "{}", before.1);
    assert_eq!(num(&before, "fi.plugin.reconfigures"), 0);
    let seen = num(&before, "fi.fault-inject.fops-seen");
    assert!(seen >= 3, "the plugin saw the fops: {seen}\n{}", before.1);
    assert_eq!(num(&before, "fi.fault-inject.fops-failed"), 0);
    assert_eq!(get(&before, "fi.fault-inject.fops"), "MKDIR");
    assert_eq!(get(&before, "fi.fault-inject.error-no"), "EIO");
    assert_eq!(num(&before, "fi.fault-inject.failure-ppm"), 0);
    let generation = generation(&before);

    // A reload with new plugin options: applied in place.
    rewrite(&m, &volfile(&brick, kind, &module, "100%", "ENOSPC"));
    let (ok, out, err) = xlfs(&m, &["reload"]);
    assert!(ok, "xlfs reload failed: {err}");
    assert!(out.contains("reconfigured volume 'fi'") && out.contains("error-no EIO -> ENOSPC"), "{out}");
    // The behaviour changed...
    assert_eq!(errno_of(std::fs::create_dir(mnt.join("b"))), Some(libc::ENOSPC), "mkdir b after the reload");
    assert!(std::fs::metadata(mnt.join("a/f")).is_ok(), "other fops still pass");
    // ...in the same instance: its counters went on, no new instance, no
    // new graph.
    let after = dump(&m);
    assert_eq!(num(&after, "fi.plugin.instances"), 1, "re-instantiated:\n{}", after.1);
    assert_eq!(num(&after, "fi.plugin.reconfigures"), 1);
    assert_eq!(num(&after, "fi.plugin.crashes"), 0);
    assert_eq!(self::generation(&after), generation, "the graph was rebuilt:\n{}", after.1);
    assert!(num(&after, "fi.fault-inject.fops-seen") > seen, "counters kept and counting:\n{}", after.1);
    assert_eq!(num(&after, "fi.fault-inject.fops-failed"), 1);
    assert_eq!(get(&after, "fi.fault-inject.error-no"), "ENOSPC");
    assert_eq!(num(&after, "fi.fault-inject.failure-ppm"), 1_000_000);

    // A value the plugin refuses: the reload fails naming the volume and
    // the option; the old options stay in force.
    rewrite(&m, &volfile(&brick, kind, &module, "100%", "EBOGUS"));
    let (ok, out, err) = xlfs(&m, &["reload"]);
    assert!(!ok, "a refused value must fail the reload: {out}");
    assert!(
        err.contains("volume 'fi'")
            && err.contains("error-no ENOSPC -> EBOGUS")
            && err.contains("unknown errno 'EBOGUS'"),
        "{err}"
    );
    assert_eq!(errno_of(std::fs::create_dir(mnt.join("c"))), Some(libc::ENOSPC), "old options in force");
    let refused = dump(&m);
    assert_eq!(get(&refused, "fi.fault-inject.error-no"), "ENOSPC");
    assert_eq!(num(&refused, "fi.plugin.instances"), 1);
    assert_eq!(num(&refused, "fi.fault-inject.fops-failed"), 2);
    assert_eq!(self::generation(&refused), generation);

    // Back to a value it takes: the next reload applies.
    rewrite(&m, &volfile(&brick, kind, &module, "0%", "ENOSPC"));
    let (ok, out, err) = xlfs(&m, &["reload"]);
    assert!(ok && out.contains("reconfigured volume 'fi'"), "{out}{err}");
    std::fs::create_dir(mnt.join("d")).expect("mkdir d: failure 0% again");
    assert_eq!(num(&dump(&m), "fi.plugin.reconfigures"), 2);
    drop(m);
}

#[test]
fn wasm_plugin_dumps_and_takes_new_options_in_place() {
    dump_and_reconfigure_in_place("wasm", plugin_kit::wasm("fault-inject"));
}

#[test]
fn dylib_plugin_dumps_and_takes_new_options_in_place() {
    dump_and_reconfigure_in_place("dylib", plugin_kit::dylib("fault-inject"));
}

/// RSS of process `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("VmRSS");
    line.trim().trim_end_matches("kB").trim().parse().expect("VmRSS value")
}

/// Each reload to a new version of a WebAssembly module (a new file with
/// other bytes, so compiled anew) builds a new graph; the versions left
/// behind are freed, so the mount's memory stays flat over many reloads
/// (it grew by about 8 MB a version when they were kept).
#[test]
fn module_versions_left_behind_by_reloads_are_freed() {
    let brick = kit::Brick::start();
    let base = std::fs::read(plugin_kit::wasm("fault-inject")).expect("module");
    let dir = tempfile::tempdir().expect("tempdir");
    let version = |i: u32| {
        // A custom section ("xlfs", payload i) makes other bytes, same code.
        let mut bytes = base.clone();
        bytes.extend_from_slice(&[0, 9, 4, b'x', b'l', b'f', b's']);
        bytes.extend_from_slice(&i.to_le_bytes());
        let p = dir.path().join(format!("fault-inject-{i}.wasm"));
        std::fs::write(&p, bytes).expect("write module version");
        p
    };
    let m = FuseMount::start_args(&volfile(&brick, "wasm", &version(0), "0%", "EIO"), "", &["--watch-interval", "0"]);
    let mut rss = Vec::new();
    for i in 1..=24u32 {
        rewrite(&m, &volfile(&brick, "wasm", &version(i), "0%", "EIO"));
        let (ok, out, err) = xlfs(&m, &["reload"]);
        assert!(ok, "reload {i}: {out}{err}");
        std::fs::create_dir(m.path().join(format!("d{i}"))).expect("mkdir through the new version");
        rss.push(rss_kib(m.pid()));
    }
    // The process holds the version in use, the one before it (in use
    // still when the last was loaded) and at most 4 idle ones (the
    // loader's cache), not the 25 it was given.
    let loaded = num(&dump(&m), "fi.plugin.modules-loaded");
    assert!((1..=6).contains(&loaded), "{loaded} module versions still loaded after 24 reloads");
    // And their memory is given back: once the idle modules are there, 16
    // more versions (128 MB when they were kept) add no more than the
    // allocator's own noise (up to 18 MB seen under CI load).
    let (warm, last) = (rss[7], rss[23]);
    assert!(last < warm + 32 * 1024, "RSS over reloads 1..=24 (KiB): {rss:?}");
    eprintln!("RSS over reloads 1..=24 (KiB): {rss:?}; {loaded} module versions loaded");
    drop(m);
}
