//! What the runtime's fuzz targets check, shared by them: each parser takes
//! any input without panicking, and what it accepts holds together.

use std::sync::OnceLock;

use xlfs_runtime::fuse::MountOptions;
use xlfs_runtime::graph::GraphSpec;
use xlfs_runtime::registry::Registry;
use xlfs_runtime::volfile::Volfile;
use xlfs_sdk::options::Options;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::builtin)
}

/// A volfile: parsed, and what parses validated against the built-in
/// translators (options parsed by their declarations, the tree checked).
pub fn volfile(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(v) = Volfile::parse(&text, "fuzz") {
        let _ = GraphSpec::validate(&v, registry());
    }
}

/// An option value: the first byte picks a registered translator type,
/// the rest is the value given to each option it declares.
pub fn options(data: &[u8]) {
    let Some((&pick, value)) = data.split_first() else { return };
    let names = registry().names();
    let Some(ty) = registry().get(names[pick as usize % names.len()]) else { return };
    let value = String::from_utf8_lossy(value);
    for decl in ty.options {
        if let Ok(o) = Options::resolve(ty.options, [(decl.name, value.as_ref())]) {
            // Accepted: resolving again with the defaults filled agrees.
            let again = Options::resolve(ty.options, [(decl.name, value.as_ref())]);
            assert_eq!(Ok(o), again, "{}: {:?}", decl.name, value);
        }
    }
}

/// A mount option string (`xlfs mount -o`).
pub fn mount_options(data: &[u8]) {
    let _ = MountOptions::parse(&String::from_utf8_lossy(data));
}
