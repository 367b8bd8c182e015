//! [`Daemon`]: a real `xlfs daemon` on a temporary state directory and a
//! free loopback port, stopped (SIGTERM, which stops its bricks; SIGKILL
//! if it hangs) when dropped, also when a test panics (then its log is
//! printed); and [`Daemon::volume`] to run `xlfs volume --daemon ADDR ...`;
//! helpers for brick directories and a mount's `xlfs status`; [`Etcd`]:
//! a real etcd on free loopback ports, for daemons of several nodes
//! ([`Daemon::start_node`]).

use super::*;
use std::os::unix::fs::MetadataExt;

/// A running `xlfs daemon`.
pub struct Daemon {
    child: Option<Child>,
    addr: String,
    dir: tempfile::TempDir,
    /// `--node` and `--store`, for a node of a cluster.
    extra: Vec<String>,
}

/// A free loopback port (bound, then released: another process could take
/// it in between, which the daemon's start would report).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// `force` if `dir` is on the root file system (create refuses it otherwise).
pub fn force_if_root(dir: &Path) -> Option<&'static str> {
    let dev = |p: &Path| std::fs::metadata(p).expect("stat").dev();
    (dev(dir) == dev(Path::new("/"))).then_some("force")
}

/// Makes `n` brick directories under `root`.
pub fn brick_dirs(root: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let d = root.join(format!("b{i}"));
            std::fs::create_dir_all(&d).expect("brick dir");
            std::fs::canonicalize(&d).expect("canonical")
        })
        .collect()
}

/// `VERB NAME replica 3 BRICK... [force]`: `xlfs volume create` or
/// `add-brick` arguments.
pub fn replica3_args(
    verb: &str,
    name: &str,
    bricks: impl IntoIterator<Item = String>,
    force: Option<&str>,
) -> Vec<String> {
    let mut a: Vec<String> = [verb, name, "replica", "3"].map(String::from).to_vec();
    a.extend(bricks);
    a.extend(force.map(String::from));
    a
}

/// Owned arguments as the `&str`s [`Daemon::ok`] and friends take.
pub fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// `127.0.0.1:DIR`: a brick argument for `xlfs volume`.
pub fn brick_arg(d: &Path) -> String {
    format!("127.0.0.1:{}", d.display())
}

