//! Growing a volume end to end, through a real `xlfs daemon`, real brick
//! processes and a real FUSE mount: a 2 x 3 volume holding 300 files is
//! grown to 3 x 3 with `xlfs volume add-brick` (the mount switches to the
//! grown graph live) and spread with `xlfs volume rebalance start`, while
//! a workload appends to files it keeps open, overwrites files and reads
//! every file back, checking every byte against its model: no operation
//! fails, no byte is lost, every file ends on exactly one replica set and
//! each set holds a fair share, and `rebalance status` shows the counts.
//! Then `rebalance fix-layout` on a 2 x 3 volume, and `remove-brick ...
//! start` of one of its sets under the same kind of workload: commit is
//! refused until every file has left the set, then drops it. And a
//! rebalance during which a whole replica set goes away (two of its three
//! bricks killed and kept down): it pauses, says why, and resumes once
//! the set is back, with nothing lost or left behind.

mod kit;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kit::daemon::{
    Daemon, brick_arg, brick_dirs, force_if_root, graph_of, mount_status, replica3_args, strs, wait_for,
};
use kit::fuse_mount::FuseMount;

const REPLICA: usize = 3;
const FILES: usize = 300;
const DEADLINE: Duration = Duration::from_secs(90);

/// File `k`'s first content: mostly a few KiB, every tenth 300 KB.
fn content(k: usize, round: usize) -> Vec<u8> {
    let len = if k.is_multiple_of(10) { 300_000 } else { 1000 + (k * 37) % 9000 };
    (0..len).map(|i| ((k * 7 + i + round * 13) % 251) as u8).collect()
}

fn rel(k: usize) -> String {
    if k < 200 { format!("f{k}") } else { format!("d/f{k}") }
}

/// The replica sets whose three bricks all hold `rel` as data (a link
/// file is not data), or why a set's copies disagree (entry operations
/// may still be on their way to the bricks).
fn sets_holding(bricks: &[PathBuf], rel: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for (s, set) in bricks.chunks(REPLICA).enumerate() {
        let kinds: Vec<bool> = set
            .iter()
            .map(|b| {
                let p = b.join(rel);
                p.symlink_metadata().is_ok() && xlfs_sdk::testing::xattr(&p, "trusted.glusterfs.dht.linkto").is_none()
            })
            .collect();
        if kinds.iter().any(|k| *k != kinds[0]) {
            return Err(format!("{rel}: the copies of set {s} disagree: {kinds:?}"));
        }
        if kinds[0] {
            out.push(s);
        }
    }
    Ok(out)
}

