//! Distribute end to end: six real `xlfs brick` processes as a 2 x 3
//! distributed-replicate volume (protocol/client x6 -> cluster/replicate x2
//! -> cluster/distribute -> the default performance translators ->
//! io-stats) mounted with FUSE by a real `xlfs mount`, and `xlfs up
//! --sets 2` / `xlfs down`.
//!
//! - files made, listed, read, renamed and removed through the mount land
//!   on exactly one replica set each (three identical copies), both sets
//!   hold some, directories exist on all six bricks with a layout, and
//!   statfs is the two sets' sum;
//! - `xlfs up --sets 2` brings up such a volume, and `xlfs down` stops it.

mod kit;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kit::fuse_mount::{FuseMount, is_mounted};
use kit::{Cluster, Down, run_xlfs};

const SETS: usize = 2;
const REPLICA: usize = 3;

/// Which sets hold `rel` as data (every brick of the set), and where link
/// files are; panics when the copies of a set disagree.
fn sets_holding(bricks: &[PathBuf], rel: &str) -> (Vec<usize>, usize) {
    placement(bricks, rel).unwrap_or_else(|e| panic!("{e}"))
}

/// [`sets_holding`], or why the copies of a set disagree.
fn placement(bricks: &[PathBuf], rel: &str) -> Result<(Vec<usize>, usize), String> {
    let mut data = Vec::new();
    let mut links = 0;
    for s in 0..SETS {
        let mut kinds = Vec::new();
        for b in &bricks[s * REPLICA..(s + 1) * REPLICA] {
            let p = b.join(rel);
            kinds.push(match p.symlink_metadata() {
                Err(_) => "none",
                Ok(_) if xlfs_sdk::testing::xattr(&p, "trusted.glusterfs.dht.linkto").is_some() => "link",
                Ok(_) => "data",
            });
        }
        if kinds.iter().any(|k| *k != kinds[0]) {
            return Err(format!("{rel}: copies of set {s} disagree: {kinds:?}"));
        }
        match kinds[0] {
            "data" => data.push(s),
            "link" => links += 1,
            _ => {}
        }
    }
    Ok((data, links))
}

fn statvfs(p: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid C string and a zeroed out-struct statvfs fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(r, 0, "statvfs {}", p.display());
    st
}

#[test]
fn a_two_by_three_volume_through_fuse() {
    let c = Cluster::start(SETS * REPLICA);
    let bricks: Vec<(u16, String)> = c.bricks.iter().map(|b| (b.port(), b.subvolume())).collect();
    let dirs: Vec<PathBuf> = c.bricks.iter().map(|b| b.dir().to_path_buf()).collect();
    let text = xlfs_runtime::cli::distributed_volfile("dist", &bricks, REPLICA, &[], xlfs_runtime::cli::DEFAULT_PERF);
    assert!(text.contains("type cluster/distribute"), "{text}");
    let m = FuseMount::start(&text, "");
    let mnt = m.path().to_path_buf();

    std::fs::create_dir(mnt.join("d")).expect("mkdir through the mount");
    std::fs::create_dir(mnt.join("d/sub")).expect("mkdir sub");
    let mut want = BTreeSet::new();
    for k in 0..120 {
        let name = format!("f{k}");
        std::fs::write(mnt.join("d").join(&name), format!("file {k}\n")).expect("write through the mount");
        want.insert(name);
    }
    want.insert("sub".to_string());
    let listed: Vec<String> = std::fs::read_dir(mnt.join("d"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    assert_eq!(listed.len(), want.len(), "no duplicates: {listed:?}");
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), want);
    for b in &dirs {
        for d in ["d", "d/sub"] {
            assert!(b.join(d).is_dir(), "{d} on {}", b.display());
            assert!(xlfs_sdk::testing::xattr(&b.join(d), "trusted.glusterfs.dht").is_some(), "layout of {d}");
        }
    }
    let mut per_set = [0usize; SETS];
    for k in 0..120 {
        let (data, links) = sets_holding(&dirs, &format!("d/f{k}"));
        assert_eq!((data.len(), links), (1, 0), "f{k} on one set, where it hashes");
        per_set[data[0]] += 1;
        assert_eq!(std::fs::read_to_string(mnt.join(format!("d/f{k}"))).expect("read"), format!("file {k}\n"));
    }
    assert!(per_set.iter().all(|n| *n > 20), "both sets hold files: {per_set:?}");

    // Renames: each file still on one set, visible under its new name only.
    for k in 0..60 {
        std::fs::rename(mnt.join(format!("d/f{k}")), mnt.join(format!("d/r{k}"))).expect("rename");
    }
    let mut moved_links = 0;
    for k in 0..60 {
        assert!(!mnt.join(format!("d/f{k}")).exists(), "f{k} gone");
        assert_eq!(std::fs::read_to_string(mnt.join(format!("d/r{k}"))).expect("read renamed"), format!("file {k}\n"));
        let (data, links) = sets_holding(&dirs, &format!("d/r{k}"));
        assert_eq!(data.len(), 1, "r{k}: one set holds the data");
        moved_links += links;
        assert_eq!(sets_holding(&dirs, &format!("d/f{k}")), (vec![], 0), "nothing left of f{k}");
    }
    assert!(moved_links > 0, "some renames crossed sets and left a link file");
    let listed = std::fs::read_dir(mnt.join("d")).expect("readdir").count();
    assert_eq!(listed, 121, "renamed names listed once, link files not at all");

    // statfs: the two sets' sum (every brick is on the same file system).
    let (local, vol) = (statvfs(&dirs[0]), statvfs(&mnt));
    let local_bytes = local.f_blocks as f64 * local.f_frsize as f64;
    let vol_bytes = vol.f_blocks as f64 * vol.f_frsize as f64;
    assert!((vol_bytes / local_bytes - SETS as f64).abs() < 0.01, "volume {vol_bytes} vs brick fs {local_bytes}");

    // Removal: files, link files and every copy of the directories.
    for e in std::fs::read_dir(mnt.join("d")).expect("readdir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            std::fs::remove_dir(&p).expect("rmdir sub");
        } else {
            std::fs::remove_file(&p).expect("unlink");
        }
    }
    std::fs::remove_dir(mnt.join("d")).expect("rmdir d");
    for b in &dirs {
        assert!(!b.join("d").exists(), "d removed from {}", b.display());
    }
    drop(m);
}

