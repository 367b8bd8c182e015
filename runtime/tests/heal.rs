//! Self-heal end to end, in process: three bricks (storage/posix ->
//! features/locks -> features/index -> debug/io-stats) under
//! cluster/replicate, driven through the client API and replicate's
//! virtual xattrs (`xlfs.heal.*`).
//!
//! A child is "down" by building the graph with debug/error-gen failing
//! every fop of that child with ENOTCONN (as an unreachable brick does);
//! the bricks stay the same directories, so a later graph without it sees
//! what the down child missed. Split-brains are made directly on the brick
//! directories (contents and `trusted.afr.*` counters), as a crash could
//! leave them.

#[allow(dead_code)]
#[path = "kit/workload.rs"]
mod workload;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use xlfs_runtime::client::Client;
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;
use xlfs_sdk::{Dict, Errno, Fop, Loc, Response, SetAttr};

const BRICKS: usize = 3;
const BLOCK: usize = 128 << 10;

struct Bricks {
    _tmp: tempfile::TempDir,
    dirs: Vec<PathBuf>,
}

impl Bricks {
    fn new() -> Bricks {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dirs: Vec<PathBuf> = (0..BRICKS).map(|i| tmp.path().join(format!("b{i}"))).collect();
        for d in &dirs {
            std::fs::create_dir(d).expect("brick dir");
        }
        Bricks { _tmp: tmp, dirs }
    }

    /// A graph over the bricks; children in `down` fail everything with ENOTCONN.
    async fn graph(&self, down: &[usize], afr: &[(&str, &str)]) -> Arc<Graph> {
        let g = Graph::from_str(&self.volfile(down, afr), "heal.vol", &Registry::builtin()).expect("graph builds");
        g.activate();
        g.wait_up(Duration::from_secs(10)).await.expect("graph comes up");
        Arc::new(g)
    }

    /// The client volfile of [`Bricks::graph`].
    fn volfile(&self, down: &[usize], afr: &[(&str, &str)]) -> String {
        let mut v = String::new();
        for (i, b) in self.dirs.iter().enumerate() {
            v += &format!(
                "volume p{i}\n    type storage/posix\n    option directory {b}\nend-volume\n\n\
                 volume l{i}\n    type features/locks\n    subvolumes p{i}\nend-volume\n\n\
                 volume x{i}\n    type features/index\n    option index-base {b}/.glusterfs/indices\n    subvolumes l{i}\nend-volume\n\n",
                b = b.display()
            );
            let below = if down.contains(&i) {
                v += &format!(
                    "volume e{i}\n    type debug/error-gen\n    option failure 100\n    option error-no ENOTCONN\n    \
                     subvolumes x{i}\nend-volume\n\n"
                );
                format!("e{i}")
            } else {
                format!("x{i}")
            };
            v += &format!("volume rep3-client-{i}\n    type debug/io-stats\n    subvolumes {below}\nend-volume\n\n");
        }
        v += "volume rep3-replicate-0\n    type cluster/replicate\n";
        for (k, val) in
            [("afr-pending-xattr", "rep3-client-0,rep3-client-1,rep3-client-2"), ("post-op-delay-secs", "0")]
                .iter()
                .chain(afr)
        {
            v += &format!("    option {k} {val}\n");
        }
        v += "    subvolumes rep3-client-0 rep3-client-1 rep3-client-2\nend-volume\n\n";
        v += "volume rep3\n    type debug/io-stats\n    subvolumes rep3-replicate-0\nend-volume\n";
        v
    }

    fn path(&self, i: usize, rel: &str) -> PathBuf {
        self.dirs[i].join(rel.trim_start_matches('/'))
    }

