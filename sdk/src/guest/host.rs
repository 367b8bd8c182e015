//! The guest's side of the host functions: on WebAssembly they are imports
//! from module `xlfs`; natively they are the function pointers of the
//! [`HostVtable`] the host passed to `xlfs_init`. [`Host`] hides which.

use crate::errno::Errno;
use crate::types::{FdId, Gfid};

use super::sys::{self, HostVtable};

/// Declares each host function once: the WebAssembly import and the
/// [`Host`] method that calls it (or the vtable entry of the same name).
macro_rules! host_fns {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty ;)*) => {
        #[cfg(target_family = "wasm")]
        mod imports {
            #[link(wasm_import_module = "xlfs")]
            unsafe extern "C" {
                $(
                    #[link_name = stringify!($name)]
                    pub(super) fn $name($($arg: $ty),*) -> $ret;
                )*
            }
        }

        /// One function per host function, taking the [`Host`] first.
        mod raw {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[inline]
                #[allow(clippy::too_many_arguments)]
                pub(super) unsafe fn $name(host: Host, $($arg: $ty),*) -> $ret {
                    #[cfg(target_family = "wasm")]
                    // SAFETY: the caller upholds the import's contract.
                    unsafe {
                        let _ = host;
                        imports::$name($($arg),*)
                    }
                    #[cfg(not(target_family = "wasm"))]
                    // SAFETY: the host keeps the vtable valid while it may
                    // call into this instance; the caller upholds the rest.
                    unsafe {
                        let vt = &*host.vt;
                        (vt.$name)(vt.ctx, $($arg),*)
                    }
                }
            )*
        }
    };
}

host_fns! {
    wind(frame: u64, child: u32, flags: u32, msg: *const u8, len: u32, payload: u32) -> i64;
    unwind(frame: u64, msg: *const u8, len: u32, payload: u32) -> i32;
    timer_set(delay_ms: u64) -> i64;
    timer_cancel(timer: u64) -> i32;
    inode_ctx_get(gfid: *const u8, out: *mut u64) -> i32;
    inode_ctx_set(gfid: *const u8, value: u64) -> i32;
    inode_ctx_del(gfid: *const u8) -> i32;
    fd_ctx_get(fd: u64, out: *mut u64) -> i32;
    fd_ctx_set(fd: u64, value: u64) -> i32;
    fd_ctx_del(fd: u64) -> i32;
    log(level: u32, msg: *const u8, len: u32) -> ();
    now_ns() -> u64;
    buf_len(buf: u32) -> i64;
    buf_read(buf: u32, offset: u64, dst: *mut u8, len: u32) -> i64;
    buf_new(src: *const u8, len: u32) -> i64;
    buf_slice(buf: u32, offset: u64, len: u64) -> i64;
    buf_free(buf: u32) -> i32;
    declare(msg: *const u8, len: u32) -> i32;
}

/// The host this instance runs in: logging, a clock, timers and per-inode
/// and per-fd context. Cheap to copy; valid for the instance's life.
#[derive(Clone, Copy)]
pub struct Host {
    #[cfg_attr(target_family = "wasm", allow(dead_code))]
    vt: *const HostVtable,
}

fn errno_of(ret: i64) -> Errno {
    Errno(i32::try_from(-ret).unwrap_or(Errno::EIO.0))
}

fn status(ret: i32) -> Result<(), Errno> {
    if ret < 0 { Err(Errno(-ret)) } else { Ok(()) }
}

/// Lengths cross the boundary as `u32`; longer slices are refused.
fn len32(len: usize) -> Result<u32, Errno> {
    u32::try_from(len).map_err(|_| Errno::E2BIG)
}

impl Host {
    /// The host as passed to `xlfs_describe` / `xlfs_init` (ignored, and
    /// null, on WebAssembly).
    pub(crate) fn from_raw(vt: *const HostVtable) -> Host {
        Host { vt }
    }

