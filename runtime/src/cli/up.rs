//! `xlfs up [DIR]` and `xlfs down [DIR]`: a local replica-3 volume (or,
//! with `--sets N`, N replica-3 sets under cluster/distribute) in one
//! command, for trying xlfs and for development.
//!
//! `up` lays out `DIR` (default `./xlfs-data`):
//!
//! ```text
//! DIR/bricks/b0 b1 b2   the brick directories, three per set (kept across up/down)
//! DIR/client.vol        the client volfile (rewritten by each `up`)
//! DIR/mnt               the mount point
//! DIR/logs/*.log        one log per process
//! DIR/run/*.pid         the processes `up` started, for `down`
//! ```
//!
//! It starts three `xlfs brick` processes per set on free loopback ports
//! (each reports the port it bound in its start line), writes a client
//! volfile (protocol/client x3 -> cluster/replicate per set, ->
//! cluster/distribute over the sets when there are several, -> the
//! performance translators -> debug/io-stats, as GlusterFS generates for a
//! (distributed-)replicate volume), starts the self-heal daemon
//! (`xlfs heal --daemon`) and mounts the volume with `xlfs mount`, then
//! prints what it did and how to stop it. If anything fails, what was
//! started is stopped again.
//!
//! `down` unmounts and stops, in that order, the mount, the heal daemon
//! and the bricks (SIGTERM, then waits for each to exit); the data stays in
//! the bricks for the next `up`. A pid is only signalled while its
//! `/proc/PID/cmdline` is still the xlfs process `up` started.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use xlfs_sdk::guest::sys::Placement;

use super::CliError;
use crate::mgmt::keys::Plugin;
use crate::mgmt::volgen::stack_plugins;

/// The volume's name (its top volume and the prefix of its translators).
const VOLUME: &str = "xlfs";

/// Bricks per replica set.
const REPLICAS: usize = 3;

/// Most replica sets `--sets` takes.
const MAX_SETS: usize = 32;

/// How long a brick may take to report that it serves.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a process may take to exit after SIGTERM (a brick drains its
/// in-flight fops for up to 30 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(40);

/// `xlfs up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where the bricks, the volfile, the logs and the mount point go.
    #[arg(default_value = "xlfs-data")]
    pub dir: PathBuf,
    /// Mount options for `xlfs mount -o` (comma-separated).
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Option<String>,
    /// Extra `cluster/replicate` options in the client volfile, as
    /// KEY=VALUE (e.g. lock-contention-policy=inodelk-count); repeatable.
    #[arg(long = "afr", value_name = "KEY=VALUE")]
    pub afr: Vec<String>,
    /// storage/posix options for every brick, as KEY=VALUE (e.g.
    /// o-direct-min-size=0); repeatable.
    #[arg(long = "posix", value_name = "KEY=VALUE")]
    pub posix: Vec<String>,
    /// Do not start the self-heal daemon.
    #[arg(long)]
    pub no_shd: bool,
    /// Replica-3 sets; more than one puts cluster/distribute over them
    /// (bricks b0..b2 are the first set, b3..b5 the second, ...).
    /// Default: as many as DIR holds already, else 1. A DIR made with
    /// another number is refused (a volume grows by add-brick and
    /// rebalance under `xlfs daemon`, not by a new layout over its data).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_SETS as i64))]
    pub sets: Option<u16>,
    /// The performance translators of the client graph, top first,
    /// comma-separated (`none` for none); default: md-cache, quick-read,
    /// open-behind, readdir-ahead, write-behind.
    #[arg(long, value_name = "LIST")]
    pub perf: Option<String>,
    /// A plugin translator in the client graph, as NAME=wasm:/ABS/PATH or
    /// NAME=dylib:/ABS/PATH, where its module asks to sit (as a volume's
    /// `plugin.NAME` key); repeatable, stacked in the order of their names.
    #[arg(long = "plugin", value_name = "NAME=SPEC")]
    pub plugins: Vec<String>,
    /// TLS between the mount (and the heal daemon) and the bricks, both
    /// ways: this node's certificate (PEM), used by bricks and clients
    /// alike; give it with --ssl-private-key and --ssl-ca-list
    /// (GlusterFS's `transport.socket.ssl-*`).
    #[arg(long, value_name = "FILE", requires_all = ["ssl_private_key", "ssl_ca_list"])]
    pub ssl_own_cert: Option<PathBuf>,
    /// The private key of --ssl-own-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "ssl_own_cert")]
    pub ssl_private_key: Option<PathBuf>,
    /// The CAs whose certificates the bricks and clients accept (PEM).
    #[arg(long, value_name = "FILE", requires = "ssl_own_cert")]
    pub ssl_ca_list: Option<PathBuf>,
    /// The certificate common names the bricks let in, comma-separated
    /// (`*` wildcards; default: any the CA signed).
    #[arg(long, value_name = "NAMES", requires = "ssl_own_cert")]
    pub ssl_allow: Option<String>,
}

