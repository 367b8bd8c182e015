//! The `xlfs` command line: the argument definitions (clap derive) and what
//! each subcommand does, one module per subcommand. `main.rs` only parses,
//! sets up logging ([`Cli::log_file`], [`Cli::default_log_filter`]) and runs
//! [`Cli::run`] on a tokio runtime. A new subcommand is a new [`Command`]
//! variant with its own argument type and `run`.

use std::io::Write;
use std::path::Path;

use clap::{Parser, Subcommand};

use crate::graph::{GraphError, LoadError};
use crate::volfile::VolfileError;

pub mod brick;
pub mod daemon;
pub mod heal;
pub mod mount;
pub mod profile;
pub mod reload;
pub mod up;
pub mod volfile;

pub use crate::mgmt::volgen::local::{DEFAULT_PERF, client_volfile, distributed_volfile, replica_volfile};
pub use brick::{BrickArgs, BrickError};
pub use daemon::{DaemonArgs, DaemonError, PeerArgs, PeerCommand, VolumeArgs, VolumeCommand};
pub use heal::{HealArgs, HealError};
pub use mount::{MountArgs, MountError, UmountArgs};
pub use profile::ProfileArgs;
pub use reload::{ReloadArgs, ReloadError, StatusArgs, SyncArgs};
pub use up::{DownArgs, UpArgs, UpError};
pub use volfile::VolfileCommand;

/// xlfs: a distributed filesystem built from a graph of translators.
#[derive(Debug, Parser)]
#[command(name = "xlfs", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with volfiles.
    #[command(subcommand)]
    Volfile(VolfileCommand),
    /// Serve a brick: a directory behind posix -> locks -> io-threads ->
    /// index -> io-stats -> protocol/server, until SIGTERM or SIGINT.
    Brick(BrickArgs),
    /// Mount a volume with FUSE: the graph of a client volfile, until
    /// unmounted, SIGTERM or SIGINT (a daemon unless --foreground).
    Mount(MountArgs),
    /// Unmount an xlfs mount (also one whose process died).
    Umount(UmountArgs),
    /// Start three local bricks and mount a replica-3 volume over them.
    Up(UpArgs),
    /// Unmount and stop what `xlfs up` started.
    Down(DownArgs),
    /// Self-heal a replicated volume, list what needs healing, or resolve
    /// a split-brain.
    Heal(HealArgs),
    /// Make a mounted client re-read its volfile now (as SIGHUP does).
    Reload(ReloadArgs),
    /// Show a mounted client's running graph, its generation and when it
    /// was switched.
    Status(StatusArgs),
    /// Send what a mounted client delayed (directory operations answered
    /// early, writes held by write-behind) to the bricks and wait for their
    /// answers: sync(1) for an xlfs mount, whose process the kernel never
    /// tells of a sync or syncfs (it does so for virtiofs only).
    Sync(SyncArgs),
    /// Show where the time goes, per fop and translator, in a mounted
    /// client's graph and its bricks' (or one brick's, with --brick).
    Profile(ProfileArgs),
    /// Run the management daemon of this node (GlusterFS's glusterd): keep
    /// volume specs, serve and supervise their bricks, serve client volfiles.
    Daemon(DaemonArgs),
    /// Create, start, stop, delete, configure and show volumes (asks the
    /// daemon).
    Volume(VolumeArgs),
    /// Add, remove and list the nodes of the cluster (asks the daemon).
    Peer(PeerArgs),
}

/// Why a command failed; the message is what the user sees.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The volfile could not be read or parsed.
    #[error(transparent)]
    Volfile(#[from] VolfileError),
    /// The volfile does not make a valid graph.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The brick could not be served.
    #[error(transparent)]
    Brick(#[from] BrickError),
    /// Mounting or unmounting failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// `xlfs up` or `xlfs down` failed.
    #[error(transparent)]
    Up(#[from] UpError),
    /// Healing failed.
    #[error(transparent)]
    Heal(#[from] HealError),
    /// A reload or status request failed.
    #[error(transparent)]
    Reload(#[from] ReloadError),
    /// The daemon or a volume request failed.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// Writing the output failed.
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// Makes the process `cmd` starts the leader of a new session, so it
/// outlives the command that started it (`xlfs mount`'s daemon, the
/// processes of `xlfs up`).
fn new_session(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl From<LoadError> for CliError {
    fn from(e: LoadError) -> CliError {
        match e {
            LoadError::Volfile(e) => CliError::Volfile(e),
            LoadError::Graph(e) => CliError::Graph(e),
        }
    }
}

impl Cli {
    /// Where the command wants its log written, if not stderr.
    pub fn log_file(&self) -> Option<&Path> {
        match &self.command {
            Command::Brick(b) => b.log_file.as_deref(),
            Command::Mount(m) => m.log_file.as_deref(),
            Command::Heal(h) => h.log_file.as_deref(),
            Command::Daemon(d) => d.log_file.as_deref(),
            _ => None,
        }
    }

    /// The worker threads the command's own options ask for (a mount's
    /// `-o event-threads=N`), over `TOKIO_WORKER_THREADS`.
    pub fn event_threads(&self) -> Option<usize> {
        match &self.command {
            Command::Mount(m) => m.event_threads(),
            _ => None,
        }
    }

    /// The log filter when neither `XLFS_LOG` nor `RUST_LOG` sets one: a
    /// brick is a server and logs what it does (`info`, like GlusterFS's
    /// bricks); one-shot commands only warn. A mount leaves out fuser's
    /// session warning, which only says that fuser's own unmount at the end
    /// found the mount already gone (the bridge unmounts first, after
    /// draining).
    pub fn default_log_filter(&self) -> &'static str {
        match &self.command {
            Command::Mount(_) => "info,fuser::session=error",
            Command::Brick(_) | Command::Daemon(_) => "info",
            Command::Heal(h) if h.is_daemon() => "info",
            _ => "warn",
        }
    }

    /// Runs the command, writing its normal output to `out`.
    pub async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        match self.command {
            Command::Volfile(cmd) => cmd.run(out).await,
            Command::Brick(args) => args.run(out).await,
            Command::Mount(args) => args.run(out).await,
            Command::Umount(args) => args.run().await,
            Command::Up(args) => args.run(out).await,
            Command::Down(args) => args.run(out).await,
            Command::Heal(args) => args.run(out).await,
            Command::Reload(args) => args.run(out).await,
            Command::Status(args) => args.run(out).await,
            Command::Sync(args) => args.run().await,
            Command::Profile(args) => args.run(out).await,
            Command::Daemon(args) => args.run(out).await,
            Command::Volume(args) => args.run(out).await,
            Command::Peer(args) => args.run(out).await,
        }
    }
}
