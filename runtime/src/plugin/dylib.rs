//! The native engine: a plugin as a shared library (cdylib), loaded with
//! libloading. Its ABI version marker is read from the file's dynamic
//! symbol table before the library is loaded (so a library of another
//! major never runs any code); the host functions reach it as a
//! [`HostVtable`] whose `ctx` is the node's [`HostCtx`].
//!
//! A native plugin is trusted code in the process: nothing stops it from
//! looping, allocating or corrupting memory. The host checks every pointer
//! and length it is given and treats a handler's failure code as a crash
//! of the instance.
//!
//! **Panics.** The exports are `extern "C"` functions: nothing can unwind
//! out of them into the host, so the host does not try to catch anything
//! around them (a `catch_unwind` there would catch nothing). The guest
//! SDK's `export_plugin!` catches a Rust plugin's panic inside the plugin
//! and returns the failure code instead. A plugin built without it must
//! not let a panic or a C++ exception out of an export: if one does, the
//! process aborts (Rust's "panic in a function that cannot unwind"; for a
//! C++ exception, "Rust cannot catch foreign exceptions" or
//! `std::terminate`). The other way round, the host's own functions
//! in the vtable ([`HostVtable`]), which the plugin calls, catch every
//! panic of the host's and return `-EIO`, so nothing unwinds into the
//! plugin either.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::Described;
use std::path::Path;
use std::sync::Arc;

use libloading::Library;
use object::{Object, ObjectSymbol};
use xlfs_sdk::Errno;
use xlfs_sdk::guest::sys::{self, HostVtable, NodeExports, PolicyExports, exports, node_exports, policy_exports};

use super::node::{Fault, Guest, GuestLimits, HostCtx, Module, PolicyCall};
use super::{PluginError, check_version, decode_descriptor};

type DescribeFn = unsafe extern "C" fn(*const HostVtable) -> i32;
type InitFn = unsafe extern "C" fn(*const HostVtable, *const u8, u32) -> usize;
type OnFopFn = unsafe extern "C" fn(usize, u64, *const u8, u32, u32) -> i32;
type OnReplyFn = unsafe extern "C" fn(usize, u64, u64, *const u8, u32, u32) -> i32;
type OnTimerFn = unsafe extern "C" fn(usize, u64) -> i32;
type OnEventFn = unsafe extern "C" fn(usize, i32, *const u8, u32) -> i32;
type FiniFn = unsafe extern "C" fn(usize);
type RaOpenFn = unsafe extern "C" fn(usize, u64, u32) -> i64;
type RaReadFn = unsafe extern "C" fn(usize, u64, u64, u64, u64, *mut u8, u32) -> i32;
type RaResetFn = unsafe extern "C" fn(usize, u64, u64, u32) -> i32;
type RaCloseFn = unsafe extern "C" fn(usize, u64) -> i32;
type LockInterestFn = unsafe extern "C" fn(usize) -> i32;
type LockDecideFn = unsafe extern "C" fn(usize, u32, *const u8, u32) -> i64;
type DumpFn = unsafe extern "C" fn(usize, *mut u8, u32) -> i32;
type ReconfigureFn = unsafe extern "C" fn(usize, *const u8, u32) -> i32;

/// The read-ahead policy exports (ABI v1.1).
#[derive(Clone, Copy)]
struct RaSyms {
    open: RaOpenFn,
    read: RaReadFn,
    reset: RaResetFn,
    close: RaCloseFn,
}

/// The lock-contention policy exports (ABI v1.1).
#[derive(Clone, Copy)]
struct LockSyms {
    interest: LockInterestFn,
    decide: LockDecideFn,
}

