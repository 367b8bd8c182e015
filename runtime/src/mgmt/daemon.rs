//! The daemon's request handling: each [`Request`] checked, applied to the
//! [store](super::store) and the [supervisor](super::supervisor), and
//! answered. Requests that change something run one at a time; a refused
//! request changes nothing.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use xlfs_sdk::Gfid;

use super::keys::{self, KEYS, KeyError};
use super::protocol::{
    BrickDump, BrickHeal, BrickStatus, HealAction, KeyValue, ProfileAction, RebalanceAction, RebalanceStatus,
    RemoveAction, Reply, Request, Response, SPEC_WAIT, VolumeState, read_frame, volfile_digest, write_frame,
};
use super::rebalance::{self, Progress};
use super::shd::Shds;
use super::spec::{BadBrick, BadName, BrickSpec, VolumeSpec, VolumeStatus, check_name};
use super::store::{Expect, Peer, Store, StoreError, Versioned};
use super::supervisor::{BrickJob, StartError, Supervisor, is_local};
use super::volgen::{VolgenError, client_volfile};
use crate::graph::Graph;
use crate::registry::Registry;

/// How long `volume heal`, `profile` and `statedump` wait for the volume's
/// client graph (and its replicate children) to come up.
const GRAPH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The xattr that marks a brick directory as part of a volume.
pub const VOLUME_ID_XATTR: &str = "trusted.glusterfs.volume-id";

/// Why a request was refused (nothing changed) or failed.
#[derive(Debug, thiserror::Error)]
pub enum MgmtError {
    /// A bad volume name.
    #[error(transparent)]
    Name(#[from] BadName),
    /// A bad `HOST:DIR`.
    #[error(transparent)]
    Brick(#[from] BadBrick),
    /// A bad key or value.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The volume layout is not supported.
    #[error(transparent)]
    Volgen(#[from] VolgenError),
    /// A brick did not start.
    #[error("volume start failed: {0}")]
    Start(Box<StartError>),
    /// No such volume.
    #[error("volume {0} does not exist")]
    NoVolume(String),
    /// The name is taken.
    #[error("volume {0} already exists")]
    Exists(String),
    /// Create without bricks.
    #[error("volume create {0}: no bricks given (HOST:DIR ...)")]
    NoBricks(String),
    /// A replica count of 0.
    #[error("replica count must be at least 1")]
    ZeroReplica,
    /// The replica count does not divide the brick count.
    #[error("replica count {replica} does not divide the brick count {bricks}")]
    ReplicaMismatch {
        /// The replica count.
        replica: usize,
        /// The brick count.
        bricks: usize,
    },
    /// The brick's host is neither this node nor a peer.
    #[error(
        "brick {0}: its host {host} is not this node and not a peer of it (add it first: `xlfs peer add {host}`)",
        host = .0.host
    )]
    NotPeer(BrickSpec),
    /// Another node's daemon refused or could not be asked.
    #[error("peer {node}: {why}")]
    Peer {
        /// The node.
        node: String,
        /// Why.
        why: String,
    },
    /// A peer add that cannot be.
    #[error("peer add {address}: {why}")]
    BadPeer {
        /// The address given.
        address: String,
        /// Why.
        why: String,
    },
    /// A peer remove of a node that still holds bricks.
    #[error("peer remove {node}: it holds brick {brick} of volume {volume}; remove its bricks first")]
    PeerInUse {
        /// The node.
        node: String,
        /// A brick on it.
        brick: BrickSpec,
        /// Its volume.
        volume: String,
    },
    /// A brick on another node did not come up or go down in time.
    #[error("volume {name}: brick {brick}: {why}")]
    Remote {
        /// The volume.
        name: String,
        /// The brick.
        brick: BrickSpec,
        /// Why.
        why: String,
    },
    /// The brick directory is missing or unusable.
    #[error("brick {brick}: directory {}: {source}", brick.dir.display())]
    BrickDir {
        /// The brick.
        brick: BrickSpec,
        /// Why.
        source: std::io::Error,
    },
    /// The brick path is not a directory.
    #[error("brick {0}: not a directory")]
    NotDir(BrickSpec),
    /// A brick given twice.
    #[error("brick {0} is listed more than once")]
    Duplicate(BrickSpec),
    /// A brick on the root file system, without `force`.
    #[error(
        "brick {0} is on the root file system; put bricks on their own file system, or add `force` to use it anyway"
    )]
    RootFs(BrickSpec),
    /// A brick already in a volume.
    #[error("brick {brick} is already part of {what}")]
    InUse {
        /// The brick.
        brick: BrickSpec,
        /// Which volume (or which volume id).
        what: String,
    },
    /// Marking or unmarking a brick failed.
    #[error("brick {brick}: {what} {VOLUME_ID_XATTR}: {source}")]
    Xattr {
        /// The brick.
        brick: BrickSpec,
        /// set, read or remove.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// Start of a started volume.
    #[error("volume {0} is already started (`xlfs volume start {0} force` restarts the bricks that are down)")]
    AlreadyStarted(String),
    /// Stop (or getspec) of a volume not started.
    #[error("volume {0} is not started")]
    NotStarted(String),
    /// Delete of a started volume.
    #[error("volume {0} is started; stop it first (`xlfs volume stop {0}`)")]
    DeleteStarted(String),
    /// The volume's client graph could not be built or used.
    #[error("volume {name}: {why}")]
    Graph {
        /// The volume.
        name: String,
        /// Why.
        why: String,
    },
    /// Portmap of a brick nobody serves.
    #[error("no brick {0} is served by this daemon")]
    NoSuchBrick(String),
    /// add-brick with another replica count.
    #[error(
        "volume {name} has replica {have}; add-brick cannot change the replica count (give `replica {have}` or no replica count)"
    )]
    ReplicaChange {
        /// The volume.
        name: String,
        /// Its replica count.
        have: usize,
    },
    /// add-brick with a brick count that is not whole replica sets.
    #[error(
        "volume add-brick {name}: {bricks} bricks do not make whole replica sets of {replica}: give a multiple of {replica}"
    )]
    NotWholeSets {
        /// The volume.
        name: String,
        /// Bricks given.
        bricks: usize,
        /// The replica count.
        replica: usize,
    },
    /// A rebalance of a volume with one replica set.
    #[error("volume {0} has a single replica set: there is nothing to rebalance (add bricks first)")]
    NotDistributed(String),
    /// A rebalance while one runs.
    #[error("volume {0}: a rebalance is in progress (`xlfs volume rebalance {0} status`, or `stop` it)")]
    RebalanceRunning(String),
    /// remove-brick of a brick not in the volume.
    #[error("brick {brick} is not part of volume {name}")]
    NotInVolume {
        /// The volume.
        name: String,
        /// The brick.
        brick: String,
    },
    /// remove-brick of part of a replica set, or of every set.
    #[error("volume remove-brick {name}: {why}")]
    BadRemove {
        /// The volume.
        name: String,
        /// Why.
        why: String,
    },
    /// remove-brick commit while files are left on the bricks.
    #[error(
        "volume remove-brick {name} commit: {count} files are still on brick {brick} (e.g. {example}); run `xlfs volume remove-brick {name} ... start` again"
    )]
    FilesLeft {
        /// The volume.
        name: String,
        /// A brick with files.
        brick: BrickSpec,
        /// How many files are on it.
        count: u64,
        /// One of them.
        example: String,
    },
    /// Stop without a rebalance running.
    #[error("volume {0}: no rebalance is in progress")]
    NoRebalance(String),
}