/// `xlfs down`.
#[derive(Debug, Args)]
pub struct DownArgs {
    /// The directory `xlfs up` used.
    #[arg(default_value = "xlfs-data")]
    pub dir: PathBuf,
}

/// Why up or down failed.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// A file or directory under DIR could not be used.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A process could not be started or did not start.
    #[error("starting {what}: {why} (log: {})", log.display())]
    Start {
        /// Which process.
        what: String,
        /// Why.
        why: String,
        /// Its log.
        log: PathBuf,
    },
    /// The volume is running already.
    #[error("{} is already up ({running}); run `xlfs down {}` first", dir.display(), dir.display())]
    AlreadyUp {
        /// DIR.
        dir: PathBuf,
        /// What runs.
        running: String,
    },
    /// A `--afr` or `--posix` value is not KEY=VALUE.
    #[error("{flag} {value:?}: expected KEY=VALUE with no whitespace")]
    BadOption {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: String,
    },
    /// A `--plugin` that does not name a loadable module.
    #[error("--plugin {value:?}: {why}")]
    BadPlugin {
        /// The value given.
        value: String,
        /// Why.
        why: String,
    },
    /// `--sets` differs from what DIR holds.
    #[error(
        "{} holds a volume of {have} replica set(s); `xlfs up` brings it back as it is: drop --sets, or give \
         --sets {have} (to grow a volume, use `xlfs volume add-brick` and `rebalance` under `xlfs daemon`)",
        dir.display()
    )]
    SetsMismatch {
        /// DIR.
        dir: PathBuf,
        /// The sets DIR holds.
        have: usize,
        /// The sets asked for.
        want: usize,
    },
    /// Some processes did not stop.
    #[error("still running after {STOP_TIMEOUT:?}: {0}")]
    NotStopped(String),
}

/// The paths under DIR.
struct Layout {
    dir: PathBuf,
}

impl Layout {
    fn new(dir: &Path) -> Result<Layout, UpError> {
        std::fs::create_dir_all(dir).map_err(|source| UpError::Io { path: dir.to_path_buf(), source })?;
        let dir = std::fs::canonicalize(dir).map_err(|source| UpError::Io { path: dir.to_path_buf(), source })?;
        Ok(Layout { dir })
    }

    fn brick(&self, i: usize) -> PathBuf {
        self.dir.join("bricks").join(format!("b{i}"))
    }
    fn volfile(&self) -> PathBuf {
        self.dir.join("client.vol")
    }
    fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }
    fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }
    fn pid_file(&self, name: &str) -> PathBuf {
        self.dir.join("run").join(format!("{name}.pid"))
    }

    /// The processes `up` starts with `bricks` bricks, in stop order.
    fn names_for(bricks: usize) -> Vec<String> {
        let mut v = vec!["mount".to_string(), "shd".to_string()];
        v.extend((0..bricks).map(|i| format!("b{i}")));
        v
    }

    /// The processes an `up` may have started here: as many bricks as the
    /// pid files under `run/` name (at least one set's).
    fn names(&self) -> Vec<String> {
        let recorded = std::fs::read_dir(self.dir.join("run"))
            .into_iter()
            .flatten()
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix('b')?.strip_suffix(".pid")?.parse::<usize>().ok()
            })
            .map(|i| i + 1)
            .max()
            .unwrap_or(0);
        Layout::names_for(recorded.clamp(REPLICAS, REPLICAS * MAX_SETS))
    }

    /// The replica sets an earlier `up` made here (brick directories
    /// b0, b1, ... in a row, by sets of three).
    fn sets_made(&self) -> usize {
        (0..REPLICAS * MAX_SETS).take_while(|i| self.brick(*i).is_dir()).count() / REPLICAS
    }

    fn mkdirs(&self, bricks: usize) -> Result<(), UpError> {
        let mut dirs = vec![self.dir.join("logs"), self.dir.join("run"), self.mnt()];
        dirs.extend((0..bricks).map(|i| self.brick(i)));
        for d in dirs {
            std::fs::create_dir_all(&d).map_err(|source| UpError::Io { path: d, source })?;
        }
        Ok(())
    }

    /// The live process recorded under `name`, if any.
    fn running(&self, name: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.pid_file(name)).ok()?.trim().parse().ok()?;
        is_ours(pid, &self.dir).then_some(pid)
    }

    fn record(&self, name: &str, pid: u32) -> Result<(), UpError> {
        let path = self.pid_file(name);
        std::fs::write(&path, format!("{pid}\n")).map_err(|source| UpError::Io { path, source })
    }
}

