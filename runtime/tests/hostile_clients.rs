//! Hostile clients (issue 17, item 3): a peer that has passed the
//! handshake and speaks valid frames, but with values a well-behaved client
//! never sends, against a real `xlfs brick` process (its whole generated
//! graph: server, io-stats, index, io-threads, upcall, locks, posix). Each
//! case gets an error, the brick keeps serving a well-behaved client
//! beside it, nothing outside the brick directory is touched, and the
//! brick's memory stays bounded:
//!
//! - offsets and sizes near 2^63 and 2^64, and byte ranges that overflow;
//! - fds the connection never opened, another connection's fd ids, an fd
//!   used after its release;
//! - lock owners of another client (an unlock that is not ours releases
//!   nothing);
//! - names with `/`, `.`, `..`, NUL, empty or over 255 bytes, and the
//!   brick's own `.glusterfs`;
//! - paths longer than PATH_MAX through deep directories;
//! - gfids that do not exist, the null gfid, the root as a thing to remove
//!   or rename;
//! - the `trusted.gfid` xattr set or removed from a client;
//! - opens of a FIFO and a device node (a FUSE client's kernel never asks:
//!   the brick would block a thread on the FIFO or read its own devices);
//! - 100,000 requests in flight from one connection;
//! - a slow reader that asks for large reads and never reads the replies.

mod kit;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kit::Brick;
use kit::raw::{RAW_GUARD, Raw};
use xlfs_sdk::{
    CallCtx, Dict, Errno, Fd, FdId, Flock, Fop, Gfid, LkCmd, Loc, LockType, Reply, SetAttr, Value, XattropOp,
};
use xlfs_xlators::protocol::rpc::Message;

/// The brick's resident memory in KiB.
fn rss_kib(brick: &Brick) -> u64 {
    let pid = brick.pid().expect("brick running");
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("brick status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

fn connect(brick: &Brick, who: &str) -> Raw {
    Raw::hello(brick.addr(), &brick.subvolume(), who)
}

/// The gfid of a created or looked-up entry.
fn gfid_of(r: Result<xlfs_sdk::Response, Errno>) -> Gfid {
    match r.expect("entry fop").reply {
        Reply::Entry { iatt, .. } => iatt.gfid,
        other => panic!("expected an entry, got {other:?}"),
    }
}

fn create(raw: &mut Raw, parent: Gfid, name: &str, fd: u64) -> Fd {
    let loc = Loc::entry(parent, name);
    let gfid = gfid_of(raw.call(Fop::Create { loc, flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: FdId(fd) }));
    Fd { id: FdId(fd), gfid }
}

fn mkdir(raw: &mut Raw, parent: Gfid, name: &str) -> Gfid {
    gfid_of(raw.call(Fop::Mkdir { loc: Loc::entry(parent, name), mode: 0o755, umask: 0 }))
}

fn write(raw: &mut Raw, fd: Fd, offset: u64, data: &'static [u8]) -> Result<xlfs_sdk::Response, Errno> {
    raw.call(Fop::Writev { fd, data: Bytes::from_static(data), offset, flags: 0 })
}

fn read(raw: &mut Raw, fd: Fd, offset: u64, size: u32) -> Result<Bytes, Errno> {
    match raw.call(Fop::Readv { fd, size, offset, flags: 0 })?.reply {
        Reply::Read { data, .. } => Ok(data),
        other => panic!("expected data, got {other:?}"),
    }
}

/// The well-behaved client still gets answers.
fn still_serves(good: &mut Raw, what: &str) {
    if let Err(e) = good.call(Fop::Stat { loc: Loc::root() }) {
        panic!("after {what}: the brick no longer serves a good client: {e:?}");
    }
}

/// Every entry under `dir`, as paths relative to it, `.glusterfs` left out.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            let rel = p.strip_prefix(dir).expect("under dir").display().to_string();
            if rel == ".glusterfs" {
                continue;
            }
            if p.is_dir() && !p.is_symlink() {
                stack.push(p.clone());
            }
            out.push(rel);
        }
    }
    out.sort();
    out
}

