//! The check of the `graph_ops` fuzz target (`xlators-builtin/fuzz`:
//! random fop sequences through replicate over three locks/posix children,
//! checked against a model), run in CI for a bounded time: a few seeded
//! sequences that reach the interesting states (a child down and healed,
//! lock conflicts, directory renames), then a few hundred random ones.
//! `cargo fuzz run graph_ops` runs it open-ended. More cases:
//! `XLFS_GRAPH_OPS_CASES=5000 cargo test -p xlfs-xlators --test graph_ops_survive`.

#[allow(dead_code)] // the decoder's types are there for the fuzz target's use
#[path = "../fuzz/src/graph.rs"]
mod graph;

use std::time::Instant;

use xlfs_sdk::testing::Rng;

/// Hand-made inputs (byte 0: options; then ops as `graph::decode` reads
/// them): each reaches a state random bytes rarely do.
fn seeds() -> Vec<Vec<u8>> {
    vec![
        // create a; write 10 bytes at 5; read at 2; ftruncate to 3; fstat;
        // close.
        vec![0, 0x00, 0, 0, 0x03, 0, 5, 0, 10, 9, 0x06, 0, 2, 0, 20, 0x08, 0, 3, 0, 0x09, 0, 0x0c, 0, 0],
        // With the post-op delay: create a; write; child 2 down; a write
        // it misses; child 2 up (heal); read.
        vec![1, 0x00, 0, 0, 0x03, 0, 0, 0, 16, 1, 0x17, 2, 0x03, 0, 4, 0, 16, 7, 0x8f, 2, 0x06, 0, 0, 0, 30],
        // Two owners: owner 1 write-locks 0..5; owner 2's lock is refused
        // (EAGAIN) and GETLK names owner 1; owner 1 unlocks, owner 2 locks.
        vec![
            0, 0x00, 0, 0, 0x15, 0, 0, 5, 0, 5, 0x15, 0, 1, 5, 0, 5, 0x15, 0, 1, 4, 0, 5, 0x15, 0, 0, 9, 0, 5, 0x15, 0,
            1, 5, 0, 5, 0x0c, 0, 1,
        ],
        // mkdir d; create d/a; rename d to b; list b; rmdir b (ENOTEMPTY);
        // list the root.
        vec![0, 0x0f, 3, 0x00, 4, 0, 0x0e, 3, 1, 0x11, 1, 0x10, 1, 0x11, 3],
        // Offsets past 2^40, near 2^63 and 2^64; a truncate to 2^40; a read
        // there.
        vec![
            0, 0x00, 0, 0, 0x03, 0, 0xd0, 1, 4, 9, 0x03, 0, 0xe0, 3, 4, 9, 0x03, 0, 0xf0, 0, 4, 9, 0x08, 0, 0xd0, 0,
            0x06, 0, 0xd0, 0, 16,
        ],
        // create a; write; close; child 1 down; open a with O_TRUNC; child
        // 1 up; heal: the copy that missed the truncation is healed (it
        // used to stay as it was, unblamed).
        vec![0, 0, 0, 0, 0x03, 0, 0, 0, 0x0a, 0x09, 0x0c, 0, 0, 0x17, 0x01, 0x92, 0, 0],
        // create a; child 0 down; one byte written at 2^40; heal: the
        // source's hole is skipped (it used to be read block by block,
        // millions of them, and the heal never ended).
        vec![0, 0, 0, 0, 0x17, 0x12, 0x03, 0, 0xd0, 0, 0x01, 0x01],
    ]
}

/// Entry heal's stale names (a name removed and made again, a directory
/// replaced by a file, a directory renamed, a file renamed over another,
/// each with a child down), run with namespace changes while one child is
/// down; each failed with EIO in heal before entry heal replaced a sink's
/// name for another inode.
const STALE_NAMES: &[&str] = &[
    "0f0000000c0000170d0d00000000",
    "8f7e7c1e38c49fe5f2bdf447e270799b7bd955",
    "0f0f0117010e0100",
    "6501444cf007a536dc4cfa07171e1826265613",
    // A name linked back (by gfid) to a file the sink had unlinked while
    // open: posix linked it but left its handle parked, and the link failed.
    "8f5badd253e7bd754cdb1aadead50d42925f870e3aeb021b7fcaecbacb39892895a34a6f7617e22904221601268ce5f6d442c03977d57e7c1e38c49fe5eb541b1bcb0385353b44767a0284e512710c46c7a9c5ef977807dbc4e561f2bdf447fc29e27079e6b1e393f1b00ba9fc199cc69b364739483bd1cfcd944a24ac554109826c50bdb25f909b7bd9557a6aea6298914daa8ec840f79bba45",
];

#[test]
fn entry_heal_replaces_a_sinks_stale_names() {
    for hex in STALE_NAMES {
        let bytes: Vec<u8> =
            (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex")).collect();
        if std::panic::catch_unwind(|| graph::check_graph_ops_unfrozen(&bytes)).is_err() {
            panic!("the check failed (above) on the stale-name case {hex}");
        }
    }
}

/// [`graph::check_graph_ops`], naming the input (in hex, for
/// `XLFS_GRAPH_OPS_INPUT`) when it fails.
fn check(input: &[u8]) {
    if std::panic::catch_unwind(|| graph::check_graph_ops(input)).is_err() {
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        panic!("the check failed (above) on input XLFS_GRAPH_OPS_INPUT={hex}");
    }
}

#[test]
fn random_fop_sequences_through_replicate_match_the_model() {
    let cases: usize = std::env::var("XLFS_GRAPH_OPS_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    // One input in hex (a fuzzer artifact, a minimized case) alone.
    if let Ok(hex) = std::env::var("XLFS_GRAPH_OPS_INPUT") {
        let bytes: Vec<u8> =
            (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex input")).collect();
        graph::check_graph_ops(&bytes);
        return;
    }
    let start = Instant::now();
    for s in seeds() {
        check(&s);
    }
    let seed = std::env::var("XLFS_GRAPH_OPS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x243f_6a88_85a3_08d3);
    let mut rng = Rng(seed);
    let mut ops = 0;
    for _ in 0..cases {
        let len = 1 + rng.index(200);
        let input: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        ops += graph::decode(&input).1.len();
        check(&input);
    }
    eprintln!("{cases} random sequences, {ops} ops, in {:?}", start.elapsed());
}