/// True while `pid` is an xlfs process whose command line names `dir`.
fn is_ours(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let dir = dir.as_os_str().as_encoded_bytes();
    let names_dir = args.iter().any(|a| a.windows(dir.len()).any(|w| w == dir));
    // Any build or copy of the binary (xlfs, xlfs-1.2, a rebuilt one ...).
    let is_xlfs = args.first().is_some_and(|a| a.rsplit(|b| *b == b'/').next().is_some_and(|n| n.starts_with(b"xlfs")));
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(true);
    is_xlfs && names_dir && !zombie
}

/// True if `path` is a mount whose FUSE process is gone ("Transport
/// endpoint is not connected").
/// Whether something is mounted on `path` (its device differs from its
/// parent's).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), path.parent().map(std::fs::metadata)) {
        (Ok(m), Some(Ok(p))) => m.dev() != p.dev(),
        _ => false,
    }
}

fn is_dead_mount(path: &Path) -> bool {
    std::fs::metadata(path).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
}

/// A process `up` started.
struct Started {
    name: String,
    pid: u32,
}

impl UpArgs {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let afr = key_values("--afr", &self.afr)?;
        let posix = key_values("--posix", &self.posix)?;
        let mut plugins = Vec::new();
        for (kv, (name, spec)) in self.plugins.iter().zip(key_values("--plugin", &self.plugins)?) {
            let bad = |why: String| UpError::BadPlugin { value: kv.clone(), why };
            let p = crate::mgmt::keys::plugin(&format!("plugin.{name}"), &spec).map_err(|e| bad(e.to_string()))?;
            let at = p.placement().map_err(bad)?;
            plugins.push((p, at));
        }
        plugins.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        let tls = self.tls()?;
        let lay = Layout::new(&self.dir)?;
        let running: Vec<String> =
            lay.names().iter().filter_map(|n| lay.running(n).map(|p| format!("{n} pid {p}"))).collect();
        if !running.is_empty() {
            return Err(UpError::AlreadyUp { dir: lay.dir.clone(), running: running.join(", ") }.into());
        }
        let have = lay.sets_made();
        let sets = match (self.sets.map(usize::from), have) {
            (None, 0) => 1,
            (None, n) => n,
            (Some(want), n) if n == 0 || want == n => want,
            (Some(want), n) => return Err(UpError::SetsMismatch { dir: lay.dir.clone(), have: n, want }.into()),
        };
        let bricks = REPLICAS * sets;
        lay.mkdirs(bricks)?;
        // A mount left behind by a process that died.
        if is_dead_mount(&lay.mnt()) {
            let _ = crate::fuse::lazy_unmount(&lay.mnt());
        }
        let perf: Vec<String> = match self.perf.as_deref() {
            None => DEFAULT_PERF.iter().map(|p| p.to_string()).collect(),
            Some("none") | Some("") => Vec::new(),
            Some(list) => list.split(',').map(|p| p.trim().to_string()).collect(),
        };
        let (no_shd, options, ssl_allow) = (self.no_shd, self.options, self.ssl_allow);
        let report = tokio::task::spawn_blocking(move || {
            let mut started = Vec::new();
            let graph = Graph { afr: &afr, perf: &perf, plugins: &plugins, tls: &tls, ssl_allow: ssl_allow.as_deref() };
            match start_all(&lay, bricks, &graph, &posix, no_shd, options.as_deref(), &mut started) {
                Ok(lines) => Ok(lines),
                Err(e) => {
                    stop(&lay, &started);
                    Err(e)
                }
            }
        })
        .await
        .map_err(|e| UpError::Start { what: "xlfs up".into(), why: e.to_string(), log: PathBuf::new() })??;
        out.write_all(report.as_bytes())?;
        out.flush()?;
        Ok(())
    }
}