/// The daemon's state: the store, the bricks, the registry for keys.
pub struct Daemon {
    pub(super) store: Arc<dyn Store>,
    pub(super) sup: Arc<Supervisor>,
    shds: Shds,
    registry: Registry,
    /// This node (`--node`) and its daemon's address; `None`: a daemon
    /// alone, whose bricks are those on an address of this machine.
    pub(super) me: Option<Peer>,
    /// Serializes requests that change something.
    pub(super) changes: tokio::sync::Mutex<()>,
    /// The last or current rebalance run of each volume.
    rebalances: parking_lot::Mutex<std::collections::BTreeMap<String, Arc<Progress>>>,
    /// The bundle kept by `profile stop`, per volume, until `start`.
    profiles: parking_lot::Mutex<std::collections::BTreeMap<String, String>>,
    /// What this daemon last published of its bricks, and when.
    pub(super) published: parking_lot::Mutex<super::cluster::Published>,
    /// Woken when a volfile may have changed (a request changed something,
    /// another node changed the store, a brick here moved): `getspec`s
    /// waiting for a change look again.
    pub(super) volfiles: tokio::sync::Notify,
}

impl Daemon {
    /// A daemon over `store`, running bricks with `sup` and self-heal
    /// daemons with `shds`; `me`: this node's name and daemon address
    /// (`--node`), whose bricks it serves (without it: the bricks on any
    /// address of this machine).
    pub fn new(store: Arc<dyn Store>, sup: Arc<Supervisor>, shds: Shds, me: Option<Peer>) -> Daemon {
        Daemon {
            store,
            sup,
            shds,
            registry: Registry::builtin(),
            me,
            changes: tokio::sync::Mutex::new(()),
            rebalances: Default::default(),
            profiles: Default::default(),
            volfiles: tokio::sync::Notify::new(),
            published: Default::default(),
        }
    }

    /// True if this daemon serves the bricks of `host`: its node's name
    /// when it has one, else any address of this machine.
    pub(super) fn is_mine(&self, host: &str) -> bool {
        match &self.me {
            Some(p) => p.node == host,
            None => is_local(host),
        }
    }

