//! `xlfs heal`: self-heal of a replicated volume, the heal daemon, heal
//! info and split-brain resolution.
//!
//! The command builds the client graph of `--volfile` in this process,
//! waits for it to come up (and, for up to `--wait`, for every replicate
//! child), and drives cluster/replicate through its virtual xattrs on the
//! root (see `xlfs_xlators::cluster::replicate::heal`):
//! - `xlfs heal --volfile F [--full]`: heals once what the bricks' indices
//!   list (or, with `--full`, the whole tree; with `--gfid G`, one inode),
//!   prints `healed N, failed N, split-brain N, remaining N` and one line
//!   per inode not healed; fails (exit status 1) when an inode could not be
//!   healed or is in split-brain (naming them), or when children are down
//!   and inodes still need heal.
//! - `xlfs heal --volfile F --daemon [--interval SECS]`: the self-heal
//!   daemon: heals every SECS seconds (default 600, GlusterFS's
//!   heal-timeout) and at once when a replicate child comes up, until
//!   SIGTERM or SIGINT.
//! - `xlfs heal --volfile F info`: per child, the gfids its index lists,
//!   the kinds each needs healed and which are in split-brain.
//! - `xlfs heal --volfile F split-brain POLICY PATH [--source-brick NAME]`:
//!   resolves the split-brain of PATH (a path inside the volume) with
//!   `bigger-file`, `latest-mtime` or `source-brick` (with the child's
//!   volume name).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};
use xlfs_sdk::dict::keys::{
    HEAL_FAILED, HEAL_GFID, HEAL_HEALED, HEAL_INFO, HEAL_REMAINING, HEAL_REPORT, HEAL_RESULT, HEAL_RUN,
    HEAL_SPLIT_BRAIN, SPLIT_BRAIN_RESOLVE,
};
use xlfs_sdk::{CallCtx, Dict, Errno, Fop, Loc, Reply, Response};

use super::CliError;
use crate::client::Client;
use crate::graph::{Graph, NotUp};
use crate::registry::Registry;

/// `xlfs heal`.
#[derive(Debug, Args)]
pub struct HealArgs {
    /// The client volfile of the volume.
    #[arg(long, value_name = "FILE")]
    pub volfile: PathBuf,
    /// Append the log to FILE.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Crawl the whole tree instead of healing what the indices list.
    #[arg(long)]
    pub full: bool,
    /// Heal only this gfid (and what its entry heal creates).
    #[arg(long, value_name = "GFID", conflicts_with = "full")]
    pub gfid: Option<String>,
    /// Keep running as the self-heal daemon.
    #[arg(long)]
    pub daemon: bool,
    /// The daemon's interval between heals, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 600, requires = "daemon")]
    pub interval: u64,
    /// How long to wait for the volume's children to come up, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub wait: u64,
    /// What to do instead of healing.
    #[command(subcommand)]
    pub action: Option<HealAction>,
}

/// `xlfs heal` subcommands.
#[derive(Debug, Subcommand)]
pub enum HealAction {
    /// List, per brick, what needs healing and what is in split-brain.
    Info,
    /// Resolve the split-brain of one file or directory.
    SplitBrain {
        /// How to choose the good copy.
        policy: Policy,
        /// The path inside the volume.
        path: String,
        /// The child (its volume name) to take as the good copy, with the
        /// `source-brick` policy.
        #[arg(long, value_name = "NAME")]
        source_brick: Option<String>,
    },
}

/// Split-brain resolution policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// The biggest copy.
    BiggerFile,
    /// The copy modified last.
    LatestMtime,
    /// The copy on `--source-brick`.
    SourceBrick,
}

