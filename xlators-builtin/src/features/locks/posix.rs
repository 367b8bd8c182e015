//! POSIX (fcntl) record locks of one inode.
//!
//! Each owner's locks are kept as disjoint byte ranges: a new lock or unlock
//! of an owner replaces that owner's locks over its range (splitting them
//! where needed), so upgrades and downgrades happen in place, and adjacent
//! ranges of the same owner, type and fd are merged. Locks of different
//! owners conflict when they overlap and one of them is a write lock.
//!
//! As GlusterFS does, a blocking request that has to wait first gives up
//! its owner's own locks over the requested range, so two owners upgrading
//! overlapping read locks wait for each other's *new* requests only and
//! cannot deadlock. Blocked requests are re-examined in arrival order
//! whenever locks go.

use std::collections::VecDeque;

use tokio::sync::oneshot;
use xlfs_sdk::{Errno, FdId, Flock, LockType};

use super::Owner;
use super::queue::{Attempt, Waiting, fail_waiters};

/// One granted (or requested) range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PosixLk {
    pub owner: Owner,
    /// The fd it was taken through (released with it).
    pub fd: FdId,
    pub exclusive: bool,
    pub start: u64,
    /// Last byte, inclusive; `u64::MAX` is "to end of file".
    pub end: u64,
    pub pid: u32,
}

impl PosixLk {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn conflicts(&self, other: &PosixLk) -> bool {
        self.owner != other.owner && self.overlaps(other.start, other.end) && (self.exclusive || other.exclusive)
    }

    /// The lock as a `Flock` (for GETLK replies).
    pub fn to_flock(&self) -> Flock {
        Flock {
            ty: if self.exclusive { LockType::Write } else { LockType::Read },
            start: self.start,
            len: if self.end == u64::MAX { 0 } else { self.end - self.start + 1 },
            pid: self.pid,
            owner: self.owner.lk_owner,
        }
    }
}

/// The posix locks of one inode.
#[derive(Default)]
pub(super) struct PosixLocks {
    pub granted: Vec<PosixLk>,
    pub blocked: VecDeque<Waiting<PosixLk>>,
}

impl PosixLocks {
    /// Granted ranges plus blocked requests.
    pub fn len(&self) -> usize {
        self.granted.len() + self.blocked.len()
    }

    /// The first granted lock of another owner in the way of `req`.
    pub fn conflict(&self, req: &PosixLk) -> Option<&PosixLk> {
        self.granted.iter().find(|l| l.conflicts(req))
    }

    /// Sets the lock `req` (or, with `unlock`, clears the owner's locks over
    /// its range) without looking at other owners.
    pub fn apply(&mut self, req: &PosixLk, unlock: bool) {
        let (start, end) = (req.start, req.end);
        let mut kept = Vec::with_capacity(self.granted.len() + 2);
        for l in self.granted.drain(..) {
            if l.owner != req.owner || !l.overlaps(start, end) {
                kept.push(l);
                continue;
            }
            if l.start < start {
                kept.push(PosixLk { end: start - 1, ..l.clone() });
            }
            if l.end > end {
                kept.push(PosixLk { start: end + 1, ..l });
            }
        }
        if !unlock {
            let (mut s, mut e) = (start, end);
            kept.retain(|l| {
                let joins = l.owner == req.owner
                    && l.exclusive == req.exclusive
                    && l.fd == req.fd
                    && (l.end.checked_add(1) == Some(s) || e.checked_add(1) == Some(l.start));
                if joins {
                    s = s.min(l.start);
                    e = e.max(l.end);
                }
                !joins
            });
            kept.push(PosixLk { start: s, end: e, ..req.clone() });
        }
        self.granted = kept;
    }

    /// Tries to take `req`; queues it when it conflicts and `block` is set.
    pub fn lock(&mut self, id: u64, req: PosixLk, block: bool) -> Attempt {
        if self.conflict(&req).is_none() {
            self.apply(&req, false);
            return Attempt::Granted;
        }
        if !block {
            return Attempt::WouldBlock;
        }
        self.apply(&req, true);
        let (answer, pending) = oneshot::channel();
        self.blocked.push_back(Waiting { id, lock: req, answer });
        // Giving up our own range may have freed someone else.
        self.grant_blocked();
        Attempt::Queued(pending)
    }

    /// Grants what can be granted among the blocked requests, in order.
    pub fn grant_blocked(&mut self) {
        let waiting = std::mem::take(&mut self.blocked);
        for w in waiting {
            if w.answer.is_closed() {
                continue;
            }
            if self.conflict(&w.lock).is_none() {
                self.apply(&w.lock, false);
                // The waiter is still listening (checked above, and it only
                // stops listening after removing itself under the same lock).
                w.answer(Ok(()));
            } else {
                self.blocked.push_back(w);
            }
        }
    }

    /// Releases every lock of `owner` (close(2) semantics); true if any.
    pub fn release_owner(&mut self, owner: &Owner) -> bool {
        let before = self.granted.len();
        self.granted.retain(|l| l.owner != *owner);
        before != self.granted.len()
    }

    /// Releases the locks `client` took through `fd` and fails its waiters
    /// on that fd with EBADF; true if anything went.
    pub fn release_fd(&mut self, client: &str, fd: FdId) -> bool {
        let before = self.len();
        let mine = |l: &PosixLk| l.fd == fd && &*l.owner.client == client;
        self.granted.retain(|l| !mine(l));
        fail_waiters(&mut self.blocked, mine, Errno::EBADF);
        before != self.len()
    }

    /// Releases everything of `client`, failing its waiters with `err`;
    /// returns how many entries went.
    pub fn purge_client(&mut self, client: &str, err: Errno) -> usize {
        let before = self.len();
        self.granted.retain(|l| &*l.owner.client != client);
        fail_waiters(&mut self.blocked, |l| &*l.owner.client == client, err);
        before - self.len()
    }

    /// Fails with EINTR the blocked requests of `owner` that overlap
    /// `start..=end` (their caller was interrupted); how many.
    pub fn cancel_waiting(&mut self, owner: &Owner, start: u64, end: u64) -> usize {
        let before = self.blocked.len();
        fail_waiters(&mut self.blocked, |l| l.owner == *owner && l.overlaps(start, end), Errno::EINTR);
        before - self.blocked.len()
    }

    /// Drops a blocked request whose caller went away; true if found. (A
    /// request granted just before its caller went away stays granted, as
    /// after an interrupted fcntl(2); the owner's flush or the fd's release
    /// frees it.)
    pub fn cancel(&mut self, id: u64) -> bool {
        match self.blocked.iter().position(|w| w.id == id) {
            Some(i) => {
                self.blocked.remove(i);
                true
            }
            None => false,
        }
    }
}
