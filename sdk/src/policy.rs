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
//! Each option that names a policy takes a built-in name or
//! `<scheme>:<spec>`, handed to the loader registered for the scheme: the
//! runtime registers `wasm` and `dylib` (spec: the module's absolute path).

use std::sync::{Arc, RwLock};

pub mod lock_contention;
pub mod read_ahead;

/// Builds a policy from the part of an option value after `scheme:`.
pub type Loader<P> = Arc<dyn Fn(&str) -> Result<Arc<P>, String> + Send + Sync>;

/// Most loaders registered per kind of policy (one per plugin engine is
/// the use).
const MAX_LOADERS: usize = 16;

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
    /// Too many loaders registered.
    #[error("too many policy loaders registered (at most {MAX_LOADERS})")]
    TooManyLoaders,
}

/// The loaders of one kind of policy, by scheme.
pub(crate) struct Loaders<P: ?Sized + 'static> {
    what: &'static str,
    builtin: &'static [&'static str],
    list: RwLock<Vec<(String, Loader<P>)>>,
}

impl<P: ?Sized + 'static> Loaders<P> {
    pub(crate) const fn new(what: &'static str, builtin: &'static [&'static str]) -> Self {
        Loaders { what, builtin, list: RwLock::new(Vec::new()) }
    }

    /// Registers (or replaces) the loader for `scheme`.
    pub(crate) fn register(&self, scheme: &str, loader: Loader<P>) -> Result<(), PolicyError> {
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = l.iter_mut().find(|(s, _)| s == scheme) {
            slot.1 = loader;
            return Ok(());
        }
        if l.len() >= MAX_LOADERS {
            return Err(PolicyError::TooManyLoaders);
        }
        l.push((scheme.to_string(), loader));
        Ok(())
    }

    /// The policy `value` names: `builtin(value)`, or `scheme:spec` handed
    /// to the scheme's loader.
    pub(crate) fn resolve(&self, value: &str, builtin: impl Fn(&str) -> Option<Arc<P>>) -> Result<Arc<P>, PolicyError> {
        let value = value.trim();
        if let Some(p) = builtin(value) {
            return Ok(p);
        }
        let loaders = self.list.read().unwrap_or_else(|e| e.into_inner());
        if let Some((scheme, spec)) = value.split_once(':')
            && let Some((_, loader)) = loaders.iter().find(|(s, _)| s == scheme)
        {
            let loader = loader.clone();
            drop(loaders);
            return loader(spec).map_err(|reason| PolicyError::Load {
                what: self.what,
                name: value.to_string(),
                reason,
            });
        }
        Err(PolicyError::Unknown {
            what: self.what,
            name: value.to_string(),
            builtin: self.builtin,
            schemes: loaders.iter().map(|(s, _)| s.clone()).collect(),
        })
    }
}
