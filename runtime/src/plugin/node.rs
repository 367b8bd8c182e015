//! One plugin node, whichever engine runs its guest: the [`Xlator`] the
//! graph sees ([`PluginXlator`]), the frames it has in flight, the calls it
//! wound, its timers, buffer handles and context slots ([`Core`]), and the
//! host functions the guest calls ([`HostCtx`]). The engines (`wasm.rs`,
//! `dylib.rs`) only move bytes in and out of their guest.
//!
//! Concurrency: calls into the guest are serialized by the node's `slot`
//! mutex and never await; host functions (called from inside those calls)
//! take only the smaller locks (`frames`, a frame's cell, `bufs`,
//! `timers`), never `slot`, and never call back into the guest.
//!
//! A fop's own task drives its frame ([`Driver`]): `wind` only queues the
//! call in the frame's cell; the fop's future starts the queued calls,
//! polls them, and when one is ready runs the guest's `xlfs_on_reply`
//! synchronously, until the frame has a result (an unwind, a tail call's
//! result, or EIO from a fault). So a pass-through fop costs no task spawn
//! and no channel hop: over a child that answers at once, the whole round
//! trip is one poll. Calls still running when the frame ends (fan-out
//! answered early, a timed-out or cancelled fop) are driven to their end by
//! one background task, their replies delivered as before. Only calls
//! without a frame (frame 0) and timers are tasks of their own.
//!
//! Lock order: `slot`, then `frames`, then a frame's cell.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;
use xlfs_sdk::abi::{self, Limits};
use xlfs_sdk::guest::sys::{self, Descriptor};
use xlfs_sdk::slots::Slots;
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, EventSink, FdId, Fop, FopFuture, FopKind, FopResult, Gfid, Options,
    Request, Xlator,
};

use super::Loaded;

/// Most buffer handles a node holds at once.
pub(crate) const MAX_BUFFERS: usize = 16384;
/// Most timers a node has armed at once.
pub(crate) const MAX_TIMERS: usize = 4096;
/// Most per-inode (and, separately, per-fd) context values a node keeps.
pub(crate) const MAX_CTX: usize = 65536;
/// Longest log line kept from a guest, in bytes.
const MAX_LOG: usize = 4096;

/// Why a guest call failed: a trap, a missed deadline, a failed handler.
#[derive(Debug)]
pub(crate) struct Fault(pub(crate) String);

