//! The guest runtime behind [`export_plugin!`](crate::export_plugin): the
//! [`Plugin`] trait an author implements, the per-frame context [`Cx`],
//! and the functions the exports call, which decode messages, keep each
//! frame's state, and turn panics into a failed handler.

use std::collections::BTreeMap;

use crate::abi::{self, Limits};
use crate::errno::Errno;
use crate::options::{OptionDecl, Options};
use crate::xlator::ReconfigureError;
use crate::{CallCtx, Dict, Event, EventFrom, FopResult, Request, Value};

use super::host::{Buf, Host};
use super::sys::{self, DeclaredOption, Descriptor, EventSet, FopSet, HostVtable};

/// The id of a call this instance wound, as `wind` returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

/// The id of a timer, as [`Host::set_timer`] returned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(pub u64);

/// A translator written against the plugin ABI. One value of this type is
/// one graph node's instance; the host calls it one handler at a time.
///
/// A fop arrives in [`Plugin::fop`] with a fresh [`Cx`]: wind calls to
/// children, answer with [`Cx::unwind`], or both. Each wound call's result
/// comes back in [`Plugin::reply`] with the same frame's [`Cx`] (its
/// [`Cx::state`] kept by the SDK until the frame is unwound). Fops not in
/// [`Plugin::FOPS`] never enter the guest: the host passes them to child 0.
pub trait Plugin: Sized + 'static {
    /// State kept per frame (per fop in flight), from its first handler to
    /// its unwind.
    type Frame: Default + 'static;
    /// The plugin's name.
    const NAME: &'static str;
    /// One line on what it does.
    const DESCRIPTION: &'static str = "";
    /// Declared options; the host validates volfile options against them.
    const OPTIONS: &'static [OptionDecl] = &[];
    /// The fops that enter the guest.
    const FOPS: FopSet = FopSet::ALL;
    /// The events that enter the guest ([`Plugin::event`]).
    const EVENTS: EventSet = EventSet::NONE;
    /// Fewest children.
    const MIN_CHILDREN: u32 = 1;
    /// Most children ([`sys::UNLIMITED_CHILDREN`] for no limit).
    const MAX_CHILDREN: u32 = 1;

    /// Builds the instance from validated options (defaults filled).
    fn init(host: Host, options: &Options) -> Result<Self, String>;

    /// A fop arrived. In a WRITE the `data` field is empty: the bytes stay
    /// in the host, reached through [`Cx::data`].
    fn fop(&mut self, cx: &mut Cx<'_, Self::Frame>, req: Request);

    /// A call wound from this frame came back. A READ reply's `data` is
    /// empty; the bytes are [`Cx::data`]. The default unwinds the frame
    /// with the result as it came (data included, without a copy).
    fn reply(&mut self, cx: &mut Cx<'_, Self::Frame>, call: CallId, result: FopResult) {
        let _ = call;
        cx.unwind(result);
    }

    /// A call wound with [`Ctl::wind_detached`] came back. The default
    /// drops the result.
    fn detached_reply(&mut self, ctl: &mut Ctl<'_, Self::Frame>, call: CallId, result: FopResult, data: Option<Buf>) {
        let _ = (ctl, call, result, data);
    }

    /// A timer fired.
    fn timer(&mut self, ctl: &mut Ctl<'_, Self::Frame>, timer: TimerId) {
        let _ = (ctl, timer);
    }

    /// An event in [`Plugin::EVENTS`] arrived; return true to pass it on to
    /// the node's parents. The default passes events from children on.
    fn event(&mut self, host: Host, event: &Event, from: EventFrom) -> bool {
        let _ = (host, event);
        matches!(from, EventFrom::Child(_))
    }

    /// The node is going away.
    fn fini(&mut self, host: Host) {
        let _ = host;
    }

    /// The instance's own state for `xlfs status --dump` (ABI v1.2):
    /// push `(key, value)` pairs (counters, settings). The host shows them
    /// beside its own counters for the node, as `VOLUME.NAME.key` where
    /// `NAME` is [`Plugin::NAME`]. The default reports nothing.
    fn dump(&self, out: &mut Vec<(String, String)>) {
        let _ = out;
    }

    /// New options on a live volfile reload (ABI v1.2), validated against
    /// [`Plugin::OPTIONS`] with the defaults filled, as [`Plugin::init`]
    /// gets them; the instance keeps its state and its frames in flight.
    /// Apply all or nothing: `Err(ReconfigureError::Invalid(why))` refuses
    /// them (name the option in `why`: the reload reports it and the old
    /// options stay in force). The default,
    /// `Err(ReconfigureError::Unsupported)`, makes the host build a new
    /// instance with the new options instead.
    fn reconfigure(&mut self, options: &Options) -> Result<(), ReconfigureError> {
        let _ = options;
        Err(ReconfigureError::Unsupported)
    }
}

struct Slot<S> {
    ctx: CallCtx,
    state: S,
}

pub(super) struct Instance<P: Plugin> {
    pub(super) host: Host,
    pub(super) plugin: P,
    frames: BTreeMap<u64, Slot<P::Frame>>,
    scratch: Vec<u8>,
}

/// One frame's context in [`Plugin::fop`] and [`Plugin::reply`].
pub struct Cx<'a, S> {
    host: Host,
    frame: u64,
    slot: &'a mut Slot<S>,
    scratch: &'a mut Vec<u8>,
    data: Option<Buf>,
    ended: bool,
}

