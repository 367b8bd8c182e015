//! `ra-tolerant`: an out-of-order-tolerant read-ahead policy written
//! against `xlfs_sdk::policy::read_ahead` alone. A read belongs to the
//! stream when it starts no more than `page_count` pages behind the
//! furthest byte read so far and no more than that ahead of it; anything
//! else restarts the stream. It keeps `page_count` pages prefetched past
//! the furthest read and drops pages once they fall out of the backward
//! window.
//!
//! The plugin hosts do not load policy modules yet (ABI v1.0 has no policy
//! exports), so this crate is a library of the decision, tested here; the
//! built-in `tolerant` policy makes the same decisions inside xlfs.

use xlfs_sdk::policy::read_ahead::{Advice, Geometry, Range, ReadAheadPolicy, ReadAheadStream, ReadInfo};

/// The policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct RaTolerant;

/// Its state for one fd.
pub struct Stream {
    geo: Geometry,
    /// The furthest byte read, or None before the first read.
    furthest: Option<u64>,
    /// Prefetched (or read) up to here.
    ahead: u64,
}

impl ReadAheadPolicy for RaTolerant {
    fn name(&self) -> &str {
        "ra-tolerant"
    }
    fn open(&self, geo: Geometry) -> Box<dyn ReadAheadStream> {
        Box::new(Stream { geo, furthest: None, ahead: 0 })
    }
}

impl ReadAheadStream for Stream {
    fn on_read(&mut self, r: ReadInfo) -> Advice {
        let (window, end) = (self.geo.window().max(r.size), r.offset.saturating_add(r.size));
        let in_stream = self.furthest.is_some_and(|f| r.offset.saturating_add(window) >= f && r.offset <= f.saturating_add(window));
        let mut advice = Advice::default();
        if !in_stream {
            advice.reset = self.furthest.is_some();
            advice.drop.push(Range::ALL);
            self.furthest = Some(end);
            self.ahead = self.geo.page_ceil(end);
            return advice;
        }
        let furthest = self.furthest.unwrap_or(end).max(end);
        self.furthest = Some(furthest);
        let from = self.ahead.max(self.geo.page_floor(furthest));
        let to = self.geo.page_ceil(furthest.saturating_add(self.geo.window()));
        if to > from {
            advice.prefetch.push(Range { offset: from, len: to - from });
            self.ahead = to;
        }
        let behind = self.geo.page_floor(furthest.saturating_sub(window));
        if behind > 0 {
            advice.drop.push(Range { offset: 0, len: behind });
        }
        advice
    }
    fn reset_cache(&mut self, geo: Geometry) {
        self.geo = geo;
        self.ahead = self.furthest.map_or(0, |f| geo.page_ceil(f));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEO: Geometry = Geometry { page_size: 4096, page_count: 4 };

    fn feed(offsets: &[u64]) -> Vec<Advice> {
        let mut s = RaTolerant.open(GEO);
        offsets.iter().map(|o| s.on_read(ReadInfo { offset: o * 4096, size: 4096, at_ns: 0 })).collect()
    }

    #[test]
    fn reordered_sequential_reads_keep_the_window() {
        // Requests of a sequential stream, each moved up to three places.
        let advices = feed(&[1, 0, 3, 2, 5, 7, 4, 6, 8, 11, 10, 9, 12]);
        assert!(advices.iter().all(|a| !a.reset));
        let furthest = advices.iter().flat_map(|a| a.prefetch.iter().map(Range::end)).max();
        assert_eq!(furthest, Some(13 * 4096 + GEO.window()));
        // Pages leave only once they are a window behind the furthest read.
        assert_eq!(advices.last().map(|a| a.drop.clone()), Some(vec![Range { offset: 0, len: 9 * 4096 }]));
    }

    #[test]
    fn a_far_seek_restarts_and_drops_everything() {
        let advices = feed(&[0, 1, 1000, 1001]);
        assert!(advices[2].reset && advices[2].drop == vec![Range::ALL]);
        assert!(!advices[3].reset && !advices[3].prefetch.is_empty());
        assert!(!advices[0].reset, "the first read is not a reset");
    }
}