/// A guest instance: one per node, recreated after a fault.
pub(crate) trait Guest: Send {
    /// A fop arrived (`xlfs_on_fop`).
    fn on_fop(&mut self, frame: u64, msg: &[u8], payload: u32) -> Result<(), Fault>;
    /// A wound call came back (`xlfs_on_reply`).
    fn on_reply(&mut self, frame: u64, call: u64, msg: &[u8], payload: u32) -> Result<(), Fault>;
    /// A timer fired (`xlfs_on_timer`).
    fn on_timer(&mut self, timer: u64) -> Result<(), Fault>;
    /// An event arrived (`xlfs_on_event`); true to pass it on.
    fn on_event(&mut self, from: i32, msg: &[u8]) -> Result<bool, Fault>;
    /// A policy call (the ABI v1.1 policy exports); a fault if the module
    /// does not export it.
    fn policy(&mut self, call: PolicyCall<'_>) -> Result<i64, Fault>;
    /// The instance's own state (`xlfs_dump`, ABI v1.2): an encoded Dict,
    /// or `None` when it reports nothing (a negative errno, or more than
    /// [`sys::MAX_DUMP`] bytes). A fault if the module lacks the export.
    fn dump(&mut self) -> Result<Option<Vec<u8>>, Fault>;
    /// New options (`xlfs_reconfigure`, ABI v1.2): the export's result, `0`
    /// or a negative errno. A fault if the module lacks the export.
    fn reconfigure(&mut self, options: &[u8]) -> Result<i32, Fault>;
    /// The instance is done (`xlfs_fini`).
    fn fini(&mut self);
}

/// One call of the policy exports (`sdk/PLUGIN-ABI.md` section 11).
pub(crate) enum PolicyCall<'a> {
    /// `xlfs_ra_open`.
    RaOpen { page_size: u64, page_count: u32 },
    /// `xlfs_ra_read`; the advice is written to `out` (cleared first).
    RaRead { stream: u64, offset: u64, size: u64, at_ns: u64, out: &'a mut Vec<u8> },
    /// `xlfs_ra_reset`.
    RaReset { stream: u64, page_size: u64, page_count: u32 },
    /// `xlfs_ra_close`.
    RaClose { stream: u64 },
    /// `xlfs_lock_interest`.
    LockInterest,
    /// `xlfs_lock_decide`.
    LockDecide { event: u32, view: &'a [u8] },
}

/// A loaded module that can make instances.
pub(crate) trait Module: Send + Sync {
    /// A new instance bound to `host`, initialized with the encoded options.
    fn instantiate(&self, host: &Arc<HostCtx>, options: &[u8], limits: &GuestLimits) -> Result<Box<dyn Guest>, Fault>;
}

/// Limits of one instance that only a sandboxing engine can enforce.
#[derive(Clone, Debug)]
pub(crate) struct GuestLimits {
    /// Most linear memory, in bytes.
    pub(crate) memory: usize,
    /// Longest single call.
    pub(crate) call_timeout: Duration,
}

/// What bounds a node, from its options.
#[derive(Clone, Debug)]
pub(crate) struct NodeLimits {
    pub(crate) frame_timeout: Duration,
    pub(crate) max_frames: usize,
    pub(crate) crash_limit: usize,
    pub(crate) crash_window: Duration,
}

struct FrameEntry {
    cell: Arc<FrameCell>,
    ctx: CallCtx,
    kind: FopKind,
}

/// Who a wound call belongs to, echoed with its result.
#[derive(Clone, Copy)]
struct CallMeta {
    call: u64,
    /// The instance generation that wound it.
    era: u64,
    /// A tail wind: its result is the frame's.
    tail: bool,
}

/// A call the guest wound, not started yet: the frame's driver starts it
/// (outside every lock).
struct Wound {
    meta: CallMeta,
    target: Child,
    ctx: CallCtx,
    req: Request,
    /// Counts the call in flight until it ends (or is dropped unstarted).
    _count: CallCount,
}

/// One of the node's calls in flight; the count drops with it.
struct CallCount(Arc<AtomicUsize>);

impl Drop for CallCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

type CallFuture = Pin<Box<dyn Future<Output = (CallMeta, FopResult)> + Send>>;

impl Wound {
    fn start(self) -> CallFuture {
        Box::pin(async move {
            let Wound { meta, target, ctx, req, _count } = self;
            let result = target.call(ctx, req).await;
            (meta, result)
        })
    }
}

/// What host functions hand a frame's driver: calls to start, its result,
/// and the waker of its task while it waits.
#[derive(Default)]
struct FrameState {
    inbox: Vec<Wound>,
    result: Option<FopResult>,
    waker: Option<Waker>,
}

#[derive(Default)]
struct FrameCell(Mutex<FrameState>);

impl FrameCell {
    fn push(&self, w: Wound) {
        let mut s = self.0.lock();
        s.inbox.push(w);
        if let Some(waker) = s.waker.take() {
            waker.wake();
        }
    }

    /// Sets the frame's result (the first one stands).
    fn finish(&self, result: FopResult) {
        let mut s = self.0.lock();
        if s.result.is_none() {
            s.result = Some(result);
        }
        if let Some(waker) = s.waker.take() {
            waker.wake();
        }
    }
}

/// Drives one frame inside the task of the fop that made it: starts the
/// calls wound for the frame, polls them, delivers their replies to the
/// guest, and yields the frame's result. Dropped before the frame is over
/// (a frame timeout, the caller gone) or with calls still running, it hands
/// the rest to a background task.
struct Driver {
    core: Arc<Core>,
    frame: u64,
    cell: Arc<FrameCell>,
    calls: Vec<CallFuture>,
    /// When the frame times out.
    deadline: Instant,
    /// Set on the background task's driver: its drop hands nothing on.
    detached: bool,
}

impl Driver {
    /// Makes progress; `Ready(Some(result))` once the frame has a result
    /// (when `want_result`), `Ready(None)` once nothing is left to run
    /// (when not).
    fn poll_frame(&mut self, cx: &mut Context<'_>, want_result: bool) -> Poll<Option<FopResult>> {
        loop {
            let (wounds, result) = {
                let mut s = self.cell.0.lock();
                s.waker = None;
                (std::mem::take(&mut s.inbox), if want_result { s.result.take() } else { None })
            };
            self.calls.extend(wounds.into_iter().map(Wound::start));
            if result.is_some() {
                return Poll::Ready(result);
            }
            let mut progressed = false;
            let mut i = 0;
            while i < self.calls.len() {
                let Poll::Ready((meta, result)) = self.calls[i].as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                drop(self.calls.swap_remove(i));
                progressed = true;
                if meta.tail {
                    if want_result {
                        return Poll::Ready(Some(result));
                    }
                } else {
                    // The guest's reply handler runs here, in this task; it
                    // may wind more calls or unwind the frame.
                    self.core.deliver(meta.era, self.frame, meta.call, result);
                }
            }
            if progressed {
                continue;
            }
            let mut s = self.cell.0.lock();
            if !s.inbox.is_empty() || (want_result && s.result.is_some()) {
                continue;
            }
            if !want_result && self.calls.is_empty() {
                return Poll::Ready(None);
            }
            s.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
    }

    /// The background rest of a frame: its result if it is still in flight
    /// (discarded: the caller is gone; EIO and logged at the deadline),
    /// then every call still queued or running.
    async fn finish(mut self) {
        if self.core.frames.lock().contains_key(&self.frame) {
            let deadline = tokio::time::Instant::from_std(self.deadline);
            if tokio::time::timeout_at(deadline, std::future::poll_fn(|cx| self.poll_frame(cx, true))).await.is_err() {
                self.core.expire(self.frame);
            }
        }
        std::future::poll_fn(|cx| self.poll_frame(cx, false)).await;
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        if self.calls.is_empty() {
            // One lock at a time: elsewhere the order is frames, then cell.
            let queued = !self.cell.0.lock().inbox.is_empty();
            let live = self.core.frames.lock().contains_key(&self.frame);
            if !queued && !live {
                return;
            }
        }
        let Some(rt) = self.core.handle() else { return };
        let rest = Driver {
            core: self.core.clone(),
            frame: self.frame,
            cell: self.cell.clone(),
            calls: std::mem::take(&mut self.calls),
            deadline: self.deadline,
            detached: true,
        };
        rt.spawn(rest.finish());
    }
}

#[derive(Default)]
struct Bufs {
    map: HashMap<u32, Bytes>,
    next: u32,
}

impl Bufs {
    fn insert(&mut self, b: Bytes) -> Result<u32, Errno> {
        if self.map.len() >= MAX_BUFFERS {
            return Err(Errno::ENOMEM);
        }
        loop {
            self.next = self.next.wrapping_add(1).max(1);
            if !self.map.contains_key(&self.next) {
                self.map.insert(self.next, b);
                return Ok(self.next);
            }
        }
    }
}

#[derive(Default)]
struct Slot {
    guest: Option<Box<dyn Guest>>,
    /// When recent crashes happened, oldest first (at most the limit).
    crashes: VecDeque<Instant>,
    total_crashes: u64,
    disabled: bool,
    shut: bool,
    last_disabled_log: Option<Instant>,
}

/// The state of one plugin node.
pub(crate) struct Core {
    me: Weak<Core>,
    name: String,
    children: Vec<Child>,
    sink: EventSink,
    limits: NodeLimits,
    /// The guest; declared before `loaded` so it is dropped first.
    slot: Mutex<Slot>,
    frames: Mutex<HashMap<u64, FrameEntry>>,
    bufs: Mutex<Bufs>,
    timers: Mutex<HashMap<u64, AbortHandle>>,
    inode_ctx: Slots<Gfid, u64>,
    fd_ctx: Slots<FdId, u64>,
    permits: Semaphore,
    next_frame: AtomicU64,
    next_call: AtomicU64,
    next_timer: AtomicU64,
    calls: Arc<AtomicUsize>,
    entered: AtomicU64,
    passed: AtomicU64,
    /// Bumped each time the instance is dropped; replies and timers of an
    /// older instance are discarded.
    generation: AtomicU64,
    rt: OnceLock<Handle>,
    node_ctx: CallCtx,
    /// The options an instance is made with (the plugin's own, encoded):
    /// the volfile's, or the last ones `xlfs_reconfigure` accepted.
    init_msg: Mutex<Vec<u8>>,
    /// The node's options as the graph gave them (host's and plugin's).
    options: Mutex<Options>,
    /// Instances made (the first, and each restart after a crash).
    instances: AtomicU64,
    /// Option changes applied in place.
    reconfigures: AtomicU64,
    guest_limits: GuestLimits,
    host: Arc<HostCtx>,
    loaded: Arc<Loaded>,
}

fn neg(e: Errno) -> i64 {
    -(e.0 as i64)
}

impl Core {
    pub(crate) fn new(
        name: String,
        children: Vec<Child>,
        sink: EventSink,
        limits: NodeLimits,
        guest_limits: GuestLimits,
        options: Options,
        loaded: Arc<Loaded>,
    ) -> Arc<Core> {
        let init_msg = plugin_options(loaded.kind, &options);
        Arc::new_cyclic(|me: &Weak<Core>| Core {
            me: me.clone(),
            node_ctx: CallCtx::root(format!("plugin:{name}")),
            host: Arc::new(HostCtx {
                label: name.clone(),
                core: me.clone(),
                declared: Mutex::new(None),
                last_error: Mutex::new(None),
            }),
            name,
            children,
            sink,
            permits: Semaphore::new(limits.max_frames),
            limits,
            slot: Mutex::new(Slot::default()),
            frames: Mutex::new(HashMap::new()),
            bufs: Mutex::new(Bufs::default()),
            timers: Mutex::new(HashMap::new()),
            inode_ctx: Slots::with_capacity(MAX_CTX),
            fd_ctx: Slots::with_capacity(MAX_CTX),
            next_frame: AtomicU64::new(1),
            next_call: AtomicU64::new(1),
            next_timer: AtomicU64::new(1),
            calls: Arc::new(AtomicUsize::new(0)),
            entered: AtomicU64::new(0),
            passed: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            rt: OnceLock::new(),
            init_msg: Mutex::new(init_msg),
            options: Mutex::new(options),
            instances: AtomicU64::new(0),
            reconfigures: AtomicU64::new(0),
            guest_limits,
            loaded,
        })
    }

    fn desc(&self) -> &Descriptor {
        &self.loaded.desc
    }

    /// Builds the first instance now, so that a plugin whose init fails
    /// fails the graph build with its reason.
    pub(crate) fn start(&self) -> Result<(), String> {
        let mut slot = self.slot.lock();
        match self.instantiate() {
            Ok(g) => {
                slot.guest = Some(g);
                Ok(())
            }
            Err(Fault(why)) => Err(self.host.with_last_error(why)),
        }
    }

    /// A new instance with the current options.
    fn instantiate(&self) -> Result<Box<dyn Guest>, Fault> {
        let msg = self.init_msg.lock().clone();
        let g = self.loaded.module.instantiate(&self.host, &msg, &self.guest_limits)?;
        self.instances.fetch_add(1, Ordering::Relaxed);
        Ok(g)
    }

    /// New options for the node ([`Xlator::reconfigure`]): given in place
    /// to the instance through `xlfs_reconfigure` (ABI v1.2) when only the
    /// plugin's own options changed and the module exports it; otherwise
    /// [`ReconfigureError::Unsupported`] (the graph builds a new node).
    /// Checked against the module's declarations first, as at init. A
    /// refusal (or a crash) leaves the old options in force: a restarted
    /// instance gets them too.
    fn reconfigure(&self, new: &Options) -> Result<(), ReconfigureError> {
        if !self.loaded.node_exports.reconfigure {
            return Err(ReconfigureError::Unsupported);
        }
        {
            let old = self.options.lock();
            if self.loaded.kind.host_options().iter().any(|h| old.get(h.name) != new.get(h.name)) {
                // module, limits: the host's own options need a new node.
                return Err(ReconfigureError::Unsupported);
            }
        }
        let given: Vec<(String, String)> =
            new.iter().filter(|(_, _, set)| *set).map(|(k, v, _)| (k.to_string(), v.to_string())).collect();
        Options::resolve(self.loaded.decls, given.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(|e| ReconfigureError::Invalid(e.to_string()))?;
        let msg = plugin_options(self.loaded.kind, new);
        let r = self.with_guest(None, |g, _| {
            let code = g.reconfigure(&msg)?;
            // The plugin logs why before refusing (under the slot lock,
            // so this is this call's line).
            let said = if code < 0 { self.host.last_error.lock().take() } else { None };
            Ok((code, said))
        });
        match r {
            Ok((sys::HANDLER_OK, _)) => {
                *self.init_msg.lock() = msg;
                *self.options.lock() = new.clone();
                self.reconfigures.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: "xlfs::plugin", node = %self.name, "plugin took its new options in place");
                Ok(())
            }
            Ok((sys::RECONFIGURE_UNSUPPORTED, _)) => Err(ReconfigureError::Unsupported),
            Ok((code, said)) => Err(ReconfigureError::Invalid(said.unwrap_or_else(|| {
                format!("{} refused them ({})", sys::node_exports::RECONFIGURE, Errno(code.saturating_neg()))
            }))),
            // A disabled plugin stays so until its node is rebuilt: let
            // the reload rebuild it with the new options.
            Err(_) if self.slot.lock().disabled => Err(ReconfigureError::Unsupported),
            Err(e) => Err(ReconfigureError::Invalid(format!(
                "{} failed ({e}): the plugin crashed, see the log; its old options stay",
                sys::node_exports::RECONFIGURE
            ))),
        }
    }

    /// The instance's own dump pairs (ABI v1.2), if it runs and reports
    /// any. A crash while dumping is handled as any other.
    fn guest_dump(&self) -> Vec<(String, String)> {
        if !self.loaded.node_exports.dump {
            return Vec::new();
        }
        let mut slot = self.slot.lock();
        if slot.shut || slot.disabled {
            return Vec::new();
        }
        let Some(guest) = slot.guest.as_mut() else { return Vec::new() };
        self.host.last_error.lock().take();
        let bytes = match guest.dump() {
            Ok(Some(b)) => b,
            Ok(None) => return Vec::new(),
            Err(fault) => {
                self.crash(&mut slot, fault);
                return Vec::new();
            }
        };
        drop(slot);
        match sys::decode_dump(&bytes) {
            Ok(pairs) => pairs,
            Err(e) => {
                tracing::warn!(target: "xlfs::plugin", node = %self.name, "plugin dumped garbage ({e}): left out");
                Vec::new()
            }
        }
    }

    fn handle(&self) -> Option<Handle> {
        Handle::try_current().ok().or_else(|| self.rt.get().cloned())
    }

    /// Runs `f` on the instance (making one if the last one crashed),
    /// unless the plugin is disabled or shut, or `era` is given and is not
    /// the current instance's. A fault drops the instance ([`Core::crash`]).
    fn with_guest<R>(
        &self,
        era: Option<u64>,
        f: impl FnOnce(&mut dyn Guest, u64) -> Result<R, Fault>,
    ) -> Result<R, Errno> {
        let mut slot = self.slot.lock();
        if slot.shut {
            return Err(Errno::ENOTCONN);
        }
        let current = self.generation.load(Ordering::Acquire);
        if era.is_some_and(|g| g != current) {
            return Err(Errno::ESTALE);
        }
        if slot.disabled {
            let now = Instant::now();
            if slot.last_disabled_log.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                slot.last_disabled_log = Some(now);
                tracing::warn!(target: "xlfs::plugin", node = %self.name, module = %self.loaded.path.display(),
                    "plugin is disabled after a crash loop: its fops fail with EIO until the graph is rebuilt");
            }
            return Err(Errno::EIO);
        }
        if slot.guest.is_none() {
            match self.instantiate() {
                Ok(g) => {
                    tracing::info!(target: "xlfs::plugin", node = %self.name, "plugin instance restarted");
                    slot.guest = Some(g);
                }
                Err(Fault(why)) => {
                    let why = self.host.with_last_error(format!("restart failed: {why}"));
                    self.crash(&mut slot, Fault(why));
                    return Err(Errno::EIO);
                }
            }
        }
        let Some(guest) = slot.guest.as_mut() else { return Err(Errno::EIO) };
        // A crash report quotes the plugin's last error line of this call.
        self.host.last_error.lock().take();
        match f(guest.as_mut(), current) {
            Ok(r) => Ok(r),
            Err(fault) => {
                self.crash(&mut slot, fault);
                Err(Errno::EIO)
            }
        }
    }

    /// Drops a faulted instance: its frames in flight fail with EIO, its
    /// timers, buffers and context values go; too many crashes within the
    /// window disable the plugin.
    fn crash(&self, slot: &mut Slot, Fault(why): Fault) {
        let dead = slot.guest.take();
        self.generation.fetch_add(1, Ordering::AcqRel);
        let frames: Vec<FrameEntry> = self.frames.lock().drain().map(|(_, f)| f).collect();
        let failed = frames.len();
        for f in frames {
            f.cell.finish(Err(Errno::EIO));
        }
        self.bufs.lock().map.clear();
        for (_, t) in self.timers.lock().drain() {
            t.abort();
        }
        self.inode_ctx.retain(|_, _| false);
        self.fd_ctx.retain(|_, _| false);
        let now = Instant::now();
        slot.total_crashes += 1;
        slot.crashes.push_back(now);
        while slot.crashes.len() > self.limits.crash_limit
            || slot.crashes.front().is_some_and(|t| now.duration_since(*t) > self.limits.crash_window)
        {
            slot.crashes.pop_front();
        }
        let module = self.loaded.path.display();
        if slot.crashes.len() >= self.limits.crash_limit {
            slot.disabled = true;
            tracing::error!(target: "xlfs::plugin", node = %self.name, %module,
                "plugin crashed: {why}; {failed} fops in flight failed with EIO; {} crashes within {:?} (crash-loop-limit): \
                 plugin DISABLED, its fops now fail with EIO until the graph is rebuilt",
                slot.crashes.len(), self.limits.crash_window);
        } else {
            tracing::error!(target: "xlfs::plugin", node = %self.name, %module,
                "plugin crashed: {why}; {failed} fops in flight failed with EIO; the instance is dropped and restarted on the next call");
        }
        drop(dead);
    }

    /// A fop for the guest: a new frame, `xlfs_on_fop`, then drive the
    /// frame in this task until it has a result (or fails, or times out).
    async fn run_fop(&self, ctx: CallCtx, mut req: Request) -> FopResult {
        if self.rt.get().is_none()
            && let Ok(h) = Handle::try_current()
        {
            let _ = self.rt.set(h);
        }
        let Some(me) = self.me.upgrade() else { return Err(Errno::ENOTCONN) };
        let _permit = self.permits.acquire().await.map_err(|_| Errno::EIO)?;
        self.entered.fetch_add(1, Ordering::Relaxed);
        let kind = req.fop.kind();
        let frame = self.next_frame.fetch_add(1, Ordering::Relaxed);
        let cell = Arc::new(FrameCell::default());
        let deadline = tokio::time::Instant::now() + self.limits.frame_timeout;
        let mut driver = Driver {
            core: me,
            frame,
            cell: cell.clone(),
            calls: Vec::new(),
            deadline: deadline.into_std(),
            detached: false,
        };
        let data = sys::take_fop_data(&mut req.fop);
        let mut msg = Vec::new();
        sys::encode_call(Some(&ctx), &req, &mut msg);
        let entered = self.with_guest(None, |g, _| {
            let payload = match data {
                None => sys::NO_BUF,
                Some(d) => match self.bufs.lock().insert(d) {
                    Ok(h) => h,
                    Err(e) => return Ok(Err(e)),
                },
            };
            self.frames.lock().insert(frame, FrameEntry { cell, ctx, kind });
            g.on_fop(frame, &msg, payload).map(Ok)
        });
        match entered {
            Ok(Ok(())) => {}
            Ok(Err(e)) | Err(e) => {
                // The frame failed before the guest saw it (or with it).
                self.frames.lock().remove(&frame);
                return Err(e);
            }
        }
        let run = std::future::poll_fn(|cx| driver.poll_frame(cx, true));
        match tokio::time::timeout_at(deadline, run).await {
            Ok(Some(result)) => result,
            Ok(None) => Err(Errno::EIO),
            Err(_) => {
                self.expire(frame);
                Err(Errno::EIO)
            }
        }
    }

    /// A frame missed its deadline: it is dropped (logged) if still in
    /// flight; a later unwind of it is refused.
    fn expire(&self, frame: u64) {
        if let Some(f) = self.frames.lock().remove(&frame) {
            tracing::warn!(target: "xlfs::plugin", node = %self.name, frame, fop = f.kind.name(),
                "plugin did not unwind the frame within frame-timeout ({:?}): failing it with EIO", self.limits.frame_timeout);
            f.cell.finish(Err(Errno::EIO));
        }
    }

    /// A wound call's result, back into the guest.
    fn deliver(&self, era: u64, frame: u64, call: u64, mut result: FopResult) {
        let data = sys::take_result_data(&mut result);
        let r = self.with_guest(Some(era), |g, _| {
            let payload = match data {
                None => sys::NO_BUF,
                Some(d) => match self.bufs.lock().insert(d) {
                    Ok(h) => h,
                    Err(e) => {
                        result = Err(e);
                        sys::NO_BUF
                    }
                },
            };
            let mut msg = Vec::new();
            abi::encode(&result, &mut msg);
            g.on_reply(frame, call, &msg, payload)
        });
        if let Err(e) = r {
            tracing::debug!(target: "xlfs::plugin", node = %self.name, frame, call, "reply not delivered: {e:?}");
        }
    }

    fn fire_timer(&self, era: u64, timer: u64) {
        if self.timers.lock().remove(&timer).is_none() {
            return;
        }
        let _ = self.with_guest(Some(era), |g, _| g.on_timer(timer));
    }

    /// Fails one frame with EIO because the guest misused the ABI for it.
    fn fail_frame(&self, frame: u64, why: &str) {
        if let Some(f) = self.frames.lock().remove(&frame) {
            tracing::warn!(target: "xlfs::plugin", node = %self.name, frame, fop = f.kind.name(), "{why}: failing the fop with EIO");
            f.cell.finish(Err(Errno::EIO));
        } else {
            tracing::warn!(target: "xlfs::plugin", node = %self.name, frame, "{why}");
        }
    }

    fn wind(&self, frame: u64, child: u32, flags: u32, msg: &[u8], payload: u32) -> i64 {
        let tail = flags & sys::WIND_TAIL != 0;
        if flags & !sys::WIND_TAIL != 0 || (tail && frame == 0) {
            self.fail_frame(frame, &format!("wind with bad flags {flags:#x}"));
            return neg(Errno::EINVAL);
        }
        let (ctx, mut req) = match sys::decode_call(msg, &Limits::DEFAULT) {
            Ok(x) => x,
            Err(e) => {
                self.fail_frame(frame, &format!("wind of an undecodable request ({e})"));
                return neg(Errno::EINVAL);
            }
        };
        let Some(target) = self.children.get(child as usize).cloned() else {
            self.fail_frame(
                frame,
                &format!("wind to child {child}, but the node has {} children", self.children.len()),
            );
            return neg(Errno::EINVAL);
        };
        if payload != sys::NO_BUF {
            let Some(bytes) = self.bufs.lock().map.get(&payload).cloned() else {
                self.fail_frame(frame, &format!("wind with unknown buffer handle {payload}"));
                return neg(Errno::EBADF);
            };
            if !sys::put_fop_data(&mut req.fop, bytes) {
                self.fail_frame(frame, &format!("wind of {} with a data buffer", req.fop.kind().name()));
                return neg(Errno::EINVAL);
            }
        }
        let max_calls = self.limits.max_frames.saturating_mul(4).max(64);
        if self.calls.load(Ordering::Relaxed) >= max_calls {
            return neg(Errno::EAGAIN);
        }
        let era = self.generation.load(Ordering::Acquire);
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let meta = CallMeta { call, era, tail };
        let wound = |ctx: CallCtx, count: CallCount| Wound { meta, target, ctx, req, _count: count };
        if frame == 0 {
            // A detached call: no fop to drive it, so a task of its own.
            let (Some(rt), Some(me)) = (self.handle(), self.me.upgrade()) else { return neg(Errno::EAGAIN) };
            self.calls.fetch_add(1, Ordering::Relaxed);
            let fut = wound(ctx.unwrap_or_else(|| self.node_ctx.clone()), CallCount(self.calls.clone())).start();
            rt.spawn(async move {
                let (meta, result) = fut.await;
                me.deliver(meta.era, 0, meta.call, result);
            });
            return call as i64;
        }
        let mut frames = self.frames.lock();
        let Some(entry) = frames.get(&frame) else { return neg(Errno::ENOENT) };
        self.calls.fetch_add(1, Ordering::Relaxed);
        // A context the guest encoded lacks the fop's timing frame
        // (never encoded): the call is still the fop's own.
        let ctx = match ctx {
            Some(c) => CallCtx { frame: entry.ctx.frame.clone(), ..c },
            None => entry.ctx.clone(),
        };
        let w = wound(ctx, CallCount(self.calls.clone()));
        entry.cell.push(w);
        if tail {
            // The frame ends here: its result is this call's.
            frames.remove(&frame);
        }
        call as i64
    }

    fn unwind(&self, frame: u64, msg: &[u8], payload: u32) -> i32 {
        let Some(entry) = self.frames.lock().remove(&frame) else {
            tracing::debug!(target: "xlfs::plugin", node = %self.name, frame, "unwind of a frame not in flight");
            return -Errno::ENOENT.0;
        };
        let kind = entry.kind.name();
        let refuse = |entry: FrameEntry, why: String, e: Errno| {
            tracing::warn!(target: "xlfs::plugin", node = %self.name, frame, fop = kind, "{why}: failing the fop with EIO");
            entry.cell.finish(Err(Errno::EIO));
            -e.0
        };
        let mut result = match abi::decode::<FopResult>(msg, None, &Limits::DEFAULT) {
            Ok(r) => r,
            Err(e) => return refuse(entry, format!("plugin unwound garbage ({e})"), Errno::EINVAL),
        };
        if payload != sys::NO_BUF {
            let Some(bytes) = self.bufs.lock().map.get(&payload).cloned() else {
                return refuse(entry, format!("unwind with unknown buffer handle {payload}"), Errno::EBADF);
            };
            if !sys::put_result_data(&mut result, bytes) {
                return refuse(entry, "unwind of a non-READ result with a data buffer".into(), Errno::EINVAL);
            }
        }
        entry.cell.finish(result);
        0
    }

    fn timer_set(&self, delay_ms: u64) -> i64 {
        let mut timers = self.timers.lock();
        if timers.len() >= MAX_TIMERS {
            return neg(Errno::EAGAIN);
        }
        let (Some(rt), Some(me)) = (self.handle(), self.me.upgrade()) else { return neg(Errno::EAGAIN) };
        let id = self.next_timer.fetch_add(1, Ordering::Relaxed);
        let era = self.generation.load(Ordering::Acquire);
        let weak = Arc::downgrade(&me);
        drop(me);
        let task = rt.spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            if let Some(core) = weak.upgrade() {
                core.fire_timer(era, id);
            }
        });
        timers.insert(id, task.abort_handle());
        id as i64
    }

