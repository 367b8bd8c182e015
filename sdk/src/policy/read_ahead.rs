//! The read-ahead policy: which ranges of a file performance/read-ahead
//! prefetches and which of its cached pages it drops.
//!
//! The translator opens one [`ReadAheadStream`] per fd (from
//! [`ReadAheadPolicy::open`], told the page geometry), shows it every read
//! of the fd as a [`ReadInfo`] (offset, size, time) and answers the stream's
//! [`Advice`]: ranges to prefetch and ranges to drop. When the fd is
//! released the stream is closed ([`ReadAheadStream::close`]) and the
//! translator drops everything it cached for the fd.
//!
//! Built-in policies ([`builtin`]):
//! - `tolerant` ([`Tolerant`], the default): a read counts as part of the
//!   sequential stream when it lands within the window behind the furthest
//!   read seen (a backward seek window, as mountpoint-s3's prefetcher keeps)
//!   or within the window ahead of it. Requests that the kernel's
//!   read-ahead and the client's io-threads reordered therefore neither
//!   reset the window nor throw prefetched pages away.
//! - `gluster-strict` ([`GlusterStrict`]): GlusterFS's old rule: any read
//!   not at exactly the offset where the previous read ended is random: the
//!   window is reset and every cached page dropped. Kept to compare against.
//!
//! All offsets the policies hand back are page-aligned and computed with
//! saturating arithmetic, so any offset a client sends is safe.
//!
//! Other policies come from plugin modules: the graph offers a loader per
//! scheme ([`Policies`](super::Policies)), which maps an option value such
//! as `wasm:/path/ra.wasm` to one (the translator's `policy` option).

use std::sync::Arc;

/// A byte range `[offset, offset + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Range {
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Range {
    /// Every byte of the file.
    pub const ALL: Range = Range { offset: 0, len: u64::MAX };

    /// One past the last byte (saturating).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// The page geometry the translator caches with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per page (at least 1).
    pub page_size: u64,
    /// Pages to keep prefetched ahead of the reader.
    pub page_count: u32,
}

impl Geometry {
    /// The prefetch window in bytes: `page_size * page_count`.
    pub fn window(&self) -> u64 {
        self.page_size.max(1).saturating_mul(u64::from(self.page_count))
    }

    /// `offset` rounded down to a page boundary.
    pub fn page_floor(&self, offset: u64) -> u64 {
        offset - offset % self.page_size.max(1)
    }

    /// `offset` rounded up to a page boundary (saturating).
    pub fn page_ceil(&self, offset: u64) -> u64 {
        let ps = self.page_size.max(1);
        match offset % ps {
            0 => offset,
            r => offset.saturating_add(ps - r),
        }
    }
}

/// One read of the fd, as the translator received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadInfo {
    /// Offset of the read.
    pub offset: u64,
    /// Bytes asked for.
    pub size: u64,
    /// When it arrived: a monotonic clock in nanoseconds.
    pub at_ns: u64,
}

/// A stream's answer to one read.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Advice {
    /// Ranges to prefetch (page-aligned); the translator skips pages it
    /// already has or is fetching.
    pub prefetch: Vec<Range>,
    /// Ranges whose cached pages to drop (a page is dropped when it lies
    /// wholly inside one).
    pub drop: Vec<Range>,
    /// True when the policy judged the read random and started its window
    /// over (counted in the translator's dump).
    pub reset: bool,
}

/// A read-ahead policy: makes one stream per fd. Must not block.
pub trait ReadAheadPolicy: Send + Sync + 'static {
    /// The name it was chosen by.
    fn name(&self) -> &str;
    /// The state for a newly opened fd.
    fn open(&self, geometry: Geometry) -> Box<dyn ReadAheadStream>;
}

/// The policy's state for one fd.
pub trait ReadAheadStream: Send + 'static {
    /// A read of the fd arrived; what to prefetch and drop.
    fn on_read(&mut self, read: ReadInfo) -> Advice;
    /// The translator emptied the fd's cache (a write to the inode, or a
    /// reconfigure, which may bring a new geometry): prefetch again from
    /// where the stream is.
    fn reset_cache(&mut self, geometry: Geometry);
    /// The fd is being released (the translator drops its pages anyway).
    fn close(&mut self) {}
}

/// The sequential-stream state both built-ins keep.
#[derive(Clone, Copy, Debug)]
struct Window {
    geo: Geometry,
    /// False until the first read.
    started: bool,
    /// Where the stream is expected to continue.
    next: u64,
    /// Everything below this is prefetched (or was read).
    prefetched_to: u64,
}

impl Window {
    fn new(geo: Geometry) -> Window {
        Window { geo, started: false, next: 0, prefetched_to: 0 }
    }

    /// Starts the stream over at the end of `read`; drops every page.
    fn reset(&mut self, end: u64, count: bool) -> Advice {
        let was = self.started;
        self.started = true;
        self.next = end;
        self.prefetched_to = self.geo.page_ceil(end);
        Advice { prefetch: Vec::new(), drop: vec![Range::ALL], reset: was && count }
    }

