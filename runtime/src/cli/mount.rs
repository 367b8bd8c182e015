//! `xlfs mount` and `xlfs umount`.
//!
//! `xlfs mount --volfile FILE [-o OPTS] MOUNTPOINT` builds the client graph
//! from the volfile (protocol/client to bricks, or a local graph straight
//! over storage/posix), waits for it to come up, and mounts it with the FUSE
//! bridge ([`crate::fuse`]). Once mounted it prints one line to stdout,
//! `xlfs mount: FILE on MOUNTPOINT (pid N)`.
//!
//! By default the command becomes a daemon once mounted: it starts itself
//! again in the foreground in a new session, with its log in
//! `/var/log/xlfs/<mountpoint>.log` (unless `--log-file`), waits for that
//! line, prints it and exits 0 (or fails with the child's error). With
//! `--foreground` it stays attached. Either way SIGTERM and SIGINT unmount
//! (lazily if busy, after a grace period), let the fops in flight finish,
//! shut the graph down and exit 0; an unmount from outside does the same.
//!
//! `xlfs mount HOST[:PORT]:/VOLUME MOUNTPOINT` mounts a volume by name:
//! it asks the `xlfs daemon` at HOST:PORT (default port 24007) for the
//! volume's client volfile (`getspec`), writes it to
//! `/run/xlfs/mounts/<h>.vol` (`<h>` as for the control socket; under
//! `$XLFS_RUN_DIR` if set) and mounts that. The mount process then asks
//! again every `--spec-interval` seconds; when the volfile changed (a
//! `volume set`, a brick restarted on another port) it writes the new one
//! and reloads it at once, so the graph follows without a remount. A
//! daemon that does not answer is logged and asked again later; the
//! running graph stays.
//!
//! `xlfs umount [-l] MOUNTPOINT` unmounts (lazily with `-l`), also a mount
//! whose process died ("Transport endpoint is not connected").
//!
//! Changing a live mount: the mount process reloads its volfile on SIGHUP,
//! on `xlfs reload MOUNTPOINT` (through its control socket, see
//! [`super::reload`]), and when its watcher (a poll every
//! `--watch-interval` seconds, 0 for none) sees the volfile or a module file
//! it names change; see [`crate::reload`].

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};

use super::CliError;
use crate::fuse::{FuseError, Mount, MountOptions, OptionsError};
use crate::graph::{Graph, GraphSpec, NotUp};
use crate::registry::Registry;
use crate::reload::Reloader;
use crate::volfile::Volfile;

/// How long fops in flight may take to finish after the unmount.
const DRAIN: Duration = Duration::from_secs(10);

/// How long an unmount waits for the graph to send what it delayed.
const SEND_DELAYED: Duration = Duration::from_secs(120);

/// The start line's prefix (scripts, the daemon parent and tests read it).
pub const READY_PREFIX: &str = "xlfs mount: ";

/// `xlfs mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// The client volfile to mount (instead of a volume from a daemon).
    #[arg(long, value_name = "FILE")]
    pub volfile: Option<PathBuf>,
    /// Where to mount (an existing directory); before it, to mount a volume
    /// from the `xlfs daemon` at `HOST[:PORT]` (port 24007 if not given),
    /// `HOST[:PORT]:/VOLUME` (`127.0.0.1:/gv0`, `node1:24007:/gv0`).
    #[arg(value_name = "[HOST[:PORT]:/VOLUME] MOUNTPOINT")]
    pub mountpoint: PathBuf,
    /// The mount point, when a volume is named before it.
    #[arg(hide = true)]
    pub then: Option<PathBuf>,
    /// The volume to mount (set from the arguments by [`MountArgs::normalize`]).
    #[arg(skip)]
    pub source: Option<String>,
    /// Mount options, comma-separated; may be given more than once (see the
    /// README: entry-timeout, attribute-timeout, negative-timeout,
    /// keep-cache, auto-invalidation, writeback-cache, noatime, max-write,
    /// max-read, max-readahead, direct-io-mode, allow-other,
    /// default-permissions, reader-threads, ro ...).
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Vec<String>,
    /// Stay in the foreground instead of becoming a daemon once mounted.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Append the log to FILE (default: stderr in the foreground, else
    /// /var/log/xlfs/MOUNTPOINT.log, the mount point's path with `/` as `-`).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Seconds to wait for the graph to come up (its bricks to connect).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub up_timeout: u64,
    /// Seconds between looks at the volfile (and the module files it
    /// names) for changes to apply; 0 turns the watcher off (SIGHUP and
    /// `xlfs reload` still work).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub watch_interval: f64,
    /// Mounted by name, the mount follows its volume's volfile: the daemon
    /// answers as soon as it changes (or after 30 s, and the mount asks
    /// again at once); this is the least time between two asks the daemon
    /// answers at once, and the wait after an error. 0: do not follow.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub spec_interval: f64,
    /// Internal: this process is the daemon started by `xlfs mount`.
    #[arg(long, hide = true)]
    pub daemon_child: bool,
}

