//! The inode table the FUSE bridge keeps: which inodes the kernel knows
//! (by gfid and by the FUSE node id handed to the kernel), how many lookups
//! the kernel holds on each (`nlookup`, released by `forget`), and a cache
//! of directory entries (parent gfid, name) -> gfid.
//!
//! The root is always present and never evicted. An inode whose `nlookup`
//! drops to zero stays cached on a least-recently-used list; past the
//! table's LRU limit the oldest such inode is evicted along with the
//! entries that name it. Inodes the kernel still holds are bounded by the
//! kernel; the rest by the limit.
//!
//! Node ids are the kernel's inode numbers too (FUSE reports a node's id as
//! its `st_ino`), so an inode's node id is derived from its gfid
//! ([`Gfid::ino`], the root is 1): `stat` shows the same number after the
//! inode was evicted and looked up again, as on the bricks. If that number
//! is taken by another cached inode (or is 0 or 1), a free one is chosen
//! instead; two cached inodes never share a node id.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use xlfs_sdk::Gfid;

/// The FUSE node id of the root.
pub const ROOT_NODEID: u64 = 1;

/// An inode as the bridge knows it.
#[derive(Debug, PartialEq, Eq)]
pub struct Inode {
    gfid: Gfid,
    nodeid: u64,
}

impl Inode {
    /// The inode's gfid.
    pub fn gfid(&self) -> Gfid {
        self.gfid
    }
    /// The node id given to the kernel for it (never shared with another
    /// cached inode; derived from the gfid when free, see the module doc).
    pub fn nodeid(&self) -> u64 {
        self.nodeid
    }
}

/// Why the table refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InodeError {
    /// A reply carried the null gfid.
    #[error("reply for '{name}' carries the null gfid")]
    NullGfid {
        /// The entry name.
        name: String,
    },
}

struct Entry {
    inode: Arc<Inode>,
    nlookup: u64,
    /// The dentries naming this inode.
    names: Vec<(Gfid, Arc<str>)>,
    /// Position on the LRU list while `nlookup` is zero.
    lru_tick: Option<u64>,
}

struct Inner {
    inodes: HashMap<Gfid, Entry>,
    by_nodeid: HashMap<u64, Gfid>,
    dentries: HashMap<(Gfid, Arc<str>), Gfid>,
    /// Unreferenced inodes by age (oldest first).
    lru: BTreeMap<u64, Gfid>,
    next_tick: u64,
}

/// The inode table: see the module documentation.
pub struct InodeTable {
    inner: Mutex<Inner>,
    root: Arc<Inode>,
    lru_limit: usize,
}

impl InodeTable {
    /// A table holding the root, keeping at most `lru_limit` inodes the
    /// kernel has forgotten.
    pub fn new(lru_limit: usize) -> InodeTable {
        let root_inode = Arc::new(Inode { gfid: Gfid::ROOT, nodeid: ROOT_NODEID });
        let root = Entry { inode: root_inode.clone(), nlookup: 0, names: Vec::new(), lru_tick: None };
        let inner = Inner {
            inodes: HashMap::from([(Gfid::ROOT, root)]),
            by_nodeid: HashMap::from([(ROOT_NODEID, Gfid::ROOT)]),
            dentries: HashMap::new(),
            lru: BTreeMap::new(),
            next_tick: 0,
        };
        InodeTable { inner: Mutex::new(inner), root: root_inode, lru_limit }
    }

    /// The root inode.
    pub fn root(&self) -> Arc<Inode> {
        self.root.clone()
    }

