//! The foundation's client-API workload: a tree of directories and files,
//! data at offsets, renames, links, xattrs, listings, conflicting POSIX
//! locks, then the brick directory checked on disk (real names, gfid
//! xattrs, handle links) and io-stats' dump. Run over an in-process graph
//! (`tests/foundation.rs`) and over the network (`tests/network.rs`) with
//! the same assertions.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use xlfs_runtime::client::Client;
use xlfs_runtime::graph::Graph;
use xlfs_sdk::testing::xattr;
use xlfs_sdk::types::{rename_flags, xattr_flags};
use xlfs_sdk::{Errno, FileType, Flock, Gfid, LkCmd, LockType};

/// The gfid stored in `path`'s `trusted.gfid` xattr.
pub fn gfid_xattr(path: &Path) -> Gfid {
    let v = xattr(path, "trusted.gfid").unwrap_or_else(|| panic!("no trusted.gfid on {}", path.display()));
    Gfid(v.try_into().unwrap_or_else(|v: Vec<u8>| panic!("gfid xattr of {} has {} bytes", path.display(), v.len())))
}

/// Every entry under a brick root but `.glusterfs`, relative, sorted.
pub fn brick_tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.strip_prefix(root).is_ok_and(|r| r.starts_with(".glusterfs")) {
                continue;
            }
            if p.symlink_metadata().expect("lstat").is_dir() {
                stack.push(p.clone());
            }
            out.push(p.strip_prefix(root).expect("under root").to_path_buf());
        }
    }
    out.sort();
    out
}

/// AFR's dirty counters, which raise every child's at once.
pub const AFR_DIRTY: &str = "trusted.afr.dirty";

/// The three AFR counters (data, metadata, entry) in xattr `key` of
/// `path`: zeros when it is absent. For a child's key, what the copy says
/// of that child: its own counters plus the dirty ones.
pub fn afr_counters(path: &Path, key: &str) -> [i32; 3] {
    let read = |k: &str| {
        let v = xattr(path, k).unwrap_or_default();
        let mut out = [0i32; 3];
        for (o, c) in out.iter_mut().zip(v.chunks_exact(4)) {
            *o = i32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        out
    };
    let own = read(key);
    if key == AFR_DIRTY {
        return own;
    }
    let dirty = read(AFR_DIRTY);
    std::array::from_fn(|x| own[x] + dirty[x])
}

/// The 12-byte xattr value of three AFR counters.
pub fn afr_value(v: [i32; 3]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_be_bytes()).collect()
}