/// `xlfs umount`.
#[derive(Debug, Args)]
pub struct UmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Detach now even if busy; the mount goes away once unused.
    #[arg(short = 'l', long)]
    pub lazy: bool,
}

/// Why a mount or unmount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A mount option is wrong.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// The FUSE mount failed.
    #[error(transparent)]
    Fuse(#[from] FuseError),
    /// The graph did not come up.
    #[error("{0} (are the bricks running and reachable?)")]
    NotUp(#[from] NotUp),
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
    /// The control socket for `xlfs reload` could not be made.
    #[error("control socket: {0}")]
    Control(std::io::Error),
    /// The daemon could not be started or failed before mounting.
    #[error("starting the mount daemon: {0}")]
    Daemon(String),
    /// A task failed.
    #[error("mount task: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// The volume's volfile could not be had from the daemon.
    #[error("mounting {source_name}: {why}")]
    Spec {
        /// `HOST:/VOLUME` as given.
        source_name: String,
        /// Why.
        why: String,
    },
    /// umount failed.
    #[error("unmounting {}: {source}", path.display())]
    Umount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl MountArgs {
    /// `-o event-threads=N`, if given (and the options parse; if they do
    /// not, the mount itself reports it).
    pub fn event_threads(&self) -> Option<usize> {
        self.mount_options().ok().and_then(|o| o.event_threads)
    }

    fn mount_options(&self) -> Result<MountOptions, MountError> {
        let mut o = MountOptions::default();
        for s in &self.options {
            o.apply(s)?;
        }
        Ok(o)
    }

    /// The volfile to mount: `--volfile`, or the one fetched for the source.
    fn volfile(&self) -> PathBuf {
        match &self.volfile {
            Some(v) => v.clone(),
            None => spec_path(&self.mountpoint),
        }
    }

    /// Sorts the positional arguments: `SOURCE MOUNTPOINT` or `MOUNTPOINT`
    /// (with `--volfile`).
    pub fn normalize(mut self) -> Result<MountArgs, MountError> {
        if let Some(m) = self.then.take() {
            self.source = Some(self.mountpoint.display().to_string());
            self.mountpoint = m;
        }
        match (&self.source, &self.volfile) {
            (Some(_), None) | (None, Some(_)) => Ok(self),
            (Some(src), Some(_)) => Err(MountError::Spec {
                source_name: src.clone(),
                why: "give either --volfile FILE or HOST[:PORT]:/VOLUME, not both".into(),
            }),
            (None, None) => Err(MountError::Spec {
                source_name: self.mountpoint.display().to_string(),
                why: "what to mount? give --volfile FILE or HOST[:PORT]:/VOLUME before the mount point".into(),
            }),
        }
    }

    /// Mounts and serves until unmounted or signalled.
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let this = self.normalize()?;
        let opts = this.mount_options()?;
        this.run_normalized(opts, out).await
    }

    async fn run_normalized(self, opts: MountOptions, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        if let Some(src) = &self.source {
            let text = SpecSource::new(src, &opts.backup_volfile_servers)?.fetch(None).await?;
            write_spec(src, &self.volfile(), &text)?;
        }
        if self.foreground {
            return self.serve(opts, out).await;
        }
        // Check what can be checked before going to the background.
        Volfile::load(self.volfile()).map_err(CliError::from).and_then(|v| {
            GraphSpec::validate(&v, &Registry::builtin())?;
            Ok(())
        })?;
        let line = tokio::task::spawn_blocking(move || self.daemonize(&opts)).await.map_err(MountError::from)??;
        writeln!(out, "{line}")?;
        out.flush()?;
        Ok(())
    }

    async fn serve(self, opts: MountOptions, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let volfile = self.volfile();
        let spec_source = match &self.source {
            Some(src) => Some(SpecSource::new(src, &opts.backup_volfile_servers)?),
            None => None,
        };
        let graph = Arc::new(Graph::load(&volfile, &Registry::builtin())?);
        let mut term = signal(SignalKind::terminate()).map_err(MountError::Signal)?;
        let mut int = signal(SignalKind::interrupt()).map_err(MountError::Signal)?;
        graph.activate();
        let timeout = Duration::from_secs(self.up_timeout);
        let up = tokio::select! {
            r = graph.wait_up(timeout) => Some(r),
            _ = term.recv() => None,
            _ = int.recv() => None,
        };
        match up {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                shutdown(graph).await;
                return Err(MountError::from(e).into());
            }
            None => {
                shutdown(graph).await;
                return Ok(());
            }
        }
        let (g, rt) = (graph.clone(), tokio::runtime::Handle::current());
        let mp = self.mountpoint.clone();
        let mounted = tokio::task::spawn_blocking(move || Mount::with_graph(g, &mp, opts, rt)).await;
        let mount = match mounted.map_err(MountError::from).and_then(|r| r.map_err(MountError::from)) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                shutdown(graph).await;
                return Err(e.into());
            }
        };
        // The mount owns the graph now; a switch frees it.
        drop(graph);
        let mut hup = signal(SignalKind::hangup()).map_err(MountError::Signal)?;
        let reloader = Arc::new(Reloader::new(
            std::fs::canonicalize(&volfile).unwrap_or_else(|_| volfile.clone()),
            Registry::builtin(),
            mount.clone(),
            timeout,
        ));
        let control = match super::reload::serve_control(mount.mountpoint(), reloader.clone()) {
            Ok(c) => c,
            Err(e) => {
                let _ = mount.unmount(DRAIN).await;
                if let Some(g) = mount.graph() {
                    shutdown(g).await;
                }
                return Err(MountError::Control(e).into());
            }
        };
        let watcher = (self.watch_interval > 0.0).then(|| {
            let every = Duration::from_secs_f64(self.watch_interval.min(86_400.0));
            tokio::spawn(reloader.clone().watch(every))
        });
        let follower = match spec_source {
            Some(from) if self.spec_interval > 0.0 => {
                let every = Duration::from_secs_f64(self.spec_interval.min(86_400.0));
                Some(tokio::spawn(follow_spec(from, volfile.clone(), reloader.clone(), every)))
            }
            _ => None,
        };
        let line = format!(
            "{READY_PREFIX}{} on {} (pid {})",
            self.source.clone().unwrap_or_else(|| volfile.display().to_string()),
            mount.mountpoint().display(),
            std::process::id()
        );
        tracing::info!("{line}");
        writeln!(out, "{line}")?;
        out.flush()?;
        if self.daemon_child {
            detach_stdio();
        }
        let why = loop {
            tokio::select! {
                _ = term.recv() => break "SIGTERM",
                _ = int.recv() => break "SIGINT",
                _ = mount.ended() => break "unmounted",
                _ = hup.recv() => {
                    let r = reloader.clone();
                    tokio::spawn(async move { r.reload("SIGHUP").await });
                }
            }
        };
        tracing::info!(why, "unmounting");
        if let Some(w) = watcher {
            w.abort();
        }
        if let Some(f) = follower {
            f.abort();
        }
        drop(control);
        reloader.quiesce(timeout + crate::fuse::switch::DRAIN).await;
        let r = mount.unmount(DRAIN).await;
        if let Some(g) = mount.graph() {
            if !g.drain(SEND_DELAYED).await {
                tracing::error!("delayed writes or directory operations still not sent after {SEND_DELAYED:?}");
            }
            shutdown(g).await;
        }
        if self.source.is_some() {
            // The fetched volfile belongs to this mount only.
            let _ = std::fs::remove_file(&volfile);
        }
        tracing::info!("stopped");
        r.map_err(|e| MountError::from(e).into())
    }

    /// Starts this command again as a daemon in the foreground and returns
    /// its start line once it has mounted.
    fn daemonize(self, opts: &MountOptions) -> Result<String, MountError> {
        let abs = |p: &Path| std::fs::canonicalize(p).map_err(|e| MountError::Daemon(format!("{}: {e}", p.display())));
        let (volfile, mountpoint) = (abs(&self.volfile())?, abs(&self.mountpoint)?);
        let log = match self.log_file {
            Some(l) => l,
            None => {
                let dir = Path::new("/var/log/xlfs");
                std::fs::create_dir_all(dir).map_err(|e| MountError::Daemon(format!("{}: {e}", dir.display())))?;
                dir.join(log_name(&mountpoint))
            }
        };
        let exe = std::env::current_exe().map_err(|e| MountError::Daemon(format!("finding the xlfs binary: {e}")))?;
        let mut cmd = Command::new(exe);
        cmd.arg("mount");
        match &self.source {
            Some(src) => cmd.arg(src).arg("--spec-interval").arg(self.spec_interval.to_string()),
            None => cmd.arg("--volfile").arg(&volfile),
        };
        cmd.arg("--foreground")
            .arg("--daemon-child")
            .arg("--log-file")
            .arg(&log)
            .arg("--up-timeout")
            .arg(self.up_timeout.to_string())
            .arg("--watch-interval")
            .arg(self.watch_interval.to_string())
            .arg("-o")
            .arg(opts.to_option_string())
            .arg(&mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        super::new_session(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| MountError::Daemon(e.to_string()))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        if line.starts_with(READY_PREFIX) {
            return Ok(line.trim_end().to_string());
        }
        let mut err = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = stderr.read_to_string(&mut err);
        }
        let status = child.wait().map_err(|e| MountError::Daemon(e.to_string()))?;
        let err = err.trim().trim_start_matches("xlfs: ");
        Err(MountError::Daemon(format!("{status}: {err} (log: {})", log.display())))
    }
}

