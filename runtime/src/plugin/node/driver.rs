//! A plugin node's frames and the calls wound for them.
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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::runtime::Handle;
use xlfs_sdk::abi::{self, Limits};
use xlfs_sdk::guest::sys;
use xlfs_sdk::{CallCtx, Child, Errno, FopKind, FopResult, Request};

use super::{Core, neg};

/// Calls one frame may wind in all (a fan-out of 100,000 is fine; a guest
/// whose every reply winds again is stopped here).
const MAX_CALLS_PER_FRAME: u32 = 1 << 20;
/// Replies a driver delivers in one poll before it yields, so that a frame
/// whose calls all answer at once cannot hold the thread (and its deadline).
const DELIVERIES_PER_POLL: u32 = 1024;

pub(super) struct FrameEntry {
    pub(super) cell: Arc<FrameCell>,
    ctx: CallCtx,
    kind: FopKind,
    /// Calls wound for it so far.
    wound: u32,
    /// The fop as the guest got it (WRITE data left out): what a wind
    /// "as it came" ([`sys::WIND_AS_IS`], ABI v1.3) sends, without decoding
    /// (cloned, or taken by a tail wind, which ends the frame).
    req: Option<Request>,
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

/// One of the node's calls in flight: counted while it lives.
struct CallCount(Arc<AtomicUsize>);

impl CallCount {
    fn start(calls: &Arc<AtomicUsize>) -> CallCount {
        calls.fetch_add(1, Ordering::Relaxed);
        CallCount(calls.clone())
    }
}

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
    inbox: SmallVec<[Wound; 1]>,
    result: Option<FopResult>,
    waker: Option<Waker>,
}

#[derive(Default)]
pub(super) struct FrameCell(Mutex<FrameState>);

impl FrameCell {
    fn push(&self, w: Wound) {
        let mut s = self.0.lock();
        s.inbox.push(w);
        if let Some(waker) = s.waker.take() {
            waker.wake();
        }
    }

    /// The frame's one call if the guest tail-wound it and did nothing
    /// else (a pass-through's `xlfs_on_fop`).
    fn take_sole_tail(&self) -> Option<Wound> {
        let mut s = self.0.lock();
        let sole_tail = s.result.is_none() && s.inbox.len() == 1 && s.inbox[0].meta.tail;
        if sole_tail { s.inbox.pop() } else { None }
    }

    /// Sets the frame's result (the first one stands).
    pub(super) fn finish(&self, result: FopResult) {
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
    calls: SmallVec<[CallFuture; 2]>,
    /// When the frame times out.
    deadline: Instant,
    /// Set on the background task's driver: its drop hands nothing on.
    detached: bool,
    /// The frame's result was taken: it is out of the frame table and no
    /// call can be queued for it any more.
    finished: bool,
}

impl Driver {
    /// Makes progress; `Ready(Some(result))` once the frame has a result
    /// (when `want_result`), `Ready(None)` once nothing is left to run
    /// (when not).
    fn poll_frame(&mut self, cx: &mut Context<'_>, want_result: bool) -> Poll<Option<FopResult>> {
        let mut delivered = 0u32;
        loop {
            let (wounds, result) = {
                let mut s = self.cell.0.lock();
                s.waker = None;
                (std::mem::take(&mut s.inbox), if want_result { s.result.take() } else { None })
            };
            self.calls.extend(wounds.into_iter().map(Wound::start));
            if result.is_some() {
                // An unwind takes the frame out of the table before it
                // sets the result, so nothing more can be queued.
                self.finished = true;
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
                        // The tail wind took the frame out of the table.
                        self.finished = true;
                        return Poll::Ready(Some(result));
                    }
                } else {
                    // The guest's reply handler runs here, in this task; it
                    // may wind more calls or unwind the frame.
                    self.core.deliver(meta.era, self.frame, meta.call, result);
                    delivered += 1;
                }
            }
            if progressed && delivered >= DELIVERIES_PER_POLL {
                // Let the runtime (and the frame's deadline) in.
                cx.waker().wake_by_ref();
                return Poll::Pending;
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
            if self.finished {
                return;
            }
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
            finished: self.finished,
        };
        rt.spawn(rest.finish());
    }
}

