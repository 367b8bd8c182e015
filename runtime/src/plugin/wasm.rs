//! The WebAssembly engine: wasmtime, one process-wide [`Engine`] with epoch
//! interruption (a background thread ticks the epoch every [`TICK`]), one
//! [`Linker`] with the host functions as imports of module `xlfs`, and per
//! node one [`Store`] and instance, bounded by a memory limit and a
//! deadline per call. Compiled modules are cached by the loader (`plugin.rs`) in the
//! process, and their machine code on disk between processes ([`code_cache`]).

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmtime::{Caller, Config, Engine, InstancePre, Linker, Memory, ResourceLimiter, Store, Trap, TypedFunc};
use xlfs_sdk::Errno;
use xlfs_sdk::guest::sys::{self, NodeExports, PolicyExports, exports, imports, node_exports, policy_exports};

use super::node::{Fault, Guest, GuestLimits, HostCtx, Module, PolicyCall};
use super::{Described, PluginError, check_version, decode_descriptor};

mod code_cache;

/// How often the epoch advances: the granularity of `plugin-call-timeout`.
pub(crate) const TICK: Duration = Duration::from_millis(10);
/// Most table elements an instance may grow to.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;
/// Limits for the short-lived instance that describes a module.
const DESCRIBE_LIMITS: GuestLimits = GuestLimits { memory: 64 << 20, call_timeout: Duration::from_secs(5) };

fn engine() -> Result<&'static Engine, String> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let mut config = Config::new();
            config.epoch_interruption(true);
            let engine = Engine::new(&config).map_err(|e| format!("wasmtime engine: {e:#}"))?;
            let ticker = engine.clone();
            std::thread::Builder::new()
                .name("xlfs-wasm-epoch".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(TICK);
                        ticker.increment_epoch();
                    }
                })
                .map_err(|e| format!("cannot start the wasm epoch thread: {e}"))?;
            Ok(engine)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// What a store holds: the node's host context, the guest's memory once
/// known, and the memory limit.
struct HostState {
    ctx: Arc<HostCtx>,
    memory: Option<Memory>,
    limiter: Limiter,
}

struct Limiter {
    memory: usize,
    /// The size a refused growth asked for.
    refused: Option<usize>,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory {
            self.refused = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        4
    }
}

/// `len` bytes of guest memory at `ptr`, if in bounds.
fn guest_bytes<'a>(caller: &'a Caller<'_, HostState>, ptr: u32, len: u32) -> Option<&'a [u8]> {
    let mem = caller.data().memory?;
    let start = ptr as usize;
    mem.data(caller).get(start..start.checked_add(len as usize)?)
}

/// Writes `bytes` into guest memory at `ptr`; false if out of bounds.
fn put_guest(caller: &mut Caller<'_, HostState>, ptr: u32, bytes: &[u8]) -> bool {
    let Some(mem) = caller.data().memory else { return false };
    mem.write(caller, ptr as usize, bytes).is_ok()
}

fn gfid_at(caller: &Caller<'_, HostState>, ptr: u32) -> Option<[u8; 16]> {
    guest_bytes(caller, ptr, 16)?.try_into().ok()
}

const EFAULT: i32 = -Errno::EFAULT.0;

