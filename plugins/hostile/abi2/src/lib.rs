//! A plugin that declares plugin ABI 2.0: a v1 host must refuse it at load,
//! naming both versions, before calling anything else. It exports the v1
//! entry points' names too, so only the version marker tells it apart.

/// The version marker: built for ABI v2.0.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_abi_version_2_0() {}

/// Would describe the plugin; a v1 host must never call it.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_describe(_host: usize) -> i32 {
    -1
}

/// Would build an instance; a v1 host must never call it.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_init(_host: usize, _opts: usize, _len: u32) -> usize {
    0
}
