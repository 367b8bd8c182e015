//! The changelog: AFR's pending counters, how they are stored, and how a
//! stale copy is told from a good one.
//!
//! Every inode on every child carries, for every child `j` of the replica
//! set, the xattr `trusted.afr.<name_j>` (names from `afr-pending-xattr`,
//! by default the children's volume names, as GlusterFS volfiles give
//! `rep3-client-0,...`), and one more, [`DIRTY`]. Each value is 12 bytes:
//! three big-endian `i32` counters, for data, metadata and entry changes
//! ([`Kind`]). On child `i`, `pending_i[j][kind] + dirty_i[kind]` says
//! "child `j` may have missed `kind` changes that child `i` has": the
//! dirty counter raises the whole row at once.
//!
//! A transaction raises the dirty counter on every participating child
//! before the fop (pre-op: one xattr, where raising each child's counter
//! wrote one per child) and, after it, lowers it again and raises the
//! counters of the children that failed or did not take part (post-op), on
//! every participant still reachable. What is left blames exactly those
//! children, and it is the same on every copy, so any node can tell which
//! copy is stale. This is GlusterFS's AFR v2 scheme (`trusted.afr.dirty`);
//! counters raised the old way, every child's at once, read the same. With
//! `optimistic-change-log` on, metadata and entry transactions that reach
//! every child skip the pre-op and only add `+1` for failed children after
//! the fop (nothing at all when everything succeeded).
//!
//! Reading the counters ([`row`] folds the dirty counter into every
//! child's, [`stale`]): a transaction in flight raises a whole row
//! uniformly, so each row is first reduced by its smallest entry. A child
//! is stale when it blames itself, or when a child that does not blame
//! itself blames it. When that makes every answering child stale the
//! counters carry no usable information (everything in flight, or a
//! split-brain for the heal logic to judge) and no child is reported stale.

use bytes::Bytes;
use xlfs_sdk::{Dict, Value};

/// A set of children as a bit mask (bit `i` is child `i`); AFR takes at
/// most 64 children.
pub type Mask = u64;

/// The bit of child `i`.
pub fn bit(i: usize) -> Mask {
    1u64 << i
}

/// All of the first `n` children.
pub fn all(n: usize) -> Mask {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// The children in a mask, lowest first.
pub fn members(mut m: Mask) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if m == 0 {
            return None;
        }
        let i = m.trailing_zeros() as usize;
        m &= m - 1;
        Some(i)
    })
}

/// The number of children in a mask.
pub fn count(m: Mask) -> u32 {
    m.count_ones()
}

/// What a counter counts (its index in the 12-byte value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// File contents (writes, truncates, ...).
    Data = 0,
    /// Attributes and xattrs.
    Metadata = 1,
    /// Directory entries (create, unlink, rename, ...).
    Entry = 2,
}

impl Kind {
    /// The three kinds, in value order.
    pub const ALL: [Kind; 3] = [Kind::Data, Kind::Metadata, Kind::Entry];
}

/// The xattr prefix of the counters.
pub const PREFIX: &str = "trusted.afr.";

/// The dirty counters: raised by a pre-op for every child at once.
pub const DIRTY: &str = "trusted.afr.dirty";

/// Bytes in a counter value.
pub const VALUE_LEN: usize = 12;

/// The counter xattr for pending name `name`.
pub fn key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// Encodes three counters.
pub fn encode(v: [i32; 3]) -> Bytes {
    let mut b = Vec::with_capacity(VALUE_LEN);
    for x in v {
        b.extend_from_slice(&x.to_be_bytes());
    }
    Bytes::from(b)
}

/// Decodes a value; shorter values are zero-padded (a missing counter is
/// zero), bytes past the third counter are ignored. None if the length is
/// not a multiple of four.
pub fn decode(b: &[u8]) -> Option<[i32; 3]> {
    if !b.len().is_multiple_of(4) {
        return None;
    }
    let mut out = [0i32; 3];
    for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
        *o = i32::from_be_bytes([c[0], c[1], c[2], c[3]]);
    }
    Some(out)
}

