//! Policies: small decision interfaces a built-in translator consults at
//! chosen points, so the decision can be swapped (by option, or for a
//! plugin module) without touching the translator.
//!
//! A policy sees plain-data events and a plain-data view of the state and
//! answers with a plain-data decision; nothing in the types is specific to
//! Rust, so the plugin hosts (WebAssembly, dylib) carry them in the plugin
//! ABI (v1.1, `sdk/PLUGIN-ABI.md` section 11).
//!
//! - [`lock_contention`]: when cluster/replicate releases an eager lock.
//! - [`read_ahead`]: what performance/read-ahead prefetches and drops.
//!
//! Each option that names a policy (declared [`OptType::Module`]) takes a
//! built-in name or `<scheme>:<spec>`, handed to the loader the graph
//! offers for the scheme in [`InitCtx::policies`](crate::InitCtx): the
//! runtime offers `wasm` and `dylib` (spec: the module's absolute path).
//! Nothing here is process-global: two graphs may offer different loaders.
//!
//! [`OptType::Module`]: crate::OptType::Module

use std::sync::Arc;

use self::lock_contention::LockContentionPolicy;
use self::read_ahead::ReadAheadPolicy;

pub mod lock_contention;
pub mod read_ahead;

/// Builds a policy from the part of an option value after `scheme:`.
pub type Loader<P> = Arc<dyn Fn(&str) -> Result<Arc<P>, String> + Send + Sync>;

/// Why a policy could not be had.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// Neither a built-in name nor `scheme:spec` with a registered scheme.
    #[error("unknown {what} policy '{name}': expected one of {} or <scheme>:<module> with a registered scheme ({})", .builtin.join(", "), if .schemes.is_empty() { "none registered".to_string() } else { .schemes.join(", ") })]
    Unknown {
        /// The kind of policy.
        what: &'static str,
        /// The value given.
        name: String,
        /// The built-in names.
        builtin: &'static [&'static str],
        /// The schemes registered.
        schemes: Vec<String>,
    },
    /// The loader failed.
    #[error("{what} policy '{name}': {reason}")]
    Load {
        /// The kind of policy.
        what: &'static str,
        /// The value given.
        name: String,
        /// The loader's message.
        reason: String,
    },
}

/// The policy loaders a graph offers its translators, by scheme, for each
/// kind of policy; built-in names need none. `Default` offers only the
/// built-ins.
#[derive(Clone, Default)]
pub struct Policies {
    read_ahead: Vec<(String, Loader<dyn ReadAheadPolicy>)>,
    lock_contention: Vec<(String, Loader<dyn LockContentionPolicy>)>,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies")
            .field("read_ahead", &self.read_ahead.iter().map(|(s, _)| s).collect::<Vec<_>>())
            .field("lock_contention", &self.lock_contention.iter().map(|(s, _)| s).collect::<Vec<_>>())
            .finish()
    }
}

impl Policies {
    /// Offers `loader` for read-ahead policy values `scheme:...` (replacing
    /// an earlier one for the scheme).
    pub fn with_read_ahead(mut self, scheme: &str, loader: read_ahead::Loader) -> Policies {
        put(&mut self.read_ahead, scheme, loader);
        self
    }
    /// Offers `loader` for lock-contention policy values `scheme:...`.
    pub fn with_lock_contention(mut self, scheme: &str, loader: lock_contention::Loader) -> Policies {
        put(&mut self.lock_contention, scheme, loader);
        self
    }
    /// The read-ahead policy an option value names: a built-in name, or
    /// `scheme:spec` handed to the scheme's loader (`wasm:/path/ra.wasm`).
    pub fn read_ahead(&self, value: &str) -> Result<Arc<dyn ReadAheadPolicy>, PolicyError> {
        resolve(&self.read_ahead, "read-ahead", read_ahead::BUILTIN, read_ahead::builtin, value)
    }
    /// The lock-contention policy an option value names, likewise.
    pub fn lock_contention(&self, value: &str) -> Result<Arc<dyn LockContentionPolicy>, PolicyError> {
        resolve(&self.lock_contention, "lock-contention", lock_contention::BUILTIN, lock_contention::builtin, value)
    }
}

fn put<P: ?Sized>(list: &mut Vec<(String, Loader<P>)>, scheme: &str, loader: Loader<P>) {
    match list.iter_mut().find(|(s, _)| s == scheme) {
        Some(slot) => slot.1 = loader,
        None => list.push((scheme.to_string(), loader)),
    }
}

/// The policy `value` names: `builtin(value)`, or `scheme:spec` handed to
/// the scheme's loader.
fn resolve<P: ?Sized>(
    loaders: &[(String, Loader<P>)],
    what: &'static str,
    names: &'static [&'static str],
    builtin: impl Fn(&str) -> Option<Arc<P>>,
    value: &str,
) -> Result<Arc<P>, PolicyError> {
    let value = value.trim();
    if let Some(p) = builtin(value) {
        return Ok(p);
    }
    if let Some((scheme, spec)) = value.split_once(':')
        && let Some((_, loader)) = loaders.iter().find(|(s, _)| s == scheme)
    {
        return loader(spec).map_err(|reason| PolicyError::Load { what, name: value.to_string(), reason });
    }
    Err(PolicyError::Unknown {
        what,
        name: value.to_string(),
        builtin: names,
        schemes: loaders.iter().map(|(s, _)| s.clone()).collect(),
    })
}
