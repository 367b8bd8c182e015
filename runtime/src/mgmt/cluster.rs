//! Several nodes, one cluster: what a daemon does with the other nodes'
//! daemons when they share a store ([`super::store::etcd::EtcdStore`]).
//!
//! - **Peers** (`xlfs peer add|remove|list`): a node joins when a member
//!   adds it; the member asks the node's daemon who it is (`Hello`: its
//!   `--node` name and the id of the store it uses) and refuses a daemon
//!   that uses another store. Bricks may be on this node or on peers only.
//! - **Bricks on other nodes**: create and add-brick ask each brick's node
//!   to check and mark its bricks (`PrepareBricks`), as GlusterFS's glusterd
//!   stages a volume create on every peer; a refusal anywhere undoes the
//!   marks made elsewhere (`ReleaseBricks`). remove-brick commit asks the
//!   node how many files a brick still holds (`BrickFiles`).
//! - **Reconciling** ([`Daemon::run_cluster`]): each daemon follows the
//!   store (its watch, and every few seconds) and serves its own bricks of
//!   every started volume, stops them when the volume stops, goes or drops
//!   them, and publishes each brick's [`BrickState`] (port, pid, disk free,
//!   start error, and the spec revision it acted on). Volfiles name the
//!   ports published, so a client mounted from any node reaches every
//!   brick; start and stop on one node wait until the other nodes report
//!   their bricks up or down (bounded).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use xlfs_sdk::Gfid;

use super::bricks;
use super::daemon::{Daemon, MgmtError};
use super::protocol::{PeerStatus, Reply, Request, call};
use super::spec::{BrickSpec, VolumeSpec, VolumeStatus};
use super::store::{BrickState, Expect, Peer, StoreError, Versioned};
use super::supervisor::disk_free;

/// How long start and stop wait for the other nodes' bricks.
const REMOTE_WAIT: Duration = Duration::from_secs(60);
/// How often a daemon looks at the store without being told of a change.
const RECONCILE_EVERY: Duration = Duration::from_secs(2);
/// A brick state is published again at least this often (disk free).
const REPUBLISH: Duration = Duration::from_secs(30);
/// A brick that failed to start is tried again after this long.
const RETRY_START: Duration = Duration::from_secs(30);
/// How long `peer list` waits for each peer's daemon.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// What a daemon last published of its bricks, and which failed to start.
#[derive(Default)]
pub(crate) struct Published {
    last: BTreeMap<(String, BrickSpec), (BrickState, Instant)>,
    failed: BTreeMap<(String, BrickSpec), (Instant, String)>,
}