/// How the user can run this binary again: `xlfs` when that name on PATH
/// is this binary, else its full path (a build from source, not installed).
fn command_name(exe: &Path) -> String {
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| {
            std::fs::canonicalize(d.join("xlfs")).ok().zip(std::fs::canonicalize(exe).ok()).is_some_and(|(a, b)| a == b)
        })
    });
    if on_path { "xlfs".to_string() } else { exe.display().to_string() }
}

/// Parses repeated `flag KEY=VALUE` arguments.
fn key_values(flag: &'static str, list: &[String]) -> Result<Vec<(String, String)>, UpError> {
    list.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() && !v.is_empty() && !kv.contains(char::is_whitespace) => {
                Ok((k.to_string(), v.to_string()))
            }
            _ => Err(UpError::BadOption { flag, value: kv.clone() }),
        })
        .collect()
}

/// What the client graph is made of, besides the bricks.
struct Graph<'a> {
    afr: &'a [(String, String)],
    perf: &'a [String],
    plugins: &'a [(Plugin, Placement)],
    /// `transport.socket.ssl-*` options of both ends (none: plain TCP).
    tls: &'a [(String, String)],
    /// The bricks' `auth.ssl-allow`.
    ssl_allow: Option<&'a str>,
}

impl UpArgs {
    /// The TLS options of bricks and clients, from the `--ssl-*` flags
    /// (clap makes them come together), with absolute paths of files that
    /// exist.
    fn tls(&self) -> Result<Vec<(String, String)>, UpError> {
        let mut v = Vec::new();
        let files = [
            ("transport.socket.ssl-own-cert", &self.ssl_own_cert),
            ("transport.socket.ssl-private-key", &self.ssl_private_key),
            ("transport.socket.ssl-ca-list", &self.ssl_ca_list),
        ];
        for (key, path) in files {
            let Some(path) = path else { return Ok(Vec::new()) };
            let abs = std::fs::canonicalize(path).map_err(|source| UpError::Io { path: path.clone(), source })?;
            v.push((key.to_string(), abs.display().to_string()));
        }
        v.push(("transport.socket.ssl-enabled".into(), "on".into()));
        Ok(v)
    }
}