    fn timer_cancel(&self, id: u64) -> i32 {
        match self.timers.lock().remove(&id) {
            Some(t) => {
                t.abort();
                0
            }
            None => -Errno::ENOENT.0,
        }
    }

    fn shutdown(&self) {
        let dead = {
            let mut slot = self.slot.lock();
            slot.shut = true;
            slot.guest.take()
        };
        if let Some(mut g) = dead {
            g.fini();
        }
        for (_, f) in self.frames.lock().drain() {
            f.cell.finish(Err(Errno::EIO));
        }
        for (_, t) in self.timers.lock().drain() {
            t.abort();
        }
    }
}

/// What host functions act on: one node (or, while a module is being
/// described, no node). WebAssembly stores hold it; a native guest gets a
/// pointer to it as its vtable's `ctx`.
pub(crate) struct HostCtx {
    label: String,
    core: Weak<Core>,
    declared: Mutex<Option<Vec<u8>>>,
    last_error: Mutex<Option<String>>,
}

impl HostCtx {
    /// A context for `xlfs_describe`: only `declare` and `log` work.
    pub(crate) fn describing(label: String) -> Arc<HostCtx> {
        Arc::new(HostCtx { label, core: Weak::new(), declared: Mutex::new(None), last_error: Mutex::new(None) })
    }

