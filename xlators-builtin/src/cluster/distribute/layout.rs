//! A directory's hash layout: which range of the 32-bit name hash each
//! subvolume holds, stored on that subvolume's copy of the directory in
//! `trusted.glusterfs.dht`, as GlusterFS does.
//!
//! The xattr value is 16 bytes, four big-endian 32-bit words: the commit
//! hash, the hash type (0: Davies-Meyer, the only one), the range's start
//! and its stop (inclusive). A subvolume whose stop is below its start holds
//! no range.
//!
//! A layout is whole when the ranges of the subvolumes that have the
//! directory cover `0..=u32::MAX` with no hole and no overlap. A new layout
//! (mkdir, or the repair of a broken one) splits the hash space in equal
//! ranges, handed to the subvolumes in order from a start that depends on
//! the directory's gfid (GlusterFS's `dht_selfheal_layout_alloc_start`), so
//! that directories do not all put the same hash range on the same
//! subvolume, and so that two clients repairing the same directory compute
//! the same layout.
//!
//! The commit hash says whether the layout is settled: xlfs writes
//! [`COMMITTED`] on a new directory and on a repair that moved no range of
//! a subvolume that held one (no file can be away from where its name
//! hashes), and [`UNSETTLED`] when a repair moved ranges, so lookups of
//! missing names in that directory look on every subvolume
//! (`lookup-optimize`). Rebalance settles it again (`migrate`:
//! [`Layout::fixed`], [`Layout::settled_form`]) once every file in the
//! directory is where its name hashes.

use xlfs_sdk::Gfid;

use super::hash::dm_hash;

/// The xattr holding a directory's range on a subvolume.
pub const LAYOUT_XATTR: &str = "trusted.glusterfs.dht";
/// The commit hash of a settled layout.
pub const COMMITTED: u32 = 1;
/// The commit hash of a layout whose ranges moved: names may be away from
/// their hashed subvolume.
pub const UNSETTLED: u32 = 0;
/// The hash type word of the Davies-Meyer hash.
const DM_TYPE: u32 = 0;

/// One subvolume's range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// The commit hash written with the range.
    pub commit: u32,
    /// First hash.
    pub start: u32,
    /// Last hash (inclusive).
    pub stop: u32,
}

impl Range {
    /// The xattr value.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.commit.to_be_bytes());
        b[4..8].copy_from_slice(&DM_TYPE.to_be_bytes());
        b[8..12].copy_from_slice(&self.start.to_be_bytes());
        b[12..16].copy_from_slice(&self.stop.to_be_bytes());
        b
    }

    /// Parses an xattr value; None when it is not 16 bytes of a known type
    /// (a broken range is repaired like a missing one).
    pub fn decode(b: &[u8]) -> Option<Range> {
        let w = |i: usize| -> Option<u32> { Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?)) };
        if b.len() != 16 || w(4)? != DM_TYPE {
            return None;
        }
        Some(Range { commit: w(0)?, start: w(8)?, stop: w(12)? })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.stop < self.start
    }
}

/// A directory's layout: per subvolume, its range if it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Indexed by subvolume.
    pub ranges: Vec<Option<Range>>,
}

/// What is wrong with a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Anomalies {
    /// Hash values no subvolume holds (counted as gaps).
    pub holes: u32,
    /// Hash values more than one subvolume holds (counted as places).
    pub overlaps: u32,
}

impl Anomalies {
    /// No hole and no overlap.
    pub fn none(&self) -> bool {
        self.holes == 0 && self.overlaps == 0
    }
}

impl Layout {
    /// A layout for `n` subvolumes with no range anywhere.
    pub fn empty(n: usize) -> Layout {
        Layout { ranges: vec![None; n] }
    }

    /// The layout xlfs gives a directory with this gfid over `n`
    /// subvolumes: equal ranges from a gfid-dependent first subvolume.
    pub fn fresh(gfid: Gfid, n: usize, commit: u32) -> Layout {
        Layout::fresh_on(gfid, &vec![true; n], commit)
    }

    /// [`Layout::fresh`] over the subvolumes `active` marks only; the
    /// others (being removed: `decommissioned-bricks`) get an empty range,
    /// so no name hashes to them. With every subvolume active it is
    /// `fresh`'s layout exactly.
    pub fn fresh_on(gfid: Gfid, active: &[bool], commit: u32) -> Layout {
        let mut l = Layout::empty(active.len());
        let idx: Vec<usize> = (0..active.len()).filter(|i| active[*i]).collect();
        let m = idx.len();
        if m == 0 {
            return l;
        }
        for (i, a) in active.iter().enumerate() {
            if !a {
                l.ranges[i] = Some(Range { commit, start: u32::MAX, stop: 0 });
            }
        }
        let first = dm_hash(gfid.to_string().as_bytes()) as usize % m;
        let chunk = u32::MAX / m as u32;
        for k in 0..m {
            let start = chunk * k as u32;
            let stop = if k + 1 == m { u32::MAX } else { chunk * (k as u32 + 1) - 1 };
            l.ranges[idx[(first + k) % m]] = Some(Range { commit, start, stop });
        }
        l
    }

