//! Runs the built `xlfs` binary's `volfile check` on real GlusterFS
//! volfiles and on the test volfiles in `tests/fixtures/`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> PathBuf {
    manifest().join("tests/fixtures").join(name)
}

/// Runs `xlfs volfile check PATH`: (success, stdout, stderr).
fn check(path: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xlfs"))
        .args(["volfile", "check"])
        .arg(path)
        .env_remove("XLFS_LOG")
        .env_remove("RUST_LOG")
        .output()
        .expect("xlfs runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Expects a failure whose stderr names `path:line` and contains every needle.
fn fails_at(name: &str, line: usize, needles: &[&str]) {
    let path = fixture(name);
    let (ok, stdout, stderr) = check(&path);
    assert!(!ok, "{name} should fail; stdout:\n{stdout}");
    assert!(stdout.is_empty(), "{name}: nothing on stdout on failure, got:\n{stdout}");
    let at = format!("{}:{line}: ", path.display());
    assert!(stderr.contains(&at), "{name}: expected '{at}' in stderr:\n{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{name}: expected {n:?} in stderr:\n{stderr}");
    }
}

#[test]
fn gluster_brick_volfile_names_first_type_not_built_in() {
    let path = manifest().join("tests/fixtures/gluster-volfiles/replica3-brick.vol");
    let (ok, _, stderr) = check(&path);
    assert!(!ok);
    assert!(stderr.contains(&format!("{}:10: ", path.display())), "{stderr}");
    assert!(stderr.contains("volume 'rep3-trash': unknown type 'features/trash'"), "{stderr}");
    assert!(stderr.contains("known types: ") && stderr.contains("storage/posix"), "{stderr}");
}

#[test]
fn typo_subvolume_keyword() {
    fails_at("typo-subvolume.vol", 8, &["expected 'subvolumes', 'option', 'type' or 'end-volume', found 'subvolume'"]);
}

#[test]
fn unknown_option() {
    fails_at("unknown-option.vol", 3, &["volume 't-posix' (storage/posix)", "unknown option 'directroy'"]);
}

#[test]
fn missing_end_volume() {
    fails_at(
        "missing-end.vol",
        7,
        &["expected 'end-volume' for volume 't-locks' (started at line 5), found end of file"],
    );
}

#[test]
fn cycle() {
    fails_at("cycle.vol", 13, &["cycle in subvolumes: t-locks -> t-errors -> t-locks"]);
}

#[test]
fn two_tops() {
    fails_at("two-tops.vol", 10, &["exactly one top volume", "'t-locks', 't-stray'"]);
}

#[test]
fn missing_file() {
    let (ok, _, stderr) = check(&fixture("no-such.vol"));
    assert!(!ok);
    assert!(stderr.contains("no-such.vol"), "{stderr}");
}

/// Needs the real storage/posix, features/locks and debug/io-stats types
/// (their option declarations), not the placeholders.
#[test]
fn valid_brick_prints_tree_with_effective_options() {
    let path = fixture("brick.vol");
    let (ok, stdout, stderr) = check(&path);
    assert!(ok, "stderr:\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], format!("{}: ok, 3 volumes, top 't'", path.display()));
    assert_eq!(lines[1], "t (debug/io-stats)");
    let locks = lines.iter().position(|l| *l == "└── t-locks (features/locks)").expect("locks under io-stats");
    let posix = lines.iter().position(|l| *l == "    └── t-posix (storage/posix)").expect("posix under locks");
    assert!(locks < posix);
    assert!(lines[posix..].iter().any(|l| l.trim() == "directory /srv/xlfs/t1"), "{stdout}");
    assert!(stdout.contains(" (default)"), "defaulted options are shown and marked:\n{stdout}");
}