    /// The read continues the stream: move on and keep `window` bytes
    /// prefetched ahead; drop pages more than `keep_behind` bytes behind.
    fn advance(&mut self, next: u64, keep_behind: u64) -> Advice {
        self.next = next;
        let start = self.prefetched_to.max(self.geo.page_floor(next));
        let target = self.geo.page_ceil(next.saturating_add(self.geo.window()));
        let mut advice = Advice::default();
        if target > start {
            advice.prefetch.push(Range { offset: start, len: target - start });
            self.prefetched_to = target;
        }
        let behind = self.geo.page_floor(next.saturating_sub(keep_behind));
        if behind > 0 {
            advice.drop.push(Range { offset: 0, len: behind });
        }
        advice
    }
}

/// `tolerant`: sequential streams survive bounded reordering.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tolerant;

struct TolerantStream(Window);

impl ReadAheadPolicy for Tolerant {
    fn name(&self) -> &str {
        "tolerant"
    }
    fn open(&self, geometry: Geometry) -> Box<dyn ReadAheadStream> {
        Box::new(TolerantStream(Window::new(geometry)))
    }
}

impl ReadAheadStream for TolerantStream {
    fn on_read(&mut self, read: ReadInfo) -> Advice {
        let w = &mut self.0;
        let end = read.offset.saturating_add(read.size);
        if !w.started {
            return w.reset(end, false);
        }
        // In the stream: not further behind the furthest read than the
        // window (a late, reordered request), not further ahead than the
        // window (an early one).
        let window = w.geo.window().max(read.size);
        let behind_ok = read.offset.saturating_add(window) >= w.next;
        let ahead_ok = read.offset <= w.next.saturating_add(window);
        if !(behind_ok && ahead_ok) {
            return w.reset(end, true);
        }
        let next = w.next.max(end);
        w.advance(next, window)
    }
    fn reset_cache(&mut self, geometry: Geometry) {
        self.0 = Window { geo: geometry, prefetched_to: geometry.page_ceil(self.0.next), ..self.0 };
    }
}

/// `gluster-strict`: any read not at the previous read's end resets.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlusterStrict;

struct StrictStream(Window);

impl ReadAheadPolicy for GlusterStrict {
    fn name(&self) -> &str {
        "gluster-strict"
    }
    fn open(&self, geometry: Geometry) -> Box<dyn ReadAheadStream> {
        Box::new(StrictStream(Window::new(geometry)))
    }
}

impl ReadAheadStream for StrictStream {
    fn on_read(&mut self, read: ReadInfo) -> Advice {
        let w = &mut self.0;
        let end = read.offset.saturating_add(read.size);
        if !w.started || read.offset != w.next {
            return w.reset(end, true);
        }
        // GlusterFS keeps no pages behind the reader.
        w.advance(end, 0)
    }
    fn reset_cache(&mut self, geometry: Geometry) {
        self.0 = Window { geo: geometry, prefetched_to: geometry.page_ceil(self.0.next), ..self.0 };
    }
}

/// The default policy's name (and what a policy from a plugin module falls
/// back to when it fails).
pub const DEFAULT: &str = "tolerant";

/// The names of the built-in policies.
pub const BUILTIN: &[&str] = &["tolerant", "gluster-strict"];

/// A built-in policy by name.
pub fn builtin(name: &str) -> Option<Arc<dyn ReadAheadPolicy>> {
    match name.trim() {
        "tolerant" => Some(Arc::new(Tolerant)),
        "gluster-strict" => Some(Arc::new(GlusterStrict)),
        _ => None,
    }
}

pub use super::PolicyError;