fn fails_with(r: Result<xlfs_sdk::Response, Errno>, allowed: &[Errno], what: &str) {
    match r {
        Err(e) => assert!(allowed.contains(&e), "{what}: failed with {e:?}, expected one of {allowed:?}"),
        Ok(resp) => panic!("{what}: succeeded ({:?})", resp.reply),
    }
}

#[test]
fn offsets_and_sizes_near_the_limits_are_refused() {
    let brick = Brick::start();
    let mut good = connect(&brick, "good");
    let mut evil = connect(&brick, "evil");
    let fd = create(&mut evil, Gfid::ROOT, "f", 1);
    write(&mut evil, fd, 0, b"0123456789").expect("a normal write");
    let huge = [i64::MAX as u64, i64::MAX as u64 - 4, 1 << 63, u64::MAX, u64::MAX - 4];
    let bad = [Errno::EINVAL, Errno::EFBIG, Errno::EOVERFLOW, Errno::ENOSPC];
    for off in huge {
        fails_with(write(&mut evil, fd, off, b"abcdefgh"), &bad, &format!("write at {off}"));
        match read(&mut evil, fd, off, 4096) {
            Ok(d) => assert!(d.is_empty(), "read at {off} returned {} bytes", d.len()),
            Err(e) => assert!(bad.contains(&e), "read at {off}: {e:?}"),
        }
        fails_with(evil.call(Fop::Ftruncate { fd, offset: off }), &bad, &format!("ftruncate to {off}"));
        let t = Fop::Truncate { loc: Loc::gfid(fd.gfid), offset: off };
        fails_with(evil.call(t), &bad, &format!("truncate to {off}"));
        for mode in [0, 1] {
            let f = Fop::Fallocate { fd, mode, offset: off, len: 4096 };
            fails_with(evil.call(f), &bad, &format!("fallocate mode {mode} at {off}"));
            let f = Fop::Fallocate { fd, mode, offset: 0, len: off };
            fails_with(evil.call(f), &bad, &format!("fallocate mode {mode} of {off} bytes"));
        }
        fails_with(evil.call(Fop::Zerofill { fd, offset: off, len: 4096 }), &bad, &format!("zerofill at {off}"));
        fails_with(evil.call(Fop::Zerofill { fd, offset: 4096, len: off }), &bad, &format!("zerofill of {off}"));
        // A hole punched past the end changes nothing; either answer is fine,
        // as long as the file is unchanged (checked below).
        let _ = evil.call(Fop::Discard { fd, offset: off, len: 4096 });
        // Byte-range locks whose end overflows.
        let lock = Flock { ty: LockType::Write, start: off, len: u64::MAX, pid: 1, owner: 1 };
        let r = evil.call(Fop::Lk { fd, cmd: LkCmd::SetLk, lock });
        fails_with(r, &[Errno::EINVAL, Errno::EOVERFLOW], &format!("a lock at {off} of 2^64-1 bytes"));
        let r = evil.call(Fop::Inodelk { domain: "d".into(), loc: Loc::gfid(fd.gfid), cmd: LkCmd::SetLk, lock });
        fails_with(r, &[Errno::EINVAL, Errno::EOVERFLOW], &format!("an inodelk at {off} of 2^64-1 bytes"));
        still_serves(&mut good, &format!("offset {off}"));
    }
    // Sizes: the largest reads a client may ask for.
    for size in [u32::MAX, 1 << 31, (64 << 20) + 1] {
        match read(&mut evil, fd, 0, size) {
            Ok(d) => assert_eq!(&d[..], b"0123456789", "a read of {size} bytes"),
            Err(e) => assert_eq!(e, Errno::EINVAL, "a read of {size} bytes"),
        }
    }
    let r = evil.call(Fop::Readdir { fd: Fd { id: FdId(9), gfid: Gfid::ROOT }, size: u32::MAX, offset: u64::MAX });
    assert_eq!(r.err(), Some(Errno::EBADF), "readdir on an fd never opened");
    let r = evil.call(Fop::Opendir { loc: Loc::root(), fd: FdId(2) });
    r.expect("opendir");
    let dfd = Fd { id: FdId(2), gfid: Gfid::ROOT };
    for (size, offset) in [(u32::MAX, 0), (0, 0), (4096, u64::MAX), (4096, 1 << 63)] {
        match evil.call(Fop::Readdirp { fd: dfd, size, offset }) {
            Ok(_) => {}
            Err(e) => assert!([Errno::EINVAL, Errno::ENOENT].contains(&e), "readdirp {size} at {offset}: {e:?}"),
        }
    }
    good.call(Fop::Open { loc: Loc::gfid(fd.gfid), flags: libc::O_RDONLY as u32, fd: FdId(77) }).expect("open");
    let data = read(&mut good, Fd { id: FdId(77), gfid: fd.gfid }, 0, 100).expect("read");
    assert_eq!(&data[..], b"0123456789", "the file is as it was");
    assert_eq!(std::fs::read(brick.dir().join("f")).expect("on disk"), b"0123456789");
}

