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

/// Why a volfile does not make a graph: the file and line, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {kind}")]
pub struct GraphError {
    /// The volfile's origin.
    pub file: String,
    /// The line the problem is on.
    pub line: usize,
    /// What is wrong (boxed: errors travel far, the common path stays small).
    pub kind: Box<GraphErrorKind>,
}

/// Why a volfile could not be loaded into a graph: reading, parsing or
/// checking and building it failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The volfile could not be read or parsed.
    #[error(transparent)]
    Volfile(#[from] VolfileError),
    /// It does not make a graph.
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// What is wrong with a graph.
#[derive(Debug, thiserror::Error)]
pub enum GraphErrorKind {
    /// The volfile has no volume.
    #[error("expected at least one volume, found none")]
    Empty,
    /// A `type` the registry does not know.
    #[error("volume '{volume}': unknown type '{type_name}' (known types: {})", known.join(", "))]
    UnknownType {
        /// The volume.
        volume: String,
        /// The type given.
        type_name: String,
        /// The registered types.
        known: Vec<String>,
    },
    /// A subvolume that no volume defines.
    #[error("volume '{volume}': subvolume '{subvolume}' is not defined (expected the name of a volume in this file)")]
    UndefinedSubvolume {
        /// The volume.
        volume: String,
        /// The missing name.
        subvolume: String,
    },
    /// The same subvolume listed twice.
    #[error("volume '{volume}': subvolume '{subvolume}' is listed twice")]
    DuplicateSubvolume {
        /// The volume.
        volume: String,
        /// The repeated name.
        subvolume: String,
    },
    /// Volumes that are their own (indirect) subvolume.
    #[error("cycle in subvolumes: {}", path.join(" -> "))]
    Cycle {
        /// The volumes along the cycle, the first repeated at the end.
        path: Vec<String>,
    },
    /// More than one volume is not used as a subvolume.
    #[error("expected exactly one top volume (one that no other volume uses as a subvolume), found {}: {}", tops.len(), quoted(tops))]
    ManyTops {
        /// The top volumes, in file order.
        tops: Vec<String>,
    },
    /// Too few or too many subvolumes for the type.
    #[error("volume '{volume}' ({type_name}): expected {}, found {found}", child_range(*min, *max))]
    ChildCount {
        /// The volume.
        volume: String,
        /// Its type.
        type_name: String,
        /// Fewest children the type takes.
        min: usize,
        /// Most children the type takes.
        max: usize,
        /// How many it has.
        found: usize,
    },
    /// An option is unknown or has a bad value.
    #[error("volume '{volume}' ({type_name}): {source}")]
    Option {
        /// The volume.
        volume: String,
        /// Its type.
        type_name: String,
        /// What is wrong with the option.
        source: OptionError,
    },
    /// A dynamic type (a plugin host) could not make the volume's type:
    /// its module is missing, not a plugin, or of a refused ABI version.
    #[error("volume '{volume}' ({type_name}): {message}")]
    Dynamic {
        /// The volume.
        volume: String,
        /// Its type.
        type_name: String,
        /// Why.
        message: String,
    },
    /// The translator's constructor refused.
    #[error("volume '{volume}' ({type_name}): {source}")]
    Init {
        /// The volume.
        volume: String,
        /// Its type.
        type_name: String,
        /// The constructor's error.
        source: InitError,
    },
}

fn quoted(names: &[String]) -> String {
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

fn child_range(min: usize, max: usize) -> String {
    let n = |k: usize| if k == 1 { "1 subvolume".to_string() } else { format!("{k} subvolumes") };
    match (min, max) {
        (0, 0) => "no subvolumes".into(),
        (a, b) if a == b => format!("exactly {}", n(a)),
        (a, usize::MAX) => format!("at least {}", n(a)),
        (0, b) => format!("at most {}", n(b)),
        (a, b) => format!("{a} to {b} subvolumes"),
    }
}

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

/// One volume of a validated graph.
#[derive(Clone, Debug)]
struct SpecNode {
    name: Arc<str>,
    line: usize,
    ty: XlatorType,
    options: Options,
    children: Vec<usize>,
    /// The SHA-256 of the content of each file an option names (plugin
    /// modules, policy modules), by option: a module rebuilt in place is a
    /// change even though the volfile is not.
    files: Vec<(String, [u8; 32])>,
}

/// Largest file hashed for [`SpecNode::files`] (plugin modules are limited
/// to this size too).
const MAX_HASHED_FILE: u64 = 512 << 20;

/// The absolute path of an existing regular file an option value names:
/// a path value, or a string that is one after an optional `scheme:`
/// prefix (`wasm:/lib/policy.wasm`).
fn option_file(value: &OptValue) -> Option<std::path::PathBuf> {
    let p = match value {
        OptValue::Path(p) => p.clone(),
        OptValue::Str(s) => {
            let s = s.split_once(':').filter(|(scheme, _)| !scheme.contains('/')).map_or(s.as_str(), |(_, rest)| rest);
            std::path::PathBuf::from(s)
        }
        _ => return None,
    };
    let meta = std::fs::metadata(&p).ok()?;
    (p.is_absolute() && meta.is_file() && meta.len() <= MAX_HASHED_FILE).then_some(p)
}

/// The content hash of each file `options` name, by option.
fn files_hash(options: &Options) -> Vec<(String, [u8; 32])> {
    let mut out = Vec::new();
    for (key, value, _) in options.iter() {
        let Some(path) = option_file(value) else { continue };
        // An unreadable file hashes as its error: a later readable one differs.
        let bytes = std::fs::read(&path).unwrap_or_else(|e| e.to_string().into_bytes());
        out.push((key.to_string(), Sha256::digest(&bytes).into()));
    }
    out
}

/// A validated graph that is not built: every type known, every subvolume
/// defined, no cycle, one top, child counts and options valid. Built with
/// [`Graph::from_spec`]; printed with [`GraphSpec::describe`].
#[derive(Clone, Debug)]
pub struct GraphSpec {
    origin: String,
    /// In file order.
    nodes: Vec<SpecNode>,
    top: usize,
    /// Children before parents (a depth-first post-order; reversed, it
    /// puts parents before children).
    order: Vec<usize>,
}

/// Depth-first post-order over `children` from each root; `Err` holds a
/// cycle as (path of node indexes ending at the repeated node, the node and
/// child position of the edge that closes it).
fn post_order(
    children: &[Vec<usize>],
    roots: impl IntoIterator<Item = usize>,
) -> Result<Vec<usize>, (Vec<usize>, usize, usize)> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut mark = vec![Mark::New; children.len()];
    let mut order = Vec::with_capacity(children.len());
    for root in roots {
        if mark[root] != Mark::New {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        mark[root] = Mark::Open;
        while let Some((node, next)) = stack.last_mut() {
            let node = *node;
            let Some(&child) = children[node].get(*next) else {
                mark[node] = Mark::Done;
                order.push(node);
                stack.pop();
                continue;
            };
            let pos = *next;
            *next += 1;
            match mark[child] {
                Mark::New => {
                    mark[child] = Mark::Open;
                    stack.push((child, 0));
                }
                Mark::Open => {
                    let from = stack.iter().position(|&(n, _)| n == child).unwrap_or(0);
                    let mut path: Vec<usize> = stack[from..].iter().map(|&(n, _)| n).collect();
                    path.push(child);
                    return Err((path, node, pos));
                }
                Mark::Done => {}
            }
        }
    }
    Ok(order)
}

impl GraphSpec {
    /// Checks `volfile` against `registry` without building anything.
    /// Checks run in this order, each over the volumes in file order, and
    /// the first problem is returned: types, subvolume names, cycles, a
    /// single top, child counts, options.
    pub fn validate(volfile: &Volfile, registry: &Registry) -> Result<GraphSpec, GraphError> {
        let err =
            |line: usize, kind: GraphErrorKind| GraphError { file: volfile.origin.clone(), line, kind: Box::new(kind) };
        let vols = &volfile.volumes;
        if vols.is_empty() {
            return Err(err(1, GraphErrorKind::Empty));
        }

        let mut types = Vec::with_capacity(vols.len());
        for v in vols {
            let Some(ty) = registry.get(&v.type_name) else {
                return Err(err(
                    v.type_line,
                    GraphErrorKind::UnknownType {
                        volume: v.name.clone(),
                        type_name: v.type_name.clone(),
                        known: registry.names().into_iter().map(String::from).collect(),
                    },
                ));
            };
            // A dynamic type (a plugin host) becomes the volume's own type:
            // the loaded module's options and child counts.
            let ty = match registry.specializer(ty.name) {
                None => ty.clone(),
                Some(specialize) => {
                    let given: Vec<(&str, &str)> =
                        v.options.iter().map(|o| (o.key.as_str(), o.value.as_str())).collect();
                    specialize(&given).map_err(|message| {
                        let line = v.options.iter().find(|o| o.key == "module").map_or(v.type_line, |o| o.line);
                        err(
                            line,
                            GraphErrorKind::Dynamic { volume: v.name.clone(), type_name: ty.name.to_string(), message },
                        )
                    })?
                }
            };
            types.push(ty);
        }

        let index: HashMap<&str, usize> = vols.iter().enumerate().map(|(i, v)| (v.name.as_str(), i)).collect();
        let mut children: Vec<Vec<usize>> = Vec::with_capacity(vols.len());
        for v in vols {
            let mut kids = Vec::with_capacity(v.subvolumes.len());
            for s in &v.subvolumes {
                let volume = v.name.clone();
                let subvolume = s.name.clone();
                let Some(&c) = index.get(s.name.as_str()) else {
                    return Err(err(s.line, GraphErrorKind::UndefinedSubvolume { volume, subvolume }));
                };
                if kids.contains(&c) {
                    return Err(err(s.line, GraphErrorKind::DuplicateSubvolume { volume, subvolume }));
                }
                kids.push(c);
            }
            children.push(kids);
        }

        let order = post_order(&children, 0..vols.len()).map_err(|(path, node, pos)| {
            let path = path.into_iter().map(|i| vols[i].name.clone()).collect();
            err(vols[node].subvolumes[pos].line, GraphErrorKind::Cycle { path })
        })?;

        let mut used = vec![false; vols.len()];
        children.iter().flatten().for_each(|&c| used[c] = true);
        let tops: Vec<usize> = (0..vols.len()).filter(|&i| !used[i]).collect();
        let &[top] = tops.as_slice() else {
            // No top at all needs a cycle, refused above.
            let line = tops.get(1).map_or(1, |&i| vols[i].line);
            return Err(err(
                line,
                GraphErrorKind::ManyTops { tops: tops.iter().map(|&i| vols[i].name.clone()).collect() },
            ));
        };

        for ((v, ty), kids) in vols.iter().zip(&types).zip(&children) {
            if kids.len() < ty.min_children || kids.len() > ty.max_children {
                let line = v.subvolumes.first().map_or(v.line, |s| s.line);
                return Err(err(
                    line,
                    GraphErrorKind::ChildCount {
                        volume: v.name.clone(),
                        type_name: ty.name.to_string(),
                        min: ty.min_children,
                        max: ty.max_children,
                        found: kids.len(),
                    },
                ));
            }
        }

        let mut nodes = Vec::with_capacity(vols.len());
        for ((v, ty), kids) in vols.iter().zip(types).zip(children) {
            let opt_err = |line: usize, source: OptionError| {
                err(line, GraphErrorKind::Option { volume: v.name.clone(), type_name: ty.name.to_string(), source })
            };
            // One at a time first, so an error points at its own line.
            for o in &v.options {
                Options::resolve(ty.options, [(o.key.as_str(), o.value.as_str())]).map_err(|e| opt_err(o.line, e))?;
            }
            let options = Options::resolve(ty.options, v.options.iter().map(|o| (o.key.as_str(), o.value.as_str())))
                .map_err(|e| opt_err(v.type_line, e))?;
            let files = files_hash(&options);
            nodes.push(SpecNode { name: Arc::from(v.name.as_str()), line: v.line, ty, options, children: kids, files });
        }
        Ok(GraphSpec { origin: volfile.origin.clone(), nodes, top, order })
    }

    /// Where the volfile came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The top volume's name.
    pub fn top_name(&self) -> &str {
        &self.nodes[self.top].name
    }

    /// The graph as a tree from the top down: each volume with its type and
    /// effective options (defaults marked `(default)`), children below it.
    /// A volume reached twice is shown in full the first time only.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let mut seen = vec![false; self.nodes.len()];
        self.describe_node(self.top, "", None, &mut seen, &mut out);
        out
    }

    fn describe_node(&self, i: usize, prefix: &str, last: Option<bool>, seen: &mut [bool], out: &mut String) {
        let node = &self.nodes[i];
        let (branch, body) = match last {
            None => ("", String::new()),
            Some(true) => ("└── ", format!("{prefix}    ")),
            Some(false) => ("├── ", format!("{prefix}│   ")),
        };
        out.push_str(&format!("{prefix}{branch}{} ({})", node.name, node.ty.name));
        if std::mem::replace(&mut seen[i], true) {
            out.push_str(" (shown above)\n");
            return;
        }
        out.push('\n');
        let bar = if node.children.is_empty() { "    " } else { "│   " };
        for (key, value, given) in node.options.iter() {
            let mark = if given { "" } else { " (default)" };
            out.push_str(&format!("{body}{bar}{key} {value}{mark}\n"));
        }
        for (k, &c) in node.children.iter().enumerate() {
            self.describe_node(c, &body, Some(k + 1 == node.children.len()), seen, out);
        }
    }

    /// The files the options name (plugin and policy modules): what a
    /// volfile watcher also watches.
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        let mut out: Vec<std::path::PathBuf> =
            self.nodes.iter().flat_map(|n| n.options.iter().filter_map(|(_, v, _)| option_file(v))).collect();
        out.sort();
        out.dedup();
        out
    }

    /// How `new` differs from this (running) spec: not at all, only in
    /// option values, or in structure (volumes added, removed, reordered
    /// or renamed, a type or subvolume list changed, the top changed, or a
    /// file an option names changed content).
    pub fn diff(&self, new: &GraphSpec) -> GraphDiff {
        let names = |s: &GraphSpec| s.nodes.iter().map(|n| n.name.to_string()).collect::<Vec<_>>();
        let (old_names, new_names) = (names(self), names(new));
        if old_names != new_names {
            let added: Vec<&String> = new_names.iter().filter(|n| !old_names.contains(n)).collect();
            let removed: Vec<&String> = old_names.iter().filter(|n| !new_names.contains(n)).collect();
            let list = |v: &[&String]| v.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ");
            let mut why = Vec::new();
            if !added.is_empty() {
                why.push(format!("added {}", list(&added)));
            }
            if !removed.is_empty() {
                why.push(format!("removed {}", list(&removed)));
            }
            if why.is_empty() {
                why.push("reordered".to_string());
            }
            return GraphDiff::Structure(format!("volumes {}", why.join(", ")));
        }
        if self.top != new.top {
            return GraphDiff::Structure(format!("top volume '{}' -> '{}'", self.top_name(), new.top_name()));
        }
        let mut changes = Vec::new();
        for (o, n) in self.nodes.iter().zip(&new.nodes) {
            if o.ty.name != n.ty.name {
                return GraphDiff::Structure(format!("volume '{}': type {} -> {}", o.name, o.ty.name, n.ty.name));
            }
            if o.children != n.children {
                return GraphDiff::Structure(format!("volume '{}': subvolumes changed", o.name));
            }
            // The same option naming the same file, whose content changed:
            // what runs is not what the file now holds. (A new value is an
            // option change: reconfigure loads the new file.)
            for (key, hash) in &o.files {
                let same_value = o.options.get(key) == n.options.get(key);
                if same_value && n.files.iter().any(|(k, h)| k == key && h != hash) {
                    return GraphDiff::Structure(format!("volume '{}': the file option '{key}' names changed", o.name));
                }
            }
            if o.options == n.options {
                continue;
            }
            let mut keys: Vec<&str> = o.options.iter().chain(n.options.iter()).map(|(k, _, _)| k).collect();
            keys.sort_unstable();
            keys.dedup();
            let shown = |opts: &Options, k: &str| opts.get(k).map_or_else(|| "(unset)".to_string(), |v| v.to_string());
            let values = keys
                .into_iter()
                .filter(|k| o.options.get(k) != n.options.get(k))
                .map(|k| OptionValueChange { key: k.to_string(), old: shown(&o.options, k), new: shown(&n.options, k) })
                .collect();
            changes.push(OptionChange { volume: o.name.to_string(), type_name: o.ty.name.to_string(), values });
        }
        if changes.is_empty() { GraphDiff::Same } else { GraphDiff::Options(changes) }
    }
}

