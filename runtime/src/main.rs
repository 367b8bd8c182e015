//! The `xlfs` command: parses the arguments, sets up logging to stderr
//! (filter from `XLFS_LOG`, else `RUST_LOG`, else `warn`) and runs the
//! subcommand; on error prints the message to stderr and exits with 1.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use xlfs_runtime::cli::Cli;

fn main() -> ExitCode {
    let filter = std::env::var("XLFS_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();

    let cli = Cli::parse();
    let stdout = std::io::stdout();
    match cli.run(&mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xlfs: {e}");
            ExitCode::FAILURE
        }
    }
}