#[test]
fn fds_and_lock_owners_of_others_are_not_ours() {
    let brick = Brick::start();
    let mut a = connect(&brick, "a");
    let mut b = connect(&brick, "b");
    let fa = create(&mut a, Gfid::ROOT, "shared", 1);
    write(&mut a, fa, 0, b"a's data").expect("a writes");

    // b never opened fd 1 (a did) nor fd 5 (nobody did).
    for id in [1, 5, u64::MAX] {
        let fd = Fd { id: FdId(id), gfid: fa.gfid };
        assert_eq!(read(&mut b, fd, 0, 10).err(), Some(Errno::EBADF), "b reads fd {id}");
        fails_with(write(&mut b, fd, 0, b"evil"), &[Errno::EBADF], &format!("b writes fd {id}"));
        fails_with(b.call(Fop::Fstat { fd }), &[Errno::EBADF], &format!("b fstats fd {id}"));
        fails_with(b.call(Fop::Fsync { fd, datasync: false }), &[Errno::EBADF], &format!("b fsyncs fd {id}"));
        fails_with(b.call(Fop::Release { fd }), &[Errno::EBADF], &format!("b releases fd {id}"));
    }
    assert_eq!(read(&mut a, fa, 0, 100).expect("a's fd still works"), &b"a's data"[..]);

    // a's locks: a POSIX lock and an inodelk with owner 7.
    let lock = Flock { ty: LockType::Write, start: 0, len: 100, pid: 1, owner: 7 };
    let a_ctx = CallCtx { lk_owner: 7, ..CallCtx::root("a") };
    a.call_as(&a_ctx, Fop::Lk { fd: fa, cmd: LkCmd::SetLk, lock }).expect("a locks");
    let ilk = |cmd, ty| Fop::Inodelk {
        domain: "dom".into(),
        loc: Loc::gfid(fa.gfid),
        cmd,
        lock: Flock { ty, start: 0, len: 0, pid: 1, owner: 7 },
    };
    a.call_as(&a_ctx, ilk(LkCmd::SetLk, LockType::Write)).expect("a takes an inodelk");

    // b opens the file itself and tries to release a's locks with a's owner.
    b.call(Fop::Open { loc: Loc::gfid(fa.gfid), flags: libc::O_RDWR as u32, fd: FdId(1) }).expect("b opens");
    let fb = Fd { id: FdId(1), gfid: fa.gfid };
    let b_as_a = CallCtx { lk_owner: 7, ..CallCtx::root("a") };
    let _ = b.call_as(&b_as_a, Fop::Lk { fd: fb, cmd: LkCmd::SetLk, lock: Flock { ty: LockType::Unlock, ..lock } });
    let _ = b.call_as(&b_as_a, ilk(LkCmd::SetLk, LockType::Unlock));
    // a's locks still hold against a third client.
    let mut c = connect(&brick, "c");
    c.call(Fop::Open { loc: Loc::gfid(fa.gfid), flags: libc::O_RDWR as u32, fd: FdId(1) }).expect("c opens");
    let fc = Fd { id: FdId(1), gfid: fa.gfid };
    let c_ctx = CallCtx { lk_owner: 9, ..CallCtx::root("c") };
    let try_lock = Fop::Lk { fd: fc, cmd: LkCmd::SetLk, lock: Flock { owner: 9, ..lock } };
    assert_eq!(c.call_as(&c_ctx, try_lock.clone()).err(), Some(Errno::EAGAIN), "a's POSIX lock survived b's unlock");
    let c_ilk = Fop::Inodelk {
        domain: "dom".into(),
        loc: Loc::gfid(fa.gfid),
        cmd: LkCmd::SetLk,
        lock: Flock { ty: LockType::Write, start: 0, len: 0, pid: 1, owner: 9 },
    };
    assert_eq!(c.call_as(&c_ctx, c_ilk.clone()).err(), Some(Errno::EAGAIN), "a's inodelk survived b's unlock");
    // b's own unlock of a lock it does not hold did not take c's place
    // either; once a goes, c gets both.
    drop(a);
    let deadline = Instant::now() + RAW_GUARD;
    while c.call_as(&c_ctx, try_lock.clone()).is_err() {
        assert!(Instant::now() < deadline, "a's POSIX lock is freed when a disconnects");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.call_as(&c_ctx, c_ilk).expect("a's inodelk is freed when a disconnects");

    // An fd used after its release.
    c.call(Fop::Release { fd: fc }).expect("release");
    assert_eq!(read(&mut c, fc, 0, 10).err(), Some(Errno::EBADF), "read after release");
    still_serves(&mut b, "fd games");
}

#[test]
fn bad_names_create_nothing_anywhere() {
    let brick = Brick::start();
    let outside = brick.dir().parent().expect("brick has a parent").to_path_buf();
    let outside_before = std::fs::read_dir(&outside).expect("parent").count();
    let mut good = connect(&brick, "good");
    let mut evil = connect(&brick, "evil");
    let d = mkdir(&mut evil, Gfid::ROOT, "d");
    let f = create(&mut evil, d, "f", 1);
    let before = tree(brick.dir());
    let long = "x".repeat(256);
    let names = ["a/b", "/", "../escape", "..", ".", "", "nul\0here", long.as_str(), "d/../../escape"];
    let entry_errs = [Errno::EINVAL, Errno::ENAMETOOLONG, Errno::EPERM, Errno::EEXIST, Errno::EISDIR, Errno::ENOTEMPTY];
    for name in names {
        let what = |op: &str| format!("{op} {name:?}");
        for parent in [Gfid::ROOT, d] {
            let loc = Loc::entry(parent, name);
            fails_with(
                evil.call(Fop::Create {
                    loc: loc.clone(),
                    flags: libc::O_RDWR as u32,
                    mode: 0o644,
                    umask: 0,
                    fd: FdId(9),
                }),
                &entry_errs,
                &what("create"),
            );
            fails_with(evil.call(Fop::Mkdir { loc: loc.clone(), mode: 0o755, umask: 0 }), &entry_errs, &what("mkdir"));
            fails_with(
                evil.call(Fop::Mknod { loc: loc.clone(), mode: libc::S_IFIFO | 0o644, rdev: 0, umask: 0 }),
                &entry_errs,
                &what("mknod"),
            );
            fails_with(
                evil.call(Fop::Symlink { target: "/etc/passwd".into(), loc: loc.clone(), umask: 0 }),
                &entry_errs,
                &what("symlink"),
            );
            fails_with(evil.call(Fop::Link { old: Loc::gfid(f.gfid), new: loc.clone() }), &entry_errs, &what("link"));
            fails_with(
                evil.call(Fop::Rename { old: Loc::entry(d, "f"), new: loc.clone(), flags: 0 }),
                &entry_errs,
                &what("rename to"),
            );
            let lookup = evil.call(Fop::Lookup { loc: loc.clone() });
            let ok_lookup = matches!(name, "." | "..") && lookup.is_ok();
            if !ok_lookup {
                fails_with(lookup, &[Errno::EINVAL, Errno::ENAMETOOLONG, Errno::ENOENT, Errno::EPERM], &what("lookup"));
            }
            let _ = evil.call(Fop::Unlink { loc: loc.clone(), flags: 0 });
            let _ = evil.call(Fop::Rmdir { loc, flags: 0 });
        }
        still_serves(&mut good, &what("names"));
    }
    // The brick's own internals are not names a client can use.
    for op in [
        Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, ".glusterfs"), mode: 0o755, umask: 0 },
        Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, ".glusterfs"), flags: 0 },
        Fop::Rename { old: Loc::entry(Gfid::ROOT, ".glusterfs"), new: Loc::entry(d, "g"), flags: 0 },
        Fop::Rename { old: Loc::entry(d, "f"), new: Loc::entry(Gfid::ROOT, ".glusterfs"), flags: 0 },
        Fop::Symlink { target: "x".into(), loc: Loc::entry(Gfid::ROOT, ".glusterfs"), umask: 0 },
    ] {
        let what = format!("{op:?}");
        fails_with(evil.call(op), &[Errno::EPERM, Errno::ENOENT, Errno::EEXIST], &what);
    }
    // The root is neither removed nor renamed.
    for op in [
        Fop::Rmdir { loc: Loc::gfid(Gfid::ROOT), flags: 0 },
        Fop::Unlink { loc: Loc::gfid(Gfid::ROOT), flags: 0 },
        Fop::Rename { old: Loc::gfid(Gfid::ROOT), new: Loc::entry(d, "root"), flags: 0 },
    ] {
        let what = format!("{op:?}");
        assert!(evil.call(op).is_err(), "{what} failed");
    }
    assert_eq!(tree(brick.dir()), before, "nothing was created, removed or renamed in the brick");
    assert_eq!(std::fs::read_dir(&outside).expect("parent").count(), outside_before, "nothing appeared outside");
    assert!(brick.dir().join(".glusterfs/00/00").is_dir(), "the brick's internals are intact");
}

