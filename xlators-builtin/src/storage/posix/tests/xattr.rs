//! Tests of storage/posix's xattrs and xattrop.

use super::*;

#[tokio::test]
async fn xattrs_and_their_protection() {
    xattrs_and_their_protection_here().await;
}

/// The same through `/proc/self/fd` paths, as on a kernel older than the
/// `*xattrat` calls (6.13).
#[tokio::test]
async fn xattrs_and_their_protection_without_the_xattrat_calls() {
    super::super::sys::xattrat_off();
    xattrs_and_their_protection_here().await;
}

async fn xattrs_and_their_protection_here() {
    let e = env();
    let (f, fd) = e.create(Gfid::ROOT, "f").await;
    let loc = Loc::gfid(f);
    e.setx(loc.clone(), "user.a", b"1", 0).await.expect("set");
    e.setx(loc.clone(), "trusted.b", b"two", 0).await.expect("set trusted");
    assert_eq!(e.getx(loc.clone(), "user.a").await.expect("get").get_bytes("user.a").as_deref(), Some(&b"1"[..]));
    assert_eq!(e.getx(loc.clone(), "user.none").await.err(), Some(Errno::ENODATA));
    let all = e.getx(loc.clone(), "").await.expect("list");
    assert!(all.contains("user.a") && all.contains("trusted.b") && all.contains(GFID_XATTR), "{all:?}");
    assert_eq!(all.get_bytes(GFID_XATTR).as_deref(), Some(&f.0[..]));

    assert_eq!(e.setx(loc.clone(), "user.a", b"x", xattr_flags::CREATE).await, Err(Errno::EEXIST));
    assert_eq!(e.setx(loc.clone(), "user.new", b"x", xattr_flags::REPLACE).await, Err(Errno::ENODATA));
    e.setx(loc.clone(), "user.a", b"3", xattr_flags::REPLACE).await.expect("replace");
    e.setx(loc.clone(), "user.new", b"4", xattr_flags::CREATE).await.expect("create");
    assert_eq!(xattr(&e.brick.join("f"), "user.a"), Some(b"3".to_vec()));

    assert_eq!(e.setx(loc.clone(), GFID_XATTR, &Gfid::random().0, 0).await, Err(Errno::EPERM));
    assert_eq!(e.setx(loc.clone(), GFID_XATTR, &f.0, 0).await, Err(Errno::EPERM));
    assert_eq!(e.run(Fop::Removexattr { loc: loc.clone(), name: GFID_XATTR.into() }).await.err(), Some(Errno::EPERM));
    assert_eq!(e.run(Fop::Fremovexattr { fd, name: GFID_XATTR.into() }).await.err(), Some(Errno::EPERM));
    let fset = e.run(Fop::Fsetxattr { fd, xattrs: bytes_xdata(GFID_XATTR, &[0; 16]), flags: 0 }).await;
    assert_eq!(fset.err(), Some(Errno::EPERM));
    assert_eq!(xattr(&e.brick.join("f"), GFID_XATTR), Some(f.0.to_vec()));
    let vid = e.run(Fop::Removexattr { loc: Loc::root(), name: VOLUME_ID_XATTR.into() }).await;
    assert_eq!(vid.err(), Some(Errno::EPERM));

    e.run(Fop::Removexattr { loc: loc.clone(), name: "user.a".into() }).await.expect("remove");
    assert_eq!(e.getx(loc.clone(), "user.a").await.err(), Some(Errno::ENODATA));
    e.run(Fop::Fsetxattr { fd, xattrs: bytes_xdata("user.f", b"fd"), flags: 0 }).await.expect("fset");
    match e.reply(Fop::Fgetxattr { fd, name: "user.f".into() }).await.expect("fget") {
        Reply::Xattrs(d) => assert_eq!(d.get_bytes("user.f").as_deref(), Some(&b"fd"[..])),
        r => panic!("{r:?}"),
    }
    e.run(Fop::Fremovexattr { fd, name: "user.f".into() }).await.expect("fremove");
    assert_eq!(xattr(&e.brick.join("f"), "user.f"), None);

    // Lookup returns requested xattrs and the open fd count.
    let req = Dict::new()
        .with("trusted.b", Value::U64(0))
        .with("trusted.missing", Value::U64(0))
        .with(OPEN_FD_COUNT, Value::U64(0));
    let rsp = e.runx(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "f") }, req).await.expect("lookup");
    assert_eq!(rsp.xdata.get_bytes("trusted.b").as_deref(), Some(&b"two"[..]));
    assert!(!rsp.xdata.contains("trusted.missing"));
    assert_eq!(rsp.xdata.get_u64(OPEN_FD_COUNT), Some(1));

    // Directory xattrs.
    let d = e.mkdir(Gfid::ROOT, "d").await;
    e.setx(Loc::gfid(d), "trusted.glusterfs.dht", b"layout", 0).await.expect("dir xattr");
    assert_eq!(xattr(&e.brick.join("d"), "trusted.glusterfs.dht"), Some(b"layout".to_vec()));
    e.release(fd).await;

    // A file with no descriptor open here: its xattrs by its name.
    let (g, gfd) = e.create(Gfid::ROOT, "g").await;
    e.release(gfd).await;
    let by_name = Loc::entry(Gfid::ROOT, "g");
    e.setx(by_name.clone(), "user.k", b"v", 0).await.expect("set by name");
    assert_eq!(e.setx(by_name.clone(), "user.k", b"w", xattr_flags::CREATE).await, Err(Errno::EEXIST));
    assert_eq!(xattr(&e.brick.join("g"), "user.k"), Some(b"v".to_vec()));
    let all = e.getx(by_name.clone(), "").await.expect("list by name");
    assert_eq!(all.get_bytes("user.k").as_deref(), Some(&b"v"[..]));
    assert_eq!(all.get_bytes(GFID_XATTR).as_deref(), Some(&g.0[..]));
    let big = vec![7u8; 4000];
    e.setx(by_name.clone(), "user.big", &big, 0).await.expect("a value longer than the first buffer");
    assert_eq!(
        e.getx(by_name.clone(), "user.big").await.expect("get").get_bytes("user.big").as_deref(),
        Some(&big[..])
    );
    e.run(Fop::Removexattr { loc: by_name.clone(), name: "user.k".into() }).await.expect("remove by name");
    assert_eq!(e.getx(by_name.clone(), "user.k").await.err(), Some(Errno::ENODATA));
    assert_eq!(xattr(&e.brick.join("g"), "user.k"), None);
    let rsp = e.runx(Fop::Lookup { loc: by_name }, Dict::new()).await.expect("lookup by name");
    match rsp.reply {
        Reply::Entry { iatt, .. } => assert_eq!(iatt.gfid, g),
        r => panic!("{r:?}"),
    }
}