fn linker() -> Result<&'static Linker<HostState>, String> {
    static LINKER: OnceLock<Result<Linker<HostState>, String>> = OnceLock::new();
    LINKER
        .get_or_init(|| {
            let mut l = Linker::new(engine()?);
            define(&mut l).map_err(|e| format!("wasm host functions: {e:#}"))?;
            Ok(l)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The host functions, as imports of module `xlfs`. A bad guest pointer is
/// answered with -EFAULT, never a trap on the host's side.
fn define(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let m = sys::IMPORT_MODULE;
    l.func_wrap(
        m,
        imports::WIND,
        |c: Caller<'_, HostState>, frame: u64, child: u32, flags: u32, p: u32, n: u32, buf: u32| -> i64 {
            let ctx = c.data().ctx.clone();
            guest_bytes(&c, p, n).map_or_else(
                || i64::from(ctx.bad_pointer(frame, "wind")),
                |msg| ctx.wind(frame, child, flags, msg, buf),
            )
        },
    )?;
    l.func_wrap(m, imports::UNWIND, |c: Caller<'_, HostState>, frame: u64, p: u32, n: u32, buf: u32| -> i32 {
        let ctx = c.data().ctx.clone();
        guest_bytes(&c, p, n).map_or_else(|| ctx.bad_pointer(frame, "unwind"), |msg| ctx.unwind(frame, msg, buf))
    })?;
    l.func_wrap(m, imports::TIMER_SET, |c: Caller<'_, HostState>, ms: u64| -> i64 { c.data().ctx.timer_set(ms) })?;
    l.func_wrap(m, imports::TIMER_CANCEL, |c: Caller<'_, HostState>, id: u64| -> i32 {
        c.data().ctx.timer_cancel(id)
    })?;
    l.func_wrap(m, imports::INODE_CTX_GET, |mut c: Caller<'_, HostState>, g: u32, out: u32| -> i32 {
        let Some(gfid) = gfid_at(&c, g) else { return EFAULT };
        match c.data().ctx.inode_ctx_get(gfid) {
            Some(v) if put_guest(&mut c, out, &v.to_le_bytes()) => 1,
            Some(_) => EFAULT,
            None => 0,
        }
    })?;
    l.func_wrap(m, imports::INODE_CTX_SET, |c: Caller<'_, HostState>, g: u32, v: u64| -> i32 {
        gfid_at(&c, g).map_or(EFAULT, |gfid| c.data().ctx.inode_ctx_set(gfid, v))
    })?;
    l.func_wrap(m, imports::INODE_CTX_DEL, |c: Caller<'_, HostState>, g: u32| -> i32 {
        gfid_at(&c, g).map_or(EFAULT, |gfid| c.data().ctx.inode_ctx_del(gfid))
    })?;
    l.func_wrap(m, imports::FD_CTX_GET, |mut c: Caller<'_, HostState>, fd: u64, out: u32| -> i32 {
        match c.data().ctx.fd_ctx_get(fd) {
            Some(v) if put_guest(&mut c, out, &v.to_le_bytes()) => 1,
            Some(_) => EFAULT,
            None => 0,
        }
    })?;
    l.func_wrap(m, imports::FD_CTX_SET, |c: Caller<'_, HostState>, fd: u64, v: u64| -> i32 {
        c.data().ctx.fd_ctx_set(fd, v)
    })?;
    l.func_wrap(m, imports::FD_CTX_DEL, |c: Caller<'_, HostState>, fd: u64| -> i32 { c.data().ctx.fd_ctx_del(fd) })?;
    l.func_wrap(m, imports::LOG, |c: Caller<'_, HostState>, level: u32, p: u32, n: u32| {
        if let Some(msg) = guest_bytes(&c, p, n) {
            c.data().ctx.log(level, msg);
        }
    })?;
    l.func_wrap(m, imports::NOW_NS, |c: Caller<'_, HostState>| -> u64 { c.data().ctx.now_ns() })?;
    l.func_wrap(m, imports::BUF_LEN, |c: Caller<'_, HostState>, h: u32| -> i64 { c.data().ctx.buf_len(h) })?;
    l.func_wrap(m, imports::BUF_READ, |mut c: Caller<'_, HostState>, h: u32, off: u64, dst: u32, n: u32| -> i64 {
        let bytes = match c.data().ctx.buf(h) {
            Ok(b) => b,
            Err(e) => return -(e.0 as i64),
        };
        let start = usize::try_from(off).unwrap_or(usize::MAX).min(bytes.len());
        let end = start.saturating_add(n as usize).min(bytes.len());
        if put_guest(&mut c, dst, &bytes[start..end]) { (end - start) as i64 } else { EFAULT as i64 }
    })?;
    l.func_wrap(m, imports::BUF_NEW, |c: Caller<'_, HostState>, p: u32, n: u32| -> i64 {
        let ctx = c.data().ctx.clone();
        guest_bytes(&c, p, n).map_or(EFAULT as i64, |b| ctx.buf_new(b))
    })?;
    l.func_wrap(m, imports::BUF_SLICE, |c: Caller<'_, HostState>, h: u32, off: u64, n: u64| -> i64 {
        c.data().ctx.buf_slice(h, off, n)
    })?;
    l.func_wrap(m, imports::BUF_FREE, |c: Caller<'_, HostState>, h: u32| -> i32 { c.data().ctx.buf_free(h) })?;
    l.func_wrap(m, imports::DECLARE, |c: Caller<'_, HostState>, p: u32, n: u32| -> i32 {
        let ctx = c.data().ctx.clone();
        guest_bytes(&c, p, n).map_or(EFAULT, |b| ctx.declare(b))
    })?;
    Ok(())
}

