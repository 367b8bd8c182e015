//! Brick supervision and the portmapper.
//!
//! The daemon serves each local brick of a started volume with one `xlfs
//! brick --dir DIR --port P` process. The port is chosen without races:
//! the first start asks for port 0 and the brick reports the port the
//! kernel gave it in its start line (`xlfs brick: serving ... on
//! HOST:PORT`); a restart asks for the port it had, so clients reconnect
//! to the same address, and falls back to port 0 if that is taken.
//! [`Supervisor::port`] answers which port a brick listens on
//! (GlusterFS's portmapper); the client volfile the daemon serves names
//! the current ports.
//!
//! A brick that exits without being asked to is restarted after a backoff
//! (1 s, doubling to 30 s, back to 1 s once a run lasted a minute); each
//! exit and restart is logged. Bricks are spawned from one long-lived
//! thread with `PR_SET_PDEATHSIG`, so they never outlive the daemon (a
//! daemon restart restarts the bricks of started volumes).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};

use super::spec::BrickSpec;

/// How long a brick may take to report that it serves.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a brick may take to exit after SIGTERM before SIGKILL (it
/// drains in-flight fops for up to 30 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(40);
/// The first wait before a restart.
pub(super) const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait before a restart.
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A run this long resets the backoff.
pub(super) const STABLE_RUN: Duration = Duration::from_secs(60);
/// The start line's prefix.
const SERVING: &str = "xlfs brick: serving ";

/// One brick to serve.
#[derive(Clone, Debug)]
pub struct BrickJob {
    /// The volume.
    pub volume: String,
    /// The volume's uuid (the brick's storage/posix `volume-id`).
    pub volume_id: String,
    /// The brick.
    pub brick: BrickSpec,
    /// protocol/server options from the volume's keys (`--server`).
    pub server: Vec<(&'static str, String)>,
    /// storage/posix options from the volume's `storage.*` keys (`--posix`).
    pub posix: Vec<(String, String)>,
    /// The port it served on before this daemon started (published in a
    /// shared store), tried first so that clients find it where it was.
    pub port: Option<u16>,
}

impl BrickJob {
    /// The arguments of `xlfs brick` that serve it on `port`.
    pub fn args(&self, port: u16) -> Vec<String> {
        let mut a = vec![
            "--dir".to_string(),
            self.brick.dir.display().to_string(),
            "--port".into(),
            port.to_string(),
            "--host".into(),
            bind_address(&self.brick.host),
            "--volume".into(),
            self.volume.clone(),
            "--posix".into(),
            format!("volume-id={}", self.volume_id),
        ];
        a.extend(self.server.iter().flat_map(|(k, v)| ["--server".to_string(), format!("{k}={v}")]));
        a.extend(self.posix.iter().flat_map(|(k, v)| ["--posix".to_string(), format!("{k}={v}")]));
        a
    }
}

/// A brick's state now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunState {
    /// Its process, while one serves.
    pub pid: Option<u32>,
    /// The port it serves (or last served) on.
    pub port: Option<u16>,
    /// Restarts after unexpected exits.
    pub restarts: u32,
}