    /// What the guest declared.
    pub(crate) fn take_declared(&self) -> Option<Vec<u8>> {
        self.declared.lock().take()
    }

    /// `why`, with the guest's last error log line if it logged one.
    pub(crate) fn with_last_error(&self, why: String) -> String {
        match self.last_error.lock().take() {
            Some(e) => format!("{why} (plugin said: {e})"),
            None => why,
        }
    }

    fn core(&self) -> Result<Arc<Core>, Errno> {
        self.core.upgrade().ok_or(Errno::EPERM)
    }

    pub(crate) fn wind(&self, frame: u64, child: u32, flags: u32, msg: &[u8], payload: u32) -> i64 {
        self.core().map_or_else(neg, |c| c.wind(frame, child, flags, msg, payload))
    }

    pub(crate) fn unwind(&self, frame: u64, msg: &[u8], payload: u32) -> i32 {
        self.core().map_or_else(|e| -e.0, |c| c.unwind(frame, msg, payload))
    }

    pub(crate) fn timer_set(&self, delay_ms: u64) -> i64 {
        self.core().map_or_else(neg, |c| c.timer_set(delay_ms))
    }

    pub(crate) fn timer_cancel(&self, id: u64) -> i32 {
        self.core().map_or_else(|e| -e.0, |c| c.timer_cancel(id))
    }

