//! Plugin hosts: translators loaded at run time, as a WebAssembly module
//! (`type plugin/wasm`, run by wasmtime) or as a native shared library
//! (`type plugin/dylib`, loaded with libloading), both speaking the plugin
//! ABI v1.4 (`sdk/PLUGIN-ABI.md`; v1.0 to v1.3 plugins load too) and both adapted into the native [`Xlator`]
//! trait, so a plugin can sit anywhere in a graph:
//!
//! ```text
//! volume logged
//!     type plugin/dylib
//!     option module /usr/lib/xlfs/libxlfs_plugin_access_log.so
//!     option log-level debug        # declared by the plugin itself
//!     subvolumes below
//! end-volume
//! ```
//!
//! - Loading (`load`): the file is read and hashed (SHA-256); modules are
//!   cached by that hash, so a module is compiled once however many nodes
//!   and graphs use it, and kept loaded while any does. The version marker
//!   export (`xlfs_abi_version_<major>_<minor>`) is checked before anything
//!   in the module runs: another major, or a newer minor, is refused naming
//!   both versions. Then the module describes itself: its options, which
//!   fops and events it wants, how many children it takes.
//! - Validation: both types are *dynamic* in the [`Registry`]: the graph
//!   validates a volume's options against the host's options (below) plus
//!   the ones the module declares, before any node is built.
//! - Nodes (`node.rs`, `node/`): one guest instance per graph node. Fops the module
//!   does not want pass to child 0 without entering it; a fop that enters
//!   it is driven in its own task (wound calls polled there, replies handed
//!   to the guest as they come), with no task spawn or channel per fop.
//! - Faults: a trap, a missed call deadline, a failed handler (the SDK's
//!   failure code, as for a caught panic in a native plugin) fail that node's fops in flight with EIO, are
//!   logged with the reason, and drop the instance; the next call makes a new
//!   one. `crash-loop-limit` crashes within `crash-loop-window` disable the
//!   plugin: its fops then fail with EIO (fail closed), logged, until the
//!   graph is rebuilt; the rest of the graph keeps working. A frame the
//!   plugin never unwinds fails with EIO after `frame-timeout`.
//! - Policies (`policy.rs`, plugin ABI v1.1): a module that exports a
//!   read-ahead or lock-contention policy serves performance/read-ahead's
//!   `policy` and cluster/replicate's `lock-contention-policy` when they are
//!   set to `wasm:<path>` or `dylib:<path>`; [`register`] registers those
//!   loaders. A failing policy call falls back to the built-in default.
//! - Dump and reconfigure (`node/xlator.rs`, plugin ABI v1.2, optional exports):
//!   a node's dump adds the plugin's own pairs (`xlfs_dump`) to the host's
//!   counters; an options-only reload hands a node its new plugin options
//!   in place (`xlfs_reconfigure`, validated against the declarations
//!   first), keeping the instance; a module without it is rebuilt, and a
//!   refusal fails the reload with the old options kept.
//! - A native plugin runs in the process: it is trusted code. The host
//!   checks what crosses the boundary; its vtable functions catch the
//!   host's own panics. Nothing can unwind out of the plugin's `extern "C"`
//!   exports: the SDK's export macro catches a Rust plugin's panics and
//!   returns the failure code, and a plugin built without it that unwinds
//!   aborts the process (`dylib.rs`). It cannot be interrupted or
//!   memory-limited: use WebAssembly for untrusted plugins.
//!
//! [`Xlator`]: xlfs_sdk::Xlator

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use xlfs_sdk::abi::{self, AbiVersion, VersionError};
use xlfs_sdk::guest::sys::{self, DeclaredOption, DeclaredType, Descriptor, NodeExports, PolicyExports};
use xlfs_sdk::options::{Opt, kind};
use xlfs_sdk::{InitCtx, InitError, OptType, OptionDecl, Options, Xlator, XlatorType};

use crate::registry::{Registry, RegistryError};

mod dylib;
mod node;
mod policy;
mod wasm;

use node::{Core, GuestLimits, Module, NodeLimits, PluginXlator};

