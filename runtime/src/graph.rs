//! The translator graph: checks a [`Volfile`] against a [`Registry`]
//! ([`GraphSpec::validate`]: types, subvolumes, cycles, a single top, child
//! counts, options), then builds one translator per volume, children first
//! ([`Graph::build`]), and links their event sinks so that events travel from
//! the leaves up to the top.
//!
//! Life cycle: [`Graph::activate`] sends `ParentUp` to every node; the leaves
//! answer `ChildUp`, which climbs to the top; [`Graph::wait_up`] waits for it.
//! [`Graph::shutdown`] (or dropping the graph) sends `ParentDown` and calls
//! every node's `fini` once.
//!
//! Live changes (a mounted client's `xlfs reload`): [`GraphSpec::diff`] says
//! whether a newly validated spec differs from the running one only in
//! option values (same volumes in the same order, same types, subvolumes and
//! module file contents) or in structure; [`Graph::reconfigure`] applies an
//! options-only change to the running translators, all or nothing. A
//! structural change needs a new graph built beside the old one (see
//! [`crate::reload`]). [`live_graphs`] counts the graphs not yet dropped, so
//! a switch can show that the old ones are freed.
//!
//! The spec half (checking and diffing, with the errors that name a volfile
//! line) is in `spec`, re-exported here; this file holds the live graph.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, watch};
use xlfs_sdk::options::{OptValue, OptionError};
use xlfs_sdk::profile::GraphProfile;
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{Child, Event, EventFrom, EventSink, InitCtx, InitError, Options, Upcall, Xlator, XlatorType};

use crate::profile::{NodeStats, Profiler, Timed};
use crate::registry::Registry;
use crate::volfile::{Volfile, VolfileError};

mod spec;

pub use spec::*;

/// The state of the graph's top as its events say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopState {
    /// Not up yet, or a `ChildDown` reached the top.
    Down,
    /// A `ChildUp` reached the top.
    Up,
}

/// The graph's top did not come up in time.
#[derive(Debug, thiserror::Error)]
#[error("graph top '{top}' did not report ChildUp within {timeout:?}")]
pub struct NotUp {
    /// The top volume.
    pub top: String,
    /// How long was waited.
    pub timeout: Duration,
}

/// Why [`Graph::reconfigure`] did not apply a spec; the running graph is
/// as it was.
#[derive(Debug, thiserror::Error)]
pub enum ReconfigureFailure {
    /// The spec differs in more than option values.
    #[error("not an options-only change: {0}")]
    Structure(String),
    /// A translator cannot change its options while running (a new graph
    /// is needed).
    #[error("{change}: this translator cannot change options while running")]
    Unsupported {
        /// What was to change.
        change: OptionChange,
    },
    /// A translator refused the new values.
    #[error("{change}: refused: {message}")]
    Refused {
        /// What was to change.
        change: OptionChange,
        /// The translator's reason.
        message: String,
    },
}

/// A built node.
struct Node {
    xl: Arc<dyn Xlator>,
    /// `xl` as its parents and callers see it: timed ([`crate::profile`]).
    timed: Arc<dyn Xlator>,
    sink: EventSink,
}

/// A built graph of translators.
pub struct Graph {
    /// Replaced (same structure, new option values) by a reconfigure.
    spec: RwLock<Arc<GraphSpec>>,
    /// Indexed like `spec.nodes`.
    nodes: Arc<[Node]>,
    built_at: SystemTime,
    state: watch::Receiver<TopState>,
    upcalls: broadcast::Sender<Upcall>,
    shut: AtomicBool,
    profiler: Arc<Profiler>,
}

/// How many upcalls a slow [`Graph::upcalls`] receiver may fall behind
/// before it is told it lost some.
const UPCALL_QUEUE: usize = 1024;

/// Graphs built and not yet dropped, in this process.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// How many graphs are built and not yet dropped in this process (a graph
/// switch frees the old one once drained: this shows it).
pub fn live_graphs() -> usize {
    LIVE.load(Ordering::Acquire)
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let spec = self.spec();
        f.debug_struct("Graph").field("origin", &spec.origin).field("top", &spec.top_name()).finish()
    }
}