#[test]
fn gfids_that_do_not_exist_and_internal_xattrs() {
    let brick = Brick::start();
    let mut evil = connect(&brick, "evil");
    let f = create(&mut evil, Gfid::ROOT, "f", 1);
    let stale = [Errno::ESTALE, Errno::ENOENT, Errno::EINVAL];
    for g in [Gfid::random(), Gfid::NULL, Gfid([0xff; 16])] {
        let what = |op: &str| format!("{op} on {g}");
        fails_with(evil.call(Fop::Stat { loc: Loc::gfid(g) }), &stale, &what("stat"));
        fails_with(evil.call(Fop::Lookup { loc: Loc::entry(g, "x") }), &stale, &what("lookup under"));
        let create =
            Fop::Create { loc: Loc::entry(g, "x"), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: FdId(3) };
        fails_with(evil.call(create), &stale, &what("create under"));
        fails_with(evil.call(Fop::Open { loc: Loc::gfid(g), flags: 0, fd: FdId(4) }), &stale, &what("open"));
        let xop = Fop::Xattrop {
            loc: Loc::gfid(g),
            op: XattropOp::AddArray,
            xattrs: Dict::new().with("trusted.afr.x", Value::Bytes(Bytes::from_static(&[0, 0, 0, 1]))),
        };
        fails_with(evil.call(xop), &stale, &what("xattrop"));
    }
    // The gfid xattr (anywhere) and the volume id (on the root) are the
    // brick's, not the client's.
    let other = Value::Bytes(Bytes::copy_from_slice(&Gfid::random().0));
    for (gfid, key) in
        [(f.gfid, "trusted.gfid"), (Gfid::ROOT, "trusted.gfid"), (Gfid::ROOT, "trusted.glusterfs.volume-id")]
    {
        let set = Dict::new().with(key, other.clone());
        let r = evil.call(Fop::Setxattr { loc: Loc::gfid(gfid), xattrs: set.clone(), flags: 0 });
        fails_with(r, &[Errno::EPERM], &format!("setxattr {key} on {gfid}"));
        let r = evil.call(Fop::Removexattr { loc: Loc::gfid(gfid), name: key.into() });
        fails_with(r, &[Errno::EPERM], &format!("removexattr {key} on {gfid}"));
        let xop = Fop::Xattrop { loc: Loc::gfid(gfid), op: XattropOp::AddArray, xattrs: set };
        fails_with(evil.call(xop), &[Errno::EPERM, Errno::EINVAL], &format!("xattrop {key} on {gfid}"));
    }
    let set = Dict::new().with("trusted.gfid", other);
    fails_with(evil.call(Fop::Fsetxattr { fd: f, xattrs: set, flags: 0 }), &[Errno::EPERM], "fsetxattr trusted.gfid");
    assert_eq!(gfid_of(evil.call(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "f") })), f.gfid, "gfid unchanged");
    // Mode bits beyond the permission and type bits are dropped or refused.
    let bad_attr = SetAttr { mode: Some(u32::MAX), ..SetAttr::default() };
    if evil.call(Fop::Setattr { loc: Loc::gfid(f.gfid), attr: bad_attr }).is_ok() {
        let mode = std::fs::metadata(brick.dir().join("f")).expect("on disk").permissions();
        assert!(std::os::unix::fs::PermissionsExt::mode(&mode) & libc::S_IFMT == libc::S_IFREG, "still a file");
    }
}

