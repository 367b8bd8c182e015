//! Plugins: translators built against this SDK alone, loaded by the runtime
//! as a WebAssembly module (`wasm32-unknown-unknown`) or as a native
//! `cdylib`, through one flat C ABI (`sdk/PLUGIN-ABI.md`, C header
//! `sdk/include/xlfs_plugin.h`).
//!
//! - [`sys`] is the raw contract both sides share (names, flags, the native
//!   host vtable, the descriptor encoding, message framing). It is always
//!   compiled: the runtime's hosts use it.
//! - With the `guest` feature, the rest of this module is the guest SDK: an
//!   author implements `Plugin` and calls `export_plugin!`
//!   once; the same crate then builds as `.wasm` and as a cdylib. The SDK
//!   keeps per-frame state, hides the encoding and the buffer handles, and
//!   catches panics at the boundary.
//! - `policy` (ABI v1.1): a module can instead export a read-ahead and/or
//!   a lock-contention policy (`xlfs_sdk::policy`) with
//!   `export_policy!`; the host calls it from the
//!   built-in translators whose options name the module.
//!
//! ```ignore
//! use xlfs_sdk::guest::{Cx, Host, Plugin};
//! use xlfs_sdk::{Options, Request};
//!
//! struct Pass;
//! impl Plugin for Pass {
//!     type Frame = ();
//!     const NAME: &'static str = "pass";
//!     fn init(_host: Host, _options: &Options) -> Result<Pass, String> { Ok(Pass) }
//!     fn fop(&mut self, cx: &mut Cx<'_, ()>, req: Request) {
//!         if let Err(e) = cx.forward(&req) { cx.unwind(Err(e)) }
//!     }
//! }
//! xlfs_sdk::export_plugin!(Pass);
//! ```

pub mod sys;

#[cfg(feature = "guest")]
mod host;
#[cfg(feature = "guest")]
pub mod policy;
#[cfg(feature = "guest")]
mod rt;

#[cfg(feature = "guest")]
pub use host::{Buf, Host};
#[cfg(feature = "guest")]
pub use rt::{CallId, Ctl, Cx, Plugin, TimerId};
pub use sys::{EventSet, FopSet, Placement};

/// Glue for [`export_plugin!`](crate::export_plugin); not part of the API.
#[cfg(feature = "guest")]
#[doc(hidden)]
pub mod __rt {
    pub use super::policy::{lock_decide, lock_interest, ra_close, ra_open, ra_read, ra_reset};
    pub use super::rt::{alloc, describe, dump, fini, free, init, on_event, on_fop, on_reply, on_timer, reconfigure};
}

// The export macros spell the version marker out; it must follow the ABI.
// Every module they make exports xlfs_dump and xlfs_reconfigure and may
// forward fops and replies "as they came" and may declare a placement, so
// it is v1.4 (an older host refuses it, naming both versions).
const _: () =
    assert!(crate::abi::ABI_MAJOR == 1 && crate::abi::ABI_MINOR == 0, "update export_plugin!'s version marker");
const _: () = assert!(
    sys::PLUGIN_ABI.major == 1 && sys::PLUGIN_ABI.minor == 4,
    "update the version marker of export_plugin! and export_policy!"
);

/// Exports a [`Plugin`] type through the plugin ABI: the version marker
/// `xlfs_abi_version_1_4`, `xlfs_alloc`/`xlfs_free`, `xlfs_describe`,
/// `xlfs_init`, the `xlfs_on_*` handlers, `xlfs_fini`, and (v1.2)
/// `xlfs_dump` and `xlfs_reconfigure` (whose defaults report nothing and
/// leave reconfiguring to a new instance). Every handler is guarded: a
/// panic inside the plugin is caught (natively; on WebAssembly it traps),
/// logged, and returned as the failure code, which the host treats as a
/// crashed instance. Use it once, at the crate root of a `cdylib` crate.
#[cfg(feature = "guest")]
#[macro_export]
macro_rules! export_plugin {
    (@common $plugin:ty) => {
        /// Allocates `size` bytes for the host (null on failure).
        #[unsafe(no_mangle)]
        pub extern "C" fn xlfs_alloc(size: u32) -> *mut u8 {
            $crate::guest::__rt::alloc(size)
        }

        /// Frees what `xlfs_alloc` returned.
        ///
        /// # Safety
        /// `ptr` and `size` as returned by and given to `xlfs_alloc`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_free(ptr: *mut u8, size: u32) {
            unsafe { $crate::guest::__rt::free(ptr, size) }
        }

        /// Declares the plugin to the host.
        ///
        /// # Safety
        /// `host` as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_describe(host: *const $crate::guest::sys::HostVtable) -> i32 {
            unsafe { $crate::guest::__rt::describe::<$plugin>(host) }
        }

        /// Builds an instance.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_init(host: *const $crate::guest::sys::HostVtable, opts: *const u8, len: u32) -> usize {
            unsafe { $crate::guest::__rt::init::<$plugin>(host, opts, len) }
        }

        /// A fop arrived.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_on_fop(inst: usize, frame: u64, msg: *const u8, len: u32, payload: u32) -> i32 {
            unsafe { $crate::guest::__rt::on_fop::<$plugin>(inst, frame, msg, len, payload) }
        }

        /// A reply arrived.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_on_reply(
            inst: usize,
            frame: u64,
            call: u64,
            msg: *const u8,
            len: u32,
            payload: u32,
        ) -> i32 {
            unsafe { $crate::guest::__rt::on_reply::<$plugin>(inst, frame, call, msg, len, payload) }
        }

        /// A timer fired.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_on_timer(inst: usize, timer: u64) -> i32 {
            unsafe { $crate::guest::__rt::on_timer::<$plugin>(inst, timer) }
        }

        /// An event arrived.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_on_event(inst: usize, from: i32, msg: *const u8, len: u32) -> i32 {
            unsafe { $crate::guest::__rt::on_event::<$plugin>(inst, from, msg, len) }
        }

        /// The instance is done.
        ///
        /// # Safety
        /// `inst` as returned by `xlfs_init`, not used afterwards.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_fini(inst: usize) {
            unsafe { $crate::guest::__rt::fini::<$plugin>(inst) }
        }

        /// The instance's state for the host's dump (ABI v1.2).
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_dump(inst: usize, out: *mut u8, cap: u32) -> i32 {
            unsafe { $crate::guest::__rt::dump::<$plugin>(inst, out, cap) }
        }

        /// New options for the running instance (ABI v1.2).
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_reconfigure(inst: usize, opts: *const u8, len: u32) -> i32 {
            unsafe { $crate::guest::__rt::reconfigure::<$plugin>(inst, opts, len) }
        }
    };
    ($plugin:ty) => {
        /// The plugin ABI version marker (v1.4).
        #[unsafe(no_mangle)]
        pub extern "C" fn xlfs_abi_version_1_4() {}
        $crate::export_plugin!(@common $plugin);
    };
}