    /// Records a reply that hands `name` under `parent` to the kernel as
    /// `gfid` (lookup, create, mkdir, mknod, symlink, link, readdirplus):
    /// the inode's `nlookup` grows by one and the entry is cached (replacing
    /// what the name pointed to before).
    pub fn lookup_reply(&self, parent: Gfid, name: &str, gfid: Gfid) -> Result<Arc<Inode>, InodeError> {
        if gfid.is_null() {
            return Err(InodeError::NullGfid { name: name.to_string() });
        }
        let mut t = self.inner.lock();
        let inode = t.reference(gfid);
        let key: (Gfid, Arc<str>) = (parent, Arc::from(name));
        if t.dentries.get(&key) != Some(&gfid) {
            t.unlink_key(&key);
            if let Some(e) = t.inodes.get_mut(&gfid) {
                e.names.push(key.clone());
            }
            t.dentries.insert(key, gfid);
        }
        Ok(inode)
    }

    /// Records a reply that hands an inode to the kernel by gfid alone (no
    /// entry): its `nlookup` grows by one.
    pub fn lookup_gfid_reply(&self, gfid: Gfid) -> Result<Arc<Inode>, InodeError> {
        if gfid.is_null() {
            return Err(InodeError::NullGfid { name: String::new() });
        }
        Ok(self.inner.lock().reference(gfid))
    }

    /// The kernel forgets `n` lookups of `nodeid`. At zero the inode goes on
    /// the LRU list (the root stays). Unknown node ids are ignored. Returns
    /// the gfids evicted to keep the LRU list within its limit (the caller
    /// tells the graph to forget them).
    pub fn forget(&self, nodeid: u64, n: u64) -> Vec<Gfid> {
        let mut guard = self.inner.lock();
        let t = &mut *guard;
        let Some(e) = t.by_nodeid.get(&nodeid).and_then(|g| t.inodes.get_mut(g)) else { return Vec::new() };
        e.nlookup = e.nlookup.saturating_sub(n);
        if e.nlookup > 0 || e.inode.gfid == Gfid::ROOT || e.lru_tick.is_some() {
            return Vec::new();
        }
        e.lru_tick = Some(t.next_tick);
        t.lru.insert(t.next_tick, e.inode.gfid);
        t.next_tick += 1;
        let mut evicted = Vec::new();
        while t.lru.len() > self.lru_limit {
            let Some((_, old)) = t.lru.pop_first() else { break };
            t.evict(old);
            evicted.push(old);
        }
        evicted
    }

    /// The inode with this gfid, if cached.
    pub fn get(&self, gfid: Gfid) -> Option<Arc<Inode>> {
        self.inner.lock().inodes.get(&gfid).map(|e| e.inode.clone())
    }

    /// The inode the kernel knows as `nodeid`.
    pub fn by_nodeid(&self, nodeid: u64) -> Option<Arc<Inode>> {
        let t = self.inner.lock();
        t.by_nodeid.get(&nodeid).and_then(|g| t.inodes.get(g)).map(|e| e.inode.clone())
    }

    /// The cached entry `name` under `parent`.
    pub fn resolve(&self, parent: Gfid, name: &str) -> Option<Gfid> {
        self.inner.lock().dentries.get(&(parent, Arc::from(name))).copied()
    }

    /// How many lookups the kernel holds on `gfid` (0 if unknown).
    pub fn nlookup(&self, gfid: Gfid) -> u64 {
        self.inner.lock().inodes.get(&gfid).map_or(0, |e| e.nlookup)
    }

    /// Drops the cached entry after an unlink.
    pub fn unlink(&self, parent: Gfid, name: &str) {
        self.inner.lock().unlink_key(&(parent, Arc::from(name)));
    }

    /// Drops the cached entry after an rmdir, and every entry cached under
    /// the removed directory.
    pub fn rmdir(&self, parent: Gfid, name: &str) {
        let mut t = self.inner.lock();
        if let Some(dir) = t.unlink_key(&(parent, Arc::from(name))) {
            let under: Vec<(Gfid, Arc<str>)> = t.dentries.keys().filter(|(p, _)| *p == dir).cloned().collect();
            for key in under {
                t.unlink_key(&key);
            }
        }
    }

