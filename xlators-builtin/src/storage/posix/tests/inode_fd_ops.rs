//! Tests of storage/posix's data I/O and inode attributes.

use super::*;

#[tokio::test]
async fn reads_writes_sparse_and_eof() {
    let e = env();
    let (_, fd) = e.create(Gfid::ROOT, "f").await;
    e.write(fd, 0, b"abcdef").await;
    e.write(fd, 3, b"XY").await;
    assert_eq!(e.read(fd, 0, 100).await.expect("read"), b"abcXYf");
    assert_eq!(e.read(fd, 2, 3).await.expect("read"), b"cXY");
    assert_eq!(e.read(fd, 6, 10).await.expect("at eof"), b"");
    assert_eq!(e.read(fd, 1 << 30, 10).await.expect("past eof"), b"");

    let far = 4 << 20;
    e.write(fd, far, b"end").await;
    let st = match e.reply(Fop::Fstat { fd }).await.expect("fstat") {
        Reply::Attr(a) => a,
        r => panic!("{r:?}"),
    };
    assert_eq!(st.size, far + 3);
    assert!(st.blocks * 512 < far, "sparse file allocated {} blocks", st.blocks);
    let mid = e.read(fd, 1 << 20, 4096).await.expect("hole");
    assert_eq!(mid, vec![0u8; 4096]);
    assert_eq!(e.read(fd, far - 2, 10).await.expect("tail"), b"\0\0end");
    assert_eq!(e.read(fd, 0, (MAX_IO + 1) as u32).await, Err(Errno::EINVAL));

    // Truncate by path and by fd.
    let g = fd.gfid;
    assert!(
        matches!(e.reply(Fop::Truncate { loc: Loc::gfid(g), offset: 2 }).await, Ok(Reply::PrePost { post, .. }) if post.size == 2)
    );
    assert_eq!(e.read(fd, 0, 10).await.expect("read"), b"ab");
    assert!(
        matches!(e.reply(Fop::Ftruncate { fd, offset: 0 }).await, Ok(Reply::PrePost { post, .. }) if post.size == 0)
    );
    e.release(fd).await;
    assert_eq!(e.read(fd, 0, 1).await, Err(Errno::EBADF));
}

/// Lent memory over a heap buffer, saying when it is used.
struct HeapLent(Vec<u8>, Arc<std::sync::atomic::AtomicBool>);

impl LentMem for HeapLent {
    fn capacity(&self) -> usize {
        self.0.len()
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.0
    }
    fn freeze(self: Box<Self>, len: usize) -> Bytes {
        self.1.store(true, Ordering::Relaxed);
        let mut v = self.0;
        v.truncate(len);
        Bytes::from(v)
    }
}

#[tokio::test]
async fn a_read_fills_the_memory_its_caller_lent() {
    let e = env();
    let (_, fd) = e.create(Gfid::ROOT, "f").await;
    e.write(fd, 0, b"abcdef").await;
    let read = |size: u32, lent: Vec<u8>| {
        let used = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mem = HeapLent(lent, used.clone());
        let ctx = CallCtx { lent: xlfs_sdk::ctx::Lent::new(Box::new(mem)), ..e.ctx.clone() };
        let xl = e.xl.clone();
        async move {
            match xl.call(ctx, Request::new(Fop::Readv { fd, size, offset: 1, flags: 0 })).await.expect("read").reply {
                Reply::Read { data, .. } => (data.to_vec(), used.load(Ordering::Relaxed)),
                r => panic!("{r:?}"),
            }
        }
    };
    // Read into the lent buffer (a short read at end of file, too).
    assert_eq!(read(4, vec![0; 64]).await, (b"bcde".to_vec(), true));
    assert_eq!(read(64, vec![0; 64]).await, (b"bcdef".to_vec(), true));
    // Lent memory smaller than the read is not used.
    assert_eq!(read(5, vec![0; 2]).await, (b"bcdef".to_vec(), false));
}