/// A compiled module, ready to instantiate.
struct WasmModule {
    pre: InstancePre<HostState>,
    policies: PolicyExports,
    node_exports: NodeExports,
}

/// Compiles, checks and describes the module in `bytes` (whose SHA-256 is
/// `sha256`).
pub(super) fn load(path: &Path, bytes: &[u8], sha256: &[u8; 32]) -> Result<Described, PluginError> {
    let fail = |reason: String| PluginError::Load { path: path.into(), reason };
    let engine = engine().map_err(fail)?;
    let code = code_cache::compile(engine, bytes, sha256).map_err(|e| PluginError::NotAPlugin {
        path: path.into(),
        reason: format!("not a WebAssembly module wasmtime accepts: {e:#}"),
    })?;
    // The version marker first: a module of another major may import
    // functions this host does not have, and must be named for its version.
    let version = check_version(path, code.exports().map(|e| e.name()))?;
    let policies = PolicyExports::probe(version, code.exports().map(|e| e.name()));
    let node_exports = NodeExports::probe(version, code.exports().map(|e| e.name()));
    let pre = linker()
        .map_err(fail)?
        .instantiate_pre(&code)
        .map_err(|e| fail(format!("it needs host functions this host (ABI {}) lacks: {e:#}", sys::PLUGIN_ABI)))?;
    let module = WasmModule { pre, policies, node_exports };
    let ctx = HostCtx::describing(path.display().to_string());
    let mut store = module.store(&ctx, &DESCRIBE_LIMITS);
    let describe = module
        .instance(&mut store)
        .and_then(|inst| {
            inst.get_typed_func::<u32, i32>(&mut store, exports::DESCRIBE)
                .map_err(|e| Fault(format!("no {} export: {e:#}", exports::DESCRIBE)))
        })
        .and_then(|f| call(&mut store, &DESCRIBE_LIMITS, |s| f.call(s, 0)));
    match describe {
        Ok(sys::HANDLER_OK) => {}
        Ok(code) => return Err(fail(ctx.with_last_error(format!("{} returned {code}", exports::DESCRIBE)))),
        Err(Fault(why)) => return Err(fail(ctx.with_last_error(format!("{} failed: {why}", exports::DESCRIBE)))),
    }
    let desc = decode_descriptor(path, ctx.take_declared())?;
    Ok(Described { version, desc, policies, node_exports, module: Box::new(module) })
}

impl WasmModule {
    fn store(&self, ctx: &Arc<HostCtx>, limits: &GuestLimits) -> Store<HostState> {
        let state =
            HostState { ctx: ctx.clone(), memory: None, limiter: Limiter { memory: limits.memory, refused: None } };
        let mut store = Store::new(self.pre.module().engine(), state);
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_trap();
        store
    }

    fn instance(&self, store: &mut Store<HostState>) -> Result<wasmtime::Instance, Fault> {
        store.set_epoch_deadline(ticks(&DESCRIBE_LIMITS.call_timeout));
        let inst = self.pre.instantiate(&mut *store).map_err(|e| fault(e, store, &DESCRIBE_LIMITS))?;
        let memory = inst.get_memory(&mut *store, exports::MEMORY).ok_or_else(|| Fault("no exported memory".into()))?;
        store.data_mut().memory = Some(memory);
        Ok(inst)
    }
}

fn ticks(timeout: &Duration) -> u64 {
    (timeout.as_nanos() / TICK.as_nanos()).max(1) as u64 + 1
}

/// Why a wasm call failed, in words.
fn fault(e: wasmtime::Error, store: &Store<HostState>, limits: &GuestLimits) -> Fault {
    let mut why = match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => format!("a call ran longer than plugin-call-timeout ({:?})", limits.call_timeout),
        Some(t) => t.to_string(),
        None => format!("{e:#}"),
    };
    if let Some(asked) = store.data().limiter.refused {
        why = format!(
            "{why}, after a memory growth to {asked} bytes was refused (plugin-memory-limit {} bytes)",
            limits.memory
        );
    }
    Fault(why)
}