/// Sends a graph event to `nodes` in `order`; what a node's `notify`
/// returns goes on to its parents.
/// [`Graph::drain`] through the node `top`. The answer from the bottom of
/// the graph (usually ENOSYS) says nothing: operations that failed while
/// delayed are reported by the translators that delayed them.
pub async fn drain(top: &Child, timeout: Duration) -> bool {
    let req = xlfs_sdk::Request::new(xlfs_sdk::Fop::Ipc { op: xlfs_sdk::IPC_DRAIN });
    tokio::time::timeout(timeout, top.call(xlfs_sdk::CallCtx::root("xlfs-drain"), req)).await.is_ok()
}

fn broadcast_to(nodes: &[Node], order: &[usize], event: &Event) {
    for &i in order {
        let n = &nodes[i];
        if let Some(up) = n.xl.notify(event.clone(), EventFrom::Graph) {
            n.sink.send(up);
        }
    }
}

impl Graph {
    /// Validates `volfile` against `registry` and builds it.
    pub fn build(volfile: &Volfile, registry: &Registry) -> Result<Graph, GraphError> {
        Graph::from_spec(GraphSpec::validate(volfile, registry)?)
    }

    /// Parses volfile text (`origin` names it in errors) and builds it.
    pub fn from_str(text: &str, origin: &str, registry: &Registry) -> Result<Graph, LoadError> {
        Ok(Graph::build(&Volfile::parse(text, origin)?, registry)?)
    }

    /// Reads the volfile at `path` and builds it.
    pub fn load(path: impl AsRef<std::path::Path>, registry: &Registry) -> Result<Graph, LoadError> {
        Ok(Graph::build(&Volfile::load(path)?, registry)?)
    }

    /// Builds a validated graph: each translator's constructor runs after
    /// its children's, with its name, options, children and a fresh event
    /// sink; then every child's sink is linked to its parents. If a
    /// constructor fails, the nodes already built are finalized (`fini`) and
    /// the error names the volume and type.
    pub fn from_spec(spec: GraphSpec) -> Result<Graph, GraphError> {
        let mut built: Vec<Option<Node>> = (0..spec.nodes.len()).map(|_| None).collect();
        let stats: Vec<Arc<NodeStats>> = spec.nodes.iter().map(|_| Arc::new(NodeStats::default())).collect();
        // Where fops enter from outside: the top, or a brick server's
        // children (protocol/server calls them with the peers' fops).
        let top = &spec.nodes[spec.top];
        let entry = |i: usize| i == spec.top || (top.ty.name == "protocol/server" && top.children.contains(&i));
        for (done, &i) in spec.order.iter().enumerate() {
            let s = &spec.nodes[i];
            let children = s
                .children
                .iter()
                .map(|&c| Child {
                    name: spec.nodes[c].name.clone(),
                    xl: built[c].as_ref().map(|n| n.timed.clone()).expect("children are built before their parents"),
                })
                .collect();
            let sink = EventSink::new();
            let ctx = InitCtx {
                name: s.name.to_string(),
                options: s.options.clone(),
                children,
                events: sink.clone(),
                policies: spec.policies.clone(),
            };
            match (s.ty.build)(ctx) {
                Ok(xl) => {
                    let timed = Arc::new(Timed::new(xl.clone(), stats[i].clone(), s.children.is_empty(), entry(i)));
                    built[i] = Some(Node { xl, timed, sink });
                }
                Err(source) => {
                    for &j in spec.order[..done].iter().rev() {
                        if let Some(n) = &built[j] {
                            n.xl.fini();
                        }
                    }
                    return Err(GraphError {
                        file: spec.origin.clone(),
                        line: s.line,
                        kind: Box::new(GraphErrorKind::Init {
                            volume: s.name.to_string(),
                            type_name: s.ty.name.to_string(),
                            source,
                        }),
                    });
                }
            }
        }
        let nodes: Arc<[Node]> =
            built.into_iter().map(|n| n.expect("every node reachable from the top is built")).collect();
        let top_down: Arc<[usize]> = spec.order.iter().rev().copied().collect();
        let meta: Arc<[(String, String)]> =
            spec.nodes.iter().map(|s| (s.name.to_string(), s.ty.name.to_string())).collect();
        let profiler = Arc::new(Profiler::new(
            spec.top_name().to_string(),
            spec.nodes
                .iter()
                .map(|s| {
                    (
                        s.name.to_string(),
                        s.ty.name.to_string(),
                        s.children.iter().map(|&c| spec.nodes[c].name.to_string()).collect(),
                    )
                })
                .collect(),
            stats,
            top_down.to_vec(),
        ));
        for n in nodes.iter() {
            let (weak, order) = (Arc::downgrade(&nodes), top_down.clone());
            n.sink.set_broadcast(move |ev| {
                if let Some(nodes) = weak.upgrade() {
                    broadcast_to(&nodes, &order, ev);
                }
            });
            let p = profiler.clone();
            n.sink.set_profile(move |reset| p.snapshot(reset));
            let (weak, order, meta) = (Arc::downgrade(&nodes), top_down.clone(), meta.clone());
            n.sink.set_dump(move || {
                let Some(nodes) = weak.upgrade() else { return Vec::new() };
                let mut out = Vec::new();
                for &i in order.iter() {
                    let (name, ty) = &meta[i];
                    out.push((format!("{name}.type"), ty.clone()));
                    out.extend(nodes[i].xl.dump().into_iter().map(|(k, v)| (format!("{name}.{k}"), v)));
                }
                out
            });
        }

        for (p, s) in spec.nodes.iter().enumerate() {
            for (k, &c) in s.children.iter().enumerate() {
                nodes[c].sink.attach_parent(Arc::downgrade(&nodes[p].xl), k, nodes[p].sink.clone());
            }
        }
        let (tx, state) = watch::channel(TopState::Down);
        let (upcalls, _) = broadcast::channel(UPCALL_QUEUE);
        let up_tx = upcalls.clone();
        nodes[spec.top].sink.set_hook(move |ev| match ev {
            Event::ChildUp => {
                tx.send_replace(TopState::Up);
            }
            Event::ChildDown => {
                tx.send_replace(TopState::Down);
            }
            Event::Upcall(u) => {
                let _ = up_tx.send(u.clone());
            }
            _ => {}
        });
        tracing::debug!(origin = %spec.origin, top = %spec.top_name(), nodes = nodes.len(), "graph built");
        LIVE.fetch_add(1, Ordering::AcqRel);
        Ok(Graph {
            spec: RwLock::new(Arc::new(spec)),
            nodes,
            built_at: SystemTime::now(),
            state,
            upcalls,
            shut: AtomicBool::new(false),
            profiler,
        })
    }

