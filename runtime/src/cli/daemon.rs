//! `xlfs daemon` (one per node, GlusterFS's glusterd) and `xlfs volume
//! ...`, the commands that talk to it.
//!
//! `xlfs daemon [--state-dir DIR] [--listen HOST:PORT]` runs in the
//! foreground (under systemd: `runtime/dist/xlfs-daemon.service`): it keeps
//! volume specs in `DIR/volumes/*.toml`, serves the bricks of started
//! volumes (logs in `DIR/logs/`) and answers the control protocol
//! ([`crate::mgmt::protocol`]) on the address. Once listening it prints
//! `xlfs daemon: listening on ADDR (state DIR)`. SIGTERM or SIGINT stops
//! the bricks and the daemon; the next start serves the started volumes
//! again.
//!
//! `xlfs volume [--daemon HOST:PORT] [--json] SUBCOMMAND` sends one
//! request and prints the answer: a line or a table for people, the JSON
//! reply with `--json`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use tokio::signal::unix::{SignalKind, signal};

use super::CliError;
use crate::mgmt::daemon::{Daemon, StateDir};
use crate::mgmt::protocol::{
    DEFAULT_ADDR, HealAction, ProfileAction, ProtocolError, RebalanceAction, RebalanceStatus, RemoveAction, Reply,
    Request, call,
};
use crate::mgmt::shd::Shds;
use crate::mgmt::store::etcd::EtcdStore;
use crate::mgmt::store::{FileStore, Peer, Store, StoreError};
use crate::mgmt::supervisor::Supervisor;

/// The start line's prefix (tests and scripts read it).
pub const READY_PREFIX: &str = "xlfs daemon: listening on ";

/// `xlfs daemon`.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Where the volume specs and the brick logs are kept.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/xlfs")]
    pub state_dir: PathBuf,
    /// The address to answer `xlfs volume` and mounts on.
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_ADDR)]
    pub listen: String,
    /// Append the log to FILE instead of writing it to stderr.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// This node's name: the HOST of its bricks' `HOST:DIR` and the
    /// address other nodes reach its daemon at (with the --listen port).
    /// Without it, this daemon serves the bricks on any address of this
    /// machine and has no peers.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// The cluster store: `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` to
    /// share volumes, peers and brick ports with the other nodes' daemons
    /// through etcd; default: files in the state directory (this node only).
    #[arg(long, value_name = "URL")]
    pub store: Option<String>,
}

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The state directory cannot be used.
    #[error("state directory {}: {source}", dir.display())]
    StateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The address cannot be listened on.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("installing signal handlers: {0}")]
    Signal(std::io::Error),
    /// A request failed or was refused.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The command line of `xlfs volume` is wrong.
    #[error("{0}")]
    Usage(String),
}

impl DaemonArgs {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let state_err = |dir: &std::path::Path| {
            let dir = dir.to_path_buf();
            move |source| DaemonError::StateDir { dir, source }
        };
        std::fs::create_dir_all(&self.state_dir).map_err(state_err(&self.state_dir))?;
        let dir = std::fs::canonicalize(&self.state_dir).map_err(state_err(&self.state_dir))?;
        let state = StateDir(dir.clone());
        let store: Arc<dyn Store> = match &self.store {
            Some(url) => Arc::new(EtcdStore::open(url).map_err(DaemonError::from)?),
            None => Arc::new(FileStore::open(&state.volumes()).map_err(DaemonError::from)?),
        };
        let exe = std::env::current_exe().map_err(state_err(&dir))?;
        let sup = Arc::new(Supervisor::new(exe, state.logs()).map_err(state_err(&state.logs()))?);
        let shds = Shds::new(state.shd()).map_err(state_err(&state.shd()))?;
        let listener = tokio::net::TcpListener::bind(&self.listen)
            .await
            .map_err(|source| DaemonError::Listen { addr: self.listen.clone(), source })?;
        let local =
            listener.local_addr().map_err(|source| DaemonError::Listen { addr: self.listen.clone(), source })?;
        let addr = local.to_string();
        let me = self.node.map(|node| Peer { address: format!("{node}:{}", local.port()), node });
        let daemon = Arc::new(Daemon::new(store, sup, shds, me));
        let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
        let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
        let server = tokio::spawn(daemon.clone().serve(listener));
        if let Err(e) = daemon.resume().await {
            tracing::error!("starting the bricks of started volumes: {e}");
        }
        let shd_task = tokio::spawn(daemon.clone().run_shds());
        let cluster_task = tokio::spawn(daemon.clone().run_cluster());
        let line = format!("{READY_PREFIX}{addr} (state {})", dir.display());
        tracing::info!("{line}");
        writeln!(out, "{line}")?;
        out.flush()?;
        let sig = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = sig, "stopping the bricks and the daemon");
        server.abort();
        shd_task.abort();
        cluster_task.abort();
        daemon.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// `xlfs peer`.