#[tokio::test]
async fn mknod_setattr_access_statfs() {
    let e = env_with(&[("shared-brick-count", "2")]);
    let fifo = e
        .entry_of(
            Fop::Mknod { loc: Loc::entry(Gfid::ROOT, "fifo"), mode: libc::S_IFIFO | 0o640, rdev: 0, umask: 0o022 },
            Dict::new(),
        )
        .await
        .expect("mknod");
    assert_eq!((fifo.file_type(), fifo.mode & 0o7777), (FileType::Fifo, 0o640));
    // Never opened on the brick (an O_RDONLY open would wait for a writer).
    assert_eq!(e.open(fifo.gfid, libc::O_RDONLY).await.err(), Some(Errno::ENXIO));
    let bad =
        e.run(Fop::Mknod { loc: Loc::entry(Gfid::ROOT, "x"), mode: libc::S_IFDIR | 0o755, rdev: 0, umask: 0 }).await;
    assert_eq!(bad.err(), Some(Errno::EINVAL));
    // umask applies; the brick process's umask does not.
    let d = e
        .entry_of(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "open"), mode: 0o777, umask: 0o002 }, Dict::new())
        .await
        .expect("mkdir");
    assert_eq!(d.mode & 0o7777, 0o775);

    let (f, fd) = e.create(Gfid::ROOT, "f").await;
    let attr = SetAttr {
        mode: Some(0o600),
        uid: Some(1234),
        gid: Some(5678),
        atime: Some(TimeSet::At(Timespec { sec: 1_000_000, nsec: 5 })),
        mtime: Some(TimeSet::At(Timespec { sec: 2_000_000, nsec: 7 })),
    };
    match e.reply(Fop::Setattr { loc: Loc::gfid(f), attr }).await.expect("setattr") {
        Reply::PrePost { pre, post } => {
            assert_eq!(pre.mode & 0o7777, 0o644);
            assert_eq!((post.mode & 0o7777, post.uid, post.gid), (0o600, 1234, 5678));
            assert_eq!(
                (post.atime.sec, post.atime.nsec, post.mtime.sec, post.mtime.nsec),
                (1_000_000, 5, 2_000_000, 7)
            );
        }
        r => panic!("{r:?}"),
    }
    let md = std::fs::metadata(e.brick.join("f")).expect("md");
    assert_eq!((md.mode() & 0o7777, md.uid(), md.mtime()), (0o600, 1234, 2_000_000));
    let now = SetAttr { mtime: Some(TimeSet::Now), ..SetAttr::default() };
    match e.reply(Fop::Fsetattr { fd, attr: now }).await.expect("fsetattr") {
        Reply::PrePost { post, .. } => assert!(post.mtime.sec > 2_000_000),
        r => panic!("{r:?}"),
    }

    // Access for another user: owner 1234 with mode 0600.
    let mut other = CallCtx::root("c");
    other.uid = 1000;
    other.gid = 1000;
    let access = |ctx: CallCtx, mask| {
        let xl = e.xl.clone();
        async move { xl.call(ctx, Request::new(Fop::Access { loc: Loc::gfid(f), mask })).await.map(drop) }
    };
    assert_eq!(access(other.clone(), 4).await, Err(Errno::EACCES));
    assert_eq!(access(other.clone(), 0).await, Ok(()));
    let mut owner = other.clone();
    owner.uid = 1234;
    assert_eq!(access(owner.clone(), 6).await, Ok(()));
    assert_eq!(access(owner, 1).await, Err(Errno::EACCES));
    assert_eq!(access(CallCtx::root("r"), 6).await, Ok(()));
    assert_eq!(access(CallCtx::root("r"), 1).await, Err(Errno::EACCES));

    // New inodes belong to the caller.
    let mut user = CallCtx::root("u");
    user.uid = 4321;
    user.gid = 8765;
    let id = e.fd_id();
    let fop = Fop::Create {
        loc: Loc::entry(Gfid::ROOT, "mine"),
        flags: libc::O_WRONLY as u32,
        mode: 0o600,
        umask: 0,
        fd: id,
    };
    e.xl.call(user, Request::new(fop)).await.expect("create as user");
    let md = std::fs::metadata(e.brick.join("mine")).expect("md");
    assert_eq!((md.uid(), md.gid()), (4321, 8765));

    let st = match e.reply(Fop::Statfs { loc: Loc::root() }).await.expect("statfs") {
        Reply::Statfs(s) => s,
        r => panic!("{r:?}"),
    };
    let raw = sys::fstatvfs(e.xl.inner.brick.root_fd()).expect("statvfs");
    assert_eq!(st.blocks, raw.f_blocks / 2);
    assert_eq!(st.files, raw.f_files / 2);
    assert!(st.bsize > 0);
    e.release(fd).await;
}