    /// Applies `new`'s option values to the running translators when they
    /// are all that differs ([`GraphSpec::diff`]): each changed volume's
    /// translator gets [`Xlator::reconfigure`] with its new options, in
    /// file order. All or nothing: if one refuses (or cannot), the ones
    /// already changed get their old options back and the error names the
    /// volume, options and values. On success the graph's spec is `new`
    /// (so [`Graph::describe`] shows the new values) and the changes are
    /// returned (empty when nothing changed).
    pub fn reconfigure(&self, new: GraphSpec) -> Result<Vec<OptionChange>, ReconfigureFailure> {
        let old = self.spec();
        let changes = match old.diff(&new) {
            GraphDiff::Same => return Ok(Vec::new()),
            GraphDiff::Structure(why) => return Err(ReconfigureFailure::Structure(why)),
            GraphDiff::Options(c) => c,
        };
        let index = |name: &str| old.nodes.iter().position(|n| &*n.name == name);
        let mut done: Vec<usize> = Vec::new();
        for change in &changes {
            let Some(i) = index(&change.volume) else { continue };
            if let Err(e) = self.nodes[i].xl.reconfigure(&new.nodes[i].options) {
                for &j in done.iter().rev() {
                    if let Err(back) = self.nodes[j].xl.reconfigure(&old.nodes[j].options) {
                        tracing::error!(volume = %old.nodes[j].name, error = %back, "restoring the old options failed");
                    }
                }
                let change = change.clone();
                return Err(match e {
                    ReconfigureError::Unsupported => ReconfigureFailure::Unsupported { change },
                    ReconfigureError::Invalid(message) => ReconfigureFailure::Refused { change, message },
                });
            }
            done.push(i);
        }
        for c in &changes {
            tracing::info!(origin = %new.origin, "reconfigured {c}");
        }
        *self.spec.write() = Arc::new(new);
        Ok(changes)
    }

    /// Node indexes from the top down (parents before children).
    fn top_down(&self) -> Vec<&Node> {
        self.spec().order.iter().rev().map(|&i| &self.nodes[i]).collect()
    }

    /// Sends `ParentUp` to every node, top first; leaves answer `ChildUp`,
    /// which climbs to the top (see [`Graph::wait_up`]).
    pub fn activate(&self) {
        self.broadcast(Event::ParentUp);
    }

