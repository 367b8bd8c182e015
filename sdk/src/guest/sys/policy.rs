//! The optional policy exports of ABI v1.1 (read-ahead, lock contention):
//! their names, how a host probes for them, and the encoding of what
//! crosses (interest bits, decisions, lock views, read-ahead advice).

use crate::abi::AbiVersion;
use crate::policy::lock_contention::{Decision, Interest, LockView};
use crate::policy::read_ahead::{Advice, Range};

/// The policy exports (ABI v1.1, all optional): a module exporting every
/// function of one group provides that policy.
pub mod policy_exports {
    /// `int64_t (xlfs_inst, uint64_t page_size, uint32_t page_count)`: a
    /// new read-ahead stream; its id (> 0) or a negative errno.
    pub const RA_OPEN: &str = "xlfs_ra_open";
    /// `int32_t (xlfs_inst, uint64_t stream, uint64_t offset, uint64_t size,
    /// uint64_t at_ns, uint8_t *out, uint32_t cap)`: a read; writes the
    /// encoded advice to `out` and returns its length, or a negative errno.
    pub const RA_READ: &str = "xlfs_ra_read";
    /// `int32_t (xlfs_inst, uint64_t stream, uint64_t page_size, uint32_t
    /// page_count)`: the translator emptied the stream's cache.
    pub const RA_RESET: &str = "xlfs_ra_reset";
    /// `int32_t (xlfs_inst, uint64_t stream)`: the fd is released.
    pub const RA_CLOSE: &str = "xlfs_ra_close";
    /// The read-ahead group.
    pub const READ_AHEAD: &[&str] = &[RA_OPEN, RA_READ, RA_RESET, RA_CLOSE];
    /// `int32_t (xlfs_inst)`: the counts the policy wants, as
    /// [`super::LOCK_WANTS_INODELK_COUNT`] | [`super::LOCK_WANTS_OPEN_FD_COUNT`].
    pub const LOCK_INTEREST: &str = "xlfs_lock_interest";
    /// `int64_t (xlfs_inst, uint32_t event, const uint8_t *view, uint32_t
    /// len)`: the decision ([`super::encode_decision`]), or `-1` on failure.
    pub const LOCK_DECIDE: &str = "xlfs_lock_decide";
    /// The lock-contention group.
    pub const LOCK_CONTENTION: &[&str] = &[LOCK_INTEREST, LOCK_DECIDE];
}

/// Which policies a module's exports provide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyExports {
    /// Every read-ahead export is there.
    pub read_ahead: bool,
    /// Every lock-contention export is there.
    pub lock_contention: bool,
}

impl PolicyExports {
    /// What a module of `version` with these export names provides (nothing
    /// before v1.1).
    pub fn probe<'a>(version: AbiVersion, names: impl Iterator<Item = &'a str>) -> PolicyExports {
        if version.minor < 1 {
            return PolicyExports::default();
        }
        let names: Vec<&str> = names.collect();
        let all = |group: &[&str]| group.iter().all(|g| names.contains(g));
        PolicyExports {
            read_ahead: all(policy_exports::READ_AHEAD),
            lock_contention: all(policy_exports::LOCK_CONTENTION),
        }
    }
}

/// `xlfs_lock_interest` bit: report the inodelk count.
pub const LOCK_WANTS_INODELK_COUNT: i32 = 1;
/// `xlfs_lock_interest` bit: report the open fd count.
pub const LOCK_WANTS_OPEN_FD_COUNT: i32 = 2;
/// Most ranges of each kind in one read-ahead advice.
pub const MAX_ADVICE_RANGES: usize = 64;
/// The largest encoded advice: what the host's `out` buffer holds.
pub const MAX_ADVICE: usize = 1 + 2 * (4 + MAX_ADVICE_RANGES * 16);
/// Length of an encoded lock view (ABI v1.1; later minors may append).
pub const LOCK_VIEW_LEN: usize = 50;

/// The interest bits of `i`.
pub fn interest_bits(i: Interest) -> i32 {
    (if i.inodelk_count { LOCK_WANTS_INODELK_COUNT } else { 0 })
        | (if i.open_fd_count { LOCK_WANTS_OPEN_FD_COUNT } else { 0 })
}

/// The interest in bits `b` (unknown bits ignored).
pub fn interest_from_bits(b: i32) -> Interest {
    Interest { inodelk_count: b & LOCK_WANTS_INODELK_COUNT != 0, open_fd_count: b & LOCK_WANTS_OPEN_FD_COUNT != 0 }
}

/// A decision as `xlfs_lock_decide` returns it: `0` keep, `1` release now,
/// `n >= 2` release within `n - 1` ms (so `ReleaseAfter { ms: 0 }` is `1`).
pub fn encode_decision(d: Decision) -> i64 {
    match d {
        Decision::Keep => 0,
        Decision::ReleaseNow => 1,
        Decision::ReleaseAfter { ms } => i64::try_from(ms.saturating_add(1)).unwrap_or(i64::MAX),
    }
}

/// The decision `xlfs_lock_decide` returned; `None` for a negative value.
pub fn decode_decision(v: i64) -> Option<Decision> {
    match v {
        ..0 => None,
        0 => Some(Decision::Keep),
        1 => Some(Decision::ReleaseNow),
        n => Some(Decision::ReleaseAfter { ms: (n - 1) as u64 }),
    }
}

/// Encodes a lock view: gfid (16 bytes), held and contended (one byte
/// each, 0/1), then `u32` local_open_fds, brick_open_fds, inodelk_count,
/// in_flight, and `u64` txns, held_ms, little-endian: [`LOCK_VIEW_LEN`] bytes.
pub fn encode_lock_view(v: &LockView, out: &mut Vec<u8>) {
    out.extend_from_slice(&v.gfid.0);
    out.push(u8::from(v.held));
    out.push(u8::from(v.contended));
    for n in [v.local_open_fds, v.brick_open_fds, v.inodelk_count, v.in_flight] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&v.txns.to_le_bytes());
    out.extend_from_slice(&v.held_ms.to_le_bytes());
}

