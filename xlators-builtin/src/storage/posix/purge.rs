//! Freeing unlinked files behind the unlink (CephFS's purge queue, the
//! chunk deletion MooseFS leaves to its chunkservers): when an unlink or a
//! rename over a file removes a regular file's last name and no fd is open
//! on it, a thread of the brick frees it later.
//!
//! Dropping an inode's last reference frees its blocks: its data, and an
//! external xattr block where its xattrs do not fit in its inode (inodes
//! smaller than 256 bytes, or replicate's counters left raised); on a file
//! system mounted with `discard` each freed extent is a discard the unlink
//! waits for. Measured on this project's machine, when every file still
//! had such a block: a brick's UNLINK took 650 us, most of it in
//! `blkdev_issue_discard`, and `rm -rf` of 5000 files waited 1.3 s of its
//! 1.9 s for the bricks to drain.
//!
//! Two ways to leave the freeing to the thread, both unreachable by name
//! or gfid from then on:
//! - **Held** (while fewer than [`MAX_HELD`], or an eighth of the
//!   open-file limit, are; unlinks running at once on several threads may
//!   each take the last place): the unlink opens the gfid handle (its
//!   last link) `O_PATH`, removes it, and queues the descriptor; the
//!   thread's close is the inode's last reference. One directory
//!   operation per file (the handle's removal) and none for the thread.
//!   When the brick exits, however it exits, the kernel closes what is
//!   queued and so frees the files; only a crash of the machine leaves
//!   their inodes linkless, for a journaled ext4 or XFS to free when it
//!   is mounted again (its orphan list), or for `e2fsck` on an ext4
//!   without a journal.
//! - **Parked**: the handle moves to `.glusterfs/unlink/` and the thread
//!   removes it there; what waits when the brick stops is dropped at its
//!   next start, with the files of fds open at the stop (`handle.rs`'s
//!   `purge_parked`). Two directory operations more per file and one
//!   for the thread (held instead: `rm -rf` of 5000 files in 0.95 s
//!   against 1.04 s at 12 % less CPU of mount and bricks, six alternated
//!   pairs; benches/RESULTS.md).
//!
//! An open by gfid and a link of the inode take the inode lock the unlink
//! holds, so neither finds the file between the unlink's check of its
//! links and the handle's removal.
//!
//! Bounded: at most [`MAX_PENDING`] files wait; beyond, the unlink frees
//! its file itself. A fop that changes the file system and fails with
//! ENOSPC while files wait frees them all and runs again once (see
//! `posix.rs`).

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use xlfs_sdk::{Errno, Gfid};

use super::handle::parked_rel;
use super::sys;

/// Most files waiting to be freed.
pub(crate) const MAX_PENDING: usize = 65536;
/// Most of them kept by a descriptor (each one counts against the
/// process's open-file limit, of which they take an eighth at most).
pub(crate) const MAX_HELD: usize = 1024;

/// A file left to the purge thread.
pub(crate) enum Work {
    /// Its handle parked in `unlink/`, and its inode number: a parked name
    /// found holding another inode (the gfid made again, then unlinked
    /// while open, parked over this one) is left alone.
    Parked(Gfid, u64),
    /// A descriptor of the inode, whose links are all gone.
    Held(OwnedFd),
}

/// How long the purge thread waits for work before it ends.
const IDLE: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    /// What waits, in the order it came.
    queue: VecDeque<Work>,
    /// A purge thread runs.
    running: bool,
    /// The brick is going away: the thread ends.
    stop: bool,
    /// Tests: the thread frees nothing while set.
    paused: bool,
    /// Files taken from the queue and not freed yet.
    busy: usize,
}

struct Shared {
    /// `.glusterfs` of the brick.
    gfs: OwnedFd,
    st: Mutex<State>,
    cv: Condvar,
    /// Files queued, or taken from the queue and not freed yet, read
    /// without the lock: every fop of the brick asks.
    pending: AtomicUsize,
    /// Of those, the ones kept by a descriptor.
    held: AtomicUsize,
    /// How many may be ([`MAX_HELD`], or an eighth of the open-file limit).
    max_held: usize,
}

/// The brick's queue of parked handles to drop, and its thread.
pub(crate) struct Purger {
    shared: Arc<Shared>,
}

