//! One plugin node, whichever engine runs its guest: the [`Xlator`] the
//! graph sees ([`PluginXlator`]), the frames it has in flight, the calls it
//! wound, its timers, buffer handles and context slots ([`Core`]), and the
//! host functions the guest calls ([`HostCtx`]). The engines (`wasm.rs`,
//! `dylib.rs`) only move bytes in and out of their guest.
//!
//! This file holds what an engine provides ([`Module`], [`Guest`]), the
//! node's state ([`Core`]) and the life of its guest instance (made, called
//! under the `slot` lock, dropped after a crash, shut down). Beside it:
//! - `node/driver.rs`: frames and the calls wound for them, driven inside
//!   each fop's own task;
//! - `node/host.rs`: the host functions the guest calls ([`HostCtx`]);
//! - `node/handles.rs`: the guest's buffer handles and timers;
//! - `node/xlator.rs`: the node as the graph sees it ([`PluginXlator`]),
//!   with its dump and reconfigure.
//!
//! Concurrency: calls into the guest are serialized by the node's `slot`
//! mutex and never await; host functions (called from inside those calls)
//! take only the smaller locks (`frames`, a frame's cell, `bufs`,
//! `timers`), never `slot`, and never call back into the guest.
//!
//! Lock order: `slot`, then `frames`, then a frame's cell.
//!
//! [`Xlator`]: xlfs_sdk::Xlator

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;
use xlfs_sdk::guest::sys::Descriptor;
use xlfs_sdk::slots::{IdMap, Slots};
use xlfs_sdk::{CallCtx, Child, Errno, EventSink, FdId, Gfid, Options};

use super::Loaded;

mod driver;
mod handles;
mod host;
mod xlator;

use driver::FrameEntry;
use handles::Bufs;
pub(crate) use host::HostCtx;
pub(crate) use xlator::{PluginXlator, plugin_options};

/// Most buffer handles a node holds at once.
pub(crate) const MAX_BUFFERS: usize = 16384;
/// Most bytes a node's buffer handles may hold at once: beyond, a new
/// handle (a WRITE's data on its way in, a READ's on its way back, one
/// the guest makes) is refused with ENOMEM and that fop fails.
pub(crate) const MAX_BUFFER_BYTES: usize = 256 << 20;
/// Most timers a node has armed at once.
pub(crate) const MAX_TIMERS: usize = 4096;
/// Most per-inode (and, separately, per-fd) context values a node keeps.
pub(crate) const MAX_CTX: usize = 65536;

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
    /// [`sys::MAX_DUMP`](xlfs_sdk::guest::sys::MAX_DUMP) bytes). A fault if the module lacks the export.
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

#[derive(Default)]
struct Slot {
    guest: Option<Box<dyn Guest>>,
    /// The buffer messages to the guest are encoded into, reused.
    scratch: Vec<u8>,
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
    frames: Mutex<IdMap<FrameEntry>>,
    /// The result `xlfs_on_reply` is being given, with its frame: what an
    /// unwind "as it came" (an empty message, ABI v1.3) answers with.
    in_hand: Mutex<Option<(u64, xlfs_sdk::FopResult)>>,
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
                log_budget: Mutex::default(),
            }),
            name,
            children,
            sink,
            permits: Semaphore::new(limits.max_frames),
            limits,
            slot: Mutex::new(Slot::default()),
            frames: Mutex::new(IdMap::default()),
            in_hand: Mutex::new(None),
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

    fn handle(&self) -> Option<Handle> {
        Handle::try_current().ok().or_else(|| self.rt.get().cloned())
    }

    /// Runs `f` on the instance (making one if the last one crashed) and
    /// the node's reusable message buffer,
    /// unless the plugin is disabled or shut, or `era` is given and is not
    /// the current instance's. A fault drops the instance ([`Core::crash`]).
    fn with_guest<R>(
        &self,
        era: Option<u64>,
        f: impl FnOnce(&mut dyn Guest, &mut Vec<u8>) -> Result<R, Fault>,
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
        let Slot { guest, scratch, .. } = &mut *slot;
        let Some(guest) = guest.as_mut() else { return Err(Errno::EIO) };
        // A crash report quotes the plugin's last error line of this call.
        self.host.last_error.lock().take();
        match f(guest.as_mut(), scratch) {
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
        self.bufs.lock().clear();
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
