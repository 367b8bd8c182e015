//! The functions the export macros call, one per export (`xlfs_alloc` ...
//! `xlfs_fini`, and the ABI v1.2 `xlfs_dump` and `xlfs_reconfigure`): each
//! decodes the host's message, finds the instance and the frame's state,
//! and runs the plugin's handler inside the panic guard.

use crate::abi::{self, Limits};
use crate::errno::Errno;
use crate::guest::host::{Buf, Host};
use crate::guest::sys::{self, DeclaredOption, Descriptor, HostVtable};
use crate::options::Options;
use crate::xlator::ReconfigureError;
use crate::{Dict, Event, EventFrom, FopResult, Request, Value};

use super::guard::{guard, install_panic_hook};
use super::{CallId, Ctl, Cx, Instance, Plugin, Slot, TimerId};

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
pub(in crate::guest) unsafe fn instance<'a, P: Plugin>(inst: usize) -> Option<&'a mut Instance<P>> {
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
            placement: P::PLACEMENT,
        };
        let mut out = Vec::new();
        d.encode(&mut out);
        match host.raw_declare(&out) {
            Ok(()) => sys::HANDLER_OK,
            Err(e) => -e.0,
        }
    })
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
                let inst = Instance::<P> {
                    host,
                    plugin,
                    frames: Default::default(),
                    callers: Default::default(),
                    scratch: Vec::new(),
                };
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
        let Instance { plugin, frames, callers, scratch, .. } = i;
        let decoded = sys::split_call(msg).and_then(|(ctx, came)| {
            let ctx = if ctx.is_empty() { None } else { Some(callers.decode(ctx)?) };
            Ok((ctx, abi::decode::<Request>(came, None, &Limits::DEFAULT)?, came))
        });
        let (ctx, req, came) = match decoded {
            Ok((Some(ctx), req, came)) => (ctx, req, came),
            Ok((None, ..)) => {
                host.error("fop message without a caller context");
                return sys::HANDLER_FAILED;
            }
            Err(e) => {
                host.error(&format!("fop message: {e}"));
                return sys::HANDLER_FAILED;
            }
        };
        // The frame joins the map (boxed) only if it outlives this handler
        // (a tail wind or an unwind here ends it).
        let mut state = P::Frame::default();
        let mut cx =
            Cx { host, frame, ctx: &ctx, state: &mut state, came, scratch, data, incoming: None, ended: false };
        plugin.fop(&mut cx, req);
        let ended = cx.ended;
        drop(cx);
        if !ended {
            frames.insert(frame, Box::new(Slot { ctx, came: came.to_vec(), state }));
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
        let decoded = || match abi::decode::<FopResult>(msg, None, &Limits::DEFAULT) {
            Ok(r) => Some(r),
            Err(e) => {
                host.error(&format!("reply message: {e}"));
                None
            }
        };
        let Instance { plugin, frames, scratch, .. } = i;
        if frame == 0 {
            let Some(result) = decoded() else { return sys::HANDLER_FAILED };
            let mut ctl = Ctl { host, frames, scratch };
            plugin.detached_reply(&mut ctl, CallId(call), result, data);
            return sys::HANDLER_OK;
        }
        // A reply for a frame already unwound (fan-out answered early) is
        // dropped with its data, undecoded.
        let Some(slot) = frames.get_mut(&frame) else { return sys::HANDLER_OK };
        let Some(result) = decoded() else { return sys::HANDLER_FAILED };
        // Kept to see whether the plugin unwinds it unchanged (then it goes
        // "as it came", ABI v1.3, without being encoded again).
        let incoming = host.as_is().then_some(msg);
        let mut cx = slot.cx(host, frame, scratch, data, incoming);
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
    use crate::guest::sys::FopSet;
    use crate::options::{OptType, OptionDecl};
    use crate::{CallCtx, Fd, FdId, Fop, Gfid, Iatt, Loc, Reply, Request, Response};

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

    /// A v1.3 host: the same fake, declaring the minor with AS_IS.
    const AS_IS_VT: HostVtable = HostVtable { minor: sys::AS_IS_MINOR, ..VT };

    /// An instance of `P` on host `vt`, with no options.
    fn started<P: Plugin>(vt: &'static HostVtable) -> usize {
        let o = opts(&[]);
        // SAFETY: the fake host and a valid options message.
        let inst = unsafe { init::<P>(vt, o.as_ptr(), o.len() as u32) };
        assert_ne!(inst, 0);
        inst
    }

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

    #[test]
    fn unchanged_fops_and_replies_go_as_they_came() {
        take();
        let inst = started::<T>(&AS_IS_VT);
        // SAFETY (all calls below): the fake host and valid messages.
        // Stat is wound unchanged: flag AS_IS, no message.
        let m = msg(&Request::new(Fop::Stat { loc: Loc::root() }));
        assert_eq!(unsafe { on_fop::<T>(inst, 1, m.as_ptr(), m.len() as u32, 0) }, sys::HANDLER_OK);
        assert_eq!(take(), [Call::Wind { frame: 1, child: 0, flags: sys::WIND_AS_IS, msg: vec![], payload: 0 }]);
        // Its reply, unwound unchanged by the default handler: no message.
        let mut r = Vec::new();
        abi::encode(&FopResult::Ok(Response::from(Reply::Attr(Iatt::default()))), &mut r);
        assert_eq!(unsafe { on_reply::<T>(inst, 1, 77, r.as_ptr(), r.len() as u32, 0) }, sys::HANDLER_OK);
        assert_eq!(take(), [Call::Unwind { frame: 1, msg: vec![], payload: 0 }]);
        // A WRITE forwarded (tail) with its data handle, as it came.
        let fd = Fd { id: FdId(1), gfid: Gfid::ROOT };
        let m = msg(&Request::new(Fop::Writev { fd, data: Bytes::new(), offset: 0, flags: 0 }));
        assert_eq!(unsafe { on_fop::<T>(inst, 2, m.as_ptr(), m.len() as u32, 42) }, sys::HANDLER_OK);
        let flags = sys::WIND_TAIL | sys::WIND_AS_IS;
        assert_eq!(take(), [Call::Wind { frame: 2, child: 0, flags, msg: vec![], payload: 42 }, Call::BufFree(42)]);
        unsafe { fini::<T>(inst) };
    }

    /// Adds an xdata key to every fop it winds, and answers every reply
    /// with ENOENT.
    struct M;

    impl Plugin for M {
        type Frame = ();
        const NAME: &'static str = "m";
        fn init(_host: Host, _options: &Options) -> Result<M, String> {
            Ok(M)
        }
        fn fop(&mut self, cx: &mut Cx<'_, ()>, mut req: Request) {
            req.xdata.set_str("seen", "1");
            cx.wind(0, &req, None).expect("wind");
        }
        fn reply(&mut self, cx: &mut Cx<'_, ()>, _call: CallId, _result: FopResult) {
            cx.unwind(Err(Errno::ENOENT));
        }
    }

    #[test]
    fn changed_fops_and_replies_are_encoded_for_an_as_is_host() {
        take();
        let inst = started::<M>(&AS_IS_VT);
        // SAFETY (all calls below): the fake host and valid messages.
        let stat = Request::new(Fop::Stat { loc: Loc::root() });
        let m = msg(&stat);
        assert_eq!(unsafe { on_fop::<M>(inst, 1, m.as_ptr(), m.len() as u32, 0) }, sys::HANDLER_OK);
        let Some(Call::Wind { frame: 1, child: 0, flags: 0, msg: wound, payload: 0 }) = take().pop() else {
            panic!("no wind, or wound as it came")
        };
        let mut want = stat.clone();
        want.xdata.set_str("seen", "1");
        assert_eq!(sys::decode_call(&wound, &Limits::DEFAULT).expect("decodes"), (None, want));
        let mut r = Vec::new();
        abi::encode(&FopResult::Ok(Response::from(Reply::Attr(Iatt::default()))), &mut r);
        assert_eq!(unsafe { on_reply::<M>(inst, 1, 77, r.as_ptr(), r.len() as u32, 0) }, sys::HANDLER_OK);
        let mut e = Vec::new();
        abi::encode(&FopResult::Err(Errno::ENOENT), &mut e);
        assert_eq!(take(), [Call::Unwind { frame: 1, msg: e, payload: 0 }]);
        unsafe { fini::<M>(inst) };
    }

    #[test]
    fn a_caller_context_is_decoded_once_per_encoding() {
        let enc = |c: &CallCtx| {
            let mut b = Vec::new();
            abi::encode(c, &mut b);
            b
        };
        let a = CallCtx::root("a");
        let b = CallCtx { uid: 7, groups: vec![1, 2].into(), ..CallCtx::root("b") };
        let (ea, eb) = (enc(&a), enc(&b));
        let mut cache = super::super::CtxCache::default();
        let first = cache.decode(&ea).expect("a");
        let again = cache.decode(&ea).expect("a again");
        assert_eq!((&first, &again), (&a, &a));
        assert!(std::sync::Arc::ptr_eq(&first.client_id, &again.client_id), "shared, not decoded again");
        assert_eq!(cache.decode(&eb).expect("b"), b);
        let after = cache.decode(&ea).expect("a after b");
        assert_eq!(after, a);
        assert!(!std::sync::Arc::ptr_eq(&first.client_id, &after.client_id), "decoded again after b");
        assert!(cache.decode(&ea[..ea.len() - 1]).is_err());
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