/// `xlfs status MOUNTPOINT`.
pub fn mount_status(mnt: &Path) -> String {
    let out = super::run_xlfs(&["status".as_ref(), mnt.as_os_str()]);
    assert!(out.status.success(), "xlfs status: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The running graph in a status (after its `graph:` line).
pub fn graph_of(status: &str) -> &str {
    status.split_once("\ngraph:\n").map_or("", |(_, g)| g)
}

/// The graph generation a mount's status shows.
pub fn generation(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("generation: "))
        .and_then(|g| g.trim().parse().ok())
        .expect("status has a generation")
}

impl Daemon {
    /// Starts a daemon and waits for its start line.
    pub fn start() -> Daemon {
        let dir = tempfile::Builder::new().prefix("xlfs-daemon-").tempdir().expect("temp dir");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut d = Daemon { child: None, addr, dir, extra: Vec::new() };
        d.launch();
        d
    }

    /// Starts the daemon of node `ip` (a loopback address, 127.0.0.2 and
    /// so on: each node its own address) over the cluster store `store`.
    pub fn start_node(ip: &str, store: &str) -> Daemon {
        let dir = tempfile::Builder::new().prefix("xlfs-node-").tempdir().expect("temp dir");
        let addr = format!("{ip}:{}", free_port());
        let extra = ["--node", ip, "--store", store].map(String::from).to_vec();
        let mut d = Daemon { child: None, addr, dir, extra };
        d.launch();
        d
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).expect("log");
        let mut cmd = Command::new(XLFS);
        cmd.arg("daemon")
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--listen")
            .arg(&self.addr)
            .args(&self.extra)
            .env("XLFS_LOG", log_filter())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().expect("spawn xlfs daemon");
        let rx = watch_stdout(child.stdout.take().expect("stdout"), |l| l.starts_with("xlfs daemon: listening on "));
        if rx.recv_timeout(PROCESS_TIMEOUT).is_err() {
            kill_and_reap(&mut child);
            panic!("xlfs daemon did not start\n--- daemon log ---\n{}", tail(&self.log(), 60));
        }
        self.child = Some(child);
    }

    /// Its address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Its state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Its log file (also its stderr).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs `xlfs volume --daemon ADDR ARGS`; returns (success, stdout,
    /// stderr).
    pub fn volume(&self, args: &[&str]) -> (bool, String, String) {
        let mut all = vec!["volume", "--daemon", &self.addr];
        all.extend_from_slice(args);
        let out = run_xlfs(&all);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// [`Daemon::volume`] that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.volume(args);
        assert!(ok, "xlfs volume {args:?} failed: {err}\n--- daemon log ---\n{}", tail(&self.log(), 40));
        out
    }

    /// [`Daemon::volume`] that must fail; returns stderr.
    pub fn refused(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.volume(args);
        assert!(!ok, "xlfs volume {args:?} should have failed, said: {out}");
        err
    }

    /// `xlfs volume status --json VOL`: (port, pid, up, restarts) per brick.
    pub fn bricks(&self, vol: &str) -> Vec<(Option<u16>, Option<u32>, bool, u64)> {
        let out = self.ok(&["status", vol, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("status is JSON");
        v["volumes"][0]["bricks"]
            .as_array()
            .expect("bricks")
            .iter()
            .map(|b| {
                (
                    b["port"].as_u64().map(|p| p as u16),
                    b["pid"].as_u64().map(|p| p as u32),
                    b["up"].as_bool().expect("up"),
                    b["restarts"].as_u64().expect("restarts"),
                )
            })
            .collect()
    }

    /// Stops it (SIGTERM, exit 0 expected) and starts it again on the same
    /// state directory and address.
    pub fn restart(&mut self) {
        let st = self.stop();
        assert!(st.success(), "xlfs daemon exited with {st}\n--- daemon log ---\n{}", tail(&self.log(), 60));
        self.launch();
    }

    /// Starts it again after [`Daemon::stop`] (same state directory,
    /// address and arguments).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the daemon is running");
        self.launch();
    }

    /// Stops it with SIGTERM and waits; returns the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        send_signal(child.id(), libc::SIGTERM);
        match wait_timeout(&mut child, PROCESS_TIMEOUT * 2) {
            Some(st) => st,
            None => {
                kill_and_reap(&mut child);
                panic!("xlfs daemon did not stop on SIGTERM\n--- daemon log ---\n{}", tail(&self.log(), 60));
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our child, not yet reaped.
            let _ = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            if wait_timeout(&mut child, PROCESS_TIMEOUT * 2).is_none() {
                kill_and_reap(&mut child);
            }
        }
        if std::thread::panicking() {
            let log = self.log();
            let keep = std::env::temp_dir().join(format!("xlfs-daemon-{}.log", std::process::id()));
            if std::fs::write(&keep, &log).is_ok() {
                eprintln!("--- the whole daemon log is kept in {} ---", keep.display());
            }
            eprintln!("--- daemon log ({}) ---\n{}", self.log_path().display(), tail(&log, 80));
        }
    }
}

/// Waits (blocking, polling every 100 ms) until `f` returns `Some`, at
/// most `within`; panics naming `what` after that.
pub fn wait_for<T>(what: &str, within: std::time::Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A real single-member etcd (`etcd` from Debian's etcd-server) on free
/// loopback ports and its own data directory; stopped when dropped.
pub struct Etcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client: u16,
    peer: u16,
}

impl Etcd {
    /// Starts it and waits until it answers.
    pub fn start() -> Etcd {
        let dir = tempfile::Builder::new().prefix("xlfs-etcd-").tempdir().expect("temp dir");
        let mut e = Etcd { child: None, dir, client: free_port(), peer: free_port() };
        e.launch();
        e
    }

    /// `etcd://127.0.0.1:PORT`, for `xlfs daemon --store`.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).expect("log");
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let client = format!("http://127.0.0.1:{}", self.client);
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg("test")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("test={peer}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log));
        die_with_parent(&mut cmd);
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!("cannot run etcd ({e}): install Debian's etcd-server (scripts/install-deps.sh does)"),
        };
        self.child = Some(child);
        let addr = format!("127.0.0.1:{}", self.client);
        wait_for("etcd to answer", PROCESS_TIMEOUT, || {
            let mut s = std::net::TcpStream::connect(&addr).ok()?;
            use std::io::{Read, Write};
            s.write_all(b"GET /health HTTP/1.0\r\n\r\n").ok()?;
            let mut out = String::new();
            s.read_to_string(&mut out).ok()?;
            out.contains("\"health\":\"true\"").then_some(())
        });
    }

    /// Stops it (SIGTERM) and waits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            send_signal(child.id(), libc::SIGTERM);
            if wait_timeout(&mut child, PROCESS_TIMEOUT).is_none() {
                kill_and_reap(&mut child);
            }
        }
    }

    /// Starts it again on the same data and ports.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- etcd log ---\n{}", tail(&std::fs::read_to_string(self.log_path()).unwrap_or_default(), 30));
        }
    }
}