impl Core {
    /// A fop for the guest: a new frame, `xlfs_on_fop`, then drive the
    /// frame in this task until it has a result (or fails, or times out).
    pub(super) async fn run_fop(&self, ctx: CallCtx, mut req: Request) -> FopResult {
        if self.rt.get().is_none()
            && let Ok(h) = Handle::try_current()
        {
            let _ = self.rt.set(h);
        }
        let _permit = match self.permits.try_acquire() {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::NoPermits) => self.permits.acquire().await.map_err(|_| Errno::EIO)?,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Errno::EIO),
        };
        self.entered.fetch_add(1, Ordering::Relaxed);
        let kind = req.fop.kind();
        let frame = self.next_frame.fetch_add(1, Ordering::Relaxed);
        let cell = Arc::new(FrameCell::default());
        let data = sys::take_fop_data(&mut req.fop);
        let entered = self.with_guest(None, |g, msg| {
            let payload = match data {
                None => sys::NO_BUF,
                Some(d) => match self.bufs.lock().insert(d) {
                    Ok(h) => h,
                    Err(e) => return Ok(Err(e)),
                },
            };
            msg.clear();
            sys::encode_call(Some(&ctx), &req, msg);
            self.frames.lock().insert(frame, FrameEntry { cell: cell.clone(), ctx, kind, req: Some(req), wound: 0 });
            g.on_fop(frame, msg, payload).map(Ok)
        });
        // Tail-wound at once (a pass-through): the frame is over and its
        // call is the fop's own, awaited here like a native translator's
        // child call: no driver, no boxed call, no frame-timeout (which
        // bounds a frame until it ends), not even the clock read.
        if let Ok(Ok(())) = entered
            && let Some(Wound { target, ctx, req, _count, .. }) = cell.take_sole_tail()
        {
            return target.call(ctx, req).await;
        }
        // Otherwise a driver runs what the guest wound (also when it
        // failed after winding: its drop hands the calls on).
        let Some(me) = self.me.upgrade() else {
            self.frames.lock().remove(&frame);
            return Err(Errno::ENOTCONN);
        };
        let deadline = tokio::time::Instant::now() + self.limits.frame_timeout;
        let mut driver = Driver {
            core: me,
            frame,
            cell,
            calls: SmallVec::new(),
            deadline: deadline.into_std(),
            detached: false,
            finished: false,
        };
        if let Ok(Err(e)) | Err(e) = entered {
            // The frame failed before the guest saw it (or with it).
            self.frames.lock().remove(&frame);
            return Err(e);
        }
        // Most frames end in their first poll (a pass-through over a child
        // that answers at once): no timer for those.
        let first = std::future::poll_fn(|cx| Poll::Ready(driver.poll_frame(cx, true))).await;
        if let Poll::Ready(done) = first {
            return done.unwrap_or(Err(Errno::EIO));
        }
        // Boxed: its timer would make every fop's future larger (and
        // moved about) for the frames that never need it.
        Box::pin(self.wait_frame(driver, deadline, frame)).await
    }

    /// The rest of a frame that did not end in its first poll, under its
    /// deadline.
    async fn wait_frame(&self, mut driver: Driver, deadline: tokio::time::Instant, frame: u64) -> FopResult {
        match tokio::time::timeout_at(deadline, std::future::poll_fn(|cx| driver.poll_frame(cx, true))).await {
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
        let r = self.with_guest(Some(era), |g, msg| {
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
            msg.clear();
            abi::encode(&result, msg);
            // Kept for an unwind "as it came" (an empty message, ABI v1.3)
            // during this handler.
            *self.in_hand.lock() = (frame != 0).then_some((frame, result));
            let r = g.on_reply(frame, call, msg, payload);
            self.in_hand.lock().take();
            r
        });
        if let Err(e) = r {
            tracing::debug!(target: "xlfs::plugin", node = %self.name, frame, call, "reply not delivered: {e:?}");
        }
    }

    /// Fails one frame with EIO because the guest misused the ABI for it
    /// (or the host refused a call the frame needs: the guest may ignore
    /// the refusal, and the application must not wait for frame-timeout).
    pub(super) fn fail_frame(&self, frame: u64, why: &str) {
        if let Some(f) = self.frames.lock().remove(&frame) {
            tracing::warn!(target: "xlfs::plugin", node = %self.name, frame, fop = f.kind.name(), "{why}: failing the fop with EIO");
            f.cell.finish(Err(Errno::EIO));
        } else {
            tracing::warn!(target: "xlfs::plugin", node = %self.name, frame, "{why}");
        }
    }

    pub(super) fn wind(&self, frame: u64, child: u32, flags: u32, msg: &[u8], payload: u32) -> i64 {
        let tail = flags & sys::WIND_TAIL != 0;
        let as_is = flags & sys::WIND_AS_IS != 0;
        if flags & !(sys::WIND_TAIL | sys::WIND_AS_IS) != 0 || (frame == 0 && (tail || as_is)) {
            self.fail_frame(frame, &format!("wind with bad flags {flags:#x}"));
            return neg(Errno::EINVAL);
        }
        // A request the guest encoded; None: the frame's fop as it came,
        // taken from the frame table below.
        let decoded = if !as_is {
            match sys::decode_call(msg, &Limits::DEFAULT) {
                Ok(x) => Some(x),
                Err(e) => {
                    self.fail_frame(frame, &format!("wind of an undecodable request ({e})"));
                    return neg(Errno::EINVAL);
                }
            }
        } else if !msg.is_empty() {
            self.fail_frame(frame, "wind as it came with a message");
            return neg(Errno::EINVAL);
        } else {
            None
        };
        let Some(target) = self.children.get(child as usize).cloned() else {
            self.fail_frame(
                frame,
                &format!("wind to child {child}, but the node has {} children", self.children.len()),
            );
            return neg(Errno::EINVAL);
        };
        let data = match payload {
            sys::NO_BUF => None,
            h => match self.bufs.lock().get(h) {
                Some(bytes) => Some(bytes),
                None => {
                    self.fail_frame(frame, &format!("wind with unknown buffer handle {h}"));
                    return neg(Errno::EBADF);
                }
            },
        };
        let with_data = |req: &mut Request, data: Option<bytes::Bytes>| {
            let Some(bytes) = data else { return Ok(()) };
            if sys::put_fop_data(&mut req.fop, bytes) {
                Ok(())
            } else {
                Err(format!("wind of {} with a data buffer", req.fop.kind().name()))
            }
        };
        let max_calls = self.limits.max_frames.saturating_mul(4).max(64);
        if self.calls.load(Ordering::Relaxed) >= max_calls {
            if frame != 0 {
                self.fail_frame(frame, &format!("wind refused: the node has {max_calls} calls in flight"));
            }
            return neg(Errno::EAGAIN);
        }
        let era = self.generation.load(Ordering::Acquire);
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        let meta = CallMeta { call, era, tail };
        if frame == 0 {
            // A detached call: no fop to drive it, so a task of its own.
            let Some((ctx, mut req)) = decoded else { return neg(Errno::EINVAL) };
            if let Err(why) = with_data(&mut req, data) {
                self.fail_frame(frame, &why);
                return neg(Errno::EINVAL);
            }
            let (Some(rt), Some(me)) = (self.handle(), self.me.upgrade()) else { return neg(Errno::EAGAIN) };
            let ctx = ctx.unwrap_or_else(|| self.node_ctx.clone());
            let fut = Wound { meta, target, ctx, req, _count: CallCount::start(&self.calls) }.start();
            rt.spawn(async move {
                let (meta, result) = fut.await;
                me.deliver(meta.era, 0, meta.call, result);
            });
            return call as i64;
        }
        let mut frames = self.frames.lock();
        let Some(entry) = frames.get_mut(&frame) else { return neg(Errno::ENOENT) };
        entry.wound += 1;
        if entry.wound > MAX_CALLS_PER_FRAME {
            drop(frames);
            self.fail_frame(frame, &format!("wind refused: more than {MAX_CALLS_PER_FRAME} calls for one frame"));
            return neg(Errno::EAGAIN);
        }
        let (ctx, mut req) = match decoded {
            Some(x) => x,
            // A tail wind ends the frame: its fop moves into the call.
            None => match if tail { entry.req.take() } else { entry.req.clone() } {
                Some(req) => (None, req),
                None => return neg(Errno::ENOENT),
            },
        };
        if let Err(why) = with_data(&mut req, data) {
            drop(frames);
            self.fail_frame(frame, &why);
            return neg(Errno::EINVAL);
        }
        let _count = CallCount::start(&self.calls);
        // A context the guest encoded lacks the fop's timing frame
        // (never encoded): the call is still the fop's own.
        let call_ctx = |frame_ctx: CallCtx| match ctx {
            Some(c) => CallCtx { frame: frame_ctx.frame, ..c },
            None => frame_ctx,
        };
        if tail {
            // The frame ends here: its result is this call's, which takes
            // the frame's context.
            let Some(FrameEntry { cell, ctx, .. }) = frames.remove(&frame) else { return neg(Errno::ENOENT) };
            drop(frames);
            cell.push(Wound { meta, target, ctx: call_ctx(ctx), req, _count });
        } else {
            entry.cell.push(Wound { meta, target, ctx: call_ctx(entry.ctx.clone()), req, _count });
        }
        call as i64
    }

    pub(super) fn unwind(&self, frame: u64, msg: &[u8], payload: u32) -> i32 {
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
        let mut result = if msg.is_empty() {
            // As it came (ABI v1.3): the result being delivered to this frame.
            match self.in_hand.lock().take_if(|(f, _)| *f == frame) {
                Some((_, r)) => r,
                None => {
                    let why: String = "unwind with an empty message outside the frame's xlfs_on_reply".into();
                    return refuse(entry, why, Errno::EINVAL);
                }
            }
        } else {
            match abi::decode::<FopResult>(msg, None, &Limits::DEFAULT) {
                Ok(r) => r,
                Err(e) => return refuse(entry, format!("plugin unwound garbage ({e})"), Errno::EINVAL),
            }
        };
        if payload != sys::NO_BUF {
            let Some(bytes) = self.bufs.lock().get(payload) else {
                return refuse(entry, format!("unwind with unknown buffer handle {payload}"), Errno::EBADF);
            };
            if !sys::put_result_data(&mut result, bytes) {
                return refuse(entry, "unwind of a non-READ result with a data buffer".into(), Errno::EINVAL);
            }
        }
        entry.cell.finish(result);
        0
    }
}