/// How a new spec differs from a running one ([`GraphSpec::diff`]).
#[derive(Debug, PartialEq)]
pub enum GraphDiff {
    /// Nothing changed.
    Same,
    /// Only option values changed; [`Graph::reconfigure`] can apply them.
    Options(Vec<OptionChange>),
    /// The graph's shape or a module changed (the reason): it must be rebuilt.
    Structure(String),
}

/// The changed options of one volume.
#[derive(Clone, Debug, PartialEq)]
pub struct OptionChange {
    /// The volume.
    pub volume: String,
    /// Its type.
    pub type_name: String,
    /// The options whose values differ.
    pub values: Vec<OptionValueChange>,
}

/// One option's old and new value (`(unset)` for none).
#[derive(Clone, Debug, PartialEq)]
pub struct OptionValueChange {
    /// The option.
    pub key: String,
    /// The running value.
    pub old: String,
    /// The new value.
    pub new: String,
}

impl std::fmt::Display for OptionChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let values: Vec<String> = self.values.iter().map(|v| format!("{} {} -> {}", v.key, v.old, v.new)).collect();
        write!(f, "volume '{}' ({}): {}", self.volume, self.type_name, values.join(", "))
    }
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
            let ctx = InitCtx { name: s.name.to_string(), options: s.options.clone(), children, events: sink.clone() };
            match (s.ty.build)(ctx) {
                Ok(xl) => {
                    let timed = Arc::new(Timed::new(xl.clone(), stats[i].clone(), s.children.is_empty()));
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
mod tests {
    use std::cell::RefCell;

    use xlfs_sdk::{CallCtx, Errno, Fop, FopFuture, Loc, OptType, OptionDecl, Request};

    use super::*;

    thread_local! {
        /// What the test translators saw, as "name:what" lines.
        static LOG: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    fn log(line: String) {
        LOG.with(|l| l.borrow_mut().push(line));
    }

    fn take_log() -> Vec<String> {
        LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }

    /// A test translator: a leaf says ChildUp on ParentUp and ChildDown on
    /// ParentDown (when its `up` option is on); any node passes child events on.
    struct TestXl {
        name: String,
        children: Vec<Child>,
        sink: EventSink,
        leaf_up: bool,
    }

    impl Xlator for TestXl {
        fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
            Box::pin(async move {
                match self.children.first() {
                    Some(c) => c.call(ctx, req).await,
                    None => Err(Errno::ENOSYS),
                }
            })
        }
        fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
            log(format!("{}:{event:?}:{from:?}", self.name));
            match (from, &event) {
                (EventFrom::Graph, Event::ParentUp) if self.leaf_up => self.sink.send(Event::ChildUp),
                (EventFrom::Graph, Event::ParentDown) if self.leaf_up => self.sink.send(Event::ChildDown),
                (EventFrom::Child(_), _) => return Some(event),
                _ => {}
            }
            None
        }
        fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
            if self.children.is_empty() {
                return Err(ReconfigureError::Unsupported);
            }
            let n = options.int("thread-count").unwrap_or(0);
            if n == 13 {
                return Err(ReconfigureError::Invalid("13 is unlucky".into()));
            }
            log(format!("{}:reconfigure:{n}", self.name));
            Ok(())
        }
        fn dump(&self) -> Vec<(String, String)> {
            let names: Vec<&str> = self.children.iter().map(|c| &*c.name).collect();
            vec![("children".into(), names.join(","))]
        }
        fn fini(&self) {
            log(format!("{}:fini", self.name));
        }
    }

    fn build_test(init: InitCtx, leaf: bool) -> Result<Arc<dyn Xlator>, InitError> {
        if init.options.bool("fail") == Some(true) {
            return Err(InitError::new("option 'directory' is required"));
        }
        log(format!("{}:build", init.name));
        let leaf_up = leaf && init.options.bool("up") == Some(true);
        Ok(Arc::new(TestXl { name: init.name, children: init.children, sink: init.events, leaf_up }))
    }

    const LEAF_OPTS: &[OptionDecl] = &[
        OptionDecl::new("up", OptType::Bool).default("on"),
        OptionDecl::new("fail", OptType::Bool).default("off"),
        OptionDecl::new("directory", OptType::Path),
    ];
    const PASS_OPTS: &[OptionDecl] = &[
        OptionDecl::new("thread-count", OptType::Int).default("16").range(1.0, 64.0),
        OptionDecl::new("mode", OptType::Enum(&["fast", "safe"])).default("safe"),
    ];

    const LEAF: XlatorType = XlatorType {
        name: "test/leaf",
        description: "a leaf",
        options: LEAF_OPTS,
        min_children: 0,
        max_children: 0,
        build: |i| build_test(i, true),
    };
    const PASS: XlatorType = XlatorType {
        name: "test/pass",
        description: "one child",
        options: PASS_OPTS,
        min_children: 1,
        max_children: 1,
        build: |i| build_test(i, false),
    };
    const FAN: XlatorType = XlatorType {
        name: "test/fan",
        description: "two or more children",
        options: &[],
        min_children: 2,
        max_children: usize::MAX,
        build: |i| build_test(i, false),
    };

    fn registry() -> Registry {
        let mut r = Registry::new();
        for t in [LEAF, PASS, FAN] {
            r.register(t).expect("distinct");
        }
        r
    }

    fn check(text: &str) -> Result<GraphSpec, GraphError> {
        GraphSpec::validate(&Volfile::parse(text, "g.vol").expect("parses"), &registry())
    }

    fn build(text: &str) -> Graph {
        Graph::from_str(text, "g.vol", &registry()).expect("builds")
    }

    fn check_err(text: &str) -> (usize, String) {
        let e = check(text).expect_err("must fail");
        (e.line, e.to_string())
    }

    const CHAIN: &str = "\
volume leaf
    type test/leaf
    option directory /srv/b1
end-volume

volume mid
    type test/pass
    option thread-count 4
    subvolumes leaf
end-volume

volume top
    type test/pass
    subvolumes mid
end-volume
";

    #[test]
    fn unknown_type_lists_known_and_reports_first() {
        let (line, msg) = check_err(
            "volume a\n type test/leaf\nend-volume\nvolume b\n type test/nope\n subvolumes a\nend-volume\n\
             volume c\n type test/other\n subvolumes b\nend-volume\n",
        );
        assert_eq!(line, 5);
        assert_eq!(msg, "g.vol:5: volume 'b': unknown type 'test/nope' (known types: test/fan, test/leaf, test/pass)");
    }

    #[test]
    fn unknown_option_lists_known() {
        let (line, msg) = check_err(&CHAIN.replace("option thread-count 4", "option thread-cont 4"));
        assert_eq!(line, 8);
        assert!(msg.starts_with("g.vol:8: volume 'mid' (test/pass): unknown option 'thread-cont'"), "{msg}");
        assert!(msg.contains("thread-count") && msg.contains("mode"), "{msg}");
    }

    #[test]
    fn bad_value_names_option_value_and_form() {
        let (line, msg) = check_err(&CHAIN.replace("option thread-count 4", "option thread-count many"));
        assert_eq!(line, 8);
        assert!(msg.contains("'thread-count'") && msg.contains("'many'") && msg.contains("an integer"), "{msg}");
        let (_, msg) = check_err(&CHAIN.replace("option thread-count 4", "option thread-count 100"));
        assert!(msg.contains("out of range"), "{msg}");
        let (line, msg) = check_err(&CHAIN.replace("/srv/b1", "relative/dir"));
        assert_eq!(line, 3);
        assert!(msg.contains("'relative/dir'") && msg.contains("absolute path"), "{msg}");
    }

    #[test]
    fn cycle_names_path_and_line() {
        let (line, msg) = check_err(
            "volume top\n type test/pass\n subvolumes a\nend-volume\n\
             volume a\n type test/pass\n subvolumes b\nend-volume\n\
             volume b\n type test/pass\n subvolumes a\nend-volume\n",
        );
        assert_eq!(line, 11);
        assert_eq!(msg, "g.vol:11: cycle in subvolumes: a -> b -> a");
        let (line, msg) = check_err("volume a\n type test/pass\n subvolumes a\nend-volume\n");
        assert_eq!(line, 3);
        assert!(msg.ends_with("cycle in subvolumes: a -> a"), "{msg}");
    }

    #[test]
    fn two_tops_names_both() {
        let (line, msg) = check_err(&format!("{CHAIN}\nvolume other\n type test/leaf\nend-volume\n"));
        assert_eq!(line, 17);
        assert!(msg.contains("found 2: 'top', 'other'"), "{msg}");
    }

    #[test]
    fn undefined_and_repeated_subvolume() {
        let (line, msg) = check_err(&CHAIN.replace("subvolumes mid", "subvolumes midd"));
        assert_eq!(line, 14);
        assert!(msg.contains("volume 'top': subvolume 'midd' is not defined"), "{msg}");
        let (line, msg) =
            check_err("volume l\n type test/leaf\nend-volume\nvolume f\n type test/fan\n subvolumes l l\nend-volume\n");
        assert_eq!(line, 6);
        assert!(msg.contains("subvolume 'l' is listed twice"), "{msg}");
    }

    #[test]
    fn child_count() {
        let (line, msg) = check_err("volume p\n type test/pass\nend-volume\n");
        assert_eq!(line, 1);
        assert_eq!(msg, "g.vol:1: volume 'p' (test/pass): expected exactly 1 subvolume, found 0");
        let (line, msg) =
            check_err("volume l\n type test/leaf\nend-volume\nvolume f\n type test/fan\n subvolumes l\nend-volume\n");
        assert_eq!(line, 6);
        assert!(msg.ends_with("expected at least 2 subvolumes, found 1"), "{msg}");
        let (_, msg) =
            check_err("volume l\n type test/leaf\nend-volume\nvolume m\n type test/leaf\n subvolumes l\nend-volume\n");
        assert!(msg.ends_with("(test/leaf): expected no subvolumes, found 1"), "{msg}");
    }

    #[test]
    fn describe_shows_tree_and_defaults() {
        let spec = check(CHAIN).expect("valid");
        assert_eq!(spec.top_name(), "top");
        let tree = spec.describe();
        let expected = "\
top (test/pass)
│   mode safe (default)
│   thread-count 16 (default)
└── mid (test/pass)
    │   mode safe (default)
    │   thread-count 4
    └── leaf (test/leaf)
            directory /srv/b1
            fail off (default)
            up on (default)
";
        assert_eq!(tree, expected);
    }

    #[test]
    fn validate_runs_no_constructor() {
        take_log();
        check(CHAIN).expect("valid");
        assert!(take_log().is_empty());
    }

    #[tokio::test]
    async fn child_up_reaches_top_and_child_down_follows() {
        take_log();
        let g = build(CHAIN);
        assert_eq!(take_log(), ["leaf:build", "mid:build", "top:build"]);
        assert_eq!(g.state(), TopState::Down);
        assert_eq!(g.top().name.as_ref(), "top");
        g.activate();
        g.wait_up(Duration::from_secs(5)).await.expect("up");
        assert_eq!(g.state(), TopState::Up);
        let log = take_log();
        // ParentUp goes top-down; the leaf's ChildUp climbs through mid to top.
        assert_eq!(
            log,
            [
                "top:ParentUp:Graph",
                "mid:ParentUp:Graph",
                "leaf:ParentUp:Graph",
                "mid:ChildUp:Child(0)",
                "top:ChildUp:Child(0)",
            ]
        );
        g.shutdown();
        assert_eq!(g.state(), TopState::Down);
        let log = take_log();
        assert!(log.contains(&"top:ChildDown:Child(0)".to_string()), "{log:?}");
        // A fop at the top goes down the chain to the leaf.
        let r = g.top().call(CallCtx::root("t"), Request::new(Fop::Stat { loc: Loc::root() })).await;
        assert_eq!(r.err(), Some(Errno::ENOSYS));
    }

    #[tokio::test]
    async fn wait_up_times_out_when_no_leaf_says_up() {
        let g = build(&CHAIN.replace("option directory /srv/b1", "option up off"));
        g.activate();
        let e = g.wait_up(Duration::from_millis(20)).await.expect_err("never up");
        assert!(e.to_string().contains("'top'"), "{e}");
    }

    #[test]
    fn fini_exactly_once_top_down() {
        take_log();
        let g = build(CHAIN);
        take_log();
        g.shutdown();
        g.shutdown();
        drop(g);
        let finis: Vec<String> = take_log().into_iter().filter(|l| l.ends_with(":fini")).collect();
        assert_eq!(finis, ["top:fini", "mid:fini", "leaf:fini"]);

        let g = build(CHAIN);
        take_log();
        drop(g);
        let finis = take_log().into_iter().filter(|l| l.ends_with(":fini")).count();
        assert_eq!(finis, 3);
    }

    const DIAMOND: &str = "\
volume shared
    type test/leaf
end-volume
volume a
    type test/pass
    subvolumes shared
end-volume
volume b
    type test/pass
    subvolumes shared
end-volume
volume top
    type test/fan
    subvolumes a b
end-volume
";

    #[test]
    fn shared_child_notifies_every_parent_and_is_built_once() {
        take_log();
        let g = build(DIAMOND);
        let builds = take_log();
        assert_eq!(builds.iter().filter(|l| *l == "shared:build").count(), 1);
        g.activate();
        let log = take_log();
        for l in ["a:ChildUp:Child(0)", "b:ChildUp:Child(0)", "top:ChildUp:Child(0)", "top:ChildUp:Child(1)"] {
            assert!(log.contains(&l.to_string()), "{l} missing in {log:?}");
        }
        assert_eq!(g.state(), TopState::Up);
        assert!(g.describe().contains("shared (test/leaf) (shown above)"), "{}", g.describe());
        let dump = g.dump();
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(dump[..2], [pair("top.type", "test/fan"), pair("top.children", "a,b")]);
        assert_eq!(dump.len(), 8);
        assert!(dump.contains(&pair("shared.type", "test/leaf")));
    }

    #[tokio::test]
    async fn every_node_is_timed_and_self_times_add_up_to_the_top() {
        let g = build(CHAIN);
        for _ in 0..4 {
            let r = g.top().call(CallCtx::root("t"), Fop::Stat { loc: Loc::root() }.into()).await;
            assert_eq!(r.err(), Some(Errno::ENOSYS), "the test leaf answers ENOSYS");
        }
        let p = g.profile(false);
        assert_eq!(p.top, "top");
        assert_eq!(p.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["top", "mid", "leaf"], "top first");
        let stat: Vec<_> = p.nodes.iter().map(|n| *n.fop(xlfs_sdk::FopKind::Stat).expect("counted")).collect();
        assert!(stat.iter().all(|f| f.count == 4), "{stat:?}");
        assert!(stat.iter().all(|f| f.self_ns <= f.total_ns), "{stat:?}");
        // Exact in clock ticks; converting each counter to nanoseconds
        // truncates, so a sum of k of them may be k ns off.
        assert!(stat.iter().map(|f| f.self_ns).sum::<u64>().abs_diff(stat[0].total_ns) <= 3, "{stat:?}");
        assert!(
            (stat[0].total_ns - stat[0].self_ns).abs_diff(stat[1].total_ns) <= 2,
            "top waited exactly for mid: {stat:?}"
        );
        // What protocol/server asks through its sink: the same counters.
        let via_sink = g.nodes[0].sink.graph_profile(true).expect("linked");
        assert_eq!(via_sink.nodes, p.nodes);
        assert!(g.profile(false).nodes.iter().all(|n| n.fops.is_empty()), "reset");
        // The graph's own calls of a node (nodes_of_type) are not timed.
        let (leaf, _) = g.nodes_of_type("test/leaf").remove(0);
        let _ = leaf.call(CallCtx::root("t"), Fop::Stat { loc: Loc::root() }.into()).await;
        assert!(g.profile(false).nodes.iter().all(|n| n.fops.is_empty()), "untimed");
    }

    #[test]
    fn broadcast_reaches_every_node() {
        let g = build(DIAMOND);
        take_log();
        g.broadcast(Event::ClientGone { client_id: "c1".into() });
        let log = take_log();
        for n in ["top", "a", "b", "shared"] {
            let line = format!("{n}:ClientGone {{ client_id: \"c1\" }}:Graph");
            assert_eq!(log.iter().filter(|l| **l == line).count(), 1, "{n}: {log:?}");
        }
    }

    #[test]
    fn a_node_can_broadcast_through_its_sink() {
        let g = build(DIAMOND);
        take_log();
        let leaf = g.spec().nodes.iter().position(|n| &*n.name == "shared").expect("shared node");
        g.nodes[leaf].sink.broadcast(Event::ClientGone { client_id: "c2".into() });
        let log = take_log();
        for n in ["top", "a", "b", "shared"] {
            let line = format!("{n}:ClientGone {{ client_id: \"c2\" }}:Graph");
            assert_eq!(log.iter().filter(|l| **l == line).count(), 1, "{n}: {log:?}");
        }
        let sink = g.nodes[leaf].sink.clone();
        drop(g);
        sink.broadcast(Event::ClientGone { client_id: "c3".into() });
        assert!(take_log().iter().all(|l| !l.contains("c3")), "a dropped graph hears nothing");
    }

    #[test]
    fn init_error_names_volume_and_type_and_finalizes_built_nodes() {
        let text = "\
volume ok
    type test/leaf
end-volume
volume b1-posix
    type test/leaf
    option fail on
end-volume
volume top
    type test/fan
    subvolumes ok b1-posix
end-volume
";
        take_log();
        let e = Graph::build(&Volfile::parse(text, "g.vol").expect("parses"), &registry()).expect_err("fails");
        assert_eq!(e.to_string(), "g.vol:4: volume 'b1-posix' (test/leaf): option 'directory' is required");
        assert_eq!(take_log(), ["ok:build", "ok:fini"]);
    }

    #[test]
    fn gluster_brick_volfile_stops_at_first_unknown_type() {
        // The built-in registry knows storage/posix etc.; an unknown type in a
        // real GlusterFS brick volfile is reported with the built-in list.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/fixtures/gluster-volfiles/replica3-brick.vol");
        let v = Volfile::load(&path).expect("fixture parses");
        let e = GraphSpec::validate(&v, &Registry::builtin()).expect_err("features/trash is not built in");
        assert_eq!(e.line, 10);
        assert!(
            e.to_string().contains("unknown type 'features/trash'") && e.to_string().contains("storage/posix"),
            "{e}"
        );
    }

    #[test]
    fn diff_tells_options_from_structure() {
        let old = check(CHAIN).expect("valid");
        assert_eq!(old.diff(&check(CHAIN).expect("valid")), GraphDiff::Same);
        let GraphDiff::Options(c) =
            old.diff(&check(&CHAIN.replace("thread-count 4", "thread-count 8")).expect("valid"))
        else {
            panic!("options only")
        };
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].to_string(), "volume 'mid' (test/pass): thread-count 4 -> 8");
        let more = CHAIN.replace("subvolumes mid\n", "subvolumes extra\n")
            + "volume extra\n type test/pass\n subvolumes mid\nend-volume\n";
        let GraphDiff::Structure(why) = old.diff(&check(&more).expect("valid")) else { panic!("structure") };
        assert_eq!(why, "volumes added 'extra'");
        let fewer =
            "volume leaf\n type test/leaf\nend-volume\nvolume top\n type test/pass\n subvolumes leaf\nend-volume\n";
        let GraphDiff::Structure(why) = old.diff(&check(fewer).expect("valid")) else { panic!("structure") };
        assert_eq!(why, "volumes removed 'mid'");
    }

    #[test]
    fn a_changed_module_file_is_a_structural_change() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("module.bin");
        std::fs::write(&file, b"one").expect("write");
        let text = CHAIN.replace("/srv/b1", &file.display().to_string());
        let old = check(&text).expect("valid");
        assert_eq!(old.files(), vec![file.clone()]);
        assert_eq!(old.diff(&check(&text).expect("valid")), GraphDiff::Same);
        std::fs::write(&file, b"two").expect("rewrite in place");
        let GraphDiff::Structure(why) = old.diff(&check(&text).expect("valid")) else { panic!("structure") };
        assert_eq!(why, "volume 'leaf': the file option 'directory' names changed");
        // Naming another file is an option change.
        let other = tmp.path().join("other.bin");
        std::fs::write(&other, b"three").expect("write");
        let GraphDiff::Options(c) =
            old.diff(&check(&CHAIN.replace("/srv/b1", &other.display().to_string())).expect("valid"))
        else {
            panic!("options")
        };
        assert_eq!(c[0].values[0].key, "directory");
    }

    #[test]
    fn reconfigure_is_all_or_nothing() {
        let g = build(CHAIN);
        take_log();
        let before = g.describe();
        // mid takes 8, then top refuses 13: mid gets 4 back.
        let bad = CHAIN
            .replace("thread-count 4", "thread-count 8")
            .replace("subvolumes mid", "option thread-count 13\n subvolumes mid");
        let e = g.reconfigure(check(&bad).expect("valid")).expect_err("refused");
        assert_eq!(e.to_string(), "volume 'top' (test/pass): thread-count 16 -> 13: refused: 13 is unlucky");
        assert_eq!(take_log(), ["mid:reconfigure:8", "mid:reconfigure:4"]);
        assert_eq!(g.describe(), before, "the running spec is unchanged");
        // A leaf that cannot reconfigure says so.
        let e = g.reconfigure(check(&CHAIN.replace("/srv/b1", "/srv/b2")).expect("valid")).expect_err("unsupported");
        assert!(matches!(e, ReconfigureFailure::Unsupported { .. }), "{e}");
        // Structure is refused; a good change applies and shows.
        assert!(matches!(g.reconfigure(check(DIAMOND).expect("valid")), Err(ReconfigureFailure::Structure(_))));
        let changes =
            g.reconfigure(check(&CHAIN.replace("thread-count 4", "thread-count 9")).expect("valid")).expect("applies");
        assert_eq!(changes.len(), 1);
        assert_eq!(take_log(), ["mid:reconfigure:9"]);
        assert!(g.describe().contains("thread-count 9"), "{}", g.describe());
        assert!(
            g.reconfigure(check(&CHAIN.replace("thread-count 4", "thread-count 9")).expect("valid"))
                .expect("same")
                .is_empty()
        );
    }

    const DYN_OPTS: &[OptionDecl] =
        &[OptionDecl::new("module", OptType::Path), OptionDecl::new("depth", OptType::Int).range(1.0, 3.0)];

    /// A dynamic type: its volume's `module` option picks the child count.
    fn specialize_dyn(given: &[(&str, &str)]) -> Result<XlatorType, String> {
        match given.iter().find(|(k, _)| *k == "module").map(|(_, v)| *v) {
            None => Err("option 'module' is required".into()),
            Some("/leaf") => {
                Ok(XlatorType { name: "test/dyn", options: DYN_OPTS, min_children: 0, max_children: 0, ..LEAF })
            }
            Some(other) => Err(format!("{other}: no such module")),
        }
    }

    #[test]
    fn dynamic_types_validate_against_their_specialized_type() {
        let mut r = registry();
        let generic = XlatorType { name: "test/dyn", options: &DYN_OPTS[..1], ..LEAF };
        r.register_dynamic(generic, specialize_dyn).expect("new type");
        let check = |text: &str| GraphSpec::validate(&Volfile::parse(text, "d.vol").expect("parses"), &r);
        let spec =
            check("volume d\n type test/dyn\n option module /leaf\n option depth 2\nend-volume\n").expect("valid");
        assert!(spec.describe().contains("depth 2"), "{}", spec.describe());
        // The specialized declarations are the ones checked.
        let e =
            check("volume d\n type test/dyn\n option module /leaf\n option depth 9\nend-volume\n").expect_err("range");
        assert_eq!(e.line, 4);
        assert!(e.to_string().contains("out of range"), "{e}");
        // The specializer's refusal points at `option module`, or the type.
        let e = check("volume d\n type test/dyn\n\n option module /other\nend-volume\n").expect_err("refused");
        assert_eq!(e.to_string(), "d.vol:4: volume 'd' (test/dyn): /other: no such module");
        let e = check("volume d\n type test/dyn\nend-volume\n").expect_err("no module");
        assert_eq!(e.to_string(), "d.vol:2: volume 'd' (test/dyn): option 'module' is required");
        // So are its child counts.
        let e = check("volume l\n type test/leaf\nend-volume\nvolume d\n type test/dyn\n option module /leaf\n subvolumes l\nend-volume\n")
            .expect_err("a leaf");
        assert!(e.to_string().ends_with("expected no subvolumes, found 1"), "{e}");
    }
}