#[test]
fn paths_longer_than_path_max_through_deep_directories() {
    let brick = Brick::start();
    let mut raw = connect(&brick, "deep");
    let name = "d".repeat(200);
    let mut parent = Gfid::ROOT;
    // 60 levels of 200-byte names: 12 KiB of path, three times PATH_MAX.
    for _ in 0..60 {
        parent = mkdir(&mut raw, parent, &name);
    }
    let fd = create(&mut raw, parent, "leaf", 1);
    write(&mut raw, fd, 0, b"deep data").expect("write deep");
    raw.call(Fop::Release { fd }).expect("release");
    let leaf = gfid_of(raw.call(Fop::Lookup { loc: Loc::entry(parent, "leaf") }));
    assert_eq!(leaf, fd.gfid);
    raw.call(Fop::Open { loc: Loc::gfid(leaf), flags: libc::O_RDONLY as u32, fd: FdId(2) }).expect("open deep");
    let data = read(&mut raw, Fd { id: FdId(2), gfid: leaf }, 0, 100).expect("read deep");
    assert_eq!(&data[..], b"deep data");
    raw.call(Fop::Stat { loc: Loc::gfid(parent) }).expect("stat the deepest directory by gfid");
    raw.call(Fop::Rename { old: Loc::entry(parent, "leaf"), new: Loc::entry(Gfid::ROOT, "up"), flags: 0 })
        .expect("rename from the bottom to the top");
    assert_eq!(std::fs::read(brick.dir().join("up")).expect("renamed file"), b"deep data");
}