/// Starts the bricks, the heal daemon and the mount; returns the report.
fn start_all(
    lay: &Layout,
    count: usize,
    graph: &Graph<'_>,
    posix: &[(String, String)],
    no_shd: bool,
    options: Option<&str>,
    started: &mut Vec<Started>,
) -> Result<String, UpError> {
    let exe = std::env::current_exe().map_err(|e| UpError::Start {
        what: "xlfs".into(),
        why: format!("finding the xlfs binary: {e}"),
        log: PathBuf::new(),
    })?;
    let mut report = String::new();
    let mut ports = Vec::new();
    for i in 0..count {
        let name = format!("b{i}");
        let (dir, log) = (lay.brick(i), lay.log(&name));
        let mut cmd = Command::new(&exe);
        cmd.arg("brick").arg("--dir").arg(&dir).args(["--port", "0", "--host", "127.0.0.1", "--allow", "127.0.0.1"]);
        cmd.arg("--log-file").arg(&log);
        for (k, v) in posix {
            cmd.arg("--posix").arg(format!("{k}={v}"));
        }
        for (k, v) in graph.tls {
            cmd.arg("--server").arg(format!("{k}={v}"));
        }
        if let Some(names) = graph.ssl_allow {
            cmd.arg("--server").arg(format!("auth.ssl-allow={names}"));
        }
        let (child, line) = spawn_daemon(cmd, &name, &log, |l| l.starts_with("xlfs brick: serving "))?;
        started.push(Started { name: name.clone(), pid: child.id() });
        lay.record(&name, child.id())?;
        let port = line.rsplit_once(':').and_then(|(_, p)| p.trim().parse::<u16>().ok()).ok_or_else(|| {
            UpError::Start { what: name.clone(), why: format!("unexpected start line {line:?}"), log: log.clone() }
        })?;
        report += &format!(
            "xlfs up: brick {name}: {} on 127.0.0.1:{port} (pid {}, log {})\n",
            dir.display(),
            child.id(),
            log.display()
        );
        ports.push(port);
    }
    let volfile = lay.volfile();
    let bricks: Vec<(u16, String)> =
        ports.iter().enumerate().map(|(i, p)| (*p, lay.brick(i).display().to_string())).collect();
    let afr: Vec<(&str, &str)> = graph.afr.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let perf: Vec<&str> = graph.perf.iter().map(String::as_str).collect();
    let client: Vec<(&str, &str)> = graph.tls.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let text = format!(
        "# generated by xlfs up; rewritten on each `xlfs up {}`\n{}",
        lay.dir.display(),
        volfile_with_plugins(VOLUME, &bricks, REPLICAS, &afr, &perf, graph.plugins, &client)
    );
    std::fs::write(&volfile, text).map_err(|source| UpError::Io { path: volfile.clone(), source })?;
    if !no_shd {
        let log = lay.log("shd");
        let mut cmd = Command::new(&exe);
        cmd.arg("heal").arg("--volfile").arg(&volfile).arg("--daemon").arg("--log-file").arg(&log);
        let (child, _) =
            spawn_daemon(cmd, "the self-heal daemon", &log, |l| l.starts_with(super::heal::DAEMON_PREFIX))?;
        started.push(Started { name: "shd".into(), pid: child.id() });
        lay.record("shd", child.id())?;
        report += &format!("xlfs up: self-heal daemon (pid {}, log {})\n", child.id(), log.display());
    }
    let log = lay.log("mount");
    let mut cmd = Command::new(&exe);
    cmd.arg("mount").arg("--volfile").arg(&volfile).arg("--log-file").arg(&log);
    if let Some(o) = options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(lay.mnt());
    let mounted = cmd.stdin(Stdio::null()).output().map_err(|e| UpError::Start {
        what: "xlfs mount".into(),
        why: e.to_string(),
        log: log.clone(),
    })?;
    let line = String::from_utf8_lossy(&mounted.stdout).trim().to_string();
    let pid = line.rsplit_once("(pid ").and_then(|(_, p)| p.trim_end_matches(')').parse::<u32>().ok());
    let (true, Some(pid)) = (mounted.status.success(), pid) else {
        let err = String::from_utf8_lossy(&mounted.stderr).trim().to_string();
        return Err(UpError::Start { what: "xlfs mount".into(), why: format!("{}: {err}", mounted.status), log });
    };
    started.push(Started { name: "mount".into(), pid });
    lay.record("mount", pid)?;
    report += &format!(
        "xlfs up: {} volume '{VOLUME}' ({}) mounted on {} (pid {pid}, log {})\n\
         Stop it with: {} down {}\n",
        match count / REPLICAS {
            1 => "replica-3".to_string(),
            n => format!("{n} x 3 distributed-replicate"),
        },
        volfile.display(),
        lay.mnt().display(),
        log.display(),
        command_name(&exe),
        lay.dir.display()
    );
    Ok(report)
}

/// The performance translators of the default client graph, top first.
/// GlusterFS's volgen puts md-cache, open-behind, quick-read, ...,
/// readdir-ahead, ..., write-behind between io-stats and the cluster
/// translators; here quick-read sits above open-behind, so a read it
/// answers from the lookup's content never makes open-behind open the file,
/// and the flush and release that follow are answered by open-behind:
/// reading a small file costs only its lookup. readdir-ahead sits below
/// md-cache (which fills its caches from the entries it serves) and above
/// write-behind (which corrects the attributes of entries with queued
/// writes in the readdirps it sends).
pub const DEFAULT_PERF: &[&str] = &["md-cache", "quick-read", "open-behind", "readdir-ahead", "write-behind"];

