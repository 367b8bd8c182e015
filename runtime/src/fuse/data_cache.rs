//! When the kernel's cached pages of a file are dropped.
//!
//! Files are opened with FOPEN_KEEP_CACHE (`keep-cache`), so the kernel
//! keeps a file's pages across opens. Changes made by another client reach
//! the mount as invalidation upcalls (`upcall`), which drop them. A change
//! the upcalls did not report (this mount's interest in the inode had
//! expired at the bricks, or the volume has no features/upcall) shows up
//! later as attributes whose mtime or size moved.
//!
//! The kernel's own FUSE_AUTO_INVAL_DATA drops the pages on such a change,
//! but it cannot tell a change made through this mount from another: after
//! a write it does not know the mtime the bricks gave the file, so the next
//! GETATTR looks like a foreign change and the file's whole page cache goes.
//! A database that overwrites pages in place then reads each of them back
//! from the bricks (pgbench did one brick READ per transaction).
//!
//! So with `auto-invalidation` the bridge does it instead, and the kernel is
//! not asked for FUSE_AUTO_INVAL_DATA: per regular file it remembers the
//! mtime and size it last gave the kernel and when this mount last changed
//! the file (a write, truncate, fallocate, copy or time change went
//! through it). Attributes that moved drop the file's pages unless this
//! mount changed the file within [`OWN_CHANGE_GRACE`]. Within that time
//! the attributes may still move for the mount's own writes: write-behind
//! answers a write with attributes it computes, and the bricks' own times
//! arrive later. A foreign change in that time is the upcalls' to report:
//! the mount, having just sent fops on the inode, is registered for them
//! at the bricks (for `cache-invalidation-timeout`, 600 s by default).
//! Entries live as long as the inode table holds the inode.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use xlfs_sdk::{FileType, Gfid, Iatt, Timespec};

/// How long after this mount changed a file moved attributes are taken to
/// be its own change.
pub(super) const OWN_CHANGE_GRACE: Duration = Duration::from_secs(30);

#[derive(Default)]
pub(super) struct DataVersions(Mutex<HashMap<Gfid, Seen>>);

struct Seen {
    mtime: Timespec,
    size: u64,
    /// When this mount last changed the file.
    own: Option<Instant>,
}

impl DataVersions {
    /// This mount is about to change `gfid`'s data or times.
    pub(super) fn changing(&self, gfid: Gfid) {
        if let Some(s) = self.0.lock().get_mut(&gfid) {
            s.own = Some(Instant::now());
        }
    }

    /// Attributes about to be given to the kernel: true when they show a
    /// change this mount did not make, so the file's cached pages are stale.
    pub(super) fn saw(&self, iatt: &Iatt) -> bool {
        self.saw_at(iatt, Instant::now())
    }

    fn saw_at(&self, iatt: &Iatt, now: Instant) -> bool {
        if iatt.gfid.is_null() || iatt.file_type() != FileType::Regular {
            return false;
        }
        let mut m = self.0.lock();
        let Some(s) = m.get_mut(&iatt.gfid) else {
            m.insert(iatt.gfid, Seen { mtime: iatt.mtime, size: iatt.size, own: None });
            return false;
        };
        if s.mtime == iatt.mtime && s.size == iatt.size {
            return false;
        }
        (s.mtime, s.size) = (iatt.mtime, iatt.size);
        s.own.is_none_or(|t| now.saturating_duration_since(t) > OWN_CHANGE_GRACE)
    }

    /// The inode left the inode table (and the kernel's cache).
    pub(super) fn forget(&self, gfid: Gfid) {
        self.0.lock().remove(&gfid);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Gfid = Gfid([7; 16]);

    fn file(mtime: i64, size: u64) -> Iatt {
        Iatt { gfid: G, mode: libc::S_IFREG | 0o644, size, mtime: Timespec { sec: mtime, nsec: 0 }, ..Iatt::default() }
    }

    #[test]
    fn own_changes_keep_the_pages_and_foreign_ones_drop_them() {
        let d = DataVersions::default();
        let t0 = Instant::now();
        assert!(!d.saw_at(&file(1, 10), t0), "first sight");
        assert!(!d.saw_at(&file(1, 10), t0), "unchanged");
        assert!(d.saw_at(&file(2, 10), t0), "mtime moved, no change of ours");
        assert!(d.saw_at(&file(2, 20), t0), "size moved, no change of ours");
        d.changing(G);
        let t1 = Instant::now();
        assert!(!d.saw_at(&file(2, 20), t1), "own change not visible yet");
        assert!(!d.saw_at(&file(3, 20), t1), "own write moved the mtime");
        assert!(!d.saw_at(&file(4, 20), t1 + OWN_CHANGE_GRACE / 2), "the bricks' time for it, later");
        let after = t1 + OWN_CHANGE_GRACE + Duration::from_secs(1);
        assert!(!d.saw_at(&file(4, 20), after), "unchanged");
        assert!(d.saw_at(&file(5, 20), after), "moved long after our last change");
        let dir = Iatt { mode: libc::S_IFDIR | 0o755, ..file(9, 1) };
        assert!(!d.saw_at(&dir, after), "directories have no pages here");
        d.forget(G);
        assert_eq!(d.len(), 0);
    }
}
