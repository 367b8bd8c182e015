//! The checks of the runtime's fuzz targets (`runtime/fuzz`: the volfile
//! parser and validation, every translator's option value parsers, the
//! mount options), run in CI for a bounded time: a few thousand seeded
//! mutations of real inputs each. `cargo fuzz` runs them open-ended.

#[path = "../fuzz/src/lib.rs"]
mod checks;

use xlfs_sdk::testing::Rng;

const TOKENS: &[&[u8]] = &[
    b"\n",
    b" ",
    b"volume ",
    b"end-volume\n",
    b"option ",
    b"subvolumes ",
    b"type ",
    b"#",
    b"=",
    b",",
    b"-1",
    b"0",
    b"18446744073709551616",
    b"1e308",
    b"NaN",
    b"%",
    b"KB",
    b"PB",
    b"\0",
    b"\xff\xfe",
    b"on",
    b"off",
];

/// `seed` changed in one to four places: bytes flipped, cut out, or
/// tokens put in.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.index(4) {
        let at = rng.index(v.len() + 1);
        match rng.index(4) {
            0 if at < v.len() => v[at] ^= 1 << rng.index(8),
            1 if at < v.len() => {
                let end = (at + rng.index(16)).min(v.len());
                v.drain(at..end);
            }
            _ => {
                let t = TOKENS[rng.index(TOKENS.len())];
                v.splice(at..at, t.iter().copied());
            }
        }
    }
    v
}

fn run(seeds: &[Vec<u8>], n: usize, check: fn(&[u8])) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for s in seeds {
        check(s);
    }
    for _ in 0..n {
        let seed = &seeds[rng.index(seeds.len())];
        check(&mutate(&mut rng, seed));
    }
}

fn fixtures() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    for d in [dir.clone(), dir.join("gluster-volfiles")] {
        for e in std::fs::read_dir(&d).expect("fixtures").flatten() {
            if e.path().extension().is_some_and(|x| x == "vol") {
                out.push(std::fs::read(e.path()).expect("fixture"));
            }
        }
    }
    assert!(out.len() >= 5, "fixtures found: {}", out.len());
    out
}

#[test]
fn the_volfile_parser_survives_mutated_volfiles() {
    run(&fixtures(), 3000, checks::volfile);
}

#[test]
fn option_parsers_survive_mutated_values() {
    let values = ["on", "128KB", "10%", "600", "1.5", "a,b,c", "/abs/path", "inodelk-count", "3s", "-1", ""];
    let seeds: Vec<Vec<u8>> =
        (0..=255u8).flat_map(|t| values.iter().map(move |v| [&[t][..], v.as_bytes()].concat())).collect();
    run(&seeds, 20_000, checks::options);
}

#[test]
fn the_mount_option_parser_survives_mutated_options() {
    let seeds: Vec<Vec<u8>> = [
        "entry-timeout=1,attribute-timeout=1,negative-timeout=0",
        "writeback-cache,noatime,max-write=1048576,reader-threads=2",
        "backup-volfile-servers=h1:h2:24007,log-level=DEBUG,rw,nosuid",
        "acl,selinux,allow-other,default-permissions,direct-io-mode=on",
        "",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    run(&seeds, 5000, checks::mount_options);
}
