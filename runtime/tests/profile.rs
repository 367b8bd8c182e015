//! `xlfs profile`, end to end: three `xlfs brick` processes, an `xlfs
//! mount` of the default replica-3 client graph, some file operations, then
//! the profile of the mount (its graph joined with each brick's over the
//! wire), of one brick asked directly, as JSON, and after a reset.

mod kit;

use std::io::Write;
use std::os::unix::fs::MetadataExt;

use kit::Cluster;
use kit::fuse_mount::FuseMount;

/// Runs `xlfs profile ARGS`; panics unless it succeeds; returns stdout.
fn profile(args: &[&str]) -> String {
    let mut all = vec!["profile"];
    all.extend_from_slice(args);
    let out = kit::run_xlfs(&all);
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "xlfs {all:?} failed: {stderr}\n{stdout}");
    stdout
}

/// The calls column of the rows of `fop`'s table whose translator part
/// contains `needle` (`(storage/posix) brick`).
fn calls(text: &str, fop: &str, needle: &str) -> Vec<u64> {
    // (translator and where, calls): a translator with calls both in the
    // callers' latency and behind it (an fsync that found its file's write
    // not yet sent carried it, in the fsync's own round: write-behind's
    // "fsync in one round"; the other writes went behind) has a row in
    // each table, summed here.
    let mut out: Vec<(String, u64)> = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            inside = line.starts_with(&format!("{fop}: "));
            continue;
        }
        // A translator's wait for other fops is a row of its own.
        if inside && line.contains(needle) && !line.contains("self us/call") && !line.contains("waiting for other fops")
        {
            let words: Vec<&str> = line.split_whitespace().collect();
            let n: u64 = words[3].parse().unwrap_or_else(|_| panic!("calls column in {line:?}"));
            let who = words[5..].join(" ");
            match out.iter_mut().find(|(w, _)| *w == who) {
                Some((_, c)) => *c += n,
                None => out.push((who, n)),
            }
        }
    }
    out.into_iter().map(|(_, n)| n).collect()
}

/// The calls of the row of `fop`'s table, in the callers' latency (not
/// behind), whose translator part contains `needle`; 0 without one.
fn calls_in_latency(text: &str, fop: &str, needle: &str) -> u64 {
    let mut inside = false;
    for line in text.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            inside = line.starts_with(&format!("{fop}: "));
            continue;
        }
        if inside && line.contains("behind, in no caller's latency") {
            return 0;
        }
        // A translator's wait for other fops is a row of its own.
        if inside && line.contains(needle) && !line.contains("self us/call") && !line.contains("waiting for other fops")
        {
            return line.split_whitespace().nth(3).and_then(|n| n.parse().ok()).unwrap_or(0);
        }
    }
    0
}

#[test]
fn profile_shows_each_translator_of_the_mount_and_its_bricks() {
    let c = Cluster::start(3);
    let m = FuseMount::start(&c.replica_volfile(&[]), "");
    let dir = m.path().join("d");
    std::fs::create_dir(&dir).expect("mkdir");
    for i in 0..8 {
        let mut f = std::fs::File::create(dir.join(format!("f{i}"))).expect("create");
        f.write_all(&vec![i as u8; 64 << 10]).expect("write");
        f.sync_all().expect("fsync");
    }
    for i in 0..8 {
        let p = dir.join(format!("f{i}"));
        assert_eq!(std::fs::metadata(&p).expect("stat").size(), 64 << 10);
        assert_eq!(std::fs::read(&p).expect("read").len(), 64 << 10);
    }

    let text = profile(&[m.path().to_str().expect("utf-8")]);
    for (what, want, fop, needle) in [
        ("the wire of each protocol/client", 3, "WRITE", "network+queue (protocol/client) mount"),
        ("replicate", 1, "WRITE", "(cluster/replicate) mount"),
        ("each brick's posix", 3, "WRITE", "(storage/posix) brick 127.0.0.1:"),
        ("each brick's io-threads", 3, "FSYNC", "(performance/io-threads) brick 127.0.0.1:"),
    ] {
        let n = calls(&text, fop, needle);
        assert_eq!(n.len(), want, "{what}: {want} {fop} rows with {needle:?} in\n{text}");
        assert!(n.iter().all(|&k| k > 0), "{what}: calls counted in\n{text}");
    }
    assert!(!text.contains("not reached"), "every brick answered:\n{text}");
    // Each row's part of the top's time: the parts add up to the top's
    // total (write-behind answers writes and sends them behind, in their
    // own table; replicate's three clients share its wait).
    for fop in ["WRITE", "FSYNC"] {
        let head = text.lines().find(|l| l.starts_with(&format!("{fop}: "))).expect("fop line");
        let pct: f64 = head
            .rsplit_once('(')
            .and_then(|(_, p)| p.strip_suffix(" %)"))
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no sum in {head:?}"));
        // When some writes went with their fsync and the rest behind,
        // the rows below replicate are estimated from per-call means over
        // both kinds and the sum strays (82-94 % seen, with or without
        // features/utime): checked only when every write went behind.
        if fop == "WRITE" && calls_in_latency(&text, fop, "(cluster/replicate) mount") > 0 {
            continue;
        }
        assert!((95.0..=105.0).contains(&pct), "{fop}'s rows add up to its top total:\n{text}");
    }
    assert!(text.contains("behind, in no caller's latency"), "write-behind's writes are behind:\n{text}");

    let json = profile(&["--json", m.path().to_str().expect("utf-8")]);
    assert!(json.starts_with("{\"graph\":\"rep3\"") && json.contains("\"type\":\"storage/posix\""), "{json}");
    assert_eq!(json.matches("\"reached\":true").count(), 3, "{json}");

    let b = &c[0];
    let alone = profile(&["--brick", &format!("127.0.0.1:{}", b.port()), "--subvolume", &b.subvolume()]);
    let n = calls(&alone, "WRITE", "(storage/posix) brick");
    assert!(n.len() == 1 && n[0] > 0, "one brick asked directly:\n{alone}");
    assert!(!alone.contains("network+queue"), "{alone}");

    profile(&["--reset", m.path().to_str().expect("utf-8")]);
    let after = profile(&[m.path().to_str().expect("utf-8")]);
    assert!(calls(&after, "WRITE", "").is_empty(), "no writes since the reset:\n{after}");
}