    /// Keeps a self-heal daemon running per started volume, over its
    /// current client volfile ([`Shds::reconcile`] every second), until
    /// the future is dropped.
    pub async fn run_shds(self: Arc<Self>) {
        loop {
            let mut want = std::collections::BTreeMap::new();
            match self.store.list() {
                Ok(list) => {
                    let healed = |v: &&Versioned| {
                        v.spec.status == VolumeStatus::Started
                            && v.spec
                                .options
                                .get("cluster.self-heal-daemon")
                                .and_then(|o| xlfs_sdk::options::parse_bool(o))
                                != Some(false)
                    };
                    for v in list.iter().filter(healed) {
                        // Only once every brick has a port: a volfile with
                        // port 0 would be replaced at once.
                        // Healed from the nodes that hold bricks, as GlusterFS.
                        if !v.spec.bricks.iter().any(|b| self.is_mine(&b.host)) {
                            continue;
                        }
                        let ports = self.brick_ports(&v.spec);
                        if ports.iter().any(Option::is_none) {
                            continue;
                        }
                        let ports: Vec<u16> = ports.into_iter().flatten().collect();
                        if let Ok(text) = client_volfile(&v.spec, &ports) {
                            want.insert(v.spec.name.clone(), text);
                        }
                    }
                    self.shds.reconcile(&self.sup, &want).await;
                }
                Err(e) => tracing::warn!("self-heal daemons: listing volumes: {e}"),
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }

    /// Starts the bricks of every started volume (at daemon start);
    /// failures are logged, and the brick stays down.
    pub async fn resume(&self) -> Result<(), MgmtError> {
        let _one = self.changes.lock().await;
        for v in self.store.list()? {
            if v.spec.status == VolumeStatus::Started {
                for job in self.jobs(&v.spec) {
                    if let Err(e) = self.sup.start(job).await {
                        tracing::error!("{e}");
                    }
                }
            }
        }
        Ok(())
    }

    /// Stops every brick (at daemon exit), then publishes their states:
    /// down, on the ports they had (for the next start).
    pub async fn shutdown(&self) {
        self.shds.stop_all().await;
        self.sup.stop_all().await;
        for v in self.store.list().unwrap_or_default() {
            if let Err(e) = self.publish_mine(&v) {
                tracing::warn!(volume = %v.spec.name, "publishing the bricks' states: {e}");
            }
        }
    }

    /// Accepts connections on `listener` and answers their requests,
    /// until the future is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let d = self.clone();
            tokio::spawn(async move {
                let (mut rd, mut wr) = stream.into_split();
                loop {
                    let req = match read_frame::<Request>(&mut rd).await {
                        Ok(Some(r)) => r,
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(%peer, "control connection: {e}");
                            let _ = write_frame(&mut wr, &Response::Error(format!("bad request: {e}"))).await;
                            break;
                        }
                    };
                    let resp = d.handle(req).await;
                    if write_frame(&mut wr, &resp).await.is_err() {
                        break;
                    }
                }
            });
        }
    }

    /// Answers one request.
    pub async fn handle(&self, req: Request) -> Response {
        let logged = !matches!(
            req,
            Request::Getspec { .. }
                | Request::Portmap { .. }
                | Request::Info { .. }
                | Request::Status { .. }
                | Request::Rebalance { action: RebalanceAction::Status, .. }
        );
        let what = format!("{req:?}");
        let r = self.apply(req).await;
        if logged {
            self.volfiles.notify_waiters();
        }
        match r {
            Ok(reply) => {
                if logged {
                    tracing::info!(request = %what, "done");
                }
                Response::Ok(reply)
            }
            Err(e) => {
                if logged {
                    tracing::info!(request = %what, "refused: {e}");
                }
                Response::Error(e.to_string())
            }
        }
    }

    async fn apply(&self, req: Request) -> Result<Reply, MgmtError> {
        match req {
            Request::Create { name, replica, bricks, force, options } => {
                let _one = self.changes.lock().await;
                self.create(&name, replica, &bricks, force, &options).await
            }
            Request::Start { name, force } => {
                let _one = self.changes.lock().await;
                self.start(&name, force).await
            }
            Request::Stop { name } => {
                let _one = self.changes.lock().await;
                self.stop(&name).await
            }
            Request::Delete { name } => {
                let _one = self.changes.lock().await;
                self.delete(&name).await
            }
            Request::Set { name, key, value } => {
                let _one = self.changes.lock().await;
                if let Some(p) = key.strip_prefix(keys::PLUGIN_PREFIX)
                    && (p == name || p.starts_with(&format!("{name}-")))
                {
                    // Volgen names its own translators VOLUME and VOLUME-...
                    return Err(KeyError::Plugin {
                        key,
                        why: format!("the name is taken by the generated graph: avoid {name} and {name}-..."),
                    }
                    .into());
                }
                let mut v = self.get(&name)?;
                let value = keys::validate_in(&self.registry, &v.spec.options, &key, &value)?;
                v.spec.options.insert(key.clone(), value.clone());
                self.store.put(&v.spec, Expect::Revision(v.revision))?;
                Ok(done(format!("volume set: {name}: {key} = {value}")))
            }
            Request::Reset { name, key } => {
                let _one = self.changes.lock().await;
                let mut v = self.get(&name)?;
                match &key {
                    Some(k) => {
                        keys::check_name(k)?;
                        v.spec.options.remove(k);
                        // A plugin's options go with it.
                        if let Some(plugin) = k.strip_prefix(keys::PLUGIN_PREFIX)
                            && keys::plugin_option(k).is_none()
                        {
                            v.spec.options.retain(|o, _| keys::plugin_option(o).is_none_or(|(n, _)| n != plugin));
                        }
                    }
                    None => v.spec.options.clear(),
                }
                self.store.put(&v.spec, Expect::Revision(v.revision))?;
                Ok(done(format!("volume reset: {name}: {}", key.as_deref().unwrap_or("every key"))))
            }
            Request::Get { name, key } => {
                let v = self.get(&name)?;
                let one = |k: &keys::Key| {
                    let set = v.spec.options.get(k.name);
                    KeyValue {
                        key: k.name.to_string(),
                        value: set.cloned().unwrap_or_else(|| keys::default_value(&self.registry, k)),
                        set: set.is_some(),
                    }
                };
                let plugins = v.spec.options.iter().filter(|(k, _)| k.starts_with(keys::PLUGIN_PREFIX));
                let plugin = |(k, val): (&String, &String)| KeyValue { key: k.clone(), value: val.clone(), set: true };
                let family = v.spec.options.iter().filter(|(k, _)| keys::family(k).is_some());
                let values = if key == "all" {
                    KEYS.iter().map(one).chain(family.map(plugin)).chain(plugins.map(plugin)).collect()
                } else if keys::family(&key).is_some() {
                    let set = v.spec.options.get(&key);
                    let value = match set {
                        Some(v) => v.clone(),
                        None => keys::default_of(&self.registry, &key)?,
                    };
                    vec![KeyValue { set: set.is_some(), key, value }]
                } else if key.starts_with(keys::PLUGIN_PREFIX) {
                    keys::check_name(&key)?;
                    let value = v.spec.options.get(&key).cloned().unwrap_or_else(|| "(unset)".into());
                    vec![KeyValue { set: value != "(unset)", key, value }]
                } else {
                    vec![one(keys::find(&key)?)]
                };
                Ok(Reply::Values { values })
            }
            Request::SetHelp => Ok(Reply::Help { keys: keys::help(&self.registry) }),
            Request::Info { name } => {
                let volumes = match name {
                    Some(n) => vec![self.get(&n)?.spec],
                    None => self.store.list()?.into_iter().map(|v| v.spec).collect(),
                };
                Ok(Reply::Volumes { volumes })
            }
            Request::Status { name } => {
                let specs = match name {
                    Some(n) => vec![self.get(&n)?.spec],
                    None => self.store.list()?.into_iter().map(|v| v.spec).collect(),
                };
                Ok(Reply::Status { volumes: specs.iter().map(|s| self.state_of(s)).collect() })
            }
            Request::Getspec { name, brick: None, unless } => {
                let deadline = tokio::time::Instant::now() + SPEC_WAIT;
                loop {
                    // Registered before looking, so no change slips between.
                    let changed = self.volfiles.notified();
                    let (v, volfile) = self.volfile(&name)?;
                    let same = unless == Some(volfile_digest(&volfile));
                    if !same || tokio::time::timeout_at(deadline, changed).await.is_err() {
                        return Ok(Reply::Spec { volfile, revision: v.revision });
                    }
                }
            }
            Request::Getspec { name, brick: Some(brick), .. } => self.brick_volfile(&name, &brick),
            Request::Heal { name, action } => self.heal(&name, action).await,
            Request::Profile { name, action } => {
                if action == ProfileAction::Info
                    && let Some(frozen) = self.profiles.lock().get(&name)
                {
                    return Ok(Reply::Profile { bundle: frozen.clone() });
                }
                let (spec, graph) = self.client_graph(&name).await?;
                let res = graph.wait_up(GRAPH_WAIT).await;
                // Every brick, not just enough for the volume to be up.
                crate::cli::heal::wait_children(&graph, GRAPH_WAIT).await;
                let bundle = match res {
                    Ok(()) => Ok(crate::profile::collect(&graph, action == ProfileAction::Start).await),
                    Err(e) => Err(MgmtError::Graph { name: spec.name.clone(), why: e.to_string() }),
                };
                drop_graph(graph).await;
                let text = bundle?.to_text();
                match action {
                    ProfileAction::Info => Ok(Reply::Profile { bundle: text }),
                    ProfileAction::Start => {
                        self.profiles.lock().remove(&name);
                        Ok(done(format!("volume profile: {name}: started (every brick's counts zeroed)")))
                    }
                    ProfileAction::Stop => {
                        self.profiles.lock().insert(name.clone(), text);
                        Ok(done(format!("volume profile: {name}: stopped (info shows the counts kept now)")))
                    }
                }
            }
            Request::SplitBrain { name, policy, path, source_brick } => {
                self.split_brain(&name, &policy, &path, source_brick.as_deref()).await
            }
            Request::Statedump { name } => {
                let (spec, graph) = self.client_graph(&name).await?;
                // Each brick is asked through its own protocol/client, which
                // need not wait for the whole graph.
                let _ = graph.wait_up(GRAPH_WAIT).await;
                crate::cli::heal::wait_children(&graph, GRAPH_WAIT).await;
                let mut bricks = Vec::new();
                for (client, _) in graph.nodes_of_type(crate::profile::CLIENT_TYPE) {
                    let i = (0..spec.bricks.len()).find(|i| *client.name == format!("{name}-client-{i}"));
                    let brick =
                        i.and_then(|i| spec.bricks.get(i)).map_or_else(|| client.name.to_string(), |b| b.to_string());
                    bricks.push(match crate::profile::ask_brick_dump(&client).await {
                        Ok(text) => BrickDump { brick, dump: text.lines().map(String::from).collect(), error: None },
                        Err(e) => BrickDump { brick, dump: Vec::new(), error: Some(e) },
                    });
                }
                drop_graph(graph).await;
                Ok(Reply::Statedump { bricks })
            }
            Request::AddBrick { name, replica, bricks, force } => {
                let _one = self.changes.lock().await;
                self.add_brick(&name, replica, &bricks, force).await
            }
            Request::Rebalance { name, action } => self.rebalance(&name, action).await,
            Request::RemoveBrick { name, bricks, action } => {
                let _one = self.changes.lock().await;
                self.remove_brick(&name, &bricks, action).await
            }
            Request::Portmap { brick } => {
                let b = BrickSpec::parse(&brick)?;
                let port = self.sup.port(&b).or_else(|| self.sup.port(&b.canonical()));
                Ok(Reply::Port { port: port.ok_or(MgmtError::NoSuchBrick(brick))? })
            }
            Request::PeerAdd { address } => {
                let _one = self.changes.lock().await;
                self.peer_add(&address).await
            }
            Request::PeerRemove { node } => {
                let _one = self.changes.lock().await;
                self.peer_remove(&node)
            }
            Request::PeerList => self.peer_list().await,
            Request::Hello => {
                Ok(Reply::Hello { node: self.me.as_ref().map(|p| p.node.clone()), cluster: self.store.cluster() })
            }
            Request::PrepareBricks { bricks, force, id } => self.prepare_asked(&bricks, force, &id),
            Request::ReleaseBricks { bricks } => self.release_asked(&bricks),
            Request::BrickFiles { brick } => self.files_asked(&brick),
        }
    }

    /// The client volfile of started volume `name`, as served to mounts.
    fn volfile(&self, name: &str) -> Result<(Versioned, String), MgmtError> {
        let v = self.get(name)?;
        if v.spec.status != VolumeStatus::Started {
            return Err(MgmtError::NotStarted(name.to_string()));
        }
        let ports: Vec<u16> = self.brick_ports(&v.spec).into_iter().map(|p| p.unwrap_or(0)).collect();
        let text = client_volfile(&v.spec, &ports)?;
        Ok((v, text))
    }

    /// The volfile brick `raw` of volume `name` serves (or would serve: a
    /// brick not started shows port 0).
    fn brick_volfile(&self, name: &str, raw: &str) -> Result<Reply, MgmtError> {
        let v = self.get(name)?;
        let b = BrickSpec::parse(raw)?;
        let i = v.spec.bricks.iter().position(|x| *x == b || *x == b.canonical());
        let i = i.ok_or_else(|| MgmtError::NotInVolume { name: name.to_string(), brick: raw.to_string() })?;
        let port = self.brick_ports(&v.spec)[i].unwrap_or(0);
        let job = self.job(&v.spec, &v.spec.bricks[i], None);
        let volfile = crate::cli::BrickArgs::volfile_of(&job.args(port))
            .map_err(|e| MgmtError::Graph { name: name.to_string(), why: e.to_string() })?;
        Ok(Reply::Spec { volfile, revision: v.revision })
    }

    /// The volume's client graph, built in the daemon and activated (as
    /// `xlfs heal --volfile` and `xlfs profile` build theirs); give it
    /// back to [`drop_graph`].
    async fn client_graph(&self, name: &str) -> Result<(VolumeSpec, Arc<Graph>), MgmtError> {
        let (v, text) = self.volfile(name)?;
        let graph = Graph::from_str(&text, &format!("volume {name}"), &self.registry)
            .map_err(|e| MgmtError::Graph { name: name.to_string(), why: e.to_string() })?;
        let graph = Arc::new(graph);
        graph.activate();
        Ok((v.spec, graph))
    }

    /// `volume heal NAME [info|full]`, with `xlfs heal`'s machinery.
    async fn heal(&self, name: &str, action: HealAction) -> Result<Reply, MgmtError> {
        let (spec, graph) = self.client_graph(name).await?;
        let res = match action {
            HealAction::Info => crate::cli::heal::info_of(&graph, GRAPH_WAIT).await.map(|text| {
                let clients: Vec<String> = (0..spec.bricks.len()).map(|i| format!("{name}-client-{i}")).collect();
                Reply::HealInfo { name: name.to_string(), bricks: heal_info(&text, &clients, &spec.bricks) }
            }),
            HealAction::Index | HealAction::Full => {
                crate::cli::heal::heal_of(&graph, action == HealAction::Full, GRAPH_WAIT).await.map(
                    |(summary, report)| {
                        let report = if report.is_empty() { String::new() } else { format!("\n{report}") };
                        done(format!("volume heal: {name}: {summary}{report}"))
                    },
                )
            }
        };
        drop_graph(graph).await;
        res.map_err(|e| MgmtError::Graph { name: name.to_string(), why: e.to_string() })
    }

    /// The brick jobs of a volume on this node.
    pub(super) fn jobs(&self, spec: &VolumeSpec) -> Vec<BrickJob> {
        let mine: Vec<&BrickSpec> = spec.bricks.iter().filter(|b| self.is_mine(&b.host)).collect();
        // Where they served before, if this daemon restarted.
        let before = match mine.is_empty() {
            true => Default::default(),
            false => self.store.brick_states(&spec.name).unwrap_or_default(),
        };
        mine.into_iter().map(|b| self.job(spec, b, before.get(b).and_then(|s| s.port))).collect()
    }

    /// The job serving brick `b` of `spec` (`port`: where it served before).
    fn job(&self, spec: &VolumeSpec, b: &BrickSpec, port: Option<u16>) -> BrickJob {
        BrickJob {
            volume: spec.name.clone(),
            volume_id: spec.id.clone(),
            brick: b.clone(),
            server: keys::brick_options(&spec.options),
            posix: keys::brick_posix_options(&spec.options),
            port,
        }
    }

    /// `volume heal NAME split-brain POLICY PATH`: `xlfs heal`'s
    /// resolution on the volume's client graph.
    async fn split_brain(
        &self,
        name: &str,
        policy: &str,
        path: &str,
        source: Option<&str>,
    ) -> Result<Reply, MgmtError> {
        let v = self.get(name)?;
        let bad = |why: String| MgmtError::Graph { name: name.to_string(), why };
        let value = match (policy, source) {
            ("bigger-file" | "latest-mtime", None) => policy.to_string(),
            ("source-brick", Some(raw)) => {
                let b = BrickSpec::parse(raw)?;
                let i = v.spec.bricks.iter().position(|x| *x == b || *x == b.canonical());
                let i = i.ok_or_else(|| MgmtError::NotInVolume { name: name.to_string(), brick: raw.to_string() })?;
                format!("source-brick:{name}-client-{i}")
            }
            ("source-brick", None) => {
                return Err(bad("split-brain source-brick needs the good copy's HOST:DIR".into()));
            }
            _ => {
                return Err(bad(format!(
                    "split-brain policy {policy:?}: use bigger-file PATH, latest-mtime PATH or source-brick HOST:DIR PATH"
                )));
            }
        };
        let (_, graph) = self.client_graph(name).await?;
        let res = match graph.wait_up(GRAPH_WAIT).await {
            Ok(()) => {
                crate::cli::heal::wait_children(&graph, GRAPH_WAIT).await;
                crate::cli::heal::split_brain_of(&graph, path, &value).await.map_err(|e| bad(e.to_string()))
            }
            Err(e) => Err(bad(e.to_string())),
        };
        drop_graph(graph).await;
        Ok(done(format!("volume heal: {name}: {path}: {}", res?)))
    }

    fn get(&self, name: &str) -> Result<Versioned, MgmtError> {
        self.store.get(name)?.ok_or_else(|| MgmtError::NoVolume(name.to_string()))
    }

    fn state_of(&self, spec: &VolumeSpec) -> VolumeState {
        let remote = self.remote_states(spec);
        let bricks = spec
            .bricks
            .iter()
            .map(|b| {
                let st = self.brick_state(spec, b, &remote);
                BrickStatus {
                    host: b.host.clone(),
                    dir: b.dir.display().to_string(),
                    port: st.port,
                    pid: st.pid,
                    up: st.pid.is_some(),
                    disk_free: st.disk_free,
                    restarts: st.restarts,
                }
            })
            .collect();
        VolumeState {
            name: spec.name.clone(),
            status: spec.status.to_string(),
            bricks,
            shd: self.shds.status(&spec.name),
        }
    }

    async fn create(
        &self,
        name: &str,
        replica: Option<usize>,
        bricks: &[String],
        force: bool,
        options: &[(String, String)],
    ) -> Result<Reply, MgmtError> {
        check_name(name)?;
        if self.store.get(name)?.is_some() {
            return Err(MgmtError::Exists(name.to_string()));
        }
        if bricks.is_empty() {
            return Err(MgmtError::NoBricks(name.to_string()));
        }
        let replica = replica.unwrap_or(bricks.len());
        if replica == 0 {
            return Err(MgmtError::ZeroReplica);
        }
        if !bricks.len().is_multiple_of(replica) {
            return Err(MgmtError::ReplicaMismatch { replica, bricks: bricks.len() });
        }
        let id = Gfid::random();
        let mut spec = VolumeSpec {
            name: name.to_string(),
            id: id.to_string(),
            replica,
            status: VolumeStatus::Created,
            bricks: bricks.iter().map(|b| BrickSpec::parse(b)).collect::<Result<_, _>>()?,
            options: Default::default(),
            removing: Vec::new(),
        };
        for (key, value) in options {
            let value = keys::validate_in(&self.registry, &spec.options, key, value)?;
            spec.options.insert(key.clone(), value);
        }
        // Refuses layouts volgen cannot serve, before anything is marked.
        client_volfile(&spec, &[])?;
        spec.bricks = self.prepare_bricks(&spec.bricks, force, id).await?;
        if let Err(e) = self.store.put(&spec, Expect::Absent) {
            self.release_bricks(&spec.bricks).await;
            return Err(e.into());
        }
        Ok(done(format!(
            "volume create: {name}: success: replica {replica}, {} bricks, id {}; start it with `xlfs volume start {name}`",
            spec.bricks.len(),
            spec.id
        )))
    }

    async fn start(&self, name: &str, force: bool) -> Result<Reply, MgmtError> {
        let mut v = self.get(name)?;
        let was_started = v.spec.status == VolumeStatus::Started;
        let before = v.spec.status;
        if was_started && !force {
            return Err(MgmtError::AlreadyStarted(name.to_string()));
        }
        client_volfile(&v.spec, &[])?;
        let mut failed = None;
        for job in self.jobs(&v.spec) {
            if let Err(e) = self.sup.start(job).await {
                failed = Some(e);
                break;
            }
        }
        if let Some(e) = failed {
            if !was_started {
                self.sup.stop_volume(name).await;
            }
            return Err(MgmtError::Start(Box::new(e)));
        }
        if !was_started {
            v.spec.status = VolumeStatus::Started;
            match self.store.put(&v.spec, Expect::Revision(v.revision)) {
                Ok(r) => v.revision = r,
                Err(e) => {
                    self.sup.stop_volume(name).await;
                    return Err(e.into());
                }
            }
        }
        // Bricks on other nodes start as their daemons see the change.
        if let Err(e) = self.wait_remote(&v, true).await {
            if !was_started {
                self.undo_start(name, before).await;
            }
            return Err(e);
        }
        let what = if was_started { "bricks that were down restarted" } else { "success" };
        Ok(done(format!("volume start: {name}: {what}")))
    }

    /// `volume add-brick`: whole replica sets appended to the volume; a
    /// started volume's new bricks are served before the spec changes, so
    /// mounts (which follow `getspec`) switch to a graph whose new sets
    /// are up. Refused with nothing changed on any error.
    async fn add_brick(
        &self,
        name: &str,
        replica: Option<usize>,
        bricks: &[String],
        force: bool,
    ) -> Result<Reply, MgmtError> {
        let v = self.get(name)?;
        let have = v.spec.replica;
        if replica.is_some_and(|r| r != have) {
            return Err(MgmtError::ReplicaChange { name: name.to_string(), have });
        }
        if bricks.is_empty() {
            return Err(MgmtError::NoBricks(name.to_string()));
        }
        if !bricks.len().is_multiple_of(have) {
            return Err(MgmtError::NotWholeSets { name: name.to_string(), bricks: bricks.len(), replica: have });
        }
        let parsed: Vec<BrickSpec> = bricks.iter().map(|b| BrickSpec::parse(b)).collect::<Result<_, _>>()?;
        let mut spec = v.spec.clone();
        spec.bricks.extend(parsed);
        client_volfile(&spec, &[])?;
        let id = Gfid::parse(&spec.id).unwrap_or_default();
        let added = self.prepare_bricks(&spec.bricks[v.spec.bricks.len()..], force, id).await?;
        spec.bricks.truncate(v.spec.bricks.len());
        spec.bricks.extend(added.iter().cloned());
        let started = spec.status == VolumeStatus::Started;
        if started {
            let new_jobs = self.jobs(&spec).into_iter().filter(|j| added.contains(&j.brick));
            for job in new_jobs {
                if let Err(e) = self.sup.start(job).await {
                    self.sup.stop_bricks(name, |b| added.contains(b)).await;
                    self.release_bricks(&added).await;
                    return Err(MgmtError::Start(Box::new(e)));
                }
            }
        }
        match self.store.put(&spec, Expect::Revision(v.revision)) {
            Ok(revision) if started => {
                // New bricks on other nodes start as their daemons see it.
                self.wait_remote(&Versioned { spec: spec.clone(), revision }, true).await?;
            }
            Ok(_) => {}
            Err(e) => {
                if started {
                    self.sup.stop_bricks(name, |b| added.contains(b)).await;
                }
                self.release_bricks(&added).await;
                return Err(e.into());
            }
        }
        let sets = spec.bricks.len() / have;
        Ok(done(format!(
            "volume add-brick: {name}: success: {} bricks added, {sets} replica sets of {have}; spread existing files with `xlfs volume rebalance {name} start`",
            added.len()
        )))
    }

    /// `volume rebalance NAME fix-layout|start|status|stop`.
    async fn rebalance(&self, name: &str, action: RebalanceAction) -> Result<Reply, MgmtError> {
        let current = self.rebalances.lock().get(name).cloned();
        match action {
            RebalanceAction::Status => {
                self.get(name)?;
                let status = current.map(|p| p.status()).unwrap_or_else(|| RebalanceStatus {
                    name: name.to_string(),
                    state: "not started".into(),
                    ..RebalanceStatus::default()
                });
                Ok(Reply::Rebalance { status })
            }
            RebalanceAction::Stop => {
                let p = current.filter(|p| p.running()).ok_or_else(|| MgmtError::NoRebalance(name.to_string()))?;
                p.request_stop();
                Ok(done(format!("volume rebalance: {name}: stopping after the file in progress")))
            }
            RebalanceAction::FixLayout | RebalanceAction::Start => {
                if current.is_some_and(|p| p.running()) {
                    return Err(MgmtError::RebalanceRunning(name.to_string()));
                }
                let kind = if action == RebalanceAction::Start {
                    rebalance::Kind::Rebalance
                } else {
                    rebalance::Kind::FixLayout
                };
                self.start_run(name, kind).await
            }
        }
    }

    /// Starts a rebalance run of `kind` in the background.
    async fn start_run(&self, name: &str, kind: rebalance::Kind) -> Result<Reply, MgmtError> {
        let v = self.get(name)?;
        if v.spec.bricks.len() <= v.spec.replica {
            return Err(MgmtError::NotDistributed(name.to_string()));
        }
        let (_, graph) = self.client_graph(name).await?;
        let up = graph.wait_up(GRAPH_WAIT).await;
        crate::cli::heal::wait_children(&graph, GRAPH_WAIT).await;
        let dht = graph.nodes_of_type(xlfs_xlators::cluster::distribute::TYPE.name).into_iter().next();
        let dht = match (dht, up) {
            (Some((dht, _)), Ok(())) => dht,
            (found, up) => {
                drop_graph(graph).await;
                return Err(match up {
                    Err(e) if found.is_some() => MgmtError::Graph { name: name.to_string(), why: e.to_string() },
                    _ => MgmtError::NotDistributed(name.to_string()),
                });
            }
        };
        let p = Progress::new(name, kind);
        let busy = {
            let mut runs = self.rebalances.lock();
            let busy = runs.get(name).is_some_and(|p| p.running());
            if !busy {
                runs.insert(name.to_string(), p.clone());
            }
            busy
        };
        if busy {
            drop_graph(graph).await;
            return Err(MgmtError::RebalanceRunning(name.to_string()));
        }
        let vol = name.to_string();
        tokio::spawn(async move {
            let r = rebalance::run(dht, kind, p.clone()).await;
            match &r {
                Ok(()) => tracing::info!(volume = %vol, status = ?p.status(), "rebalance ended"),
                Err(e) => tracing::error!(volume = %vol, "rebalance failed: {e}"),
            }
            p.finish(r);
            drop_graph(graph).await;
        });
        let what = match kind {
            rebalance::Kind::Rebalance => "rebalance",
            rebalance::Kind::FixLayout => "fix-layout",
            rebalance::Kind::RemoveBrick => "remove-brick",
        };
        Ok(done(format!("volume {what}: {name}: {what} started; see its status")))
    }

    /// `volume remove-brick NAME HOST:DIR... start|status|commit`.
    async fn remove_brick(&self, name: &str, bricks: &[String], action: RemoveAction) -> Result<Reply, MgmtError> {
        let mut v = self.get(name)?;
        let bad = |why: String| MgmtError::BadRemove { name: name.to_string(), why };
        let mut given = Vec::new();
        for raw in bricks {
            let b = BrickSpec::parse(raw)?.canonical();
            if !v.spec.bricks.contains(&b) {
                return Err(MgmtError::NotInVolume { name: name.to_string(), brick: raw.clone() });
            }
            given.push(b);
        }
        let r = v.spec.replica.max(1);
        let sets: std::collections::BTreeSet<usize> =
            v.spec.bricks.iter().enumerate().filter(|(_, b)| given.contains(b)).map(|(i, _)| i / r).collect();
        let leaving: Vec<BrickSpec> =
            v.spec.bricks.iter().enumerate().filter(|(i, _)| sets.contains(&(i / r))).map(|(_, b)| b.clone()).collect();
        if given.is_empty() || leaving.iter().any(|b| !given.contains(b)) {
            return Err(bad(format!("give every brick of each replica set to remove (sets of {r})")));
        }
        let running = self.rebalances.lock().get(name).is_some_and(|p| p.running());
        match action {
            RemoveAction::Start => {
                if sets.len() * r >= v.spec.bricks.len() {
                    return Err(bad("cannot remove every replica set".into()));
                }
                if v.spec.status != VolumeStatus::Started {
                    return Err(MgmtError::NotStarted(name.to_string()));
                }
                if running {
                    return Err(MgmtError::RebalanceRunning(name.to_string()));
                }
                if !v.spec.removing.is_empty() && v.spec.removing != leaving {
                    return Err(bad("another remove-brick is under way; commit it first".into()));
                }
                if v.spec.removing != leaving {
                    v.spec.removing = leaving;
                    self.store.put(&v.spec, Expect::Revision(v.revision))?;
                }
                self.start_run(name, rebalance::Kind::RemoveBrick).await
            }
            RemoveAction::Status => self.rebalance(name, RebalanceAction::Status).await,
            RemoveAction::Commit => {
                if v.spec.removing != leaving {
                    return Err(bad("these bricks are not being removed; run `start` first".into()));
                }
                if running {
                    return Err(MgmtError::RebalanceRunning(name.to_string()));
                }
                for b in &leaving {
                    let (count, example) = self.files_on(b).await?;
                    if count > 0 {
                        return Err(MgmtError::FilesLeft { name: name.to_string(), brick: b.clone(), count, example });
                    }
                }
                v.spec.bricks.retain(|b| !leaving.contains(b));
                v.spec.removing.clear();
                self.store.put(&v.spec, Expect::Revision(v.revision))?;
                self.sup.stop_bricks(name, |b| leaving.contains(b)).await;
                self.release_bricks(&leaving).await;
                Ok(done(format!(
                    "volume remove-brick: {name}: commit: {} bricks removed (their directories keep directories and stale link files only)",
                    leaving.len()
                )))
            }
        }
    }

    async fn stop(&self, name: &str) -> Result<Reply, MgmtError> {
        let mut v = self.get(name)?;
        if v.spec.status != VolumeStatus::Started {
            return Err(MgmtError::NotStarted(name.to_string()));
        }
        v.spec.status = VolumeStatus::Stopped;
        v.revision = self.store.put(&v.spec, Expect::Revision(v.revision))?;
        self.sup.stop_volume(name).await;
        self.wait_remote(&v, false).await?;
        Ok(done(format!("volume stop: {name}: success")))
    }

    async fn delete(&self, name: &str) -> Result<Reply, MgmtError> {
        let v = self.get(name)?;
        if v.spec.status == VolumeStatus::Started {
            return Err(MgmtError::DeleteStarted(name.to_string()));
        }
        self.store.delete(name, v.revision)?;
        self.release_bricks(&v.spec.bricks).await;
        Ok(done(format!(
            "volume delete: {name}: success (the data stays in the brick directories; their {VOLUME_ID_XATTR} mark is removed)"
        )))
    }
}