    pub(crate) fn inode_ctx_get(&self, gfid: [u8; 16]) -> Option<u64> {
        self.core().ok()?.inode_ctx.get(&Gfid(gfid))
    }

    pub(crate) fn inode_ctx_set(&self, gfid: [u8; 16], value: u64) -> i32 {
        match self.core().and_then(|c| c.inode_ctx.insert(Gfid(gfid), value)) {
            Ok(_) => 0,
            Err(e) => -e.0,
        }
    }

    pub(crate) fn inode_ctx_del(&self, gfid: [u8; 16]) -> i32 {
        match self.core() {
            Ok(c) => c.inode_ctx.remove(&Gfid(gfid)).map_or(-Errno::ENOENT.0, |_| 0),
            Err(e) => -e.0,
        }
    }

    pub(crate) fn fd_ctx_get(&self, fd: u64) -> Option<u64> {
        self.core().ok()?.fd_ctx.get(&FdId(fd))
    }

    pub(crate) fn fd_ctx_set(&self, fd: u64, value: u64) -> i32 {
        match self.core().and_then(|c| c.fd_ctx.insert(FdId(fd), value)) {
            Ok(_) => 0,
            Err(e) => -e.0,
        }
    }

    pub(crate) fn fd_ctx_del(&self, fd: u64) -> i32 {
        match self.core() {
            Ok(c) => c.fd_ctx.remove(&FdId(fd)).map_or(-Errno::ENOENT.0, |_| 0),
            Err(e) => -e.0,
        }
    }

