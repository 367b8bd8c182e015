//! The end-to-end test kit, shared by the test files (`mod kit;`):
//!
//! - [`Brick`] / [`Cluster`]: real `xlfs brick` processes on free loopback
//!   ports, each in its own temporary directory (`brick/` is served,
//!   `brick.log` holds its log and stderr), with kill (SIGKILL), stop
//!   (SIGTERM, exit 0 expected), pause/resume (SIGSTOP/SIGCONT) and restart
//!   on the same port. Dropping one kills and reaps the process (also when a
//!   test panics, and then its log is printed) and removes the directory.
//! - [`mount`], [`mount_with`], [`client_graph`]: an in-process client graph
//!   (protocol/client -> debug/io-stats) on a brick, and the
//!   [`Client`](xlfs_runtime::client::Client) over it.
//! - [`TestProcess`]: re-runs this test binary as a separate process that
//!   plays a role (for example a lock holder to be killed with SIGKILL).
//! - [`run_xlfs`]: runs the `xlfs` binary to completion, for failure cases;
//!   [`heal`] and [`heal_until_clean`] run `xlfs heal` on a volfile
//!   ([`volfile_file`] writes one); [`assert_bricks_identical`] compares
//!   the bricks' copies.
//! - [`daemon`]: a real `xlfs daemon` on a free port, and `xlfs volume`
//!   commands to it.
//! - [`fuse_mount`]: a FUSE mount by a real `xlfs mount` process, and `sh`
//!   to run a bash script on it.
//! - [`workload`]: the foundation's client-API workload, run in-process and
//!   over the network with the same assertions.
//! - [`netns`]: hosts in network namespaces on a bridge (bricks started in
//!   them with [`netns::Net::brick`] configs), links cut or degraded, and
//!   small loop-mounted file systems; [`ledger`]: a writer through a mount
//!   that records what it was promised and checks it afterwards, and a
//!   watch for threads stuck in D state.
//!
//! Everything is per test (no fixed ports, no shared directories), so tests
//! run in parallel. Spawned processes get `PR_SET_PDEATHSIG`, so they die
//! with the thread that started them even if the test process is killed:
//! start bricks from the test's own thread, not from spawned tasks.
#![allow(dead_code)]

pub mod daemon;
pub mod fuse_mount;
pub mod ledger;
pub mod netns;
mod process;
pub mod raw;
mod replica;
pub mod tls;
pub mod workload;

// Not every test file uses them (each compiles the kit on its own).
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use replica::*;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xlfs_runtime::client::Client;
use xlfs_runtime::graph::{Graph, TopState};
use xlfs_runtime::registry::Registry;

/// The `xlfs` binary under test.
pub const XLFS: &str = env!("CARGO_BIN_EXE_xlfs");

/// How long a brick (or a helper process) may take to start, or to exit
/// once told to: a hang guard, not a performance figure.
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a client graph may take to come up.
pub const UP_TIMEOUT: Duration = Duration::from_secs(20);

/// The log filter for bricks: `XLFS_TEST_LOG`, else `info`.
fn log_filter() -> String {
    std::env::var("XLFS_TEST_LOG").unwrap_or_else(|_| "info".to_string())
}

/// Logs of the test process itself (client graphs) go to the test's
/// captured output; filter from `XLFS_TEST_LOG`, else `info`.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(log_filter()))
        .with_ansi(false)
        .with_test_writer()
        .try_init();
}

/// Makes `cmd`'s process die with the thread that spawns it.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sends `sig` to a process.
fn send_signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid we spawned and have not reaped.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
}

/// True when every thread of process `pid` is stopped (state `T`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the parenthesised command name.
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

/// Waits for `child` to exit, at most `timeout`.
fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => return None,
            Err(e) => panic!("waiting for pid {}: {e}", child.id()),
        }
    }
}

