//! The `xlfs` command: parses the arguments, sets up logging (to stderr, or
//! appended to the command's `--log-file`; filter from `XLFS_LOG`, else
//! `RUST_LOG`, else the command's default) and runs the subcommand on a
//! multi-thread tokio runtime (a mount's `-o event-threads=N` worker
//! threads, else `TOKIO_WORKER_THREADS`, else one per core); on error prints the message to stderr (and
//! logs it) and exits with 1.

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::EnvFilter;
use xlfs_runtime::cli::Cli;

/// How long leftover runtime tasks may take to stop once the command is done.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(5);

/// The variable that sizes a process's pool of worker threads (tokio's own
/// name; GlusterFS's `client.event-threads` / `server.event-threads`): the
/// number of cores when unset. Checked here, so that a bad value is an
/// error naming it rather than a panic inside tokio.
const WORKER_THREADS_ENV: &str = "TOKIO_WORKER_THREADS";

/// Most worker threads [`WORKER_THREADS_ENV`] may ask for.
const MAX_WORKER_THREADS: usize = 256;

/// The worker threads [`WORKER_THREADS_ENV`] asks for, if set.
fn worker_threads() -> Result<Option<usize>, String> {
    let bad =
        |v: &str| format!("{WORKER_THREADS_ENV}={v:?}: expected a number of threads from 1 to {MAX_WORKER_THREADS}");
    match std::env::var(WORKER_THREADS_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(bad(&v.to_string_lossy())),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_WORKER_THREADS).contains(&n) => Ok(Some(n)),
            _ => Err(bad(&v)),
        },
    }
}

/// The variable choosing the scheduling policy of every thread of an xlfs
/// process (and of the bricks and mounts a daemon starts, which inherit
/// it): `batch` (the default) or `normal`.
const SCHED_ENV: &str = "XLFS_SCHED";

/// The policy [`SCHED_ENV`] asks for: `SCHED_BATCH` unless it says
/// `normal`.
fn sched_policy() -> Result<libc::c_int, String> {
    let bad = |v: &str| format!("{SCHED_ENV}={v:?}: expected batch or normal");
    match std::env::var(SCHED_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(libc::SCHED_BATCH),
        Err(std::env::VarError::NotUnicode(v)) => Err(bad(&v.to_string_lossy())),
        Ok(v) => match v.trim() {
            "batch" => Ok(libc::SCHED_BATCH),
            "normal" => Ok(libc::SCHED_OTHER),
            _ => Err(bad(&v)),
        },
    }
}

/// Gives the calling thread `policy`; threads it creates afterwards
/// inherit it. SCHED_BATCH keeps a thread from preempting the one that
/// woke it: a mount's thread sends a fop to its three bricks and a brick
/// answers without being switched out after each socket write to run the
/// peer it just woke (on this 2-core machine, 5 alternated rounds against
/// the default policy: pgbench faster in every round, creates 1.32x; see
/// benches/RESULTS.md). Allowed without privileges. (Opt-in for a day
/// while tests failed with it now and then: the timing it changes exposed
/// five races, closed since; README "Scheduling policy".)
fn set_sched_policy(policy: libc::c_int) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on the calling thread (0) with a valid
    // sched_param.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

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

/// Raises the soft limit on open files to the hard one, as glusterfsd
/// does: a brick holds an fd per open file of its clients (up to
/// `max-open-fds`) and keeps directories open, more than the 1024 a
/// login's soft limit usually allows.
fn raise_open_file_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0 {
                tracing::debug!("cannot raise the open-file limit from {}", lim.rlim_cur);
            }
        }
    }
}

fn main() -> ExitCode {
    // First, so that every thread started later (logging, runtime, FUSE,
    // sync threads) inherits the policy.
    let sched = match sched_policy() {
        Ok(p) => set_sched_policy(p),
        Err(e) => {
            eprintln!("xlfs: {e}");
            return ExitCode::FAILURE;
        }
    };
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
    raise_open_file_limit();
    if let Err(e) = sched {
        tracing::warn!("{SCHED_ENV}: cannot set the scheduling policy ({e}); threads keep the default");
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    match cli.event_threads().map(|n| Ok(Some(n))).unwrap_or_else(worker_threads) {
        Ok(Some(n)) => {
            builder.worker_threads(n);
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("xlfs: {e}");
            return ExitCode::FAILURE;
        }
    }
    let rt = match builder.enable_all().build() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_given_batch_is_batch_and_its_new_threads_too() {
        std::thread::spawn(|| {
            set_sched_policy(libc::SCHED_BATCH).expect("SCHED_BATCH needs no privilege");
            // SAFETY: querying the calling thread's policy.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_BATCH);
            let child = std::thread::spawn(|| unsafe { libc::sched_getscheduler(0) }).join().expect("join");
            assert_eq!(child, libc::SCHED_BATCH, "a thread created afterwards inherits it");
            set_sched_policy(libc::SCHED_OTHER).expect("back to normal");
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
        })
        .join()
        .expect("thread");
    }
}
