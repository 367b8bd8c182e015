//! A misbehaving policy plugin for the hosts' fallback tests. Its
//! read-ahead policy opens streams but panics on every read (a trap on
//! WebAssembly, a caught panic natively); its lock-contention policy asks
//! for the open fd count, then spins forever in every decision (on
//! WebAssembly the call deadline stops it; never load that one natively).

use std::hint::black_box;

use xlfs_sdk::policy::lock_contention::{Decision, Interest, LockContentionPolicy, LockEvent, LockView};
use xlfs_sdk::policy::read_ahead::{Advice, Geometry, ReadAheadPolicy, ReadAheadStream, ReadInfo};

/// Panics on every read.
#[derive(Clone, Copy, Debug, Default)]
pub struct Panicky;

/// Its stream.
pub struct PanickyStream;

impl ReadAheadPolicy for Panicky {
    fn name(&self) -> &str {
        "panicky"
    }
    fn open(&self, _geo: Geometry) -> Box<dyn ReadAheadStream> {
        Box::new(PanickyStream)
    }
}

impl ReadAheadStream for PanickyStream {
    fn on_read(&mut self, read: ReadInfo) -> Advice {
        panic!("bad-policy: refusing the read at {}", black_box(read.offset))
    }
    fn reset_cache(&mut self, _geo: Geometry) {}
}

/// Spins forever in every decision.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spinner;

impl LockContentionPolicy for Spinner {
    fn name(&self) -> &str {
        "spinner"
    }
    fn interest(&self) -> Interest {
        Interest { open_fd_count: true, ..Interest::default() }
    }
    fn decide(&self, _event: LockEvent, _view: &LockView) -> Decision {
        let mut n = 0u64;
        loop {
            n = black_box(n.wrapping_add(1));
        }
    }
}

xlfs_sdk::export_policy!(read_ahead = Panicky, lock_contention = Spinner);