#[derive(Debug, Args)]
pub struct PeerArgs {
    /// The daemon to ask.
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_ADDR, global = true)]
    pub daemon: String,
    /// Print the daemon's answer as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: PeerCommand,
}

/// `xlfs peer` subcommands (as GlusterFS's `gluster peer`).
#[derive(Debug, Subcommand)]
pub enum PeerCommand {
    /// Add the node whose daemon answers at `HOST[:PORT]` (it must use the
    /// same --store etcd://... and have a --node name).
    Add {
        /// Its daemon's address (port 24007 if none is given).
        address: String,
    },
    /// Forget a node (refused while it holds bricks).
    Remove {
        /// Its node name.
        node: String,
    },
    /// List the nodes and whether their daemons answer.
    List,
}

impl PeerArgs {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let req = match self.command {
            PeerCommand::Add { address } => {
                let address = if address.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
                    address
                } else {
                    format!("{address}:24007")
                };
                Request::PeerAdd { address }
            }
            PeerCommand::Remove { node } => Request::PeerRemove { node },
            PeerCommand::List => Request::PeerList,
        };
        let reply = call(&self.daemon, &req).await.map_err(DaemonError::from)?;
        print_reply(out, &reply, self.json)
    }
}

/// Prints a reply: for people, or as JSON.
fn print_reply(out: &mut (dyn Write + Send), reply: &Reply, json: bool) -> Result<(), CliError> {
    if json {
        let text = serde_json::to_string_pretty(reply).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
        writeln!(out, "{text}")?;
    } else {
        out.write_all(render(reply).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

/// `xlfs volume`.
#[derive(Debug, Args)]
pub struct VolumeArgs {
    /// The daemon to ask.
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_ADDR, global = true)]
    pub daemon: String,
    /// Print the daemon's answer as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: VolumeCommand,
}

/// `xlfs volume` subcommands (as GlusterFS's `gluster volume`).
#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Make a volume: `create NAME [replica N] HOST:DIR... [force]`
    /// (`force` allows bricks on the root file system), or `create NAME
    /// --from-info FILE [force]`: the bricks, replica count and options of
    /// a `gluster volume info` listing (options xlfs has no key for are
    /// listed and skipped).
    Create {
        /// The volume's name.
        name: String,
        /// A `gluster volume info` listing of one volume.
        #[arg(long, value_name = "FILE")]
        from_info: Option<PathBuf>,
        /// `[replica N] HOST:DIR... [force]`.
        #[arg(required_unless_present = "from_info", num_args = 0.., value_name = "[replica N] HOST:DIR... [force]")]
        args: Vec<String>,
    },
    /// Serve a volume's bricks; `start NAME force` restarts those that are down.
    Start {
        /// The volume.
        name: String,
        /// `force`.
        #[arg(value_parser = ["force"])]
        force: Option<String>,
    },
    /// Stop a volume's bricks.
    Stop {
        /// The volume.
        name: String,
    },
    /// Delete a stopped volume (the data stays in the brick directories).
    Delete {
        /// The volume.
        name: String,
    },
    /// Show volume specs (as TOML).
    Info {
        /// One volume (default: all).
        name: Option<String>,
    },
    /// Show each brick: port, pid, online, disk free.
    Status {
        /// One volume (default: all).
        name: Option<String>,
    },
    /// Set a key: `set NAME KEY VALUE`; `set help` lists the keys.
    Set {
        /// `NAME KEY VALUE`, or `help`.
        #[arg(required = true, num_args = 1..=3, value_name = "NAME KEY VALUE | help")]
        args: Vec<String>,
    },
    /// Reset one key, or every key, to its default.
    Reset {
        /// The volume.
        name: String,
        /// The key (default: all).
        key: Option<String>,
    },
    /// Show a key's value, or every key's (`all`).
    Get {
        /// The volume.
        name: String,
        /// A key, or `all`.
        key: String,
    },
    /// Print the client volfile the daemon serves for a volume.
    Getspec {
        /// The volume.
        name: String,
        /// That brick's volfile instead (`HOST:DIR`).
        #[arg(long, value_name = "HOST:DIR")]
        brick: Option<String>,
    },
    /// Print the port brick HOST:DIR listens on.
    Portmap {
        /// `HOST:DIR`.
        brick: String,
    },
    /// Heal what the bricks' indices list; `full` crawls the whole tree;
    /// `info` lists per brick what needs healing; `split-brain bigger-file
    /// PATH`, `split-brain latest-mtime PATH` or `split-brain source-brick
    /// HOST:DIR PATH` resolves the split-brain of PATH (inside the volume).
    Heal {
        /// The volume.
        name: String,
        /// `info`, `full` or `split-brain`.
        #[arg(value_parser = ["info", "full", "split-brain"])]
        action: Option<String>,
        /// After `split-brain`: the policy (and source brick), then the path.
        #[arg(value_name = "POLICY [HOST:DIR] PATH")]
        rest: Vec<String>,
    },
    /// `profile NAME start|info|stop`: the bricks' per-fop counts and
    /// times (always counted; `start` zeroes them, `stop` keeps them as
    /// they are for `info`).
    Profile {
        /// The volume.
        name: String,
        /// `start`, `info` or `stop`.
        #[arg(value_parser = ["start", "info", "stop"])]
        action: String,
    },
    /// Print each brick's graph dump (GlusterFS's statedump).
    Statedump {
        /// The volume.
        name: String,
    },
    /// Grow a volume by whole replica sets: `add-brick NAME [replica N]
    /// HOST:DIR... [force]` (N must be the volume's replica count; `force`
    /// allows bricks on the root file system). Mounted clients switch to
    /// the grown graph live; `rebalance NAME start` then spreads the files.
    AddBrick {
        /// The volume.
        name: String,
        /// `[replica N] HOST:DIR... [force]`.
        #[arg(required = true, num_args = 1.., value_name = "[replica N] HOST:DIR... [force]")]
        args: Vec<String>,
    },
    /// Shrink a volume by whole replica sets: `remove-brick NAME HOST:DIR...
    /// start` gives those sets no new files and moves their files to the
    /// others (files stay readable and writable), `status` shows the move's
    /// progress, `commit` drops the bricks from the volume once no file is
    /// left on them (it refuses before).
    RemoveBrick {
        /// The volume.
        name: String,
        /// `HOST:DIR... start|status|commit`.
        #[arg(required = true, num_args = 2.., value_name = "HOST:DIR... start|status|commit")]
        args: Vec<String>,
    },
    /// Spread a volume over its replica sets: `fix-layout` rewrites every
    /// directory's hash layout over all sets; `start` does that and moves
    /// every file whose name now hashes to another set (files stay readable
    /// and writable meanwhile); `status` shows the progress (files scanned,
    /// moved, skipped, failed, bytes, time left); `stop` stops after the
    /// file in progress.
    Rebalance {
        /// The volume.
        name: String,
        /// `fix-layout`, `start`, `status` or `stop`.
        #[arg(value_parser = ["fix-layout", "start", "status", "stop"])]
        action: String,
    },
}

