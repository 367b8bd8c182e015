//! The `xlfs` command: parses the arguments, sets up logging (to stderr, or
//! appended to the command's `--log-file`; filter from `XLFS_LOG`, else
//! `RUST_LOG`, else the command's default) and runs the subcommand on a
//! multi-thread tokio runtime; on error prints the message to stderr (and
//! logs it) and exits with 1.

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use xlfs_runtime::cli::Cli;

/// How long leftover runtime tasks may take to stop once the command is done.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(5);

fn init_logging(cli: &Cli) -> std::io::Result<()> {
    let filter = std::env::var("XLFS_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new(cli.default_log_filter()));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match cli.log_file() {
        Some(path) => {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
            builder.with_ansi(false).with_writer(Mutex::new(file)).init();
        }
        None => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            builder.with_ansi(ansi).with_writer(std::io::stderr).init();
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(&cli) {
        let file = cli.log_file().map(|p| p.display().to_string()).unwrap_or_default();
        eprintln!("xlfs: log file {file}: {e}");
        return ExitCode::FAILURE;
    }
    // A panic in a spawned task ends only that task, and a daemonized
    // mount's stderr is /dev/null: put it in the log too.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!(thread = std::thread::current().name().unwrap_or("?"), "panic: {info}");
        default_hook(info);
    }));
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("xlfs: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let logs_to_file = cli.log_file().is_some();
    let result = rt.block_on(cli.run(&mut std::io::stdout()));
    rt.shutdown_timeout(RUNTIME_SHUTDOWN);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if logs_to_file {
                tracing::error!("{e}");
            }
            eprintln!("xlfs: {e}");
            ExitCode::FAILURE
        }
    }
}
