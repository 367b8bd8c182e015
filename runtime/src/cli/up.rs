//! `xlfs up [DIR]` and `xlfs down [DIR]`: a local replica-3 volume (or,
//! with `--sets N`, N replica-3 sets under cluster/distribute) in one
//! command, for trying xlfs and for development. It is a thin use of
//! `xlfs daemon`: what a user of the volume CLI would do, in one step.
//!
//! `up` lays out `DIR` (default `./xlfs-data`):
//!
//! ```text
//! DIR/daemon/           the daemon's state: the volume's spec and keys, brick and heal logs
//! DIR/bricks/b0 b1 b2   the brick directories, three per set (kept across up/down)
//! DIR/client.vol        the client volfile the daemon generated (for `xlfs mount --volfile`)
//! DIR/mnt               the mount point
//! DIR/logs/*.log        the daemon's and the mount's logs
//! DIR/run/              the pids of the daemon and the mount, and the daemon's address
//! ```
//!
//! It starts `xlfs daemon --state-dir DIR/daemon` on a free loopback port;
//! creates the volume `xlfs` the first time (`volume create xlfs replica 3
//! 127.0.0.1:DIR/bricks/b0 ... force`); resets its keys and sets those its
//! flags stand for, so the volume has exactly what this `up` says
//! (`--afr K=V` is the key `cluster.K`, `--posix K=V` is `storage.K`,
//! `--perf LIST` the `performance.*` toggles, `--plugin NAME=SPEC` is
//! `plugin.NAME` (`--plugin NAME.OPTION=VALUE` `plugin.NAME.OPTION`), `--ssl-*` the `ssl.*`, `client.ssl`, `server.ssl` and
//! `auth.ssl-allow` keys, `--no-shd` is `cluster.self-heal-daemon off`,
//! `--tcp` is `network.local-transport off`);
//! starts it (the daemon serves the bricks and runs the self-heal daemon);
//! and mounts it by name (`xlfs mount 127.0.0.1:PORT:/xlfs DIR/mnt`), so
//! the mount follows `xlfs volume --daemon 127.0.0.1:PORT set xlfs ...`.
//! Then it prints what it did and how to stop it. If anything fails, what
//! was started is stopped again. Every flag is checked (plugin modules
//! loaded) before anything starts.
//!
//! `down` unmounts `DIR/mnt` (also a mount made again by hand), stops the
//! volume and the daemon, then any process left that names DIR (SIGTERM,
//! then waits for each to exit); the data and the volume stay for the next
//! `up`. A pid is only signalled while its `/proc/PID/cmdline` is still an
//! xlfs process naming DIR.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use super::CliError;
use crate::mgmt::keys::{self, KEYS, Target};
use crate::mgmt::protocol::{Reply, Request, call};
use crate::mgmt::spec::VolumeStatus;
use crate::registry::Registry;

/// The volume's name (its top volume and the prefix of its translators).
const VOLUME: &str = "xlfs";

/// Bricks per replica set.
const REPLICAS: usize = 3;

/// Most replica sets `--sets` takes.
const MAX_SETS: usize = 32;

