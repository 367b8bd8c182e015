//! The guest runtime behind [`export_plugin!`](crate::export_plugin): the
//! [`Plugin`] trait an author implements, the per-frame context [`Cx`],
//! and the functions the exports call, which decode messages, keep each
//! frame's state, and turn panics into a failed handler.
//!
//! This file holds the [`Plugin`] trait and an instance's state; beside
//! it:
//! - `rt/cx.rs`: the contexts handlers get, [`Cx`] in a frame and [`Ctl`]
//!   outside one;
//! - `rt/exports.rs`: the functions the export macros call, one per
//!   export;
//! - `rt/guard.rs`: the panic guard around every handler, and the panic
//!   hook behind it.

use crate::options::{OptionDecl, Options};
use crate::xlator::ReconfigureError;
use crate::{CallCtx, Event, EventFrom, FopResult, Request};

use super::host::{Buf, Host};
use super::sys::{EventSet, FopSet};

mod cx;
mod exports;
mod guard;

pub use cx::{Ctl, Cx};
pub(super) use exports::instance;
pub use exports::{alloc, describe, dump, fini, free, init, on_event, on_fop, on_reply, on_timer, reconfigure};
pub(super) use guard::guard;

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
    /// Most children ([`sys::UNLIMITED_CHILDREN`](super::sys::UNLIMITED_CHILDREN) for no limit).
    const MAX_CHILDREN: u32 = 1;
    /// Where a volume's generated client graph puts it (`plugin.NAME` keys).
    const PLACEMENT: super::sys::Placement = super::sys::Placement::Top;

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

/// One frame in flight: its caller, the fop as it arrived (encoded, WRITE
/// data left out: a wind of it unchanged goes "as it came", ABI v1.3) and the
/// plugin's state. Boxed in the frame map (only a frame that outlives its
/// first handler gets there), so it never moves.
struct Slot<S> {
    ctx: CallCtx,
    /// The fop as it came, encoded (what a wind compares its own
    /// encoding with).
    came: Vec<u8>,
    state: S,
}

/// The frames in flight by id (the host numbers them from a counter).
type Frames<S> = crate::slots::IdMap<Box<Slot<S>>>;

/// Whether `a` and `b` hold the same bytes, compared eight at a time.
/// These comparisons (an unchanged caller, fop or reply) run on every fop,
/// and the `memcmp` a wasm32 build links steps one byte at a time: it was
/// a tenth of a pass-through's time per forwarded WRITE.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let ((aw, at), (bw, bt)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    aw.iter().zip(bw).all(|(x, y)| u64::from_ne_bytes(*x) == u64::from_ne_bytes(*y))
        && at.iter().zip(bt).all(|(x, y)| x == y)
}

/// The caller context of the last fop, with its encoding: fops mostly come
/// from one caller, and a fop whose context has the same bytes shares the
/// decoded value (two reference counts) instead of decoding it again.
#[derive(Default)]
struct CtxCache {
    bytes: Vec<u8>,
    ctx: Option<CallCtx>,
}

impl CtxCache {
    fn decode(&mut self, bytes: &[u8]) -> Result<CallCtx, crate::abi::DecodeError> {
        if let Some(ctx) = &self.ctx
            && same_bytes(&self.bytes, bytes)
        {
            return Ok(ctx.clone());
        }
        let ctx = crate::abi::decode::<CallCtx>(bytes, None, &crate::abi::Limits::DEFAULT)?;
        self.bytes.clear();
        self.bytes.extend_from_slice(bytes);
        self.ctx = Some(ctx.clone());
        Ok(ctx)
    }
}

pub(super) struct Instance<P: Plugin> {
    pub(super) host: Host,
    pub(super) plugin: P,
    frames: Frames<P::Frame>,
    callers: CtxCache,
    scratch: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::same_bytes;

    #[test]
    fn same_bytes_agrees_with_slice_equality() {
        let base: Vec<u8> = (0..40u8).collect();
        for len in 0..base.len() {
            let a = &base[..len];
            assert!(same_bytes(a, a));
            assert!(!same_bytes(a, &base[..len + 1]), "lengths differ at {len}");
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 0x80;
                assert!(!same_bytes(a, &b), "a byte differs at {at} of {len}");
            }
        }
    }
}
