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
//! mtime and size it last gave the kernel and whether this mount changed
//! the file since (a write, truncate, fallocate, copy or time change went
//! through it). Attributes that moved with no such change of its own drop
//! the file's pages. A foreign change racing one of this mount's own is
//! not seen here; it is the upcall's to report, and this mount, being
//! active on the inode, is registered for it. Entries live as long as the
//! inode table holds the inode.

use std::collections::HashMap;

use parking_lot::Mutex;
use xlfs_sdk::{FileType, Gfid, Iatt, Timespec};

#[derive(Default)]
pub(super) struct DataVersions(Mutex<HashMap<Gfid, Seen>>);

struct Seen {
    mtime: Timespec,
    size: u64,
    /// This mount changed the file since the kernel was last given its
    /// attributes.
    own: bool,
}

impl DataVersions {
    /// This mount is about to change `gfid`'s data or times.
    pub(super) fn changing(&self, gfid: Gfid) {
        if let Some(s) = self.0.lock().get_mut(&gfid) {
            s.own = true;
        }
    }

    /// Attributes about to be given to the kernel: true when they show a
    /// change this mount did not make, so the file's cached pages are stale.
    pub(super) fn saw(&self, iatt: &Iatt) -> bool {
        if iatt.gfid.is_null() || iatt.file_type() != FileType::Regular {
            return false;
        }
        let mut m = self.0.lock();
        let Some(s) = m.get_mut(&iatt.gfid) else {
            m.insert(iatt.gfid, Seen { mtime: iatt.mtime, size: iatt.size, own: false });
            return false;
        };
        if s.mtime == iatt.mtime && s.size == iatt.size {
            return false;
        }
        let foreign = !s.own;
        *s = Seen { mtime: iatt.mtime, size: iatt.size, own: false };
        foreign
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
        assert!(!d.saw(&file(1, 10)), "first sight");
        assert!(!d.saw(&file(1, 10)), "unchanged");
        d.changing(G);
        assert!(!d.saw(&file(1, 10)), "own change not visible yet");
        assert!(!d.saw(&file(2, 10)), "own write moved the mtime");
        assert!(d.saw(&file(3, 10)), "moved again with no write of ours");
        assert!(d.saw(&file(3, 20)), "size moved");
        let dir = Iatt { mode: libc::S_IFDIR | 0o755, ..file(9, 1) };
        assert!(!d.saw(&dir), "directories have no pages here");
        d.forget(G);
        assert_eq!(d.len(), 0);
    }
}