#[test]
fn a_flood_of_requests_is_answered_in_bounded_memory() {
    const FLOOD: u64 = 100_000;
    let brick = Brick::start();
    let mut good = connect(&brick, "good");
    still_serves(&mut good, "start");
    let base = rss_kib(&brick);
    let flood = connect(&brick, "flood");
    let mut reader = flood.try_clone();
    let mut sender = flood;
    let answered = std::thread::spawn(move || {
        let mut n = 0u64;
        while n < FLOOD {
            match reader.recv() {
                Some((_, Message::Reply(r))) => {
                    r.expect("a stat in the flood");
                    n += 1;
                }
                Some(_) => {}
                None => panic!("the brick closed the flooding connection after {n} replies"),
            }
        }
        n
    });
    let ctx = CallCtx::root("flood");
    let mut peak = base;
    for i in 0..FLOOD {
        sender.send_call(&ctx, Fop::Stat { loc: Loc::root() });
        if i % 10_000 == 0 {
            still_serves(&mut good, "requests in the flood");
            peak = peak.max(rss_kib(&brick));
        }
    }
    assert_eq!(answered.join().expect("reader"), FLOOD);
    peak = peak.max(rss_kib(&brick));
    assert!(peak < base + 256 * 1024, "brick RSS went from {base} KiB to {peak} KiB during the flood");
    still_serves(&mut good, "the flood");
}