impl<S> Cx<'_, S> {
    /// The frame's id.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// Who called.
    pub fn ctx(&self) -> &CallCtx {
        &self.slot.ctx
    }

    /// This frame's state.
    pub fn state(&mut self) -> &mut S {
        &mut self.slot.state
    }

    /// The host.
    pub fn host(&self) -> Host {
        self.host
    }

    /// The bulk data that came with this message: a WRITE's data in
    /// [`Plugin::fop`], a READ reply's data in [`Plugin::reply`].
    pub fn data(&self) -> Option<&Buf> {
        self.data.as_ref()
    }

    /// Takes [`Cx::data`] to keep it past this handler.
    pub fn take_data(&mut self) -> Option<Buf> {
        self.data.take()
    }

    /// True once the frame is unwound (or tail-wound).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Winds `req` to child `child` as the frame's caller. A WRITE carries
    /// `data` if given, else its own `data` field if not empty (copied into
    /// the host), else this message's [`Cx::data`]: so passing on a WRITE
    /// as it came never copies it. Its result comes back in
    /// [`Plugin::reply`].
    pub fn wind(&mut self, child: u32, req: &Request, data: Option<&Buf>) -> Result<CallId, Errno> {
        self.wind_flags(child, None, req, data, 0).map(CallId)
    }

    /// Like [`Cx::wind`] with another caller context.
    pub fn wind_as(&mut self, child: u32, ctx: &CallCtx, req: &Request, data: Option<&Buf>) -> Result<CallId, Errno> {
        self.wind_flags(child, Some(ctx), req, data, 0).map(CallId)
    }

    /// Passes `req` to child 0 and lets its result be this frame's, without
    /// coming back into the guest (a tail wind). The frame ends.
    pub fn forward(&mut self, req: &Request) -> Result<(), Errno> {
        self.forward_to(0, req, None)
    }

    /// [`Cx::forward`] to another child, with explicit data.
    pub fn forward_to(&mut self, child: u32, req: &Request, data: Option<&Buf>) -> Result<(), Errno> {
        self.check_open()?;
        self.wind_flags(child, None, req, data, sys::WIND_TAIL)?;
        self.ended = true;
        Ok(())
    }

    /// Answers the frame. A READ reply carries its `data` field if not
    /// empty (copied into the host), else this message's [`Cx::data`]: so
    /// a reply unwound as it came never copies its data.
    pub fn unwind(&mut self, result: FopResult) {
        self.unwind_with(result, None)
    }

    /// Answers the frame with explicit READ data.
    pub fn unwind_with(&mut self, mut result: FopResult, data: Option<&Buf>) {
        if self.ended {
            self.host.warn("unwind of a frame that has already ended");
            return;
        }
        let own = sys::take_result_data(&mut result);
        let Ok(handle) = self.pick(own, data) else {
            result = Err(Errno::ENOMEM);
            self.finish_unwind(result, None);
            return;
        };
        self.finish_unwind(result, handle.as_ref().map(|(h, _)| *h));
    }

    fn finish_unwind(&mut self, result: FopResult, handle: Option<u32>) {
        self.scratch.clear();
        abi::encode(&result, self.scratch);
        // ENOENT: the host already failed the frame (it timed out).
        if let Err(e) = self.host.raw_unwind(self.frame, self.scratch, handle.unwrap_or(sys::NO_BUF)) {
            self.host.warn(&format!("unwind of frame {} refused: {e}", self.frame));
        }
        self.ended = true;
    }

    /// Winds an already-encoded fop message (`sdk/PLUGIN-ABI.md`, "Fop
    /// messages") with raw `wind` flags: for plugins that relay messages or
    /// encode them themselves. The host checks the message.
    pub fn wind_encoded(&mut self, child: u32, flags: u32, msg: &[u8], data: Option<&Buf>) -> Result<CallId, Errno> {
        self.check_open()?;
        let r = self.host.raw_wind(self.frame, child, flags, msg, data.map_or(sys::NO_BUF, Buf::handle));
        if r.is_ok() && flags & sys::WIND_TAIL != 0 {
            self.ended = true;
        }
        r.map(CallId)
    }

    /// Unwinds with an already-encoded result message; the host checks it
    /// (and fails the frame with EIO if it does not decode). The frame ends
    /// either way.
    pub fn unwind_encoded(&mut self, msg: &[u8], data: Option<&Buf>) -> Result<(), Errno> {
        self.check_open()?;
        self.ended = true;
        self.host.raw_unwind(self.frame, msg, data.map_or(sys::NO_BUF, Buf::handle))
    }

    fn check_open(&self) -> Result<(), Errno> {
        if self.ended { Err(Errno::EINVAL) } else { Ok(()) }
    }

    /// The handle to send: explicit data, else the message's own bytes
    /// (made into a new buffer, returned so it lives until the call), else
    /// this message's data.
    fn pick(&self, own: Option<bytes::Bytes>, data: Option<&Buf>) -> Result<Option<(u32, Option<Buf>)>, Errno> {
        if let Some(d) = data {
            return Ok(Some((d.handle(), None)));
        }
        match own {
            None => Ok(None),
            Some(b) if !b.is_empty() => {
                let buf = Buf::from_bytes(self.host, &b)?;
                Ok(Some((buf.handle(), Some(buf))))
            }
            Some(_) => Ok(self.data.as_ref().map(|d| (d.handle(), None))),
        }
    }

    fn wind_flags(
        &mut self,
        child: u32,
        ctx: Option<&CallCtx>,
        req: &Request,
        data: Option<&Buf>,
        flags: u32,
    ) -> Result<u64, Errno> {
        self.check_open()?;
        self.scratch.clear();
        // Only a WRITE carries data, which crosses as a handle: encode a
        // copy without it (cheap: the bytes are shared); anything else as is.
        let picked = if matches!(req.fop, crate::Fop::Writev { .. }) {
            let mut req = req.clone();
            let own = sys::take_fop_data(&mut req.fop);
            let picked = self.pick(own, data)?;
            sys::encode_call(ctx, &req, self.scratch);
            picked
        } else {
            let picked = self.pick(None, data)?;
            sys::encode_call(ctx, req, self.scratch);
            picked
        };
        let handle = picked.as_ref().map_or(sys::NO_BUF, |(h, _)| *h);
        self.host.raw_wind(self.frame, child, flags, self.scratch, handle)
    }
}