#[test]
fn up_with_two_sets_and_down() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("vol");
    let _down = Down(dir.clone());
    let up = run_xlfs(&["up".as_ref(), dir.as_os_str(), "--sets".as_ref(), "2".as_ref()]);
    let text = String::from_utf8_lossy(&up.stdout).into_owned() + &String::from_utf8_lossy(&up.stderr);
    assert!(up.status.success(), "xlfs up --sets 2: {text}");
    assert!(text.contains("2 x 3 distributed-replicate"), "{text}");
    let mnt = std::fs::canonicalize(dir.join("mnt")).expect("mnt");
    assert!(is_mounted(&mnt), "{text}");
    let vol = std::fs::read_to_string(dir.join("client.vol")).expect("volfile");
    assert!(vol.contains("volume xlfs-dht\n    type cluster/distribute\n"), "{vol}");
    let bricks: Vec<PathBuf> = (0..SETS * REPLICA).map(|i| dir.join(format!("bricks/b{i}"))).collect();
    for k in 0..20 {
        std::fs::write(mnt.join(format!("k{k}")), b"kept\n").expect("write through the mount");
    }
    // Creates may be answered before the bricks have them (replicate's
    // async-dirops): wait for them to land.
    xlfs_sdk::testing::eventually("every file on one set", std::time::Duration::from_secs(20), || {
        for k in 0..20 {
            let rel = format!("k{k}");
            let held = placement(&bricks, &rel)?.0.len();
            if held != 1 {
                return Err(format!("{rel} on {held} sets"));
            }
        }
        Ok(())
    });
    let down = run_xlfs(&["down".as_ref(), dir.as_os_str()]);
    let text = String::from_utf8_lossy(&down.stdout).into_owned() + &String::from_utf8_lossy(&down.stderr);
    assert!(down.status.success(), "{text}");
    assert!(text.contains("b5"), "all six bricks stopped: {text}");
    assert!(!is_mounted(&mnt));
    assert!(std::fs::read_dir(dir.join("run")).expect("run dir").next().is_none(), "pid files removed");
}