/// Splits `HOST[:PORT]:/VOLUME` into the daemon's address and the volume.
fn parse_source(src: &str) -> Result<(String, String), MountError> {
    let bad = || MountError::Spec { source_name: src.to_string(), why: "expected HOST[:PORT]:/VOLUME".into() };
    let (host, volume) = src.rsplit_once(":/").ok_or_else(bad)?;
    if host.is_empty() || volume.is_empty() || volume.contains('/') {
        return Err(bad());
    }
    let has_port = match host.rsplit_once(':') {
        Some((h, p)) => !h.is_empty() && p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']')),
        None => false,
    };
    let addr = if has_port { host.to_string() } else { format!("{host}:24007") };
    Ok((addr, volume.to_string()))
}

/// Where a mount by name gets its volfile: the daemon of the source, then
/// the backup volfile servers.
struct SpecSource {
    src: String,
    servers: Vec<String>,
    volume: String,
}

impl SpecSource {
    fn new(src: &str, backups: &[String]) -> Result<SpecSource, MountError> {
        let (addr, volume) = parse_source(src)?;
        let port = addr.rsplit_once(':').map_or("24007", |(_, p)| p);
        let mut servers = vec![addr.clone()];
        for b in backups {
            let has_port = b.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok());
            servers.push(if has_port { b.clone() } else { format!("{b}:{port}") });
        }
        Ok(SpecSource { src: src.to_string(), servers, volume })
    }

    /// Asks each daemon in turn for the volume's client volfile; the first
    /// answer wins. A daemon that refuses (no such volume, not started)
    /// is final: the others share its store. With `have` (the text this
    /// mount runs), the daemon answers once the volfile differs, or after
    /// a while with the same.
    async fn fetch(&self, have: Option<&str>) -> Result<String, MountError> {
        use crate::mgmt::protocol::{ProtocolError, Reply, Request, call, volfile_digest};
        let fail = |why: String| MountError::Spec { source_name: self.src.clone(), why };
        let unless = have.map(volfile_digest);
        let mut tried = Vec::new();
        for addr in &self.servers {
            match call(addr, &Request::Getspec { name: self.volume.clone(), brick: None, unless }).await {
                Ok(Reply::Spec { volfile, .. }) => {
                    if addr != &self.servers[0] {
                        tracing::info!(server = %addr, "volfile fetched from a backup volfile server");
                    }
                    return Ok(volfile);
                }
                Ok(other) => return Err(fail(format!("{addr}: unexpected answer {other:?}"))),
                Err(e @ ProtocolError::Refused(_)) => return Err(fail(e.to_string())),
                Err(e) => tried.push(e.to_string()),
            }
        }
        Err(fail(tried.join("; ")))
    }
}

