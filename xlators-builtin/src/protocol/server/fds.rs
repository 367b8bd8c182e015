//! One connection's fd table: the client's own [`FdId`]s mapped to
//! brick-unique ones (GlusterFS's per-client fdtable). Open, create and
//! opendir reserve a slot, which becomes usable when the open succeeds;
//! release and releasedir free it; every fd-based fop is translated, and an
//! fd the client does not have open is EBADF.

use std::collections::HashMap;

use xlfs_sdk::{Errno, Fd, FdId, Gfid};

/// An fd of the client's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Slot {
    /// The brick-unique id sent down.
    pub brick: FdId,
    /// Opened by opendir.
    pub dir: bool,
    /// The inode, when known (from the open's location, create's reply or
    /// a later fd-based fop).
    pub gfid: Gfid,
    /// The open succeeded; until then fops on it are EBADF.
    pub ready: bool,
}

/// The table, bounded by `max` fds.
#[derive(Debug)]
pub(super) struct FdTable {
    map: HashMap<FdId, Slot>,
    max: usize,
}

impl FdTable {
    pub(super) fn new(max: usize) -> FdTable {
        FdTable { map: HashMap::new(), max }
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Reserves `client` for an open in progress: EBADF if the client
    /// already uses that id, EMFILE when the table is full.
    pub(super) fn reserve(&mut self, client: FdId, brick: FdId, dir: bool, gfid: Gfid) -> Result<(), Errno> {
        if self.map.contains_key(&client) {
            return Err(Errno::EBADF);
        }
        if self.map.len() >= self.max {
            return Err(Errno::EMFILE);
        }
        self.map.insert(client, Slot { brick, dir, gfid, ready: false });
        Ok(())
    }

    /// Ends an open: the slot becomes usable, or goes if the open failed.
    pub(super) fn opened(&mut self, client: FdId, ok: bool, gfid: Gfid) {
        if !ok {
            self.map.remove(&client);
        } else if let Some(s) = self.map.get_mut(&client) {
            s.ready = true;
            if s.gfid.is_null() {
                s.gfid = gfid;
            }
        }
    }

    /// Frees an open fd for release / releasedir.
    pub(super) fn take(&mut self, client: FdId) -> Result<Slot, Errno> {
        match self.map.get(&client).copied() {
            Some(s) if s.ready => {
                self.map.remove(&client);
                Ok(s)
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// Rewrites `fd` to its brick id (learning its gfid if unknown).
    pub(super) fn translate(&mut self, fd: &mut Fd) -> Result<(), Errno> {
        match self.map.get_mut(&fd.id) {
            Some(s) if s.ready => {
                if s.gfid.is_null() {
                    s.gfid = fd.gfid;
                }
                fd.id = s.brick;
                Ok(())
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// Empties the table (the connection is gone), opens in progress
    /// included.
    pub(super) fn drain(&mut self) -> Vec<Slot> {
        self.map.drain().map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_life_cycle() {
        let mut t = FdTable::new(2);
        let g = Gfid([9; 16]);
        t.reserve(FdId(7), FdId(100), false, Gfid::NULL).expect("free");
        assert_eq!(t.reserve(FdId(7), FdId(101), false, Gfid::NULL), Err(Errno::EBADF), "in use");
        let mut fd = Fd { id: FdId(7), gfid: g };
        assert_eq!(t.translate(&mut fd), Err(Errno::EBADF), "open in progress");
        t.opened(FdId(7), true, Gfid::NULL);
        t.translate(&mut fd).expect("open");
        assert_eq!(fd.id, FdId(100));
        t.reserve(FdId(8), FdId(102), true, g).expect("free");
        assert_eq!(t.reserve(FdId(9), FdId(103), true, g), Err(Errno::EMFILE), "full");
        t.opened(FdId(8), false, g);
        assert_eq!(t.len(), 1, "failed open freed");
        let s = t.take(FdId(7)).expect("open");
        assert_eq!((s.brick, s.gfid), (FdId(100), g), "gfid learnt from a later fop");
        assert_eq!(t.take(FdId(7)), Err(Errno::EBADF));
    }
}