    pub(crate) fn log(&self, level: u32, msg: &[u8]) {
        let msg = String::from_utf8_lossy(&msg[..msg.len().min(MAX_LOG)]);
        let node = &self.label;
        match level {
            sys::log_level::ERROR => {
                *self.last_error.lock() = Some(msg.to_string());
                tracing::error!(target: "xlfs::plugin", %node, "{msg}")
            }
            sys::log_level::WARN => tracing::warn!(target: "xlfs::plugin", %node, "{msg}"),
            sys::log_level::INFO => tracing::info!(target: "xlfs::plugin", %node, "{msg}"),
            sys::log_level::DEBUG => tracing::debug!(target: "xlfs::plugin", %node, "{msg}"),
            _ => tracing::trace!(target: "xlfs::plugin", %node, "{msg}"),
        }
    }

    pub(crate) fn now_ns(&self) -> u64 {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The bytes behind a handle.
    pub(crate) fn buf(&self, h: u32) -> Result<Bytes, Errno> {
        self.core()?.bufs.lock().map.get(&h).cloned().ok_or(Errno::EBADF)
    }

    pub(crate) fn buf_len(&self, h: u32) -> i64 {
        self.buf(h).map_or_else(neg, |b| b.len() as i64)
    }

    pub(crate) fn buf_new(&self, bytes: &[u8]) -> i64 {
        self.buf_insert(Bytes::copy_from_slice(bytes))
    }

    fn buf_insert(&self, b: Bytes) -> i64 {
        match self.core().and_then(|c| c.bufs.lock().insert(b)) {
            Ok(h) => h as i64,
            Err(e) => neg(e),
        }
    }

    pub(crate) fn buf_slice(&self, h: u32, offset: u64, len: u64) -> i64 {
        match self.buf(h) {
            Ok(b) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
                let end = start.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)).min(b.len());
                self.buf_insert(b.slice(start..end))
            }
            Err(e) => neg(e),
        }
    }

    pub(crate) fn buf_free(&self, h: u32) -> i32 {
        match self.core() {
            Ok(c) => c.bufs.lock().map.remove(&h).map_or(-Errno::EBADF.0, |_| 0),
            Err(e) => -e.0,
        }
    }

    pub(crate) fn declare(&self, msg: &[u8]) -> i32 {
        if self.core.strong_count() > 0 {
            return -Errno::EPERM.0;
        }
        if msg.len() > sys::MAX_DESCRIPTOR {
            return -Errno::E2BIG.0;
        }
        let mut d = self.declared.lock();
        if d.is_some() {
            return -Errno::EEXIST.0;
        }
        *d = Some(msg.to_vec());
        0
    }
}

