//! PostgreSQL on an xlfs FUSE mount of a replica-3 volume of real brick
//! processes: initdb, start, `pgbench -i -s 10`, `pgbench -c 4 -t 500`,
//! then pgbench's own balance invariants checked with psql, and `xlfs
//! profile` of the run checked against io-stats: per fop, the translators'
//! parts add up (within 5 %) to the latency io-stats measured at the top.
//! This is the workload of the GlusterFS bug report xlfs grew from. It needs PostgreSQL 15 from Debian's packages
//! (`.ci/run` installs it) and runs the server as the `postgres` user, so
//! the mount's defaults (allow-other, default-permissions) are exercised.

mod kit;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const XLFS: &str = env!("CARGO_BIN_EXE_xlfs");
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// An `xlfs mount --foreground` process; dropping it stops it and detaches
/// the mount if it is still there.
struct FuseMount {
    child: Child,
    mnt: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl FuseMount {
    fn start(volfile: &str) -> FuseMount {
        let dir = tempfile::Builder::new().prefix("xlfs-pg-").tempdir().expect("temp dir");
        let vol = dir.path().join("client.vol");
        std::fs::write(&vol, volfile).expect("volfile");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        let log = dir.path().join("mount.log");
        let mut cmd = Command::new(XLFS);
        cmd.args(["mount", "--foreground", "--volfile"]).arg(&vol).arg("--log-file").arg(&log).arg(&mnt);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn xlfs mount");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("start line");
        assert!(line.starts_with("xlfs mount: "), "mount did not start: {line:?}");
        // The parent directory must let postgres through to the mount.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        FuseMount { child, mnt, log, _dir: dir }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = xlfs_runtime::fuse::lazy_unmount(&self.mnt);
        if std::thread::panicking() {
            eprintln!("--- mount log ---\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
    }
}

/// Runs a PostgreSQL tool as the postgres user.
fn as_pg(tool: &str, args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(Path::new(PG_BIN).join(tool))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("runuser")
}

fn ok(tool: &str, out: Output) -> String {
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{tool} failed ({}):\n{so}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    so
}

/// Stops the server on every path.
struct Server {
    data: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let d = self.data.display().to_string();
        let _ = as_pg("pg_ctl", &["-D", &d, "-m", "immediate", "-w", "stop"]);
    }
}

fn chown_postgres(p: &Path) {
    let out = Command::new("id").args(["-u", "postgres"]).output().expect("id");
    let uid: u32 =
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("postgres uid (is postgresql installed?)");
    let out = Command::new("id").args(["-g", "postgres"]).output().expect("id");
    let gid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("postgres gid");
    std::os::unix::fs::chown(p, Some(uid), Some(gid)).expect("chown");
}

#[test]
fn pgbench_on_the_mount() {
    assert!(
        Path::new(PG_BIN).join("initdb").exists(),
        "PostgreSQL 15 is needed in {PG_BIN} (apt-get install postgresql; .ci/run installs it)"
    );
    let bricks = kit::Cluster::start(3);
    let m = FuseMount::start(&bricks.replica_volfile(&[]));
    let root = m.mnt.join("pg");
    std::fs::create_dir(&root).expect("mkdir");
    chown_postgres(&root);
    let sock = tempfile::Builder::new().prefix("xlfs-pgsock-").tempdir().expect("socket dir");
    std::fs::set_permissions(sock.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        l.local_addr().expect("addr").port().to_string()
    };
    let data = root.join("data");
    let (d, s) = (data.display().to_string(), sock.path().display().to_string());
    let log = root.join("server.log").display().to_string();

    ok("initdb", as_pg("initdb", &["-D", &d, "-U", "postgres", "-A", "trust"]));
    let _server = Server { data: data.clone() };
    let opts = format!("-p {port} -k {s} -c listen_addresses=''");
    ok("pg_ctl start", as_pg("pg_ctl", &["-D", &d, "-l", &log, "-w", "-t", "120", "-o", &opts, "start"]));
    let conn = ["-h", &s, "-p", &port, "-U", "postgres"];
    let args = |extra: &[&str]| -> Vec<String> { conn.iter().chain(extra).map(|x| x.to_string()).collect() };
    let run = |tool: &str, extra: &[&str]| {
        let a = args(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        ok(tool, as_pg(tool, &a))
    };
    run("pgbench", &["-i", "-s", "10", "-q", "postgres"]);
    // io-stats's reading and the profile's reset must see the same fops:
    // the server may still be writing after `pgbench -i` (a checkpoint's
    // writes and closes), and one fop that ends between the two would be
    // in one count and not the other. So the pair is taken again until
    // io-stats reads the same after the reset as before it.
    let before = (0..20)
        .find_map(|_| {
            let before = settled_io_stats(&m.mnt);
            xlfs(&["profile", "--reset", m.mnt.to_str().expect("utf-8")]);
            (io_stats(&m.mnt) == before).then_some(before)
        })
        .expect("the idle server stops doing fops between two readings of io-stats");
    let out = run("pgbench", &["-c", "4", "-j", "2", "-t", "500", "postgres"]);
    assert!(out.contains("number of transactions actually processed: 2000/2000"), "{out}");
    assert!(out.contains("number of failed transactions: 0 "), "{out}");
    let tps = out.lines().find(|l| l.starts_with("tps = ")).unwrap_or("tps = ?");
    eprintln!("pgbench -c 4 -j 2 -t 500 on xlfs: {tps}");

    // pgbench's invariants: every transaction adds the same delta to one
    // account, its teller and its branch, and logs it in the history.
    let q = |sql: &str| run("psql", &["-At", "-c", sql, "postgres"]).trim().to_string();
    assert_eq!(q("select count(*) from pgbench_accounts"), "1000000");
    assert_eq!(q("select count(*) from pgbench_history"), "2000");
    let sums = q("select (select sum(abalance) from pgbench_accounts) || ' ' || \
                  (select sum(tbalance) from pgbench_tellers) || ' ' || \
                  (select sum(bbalance) from pgbench_branches) || ' ' || \
                  (select sum(delta) from pgbench_history)");
    let v: Vec<&str> = sums.split(' ').collect();
    assert!(v.len() == 4 && v.iter().all(|x| *x == v[0]), "balances agree: {sums}");
    ok("pg_ctl stop", as_pg("pg_ctl", &["-D", &d, "-m", "fast", "-w", "stop"]));
    // Both read with the server stopped: nothing runs between them.
    let after = settled_io_stats(&m.mnt);
    let profile = xlfs(&["profile", m.mnt.to_str().expect("utf-8")]);

    // The profile of the run against io-stats's own latency counters (the
    // top of the graph): per fop that took time, the same calls, and
    // the translators' parts adding up to what io-stats measured per call.
    let mut checked = Vec::new();
    for (fop, calls, accounted_us, io_stats_self_us) in profile_tops(&profile) {
        let (c0, t0) = before.get(&fop).copied().unwrap_or((0, 0.0));
        let Some(&(c1, t1)) = after.get(&fop) else { continue };
        let (calls_seen, measured_us) = (c1 - c0, t1 - t0);
        assert!(
            calls.abs_diff(calls_seen) <= 3 + calls_seen / 50,
            "{fop}: {calls} calls in the profile, {calls_seen} in io-stats\n{profile}"
        );
        // io-stats measures what it waits for (from its call to its
        // child's answer), so its own row (the profile's timing of it,
        // from outside, including its own bookkeeping: several us a call
        // in a debug build under load) is left out of the sum; the rows
        // below it must add up to what it measured. Fops whose time is
        // mostly the timing's own (a cached fstat in a debug build: its
        // node's bookkeeping, which io-stats's row shows, and the hand-offs
        // between nodes, which no row has) are left out: checked are those
        // where one node's bookkeeping is under 5 % of the fop, as is the
        // waiting that dominates an fsync. (A fixed floor of 50 us let a
        // cached FSTAT of 72 us in on a slow machine, where io-stats's own
        // row was 14 us of it and the sum came to 87 %.)
        let per_call = measured_us / calls_seen.max(1) as f64;
        if calls < 10 || io_stats_self_us / calls as f64 > 0.05 * per_call {
            continue;
        }
        let below_us = accounted_us - io_stats_self_us;
        let ratio = (below_us / calls as f64) / (measured_us / calls_seen as f64);
        assert!(
            (0.95..=1.05).contains(&ratio),
            "{fop}: rows below io-stats add up to {below_us:.0} us (all rows {accounted_us:.0} us), \
             io-stats measured {measured_us:.0} us\n{profile}"
        );
        checked.push(format!("{fop} {:.1}%", 100.0 * ratio));
    }
    assert!(checked.iter().any(|c| c.starts_with("FSYNC ")), "FSYNC checked: {checked:?}\n{profile}");
    eprintln!("xlfs profile against io-stats during pgbench: {}", checked.join(", "));
}

/// Runs `xlfs ARGS`; panics unless it succeeds; returns stdout.
fn xlfs(args: &[&str]) -> String {
    ok("xlfs", Command::new(XLFS).args(args).output().expect("run xlfs"))
}

/// io-stats's counters at the mount's top, per fop: (calls, total latency
/// in microseconds), from its statedump lines
/// `VOL.fop.NAME = calls=N errors=E latency-us samples=S min=.. avg=A max=..`.
fn io_stats(mnt: &Path) -> std::collections::HashMap<String, (u64, f64)> {
    let dump = xlfs(&["status", "--dump", mnt.to_str().expect("utf-8")]);
    let mut out = std::collections::HashMap::new();
    for line in dump.lines() {
        let Some((key, value)) = line.split_once(" = ") else { continue };
        let Some((_, fop)) = key.split_once(".fop.") else { continue };
        if fop.contains('.') {
            continue;
        }
        let field = |name: &str| {
            value.split_whitespace().find_map(|w| w.strip_prefix(name)).and_then(|v| v.parse::<f64>().ok())
        };
        if let (Some(calls), Some(avg)) = (field("calls="), field("avg=")) {
            out.insert(fop.to_string(), (calls as u64, calls * avg));
        }
    }
    out
}

/// [`io_stats`] once it stays the same for half a second: the kernel's
/// releases of a process's files come after the process is gone.
fn settled_io_stats(mnt: &Path) -> std::collections::HashMap<String, (u64, f64)> {
    let mut last = io_stats(mnt);
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(500));
        let now = io_stats(mnt);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// Per fop in `xlfs profile`: (fop, calls at the top, what the rows add
/// up to, and the self time of the top io-stats's own row, both in
/// microseconds).
fn profile_tops(text: &str) -> Vec<(String, u64, f64, f64)> {
    let mut tops: Vec<(String, u64, f64, f64)> = Vec::new();
    let mut in_behind = false;
    for l in text.lines() {
        let head = l.split_once(": ").and_then(|(fop, rest)| {
            let calls: u64 = rest.split_once(" calls at the top")?.0.parse().ok()?;
            let per_call: f64 = rest.split_once("add up to ")?.1.split_once(" us/call")?.0.parse().ok()?;
            Some((fop.to_string(), calls, per_call * calls as f64, 0.0))
        });
        if let Some(h) = head {
            tops.push(h);
            in_behind = false;
            continue;
        }
        if l.trim_start().starts_with("behind,") {
            in_behind = true;
        }
        // A row: us/call, %, self ms, calls, self us/call, translator ...
        if !in_behind
            && l.ends_with("(debug/io-stats) mount")
            && let Some(top) = tops.last_mut()
            && let Some(self_ms) =
                l.split_whitespace().nth(2).and_then(|v| v.trim_start_matches('~').parse::<f64>().ok())
        {
            top.3 = self_ms * 1000.0;
        }
    }
    tops
}
