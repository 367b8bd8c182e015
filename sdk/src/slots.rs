//! Per-inode and per-fd context slots: where a translator keeps its own state
//! for an inode (by [`Gfid`]) or an open fd (by [`FdId`]), GlusterFS's
//! `inode_ctx_set` / `fd_ctx_set`.
//!
//! A slot map belongs to one translator instance. The translator removes an
//! entry when it sees [`Fop::Forget`](crate::Fop::Forget) for the inode or
//! [`Fop::Release`](crate::Fop::Release) for the fd, so the map stays bounded
//! by what the caller keeps alive. A capacity bounds it regardless: inserting
//! past it fails with ENOMEM rather than growing without limit.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use parking_lot::Mutex;

use crate::errno::Errno;
use crate::types::{FdId, Gfid};

const SHARDS: usize = 16;

/// A map keyed by ids a counter hands out (frames, calls, timers), hashed
/// with [`IdHasher`].
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The hash of a counter-issued id: one multiplication (Fibonacci hashing)
/// spreads consecutive ids over the table. Not for keys a peer chooses:
/// it gives no protection against collisions made on purpose.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A sharded concurrent map with a capacity.
pub struct Slots<K, V> {
    shards: Box<[Mutex<HashMap<K, V>>]>,
    cap_per_shard: usize,
}

/// Per-inode context.
pub type InodeSlots<V> = Slots<Gfid, V>;
/// Per-fd context.
pub type FdSlots<V> = Slots<FdId, V>;

/// Keys a slot map can shard on.
pub trait SlotKey: Hash + Eq + Copy {
    /// A well-mixed number used to pick the shard.
    fn shard(&self) -> usize;
}

impl SlotKey for Gfid {
    fn shard(&self) -> usize {
        self.0[15] as usize ^ self.0[7] as usize
    }
}

impl SlotKey for FdId {
    fn shard(&self) -> usize {
        self.0 as usize
    }
}

impl<K: SlotKey, V> Slots<K, V> {
    /// A map holding at most about `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect();
        Slots { shards, cap_per_shard: capacity.div_ceil(SHARDS).max(1) }
    }

    fn shard(&self, k: &K) -> &Mutex<HashMap<K, V>> {
        &self.shards[k.shard() % SHARDS]
    }

    /// Sets the value, failing with ENOMEM when the map is full.
    pub fn insert(&self, k: K, v: V) -> Result<Option<V>, Errno> {
        let mut m = self.shard(&k).lock();
        if m.len() >= self.cap_per_shard && !m.contains_key(&k) {
            return Err(Errno::ENOMEM);
        }
        Ok(m.insert(k, v))
    }

    /// Runs `f` on the value, if there is one.
    pub fn with<R>(&self, k: &K, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        self.shard(k).lock().get_mut(k).map(f)
    }

    /// Runs `f` on the value, creating it with `init` first if absent.
    pub fn with_or_insert<R>(&self, k: K, init: impl FnOnce() -> V, f: impl FnOnce(&mut V) -> R) -> Result<R, Errno> {
        let mut m = self.shard(&k).lock();
        if !m.contains_key(&k) {
            if m.len() >= self.cap_per_shard {
                return Err(Errno::ENOMEM);
            }
            m.insert(k, init());
        }
        m.get_mut(&k).map(f).ok_or(Errno::ENOMEM)
    }

    /// A copy of the value.
    pub fn get(&self, k: &K) -> Option<V>
    where
        V: Clone,
    {
        self.shard(k).lock().get(k).cloned()
    }

    /// Removes and returns the value.
    pub fn remove(&self, k: &K) -> Option<V> {
        self.shard(k).lock().remove(k)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry for which `keep` returns false.
    pub fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        for s in self.shards.iter() {
            s.lock().retain(|k, v| keep(k, v));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counter_ids_spread_over_an_id_map() {
        use std::hash::BuildHasher;
        let h = BuildHasherDefault::<IdHasher>::default();
        // Consecutive ids differ in their top 7 bits (hashbrown's tag) as
        // well as in their low bits (the bucket).
        let tags: std::collections::HashSet<u64> = (1..=128u64).map(|id| h.hash_one(id) >> 57).collect();
        assert!(tags.len() > 64, "{} distinct tags", tags.len());
        let mut m: IdMap<u64> = IdMap::default();
        for id in 1..=1000 {
            m.insert(id, id * 2);
        }
        assert!((1..=1000).all(|id| m.get(&id) == Some(&(id * 2))));
    }

    use super::*;

    #[test]
    fn capacity_is_enforced() {
        let s: FdSlots<u32> = Slots::with_capacity(16);
        for i in 0..16 {
            s.insert(FdId(i), 1).expect("room");
        }
        assert_eq!(s.insert(FdId(16), 1), Err(Errno::ENOMEM));
        assert_eq!(s.remove(&FdId(0)), Some(1));
        assert_eq!(s.with(&FdId(1), |v| *v + 1), Some(2));
    }
}
