//! The host functions a guest calls: their WebAssembly import names, the
//! `wind` flags and buffer handle constants, the log levels, and the table
//! a native guest gets them through ([`HostVtable`]).

use std::ffi::c_void;

/// The WebAssembly import module of every host function.
pub const IMPORT_MODULE: &str = "xlfs";

/// The host functions' WebAssembly import names (module [`IMPORT_MODULE`]);
/// the native vtable has a field of each name.
pub mod imports {
    /// Wind a call to a child.
    pub const WIND: &str = "wind";
    /// Unwind a frame.
    pub const UNWIND: &str = "unwind";
    /// Arm a timer.
    pub const TIMER_SET: &str = "timer_set";
    /// Cancel a timer.
    pub const TIMER_CANCEL: &str = "timer_cancel";
    /// Read a per-inode value.
    pub const INODE_CTX_GET: &str = "inode_ctx_get";
    /// Set a per-inode value.
    pub const INODE_CTX_SET: &str = "inode_ctx_set";
    /// Delete a per-inode value.
    pub const INODE_CTX_DEL: &str = "inode_ctx_del";
    /// Read a per-fd value.
    pub const FD_CTX_GET: &str = "fd_ctx_get";
    /// Set a per-fd value.
    pub const FD_CTX_SET: &str = "fd_ctx_set";
    /// Delete a per-fd value.
    pub const FD_CTX_DEL: &str = "fd_ctx_del";
    /// Log a line.
    pub const LOG: &str = "log";
    /// A monotonic clock.
    pub const NOW_NS: &str = "now_ns";
    /// Length of a buffer.
    pub const BUF_LEN: &str = "buf_len";
    /// Copy bytes out of a buffer.
    pub const BUF_READ: &str = "buf_read";
    /// Make a buffer from guest bytes.
    pub const BUF_NEW: &str = "buf_new";
    /// A sub-range of a buffer, without a copy.
    pub const BUF_SLICE: &str = "buf_slice";
    /// Release a buffer handle.
    pub const BUF_FREE: &str = "buf_free";
    /// Hand the descriptor to the host (only during `xlfs_describe`).
    pub const DECLARE: &str = "declare";
}

/// `wind` flag: the frame ends with this call; the host unwinds the frame
/// with the child's result itself and does not call `xlfs_on_reply`.
pub const WIND_TAIL: u32 = 1;
/// `wind` flag (plugin ABI v1.3): the call is the frame's own fop as it
/// arrived, with the frame's caller; the message must be empty (`len` 0).
/// The host reuses the fop it decoded, so nothing is encoded or decoded
/// again. `payload` is the WRITE data, as for any wind.
pub const WIND_AS_IS: u32 = 2;
/// The buffer handle meaning "no buffer".
pub const NO_BUF: u32 = 0;

/// Log levels of the `log` host function.
pub mod log_level {
    /// Something failed.
    pub const ERROR: u32 = 1;
    /// Something is odd.
    pub const WARN: u32 = 2;
    /// Normal operation.
    pub const INFO: u32 = 3;
    /// Detail for debugging.
    pub const DEBUG: u32 = 4;
    /// Everything.
    pub const TRACE: u32 = 5;
}

/// The host functions of a native (dylib) guest: the same functions a
/// WebAssembly guest imports from module [`IMPORT_MODULE`], each taking
/// [`HostVtable::ctx`] first. The host passes a pointer to this table to
/// `xlfs_describe` and `xlfs_init`; it stays valid until `xlfs_fini`.
/// Fields are only ever appended (by minor versions); `size` says how many
/// the host has.
#[repr(C)]
#[allow(missing_docs)] // each function is the import of the same name, see PLUGIN-ABI.md
pub struct HostVtable {
    /// `size_of::<HostVtable>()` as the host built it.
    pub size: u32,
    /// The host's ABI major version.
    pub major: u16,
    /// The host's ABI minor version.
    pub minor: u16,
    /// The host's context, passed back as each function's first argument.
    pub ctx: *mut c_void,
    pub wind: unsafe extern "C" fn(*mut c_void, u64, u32, u32, *const u8, u32, u32) -> i64,
    pub unwind: unsafe extern "C" fn(*mut c_void, u64, *const u8, u32, u32) -> i32,
    pub timer_set: unsafe extern "C" fn(*mut c_void, u64) -> i64,
    pub timer_cancel: unsafe extern "C" fn(*mut c_void, u64) -> i32,
    pub inode_ctx_get: unsafe extern "C" fn(*mut c_void, *const u8, *mut u64) -> i32,
    pub inode_ctx_set: unsafe extern "C" fn(*mut c_void, *const u8, u64) -> i32,
    pub inode_ctx_del: unsafe extern "C" fn(*mut c_void, *const u8) -> i32,
    pub fd_ctx_get: unsafe extern "C" fn(*mut c_void, u64, *mut u64) -> i32,
    pub fd_ctx_set: unsafe extern "C" fn(*mut c_void, u64, u64) -> i32,
    pub fd_ctx_del: unsafe extern "C" fn(*mut c_void, u64) -> i32,
    pub log: unsafe extern "C" fn(*mut c_void, u32, *const u8, u32),
    pub now_ns: unsafe extern "C" fn(*mut c_void) -> u64,
    pub buf_len: unsafe extern "C" fn(*mut c_void, u32) -> i64,
    pub buf_read: unsafe extern "C" fn(*mut c_void, u32, u64, *mut u8, u32) -> i64,
    pub buf_new: unsafe extern "C" fn(*mut c_void, *const u8, u32) -> i64,
    pub buf_slice: unsafe extern "C" fn(*mut c_void, u32, u64, u64) -> i64,
    pub buf_free: unsafe extern "C" fn(*mut c_void, u32) -> i32,
    pub declare: unsafe extern "C" fn(*mut c_void, *const u8, u32) -> i32,
}
