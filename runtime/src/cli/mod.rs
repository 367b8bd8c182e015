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
pub mod mount;
pub mod volfile;

pub use brick::{BrickArgs, BrickError};
pub use mount::{MountArgs, MountError, UmountArgs};
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
    /// io-stats -> protocol/server, until SIGTERM or SIGINT.
    Brick(BrickArgs),
    /// Mount a volume with FUSE: the graph of a client volfile, until
    /// unmounted, SIGTERM or SIGINT (a daemon unless --foreground).
    Mount(MountArgs),
    /// Unmount an xlfs mount (also one whose process died).
    Umount(UmountArgs),
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
    /// Writing the output failed.
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
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
            Command::Volfile(_) | Command::Umount(_) => None,
        }
    }

    /// The log filter when neither `XLFS_LOG` nor `RUST_LOG` sets one: a
    /// brick is a server and logs what it does (`info`, like GlusterFS's
    /// bricks); one-shot commands only warn.
    pub fn default_log_filter(&self) -> &'static str {
        match &self.command {
            Command::Brick(_) | Command::Mount(_) => "info",
            Command::Volfile(_) | Command::Umount(_) => "warn",
        }
    }

    /// Runs the command, writing its normal output to `out`.
    pub async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        match self.command {
            Command::Volfile(cmd) => cmd.run(out),
            Command::Brick(args) => args.run(out).await,
            Command::Mount(args) => args.run(out).await,
            Command::Umount(args) => args.run(),
        }
    }
}
