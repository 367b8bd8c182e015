//! A FUSE mount of a volfile by a real `xlfs mount --foreground` process
//! ([`FuseMount`]: dropping it, also when a test panics, stops the process
//! and detaches the mount if still there), and [`sh`] to drive a mount
//! with ordinary tools.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use super::XLFS;

/// How long a mount may take to come up or to go away: a hang guard.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);

/// True if `path` is a mount point now.
pub fn is_mounted(path: &Path) -> bool {
    let p = path.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(p.as_str())))
        .unwrap_or(false)
}

/// Sends `sig` to `pid`.
pub fn send_signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// An `xlfs mount --foreground` process and its mount point.
pub struct FuseMount {
    pub child: Option<Child>,
    mnt: PathBuf,
    vol: PathBuf,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl FuseMount {
    /// Mounts `volfile` with `-o opts` and waits for the start line.
    pub fn start(volfile: &str, opts: &str) -> FuseMount {
        FuseMount::start_args(volfile, opts, &[])
    }

    /// [`FuseMount::start`] with more `xlfs mount` arguments.
    pub fn start_args(volfile: &str, opts: &str, args: &[&str]) -> FuseMount {
        FuseMount::start_env(volfile, opts, args, &[])
    }

    /// [`FuseMount::start_args`] with more environment variables for the
    /// mount process.
    pub fn start_env(volfile: &str, opts: &str, args: &[&str], env: &[(&str, &str)]) -> FuseMount {
        let dir = tempfile::Builder::new().prefix("xlfs-fuse-").tempdir().expect("temp dir");
        let vol = dir.path().join("client.vol");
        std::fs::write(&vol, volfile).expect("volfile");
        let mut all = vec!["--volfile".to_string(), vol.display().to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        FuseMount::launch(dir, vol, opts, &all, env)
    }

    /// Mounts a volume by name (`HOST:PORT:/VOLUME`, from an `xlfs
    /// daemon`) with more `xlfs mount` arguments.
    pub fn start_by_name(source: &str, opts: &str, args: &[&str]) -> FuseMount {
        let dir = tempfile::Builder::new().prefix("xlfs-fuse-").tempdir().expect("temp dir");
        let mut all = vec![source.to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        FuseMount::launch(dir, PathBuf::new(), opts, &all, &[])
    }

    fn launch(dir: tempfile::TempDir, vol: PathBuf, opts: &str, args: &[String], env: &[(&str, &str)]) -> FuseMount {
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        let mnt = std::fs::canonicalize(&mnt).expect("canonical");
        let log = dir.path().join("mount.log");
        let mut cmd = Command::new(XLFS);
        cmd.arg("mount").arg("--foreground").arg("--log-file").arg(&log).args(args);
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts);
        }
        cmd.arg(&mnt).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.env("XLFS_LOG", std::env::var("XLFS_TEST_LOG").unwrap_or_else(|_| "info".into()));
        cmd.envs(env.iter().copied());
        // SAFETY: prctl is async-signal-safe: the mount unmounts cleanly
        // (SIGTERM) if the test process dies.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn xlfs mount");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(MOUNT_TIMEOUT).unwrap_or_default();
        let mut m = FuseMount { child: Some(child), mnt, vol, log, dir };
        if !line.starts_with("xlfs mount: ") {
            let mut err = String::new();
            if let Some(c) = m.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
                if let Some(mut e) = c.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
            }
            panic!("mount did not start: {line:?}\nstderr: {err}\nlog:\n{}", m.log());
        }
        assert!(is_mounted(&m.mnt), "mounted after the start line");
        m
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// The volfile the mount was started with (empty for a mount by name).
    pub fn volfile(&self) -> &Path {
        &self.vol
    }

    /// The directory holding the volfile, the log and the mount point.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The mount process's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` and waits for the process to exit.
    pub fn stop_with(&mut self, sig: libc::c_int) -> ExitStatus {
        if let Some(child) = &self.child {
            send_signal(child.id(), sig);
        }
        self.wait_exit(&format!("after signal {sig}"))
    }

    /// Waits (at most [`MOUNT_TIMEOUT`]) for the process to exit; `after`
    /// says what should have made it (for the panic message).
    pub fn wait_exit(&mut self, after: &str) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mount process did not exit {after}\nlog:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            send_signal(c.id(), libc::SIGTERM);
            let deadline = Instant::now() + MOUNT_TIMEOUT;
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = xlfs_runtime::fuse::lazy_unmount(&self.mnt);
        }
        if std::thread::panicking() {
            let log = self.log();
            let keep = std::env::temp_dir().join(format!(
                "xlfs-mount-{}-{}.log",
                std::process::id(),
                self.mnt.display().to_string().replace('/', "-")
            ));
            if std::fs::write(&keep, &log).is_ok() {
                eprintln!("--- the whole mount log is kept in {} ---", keep.display());
            }
            let warnings: Vec<&str> =
                log.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).take(100).collect();
            eprintln!("--- mount log warnings ---\n{}", warnings.join("\n"));
            let tail: Vec<&str> = log.lines().rev().take(100).collect();
            eprintln!("--- mount log (last lines) ---\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
    }
}

/// Runs a bash script (`set -euo pipefail`) in `cwd`; panics with its
/// output if it fails.
pub fn sh(cwd: &Path, env: &[(&str, &Path)], script: &str) -> String {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(format!("set -euo pipefail\n{script}")).current_dir(cwd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run bash");
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "script failed ({}):\n{script}\n--- stdout ---\n{so}\n--- stderr ---\n{se}",
        out.status
    );
    so.into_owned()
}