    /// The gfids brick `i`'s index lists (not its base files, which the
    /// entries are links to).
    fn index(&self, i: usize) -> Vec<String> {
        let d = self.dirs[i].join(".glusterfs/indices/xattrop");
        let mut v: Vec<String> = std::fs::read_dir(&d)
            .map(|r| r.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        v.retain(|n| !n.starts_with("xattrop-"));
        v.sort();
        v
    }
}

/// Waits for the graph's eager locks to be released, then shuts it down.
async fn done(g: Arc<Graph>) {
    for _ in 0..2000 {
        if dump(&g, "rep3-replicate-0.eager-lock.held").as_deref() == Some("0")
            && dump(&g, "rep3-replicate-0.heal.background-queued").as_deref() == Some("0")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::task::spawn_blocking(move || g.shutdown()).await.expect("shutdown");
}

use workload::dump_value as dump;

/// The number of calls of `fop` io-stats `vol` counted.
fn calls(g: &Graph, vol: &str, fop: &str) -> u64 {
    dump(g, &format!("{vol}.fop.{fop}"))
        .and_then(|v| v.split_whitespace().find_map(|w| w.strip_prefix("calls=")?.parse().ok()))
        .unwrap_or(0)
}

use xlfs_sdk::testing::{set_xattr, xattr};

fn counters(p: &Path, j: usize) -> [i32; 3] {
    workload::afr_counters(p, &format!("trusted.afr.rep3-client-{j}"))
}

use workload::afr_value as encode;

use workload::brick_tree as tree;

/// Asserts the three bricks hold the same tree (names, types, gfids, data,
/// mode, owner, user xattrs, symlink targets) with every counter at zero,
/// and that no index lists anything.
fn assert_identical_and_clean(b: &Bricks) {
    let want = tree(&b.dirs[0]);
    for i in 0..BRICKS {
        assert_eq!(tree(&b.dirs[i]), want, "names on brick {i}");
        for rel in std::iter::once(PathBuf::new()).chain(want.iter().cloned()) {
            let (p0, p) = (b.dirs[0].join(&rel), b.dirs[i].join(&rel));
            let (m0, m) = (p0.symlink_metadata().expect("lstat"), p.symlink_metadata().expect("lstat"));
            let r = rel.display();
            assert_eq!(m0.file_type(), m.file_type(), "type of {r} on brick {i}");
            assert_eq!(xattr(&p0, "trusted.gfid"), xattr(&p, "trusted.gfid"), "gfid of {r} on brick {i}");
            assert_eq!((m0.uid(), m0.gid()), (m.uid(), m.gid()), "owner of {r} on brick {i}");
            if !m0.file_type().is_symlink() {
                assert_eq!(m0.mode(), m.mode(), "mode of {r} on brick {i}");
                assert_eq!(xattr(&p0, "user.k"), xattr(&p, "user.k"), "user.k of {r} on brick {i}");
            }
            if m0.is_file() {
                assert_eq!(
                    std::fs::read(&p0).expect("read"),
                    std::fs::read(&p).expect("read"),
                    "data of {r} on brick {i}"
                );
            }
            if m0.file_type().is_symlink() {
                assert_eq!(std::fs::read_link(&p0).expect("link"), std::fs::read_link(&p).expect("link"), "{r}");
            }
            for j in 0..BRICKS {
                assert_eq!(counters(&p, j), [0; 3], "counters of {r} on brick {i} for child {j}");
            }
        }
        assert!(b.index(i).is_empty(), "index of brick {i}: {:?}", b.index(i));
    }
}

/// Sends a heal request (setxattr on the root) and returns the reply xdata.
async fn heal(c: &Client, key: &str, value: &str) -> Dict {
    let mut x = Dict::new();
    x.set_bytes(key, value.as_bytes().to_vec());
    let Response { xdata, .. } =
        c.call(Fop::Setxattr { loc: Loc::root(), xattrs: x, flags: 0 }).await.expect("heal request");
    xdata
}

fn counts(x: &Dict) -> [u64; 4] {
    ["xlfs.heal.healed", "xlfs.heal.failed", "xlfs.heal.split-brain", "xlfs.heal.remaining"]
        .map(|k| x.get_u64(k).unwrap_or(u64::MAX))
}

async fn info(c: &Client) -> String {
    match c.call(Fop::Getxattr { loc: Loc::root(), name: "xlfs.heal.info".into() }).await.expect("info").reply {
        xlfs_sdk::Reply::Xattrs(d) => d.get_str("xlfs.heal.info").expect("info text").to_string(),
        r => panic!("{r:?}"),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

async fn write_file(c: &Client, path: &str, off: u64, data: &[u8]) {
    let f = match c.open(path, libc::O_RDWR).await {
        Ok(f) => f,
        Err(Errno::ENOENT) => c.create(path, libc::O_RDWR, 0o644).await.expect("create"),
        Err(e) => panic!("open {path}: {e:?}"),
    };
    f.write(off, Bytes::copy_from_slice(data)).await.expect("write");
    f.close().await.expect("close");
}

const NO_INLINE: [(&str, &str); 3] =
    [("data-self-heal", "off"), ("metadata-self-heal", "off"), ("entry-self-heal", "off")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_repairs_data_metadata_and_entries_a_down_child_missed() {
    let b = Bricks::new();
    // Healthy: a file to be changed, a file and a directory to be removed.
    let g = b.graph(&[], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/x", 0, &pattern(2 * BLOCK, 1)).await;
    write_file(&c, "/gone", 0, b"bye").await;
    c.mkdir("/d0", 0o755).await.expect("mkdir");
    write_file(&c, "/d0/in", 0, b"inner").await;
    c.mkdir("/d0/sub", 0o755).await.expect("mkdir");
    done(g).await;

    // Child 2 down: everything below misses it.
    let g = b.graph(&[2], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/x", BLOCK as u64 + 7, b"changed while child 2 was down").await;
    c.setattr("/x", SetAttr { mode: Some(0o640), uid: Some(1234), ..Default::default() }).await.expect("setattr");
    c.setxattr("/x", "user.k", b"v1", 0).await.expect("setxattr");
    c.unlink("/gone").await.expect("unlink");
    c.unlink("/d0/in").await.expect("unlink");
    c.rmdir("/d0/sub").await.expect("rmdir");
    c.rmdir("/d0").await.expect("rmdir");
    c.mkdir("/d", 0o750).await.expect("mkdir");
    write_file(&c, "/d/f", 0, &pattern(BLOCK + 100, 2)).await;
    c.setxattr("/d/f", "user.k", b"file", 0).await.expect("setxattr");
    c.symlink("../x", "/d/l").await.expect("symlink");
    c.link("/d/f", "/d/h").await.expect("link");
    mknod_fifo(&c).await;
    done(g).await;

    assert!(b.path(2, "/gone").exists() && b.path(2, "/d0/sub").exists() && !b.path(2, "/d").exists());
    assert!(!b.index(0).is_empty(), "the index lists what child 2 missed");

    let g = b.graph(&[], &[NO_INLINE.as_slice(), &[("data-self-heal-algorithm", "full")]].concat()).await;
    let c = Client::new(g.top());
    let text = info(&c).await;
    assert!(text.contains("rep3-client-0: up, ") && text.contains("data"), "{text}");
    assert!(!text.contains("split-brain"), "{text}");
    let x = heal(&c, "xlfs.heal.run", "index").await;
    let [healed, failed, split, remaining] = counts(&x);
    assert_eq!((failed, split, remaining), (0, 0, 0), "{:?}", x.get_str("xlfs.heal.report"));
    assert!(healed >= 5, "healed {healed}");
    done(g).await;

    assert_identical_and_clean(&b);
    // New entries got the source's gfid, the hard link is a link, the symlink its target.
    let ino = |i: usize, p: &str| b.path(i, p).symlink_metadata().expect("lstat").ino();
    assert_eq!(ino(2, "/d/f"), ino(2, "/d/h"));
    assert_eq!(std::fs::read_link(b.path(2, "/d/l")).expect("link"), Path::new("../x"));
    assert_eq!(b.path(2, "/x").symlink_metadata().expect("lstat").uid(), 1234);
    assert_eq!(xattr(&b.path(2, "/x"), "user.k").as_deref(), Some(&b"v1"[..]));
    assert!(!b.path(2, "/gone").exists() && !b.path(2, "/d0").exists());
}

/// Makes a fifo `/d/p` (fifos are healed like files, without data).
async fn mknod_fifo(c: &Client) {
    let d = c.stat("/d").await.expect("stat /d");
    let fop = Fop::Mknod { loc: Loc::entry(d.gfid, "p"), mode: 0o010640, rdev: 0, umask: 0 };
    let x = Dict::new().with(xlfs_sdk::dict::keys::GFID_REQ, xlfs_sdk::Value::Gfid(xlfs_sdk::Gfid::random()));
    c.call_x(fop, x).await.expect("mknod fifo");
}

/// A file written on every child, then changed in one block while child 2
/// was down; healed with `algo`. Returns the writes child 2 received.
async fn heal_one_block(algo: &str) -> u64 {
    let b = Bricks::new();
    let g = b.graph(&[], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/big", 0, &pattern(8 * BLOCK, 3)).await;
    done(g).await;
    let g = b.graph(&[2], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/big", 3 * BLOCK as u64 + 5, b"0123456789").await;
    done(g).await;
    assert_ne!(std::fs::read(b.path(0, "/big")).expect("read"), std::fs::read(b.path(2, "/big")).expect("read"));

    let g = b.graph(&[], &[NO_INLINE.as_slice(), &[("data-self-heal-algorithm", algo)]].concat()).await;
    let c = Client::new(g.top());
    let before = calls(&g, "rep3-client-2", "WRITE");
    let x = heal(&c, "xlfs.heal.run", "index").await;
    assert_eq!(counts(&x), [1, 0, 0, 0], "{:?}", x.get_str("xlfs.heal.report"));
    let writes = calls(&g, "rep3-client-2", "WRITE") - before;
    done(g).await;
    assert_identical_and_clean(&b);
    writes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_heal_writes_only_the_block_that_differs_and_full_writes_all() {
    assert_eq!(heal_one_block("diff").await, 1);
    assert_eq!(heal_one_block("full").await, 8);
}

/// Makes `/s` a data split-brain: each brick holds its own contents
/// (`sizes[i]` bytes, mtime `mtimes[i]`) and blames both others.
async fn split_brain(afr: &[(&str, &str)], sizes: [usize; 3], mtimes: [u64; 3]) -> (Bricks, Arc<Graph>) {
    let b = Bricks::new();
    let g = b.graph(&[], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/s", 0, b"original").await;
    done(g).await;
    make_split(&b, "/s", sizes, mtimes);
    let g = b.graph(&[], &[NO_INLINE.as_slice(), afr].concat()).await;
    (b, g)
}

/// Gives each brick's copy of `rel` its own contents and counters blaming the others.
fn make_split(b: &Bricks, rel: &str, sizes: [usize; 3], mtimes: [u64; 3]) {
    for i in 0..BRICKS {
        let p = b.path(i, rel);
        let seed = (sizes[i] as u64 + mtimes[i]) as u8;
        std::fs::write(&p, pattern(sizes[i], seed)).expect("write brick copy");
        let f = std::fs::File::options().write(true).open(&p).expect("open");
        f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(mtimes[i])).expect("mtime");
        for j in 0..BRICKS {
            set_xattr(&p, &format!("trusted.afr.rep3-client-{j}"), &encode([i32::from(i != j), 0, 0]))
                .expect("set xattr");
        }
        // What the brick's index would hold after the writes that did this.
        let gfid = xlfs_sdk::Gfid(xattr(&p, "trusted.gfid").expect("gfid").try_into().expect("16 bytes"));
        std::fs::write(b.dirs[i].join(".glusterfs/indices/xattrop").join(gfid.to_string()), b"").expect("index entry");
    }
}

async fn read_all(c: &Client, path: &str) -> Result<Bytes, Errno> {
    let f = c.open(path, libc::O_RDONLY).await?;
    let r = f.read(0, 1 << 20).await;
    f.close().await?;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_brain_gives_eio_and_each_policy_resolves_it() {
    let sizes = [100, 300, 200];
    let mtimes = [1_000, 2_000, 3_000];
    for (policy, winner) in [("bigger-file", 1usize), ("latest-mtime", 2), ("source-brick:rep3-client-0", 0)] {
        let (b, g) = split_brain(&[], sizes, mtimes).await;
        let c = Client::new(g.top());
        let want = std::fs::read(b.path(winner, "/s")).expect("read");
        c.stat("/s").await.expect("lookup and stat still work");
        assert_eq!(read_all(&c, "/s").await, Err(Errno::EIO), "{policy}");
        let text = info(&c).await;
        assert!(text.contains("split-brain data"), "{text}");
        // Heal does not pick a side by itself.
        let x = heal(&c, "xlfs.heal.run", "index").await;
        assert_eq!(counts(&x)[2], 1, "{:?}", x.get_str("xlfs.heal.report"));
        assert!(x.get_str("xlfs.heal.report").is_some_and(|r| r.contains("split-brain data")));
        // Resolve through the file's location.
        let s = c.stat("/s").await.expect("stat");
        let mut xa = Dict::new();
        xa.set_bytes("xlfs.split-brain.resolve", policy.as_bytes().to_vec());
        let r = c.call(Fop::Setxattr { loc: Loc::gfid(s.gfid), xattrs: xa, flags: 0 }).await.expect("resolve");
        assert_eq!(r.xdata.get_str("xlfs.heal.result"), Some("resolved"), "{policy}");
        assert_eq!(read_all(&c, "/s").await.expect("readable again").as_ref(), want.as_slice(), "{policy}");
        done(g).await;
        assert_identical_and_clean(&b);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn favorite_child_policy_resolves_during_heal_and_ties_stay_split() {
    // Majority: bricks 0 and 1 agree (same size and mtime), brick 2 differs.
    let (b, g) = split_brain(&[("favorite-child-policy", "majority")], [100, 100, 300], [5_000, 5_000, 9_000]).await;
    let c = Client::new(g.top());
    let want = std::fs::read(b.path(0, "/s")).expect("read");
    let x = heal(&c, "xlfs.heal.run", "index").await;
    assert_eq!(counts(&x), [1, 0, 0, 0], "{:?}", x.get_str("xlfs.heal.report"));
    assert_eq!(read_all(&c, "/s").await.expect("read").as_ref(), want.as_slice());
    done(g).await;
    assert_identical_and_clean(&b);

    // Size with two biggest copies alike in size: no choice, still split.
    let (b, g) = split_brain(&[("favorite-child-policy", "size")], [300, 300, 100], [1, 2, 3]).await;
    let c = Client::new(g.top());
    let x = heal(&c, "xlfs.heal.run", "index").await;
    assert_eq!(counts(&x)[2], 1);
    assert_eq!(read_all(&c, "/s").await, Err(Errno::EIO));
    // mtime policy through the resolve request picks brick 2.
    let want = std::fs::read(b.path(2, "/s")).expect("read");
    let s = c.stat("/s").await.expect("stat");
    let mut xa = Dict::new();
    xa.set_bytes("xlfs.split-brain.resolve", b"latest-mtime".to_vec());
    c.call(Fop::Setxattr { loc: Loc::gfid(s.gfid), xattrs: xa, flags: 0 }).await.expect("resolve");
    assert_eq!(read_all(&c, "/s").await.expect("read").as_ref(), want.as_slice());
    done(g).await;
    assert_identical_and_clean(&b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_starts_a_background_heal() {
    let b = Bricks::new();
    let g = b.graph(&[], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/f", 0, &pattern(3 * BLOCK, 4)).await;
    done(g).await;
    let g = b.graph(&[2], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/f", 10, b"newer data").await;
    c.setattr("/f", SetAttr { mode: Some(0o600), ..Default::default() }).await.expect("chmod");
    done(g).await;
    // Inline heal on (the default).
    let g = b.graph(&[], &[]).await;
    let c = Client::new(g.top());
    c.stat("/f").await.expect("stat");
    let want = std::fs::read(b.path(0, "/f")).expect("read");
    let mut healed = false;
    for _ in 0..2000 {
        let clean = (0..BRICKS).all(|j| counters(&b.path(0, "/f"), j) == [0; 3]);
        if clean && std::fs::read(b.path(2, "/f")).expect("read") == want {
            healed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(healed, "the background heal did not finish");
    done(g).await;
    assert_identical_and_clean(&b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_during_heal_ends_with_identical_copies() {
    let b = Bricks::new();
    let g = b.graph(&[], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/w", 0, &pattern(32 * BLOCK, 5)).await;
    done(g).await;
    let g = b.graph(&[2], &NO_INLINE).await;
    let c = Client::new(g.top());
    for k in 0..32u64 {
        write_file(&c, "/w", k * BLOCK as u64, &pattern(64, 6)).await;
    }
    done(g).await;

    let g = b
        .graph(
            &[],
            &[NO_INLINE.as_slice(), &[("data-self-heal-window-size", "1"), ("data-self-heal-algorithm", "full")]]
                .concat(),
        )
        .await;
    let c = Client::new(g.top());
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            let f = c.open("/w", libc::O_RDWR).await.expect("open");
            for k in 0..64u64 {
                f.write((k % 32) * BLOCK as u64 + 100, Bytes::from(pattern(300, k as u8))).await.expect("write");
                tokio::task::yield_now().await;
            }
            f.close().await.expect("close");
        })
    };
    let x = heal(&c, "xlfs.heal.run", "index").await;
    writer.await.expect("writer");
    // (remaining may count the writer's transaction in flight at the end.)
    assert_eq!(counts(&x)[1..3], [0, 0], "{:?}", x.get_str("xlfs.heal.report"));
    done(g).await;
    assert_identical_and_clean(&b);
}

/// Runs `xlfs heal ARGS` in process; returns its output and result.
async fn xlfs_heal(args: &[&str]) -> (String, Result<(), xlfs_runtime::cli::CliError>) {
    use clap::Parser;
    let cli = xlfs_runtime::cli::Cli::try_parse_from(["xlfs", "heal"].iter().chain(args)).expect("arguments parse");
    let mut out: Vec<u8> = Vec::new();
    let r = cli.run(&mut out).await;
    (String::from_utf8(out).expect("utf-8 output"), r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xlfs_heal_heals_lists_and_resolves() {
    let b = Bricks::new();
    let g = b.graph(&[], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/f", 0, b"first").await;
    write_file(&c, "/s", 0, b"second").await;
    done(g).await;
    let g = b.graph(&[2], &NO_INLINE).await;
    write_file(&Client::new(g.top()), "/f", 0, b"FIRST, while child 2 was down").await;
    done(g).await;
    make_split(&b, "/s", [10, 20, 30], [1, 2, 3]);
    let vol = b.dirs[0].parent().expect("tmp").join("client.vol");
    std::fs::write(&vol, b.volfile(&[], &NO_INLINE)).expect("volfile");
    let vol = vol.to_str().expect("utf-8");

    let (out, r) = xlfs_heal(&["--volfile", vol, "info"]).await;
    r.expect("info");
    assert!(
        out.contains("rep3-client-0: up, 2 entries to heal") && out.contains("rep3-client-2: up, 1 entry to heal"),
        "{out}"
    );
    assert!(out.contains(" data split-brain data") && out.lines().any(|l| l.ends_with(" data")), "{out}");

    let (out, r) = xlfs_heal(&["--volfile", vol]).await;
    assert!(out.starts_with("healed 1, failed 0, split-brain 1, remaining 1"), "{out}");
    let e = r.expect_err("a split-brain is left").to_string();
    assert!(e.contains("split-brain data"), "{e}");

    let (out, r) =
        xlfs_heal(&["--volfile", vol, "split-brain", "source-brick", "/s", "--source-brick", "rep3-client-1"]).await;
    r.expect("resolves");
    assert_eq!(out, "/s: resolved (source-brick:rep3-client-1)\n");
    let (_, r) = xlfs_heal(&["--volfile", vol, "split-brain", "bigger-file", "/s"]).await;
    assert!(r.expect_err("no longer split").to_string().contains("not in split-brain"));

    let (out, r) = xlfs_heal(&["--volfile", vol]).await;
    r.expect("nothing left");
    assert_eq!(out, "healed 0, failed 0, split-brain 0, remaining 0\n");
    assert_identical_and_clean(&b);
    assert_eq!(std::fs::read(b.path(2, "/s")).expect("read"), pattern(20, 22));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_split_brain_refuses_getxattr_until_source_brick_resolves_it() {
    let b = Bricks::new();
    let g = b.graph(&[], &NO_INLINE).await;
    let c = Client::new(g.top());
    write_file(&c, "/m", 0, b"same data").await;
    c.setxattr("/m", "user.k", b"v", 0).await.expect("setxattr");
    done(g).await;
    for i in 0..BRICKS {
        let p = b.path(i, "/m");
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600 + 0o10 * i as u32))
            .expect("chmod");
        set_xattr(&p, "user.k", format!("v{i}").as_bytes()).expect("set xattr");
        for j in 0..BRICKS {
            set_xattr(&p, &format!("trusted.afr.rep3-client-{j}"), &encode([0, i32::from(i != j), 0]))
                .expect("set xattr");
        }
    }
    let g = b.graph(&[], &NO_INLINE).await;
    let c = Client::new(g.top());
    c.stat("/m").await.expect("stat works");
    assert_eq!(c.getxattr("/m", "user.k").await, Err(Errno::EIO));
    assert_eq!(read_all(&c, "/m").await.expect("data is fine").as_ref(), b"same data");
    let x = heal(&c, "xlfs.heal.run", "full").await;
    assert_eq!(counts(&x)[2], 1, "{:?}", x.get_str("xlfs.heal.report"));
    let s = c.stat("/m").await.expect("stat");
    let resolve = |policy: &str| {
        let mut xa = Dict::new();
        xa.set_bytes("xlfs.split-brain.resolve", policy.as_bytes().to_vec());
        Fop::Setxattr { loc: Loc::gfid(s.gfid), xattrs: xa, flags: 0 }
    };
    let r = c.call(resolve("bigger-file")).await.expect("resolve");
    let why = r.xdata.get_str("xlfs.heal.result").expect("result");
    assert!(why.starts_with("unresolved") && why.contains("source-brick"), "{why}");
    let r = c.call(resolve("source-brick:rep3-client-2")).await.expect("resolve");
    assert_eq!(r.xdata.get_str("xlfs.heal.result"), Some("resolved"));
    assert_eq!(c.getxattr("/m", "user.k").await.expect("readable").as_ref(), b"v2");
    done(g).await;
    assert_identical_and_clean(&b);
    let mode = b.path(0, "/m").symlink_metadata().expect("lstat").mode();
    assert_eq!(mode & 0o777, 0o620);
}
