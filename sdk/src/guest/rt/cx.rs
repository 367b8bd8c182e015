//! The contexts a plugin's handlers get: [`Cx`], one frame's (in
//! [`Plugin::fop`] and [`Plugin::reply`]), and [`Ctl`], outside a frame
//! (timers, detached replies).

use crate::abi;
use crate::errno::Errno;
use crate::guest::host::{Buf, Host};
use crate::guest::sys;
use crate::{CallCtx, FopResult, Request};

#[cfg(doc)]
use super::Plugin;
use super::{CallId, Frames, Slot};

/// One frame's context in [`Plugin::fop`] and [`Plugin::reply`].
pub struct Cx<'a, S> {
    pub(super) host: Host,
    pub(super) frame: u64,
    pub(super) ctx: &'a CallCtx,
    pub(super) state: &'a mut S,
    /// The frame's fop as it came, encoded (a WRITE's data left out).
    pub(super) came: &'a [u8],
    pub(super) scratch: &'a mut Vec<u8>,
    pub(super) data: Option<Buf>,
    /// In [`Plugin::reply`]: the result message as it came (its data left
    /// out), if the host takes an unwind "as it came".
    pub(super) incoming: Option<&'a [u8]>,
    pub(super) ended: bool,
}

impl<S> Slot<S> {
    /// A context for this frame's handler.
    pub(super) fn cx<'a>(
        &'a mut self,
        host: Host,
        frame: u64,
        scratch: &'a mut Vec<u8>,
        data: Option<Buf>,
        incoming: Option<&'a [u8]>,
    ) -> Cx<'a, S> {
        let Slot { ctx, came, state } = self;
        Cx { host, frame, ctx, state, came, scratch, data, incoming, ended: false }
    }
}

impl<S> Cx<'_, S> {
    /// The frame's id.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// Who called.
    pub fn ctx(&self) -> &CallCtx {
        self.ctx
    }

    /// This frame's state.
    pub fn state(&mut self) -> &mut S {
        self.state
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
        let own_empty = own.as_ref().is_none_or(|b| b.is_empty());
        let Ok(picked) = self.pick(own, data) else {
            self.finish_unwind(&Err(Errno::ENOMEM), sys::NO_BUF, false);
            return;
        };
        let handle = picked.as_ref().map_or(sys::NO_BUF, |(h, _)| *h);
        // Unchanged (with its data as it came): the host answers with the
        // result it delivered, without decoding this one.
        let may_be_as_came = data.is_none() && own_empty;
        self.finish_unwind(&result, handle, may_be_as_came);
    }

    /// Encodes `result` and unwinds it, or an empty message if it encodes
    /// to the result as it came (when `may_be_as_came`).
    fn finish_unwind(&mut self, result: &FopResult, handle: u32, may_be_as_came: bool) {
        let mut msg = std::mem::take(self.scratch);
        msg.clear();
        abi::encode(result, &mut msg);
        let as_came = may_be_as_came && self.incoming.take().is_some_and(|came| super::same_bytes(came, &msg));
        self.send_unwind(if as_came { &[] } else { &msg }, handle);
        *self.scratch = msg;
    }

    fn send_unwind(&mut self, msg: &[u8], handle: u32) {
        // ENOENT: the host already failed the frame (it timed out).
        if let Err(e) = self.host.raw_unwind(self.frame, msg, handle) {
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
        // Only a WRITE carries data, which crosses as a handle: encoded
        // without it (a copy, cheap: the bytes are shared).
        let stripped;
        let (req, own) = match &req.fop {
            crate::Fop::Writev { data, .. } if !data.is_empty() => {
                let mut r = req.clone();
                let own = sys::take_fop_data(&mut r.fop);
                stripped = r;
                (&stripped, own)
            }
            crate::Fop::Writev { .. } => (req, Some(bytes::Bytes::new())),
            _ => (req, None),
        };
        let picked = self.pick(own, data)?;
        let handle = picked.as_ref().map_or(sys::NO_BUF, |(h, _)| *h);
        self.scratch.clear();
        sys::encode_call(ctx, req, self.scratch);
        // The fop as it came (a WRITE's data field empty, as it arrived),
        // as the frame's caller: the host reuses what it decoded.
        let req_bytes = &self.scratch[sys::CALL_HEADER..];
        if ctx.is_none() && self.host.as_is() && super::same_bytes(req_bytes, self.came) {
            return self.host.raw_wind(self.frame, child, flags | sys::WIND_AS_IS, &[], handle);
        }
        self.host.raw_wind(self.frame, child, flags, self.scratch, handle)
    }
}

/// Context outside a frame: timers and detached replies.
pub struct Ctl<'a, S> {
    pub(super) host: Host,
    pub(super) frames: &'a mut Frames<S>,
    pub(super) scratch: &'a mut Vec<u8>,
}

impl<S> Ctl<'_, S> {
    /// The host.
    pub fn host(&self) -> Host {
        self.host
    }

    /// The ids of the frames in flight in this instance, in order.
    pub fn frames(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.frames.keys().copied().collect();
        ids.sort_unstable();
        ids
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
        slot.cx(self.host, frame, self.scratch, None, None).wind(child, req, data)
    }

    /// Answers a frame in flight (for example one delayed until a timer).
    pub fn unwind(&mut self, frame: u64, result: FopResult, data: Option<&Buf>) -> Result<(), Errno> {
        let mut slot = self.frames.remove(&frame).ok_or(Errno::ENOENT)?;
        slot.cx(self.host, frame, self.scratch, None, None).unwind_with(result, data);
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