    /// Moves the cached entry after a rename; what `new_name` named before
    /// is dropped. If the old entry was not cached, both names are dropped.
    pub fn rename(&self, old_parent: Gfid, old_name: &str, new_parent: Gfid, new_name: &str) {
        let mut t = self.inner.lock();
        let moved = t.unlink_key(&(old_parent, Arc::from(old_name)));
        let new_key: (Gfid, Arc<str>) = (new_parent, Arc::from(new_name));
        t.unlink_key(&new_key);
        if let Some(gfid) = moved
            && let Some(e) = t.inodes.get_mut(&gfid)
        {
            e.names.push(new_key.clone());
            t.dentries.insert(new_key, gfid);
        }
    }

    /// The cached entries naming `gfid`, as (parent gfid, name).
    pub fn names(&self, gfid: Gfid) -> Vec<(Gfid, Arc<str>)> {
        self.inner.lock().inodes.get(&gfid).map(|e| e.names.clone()).unwrap_or_default()
    }

    /// The cached entries naming `gfid` other than (`parent`, `name`).
    pub fn other_names(&self, gfid: Gfid, parent: Gfid, name: &str) -> Vec<(Gfid, Arc<str>)> {
        let t = self.inner.lock();
        let Some(e) = t.inodes.get(&gfid) else { return Vec::new() };
        e.names.iter().filter(|(p, n)| (*p, &**n) != (parent, name)).cloned().collect()
    }

    /// The names cached under the directory `dir`.
    pub fn children(&self, dir: Gfid) -> Vec<Arc<str>> {
        self.inner.lock().dentries.keys().filter(|(p, _)| *p == dir).map(|(_, n)| n.clone()).collect()
    }

    /// Every cached inode's node id (for invalidating them all).
    pub fn nodeids(&self) -> Vec<u64> {
        self.inner.lock().by_nodeid.keys().copied().collect()
    }

    /// How many inodes are cached (the root included).
    pub fn len(&self) -> usize {
        self.inner.lock().inodes.len()
    }

    /// Always false: the root is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// How many cached inodes the kernel has forgotten.
    pub fn lru_len(&self) -> usize {
        self.inner.lock().lru.len()
    }
}

impl Inner {
    /// Finds or creates the inode and adds one lookup.
    fn reference(&mut self, gfid: Gfid) -> Arc<Inode> {
        let by_nodeid = &mut self.by_nodeid;
        let e = self.inodes.entry(gfid).or_insert_with(|| {
            let mut nodeid = gfid.ino();
            while nodeid <= ROOT_NODEID || by_nodeid.contains_key(&nodeid) {
                // Taken (or reserved): step to another number, the same
                // sequence for the same gfid.
                nodeid = nodeid.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            }
            by_nodeid.insert(nodeid, gfid);
            Entry { inode: Arc::new(Inode { gfid, nodeid }), nlookup: 0, names: Vec::new(), lru_tick: None }
        });
        e.nlookup = e.nlookup.saturating_add(1);
        if let Some(tick) = e.lru_tick.take() {
            self.lru.remove(&tick);
        }
        e.inode.clone()
    }

    /// Removes a dentry; returns the gfid it named.
    fn unlink_key(&mut self, key: &(Gfid, Arc<str>)) -> Option<Gfid> {
        let gfid = self.dentries.remove(key)?;
        if let Some(e) = self.inodes.get_mut(&gfid) {
            e.names.retain(|n| n != key);
        }
        Some(gfid)
    }