/// Runs one guest call under the deadline.
fn call<R>(
    store: &mut Store<HostState>,
    limits: &GuestLimits,
    f: impl FnOnce(&mut Store<HostState>) -> wasmtime::Result<R>,
) -> Result<R, Fault> {
    store.set_epoch_deadline(ticks(&limits.call_timeout));
    f(store).map_err(|e| fault(e, store, limits))
}

struct Funcs {
    alloc: TypedFunc<u32, u32>,
    free: TypedFunc<(u32, u32), ()>,
    on_fop: TypedFunc<(u32, u64, u32, u32, u32), i32>,
    on_reply: TypedFunc<(u32, u64, u64, u32, u32, u32), i32>,
    on_timer: TypedFunc<(u32, u64), i32>,
    on_event: TypedFunc<(u32, i32, u32, u32), i32>,
    fini: TypedFunc<u32, ()>,
    ra: Option<RaFuncs>,
    lock: Option<LockFuncs>,
    /// `xlfs_dump` (ABI v1.2, optional): instance, out, cap.
    dump: Option<TypedFunc<(u32, u32, u32), i32>>,
    /// `xlfs_reconfigure` (ABI v1.2, optional): instance, options, length.
    reconfigure: Option<TypedFunc<(u32, u32, u32), i32>>,
}

/// `xlfs_ra_read`'s parameters: instance, stream, offset, size, at_ns, out, cap.
type RaReadParams = (u32, u64, u64, u64, u64, u32, u32);

/// The read-ahead policy exports (ABI v1.1).
struct RaFuncs {
    open: TypedFunc<(u32, u64, u32), i64>,
    read: TypedFunc<RaReadParams, i32>,
    reset: TypedFunc<(u32, u64, u64, u32), i32>,
    close: TypedFunc<(u32, u64), i32>,
}

/// The lock-contention policy exports (ABI v1.1).
struct LockFuncs {
    interest: TypedFunc<u32, i32>,
    decide: TypedFunc<(u32, u32, u32, u32), i64>,
}

/// One node's instance.
struct WasmGuest {
    store: Store<HostState>,
    f: Funcs,
    inst: u32,
    limits: GuestLimits,
    /// A guest buffer messages are written into: (pointer, capacity).
    scratch: (u32, u32),
    /// A guest buffer read-ahead advice is written into, once needed.
    out: (u32, u32),
}

impl Module for WasmModule {
    fn instantiate(&self, host: &Arc<HostCtx>, options: &[u8], limits: &GuestLimits) -> Result<Box<dyn Guest>, Fault> {
        let mut store = self.store(host, limits);
        let inst = self.instance(&mut store)?;
        macro_rules! func {
            ($name:expr) => {
                inst.get_typed_func(&mut store, $name).map_err(|e| Fault(format!("export {}: {e:#}", $name)))?
            };
        }
        let init: TypedFunc<(u32, u32, u32), u32> = func!(exports::INIT);
        let mut f = Funcs {
            alloc: func!(exports::ALLOC),
            free: func!(exports::FREE),
            on_fop: func!(exports::ON_FOP),
            on_reply: func!(exports::ON_REPLY),
            on_timer: func!(exports::ON_TIMER),
            on_event: func!(exports::ON_EVENT),
            fini: func!(exports::FINI),
            ra: None,
            lock: None,
            dump: None,
            reconfigure: None,
        };
        if self.node_exports.dump {
            f.dump = Some(func!(node_exports::DUMP));
        }
        if self.node_exports.reconfigure {
            f.reconfigure = Some(func!(node_exports::RECONFIGURE));
        }
        if self.policies.read_ahead {
            f.ra = Some(RaFuncs {
                open: func!(policy_exports::RA_OPEN),
                read: func!(policy_exports::RA_READ),
                reset: func!(policy_exports::RA_RESET),
                close: func!(policy_exports::RA_CLOSE),
            });
        }
        if self.policies.lock_contention {
            f.lock = Some(LockFuncs {
                interest: func!(policy_exports::LOCK_INTEREST),
                decide: func!(policy_exports::LOCK_DECIDE),
            });
        }
        let mut g = WasmGuest { store, f, inst: 0, limits: limits.clone(), scratch: (0, 0), out: (0, 0) };
        let (p, n) = g.put(options)?;
        let inst = call(&mut g.store, &g.limits, |s| init.call(s, (0, p, n)))?;
        if inst == 0 {
            return Err(Fault(format!("{} returned no instance", exports::INIT)));
        }
        g.inst = inst;
        Ok(Box::new(g))
    }
}