/// How long the daemon may take to listen, and the bricks to serve.
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
    /// cluster/replicate options, as KEY=VALUE (the volume key
    /// `cluster.KEY`; e.g. lock-contention-policy=inodelk-count); repeatable.
    #[arg(long = "afr", value_name = "KEY=VALUE")]
    pub afr: Vec<String>,
    /// storage/posix options for every brick, as KEY=VALUE (the volume
    /// key `storage.KEY`; e.g. o-direct-min-size=0); repeatable.
    #[arg(long = "posix", value_name = "KEY=VALUE")]
    pub posix: Vec<String>,
    /// Do not run the self-heal daemon (`cluster.self-heal-daemon off`).
    #[arg(long)]
    pub no_shd: bool,
    /// Reach the bricks over TCP although they are on this host
    /// (`network.local-transport off`), as a client elsewhere would; by
    /// default the mount uses their Unix sockets with payloads in shared
    /// memory.
    #[arg(long)]
    pub tcp: bool,
    /// Replica-3 sets; more than one puts cluster/distribute over them
    /// (bricks b0..b2 are the first set, b3..b5 the second, ...).
    /// Default: as many as DIR holds already, else 1. A DIR made with
    /// another number is refused (a volume grows by add-brick and
    /// rebalance under `xlfs daemon`, not by a new layout over its data).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_SETS as i64))]
    pub sets: Option<u16>,
    /// The performance translators of the client graph, comma-separated
    /// (`none` for none), stacked in volgen's order (io-threads, md-cache,
    /// quick-read, open-behind, readdir-ahead, read-ahead, write-behind,
    /// top first); default: md-cache, quick-read, open-behind,
    /// readdir-ahead, write-behind.
    #[arg(long, value_name = "LIST")]
    pub perf: Option<String>,
    /// A plugin translator in the client graph, as NAME=wasm:/ABS/PATH or
    /// NAME=dylib:/ABS/PATH, where its module asks to sit (the volume key
    /// `plugin.NAME`), or an option of one as NAME.OPTION=VALUE (the key
    /// `plugin.NAME.OPTION`, e.g. `pt.tail=on`); repeatable, stacked in the
    /// order of their names.
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
    /// A flag's value that its volume key refuses (a `--plugin` whose
    /// module does not load, an option the translator does not declare, a
    /// value out of range, a `--perf` name with no toggle).
    #[error("{flag} {value:?}: {why}")]
    BadFlag {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: String,
        /// Why.
        why: String,
    },
    /// The daemon refused a step, or could not be reached.
    #[error("xlfs daemon ({step}): {why} (log: {})", log.display())]
    Daemon {
        /// What was asked.
        step: String,
        /// Its answer.
        why: String,
        /// The daemon's log.
        log: PathBuf,
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
        Layout::existing(dir)
    }

    /// The layout of a DIR that must exist already (`down` makes nothing).
    fn existing(dir: &Path) -> Result<Layout, UpError> {
        let dir = std::fs::canonicalize(dir).map_err(|source| UpError::Io { path: dir.to_path_buf(), source })?;
        Ok(Layout { dir })
    }

    fn brick(&self, i: usize) -> PathBuf {
        self.dir.join("bricks").join(format!("b{i}"))
    }
    fn volfile(&self) -> PathBuf {
        self.dir.join("client.vol")
    }
    fn state(&self) -> PathBuf {
        self.dir.join("daemon")
    }
    fn addr_file(&self) -> PathBuf {
        self.dir.join("run").join("daemon.addr")
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

    /// The processes `up` starts, in stop order.
    fn names() -> [&'static str; 2] {
        ["mount", "daemon"]
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

/// Every live xlfs process whose command line names `dir`, but this one.
fn processes_naming(dir: &Path) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me && is_ours(*pid, dir))
        .collect()
}

