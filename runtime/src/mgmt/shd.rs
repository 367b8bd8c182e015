//! Self-heal daemons (GlusterFS's glustershd): the daemon runs one `xlfs
//! heal --daemon` per started volume, over the volume's client volfile
//! (written to `STATE/shd/VOLUME.vol`; log in `STATE/logs/VOLUME-shd.log`).
//! [`Shds::reconcile`] runs every second: it starts the self-heal daemon
//! of a volume that was started, stops that of a volume that was stopped,
//! restarts one that died (logged, counted; after the bricks' backoff, 1 s
//! doubling to 30 s while it keeps dying young) and, when the volume's volfile
//! changed (a `volume set`, a brick on a new port), writes the new one and
//! restarts the self-heal daemon on it. `xlfs heal --daemon` heals at its
//! start, whenever a replicate child comes up, and every
//! [`SHD_INTERVAL`] seconds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::supervisor::{BACKOFF_MAX, BACKOFF_MIN, STABLE_RUN, Supervisor};

/// Seconds between heals of the whole index (GlusterFS's heal-timeout).
pub const SHD_INTERVAL: u64 = 600;
/// How long a self-heal daemon may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A self-heal daemon's state, as `volume status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShdStatus {
    /// Its process, while it runs.
    pub pid: Option<u32>,
    /// Running now.
    pub up: bool,
    /// Times it was restarted after dying.
    pub restarts: u32,
}

struct Shd {
    child: Child,
    volfile: String,
    restarts: u32,
    started: Instant,
    /// The wait before the next restart, doubled while it keeps dying
    /// soon after a start (as the bricks').
    backoff: Duration,
    /// When a dead one may be started again.
    retry_at: Option<Instant>,
}

/// The self-heal daemons of this node's started volumes.
pub struct Shds {
    dir: PathBuf,
    running: Mutex<BTreeMap<String, Shd>>,
}

impl Shds {
    /// Self-heal daemons whose volfiles go to `dir`.
    pub fn new(dir: PathBuf) -> std::io::Result<Shds> {
        std::fs::create_dir_all(&dir)?;
        Ok(Shds { dir, running: Mutex::new(BTreeMap::new()) })
    }

    /// The state of `volume`'s self-heal daemon, if it has one.
    pub fn status(&self, volume: &str) -> Option<ShdStatus> {
        let mut m = self.running.lock();
        let s = m.get_mut(volume)?;
        let up = matches!(s.child.try_wait(), Ok(None));
        Some(ShdStatus { pid: up.then(|| s.child.id()), up, restarts: s.restarts })
    }

    /// Brings the self-heal daemons in line with `want` (volume to its
    /// client volfile): starts, stops and restarts them as needed.
    pub async fn reconcile(&self, sup: &Supervisor, want: &BTreeMap<String, String>) {
        let mut stop: Vec<(String, Shd)> = Vec::new();
        let mut start: Vec<(String, String, u32, Duration)> = Vec::new();
        {
            let mut m = self.running.lock();
            let names: Vec<String> = m.keys().cloned().collect();
            for name in names {
                let Some(s) = m.get_mut(&name) else { continue };
                match want.get(&name) {
                    None => {
                        if let Some(s) = m.remove(&name) {
                            stop.push((name, s));
                        }
                    }
                    Some(text) => {
                        if let Ok(Some(status)) = s.child.try_wait() {
                            let now = Instant::now();
                            match s.retry_at {
                                None => {
                                    s.backoff = if now.duration_since(s.started) >= STABLE_RUN {
                                        BACKOFF_MIN
                                    } else {
                                        (s.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX)
                                    };
                                    s.retry_at = Some(now + s.backoff);
                                    tracing::warn!(volume = %name, %status, "self-heal daemon died; restarting in {:?}", s.backoff);
                                }
                                Some(at) if now >= at => {
                                    start.push((name.clone(), text.clone(), s.restarts + 1, s.backoff));
                                    m.remove(&name);
                                }
                                Some(_) => {}
                            }
                        } else if s.volfile != *text {
                            tracing::info!(volume = %name, "volfile changed; restarting the self-heal daemon on it");
                            start.push((name.clone(), text.clone(), s.restarts, s.backoff));
                            if let Some(s) = m.remove(&name) {
                                stop.push((name, s));
                            }
                        }
                    }
                }
            }
            for (name, text) in want {
                if !m.contains_key(name) && !start.iter().any(|(n, ..)| n == name) {
                    start.push((name.clone(), text.clone(), 0, Duration::ZERO));
                }
            }
        }
        for (name, s) in stop {
            stop_one(&name, s).await;
        }
        for (name, text, restarts, backoff) in start {
            match self.spawn(sup, &name, &text) {
                Ok(child) => {
                    tracing::info!(volume = %name, pid = child.id(), "self-heal daemon started");
                    let shd = Shd { child, volfile: text, restarts, started: Instant::now(), backoff, retry_at: None };
                    self.running.lock().insert(name, shd);
                }
                Err(e) => tracing::error!(volume = %name, "starting the self-heal daemon: {e}"),
            }
        }
    }

    fn spawn(&self, sup: &Supervisor, volume: &str, volfile: &str) -> std::io::Result<Child> {
        let path = self.dir.join(format!("{volume}.vol"));
        let tmp = self.dir.join(format!(".{volume}.vol.tmp"));
        std::fs::write(&tmp, volfile)?;
        std::fs::rename(&tmp, &path)?;
        let log_path = sup.log_dir().join(format!("{volume}-shd.log"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let mut cmd = Command::new(sup.exe());
        cmd.arg("heal")
            .arg("--volfile")
            .arg(&path)
            .arg("--daemon")
            .arg("--interval")
            .arg(SHD_INTERVAL.to_string())
            .arg("--wait")
            .arg("30")
            .arg("--log-file")
            .arg(&log_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        sup.spawn(cmd)
    }

    /// Stops every self-heal daemon.
    pub async fn stop_all(&self) {
        let all: Vec<(String, Shd)> = std::mem::take(&mut *self.running.lock()).into_iter().collect();
        for (name, s) in all {
            stop_one(&name, s).await;
        }
    }
}

/// SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]; reaps it.
async fn stop_one(volume: &str, mut s: Shd) {
    let pid = s.child.id();
    // SAFETY: kill(2) on our child, not yet reaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let _ = tokio::task::spawn_blocking(move || {
        let end = Instant::now() + STOP_TIMEOUT;
        while matches!(s.child.try_wait(), Ok(None)) {
            if Instant::now() >= end {
                let _ = s.child.kill();
                let _ = s.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await;
    tracing::info!(volume, pid, "self-heal daemon stopped");
}
