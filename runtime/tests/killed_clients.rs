//! A client killed while it holds locks (issue 17, item 1, without network
//! namespaces): a replica-3 FUSE mount (a real `xlfs mount` process) that
//! holds AFR's eager lock on a file it keeps writing, and a POSIX lock on
//! it, is SIGKILLed. Another mount gets the POSIX lock and writes the file
//! (the eager lock gone with the dead client's connections) within the
//! ping timeout, and heal leaves three identical copies.

mod kit;

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kit::fuse_mount::{FuseMount, is_mounted};
use kit::{Cluster, assert_bricks_identical, heal_until_clean, volfile_file};

/// A hang guard: a killed client's connections close at once, so its
/// locks go long before the ping timeout would notice it.
const GUARD: Duration = Duration::from_secs(20);

/// fcntl byte-range write lock over the whole file, without waiting.
fn try_lock(f: &File) -> std::io::Result<()> {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: a valid fd and a flock struct that outlives the call.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

fn open_rw(path: &std::path::Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).expect("open")
}

#[test]
fn a_client_killed_holding_eager_and_posix_locks_frees_them() {
    let c = Cluster::start(3);
    let text = c.replica_volfile(&[]);
    let tmp = tempfile::tempdir().expect("tmp");
    let vol = volfile_file(tmp.path(), &text);
    let mut a = FuseMount::start(&text, "");
    let b = FuseMount::start(&text, "");

    let fa = Arc::new(open_rw(&a.path().join("f")));
    fa.write_all_at(&[1u8; 1 << 20], 0).expect("a writes");
    try_lock(&fa).expect("a takes a POSIX lock");
    let fb = open_rw(&b.path().join("f"));
    let busy = try_lock(&fb).expect_err("a holds the lock");
    assert!(matches!(busy.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)), "{busy}");

    // a keeps writing (AFR keeps its eager lock on f) until it dies.
    let written = Arc::new(AtomicU64::new(0));
    let writer = std::thread::spawn({
        let (fa, written) = (fa.clone(), written.clone());
        move || {
            let block = [2u8; 65536];
            for i in 0u64.. {
                if fa.write_all_at(&block, (i % 16) * 65536).is_err() {
                    return;
                }
                written.store(i + 1, Ordering::Release);
            }
        }
    });
    let start = Instant::now();
    while written.load(Ordering::Acquire) < 20 {
        assert!(start.elapsed() < GUARD, "a's writes go through");
        std::thread::sleep(Duration::from_millis(10));
    }
    a.stop_with(libc::SIGKILL);
    let _ = xlfs_runtime::fuse::lazy_unmount(a.path());
    writer.join().expect("writer thread");
    drop(fa);
    assert!(!is_mounted(a.path()));

    // b gets the lock and writes, well within the guard.
    let start = Instant::now();
    while let Err(e) = try_lock(&fb) {
        assert!(start.elapsed() < GUARD, "the dead client's POSIX lock is still held after {GUARD:?}: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    fb.write_all_at(b"b was here", 0).expect("b writes the file the dead client had locked");
    fb.sync_all().expect("b's fsync");
    let mut head = [0u8; 10];
    fb.read_exact_at(&mut head, 0).expect("b reads");
    assert_eq!(&head, b"b was here");
    drop(fb);
    drop(b);

    // Whatever a left half done, heal finishes: three identical copies.
    heal_until_clean(&vol);
    assert_bricks_identical(&c, true);
}
