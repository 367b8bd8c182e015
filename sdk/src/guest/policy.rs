//! Policy modules (plugin ABI v1.1): a read-ahead policy and/or a
//! lock-contention policy, written against `xlfs_sdk::policy` exactly as a
//! built-in one is, exported by [`export_policy!`](crate::export_policy).
//! The host calls them synchronously from performance/read-ahead and
//! cluster/replicate (options `policy` and `lock-contention-policy` set to
//! `wasm:/path/module.wasm` or `dylib:/path/libmodule.so`).
//!
//! The module is a complete plugin: as a translator (`plugin/wasm`) it
//! passes every fop to its child without entering the guest.

use std::collections::BTreeMap;

use crate::Request;
use crate::errno::Errno;
use crate::options::Options;
use crate::policy::lock_contention::{LockContentionPolicy, LockEvent};
use crate::policy::read_ahead::{Geometry, ReadAheadPolicy, ReadAheadStream, ReadInfo};

use super::host::Host;
use super::rt::{self, Cx, Plugin};
use super::sys::{self, FopSet};

/// Most read-ahead streams one instance keeps; `xlfs_ra_open` fails with
/// ENOMEM past it.
pub const MAX_STREAMS: usize = 65536;

/// The instance of a policy module: its policies (made with `Default`) and
/// the read-ahead streams it has open. `R` or `L` is [`Without`] for a
/// module that exports only the other policy.
pub struct Policies<R, L> {
    ra: R,
    lock: L,
    streams: BTreeMap<u64, Box<dyn ReadAheadStream>>,
    next: u64,
    out: Vec<u8>,
}

/// Stands for the policy a module does not export.
#[derive(Clone, Copy, Debug, Default)]
pub struct Without;

impl<R: Default + 'static, L: Default + 'static> Plugin for Policies<R, L> {
    type Frame = ();
    const NAME: &'static str = "policy-module";
    const DESCRIPTION: &'static str =
        "policies for built-in translators (plugin ABI v1.1); as a translator it passes every fop on";
    const FOPS: FopSet = FopSet::NONE;

    fn init(_host: Host, _options: &Options) -> Result<Self, String> {
        Ok(Policies { ra: R::default(), lock: L::default(), streams: BTreeMap::new(), next: 0, out: Vec::new() })
    }

    fn fop(&mut self, cx: &mut Cx<'_, ()>, req: Request) {
        if let Err(e) = cx.forward(&req) {
            cx.unwind(Err(e));
        }
    }
}

/// The instance behind `inst`, inside the SDK's panic guard; `failed` if
/// there is none or `f` panics.
///
/// # Safety
/// `inst` as `xlfs_init` returned it.
unsafe fn with<R, L, T>(inst: usize, failed: T, f: impl FnOnce(&mut Policies<R, L>) -> T) -> T
where
    R: Default + 'static,
    L: Default + 'static,
{
    // SAFETY: the caller's contract.
    let Some(i) = (unsafe { rt::instance::<Policies<R, L>>(inst) }) else { return failed };
    let host = i.host;
    rt::guard(host, failed, || f(&mut i.plugin))
}

/// `xlfs_ra_open`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn ra_open<R: ReadAheadPolicy + Default, L: Default + 'static>(
    inst: usize,
    page_size: u64,
    page_count: u32,
) -> i64 {
    // SAFETY: the caller's contract.
    unsafe {
        with::<R, L, i64>(inst, sys::HANDLER_FAILED.into(), |p| {
            if p.streams.len() >= MAX_STREAMS {
                return -i64::from(Errno::ENOMEM.0);
            }
            p.next += 1;
            let stream = p.ra.open(Geometry { page_size, page_count });
            p.streams.insert(p.next, stream);
            p.next as i64
        })
    }
}

/// `xlfs_ra_read`.
///
/// # Safety
/// Arguments as the ABI specifies: `out` is writable for `cap` bytes.
pub unsafe fn ra_read<R: ReadAheadPolicy + Default, L: Default + 'static>(
    inst: usize,
    stream: u64,
    offset: u64,
    size: u64,
    at_ns: u64,
    out: *mut u8,
    cap: u32,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        with::<R, L, i32>(inst, sys::HANDLER_FAILED, |p| {
            let Some(s) = p.streams.get_mut(&stream) else { return -Errno::ENOENT.0 };
            let advice = s.on_read(ReadInfo { offset, size, at_ns });
            p.out.clear();
            sys::encode_advice(&advice, &mut p.out);
            if p.out.len() > cap as usize || out.is_null() {
                return -Errno::E2BIG.0;
            }
            // SAFETY: the host's contract: `out` holds `cap` bytes.
            std::ptr::copy_nonoverlapping(p.out.as_ptr(), out, p.out.len());
            p.out.len() as i32
        })
    }
}

/// `xlfs_ra_reset`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn ra_reset<R: ReadAheadPolicy + Default, L: Default + 'static>(
    inst: usize,
    stream: u64,
    page_size: u64,
    page_count: u32,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        with::<R, L, i32>(inst, sys::HANDLER_FAILED, |p| match p.streams.get_mut(&stream) {
            Some(s) => {
                s.reset_cache(Geometry { page_size, page_count });
                0
            }
            None => -Errno::ENOENT.0,
        })
    }
}

/// `xlfs_ra_close`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn ra_close<R: ReadAheadPolicy + Default, L: Default + 'static>(inst: usize, stream: u64) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        with::<R, L, i32>(inst, sys::HANDLER_FAILED, |p| match p.streams.remove(&stream) {
            Some(mut s) => {
                s.close();
                0
            }
            None => -Errno::ENOENT.0,
        })
    }
}

/// `xlfs_lock_interest`.
///
/// # Safety
/// Arguments as the ABI specifies.
pub unsafe fn lock_interest<R: Default + 'static, L: LockContentionPolicy + Default>(inst: usize) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { with::<R, L, i32>(inst, sys::HANDLER_FAILED, |p| sys::interest_bits(p.lock.interest())) }
}

/// `xlfs_lock_decide`.
///
/// # Safety
/// Arguments as the ABI specifies: `view` is readable for `len` bytes.
pub unsafe fn lock_decide<R: Default + 'static, L: LockContentionPolicy + Default>(
    inst: usize,
    event: u32,
    view: *const u8,
    len: u32,
) -> i64 {
    // SAFETY: the caller's contract.
    unsafe {
        with::<R, L, i64>(inst, sys::HANDLER_FAILED.into(), |p| {
            let bytes =
                if view.is_null() || len == 0 { &[][..] } else { std::slice::from_raw_parts(view, len as usize) };
            let (Some(view), Some(event)) =
                (sys::decode_lock_view(bytes), u8::try_from(event).ok().and_then(LockEvent::from_code))
            else {
                return -i64::from(Errno::EINVAL.0);
            };
            sys::encode_decision(p.lock.decide(event, &view))
        })
    }
}