/// Context outside a frame: timers and detached replies.
pub struct Ctl<'a, S> {
    host: Host,
    frames: &'a mut BTreeMap<u64, Slot<S>>,
    scratch: &'a mut Vec<u8>,
}

impl<S> Ctl<'_, S> {
    /// The host.
    pub fn host(&self) -> Host {
        self.host
    }

    /// The ids of the frames in flight in this instance.
    pub fn frames(&self) -> Vec<u64> {
        self.frames.keys().copied().collect()
    }

    /// A frame's state, if it is in flight.
    pub fn state(&mut self, frame: u64) -> Option<&mut S> {
        self.frames.get_mut(&frame).map(|s| &mut s.state)
    }

    /// Winds a call from a frame in flight (for example one held until a
    /// timer fired), as [`Cx::wind`]; its result comes back in
    /// [`Plugin::reply`] for that frame.
    pub fn wind(&mut self, frame: u64, child: u32, req: &Request, data: Option<&Buf>) -> Result<CallId, Errno> {
        let slot = self.frames.get_mut(&frame).ok_or(Errno::ENOENT)?;
        let mut cx = Cx { host: self.host, frame, slot, scratch: self.scratch, data: None, ended: false };
        cx.wind(child, req, data)
    }

    /// Answers a frame in flight (for example one delayed until a timer).
    pub fn unwind(&mut self, frame: u64, result: FopResult, data: Option<&Buf>) -> Result<(), Errno> {
        let mut slot = self.frames.remove(&frame).ok_or(Errno::ENOENT)?;
        let mut cx = Cx { host: self.host, frame, slot: &mut slot, scratch: self.scratch, data: None, ended: false };
        cx.unwind_with(result, data);
        Ok(())
    }

    /// Winds a call that belongs to no frame (prefetch, background work);
    /// its result comes back in [`Plugin::detached_reply`]. With no `ctx`,
    /// the host calls as the node itself.
    pub fn wind_detached(
        &mut self,
        child: u32,
        ctx: Option<&CallCtx>,
        req: &Request,
        data: Option<&Buf>,
    ) -> Result<CallId, Errno> {
        let mut req = req.clone();
        let own = sys::take_fop_data(&mut req.fop);
        let made = match (data, own) {
            (Some(_), _) | (None, None) => None,
            (None, Some(b)) if b.is_empty() => None,
            (None, Some(b)) => Some(Buf::from_bytes(self.host, &b)?),
        };
        let handle = data.or(made.as_ref()).map_or(sys::NO_BUF, Buf::handle);
        self.scratch.clear();
        sys::encode_call(ctx, &req, self.scratch);
        self.host.raw_wind(0, child, 0, self.scratch, handle).map(CallId)
    }
}

/// Runs a handler: natively, a panic is caught, logged through the host
/// and turned into `failed`; on WebAssembly a panic traps (after the hook
/// installed by `init` logged it).
pub(super) fn guard<R>(host: Host, failed: R, f: impl FnOnce() -> R) -> R {
    #[cfg(target_family = "wasm")]
    {
        let _ = (host, &failed);
        f()
    }
    #[cfg(not(target_family = "wasm"))]
    {
        let outer = IN_GUARD.with(|g| g.replace(true));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        IN_GUARD.with(|g| g.set(outer));
        match r {
            Ok(r) => r,
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                let at = PANIC_AT.with(|p| p.take()).unwrap_or_default();
                host.error(&format!("plugin panicked: {msg}{at}"));
                failed
            }
        }
    }
}

/// A message the host passed: `len` bytes at `ptr` (none when `len` is 0).
///
/// # Safety
/// `ptr` valid for `len` bytes for `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: u32) -> &'a [u8] {
    if len == 0 || ptr.is_null() {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(ptr, len as usize) }
    }
}

/// # Safety
/// `inst` as returned by [`init`] for this `P`, not finished.
pub(super) unsafe fn instance<'a, P: Plugin>(inst: usize) -> Option<&'a mut Instance<P>> {
    // SAFETY: the host passes back what `init` returned and serializes calls.
    unsafe { (inst as *mut Instance<P>).as_mut() }
}

/// `xlfs_alloc`.
pub fn alloc(size: u32) -> *mut u8 {
    let Ok(layout) = std::alloc::Layout::array::<u8>(size.max(1) as usize) else {
        return std::ptr::null_mut();
    };
    // SAFETY: non-zero size.
    unsafe { std::alloc::alloc(layout) }
}

