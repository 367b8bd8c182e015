//! performance/write-behind through a real FUSE mount (`xlfs mount`) over
//! storage/posix, with debug/error-gen between them where a test needs
//! writes to fail: overlapping writes keep their order and reads and fstat
//! after writes are exact; a write that fails behind the application's
//! back is reported by the next fsync; an O_DIRECT write is not delayed
//! (its error comes back from the write itself).

mod kit;

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use kit::fuse_mount::FuseMount;

/// posix -> [error-gen failing every WRITE with ENOSPC] -> write-behind -> io-stats.
fn volfile(brick: &Path, failing: bool) -> String {
    let mut v = format!("volume posix\n type storage/posix\n option directory {}\nend-volume\n", brick.display());
    let mut below = "posix";
    if failing {
        v += "volume eg\n type debug/error-gen\n option failure 100\n option error-no ENOSPC\n option enable WRITE\n \
              subvolumes posix\nend-volume\n";
        below = "eg";
    }
    v += &format!("volume wb\n type performance/write-behind\n subvolumes {below}\nend-volume\n");
    v += "volume top\n type debug/io-stats\n subvolumes wb\nend-volume\n";
    v
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
    let dir = tempfile::tempdir().expect("dir");
    let brick = dir.path().join("brick");
    std::fs::create_dir(&brick).expect("brick");
    let m = FuseMount::start(&volfile(&brick, false), "");
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
    let dir = tempfile::tempdir().expect("dir");
    let brick = dir.path().join("brick");
    std::fs::create_dir(&brick).expect("brick");
    let m = FuseMount::start(&volfile(&brick, true), "");
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
