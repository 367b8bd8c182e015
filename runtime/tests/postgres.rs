//! PostgreSQL on an xlfs FUSE mount of a real brick process: initdb, start,
//! `pgbench -i -s 10`, `pgbench -c 4 -t 500`, then pgbench's own balance
//! invariants checked with psql. This is the workload of the GlusterFS bug
//! report xlfs grew from. It needs PostgreSQL 15 from Debian's packages
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
    let brick = kit::Brick::start();
    let m = FuseMount::start(&kit::client_volfile(&brick, &[]));
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
}