/// Parses `[replica N] HOST:DIR... [force]`.
fn create_args(args: &[String]) -> Result<(Option<usize>, Vec<String>, bool), DaemonError> {
    let mut rest: &[String] = args;
    let mut replica = None;
    if rest.first().is_some_and(|a| a == "replica") {
        let n = rest.get(1).ok_or_else(|| DaemonError::Usage("replica: give the count (replica N)".into()))?;
        replica = Some(
            n.parse::<usize>()
                .map_err(|_| DaemonError::Usage(format!("replica {n:?}: the replica count must be a number")))?,
        );
        rest = &rest[2..];
    }
    let force = rest.last().is_some_and(|a| a == "force");
    if force {
        rest = &rest[..rest.len() - 1];
    }
    Ok((replica, rest.to_vec(), force))
}

/// `create NAME --from-info FILE [force]`: the request, and a line for
/// each listed option skipped (no xlfs key).
fn create_from_info(
    name: String,
    file: &std::path::Path,
    args: &[String],
) -> Result<(Request, Vec<String>), DaemonError> {
    let force = match args {
        [] => false,
        [f] if f == "force" => true,
        _ => {
            return Err(DaemonError::Usage(
                "with --from-info, the bricks come from the listing: give only `force`".into(),
            ));
        }
    };
    let text = std::fs::read_to_string(file).map_err(|e| DaemonError::Usage(format!("{}: {e}", file.display())))?;
    let info = crate::mgmt::gluster_info::parse(&text, &file.display().to_string())
        .map_err(|e| DaemonError::Usage(e.to_string()))?;
    let (options, skipped): (Vec<_>, Vec<_>) =
        info.options.into_iter().partition(|(k, _)| crate::mgmt::keys::check_name(k).is_ok());
    let skipped = skipped.into_iter().map(|(k, v)| format!("skipped (xlfs has no such key): {k}: {v}")).collect();
    Ok((Request::Create { name, replica: Some(info.replica), bricks: info.bricks, force, options }, skipped))
}

