//! The fd table: the open files and directories of a mount or API client.
//! Each open gets an [`FdId`] that is never handed out again while it is
//! open (ids count up from 1; 0 is never used), mapped to what was opened.
//! The table has a capacity: opening past it fails with `EMFILE`.

use std::collections::HashMap;

use parking_lot::Mutex;
use xlfs_sdk::{Errno, FdId, Gfid};

/// What an fd is open on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdEntry {
    /// The inode.
    pub gfid: Gfid,
    /// The `O_*` open flags.
    pub flags: u32,
    /// True for an fd from opendir.
    pub is_dir: bool,
}

struct Inner {
    open: HashMap<u64, FdEntry>,
    next: u64,
}

/// Open fds by id, up to a capacity.
pub struct FdTable {
    inner: Mutex<Inner>,
    capacity: usize,
}

impl FdTable {
    /// A table holding at most `capacity` open fds.
    pub fn new(capacity: usize) -> FdTable {
        FdTable { inner: Mutex::new(Inner { open: HashMap::new(), next: 1 }), capacity }
    }

    /// Registers an open fd; `EMFILE` when the table is full.
    pub fn open(&self, entry: FdEntry) -> Result<FdId, Errno> {
        let mut t = self.inner.lock();
        if t.open.len() >= self.capacity {
            return Err(Errno::EMFILE);
        }
        // Skips ids still open (only possible after the counter wraps) and 0.
        let mut id = t.next;
        while id == 0 || t.open.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        t.next = id.wrapping_add(1);
        t.open.insert(id, entry);
        Ok(FdId(id))
    }

    /// What `id` is open on.
    pub fn get(&self, id: FdId) -> Option<FdEntry> {
        self.inner.lock().open.get(&id.0).copied()
    }

    /// Records the inode an fd turned out to be open on (a create that
    /// opened an existing file). Does nothing if `id` is not open.
    pub fn set_gfid(&self, id: FdId, gfid: Gfid) {
        if let Some(e) = self.inner.lock().open.get_mut(&id.0) {
            e.gfid = gfid;
        }
    }

    /// Closes `id`, returning what it was open on (`None` if it was not open).
    pub fn release(&self, id: FdId) -> Option<FdEntry> {
        self.inner.lock().open.remove(&id.0)
    }

    /// How many fds are open.
    pub fn len(&self) -> usize {
        self.inner.lock().open.len()
    }

    /// True when no fd is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when some fd is open on `gfid`.
    pub fn is_open_on(&self, gfid: Gfid) -> bool {
        self.inner.lock().open.values().any(|e| e.gfid == gfid)
    }

    /// Every open fd (for a graph switch, which reopens them by gfid).
    pub fn entries(&self) -> Vec<(FdId, FdEntry)> {
        self.inner.lock().open.iter().map(|(&id, &e)| (FdId(id), e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8, is_dir: bool) -> FdEntry {
        let mut g = [0u8; 16];
        g[0] = n;
        FdEntry { gfid: Gfid(g), flags: 2, is_dir }
    }

    #[test]
    fn open_get_release() {
        let t = FdTable::new(4);
        assert!(t.is_empty());
        let a = t.open(entry(1, false)).expect("a");
        let b = t.open(entry(2, true)).expect("b");
        assert_ne!(a, b);
        assert_ne!(a.0, 0);
        assert_eq!(t.get(b), Some(entry(2, true)));
        t.set_gfid(b, entry(5, true).gfid);
        assert_eq!(t.get(b), Some(entry(5, true)));
        t.set_gfid(b, entry(2, true).gfid);
        t.set_gfid(FdId(999), entry(5, true).gfid);
        assert_eq!(t.len(), 2);
        assert_eq!(t.release(a), Some(entry(1, false)));
        assert_eq!(t.release(a), None);
        assert_eq!(t.get(a), None);
        assert_eq!(t.entries(), vec![(b, entry(2, true))]);
    }

    #[test]
    fn capacity_gives_emfile_and_frees_on_release() {
        let t = FdTable::new(2);
        let a = t.open(entry(1, false)).expect("a");
        t.open(entry(2, false)).expect("b");
        assert_eq!(t.open(entry(3, false)), Err(Errno::EMFILE));
        t.release(a);
        let c = t.open(entry(3, false)).expect("room again");
        assert_ne!(c, a, "ids are not reused right away");
        assert_eq!(FdTable::new(0).open(entry(1, false)), Err(Errno::EMFILE));
    }

    #[test]
    fn ids_are_never_reused_while_open_even_after_wrap() {
        let t = FdTable::new(8);
        t.inner.lock().next = u64::MAX - 1;
        let a = t.open(entry(1, false)).expect("a");
        let b = t.open(entry(2, false)).expect("b");
        let c = t.open(entry(3, false)).expect("c");
        assert_eq!((a.0, b.0, c.0), (u64::MAX - 1, u64::MAX, 1), "0 is skipped");
        t.inner.lock().next = u64::MAX - 1;
        let d = t.open(entry(4, false)).expect("d");
        assert_eq!(d.0, 2, "open ids are skipped");
    }
}
