//! The `xlfs` command line: the argument definitions (clap derive) and what
//! each subcommand does. `main.rs` only parses, sets up logging and calls
//! [`Cli::run`]. A new subcommand is a new [`Command`] variant with its own
//! argument type and `run`.

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::graph::{GraphError, GraphSpec};
use crate::registry::Registry;
use crate::volfile::{Volfile, VolfileError};

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
}

/// `xlfs volfile ...`.
#[derive(Debug, Subcommand)]
pub enum VolfileCommand {
    /// Parse and validate a volfile (types, structure, subvolume counts,
    /// options) without starting any translator, then print its graph from
    /// the top down with each translator's effective options.
    Check {
        /// The volfile.
        file: PathBuf,
    },
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
    /// Writing the output failed.
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

impl Cli {
    /// Runs the command, writing its normal output to `out`.
    pub fn run(self, out: &mut dyn Write) -> Result<(), CliError> {
        match self.command {
            Command::Volfile(cmd) => cmd.run(out),
        }
    }
}

impl VolfileCommand {
    fn run(self, out: &mut dyn Write) -> Result<(), CliError> {
        match self {
            VolfileCommand::Check { file } => {
                let volfile = Volfile::load(&file)?;
                let spec = GraphSpec::validate(&volfile, &Registry::builtin())?;
                tracing::info!(file = %file.display(), volumes = volfile.volumes.len(), "volfile is valid");
                writeln!(out, "{}: ok, {} volumes, top '{}'", spec.origin(), volfile.volumes.len(), spec.top_name())?;
                out.write_all(spec.describe().as_bytes())?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_volfile_check() {
        let cli = Cli::try_parse_from(["xlfs", "volfile", "check", "a.vol"]).expect("parses");
        assert!(matches!(cli.command, Command::Volfile(VolfileCommand::Check { ref file }) if file == &PathBuf::from("a.vol")));
        assert!(Cli::try_parse_from(["xlfs", "volfile", "check"]).is_err());
        assert!(Cli::try_parse_from(["xlfs", "nope"]).is_err());
    }

    #[test]
    fn check_reports_parse_errors_with_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.vol");
        std::fs::write(&path, "volume a\n  type storage/posix\n  subvolume b\nend-volume\n").expect("write");
        let cli = Cli::try_parse_from(["xlfs".as_ref(), "volfile".as_ref(), "check".as_ref(), path.as_os_str()]).expect("parses");
        let mut out = Vec::new();
        let e = cli.run(&mut out).expect_err("typo");
        assert_eq!(e.to_string(), format!("{}:3: expected 'subvolumes', 'option', 'type' or 'end-volume', found 'subvolume'", path.display()));
        assert!(out.is_empty());
    }
}