    /// The subvolume whose range holds `hash`.
    pub fn search(&self, hash: u32) -> Option<usize> {
        self.ranges.iter().position(|r| r.is_some_and(|r| !r.is_empty() && r.start <= hash && hash <= r.stop))
    }

    /// The subvolume the name hashes to.
    pub fn hashed(&self, name: &str) -> Option<usize> {
        self.search(dm_hash(name.as_bytes()))
    }

    /// Holes and overlaps among the ranges of the subvolumes in `present`
    /// (those that have the directory).
    pub fn anomalies(&self, present: &[bool]) -> Anomalies {
        let mut rs: Vec<(u64, u64)> = self
            .ranges
            .iter()
            .zip(present)
            .filter_map(|(r, p)| r.filter(|r| *p && !r.is_empty()).map(|r| (u64::from(r.start), u64::from(r.stop))))
            .collect();
        rs.sort_unstable();
        let mut a = Anomalies::default();
        let mut next = 0u64; // the first hash not covered yet
        for (start, stop) in rs {
            if start > next {
                a.holes += 1;
            } else if start < next {
                a.overlaps += 1;
            }
            next = next.max(stop + 1);
        }
        if next <= u64::from(u32::MAX) {
            a.holes += 1;
        }
        a
    }

    /// True when every range (of a present subvolume) carries
    /// `COMMITTED`: a name not on its hashed subvolume does not exist.
    pub fn settled(&self, present: &[bool]) -> bool {
        self.ranges.iter().zip(present).all(|(r, p)| !*p || r.is_some_and(|r| r.commit == COMMITTED))
    }

    /// The layout a repair writes: [`Layout::balanced_on`] over every
    /// subvolume, committed only when no subvolume that held a range would
    /// hold another one.
    pub fn repaired(&self, gfid: Gfid) -> Layout {
        self.repaired_on(gfid, &vec![true; self.ranges.len()])
    }

    /// [`Layout::repaired`] over the subvolumes `active` marks.
    pub fn repaired_on(&self, gfid: Gfid, active: &[bool]) -> Layout {
        let mut new = self.balanced_on(gfid, active, COMMITTED);
        let moved = self.ranges.iter().zip(&new.ranges).any(|(old, new)| match (old, new) {
            (Some(o), Some(n)) => !o.is_empty() && (o.start, o.stop) != (n.start, n.stop),
            (Some(o), None) => !o.is_empty(),
            _ => false,
        });
        if moved {
            new.ranges.iter_mut().flatten().for_each(|r| r.commit = UNSETTLED);
        }
        new
    }