#[test]
fn a_slow_reader_of_large_reads_is_held_in_bounded_memory() {
    let brick = Brick::start();
    let mut good = connect(&brick, "good");
    let mut slow = connect(&brick, "slow");
    // A sparse 16 GiB file: every read returns its full size, in zeros.
    let fd = create(&mut slow, Gfid::ROOT, "sparse", 1);
    slow.call(Fop::Ftruncate { fd, offset: 16 << 30 }).expect("ftruncate");
    still_serves(&mut good, "setup");
    let base = rss_kib(&brick);
    slow.sock.set_write_timeout(Some(Duration::from_secs(3))).expect("write timeout");
    let ctx = CallCtx::root("slow");
    // Up to 512 reads of 8 MiB (4 GiB) without reading a reply; the brick
    // stops reading from us long before.
    let mut sent = 0u64;
    let mut buf = Vec::new();
    for i in 0..512u64 {
        buf.clear();
        let m = Message::Call {
            ctx: ctx.clone(),
            req: xlfs_sdk::Request::new(Fop::Readv { fd, size: 8 << 20, offset: i << 23, flags: 0 }),
        };
        buf.extend_from_slice(&m.to_frame(i + 1000).expect("frame").to_vec());
        if slow.sock.write_all(&buf).is_err() {
            break;
        }
        sent += 1;
    }
    // Whatever the brick takes on for us, it has taken within a few seconds.
    let mut held = 0;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(500));
        held = held.max(rss_kib(&brick));
    }
    eprintln!("slow reader: {sent} reads sent, brick RSS {base} KiB -> {held} KiB");
    still_serves(&mut good, "a slow reader");
    assert!(
        held < base + 192 * 1024,
        "brick RSS went from {base} KiB to {held} KiB holding {sent} unread 8 MiB replies"
    );
    drop(slow);
    still_serves(&mut good, "the slow reader left");
}

#[test]
fn fifos_and_device_nodes_are_never_opened_on_the_brick() {
    let brick = Brick::start();
    let mut evil = connect(&brick, "evil");
    let mut good = connect(&brick, "good");
    // /dev/null's numbers: harmless if the brick did open it.
    let null = libc::makedev(1, 3);
    for (name, mode, rdev) in [("fifo", libc::S_IFIFO | 0o666, 0), ("dev", libc::S_IFCHR | 0o666, null)] {
        let made = evil.call(Fop::Mknod { loc: Loc::entry(Gfid::ROOT, name), mode, rdev, umask: 0 });
        let g = match made {
            Ok(_) => gfid_of(evil.call(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, name) })),
            // A brick without CAP_MKNOD cannot make the device: nothing to open.
            Err(Errno::EPERM) if rdev != 0 => continue,
            Err(e) => panic!("mknod {name}: {e:?}"),
        };
        for (i, flags) in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR].into_iter().enumerate() {
            let open = Fop::Open { loc: Loc::gfid(g), flags: flags as u32, fd: FdId(20 + i as u64) };
            fails_with(evil.call(open), &[Errno::ENXIO], &format!("open {name} with flags {flags:#o}"));
        }
        let create = Fop::Create {
            loc: Loc::entry(Gfid::ROOT, name),
            flags: libc::O_RDONLY as u32,
            mode: 0o644,
            umask: 0,
            fd: FdId(30),
        };
        fails_with(evil.call(create), &[Errno::ENXIO, Errno::EEXIST], &format!("create over {name}"));
        still_serves(&mut good, &format!("opens of {name}"));
    }
}