/// The xattrop dict that adds `dirty` to the `kind` dirty counter and
/// `delta(j)` to the `kind` counter of every child `j` (zero deltas are
/// left out; None when all are zero).
pub fn changelog(keys: &[String], kind: Kind, dirty: i32, delta: impl Fn(usize) -> i32) -> Option<Dict> {
    let mut d = Dict::new();
    let one = |v: i32| {
        let mut c = [0i32; 3];
        c[kind as usize] = v;
        encode(c)
    };
    if dirty != 0 {
        d.set_bytes(DIRTY, one(dirty));
    }
    for (j, k) in keys.iter().enumerate() {
        let v = delta(j);
        if v != 0 {
            d.set_bytes(k.clone(), one(v));
        }
    }
    (!d.is_empty()).then_some(d)
}

/// A request dict naming every counter xattr, the dirty one included (for
/// lookup: posix returns the named xattrs in the reply xdata).
pub fn request_keys(keys: &[String], xdata: &mut Dict) {
    for k in keys.iter().map(String::as_str).chain([DIRTY]) {
        if !xdata.contains(k) {
            xdata.set(k, Value::U64(0));
        }
    }
}

/// The counters in xattr `key` of `xattrs` (zeros when absent).
fn counters(xattrs: &Dict, key: &str) -> [i32; 3] {
    xattrs.get_bytes(key).and_then(|b| decode(&b)).unwrap_or([0; 3])
}

/// The dirty counters in `xattrs` (zeros when absent).
pub fn dirty(xattrs: &Dict) -> [i32; 3] {
    counters(xattrs, DIRTY)
}

/// What one child's copy says about every child: `row[j]` are the counters
/// blaming child `j`, its own plus the dirty ones. Missing xattrs read as
/// zero.
pub fn row(keys: &[String], xattrs: &Dict) -> Vec<[i32; 3]> {
    let d = dirty(xattrs);
    keys.iter()
        .map(|k| {
            let own = counters(xattrs, k);
            std::array::from_fn(|x| own[x].wrapping_add(d[x]))
        })
        .collect()
}

/// The stale children for `kind`, from the rows of the children that
/// answered (`rows[i]` is None for children that did not).
pub fn stale(rows: &[Option<Vec<[i32; 3]>>], kind: Kind) -> Mask {
    let k = kind as usize;
    let norm: Vec<Option<Vec<i64>>> = rows
        .iter()
        .map(|r| {
            r.as_ref().map(|r| {
                let min = r.iter().map(|c| i64::from(c[k])).min().unwrap_or(0);
                r.iter().map(|c| i64::from(c[k]) - min).collect()
            })
        })
        .collect();
    let mut answered: Mask = 0;
    let mut accused: Mask = 0;
    for (i, r) in norm.iter().enumerate() {
        let Some(r) = r else { continue };
        answered |= bit(i);
        if r.get(i).is_some_and(|&v| v > 0) {
            accused |= bit(i);
        }
    }
    let fools = accused;
    for (i, r) in norm.iter().enumerate() {
        let Some(r) = r else { continue };
        if fools & bit(i) != 0 {
            continue;
        }
        for (j, &v) in r.iter().enumerate() {
            if j != i && v > 0 && j < 64 {
                accused |= bit(j);
            }
        }
    }
    if answered != 0 && accused & answered == answered { 0 } else { accused }
}

/// What the counters of one kind say, for self-heal (GlusterFS's
/// `afr_selfheal_find_direction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No counter of this kind is raised on any answering child.
    Clean,
    /// `sources` hold good copies, `sinks` are to be healed from them.
    /// `sinks` may be empty (counters raised on every copy alike: only a
    /// reset is due). `uncertain` is set when every answering copy blames
    /// itself, or the counters are raised alike on every copy (a client
    /// died between pre-op and post-op), so no copy is known better than
    /// another: all answering copies are then `sources` and the heal picks
    /// among them.
    Heal {
        /// Copies to copy from.
        sources: Mask,
        /// Copies to heal.
        sinks: Mask,
        /// No copy is known good (every copy blames itself).
        uncertain: bool,
    },
    /// Every copy that does not blame itself is blamed by another one: no
    /// copy can be trusted without a policy.
    SplitBrain {
        /// The copies taking part in the split-brain.
        copies: Mask,
    },
}

