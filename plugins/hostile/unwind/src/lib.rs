//! A native plugin written by hand, without the guest SDK (so without its
//! panic guard), whose `xlfs_describe` panics: the first export a host
//! calls, so `xlfs volfile check` reaches it. A panic cannot leave an
//! `extern "C"` function: Rust aborts the process ("panic in a function
//! that cannot unwind"). This is the contract `sdk/PLUGIN-ABI.md` section 8
//! states for native plugins built without the SDK; the runtime's tests
//! check that it holds (the process that loads this dies by SIGABRT) and
//! that nothing outside that process is affected. Only a native build
//! means anything: on WebAssembly a panic is a trap.

/// The version marker: plugin ABI v1.0.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_abi_version_1_0() {}

/// Panics: a plugin without the SDK's guard at its boundary.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_describe(_host: *const u8) -> i32 {
    panic!("xlfs test plugin: panic in xlfs_describe, outside the SDK's guard")
}

/// Never reached (describe aborts first); present because the host looks
/// up every export before describing.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_init(_host: *const u8, _opts: *const u8, _len: u32) -> usize {
    0
}

/// Never reached.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_on_fop(_inst: usize, _frame: u64, _msg: *const u8, _len: u32, _payload: u32) -> i32 {
    -1
}

/// Never reached.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_on_reply(
    _inst: usize,
    _frame: u64,
    _call: u64,
    _msg: *const u8,
    _len: u32,
    _payload: u32,
) -> i32 {
    -1
}

/// Never reached.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_on_timer(_inst: usize, _timer: u64) -> i32 {
    -1
}

/// Never reached.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_on_event(_inst: usize, _from: i32, _msg: *const u8, _len: u32) -> i32 {
    -1
}

/// Never reached.
#[unsafe(no_mangle)]
pub extern "C" fn xlfs_fini(_inst: usize) {}
