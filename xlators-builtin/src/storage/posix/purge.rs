//! Freeing unlinked files behind the unlink (CephFS's purge queue, the
//! chunk deletion MooseFS leaves to its chunkservers): when an unlink or a
//! rename over a file removes a regular file's last name and no fd is open
//! on it, its gfid handle (its last link) moves to `.glusterfs/unlink/`
//! and a thread of the brick drops it there later.
//!
//! Dropping the last link frees the inode's blocks: its data, and an
//! external xattr block where its xattrs do not fit in its inode (inodes
//! smaller than 256 bytes, or replicate's counters left raised); on a file
//! system mounted with `discard` each freed extent is a discard the unlink
//! waits for. Measured on this project's machine, when every file still
//! had such a block: a brick's UNLINK took 650 us, most of it in
//! `blkdev_issue_discard`, and `rm -rf` of 5000 files waited 1.3 s of its
//! 1.9 s for the bricks to drain. The rename out of the handle directory
//! frees nothing, and the file is unreachable from then on: its names are
//! gone and lookups by gfid look in `unlink/` only while an fd is open.
//!
//! Bounded: at most [`MAX_PENDING`] files wait; beyond, the unlink frees
//! its file itself. A fop that changes the file system and fails with
//! ENOSPC while files wait frees them all and runs again once (see
//! `posix.rs`). What waits when the
//! brick stops is dropped at its next start, with the files of fds open
//! at the stop (`handle.rs`'s `purge_parked`).

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
/// How long the purge thread waits for work before it ends.
const IDLE: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    /// Each parked file's gfid and inode number: a parked name found
    /// holding another inode (the gfid made again, then unlinked while
    /// open, parked over this one) is left alone.
    queue: VecDeque<(Gfid, u64)>,
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
            }),
        }
    }

    /// Whether a file may be queued now (false: the queue is full, the
    /// caller frees the file itself).
    pub fn has_room(&self) -> bool {
        let st = self.shared.st.lock();
        st.queue.len() < MAX_PENDING && !st.stop
    }

    /// Queues the parked handle of `g` (inode `ino`), freed in place when
    /// the queue filled up meanwhile.
    pub fn push(&self, g: Gfid, ino: u64) {
        let mut st = self.shared.st.lock();
        if st.queue.len() >= MAX_PENDING || st.stop {
            drop(st);
            self.shared.drop_parked(g, ino);
            return;
        }
        st.queue.push_back((g, ino));
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
        let queued: Vec<(Gfid, u64)> = self.shared.st.lock().queue.drain(..).collect();
        let n = queued.len();
        for (g, ino) in queued {
            self.shared.drop_parked(g, ino);
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

impl Shared {
    fn run(&self) {
        loop {
            let (g, ino) = {
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
            self.drop_parked(g, ino);
            self.st.lock().busy -= 1;
            self.pending.fetch_sub(1, Ordering::Relaxed);
            self.cv.notify_all();
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