/// Judges the counters of `kind` from the rows of the children that
/// answered (`rows[i]` None for the others). Rows are first reduced by
/// their smallest entry (a transaction in flight raises a row uniformly).
/// A child that blames itself is a "fool" and has no say; the others are
/// "wise"; a wise child blamed by no wise child is a source, every other
/// answering child a sink. No wise child: everyone is uncertain. Wise
/// children but no source: split-brain.
pub fn verdict(rows: &[Option<Vec<[i32; 3]>>], kind: Kind) -> Verdict {
    let k = kind as usize;
    let mut answered: Mask = 0;
    let mut raised = false;
    let mut fools: Mask = 0;
    let norm: Vec<Option<Vec<i64>>> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let r = r.as_ref()?;
            if i < 64 {
                answered |= bit(i);
            }
            raised |= r.iter().any(|c| c[k] != 0);
            let min = r.iter().map(|c| i64::from(c[k])).min().unwrap_or(0);
            let v: Vec<i64> = r.iter().map(|c| i64::from(c[k]) - min).collect();
            if i < 64 && v.get(i).is_some_and(|&x| x > 0) {
                fools |= bit(i);
            }
            Some(v)
        })
        .collect();
    if !raised || answered == 0 {
        return Verdict::Clean;
    }
    let wise = answered & !fools;
    let flat = norm.iter().flatten().all(|r| r.iter().all(|&v| v == 0));
    if wise == 0 || flat {
        return Verdict::Heal { sources: answered, sinks: 0, uncertain: true };
    }
    let mut accused: Mask = 0;
    for i in members(wise) {
        if let Some(Some(r)) = norm.get(i) {
            for (j, &v) in r.iter().enumerate() {
                if j != i && v > 0 && j < 64 {
                    accused |= bit(j);
                }
            }
        }
    }
    let sources = wise & !accused;
    if sources == 0 {
        return Verdict::SplitBrain { copies: answered };
    }
    Verdict::Heal { sources, sinks: answered & !sources, uncertain: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<String> {
        (0..3).map(|i| key(&format!("v-client-{i}"))).collect()
    }

    fn r(data: [i32; 3]) -> Option<Vec<[i32; 3]>> {
        Some(data.iter().map(|&d| [d, 0, 0]).collect())
    }

    #[test]
    fn values_round_trip_big_endian() {
        let v = encode([1, -2, 70000]);
        assert_eq!(v.as_ref(), &[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe, 0, 1, 0x11, 0x70]);
        assert_eq!(decode(&v), Some([1, -2, 70000]));
        assert_eq!(decode(&[0, 0, 0, 5]), Some([5, 0, 0]));
        assert_eq!(decode(&[0, 0, 5]), None);
        let d = changelog(&keys(), Kind::Metadata, 0, |j| if j == 1 { -1 } else { 0 }).expect("one key");
        assert_eq!(d.len(), 1);
        assert_eq!(decode(&d.get_bytes("trusted.afr.v-client-1").expect("key")), Some([0, -1, 0]));
        assert!(changelog(&keys(), Kind::Data, 0, |_| 0).is_none());
        // A pre-op writes the dirty counter only; a post-op blaming child 2 lowers it and raises child 2's.
        let pre = changelog(&keys(), Kind::Data, 1, |_| 0).expect("dirty");
        assert_eq!(pre.keys().collect::<Vec<_>>(), vec![DIRTY]);
        let post = changelog(&keys(), Kind::Data, -1, |j| i32::from(j == 2)).expect("two keys");
        assert_eq!(decode(&post.get_bytes(DIRTY).expect("dirty")), Some([-1, 0, 0]));
        assert_eq!(decode(&post.get_bytes("trusted.afr.v-client-2").expect("key")), Some([1, 0, 0]));
        let mut x = Dict::new();
        x.set_bytes("trusted.afr.v-client-2", encode([3, 0, 0]));
        assert_eq!(row(&keys(), &x), vec![[0; 3], [0; 3], [3, 0, 0]]);
        // The dirty counter raises the whole row: as every child's own counter would.
        x.set_bytes(DIRTY, encode([1, 0, 2]));
        assert_eq!(row(&keys(), &x), vec![[1, 0, 2], [1, 0, 2], [4, 0, 2]]);
        assert_eq!(dirty(&x), [1, 0, 2]);
        let mut r = Dict::new();
        request_keys(&keys(), &mut r);
        assert!(r.contains(DIRTY) && r.contains("trusted.afr.v-client-0"));
    }

    #[test]
    fn blame_finds_the_stale_copy() {
        // Clean: nobody blamed.
        assert_eq!(stale(&[r([0, 0, 0]), r([0, 0, 0]), r([0, 0, 0])], Kind::Data), 0);
        // Child 2 failed a write while reachable: the others blame it and it blames itself.
        assert_eq!(stale(&[r([0, 0, 1]), r([0, 0, 1]), r([0, 0, 1])], Kind::Data), 0b100);
        // Child 2 was down: only the others say so.
        assert_eq!(stale(&[r([0, 0, 2]), r([0, 0, 2]), r([0, 0, 0])], Kind::Data), 0b100);
        assert_eq!(stale(&[r([0, 0, 2]), r([0, 0, 2]), None], Kind::Data), 0b100);
        // Another client's transaction in flight raises whole rows: no one is stale...
        assert_eq!(stale(&[r([1, 1, 1]), r([1, 1, 1]), r([1, 1, 1])], Kind::Data), 0);
        // ... and an earlier blame still shows through it.
        assert_eq!(stale(&[r([1, 1, 2]), r([1, 1, 2]), r([1, 1, 1])], Kind::Data), 0b100);
        // The other kinds are separate.
        assert_eq!(stale(&[r([0, 0, 1]), r([0, 0, 1]), r([0, 0, 1])], Kind::Metadata), 0);
        // Each blames the other: no usable information among the answering children.
        assert_eq!(stale(&[r([0, 1, 0]), r([1, 0, 0]), None], Kind::Data), 0);
    }

    #[test]
    fn verdict_tells_sources_sinks_and_split_brain() {
        use Verdict::*;
        assert_eq!(verdict(&[r([0, 0, 0]), r([0, 0, 0]), None], Kind::Data), Clean);
        // Child 2 missed writes.
        assert_eq!(
            verdict(&[r([0, 0, 2]), r([0, 0, 2]), r([0, 0, 0])], Kind::Data),
            Heal { sources: 0b011, sinks: 0b100, uncertain: false }
        );
        // It also blames itself (failed while reachable).
        assert_eq!(
            verdict(&[r([0, 0, 1]), r([0, 0, 1]), r([0, 0, 1])], Kind::Data),
            Heal { sources: 0b011, sinks: 0b100, uncertain: false }
        );
        // Raised uniformly (a client died between pre-op and post-op): everyone is a fool.
        assert_eq!(
            verdict(&[r([1, 1, 1]), r([1, 1, 1]), r([1, 1, 1])], Kind::Data),
            Heal { sources: 0b111, sinks: 0, uncertain: true }
        );
        // Each of two blames the other: split-brain among them...
        assert_eq!(verdict(&[r([0, 1, 0]), r([1, 0, 0]), None], Kind::Data), SplitBrain { copies: 0b011 });
        // ... unless a third copy nobody blames is there to heal both.
        assert_eq!(
            verdict(&[r([0, 1, 0]), r([1, 0, 0]), r([0, 0, 0])], Kind::Data),
            Heal { sources: 0b100, sinks: 0b011, uncertain: false }
        );
        // Three-way split-brain.
        assert_eq!(verdict(&[r([0, 1, 1]), r([1, 0, 1]), r([1, 1, 0])], Kind::Data), SplitBrain { copies: 0b111 });
        // Other kinds are not affected.
        assert_eq!(verdict(&[r([0, 1, 0]), r([1, 0, 0]), None], Kind::Entry), Clean);
    }

    #[test]
    fn masks() {
        assert_eq!(members(0b1011).collect::<Vec<_>>(), vec![0, 1, 3]);
        assert_eq!(all(3), 0b111);
        assert_eq!(all(64), u64::MAX);
        assert_eq!(count(0b1011), 3);
    }
}