#[tokio::test]
async fn xattrop_adds_and_replies_with_the_result() {
    let e = env();
    let (f, fd) = e.create(Gfid::ROOT, "f").await;
    let key = "trusted.afr.vol-client-0";
    // Missing counts as zeros; an all-zero delta only reads.
    assert_eq!(e.xattrop(f, XattropOp::AddArray, key, &be32(&[0, 0, 0])).await.expect("read"), be32(&[0, 0, 0]));
    assert_eq!(xattr(&e.brick.join("f"), key), None, "a zero delta must not create the xattr");
    assert_eq!(e.xattrop(f, XattropOp::AddArray, key, &be32(&[1, 0, 2])).await.expect("add"), be32(&[1, 0, 2]));
    assert_eq!(e.xattrop(f, XattropOp::AddArray, key, &be32(&[1, 5, -3])).await.expect("add"), be32(&[2, 5, -1]));
    assert_eq!(xattr(&e.brick.join("f"), key), Some(be32(&[2, 5, -1])));
    assert_eq!(e.xattrop(f, XattropOp::AddArray, key, &be32(&[0, 0, 0])).await.expect("read"), be32(&[2, 5, -1]));
    // Replicate's counters back at zero stay while the file is open (the
    // test's fd), so the next transaction finds them in place.
    assert_eq!(e.xattrop(f, XattropOp::AddArray, key, &be32(&[-2, -5, 1])).await.expect("zero"), be32(&[0, 0, 0]));
    assert_eq!(xattr(&e.brick.join("f"), key), Some(be32(&[0, 0, 0])), "kept while open");
    assert_eq!(e.xattrop(f, XattropOp::AddArray, key, &be32(&[2, 5, -1])).await.expect("again"), be32(&[2, 5, -1]));
    // Wrapping, like the C code's 32-bit arithmetic.
    let w = "trusted.wrap";
    e.xattrop(f, XattropOp::AddArray, w, &be32(&[i32::MAX])).await.expect("max");
    assert_eq!(e.xattrop(f, XattropOp::AddArray, w, &be32(&[1])).await.expect("wrap"), be32(&[i32::MIN]));
    // Other counters are kept at zero.
    assert_eq!(e.xattrop(f, XattropOp::AddArray, w, &be32(&[i32::MIN])).await.expect("zero"), be32(&[0]));
    assert_eq!(xattr(&e.brick.join("f"), w), Some(be32(&[0])));
    e.xattrop(f, XattropOp::AddArray, w, &be32(&[i32::MIN])).await.expect("min");

    let k64 = "trusted.glusterfs.quota.size";
    assert_eq!(
        e.xattrop(f, XattropOp::AddArray64, k64, &be64(&[1 << 40, -7])).await.expect("add64"),
        be64(&[1 << 40, -7])
    );
    match e
        .reply(Fop::Fxattrop { fd, op: XattropOp::AddArray64, xattrs: bytes_xdata(k64, &be64(&[-(1 << 40), 10])) })
        .await
        .expect("fxattrop")
    {
        Reply::Xattrs(d) => assert_eq!(d.get_bytes(k64).map(|b| b.to_vec()), Some(be64(&[0, 3]))),
        r => panic!("{r:?}"),
    }
    assert_eq!(e.xattrop(f, XattropOp::AddArray, key, &[1, 2, 3]).await.err(), Some(Errno::EINVAL));
    assert_eq!(e.xattrop(f, XattropOp::AddArray64, key, &be32(&[1])).await.err(), Some(Errno::EINVAL));
    assert_eq!(e.xattrop(f, XattropOp::AddArray, GFID_XATTR, &be32(&[1, 1, 1, 1])).await.err(), Some(Errno::EPERM));
    // A shorter stored value is zero-padded; a longer one does not fit.
    assert_eq!(
        e.xattrop(f, XattropOp::AddArray, key, &be32(&[1, 1, 1, 1])).await.expect("longer"),
        be32(&[3, 6, 0, 1])
    );
    assert_eq!(e.xattrop(f, XattropOp::AddArray, key, &be32(&[1])).await.err(), Some(Errno::ERANGE));
    // xdata asks for other xattrs and the open fd count.
    let x = Dict::new().with("trusted.wrap", Value::U64(0)).with(OPEN_FD_COUNT, Value::U64(0));
    let rsp = e
        .runx(
            Fop::Xattrop { loc: Loc::gfid(f), op: XattropOp::AddArray, xattrs: bytes_xdata(key, &be32(&[0, 0, 0, 0])) },
            x,
        )
        .await
        .expect("xattrop");
    assert_eq!(rsp.xdata.get_bytes("trusted.wrap").map(|b| b.to_vec()), Some(be32(&[i32::MIN])));
    assert_eq!(rsp.xdata.get_u64(OPEN_FD_COUNT), Some(1));
    e.release(fd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn xattrop_is_atomic_per_inode() {
    let e = Arc::new(env());
    let (f, fd) = e.create(Gfid::ROOT, "f").await;
    let key = "trusted.afr.dirty";
    let mut tasks = Vec::new();
    for i in 0..64 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            let delta = if i % 2 == 0 { be32(&[1, 2]) } else { be32(&[1, -1]) };
            if i % 3 == 0 {
                e.reply(Fop::Fxattrop { fd, op: XattropOp::AddArray, xattrs: bytes_xdata(key, &delta) }).await.map(drop)
            } else {
                e.xattrop(f, XattropOp::AddArray, key, &delta).await.map(drop)
            }
        }));
    }
    for t in tasks {
        t.await.expect("join").expect("xattrop");
    }
    assert_eq!(xattr(&e.brick.join("f"), key), Some(be32(&[64, 32])));
    e.release(fd).await;
}
