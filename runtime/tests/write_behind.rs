//! performance/write-behind through a real FUSE mount (`xlfs mount`) over
//! storage/posix, with debug/error-gen between them where a test needs
//! writes to fail: overlapping writes keep their order and reads and fstat
//! after writes are exact; a write that fails behind the application's
//! back is reported by the next fsync; an O_DIRECT write is not delayed
//! (its error comes back from the write itself); tar's futimens, fchown
//! and fchmod of an open file are answered at once, show at once, reach
//! the brick, and a failure among them is reported by the next fsync.

mod kit;

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use kit::fuse_mount::FuseMount;

/// posix -> [error-gen failing every `failing` fop with ENOSPC] -> write-behind -> io-stats.
fn volfile(brick: &Path, failing: Option<&str>) -> String {
    let mut v = format!("volume posix\n type storage/posix\n option directory {}\nend-volume\n", brick.display());
    let mut below = "posix";
    if let Some(fop) = failing {
        v += &format!(
            "volume eg\n type debug/error-gen\n option failure 100\n option error-no ENOSPC\n option enable {fop}\n \
             subvolumes posix\nend-volume\n"
        );
        below = "eg";
    }
    v += &format!("volume wb\n type performance/write-behind\n subvolumes {below}\nend-volume\n");
    v += "volume top\n type debug/io-stats\n subvolumes wb\nend-volume\n";
    v
}

/// A mount of [`volfile`] over a new brick directory: (the temporary
/// directory, the brick, the mount), dropped in reverse order.
fn mounted(failing: Option<&str>) -> (tempfile::TempDir, std::path::PathBuf, FuseMount) {
    let dir = tempfile::tempdir().expect("dir");
    let brick = dir.path().join("brick");
    std::fs::create_dir(&brick).expect("brick");
    let m = FuseMount::start(&volfile(&brick, failing), "");
    (dir, brick, m)
}

/// A small deterministic generator for offsets and lengths.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn overlapping_writes_and_reads_and_fstat_after_them_are_exact() {
    let (_dir, brick, m) = mounted(None);
    let path = m.path().join("f");
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("create");
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Lcg(7);
    for k in 0..300u64 {
        let off = rng.next(64 * 1024) as usize;
        let len = 1 + rng.next(9000) as usize;
        let data: Vec<u8> = (0..len).map(|i| (k as usize * 31 + i) as u8).collect();
        f.write_all_at(&data, off as u64).expect("write");
        if model.len() < off + len {
            model.resize(off + len, 0);
        }
        model[off..off + len].copy_from_slice(&data);
        let size = f.metadata().expect("fstat").len();
        assert_eq!(size, model.len() as u64, "fstat after write {k}");
        let (ro, rl) = (rng.next(model.len() as u64) as usize, 1 + rng.next(4096) as usize);
        let rl = rl.min(model.len() - ro);
        let mut got = vec![0u8; rl];
        f.read_exact_at(&mut got, ro as u64).expect("read after write");
        assert!(got == model[ro..ro + rl], "read of {rl} at {ro} after write {k}");
    }
    f.sync_all().expect("fsync");
    drop(f);
    let mut again = Vec::new();
    std::fs::File::open(&path).expect("open").read_to_end(&mut again).expect("read back");
    assert!(again == model, "read back through the mount");
    assert!(std::fs::read(brick.join("f")).expect("brick copy") == model, "the brick holds the writes in order");
}

#[test]
fn a_write_that_fails_behind_is_reported_by_fsync_and_o_direct_is_not_delayed() {
    let (_dir, _brick, m) = mounted(Some("WRITE"));
    let path = m.path().join("f");
    let mut f =
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("create");
    // Acknowledged once queued: the failure comes later.
    f.write_all_at(&[1u8; 4096], 0).expect("the write is acknowledged behind");
    let err = f.sync_all().expect_err("fsync reports the write that failed behind");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    f.seek(SeekFrom::Start(0)).expect("seek");
    drop(f);
    // O_DIRECT: the write goes down at once and its error comes back from it.
    let mut buf = vec![0u8; 8192];
    let start = buf.as_ptr().align_offset(4096);
    let aligned = &mut buf[start..start + 4096];
    aligned.fill(2);
    let d = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&path).expect("open O_DIRECT");
    // SAFETY: an open fd and a buffer of the given length.
    let n = unsafe { libc::pwrite(d.as_raw_fd(), aligned.as_ptr().cast(), aligned.len(), 0) };
    let e = std::io::Error::last_os_error();
    assert_eq!(n, -1, "an O_DIRECT write is not acknowledged before the brick answers");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
}

/// `futimens` of `fd` to (atime, mtime) seconds.
fn futimens(fd: &std::fs::File, atime: i64, mtime: i64) -> std::io::Result<()> {
    let ts = [libc::timespec { tv_sec: atime, tv_nsec: 0 }, libc::timespec { tv_sec: mtime, tv_nsec: 0 }];
    // SAFETY: an open fd and two timespecs.
    if unsafe { libc::futimens(fd.as_raw_fd(), ts.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn setattrs_of_an_open_file_are_answered_behind_show_at_once_and_reach_the_brick() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (_dir, brick, m) = mounted(None);
    let path = m.path().join("f");
    // As tar extracts a file: data, then times, owner and mode on its fd.
    let f = std::fs::OpenOptions::new().write(true).create_new(true).open(&path).expect("create");
    f.write_all_at(&[7u8; 10_000], 0).expect("write");
    futimens(&f, 1_000_000, 2_000_000).expect("futimens");
    std::os::unix::fs::fchown(&f, Some(1234), Some(5678)).expect("fchown");
    f.set_permissions(std::fs::Permissions::from_mode(0o751)).expect("fchmod");
    let seen = |what: &str, md: std::fs::Metadata| {
        assert_eq!(
            (md.len(), md.mode() & 0o7777, md.uid(), md.gid(), md.atime(), md.mtime()),
            (10_000, 0o751, 1234, 5678, 1_000_000, 2_000_000),
            "{what}"
        );
    };
    seen("fstat", f.metadata().expect("fstat"));
    seen("stat", std::fs::metadata(&path).expect("stat"));
    drop(f);
    let stats = kit::status_dump(m.path());
    assert_eq!(stats.get("wb.setattrs-behind").map(String::as_str), Some("3"), "{stats:?}");
    xlfs_sdk::testing::eventually("the brick has the attributes", std::time::Duration::from_secs(10), || {
        let md = std::fs::metadata(brick.join("f")).map_err(|e| e.to_string())?;
        let got = (md.len(), md.mode() & 0o7777, md.uid(), md.gid(), md.atime(), md.mtime());
        let want = (10_000, 0o751, 1234, 5678, 1_000_000, 2_000_000);
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    });
    seen("stat after close", std::fs::metadata(&path).expect("stat"));
}

#[test]
fn a_setattr_that_fails_behind_is_reported_by_fsync() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, _brick, m) = mounted(Some("FSETATTR"));
    let f = std::fs::OpenOptions::new().write(true).create_new(true).open(m.path().join("f")).expect("create");
    f.write_all_at(b"data", 0).expect("write");
    f.set_permissions(std::fs::Permissions::from_mode(0o600)).expect("fchmod is answered behind");
    let err = f.sync_all().expect_err("fsync reports the fchmod that failed behind");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    f.sync_all().expect("reported once");
}
