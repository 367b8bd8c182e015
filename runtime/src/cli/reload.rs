//! `xlfs reload MOUNTPOINT` and `xlfs status MOUNTPOINT`, and the control
//! socket of a mount process that answers them.
//!
//! Each `xlfs mount` process listens on a Unix socket named after its
//! canonical mount point: `/run/xlfs/<h>.sock`, where `<h>` is the first 16
//! hex digits of the SHA-256 of the path (short, whatever the path's
//! length; `$XLFS_RUN_DIR` replaces `/run/xlfs`). The commands canonicalize
//! the mount point they are given the same way, so any spelling of the path
//! finds the process. The socket is made when the mount is up and removed
//! when it ends; a stale one (the process died) is refused at connect.
//!
//! The exchange is one request line (`reload`, `status`, `dump`, `profile`
//! or `profile reset`) and the answer:
//! a line `ok` or `error`, then the text to show. `xlfs reload` prints the
//! outcome and exits 1 when the new volfile was rejected (the running graph
//! goes on); `xlfs status` prints the running graph, its generation, the
//! volfile, when it was switched and the last reload's outcome, and with
//! `--dump` every translator's counters (how a workload's lock and xattrop
//! fops per lock-contention policy are seen on a mount). `profile` answers
//! with the running graph's fop timings and its bricks'
//! ([`crate::profile::ProfileBundle::to_text`]), which `xlfs profile`
//! prints.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::CliError;
use crate::reload::Reloader;

/// `xlfs reload`.
#[derive(Debug, Args)]
pub struct ReloadArgs {
    /// The mount point of the client to reload.
    pub mountpoint: PathBuf,
}

/// `xlfs status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The mount point of the client.
    pub mountpoint: PathBuf,
    /// Also print every translator's counters (`volume.key = value`):
    /// io-stats per fop, the lock and xattrop fops cluster/replicate sent
    /// (`sent.FINODELK` ...), eager-lock windows, heal queues, ...
    #[arg(long)]
    pub dump: bool,
}

/// `xlfs sync`.
#[derive(Debug, Args)]
pub struct SyncArgs {
    /// The mount point of the client.
    pub mountpoint: PathBuf,
}

/// Why a reload or status request failed.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// No mount process answers for the mount point.
    #[error("no xlfs mount process answers for {} (control socket {}): {source}", mountpoint.display(), socket.display())]
    NotRunning {
        /// The mount point.
        mountpoint: PathBuf,
        /// The socket tried.
        socket: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The mount process rejected the new volfile; the running graph goes on.
    #[error("reload rejected, the running graph goes on: {0}")]
    Rejected(String),
    /// The request failed.
    #[error("{0}")]
    Failed(String),
    /// Talking to the mount process failed.
    #[error("talking to the mount process: {0}")]
    Io(#[from] std::io::Error),
}

/// The directory of the control sockets.
pub(crate) fn run_dir() -> PathBuf {
    std::env::var_os("XLFS_RUN_DIR").map_or_else(|| PathBuf::from("/run/xlfs"), PathBuf::from)
}

/// The control socket of the mount on `mountpoint` (canonicalized if it
/// exists).
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let canonical = std::fs::canonicalize(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let hash = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let name: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    run_dir().join(format!("{name}.sock"))
}

/// The largest request line read.
const MAX_REQUEST: u64 = 64;
/// The largest answer read.
const MAX_ANSWER: u64 = 1 << 20;

/// Sends `request` to the mount on `mountpoint`; returns (ok, text).
pub(super) async fn ask(mountpoint: &Path, request: &str) -> Result<(bool, String), ReloadError> {
    let socket = socket_path(mountpoint);
    let mut s = UnixStream::connect(&socket).await.map_err(|source| ReloadError::NotRunning {
        mountpoint: mountpoint.to_path_buf(),
        socket: socket.clone(),
        source,
    })?;
    s.write_all(format!("{request}\n").as_bytes()).await?;
    s.shutdown().await?;
    let mut answer = String::new();
    s.take(MAX_ANSWER).read_to_string(&mut answer).await?;
    match answer.split_once('\n') {
        Some(("ok", text)) => Ok((true, text.to_string())),
        Some(("error", text)) => Ok((false, text.to_string())),
        _ => Err(ReloadError::Failed(format!("unexpected answer from the mount process: {answer:?}"))),
    }
}

impl ReloadArgs {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        match ask(&self.mountpoint, "reload").await? {
            (true, text) => {
                out.write_all(text.as_bytes())?;
                Ok(())
            }
            (false, text) => Err(ReloadError::Rejected(text.trim_end().to_string()).into()),
        }
    }
}

