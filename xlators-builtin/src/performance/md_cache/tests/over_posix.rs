//! Tests of performance/md-cache over real storage/posix: prefetch by
//! readdirp, getxattr from the cache, whole-directory reads on a miss.

use super::*;

#[tokio::test]
async fn over_posix_readdirp_prefetches_and_getxattr_stays_in_the_cache() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().display().to_string();
    let (init, _) = xlfs_sdk::testing::init_named(
        "posix",
        crate::storage::posix::TYPE.options,
        &[("directory", dir.as_str())],
        &[],
    );
    let posix = (crate::storage::posix::TYPE.build)(init).expect("posix");
    // Passes every fop to storage/posix, counting them.
    let counting = xlfs_sdk::testing::Gate::passing(posix.clone());
    let o = Options::resolve(OPTIONS, [("xattr-cache-list", "user.tag")]).expect("options");
    let clock = Arc::new(ManualClock(AtomicU64::new(SEC)));
    let md = MdCache::new(Child { name: Arc::from("posix"), xl: counting.clone() }, config(&o), clock);
    let ctx = CallCtx::root("t");
    let call = |fop: Fop| md.call(ctx.clone(), Request::new(fop));

    let mut files = Vec::new();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let fop = Fop::Create {
            loc: Loc::entry(Gfid::ROOT, name),
            flags: libc::O_RDWR as u32,
            mode: 0o644,
            umask: 0,
            fd: FdId(i as u64 + 1),
        };
        let Reply::Entry { iatt, .. } = call(fop).await.expect("create").reply else { panic!("create reply") };
        files.push(iatt.gfid);
    }
    // Tag "b" directly on the brick (behind md-cache).
    let set = Fop::Setxattr {
        loc: Loc::gfid(files[1]),
        xattrs: Dict::new().with("user.tag", Value::Bytes(Bytes::from_static(b"B"))),
        flags: 0,
    };
    posix.call(ctx.clone(), Request::new(set)).await.expect("setxattr");
    // What the brick itself says about security.selinux (normally ENODATA).
    let mut selinux = Vec::new();
    for g in &files {
        let r = posix.call(ctx.clone(), Request::new(Fop::Getxattr { loc: Loc::gfid(*g), name: SELINUX.into() })).await;
        selinux.push(r.map(|r| match r.reply {
            Reply::Xattrs(d) => d.get_bytes(SELINUX),
            _ => None,
        }));
    }

    let fd = Fd { id: FdId(10), gfid: Gfid::ROOT };
    call(Fop::Opendir { loc: Loc::root(), fd: fd.id }).await.expect("opendir");
    let rsp = call(Fop::Readdirp { fd, size: 1 << 20, offset: 0 }).await.expect("readdirp");
    assert!(rsp.xdata.is_empty(), "added keys leak: {:?}", rsp.xdata);
    let Reply::Dirents(entries) = &rsp.reply else { panic!("readdirp reply") };
    assert!(entries.iter().any(|e| e.name == "b"));
    let before = counting.arrived().len();
    for (i, g) in files.iter().enumerate() {
        let r = call(Fop::Getxattr { loc: Loc::gfid(*g), name: "user.tag".into() }).await;
        let got = r.map(|r| match r.reply {
            Reply::Xattrs(d) => d.get_bytes("user.tag"),
            _ => None,
        });
        if i == 1 {
            assert_eq!(got, Ok(Some(Bytes::from_static(b"B"))));
        } else {
            assert_eq!(got, Err(Errno::ENODATA));
        }
        let r = call(Fop::Getxattr { loc: Loc::gfid(*g), name: SELINUX.into() }).await;
        let got = r.map(|r| match r.reply {
            Reply::Xattrs(d) => d.get_bytes(SELINUX),
            _ => None,
        });
        assert_eq!(got, selinux[i]);
        let r = call(Fop::Getxattr { loc: Loc::gfid(*g), name: ACL_ACCESS.into() }).await;
        assert_eq!(r.err(), Some(Errno::ENODATA));
        let Reply::Attr(a) = call(Fop::Stat { loc: Loc::gfid(*g) }).await.expect("stat").reply else { panic!() };
        assert_eq!(a.gfid, *g);
    }
    assert_eq!(counting.arrived().len(), before, "fops reached posix: {:?}", &counting.arrived()[before..]);
}

#[tokio::test]
async fn a_lookup_miss_reads_the_directory_whole_and_later_lookups_are_hits() {
    let t = setup(&[("cache-invalidation", "on")]);
    let d = t.fs.add(Gfid::ROOT, "d", true);
    for n in ["a", "b", "c", "e"] {
        t.fs.add(d, n, false);
    }
    t.lookup(d, "a").expect("a: a miss, which starts reading d");
    // Read twice: once for the names (lookups wait for it), once more for
    // the translators below that bring more with each entry.
    for _ in 0..1000 {
        if t.dump("dirs-prefetched") >= 1 && t.fs.count(FopKind::Releasedir) >= 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(t.dump("dirs-prefetched"), 1);
    assert_eq!(t.fs.count(FopKind::Opendir), 2);
    assert_eq!(t.fs.count(FopKind::Releasedir), 2, "the directory fd is given back");
    let before = t.fs.count(FopKind::Lookup);
    for n in ["b", "c", "e"] {
        t.lookup(d, n).expect(n);
    }
    assert_eq!(t.lookup(d, "zz"), Err(Errno::ENOENT), "listed whole: a name it lacks is absent");
    assert_eq!(t.fs.count(FopKind::Lookup), before, "answered from the listing");
    // Another client adds a name: the bricks invalidate d, and its names
    // are asked for again.
    t.md.notify(Event::Upcall(Upcall::Invalidate { gfid: d }), EventFrom::Child(0));
    t.fs.add(d, "new", false);
    t.lookup(d, "new").expect("seen after the invalidation");
    assert_eq!(t.fs.count(FopKind::Lookup), before + 1);
    // A listing the child says may miss names (a rebalance moving files
    // between the subvolumes distribute reads in turn) is not trusted.
    let t = setup(&[("cache-invalidation", "on")]);
    t.fs.0.lock().inexact = true;
    let d = t.fs.add(Gfid::ROOT, "d", true);
    t.fs.add(d, "a", false);
    t.lookup(d, "a").expect("a: a miss, which starts reading d");
    for _ in 0..1000 {
        if t.fs.count(FopKind::Releasedir) >= 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(t.dump("dirs-prefetched"), 0);
    assert!(t.fs.last(FopKind::Readdirp).expect("read").xdata.contains(keys::WHOLE_LISTING));
    let before = t.fs.count(FopKind::Lookup);
    assert_eq!(t.lookup(d, "zz"), Err(Errno::ENOENT));
    assert_eq!(t.fs.count(FopKind::Lookup), before + 1, "asked below");
    // Without cache invalidation nothing is read ahead.
    let t = setup(&[]);
    let d = t.fs.add(Gfid::ROOT, "d", true);
    t.fs.add(d, "a", false);
    t.lookup(d, "a").expect("a");
    tokio::task::yield_now().await;
    assert_eq!(t.fs.count(FopKind::Opendir), 0);
}
