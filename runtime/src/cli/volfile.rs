//! `xlfs volfile ...`: work with volfiles without serving them.

use std::io::Write;
use std::path::PathBuf;

use clap::Subcommand;

use super::CliError;
use crate::graph::GraphSpec;
use crate::mgmt::protocol::{DEFAULT_ADDR, Reply, Request, call};
use crate::registry::Registry;
use crate::volfile::Volfile;

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
    /// Print the client volfile the daemon generates for a volume, or with
    /// `--brick` the volfile one of its bricks serves.
    Show {
        /// The volume.
        volume: String,
        /// A brick of it (`HOST:DIR`).
        #[arg(long, value_name = "HOST:DIR")]
        brick: Option<String>,
        /// The daemon to ask.
        #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_ADDR)]
        daemon: String,
    },
}

impl VolfileCommand {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        match self {
            VolfileCommand::Show { volume, brick, daemon } => {
                let reply = call(&daemon, &Request::Getspec { name: volume, brick, unless: None })
                    .await
                    .map_err(super::DaemonError::from)?;
                match reply {
                    Reply::Spec { volfile, .. } => out.write_all(volfile.as_bytes())?,
                    other => writeln!(out, "unexpected answer: {other:?}")?,
                }
                Ok(())
            }
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
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    #[test]
    fn parses_volfile_check() {
        let cli = Cli::try_parse_from(["xlfs", "volfile", "check", "a.vol"]).expect("parses");
        assert!(
            matches!(cli.command, Command::Volfile(VolfileCommand::Check { ref file }) if file == &PathBuf::from("a.vol"))
        );
        assert!(Cli::try_parse_from(["xlfs", "volfile", "check"]).is_err());
        assert!(Cli::try_parse_from(["xlfs", "nope"]).is_err());
    }

    #[test]
    fn check_reports_parse_errors_with_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.vol");
        std::fs::write(&path, "volume a\n  type storage/posix\n  subvolume b\nend-volume\n").expect("write");
        let cli = Cli::try_parse_from(["xlfs".as_ref(), "volfile".as_ref(), "check".as_ref(), path.as_os_str()])
            .expect("parses");
        let Command::Volfile(cmd) = cli.command else { panic!("a volfile command") };
        let mut out = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let e = rt.block_on(cmd.run(&mut out)).expect_err("typo");
        assert_eq!(
            e.to_string(),
            format!("{}:3: expected 'subvolumes', 'option', 'type' or 'end-volume', found 'subvolume'", path.display())
        );
        assert!(out.is_empty());
    }
}
