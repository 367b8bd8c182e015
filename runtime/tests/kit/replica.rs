//! Replica checks: volfiles on disk, `xlfs heal` runs, the bricks' AFR
//! counters, and comparing the bricks' copies.

use super::*;

/// Writes volfile `text` as `dir/client.vol` and returns its path.
pub fn volfile_file(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("client.vol");
    std::fs::write(&p, text).expect("write volfile");
    p
}

/// Runs `xlfs heal --volfile V ARGS`; returns (success, stdout+stderr).
pub fn heal(volfile: &Path, args: &[&str]) -> (bool, String) {
    let mut all = vec!["heal".to_string(), "--volfile".into(), volfile.display().to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    let out = run_xlfs(&all);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Heals (index) until `xlfs heal` says all is clean (bounded: 30 tries):
/// it succeeds with `remaining 0`. A pass may succeed and leave an inode
/// for the next one (one whose heal another healer held the lock of).
pub fn heal_until_clean(volfile: &Path) -> String {
    let mut log = String::new();
    for _ in 0..30 {
        let (ok, text) = heal(volfile, &[]);
        log += &text;
        if ok && text.contains("remaining 0") {
            return log;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("heal did not finish:\n{log}");
}

/// The `trusted.afr.rep3-client-<j>` counters (data, metadata, entry) of a
/// brick file of the kit's replica-3 volume ([`Cluster::replica_volfile`]).
pub fn rep3_counters(path: &Path, j: usize) -> [i32; 3] {
    workload::afr_counters(path, &format!("trusted.afr.rep3-client-{j}"))
}

/// Asserts the cluster's bricks hold the same tree: names, types, gfids,
/// data and size of files, symlink targets, modes of the rest; with
/// `clean`, also that no counter blames anyone. Returns the tree
/// (relative paths).
pub fn assert_bricks_identical(c: &Cluster, clean: bool) -> Vec<PathBuf> {
    let roots: Vec<PathBuf> = c.bricks.iter().map(|b| b.dir().to_path_buf()).collect();
    let counters: Vec<String> = (0..roots.len()).map(|j| format!("trusted.afr.rep3-client-{j}")).collect();
    assert_copies_identical(&roots, &counters, clean)
}

/// [`assert_bricks_identical`] for the copies of one replica set: brick
/// directories `roots`, whose AFR counters are the xattrs `counters`.
pub fn assert_copies_identical(roots: &[PathBuf], counters: &[String], clean: bool) -> Vec<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let want = workload::brick_tree(&roots[0]);
    for r in &roots[1..] {
        assert_eq!(workload::brick_tree(r), want, "names on {} vs {}", r.display(), roots[0].display());
    }
    for rel in &want {
        let p0 = roots[0].join(rel);
        let m0 = p0.symlink_metadata().expect("lstat");
        let g0 = xlfs_sdk::testing::xattr(&p0, "trusted.gfid");
        for r in &roots[1..] {
            let p = r.join(rel);
            let m = p.symlink_metadata().expect("lstat");
            assert_eq!(m0.file_type(), m.file_type(), "type of {}", rel.display());
            assert_eq!(
                g0,
                xlfs_sdk::testing::xattr(&p, "trusted.gfid"),
                "gfid of {} on {}",
                rel.display(),
                r.display()
            );
            if m0.is_file() {
                assert!(
                    std::fs::read(&p0).expect("read") == std::fs::read(&p).expect("read"),
                    "data of {}",
                    rel.display()
                );
                assert_eq!(m0.len(), m.len(), "size of {}", rel.display());
            }
            if m0.file_type().is_symlink() {
                assert_eq!(std::fs::read_link(&p0).expect("readlink"), std::fs::read_link(&p).expect("readlink"));
            } else {
                assert_eq!(m0.permissions().mode(), m.permissions().mode(), "mode of {}", rel.display());
            }
        }
    }
    if clean {
        for r in roots {
            for rel in
                want.iter().filter(|rel| !r.join(rel).symlink_metadata().expect("lstat").file_type().is_symlink())
            {
                for key in counters.iter().map(String::as_str).chain([workload::AFR_DIRTY]) {
                    assert_eq!(
                        workload::afr_counters(&r.join(rel), key),
                        [0, 0, 0],
                        "{} on {} blames {key}",
                        rel.display(),
                        r.display()
                    );
                }
            }
        }
    }
    want
}

/// Runs `xlfs down DIR` when dropped, so a volume `xlfs up` brought up in
/// DIR goes down on every exit path of a test.
pub struct Down(pub PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = std::process::Command::new(XLFS).arg("down").arg(&self.0).output();
    }
}
