//! Tests of storage/posix's fd table: open flags, the fd limit, fds on
//! unlinked files.

use super::*;

#[tokio::test]
async fn open_flags_and_fd_limits() {
    let e = env_with(&[("max-open-fds", "2")]);
    let (g, fd) = e.create(Gfid::ROOT, "f").await;
    e.write(fd, 0, b"0123456789").await;
    let ro = e.open(g, libc::O_RDONLY).await.expect("open");
    assert_eq!(e.open(g, libc::O_RDONLY).await, Err(Errno::EMFILE));
    let id = e.fd_id();
    let r = e.run(Fop::Opendir { loc: Loc::root(), fd: id }).await;
    assert_eq!(r.err(), Some(Errno::EMFILE));
    e.release(ro).await;
    // O_TRUNC through open; a duplicate fd id is refused.
    let t = e.open(g, libc::O_RDWR | libc::O_TRUNC).await.expect("open trunc");
    assert_eq!(e.read(t, 0, 10).await.expect("read"), b"");
    let dup = e.run(Fop::Open { loc: Loc::gfid(g), flags: 0, fd: t.id }).await;
    assert_eq!(dup.err(), Some(Errno::EBADF));
    // Opening a directory, and O_DIRECT with an unaligned buffer.
    e.release(t).await;
    e.release(fd).await;
    let d = e.mkdir(Gfid::ROOT, "d").await;
    assert_eq!(e.open(d, libc::O_RDONLY).await.err(), Some(Errno::EISDIR));
    let direct = e.open(g, libc::O_RDWR | libc::O_DIRECT).await;
    if let Ok(direct) = direct {
        let data = vec![7u8; 4097];
        // Offset 1 of a Bytes is not page aligned; the brick copies it.
        let b = Bytes::from(data).slice(1..);
        let r = e.reply(Fop::Writev { fd: direct, data: b, offset: 0, flags: 0 }).await;
        assert!(matches!(r, Ok(Reply::PrePost { .. })), "{r:?}");
        assert_eq!(e.read(direct, 0, 4096).await.expect("direct read"), vec![7u8; 4096]);
        e.release(direct).await;
    }
    assert_eq!(e.run(Fop::Flush { fd: Fd { id: FdId(999_999), gfid: g } }).await.err(), Some(Errno::EBADF));
}

#[tokio::test]
async fn unlink_while_open_keeps_the_data() {
    let e = env();
    let (f, fd) = e.create(Gfid::ROOT, "f").await;
    e.write(fd, 0, b"before").await;
    let second = e.open(f, libc::O_RDONLY).await.expect("second fd");
    match e.reply(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "f"), flags: 0 }).await.expect("unlink") {
        Reply::Parent { pre, post } => assert!(post.mtime >= pre.mtime),
        r => panic!("{r:?}"),
    }
    assert!(!e.brick.join("f").exists());
    let parked = e.brick.join(".glusterfs/unlink").join(f.to_string());
    assert!(!e.handle_path(f).exists() && parked.exists(), "an open file's handle waits in .glusterfs/unlink");
    assert_eq!(e.lookup(Gfid::ROOT, "f").await.err(), Some(Errno::ENOENT));
    // No name left, but open here: found by gfid (stat through the open
    // file, a nameless lookup and a reopen after a graph switch), with no link.
    let st = e.stat(f).await.expect("stat of an unlinked open file");
    assert_eq!((st.nlink, st.size), (0, 6));
    let found = e.entry_of(Fop::Lookup { loc: Loc::gfid(f) }, Dict::new()).await.expect("nameless lookup");
    assert_eq!((found.gfid, found.nlink), (f, 0));
    let third = e.open(f, libc::O_RDONLY).await.expect("reopen by gfid");
    e.release(third).await;
    assert!(parked.exists(), "two fds are still open");
    e.write(fd, 6, b" after").await;
    assert_eq!(e.read(second, 0, 100).await.expect("read"), b"before after");
    match e.reply(Fop::Fstat { fd }).await.expect("fstat") {
        Reply::Attr(a) => assert_eq!((a.gfid, a.nlink, a.size), (f, 0, 12)),
        r => panic!("{r:?}"),
    }
    e.release(fd).await;
    assert!(parked.exists(), "one fd is still open");
    assert_eq!(e.read(second, 0, 6).await.expect("read"), b"before");
    e.release(second).await;
    assert!(std::fs::symlink_metadata(&parked).is_err(), "the handle must go with the last fd");
    assert!(std::fs::symlink_metadata(e.handle_path(f)).is_err());
    assert_eq!(e.stat(f).await.err(), Some(Errno::ENOENT), "gone with the last fd");
    assert_eq!(e.run(Fop::Release { fd: second }).await.err(), Some(Errno::EBADF));

    // Unlink of a closed file removes the handle at once; rmdir too.
    let (g, gfd) = e.create(Gfid::ROOT, "g").await;
    e.release(gfd).await;
    e.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "g"), flags: 0 }).await.expect("unlink");
    assert!(std::fs::symlink_metadata(e.handle_path(g)).is_err());
    let d = e.mkdir(Gfid::ROOT, "d").await;
    assert_eq!(e.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "d"), flags: 0 }).await.err(), Some(Errno::EISDIR));
    e.mkdir(d, "child").await;
    assert_eq!(e.run(Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, "d"), flags: 0 }).await.err(), Some(Errno::ENOTEMPTY));
    e.run(Fop::Rmdir { loc: Loc::entry(d, "child"), flags: 0 }).await.expect("rmdir child");
    e.run(Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, "d"), flags: 0 }).await.expect("rmdir");
    assert!(std::fs::symlink_metadata(e.handle_path(d)).is_err());
    assert_eq!(e.stat(d).await.err(), Some(Errno::ENOENT));
}

/// A brick stopped (or killed) with an unlinked file open leaves its handle
/// in `.glusterfs/unlink`; the next start drops it (no fd can be open).
#[tokio::test]
async fn a_restarted_brick_drops_what_was_unlinked_while_open() {
    let e = env();
    let (f, fd) = e.create(Gfid::ROOT, "f").await;
    e.write(fd, 0, &[1u8; 8192]).await;
    e.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "f"), flags: 0 }).await.expect("unlink");
    let parked = e.brick.join(".glusterfs/unlink").join(f.to_string());
    assert!(parked.exists());
    // A second brick over the same directory stands for the restart.
    let again = Posix::new(init(&e.brick, &[])).expect("restart");
    assert!(!parked.exists(), "the left-over file is dropped at start");
    drop(again);
    // The first instance's fd still reads its data (the kernel keeps the
    // inode), and its last close does not trip over the missing handle.
    assert_eq!(e.read(fd, 0, 4).await.expect("read"), vec![1u8; 4]);
    e.release(fd).await;
    assert_eq!(std::fs::read_dir(e.brick.join(".glusterfs/unlink")).expect("unlink dir").count(), 0);
}
