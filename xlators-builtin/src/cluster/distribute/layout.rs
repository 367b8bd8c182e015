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

    /// The layout a repair writes: [`Layout::fresh`], committed only when
    /// no subvolume that held a range would hold another one.
    pub fn repaired(&self, gfid: Gfid) -> Layout {
        self.repaired_on(gfid, &vec![true; self.ranges.len()])
    }

    /// [`Layout::repaired`] over the subvolumes `active` marks.
    pub fn repaired_on(&self, gfid: Gfid, active: &[bool]) -> Layout {
        let fresh = Layout::fresh_on(gfid, active, COMMITTED);
        let moved = self.ranges.iter().zip(&fresh.ranges).any(|(old, new)| match (old, new) {
            (Some(o), Some(n)) => !o.is_empty() && (o.start, o.stop) != (n.start, n.stop),
            (Some(o), None) => !o.is_empty(),
            _ => false,
        });
        if moved { Layout::fresh_on(gfid, active, UNSETTLED) } else { fresh }
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
}