/// `xlfs_free`.
///
/// # Safety
/// `ptr`/`size` from [`alloc`].
pub unsafe fn free(ptr: *mut u8, size: u32) {
    if ptr.is_null() {
        return;
    }
    if let Ok(layout) = std::alloc::Layout::array::<u8>(size.max(1) as usize) {
        // SAFETY: allocated by `alloc` with this layout.
        unsafe { std::alloc::dealloc(ptr, layout) }
    }
}

/// `xlfs_describe`.
///
/// # Safety
/// `host` as the ABI specifies.
pub unsafe fn describe<P: Plugin>(host: *const HostVtable) -> i32 {
    let host = Host::from_raw(host);
    guard(host, sys::HANDLER_FAILED, || {
        let d = Descriptor {
            name: P::NAME.to_string(),
            description: P::DESCRIPTION.to_string(),
            min_children: P::MIN_CHILDREN,
            max_children: P::MAX_CHILDREN,
            fops: P::FOPS,
            events: P::EVENTS,
            options: P::OPTIONS.iter().map(DeclaredOption::from).collect(),
        };
        let mut out = Vec::new();
        d.encode(&mut out);
        match host.raw_declare(&out) {
            Ok(()) => sys::HANDLER_OK,
            Err(e) => -e.0,
        }
    })
}

#[cfg(not(target_family = "wasm"))]
thread_local! {
    /// True while [`guard`] runs a handler on this thread.
    static IN_GUARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where the last panic inside [`guard`] happened, for its log line.
    static PANIC_AT: std::cell::Cell<Option<String>> = const { std::cell::Cell::new(None) };
}

/// Natively, panics in handlers are caught by [`guard`] and logged through
/// the host; this hook keeps their location and prints nothing for them.
/// Any other panic goes to the hook that was there before (a cdylib has its
/// own std, but a plugin linked as an rlib shares the host's).
#[cfg(not(target_family = "wasm"))]
fn install_panic_hook() {
    use std::sync::Once;
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_GUARD.with(|g| g.get()) {
                let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line()));
                PANIC_AT.with(|p| p.set(at));
            } else {
                previous(info);
            }
        }));
    });
}

#[cfg(target_family = "wasm")]
fn install_panic_hook() {
    use std::sync::Once;
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // On WebAssembly the host functions are imports: no vtable needed.
        std::panic::set_hook(Box::new(|info| {
            let msg = info.payload_as_str().unwrap_or("(no message)");
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            Host::from_raw(std::ptr::null()).error(&format!("plugin panicked: {msg}{at}"))
        }));
    });
}

/// `xlfs_init`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn init<P: Plugin>(host: *const HostVtable, opts: *const u8, len: u32) -> usize {
    let host = Host::from_raw(host);
    install_panic_hook();
    // SAFETY: the host's message.
    let msg = unsafe { bytes(opts, len) };
    guard(host, 0, || {
        let Some(options) = options_of::<P>(host, msg) else { return 0 };
        match P::init(host, &options) {
            Ok(plugin) => {
                let inst = Instance::<P> { host, plugin, frames: BTreeMap::new(), scratch: Vec::new() };
                Box::into_raw(Box::new(inst)) as usize
            }
            Err(e) => {
                host.error(&format!("{}: init failed: {e}", P::NAME));
                0
            }
        }
    })
}

/// `xlfs_on_fop`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn on_fop<P: Plugin>(inst: usize, frame: u64, msg: *const u8, len: u32, payload: u32) -> i32 {
    // SAFETY: the host's contract.
    let (Some(i), msg) = (unsafe { instance::<P>(inst) }, unsafe { bytes(msg, len) }) else {
        return sys::HANDLER_FAILED;
    };
    let host = i.host;
    guard(host, sys::HANDLER_FAILED, || {
        let data = Buf::adopt(host, payload);
        let (ctx, req) = match sys::decode_call(msg, &Limits::DEFAULT) {
            Ok((Some(ctx), req)) => (ctx, req),
            Ok((None, _)) => {
                host.error("fop message without a caller context");
                return sys::HANDLER_FAILED;
            }
            Err(e) => {
                host.error(&format!("fop message: {e}"));
                return sys::HANDLER_FAILED;
            }
        };
        let Instance { plugin, frames, scratch, .. } = i;
        let slot = frames.entry(frame).or_insert_with(|| Slot { ctx, state: P::Frame::default() });
        let mut cx = Cx { host, frame, slot, scratch, data, ended: false };
        plugin.fop(&mut cx, req);
        let ended = cx.ended;
        drop(cx);
        if ended {
            frames.remove(&frame);
        }
        sys::HANDLER_OK
    })
}