impl VolumeCommand {
    /// The request, and lines to show people before the answer.
    fn request(self) -> Result<(Request, Vec<String>), DaemonError> {
        let cmd = match self {
            VolumeCommand::Create { name, from_info: Some(file), args } => {
                return create_from_info(name, &file, &args);
            }
            cmd => cmd,
        };
        let req = match cmd {
            VolumeCommand::Create { name, args, .. } => {
                let (replica, bricks, force) = create_args(&args)?;
                Request::Create { name, replica, bricks, force, options: Vec::new() }
            }
            VolumeCommand::Start { name, force } => Request::Start { name, force: force.is_some() },
            VolumeCommand::Stop { name } => Request::Stop { name },
            VolumeCommand::Delete { name } => Request::Delete { name },
            VolumeCommand::Info { name } => Request::Info { name },
            VolumeCommand::Status { name } => Request::Status { name },
            VolumeCommand::Set { args } => match args.as_slice() {
                [help] if help == "help" => Request::SetHelp,
                [name, key, value] => Request::Set { name: name.clone(), key: key.clone(), value: value.clone() },
                _ => return Err(DaemonError::Usage("usage: xlfs volume set NAME KEY VALUE | set help".into())),
            },
            VolumeCommand::Reset { name, key } => Request::Reset { name, key },
            VolumeCommand::Get { name, key } => Request::Get { name, key },
            VolumeCommand::Getspec { name, brick } => Request::Getspec { name, brick, unless: None },
            VolumeCommand::Portmap { brick } => Request::Portmap { brick },
            VolumeCommand::Heal { name, action, rest } if action.as_deref() == Some("split-brain") => {
                let (policy, source_brick, path) = match rest.as_slice() {
                    [policy, path] => (policy.clone(), None, path.clone()),
                    [policy, brick, path] if policy == "source-brick" => {
                        (policy.clone(), Some(brick.clone()), path.clone())
                    }
                    _ => {
                        return Err(DaemonError::Usage(
                            "usage: xlfs volume heal NAME split-brain bigger-file|latest-mtime PATH | source-brick HOST:DIR PATH"
                                .into(),
                        ));
                    }
                };
                Request::SplitBrain { name, policy, path, source_brick }
            }
            VolumeCommand::Heal { name, action, rest } => {
                if !rest.is_empty() {
                    return Err(DaemonError::Usage(format!("volume heal: unexpected {:?}", rest.join(" "))));
                }
                let action = match action.as_deref() {
                    Some("info") => HealAction::Info,
                    Some("full") => HealAction::Full,
                    _ => HealAction::Index,
                };
                Request::Heal { name, action }
            }
            VolumeCommand::Profile { name, action } => {
                let action = match action.as_str() {
                    "start" => ProfileAction::Start,
                    "stop" => ProfileAction::Stop,
                    _ => ProfileAction::Info,
                };
                Request::Profile { name, action }
            }
            VolumeCommand::Statedump { name } => Request::Statedump { name },
            VolumeCommand::AddBrick { name, args } => {
                let (replica, bricks, force) = create_args(&args)?;
                Request::AddBrick { name, replica, bricks, force }
            }
            VolumeCommand::RemoveBrick { name, mut args } => {
                let action = match args.pop().as_deref() {
                    Some("start") => RemoveAction::Start,
                    Some("status") => RemoveAction::Status,
                    Some("commit") => RemoveAction::Commit,
                    _ => {
                        return Err(DaemonError::Usage(
                            "usage: xlfs volume remove-brick NAME HOST:DIR... start|status|commit".into(),
                        ));
                    }
                };
                Request::RemoveBrick { name, bricks: args, action }
            }
            VolumeCommand::Rebalance { name, action } => {
                let action = match action.as_str() {
                    "fix-layout" => RebalanceAction::FixLayout,
                    "start" => RebalanceAction::Start,
                    "stop" => RebalanceAction::Stop,
                    _ => RebalanceAction::Status,
                };
                Request::Rebalance { name, action }
            }
        };
        Ok((req, Vec::new()))
    }
}