    /// Logs a line at `level` ([`sys::log_level`]) under this node's name.
    pub fn log(self, level: u32, msg: &str) {
        let len = msg.len().min(u32::MAX as usize) as u32;
        // SAFETY: `msg` is valid for `len` bytes.
        unsafe { raw::log(self, level, msg.as_ptr(), len) }
    }

    /// Logs at error level.
    pub fn error(self, msg: &str) {
        Host::log(self, sys::log_level::ERROR, msg)
    }
    /// Logs at warning level.
    pub fn warn(self, msg: &str) {
        Host::log(self, sys::log_level::WARN, msg)
    }
    /// Logs at info level.
    pub fn info(self, msg: &str) {
        Host::log(self, sys::log_level::INFO, msg)
    }
    /// Logs at debug level.
    pub fn debug(self, msg: &str) {
        Host::log(self, sys::log_level::DEBUG, msg)
    }

    /// Nanoseconds on the host's monotonic clock.
    pub fn now_ns(self) -> u64 {
        // SAFETY: no arguments.
        unsafe { raw::now_ns(self) }
    }

    /// Arms a one-shot timer: `Plugin::timer` runs with its id after
    /// `delay_ms` milliseconds.
    pub fn set_timer(self, delay_ms: u64) -> Result<super::TimerId, Errno> {
        // SAFETY: plain values.
        let r = unsafe { raw::timer_set(self, delay_ms) };
        if r < 0 { Err(errno_of(r)) } else { Ok(super::TimerId(r as u64)) }
    }

    /// Cancels a timer that has not fired.
    pub fn cancel_timer(self, timer: super::TimerId) -> Result<(), Errno> {
        // SAFETY: plain values.
        status(unsafe { raw::timer_cancel(self, timer.0) })
    }

    /// This node's value for an inode, if set.
    pub fn inode_ctx(self, gfid: &Gfid) -> Option<u64> {
        let mut out = 0u64;
        // SAFETY: 16 readable bytes and a writable u64.
        let r = unsafe { raw::inode_ctx_get(self, gfid.0.as_ptr(), &mut out) };
        (r == 1).then_some(out)
    }

    /// Sets this node's value for an inode (dropped when the inode is
    /// forgotten); ENOMEM when the host's table is full.
    pub fn set_inode_ctx(self, gfid: &Gfid, value: u64) -> Result<(), Errno> {
        // SAFETY: 16 readable bytes.
        status(unsafe { raw::inode_ctx_set(self, gfid.0.as_ptr(), value) })
    }

    /// Deletes this node's value for an inode.
    pub fn del_inode_ctx(self, gfid: &Gfid) {
        // SAFETY: 16 readable bytes.
        unsafe { raw::inode_ctx_del(self, gfid.0.as_ptr()) };
    }

    /// This node's value for an fd, if set.
    pub fn fd_ctx(self, fd: FdId) -> Option<u64> {
        let mut out = 0u64;
        // SAFETY: a writable u64.
        let r = unsafe { raw::fd_ctx_get(self, fd.0, &mut out) };
        (r == 1).then_some(out)
    }

    /// Sets this node's value for an fd (dropped when the fd is released).
    pub fn set_fd_ctx(self, fd: FdId, value: u64) -> Result<(), Errno> {
        // SAFETY: plain values.
        status(unsafe { raw::fd_ctx_set(self, fd.0, value) })
    }

    /// Deletes this node's value for an fd.
    pub fn del_fd_ctx(self, fd: FdId) {
        // SAFETY: plain values.
        unsafe { raw::fd_ctx_del(self, fd.0) };
    }

