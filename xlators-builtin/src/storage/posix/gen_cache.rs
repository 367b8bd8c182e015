//! A map by gfid bounded in two generations: a new entry goes into the
//! young one; when that is full it becomes the old one (the old one is
//! dropped), and an entry found in the old one moves back to the young.
//! What is used stays; at most `cap` entries are kept.

use std::collections::HashMap;

use parking_lot::Mutex;
use xlfs_sdk::Gfid;

pub(super) struct GenCache<V> {
    cap: usize,
    gens: Mutex<[HashMap<Gfid, V>; 2]>,
}

impl<V: Clone> GenCache<V> {
    /// An empty cache of at most `cap` entries.
    pub(super) fn new(cap: usize) -> GenCache<V> {
        GenCache { cap, gens: Mutex::new([HashMap::new(), HashMap::new()]) }
    }

    pub(super) fn get(&self, g: &Gfid) -> Option<V> {
        let mut gens = self.gens.lock();
        if let Some(v) = gens[0].get(g) {
            return Some(v.clone());
        }
        let v = gens[1].remove(g)?;
        self.put_in(&mut gens, *g, v.clone());
        Some(v)
    }

    pub(super) fn put(&self, g: Gfid, v: V) {
        self.put_in(&mut self.gens.lock(), g, v);
    }

    fn put_in(&self, gens: &mut [HashMap<Gfid, V>; 2], g: Gfid, v: V) {
        if gens[0].len() >= self.cap / 2 {
            gens[1] = std::mem::take(&mut gens[0]);
        }
        gens[0].insert(g, v);
    }

    pub(super) fn remove(&self, g: &Gfid) {
        let mut gens = self.gens.lock();
        gens[0].remove(g);
        gens[1].remove(g);
    }

    pub(super) fn len(&self) -> usize {
        let gens = self.gens.lock();
        gens[0].len() + gens[1].len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_stays_bounded_and_keeps_what_is_used() {
        const CAP: usize = 4096;
        let c = GenCache::new(CAP);
        let g = |i: u64| {
            let mut b = [0u8; 16];
            b[8..].copy_from_slice(&i.to_be_bytes());
            Gfid(b)
        };
        c.put(g(0), 0);
        for i in 1..(CAP as u64 * 4) {
            c.put(g(i), i);
            if i % 100 == 0 {
                assert_eq!(c.get(&g(0)), Some(0), "a gfid in use stays");
            }
            assert!(c.len() <= CAP);
        }
        assert_eq!(c.get(&g(1)), None, "one not used went");
        c.remove(&g(0));
        assert_eq!(c.get(&g(0)), None);
    }
}
