//! The checked graph spec and its diff: [`GraphSpec::validate`] checks a
//! volfile against a registry (types, subvolumes, cycles, one top, child
//! counts, options) without building anything, and [`GraphSpec::diff`]
//! tells an options-only change from a structural one; with the errors
//! that name the volfile line.

use super::*;
use xlfs_sdk::options::{OptType, OptionDecl, declaration, module_file};

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

pub(super) fn quoted(names: &[String]) -> String {
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

pub(super) fn child_range(min: usize, max: usize) -> String {
    let n = |k: usize| if k == 1 { "1 subvolume".to_string() } else { format!("{k} subvolumes") };
    match (min, max) {
        (0, 0) => "no subvolumes".into(),
        (a, b) if a == b => format!("exactly {}", n(a)),
        (a, usize::MAX) => format!("at least {}", n(a)),
        (0, b) => format!("at most {}", n(b)),
        (a, b) => format!("{a} to {b} subvolumes"),
    }
}

/// One volume of a validated graph.
#[derive(Clone, Debug)]
pub(super) struct SpecNode {
    pub(super) name: Arc<str>,
    pub(super) line: usize,
    pub(super) ty: XlatorType,
    pub(super) options: Options,
    pub(super) children: Vec<usize>,
    /// The SHA-256 of the content of each file an option names (plugin
    /// modules, policy modules), by option: a module rebuilt in place is a
    /// change even though the volfile is not.
    pub(super) files: Vec<(String, [u8; 32])>,
}

/// Largest file hashed for [`SpecNode::files`] (plugin modules are limited
/// to this size too).
pub(super) const MAX_HASHED_FILE: u64 = 512 << 20;

/// The files a node's module options name ([`OptType::Module`]: plugin
/// and policy modules), by option key; only options declared so are
/// files, whatever other values look like.
pub(super) fn module_files<'a>(
    decls: &'a [OptionDecl],
    options: &'a Options,
) -> impl Iterator<Item = (&'a str, std::path::PathBuf)> + 'a {
    options.iter().filter_map(move |(key, value, _)| {
        let decl = declaration(decls, key)?;
        match (decl.ty, value) {
            (OptType::Module, OptValue::Str(s)) => module_file(s).map(|p| (key, p.to_path_buf())),
            _ => None,
        }
    })
}

/// The content hash of each module file a node's options name, by option.
/// A plugin's own module hashes as the content its declarations (`decls`)
/// were read from, so that a file rewritten during validation is seen as
/// changed by the next reload rather than run under the old module's
/// options. Other files are read: one larger than [`MAX_HASHED_FILE`] or
/// unreadable hashes as what went wrong (a later readable one differs).
pub(super) fn files_hash(decls: &[OptionDecl], options: &Options) -> Vec<(String, [u8; 32])> {
    let loaded = crate::plugin::loaded_hash(decls);
    module_files(decls, options)
        .map(|(key, path)| {
            if let (Some(hash), crate::plugin::MODULE_OPTION) = (loaded, key) {
                return (key.to_string(), hash);
            }
            let bytes = match std::fs::metadata(&path) {
                Ok(m) if m.len() > MAX_HASHED_FILE => format!("larger than {MAX_HASHED_FILE} bytes").into_bytes(),
                _ => std::fs::read(&path).unwrap_or_else(|e| e.to_string().into_bytes()),
            };
            (key.to_string(), Sha256::digest(&bytes).into())
        })
        .collect()
}

/// A validated graph that is not built: every type known, every subvolume
/// defined, no cycle, one top, child counts and options valid. Built with
/// [`Graph::from_spec`]; printed with [`GraphSpec::describe`].
#[derive(Clone, Debug)]
pub struct GraphSpec {
    pub(super) origin: String,
    /// In file order.
    pub(super) nodes: Vec<SpecNode>,
    pub(super) top: usize,
    /// Children before parents (a depth-first post-order; reversed, it
    /// puts parents before children).
    pub(super) order: Vec<usize>,
    /// The policy loaders of the registry it was checked against, offered
    /// to every node it builds.
    pub(super) policies: xlfs_sdk::policy::Policies,
}

/// Depth-first post-order over `children` from each root; `Err` holds a
/// cycle as (path of node indexes ending at the repeated node, the node and
/// child position of the edge that closes it).
pub(super) fn post_order(
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
            let files = files_hash(ty.options, &options);
            nodes.push(SpecNode { name: Arc::from(v.name.as_str()), line: v.line, ty, options, children: kids, files });
        }
        Ok(GraphSpec { origin: volfile.origin.clone(), nodes, top, order, policies: registry.policies().clone() })
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
            self.nodes.iter().flat_map(|n| module_files(n.ty.options, &n.options).map(|(_, p)| p)).collect();
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