    /// True when the host takes fops and replies "as they came" (plugin
    /// ABI v1.3: [`sys::WIND_AS_IS`], `unwind` with an empty message). A
    /// WebAssembly host older than the module refuses to load it, so there
    /// it is always true.
    pub(crate) fn as_is(self) -> bool {
        #[cfg(target_family = "wasm")]
        {
            true
        }
        #[cfg(not(target_family = "wasm"))]
        // SAFETY: the host keeps the vtable valid while it calls this instance.
        unsafe {
            self.vt.as_ref().is_some_and(|vt| vt.major == 1 && vt.minor >= sys::AS_IS_MINOR)
        }
    }

    pub(crate) fn raw_wind(self, frame: u64, child: u32, flags: u32, msg: &[u8], payload: u32) -> Result<u64, Errno> {
        let len = len32(msg.len())?;
        // SAFETY: `msg` is valid for `len` bytes.
        let r = unsafe { raw::wind(self, frame, child, flags, msg.as_ptr(), len, payload) };
        if r < 0 { Err(errno_of(r)) } else { Ok(r as u64) }
    }

    pub(crate) fn raw_unwind(self, frame: u64, msg: &[u8], payload: u32) -> Result<(), Errno> {
        let len = len32(msg.len())?;
        // SAFETY: `msg` is valid for `len` bytes.
        status(unsafe { raw::unwind(self, frame, msg.as_ptr(), len, payload) })
    }

    pub(crate) fn raw_declare(self, msg: &[u8]) -> Result<(), Errno> {
        let len = len32(msg.len())?;
        // SAFETY: `msg` is valid for `len` bytes.
        status(unsafe { raw::declare(self, msg.as_ptr(), len) })
    }
}

/// A buffer of bulk data kept in the host (a WRITE's data, a READ reply's
/// data): the guest holds a handle and reads or builds bytes only when it
/// needs to, so passing data on never copies it. Dropping it releases the
/// handle.
pub struct Buf {
    host: Host,
    handle: u32,
}

impl Buf {
    /// Takes ownership of a handle the host gave (none for [`sys::NO_BUF`]).
    pub(crate) fn adopt(host: Host, handle: u32) -> Option<Buf> {
        (handle != sys::NO_BUF).then(|| Buf { host, handle })
    }

    /// A new host buffer holding a copy of `bytes`.
    pub fn from_bytes(host: Host, bytes: &[u8]) -> Result<Buf, Errno> {
        let len = len32(bytes.len())?;
        // SAFETY: `bytes` is valid for `len` bytes.
        let r = unsafe { raw::buf_new(host, bytes.as_ptr(), len) };
        if r <= 0 {
            return Err(if r == 0 { Errno::EIO } else { errno_of(r) });
        }
        let handle = u32::try_from(r).map_err(|_| Errno::EIO)?;
        Ok(Buf { host, handle })
    }

    /// The raw handle number.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: plain values.
        let r = unsafe { raw::buf_len(self.host, self.handle) };
        usize::try_from(r).unwrap_or(0)
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies bytes from `offset` into `dst`; returns how many (fewer at
    /// the end of the buffer).
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<usize, Errno> {
        let len = len32(dst.len())?;
        // SAFETY: `dst` is writable for `len` bytes.
        let r = unsafe { raw::buf_read(self.host, self.handle, offset, dst.as_mut_ptr(), len) };
        if r < 0 { Err(errno_of(r)) } else { Ok(r as usize) }
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Result<Vec<u8>, Errno> {
        let mut v = vec![0u8; self.len()];
        let n = self.read(0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }

    /// A new handle on `len` bytes from `offset` (clamped to the buffer),
    /// sharing the host memory: no copy.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Buf, Errno> {
        // SAFETY: plain values.
        let r = unsafe { raw::buf_slice(self.host, self.handle, offset, len) };
        if r <= 0 {
            return Err(if r == 0 { Errno::EIO } else { errno_of(r) });
        }
        Ok(Buf { host: self.host, handle: u32::try_from(r).map_err(|_| Errno::EIO)? })
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: plain values; the handle is ours.
        unsafe { raw::buf_free(self.host, self.handle) };
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf({})", self.handle)
    }
}
