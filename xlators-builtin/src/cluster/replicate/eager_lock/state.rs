//! Per-inode state of replicate (GlusterFS's afr inode ctx): the eager
//! lock's window (phase, members, ranges in flight, failures, unstable
//! data), what heal and reads know about the inode, and the bounded map
//! of it by gfid.

use super::*;

/// Most inodes with state at once; beyond, idle ones are dropped.
pub const MAX_INODES: usize = 1 << 18;

/// Where an inode's eager lock is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not held.
    Unlocked,
    /// Someone is locking, doing a pre-op or post-op, or unlocking.
    Busy,
    /// Held.
    Held,
}

/// What AFR knows about one inode.
pub struct State {
    /// Children known stale, per [`Kind`].
    pub stale: [Mask; 3],
    /// Kinds found in split-brain (bit `1 << kind`), until healed.
    pub split: u8,
    /// The event generation `stale` was computed in (0: never).
    pub seen_gen: u64,
    /// Fds open on the inode through this AFR.
    pub local_open_fds: u32,
    /// The highest open fd count a brick reported.
    pub brick_open_fds: u32,
    /// A POSIX lock (lk) was sent for the inode through this AFR: flush
    /// must reach the bricks (features/locks drops the owner's locks there).
    pub posix_locked: bool,
    /// The eager lock.
    pub phase: Phase,
    /// The (client, lock owner) of the eager lock from the moment it is
    /// requested until it is released: contention upcalls name it.
    pub(super) owner: Option<(Arc<str>, u64)>,
    pub(super) held: Option<Held>,
    pub(super) changelog: Option<Changelog>,
    pub(super) in_flight: u32,
    pub(super) ranges: Vec<(u64, u64)>,
    pub(super) release: bool,
    pub(super) settling: u32,
    pub(super) inodelk_count: u32,
    pub(super) contended: bool,
    pub(super) txns: u64,
    pub(super) acquired_at: Instant,
    pub(super) idle_since: Instant,
    pub(super) deadline: Option<Instant>,
    pub(super) timer: bool,
    /// Writes finished under eager locks (a sequence number).
    pub(super) writes: u64,
    /// Writes known to be on stable storage on the children.
    pub(super) synced: u64,
}

impl State {
    pub(super) fn new() -> State {
        let now = Instant::now();
        State {
            stale: [0; 3],
            split: 0,
            seen_gen: 0,
            local_open_fds: 0,
            brick_open_fds: 0,
            posix_locked: false,
            phase: Phase::Unlocked,
            owner: None,
            held: None,
            changelog: None,
            in_flight: 0,
            ranges: Vec::new(),
            release: false,
            settling: 0,
            inodelk_count: 0,
            contended: false,
            txns: 0,
            acquired_at: now,
            idle_since: now,
            deadline: None,
            timer: false,
            writes: 0,
            synced: 0,
        }
    }

    pub(super) fn idle(&self) -> bool {
        self.phase == Phase::Unlocked && self.in_flight == 0 && self.local_open_fds == 0 && self.settling == 0
    }

    /// The blame a window not yet written carries.
    pub fn window_failed(&self) -> Mask {
        self.changelog.as_ref().map_or(0, |c| c.failed)
    }

    pub(super) fn view(&self, gfid: Gfid) -> LockView {
        LockView {
            gfid,
            held: self.phase != Phase::Unlocked,
            local_open_fds: self.local_open_fds,
            brick_open_fds: self.brick_open_fds,
            inodelk_count: self.inodelk_count,
            in_flight: self.in_flight,
            txns: self.txns,
            held_ms: u64::try_from(self.acquired_at.elapsed().as_millis()).unwrap_or(u64::MAX),
            contended: self.contended,
        }
    }

    pub(super) fn take_job(&mut self, why: Why) -> Job {
        self.phase = Phase::Busy;
        let unstable = self.take_unstable(None);
        Job { held: self.held.take(), changelog: self.changelog.take(), unstable, why }
    }

    /// True if writes may not be stable yet (not counting the first
    /// `synced_at` writes when an fsync just covered them); from here on
    /// they count as synced (the caller fsyncs them).
    pub(super) fn take_unstable(&mut self, synced_at: Option<u64>) -> bool {
        let synced = synced_at.map_or(self.synced, |n| n.max(self.synced));
        let unstable = self.writes > synced;
        self.synced = self.writes;
        unstable
    }
}

/// One inode's state and the wake-up for those waiting on its lock.
pub struct InodeState {
    /// The inode.
    pub gfid: Gfid,
    /// The state.
    pub s: Mutex<State>,
    pub(super) changed: Notify,
}

/// Gfid -> state, bounded.
pub struct Inodes {
    pub(super) map: Mutex<HashMap<Gfid, Arc<InodeState>>>,
}

impl Inodes {
    /// An empty map.
    pub fn new() -> Inodes {
        Inodes { map: Mutex::new(HashMap::new()) }
    }

    /// The state of `gfid`, if kept.
    pub fn get(&self, gfid: &Gfid) -> Option<Arc<InodeState>> {
        self.map.lock().get(gfid).cloned()
    }

    /// The state of `gfid`, created if needed; None when the map is full of
    /// inodes in use.
    pub fn get_or_insert(&self, gfid: Gfid) -> Option<Arc<InodeState>> {
        let mut m = self.map.lock();
        if let Some(s) = m.get(&gfid) {
            return Some(s.clone());
        }
        if m.len() >= MAX_INODES {
            m.retain(|_, st| Arc::strong_count(st) > 1 || !st.s.lock().idle());
            if m.len() >= MAX_INODES {
                return None;
            }
        }
        let st = Arc::new(InodeState { gfid, s: Mutex::new(State::new()), changed: Notify::new() });
        m.insert(gfid, st.clone());
        Some(st)
    }

    /// Drops the state of `gfid` if it is idle.
    pub fn forget(&self, gfid: &Gfid) {
        let mut m = self.map.lock();
        if m.get(gfid).is_some_and(|st| Arc::strong_count(st) == 1 && st.s.lock().idle()) {
            m.remove(gfid);
        }
    }

    /// Every state kept.
    pub fn all(&self) -> Vec<Arc<InodeState>> {
        self.map.lock().values().cloned().collect()
    }

    /// Number of inodes kept.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
}