/// Every file of `model` reads back whole through `mnt`, and (once any
/// heal has finished) is data on exactly one set, all its copies alike:
/// how many files each set holds. A timeout says what was last wrong,
/// with the end of the volume `vol`'s self-heal daemon log.
fn check_spread(d: &Daemon, vol: &str, mnt: &Path, dirs: &[PathBuf], model: &Model) -> [usize; 3] {
    for (name, want) in &model.files {
        let got = std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        assert!(got == *want, "{name}: {} bytes, want {}", got.len(), want.len());
    }
    let end = Instant::now() + DEADLINE;
    loop {
        let mut per_set = [0usize; 3];
        let wrong = model.files.keys().find_map(|name| match sets_holding(dirs, name) {
            Ok(sets) if sets.len() == 1 => {
                per_set[sets[0]] += 1;
                None
            }
            Ok(sets) => Some(format!("{name} is data on sets {sets:?}")),
            Err(e) => Some(e),
        });
        let Some(wrong) = wrong else { return per_set };
        if Instant::now() > end {
            let shd = std::fs::read_to_string(d.state_dir().join(format!("logs/{vol}-shd.log"))).unwrap_or_default();
            let tail: Vec<&str> = shd.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!("files not on exactly one set after {DEADLINE:?}: {wrong}\nshd log:\n{}", tail.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `volume create NAME replica 3 BRICKS... [force]`, then `start`.
fn create_started(d: &Daemon, name: &str, bricks: &[PathBuf], force: Option<&'static str>) {
    d.ok(&strs(&replica3_args("create", name, bricks.iter().map(|p| brick_arg(p)), force)));
    d.ok(&["start", name]);
}

/// `volume add-brick NAME replica 3 BRICKS... [force]`: what it printed.
fn add_bricks(d: &Daemon, name: &str, bricks: &[PathBuf], force: Option<&'static str>) -> String {
    d.ok(&strs(&replica3_args("add-brick", name, bricks.iter().map(|p| brick_arg(p)), force)))
}

/// Writes the FILES files (under `d/` from the 200th: `d` must exist)
/// and returns their model. The directories are fsynced: the mount
/// creates files asynchronously (async-dirops), and until a create has
/// reached the bricks another client (the daemon's rebalance) does not
/// list the name.
fn seed(mnt: &Path) -> Model {
    let mut model = Model::default();
    for k in 0..FILES {
        let c = content(k, 0);
        std::fs::write(mnt.join(rel(k)), &c).expect("write a file");
        model.files.insert(rel(k), c);
    }
    for dir in [mnt.to_path_buf(), mnt.join("d")] {
        std::fs::File::open(&dir).and_then(|d| d.sync_all()).expect("fsync the directory");
    }
    model
}

/// `volume rebalance VOL status --json`.
fn rebalance_status(d: &Daemon, vol: &str) -> serde_json::Value {
    let out = d.ok(&["rebalance", vol, "status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("status is JSON");
    v["status"].clone()
}

/// What the workload expects each file to hold, and what went wrong.
#[derive(Default)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    errors: Vec<String>,
}

/// Appends to `open.len()` files kept open, reading each back after its
/// write, until `stop`.
fn appender(mnt: PathBuf, model: Arc<Mutex<Model>>, stop: Arc<AtomicBool>) {
    let names: Vec<String> = (0..6).map(|j| format!("live/w{j}")).collect();
    let mut open: Vec<std::fs::File> = names
        .iter()
        .map(|n| std::fs::OpenOptions::new().create(true).append(true).open(mnt.join(n)).expect("open a live file"))
        .collect();
    let mut want: Vec<Vec<u8>> = vec![Vec::new(); names.len()];
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) {
        for (j, f) in open.iter_mut().enumerate() {
            let chunk: Vec<u8> = (0..4096).map(|i| ((round * 31 + j * 17 + i) % 253) as u8).collect();
            if let Err(e) = f.write_all(&chunk) {
                model.lock().expect("model").errors.push(format!("append to {}: {e}", names[j]));
                return;
            }
            want[j].extend_from_slice(&chunk);
        }
        let j = round % names.len();
        match std::fs::read(mnt.join(&names[j])) {
            Ok(got) if got == want[j] => {}
            Ok(got) => {
                let at = got.iter().zip(&want[j]).position(|(a, b)| a != b);
                model.lock().expect("model").errors.push(format!(
                    "{}: read {} bytes, wrote {}, first difference at {at:?}",
                    names[j],
                    got.len(),
                    want[j].len()
                ));
                return;
            }
            Err(e) => {
                model.lock().expect("model").errors.push(format!("read {}: {e}", names[j]));
                return;
            }
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut m = model.lock().expect("model");
    for (n, w) in names.into_iter().zip(want) {
        m.files.insert(n, w);
    }
}

/// Reads every file and compares it with the model; rewrites every
/// seventh one it visits; until `stop`.
fn checker(mnt: PathBuf, model: Arc<Mutex<Model>>, stop: Arc<AtomicBool>) {
    let mut round = 1;
    while !stop.load(Ordering::Relaxed) {
        for k in 0..FILES {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let name = rel(k);
            if (k + round).is_multiple_of(7) {
                let new = content(k, round);
                // Held while writing, so a reader never sees a half-made model.
                let mut m = model.lock().expect("model");
                if let Err(e) = std::fs::write(mnt.join(&name), &new) {
                    m.errors.push(format!("rewrite {name}: {e}"));
                    return;
                }
                m.files.insert(name, new);
                continue;
            }
            let want = model.lock().expect("model").files.get(&name).cloned().unwrap_or_default();
            match std::fs::read(mnt.join(&name)) {
                Ok(got) if got == want => {}
                Ok(got) => {
                    model.lock().expect("model").errors.push(format!(
                        "{name}: read {} bytes, want {}",
                        got.len(),
                        want.len()
                    ));
                    return;
                }
                Err(e) => {
                    let when = utc_now();
                    let again = std::fs::read(mnt.join(&name)).map(|b| b.len());
                    let stat = std::fs::metadata(mnt.join(&name)).map(|m| m.len());
                    let listed = std::fs::read_dir(mnt.join(&name).parent().expect("parent"))
                        .map(|d| d.flatten().any(|e| e.path() == mnt.join(&name)));
                    let dump = kit::run_xlfs(&["status".as_ref(), "--dump".as_ref(), mnt.as_os_str()]);
                    let keep = std::env::temp_dir().join(format!("xlfs-rebalance-dump-{}.txt", std::process::id()));
                    let _ = std::fs::write(&keep, &dump.stdout);
                    std::thread::sleep(Duration::from_secs(2));
                    let later = std::fs::read(mnt.join(&name)).map(|b| b.len());
                    model.lock().expect("model").errors.push(format!(
                        "read {name}: {e} (at {when}; read again: {again:?}; stat: {stat:?}; listed: {listed:?}; \
                         2 s later: {later:?}; the mount's dump is kept in {})",
                        keep.display()
                    ));
                    return;
                }
            }
        }
        round += 1;
    }
}

/// The time of day (UTC, as the logs print it).
fn utc_now() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let s = t.as_secs() % 86_400;
    format!("{:02}:{:02}:{:02}.{:06}", s / 3600, s / 60 % 60, s % 60, t.subsec_micros())
}

#[test]
fn grow_two_by_three_to_three_by_three_under_a_workload() {
    kit::init_tracing();
    let started = Instant::now();
    let tmp = tempfile::Builder::new().prefix("xlfs-rebal-").tempdir().expect("tempdir");
    let dirs = brick_dirs(tmp.path(), 3 * REPLICA);
    let force = force_if_root(tmp.path());
    let d = Daemon::start();
    create_started(&d, "gv", &dirs[..2 * REPLICA], force);
    assert!(d.refused(&["rebalance", "gv", "stop"]).contains("no rebalance is in progress"));
    assert!(d.ok(&["rebalance", "gv", "status"]).contains("not started"));

    let m = FuseMount::start_by_name(&format!("{}:/gv", d.addr()), "", &["--spec-interval", "0.3"]);
    let mnt = m.path().to_path_buf();
    std::fs::create_dir(mnt.join("d")).expect("mkdir d");
    std::fs::create_dir(mnt.join("live")).expect("mkdir live");
    let model = Arc::new(Mutex::new(seed(&mnt)));

    // Bad add-bricks are refused, naming the reason.
    let refused = |args: &[&str]| {
        let mut all: Vec<&str> = vec!["add-brick", "gv"];
        all.extend_from_slice(args);
        all.extend(force);
        d.refused(&all)
    };
    let (b6, b7, b8) = (brick_arg(&dirs[6]), brick_arg(&dirs[7]), brick_arg(&dirs[8]));
    let e = refused(&["replica", "2", &b6, &b7]);
    assert!(e.contains("cannot change the replica count"), "{e}");
    let e = refused(&[&b6]);
    assert!(e.contains("whole replica sets of 3"), "{e}");
    let e = refused(&[&brick_arg(&dirs[0]), &b7, &b8]);
    assert!(e.contains(&format!("brick {} is already part of volume gv", brick_arg(&dirs[0]))), "{e}");
    let e = refused(&["127.0.0.1:/no/such/dir", &b7, &b8]);
    assert!(e.contains("brick 127.0.0.1:/no/such/dir"), "{e}");
    let e = refused(&[&b6, &b6, &b8]);
    assert!(e.contains("listed more than once"), "{e}");

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = [appender as fn(PathBuf, Arc<Mutex<Model>>, Arc<AtomicBool>), checker]
        .into_iter()
        .map(|f| {
            let (mnt, model, stop) = (mnt.clone(), model.clone(), stop.clone());
            std::thread::spawn(move || f(mnt, model, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    // Grow: the mount switches to distribute over three sets, live.
    let out = add_bricks(&d, "gv", &dirs[2 * REPLICA..], force);
    assert!(out.contains("volume add-brick: gv: success: 3 bricks added, 3 replica sets of 3"), "{out}");
    assert!(d.ok(&["getspec", "gv"]).contains("subvolumes gv-replicate-0 gv-replicate-1 gv-replicate-2\n"));
    wait_for("the mount to switch to three sets", DEADLINE, || {
        graph_of(&mount_status(&mnt)).contains("gv-replicate-2").then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));

    // Rebalance while the workload runs.
    assert!(d.ok(&["rebalance", "gv", "start"]).contains("rebalance started"));
    assert!(d.refused(&["rebalance", "gv", "start"]).contains("in progress"));
    let end = Instant::now() + DEADLINE;
    let status = loop {
        let s = rebalance_status(&d, "gv");
        if s["state"] != "in progress" && s["state"] != "paused" {
            break s;
        }
        if Instant::now() > end {
            let dump = d.ok(&["statedump", "gv"]);
            let locks: Vec<&str> = dump.lines().filter(|l| l.contains("inodelk") || l.contains("entrylk")).collect();
            panic!("the rebalance did not complete: {s}\nlocks:\n{}", locks.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let table = d.ok(&["rebalance", "gv", "status"]);
    eprintln!("xlfs volume rebalance gv status\n{table}");
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("workload thread");
    }
    let model = Arc::try_unwrap(model).ok().expect("sole owner").into_inner().expect("model");
    assert!(model.errors.is_empty(), "the workload saw errors: {:?}\nstatus: {status}", model.errors);
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["failed"], 0, "{status}");
    let scanned = status["scanned"].as_u64().expect("scanned");
    let moved = status["moved"].as_u64().expect("moved");
    assert!(scanned >= FILES as u64, "{status}");
    assert!(moved > 50 && status["bytes"].as_u64().expect("bytes") > 0, "{status}");
    assert!(table.contains("rebalance of volume gv: completed") && table.contains("Moved"), "{table}");
    assert!(table.contains(&format!("{moved}")), "{table}");

    let per_set = check_spread(&d, "gv", &mnt, &dirs, &model);
    let n = model.files.len();
    for (s, c) in per_set.iter().enumerate() {
        assert!(*c * 5 >= n, "set {s} holds {c} of {n} files: {per_set:?}");
    }
    // Directories exist on the new bricks with a layout.
    for b in &dirs[2 * REPLICA..] {
        for dir in ["", "d", "live"] {
            let p = b.join(dir);
            assert!(xlfs_sdk::testing::xattr(&p, "trusted.glusterfs.dht").is_some(), "{}", p.display());
        }
    }
    eprintln!("files per set {per_set:?}; status {status}; wall {:?}", started.elapsed());
    drop(m);
}

/// `volume rebalance VOL status --json` once the run has ended.
fn wait_rebalanced(d: &Daemon, vol: &str) -> serde_json::Value {
    wait_for("the run to end", DEADLINE, || {
        let s = rebalance_status(d, vol);
        (s["state"] != "in progress" && s["state"] != "paused").then_some(s)
    })
}

#[test]
fn remove_brick_moves_everything_off_before_commit() {
    kit::init_tracing();
    let tmp = tempfile::Builder::new().prefix("xlfs-rmbrick-").tempdir().expect("tempdir");
    let dirs = brick_dirs(tmp.path(), 2 * REPLICA);
    let force = force_if_root(tmp.path());
    let d = Daemon::start();
    create_started(&d, "rv", &dirs, force);
    let m = FuseMount::start_by_name(&format!("{}:/rv", d.addr()), "", &["--spec-interval", "0.3"]);
    let mnt = m.path().to_path_buf();
    std::fs::create_dir(mnt.join("d")).expect("mkdir d");
    let model = Arc::new(Mutex::new(seed(&mnt)));
    let leaving: Vec<String> = dirs[REPLICA..].iter().map(|p| brick_arg(p)).collect();
    let rm = |what: &str| -> Vec<String> {
        let mut a: Vec<String> = vec!["remove-brick".into(), "rv".into()];
        a.extend(leaving.iter().cloned());
        a.push(what.into());
        a
    };
    let args = |v: &[String]| v.iter().map(String::clone).collect::<Vec<_>>();
    assert!(d.ok(&["rebalance", "rv", "fix-layout"]).contains("fix-layout started"));
    let fixed = wait_rebalanced(&d, "rv");
    assert_eq!((fixed["state"].as_str(), fixed["kind"].as_str()), (Some("completed"), Some("fix-layout")), "{fixed}");
    assert_eq!((fixed["dirs"].as_u64(), fixed["moved"].as_u64()), (Some(2), Some(0)), "{fixed}");
    let e = d.refused(&["remove-brick", "rv", &leaving[0], "start"]);
    assert!(e.contains("give every brick of each replica set"), "{e}");
    let e = d.refused(&args(&rm("commit")).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(e.contains("not being removed"), "{e}");

    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (mnt, model, stop) = (mnt.clone(), model.clone(), stop.clone());
        std::thread::spawn(move || checker(mnt, model, stop))
    };
    std::thread::sleep(Duration::from_millis(300));
    let out = d.ok(&args(&rm("start")).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.contains("remove-brick started"), "{out}");
    assert!(d.ok(&["getspec", "rv"]).contains("option decommissioned-bricks rv-replicate-1\n"));
    // Not before every file has left.
    let e = d.refused(&args(&rm("commit")).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(e.contains("in progress") || e.contains("files are still on brick"), "{e}");
    let status = wait_rebalanced(&d, "rv");
    stop.store(true, Ordering::Relaxed);
    worker.join().expect("workload thread");
    assert_eq!(
        (status["state"].as_str(), status["kind"].as_str()),
        (Some("completed"), Some("remove-brick")),
        "{status}"
    );
    assert_eq!(status["failed"], 0, "{status}");
    let st = d.ok(&args(&rm("status")).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(st.contains("remove-brick of volume rv: completed"), "{st}");
    eprintln!("xlfs volume remove-brick rv ... status\n{st}");
    let out = d.ok(&args(&rm("commit")).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.contains("3 bricks removed"), "{out}");
    eprintln!("{e}\n{out}");
    let spec = d.ok(&["getspec", "rv"]);
    assert!(!spec.contains("rv-client-3") && !spec.contains("decommissioned"), "{spec}");
    wait_for("the mount to drop the removed set", DEADLINE, || {
        (!graph_of(&mount_status(&mnt)).contains("rv-replicate-1")).then_some(())
    });
    let model = Arc::try_unwrap(model).ok().expect("sole owner").into_inner().expect("model");
    assert!(model.errors.is_empty(), "the workload saw errors: {:?}\nstatus: {status}", model.errors);
    for (name, want) in &model.files {
        let got = std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("read {name} after commit: {e}"));
        assert!(got == *want, "{name}: {} bytes, want {}", got.len(), want.len());
    }
    drop(m);
}

#[test]
fn a_rebalance_pauses_while_a_replica_set_is_away_and_resumes() {
    kit::init_tracing();
    let tmp = tempfile::Builder::new().prefix("xlfs-rebal-away-").tempdir().expect("tempdir");
    let dirs = brick_dirs(tmp.path(), 3 * REPLICA);
    let force = force_if_root(tmp.path());
    let d = Daemon::start();
    create_started(&d, "pv", &dirs[..2 * REPLICA], force);
    let m = FuseMount::start_by_name(&format!("{}:/pv", d.addr()), "", &["--spec-interval", "0.3"]);
    let mnt = m.path().to_path_buf();
    std::fs::create_dir(mnt.join("d")).expect("mkdir d");
    let model = seed(&mnt);
    add_bricks(&d, "pv", &dirs[2 * REPLICA..], force);
    wait_for("the mount to switch to three sets", DEADLINE, || {
        graph_of(&mount_status(&mnt)).contains("pv-replicate-2").then_some(())
    });

    assert!(d.ok(&["rebalance", "pv", "start"]).contains("rebalance started"));
    wait_for("a few files moved", DEADLINE, || (rebalance_status(&d, "pv")["moved"].as_u64() >= Some(3)).then_some(()));
    // The new set loses two of its three bricks, and they stay down: their
    // directories are moved away, so the daemon's restarts fail.
    let pids: Vec<u32> = d.bricks("pv")[2 * REPLICA..2 * REPLICA + 2].iter().map(|b| b.1.expect("pid")).collect();
    let away: Vec<(PathBuf, PathBuf)> =
        dirs[2 * REPLICA..2 * REPLICA + 2].iter().map(|p| (p.clone(), p.with_extension("away"))).collect();
    for ((from, to), pid) in away.iter().zip(&pids) {
        std::fs::rename(from, to).expect("move the brick directory away");
        // SAFETY: kill(2) on a brick's pid, which the daemon reported.
        assert_eq!(unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) }, 0);
    }
    let paused = wait_for("the rebalance to pause", DEADLINE, || {
        let s = rebalance_status(&d, "pv");
        assert_ne!(s["state"], "completed", "completed without the set: {s}");
        (s["state"] == "paused").then_some(s)
    });
    assert!(paused["error"].as_str().is_some_and(|e| e.contains("paused at") && e.contains("ENOTCONN")), "{paused}");
    let table = d.ok(&["rebalance", "pv", "status"]);
    assert!(table.contains("rebalance of volume pv: paused") && table.contains("waiting: paused at"), "{table}");
    eprintln!("while the set is away:\n{table}");
    // Still paused a while later: nothing is skipped or failed meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    let still = rebalance_status(&d, "pv");
    assert_eq!((still["state"].as_str(), still["failed"].as_u64()), (Some("paused"), Some(0)), "{still}");

    // The set comes back (the daemon's next restart finds the directories).
    for (from, to) in &away {
        std::fs::rename(to, from).expect("move the brick directory back");
    }
    let status = wait_rebalanced(&d, "pv");
    let table = d.ok(&["rebalance", "pv", "status"]);
    eprintln!("after the set came back:\n{table}");
    assert_eq!(status["state"], "completed", "{status}");
    assert_eq!(status["failed"], 0, "{status}");
    assert!(status["pauses"].as_u64() >= Some(1), "{status}");
    assert!(table.contains("paused 1 time") || table.contains("paused 2 time"), "{table}");

    let per_set = check_spread(&d, "pv", &mnt, &dirs, &model);
    assert!(per_set.iter().all(|c| c * 5 >= FILES), "{per_set:?}");
    eprintln!("files per set {per_set:?}; status {status}");
    drop(m);
}
