//! Hot swap of a live FUSE mount's graph, end to end: three real brick
//! processes, an `xlfs mount` process of a replica-3 client volfile
//! (protocol/client x3 -> cluster/replicate -> performance/read-ahead ->
//! [plugin/wasm nodes] -> debug/io-stats), and a verified read/write
//! workload on long-lived open fds (plus short-lived files and an OFD lock
//! held throughout) while the volfile changes 20 times: read-ahead's
//! page-count and policy (reconfigure; built-in policies and the
//! ra-tolerant WASM policy module), a WASM access-log inserted and
//! removed, and a plugin module file replaced in place by another build
//! (graph switches). Changes reach the mount through its volfile watcher,
//! SIGHUP and `xlfs reload`. A broken volfile, a bad option value, a
//! plugin whose init fails, one that traps in init and a plugin of another ABI are each rejected
//! by `xlfs reload` with a clear message while the workload goes on.
//!
//! Checked: no I/O error, every read verified, the data on each brick at
//! the end, the lock still held, old graphs freed (`xlfs status` counts
//! live graphs), the mount's RSS bounded. Printed: the longest fop latency
//! of the workload during switches and outside them.

mod kit;
mod plugin_kit;

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kit::Cluster;
use kit::fuse_mount::{FuseMount, is_mounted, send_signal};
use xlfs_sdk::testing::Rng;

/// A hang guard for the mount and for each change to be applied.
const TIMEOUT: Duration = Duration::from_secs(60);

/// What this test needs of a mount beyond the kit's.
impl FuseMount {
    /// Replaces the volfile atomically (the watcher never sees half of it).
    fn write_volfile(&self, text: &str) {
        let tmp = self.dir().join("client.vol.new");
        std::fs::write(&tmp, text).expect("write volfile");
        std::fs::rename(&tmp, self.volfile()).expect("replace volfile");
    }

    /// Runs `xlfs ARGS MOUNTPOINT`: (success, stdout, stderr).
    fn xlfs(&self, cmd: &str) -> (bool, String, String) {
        let out = kit::run_xlfs(&[cmd.as_ref(), self.path().as_os_str()]);
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
    }

    fn status(&self) -> String {
        let (ok, out, err) = self.xlfs("status");
        assert!(ok, "xlfs status failed: {err}");
        out
    }

    fn generation(&self) -> u64 {
        field(&self.status(), "generation: ").parse().expect("generation number")
    }

    /// The mount process's resident set, in KiB.
    fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("status");
        field(&s, "VmRSS:").trim_end_matches("kB").trim().parse().expect("VmRSS")
    }

    /// SIGTERM; the process must unmount and exit 0.
    fn stop(&mut self) {
        let st = self.stop_with(libc::SIGTERM);
        assert!(st.success(), "mount exited with {st}\nlog:\n{}", self.log());
    }
}

/// The text after `prefix` on the first line that starts with it.
fn field<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines().find_map(|l| l.strip_prefix(prefix)).unwrap_or_else(|| panic!("no {prefix:?} in:\n{text}")).trim()
}

/// What the client volfile holds besides the fixed replica-3 part.
#[derive(Clone, Debug)]
struct Variant {
    page_count: u32,
    policy: String,
    /// plugin/wasm access-log between read-ahead and the top.
    access_log: bool,
    /// Extra text spliced in (for the rejected cases).
    extra: Option<(String, &'static str)>,
}

struct Modules {
    access_log: PathBuf,
    passthrough: PathBuf,
    /// The module file `plug` loads, rewritten in place.
    plug: PathBuf,
}

fn volfile(c: &Cluster, m: &Modules, v: &Variant) -> String {
    use plugin_kit::volume;
    let mut text = String::new();
    let mut clients = Vec::new();
    for (i, b) in c.bricks.iter().enumerate() {
        let name = format!("hs-client-{i}");
        let opts = [
            ("remote-host", "127.0.0.1".to_string()),
            ("remote-port", b.port().to_string()),
            ("remote-subvolume", b.subvolume()),
        ];
        text += &volume(&name, "protocol/client", &opts, &[]);
        clients.push(name);
    }
    let names: Vec<&str> = clients.iter().map(String::as_str).collect();
    text += &volume("hs-replicate", "cluster/replicate", &[("afr-pending-xattr", clients.join(","))], &names);
    text += &volume(
        "hs-ra",
        "performance/read-ahead",
        &[("page-count", v.page_count.to_string()), ("policy", v.policy.clone())],
        &["hs-replicate"],
    );
    text += &volume("hs-plug", "plugin/wasm", &[("module", m.plug.display().to_string())], &["hs-ra"]);
    let mut below = "hs-plug";
    if v.access_log {
        let opts = [("module", m.access_log.display().to_string()), ("log-level", "debug".to_string())];
        text += &volume("hs-alog", "plugin/wasm", &opts, &[below]);
        below = "hs-alog";
    }
    if let Some((extra, sub)) = &v.extra {
        text += extra;
        below = sub;
    }
    text += &volume("hs-top", "debug/io-stats", &[], &[below]);
    text
}

/// One fop of the workload: when it started (since the test's start) and
/// how long it took.
type Sample = (Duration, Duration);

/// The workload's shared state.
struct Load {
    stop: AtomicBool,
    ops: AtomicU64,
    errors: Mutex<Vec<String>>,
    samples: Mutex<Vec<Sample>>,
    t0: Instant,
}

impl Load {
    fn timed<T>(&self, what: &str, f: impl FnOnce() -> std::io::Result<T>) -> Option<T> {
        let start = Instant::now();
        let r = f();
        self.samples.lock().expect("samples").push((start - self.t0, start.elapsed()));
        self.ops.fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors.lock().expect("errors").push(format!("{what}: {e}"));
                None
            }
        }
    }

    fn fail(&self, msg: String) {
        self.errors.lock().expect("errors").push(msg);
    }
}