/// `xlfs_on_reply`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn on_reply<P: Plugin>(inst: usize, frame: u64, call: u64, msg: *const u8, len: u32, payload: u32) -> i32 {
    // SAFETY: the host's contract.
    let (Some(i), msg) = (unsafe { instance::<P>(inst) }, unsafe { bytes(msg, len) }) else {
        return sys::HANDLER_FAILED;
    };
    let host = i.host;
    guard(host, sys::HANDLER_FAILED, || {
        let data = Buf::adopt(host, payload);
        let result = match abi::decode::<FopResult>(msg, None, &Limits::DEFAULT) {
            Ok(r) => r,
            Err(e) => {
                host.error(&format!("reply message: {e}"));
                return sys::HANDLER_FAILED;
            }
        };
        let Instance { plugin, frames, scratch, .. } = i;
        if frame == 0 {
            let mut ctl = Ctl { host, frames, scratch };
            plugin.detached_reply(&mut ctl, CallId(call), result, data);
            return sys::HANDLER_OK;
        }
        // A reply for a frame already unwound (fan-out answered early) is
        // dropped with its data.
        let Some(slot) = frames.get_mut(&frame) else { return sys::HANDLER_OK };
        let mut cx = Cx { host, frame, slot, scratch, data, ended: false };
        plugin.reply(&mut cx, CallId(call), result);
        let ended = cx.ended;
        drop(cx);
        if ended {
            frames.remove(&frame);
        }
        sys::HANDLER_OK
    })
}

/// `xlfs_on_timer`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn on_timer<P: Plugin>(inst: usize, timer: u64) -> i32 {
    // SAFETY: the host's contract.
    let Some(i) = (unsafe { instance::<P>(inst) }) else { return sys::HANDLER_FAILED };
    let host = i.host;
    guard(host, sys::HANDLER_FAILED, || {
        let Instance { plugin, frames, scratch, .. } = i;
        let mut ctl = Ctl { host, frames, scratch };
        plugin.timer(&mut ctl, TimerId(timer));
        sys::HANDLER_OK
    })
}

/// `xlfs_on_event`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn on_event<P: Plugin>(inst: usize, from: i32, msg: *const u8, len: u32) -> i32 {
    // SAFETY: the host's contract.
    let (Some(i), msg) = (unsafe { instance::<P>(inst) }, unsafe { bytes(msg, len) }) else {
        return sys::HANDLER_FAILED;
    };
    let host = i.host;
    guard(host, sys::HANDLER_FAILED, || {
        let event = match abi::decode::<Event>(msg, None, &Limits::DEFAULT) {
            Ok(e) => e,
            Err(e) => {
                host.error(&format!("event message: {e}"));
                return sys::HANDLER_FAILED;
            }
        };
        let from = if from < 0 { EventFrom::Graph } else { EventFrom::Child(from as usize) };
        if i.plugin.event(host, &event, from) { sys::EVENT_PASS } else { sys::EVENT_STOP }
    })
}

/// The options in an options message (`xlfs_init`, `xlfs_reconfigure`),
/// resolved against `P`'s declarations; the error is logged.
fn options_of<P: Plugin>(host: Host, msg: &[u8]) -> Option<Options> {
    let given = match abi::decode::<Dict>(msg, None, &Limits::DEFAULT) {
        Ok(d) => d,
        Err(e) => {
            host.error(&format!("{}: options message: {e}", P::NAME));
            return None;
        }
    };
    let pairs: Vec<(&str, &str)> = given
        .iter()
        .filter_map(|(k, v)| match v {
            Value::Str(s) => Some((k.as_str(), s.as_str())),
            _ => None,
        })
        .collect();
    match Options::resolve(P::OPTIONS, pairs) {
        Ok(o) => Some(o),
        Err(e) => {
            host.error(&format!("{}: {e}", P::NAME));
            None
        }
    }
}

/// `xlfs_dump` (ABI v1.2).
///
/// # Safety
/// Arguments as the ABI specifies: `out` writable for `cap` bytes.
pub unsafe fn dump<P: Plugin>(inst: usize, out: *mut u8, cap: u32) -> i32 {
    // SAFETY: the host's contract.
    let Some(i) = (unsafe { instance::<P>(inst) }) else { return sys::HANDLER_FAILED };
    let host = i.host;
    let encoded = guard(host, None, || {
        let mut pairs = Vec::new();
        i.plugin.dump(&mut pairs);
        let mut b = Vec::new();
        sys::encode_dump(&pairs, &mut b);
        Some(b)
    });
    let Some(b) = encoded else { return sys::HANDLER_FAILED };
    let Ok(n) = i32::try_from(b.len()) else { return -Errno::E2BIG.0 };
    if b.len() <= cap as usize && !out.is_null() {
        // SAFETY: `out` is writable for `cap` >= `b.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out, b.len()) };
    }
    n
}

/// `xlfs_reconfigure` (ABI v1.2).
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn reconfigure<P: Plugin>(inst: usize, opts: *const u8, len: u32) -> i32 {
    // SAFETY: the host's contract.
    let (Some(i), msg) = (unsafe { instance::<P>(inst) }, unsafe { bytes(opts, len) }) else {
        return sys::HANDLER_FAILED;
    };
    let host = i.host;
    guard(host, sys::HANDLER_FAILED, || {
        let Some(options) = options_of::<P>(host, msg) else { return -Errno::EINVAL.0 };
        match i.plugin.reconfigure(&options) {
            Ok(()) => sys::HANDLER_OK,
            Err(ReconfigureError::Unsupported) => sys::RECONFIGURE_UNSUPPORTED,
            Err(ReconfigureError::Invalid(why)) => {
                host.error(&format!("{}: {why}", P::NAME));
                -Errno::EINVAL.0
            }
        }
    })
}