impl VolumeArgs {
    pub(super) async fn run(self, out: &mut (dyn Write + Send)) -> Result<(), CliError> {
        let (req, notes) = self.command.request()?;
        if !self.json {
            for line in notes {
                writeln!(out, "{line}")?;
            }
        }
        let reply = call(&self.daemon, &req).await.map_err(DaemonError::from)?;
        if let Reply::Profile { bundle } = &reply {
            let b = crate::profile::ProfileBundle::parse(bundle)
                .map_err(|e| DaemonError::Usage(format!("the daemon's profile: {e}")))?;
            let bricks = brick_profiles(&b);
            let text = if self.json {
                let v = serde_json::json!({ "bricks": bricks });
                serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
            } else {
                render_profile(&bricks)
            };
            out.write_all(text.as_bytes())?;
            out.flush()?;
            return Ok(());
        }
        print_reply(out, &reply, self.json)
    }
}

/// A reply for people.
fn render(reply: &Reply) -> String {
    match reply {
        Reply::Done { message } => format!("{message}\n"),
        Reply::Volumes { volumes } if volumes.is_empty() => "no volumes\n".into(),
        Reply::Volumes { volumes } => {
            volumes.iter().map(|v| format!("# volume {}\n{}", v.name, v.to_toml())).collect::<Vec<_>>().join("\n")
        }
        Reply::Status { volumes } if volumes.is_empty() => "no volumes\n".into(),
        Reply::Status { volumes } => {
            let mut s = String::new();
            for v in volumes {
                s += &format!("Status of volume: {} ({})\n", v.name, v.status);
                let rows: Vec<[String; 5]> = v
                    .bricks
                    .iter()
                    .map(|b| {
                        [
                            format!("{}:{}", b.host, b.dir),
                            b.port.map_or("-".into(), |p| p.to_string()),
                            b.pid.map_or("-".into(), |p| p.to_string()),
                            (if b.up { "Y" } else { "N" }).to_string(),
                            b.disk_free.map_or("-".into(), human_size),
                        ]
                    })
                    .collect();
                let mut rows = rows;
                if let Some(shd) = &v.shd {
                    rows.push([
                        "Self-heal Daemon".to_string(),
                        "-".into(),
                        shd.pid.map_or("-".into(), |p| p.to_string()),
                        (if shd.up { "Y" } else { "N" }).to_string(),
                        "-".into(),
                    ]);
                }
                s += &table(&["Brick", "Port", "Pid", "Online", "Disk free"], &rows);
                s += "\n";
            }
            s
        }
        Reply::Values { values } => {
            let rows: Vec<[String; 3]> = values
                .iter()
                .map(|v| [v.key.clone(), v.value.clone(), (if v.set { "set" } else { "default" }).to_string()])
                .collect();
            table(&["Option", "Value", ""], &rows)
        }
        Reply::Help { keys } => keys
            .iter()
            .map(|k| format!("{}\n    value: {}\n    default: {}\n    {}\n", k.key, k.form, k.default, k.description))
            .collect::<Vec<_>>()
            .join("\n"),
        Reply::Spec { volfile, .. } => volfile.clone(),
        Reply::Port { port } => format!("{port}\n"),
        Reply::HealInfo { name, bricks } => {
            let mut s = format!("Heal info of volume {name}\n");
            for b in bricks {
                let state = if b.up {
                    format!("up, {} {} to heal", b.entries, if b.entries == 1 { "entry" } else { "entries" })
                } else {
                    "down".to_string()
                };
                s += &format!("Brick {}: {state}\n", b.brick);
                for d in &b.detail {
                    s += &format!("  {d}\n");
                }
            }
            s
        }
        Reply::Profile { bundle } => bundle.clone(),
        Reply::Peers { peers } => {
            let rows: Vec<[String; 3]> = peers
                .iter()
                .map(|p| {
                    let state = match (p.this, p.connected) {
                        (true, _) => "this node",
                        (false, true) => "connected",
                        (false, false) => "disconnected",
                    };
                    [p.node.clone(), p.address.clone(), state.to_string()]
                })
                .collect();
            table(&["Node", "Daemon", "State"], &rows)
        }
        Reply::Hello { node, cluster } => format!("node {} in {cluster}\n", node.as_deref().unwrap_or("(unnamed)")),
        Reply::Bricks { bricks } => bricks.iter().map(|b| format!("{b}\n")).collect(),
        Reply::Files { count, example } => format!("{count} files (e.g. {example})\n"),
        Reply::Rebalance { status } => render_rebalance(status),
        Reply::Statedump { bricks } => {
            let mut s = String::new();
            for b in bricks {
                s += &format!("Brick {}:\n", b.brick);
                match &b.error {
                    Some(e) => s += &format!("  (no dump: {e})\n"),
                    None => b.dump.iter().for_each(|l| s += &format!("  {l}\n")),
                }
            }
            s
        }
    }
}