/// Exports policies through the plugin ABI v1.1 (`sdk/PLUGIN-ABI.md`
/// section 11): a read-ahead policy (a [`ReadAheadPolicy`] type), a
/// lock-contention policy (a [`LockContentionPolicy`] type), or both, each
/// made with `Default` when the host makes an instance. The module gets the
/// version marker `xlfs_abi_version_1_4`, every translator export (as a
/// translator it passes fops on: [`policy::Policies`]) and the exports of
/// the policies given. Use it once, at the crate root of a `cdylib` crate:
///
/// ```ignore
/// xlfs_sdk::export_policy!(read_ahead = MyReadAhead);
/// xlfs_sdk::export_policy!(lock_contention = MyLockPolicy);
/// xlfs_sdk::export_policy!(read_ahead = MyReadAhead, lock_contention = MyLockPolicy);
/// ```
///
/// [`ReadAheadPolicy`]: crate::policy::read_ahead::ReadAheadPolicy
/// [`LockContentionPolicy`]: crate::policy::lock_contention::LockContentionPolicy
#[cfg(feature = "guest")]
#[macro_export]
macro_rules! export_policy {
    (read_ahead = $ra:ty) => {
        $crate::export_policy!(@module $ra, $crate::guest::policy::Without);
        $crate::export_policy!(@ra $ra, $crate::guest::policy::Without);
    };
    (lock_contention = $lock:ty) => {
        $crate::export_policy!(@module $crate::guest::policy::Without, $lock);
        $crate::export_policy!(@lock $crate::guest::policy::Without, $lock);
    };
    (read_ahead = $ra:ty, lock_contention = $lock:ty) => {
        $crate::export_policy!(@module $ra, $lock);
        $crate::export_policy!(@ra $ra, $lock);
        $crate::export_policy!(@lock $ra, $lock);
    };
    (@module $ra:ty, $lock:ty) => {
        /// The plugin ABI version marker (v1.4: policy exports since v1.1,
        /// dump and reconfigure since v1.2, "as it came" since v1.3, a
        /// placement since v1.4).
        #[unsafe(no_mangle)]
        pub extern "C" fn xlfs_abi_version_1_4() {}
        $crate::export_plugin!(@common $crate::guest::policy::Policies<$ra, $lock>);
    };
    (@ra $ra:ty, $lock:ty) => {
        /// Opens a read-ahead stream.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_ra_open(inst: usize, page_size: u64, page_count: u32) -> i64 {
            unsafe { $crate::guest::__rt::ra_open::<$ra, $lock>(inst, page_size, page_count) }
        }

        /// A read of a stream: writes the advice to `out`.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_ra_read(
            inst: usize,
            stream: u64,
            offset: u64,
            size: u64,
            at_ns: u64,
            out: *mut u8,
            cap: u32,
        ) -> i32 {
            unsafe { $crate::guest::__rt::ra_read::<$ra, $lock>(inst, stream, offset, size, at_ns, out, cap) }
        }

        /// A stream's cache was emptied.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_ra_reset(inst: usize, stream: u64, page_size: u64, page_count: u32) -> i32 {
            unsafe { $crate::guest::__rt::ra_reset::<$ra, $lock>(inst, stream, page_size, page_count) }
        }

        /// A stream's fd was released.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_ra_close(inst: usize, stream: u64) -> i32 {
            unsafe { $crate::guest::__rt::ra_close::<$ra, $lock>(inst, stream) }
        }
    };
    (@lock $ra:ty, $lock:ty) => {
        /// The counts the lock-contention policy wants.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_lock_interest(inst: usize) -> i32 {
            unsafe { $crate::guest::__rt::lock_interest::<$ra, $lock>(inst) }
        }

        /// A lock-contention decision.
        ///
        /// # Safety
        /// Arguments as the plugin ABI specifies.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn xlfs_lock_decide(inst: usize, event: u32, view: *const u8, len: u32) -> i64 {
            unsafe { $crate::guest::__rt::lock_decide::<$ra, $lock>(inst, event, view, len) }
        }
    };
}