/// `xlfs_fini`.
///
/// # Safety
/// `inst` from [`init`], not used afterwards.
pub unsafe fn fini<P: Plugin>(inst: usize) {
    if inst == 0 {
        return;
    }
    // SAFETY: `inst` is a leaked `Box<Instance<P>>`, finished once.
    let mut i = unsafe { Box::from_raw(inst as *mut Instance<P>) };
    let host = i.host;
    guard(host, (), || i.plugin.fini(host));
}

#[cfg(test)]
mod tests {
    //! The guest runtime against a fake native host that records calls.
    use std::cell::RefCell;
    use std::ffi::c_void;

    use bytes::Bytes;

    use super::*;
    use crate::options::OptType;
    use crate::{Fd, FdId, Fop, Gfid, Iatt, Loc, Reply, Response};

    #[derive(Debug, PartialEq)]
    enum Call {
        Wind { frame: u64, child: u32, flags: u32, msg: Vec<u8>, payload: u32 },
        Unwind { frame: u64, msg: Vec<u8>, payload: u32 },
        Declare(Vec<u8>),
        Log(u32, String),
        BufFree(u32),
    }

    thread_local! {
        static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
    }

    fn record(c: Call) {
        CALLS.with(|calls| calls.borrow_mut().push(c));
    }

    fn take() -> Vec<Call> {
        CALLS.with(|calls| std::mem::take(&mut *calls.borrow_mut()))
    }

    unsafe fn slice(p: *const u8, n: u32) -> Vec<u8> {
        // SAFETY: the SDK passes valid (pointer, length) pairs.
        unsafe { bytes(p, n) }.to_vec()
    }

    unsafe extern "C" fn wind(
        _: *mut c_void,
        frame: u64,
        child: u32,
        flags: u32,
        m: *const u8,
        n: u32,
        payload: u32,
    ) -> i64 {
        // SAFETY: as `slice`.
        record(Call::Wind { frame, child, flags, msg: unsafe { slice(m, n) }, payload });
        if child == 0 { 77 } else { -(Errno::EINVAL.0 as i64) }
    }
    unsafe extern "C" fn unwind(_: *mut c_void, frame: u64, m: *const u8, n: u32, payload: u32) -> i32 {
        // SAFETY: as `slice`.
        record(Call::Unwind { frame, msg: unsafe { slice(m, n) }, payload });
        0
    }
    unsafe extern "C" fn timer_set(_: *mut c_void, _: u64) -> i64 {
        5
    }
    unsafe extern "C" fn ret0_u64(_: *mut c_void, _: u64) -> i32 {
        0
    }
    unsafe extern "C" fn ctx_get(_: *mut c_void, _: *const u8, _: *mut u64) -> i32 {
        0
    }
    unsafe extern "C" fn ctx_set(_: *mut c_void, _: *const u8, _: u64) -> i32 {
        0
    }
    unsafe extern "C" fn ctx_del(_: *mut c_void, _: *const u8) -> i32 {
        0
    }
    unsafe extern "C" fn fd_get(_: *mut c_void, _: u64, _: *mut u64) -> i32 {
        0
    }
    unsafe extern "C" fn fd_set(_: *mut c_void, _: u64, _: u64) -> i32 {
        0
    }
    unsafe extern "C" fn log(_: *mut c_void, level: u32, m: *const u8, n: u32) {
        // SAFETY: as `slice`.
        record(Call::Log(level, String::from_utf8_lossy(&unsafe { slice(m, n) }).into_owned()));
    }
    unsafe extern "C" fn now(_: *mut c_void) -> u64 {
        1
    }
    unsafe extern "C" fn buf_len(_: *mut c_void, _: u32) -> i64 {
        3
    }
    unsafe extern "C" fn buf_read(_: *mut c_void, _: u32, _: u64, _: *mut u8, _: u32) -> i64 {
        0
    }
    unsafe extern "C" fn buf_new(_: *mut c_void, _: *const u8, _: u32) -> i64 {
        9
    }
    unsafe extern "C" fn buf_slice(_: *mut c_void, _: u32, _: u64, _: u64) -> i64 {
        10
    }
    unsafe extern "C" fn buf_free(_: *mut c_void, h: u32) -> i32 {
        record(Call::BufFree(h));
        0
    }
    unsafe extern "C" fn declare(_: *mut c_void, m: *const u8, n: u32) -> i32 {
        // SAFETY: as `slice`.
        record(Call::Declare(unsafe { slice(m, n) }));
        0
    }

    const VT: HostVtable = HostVtable {
        size: std::mem::size_of::<HostVtable>() as u32,
        major: 1,
        minor: 0,
        ctx: std::ptr::null_mut(),
        wind,
        unwind,
        timer_set,
        timer_cancel: ret0_u64,
        inode_ctx_get: ctx_get,
        inode_ctx_set: ctx_set,
        inode_ctx_del: ctx_del,
        fd_ctx_get: fd_get,
        fd_ctx_set: fd_set,
        fd_ctx_del: ret0_u64,
        log,
        now_ns: now,
        buf_len,
        buf_read,
        buf_new,
        buf_slice,
        buf_free,
        declare,
    };

    /// Stat winds to child 0; WRITE is forwarded (tail); LOOKUP panics;
    /// MKDIR winds to child 3, which the host refuses.
    struct T;