/// Where the volfile of a mount by name is kept.
fn spec_path(mountpoint: &Path) -> PathBuf {
    let sock = super::reload::socket_path(mountpoint);
    let stem = sock.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    super::reload::run_dir().join("mounts").join(format!("{stem}.vol"))
}

/// Writes the volfile atomically (a reload never reads half of it).
fn write_spec(src: &str, path: &Path, text: &str) -> Result<(), MountError> {
    let fail =
        |e: std::io::Error| MountError::Spec { source_name: src.into(), why: format!("{}: {e}", path.display()) };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let tmp = path.with_extension("vol.tmp");
    std::fs::write(&tmp, text).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

/// Follows the volume's volfile: asks the daemon for it, which answers as
/// soon as it differs from the one running (or after a while with the
/// same); when it changed, writes it and reloads. Asks at most every
/// `every` (also after an error). Runs until dropped.
async fn follow_spec(from: SpecSource, file: PathBuf, reloader: Arc<Reloader>, every: Duration) {
    let (src, volume) = (&from.src, &from.volume);
    loop {
        let asked = tokio::time::Instant::now();
        let have = std::fs::read_to_string(&file).ok();
        let text = match from.fetch(have.as_deref()).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("{e}; keeping the running graph");
                tokio::time::sleep_until(asked + every).await;
                continue;
            }
        };
        if have.as_deref() == Some(text.as_str()) {
            // A daemon that held the ask until its wait ran out (a long
            // poll) is asked again at once: sleeping out a long interval
            // here would leave the mount deaf to changes for that long.
            // One that answered at once with the same volfile (an older
            // daemon) is asked again after `every`.
            if asked.elapsed() < crate::mgmt::protocol::SPEC_WAIT / 2 {
                tokio::time::sleep_until(asked + every).await;
            }
            continue;
        }
        if let Err(e) = write_spec(src, &file, &text) {
            tracing::warn!("{e}");
            continue;
        }
        tracing::info!(volume, "the daemon serves a new volfile; reloading");
        let _ = reloader.reload("volfile server").await;
    }
}