/// Kills (SIGKILL) and reaps `child` unless it already exited.
fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Reads `stdout` on a thread until EOF; the first line that `want` accepts
/// is sent on the returned channel.
fn watch_stdout(
    stdout: std::process::ChildStdout,
    want: impl Fn(&str) -> bool + Send + 'static,
) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !sent && want(&line) {
                sent = true;
                let _ = tx.send(line);
            }
        }
    });
    rx
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// How a brick is configured beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct BrickConfig {
    /// `--allow` patterns (empty: all addresses).
    pub allow: Vec<String>,
    /// Extra options for the brick's protocol/server volume. When not empty
    /// the brick is started from a volfile (`--print-volfile`, these options
    /// added, then `--volfile`) instead of `--dir`.
    pub server_options: Vec<(String, String)>,
    /// Options of the brick's storage/posix (`--posix KEY=VALUE`).
    pub posix: Vec<(String, String)>,
    /// The network namespace the brick runs in (`ip netns exec NS`; see
    /// [`netns`]); `None`: this one.
    pub netns: Option<String>,
    /// The address the brick listens on and clients reach it at (default
    /// `127.0.0.1`).
    pub host: Option<String>,
    /// The directory in which the brick's `brick` directory is made (for
    /// bricks on a file system of the test's own); default: the brick's
    /// temporary directory.
    pub parent: Option<PathBuf>,
}

impl BrickConfig {
    /// A config with these `--allow` patterns.
    pub fn allow(patterns: &[&str]) -> BrickConfig {
        BrickConfig { allow: patterns.iter().map(|p| p.to_string()).collect(), ..BrickConfig::default() }
    }

    /// A config with these server options (`{dir}` in a key or value
    /// becomes the brick path, the server's subvolume).
    pub fn server_options(options: &[(&str, &str)]) -> BrickConfig {
        BrickConfig {
            server_options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..BrickConfig::default()
        }
    }
}

/// A running (or stopped, or killed) `xlfs brick` process.
pub struct Brick {
    root: tempfile::TempDir,
    dir: PathBuf,
    config: BrickConfig,
    /// 0 until the first start has reported its port.
    port: u16,
    child: Option<Child>,
}

/// A brick process that was spawned but has not reported its address yet.
struct Launch {
    child: Child,
    line: mpsc::Receiver<String>,
}

impl Brick {
    /// Starts a brick with the default configuration and waits until it serves.
    pub fn start() -> Brick {
        Brick::start_with(BrickConfig::default())
    }

    /// Starts a brick configured by `config` and waits until it serves.
    pub fn start_with(config: BrickConfig) -> Brick {
        let mut b = Brick::new(config);
        let launch = b.launch();
        b.finish_start(launch);
        b
    }

    fn new(config: BrickConfig) -> Brick {
        let root = tempfile::Builder::new().prefix("xlfs-kit-").tempdir().expect("brick temp dir");
        let dir = config.parent.as_deref().unwrap_or(root.path()).join("brick");
        std::fs::create_dir(&dir).expect("brick dir");
        let dir = std::fs::canonicalize(&dir).expect("canonical brick dir");
        Brick { root, dir, config, port: 0, child: None }
    }