    impl Plugin for T {
        type Frame = u32;
        const NAME: &'static str = "t";
        const OPTIONS: &'static [OptionDecl] = &[OptionDecl::new("n", OptType::Int).default("1")];
        fn init(_host: Host, options: &Options) -> Result<T, String> {
            if options.int("n") == Some(0) { Err("n must not be 0".into()) } else { Ok(T) }
        }
        fn fop(&mut self, cx: &mut Cx<'_, u32>, req: Request) {
            *cx.state() += 1;
            match req.fop {
                Fop::Stat { .. } => assert_eq!(cx.wind(0, &req, None), Ok(CallId(77))),
                Fop::Writev { .. } => cx.forward(&req).expect("forward"),
                Fop::Mkdir { .. } => {
                    let e = cx.wind(3, &req, None).expect_err("refused");
                    cx.unwind(Err(e));
                }
                _ => panic!("boom"),
            }
        }
    }

    /// Counts fops; dumps its count and `n`; takes a new `n` in place but
    /// refuses 7, and panics on 9.
    struct R {
        n: i64,
        seen: u64,
    }

    impl Plugin for R {
        type Frame = ();
        const NAME: &'static str = "r";
        const OPTIONS: &'static [OptionDecl] = &[OptionDecl::new("n", OptType::Int).default("1")];
        fn init(_host: Host, options: &Options) -> Result<R, String> {
            Ok(R { n: options.int("n").unwrap_or(1), seen: 0 })
        }
        fn fop(&mut self, cx: &mut Cx<'_, ()>, _req: Request) {
            self.seen += 1;
            cx.unwind(Err(Errno::ENOSYS));
        }
        fn dump(&self, out: &mut Vec<(String, String)>) {
            out.push(("seen".into(), self.seen.to_string()));
            out.push(("n".into(), self.n.to_string()));
        }
        fn reconfigure(&mut self, options: &Options) -> Result<(), ReconfigureError> {
            match options.int("n") {
                Some(7) => Err(ReconfigureError::Invalid("option 'n': 7 is unlucky".into())),
                Some(9) => panic!("nine"),
                n => {
                    self.n = n.unwrap_or(1);
                    Ok(())
                }
            }
        }
    }

    /// `xlfs_dump` through a buffer of `cap` bytes: its result and the pairs.
    fn dump_with<P: Plugin>(inst: usize, cap: usize) -> (i32, Option<Vec<(String, String)>>) {
        let mut out = vec![0u8; cap];
        // SAFETY: `out` holds `cap` bytes.
        let n = unsafe { dump::<P>(inst, out.as_mut_ptr(), cap as u32) };
        let pairs = (n >= 0 && n as usize <= cap).then(|| sys::decode_dump(&out[..n as usize]).expect("decodes"));
        (n, pairs)
    }

    #[test]
    fn dump_and_reconfigure_through_a_native_host() {
        take();
        let o = opts(&[("n", "5")]);
        // SAFETY (all calls below): the fake host and valid messages.
        let inst = unsafe { init::<R>(&VT, o.as_ptr(), o.len() as u32) };
        assert_ne!(inst, 0);
        let m = msg(&Request::new(Fop::Stat { loc: Loc::root() }));
        assert_eq!(unsafe { on_fop::<R>(inst, 1, m.as_ptr(), m.len() as u32, 0) }, sys::HANDLER_OK);
        let pairs = vec![("n".to_string(), "5".to_string()), ("seen".to_string(), "1".to_string())];
        // Too small a buffer: the length needed, nothing written.
        let (need, none) = dump_with::<R>(inst, 4);
        assert!(need > 4 && none.is_none(), "{need}");
        assert_eq!(dump_with::<R>(inst, need as usize), (need, Some(pairs)));

        // Applied in place: the count survives.
        let o = opts(&[("n", "6")]);
        assert_eq!(unsafe { reconfigure::<R>(inst, o.as_ptr(), o.len() as u32) }, sys::HANDLER_OK);
        let (_, got) = dump_with::<R>(inst, 4096);
        assert_eq!(got.expect("pairs")[..], [("n".into(), "6".into()), ("seen".into(), "1".into())]);
        // An unset option goes back to its default.
        let o = opts(&[]);
        assert_eq!(unsafe { reconfigure::<R>(inst, o.as_ptr(), o.len() as u32) }, sys::HANDLER_OK);
        assert_eq!(dump_with::<R>(inst, 4096).1.expect("pairs")[0], ("n".into(), "1".into()));
        take();
        // Refused with the reason logged; bad values and garbage too.
        let o = opts(&[("n", "7")]);
        assert_eq!(unsafe { reconfigure::<R>(inst, o.as_ptr(), o.len() as u32) }, -Errno::EINVAL.0);
        assert!(matches!(&take()[..], [Call::Log(1, m)] if m == "r: option 'n': 7 is unlucky"));
        let o = opts(&[("n", "x")]);
        assert_eq!(unsafe { reconfigure::<R>(inst, o.as_ptr(), o.len() as u32) }, -Errno::EINVAL.0);
        assert!(matches!(&take()[..], [Call::Log(1, m)] if m.contains("'n'")));
        assert_eq!(unsafe { reconfigure::<R>(inst, [9u8].as_ptr(), 1) }, -Errno::EINVAL.0);
        take();
        // A panic is the failure code.
        let o = opts(&[("n", "9")]);
        assert_eq!(unsafe { reconfigure::<R>(inst, o.as_ptr(), o.len() as u32) }, sys::HANDLER_FAILED);
        assert!(matches!(&take()[..], [Call::Log(1, m)] if m.starts_with("plugin panicked: nine")));
        assert_eq!(dump_with::<R>(inst, 4096).1.expect("pairs")[0], ("n".into(), "1".into()));
        unsafe { fini::<R>(inst) };

        // A plugin that overrides neither: nothing to dump, cannot reconfigure.
        let o = opts(&[]);
        let inst = unsafe { init::<T>(&VT, o.as_ptr(), o.len() as u32) };
        assert_ne!(inst, 0);
        assert_eq!(dump_with::<T>(inst, 4096).1, Some(Vec::new()));
        assert_eq!(unsafe { reconfigure::<T>(inst, o.as_ptr(), o.len() as u32) }, sys::RECONFIGURE_UNSUPPORTED);
        unsafe { fini::<T>(inst) };
        take();
    }