/// The value of `key` in the graph's dump.
pub fn dump_value(graph: &Graph, key: &str) -> Option<String> {
    graph.dump().into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Waits until the `rep3-replicate-0` volume holds no eager lock (windows
/// end in the background); panics after ten seconds.
pub async fn quiesce(graph: &Graph) {
    for _ in 0..2000 {
        if dump_value(graph, "rep3-replicate-0.eager-lock.held").as_deref() == Some("0") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("eager locks still held: {:?}", graph.dump());
}

/// A pgbench-like workload: four fds open on `path` (created), ten rounds
/// in which each fd writes three 8 KiB pages and fsyncs, then all closed.
pub async fn pgbench_like(c: &Client, path: &str) {
    let mut files = vec![c.create(path, libc::O_RDWR, 0o644).await.expect("create")];
    for _ in 1..4 {
        files.push(c.open(path, libc::O_RDWR).await.expect("open"));
    }
    let page = Bytes::from(vec![1u8; 8192]);
    for round in 0..10u64 {
        for (k, f) in files.iter().enumerate() {
            for w in 0..3u64 {
                f.write((k as u64 * 100 + round * 3 + w) * 8192, page.clone()).await.expect("write");
            }
            f.fsync(false).await.expect("fsync");
        }
    }
    for f in files {
        f.close().await.expect("close");
    }
}

/// Where the gfid handle of `gfid` lives under `brick`.
pub fn handle_path(brick: &Path, gfid: Gfid) -> std::path::PathBuf {
    let s = gfid.to_string();
    brick.join(".glusterfs").join(&s[0..2]).join(&s[2..4]).join(&s)
}

/// Runs the workload through `c`, a client of `graph`, whose storage is the
/// brick directory `brick`.
pub async fn client_api(c: &Client, graph: &Graph, brick: &Path) {
    // A tree of directories and files.
    c.mkdir("/a", 0o755).await.expect("mkdir a");
    c.mkdir("/a/b", 0o755).await.expect("mkdir a/b");
    c.mkdir("/c", 0o700).await.expect("mkdir c");
    assert_eq!(c.mkdir("/a", 0o755).await.expect_err("exists"), Errno::EEXIST);

    // Data at offsets, sparse, past EOF.
    let f = c.create("/a/b/data", libc::O_RDWR, 0o644).await.expect("create");
    f.write(0, Bytes::from_static(b"hello world")).await.expect("write");
    f.write(6, Bytes::from_static(b"WORLD")).await.expect("overwrite");
    assert_eq!(&f.read(0, 100).await.expect("read")[..], b"hello WORLD");
    assert_eq!(&f.read(6, 3).await.expect("read mid")[..], b"WOR");
    assert!(f.read(11, 10).await.expect("read at EOF").is_empty());
    assert!(f.read(1 << 30, 10).await.expect("read past EOF").is_empty());
    let big = 1u64 << 20;
    let post = f.write(big, Bytes::from_static(b"tail")).await.expect("sparse write");
    assert_eq!(post.size, big + 4);
    let hole = f.read(4096, 4096).await.expect("read hole");
    assert_eq!(hole.len(), 4096);
    assert!(hole.iter().all(|&b| b == 0), "hole reads as zeros");
    assert_eq!(&f.read(big, 10).await.expect("read tail")[..], b"tail");
    f.fsync(false).await.expect("fsync");
    f.truncate(11).await.expect("ftruncate");
    assert_eq!(f.stat().await.expect("fstat").size, 11);
    let data_gfid = f.gfid();
    f.close().await.expect("close");

    // Rename across directories keeps the inode.
    c.rename("/a/b/data", "/c/moved").await.expect("rename");
    assert_eq!(c.stat("/a/b/data").await.expect_err("old name gone"), Errno::ENOENT);
    let moved = c.stat("/c/moved").await.expect("new name");
    assert_eq!(moved.gfid, data_gfid);
    c.rename("/a/b", "/c/b2").await.expect("rename dir");
    c.create("/c/b2/inner", libc::O_WRONLY, 0o600).await.expect("create in renamed dir").close().await.expect("close");
    let other = c.create("/c/other", libc::O_WRONLY, 0o600).await.expect("create other");
    other.close().await.expect("close");
    assert_eq!(
        c.rename_flags("/c/moved", "/c/other", rename_flags::NOREPLACE).await.expect_err("noreplace"),
        Errno::EEXIST
    );

    // Hard and symbolic links.
    let linked = c.link("/c/moved", "/a/hard").await.expect("link");
    assert_eq!(linked.gfid, data_gfid);
    assert_eq!(c.stat("/c/moved").await.expect("stat").nlink, 2);
    c.symlink("../c/moved", "/a/sym").await.expect("symlink");
    assert_eq!(c.readlink("/a/sym").await.expect("readlink"), "../c/moved");
    assert_eq!(c.stat("/a/sym").await.expect("lstat").file_type(), FileType::Symlink);

    // Extended attributes.
    c.setxattr("/c/moved", "user.color", b"blue", 0).await.expect("setxattr");
    assert_eq!(&c.getxattr("/c/moved", "user.color").await.expect("getxattr")[..], b"blue");
    assert_eq!(
        c.setxattr("/c/moved", "user.color", b"red", xattr_flags::CREATE).await.expect_err("create flag"),
        Errno::EEXIST
    );
    assert!(c.listxattr("/c/moved").await.expect("list").contains("user.color"));
    c.removexattr("/c/moved", "user.color").await.expect("removexattr");
    assert_eq!(c.getxattr("/c/moved", "user.color").await.expect_err("gone"), Errno::ENODATA);

    // Directory listing.
    let mut names: Vec<String> = c.readdir("/c").await.expect("readdir").into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, ["b2", "moved", "other"]);
    let root: Vec<String> = c.readdir("/").await.expect("readdir root").into_iter().map(|e| e.name).collect();
    assert!(!root.iter().any(|n| n == ".glusterfs"), "the handle directory is hidden: {root:?}");

    // Conflicting POSIX locks from two owners: the second waits, then gets it.
    let owner_a = c.with_lk_owner(0xa);
    let owner_b = c.with_lk_owner(0xb);
    let fa = owner_a.open("/c/moved", libc::O_RDWR).await.expect("open a");
    let fb = owner_b.open("/c/moved", libc::O_RDWR).await.expect("open b");
    fa.lk(LkCmd::SetLk, Flock::whole(LockType::Write, 0)).await.expect("a locks");
    assert_eq!(fb.lk(LkCmd::SetLk, Flock::whole(LockType::Write, 0)).await.expect_err("b conflicts"), Errno::EAGAIN);
    let conflict = fb.lk(LkCmd::GetLk, Flock::whole(LockType::Write, 0)).await.expect("getlk");
    assert_eq!((conflict.ty, conflict.owner), (LockType::Write, 0xa));
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn(async move {
        let got = fb.lk(LkCmd::SetLkw, Flock::whole(LockType::Write, 0)).await;
        let _ = tx.send(());
        (got, fb)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(rx.try_recv().is_err(), "b must wait while a holds the lock");
    fa.lk(LkCmd::SetLk, Flock::whole(LockType::Unlock, 0)).await.expect("a unlocks");
    let (got, fb) = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("b is granted").expect("join");
    assert_eq!(got.expect("b's lock").ty, LockType::Write);
    fb.lk(LkCmd::SetLk, Flock::whole(LockType::Unlock, 0)).await.expect("b unlocks");
    fa.close().await.expect("close a");
    fb.close().await.expect("close b");

    // Unlink and rmdir.
    c.unlink("/c/other").await.expect("unlink");
    assert_eq!(c.rmdir("/c").await.expect_err("not empty"), Errno::ENOTEMPTY);

    // On disk: real names, gfid xattrs, handle links.
    assert!(brick.join("c/moved").is_file());
    assert!(brick.join("c/b2/inner").is_file());
    assert!(brick.join("a/hard").is_file());
    assert_eq!(std::fs::read(brick.join("c/moved")).expect("read on disk"), b"hello WORLD");
    assert_eq!(gfid_xattr(brick), Gfid::ROOT);
    assert_eq!(gfid_xattr(&brick.join("c/moved")), data_gfid);
    let file_handle = handle_path(brick, data_gfid);
    assert_eq!(
        std::fs::metadata(&file_handle).expect("file handle").ino(),
        std::fs::metadata(brick.join("c/moved")).expect("file").ino(),
        "a file's handle is a hard link"
    );
    let b2 = gfid_xattr(&brick.join("c/b2"));
    let c_gfid = gfid_xattr(&brick.join("c"));
    let dir_handle = std::fs::read_link(handle_path(brick, b2)).expect("dir handle is a symlink");
    let cs = c_gfid.to_string();
    assert_eq!(dir_handle, Path::new("../../").join(&cs[0..2]).join(&cs[2..4]).join(&cs).join("b2"));
    assert_eq!(
        std::fs::canonicalize(handle_path(brick, b2)).expect("resolves"),
        std::fs::canonicalize(brick.join("c/b2")).expect("dir")
    );
    for entry in ["a", "a/hard", "a/sym", "c", "c/b2", "c/b2/inner", "c/moved"] {
        let g = gfid_xattr(&brick.join(entry));
        assert!(!g.is_null(), "{entry} has a gfid");
        assert!(std::fs::symlink_metadata(handle_path(brick, g)).is_ok(), "{entry} has a handle");
    }

    // io-stats saw the traffic.
    let dump = graph.dump();
    assert!(dump.iter().any(|(k, v)| k.contains("WRITE") || v.contains("WRITE")), "io-stats dump: {dump:?}");
}