/// The engine a plugin runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A core WebAssembly module (`.wasm`), sandboxed by wasmtime.
    Wasm,
    /// A native shared library (cdylib), trusted, in-process.
    Dylib,
}

impl Kind {
    /// The volfile type name: `plugin/wasm` or `plugin/dylib`.
    pub fn type_name(self) -> &'static str {
        match self {
            Kind::Wasm => "plugin/wasm",
            Kind::Dylib => "plugin/dylib",
        }
    }

    fn host_options(self) -> &'static [OptionDecl] {
        match self {
            Kind::Wasm => WASM_OPTIONS,
            Kind::Dylib => DYLIB_OPTIONS,
        }
    }

    /// Its `module` option.
    fn module(self) -> Opt<kind::Module> {
        match self {
            Kind::Wasm => WASM_MODULE,
            Kind::Dylib => DYLIB_MODULE,
        }
    }
}

const FRAME_TIMEOUT: Opt<kind::Time> = Opt::time("frame-timeout", "1800s")
    .range(0.01, 86400.0)
    .desc("A fop the plugin has not unwound after this long fails with EIO (the plugin's later unwind is ignored).");
const MAX_FRAMES: Opt<kind::Int> = Opt::int("max-frames", "4096")
    .range(1.0, 1048576.0)
    .desc("Most fops in the plugin at once; more wait for a slot. Calls it winds are bounded at four times this.");
const CRASH_LIMIT: Opt<kind::Int> = Opt::int("crash-loop-limit", "5").range(1.0, 1000.0).desc(
    "This many crashes (traps, missed deadlines, failed handlers) within crash-loop-window disable the plugin: \
     its fops then fail with EIO until the graph is rebuilt.",
);
const CRASH_WINDOW: Opt<kind::Time> =
    Opt::time("crash-loop-window", "60s").range(0.001, 86400.0).desc("The window crash-loop-limit counts crashes in.");
/// The option naming a plugin's module file.
pub(crate) const MODULE_OPTION: &str = "module";
const WASM_MODULE: Opt<kind::Module> = Opt::optional(MODULE_OPTION)
    .desc("The plugin: a core WebAssembly module built for wasm32-unknown-unknown against xlfs-sdk (feature guest).");
const DYLIB_MODULE: Opt<kind::Module> = Opt::optional(MODULE_OPTION).desc(
    "The plugin: a native shared library (cdylib) built against xlfs-sdk (feature guest). It runs in the process \
     and is trusted.",
);
const MEMORY_LIMIT: Opt<kind::Size> = Opt::size("plugin-memory-limit", "64MB").range(65536.0, 4294967296.0).desc(
    "Most linear memory the plugin instance may grow to; an allocation past it fails inside the plugin (usually a trap).",
);
const CALL_TIMEOUT: Opt<kind::Time> = Opt::time("plugin-call-timeout", "1s").range(0.001, 600.0).desc(
    "Longest one call into the plugin may run (checked every 10ms); past it the call traps and the instance restarts.",
);

/// The host's options of `plugin/wasm` (the module declares the rest).
pub const WASM_OPTIONS: &[OptionDecl] = &[
    WASM_MODULE.decl,
    MEMORY_LIMIT.decl,
    CALL_TIMEOUT.decl,
    FRAME_TIMEOUT.decl,
    MAX_FRAMES.decl,
    CRASH_LIMIT.decl,
    CRASH_WINDOW.decl,
];

/// The host's options of `plugin/dylib` (the module declares the rest).
pub const DYLIB_OPTIONS: &[OptionDecl] =
    &[DYLIB_MODULE.decl, FRAME_TIMEOUT.decl, MAX_FRAMES.decl, CRASH_LIMIT.decl, CRASH_WINDOW.decl];

/// `plugin/wasm` as the registry holds it; each volume gets its module's
/// own type from `specialize_wasm`.
pub const WASM_TYPE: XlatorType = XlatorType {
    name: "plugin/wasm",
    description: "a translator from a WebAssembly plugin (option module: the .wasm file)",
    options: WASM_OPTIONS,
    min_children: 0,
    max_children: usize::MAX,
    build: build_wasm,
};