    fn msg(req: &Request) -> Vec<u8> {
        let mut b = Vec::new();
        sys::encode_call(Some(&CallCtx::root("c")), req, &mut b);
        b
    }

    fn opts(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut d = Dict::new();
        for (k, v) in pairs {
            d.set_str(*k, *v);
        }
        let mut b = Vec::new();
        abi::encode(&d, &mut b);
        b
    }

    #[test]
    fn runtime_round_trips_through_a_native_host() {
        take();
        // SAFETY (all calls below): the fake host and valid messages.
        assert_eq!(unsafe { describe::<T>(&VT) }, sys::HANDLER_OK);
        let Some(Call::Declare(d)) = take().pop() else { panic!("no declare") };
        let d = Descriptor::decode(&d).expect("descriptor");
        assert_eq!((d.name.as_str(), d.options.len(), d.fops), ("t", 1, FopSet::ALL));

        let bad = opts(&[("n", "0")]);
        assert_eq!(unsafe { init::<T>(&VT, bad.as_ptr(), bad.len() as u32) }, 0);
        assert!(matches!(&take()[..], [Call::Log(1, m)] if m.contains("n must not be 0")));
        let good = opts(&[("n", "5")]);
        let inst = unsafe { init::<T>(&VT, good.as_ptr(), good.len() as u32) };
        assert_ne!(inst, 0);

        // A fop wound as it came, with the frame's context; its reply unwound.
        let stat = Request::new(Fop::Stat { loc: Loc::root() });
        let m = msg(&stat);
        assert_eq!(unsafe { on_fop::<T>(inst, 9, m.as_ptr(), m.len() as u32, 0) }, sys::HANDLER_OK);
        let Some(Call::Wind { frame: 9, child: 0, flags: 0, msg: wound, payload: 0 }) = take().pop() else {
            panic!("no wind")
        };
        assert_eq!(sys::decode_call(&wound, &Limits::DEFAULT).expect("decodes"), (None, stat));
        let result: FopResult = Ok(Response::from(Reply::Attr(Iatt::default())));
        let mut r = Vec::new();
        abi::encode(&result, &mut r);
        assert_eq!(unsafe { on_reply::<T>(inst, 9, 77, r.as_ptr(), r.len() as u32, 0) }, sys::HANDLER_OK);
        assert_eq!(take(), [Call::Unwind { frame: 9, msg: r.clone(), payload: 0 }]);
        // The frame is over: a late reply is dropped.
        assert_eq!(unsafe { on_reply::<T>(inst, 9, 78, r.as_ptr(), r.len() as u32, 0) }, sys::HANDLER_OK);
        assert!(take().is_empty());

        // A WRITE forwarded with its own data handle, released afterwards.
        let fd = Fd { id: FdId(1), gfid: Gfid::ROOT };
        let write = Request::new(Fop::Writev { fd, data: Bytes::new(), offset: 0, flags: 0 });
        let m = msg(&write);
        assert_eq!(unsafe { on_fop::<T>(inst, 10, m.as_ptr(), m.len() as u32, 42) }, sys::HANDLER_OK);
        let calls = take();
        assert!(
            matches!(&calls[..], [Call::Wind { frame: 10, flags: sys::WIND_TAIL, payload: 42, .. }, Call::BufFree(42)]),
            "{calls:?}"
        );

        // A refused wind is the author's to answer.
        let mkdir = Request::new(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 });
        let m = msg(&mkdir);
        assert_eq!(unsafe { on_fop::<T>(inst, 11, m.as_ptr(), m.len() as u32, 0) }, sys::HANDLER_OK);
        let calls = take();
        let mut e = Vec::new();
        abi::encode(&FopResult::Err(Errno::EINVAL), &mut e);
        assert!(
            matches!(&calls[..], [Call::Wind { child: 3, .. }, Call::Unwind { frame: 11, msg, .. }] if *msg == e),
            "{calls:?}"
        );

        // A panic is caught, logged with its message, and fails the handler.
        let lookup = Request::new(Fop::Lookup { loc: Loc::root() });
        let m = msg(&lookup);
        assert_eq!(unsafe { on_fop::<T>(inst, 12, m.as_ptr(), m.len() as u32, 0) }, sys::HANDLER_FAILED);
        assert!(matches!(&take()[..], [Call::Log(1, m)] if m.starts_with("plugin panicked: boom at ")));
        // Garbage is refused without a panic.
        assert_eq!(unsafe { on_fop::<T>(inst, 13, [1u8, 2, 3].as_ptr(), 3, 0) }, sys::HANDLER_FAILED);
        take();
        unsafe { fini::<T>(inst) };
    }
}
