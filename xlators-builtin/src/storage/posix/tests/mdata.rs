//! The stamped times (`ctime`, see `mdata`).

use xlfs_sdk::dict::keys::UTIME;

use crate::storage::posix::mdata::MDATA_XATTR;

use super::*;

fn at(sec: i64, nsec: u32) -> Timespec {
    Timespec { sec, nsec }
}

fn stamp(t: Timespec) -> Dict {
    Dict::new().with(UTIME, Value::U64(t.to_nanos()))
}

fn times(ia: &Iatt) -> (Timespec, Timespec, Timespec) {
    (ia.ctime, ia.mtime, ia.atime)
}

/// A file made and written with stamps on two bricks shows the same times
/// on both, whatever their own clocks did; the bricks' bookkeeping moves
/// nothing, and a setattr keeps the times it was given.
#[tokio::test]
async fn two_bricks_given_the_same_stamps_show_the_same_times() {
    let (a, b) = (env(), env());
    let made = at(1_700_000_000, 111);
    let wrote = at(1_700_000_100, 222);
    let g = Gfid::random();
    let mut seen = Vec::new();
    for e in [&a, &b] {
        let id = e.fd_id();
        let create =
            Fop::Create { loc: Loc::entry(Gfid::ROOT, "f"), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id };
        let mut x = stamp(made);
        x.set(GFID_REQ, Value::Gfid(g));
        let ia = e.entry_of(create, x).await.expect("create");
        assert_eq!(times(&ia), (made, made, made), "a new inode's times are the stamp");
        let fd = Fd { id, gfid: g };
        std::thread::sleep(std::time::Duration::from_millis(5));
        let w = Fop::Writev { fd, data: Bytes::from_static(b"hello"), offset: 0, flags: 0 };
        let Reply::PrePost { pre, post } = e.runx(w, stamp(wrote)).await.expect("write").reply else { panic!("reply") };
        assert_eq!((pre.mtime, post.mtime, post.ctime, post.atime), (made, wrote, wrote, made));
        // Replicate's changelog: an unstamped xattrop on the inode.
        let mut add = Dict::new();
        add.set_bytes("trusted.afr.v-client-1", vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        e.run(Fop::Fxattrop { fd, op: XattropOp::AddArray, xattrs: add }).await.expect("xattrop");
        let st = e.stat(g).await.expect("stat");
        assert_eq!(times(&st), (wrote, wrote, made), "the bookkeeping moved no time");
        let root = e.lookup(Gfid::ROOT, "f").await.expect("lookup");
        assert_eq!(times(&root), times(&st));
        seen.push(st);
        e.release(fd).await;
    }
    assert_eq!(times(&seen[0]), times(&seen[1]));
    // The copies' own ctimes differ from what is shown (set by the clock).
    let own = std::fs::symlink_metadata(a.brick.join("f")).expect("brick file");
    assert_ne!((own.ctime(), own.ctime_nsec()), (wrote.sec, i64::from(wrote.nsec)));

    // setattr: the times it gives, ctime the stamp; a listing shows them.
    let set = at(1_700_000_200, 0);
    let mtime = at(1_000_000_000, 5);
    let attr = SetAttr { mtime: Some(TimeSet::At(mtime)), atime: Some(TimeSet::Now), ..SetAttr::default() };
    a.runx(Fop::Setattr { loc: Loc::gfid(g), attr }, stamp(set)).await.expect("setattr");
    assert_eq!(times(&a.stat(g).await.expect("stat")), (set, mtime, set));
    let id = a.fd_id();
    a.run(Fop::Opendir { loc: Loc::root(), fd: id }).await.expect("opendir");
    let Reply::Dirents(list) =
        a.reply(Fop::Readdirp { fd: Fd { id, gfid: Gfid::ROOT }, size: 65536, offset: 0 }).await.expect("readdirp")
    else {
        panic!("dirents")
    };
    let f = list.iter().find(|d| d.name == "f").expect("f listed");
    assert_eq!(times(&f.iatt), (set, mtime, set));
    // The directory took the create's stamp.
    assert_eq!(a.stat(Gfid::ROOT).await.expect("root").mtime, made);
    // Clients can neither see nor set the stored times.
    let all = a.reply(Fop::Getxattr { loc: Loc::gfid(g), name: String::new() }).await.expect("getxattr");
    assert!(!all.into_xattrs().expect("xattrs").contains(MDATA_XATTR));
    let forge = bytes_xdata(MDATA_XATTR, &[1; 37]);
    let r = a.run(Fop::Setxattr { loc: Loc::gfid(g), xattrs: forge, flags: 0 }).await;
    assert_eq!(r.err(), Some(Errno::EPERM));
}

/// With `ctime off`, stamps are ignored: the file system's own times.
#[tokio::test]
async fn ctime_off_shows_the_file_systems_times() {
    let e = env_with(&[("ctime", "off")]);
    let old = at(1_000, 0);
    let id = e.fd_id();
    let create =
        Fop::Create { loc: Loc::entry(Gfid::ROOT, "f"), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id };
    let ia = e.entry_of(create, stamp(old)).await.expect("create");
    assert!(ia.mtime.sec > 1_000_000_000, "{:?}", ia.mtime);
    assert_eq!(xattr(&e.brick.join("f"), MDATA_XATTR), None);
}

/// A file written again and again (a database's WAL) has its times
/// written to the xattr once a window, not once a write: what a stat shows
/// is always the last stamp, and the xattr catches up when read by name,
/// at release, and once the window is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_of_a_file_written_often_are_written_once_a_window() {
    use crate::storage::posix::mdata::Mdata;
    let e = env();
    let g = Gfid::random();
    let id = e.fd_id();
    let create =
        Fop::Create { loc: Loc::entry(Gfid::ROOT, "f"), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id };
    let mut x = stamp(at(1_700_000_000, 0));
    x.set(GFID_REQ, Value::Gfid(g));
    e.entry_of(create, x).await.expect("create");
    let fd = Fd { id, gfid: g };
    let on_disk = || {
        let v = xattr(&e.brick.join("f"), MDATA_XATTR).expect("stored times");
        Mdata::decode(&v).expect("decodes").mtime
    };
    let write = |i: i64| {
        let w = Fop::Writev { fd, data: Bytes::from_static(b"wal record"), offset: 0, flags: libc::O_DSYNC as u32 };
        e.runx(w, stamp(at(1_700_000_000 + i, 0)))
    };
    // A new file's times wait for its first write and close like those of
    // a data change (here: written when read by name). A window later the
    // first data change is written at once; the next ones in the window
    // only shown.
    assert_eq!(xattr(&e.brick.join("f"), MDATA_XATTR), None);
    e.run(Fop::Fgetxattr { fd, name: MDATA_XATTR.into() }).await.expect("getxattr");
    assert_eq!(on_disk(), at(1_700_000_000, 0));
    tokio::time::sleep(crate::storage::posix::mdata::DEFER_WINDOW).await;
    write(1).await.expect("write");
    assert_eq!(on_disk(), at(1_700_000_001, 0));
    for i in 2..=5 {
        write(i).await.expect("write");
        assert_eq!(e.stat(g).await.expect("stat").mtime, at(1_700_000_000 + i, 0));
    }
    assert_eq!(on_disk(), at(1_700_000_001, 0), "deferred within the window");
    // Read by name: written first.
    e.run(Fop::Fgetxattr { fd, name: MDATA_XATTR.into() }).await.expect("getxattr");
    assert_eq!(on_disk(), at(1_700_000_005, 0));
    // Once the window is over, the timer writes what is pending.
    write(6).await.expect("write");
    assert_eq!(on_disk(), at(1_700_000_005, 0));
    // The timer ticks every window; a loaded machine may delay a tick.
    let deadline = std::time::Instant::now() + crate::storage::posix::mdata::DEFER_WINDOW * 20;
    while on_disk() != at(1_700_000_006, 0) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(on_disk(), at(1_700_000_006, 0), "written by the timer");
    // At release.
    write(7).await.expect("write");
    write(8).await.expect("write");
    e.release(fd).await;
    assert_eq!(on_disk(), at(1_700_000_008, 0), "written at release");
    // A full-sync write's times are never deferred.
    let id = e.fd_id();
    e.run(Fop::Open { loc: Loc::gfid(g), flags: libc::O_RDWR as u32, fd: id }).await.expect("open");
    let fd = Fd { id, gfid: g };
    let w = Fop::Writev { fd, data: Bytes::from_static(b"x"), offset: 0, flags: libc::O_SYNC as u32 };
    e.runx(w, stamp(at(1_700_000_009, 0))).await.expect("write");
    assert_eq!(on_disk(), at(1_700_000_009, 0));
    e.release(fd).await;
}