/// The client volfile of a replicated volume named `volume` over bricks
/// served on 127.0.0.1 (`(port, remote-subvolume)` each), as GlusterFS
/// generates for a replica volume: one protocol/client per brick
/// (`<volume>-client-<i>`), cluster/replicate over them
/// (`<volume>-replicate-0`, with `afr` options added), the
/// [`DEFAULT_PERF`] translators (`<volume>-<name>`) and debug/io-stats
/// named `volume` on top. Used by `xlfs up` and by the end-to-end tests.
pub fn replica_volfile(volume: &str, bricks: &[(u16, String)], afr: &[(&str, &str)]) -> String {
    client_volfile(volume, bricks, afr, DEFAULT_PERF)
}

/// Options the generated graph sets on a performance translator. The
/// bricks run features/upcall, so the caches trust what they hold until
/// an invalidation (as GlusterFS's recommended `group metadata-cache`
/// settings: md-cache-timeout 600 with cache-invalidation on).
pub(crate) fn perf_options(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        "md-cache" => &[("md-cache-timeout", "600"), ("cache-invalidation", "on")],
        "quick-read" => &[("cache-invalidation", "on"), ("fetch-on-read", "on")],
        // Keep a whole request's worth ahead of the reader: the fill
        // resumes while a full 128 KiB remains (two FUSE batches), instead
        // of when the buffer is nearly empty and the next readdirp waits.
        "readdir-ahead" => &[("rda-low-wmark", "128KB"), ("rda-high-wmark", "256KB")],
        _ => &[],
    }
}

/// [`replica_volfile`] with the given performance translators (names of
/// `performance/<name>` types, top first) instead of the default ones.
pub fn client_volfile(volume: &str, bricks: &[(u16, String)], afr: &[(&str, &str)], perf: &[&str]) -> String {
    distributed_volfile(volume, bricks, bricks.len().max(1), afr, perf)
}

/// [`client_volfile`] with the bricks in replica sets of `replica`
/// (`<volume>-replicate-<s>` over bricks `s*replica ..`), and, when there
/// is more than one set, cluster/distribute (`<volume>-dht`) over the sets;
/// a last set with fewer bricks takes what is left.
pub fn distributed_volfile(
    volume: &str,
    bricks: &[(u16, String)],
    replica: usize,
    afr: &[(&str, &str)],
    perf: &[&str],
) -> String {
    volfile_with_plugins(volume, bricks, replica, afr, perf, &[], &[])
}

/// [`distributed_volfile`] with plugin translators where each asks
/// (as volgen places a volume's `plugin.NAME` keys) and `client` options
/// on every protocol/client.
fn volfile_with_plugins(
    volume: &str,
    bricks: &[(u16, String)],
    replica: usize,
    afr: &[(&str, &str)],
    perf: &[&str],
    plugins: &[(Plugin, Placement)],
    client: &[(&str, &str)],
) -> String {
    let clients: Vec<String> = (0..bricks.len()).map(|i| format!("{volume}-client-{i}")).collect();
    let mut v = String::new();
    for ((port, subvol), name) in bricks.iter().zip(&clients) {
        v += &format!(
            "volume {name}\n    type protocol/client\n    option remote-host 127.0.0.1\n    option remote-port {port}\n    \
             option remote-subvolume {subvol}\n"
        );
        for (k, val) in client {
            v += &format!("    option {k} {val}\n");
        }
        v += "end-volume\n\n";
    }
    let afr: String = afr.iter().map(|(k, val)| format!("    option {k} {val}\n")).collect();
    let mut below = crate::mgmt::volgen::replica_sets(&mut v, volume, &clients, replica, &afr, "");
    stack_plugins(&mut v, &mut below, plugins, Placement::Cluster);
    for p in perf.iter().rev() {
        let name = format!("{volume}-{p}");
        v += &format!("volume {name}\n    type performance/{p}\n");
        for (k, val) in perf_options(p) {
            v += &format!("    option {k} {val}\n");
        }
        v += &format!("    subvolumes {below}\nend-volume\n\n");
        below = name;
    }
    stack_plugins(&mut v, &mut below, plugins, Placement::Top);
    v += &format!("volume {volume}\n    type debug/io-stats\n    subvolumes {below}\nend-volume\n");
    v
}