impl UpArgs {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let settings = self.settings()?;
        let lay = Layout::new(&self.dir)?;
        let running: Vec<String> =
            Layout::names().iter().filter_map(|n| lay.running(n).map(|p| format!("{n} pid {p}"))).collect();
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
        let exe = std::env::current_exe().map_err(|e| UpError::Start {
            what: "xlfs".into(),
            why: format!("finding the xlfs binary: {e}"),
            log: PathBuf::new(),
        })?;
        let mut started = Vec::new();
        let up = Up { lay: &lay, exe: &exe, bricks, settings: &settings };
        match up.run(self.options.as_deref(), &mut started).await {
            Ok(report) => {
                out.write_all(report.as_bytes())?;
                out.flush()?;
                Ok(())
            }
            Err(e) => {
                let dir = lay.dir.clone();
                let _ = tokio::task::spawn_blocking(move || stop(&Layout { dir }, &started)).await;
                Err(e.into())
            }
        }
    }

    /// The volume keys the flags stand for, each checked as `volume set`
    /// would (plugin modules and policies loaded) before anything starts.
    fn settings(&self) -> Result<Vec<(String, String)>, UpError> {
        let reg = Registry::builtin();
        let mut out = Vec::new();
        // What is set so far: a plugin's options are checked against its module.
        let mut known = std::collections::BTreeMap::new();
        let check = |flag: &'static str, given: &str, key: String, value: &str, known: &_| {
            let value = keys::validate_in(&reg, known, &key, value).map_err(|e| UpError::BadFlag {
                flag,
                value: given.to_string(),
                why: e.to_string(),
            })?;
            Ok::<_, UpError>((key, value))
        };
        // A plugin's module before its options (`--plugin pt.tail=on` may
        // come first).
        let mut plugins = self.plugins.clone();
        plugins.sort_by_key(|kv| kv.split('=').next().is_some_and(|k| k.contains('.')));
        for (flag, prefix, list) in
            [("--afr", "cluster.", &self.afr), ("--posix", "storage.", &self.posix), ("--plugin", "plugin.", &plugins)]
        {
            for (given, (k, v)) in list.iter().zip(key_values(flag, list)?) {
                let (key, value) = check(flag, given, format!("{prefix}{k}"), &v, &known)?;
                known.insert(key.clone(), value.clone());
                out.push((key, value));
            }
        }
        if let Some(list) = &self.perf {
            let want: Vec<&str> = match list.trim() {
                "" | "none" => Vec::new(),
                l => l.split(',').map(str::trim).collect(),
            };
            let toggles: Vec<(&str, &str)> = KEYS
                .iter()
                .filter_map(|k| match k.target {
                    Target::Toggle { xlator, .. } => Some((k.name, xlator.strip_prefix("performance/")?)),
                    Target::Options(_) => None,
                })
                .collect();
            if let Some(bad) = want.iter().find(|w| !toggles.iter().any(|(_, t)| t == *w)) {
                let names: Vec<&str> = toggles.iter().map(|(_, t)| *t).collect();
                let why = format!("no performance translator {bad:?} to turn on (one of {})", names.join(", "));
                return Err(UpError::BadFlag { flag: "--perf", value: list.clone(), why });
            }
            for (key, short) in toggles {
                out.push((key.to_string(), if want.contains(&short) { "on" } else { "off" }.to_string()));
            }
        }
        if let Some(cert) = &self.ssl_own_cert {
            let mut tls = vec![("client.ssl", "on".to_string()), ("server.ssl", "on".to_string())];
            let files = [
                ("ssl.own-cert", Some(cert)),
                ("ssl.private-key", self.ssl_private_key.as_ref()),
                ("ssl.ca-list", self.ssl_ca_list.as_ref()),
            ];
            for (key, path) in files {
                let Some(path) = path else { continue };
                let abs = std::fs::canonicalize(path).map_err(|source| UpError::Io { path: path.clone(), source })?;
                tls.push((key, abs.display().to_string()));
            }
            if let Some(names) = &self.ssl_allow {
                tls.push(("auth.ssl-allow", names.clone()));
            }
            for (key, value) in tls {
                out.push(check("--ssl-*", &value, key.to_string(), &value, &known)?);
            }
        }
        if self.no_shd {
            out.push(("cluster.self-heal-daemon".into(), "off".into()));
        }
        if self.tcp {
            out.push(("network.local-transport".into(), "off".into()));
        }
        Ok(out)
    }
}

/// One `xlfs up`: what it brings up, and how.
struct Up<'a> {
    lay: &'a Layout,
    exe: &'a Path,
    bricks: usize,
    settings: &'a [(String, String)],
}

