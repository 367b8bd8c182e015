//! Client volfiles over bricks already serving on known loopback ports,
//! without a daemon: the graphs the end-to-end tests and benches mount
//! (the same shape volgen gives a volume with default keys).

use super::replica_sets;

/// The performance translators of the default client graph, top first.
/// GlusterFS's volgen puts md-cache, open-behind, quick-read, ...,
/// readdir-ahead, ..., write-behind between io-stats and the cluster
/// translators; here quick-read sits above open-behind, so a read it
/// answers from the lookup's content never makes open-behind open the file,
/// and the flush and release that follow are answered by open-behind:
/// reading a small file costs only its lookup. readdir-ahead sits below
/// md-cache (which fills its caches from the entries it serves) and above
/// write-behind (which corrects the attributes of entries with queued
/// writes in the readdirps it sends).
pub const DEFAULT_PERF: &[&str] = &["md-cache", "quick-read", "open-behind", "readdir-ahead", "write-behind"];

/// The client volfile of a replicated volume named `volume` over bricks
/// served on 127.0.0.1 (`(port, remote-subvolume)` each), as GlusterFS
/// generates for a replica volume: one protocol/client per brick
/// (`<volume>-client-<i>`), cluster/replicate over them
/// (`<volume>-replicate-0`, with `afr` options added), the
/// [`DEFAULT_PERF`] translators (`<volume>-<name>`) and debug/io-stats
/// named `volume` on top. Used by the end-to-end tests and benches.
pub fn replica_volfile(volume: &str, bricks: &[(u16, String)], afr: &[(&str, &str)]) -> String {
    client_volfile(volume, bricks, afr, DEFAULT_PERF)
}

/// Options the generated graph sets on a performance translator. The
/// bricks run features/upcall, so the caches trust what they hold until
/// an invalidation (as GlusterFS's recommended `group metadata-cache`
/// settings: md-cache-timeout 600 with cache-invalidation on).
pub(crate) fn perf_options(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        "md-cache" => &[("md-cache-timeout", "600"), ("cache-invalidation", "on")],
        "quick-read" => &[("cache-invalidation", "on"), ("fetch-on-read", "on")],
        // Keep a whole request's worth ahead of the reader: the fill
        // resumes while a full 128 KiB remains (two FUSE batches), instead
        // of when the buffer is nearly empty and the next readdirp waits.
        "readdir-ahead" => &[("rda-low-wmark", "128KB"), ("rda-high-wmark", "256KB")],
        _ => &[],
    }
}

/// [`replica_volfile`] with the given performance translators (names of
/// `performance/<name>` types, top first) instead of the default ones.
pub fn client_volfile(volume: &str, bricks: &[(u16, String)], afr: &[(&str, &str)], perf: &[&str]) -> String {
    distributed_volfile(volume, bricks, bricks.len().max(1), afr, perf)
}

/// [`client_volfile`] with the bricks in replica sets of `replica`
/// (`<volume>-replicate-<s>` over bricks `s*replica ..`), and, when there
/// is more than one set, cluster/distribute (`<volume>-dht`) over the sets;
/// a last set with fewer bricks takes what is left.
pub fn distributed_volfile(
    volume: &str,
    bricks: &[(u16, String)],
    replica: usize,
    afr: &[(&str, &str)],
    perf: &[&str],
) -> String {
    let clients: Vec<String> = (0..bricks.len()).map(|i| format!("{volume}-client-{i}")).collect();
    let mut v = String::new();
    for ((port, subvol), name) in bricks.iter().zip(&clients) {
        v += &format!(
            "volume {name}\n    type protocol/client\n    option remote-host 127.0.0.1\n    option remote-port {port}\n    \
             option remote-subvolume {subvol}\nend-volume\n\n"
        );
    }
    let afr: String = afr.iter().map(|(k, val)| format!("    option {k} {val}\n")).collect();
    let mut below = replica_sets(&mut v, volume, &clients, replica, &afr, "");
    for p in perf.iter().rev() {
        let name = format!("{volume}-{p}");
        v += &format!("volume {name}\n    type performance/{p}\n");
        for (k, val) in perf_options(p) {
            v += &format!("    option {k} {val}\n");
        }
        v += &format!("    subvolumes {below}\nend-volume\n\n");
        below = name;
    }
    v += &format!("volume {volume}\n    type debug/io-stats\n    subvolumes {below}\nend-volume\n");
    v
}