/// The library's entry points, valid while `lib` is loaded.
#[derive(Clone, Copy)]
struct Syms {
    init: InitFn,
    on_fop: OnFopFn,
    on_reply: OnReplyFn,
    on_timer: OnTimerFn,
    on_event: OnEventFn,
    fini: FiniFn,
    ra: Option<RaSyms>,
    lock: Option<LockSyms>,
    /// `xlfs_dump` (ABI v1.2, optional).
    dump: Option<DumpFn>,
    /// `xlfs_reconfigure` (ABI v1.2, optional).
    reconfigure: Option<ReconfigureFn>,
}

/// A loaded library. Nodes hold it (through the loader's `Loaded`) so it
/// stays loaded while any graph uses it.
struct DylibModule {
    syms: Syms,
    _lib: Library,
}

/// The dynamic symbols a shared library exports.
fn exported_names(bytes: &[u8]) -> Result<Vec<String>, String> {
    let file = object::File::parse(bytes).map_err(|e| format!("not a shared library this host can read: {e}"))?;
    Ok(file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .filter_map(|s| {
            s.name().ok().map(|n| n.strip_prefix('_').filter(|n| n.starts_with("xlfs")).unwrap_or(n).to_string())
        })
        .collect())
}

pub(super) fn load(path: &Path, bytes: &[u8]) -> Result<Described, PluginError> {
    let fail = |reason: String| PluginError::Load { path: path.into(), reason };
    let names = exported_names(bytes).map_err(|reason| PluginError::NotAPlugin { path: path.into(), reason })?;
    let version = check_version(path, names.iter().map(String::as_str))?;
    let policies = PolicyExports::probe(version, names.iter().map(String::as_str));
    let node_exports = NodeExports::probe(version, names.iter().map(String::as_str));
    // SAFETY: loading runs the library's initializers: a native plugin is
    // trusted code (see the module docs). Its version was checked above.
    let lib = unsafe { Library::new(path) }.map_err(|e| fail(format!("cannot load: {e}")))?;
    macro_rules! sym {
        ($ty:ty, $name:expr) => {
            // SAFETY: the plugin ABI gives the export this signature.
            *unsafe { lib.get::<$ty>($name) }.map_err(|e| fail(format!("no {} export: {e}", $name)))?
        };
    }
    let describe: DescribeFn = sym!(DescribeFn, exports::DESCRIBE);
    let mut syms = Syms {
        init: sym!(InitFn, exports::INIT),
        on_fop: sym!(OnFopFn, exports::ON_FOP),
        on_reply: sym!(OnReplyFn, exports::ON_REPLY),
        on_timer: sym!(OnTimerFn, exports::ON_TIMER),
        on_event: sym!(OnEventFn, exports::ON_EVENT),
        fini: sym!(FiniFn, exports::FINI),
        ra: None,
        lock: None,
        dump: None,
        reconfigure: None,
    };
    if node_exports.dump {
        syms.dump = Some(sym!(DumpFn, node_exports::DUMP));
    }
    if node_exports.reconfigure {
        syms.reconfigure = Some(sym!(ReconfigureFn, node_exports::RECONFIGURE));
    }
    if policies.read_ahead {
        syms.ra = Some(RaSyms {
            open: sym!(RaOpenFn, policy_exports::RA_OPEN),
            read: sym!(RaReadFn, policy_exports::RA_READ),
            reset: sym!(RaResetFn, policy_exports::RA_RESET),
            close: sym!(RaCloseFn, policy_exports::RA_CLOSE),
        });
    }
    if policies.lock_contention {
        syms.lock = Some(LockSyms {
            interest: sym!(LockInterestFn, policy_exports::LOCK_INTEREST),
            decide: sym!(LockDecideFn, policy_exports::LOCK_DECIDE),
        });
    }
    let ctx = HostCtx::describing(path.display().to_string());
    let vt = vtable(&ctx);
    // SAFETY: the vtable and its ctx outlive the call. (No catch_unwind:
    // nothing unwinds out of an `extern "C"` function; see the module docs.)
    match unsafe { describe(&vt) } {
        sys::HANDLER_OK => {}
        code => return Err(fail(ctx.with_last_error(format!("{} returned {code}", exports::DESCRIBE)))),
    }
    let desc = decode_descriptor(path, ctx.take_declared())?;
    Ok(Described { version, desc, policies, node_exports, module: Box::new(DylibModule { syms, _lib: lib }) })
}