/// Builds a policy from the part of the option value after `scheme:`.
pub type Loader = super::Loader<dyn ReadAheadPolicy>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GEO: Geometry = Geometry { page_size: 4096, page_count: 4 };

    fn read(offset: u64, size: u64) -> ReadInfo {
        ReadInfo { offset, size, at_ns: 0 }
    }

    /// Feeds the reads; returns (resets, furthest prefetched byte, advices).
    fn run(policy: &dyn ReadAheadPolicy, reads: &[ReadInfo]) -> (usize, u64, Vec<Advice>) {
        let mut s = policy.open(GEO);
        let advices: Vec<Advice> = reads.iter().map(|r| s.on_read(*r)).collect();
        let resets = advices.iter().filter(|a| a.reset).count();
        let furthest = advices.iter().flat_map(|a| a.prefetch.iter().map(Range::end)).max().unwrap_or(0);
        (resets, furthest, advices)
    }

    #[test]
    fn sequential_reads_prefetch_one_window_ahead_under_both() {
        let reads: Vec<ReadInfo> = (0..8).map(|i| read(i * 4096, 4096)).collect();
        for p in [builtin("tolerant").expect("t"), builtin("gluster-strict").expect("s")] {
            let (resets, furthest, advices) = run(p.as_ref(), &reads);
            assert_eq!(resets, 0, "{}", p.name());
            assert_eq!(furthest, 8 * 4096 + GEO.window(), "{}", p.name());
            // The second read prefetches the whole window after it.
            assert_eq!(advices[1].prefetch, vec![Range { offset: 2 * 4096, len: GEO.window() }]);
            // Every later read tops the window up by exactly one page.
            for a in &advices[2..] {
                assert_eq!(a.prefetch.iter().map(|r| r.len).sum::<u64>(), 4096, "{}", p.name());
                assert!(a.prefetch.iter().all(|r| r.offset % 4096 == 0));
            }
        }
    }

    #[test]
    fn a_far_seek_resets_both_and_drops_everything() {
        for p in [builtin("tolerant").expect("t"), builtin("gluster-strict").expect("s")] {
            let (resets, _, advices) = run(p.as_ref(), &[read(0, 4096), read(4096, 4096), read(1 << 30, 4096)]);
            assert_eq!(resets, 1, "{}", p.name());
            assert!(advices[2].reset && advices[2].drop == vec![Range::ALL] && advices[2].prefetch.is_empty());
        }
    }

    #[test]
    fn a_swapped_pair_resets_strict_only() {
        let reads = [read(0, 4096), read(2 * 4096, 4096), read(4096, 4096), read(3 * 4096, 4096)];
        assert_eq!(run(&Tolerant, &reads).0, 0);
        assert_eq!(run(&GlusterStrict, &reads).0, 3);
    }

    #[test]
    fn tolerant_drops_pages_behind_its_back_window_only() {
        let reads: Vec<ReadInfo> = (0..10).map(|i| read(i * 4096, 4096)).collect();
        let (_, _, advices) = run(&Tolerant, &reads);
        let last = advices.last().expect("advice");
        assert_eq!(last.drop, vec![Range { offset: 0, len: 10 * 4096 - GEO.window() }]);
        let (_, _, strict) = run(&GlusterStrict, &reads);
        assert_eq!(strict.last().expect("advice").drop, vec![Range { offset: 0, len: 10 * 4096 }]);
    }

    #[test]
    fn hostile_offsets_do_not_overflow() {
        for p in [builtin("tolerant").expect("t"), builtin("gluster-strict").expect("s")] {
            let (_, _, advices) =
                run(p.as_ref(), &[read(u64::MAX - 5, u64::MAX), read(u64::MAX, 1), read(u64::MAX, 1)]);
            for a in advices {
                for r in a.prefetch {
                    assert!(r.offset.checked_add(r.len).is_some(), "{r:?}");
                }
            }
        }
        assert!(builtin("nope").is_none());
        let policies = super::super::Policies::default();
        let e = policies.read_ahead("nope").err().expect("unknown");
        assert!(
            e.to_string().starts_with("unknown read-ahead policy 'nope': expected one of tolerant, gluster-strict"),
            "{e}"
        );
        assert_eq!(policies.read_ahead(" gluster-strict ").expect("builtin").name(), "gluster-strict");
        assert_eq!(
            BUILTIN.iter().filter_map(|n| builtin(n)).map(|p| p.name().to_string()).collect::<Vec<_>>(),
            BUILTIN
        );
    }

    #[test]
    fn reset_cache_keeps_the_stream() {
        let mut s = Tolerant.open(GEO);
        s.on_read(read(0, 4096));
        s.on_read(read(4096, 4096));
        s.reset_cache(Geometry { page_size: 8192, page_count: 2 });
        let a = s.on_read(read(8192, 4096));
        assert!(!a.reset);
        assert_eq!(a.prefetch, vec![Range { offset: 8192, len: 24576 }]);
    }

    /// A sequential stream of `n` reads of `size` bytes, shuffled inside
    /// consecutive blocks of `block` reads (each request moves fewer than
    /// `block` places), as kernel read-ahead plus io-threads deliver them.
    fn reordered(n: usize, size: u64, block: usize, seed: u64) -> Vec<ReadInfo> {
        let mut order: Vec<usize> = (0..n).collect();
        let mut x = seed | 1;
        for chunk in order.chunks_mut(block) {
            for i in (1..chunk.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.swap(i, (x % (i as u64 + 1)) as usize);
            }
        }
        order.into_iter().map(|i| read(i as u64 * size, size)).collect()
    }

    proptest! {
        #[test]
        fn bounded_reordering_keeps_the_tolerant_window_and_resets_strict(
            n in 2usize..64,
            size_pages in 1u64..=2,
            block in 2usize..=4,
            seed in any::<u64>(),
        ) {
            // Reads of up to two pages reordered within blocks of up to
            // page_count reads stay within one window of the stream.
            let size = size_pages * GEO.page_size;
            let reads = reordered(n, size, block.min(GEO.page_count as usize / size_pages as usize), seed);
            let sorted = reads.windows(2).all(|w| w[0].offset < w[1].offset);
            let end = n as u64 * size;
            let (resets, furthest, _) = run(&Tolerant, &reads);
            prop_assert_eq!(resets, 0);
            prop_assert!(furthest >= end.min(GEO.page_ceil(end)), "window lost: {} < {}", furthest, end);
            let (strict_resets, _, _) = run(&GlusterStrict, &reads);
            if sorted {
                prop_assert_eq!(strict_resets, 0);
            } else {
                prop_assert!(strict_resets >= 1);
            }
        }
    }
}