/// `plugin/dylib` as the registry holds it; each volume gets its module's
/// own type from `specialize_dylib`.
pub const DYLIB_TYPE: XlatorType = XlatorType {
    name: "plugin/dylib",
    description: "a translator from a native plugin library (option module: the .so file)",
    options: DYLIB_OPTIONS,
    min_children: 0,
    max_children: usize::MAX,
    build: build_dylib,
};

/// Adds `plugin/wasm` and `plugin/dylib` to a registry, and the `wasm:`
/// and `dylib:` loaders to the read-ahead and lock-contention policies it
/// offers its graphs.
pub fn register(r: &mut Registry) -> Result<(), RegistryError> {
    r.set_policies(policy::with_loaders(r.policies().clone()));
    r.register_dynamic(WASM_TYPE, specialize_wasm)?;
    r.register_dynamic(DYLIB_TYPE, specialize_dylib)
}

/// Why a plugin module could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The module's path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a plugin for this engine.
    #[error("{path}: not an xlfs plugin: {reason}")]
    NotAPlugin {
        /// The module's path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Built for an ABI version this host refuses.
    #[error("{path}: {source}")]
    Version {
        /// The module's path.
        path: PathBuf,
        /// Both versions.
        source: VersionError,
    },
    /// The engine could not compile, link or describe it.
    #[error("{path}: {reason}")]
    Load {
        /// The module's path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Largest module file accepted.
const MAX_MODULE_BYTES: u64 = 512 << 20;
/// Loaded modules kept when no node uses them (a volfile that turns a
/// plugin off and on again does not recompile it); each costs its compiled
/// code, about a MB for a small plugin, so few are kept.
const CACHE_IDLE: usize = 4;

/// A loaded module: what it declared and how to instantiate it.
pub(crate) struct Loaded {
    pub(crate) kind: Kind,
    pub(crate) path: PathBuf,
    pub(crate) version: AbiVersion,
    pub(crate) desc: Descriptor,
    /// The policies it exports (ABI v1.1).
    pub(crate) policies: PolicyExports,
    /// Which of `xlfs_dump` and `xlfs_reconfigure` it exports (ABI v1.2).
    pub(crate) node_exports: NodeExports,
    /// The host's options, then the module's (leaked once per module
    /// content: an [`XlatorType`] holds `'static` declarations).
    pub(crate) decls: &'static [OptionDecl],
    pub(crate) module: Box<dyn Module>,
}

type Key = (Kind, [u8; 32]);

/// What an engine found in a module it loaded.
pub(crate) struct Described {
    pub(crate) version: AbiVersion,
    pub(crate) desc: Descriptor,
    pub(crate) policies: PolicyExports,
    pub(crate) node_exports: NodeExports,
    pub(crate) module: Box<dyn Module>,
}

struct Cache {
    loaded: HashMap<Key, Arc<Loaded>>,
    /// Keys in least-recently-used order.
    lru: Vec<Key>,
    decls: HashMap<Key, &'static [OptionDecl]>,
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Cache { loaded: HashMap::new(), lru: Vec::new(), decls: HashMap::new() }))
}