impl WasmGuest {
    /// Copies a message into guest memory (reusing one buffer).
    fn put(&mut self, msg: &[u8]) -> Result<(u32, u32), Fault> {
        if msg.is_empty() {
            return Ok((0, 0));
        }
        let len = u32::try_from(msg.len()).map_err(|_| Fault(format!("a message of {} bytes", msg.len())))?;
        if len > self.scratch.1 {
            let (old, cap) = self.scratch;
            self.scratch = (0, 0);
            if cap > 0 {
                let free = &self.f.free;
                call(&mut self.store, &self.limits, |s| free.call(s, (old, cap)))?;
            }
            let want = len.checked_next_power_of_two().unwrap_or(len).max(4096);
            let alloc = &self.f.alloc;
            let ptr = call(&mut self.store, &self.limits, |s| alloc.call(s, want))?;
            if ptr == 0 {
                return Err(Fault(format!("{} could not allocate {want} bytes", exports::ALLOC)));
            }
            self.scratch = (ptr, want);
        }
        let mem = self.store.data().memory.ok_or_else(|| Fault("no memory".into()))?;
        mem.write(&mut self.store, self.scratch.0 as usize, msg)
            .map_err(|_| Fault(format!("{} returned a buffer outside memory", exports::ALLOC)))?;
        Ok((self.scratch.0, len))
    }

    fn handler64(&mut self, name: &str, r: Result<i64, Fault>) -> Result<i64, Fault> {
        match r? {
            r if r == i64::from(sys::HANDLER_FAILED) => {
                Err(Fault(self.store.data().ctx.with_last_error(format!("{name} failed"))))
            }
            r => Ok(r),
        }
    }

    fn handler(&mut self, name: &str, r: Result<i32, Fault>) -> Result<i32, Fault> {
        match r? {
            sys::HANDLER_FAILED => Err(Fault(self.store.data().ctx.with_last_error(format!("{name} failed")))),
            code => Ok(code),
        }
    }
}