    /// The directory the brick serves (absolute, canonical).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The brick's TCP port on [`Brick::host`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address it listens on (`127.0.0.1` unless configured).
    pub fn host(&self) -> &str {
        self.config.host.as_deref().unwrap_or("127.0.0.1")
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.host().parse().expect("brick host is an IP address"), self.port)
    }

    /// The name clients give as `remote-subvolume`: the brick path.
    pub fn subvolume(&self) -> String {
        self.dir.display().to_string()
    }

    /// The volume name (`NAME` in `NAME-server`): the directory's name.
    pub fn volume(&self) -> &str {
        "brick"
    }

    /// The log file (the brick's log and its stderr, over all its runs).
    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("brick.log")
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; false after `timeout`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_log_line(&[needle], timeout)
    }

    /// Waits until one line of the log contains every one of `needles`;
    /// false after `timeout`.
    pub fn wait_log_line(&self, needles: &[&str], timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().lines().any(|l| needles.iter().all(|n| l.contains(n))) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id, while one runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The command line arguments for the next start.
    fn args(&self) -> Vec<String> {
        let log = self.log_path().display().to_string();
        let port = self.port.to_string();
        let mut args: Vec<String> = ["brick", "--log-file", &log].map(String::from).to_vec();
        if self.config.server_options.is_empty() {
            args.extend(["--dir", &self.subvolume(), "--port", &port, "--host", self.host()].map(String::from));
            if !self.config.allow.is_empty() {
                args.push("--allow".into());
                args.extend(self.config.allow.iter().cloned());
            }
            for (k, v) in &self.config.posix {
                args.extend(["--posix".to_string(), format!("{k}={v}")]);
            }
        } else {
            let vol = self.write_volfile(&port);
            args.extend(["--volfile".to_string(), vol.display().to_string()]);
        }
        args
    }

    /// Writes the brick's volfile with the extra server options (for
    /// `port`) and returns its path.
    fn write_volfile(&self, port: &str) -> PathBuf {
        let mut argv =
            vec!["brick", "--dir", self.dir.to_str().expect("utf-8 path"), "--port", port, "--host", self.host()];
        if !self.config.allow.is_empty() {
            argv.push("--allow");
            argv.extend(self.config.allow.iter().map(String::as_str));
        }
        let posix: Vec<String> = self.config.posix.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for kv in &posix {
            argv.extend(["--posix", kv.as_str()]);
        }
        argv.push("--print-volfile");
        let out = run_xlfs(&argv);
        assert!(out.status.success(), "xlfs brick --print-volfile: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).expect("utf-8 volfile");
        let server_type = "    type protocol/server\n";
        let at = text.find(server_type).expect("generated volfile has a server") + server_type.len();
        let sub = self.subvolume();
        let extra: String = self
            .config
            .server_options
            .iter()
            .map(|(k, v)| format!("    option {} {}\n", k.replace("{dir}", &sub), v.replace("{dir}", &sub)))
            .collect();
        let path = self.root.path().join("brick.vol");
        std::fs::write(&path, format!("{}{extra}{}", &text[..at], &text[at..])).expect("write brick volfile");
        path
    }

    /// Spawns the process.
    fn launch(&self) -> Launch {
        assert!(self.child.is_none(), "brick already running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).expect("open brick log");
        // `ip netns exec` execs the brick in place: the pid is the brick's.
        let mut cmd = match &self.config.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, XLFS]);
                c
            }
            None => Command::new(XLFS),
        };
        cmd.args(self.args())
            .env("XLFS_LOG", log_filter())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().expect("spawn xlfs brick");
        let stdout = child.stdout.take().expect("piped stdout");
        let line = watch_stdout(stdout, |l| l.starts_with("xlfs brick: serving "));
        Launch { child, line }
    }

    /// Waits for the start line and records the port; panics (with the log)
    /// if the brick exits or does not report in time.
    fn finish_start(&mut self, launch: Launch) {
        if let Err(why) = self.try_finish_start(launch) {
            panic!("brick {} did not start: {why}\n--- brick log ---\n{}", self.dir.display(), tail(&self.log(), 60));
        }
    }

    fn try_finish_start(&mut self, mut launch: Launch) -> Result<(), String> {
        let line = match launch.line.recv_timeout(PROCESS_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                let status = launch.child.try_wait().ok().flatten();
                kill_and_reap(&mut launch.child);
                return Err(match status {
                    Some(s) => format!("exited with {s} before serving"),
                    None => format!("no start line within {PROCESS_TIMEOUT:?}"),
                });
            }
        };
        let parsed = line
            .strip_prefix("xlfs brick: serving ")
            .and_then(|rest| rest.rsplit_once(" on "))
            .and_then(|(what, addr)| Some((what.split_once(" as ")?, addr.parse::<SocketAddr>().ok()?)));
        let Some(((served, name), addr)) = parsed else {
            kill_and_reap(&mut launch.child);
            return Err(format!("unexpected start line {line:?}"));
        };
        assert_eq!(served, self.subvolume(), "start line names the brick path: {line}");
        assert_eq!(name, self.volume(), "start line names the volume: {line}");
        assert!(
            self.port == 0 || self.port == addr.port(),
            "restarted on port {} instead of {}",
            addr.port(),
            self.port
        );
        self.port = addr.port();
        self.child = Some(launch.child);
        Ok(())
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("brick is running");
        kill_and_reap(&mut child);
    }

    /// Sends SIGTERM and waits for the exit; asserts it is 0.
    pub fn stop(&mut self) {
        let status = self.stop_with(libc::SIGTERM);
        assert!(
            status.success(),
            "brick exited with {status} on SIGTERM\n--- brick log ---\n{}",
            tail(&self.log(), 60)
        );
    }

    /// Sends `sig` and waits for the process to exit (at most
    /// [`PROCESS_TIMEOUT`], then it is killed and this panics).
    pub fn stop_with(&mut self, sig: libc::c_int) -> ExitStatus {
        self.signal(sig);
        self.wait_exit(PROCESS_TIMEOUT)
    }

    /// Sends `sig` to the running process.
    pub fn signal(&self, sig: libc::c_int) {
        send_signal(self.pid().expect("brick is running"), sig);
    }

    /// Waits for the process to exit (at most `timeout`, then it is killed
    /// and this panics) and reaps it.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("brick is running");
        match wait_timeout(&mut child, timeout) {
            Some(status) => status,
            None => {
                kill_and_reap(&mut child);
                panic!("brick did not exit within {timeout:?}\n--- brick log ---\n{}", tail(&self.log(), 60));
            }
        }
    }

    /// Freezes the process (SIGSTOP): its connections stay open but nothing
    /// answers, like a hung or unreachable server.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
        // kill(2) returns before the threads stop: wait until all have.
        let pid = self.pid().expect("brick is running");
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        while !all_threads_stopped(pid) {
            assert!(Instant::now() < deadline, "brick did not stop on SIGSTOP");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Starts the brick again on the same directory and port (killing it
    /// first if it still runs) and waits until it serves. Retries for a
    /// while if the port is still held.
    pub fn restart(&mut self) {
        if self.child.is_some() {
            self.kill();
        }
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            let before = self.log().len();
            let launch = self.launch();
            match self.try_finish_start(launch) {
                Ok(()) => return,
                Err(why) => {
                    let log = self.log();
                    let in_use = log.get(before..).is_some_and(|l| l.contains("in use"));
                    if !in_use || Instant::now() >= deadline {
                        panic!(
                            "brick {} did not restart: {why}\n--- brick log ---\n{}",
                            self.dir.display(),
                            tail(&log, 60)
                        );
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

impl Drop for Brick {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            kill_and_reap(child);
        }
        if std::thread::panicking() {
            eprintln!(
                "--- log of brick {} (port {}) ---\n{}\n--- end of brick log ---",
                self.dir.display(),
                self.port,
                tail(&self.log(), 200)
            );
        }
    }
}

/// Several bricks, started together.
pub struct Cluster {
    /// The bricks, in start order.
    pub bricks: Vec<Brick>,
}

/// The peak resident memory (VmHWM) of process `pid` in MiB, if it runs.
pub fn peak_rss_mib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024)
}

impl Cluster {
    /// Starts `n` default bricks (all spawned first, then each awaited).
    pub fn start(n: usize) -> Cluster {
        Cluster::start_with((0..n).map(|_| BrickConfig::default()).collect())
    }

    /// Starts one brick per config (all spawned first, then each awaited).
    pub fn start_with(configs: Vec<BrickConfig>) -> Cluster {
        let mut bricks: Vec<Brick> = configs.into_iter().map(Brick::new).collect();
        let launches: Vec<Launch> = bricks.iter().map(Brick::launch).collect();
        for (b, l) in bricks.iter_mut().zip(launches) {
            b.finish_start(l);
        }
        Cluster { bricks }
    }
}

impl Cluster {
    /// The client volfile of a replicated volume `rep3` over these bricks
    /// (`rep3-client-<i>` -> `rep3-replicate-0` with `afr` options ->
    /// io-stats `rep3`; see [`xlfs_runtime::cli::replica_volfile`]).
    pub fn replica_volfile(&self, afr: &[(&str, &str)]) -> String {
        let bricks: Vec<(u16, String)> = self.bricks.iter().map(|b| (b.port(), b.subvolume())).collect();
        xlfs_runtime::cli::replica_volfile("rep3", &bricks, afr)
    }

    /// [`Cluster::replica_volfile`] with each protocol/client reaching its
    /// brick at [`Brick::host`] and given `client` options too.
    pub fn replica_volfile_with(&self, afr: &[(&str, &str)], client: &[(&str, &str)]) -> String {
        let to: Vec<(String, u16)> = self.bricks.iter().map(|b| (b.host().to_string(), b.port())).collect();
        self.replica_volfile_to(&to, afr, client)
    }

    /// [`Cluster::replica_volfile_with`] with brick `i` reached at
    /// `to[i]` (host, port): through a relay, for example.
    pub fn replica_volfile_to(&self, to: &[(String, u16)], afr: &[(&str, &str)], client: &[(&str, &str)]) -> String {
        let bricks: Vec<(u16, String)> = to.iter().zip(&self.bricks).map(|((_, p), b)| (*p, b.subvolume())).collect();
        let text = xlfs_runtime::cli::replica_volfile("rep3", &bricks, afr);
        let at = "    option remote-host 127.0.0.1\n";
        let parts: Vec<&str> = text.split(at).collect();
        assert_eq!(parts.len(), self.bricks.len() + 1, "one remote-host per brick in:\n{text}");
        let extra: String = client.iter().map(|(k, v)| format!("    option {k} {v}\n")).collect();
        let mut out = parts[0].to_string();
        for ((host, _), rest) in to.iter().zip(&parts[1..]) {
            out += &format!("    option remote-host {host}\n{extra}");
            out += rest;
        }
        out
    }
}

impl std::ops::Index<usize> for Cluster {
    type Output = Brick;
    fn index(&self, i: usize) -> &Brick {
        &self.bricks[i]
    }
}

impl std::ops::IndexMut<usize> for Cluster {
    fn index_mut(&mut self, i: usize) -> &mut Brick {
        &mut self.bricks[i]
    }
}

/// The volfile of a client graph on `brick`: protocol/client `client-0`
/// (remote-host 127.0.0.1, the brick's port and subvolume) under
/// debug/io-stats `client`. `options` add to or replace the client's
/// options.
pub fn client_volfile(brick: &Brick, options: &[(&str, &str)]) -> String {
    client_volfile_to(brick.port(), &brick.subvolume(), options)
}

/// [`client_volfile`] for a brick known by port and subvolume only.
pub fn client_volfile_to(port: u16, subvolume: &str, options: &[(&str, &str)]) -> String {
    let port = port.to_string();
    let mut opts: Vec<(&str, &str)> =
        vec![("remote-host", "127.0.0.1"), ("remote-port", &port), ("remote-subvolume", subvolume)];
    for &(k, v) in options {
        match opts.iter_mut().find(|(key, _)| *key == k) {
            Some(slot) => slot.1 = v,
            None => opts.push((k, v)),
        }
    }
    let lines: String = opts.iter().map(|(k, v)| format!("    option {k} {v}\n")).collect();
    format!(
        "volume client-0\n    type protocol/client\n{lines}end-volume\n\n\
         volume client\n    type debug/io-stats\n    subvolumes client-0\nend-volume\n"
    )
}

/// Builds and activates the graph in `volfile`, without waiting for it.
pub fn graph_from(volfile: &str) -> Graph {
    init_tracing();
    let g = Graph::from_str(volfile, "kit-client.vol", &Registry::builtin()).expect("client volfile builds");
    g.activate();
    g
}

/// A client graph on `brick` with `options` (see [`client_volfile`]),
/// activated but not waited for (for clients that should be refused).
pub fn client_graph(brick: &Brick, options: &[(&str, &str)]) -> Graph {
    graph_from(&client_volfile(brick, options))
}

/// An in-process client of a brick: the API client and its graph (drop
/// the graph, or call `graph.shutdown()`, to disconnect).
pub struct Mount {
    /// The client API over the graph's top.
    pub client: Client,
    /// The client graph.
    pub graph: Graph,
}

/// Connects a client graph to `brick` and waits until it is up.
pub async fn mount(brick: &Brick) -> Mount {
    mount_with(brick, &[]).await
}

/// Connects a client graph with `options` to `brick` and waits until it is up.
pub async fn mount_with(brick: &Brick, options: &[(&str, &str)]) -> Mount {
    let graph = client_graph(brick, options);
    if let Err(e) = graph.wait_up(UP_TIMEOUT).await {
        panic!("client of {} did not come up: {e}\n--- brick log ---\n{}", brick.subvolume(), tail(&brick.log(), 60));
    }
    Mount { client: Client::new(graph.top()), graph }
}

/// Connects a client graph to the brick at 127.0.0.1:`port` serving
/// `subvolume` and waits until it is up (for [`TestProcess`] roles, which
/// have no [`Brick`]).
pub async fn mount_to(port: u16, subvolume: &str, options: &[(&str, &str)]) -> Mount {
    let graph = graph_from(&client_volfile_to(port, subvolume, options));
    graph.wait_up(UP_TIMEOUT).await.expect("client comes up");
    Mount { client: Client::new(graph.top()), graph }
}

/// Waits until `graph`'s top is in `state`; false after `timeout`.
pub async fn wait_state(graph: &Graph, state: TopState, timeout: Duration) -> bool {
    let mut rx = graph.subscribe();
    tokio::time::timeout(timeout, rx.wait_for(|s| *s == state)).await.is_ok_and(|r| r.is_ok())
}

/// `xlfs status --dump` of the mount on `mnt`, as key -> value.
pub fn status_dump(mnt: &Path) -> std::collections::HashMap<String, String> {
    let out = run_xlfs(&[OsStr::new("status"), "--dump".as_ref(), mnt.as_os_str()]);
    assert!(out.status.success(), "xlfs status --dump: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Runs `xlfs ARGS` to completion (killed after [`PROCESS_TIMEOUT`], then
/// this panics) and returns its output. Logs go to stderr at `warn`.
pub fn run_xlfs<S: AsRef<OsStr>>(args: &[S]) -> Output {
    let mut cmd = Command::new(XLFS);
    cmd.args(args).env("XLFS_LOG", "warn").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().expect("spawn xlfs");
    let (mut out, mut err) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut v);
        v
    });
    let Some(status) = wait_timeout(&mut child, PROCESS_TIMEOUT) else {
        kill_and_reap(&mut child);
        panic!(
            "xlfs {:?} did not finish within {PROCESS_TIMEOUT:?}",
            args.iter().map(|a| a.as_ref().to_owned()).collect::<Vec<_>>()
        );
    };
    Output { status, stdout: out_t.join().expect("stdout reader"), stderr: err_t.join().expect("stderr reader") }
}

/// A tmpfs of a given size mounted on a directory for one test (root only:
/// `None` otherwise), detached when dropped.
pub struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    /// Mounts a tmpfs of `size` (e.g. `48m`) on the existing directory `at`.
    pub fn mount(at: &Path, size: &str) -> Option<SmallTmpfs> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallTmpfs(at.to_path_buf()))
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