impl Daemon {
    /// Follows the store and reconciles this node's bricks with it (see
    /// the module documentation), until the future is dropped.
    pub async fn run_cluster(self: std::sync::Arc<Self>) {
        let mut changes = self.store.changes();
        let mut seen = BTreeMap::new();
        let mut failing = false;
        loop {
            let r = {
                let _one = self.changes.lock().await;
                self.reconcile(&mut seen).await
            };
            // The store or a brick here changed (or time passed): volfiles
            // waited on are looked at again.
            self.volfiles.notify_waiters();
            match r {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    tracing::warn!("following the cluster store: {e}; bricks keep serving, retrying");
                    failing = true;
                }
                Err(_) => {}
            }
            // Another daemon changed the store, a brick here started or
            // exited (its state is published at once), or time passed.
            let store_changed = async {
                match changes.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ok = store_changed => if !ok { changes = None },
                () = self.sup.changed() => {}
                () = tokio::time::sleep(RECONCILE_EVERY) => {}
            }
        }
    }

    /// One pass: `seen` holds the revision of each volume last acted on.
    async fn reconcile(&self, seen: &mut BTreeMap<String, u64>) -> Result<(), StoreError> {
        let list = self.store.list()?;
        let names: BTreeSet<&str> = list.iter().map(|v| v.spec.name.as_str()).collect();
        for vol in self.sup.volumes() {
            if !names.contains(vol.as_str()) {
                tracing::info!(volume = %vol, "the volume is gone from the cluster store: stopping its bricks here");
                self.sup.stop_volume(&vol).await;
            }
        }
        for v in &list {
            let name = &v.spec.name;
            let changed = seen.get(name) != Some(&v.revision);
            self.sup.stop_bricks(name, |b| !v.spec.bricks.contains(b)).await;
            let mine = v.spec.bricks.iter().any(|b| self.is_mine(&b.host));
            // Only bricks of this node not served yet need jobs (whose
            // port hints the store is asked for): most passes have none.
            let unserved = |b: &BrickSpec| self.is_mine(&b.host) && self.sup.state(name, b).is_none();
            if v.spec.status == VolumeStatus::Started && v.spec.bricks.iter().any(unserved) {
                for job in self.jobs(&v.spec).into_iter().filter(|j| unserved(&j.brick)) {
                    let key = (name.clone(), job.brick.clone());
                    let retry = self.published.lock().failed.get(&key).is_none_or(|(t, _)| t.elapsed() >= RETRY_START);
                    if !(changed || retry) {
                        continue;
                    }
                    match self.sup.start(job).await {
                        Ok(()) => {
                            self.published.lock().failed.remove(&key);
                        }
                        Err(e) => {
                            tracing::error!("{e}");
                            self.published.lock().failed.insert(key, (Instant::now(), e.to_string()));
                        }
                    }
                }
            } else if v.spec.status != VolumeStatus::Started && changed && mine {
                self.sup.stop_volume(name).await;
                self.published.lock().failed.retain(|(vol, _), _| vol != name);
            }
            seen.insert(name.clone(), v.revision);
            self.publish_mine(v)?;
        }
        seen.retain(|n, _| names.contains(n.as_str()));
        Ok(())
    }

    /// Publishes the state of this node's bricks of `v` when it changed
    /// (or is old).
    pub(super) fn publish_mine(&self, v: &Versioned) -> Result<(), StoreError> {
        for b in v.spec.bricks.iter().filter(|b| self.is_mine(&b.host)) {
            let mut st = self.local_state(&v.spec, b);
            st.seen = v.revision;
            let key = (v.spec.name.clone(), b.clone());
            let fresh = {
                let p = self.published.lock();
                p.last.get(&key).is_some_and(|(old, at)| {
                    at.elapsed() < REPUBLISH && BrickState { disk_free: st.disk_free, ..old.clone() } == st
                })
            };
            if !fresh {
                self.store.publish(&v.spec.name, b, Some(&st))?;
                self.published.lock().last.insert(key, (st, Instant::now()));
            }
        }
        Ok(())
    }

    /// A brick of this node, from its supervisor (a brick not supervised
    /// keeps the port it last had).
    fn local_state(&self, spec: &VolumeSpec, b: &BrickSpec) -> BrickState {
        let run = self.sup.state(&spec.name, b).unwrap_or_default();
        let key = (spec.name.clone(), b.clone());
        let (error, last_port) = {
            let p = self.published.lock();
            (p.failed.get(&key).map(|(_, e)| e.clone()), p.last.get(&key).and_then(|(s, _)| s.port))
        };
        BrickState {
            port: run.port.or(last_port),
            pid: run.pid,
            restarts: run.restarts,
            disk_free: disk_free(&b.dir),
            error: if run.pid.is_some() { None } else { error },
            seen: 0,
        }
    }

    /// What the other nodes published of `spec`'s bricks (none asked for
    /// when every brick is this node's).
    pub(super) fn remote_states(&self, spec: &VolumeSpec) -> BTreeMap<BrickSpec, BrickState> {
        if spec.bricks.iter().all(|b| self.is_mine(&b.host)) {
            return BTreeMap::new();
        }
        self.store.brick_states(&spec.name).unwrap_or_else(|e| {
            tracing::warn!(volume = %spec.name, "brick states of other nodes: {e}");
            BTreeMap::new()
        })
    }

    /// Brick `b` of `spec`: from this node's supervisor, or as its node
    /// published it (`remote`, from [`Daemon::remote_states`]).
    pub(super) fn brick_state(
        &self,
        spec: &VolumeSpec,
        b: &BrickSpec,
        remote: &BTreeMap<BrickSpec, BrickState>,
    ) -> BrickState {
        if self.is_mine(&b.host) { self.local_state(spec, b) } else { remote.get(b).cloned().unwrap_or_default() }
    }

    /// The port of each brick of `spec`, where known.
    pub(super) fn brick_ports(&self, spec: &VolumeSpec) -> Vec<Option<u16>> {
        let remote = self.remote_states(spec);
        spec.bricks
            .iter()
            .map(|b| match self.is_mine(&b.host) {
                true => self.sup.state(&spec.name, b).and_then(|s| s.port),
                false => remote.get(b).and_then(|s| s.port),
            })
            .collect()
    }

    /// Waits until every brick of `v` on another node is reported up
    /// (`up`) or down by its daemon, for the revision `v` or later.
    pub(super) async fn wait_remote(&self, v: &Versioned, up: bool) -> Result<(), MgmtError> {
        let remote: Vec<&BrickSpec> = v.spec.bricks.iter().filter(|b| !self.is_mine(&b.host)).collect();
        if remote.is_empty() {
            return Ok(());
        }
        let name = &v.spec.name;
        let deadline = Instant::now() + REMOTE_WAIT;
        loop {
            let states = self.store.brick_states(name)?;
            let mut waiting = None;
            for b in &remote {
                let st = states.get(*b).filter(|s| s.seen >= v.revision);
                match st {
                    Some(s) if up && s.pid.is_some() && s.port.is_some() => {}
                    Some(s) if !up && s.pid.is_none() => {}
                    Some(BrickState { error: Some(why), .. }) if up => {
                        return Err(MgmtError::Remote { name: name.clone(), brick: (*b).clone(), why: why.clone() });
                    }
                    _ => waiting = Some(*b),
                }
            }
            let Some(b) = waiting else { return Ok(()) };
            if Instant::now() >= deadline {
                let why = format!(
                    "its node's daemon ({}) did not report it {} within {REMOTE_WAIT:?}; see that node's log",
                    b.host,
                    if up { "serving" } else { "stopped" }
                );
                return Err(MgmtError::Remote { name: name.clone(), brick: b.clone(), why });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Puts a volume whose start failed back to stopped; the other nodes
    /// stop their bricks as they see it.
    pub(super) async fn undo_start(&self, name: &str, status: VolumeStatus) {
        if let Ok(Some(mut v)) = self.store.get(name) {
            v.spec.status = status;
            if let Err(e) = self.store.put(&v.spec, Expect::Revision(v.revision)) {
                tracing::error!(volume = name, "putting a volume whose start failed back to {status}: {e}");
            }
        }
        self.sup.stop_volume(name).await;
    }

    /// The address of `node`'s daemon.
    fn peer_address(&self, node: &str) -> Result<Option<String>, MgmtError> {
        Ok(self.store.peers()?.into_iter().find(|p| p.node == node).map(|p| p.address))
    }

    /// Sends `req` to `node`'s daemon.
    async fn ask(&self, node: &str, req: &Request) -> Result<Reply, MgmtError> {
        let addr = self
            .peer_address(node)?
            .ok_or_else(|| MgmtError::Peer { node: node.to_string(), why: "not a peer of this cluster".into() })?;
        call(&addr, req).await.map_err(|e| MgmtError::Peer { node: node.to_string(), why: e.to_string() })
    }

    /// Checks and marks `bricks` with volume `id` on their nodes (this
    /// one's here, the others' by asking them): all or none. Returns them
    /// in order, their directories canonical.
    pub(super) async fn prepare_bricks(
        &self,
        bricks: &[BrickSpec],
        force: bool,
        id: Gfid,
    ) -> Result<Vec<BrickSpec>, MgmtError> {
        for (i, b) in bricks.iter().enumerate() {
            if bricks[..i].contains(b) {
                return Err(MgmtError::Duplicate(b.clone()));
            }
        }
        let mut hosts: Vec<&str> = Vec::new();
        for b in bricks {
            if !hosts.contains(&b.host.as_str()) {
                hosts.push(&b.host);
            }
        }
        let peers = self.store.peers()?;
        for b in bricks {
            if !self.is_mine(&b.host) && !peers.iter().any(|p| p.node == b.host) {
                return Err(MgmtError::NotPeer(b.clone()));
            }
        }
        let known = self.store.list()?;
        let mut out: Vec<Option<BrickSpec>> = vec![None; bricks.len()];
        let mut prepared: Vec<BrickSpec> = Vec::new();
        for host in hosts {
            let (idx, group): (Vec<usize>, Vec<BrickSpec>) =
                bricks.iter().enumerate().filter(|(_, b)| b.host == host).map(|(i, b)| (i, b.clone())).unzip();
            let r = if self.is_mine(host) {
                bricks::prepare(&group, force, &known, &|h| self.is_mine(h), id)
            } else {
                let req = Request::PrepareBricks {
                    bricks: group.iter().map(ToString::to_string).collect(),
                    force,
                    id: id.to_string(),
                };
                match self.ask(host, &req).await {
                    Ok(Reply::Bricks { bricks }) if bricks.len() == group.len() => {
                        bricks.iter().map(|b| BrickSpec::parse(b).map_err(MgmtError::from)).collect()
                    }
                    Ok(other) => {
                        Err(MgmtError::Peer { node: host.to_string(), why: format!("unexpected answer {other:?}") })
                    }
                    Err(e) => Err(e),
                }
            };
            match r {
                Ok(list) => {
                    for (i, b) in idx.into_iter().zip(list) {
                        prepared.push(b.clone());
                        out[i] = Some(b);
                    }
                }
                Err(e) => {
                    self.release_bricks(&prepared).await;
                    return Err(e);
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Removes the volume-id mark from `bricks`, on their nodes; a node
    /// that cannot be asked is logged (its mark stays: `force` is then
    /// needed to use the directory again, as GlusterFS).
    pub(super) async fn release_bricks(&self, bricks: &[BrickSpec]) {
        let (mine, others): (Vec<&BrickSpec>, Vec<&BrickSpec>) = bricks.iter().partition(|b| self.is_mine(&b.host));
        bricks::unmark(&mine);
        let mut hosts: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for b in others {
            hosts.entry(&b.host).or_default().push(b.to_string());
        }
        for (host, bricks) in hosts {
            if let Err(e) = self.ask(host, &Request::ReleaseBricks { bricks: bricks.clone() }).await {
                tracing::warn!(?bricks, "removing the volume-id mark: {e}");
            }
        }
    }

    /// Data files left on brick `b` (remove-brick commit), asking its node.
    pub(super) async fn files_on(&self, b: &BrickSpec) -> Result<(u64, String), MgmtError> {
        if self.is_mine(&b.host) {
            return Ok(bricks::data_files(&b.dir));
        }
        match self.ask(&b.host, &Request::BrickFiles { brick: b.to_string() }).await? {
            Reply::Files { count, example } => Ok((count, example)),
            other => Err(MgmtError::Peer { node: b.host.clone(), why: format!("unexpected answer {other:?}") }),
        }
    }

    /// Parses bricks another daemon asks about; each must be this node's.
    fn mine_asked(&self, bricks: &[String]) -> Result<Vec<BrickSpec>, MgmtError> {
        let mut out = Vec::new();
        for raw in bricks {
            let b = BrickSpec::parse(raw)?;
            if !self.is_mine(&b.host) {
                let me = self.me.as_ref().map_or("this machine", |p| p.node.as_str());
                return Err(MgmtError::Peer { node: b.host.clone(), why: format!("brick {b} is not on {me}") });
            }
            out.push(b);
        }
        Ok(out)
    }

    /// `PrepareBricks` from another node's daemon.
    pub(super) fn prepare_asked(&self, bricks: &[String], force: bool, id: &str) -> Result<Reply, MgmtError> {
        let list = self.mine_asked(bricks)?;
        let id = Gfid::parse(id)
            .ok_or_else(|| MgmtError::Peer { node: "?".into(), why: format!("bad volume id {id:?}") })?;
        let known = self.store.list()?;
        let done = bricks::prepare(&list, force, &known, &|h| self.is_mine(h), id)?;
        Ok(Reply::Bricks { bricks: done.iter().map(ToString::to_string).collect() })
    }

    /// `ReleaseBricks` from another node's daemon.
    pub(super) fn release_asked(&self, bricks: &[String]) -> Result<Reply, MgmtError> {
        let list = self.mine_asked(bricks)?;
        bricks::unmark(&list.iter().collect::<Vec<_>>());
        Ok(Reply::Done { message: format!("{} bricks unmarked", list.len()) })
    }

    /// `BrickFiles` from another node's daemon.
    pub(super) fn files_asked(&self, brick: &str) -> Result<Reply, MgmtError> {
        let b = self.mine_asked(&[brick.to_string()])?.remove(0);
        let (count, example) = bricks::data_files(&b.dir);
        Ok(Reply::Files { count, example })
    }

    /// `peer add ADDRESS`.
    pub(super) async fn peer_add(&self, address: &str) -> Result<Reply, MgmtError> {
        let bad = |why: String| MgmtError::BadPeer { address: address.to_string(), why };
        let Some(me) = &self.me else {
            return Err(bad(
                "this daemon has no node name: start every node's daemon with --node NAME (the host its bricks are named by) and --store etcd://HOST:PORT".into(),
            ));
        };
        if self.store.changes().is_none() {
            return Err(StoreError::NoPeers(self.store.describe()).into());
        }
        let (node, cluster) = match call(address, &Request::Hello).await {
            Ok(Reply::Hello { node, cluster }) => (node, cluster),
            Ok(other) => return Err(bad(format!("unexpected answer {other:?}"))),
            Err(e) => return Err(bad(e.to_string())),
        };
        let node = node.ok_or_else(|| bad("the daemon there has no node name (start it with --node NAME)".into()))?;
        let ours = self.store.cluster();
        if cluster != ours {
            return Err(bad(format!("the daemon there uses another cluster store ({cluster}; this node's: {ours})")));
        }
        if node == me.node {
            return Err(bad(format!("that is this node ({node})")));
        }
        self.store.put_peer(me)?;
        self.store.put_peer(&Peer { node: node.clone(), address: address.to_string() })?;
        Ok(Reply::Done { message: format!("peer add: {node} ({address}): success") })
    }

    /// `peer remove NODE`.
    pub(super) fn peer_remove(&self, node: &str) -> Result<Reply, MgmtError> {
        let fail = |why: &str| MgmtError::Peer { node: node.to_string(), why: why.to_string() };
        if self.me.as_ref().is_some_and(|p| p.node == node) {
            return Err(fail("that is this node: remove it from another node"));
        }
        if self.peer_address(node)?.is_none() {
            return Err(fail("not a peer of this cluster"));
        }
        for v in self.store.list()? {
            if let Some(b) = v.spec.bricks.iter().find(|b| b.host == node) {
                return Err(MgmtError::PeerInUse { node: node.to_string(), brick: b.clone(), volume: v.spec.name });
            }
        }
        self.store.remove_peer(node)?;
        Ok(Reply::Done { message: format!("peer remove: {node}: success") })
    }

    /// `peer list`: every node, each asked whether it answers.
    pub(super) async fn peer_list(&self) -> Result<Reply, MgmtError> {
        let mut peers = self.store.peers()?;
        if let Some(me) = &self.me
            && !peers.iter().any(|p| p.node == me.node)
        {
            peers.insert(0, me.clone());
        }
        let mut out = Vec::new();
        for p in peers {
            let this = self.me.as_ref().is_some_and(|m| m.node == p.node);
            let connected = this
                || matches!(tokio::time::timeout(HELLO_TIMEOUT, call(&p.address, &Request::Hello)).await, Ok(Ok(_)));
            out.push(PeerStatus { node: p.node, address: p.address, connected, this });
        }
        Ok(Reply::Peers { peers: out })
    }
}