    /// Waits until a `ChildUp` has reached the top (returns at once if it
    /// already has and no `ChildDown` followed).
    pub async fn wait_up(&self, timeout: Duration) -> Result<(), NotUp> {
        let mut rx = self.state.clone();
        match tokio::time::timeout(timeout, rx.wait_for(|s| *s == TopState::Up)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(NotUp { top: self.spec().top_name().to_string(), timeout }),
        }
    }

    /// The top's current state.
    pub fn state(&self) -> TopState {
        *self.state.borrow()
    }

    /// Watches the top's state.
    pub fn subscribe(&self) -> watch::Receiver<TopState> {
        self.state.clone()
    }

    /// Receives the upcalls (invalidations, lock contention) that reach the
    /// top, as the FUSE bridge needs them; a receiver more than
    /// `UPCALL_QUEUE` behind is told how many it lost.
    pub fn upcalls(&self) -> broadcast::Receiver<Upcall> {
        self.upcalls.subscribe()
    }

    /// Asks the graph to finish the work its translators delayed behind
    /// replies already given (queued writes, directory operations answered
    /// early): [`xlfs_sdk::IPC_DRAIN`] from the top. False if that took
    /// longer than `timeout`.
    pub async fn drain(&self, timeout: Duration) -> bool {
        drain(&self.top(), timeout).await
    }

    /// The top node, where fops enter the graph (timed, as every node
    /// is: [`Graph::profile`]).
    pub fn top(&self) -> Child {
        let spec = self.spec();
        Child { name: spec.nodes[spec.top].name.clone(), xl: self.nodes[spec.top].timed.clone() }
    }

    /// The fop timings of every node since the graph was built or last
    /// reset (`reset` restarts them after this snapshot); see
    /// [`crate::profile`].
    pub fn profile(&self, reset: bool) -> GraphProfile {
        self.profiler.snapshot(reset)
    }

    /// The nodes of type `type_name`, top first, untimed (what the graph
    /// asks of them itself, such as a brick's profile through each
    /// protocol/client, stays out of the timings), with their options.
    pub fn nodes_of_type(&self, type_name: &str) -> Vec<(Child, Options)> {
        let spec = self.spec();
        spec.order
            .iter()
            .rev()
            .filter(|&&i| spec.nodes[i].ty.name == type_name)
            .map(|&i| {
                (
                    Child { name: spec.nodes[i].name.clone(), xl: self.nodes[i].xl.clone() },
                    spec.nodes[i].options.clone(),
                )
            })
            .collect()
    }

    /// Sends a graph event ([`EventFrom::Graph`]) to every node, top first.
    /// What a node's `notify` returns goes on to its parents.
    pub fn broadcast(&self, event: Event) {
        let order: Vec<usize> = self.spec().order.iter().rev().copied().collect();
        broadcast_to(&self.nodes, &order, &event);
    }

    /// Every node's diagnostic state, top first, as GlusterFS's statedump:
    /// for each volume a `VOLUME.type` line, then what its translator's
    /// `dump` reports, each key prefixed with `VOLUME.`.
    pub fn dump(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let spec = self.spec();
        for &i in spec.order.iter().rev() {
            let name = &spec.nodes[i].name;
            out.push((format!("{name}.type"), spec.nodes[i].ty.name.to_string()));
            out.extend(self.nodes[i].xl.dump().into_iter().map(|(k, v)| (format!("{name}.{k}"), v)));
        }
        out
    }

    /// Sends `ParentDown` to every node, then calls `fini` on each, top
    /// first. Only the first call (or the drop, if never called) does this.
    pub fn shutdown(&self) {
        if self.shut.swap(true, Ordering::AcqRel) {
            return;
        }
        self.broadcast(Event::ParentDown);
        for n in self.top_down() {
            n.xl.fini();
        }
        tracing::debug!(origin = %self.spec().origin, "graph shut down");
    }

    /// The validated description this graph runs: the one it was built
    /// from, or the last one [`Graph::reconfigure`] applied.
    pub fn spec(&self) -> Arc<GraphSpec> {
        self.spec.read().clone()
    }

    /// Where the volfile came from.
    pub fn origin(&self) -> String {
        self.spec().origin.clone()
    }

    /// When the graph was built.
    pub fn built_at(&self) -> SystemTime {
        self.built_at
    }

    /// The tree, as [`GraphSpec::describe`].
    pub fn describe(&self) -> String {
        self.spec().describe()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        self.shutdown();
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests;