struct Supervised {
    job: BrickJob,
    log: PathBuf,
    state: Mutex<RunState>,
    stopping: Mutex<bool>,
    wake: Notify,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

type SpawnReply = std::sync::mpsc::Sender<std::io::Result<Child>>;

/// Starts, watches and stops brick processes.
pub struct Supervisor {
    exe: PathBuf,
    log_dir: PathBuf,
    spawner: Mutex<std::sync::mpsc::Sender<(Command, SpawnReply)>>,
    /// (volume, brick) -> its supervision.
    bricks: Mutex<BTreeMap<(String, BrickSpec), Arc<Supervised>>>,
    /// Woken when a brick starts serving or exits.
    changed: Notify,
}

/// Why a brick could not be started.
#[derive(Debug, thiserror::Error)]
#[error("brick {brick} of volume {volume}: {why} (log: {})", log.display())]
pub struct StartError {
    /// The volume.
    pub volume: String,
    /// The brick.
    pub brick: BrickSpec,
    /// Why.
    pub why: String,
    /// Its log.
    pub log: PathBuf,
}

impl Supervisor {
    /// A supervisor running bricks with the `xlfs` binary `exe`, their
    /// logs in `log_dir`.
    pub fn new(exe: PathBuf, log_dir: PathBuf) -> std::io::Result<Supervisor> {
        std::fs::create_dir_all(&log_dir)?;
        let (tx, rx) = std::sync::mpsc::channel::<(Command, SpawnReply)>();
        std::thread::Builder::new().name("brick-spawner".into()).spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        })?;
        Ok(Supervisor {
            exe,
            log_dir,
            spawner: Mutex::new(tx),
            bricks: Mutex::new(BTreeMap::new()),
            changed: Notify::new(),
        })
    }

    fn log_path(&self, job: &BrickJob) -> PathBuf {
        let dir = job.brick.dir.display().to_string().trim_matches('/').replace('/', "-");
        self.log_dir.join(format!("{}-{}-{dir}.log", job.volume, job.brick.host))
    }

    /// Serves `job` unless it is served already; waits for the first
    /// start. A brick that is supervised but down (waiting for its
    /// restart) is restarted now.
    pub async fn start(self: &Arc<Self>, job: BrickJob) -> Result<(), StartError> {
        let key = (job.volume.clone(), job.brick.clone());
        let running = self.bricks.lock().get(&key).cloned();
        if let Some(s) = running {
            if s.state.lock().pid.is_some() {
                return Ok(());
            }
            // Down, waiting for its restart: now, and wait for it.
            s.wake.notify_one();
            let deadline = Instant::now() + START_TIMEOUT * 2;
            while s.state.lock().pid.is_none() {
                if Instant::now() >= deadline {
                    return Err(StartError {
                        volume: s.job.volume.clone(),
                        brick: s.job.brick.clone(),
                        why: format!("still down after {:?}", START_TIMEOUT * 2),
                        log: s.log.clone(),
                    });
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            return Ok(());
        }
        let s = Arc::new(Supervised {
            log: self.log_path(&job),
            state: Mutex::new(RunState { port: job.port, ..RunState::default() }),
            job,
            stopping: Mutex::new(false),
            wake: Notify::new(),
            task: Mutex::new(None),
        });
        let (tx, rx) = oneshot::channel();
        self.bricks.lock().insert(key.clone(), s.clone());
        let task = tokio::spawn(self.clone().supervise(s.clone(), tx));
        *s.task.lock() = Some(task);
        let fail = |why: String| StartError {
            volume: s.job.volume.clone(),
            brick: s.job.brick.clone(),
            why,
            log: s.log.clone(),
        };
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => {
                self.bricks.lock().remove(&key);
                Err(fail(why))
            }
            Err(_) => {
                self.bricks.lock().remove(&key);
                Err(fail("supervision ended".into()))
            }
        }
    }

    /// Runs one brick: start, wait for its exit, restart after a backoff,
    /// until stopped.
    async fn supervise(self: Arc<Self>, s: Arc<Supervised>, first: oneshot::Sender<Result<(), String>>) {
        let mut first = Some(first);
        let mut backoff = BACKOFF_MIN;
        loop {
            let hint = s.state.lock().port.unwrap_or(0);
            let mut launched = self.launch(&s, hint).await;
            if launched.is_err() && hint != 0 {
                tracing::warn!(brick = %s.job.brick, port = hint, "could not restart on its old port; trying any port");
                launched = self.launch(&s, 0).await;
            }
            match launched {
                Ok((mut child, port)) => {
                    let pid = child.id();
                    {
                        let mut st = s.state.lock();
                        st.pid = Some(pid);
                        st.port = Some(port);
                    }
                    self.changed.notify_waiters();
                    if *s.stopping.lock() {
                        // Stopped while it was starting.
                        signal(&s, libc::SIGTERM);
                    }
                    tracing::info!(volume = %s.job.volume, brick = %s.job.brick, pid, port, "brick serving");
                    if let Some(f) = first.take() {
                        let _ = f.send(Ok(()));
                    }
                    let began = Instant::now();
                    let status = tokio::task::spawn_blocking(move || child.wait()).await;
                    s.state.lock().pid = None;
                    self.changed.notify_waiters();
                    if *s.stopping.lock() {
                        tracing::info!(volume = %s.job.volume, brick = %s.job.brick, pid, "brick stopped");
                        break;
                    }
                    if began.elapsed() >= STABLE_RUN {
                        backoff = BACKOFF_MIN;
                    }
                    let status = match status {
                        Ok(Ok(st)) => st.to_string(),
                        Ok(Err(e)) => e.to_string(),
                        Err(e) => e.to_string(),
                    };
                    s.state.lock().restarts += 1;
                    tracing::warn!(
                        volume = %s.job.volume, brick = %s.job.brick, pid, %status,
                        "brick died; restarting in {backoff:?}"
                    );
                }
                Err(why) => {
                    if let Some(f) = first.take() {
                        let _ = f.send(Err(why));
                        return;
                    }
                    tracing::warn!(volume = %s.job.volume, brick = %s.job.brick, "brick restart failed: {why}; retrying in {backoff:?}");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = s.wake.notified() => {}
            }
            if *s.stopping.lock() {
                break;
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Spawns the brick on `port` and waits for its start line; returns
    /// the process and the port it serves on.
    async fn launch(&self, s: &Supervised, port: u16) -> Result<(Child, u16), String> {
        let job = &s.job;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&s.log)
            .map_err(|e| format!("log {}: {e}", s.log.display()))?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("brick")
            .args(job.args(port))
            .arg("--log-file")
            .arg(&s.log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        detach(&mut cmd);
        let (tx, rx) = std::sync::mpsc::channel();
        self.spawner.lock().send((cmd, tx)).map_err(|_| "the spawner thread is gone".to_string())?;
        let exe = self.exe.clone();
        let started = tokio::task::spawn_blocking(move || -> Result<(Child, String), String> {
            let mut child = rx
                .recv()
                .map_err(|_| "the spawner thread is gone".to_string())?
                .map_err(|e| format!("running {}: {e}", exe.display()))?;
            let Some(stdout) = child.stdout.take() else { return Err("no stdout".into()) };
            let (ltx, lrx) = std::sync::mpsc::channel();
            // Reads the start line, then drains stdout so the brick never
            // blocks on it.
            std::thread::spawn(move || {
                let mut sent = false;
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if !sent && line.starts_with(SERVING) {
                        let _ = ltx.send(line);
                        sent = true;
                    }
                }
            });
            match lrx.recv_timeout(START_TIMEOUT) {
                Ok(line) => Ok((child, line)),
                Err(_) => {
                    let status = child.try_wait().ok().flatten();
                    let _ = child.kill();
                    let _ = child.wait();
                    Err(match status {
                        Some(st) => format!("exited with {st} before serving"),
                        None => format!("did not serve within {START_TIMEOUT:?}"),
                    })
                }
            }
        })
        .await
        .map_err(|e| e.to_string())??;
        let (mut child, line) = started;
        match line.rsplit_once(':').and_then(|(_, p)| p.trim().parse::<u16>().ok()) {
            Some(port) => Ok((child, port)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("unexpected start line {line:?}"))
            }
        }
    }

    /// Spawns `cmd` as bricks are spawned: in its own session, from the
    /// long-lived spawner thread, SIGTERMed if the daemon dies. Blocks
    /// until the process is created.
    pub fn spawn(&self, mut cmd: Command) -> std::io::Result<Child> {
        detach(&mut cmd);
        let (tx, rx) = std::sync::mpsc::channel();
        let gone = || std::io::Error::other("the spawner thread is gone");
        self.spawner.lock().send((cmd, tx)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }

    /// Where process logs go.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// The `xlfs` binary processes are run from.
    pub fn exe(&self) -> &Path {
        &self.exe
    }

    /// Stops every brick of `volume` (SIGTERM, SIGKILL after a grace
    /// period) and waits for them to exit.
    pub async fn stop_volume(&self, volume: &str) {
        self.stop_bricks(volume, |_| true).await;
    }

    /// Stops the bricks of `volume` that `which` picks (SIGTERM, SIGKILL
    /// after a grace period) and waits for them to exit: add-brick's undo
    /// and remove-brick's commit.
    pub async fn stop_bricks(&self, volume: &str, which: impl Fn(&BrickSpec) -> bool) {
        let list: Vec<Arc<Supervised>> = {
            let mut b = self.bricks.lock();
            let keys: Vec<_> = b.keys().filter(|(v, br)| v == volume && which(br)).cloned().collect();
            keys.iter().filter_map(|k| b.remove(k)).collect()
        };
        for s in &list {
            *s.stopping.lock() = true;
            s.wake.notify_one();
            signal(s, libc::SIGTERM);
        }
        for s in list {
            let task = s.task.lock().take();
            if let Some(mut task) = task
                && tokio::time::timeout(STOP_TIMEOUT, &mut task).await.is_err()
            {
                tracing::warn!(brick = %s.job.brick, "brick did not stop within {STOP_TIMEOUT:?}; killing it");
                signal(&s, libc::SIGKILL);
                let _ = task.await;
            }
        }
    }

    /// Stops every brick.
    pub async fn stop_all(&self) {
        let volumes: Vec<String> = self.bricks.lock().keys().map(|(v, _)| v.clone()).collect();
        for v in volumes {
            self.stop_volume(&v).await;
        }
    }

    /// Resolves when a brick starts serving or exits (after the call).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The volumes with a brick supervised here.
    pub fn volumes(&self) -> Vec<String> {
        let mut v: Vec<String> = self.bricks.lock().keys().map(|(v, _)| v.clone()).collect();
        v.dedup();
        v
    }

    /// The state of brick `brick` of `volume`, if it is supervised.
    pub fn state(&self, volume: &str, brick: &BrickSpec) -> Option<RunState> {
        self.bricks.lock().get(&(volume.to_string(), brick.clone())).map(|s| s.state.lock().clone())
    }

    /// The port brick `brick` serves on (of whichever volume), if known.
    pub fn port(&self, brick: &BrickSpec) -> Option<u16> {
        self.bricks.lock().iter().find(|((_, b), _)| b == brick).and_then(|(_, s)| s.state.lock().port)
    }
}

/// A child in its own session that gets SIGTERM when the spawning thread
/// (the daemon's spawner) dies.
fn detach(cmd: &mut Command) {
    // SAFETY: setsid and prctl are async-signal-safe and touch no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn signal(s: &Supervised, sig: libc::c_int) {
    if let Some(pid) = s.state.lock().pid {
        // SAFETY: kill(2) on the pid of a child not yet reaped (the state
        // is cleared as soon as it is).
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    }
}

/// The address a brick on `host` listens on: the host itself when it is
/// an IP address, else every address.
pub fn bind_address(host: &str) -> String {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) if host == "localhost" => "127.0.0.1".into(),
        Err(_) => "0.0.0.0".into(),
    }
}

/// True if `host` names this machine (an address of it can be bound).
pub fn is_local(host: &str) -> bool {
    std::net::TcpListener::bind((host, 0)).is_ok()
}

/// Free bytes on the file system of `dir`.
pub fn disk_free(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statvfs buffer of ours.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)] // field widths differ between targets
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}