    /// The equal ranges of [`Layout::fresh_on`] over the subvolumes
    /// `active` marks, each handed to the subvolume that already holds
    /// most of it (GlusterFS's `dht_selfheal_layout_maximize_overlap`), so
    /// that as few names as possible change subvolume: growing from two
    /// subvolumes to three moves a third of the hash space, not two thirds.
    /// A range no subvolume holds any of goes where `fresh_on` puts it, so
    /// a directory with no range anywhere gets `fresh_on`'s layout, and so
    /// does one that has it already. Deterministic: two clients repairing
    /// the same layout write the same one.
    pub fn balanced_on(&self, gfid: Gfid, active: &[bool], commit: u32) -> Layout {
        let fresh = Layout::fresh_on(gfid, active, commit);
        // Each range to hand out, with the subvolume fresh_on gives it to.
        let slots: Vec<(usize, Range)> =
            (0..active.len()).filter(|&i| active[i]).filter_map(|i| fresh.ranges[i].map(|r| (i, r))).collect();
        let held = |j: usize, r: &Range| -> u64 {
            match self.ranges.get(j).copied().flatten() {
                Some(o) if active[j] && !o.is_empty() => {
                    let (lo, hi) = (o.start.max(r.start), o.stop.min(r.stop));
                    if lo <= hi { u64::from(hi - lo) + 1 } else { 0 }
                }
                _ => 0,
            }
        };
        // (overlap, not fresh_on's pair, slot, subvolume), best first.
        let mut pairs: Vec<(u64, bool, usize, usize)> = Vec::new();
        for (s, (owner, r)) in slots.iter().enumerate() {
            for j in (0..active.len()).filter(|&j| active[j]) {
                let o = held(j, r);
                if o > 0 {
                    pairs.push((o, j != *owner, s, j));
                }
            }
        }
        pairs.sort_unstable_by(|a, b| b.0.cmp(&a.0).then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3))));
        let mut to: Vec<Option<usize>> = vec![None; slots.len()];
        let mut taken = vec![false; active.len()];
        for (_, _, s, j) in pairs {
            if to[s].is_none() && !taken[j] {
                to[s] = Some(j);
                taken[j] = true;
            }
        }
        for (s, (owner, _)) in slots.iter().enumerate() {
            if to[s].is_none() {
                let j = if taken[*owner] { (0..active.len()).find(|&j| active[j] && !taken[j]) } else { Some(*owner) };
                if let Some(j) = j {
                    to[s] = Some(j);
                    taken[j] = true;
                }
            }
        }
        let mut l = fresh.clone();
        for (s, (_, r)) in slots.iter().enumerate() {
            if let Some(j) = to[s] {
                l.ranges[j] = Some(*r);
            }
        }
        l
    }

    /// How many hash values change subvolume from this layout to `new`.
    pub fn moved_to(&self, new: &Layout) -> u64 {
        let kept: u64 = self
            .ranges
            .iter()
            .zip(&new.ranges)
            .filter_map(|(o, n)| {
                let (o, n) = ((*o)?, (*n)?);
                let (lo, hi) = (o.start.max(n.start), o.stop.min(n.stop));
                (!o.is_empty() && !n.is_empty() && lo <= hi).then(|| u64::from(hi - lo) + 1)
            })
            .sum();
        (1u64 << 32) - kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_layouts_are_whole_and_round_trip() {
        for n in 1..=7 {
            let l = Layout::fresh(Gfid::random(), n, COMMITTED);
            let present = vec![true; n];
            assert!(l.anomalies(&present).none(), "{n}: {l:?}");
            assert!(l.settled(&present));
            for r in l.ranges.iter().flatten() {
                assert_eq!(Range::decode(&r.encode()), Some(*r));
            }
            assert!(l.search(0).is_some() && l.search(u32::MAX).is_some());
        }
    }

    #[test]
    fn holes_and_overlaps_are_found() {
        let g = Gfid::random();
        let mut l = Layout::fresh(g, 3, COMMITTED);
        let all = [true; 3];
        l.ranges[1] = None;
        assert_eq!(l.anomalies(&all).holes, 1);
        let mut o = Layout::fresh(g, 3, COMMITTED);
        if let Some(r) = o.ranges[0].as_mut() {
            r.stop = r.stop.saturating_add(10);
            r.start = r.start.saturating_sub(10);
        }
        assert!(o.anomalies(&all).overlaps >= 1);
        // A repair of a lost range puts back the same ranges: still settled.
        assert_eq!(l.repaired(g), Layout::fresh(g, 3, COMMITTED));
        assert!(o.repaired(g).ranges.iter().flatten().all(|r| r.commit == UNSETTLED));
        assert_eq!(Range::decode(&[0u8; 15]), None);
    }

    /// Every order of `0..n`.
    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for p in permutations(n - 1) {
            for at in 0..=p.len() {
                let mut q = p.clone();
                q.insert(at, n - 1);
                out.push(q);
            }
        }
        out
    }

    #[test]
    fn growing_keeps_as_much_of_each_range_as_it_can() {
        for _ in 0..50 {
            let g = Gfid::random();
            for n in 1..=5usize {
                // n subvolumes laid out, one more added: the new one's share
                // (1/(n+1) of the hash space) moves, within rounding.
                let mut grown = Layout::empty(n + 1);
                grown.ranges[..n].copy_from_slice(&Layout::fresh(g, n, COMMITTED).ranges);
                let fixed = grown.repaired(g);
                assert!(fixed.anomalies(&vec![true; n + 1]).none(), "{fixed:?}");
                // As little as any order of the equal ranges would move.
                let fresh = Layout::fresh(g, n + 1, COMMITTED);
                let best = permutations(n + 1)
                    .into_iter()
                    .map(|p| grown.moved_to(&Layout { ranges: p.iter().map(|&k| fresh.ranges[k]).collect() }))
                    .min()
                    .expect("one order at least");
                let moved = grown.moved_to(&fixed);
                assert_eq!(moved, best, "{n} -> {}: {moved} moved, {best} could", n + 1);
                if n == 2 {
                    let third = (moved as f64 / 2f64.powi(32) - 1.0 / 3.0).abs();
                    assert!(third < 1e-6, "2 -> 3 moves a third of the hash space: {moved}");
                }
                assert_eq!(fixed.moved_to(&fixed.repaired(g)), 0, "repairing again changes nothing");
            }
            // Nothing held anywhere, or fresh already: fresh's layout.
            assert_eq!(Layout::empty(4).repaired(g), Layout::fresh(g, 4, COMMITTED));
            let fresh = Layout::fresh(g, 4, COMMITTED);
            assert_eq!(fresh.repaired(g), fresh);
            assert_eq!(fresh.moved_to(&fresh), 0);
        }
    }
}