/// Files renamed through the mount from one set to the other (half of
/// them over an existing file there) while another client looks both
/// names up: once the old name is gone the new one shows the file, and
/// once the new one shows it the old one is gone; never neither, never
/// both; and a name being replaced always shows the old file or the new
/// one. (Directory renames are not atomic across sets; see
/// ARCHITECTURE.)
#[test]
fn renames_across_sets_under_a_concurrent_reader_show_one_name() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let c = Cluster::start(SETS * REPLICA);
    let bricks: Vec<(u16, String)> = c.bricks.iter().map(|b| (b.port(), b.subvolume())).collect();
    let dirs: Vec<PathBuf> = c.bricks.iter().map(|b| b.dir().to_path_buf()).collect();
    let text = xlfs_runtime::cli::distributed_volfile("dist", &bricks, REPLICA, &[], xlfs_runtime::cli::DEFAULT_PERF);
    let m = FuseMount::start(&text, "");
    let mnt = m.path().to_path_buf();
    std::fs::create_dir(mnt.join("d")).expect("mkdir");
    let write = |rel: &str, data: &str| {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.join(rel)).expect("create");
        f.write_all(data.as_bytes()).expect("write");
        f.sync_all().expect("fsync");
    };
    // Pairs (f_k on one set, g_k hashing to the other); g_k exists for
    // even k only.
    let mut pairs = Vec::new();
    for k in 0..120 {
        let (f, g) = (format!("d/f{k}"), format!("d/g{k}"));
        write(&f, &format!("file {k}\n"));
        write(&g, &format!("old {k}\n"));
        if sets_holding(&dirs, &f).0 == sets_holding(&dirs, &g).0 {
            continue;
        }
        if k % 2 == 1 {
            std::fs::remove_file(mnt.join(&g)).expect("unlink");
        }
        pairs.push(k);
    }
    assert!(pairs.len() > 30, "enough cross-set pairs: {}", pairs.len());
    // The reader: a client of its own (no caches) over the same bricks.
    let reader_vol = xlfs_runtime::cli::distributed_volfile("dist", &bricks, REPLICA, &[], &[]);
    let (stop, ready) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let reader = {
        let (stop, ready, pairs) = (stop.clone(), ready.clone(), pairs.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(async move {
                let g = kit::graph_from(&reader_vol);
                g.wait_up(kit::UP_TIMEOUT).await.expect("reader up");
                let cl = xlfs_runtime::client::Client::new(g.top());
                let mut gfids = std::collections::HashMap::new();
                for &k in &pairs {
                    gfids.insert(k, cl.stat(&format!("/d/f{k}")).await.expect("stat f").gfid);
                }
                ready.store(true, Ordering::Relaxed);
                let (mut checks, mut wrong) = (0u64, Vec::new());
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    for &k in &pairs {
                        let (f, g, want) = (format!("/d/f{k}"), format!("/d/g{k}"), gfids[&k]);
                        let shows = |r: &Result<xlfs_sdk::Iatt, xlfs_sdk::Errno>| matches!(r, Ok(i) if i.gfid == want);
                        if round % 2 == 0 {
                            // Old name gone: the new one shows the file.
                            let rf = cl.stat(&f).await;
                            let rg = cl.stat(&g).await;
                            if rf == Err(xlfs_sdk::Errno::ENOENT) && !shows(&rg) {
                                wrong.push(format!("f{k} gone but g{k} is {rg:?}"));
                            }
                            // A g that existed is the old file or the new, never missing.
                            if k % 2 == 0 && rg.is_err() {
                                wrong.push(format!("g{k}, replaced by the rename, is {rg:?}"));
                            }
                        } else {
                            // New name shows it: the old one is gone.
                            let rg = cl.stat(&g).await;
                            let rf = cl.stat(&f).await;
                            if shows(&rg) && rf.is_ok() {
                                wrong.push(format!("g{k} shows the file and f{k} still is {rf:?}"));
                            }
                        }
                        checks += 1;
                    }
                }
                g.shutdown();
                (checks, wrong)
            })
        })
    };
    xlfs_sdk::testing::eventually("the reader has every gfid", std::time::Duration::from_secs(60), || {
        if ready.load(Ordering::Relaxed) { Ok(()) } else { Err("not yet".to_string()) }
    });
    for &k in &pairs {
        std::fs::rename(mnt.join(format!("d/f{k}")), mnt.join(format!("d/g{k}"))).expect("rename");
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (checks, wrong) = reader.join().expect("reader");
    assert!(wrong.is_empty(), "{} of {checks} checks saw a wrong name:\n{}", wrong.len(), wrong.join("\n"));
    assert!(checks >= pairs.len() as u64 * 2, "the reader kept looking: {checks} checks");
    for &k in &pairs {
        assert_eq!(std::fs::read_to_string(mnt.join(format!("d/g{k}"))).expect("read"), format!("file {k}\n"));
        assert!(!mnt.join(format!("d/f{k}")).exists());
    }
    eprintln!("{} renames across sets, {checks} reader checks", pairs.len());
}