/// Where the stored times are shown, a setattr's chown to the owner the
/// file has and chmod to the mode it has are not made (an untar as root
/// asks for both on every file): the copy's own ctime stays. A chown that
/// would clear set-id bits is still made, as the kernel clears them even
/// when the owner stays. With `ctime off` the file system's ctime is what
/// is shown, so every part is made.
#[tokio::test]
async fn a_setattr_to_what_the_file_has_is_not_made_where_stored_times_are_shown() {
    let own_ctime = |e: &Env| {
        let m = std::fs::symlink_metadata(e.brick.join("f")).expect("brick file");
        (m.ctime(), m.ctime_nsec())
    };
    for ctime in ["on", "off"] {
        let e = env_with(&[("ctime", ctime)]);
        let id = e.fd_id();
        let create =
            Fop::Create { loc: Loc::entry(Gfid::ROOT, "f"), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id };
        let ia = e.entry_of(create, Dict::new()).await.expect("create");
        let fd = Fd { id, gfid: ia.gfid };
        let same = SetAttr { uid: Some(ia.uid), gid: Some(ia.gid), mode: Some(0o644), ..SetAttr::default() };
        let before = own_ctime(&e);
        std::thread::sleep(std::time::Duration::from_millis(20));
        e.run(Fop::Fsetattr { fd, attr: same }).await.expect("fsetattr");
        e.run(Fop::Setattr { loc: Loc::gfid(ia.gfid), attr: same }).await.expect("setattr");
        if ctime == "on" {
            assert_eq!(own_ctime(&e), before, "nothing to change: no call made");
        } else {
            assert_ne!(own_ctime(&e), before, "ctime off: the calls are made and move the ctime");
        }
        // A real change is made.
        let chmod = SetAttr { mode: Some(0o600), ..SetAttr::default() };
        let Reply::PrePost { post, .. } = e.run(Fop::Fsetattr { fd, attr: chmod }).await.expect("chmod").reply else {
            panic!("reply")
        };
        assert_eq!(post.mode & 0o7777, 0o600, "ctime {ctime}");
        // A set-uid file chowned to its own owner loses the bit, as on a local file system.
        let suid = SetAttr { mode: Some(0o4755), ..SetAttr::default() };
        e.run(Fop::Fsetattr { fd, attr: suid }).await.expect("set-uid");
        let chown = SetAttr { uid: Some(ia.uid), gid: Some(ia.gid), ..SetAttr::default() };
        let Reply::PrePost { post, .. } = e.run(Fop::Fsetattr { fd, attr: chown }).await.expect("chown").reply else {
            panic!("reply")
        };
        assert_eq!(post.mode & 0o7777, 0o755, "ctime {ctime}: set-uid cleared");
        e.release(fd).await;
    }
}