impl Guest for WasmGuest {
    fn on_fop(&mut self, frame: u64, msg: &[u8], payload: u32) -> Result<(), Fault> {
        let (p, n) = self.put(msg)?;
        let (f, inst) = (&self.f.on_fop, self.inst);
        let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, frame, p, n, payload)));
        self.handler(exports::ON_FOP, r).map(drop)
    }

    fn on_reply(&mut self, frame: u64, call_id: u64, msg: &[u8], payload: u32) -> Result<(), Fault> {
        let (p, n) = self.put(msg)?;
        let (f, inst) = (&self.f.on_reply, self.inst);
        let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, frame, call_id, p, n, payload)));
        self.handler(exports::ON_REPLY, r).map(drop)
    }

    fn on_timer(&mut self, timer: u64) -> Result<(), Fault> {
        let (f, inst) = (&self.f.on_timer, self.inst);
        let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, timer)));
        self.handler(exports::ON_TIMER, r).map(drop)
    }

    fn on_event(&mut self, from: i32, msg: &[u8]) -> Result<bool, Fault> {
        let (p, n) = self.put(msg)?;
        let (f, inst) = (&self.f.on_event, self.inst);
        let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, from, p, n)));
        Ok(self.handler(exports::ON_EVENT, r)? == sys::EVENT_PASS)
    }

    fn policy(&mut self, pc: PolicyCall<'_>) -> Result<i64, Fault> {
        let inst = self.inst;
        let missing = |what: &str| Fault(format!("the module exports no {what} policy"));
        match pc {
            PolicyCall::RaOpen { page_size, page_count } => {
                let f = &self.f.ra.as_ref().ok_or_else(|| missing("read-ahead"))?.open;
                let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, page_size, page_count)));
                self.handler64(policy_exports::RA_OPEN, r)
            }
            PolicyCall::RaRead { stream, offset, size, at_ns, out } => {
                if self.f.ra.is_none() {
                    return Err(missing("read-ahead"));
                }
                if self.out.1 == 0 {
                    let alloc = &self.f.alloc;
                    let want = sys::MAX_ADVICE as u32;
                    let ptr = call(&mut self.store, &self.limits, |s| alloc.call(s, want))?;
                    if ptr == 0 {
                        return Err(Fault(format!("{} could not allocate {want} bytes", exports::ALLOC)));
                    }
                    self.out = (ptr, want);
                }
                let (p, cap) = self.out;
                let f = &self.f.ra.as_ref().ok_or_else(|| missing("read-ahead"))?.read;
                let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, stream, offset, size, at_ns, p, cap)));
                let n = self.handler(policy_exports::RA_READ, r)?;
                out.clear();
                if n > 0 {
                    let mem = self.store.data().memory.ok_or_else(|| Fault("no memory".into()))?;
                    out.resize((n as usize).min(cap as usize), 0);
                    mem.read(&self.store, p as usize, out).map_err(|_| Fault("advice outside memory".into()))?;
                }
                Ok(n.into())
            }
            PolicyCall::RaReset { stream, page_size, page_count } => {
                let f = &self.f.ra.as_ref().ok_or_else(|| missing("read-ahead"))?.reset;
                let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, stream, page_size, page_count)));
                self.handler(policy_exports::RA_RESET, r).map(i64::from)
            }
            PolicyCall::RaClose { stream } => {
                let f = &self.f.ra.as_ref().ok_or_else(|| missing("read-ahead"))?.close;
                let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, stream)));
                self.handler(policy_exports::RA_CLOSE, r).map(i64::from)
            }
            PolicyCall::LockInterest => {
                let f = &self.f.lock.as_ref().ok_or_else(|| missing("lock-contention"))?.interest;
                let r = call(&mut self.store, &self.limits, |s| f.call(s, inst));
                self.handler(policy_exports::LOCK_INTEREST, r).map(i64::from)
            }
            PolicyCall::LockDecide { event, view } => {
                if self.f.lock.is_none() {
                    return Err(missing("lock-contention"));
                }
                let (p, n) = self.put(view)?;
                let f = &self.f.lock.as_ref().ok_or_else(|| missing("lock-contention"))?.decide;
                let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, event, p, n)));
                self.handler64(policy_exports::LOCK_DECIDE, r)
            }
        }
    }

    fn dump(&mut self) -> Result<Option<Vec<u8>>, Fault> {
        let Some(f) = self.f.dump.clone() else {
            return Err(Fault(format!("the module exports no {}", node_exports::DUMP)));
        };
        let inst = self.inst;
        let mut cap = 4096u32;
        loop {
            let alloc = &self.f.alloc;
            let p = call(&mut self.store, &self.limits, |s| alloc.call(s, cap))?;
            if p == 0 {
                return Err(Fault(format!("{} could not allocate {cap} bytes", exports::ALLOC)));
            }
            // A trap names the export (a dump is not a fop: say what ran).
            let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, p, cap)))
                .map_err(|Fault(why)| Fault(format!("{}: {why}", node_exports::DUMP)));
            let n = self.handler(node_exports::DUMP, r);
            let mut out = Vec::new();
            if let Ok(n @ 0..) = n
                && n as u32 <= cap
            {
                let mem = self.store.data().memory.ok_or_else(|| Fault("no memory".into()))?;
                out.resize(n as usize, 0);
                mem.read(&self.store, p as usize, &mut out).map_err(|_| Fault("dump outside memory".into()))?;
            }
            let free = &self.f.free;
            call(&mut self.store, &self.limits, |s| free.call(s, (p, cap)))?;
            let Ok(n) = u32::try_from(n?) else { return Ok(None) };
            if n <= cap {
                return Ok(Some(out));
            }
            if n as usize > sys::MAX_DUMP {
                return Ok(None);
            }
            cap = n;
        }
    }

    fn reconfigure(&mut self, options: &[u8]) -> Result<i32, Fault> {
        let Some(f) = self.f.reconfigure.clone() else {
            return Err(Fault(format!("the module exports no {}", node_exports::RECONFIGURE)));
        };
        let (p, n) = self.put(options)?;
        let inst = self.inst;
        let r = call(&mut self.store, &self.limits, |s| f.call(s, (inst, p, n)))
            .map_err(|Fault(why)| Fault(format!("{}: {why}", node_exports::RECONFIGURE)));
        self.handler(node_exports::RECONFIGURE, r)
    }

    fn fini(&mut self) {
        let (f, inst) = (&self.f.fini, self.inst);
        if let Err(Fault(why)) = call(&mut self.store, &self.limits, |s| f.call(s, inst)) {
            tracing::warn!(target: "xlfs::plugin", "plugin fini failed: {why}");
        }
    }
}