/// One brick's fop counts since it started (profile info).
#[derive(Debug, serde::Serialize)]
struct BrickFops {
    /// `HOST:DIR`.
    brick: String,
    /// Why it has no counts.
    error: Option<String>,
    /// The brick graph's counting window, in ms.
    window_ms: u64,
    /// Per fop: (name, calls, total ns) at the top of the brick graph.
    fops: Vec<(String, u64, u64)>,
}

/// The bricks' per-fop counts of a profile bundle: per fop, the count of
/// the topmost node of the brick graph that saw it.
fn brick_profiles(b: &crate::profile::ProfileBundle) -> Vec<BrickFops> {
    b.bricks
        .iter()
        .map(|br| {
            let host = br.remote.rsplit_once(':').map_or(br.remote.as_str(), |(h, _)| h);
            let brick = format!("{host}:{}", br.subvolume);
            match &br.profile {
                Err(e) => BrickFops { brick, error: Some(e.clone()), window_ms: 0, fops: Vec::new() },
                Ok(p) => {
                    let mut fops: Vec<(String, u64, u64)> = Vec::new();
                    // Nodes are listed top first.
                    for n in &p.nodes {
                        for f in &n.fops {
                            if f.count > 0 && !fops.iter().any(|(k, _, _)| k == f.kind.name()) {
                                fops.push((f.kind.name().to_string(), f.count, f.total_ns));
                            }
                        }
                    }
                    fops.sort();
                    BrickFops { brick, error: None, window_ms: p.window_ms, fops }
                }
            }
        })
        .collect()
}