/// One node's instance.
struct DylibGuest {
    syms: Syms,
    inst: usize,
    /// The guest keeps a pointer to the vtable, whose `ctx` points into
    /// `_ctx`: both live as long as the instance.
    _vt: Box<HostVtable>,
    _ctx: Arc<HostCtx>,
    ctx: *const HostCtx,
}

// SAFETY: the instance is only called with the node's slot lock held, one
// call at a time; the plugin ABI requires a native plugin's instances to
// accept calls from any thread. The raw pointers point into `_vt`/`_ctx`,
// which are owned here.
unsafe impl Send for DylibGuest {}

impl Module for DylibModule {
    fn instantiate(&self, host: &Arc<HostCtx>, options: &[u8], _limits: &GuestLimits) -> Result<Box<dyn Guest>, Fault> {
        let vt = Box::new(vtable(host));
        let len = u32::try_from(options.len()).map_err(|_| Fault("options message too long".into()))?;
        let init = self.syms.init;
        // SAFETY: the vtable is boxed and kept with the instance; the
        // options are valid for the call.
        let inst = unsafe { init(&*vt, options.as_ptr(), len) };
        if inst == 0 {
            return Err(Fault(format!("{} returned no instance", exports::INIT)));
        }
        Ok(Box::new(DylibGuest { syms: self.syms, inst, _vt: vt, ctx: Arc::as_ptr(host), _ctx: host.clone() }))
    }
}

impl DylibGuest {
    /// Runs a handler (an `extern "C"` call: nothing to catch, see the
    /// module docs); the failure code is a fault.
    fn handler(&self, name: &str, f: impl FnOnce() -> i32) -> Result<i32, Fault> {
        self.handler64(name, || i64::from(f())).map(|r| r as i32)
    }

    /// [`DylibGuest::handler`] for the exports that return an `int64_t`.
    fn handler64(&self, name: &str, f: impl FnOnce() -> i64) -> Result<i64, Fault> {
        // SAFETY: `ctx` points into `_ctx`, alive as long as `self`.
        let ctx = unsafe { &*self.ctx };
        match f() {
            r if r == i64::from(sys::HANDLER_FAILED) => Err(Fault(ctx.with_last_error(format!("{name} failed")))),
            r => Ok(r),
        }
    }
}

fn len32(msg: &[u8]) -> Result<u32, Fault> {
    u32::try_from(msg.len()).map_err(|_| Fault(format!("a message of {} bytes", msg.len())))
}

impl Guest for DylibGuest {
    fn on_fop(&mut self, frame: u64, msg: &[u8], payload: u32) -> Result<(), Fault> {
        let (f, inst, n) = (self.syms.on_fop, self.inst, len32(msg)?);
        // SAFETY: the ABI's contract: `msg` is valid for the call.
        self.handler(exports::ON_FOP, || unsafe { f(inst, frame, msg.as_ptr(), n, payload) }).map(drop)
    }

    fn on_reply(&mut self, frame: u64, call: u64, msg: &[u8], payload: u32) -> Result<(), Fault> {
        let (f, inst, n) = (self.syms.on_reply, self.inst, len32(msg)?);
        // SAFETY: as above.
        self.handler(exports::ON_REPLY, || unsafe { f(inst, frame, call, msg.as_ptr(), n, payload) }).map(drop)
    }

    fn on_timer(&mut self, timer: u64) -> Result<(), Fault> {
        let (f, inst) = (self.syms.on_timer, self.inst);
        // SAFETY: plain values.
        self.handler(exports::ON_TIMER, || unsafe { f(inst, timer) }).map(drop)
    }