impl Purger {
    /// A purger for the handle directory `gfs` (a descriptor of its own).
    pub fn new(gfs: OwnedFd) -> Purger {
        Purger {
            shared: Arc::new(Shared {
                gfs,
                st: Mutex::new(State::default()),
                cv: Condvar::new(),
                pending: AtomicUsize::new(0),
                held: AtomicUsize::new(0),
                // Read once: the brick raises its limit before it builds
                // its graph (`raise_open_file_limit`).
                max_held: MAX_HELD.min(open_file_limit() / 8),
            }),
        }
    }

    /// Whether a file may be queued now (false: the queue is full, the
    /// caller frees the file itself).
    pub fn has_room(&self) -> bool {
        let st = self.shared.st.lock();
        st.queue.len() < MAX_PENDING && !st.stop
    }

    /// Whether a file may be queued as a descriptor now (false: park it).
    pub fn can_hold(&self) -> bool {
        self.shared.held.load(Ordering::Relaxed) < self.shared.max_held
    }

    /// Queues a file, freed in place when the queue filled up meanwhile.
    pub fn push(&self, w: Work) {
        let mut st = self.shared.st.lock();
        if st.queue.len() >= MAX_PENDING || st.stop {
            drop(st);
            self.shared.free(w);
            return;
        }
        if matches!(w, Work::Held(_)) {
            self.shared.held.fetch_add(1, Ordering::Relaxed);
        }
        st.queue.push_back(w);
        self.shared.pending.fetch_add(1, Ordering::Relaxed);
        if st.running {
            drop(st);
            self.shared.cv.notify_one();
            return;
        }
        st.running = true;
        drop(st);
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new().name("xlfs-purge".into()).spawn(move || shared.run());
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the purge thread; freeing unlinked files in place");
            self.shared.st.lock().running = false;
            self.now();
        }
    }

    /// How many files wait (or are being freed).
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Relaxed)
    }

    /// Frees every waiting file now, on the calling thread, and waits for
    /// the one the thread may be freeing.
    pub fn now(&self) {
        let queued: Vec<Work> = self.shared.st.lock().queue.drain(..).collect();
        let n = queued.len();
        for w in queued {
            self.shared.taken(w);
        }
        self.shared.pending.fetch_sub(n, Ordering::Relaxed);
        let mut st = self.shared.st.lock();
        while st.busy > 0 {
            self.shared.cv.wait_for(&mut st, Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
impl Purger {
    /// How many files may wait kept by a descriptor.
    pub fn max_held(&self) -> usize {
        self.shared.max_held
    }

    /// How many files wait kept by a descriptor.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::Relaxed)
    }

    /// Stops (or lets go on) the thread's freeing.
    pub fn pause(&self, on: bool) {
        self.shared.st.lock().paused = on;
        self.shared.cv.notify_all();
    }
}

impl Drop for Purger {
    fn drop(&mut self) {
        self.shared.st.lock().stop = true;
        self.shared.cv.notify_all();
    }
}

/// The process's soft limit on open files.
fn open_file_limit() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}

impl Shared {
    fn run(&self) {
        loop {
            let w = {
                let mut st = self.st.lock();
                loop {
                    if st.stop {
                        st.running = false;
                        return;
                    }
                    if !st.paused
                        && let Some(next) = st.queue.pop_front()
                    {
                        st.busy += 1;
                        break next;
                    }
                    if self.cv.wait_for(&mut st, IDLE).timed_out() && st.queue.is_empty() {
                        st.running = false;
                        return;
                    }
                }
            };
            self.taken(w);
            self.st.lock().busy -= 1;
            self.pending.fetch_sub(1, Ordering::Relaxed);
            self.cv.notify_all();
        }
    }

    /// Frees a file taken from the queue.
    fn taken(&self, w: Work) {
        if matches!(w, Work::Held(_)) {
            self.held.fetch_sub(1, Ordering::Relaxed);
        }
        self.free(w);
    }

    fn free(&self, w: Work) {
        match w {
            Work::Parked(g, ino) => self.drop_parked(g, ino),
            // The inode's last reference: closing it frees the file.
            Work::Held(fd) => drop(fd),
        }
    }

    fn drop_parked(&self, g: Gfid, ino: u64) {
        let h = parked_rel(&g);
        match sys::fstatat(self.gfs.as_fd(), &h, 0) {
            Ok(st) if st.st_ino == ino => {}
            _ => return,
        }
        match sys::unlinkat(self.gfs.as_fd(), &h, 0) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => tracing::warn!(gfid = %g, error = %e, "cannot free an unlinked file (dropped at the next start)"),
        }
    }
}