    /// Drops an inode and the entries naming it.
    fn evict(&mut self, gfid: Gfid) {
        if let Some(e) = self.inodes.remove(&gfid) {
            self.by_nodeid.remove(&e.inode.nodeid);
            for key in e.names {
                self.dentries.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gfid(n: u8) -> Gfid {
        let mut b = [0u8; 16];
        b[0] = n;
        Gfid(b)
    }

    #[test]
    fn root_is_pinned() {
        let t = InodeTable::new(0);
        let root = t.root();
        assert_eq!((root.gfid(), root.nodeid()), (Gfid::ROOT, ROOT_NODEID));
        t.lookup_gfid_reply(Gfid::ROOT).expect("root");
        t.forget(ROOT_NODEID, 5);
        assert_eq!(t.nlookup(Gfid::ROOT), 0);
        assert_eq!(t.by_nodeid(ROOT_NODEID).map(|i| i.gfid()), Some(Gfid::ROOT));
        assert_eq!((t.len(), t.lru_len()), (1, 0));
    }

    #[test]
    fn lookups_count_and_forget_to_zero_keeps_then_evicts() {
        let t = InodeTable::new(1);
        let a = t.lookup_reply(Gfid::ROOT, "a", gfid(1)).expect("a");
        let again = t.lookup_reply(Gfid::ROOT, "a", gfid(1)).expect("a");
        assert!(Arc::ptr_eq(&a, &again));
        assert_ne!(a.nodeid(), ROOT_NODEID);
        assert_eq!(t.nlookup(gfid(1)), 2);
        t.forget(a.nodeid(), 1);
        assert_eq!(t.nlookup(gfid(1)), 1);
        assert_eq!(t.lru_len(), 0);
        t.forget(a.nodeid(), 1);
        assert_eq!(t.nlookup(gfid(1)), 0);
        // Forgotten but cached (limit 1): still resolvable.
        assert_eq!(t.lru_len(), 1);
        assert_eq!(t.resolve(Gfid::ROOT, "a"), Some(gfid(1)));
        // A new lookup takes it off the LRU with the same node id.
        let back = t.lookup_reply(Gfid::ROOT, "a", gfid(1)).expect("a");
        assert_eq!(back.nodeid(), a.nodeid());
        assert_eq!(t.lru_len(), 0);
        // Forgetting more than held saturates at zero.
        t.forget(a.nodeid(), 10);
        assert_eq!(t.nlookup(gfid(1)), 0);
        // Unknown node ids are ignored.
        t.forget(9999, 1);
        assert_eq!(t.lookup_reply(Gfid::ROOT, "z", Gfid::NULL), Err(InodeError::NullGfid { name: "z".into() }));
    }

    #[test]
    fn lru_bound_evicts_oldest_with_its_entries() {
        let t = InodeTable::new(2);
        let ids: Vec<u64> =
            (1..=4).map(|n| t.lookup_reply(Gfid::ROOT, &format!("f{n}"), gfid(n)).expect("lookup").nodeid()).collect();
        assert_eq!(t.len(), 5);
        for id in &ids {
            t.forget(*id, 1);
        }
        assert_eq!(t.lru_len(), 2);
        assert_eq!(t.len(), 3);
        assert!(t.get(gfid(1)).is_none() && t.get(gfid(2)).is_none());
        assert!(t.by_nodeid(ids[0]).is_none());
        assert_eq!(t.resolve(Gfid::ROOT, "f1"), None);
        assert_eq!(t.resolve(Gfid::ROOT, "f4"), Some(gfid(4)));
        // A re-lookup gets the same node id back (it is the gfid's inode
        // number), one no cached inode has.
        let again = t.lookup_reply(Gfid::ROOT, "f1", gfid(1)).expect("lookup");
        assert_eq!(again.nodeid(), ids[0]);
        // Referenced inodes are never evicted, whatever the limit.
        let t = InodeTable::new(0);
        for n in 1..=10 {
            t.lookup_reply(Gfid::ROOT, &format!("f{n}"), gfid(n)).expect("lookup");
        }
        assert_eq!(t.len(), 11);
    }

    #[test]
    fn nodeids_come_from_gfids_and_never_collide() {
        let with_ino = |hi: u8, ino: u64| {
            let mut b = [hi; 16];
            b[8..].copy_from_slice(&ino.to_be_bytes());
            Gfid(b)
        };
        let t = InodeTable::new(0);
        let a = t.lookup_reply(Gfid::ROOT, "a", with_ino(1, 77)).expect("a");
        assert_eq!(a.nodeid(), 77);
        // Same inode number, other gfid: another id.
        let b = t.lookup_reply(Gfid::ROOT, "b", with_ino(2, 77)).expect("b");
        assert_ne!(b.nodeid(), 77);
        // Reserved numbers are never handed out.
        let z = t.lookup_reply(Gfid::ROOT, "z", with_ino(3, 1)).expect("z");
        assert!(z.nodeid() > ROOT_NODEID);
        // Evicted and looked up again: the same number.
        assert_eq!(t.forget(a.nodeid(), 1), vec![with_ino(1, 77)]);
        assert_eq!(t.lookup_reply(Gfid::ROOT, "a", with_ino(1, 77)).expect("a").nodeid(), 77);
        assert_eq!(t.names(with_ino(1, 77)), vec![(Gfid::ROOT, Arc::from("a"))]);
        let mut kids = t.children(Gfid::ROOT);
        kids.sort();
        assert_eq!(kids, vec![Arc::from("a"), Arc::from("b"), Arc::from("z")]);
        assert_eq!(t.nodeids().len(), 4);
    }

    #[test]
    fn unlink_and_rmdir_invalidate_entries() {
        let t = InodeTable::new(10);
        t.lookup_reply(Gfid::ROOT, "f", gfid(1)).expect("f");
        t.lookup_reply(Gfid::ROOT, "d", gfid(2)).expect("d");
        t.lookup_reply(gfid(2), "inner", gfid(3)).expect("inner");
        t.unlink(Gfid::ROOT, "f");
        assert_eq!(t.resolve(Gfid::ROOT, "f"), None);
        assert_eq!(t.nlookup(gfid(1)), 1, "the kernel still holds the inode");
        t.rmdir(Gfid::ROOT, "d");
        assert_eq!(t.resolve(Gfid::ROOT, "d"), None);
        assert_eq!(t.resolve(gfid(2), "inner"), None);
    }

    #[test]
    fn rename_moves_and_replaces_entries() {
        let t = InodeTable::new(10);
        t.lookup_reply(Gfid::ROOT, "a", gfid(1)).expect("a");
        t.lookup_reply(Gfid::ROOT, "b", gfid(2)).expect("b");
        t.rename(Gfid::ROOT, "a", gfid(9), "b2");
        assert_eq!(t.resolve(Gfid::ROOT, "a"), None);
        assert_eq!(t.resolve(gfid(9), "b2"), Some(gfid(1)));
        // Over an existing name: the old target's entry goes.
        t.rename(gfid(9), "b2", Gfid::ROOT, "b");
        assert_eq!(t.resolve(Gfid::ROOT, "b"), Some(gfid(1)));
        // Unknown source: the destination name is dropped.
        t.rename(Gfid::ROOT, "ghost", Gfid::ROOT, "b");
        assert_eq!(t.resolve(Gfid::ROOT, "b"), None);
        // Evicting gfid(1) after its entries moved leaves no stale entry.
        let t = InodeTable::new(0);
        let a = t.lookup_reply(Gfid::ROOT, "a", gfid(1)).expect("a");
        t.rename(Gfid::ROOT, "a", Gfid::ROOT, "c");
        t.forget(a.nodeid(), 1);
        assert_eq!(t.resolve(Gfid::ROOT, "c"), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_name_pointing_elsewhere_is_replaced() {
        let t = InodeTable::new(0);
        let old = t.lookup_reply(Gfid::ROOT, "x", gfid(1)).expect("x");
        t.lookup_reply(Gfid::ROOT, "x", gfid(2)).expect("x again");
        assert_eq!(t.resolve(Gfid::ROOT, "x"), Some(gfid(2)));
        t.forget(old.nodeid(), 1);
        assert!(t.get(gfid(1)).is_none());
        assert_eq!(t.resolve(Gfid::ROOT, "x"), Some(gfid(2)));
    }
}