const FILE_SIZE: u64 = 1 << 20;

/// A worker on one long-lived fd: random writes of a known pattern and
/// random reads checked against its model; returns the model.
fn rw_worker(load: Arc<Load>, path: PathBuf, seed: u64) -> Vec<u8> {
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("open");
    let mut model = vec![0u8; FILE_SIZE as usize];
    f.write_all_at(&model, 0).expect("initial fill");
    let mut rng = Rng(seed);
    let mut seq = 0u8;
    while !load.stop.load(Ordering::Relaxed) {
        let len = 1 + rng.below(64 << 10) as usize;
        let off = rng.below(FILE_SIZE - len as u64) as usize;
        if rng.below(2) == 0 {
            seq = seq.wrapping_add(1);
            let data: Vec<u8> = (0..len).map(|k| seq.wrapping_add((k % 253) as u8)).collect();
            if load.timed("pwrite", || f.write_all_at(&data, off as u64)).is_some() {
                model[off..off + len].copy_from_slice(&data);
            }
        } else {
            let mut buf = vec![0u8; len];
            if load.timed("pread", || f.read_exact_at(&mut buf, off as u64)).is_some() && buf != model[off..off + len] {
                load.fail(format!("{}: read at {off}+{len} differs from what was written", path.display()));
            }
        }
    }
    model
}