/// Decodes a lock view; bytes past [`LOCK_VIEW_LEN`] (a later minor's
/// fields) are ignored.
pub fn decode_lock_view(b: &[u8]) -> Option<LockView> {
    let b = b.get(..LOCK_VIEW_LEN)?;
    let u32_at = |i: usize| b.get(i..i + 4).and_then(|s| s.try_into().ok()).map(u32::from_le_bytes);
    let u64_at = |i: usize| b.get(i..i + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes);
    Some(LockView {
        gfid: crate::Gfid(b.get(..16)?.try_into().ok()?),
        held: b[16] != 0,
        contended: b[17] != 0,
        local_open_fds: u32_at(18)?,
        brick_open_fds: u32_at(22)?,
        inodelk_count: u32_at(26)?,
        in_flight: u32_at(30)?,
        txns: u64_at(34)?,
        held_ms: u64_at(42)?,
    })
}

/// Encodes read-ahead advice: `u8` reset (0/1), then the prefetch and the
/// drop ranges, each as a `u32` count and that many (`u64` offset, `u64`
/// len), little-endian. Ranges past [`MAX_ADVICE_RANGES`] of a kind are
/// left out.
pub fn encode_advice(a: &Advice, out: &mut Vec<u8>) {
    out.push(u8::from(a.reset));
    for ranges in [&a.prefetch, &a.drop] {
        let n = ranges.len().min(MAX_ADVICE_RANGES);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        for r in &ranges[..n] {
            out.extend_from_slice(&r.offset.to_le_bytes());
            out.extend_from_slice(&r.len.to_le_bytes());
        }
    }
}

/// Decodes read-ahead advice; `None` if it is malformed, has more than
/// [`MAX_ADVICE_RANGES`] ranges of a kind, or has bytes left over.
pub fn decode_advice(b: &[u8]) -> Option<Advice> {
    let mut pos = 0usize;
    let mut take = |n: usize| {
        let s = b.get(pos..pos.checked_add(n)?)?;
        pos += n;
        Some(s)
    };
    let reset = match take(1)?[0] {
        0 => false,
        1 => true,
        _ => return None,
    };
    let mut lists = [Vec::new(), Vec::new()];
    for list in &mut lists {
        let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        if n > MAX_ADVICE_RANGES {
            return None;
        }
        for _ in 0..n {
            let offset = u64::from_le_bytes(take(8)?.try_into().ok()?);
            let len = u64::from_le_bytes(take(8)?.try_into().ok()?);
            list.push(Range { offset, len });
        }
    }
    if take(1).is_some() {
        return None;
    }
    let [prefetch, drop] = lists;
    Some(Advice { prefetch, drop, reset })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_messages_round_trip_and_refuse_garbage() {
        let a = Advice { prefetch: vec![Range { offset: 4096, len: 8192 }], drop: vec![Range::ALL], reset: true };
        let mut b = Vec::new();
        encode_advice(&a, &mut b);
        assert!(b.len() <= MAX_ADVICE);
        assert_eq!(decode_advice(&b), Some(a));
        for n in 0..b.len() {
            assert_eq!(decode_advice(&b[..n]), None, "truncated at {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode_advice(&long), None);
        let many = Advice { prefetch: vec![Range { offset: 0, len: 1 }; MAX_ADVICE_RANGES + 5], ..Advice::default() };
        b.clear();
        encode_advice(&many, &mut b);
        assert_eq!(decode_advice(&b).map(|a| a.prefetch.len()), Some(MAX_ADVICE_RANGES));
        b[1..5].copy_from_slice(&(MAX_ADVICE_RANGES as u32 + 1).to_le_bytes());
        assert_eq!(decode_advice(&b), None);

        let v = LockView {
            gfid: crate::Gfid([3; 16]),
            held: true,
            local_open_fds: 2,
            brick_open_fds: 3,
            inodelk_count: 4,
            in_flight: 5,
            txns: 6,
            held_ms: 7,
            contended: true,
        };
        b.clear();
        encode_lock_view(&v, &mut b);
        assert_eq!(b.len(), LOCK_VIEW_LEN);
        b.extend_from_slice(b"later");
        assert_eq!(decode_lock_view(&b), Some(v));
        assert_eq!(decode_lock_view(&b[..LOCK_VIEW_LEN - 1]), None);

        for d in [Decision::Keep, Decision::ReleaseNow, Decision::ReleaseAfter { ms: 250 }] {
            assert_eq!(decode_decision(encode_decision(d)), Some(d));
        }
        assert_eq!(decode_decision(encode_decision(Decision::ReleaseAfter { ms: 0 })), Some(Decision::ReleaseNow));
        assert_eq!(decode_decision(-1), None);
        let i = Interest { inodelk_count: false, open_fd_count: true };
        assert_eq!(interest_from_bits(interest_bits(i)), i);
    }

    #[test]
    fn policy_exports_are_probed_from_v1_1_on() {
        let names = ["xlfs_init", "xlfs_ra_open", "xlfs_ra_read", "xlfs_ra_reset", "xlfs_ra_close", "xlfs_lock_decide"];
        let p = PolicyExports::probe(AbiVersion::new(1, 1), names.iter().copied());
        assert_eq!(p, PolicyExports { read_ahead: true, lock_contention: false });
        assert_eq!(PolicyExports::probe(AbiVersion::new(1, 0), names.iter().copied()), PolicyExports::default());
    }
}