#[test]
fn adler32_known_values() {
    assert_eq!(adler32(b""), 1);
    assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    let big = vec![0xffu8; 100_000];
    // Reference: the straightforward modular definition.
    let (mut a, mut b) = (1u64, 0u64);
    for &x in &big {
        a = (a + u64::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    assert_eq!(adler32(&big), ((b << 16) | a) as u32);
}

#[tokio::test]
async fn rchecksum_matches_local_computation() {
    let e = env();
    let (_, fd) = e.create(Gfid::ROOT, "f").await;
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    e.write(fd, 0, &data).await;
    for (off, len) in [(0u64, 200_000u32), (1000, 4096), (199_000, 4096), (300_000, 10)] {
        let start = (off as usize).min(data.len());
        let end = (off as usize + len as usize).min(data.len());
        let slice = &data[start..end];
        match e.reply(Fop::Rchecksum { fd, offset: off, len }).await.expect("rchecksum") {
            Reply::Checksum { weak, strong } => {
                assert_eq!(weak, adler32(slice));
                assert_eq!(strong, <[u8; 32]>::from(Sha256::digest(slice)));
            }
            r => panic!("{r:?}"),
        }
    }
    let x = Dict::new().with("check-zero-filled", Value::U64(1));
    let rsp = e.runx(Fop::Rchecksum { fd, offset: 300_000, len: 10 }, x).await.expect("zero check");
    assert_eq!(rsp.xdata.get_u64("buf-has-zeroes"), Some(1));
    e.release(fd).await;
}

#[tokio::test]
async fn fallocate_discard_zerofill_seek() {
    let e = env();
    let (_, fd) = e.create(Gfid::ROOT, "f").await;
    let size = |r: Result<Reply, Errno>| match r {
        Ok(Reply::PrePost { post, .. }) => post.size,
        r => panic!("{r:?}"),
    };
    assert_eq!(size(e.reply(Fop::Fallocate { fd, mode: 0, offset: 0, len: 1 << 20 }).await), 1 << 20);
    assert_eq!(size(e.reply(Fop::Fallocate { fd, mode: 1, offset: 0, len: 4 << 20 }).await), 1 << 20, "keep-size");
    e.write(fd, 0, &vec![0xabu8; 1 << 20]).await;
    // Punch a hole in the middle: size stays, data reads zero, seek finds it.
    assert_eq!(size(e.reply(Fop::Discard { fd, offset: 256 << 10, len: 256 << 10 }).await), 1 << 20);
    assert_eq!(e.read(fd, 256 << 10, 4096).await.expect("hole"), vec![0u8; 4096]);
    assert_eq!(e.read(fd, 0, 4).await.expect("data"), vec![0xab; 4]);
    let seek = |offset, what| e.reply(Fop::Seek { fd, offset, what });
    assert_eq!(seek(0, SeekWhat::Hole).await.expect("hole"), Reply::Offset(256 << 10));
    assert_eq!(seek(256 << 10, SeekWhat::Data).await.expect("data"), Reply::Offset(512 << 10));
    assert_eq!(seek(0, SeekWhat::Data).await.expect("data at 0"), Reply::Offset(0));
    assert_eq!(seek(2 << 20, SeekWhat::Data).await.err(), Some(Errno::ENXIO));
    assert_eq!(seek(2 << 20, SeekWhat::Hole).await.err(), Some(Errno::ENXIO));
    // Zerofill inside and past the end.
    assert_eq!(size(e.reply(Fop::Zerofill { fd, offset: 4096, len: 8192 }).await), 1 << 20);
    let got = e.read(fd, 4090, 8200).await.expect("zeroed");
    assert!(got == [vec![0xab; 6], vec![0; 8192], vec![0xab; 2]].concat(), "zerofill wrote the wrong range");
    assert_eq!(size(e.reply(Fop::Zerofill { fd, offset: (1 << 20) - 10, len: 100 }).await), (1 << 20) + 90);
    e.release(fd).await;
}

#[tokio::test]
async fn copy_file_range_copies() {
    let e = env();
    let (_, a) = e.create(Gfid::ROOT, "a").await;
    let (_, b) = e.create(Gfid::ROOT, "b").await;
    e.write(a, 0, b"0123456789").await;
    match e
        .reply(Fop::CopyFileRange { fd_in: a, off_in: 2, fd_out: b, off_out: 5, len: 100, flags: 0 })
        .await
        .expect("copy")
    {
        Reply::Copied { len, post } => assert_eq!((len, post.size), (8, 13)),
        r => panic!("{r:?}"),
    }
    assert_eq!(e.read(b, 0, 100).await.expect("read"), b"\0\0\0\0\x0023456789");
    e.release(a).await;
    e.release(b).await;
}

/// Pages of `path` in the page cache (mincore over a shared mapping).
fn resident_pages(path: &Path) -> usize {
    let f = std::fs::File::open(path).expect("open");
    let len = f.metadata().expect("stat").len() as usize;
    if len == 0 {
        return 0;
    }
    let page = 4096;
    // SAFETY: a read-only shared mapping of an open file, unmapped below;
    // mincore writes one byte per page into a vector of that many bytes.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        let mut vec = vec![0u8; len.div_ceil(page)];
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0, "mincore");
        libc::munmap(p, len);
        vec.iter().filter(|b| **b & 1 != 0).count()
    }
}