/// The plugin's own options in `options` (those the volfile sets, not the
/// host's), as the Dict of Str values `xlfs_init` and `xlfs_reconfigure` get.
pub(crate) fn plugin_options(kind: super::Kind, options: &Options) -> Vec<u8> {
    let mut mine = Dict::new();
    for (k, v, set) in options.iter() {
        if set && !kind.host_options().iter().any(|h| h.matches(k)) {
            mine.set_str(k.to_string(), v.to_string());
        }
    }
    let mut msg = Vec::new();
    abi::encode(&mine, &mut msg);
    msg
}

/// A plugin node as the graph sees it.
pub(crate) struct PluginXlator {
    pub(crate) core: Arc<Core>,
}

impl Xlator for PluginXlator {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(async move {
            let core = &self.core;
            // The host keeps context slots for the guest: drop them when
            // the inode or fd goes, whether or not the guest sees the fop.
            match &req.fop {
                Fop::Forget { gfid } => {
                    core.inode_ctx.remove(gfid);
                }
                Fop::Release { fd } | Fop::Releasedir { fd } => {
                    core.fd_ctx.remove(&fd.id);
                }
                _ => {}
            }
            if core.desc().fops.contains(req.fop.kind()) {
                return core.run_fop(ctx, req).await;
            }
            core.passed.fetch_add(1, Ordering::Relaxed);
            match core.children.first() {
                Some(c) => c.call(ctx, req).await,
                None => Err(Errno::ENOSYS),
            }
        })
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        let core = &self.core;
        // A leaf plugin cannot say ChildUp itself in ABI v1.0; the host
        // does it for it.
        if core.children.is_empty() && from == EventFrom::Graph {
            match event {
                Event::ParentUp => core.sink.send(Event::ChildUp),
                Event::ParentDown => core.sink.send(Event::ChildDown),
                _ => {}
            }
        }
        let default = || match from {
            EventFrom::Child(_) => Some(event.clone()),
            EventFrom::Graph => None,
        };
        if !core.desc().events.contains(&event) {
            return default();
        }
        let from_code = match from {
            EventFrom::Child(i) => i32::try_from(i).unwrap_or(i32::MAX),
            EventFrom::Graph => sys::FROM_GRAPH,
        };
        let mut msg = Vec::new();
        abi::encode(&event, &mut msg);
        match core.with_guest(None, |g, _| g.on_event(from_code, &msg)) {
            Ok(true) => Some(event),
            Ok(false) => None,
            Err(_) => default(),
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        self.core.reconfigure(options)
    }