impl Up<'_> {
    /// Starts the daemon, makes (or updates) and starts the volume, writes
    /// its volfile and mounts it; returns the report. `started` gets each
    /// process as it starts, for stopping them again on failure.
    async fn run(&self, options: Option<&str>, started: &mut Vec<Started>) -> Result<String, UpError> {
        let lay = self.lay;
        let log = lay.log("daemon");
        let mut cmd = Command::new(self.exe);
        cmd.arg("daemon").arg("--state-dir").arg(lay.state()).args(["--listen", "127.0.0.1:0"]);
        cmd.arg("--log-file").arg(&log);
        let ready = |l: &str| l.starts_with(super::daemon::READY_PREFIX);
        let log2 = log.clone();
        let (child, line) = tokio::task::spawn_blocking(move || spawn_daemon(cmd, "xlfs daemon", &log2, ready))
            .await
            .map_err(|e| UpError::Start { what: "xlfs daemon".into(), why: e.to_string(), log: log.clone() })??;
        started.push(Started { name: "daemon".into(), pid: child.id() });
        lay.record("daemon", child.id())?;
        let addr = line
            .strip_prefix(super::daemon::READY_PREFIX)
            .and_then(|rest| rest.split_whitespace().next())
            .ok_or_else(|| UpError::Start {
                what: "xlfs daemon".into(),
                why: format!("start line {line:?}"),
                log: log.clone(),
            })?
            .to_string();
        let addr_file = lay.addr_file();
        std::fs::write(&addr_file, format!("{addr}\n")).map_err(|source| UpError::Io { path: addr_file, source })?;
        let mut report = format!(
            "xlfs up: daemon at {addr} (pid {}, state {}, log {})\n",
            child.id(),
            lay.state().display(),
            log.display()
        );
        report += &self.volume(&addr, &log).await?;
        report += &self.mount(&addr, options, started)?;
        Ok(report)
    }

    /// Sends one request to the daemon.
    async fn ask(&self, addr: &str, log: &Path, step: &str, req: Request) -> Result<Reply, UpError> {
        call(addr, &req).await.map_err(|e| UpError::Daemon {
            step: step.to_string(),
            why: e.to_string(),
            log: log.to_path_buf(),
        })
    }

    /// Makes the volume (the first time) or gives it this `up`'s keys,
    /// starts it, waits for every brick to serve and writes the volfile;
    /// returns the report's brick lines.
    async fn volume(&self, addr: &str, log: &Path) -> Result<String, UpError> {
        let lay = self.lay;
        let bricks: Vec<String> = (0..self.bricks).map(|i| format!("127.0.0.1:{}", lay.brick(i).display())).collect();
        let existing = match call(addr, &Request::Info { name: Some(VOLUME.into()) }).await {
            Ok(Reply::Volumes { volumes }) => volumes.into_iter().next(),
            _ => None,
        };
        let was_started = match existing {
            None => {
                let create = Request::Create {
                    name: VOLUME.into(),
                    replica: Some(REPLICAS),
                    bricks: bricks.clone(),
                    force: true,
                    options: self.settings.to_vec(),
                };
                self.ask(addr, log, "volume create", create).await?;
                false
            }
            Some(spec) => {
                let have: Vec<String> = spec.bricks.iter().map(|b| b.to_string()).collect();
                if have != bricks {
                    let why = format!("volume {VOLUME} has bricks {have:?}, not {bricks:?}");
                    return Err(UpError::Daemon { step: "volume info".into(), why, log: log.to_path_buf() });
                }
                self.ask(addr, log, "volume reset", Request::Reset { name: VOLUME.into(), key: None }).await?;
                for (key, value) in self.settings {
                    let set = Request::Set { name: VOLUME.into(), key: key.clone(), value: value.clone() };
                    self.ask(addr, log, &format!("volume set {key}"), set).await?;
                }
                spec.status == VolumeStatus::Started
            }
        };
        self.ask(addr, log, "volume start", Request::Start { name: VOLUME.into(), force: was_started }).await?;
        // Every brick serving, with its port (the volfile names them).
        let deadline = Instant::now() + START_TIMEOUT;
        let state = loop {
            let last = match self.ask(addr, log, "volume status", Request::Status { name: Some(VOLUME.into()) }).await?
            {
                Reply::Status { volumes } => volumes.into_iter().next(),
                _ => None,
            };
            match last {
                Some(v) if v.bricks.iter().all(|b| b.up && b.port.is_some()) => break v,
                _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                v => {
                    let down: Vec<String> =
                        v.iter().flat_map(|v| &v.bricks).filter(|b| !b.up).map(|b| b.dir.clone()).collect();
                    let why = format!("bricks not serving after {START_TIMEOUT:?}: {}", down.join(", "));
                    return Err(UpError::Daemon { step: "volume start".into(), why, log: log.to_path_buf() });
                }
            }
        };
        let spec = Request::Getspec { name: VOLUME.into(), brick: None, unless: None };
        let Reply::Spec { volfile, .. } = self.ask(addr, log, "volfile", spec).await? else {
            return Err(UpError::Daemon {
                step: "volfile".into(),
                why: "no volfile in the answer".into(),
                log: log.to_path_buf(),
            });
        };
        let path = lay.volfile();
        let text = format!(
            "# written by `xlfs up {}` from the daemon at {addr}; a mount by name \
             (xlfs mount {addr}:/{VOLUME} MOUNTPOINT) follows the volume's changes, a mount of this file does not\n{volfile}",
            lay.dir.display()
        );
        std::fs::write(&path, text).map_err(|source| UpError::Io { path, source })?;
        let mut lines = String::new();
        for (i, b) in state.bricks.iter().enumerate() {
            lines += &format!(
                "xlfs up: brick b{i}: {} on 127.0.0.1:{} (pid {})\n",
                b.dir,
                b.port.unwrap_or(0),
                b.pid.map_or("?".into(), |p| p.to_string())
            );
        }
        match &state.shd {
            Some(shd) if shd.up => {
                lines += &format!("xlfs up: self-heal daemon (pid {})\n", shd.pid.map_or("?".into(), |p| p.to_string()))
            }
            _ => {}
        }
        Ok(lines)
    }

    /// Mounts the volume by name on DIR/mnt; returns the report's last lines.
    fn mount(&self, addr: &str, options: Option<&str>, started: &mut Vec<Started>) -> Result<String, UpError> {
        let lay = self.lay;
        let log = lay.log("mount");
        let source = format!("{addr}:/{VOLUME}");
        let mut cmd = Command::new(self.exe);
        cmd.arg("mount").arg(&source).arg("--log-file").arg(&log);
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
        Ok(format!(
            "xlfs up: {} volume '{VOLUME}' ({source}) mounted on {} (pid {pid}, log {})\n\
             Change it with: {cmd} volume --daemon {addr} set {VOLUME} KEY VALUE\n\
             Stop it with: {cmd} down {}\n",
            match self.bricks / REPLICAS {
                1 => "replica-3".to_string(),
                n => format!("{n} x 3 distributed-replicate"),
            },
            lay.mnt().display(),
            log.display(),
            lay.dir.display(),
            cmd = command_name(self.exe),
        ))
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

/// SIGTERMs the processes (in order) and waits for each to go; returns
/// those still running.
fn stop(lay: &Layout, procs: &[Started]) -> Vec<String> {
    let mut left = Vec::new();
    for p in procs.iter().rev() {
        if !is_ours(p.pid, &lay.dir) {
            let _ = std::fs::remove_file(lay.pid_file(&p.name));
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
        let lay = Layout::existing(&self.dir)?;
        let mnt = lay.mnt();
        // Whatever serves the mount point goes first, also a mount made
        // again by hand (`xlfs umount` then `xlfs mount`), which no pid file
        // names: drained, unmounted, and its process waited for.
        let mut report = String::new();
        if is_mount_point(&mnt) {
            let umount = super::mount::UmountArgs { mountpoint: mnt.clone(), lazy: false };
            match umount.run().await {
                Ok(()) => report += &format!("xlfs down: unmounted {}\n", mnt.display()),
                Err(e) => tracing::warn!("{e}"),
            }
        }
        // The volume stopped (its bricks and heal daemon with it), so the
        // next `up` starts it with that `up`'s keys.
        if lay.running("daemon").is_some()
            && let Ok(addr) = std::fs::read_to_string(lay.addr_file())
        {
            let serving: Vec<String> = match call(addr.trim(), &Request::Status { name: Some(VOLUME.into()) }).await {
                Ok(Reply::Status { volumes }) => volumes
                    .iter()
                    .flat_map(|v| &v.bricks)
                    .filter_map(|b| {
                        let name = Path::new(&b.dir).file_name()?.to_string_lossy().into_owned();
                        Some(format!("{name} (pid {})", b.pid?))
                    })
                    .collect(),
                _ => Vec::new(),
            };
            match call(addr.trim(), &Request::Stop { name: VOLUME.into() }).await {
                Ok(_) if serving.is_empty() => report += &format!("xlfs down: volume {VOLUME} stopped\n"),
                Ok(_) => report += &format!("xlfs down: volume {VOLUME} stopped: bricks {}\n", serving.join(", ")),
                Err(e) => tracing::warn!("stopping volume {VOLUME}: {e}"),
            }
        }
        let report = tokio::task::spawn_blocking(move || {
            let mut report = report;
            let dead = is_dead_mount(&mnt);
            if dead {
                let _ = crate::fuse::lazy_unmount(&mnt);
                report += &format!("xlfs down: detached the dead mount on {}\n", mnt.display());
            }
            // The mount and the daemon, then whatever else names DIR: bricks
            // and heal daemons of a daemon that died, or of an older `up`.
            let mut procs: Vec<Started> = Layout::names()
                .iter()
                .rev()
                .filter_map(|name| lay.running(name).map(|pid| Started { name: name.to_string(), pid }))
                .collect();
            let mut left = stop(&lay, &procs);
            let others: Vec<Started> = processes_naming(&lay.dir)
                .into_iter()
                .map(|pid| Started { name: format!("process {pid}"), pid })
                .collect();
            left.extend(stop(&lay, &others));
            procs.extend(others);
            let _ = std::fs::remove_file(lay.addr_file());
            if let Ok(run) = std::fs::read_dir(lay.dir.join("run")) {
                for e in run.flatten() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
            let names: Vec<String> = procs.iter().map(|p| format!("{} (pid {})", p.name, p.pid)).collect();
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
