//! The granted and blocked lists of one lock domain, shared by inodelk and
//! entrylk.
//!
//! Rules (GlusterFS's): locks of the same owner never conflict; a request
//! that conflicts with a granted lock waits (or fails with EAGAIN when it may
//! not wait); a request that conflicts with nothing granted but with an
//! earlier *blocked* request also waits unless its owner already holds or
//! awaits a lock in the domain (nested locks must not deadlock behind their
//! own waiters). Blocked requests are re-examined in arrival order, so
//! writers are not starved by a stream of readers.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use xlfs_sdk::{Errno, Gfid, Upcall};

use super::Owner;

/// Where a waiting request learns its outcome.
pub(super) type Answer = oneshot::Sender<Result<(), Errno>>;
/// The waiting side of an [`Answer`].
pub(super) type Pending = oneshot::Receiver<Result<(), Errno>>;

/// A lock kind that lives in a [`Queue`].
pub(super) trait DomainLock {
    /// Who holds it.
    fn owner(&self) -> &Owner;
    /// True if the two would conflict were their owners different.
    fn conflicts(&self, other: &Self) -> bool;
    /// The contention notice for the holder of this lock.
    fn contention(&self, gfid: Gfid, domain: &str) -> Upcall;
}

/// A granted lock.
pub(super) struct Granted<L> {
    pub id: u64,
    pub lock: L,
    /// When its holder was last told about contention.
    noticed: Option<Instant>,
}

/// A request waiting in a blocked list.
pub(super) struct Waiting<L> {
    pub id: u64,
    pub lock: L,
    pub answer: Answer,
}

impl<L> Waiting<L> {
    /// Tells the waiter its outcome; false if nobody listens any more.
    pub fn answer(self, r: Result<(), Errno>) -> bool {
        self.answer.send(r).is_ok()
    }
}

/// What a lock attempt came to.
pub(super) enum Attempt {
    /// Granted at once.
    Granted,
    /// Conflicts and may not wait.
    WouldBlock,
    /// Queued; the receiver answers when granted or failed.
    Queued(Pending),
}

/// Collects contention notices during one operation: at most one per granted
/// lock per operation, and per lock no more often than `delay`.
pub(super) struct Contention<'a> {
    gfid: Gfid,
    domain: &'a str,
    /// None when notices are switched off.
    clock: Option<(Instant, Duration)>,
    sent: Vec<u64>,
    pub out: Vec<Upcall>,
}

impl<'a> Contention<'a> {
    pub fn new(gfid: Gfid, domain: &'a str, clock: Option<(Instant, Duration)>) -> Contention<'a> {
        Contention { gfid, domain, clock, sent: Vec::new(), out: Vec::new() }
    }

    fn consider<L: DomainLock>(&mut self, g: &mut Granted<L>) {
        let Some((now, delay)) = self.clock else {
            return;
        };
        if self.sent.contains(&g.id) {
            return;
        }
        if g.noticed.is_some_and(|t| now.saturating_duration_since(t) < delay) {
            return;
        }
        g.noticed = Some(now);
        self.sent.push(g.id);
        self.out.push(g.lock.contention(self.gfid, self.domain));
    }
}

/// One domain's locks of one kind.
pub(super) struct Queue<L> {
    pub granted: Vec<Granted<L>>,
    pub blocked: VecDeque<Waiting<L>>,
}

impl<L> Default for Queue<L> {
    fn default() -> Self {
        Queue { granted: Vec::new(), blocked: VecDeque::new() }
    }
}

impl<L: DomainLock> Queue<L> {
    /// Granted plus blocked.
    pub fn len(&self) -> usize {
        self.granted.len() + self.blocked.len()
    }

    fn owner_present(&self, owner: &Owner) -> bool {
        self.granted.iter().any(|g| g.lock.owner() == owner) || self.blocked.iter().any(|w| w.lock.owner() == owner)
    }

    /// True if `lock` may be granted now; tells the holders in its way.
    fn grantable(&mut self, lock: &L, notices: &mut Contention<'_>) -> bool {
        let mut free = true;
        for g in self.granted.iter_mut() {
            if g.lock.owner() != lock.owner() && g.lock.conflicts(lock) {
                free = false;
                notices.consider(g);
            }
        }
        if !free {
            return false;
        }
        // Fairness: do not overtake a conflicting waiter, unless this owner
        // is already in the domain (its nested lock would otherwise deadlock
        // behind a waiter that waits for this owner).
        !self.blocked.iter().any(|w| w.lock.conflicts(lock)) || self.owner_present(lock.owner())
    }

    /// Tries to take `lock`; queues it when it conflicts and `block` is set.
    pub fn lock(&mut self, id: u64, lock: L, block: bool, notices: &mut Contention<'_>) -> Attempt {
        if self.grantable(&lock, notices) {
            self.granted.push(Granted { id, lock, noticed: None });
            return Attempt::Granted;
        }
        if !block {
            return Attempt::WouldBlock;
        }
        let (answer, pending) = oneshot::channel();
        self.blocked.push_back(Waiting { id, lock, answer });
        Attempt::Queued(pending)
    }

    /// Removes the first granted lock `is_it` picks; false if none.
    pub fn unlock(&mut self, is_it: impl Fn(&L) -> bool) -> bool {
        match self.granted.iter().position(|g| is_it(&g.lock)) {
            Some(i) => {
                self.granted.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Grants what can be granted among the blocked requests, in order.
    pub fn grant_blocked(&mut self, notices: &mut Contention<'_>) {
        let waiting = std::mem::take(&mut self.blocked);
        for w in waiting {
            if w.answer.is_closed() {
                continue;
            }
            if self.grantable(&w.lock, notices) {
                let Waiting { id, lock, answer } = w;
                self.granted.push(Granted { id, lock, noticed: None });
                if answer.send(Ok(())).is_err() {
                    self.granted.pop();
                }
            } else {
                self.blocked.push_back(w);
            }
        }
    }

    /// Drops the request or lock with this id (a waiter that went away);
    /// true if something was removed.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(i) = self.blocked.iter().position(|w| w.id == id) {
            self.blocked.remove(i);
            return true;
        }
        if let Some(i) = self.granted.iter().position(|g| g.id == id) {
            self.granted.swap_remove(i);
            return true;
        }
        false
    }

    /// Releases everything `client` holds and fails its waiters with
    /// `err`; returns how many entries went.
    pub fn purge_client(&mut self, client: &str, err: Errno) -> usize {
        let before = self.len();
        self.granted.retain(|g| &*g.lock.owner().client != client);
        fail_waiters(&mut self.blocked, |l| &*l.owner().client == client, err);
        before - self.len()
    }
}

/// Fails (and removes) the waiters `pick` selects.
pub(super) fn fail_waiters<L>(blocked: &mut VecDeque<Waiting<L>>, pick: impl Fn(&L) -> bool, err: Errno) {
    for w in std::mem::take(blocked) {
        if pick(&w.lock) {
            w.answer(Err(err));
        } else {
            blocked.push_back(w);
        }
    }
}