impl StatusArgs {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        match ask(&self.mountpoint, if self.dump { "dump" } else { "status" }).await? {
            (true, text) => {
                out.write_all(text.as_bytes())?;
                Ok(())
            }
            (false, text) => Err(ReloadError::Failed(text.trim_end().to_string()).into()),
        }
    }
}

impl SyncArgs {
    /// Asks the mount process to send what it delayed and waits until the
    /// bricks have answered for all of it.
    pub(super) async fn run(self) -> Result<(), CliError> {
        match ask(&self.mountpoint, "drain").await? {
            (true, _) => Ok(()),
            (false, text) => Err(ReloadError::Failed(text.trim_end().to_string()).into()),
        }
    }
}

/// A mount process's control socket; removed when dropped.
pub(crate) struct ControlSocket {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens for `xlfs reload` and `xlfs status` for the mount on
/// `mountpoint`, answering with `reloader`.
pub(crate) fn serve_control(mountpoint: &Path, reloader: Arc<Reloader>) -> std::io::Result<ControlSocket> {
    let path = socket_path(mountpoint);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A socket left by a process that died refuses connections: replace
    // it. One that answers belongs to a live mount of the same path.
    if std::os::unix::net::UnixStream::connect(&path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("{} is in use by another mount process", path.display()),
        ));
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    tracing::info!(socket = %path.display(), "control socket: xlfs reload and xlfs status");
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let r = reloader.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(stream, &r).await {
                    tracing::debug!(error = %e, "control connection");
                }
            });
        }
    });
    Ok(ControlSocket { path, task })
}

async fn answer(stream: UnixStream, reloader: &Reloader) -> std::io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut line = String::new();
    BufReader::new(rd.take(MAX_REQUEST)).read_line(&mut line).await?;
    let reply = match line.trim() {
        "reload" => match reloader.reload("xlfs reload").await {
            Ok(applied) => format!("ok\n{applied}; generation {}\n", reloader.status().generation),
            Err(e) => format!("error\n{e}\n"),
        },
        "status" => format!("ok\n{}", reloader.status()),
        "drain" => match reloader.drain().await {
            true => "ok\ndrained\n".to_string(),
            false => "error\ndelayed work still not sent\n".to_string(),
        },
        "dump" => {
            let mut text = format!("ok\n{}", reloader.status());
            for (k, v) in reloader.dump() {
                text += &format!("{k} = {v}\n");
            }
            text
        }
        "profile" | "profile reset" => match reloader.graph() {
            Some(g) => format!("ok\n{}", crate::profile::collect(&g, line.trim() == "profile reset").await.to_text()),
            None => "error\nthis mount's graph is not managed by the mount\n".to_string(),
        },
        other => format!(
            "error\nunknown request {other:?}: expected reload, status, dump, drain, profile or profile reset\n"
        ),
    };
    wr.write_all(reply.as_bytes()).await?;
    wr.shutdown().await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    #[test]
    fn socket_names_follow_the_canonical_mount_point() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let m = tmp.path().join("m");
        std::fs::create_dir(&m).expect("dir");
        std::os::unix::fs::symlink(&m, tmp.path().join("l")).expect("symlink");
        let a = socket_path(&m);
        assert_eq!(a, socket_path(&tmp.path().join("l")), "spellings of one path");
        assert_ne!(a, socket_path(Path::new("/elsewhere")));
        assert!(a.to_string_lossy().len() < 100, "fits a socket address: {}", a.display());
    }

    #[tokio::test]
    async fn a_mount_point_without_a_process_is_named_in_the_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cli = Cli::try_parse_from(["xlfs", "reload", tmp.path().to_str().expect("utf-8")]).expect("args");
        let Command::Reload(args) = cli.command else { panic!("reload") };
        let e = args.run(&mut Vec::new()).await.expect_err("nobody answers");
        assert!(
            e.to_string().starts_with(&format!("no xlfs mount process answers for {}", tmp.path().display())),
            "{e}"
        );
    }
}
