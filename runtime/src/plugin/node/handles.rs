//! What a plugin node keeps for its guest by handle between calls: the
//! buffer handles bulk data crosses as, and the timers it arms. (Its
//! per-inode and per-fd context values are [`Slots`](xlfs_sdk::slots::Slots)
//! in [`Core`].)

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use xlfs_sdk::Errno;
use xlfs_sdk::slots::IdMap;

use super::{Core, MAX_BUFFER_BYTES, MAX_BUFFERS, MAX_TIMERS, neg};

/// The guest's buffer handles, bounded in count and in bytes (a handle
/// pins its bytes until the guest frees it: the data of every WRITE a
/// pass-through never frees, or buffers it makes as large as it likes).
#[derive(Default)]
pub(super) struct Bufs {
    /// By handle (as u64: the cheap hash of [`IdMap`], not SipHash: three
    /// lookups per WRITE a plugin sees).
    map: IdMap<Bytes>,
    next: u32,
    /// Bytes behind the handles.
    bytes: usize,
}

impl Bufs {
    pub(super) fn insert(&mut self, b: Bytes) -> Result<u32, Errno> {
        if self.map.len() >= MAX_BUFFERS || self.bytes.saturating_add(b.len()) > MAX_BUFFER_BYTES {
            return Err(Errno::ENOMEM);
        }
        loop {
            self.next = self.next.wrapping_add(1).max(1);
            if let std::collections::hash_map::Entry::Vacant(e) = self.map.entry(u64::from(self.next)) {
                self.bytes += b.len();
                e.insert(b);
                return Ok(self.next);
            }
        }
    }

    pub(super) fn get(&self, h: u32) -> Option<Bytes> {
        self.map.get(&u64::from(h)).cloned()
    }

    pub(super) fn remove(&mut self, h: u32) -> Option<Bytes> {
        let b = self.map.remove(&u64::from(h))?;
        self.bytes -= b.len();
        Some(b)
    }

    pub(super) fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
    }

    /// Bytes held now.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Core {
    pub(super) fn timer_set(&self, delay_ms: u64) -> i64 {
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

    pub(super) fn timer_cancel(&self, id: u64) -> i32 {
        match self.timers.lock().remove(&id) {
            Some(t) => {
                t.abort();
                0
            }
            None => -Errno::ENOENT.0,
        }
    }

    fn fire_timer(&self, era: u64, timer: u64) {
        if self.timers.lock().remove(&timer).is_none() {
            return;
        }
        let _ = self.with_guest(Some(era), |g, _| g.on_timer(timer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_bounded_in_bytes_not_only_in_count() {
        let mut b = Bufs::default();
        let big = Bytes::from(vec![0u8; MAX_BUFFER_BYTES / 4]);
        let handles: Vec<u32> = (0..4).map(|_| b.insert(big.clone()).expect("within the budget")).collect();
        assert_eq!(b.bytes(), MAX_BUFFER_BYTES);
        assert_eq!(b.insert(Bytes::from_static(b"x")), Err(Errno::ENOMEM), "one byte over");
        assert!(b.remove(handles[0]).is_some());
        assert!(b.insert(Bytes::from_static(b"x")).is_ok(), "freeing gives the budget back");
        b.clear();
        assert_eq!(b.bytes(), 0);
    }
}
