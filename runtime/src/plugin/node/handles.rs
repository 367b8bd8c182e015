//! What a plugin node keeps for its guest by handle between calls: the
//! buffer handles bulk data crosses as, and the timers it arms. (Its
//! per-inode and per-fd context values are [`Slots`](xlfs_sdk::slots::Slots)
//! in [`Core`].)

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use xlfs_sdk::Errno;

use super::{Core, MAX_BUFFERS, MAX_TIMERS, neg};

#[derive(Default)]
pub(super) struct Bufs {
    pub(super) map: HashMap<u32, Bytes>,
    next: u32,
}

impl Bufs {
    pub(super) fn insert(&mut self, b: Bytes) -> Result<u32, Errno> {
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