    fn on_event(&mut self, from: i32, msg: &[u8]) -> Result<bool, Fault> {
        let (f, inst, n) = (self.syms.on_event, self.inst, len32(msg)?);
        // SAFETY: as above.
        Ok(self.handler(exports::ON_EVENT, || unsafe { f(inst, from, msg.as_ptr(), n) })? == sys::EVENT_PASS)
    }

    fn policy(&mut self, call: PolicyCall<'_>) -> Result<i64, Fault> {
        let inst = self.inst;
        let missing = |what: &str| Fault(format!("the module exports no {what} policy"));
        let (ra, lock) = (self.syms.ra, self.syms.lock);
        // SAFETY (each call): the ABI's contract; pointers are valid for the call.
        match call {
            PolicyCall::RaOpen { page_size, page_count } => {
                let f = ra.ok_or_else(|| missing("read-ahead"))?.open;
                self.handler64(policy_exports::RA_OPEN, || unsafe { f(inst, page_size, page_count) })
            }
            PolicyCall::RaRead { stream, offset, size, at_ns, out } => {
                let f = ra.ok_or_else(|| missing("read-ahead"))?.read;
                out.clear();
                out.resize(sys::MAX_ADVICE, 0);
                let (p, cap) = (out.as_mut_ptr(), sys::MAX_ADVICE as u32);
                let n =
                    self.handler(policy_exports::RA_READ, || unsafe { f(inst, stream, offset, size, at_ns, p, cap) })?;
                out.truncate(usize::try_from(n).unwrap_or(0).min(sys::MAX_ADVICE));
                Ok(n.into())
            }
            PolicyCall::RaReset { stream, page_size, page_count } => {
                let f = ra.ok_or_else(|| missing("read-ahead"))?.reset;
                self.handler(policy_exports::RA_RESET, || unsafe { f(inst, stream, page_size, page_count) })
                    .map(i64::from)
            }
            PolicyCall::RaClose { stream } => {
                let f = ra.ok_or_else(|| missing("read-ahead"))?.close;
                self.handler(policy_exports::RA_CLOSE, || unsafe { f(inst, stream) }).map(i64::from)
            }
            PolicyCall::LockInterest => {
                let f = lock.ok_or_else(|| missing("lock-contention"))?.interest;
                self.handler(policy_exports::LOCK_INTEREST, || unsafe { f(inst) }).map(i64::from)
            }
            PolicyCall::LockDecide { event, view } => {
                let f = lock.ok_or_else(|| missing("lock-contention"))?.decide;
                let n = len32(view)?;
                self.handler64(policy_exports::LOCK_DECIDE, || unsafe { f(inst, event, view.as_ptr(), n) })
            }
        }
    }

    fn dump(&mut self) -> Result<Option<Vec<u8>>, Fault> {
        let f = self.syms.dump.ok_or_else(|| Fault(format!("the module exports no {}", node_exports::DUMP)))?;
        let inst = self.inst;
        let mut out = vec![0u8; 4096];
        loop {
            let (p, cap) = (out.as_mut_ptr(), out.len() as u32);
            // SAFETY: `out` is writable for `cap` bytes during the call.
            let n = self.handler(node_exports::DUMP, || unsafe { f(inst, p, cap) })?;
            let Ok(n) = usize::try_from(n) else { return Ok(None) };
            if n <= out.len() {
                out.truncate(n);
                return Ok(Some(out));
            }
            if n > sys::MAX_DUMP || out.len() >= n {
                return Ok(None);
            }
            out.resize(n, 0);
        }
    }

    fn reconfigure(&mut self, options: &[u8]) -> Result<i32, Fault> {
        let f = self
            .syms
            .reconfigure
            .ok_or_else(|| Fault(format!("the module exports no {}", node_exports::RECONFIGURE)))?;
        let (inst, n) = (self.inst, len32(options)?);
        // SAFETY: the ABI's contract: `options` is valid for the call.
        self.handler(node_exports::RECONFIGURE, || unsafe { f(inst, options.as_ptr(), n) })
    }