/// Loads (or finds in the cache) the module at `path`.
pub(crate) fn load(kind: Kind, path: &Path) -> Result<Arc<Loaded>, PluginError> {
    let io = |source| PluginError::Io { path: path.to_path_buf(), source };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_MODULE_BYTES {
        return Err(PluginError::NotAPlugin {
            path: path.into(),
            reason: format!("{len} bytes, more than {MAX_MODULE_BYTES}"),
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    let key: Key = (kind, Sha256::digest(&bytes).into());
    {
        let mut c = cache().lock();
        if let Some(hit) = c.loaded.get(&key).cloned() {
            c.lru.retain(|k| *k != key);
            c.lru.push(key);
            return Ok(hit);
        }
    }
    let started = std::time::Instant::now();
    let Described { version, desc, policies, node_exports, module } = match kind {
        Kind::Wasm => wasm::load(path, &bytes, &key.1)?,
        Kind::Dylib => dylib::load(path, &bytes)?,
    };
    tracing::info!(target: "xlfs::plugin", module = %path.display(), plugin = %desc.name, abi = %version,
        sha256 = %key.1[..8].iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "plugin module loaded in {:.0?}", started.elapsed());
    for o in &desc.options {
        if kind.host_options().iter().any(|h| h.name == o.name) {
            return Err(PluginError::Load {
                path: path.into(),
                reason: format!("the plugin declares option '{}', which is the host's own", o.name),
            });
        }
    }
    let mut c = cache().lock();
    let decls = *c.decls.entry(key).or_insert_with(|| leak_decls(kind.host_options(), &desc.options));
    let loaded =
        Arc::new(Loaded { kind, path: path.to_path_buf(), version, desc, policies, node_exports, decls, module });
    let loaded = c.loaded.entry(key).or_insert(loaded).clone();
    c.lru.retain(|k| *k != key);
    c.lru.push(key);
    // Forget the least recently used modules no node holds any more.
    let mut idle = c.lru.iter().filter(|k| c.loaded.get(*k).is_some_and(|l| Arc::strong_count(l) == 1)).count();
    let mut i = 0;
    while idle > CACHE_IDLE && i < c.lru.len() {
        let k = c.lru[i];
        if c.loaded.get(&k).is_some_and(|l| Arc::strong_count(l) == 1) {
            c.loaded.remove(&k);
            c.lru.remove(i);
            idle -= 1;
        } else {
            i += 1;
        }
    }
    Ok(loaded)
}

/// How many compiled modules this process holds: those some node uses,
/// plus at most [`CACHE_IDLE`] idle ones (a module is only let go of by
/// the cache, and only once no node holds it).
pub(crate) fn modules_loaded() -> usize {
    cache().lock().loaded.len()
}

/// The content hash of the loaded module whose options `decls` are (the
/// type [`specialize`] gave a volume), if `decls` came from one: what a
/// graph validated against that module names, even if the file has
/// changed since.
pub(crate) fn loaded_hash(decls: &[OptionDecl]) -> Option<[u8; 32]> {
    let c = cache().lock();
    c.decls.iter().find(|&(_, &d)| std::ptr::eq(d, decls)).map(|(k, _)| k.1)
}

/// Remembers `decls` as those of a module with content `bytes`, as
/// [`load`] does (for tests that need no real module).
#[cfg(test)]
pub(crate) fn remember_decls(kind: Kind, bytes: &[u8], plugin: &[DeclaredOption]) -> &'static [OptionDecl] {
    let key: Key = (kind, Sha256::digest(bytes).into());
    cache().lock().decls.entry(key).or_insert_with(|| leak_decls(kind.host_options(), plugin))
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn leak_decls(host: &'static [OptionDecl], plugin: &[DeclaredOption]) -> &'static [OptionDecl] {
    let mut all = host.to_vec();
    for o in plugin {
        let ty = match &o.ty {
            DeclaredType::Bool => OptType::Bool,
            DeclaredType::Int => OptType::Int,
            DeclaredType::Size => OptType::Size,
            DeclaredType::Time => OptType::Time,
            DeclaredType::Percent => OptType::Percent,
            DeclaredType::Str => OptType::Str,
            DeclaredType::Enum(words) => {
                OptType::Enum(Box::leak(words.iter().map(|w| leak(w)).collect::<Vec<_>>().into_boxed_slice()))
            }
            DeclaredType::List => OptType::List,
            DeclaredType::Path => OptType::Path,
        };
        let mut d = OptionDecl::new(leak(&o.name), ty).desc(leak(&o.description));
        if let Some(def) = &o.default {
            d = d.default(leak(def));
        }
        if let Some((lo, hi)) = o.range {
            d = d.range(lo, hi);
        }
        all.push(d);
    }
    Box::leak(all.into_boxed_slice())
}

/// Finds the version marker among export names and checks it against this
/// host: exactly one marker; same major, minor not newer.
pub(crate) fn check_version<'a>(path: &Path, names: impl Iterator<Item = &'a str>) -> Result<AbiVersion, PluginError> {
    let found: Vec<AbiVersion> = names.filter_map(sys::parse_version_symbol).collect();
    let version = match found.as_slice() {
        [v] => *v,
        [] => {
            return Err(PluginError::NotAPlugin {
                path: path.into(),
                reason: format!("it exports no {}<major>_<minor> version marker", sys::VERSION_PREFIX),
            });
        }
        many => {
            let list: Vec<String> = many.iter().map(|v| v.to_string()).collect();
            return Err(PluginError::NotAPlugin {
                path: path.into(),
                reason: format!("it exports several version markers ({})", list.join(", ")),
            });
        }
    };
    abi::check_compatible(sys::PLUGIN_ABI, version)
        .map_err(|source| PluginError::Version { path: path.into(), source })?;
    Ok(version)
}

/// Decodes what a module declared.
pub(crate) fn decode_descriptor(path: &Path, declared: Option<Vec<u8>>) -> Result<Descriptor, PluginError> {
    let bytes = declared.ok_or_else(|| PluginError::NotAPlugin {
        path: path.into(),
        reason: "xlfs_describe did not call declare".into(),
    })?;
    Descriptor::decode(&bytes).map_err(|e| PluginError::NotAPlugin { path: path.into(), reason: e.to_string() })
}

/// The plugin file an option `module` names: an absolute path (a plugin
/// module has no built-in names or schemes).
fn module_path(raw: &str) -> Result<PathBuf, String> {
    let raw = raw.trim();
    match xlfs_sdk::options::module_file(raw) {
        Some(p) if p.as_os_str() == raw => Ok(p.to_path_buf()),
        _ => Err(format!("option 'module': '{raw}' is not an absolute path")),
    }
}

fn specialize(kind: Kind, given: &[(&str, &str)]) -> Result<XlatorType, String> {
    let what = match kind {
        Kind::Wasm => "its .wasm file",
        Kind::Dylib => "its shared library",
    };
    let Some((_, raw)) = given.iter().rev().find(|(k, _)| *k == kind.module().name()) else {
        return Err(format!("option 'module' is required: the path of {what}"));
    };
    let path = module_path(raw)?;
    let l = load(kind, &path).map_err(|e| e.to_string())?;
    let max = if l.desc.max_children == sys::UNLIMITED_CHILDREN { usize::MAX } else { l.desc.max_children as usize };
    let generic = match kind {
        Kind::Wasm => WASM_TYPE,
        Kind::Dylib => DYLIB_TYPE,
    };
    Ok(XlatorType { options: l.decls, min_children: l.desc.min_children as usize, max_children: max, ..generic })
}

fn specialize_wasm(given: &[(&str, &str)]) -> Result<XlatorType, String> {
    specialize(Kind::Wasm, given)
}

fn specialize_dylib(given: &[(&str, &str)]) -> Result<XlatorType, String> {
    specialize(Kind::Dylib, given)
}

fn build_wasm(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    build(Kind::Wasm, init)
}

fn build_dylib(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    build(Kind::Dylib, init)
}

/// The limits a node's options set (defaults when absent).
fn node_limits(o: &Options) -> NodeLimits {
    NodeLimits {
        frame_timeout: FRAME_TIMEOUT.get(o),
        max_frames: MAX_FRAMES.count(o).max(1),
        crash_limit: CRASH_LIMIT.count(o).max(1),
        crash_window: CRASH_WINDOW.get(o),
    }
}

fn build(kind: Kind, init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let raw = kind.module().given(&init.options).ok_or_else(|| InitError::new("option 'module' is required"))?;
    let path = module_path(raw).map_err(InitError::new)?;
    let l = load(kind, &path).map_err(|e| InitError::new(e.to_string()))?;
    // The graph validated the options against the module it loaded then;
    // if the file changed since, check them against what it is now.
    let given: Vec<(String, String)> =
        init.options.iter().filter(|(_, _, set)| *set).map(|(k, v, _)| (k.to_string(), v.to_string())).collect();
    Options::resolve(l.decls, given.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| InitError::new(format!("{}: {e}", path.display())))?;
    let limits = node_limits(&init.options);
    let guest_limits = GuestLimits {
        memory: usize::try_from(MEMORY_LIMIT.get(&init.options)).unwrap_or(usize::MAX),
        call_timeout: CALL_TIMEOUT.get(&init.options),
    };
    let name = init.name.clone();
    let core = Core::new(init.name, init.children, init.events, limits, guest_limits, init.options, l);
    core.start().map_err(|why| InitError::new(format!("plugin {} ({}): init failed: {why}", name, path.display())))?;
    Ok(Arc::new(PluginXlator { core }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_marker_rules() {
        let p = Path::new("/m.wasm");
        assert_eq!(
            check_version(p, ["memory", "xlfs_abi_version_1_0", "xlfs_init"].into_iter()).expect("v1.0"),
            AbiVersion::new(1, 0)
        );
        assert_eq!(check_version(p, ["xlfs_abi_version_1_1"].into_iter()).expect("v1.1"), AbiVersion::new(1, 1));
        let e = check_version(p, ["xlfs_abi_version_2_0"].into_iter()).expect_err("major");
        assert_eq!(e.to_string(), "/m.wasm: ABI major version mismatch: host speaks v1.4, peer was built for v2.0");
        assert_eq!(check_version(p, ["xlfs_abi_version_1_2"].into_iter()).expect("v1.2"), AbiVersion::new(1, 2));
        assert_eq!(check_version(p, ["xlfs_abi_version_1_3"].into_iter()).expect("v1.3"), AbiVersion::new(1, 3));
        assert_eq!(check_version(p, ["xlfs_abi_version_1_4"].into_iter()).expect("v1.4"), AbiVersion::new(1, 4));
        let e = check_version(p, ["xlfs_abi_version_1_7"].into_iter()).expect_err("newer minor");
        assert!(e.to_string().contains("v1.7") && e.to_string().contains("v1.4"), "{e}");
        let e = check_version(p, ["xlfs_init"].into_iter()).expect_err("no marker");
        assert!(e.to_string().contains("no xlfs_abi_version_<major>_<minor> version marker"), "{e}");
        let e = check_version(p, ["xlfs_abi_version_1_0", "xlfs_abi_version_1_1"].into_iter()).expect_err("two");
        assert!(e.to_string().contains("several"), "{e}");
        // A plugin built for an older minor loads on a newer host: the rule
        // check_version applies, seen from a v1.4 host.
        assert!(abi::check_compatible(AbiVersion::new(1, 4), AbiVersion::new(1, 0)).is_ok());
    }

    #[test]
    fn declared_options_become_decls_after_the_hosts() {
        const PLUGIN: &[OptionDecl] = &[
            OptionDecl::new("level", OptType::Enum(&["info", "debug"])).default("info").desc("d"),
            OptionDecl::new("count", OptType::Int).range(1.0, 9.0),
        ];
        let declared: Vec<DeclaredOption> = PLUGIN.iter().map(DeclaredOption::from).collect();
        let decls = leak_decls(WASM_OPTIONS, &declared);
        assert_eq!(&decls[..WASM_OPTIONS.len()], WASM_OPTIONS);
        assert_eq!(&decls[WASM_OPTIONS.len()..], PLUGIN);
        let o = Options::resolve(decls, [("module", "/x.wasm"), ("level", "DEBUG")]).expect("valid");
        assert_eq!(o.str("level"), Some("debug"));
        assert_eq!(o.size("plugin-memory-limit"), Some(64 << 20));
        let e = Options::resolve(decls, [("count", "10")]).expect_err("range");
        assert!(e.to_string().contains("out of range"), "{e}");
    }

    #[test]
    fn specialize_needs_a_module() {
        let e = specialize(Kind::Wasm, &[("plugin-call-timeout", "1s")]).expect_err("no module");
        assert!(e.contains("option 'module' is required"), "{e}");
        let e = specialize(Kind::Dylib, &[("module", "relative.so")]).expect_err("relative");
        assert!(e.contains("absolute path"), "{e}");
        let e = specialize(Kind::Wasm, &[("module", "/nonexistent/x.wasm")]).expect_err("missing");
        assert!(e.starts_with("/nonexistent/x.wasm: ") && e.contains("No such file"), "{e}");
    }
}
