//! The registry of translator types: maps the `type` names used in volfiles
//! (`storage/posix`) to their [`XlatorType`] (options, child counts,
//! constructor). [`Registry::builtin`] holds the built-in translators and
//! the plugin hosts (`plugin/wasm`, `plugin/dylib`); more types are added
//! with [`Registry::register`].
//!
//! A *dynamic* type ([`Registry::register_dynamic`]) is one whose options
//! and child counts depend on the volume: a plugin host loads the module the
//! volume names and answers with the module's own declarations
//! ([`Specializer`]), against which the graph then validates the volume.

use std::collections::BTreeMap;

use xlfs_sdk::XlatorType;
use xlfs_sdk::policy::Policies;

/// Turns a dynamic type into the concrete type of one volume, given that
/// volume's options as written (key, value); the error says why the volume
/// cannot be of this type (its module is missing, of a refused ABI version,
/// ...).
pub type Specializer = fn(&[(&str, &str)]) -> Result<XlatorType, String>;

/// Translator types by name.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    types: BTreeMap<&'static str, XlatorType>,
    dynamic: BTreeMap<&'static str, Specializer>,
    policies: Policies,
}

/// Why a type could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// A type of that name is already registered.
    #[error("translator type '{0}' is already registered")]
    Duplicate(String),
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// The built-in translator types ([`xlfs_xlators::builtin_types`]) and
    /// the plugin hosts ([`crate::plugin::register`]).
    pub fn builtin() -> Registry {
        let mut r = Registry::new();
        for ty in xlfs_xlators::builtin_types() {
            // Built-in names are distinct; a clash is a programming error
            // that the registry's tests catch, so keep the first.
            if let Err(e) = r.register(ty) {
                tracing::error!("{e}");
            }
        }
        if let Err(e) = crate::plugin::register(&mut r) {
            tracing::error!("{e}");
        }
        r
    }

    /// Adds a dynamic type: `ty` is its generic form (its options are the
    /// ones every volume of the type takes), `specialize` gives each
    /// volume's concrete type. Refuses a name already present.
    pub fn register_dynamic(&mut self, ty: XlatorType, specialize: Specializer) -> Result<(), RegistryError> {
        let name = ty.name;
        self.register(ty)?;
        self.dynamic.insert(name, specialize);
        Ok(())
    }

    /// The policy loaders graphs built from this registry offer their
    /// translators ([`InitCtx::policies`](xlfs_sdk::InitCtx)).
    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// Replaces the policy loaders.
    pub fn set_policies(&mut self, policies: Policies) {
        self.policies = policies;
    }

    /// The specializer of a dynamic type.
    pub fn specializer(&self, name: &str) -> Option<Specializer> {
        self.dynamic.get(name).copied()
    }

    /// Adds a type; refuses a name already present.
    pub fn register(&mut self, ty: XlatorType) -> Result<(), RegistryError> {
        if self.types.contains_key(ty.name) {
            return Err(RegistryError::Duplicate(ty.name.to_string()));
        }
        self.types.insert(ty.name, ty);
        Ok(())
    }

    /// The type called `name`.
    pub fn get(&self, name: &str) -> Option<&XlatorType> {
        self.types.get(name)
    }

    /// Every registered type name, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        self.types.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlfs_sdk::{InitCtx, InitError};

    const TEST_TYPE: XlatorType = XlatorType {
        name: "test/extra",
        description: "test",
        options: &[],
        min_children: 0,
        max_children: 0,
        build: |_: InitCtx| Err(InitError::new("test only")),
    };

    #[test]
    fn builtin_holds_every_builtin_type_once() {
        let r = Registry::builtin();
        let builtin = xlfs_xlators::builtin_types();
        assert_eq!(r.names().len(), builtin.len() + 2, "duplicate built-in type names");
        for ty in builtin {
            assert_eq!(r.get(ty.name).map(|t| t.name), Some(ty.name));
            xlfs_sdk::options::check_decls(ty.options).unwrap_or_else(|e| panic!("{}: {e}", ty.name));
            assert!(r.specializer(ty.name).is_none());
        }
        assert!(r.names().contains(&"storage/posix"));
        for plugin in ["plugin/wasm", "plugin/dylib"] {
            assert!(r.get(plugin).is_some() && r.specializer(plugin).is_some(), "{plugin}");
        }
    }

    #[test]
    fn dynamic_types_refuse_duplicates_too() {
        fn spec(_: &[(&str, &str)]) -> Result<XlatorType, String> {
            Ok(TEST_TYPE)
        }
        let mut r = Registry::new();
        r.register_dynamic(TEST_TYPE, spec).expect("new name");
        assert!(r.specializer("test/extra").is_some());
        assert_eq!(r.register_dynamic(TEST_TYPE, spec), Err(RegistryError::Duplicate("test/extra".into())));
        assert_eq!(r.register(TEST_TYPE), Err(RegistryError::Duplicate("test/extra".into())));
    }

    #[test]
    fn register_adds_and_refuses_duplicates() {
        let mut r = Registry::builtin();
        assert!(r.get("test/extra").is_none());
        r.register(TEST_TYPE).expect("new name");
        assert_eq!(r.get("test/extra").map(|t| t.max_children), Some(0));
        assert_eq!(r.register(TEST_TYPE), Err(RegistryError::Duplicate("test/extra".into())));
        let names = r.names();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }
}