/// Short-lived fds: create, write, fsync, close, reopen, verify, unlink.
fn churn_worker(load: Arc<Load>, dir: PathBuf) {
    let mut n = 0u64;
    while !load.stop.load(Ordering::Relaxed) {
        n += 1;
        let p = dir.join(format!("churn-{}", n % 8));
        let data: Vec<u8> = (0..(4096 + n % 5000)).map(|k| (k ^ n) as u8).collect();
        load.timed("create+write", || {
            let f = std::fs::File::create(&p)?;
            f.write_all_at(&data, 0)?;
            f.sync_all()
        });
        match load.timed("reopen+read", || std::fs::read(&p)) {
            Some(back) if back != data => load.fail(format!("{}: read back differs", p.display())),
            _ => {}
        }
        load.timed("unlink", || std::fs::remove_file(&p));
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An OFD lock (owner: the open file) on `f`.
fn ofd_lock(f: &std::fs::File, cmd: libc::c_int, ty: libc::c_short) -> std::io::Result<libc::flock> {
    // SAFETY: a zeroed flock is valid; fcntl gets a valid fd and pointer.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = ty;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = 0;
    l.l_len = 100;
    // SAFETY: as above.
    if unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut l) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(l)
}

/// Waits until `xlfs status` satisfies `want` (a hang guard).
fn wait_status(m: &FuseMount, what: &str, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let s = m.status();
        if want(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}: not reached; status:\n{s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn twenty_changes_under_a_verified_workload() {
    let c = Cluster::start(3);
    let work = tempfile::tempdir().expect("work dir");
    let m = Modules {
        access_log: plugin_kit::wasm("access-log"),
        passthrough: plugin_kit::wasm("passthrough"),
        plug: work.path().join("plug.wasm"),
    };
    std::fs::copy(&m.passthrough, &m.plug).expect("plug module");
    let base = Variant { page_count: 4, policy: "tolerant".into(), access_log: false, extra: None };
    let mut mount = FuseMount::start_args(&volfile(&c, &m, &base), "direct-io-mode=on", &["--watch-interval", "0.2"]);
    let mnt = mount.path().to_path_buf();
    assert_eq!(mount.generation(), 1);

    // The workload: four long-lived fds, a churn of short-lived ones, and
    // an OFD lock held from start to end.
    let load = Arc::new(Load {
        stop: AtomicBool::new(false),
        ops: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
        samples: Mutex::new(Vec::new()),
        t0: Instant::now(),
    });
    let workers: Vec<_> = (0..4u64)
        .map(|i| {
            let (l, p) = (load.clone(), mnt.join(format!("long-{i}")));
            std::thread::spawn(move || rw_worker(l, p, 0x9E37_79B9_7F4A_7C15 ^ (i + 1)))
        })
        .collect();
    let churn = {
        let (l, d) = (load.clone(), mnt.clone());
        std::thread::spawn(move || churn_worker(l, d))
    };
    let locked = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(mnt.join("locked"))
        .expect("open");
    ofd_lock(&locked, libc::F_OFD_SETLK, libc::F_WRLCK as libc::c_short).expect("OFD lock");
    std::thread::sleep(Duration::from_millis(500));

    // The 20 changes, each with the trigger that delivers it.
    let ra_wasm = format!("wasm:{}", plugin_kit::wasm("ra-tolerant").display());
    let policies = ["gluster-strict".to_string(), ra_wasm.clone(), "tolerant".to_string(), ra_wasm];
    let mut v = base.clone();
    let mut expect_gen = 1u64;
    let mut windows: Vec<(Duration, Duration)> = Vec::new();
    let mut rss_after_first = 0;
    let mut kinds = Vec::new();
    for step in 0..20usize {
        let (kind, structural) = match step % 5 {
            0 => {
                v.page_count = if v.page_count == 4 { 8 } else { 4 };
                ("read-ahead page-count", false)
            }
            1 => {
                v.access_log = !v.access_log;
                (if v.access_log { "insert wasm access-log" } else { "remove wasm access-log" }, true)
            }
            2 => {
                v.policy = policies[step / 5].clone();
                ("read-ahead policy", false)
            }
            3 => ("plugin module rebuilt in place", true),
            _ => {
                v.page_count = 2 + (step as u32 % 3);
                ("read-ahead page-count", false)
            }
        };
        kinds.push(kind);
        let began = load.t0.elapsed();
        let trigger = ["watcher", "SIGHUP", "xlfs reload"][step % 3];
        if step % 5 == 3 {
            // Another build of the module over the same path.
            let other = if step % 10 == 3 { &m.access_log } else { &m.passthrough };
            std::fs::copy(other, &m.plug).expect("replace module");
        } else {
            mount.write_volfile(&volfile(&c, &m, &v));
        }
        match trigger {
            "SIGHUP" => send_signal(mount.pid(), libc::SIGHUP),
            "xlfs reload" => {
                let (ok, out, err) = mount.xlfs("reload");
                assert!(ok, "step {step} ({kind}): xlfs reload failed: {err}\n{out}");
            }
            _ => {}
        }
        if structural {
            expect_gen += 1;
        }
        let want_ra = format!("page-count {}", v.page_count);
        let want_policy = format!("policy {}", v.policy);
        let module_opt = if step % 10 == 3 { "log-level info (default)" } else { "tail off (default)" };
        let s = wait_status(&mount, &format!("step {step} ({kind}, by {trigger})"), |s| {
            s.contains(&format!("generation: {expect_gen}\n"))
                && s.contains(&want_ra)
                && s.contains(&want_policy)
                && s.contains("hs-alog (plugin/wasm)") == v.access_log
                && (step % 5 != 3 || s.contains(module_opt))
        });
        assert!(!s.contains("rejected"), "step {step}: {s}");
        eprintln!("step {step:2} ({kind}, by {trigger}): {}", field(&s, "last reload: "));
        windows.push((began, load.t0.elapsed()));
        if step == 1 {
            rss_after_first = mount.rss_kib();
        }
    }
    let switches = kinds.iter().filter(|k| !k.contains("read-ahead")).count();
    assert_eq!(expect_gen, 1 + switches as u64);

    // Rejections, while the workload goes on: each leaves generation and
    // graph as they were.
    let good = volfile(&c, &m, &v);
    let fault_inject = plugin_kit::wasm("fault-inject");
    let abi2 = plugin_kit::wasm("abi2");
    let hostile = plugin_kit::wasm("hostile");
    let below = if v.access_log { "hs-alog" } else { "hs-plug" };
    let bad_plugin = |module: &Path, opts: &str| {
        let mut w = v.clone();
        let text = format!(
            "volume hs-bad\n    type plugin/wasm\n    option module {}\n{opts}    subvolumes {below}\nend-volume\n\n",
            module.display()
        );
        w.extra = Some((text, "hs-bad"));
        volfile(&c, &m, &w)
    };
    let rejected = [
        (
            good.replace("end-volume\n\nvolume hs-top", "\nvolume hs-top"),
            "client.vol:",
            "a volfile that does not parse",
        ),
        (
            good.replace(&format!("page-count {}", v.page_count), "page-count 99"),
            "'page-count'",
            "an out-of-range value",
        ),
        (bad_plugin(&fault_inject, "    option fops NO-SUCH-FOP\n"), "init failed", "a plugin whose init fails"),
        (bad_plugin(&abi2, ""), "ABI major version mismatch", "a plugin built for ABI 2"),
        (bad_plugin(&hostile, "    option mode init-trap\n"), "wasm trap", "a plugin that traps at init"),
    ];
    let before = mount.status();
    for (text, needle, what) in &rejected {
        mount.write_volfile(text);
        let (ok, out, err) = mount.xlfs("reload");
        assert!(!ok, "{what}: xlfs reload succeeded: {out}");
        assert!(err.contains("reload rejected, the running graph goes on") && err.contains(needle), "{what}: {err}");
        eprintln!("rejected ({what}): {}", err.trim());
        let s = mount.status();
        assert_eq!(field(&s, "generation: "), field(&before, "generation: "), "{what}");
        assert!(s.contains("rejected: "), "{what}: {s}");
    }
    mount.write_volfile(&good);
    let (ok, out, err) = mount.xlfs("reload");
    assert!(ok && out.contains("unchanged"), "back to the running volfile: {out} {err}");

    // Old graphs are freed; memory stays bounded.
    wait_status(&mount, "old graphs freed", |s| s.contains("live graphs: 1\n"));
    std::thread::sleep(Duration::from_millis(500));
    load.stop.store(true, Ordering::Relaxed);
    let models: Vec<Vec<u8>> = workers.into_iter().map(|w| w.join().expect("worker")).collect();
    churn.join().expect("churn worker");
    let rss_end = mount.rss_kib();

    // The lock moved with every switch: another open file description of
    // the same file sees it and cannot take it.
    let other = std::fs::OpenOptions::new().read(true).write(true).open(mnt.join("locked")).expect("open");
    let seen = ofd_lock(&other, libc::F_OFD_GETLK, libc::F_WRLCK as libc::c_short).expect("getlk");
    assert_eq!(seen.l_type, libc::F_WRLCK as libc::c_short, "the lock is still held after {switches} switches");
    let e = ofd_lock(&other, libc::F_OFD_SETLK, libc::F_WRLCK as libc::c_short).expect_err("conflicts");
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
    drop(other);
    drop(locked);

    // The numbers.
    let errors = load.errors.lock().expect("errors").clone();
    let samples = load.samples.lock().expect("samples").clone();
    let during = |s: &Sample| windows.iter().any(|(a, b)| s.0 < *b && s.0 + s.1 > *a);
    let (mut max_in, mut max_out, mut n_in) = (Duration::ZERO, Duration::ZERO, 0usize);
    for s in &samples {
        if during(s) {
            max_in = max_in.max(s.1);
            n_in += 1;
        } else {
            max_out = max_out.max(s.1);
        }
    }
    let status = mount.status();
    eprintln!(
        "hotswap: {} fops ({n_in} during the 20 changes, {switches} of them graph switches, generation {expect_gen}); \
         longest fop during changes {max_in:?}, outside {max_out:?}; mount RSS {} KiB after the first switch, {} KiB \
         at the end; {} I/O errors",
        samples.len(),
        rss_after_first,
        rss_end,
        errors.len()
    );
    eprintln!("final status:\n{status}");
    assert!(errors.is_empty(), "I/O errors during the swaps: {errors:#?}");
    assert!(samples.len() > 1000, "the workload ran: {} fops", samples.len());
    assert!(rss_end < rss_after_first + 256 * 1024, "RSS grew from {rss_after_first} KiB to {rss_end} KiB");

    // Everything written is there: through the mount and on every brick.
    for (i, model) in models.iter().enumerate() {
        let back = std::fs::read(mnt.join(format!("long-{i}"))).expect("read back");
        assert!(back == *model, "long-{i} differs through the mount");
    }
    mount.stop();
    assert!(!is_mounted(&mnt));
    for b in &c.bricks {
        for (i, model) in models.iter().enumerate() {
            let on = std::fs::read(b.dir().join(format!("long-{i}"))).expect("brick copy");
            assert!(on == *model, "long-{i} differs on brick {}", b.dir().display());
        }
    }
}