    /// The host's counters for the node, then the plugin's own pairs
    /// (ABI v1.2 `xlfs_dump`), each key prefixed with the plugin's name.
    fn dump(&self) -> Vec<(String, String)> {
        let core = &self.core;
        let slot = core.slot.lock();
        let l = &core.loaded;
        let mut out = vec![
            ("plugin.module".into(), l.path.display().to_string()),
            ("plugin.engine".into(), l.kind.type_name().into()),
            ("plugin.name".into(), l.desc.name.clone()),
            ("plugin.abi".into(), l.version.to_string()),
            ("plugin.frames-in-flight".into(), core.frames.lock().len().to_string()),
            ("plugin.calls-in-flight".into(), core.calls.load(Ordering::Relaxed).to_string()),
            ("plugin.fops-entered".into(), core.entered.load(Ordering::Relaxed).to_string()),
            ("plugin.fops-passed-through".into(), core.passed.load(Ordering::Relaxed).to_string()),
            ("plugin.crashes".into(), slot.total_crashes.to_string()),
            ("plugin.disabled".into(), slot.disabled.to_string()),
            ("plugin.instances".into(), core.instances.load(Ordering::Relaxed).to_string()),
            ("plugin.reconfigures".into(), core.reconfigures.load(Ordering::Relaxed).to_string()),
        ];
        drop(slot);
        let name = &l.desc.name;
        out.extend(core.guest_dump().into_iter().map(|(k, v)| (format!("{name}.{k}"), v)));
        out
    }

    fn fini(&self) {
        self.core.shutdown();
    }
}