    fn fini(&mut self) {
        let (f, inst) = (self.syms.fini, std::mem::take(&mut self.inst));
        if inst != 0 {
            // SAFETY: `inst` came from init and is not used again.
            unsafe { f(inst) };
        }
    }
}

impl Drop for DylibGuest {
    fn drop(&mut self) {
        // A crashed instance is finished too, so the plugin can free it.
        self.fini();
    }
}

// The host functions of the vtable: each checks its pointers, catches
// panics, and hands the bytes to the HostCtx.

/// Runs a host function body; a panic becomes `-EIO`.
fn guard<R: From<i32>>(f: impl FnOnce() -> Result<R, Errno>) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => R::from(-e.0),
        Err(_) => R::from(-Errno::EIO.0),
    }
}

/// # Safety
/// `ctx` is null or the `HostCtx` pointer of a vtable this host made.
unsafe fn host<'a>(ctx: *mut c_void) -> Result<&'a HostCtx, Errno> {
    // SAFETY: the caller's contract.
    unsafe { (ctx as *const HostCtx).as_ref() }.ok_or(Errno::EFAULT)
}

/// # Safety
/// `ptr` is valid for `len` bytes, or null.
unsafe fn bytes<'a>(ptr: *const u8, len: u32) -> Result<&'a [u8], Errno> {
    match (ptr.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(Errno::EFAULT),
        // SAFETY: the caller's contract.
        (false, n) => Ok(unsafe { std::slice::from_raw_parts(ptr, n as usize) }),
    }
}

/// # Safety
/// `ptr` is null or points to 16 readable bytes.
unsafe fn gfid(ptr: *const u8) -> Result<[u8; 16], Errno> {
    // SAFETY: the caller's contract.
    let b = unsafe { bytes(ptr, 16) }?;
    b.try_into().map_err(|_| Errno::EFAULT)
}