/// The daemon's default log name: the mount point's path with `/` as `-`
/// (`/mnt/vol` logs to `mnt-vol.log`), as GlusterFS names its client logs.
fn log_name(mountpoint: &Path) -> String {
    let s = mountpoint.display().to_string();
    let t = s.trim_matches('/').replace('/', "-");
    format!("{}.log", if t.is_empty() { "root" } else { &t })
}

/// Points stdout and stderr at /dev/null: the daemon's parent has read the
/// start line and gone.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto the standard descriptors with a valid fd.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
            libc::dup2(null.as_raw_fd(), 2);
        }
    }
}

/// Shuts the graph down on a blocking thread.
async fn shutdown(graph: Arc<Graph>) {
    let _ = tokio::task::spawn_blocking(move || graph.shutdown()).await;
}

/// How long `xlfs umount` waits for the mount process to exit.
const UMOUNT_EXIT_WAIT: Duration = Duration::from_secs(30);

impl UmountArgs {
    /// Asks the mount process to send what it delayed (queued writes,
    /// directory operations answered early), so that a mount made right
    /// after sees it all, then unmounts. (A plain umount(8) returns at once
    /// and the process sends it before it exits.)
    pub(super) async fn run(self) -> Result<(), CliError> {
        if !self.lazy {
            match super::reload::ask(&self.mountpoint, "drain").await {
                Ok((true, _)) => {}
                Ok((false, why)) => tracing::warn!(mountpoint = %self.mountpoint.display(), "drain: {}", why.trim()),
                Err(e) => tracing::debug!("no mount process to drain: {e}"),
            }
        }
        let control = super::reload::socket_path(&self.mountpoint);
        let flags = if self.lazy { libc::MNT_DETACH } else { 0 };
        crate::fuse::umount(&self.mountpoint, flags)
            .map_err(|source| MountError::Umount { path: self.mountpoint.clone(), source })?;
        if !self.lazy {
            // The process shuts its graph down after the kernel lets go; a
            // mount of the same point made before it is gone would find its
            // control socket still answering. Wait for it to go.
            let deadline = std::time::Instant::now() + UMOUNT_EXIT_WAIT;
            while std::os::unix::net::UnixStream::connect(&control).is_ok() {
                if std::time::Instant::now() >= deadline {
                    tracing::warn!(mountpoint = %self.mountpoint.display(), "the mount process is still running");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    fn mount_args(args: &[&str]) -> Result<MountArgs, clap::Error> {
        match Cli::try_parse_from(["xlfs", "mount"].iter().chain(args))?.command {
            Command::Mount(m) => Ok(m),
            other => panic!("not a mount command: {other:?}"),
        }
    }

    #[test]
    fn parses_options_and_modes() {
        let m = mount_args(&["--volfile", "v.vol", "/mnt/x", "-o", "ro,entry-timeout=2", "-o", "noatime", "-f"])
            .expect("args");
        assert_eq!(
            (m.volfile.as_deref(), m.mountpoint.as_path(), m.foreground),
            (Some(Path::new("v.vol")), Path::new("/mnt/x"), true)
        );
        let o = m.mount_options().expect("options");
        assert!(o.read_only && o.noatime);
        assert_eq!(o.entry_timeout, Duration::from_secs(2));
        let e = mount_args(&["/mnt/x"]).expect("args").normalize().expect_err("nothing to mount");
        assert!(e.to_string().contains("give --volfile FILE or HOST[:PORT]:/VOLUME"), "{e}");
        let m = mount_args(&["127.0.0.1:24008:/gv0", "-f", "/mnt/x"]).expect("by name").normalize().expect("valid");
        assert_eq!((m.source.as_deref(), m.volfile.as_deref()), (Some("127.0.0.1:24008:/gv0"), None));
        assert_eq!(m.mountpoint, Path::new("/mnt/x"));
        assert!(mount_args(&["--volfile", "v", "h:/gv0", "/mnt/x"]).expect("args").normalize().is_err(), "both");
        let bad = mount_args(&["--volfile", "v", "/m", "-o", "bogus"]).expect("args");
        assert!(bad.mount_options().expect_err("bogus").to_string().contains("'bogus'"));
    }

    #[test]
    fn sources_name_a_daemon_and_a_volume() {
        let p = |s: &str| parse_source(s).map_err(|e| e.to_string());
        assert_eq!(p("127.0.0.1:24008:/gv0"), Ok(("127.0.0.1:24008".into(), "gv0".into())));
        assert_eq!(p("node1:/gv0"), Ok(("node1:24007".into(), "gv0".into())));
        assert_eq!(p("[::1]:7:/v"), Ok(("[::1]:7".into(), "v".into())));
        assert!(p("node1:gv0").expect_err("no :/").contains("HOST[:PORT]:/VOLUME"));
        assert!(p(":/v").is_err() && p("h:/a/b").is_err());
    }

    #[test]
    fn log_names_follow_the_mount_point() {
        assert_eq!(log_name(Path::new("/mnt/vol")), "mnt-vol.log");
        assert_eq!(log_name(Path::new("/")), "root.log");
    }

    #[tokio::test]
    async fn bad_volfile_fails_before_daemonizing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let vol = tmp.path().join("v.vol");
        std::fs::write(&vol, "volume x\n type no/such\nend-volume\n").expect("write");
        let m = mount_args(&["--volfile", vol.to_str().expect("utf-8"), tmp.path().to_str().expect("utf-8")])
            .expect("args");
        let e = m.run(&mut Vec::new()).await.expect_err("unknown type");
        assert!(e.to_string().contains("unknown type 'no/such'"), "{e}");
    }

    #[tokio::test]
    async fn umount_of_a_non_mount_fails_with_the_reason() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let e = UmountArgs { mountpoint: tmp.path().to_path_buf(), lazy: false }.run().await.expect_err("not mounted");
        assert!(e.to_string().starts_with(&format!("unmounting {}: ", tmp.path().display())), "{e}");
    }
}