/// Starts `cmd` in a new session with its stdout piped until `ready`
/// matches a line (then stdout goes nowhere); stderr to `log`.
fn spawn_daemon(
    mut cmd: Command,
    what: &str,
    log: &Path,
    ready: impl Fn(&str) -> bool + Send + 'static,
) -> Result<(Child, String), UpError> {
    let fail = |why: String| UpError::Start { what: what.to_string(), why, log: log.to_path_buf() };
    let err = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| fail(e.to_string()))?;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(err));
    super::new_session(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| fail(e.to_string()))?;
    let Some(stdout) = child.stdout.take() else { return Err(fail("no stdout".into())) };
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads the start line, then keeps draining stdout so the daemon never
    // blocks or gets EPIPE on a later line.
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !sent && ready(&line) {
                let _ = tx.send(line);
                sent = true;
            }
        }
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(line) => Ok((child, line)),
        Err(_) => {
            let status = child.try_wait().ok().flatten();
            let _ = child.kill();
            let _ = child.wait();
            Err(fail(match status {
                Some(s) => format!("exited with {s}"),
                None => format!("no start line within {START_TIMEOUT:?}"),
            }))
        }
    }
}

/// SIGTERMs the processes (in order) and waits for each to go.
fn stop(lay: &Layout, procs: &[Started]) -> Vec<String> {
    let mut left = Vec::new();
    let order = lay.names();
    let mut procs: Vec<&Started> = procs.iter().collect();
    procs.sort_by_key(|p| order.iter().position(|n| *n == p.name));
    for p in procs {
        if !is_ours(p.pid, &lay.dir) {
            continue;
        }
        // SAFETY: kill(2) on a pid checked to be our process just now.
        unsafe { libc::kill(p.pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        while is_ours(p.pid, &lay.dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if is_ours(p.pid, &lay.dir) {
            left.push(format!("{} pid {}", p.name, p.pid));
        } else {
            let _ = std::fs::remove_file(lay.pid_file(&p.name));
        }
    }
    left
}

impl DownArgs {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let lay = Layout::new(&self.dir)?;
        let procs: Vec<Started> =
            lay.names().into_iter().filter_map(|name| lay.running(&name).map(|pid| Started { name, pid })).collect();
        let mnt = lay.mnt();
        // Whatever serves the mount point goes first, also a mount made
        // again by hand (`xlfs umount` then `xlfs mount`), which no pid file
        // names: drained, unmounted, and its process waited for.
        let mut unmounted = String::new();
        if is_mount_point(&mnt) {
            let umount = super::mount::UmountArgs { mountpoint: mnt.clone(), lazy: false };
            match umount.run().await {
                Ok(()) => unmounted = format!("xlfs down: unmounted {}\n", mnt.display()),
                Err(e) => tracing::warn!("{e}"),
            }
        }
        let report = tokio::task::spawn_blocking(move || {
            let mut report = unmounted;
            let dead = is_dead_mount(&mnt);
            if dead {
                let _ = crate::fuse::lazy_unmount(&mnt);
                report += &format!("xlfs down: detached the dead mount on {}\n", mnt.display());
            }
            let names: Vec<String> = procs.iter().map(|p| format!("{} (pid {})", p.name, p.pid)).collect();
            let left = stop(&lay, &procs);
            for name in lay.names() {
                if lay.running(&name).is_none() {
                    let _ = std::fs::remove_file(lay.pid_file(&name));
                }
            }
            if !names.is_empty() {
                report += &format!("xlfs down: stopped {}\n", names.join(", "));
            } else if !dead {
                report += &format!("xlfs down: nothing running under {}\n", lay.dir.display());
            }
            report += &format!(
                "xlfs down: the data stays in {}; `xlfs up {}` starts it again\n",
                lay.dir.join("bricks").display(),
                lay.dir.display()
            );
            (report, left)
        })
        .await
        .map_err(|e| UpError::NotStopped(e.to_string()))?;
        out.write_all(report.0.as_bytes())?;
        out.flush()?;
        if !report.1.is_empty() {
            return Err(UpError::NotStopped(report.1.join(", ")).into());
        }
        Ok(())
    }
}
