//! `ra-tolerant`: the out-of-order-tolerant read-ahead policy as a policy
//! plugin (plugin ABI v1.1). It reuses the SDK's `tolerant` policy
//! (`xlfs_sdk::policy::read_ahead::Tolerant`) under its own name: a read
//! belongs to the sequential stream when it starts within one window
//! (`page_count` pages) behind or ahead of the furthest read, so requests
//! the kernel and io-threads reordered neither reset the window nor drop
//! prefetched pages.
//!
//! Load it with performance/read-ahead's option
//! `policy wasm:/path/xlfs_plugin_ra_tolerant.wasm` (or
//! `dylib:/path/libxlfs_plugin_ra_tolerant.so`).

use xlfs_sdk::policy::read_ahead::{Geometry, ReadAheadPolicy, ReadAheadStream, Tolerant};

/// The policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct RaTolerant;

impl ReadAheadPolicy for RaTolerant {
    fn name(&self) -> &str {
        "ra-tolerant"
    }
    fn open(&self, geo: Geometry) -> Box<dyn ReadAheadStream> {
        Tolerant.open(geo)
    }
}

xlfs_sdk::export_policy!(read_ahead = RaTolerant);

#[cfg(test)]
mod tests {
    use super::*;
    use xlfs_sdk::policy::read_ahead::{Advice, GlusterStrict, Range, ReadInfo};

    const GEO: Geometry = Geometry { page_size: 4096, page_count: 4 };

    fn feed(p: &dyn ReadAheadPolicy, offsets: &[u64]) -> Vec<Advice> {
        let mut s = p.open(GEO);
        offsets.iter().map(|o| s.on_read(ReadInfo { offset: o * 4096, size: 4096, at_ns: 0 })).collect()
    }

    #[test]
    fn reordered_sequential_reads_keep_the_window() {
        // Requests of a sequential stream, each moved up to three places.
        let order = [1, 0, 3, 2, 5, 7, 4, 6, 8, 11, 10, 9, 12];
        let advices = feed(&RaTolerant, &order);
        assert!(advices.iter().all(|a| !a.reset));
        let furthest = advices.iter().flat_map(|a| a.prefetch.iter().map(Range::end)).max();
        assert_eq!(furthest, Some(13 * 4096 + GEO.window()));
        // Pages leave only once they are a window behind the furthest read.
        assert_eq!(advices.last().map(|a| a.drop.clone()), Some(vec![Range { offset: 0, len: 9 * 4096 }]));
        // GlusterFS's rule resets on the same stream.
        assert!(feed(&GlusterStrict, &order).iter().filter(|a| a.reset).count() >= 5);
    }

    #[test]
    fn a_far_seek_restarts_and_drops_everything() {
        let advices = feed(&RaTolerant, &[0, 1, 1000, 1001]);
        assert!(advices[2].reset && advices[2].drop == vec![Range::ALL]);
        assert!(!advices[3].reset && !advices[3].prefetch.is_empty());
        assert!(!advices[0].reset, "the first read is not a reset");
    }
}