fn render_profile(bricks: &[BrickFops]) -> String {
    let mut s = String::new();
    for b in bricks {
        if let Some(e) = &b.error {
            s += &format!("Brick {}: not reached: {e}\n\n", b.brick);
            continue;
        }
        s += &format!("Brick {}: fop counts over {:.1} s\n", b.brick, b.window_ms as f64 / 1000.0);
        let rows: Vec<[String; 4]> = b
            .fops
            .iter()
            .map(|(k, n, ns)| {
                [
                    k.clone(),
                    n.to_string(),
                    format!("{:.3}", *ns as f64 / 1e6),
                    format!("{:.1}", *ns as f64 / *n as f64 / 1e3),
                ]
            })
            .collect();
        s += &table(&["Fop", "Calls", "Total ms", "Avg us"], &rows);
        s += "\n";
    }
    s
}

/// A rebalance's progress: a table, a bar and the time left.
fn render_rebalance(s: &RebalanceStatus) -> String {
    let mut out = format!("{} of volume {}: {}\n", s.kind_or_default(), s.name, s.state);
    if s.state == "not started" {
        return out;
    }
    let row = [
        s.dirs.to_string(),
        s.scanned.to_string(),
        s.moved.to_string(),
        s.skipped.to_string(),
        s.failed.to_string(),
        human_size(s.bytes),
        format!("{:.1}s", s.elapsed_secs),
        s.eta_secs.map_or("-".into(), |t| format!("{t:.0}s")),
    ];
    out += &table(&["Dirs", "Scanned", "Moved", "Skipped", "Failed", "Moved size", "Elapsed", "Time left"], &[row]);
    if s.total > 0 {
        out += &format!("{} {}/{} files\n", progress_bar(s.scanned, s.total, 30), s.scanned.min(s.total), s.total);
    }
    if let Some(e) = &s.error {
        out += &format!("{}: {e}\n", if s.state == "paused" { "waiting" } else { "last error" });
    }
    if s.pauses > 0 {
        out += &format!("paused {} time(s) while a replica set was unreachable\n", s.pauses);
    }
    out
}

impl RebalanceStatus {
    fn kind_or_default(&self) -> &str {
        if self.kind.is_empty() { "rebalance" } else { &self.kind }
    }
}

/// `[#####.....] 50%`.
fn progress_bar(done: u64, total: u64, width: usize) -> String {
    let frac = if total == 0 { 0.0 } else { (done as f64 / total as f64).min(1.0) };
    let full = (frac * width as f64).round() as usize;
    format!("[{}{}] {:>3.0}%", "#".repeat(full), ".".repeat(width - full), frac * 100.0)
}

fn human_size(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1}{}", UNITS[u])
}

/// Columns padded to their widest cell.
fn table<const N: usize>(head: &[&str; N], rows: &[[String; N]]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<width$}", width = w[i])).collect();
        format!("{}\n", s.join("  ").trim_end())
    };
    let mut s = line(head.to_vec());
    for r in rows {
        s += &line(r.iter().map(String::as_str).collect());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_arguments() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            create_args(&v(&["replica", "3", "h:/a", "h:/b", "h:/c", "force"])).expect("parses"),
            (Some(3), v(&["h:/a", "h:/b", "h:/c"]), true)
        );
        assert_eq!(create_args(&v(&["h:/a"])).expect("parses"), (None, v(&["h:/a"]), false));
        assert!(create_args(&v(&["replica", "x", "h:/a"])).expect_err("not a number").to_string().contains("number"));
    }

    #[test]
    fn tables_align() {
        let t = table(&["A", "Bee"], &[["xx".to_string(), "1".to_string()]]);
        assert_eq!(t, "A   Bee\nxx  1\n");
        assert_eq!(human_size(3 * 1024 * 1024), "3.0MB");
        assert_eq!(progress_bar(1, 4, 8), "[##......]  25%");
        assert_eq!(progress_bar(9, 4, 4), "[####] 100%");
    }
}