unsafe extern "C" fn v_wind(
    ctx: *mut c_void,
    frame: u64,
    child: u32,
    flags: u32,
    msg: *const u8,
    len: u32,
    buf: u32,
) -> i64 {
    // SAFETY: the guest passes what the vtable contract says.
    guard(|| unsafe { Ok(host(ctx)?.wind(frame, child, flags, bytes(msg, len)?, buf)) })
}
unsafe extern "C" fn v_unwind(ctx: *mut c_void, frame: u64, msg: *const u8, len: u32, buf: u32) -> i32 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.unwind(frame, bytes(msg, len)?, buf)) })
}
unsafe extern "C" fn v_timer_set(ctx: *mut c_void, ms: u64) -> i64 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.timer_set(ms)) })
}
unsafe extern "C" fn v_timer_cancel(ctx: *mut c_void, id: u64) -> i32 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.timer_cancel(id)) })
}
unsafe extern "C" fn v_inode_ctx_get(ctx: *mut c_void, g: *const u8, out: *mut u64) -> i32 {
    // SAFETY: as above; `out` is checked for null.
    guard(|| unsafe {
        match host(ctx)?.inode_ctx_get(gfid(g)?) {
            Some(v) if !out.is_null() => {
                out.write_unaligned(v);
                Ok(1)
            }
            Some(_) => Err(Errno::EFAULT),
            None => Ok(0),
        }
    })
}
unsafe extern "C" fn v_inode_ctx_set(ctx: *mut c_void, g: *const u8, v: u64) -> i32 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.inode_ctx_set(gfid(g)?, v)) })
}
unsafe extern "C" fn v_inode_ctx_del(ctx: *mut c_void, g: *const u8) -> i32 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.inode_ctx_del(gfid(g)?)) })
}
unsafe extern "C" fn v_fd_ctx_get(ctx: *mut c_void, fd: u64, out: *mut u64) -> i32 {
    // SAFETY: as above; `out` is checked for null.
    guard(|| unsafe {
        match host(ctx)?.fd_ctx_get(fd) {
            Some(v) if !out.is_null() => {
                out.write_unaligned(v);
                Ok(1)
            }
            Some(_) => Err(Errno::EFAULT),
            None => Ok(0),
        }
    })
}
unsafe extern "C" fn v_fd_ctx_set(ctx: *mut c_void, fd: u64, v: u64) -> i32 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.fd_ctx_set(fd, v)) })
}
unsafe extern "C" fn v_fd_ctx_del(ctx: *mut c_void, fd: u64) -> i32 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.fd_ctx_del(fd)) })
}
unsafe extern "C" fn v_log(ctx: *mut c_void, level: u32, msg: *const u8, len: u32) {
    // SAFETY: as above.
    let _: i32 = guard(|| unsafe {
        host(ctx)?.log(level, bytes(msg, len)?);
        Ok(0)
    });
}
unsafe extern "C" fn v_now_ns(ctx: *mut c_void) -> u64 {
    // SAFETY: as above.
    catch_unwind(|| unsafe { host(ctx).map_or(0, |h| h.now_ns()) }).unwrap_or(0)
}
unsafe extern "C" fn v_buf_len(ctx: *mut c_void, h: u32) -> i64 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.buf_len(h)) })
}
unsafe extern "C" fn v_buf_read(ctx: *mut c_void, h: u32, off: u64, dst: *mut u8, len: u32) -> i64 {
    // SAFETY: as above; `dst` is checked for null and written within `len`.
    guard(|| unsafe {
        let b = host(ctx)?.buf(h)?;
        let start = usize::try_from(off).unwrap_or(usize::MAX).min(b.len());
        let end = start.saturating_add(len as usize).min(b.len());
        if end > start {
            if dst.is_null() {
                return Err(Errno::EFAULT);
            }
            std::ptr::copy_nonoverlapping(b[start..end].as_ptr(), dst, end - start);
        }
        Ok((end - start) as i64)
    })
}
unsafe extern "C" fn v_buf_new(ctx: *mut c_void, src: *const u8, len: u32) -> i64 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.buf_new(bytes(src, len)?)) })
}
unsafe extern "C" fn v_buf_slice(ctx: *mut c_void, h: u32, off: u64, len: u64) -> i64 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.buf_slice(h, off, len)) })
}
unsafe extern "C" fn v_buf_free(ctx: *mut c_void, h: u32) -> i32 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.buf_free(h)) })
}
unsafe extern "C" fn v_declare(ctx: *mut c_void, msg: *const u8, len: u32) -> i32 {
    // SAFETY: as above.
    guard(|| unsafe { Ok(host(ctx)?.declare(bytes(msg, len)?)) })
}

/// The vtable for `ctx` (which must outlive every use of it).
fn vtable(ctx: &Arc<HostCtx>) -> HostVtable {
    HostVtable {
        size: std::mem::size_of::<HostVtable>() as u32,
        major: sys::PLUGIN_ABI.major,
        minor: sys::PLUGIN_ABI.minor,
        ctx: Arc::as_ptr(ctx) as *mut c_void,
        wind: v_wind,
        unwind: v_unwind,
        timer_set: v_timer_set,
        timer_cancel: v_timer_cancel,
        inode_ctx_get: v_inode_ctx_get,
        inode_ctx_set: v_inode_ctx_set,
        inode_ctx_del: v_inode_ctx_del,
        fd_ctx_get: v_fd_ctx_get,
        fd_ctx_set: v_fd_ctx_set,
        fd_ctx_del: v_fd_ctx_del,
        log: v_log,
        now_ns: v_now_ns,
        buf_len: v_buf_len,
        buf_read: v_buf_read,
        buf_new: v_buf_new,
        buf_slice: v_buf_slice,
        buf_free: v_buf_free,
        declare: v_declare,
    }
}