/// Why healing failed.
#[derive(Debug, thiserror::Error)]
pub enum HealError {
    /// Arguments that do not go together.
    #[error("{0}")]
    Usage(&'static str),
    /// The graph did not come up.
    #[error(transparent)]
    NotUp(#[from] NotUp),
    /// Replicate refused a heal request.
    #[error("{what}: {errno} ({})", errno.description())]
    Request {
        /// What was asked.
        what: String,
        /// The error.
        errno: Errno,
    },
    /// Some inodes could not be healed.
    #[error("{failed} inode(s) could not be healed and {split} are in split-brain:\n{report}")]
    Unhealed {
        /// Inodes whose heal failed.
        failed: u64,
        /// Inodes in split-brain.
        split: u64,
        /// One line per inode.
        report: String,
    },
    /// Children are down, so what they missed cannot be healed now.
    #[error("only {up} of {all} replicate children are up: {remaining} inode(s) still need heal")]
    ChildrenDown {
        /// Children up.
        up: u64,
        /// Children in all.
        all: u64,
        /// Gfids still listed in the indices.
        remaining: u64,
    },
    /// The path is not in split-brain.
    #[error("{0}: not in split-brain")]
    NotSplitBrain(String),
    /// The policy could not pick a copy.
    #[error("{path}: {why}")]
    Unresolved {
        /// The path.
        path: String,
        /// Replicate's answer.
        why: String,
    },
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
}

/// Counts a heal request answered with.
#[derive(Debug, Default, PartialEq, Eq)]
struct Counts {
    healed: u64,
    failed: u64,
    split: u64,
    remaining: u64,
    report: String,
}

impl Counts {
    fn from_xdata(x: &Dict) -> Counts {
        let n = |k: &str| x.get_u64(k).unwrap_or(0);
        Counts {
            healed: n(HEAL_HEALED),
            failed: n(HEAL_FAILED),
            split: n(HEAL_SPLIT_BRAIN),
            remaining: n(HEAL_REMAINING),
            report: x.get_str(HEAL_REPORT).unwrap_or("").to_string(),
        }
    }

    /// A pass that healed something, failed, or left entries in the
    /// indices: more may be due soon (a heal makes entries to heal, a
    /// client that has not yet seen a child come back still writes
    /// around it), so the daemon sweeps again early.
    fn unfinished(&self) -> bool {
        self.healed + self.failed + self.remaining > 0
    }

    fn summary(&self) -> String {
        format!(
            "healed {}, failed {}, split-brain {}, remaining {}",
            self.healed, self.failed, self.split, self.remaining
        )
    }
}

impl HealArgs {
    /// True when the command runs as a long-lived daemon.
    pub fn is_daemon(&self) -> bool {
        self.daemon
    }

    fn check(&self) -> Result<(), HealError> {
        if self.action.is_some() && (self.daemon || self.full || self.gfid.is_some()) {
            return Err(HealError::Usage("--daemon, --full and --gfid do not go with info or split-brain"));
        }
        if let Some(HealAction::SplitBrain { policy, source_brick, .. }) = &self.action {
            match (policy, source_brick) {
                (Policy::SourceBrick, None) => return Err(HealError::Usage("source-brick needs --source-brick NAME")),
                (Policy::BiggerFile | Policy::LatestMtime, Some(_)) => {
                    return Err(HealError::Usage("--source-brick goes only with the source-brick policy"));
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        self.check()?;
        let graph = Arc::new(Graph::load(&self.volfile, &Registry::builtin())?);
        graph.activate();
        let r = self.run_on(&graph, out).await;
        let g = graph.clone();
        let _ = tokio::task::spawn_blocking(move || g.shutdown()).await;
        r
    }

    async fn run_on(&self, graph: &Graph, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let wait = Duration::from_secs(self.wait.max(1));
        graph.wait_up(wait).await.map_err(HealError::from)?;
        wait_children(graph, wait).await;
        // A daemon's pid: its fops are not an application's (io-threads runs
        // them last, upcall does not count it as caching what it touches).
        let client = Client::new(graph.top()).with_pid(CallCtx::SELF_HEAL_PID);
        match &self.action {
            Some(HealAction::Info) => {
                let text = info(&client).await?;
                out.write_all(text.as_bytes())?;
                Ok(())
            }
            Some(HealAction::SplitBrain { policy, path, source_brick }) => {
                let value = match policy {
                    Policy::BiggerFile => "bigger-file".to_string(),
                    Policy::LatestMtime => "latest-mtime".to_string(),
                    Policy::SourceBrick => format!("source-brick:{}", source_brick.as_deref().unwrap_or("")),
                };
                let result = resolve(&client, path, &value).await?;
                writeln!(out, "{path}: {result}")?;
                Ok(())
            }
            None if self.daemon => self.daemon(graph, &client, out).await,
            None => {
                let c = self.heal_once(&client).await?;
                writeln!(out, "{}", c.summary())?;
                if !c.report.is_empty() {
                    writeln!(out, "{}", c.report)?;
                }
                if c.failed > 0 || c.split > 0 {
                    return Err(HealError::Unhealed { failed: c.failed, split: c.split, report: c.report }.into());
                }
                let (up, all) = children_up(graph);
                if c.remaining > 0 && up < all {
                    return Err(HealError::ChildrenDown { up, all, remaining: c.remaining }.into());
                }
                Ok(())
            }
        }
    }

    async fn heal_once(&self, client: &Client) -> Result<Counts, HealError> {
        let (key, value) = match (&self.gfid, self.full) {
            (Some(g), _) => (HEAL_GFID, g.clone()),
            (None, true) => (HEAL_RUN, "full".to_string()),
            (None, false) => (HEAL_RUN, "index".to_string()),
        };
        let rsp = set_root(client, key, &value).await?;
        Ok(Counts::from_xdata(&rsp.xdata))
    }

    async fn daemon(&self, graph: &Graph, client: &Client, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let mut term = signal(SignalKind::terminate()).map_err(HealError::Signal)?;
        let mut int = signal(SignalKind::interrupt()).map_err(HealError::Signal)?;
        let interval = Duration::from_secs(self.interval.max(1));
        let mut ups = children_up(graph).0;
        // When a child last came up (the start counts: children come up
        // as the daemon connects).
        let mut came_up_at = Instant::now();
        // The start line (`xlfs up` waits for it); afterwards only the log
        // hears from the daemon, as whoever started it may be gone.
        writeln!(out, "{DAEMON_PREFIX}self-heal daemon for {} (pid {})", self.volfile.display(), std::process::id())?;
        out.flush()?;
        let mut backoff = Duration::ZERO;
        loop {
            let unfinished = match self.heal_once(client).await {
                Ok(c) => {
                    tracing::info!("self-heal: {}", c.summary());
                    if !c.report.is_empty() {
                        tracing::warn!("self-heal left:\n{}", c.report);
                    }
                    c.unfinished() || came_up_at.elapsed() < SETTLE
                }
                Err(e) => {
                    tracing::warn!("self-heal: {e}");
                    true
                }
            };
            let wait = next_wait(&mut backoff, unfinished, interval);
            let mut waited = Duration::ZERO;
            // Sleep in one-second steps, waking early when a child comes up.
            loop {
                tokio::select! {
                    _ = term.recv() => return Ok(()),
                    _ = int.recv() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                waited += Duration::from_secs(1);
                let now = children_up(graph).0;
                let came_up = now > ups;
                ups = now;
                if came_up {
                    came_up_at = Instant::now();
                    backoff = Duration::ZERO;
                    tracing::info!("a replicate child came up: healing now");
                    break;
                }
                if waited >= wait {
                    break;
                }
            }
        }
    }
}

/// How long after a child comes up the self-heal daemon keeps sweeping
/// early even when a pass finds nothing: other clients notice the child
/// (and stop writing around it) only when they reconnect, and what they
/// write meanwhile is listed after the first sweep.
const SETTLE: Duration = Duration::from_secs(60);

/// The self-heal daemon's wait before its next sweep: after a pass left
/// work, one second, doubling while passes keep leaving work, up to
/// `interval`; after a clean pass, `interval` (GlusterFS's shd sweeps
/// again a second after any pass that healed something).
/// `backoff` carries the doubling from pass to pass.
fn next_wait(backoff: &mut Duration, unfinished: bool, interval: Duration) -> Duration {
    if unfinished {
        *backoff = (*backoff * 2).clamp(Duration::from_secs(1), interval);
        *backoff
    } else {
        *backoff = Duration::ZERO;
        interval
    }
}

/// Heal info of the volume `graph` serves (waiting up to `wait` for it and
/// its replicate children): per child, replicate's `NAME: up, N entries to
/// heal` (or `NAME: down`) and a line per gfid. `xlfs volume heal VOL info`
/// runs it on the volume's client volfile.
pub(crate) async fn info_of(graph: &Graph, wait: Duration) -> Result<String, HealError> {
    graph.wait_up(wait).await?;
    wait_children(graph, wait).await;
    info(&Client::new(graph.top())).await
}

/// One heal of the volume `graph` serves, of what the indices list or, with
/// `full`, of the whole tree: the summary line and the report of inodes
/// not healed. `xlfs volume heal VOL [full]` runs it.
pub(crate) async fn heal_of(graph: &Graph, full: bool, wait: Duration) -> Result<(String, String), HealError> {
    graph.wait_up(wait).await?;
    wait_children(graph, wait).await;
    let value = if full { "full" } else { "index" };
    let rsp = set_root(&Client::new(graph.top()), HEAL_RUN, value).await?;
    let c = Counts::from_xdata(&rsp.xdata);
    Ok((c.summary(), c.report))
}

/// The daemon's start line starts with this.
pub const DAEMON_PREFIX: &str = "xlfs heal: ";

/// The children up and in all, summed over the graph's replicate volumes
/// (from their dumps).
fn children_up(graph: &Graph) -> (u64, u64) {
    graph
        .dump()
        .into_iter()
        .filter(|(k, _)| k.ends_with(".children-up"))
        .filter_map(|(_, v)| {
            let (a, b) = v.split_once('/')?;
            Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
        })
        .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
}

/// Waits up to `wait` for every replicate child to be up.
pub(crate) async fn wait_children(graph: &Graph, wait: Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let (up, all) = children_up(graph);
        if up >= all || tokio::time::Instant::now() >= deadline {
            if up < all {
                tracing::warn!("{up} of {all} replicate children are up; healing what they can");
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn set_on(client: &Client, loc: Loc, key: &str, value: &str, what: String) -> Result<Response, HealError> {
    let mut xattrs = Dict::new();
    xattrs.set_bytes(key, value.as_bytes().to_vec());
    client.call(Fop::Setxattr { loc, xattrs, flags: 0 }).await.map_err(|errno| HealError::Request { what, errno })
}

async fn set_root(client: &Client, key: &str, value: &str) -> Result<Response, HealError> {
    set_on(client, Loc::root(), key, value, format!("{key}={value}")).await
}

async fn info(client: &Client) -> Result<String, HealError> {
    let what = || format!("getxattr {HEAL_INFO}");
    match client.call(Fop::Getxattr { loc: Loc::root(), name: HEAL_INFO.into() }).await {
        Ok(Response { reply: Reply::Xattrs(d), .. }) => Ok(d.get_str(HEAL_INFO).unwrap_or("").to_string()),
        Ok(_) => Err(HealError::Request { what: what(), errno: Errno::EIO }),
        Err(errno) => Err(HealError::Request { what: what(), errno }),
    }
}

/// Resolves the split-brain of `path` on an up graph with `policy`
/// (`bigger-file`, `latest-mtime`, `source-brick:CHILD`).
pub(crate) async fn split_brain_of(graph: &Graph, path: &str, policy: &str) -> Result<String, HealError> {
    resolve(&Client::new(graph.top()), path, policy).await
}

async fn resolve(client: &Client, path: &str, policy: &str) -> Result<String, HealError> {
    let iatt = client.stat(path).await.map_err(|errno| HealError::Request { what: format!("stat {path}"), errno })?;
    let rsp = set_on(
        client,
        Loc::gfid(iatt.gfid),
        SPLIT_BRAIN_RESOLVE,
        policy,
        format!("{SPLIT_BRAIN_RESOLVE}={policy} on {path}"),
    )
    .await?;
    let result = rsp.xdata.get_str(HEAL_RESULT).unwrap_or("").to_string();
    match result.as_str() {
        "resolved" => Ok(format!("resolved ({policy})")),
        "not in split-brain" => Err(HealError::NotSplitBrain(path.to_string())),
        _ => Err(HealError::Unresolved { path: path.to_string(), why: result }),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    fn heal_args(args: &[&str]) -> Result<HealArgs, clap::Error> {
        let cli = Cli::try_parse_from(["xlfs", "heal"].iter().chain(args))?;
        match cli.command {
            Command::Heal(h) => Ok(h),
            other => panic!("not a heal command: {other:?}"),
        }
    }

    #[test]
    fn the_daemon_sweeps_again_soon_while_passes_leave_work() {
        let interval = Duration::from_secs(600);
        let mut b = Duration::ZERO;
        let waits: Vec<u64> = (0..12).map(|_| next_wait(&mut b, true, interval).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
        assert_eq!(next_wait(&mut b, false, interval), interval, "a clean pass waits the interval");
        assert_eq!(next_wait(&mut b, true, interval).as_secs(), 1, "and the next unfinished one starts over");
        let busy = Counts { remaining: 1, ..Counts::default() };
        assert!(busy.unfinished() && !Counts::default().unfinished());
        assert!(Counts { healed: 3, ..Counts::default() }.unfinished());
    }

    #[test]
    fn heal_arguments_parse_and_mixes_are_refused() {
        let h = heal_args(&["--volfile", "v.vol"]).expect("once");
        assert!(!h.is_daemon() && h.action.is_none() && h.check().is_ok());
        let h = heal_args(&["--volfile", "v.vol", "--daemon", "--interval", "5"]).expect("daemon");
        assert!(h.is_daemon());
        assert_eq!(h.interval, 5);
        assert!(heal_args(&["--volfile", "v.vol", "--interval", "5"]).is_err(), "--interval needs --daemon");
        let h = heal_args(&["--volfile", "v.vol", "info"]).expect("info");
        assert!(matches!(h.action, Some(HealAction::Info)));
        let h = heal_args(&["--volfile", "v.vol", "split-brain", "source-brick", "/a/f", "--source-brick", "c-1"])
            .expect("split-brain");
        assert!(h.check().is_ok());
        assert!(
            matches!(&h.action, Some(HealAction::SplitBrain { policy: Policy::SourceBrick, path, source_brick: Some(b) }) if path == "/a/f" && b == "c-1")
        );
        let h = heal_args(&["--volfile", "v.vol", "split-brain", "source-brick", "/f"]).expect("parses");
        assert!(h.check().is_err(), "source-brick without a brick");
        let h = heal_args(&["--volfile", "v.vol", "split-brain", "bigger-file", "/f", "--source-brick", "x"])
            .expect("parses");
        assert!(h.check().is_err());
        let h = heal_args(&["--volfile", "v.vol", "--daemon", "info"]).expect("parses");
        assert!(h.check().is_err());
        assert!(heal_args(&["--volfile", "v.vol", "split-brain", "newest", "/f"]).is_err());
    }

    #[test]
    fn counts_come_from_the_reply_xdata() {
        let mut x = Dict::new();
        x.set_str(HEAL_HEALED, "3");
        x.set_str(HEAL_FAILED, "1");
        x.set_str(HEAL_REPORT, "g failed EIO");
        let c = Counts::from_xdata(&x);
        assert_eq!(c.summary(), "healed 3, failed 1, split-brain 0, remaining 0");
        assert_eq!(c.report, "g failed EIO");
    }
}