/// Shuts a graph from [`Daemon::client_graph`] down, off the runtime's
/// threads.
async fn drop_graph(graph: Arc<Graph>) {
    let _ = tokio::task::spawn_blocking(move || graph.shutdown()).await;
}

/// Replicate's heal info text (`CLIENT: up, N entries to heal`, then
/// indented gfid lines; `CLIENT: down`), per brick.
fn heal_info(text: &str, clients: &[String], bricks: &[BrickSpec]) -> Vec<BrickHeal> {
    let mut out: Vec<BrickHeal> = Vec::new();
    for line in text.lines() {
        if let Some(detail) = line.strip_prefix("  ") {
            if let Some(b) = out.last_mut() {
                b.detail.push(detail.to_string());
            }
            continue;
        }
        let Some((client, state)) = line.split_once(": ") else { continue };
        let brick = clients
            .iter()
            .position(|c| c == client)
            .and_then(|i| bricks.get(i))
            .map_or_else(|| client.to_string(), |b| b.to_string());
        let up = state.starts_with("up");
        let entries = state
            .strip_prefix("up, ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        out.push(BrickHeal { brick, up, entries, detail: Vec::new() });
    }
    out
}

fn done(message: String) -> Reply {
    Reply::Done { message }
}

/// The daemon's state directory layout.
pub struct StateDir(pub PathBuf);

impl StateDir {
    /// Where volume specs are stored.
    pub fn volumes(&self) -> PathBuf {
        self.0.join("volumes")
    }
    /// Where the self-heal daemons' volfiles go.
    pub fn shd(&self) -> PathBuf {
        self.0.join("shd")
    }
    /// Where brick logs go.
    pub fn logs(&self) -> PathBuf {
        self.0.join("logs")
    }
}