/// Whether the file system under `dir` takes an O_DIRECT write (a probe).
fn o_direct_works(dir: &Path) -> bool {
    let probe = dir.join("probe");
    let supported =
        std::fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(&probe).is_ok_and(|f| {
            let buf = sys::AlignedBuf::zeroed(4096).expect("buf");
            // SAFETY: an aligned 4 KiB buffer written to an open fd.
            unsafe { libc::pwrite(f.as_raw_fd(), buf.as_slice().as_ptr().cast(), 4096, 0) == 4096 }
        });
    std::fs::remove_file(&probe).expect("rm probe");
    supported
}

/// Drops a file's clean pages from the page cache.
fn evict(path: &Path) {
    let f = std::fs::File::open(path).expect("open");
    f.sync_all().expect("fsync");
    // SAFETY: advice on an open fd; no memory is touched.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[tokio::test]
async fn large_aligned_reads_go_around_the_page_cache() {
    let mb = 1usize << 20;
    let data: Vec<u8> = (0..2 * mb + 100).map(|i| (i % 253) as u8).collect();
    for (opts, around) in [(&[("o-direct-read-min-size", "0")][..], false), (&[][..], true)] {
        let e = env_with(&[&[("o-direct-min-size", "0")], opts].concat());
        // (A tmpfs brick's pages are its store: nothing to go around.)
        let disk = !sys::in_memory(std::fs::File::open(&e.brick).expect("brick").as_fd());
        let around = around && disk && o_direct_works(&e.brick);
        let (g, fd) = e.create(Gfid::ROOT, "f").await;
        e.write(fd, 0, &data).await;
        let path = e.handle_path(g);
        evict(&path);
        assert_eq!(e.read(fd, mb as u64, mb as u32).await.expect("read"), &data[mb..2 * mb]);
        if disk {
            assert_eq!(resident_pages(&path), if around { 0 } else { 256 }, "around the cache: {around}");
        }
        // Across the end of the file: the bytes up to it.
        assert_eq!(e.read(fd, 2 * mb as u64, mb as u32).await.expect("read"), &data[2 * mb..]);
        // A page written (and still dirty in the cache) is read as written.
        let mut want = data[..mb].to_vec();
        want[4096..8192].fill(7);
        e.write(fd, 4096, &[7; 4096]).await;
        assert_eq!(e.read(fd, 0, mb as u32).await.expect("read"), want);
        // Below the threshold or unaligned: through the cache.
        evict(&path);
        assert_eq!(e.read(fd, 1, 256 * 1024).await.expect("read"), &want[1..256 * 1024 + 1]);
        assert!(!disk || resident_pages(&path) >= 64);
        e.release(fd).await;
        // An fd opened O_DIRECT reads across the end of the file too (a
        // short read there is the end, not a reason to read on unaligned).
        if around {
            let d = e.open(g, libc::O_RDONLY | libc::O_DIRECT).await.expect("open O_DIRECT");
            assert_eq!(e.read(d, 2 * mb as u64, mb as u32).await.expect("read"), &data[2 * mb..]);
            e.release(d).await;
        }
    }
}

#[tokio::test]
async fn large_aligned_writes_go_around_the_page_cache() {
    let mb = 1usize << 20;
    let data: Vec<u8> = (0..mb).map(|i| (i % 251) as u8).collect();
    // Off: every byte goes through the page cache.
    let e = env_with(&[("o-direct-min-size", "0")]);
    let (g, fd) = e.create(Gfid::ROOT, "buffered").await;
    e.write(fd, 0, &data).await;
    assert_eq!(resident_pages(&e.handle_path(g)), 256, "buffered 1 MiB write: every page cached");
    // Default: a 1 MiB write at an aligned offset skips the cache (when the
    // file system takes O_DIRECT at all: a probe decides), from an
    // unaligned buffer too; smaller, unaligned and O_APPEND writes do not.
    let e = env();
    let supported = o_direct_works(&e.brick);
    let (g, fd) = e.create(Gfid::ROOT, "direct").await;
    let unaligned = Bytes::from([vec![0u8], data.clone()].concat()).slice(1..);
    let r = e.reply(Fop::Writev { fd, data: unaligned, offset: mb as u64, flags: 0 }).await;
    assert!(matches!(r, Ok(Reply::PrePost { post, .. }) if post.size == 2 * mb as u64), "{r:?}");
    e.write(fd, 0, &data).await;
    let path = e.handle_path(g);
    if supported {
        assert_eq!(resident_pages(&path), 0, "1 MiB aligned writes left pages cached");
    }
    e.write(fd, 3 * mb as u64 + 1, &data[..4096]).await; // unaligned offset: buffered
    e.write(fd, 0, &data[..256 * 1024]).await; // below the threshold: buffered
    if supported {
        assert_eq!(resident_pages(&path), 2 + 64, "small and unaligned writes are buffered");
    }
    assert_eq!(e.read(fd, 0, mb as u32).await.expect("read"), data);
    assert_eq!(e.read(fd, mb as u64, mb as u32).await.expect("read"), data);
    assert_eq!(e.read(fd, 3 * mb as u64 + 1, 4096).await.expect("read"), &data[..4096]);
    // An O_APPEND fd appends whatever the offset says: never through the twin.
    let app = e.open(g, libc::O_WRONLY | libc::O_APPEND).await.expect("open append");
    e.write(app, 0, &data).await;
    let size = std::fs::metadata(&path).expect("stat").len();
    assert_eq!(size, 3 * mb as u64 + 1 + 4096 + mb as u64, "the append went to the end");
    assert_eq!(e.read(fd, size - mb as u64, mb as u32).await.expect("read"), data);
    e.release(app).await;
    e.release(fd).await;
}
