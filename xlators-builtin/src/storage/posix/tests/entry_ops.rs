//! Tests of storage/posix's entry fops: handles on disk, rename, links,
//! readdir(p), gfid-req, name checks and escape attempts, lookup content.

use super::*;

#[tokio::test]
async fn files_dirs_and_handles_on_disk() {
    let e = env();
    let d = e.mkdir(Gfid::ROOT, "dir").await;
    let sub = e.mkdir(d, "sub").await;
    let (f, fd) = e.create(sub, "file").await;
    e.write(fd, 0, b"hello").await;

    let real = e.brick.join("dir/sub/file");
    assert_eq!(std::fs::read(&real).expect("real name"), b"hello");
    assert_eq!(xattr(&real, GFID_XATTR), Some(f.0.to_vec()));
    assert_eq!(xattr(&e.brick.join("dir"), GFID_XATTR), Some(d.0.to_vec()));
    // Hard link handle for the file: same inode.
    let h = e.handle_path(f);
    assert_eq!(std::fs::metadata(&h).expect("handle").ino(), std::fs::metadata(&real).expect("file").ino());
    assert_eq!(
        h.parent().and_then(|p| p.file_name()).and_then(|s| s.to_str()),
        Some(format!("{:02x}", f.0[1]).as_str())
    );
    // Symlink handles for directories.
    assert_eq!(
        std::fs::read_link(e.handle_path(d)).expect("dir handle"),
        PathBuf::from(format!("../../00/00/{}/dir", Gfid::ROOT))
    );
    let (a, b) = (format!("{:02x}", d.0[0]), format!("{:02x}", d.0[1]));
    assert_eq!(
        std::fs::read_link(e.handle_path(sub)).expect("sub handle"),
        PathBuf::from(format!("../../{a}/{b}/{d}/sub"))
    );
    // Following the handle symlink reaches the real directory.
    assert_eq!(
        std::fs::canonicalize(e.handle_path(sub)).expect("follow"),
        std::fs::canonicalize(e.brick.join("dir/sub")).expect("real")
    );

    // Iatts: gfid, ino from gfid, nlink without the handle.
    let ia = e.lookup(sub, "file").await.expect("lookup");
    assert_eq!((ia.gfid, ia.ino, ia.nlink, ia.size), (f, f.ino(), 1, 5));
    assert_eq!(ia.mode & 0o7777, 0o644);
    assert_eq!(e.stat(sub).await.expect("stat").gfid, sub);
    assert_eq!(e.stat(d).await.expect("stat dir").mode & 0o7777, 0o755);
    e.release(fd).await;
}

#[tokio::test]
async fn rename_across_directories_rewrites_handles() {
    let e = env();
    let a = e.mkdir(Gfid::ROOT, "a").await;
    let b = e.mkdir(Gfid::ROOT, "b").await;
    let moved = e.mkdir(a, "moved").await;
    let inner = e.mkdir(moved, "inner").await;
    let (f, fd) = e.create(inner, "deep").await;
    e.write(fd, 0, b"deep data").await;
    e.release(fd).await;

    let r = e.reply(Fop::Rename { old: Loc::entry(a, "moved"), new: Loc::entry(b, "renamed"), flags: 0 }).await;
    assert!(matches!(r, Ok(Reply::Rename { iatt }) if iatt.gfid == moved), "{r:?}");
    let (x, y) = (format!("{:02x}", b.0[0]), format!("{:02x}", b.0[1]));
    assert_eq!(
        std::fs::read_link(e.handle_path(moved)).expect("handle"),
        PathBuf::from(format!("../../{x}/{y}/{b}/renamed"))
    );
    assert!(e.brick.join("b/renamed/inner/deep").exists());
    assert_eq!(e.lookup(a, "moved").await, Err(Errno::ENOENT));
    assert_eq!(e.lookup(b, "renamed").await.expect("new name").gfid, moved);
    // gfid resolution of the moved directory and of what is under it.
    assert!(e.stat(moved).await.expect("moved by gfid").is_dir());
    assert_eq!(e.stat(inner).await.expect("inner by gfid").gfid, inner);
    assert_eq!(e.lookup(inner, "deep").await.expect("deep").gfid, f);
    let fd = e.open(f, libc::O_RDONLY).await.expect("open by gfid");
    assert_eq!(e.read(fd, 0, 100).await.expect("read"), b"deep data");
    e.release(fd).await;

    // Files move too; the handle (a hard link) needs no change.
    e.reply(Fop::Rename { old: Loc::entry(inner, "deep"), new: Loc::entry(Gfid::ROOT, "top"), flags: 0 })
        .await
        .expect("rename file");
    assert_eq!(e.lookup(Gfid::ROOT, "top").await.expect("top").gfid, f);
    assert_eq!(e.stat(f).await.expect("by gfid").nlink, 1);

    // NOREPLACE and EXCHANGE.
    let (g2, fd2) = e.create(Gfid::ROOT, "other").await;
    e.release(fd2).await;
    let nr = e
        .reply(Fop::Rename {
            old: Loc::entry(Gfid::ROOT, "top"),
            new: Loc::entry(Gfid::ROOT, "other"),
            flags: rename_flags::NOREPLACE,
        })
        .await;
    assert_eq!(nr.err(), Some(Errno::EEXIST));
    e.reply(Fop::Rename {
        old: Loc::entry(Gfid::ROOT, "a"),
        new: Loc::entry(Gfid::ROOT, "other"),
        flags: rename_flags::EXCHANGE,
    })
    .await
    .expect("exchange dir and file");
    assert_eq!(e.lookup(Gfid::ROOT, "other").await.expect("other").gfid, a);
    assert_eq!(e.lookup(Gfid::ROOT, "a").await.expect("a").gfid, g2);
    assert_eq!(
        std::fs::read_link(e.handle_path(a)).expect("handle"),
        PathBuf::from(format!("../../00/00/{}/other", Gfid::ROOT))
    );
    assert!(e.stat(a).await.expect("a by gfid").is_dir());
    let both = rename_flags::NOREPLACE | rename_flags::EXCHANGE;
    let bad =
        e.reply(Fop::Rename { old: Loc::entry(Gfid::ROOT, "a"), new: Loc::entry(Gfid::ROOT, "x"), flags: both }).await;
    assert_eq!(bad.err(), Some(Errno::EINVAL));

    // A directory renamed over an empty directory: the victim's handle goes.
    let victim = e.mkdir(Gfid::ROOT, "victim").await;
    e.reply(Fop::Rename { old: Loc::entry(Gfid::ROOT, "other"), new: Loc::entry(Gfid::ROOT, "victim"), flags: 0 })
        .await
        .expect("replace dir");
    assert!(std::fs::symlink_metadata(e.handle_path(victim)).is_err());
    assert_eq!(e.stat(victim).await.err(), Some(Errno::ENOENT));
    assert!(e.stat(a).await.expect("a").is_dir());
}

#[tokio::test]
async fn rename_over_a_file_drops_or_keeps_its_handle() {
    let e = env();
    e.xl.inner.brick.purge_pause(true);
    let (src, s) = e.create(Gfid::ROOT, "src").await;
    let (closed, c) = e.create(Gfid::ROOT, "closed").await;
    let (open, o) = e.create(Gfid::ROOT, "open").await;
    e.write(o, 0, b"still here").await;
    e.release(s).await;
    e.release(c).await;
    e.reply(Fop::Rename { old: Loc::entry(Gfid::ROOT, "src"), new: Loc::entry(Gfid::ROOT, "closed"), flags: 0 })
        .await
        .expect("rename");
    assert!(std::fs::symlink_metadata(e.handle_path(closed)).is_err(), "replaced file's handle stays");
    // unlink-behind (on by default): the replaced file waits for the purge
    // thread, kept by a descriptor, its handle removed rather than parked.
    assert_eq!((e.parked(), e.xl.inner.brick.purge_held()), (0, 1));
    assert_eq!(e.lookup(Gfid::ROOT, "closed").await.expect("new").gfid, src);
    e.reply(Fop::Rename { old: Loc::entry(Gfid::ROOT, "closed"), new: Loc::entry(Gfid::ROOT, "open"), flags: 0 })
        .await
        .expect("rename over open");
    let parked = e.brick.join(".glusterfs/unlink").join(open.to_string());
    assert!(parked.exists(), "an open file's handle waits in .glusterfs/unlink");
    assert_eq!(e.stat(open).await.expect("by gfid").nlink, 0);
    assert_eq!(e.read(o, 0, 100).await.expect("read"), b"still here");
    e.release(o).await;
    assert!(std::fs::symlink_metadata(&parked).is_err());
    assert!(std::fs::symlink_metadata(e.handle_path(open)).is_err());
    e.xl.inner.brick.purge_pause(false);
}

#[tokio::test]
async fn hard_links_and_symlinks() {
    let e = env();
    let d = e.mkdir(Gfid::ROOT, "d").await;
    let (f, fd) = e.create(Gfid::ROOT, "f").await;
    e.write(fd, 0, b"linked").await;
    e.release(fd).await;
    let ia = e.entry_of(Fop::Link { old: Loc::gfid(f), new: Loc::entry(d, "alias") }, Dict::new()).await.expect("link");
    assert_eq!((ia.gfid, ia.nlink), (f, 2));
    assert_eq!(std::fs::read(e.brick.join("d/alias")).expect("alias"), b"linked");
    assert_eq!(
        e.run(Fop::Link { old: Loc::gfid(d), new: Loc::entry(Gfid::ROOT, "dl") }).await.err(),
        Some(Errno::EPERM)
    );
    // Unlinking one name keeps the other (and the handle).
    e.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "f"), flags: 0 }).await.expect("unlink");
    assert_eq!(e.stat(f).await.expect("still there").nlink, 1);
    assert!(e.handle_path(f).exists());

    let s = e
        .entry_of(Fop::Symlink { target: "d/alias".into(), loc: Loc::entry(Gfid::ROOT, "sl"), umask: 0 }, Dict::new())
        .await
        .expect("symlink");
    assert_eq!(s.file_type(), FileType::Symlink);
    assert_eq!(xattr(&e.brick.join("sl"), GFID_XATTR), Some(s.gfid.0.to_vec()));
    assert_eq!(std::fs::read_link(e.brick.join("sl")).expect("on disk"), PathBuf::from("d/alias"));
    // The symlink's handle is a hard link to the symlink itself.
    assert_eq!(
        std::fs::symlink_metadata(e.handle_path(s.gfid)).expect("h").ino(),
        std::fs::symlink_metadata(e.brick.join("sl")).expect("l").ino()
    );
    match e.reply(Fop::Readlink { loc: Loc::gfid(s.gfid), size: 4096 }).await.expect("readlink") {
        Reply::Readlink { target, iatt } => assert_eq!((target.as_str(), iatt.gfid), ("d/alias", s.gfid)),
        r => panic!("{r:?}"),
    }
    assert_eq!(e.reply(Fop::Readlink { loc: Loc::gfid(f), size: 4096 }).await.err(), Some(Errno::EINVAL));
    assert_eq!(e.open(s.gfid, libc::O_RDONLY).await.err(), Some(Errno::ELOOP));
    // A symlink resolves by gfid and by name as itself.
    assert_eq!(e.stat(s.gfid).await.expect("stat").file_type(), FileType::Symlink);
    assert_eq!(e.lookup(Gfid::ROOT, "sl").await.expect("lookup").gfid, s.gfid);
    // Hard link to a symlink.
    let l2 = e
        .entry_of(Fop::Link { old: Loc::gfid(s.gfid), new: Loc::entry(d, "sl2") }, Dict::new())
        .await
        .expect("link symlink");
    assert_eq!((l2.gfid, l2.nlink), (s.gfid, 2));
    // Its last name gone, a symlink's handle is removed at once: only
    // regular files are left to the purge thread (unlink-behind, on).
    e.xl.inner.brick.purge_pause(true);
    e.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "sl"), flags: 0 }).await.expect("unlink one name");
    assert!(std::fs::symlink_metadata(e.handle_path(s.gfid)).is_ok(), "a name is left");
    e.run(Fop::Unlink { loc: Loc::entry(d, "sl2"), flags: 0 }).await.expect("unlink the last name");
    assert!(std::fs::symlink_metadata(e.handle_path(s.gfid)).is_err(), "handle removed");
    assert_eq!((e.parked(), e.xl.inner.brick.purge_pending()), (0, 0), "nothing left to the purge thread");
    assert_eq!(e.stat(s.gfid).await.err(), Some(Errno::ENOENT));
    e.xl.inner.brick.purge_pause(false);
}

#[tokio::test]
async fn readdirp_returns_the_requested_xattrs_of_each_entry() {
    let e = env();
    let d = e.mkdir(Gfid::ROOT, "d").await;
    e.create(d, "plain").await;
    e.create(d, "tagged").await;
    e.mkdir(d, "sub").await;
    set_xattr(&e.brick.join("d/tagged"), "user.tag", b"t1").expect("set xattr");
    set_xattr(&e.brick.join("d/sub"), "user.tag", b"s1").expect("set xattr");
    set_xattr(&e.brick.join("d/sub"), "user.other", b"o").expect("set xattr");
    let ask = Dict::new().with("user.tag", Value::U64(0)).with("user.absent", Value::U64(0));
    let fd = e.opendir(d).await;
    let rsp = e.runx(Fop::Readdirp { fd, size: 1 << 20, offset: 0 }, ask.clone()).await.expect("readdirp");
    let Reply::Dirents(entries) = &rsp.reply else { panic!("{:?}", rsp.reply) };
    assert_eq!(names(entries), [".", "..", "plain", "sub", "tagged"]);
    // The gfids come with the entries, with or without xattrs of their own.
    for en in entries.iter().filter(|en| !en.name.starts_with('.')) {
        assert!(!en.iatt.gfid.is_null() && en.iatt.ino != 0, "{en:?}");
    }
    let x = &rsp.xdata;
    assert_eq!(x.get_bytes(&keys::dirent_xattr("tagged", "user.tag")).as_deref(), Some(&b"t1"[..]));
    assert_eq!(x.get_bytes(&keys::dirent_xattr("sub", "user.tag")).as_deref(), Some(&b"s1"[..]));
    // Only what was asked, only what exists, nothing for the dot entries.
    assert!(!x.contains(&keys::dirent_xattr("plain", "user.tag")));
    assert!(!x.contains(&keys::dirent_xattr("sub", "user.other")));
    assert!(x.keys().all(|k| !k.ends_with("/user.absent") && !k.starts_with("./") && !k.starts_with("../")), "{x:?}");
    assert_eq!(x.get_u64(keys::DIRENT_XATTRS), Some(2));
    assert_eq!(x.len(), 3, "{x:?}");
    // Without xattr keys: no per-entry keys and no marker; readdir ignores them.
    let plain = e.runx(Fop::Readdirp { fd, size: 1 << 20, offset: 0 }, Dict::new()).await.expect("readdirp");
    assert!(plain.xdata.is_empty(), "{:?}", plain.xdata);
    let rd = e.runx(Fop::Readdir { fd, size: 1 << 20, offset: 0 }, ask).await.expect("readdir");
    assert!(rd.xdata.is_empty(), "{:?}", rd.xdata);
    // Small batches: each carries the keys of its own entries only.
    let mut seen = Vec::new();
    let mut off = 0;
    let ask = Dict::new().with("user.tag", Value::U64(0));
    loop {
        let r = e.runx(Fop::Readdirp { fd, size: 1, offset: off }, ask.clone()).await.expect("readdirp");
        let Reply::Dirents(batch) = r.reply else { panic!() };
        let Some(last) = batch.last() else { break };
        off = last.d_off;
        for k in r.xdata.keys().filter(|k| k.contains('/')) {
            let (name, _) = keys::parse_dirent_xattr(k).expect("key form");
            assert!(batch.iter().any(|b| b.name == name), "{k} not in its batch");
            seen.push(name.to_string());
        }
    }
    seen.sort();
    assert_eq!(seen, ["sub", "tagged"]);
    e.run(Fop::Releasedir { fd }).await.expect("releasedir");
}

#[tokio::test]
async fn readdir_resumes_from_every_offset() {
    let e = env();
    let d = e.mkdir(Gfid::ROOT, "d").await;
    let mut expected = vec![".".to_string(), "..".to_string()];
    let mut gfids = HashMap::new();
    for i in 0..60 {
        let name = format!("entry-{i:03}-{}", "x".repeat(i % 17));
        let g = if i % 5 == 0 {
            e.mkdir(d, &name).await
        } else {
            let (g, fd) = e.create(d, &name).await;
            e.release(fd).await;
            g
        };
        gfids.insert(name.clone(), g);
        expected.push(name);
    }
    expected.sort();
    let full = e.list(d, 1 << 20, false).await;
    assert_eq!(names(&full), expected);
    // Small sizes: more calls, same listing; a tiny size still makes progress.
    assert_eq!(names(&e.list(d, 1000, false).await), expected);
    assert_eq!(names(&e.list(d, 1, true).await), expected);
    let one = e.opendir(d).await;
    assert_eq!(e.readdir(one, 1, 0, false).await.len(), 1);
    assert_eq!(e.readdir(one, (ENTRY_OVERHEAD * 3 + 3 * 30) as u32, 0, false).await.len(), 3);

    // Resume from each returned d_off: the rest of the listing follows.
    for (i, ent) in full.iter().enumerate() {
        let rest = e.readdir(one, 1 << 20, ent.d_off, false).await;
        let want: Vec<&str> = full[i + 1..].iter().map(|x| x.name.as_str()).collect();
        let got: Vec<&str> = rest.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(got, want, "resuming after {}", ent.name);
    }
    e.run(Fop::Releasedir { fd: one }).await.expect("releasedir");

    // readdirp: iatts carry the gfids; readdir types are right.
    for ent in e.list(d, 4096, true).await {
        match ent.name.as_str() {
            "." => assert_eq!(ent.iatt.gfid, d),
            ".." => assert_eq!(ent.iatt.gfid, Gfid::ROOT),
            n => {
                assert_eq!(ent.iatt.gfid, gfids[n], "{n}");
                assert_eq!(ent.iatt.ino, gfids[n].ino());
                assert_eq!(ent.d_type, ent.iatt.file_type());
            }
        }
    }
    for ent in &full {
        assert_eq!(ent.iatt, Iatt::default());
        let want = if ent.name.starts_with('.') || ent.name[6..9].parse::<usize>().expect("n") % 5 == 0 {
            FileType::Directory
        } else {
            FileType::Regular
        };
        assert_eq!(ent.d_type, want, "{}", ent.name);
    }
    // Not a directory fd.
    let (_, f) = e.create(Gfid::ROOT, "file").await;
    assert_eq!(e.reply(Fop::Readdir { fd: f, size: 4096, offset: 0 }).await.err(), Some(Errno::ENOTDIR));
    e.release(f).await;
}

#[tokio::test]
async fn glusterfs_dir_is_hidden() {
    let e = env();
    e.create(Gfid::ROOT, "visible").await;
    let root = e.list(Gfid::ROOT, 1 << 20, true).await;
    assert_eq!(names(&root), vec![".", "..", "visible"]);
    let dotdot = root.iter().find(|x| x.name == "..").expect("..");
    assert_eq!(dotdot.iatt.gfid, Gfid::ROOT, "the root's .. is the root");
    assert_eq!(e.lookup(Gfid::ROOT, ".glusterfs").await.err(), Some(Errno::ENOENT));
    let mk = e.run(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, ".glusterfs"), mode: 0o755, umask: 0 }).await;
    assert_eq!(mk.err(), Some(Errno::EPERM));
    assert_eq!(e.try_create(Gfid::ROOT, ".glusterfs", Dict::new()).await.err(), Some(Errno::EPERM));
    let sl = e.run(Fop::Symlink { target: "x".into(), loc: Loc::entry(Gfid::ROOT, ".glusterfs"), umask: 0 }).await;
    assert_eq!(sl.err(), Some(Errno::EPERM));
    let mv = e
        .run(Fop::Rename {
            old: Loc::entry(Gfid::ROOT, "visible"),
            new: Loc::entry(Gfid::ROOT, ".glusterfs"),
            flags: 0,
        })
        .await;
    assert_eq!(mv.err(), Some(Errno::EPERM));
    let mv = e
        .run(Fop::Rename { old: Loc::entry(Gfid::ROOT, ".glusterfs"), new: Loc::entry(Gfid::ROOT, "x"), flags: 0 })
        .await;
    assert_eq!(mv.err(), Some(Errno::ENOENT));
    let rm = e.run(Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, ".glusterfs"), flags: 0 }).await;
    assert_eq!(rm.err(), Some(Errno::ENOENT));
    assert!(e.brick.join(".glusterfs/00/00").is_dir());
    // Elsewhere the name is ordinary.
    let d = e.mkdir(Gfid::ROOT, "d").await;
    e.mkdir(d, ".glusterfs").await;
}

#[tokio::test]
async fn gfid_req_is_honoured() {
    let e = env();
    let want_d = Gfid::random();
    let d = e
        .entry_of(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 }, gfid_xdata(want_d))
        .await
        .expect("mkdir");
    assert_eq!(d.gfid, want_d);
    assert_eq!(xattr(&e.brick.join("d"), GFID_XATTR), Some(want_d.0.to_vec()));
    let want_f = Gfid::random();
    let (f, fd) = e.try_create(want_d, "f", bytes_xdata(GFID_REQ, &want_f.0)).await.expect("create");
    assert_eq!(f, want_f);
    e.release(fd).await;
    let want_s = Gfid::random();
    let s = e
        .entry_of(Fop::Symlink { target: "f".into(), loc: Loc::entry(want_d, "s"), umask: 0 }, gfid_xdata(want_s))
        .await
        .expect("symlink");
    assert_eq!(s.gfid, want_s);
    let want_n = Gfid::random();
    let n = e
        .entry_of(
            Fop::Mknod { loc: Loc::entry(want_d, "n"), mode: libc::S_IFREG | 0o600, rdev: 0, umask: 0 },
            gfid_xdata(want_n),
        )
        .await
        .expect("mknod");
    assert_eq!(n.gfid, want_n);
    // A gfid in use is refused, and nothing is left behind.
    let dup = e.try_create(Gfid::ROOT, "dup", gfid_xdata(want_f)).await;
    assert_eq!(dup.err(), Some(Errno::EEXIST));
    assert!(!e.brick.join("dup").exists());
    let dup_dir =
        e.entry_of(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "dupd"), mode: 0o755, umask: 0 }, gfid_xdata(want_d)).await;
    assert_eq!(dup_dir.err(), Some(Errno::EEXIST));
    assert!(!e.brick.join("dupd").exists());
    // The handles of the inodes that hold those gfids stay.
    assert_eq!(e.stat(want_f).await.expect("the file by gfid").gfid, want_f);
    assert_eq!(e.stat(want_d).await.expect("the directory by gfid").gfid, want_d);
    // Lookup with the wrong expected gfid is stale.
    let wrong = e.entry_of(Fop::Lookup { loc: Loc::entry(want_d, "f").with_gfid(Gfid::random()) }, Dict::new()).await;
    assert_eq!(wrong.err(), Some(Errno::ESTALE));
    let right = e.entry_of(Fop::Lookup { loc: Loc::entry(want_d, "f").with_gfid(want_f) }, Dict::new()).await;
    assert_eq!(right.expect("lookup").gfid, want_f);
    let bad = e
        .runx(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "b"), mode: 0o755, umask: 0 }, bytes_xdata(GFID_REQ, b"short"))
        .await;
    assert_eq!(bad.err(), Some(Errno::EINVAL));
    // Create without O_EXCL of an existing name opens it.
    let id = e.fd_id();
    let again = e
        .entry_of(
            Fop::Create { loc: Loc::entry(want_d, "f"), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id },
            Dict::new(),
        )
        .await;
    assert_eq!(again.expect("reopen").gfid, want_f);
    let excl = Fop::Create {
        loc: Loc::entry(want_d, "f"),
        flags: (libc::O_RDWR | libc::O_EXCL) as u32,
        mode: 0o644,
        umask: 0,
        fd: e.fd_id(),
    };
    assert_eq!(e.run(excl).await.err(), Some(Errno::EEXIST));
}

#[tokio::test]
async fn inodes_made_behind_our_back_get_gfids() {
    let e = env();
    std::fs::create_dir(e.brick.join("outer")).expect("mkdir");
    std::fs::write(e.brick.join("outer/plain"), b"plain").expect("write");
    let outer = e.lookup(Gfid::ROOT, "outer").await.expect("lookup dir");
    assert!(!outer.gfid.is_null());
    assert_eq!(xattr(&e.brick.join("outer"), GFID_XATTR), Some(outer.gfid.0.to_vec()));
    assert!(std::fs::read_link(e.handle_path(outer.gfid)).is_ok());
    let want = Gfid::random();
    let plain =
        e.entry_of(Fop::Lookup { loc: Loc::entry(outer.gfid, "plain") }, gfid_xdata(want)).await.expect("lookup");
    assert_eq!(plain.gfid, want);
    assert_eq!(plain.nlink, 1);
    assert_eq!(
        std::fs::metadata(e.handle_path(want)).expect("handle").ino(),
        std::fs::metadata(e.brick.join("outer/plain")).expect("f").ino()
    );
    // A second lookup finds the same gfid.
    assert_eq!(e.lookup(outer.gfid, "plain").await.expect("again").gfid, want);
    let fd = e.open(want, libc::O_RDONLY).await.expect("open by gfid");
    assert_eq!(e.read(fd, 0, 10).await.expect("read"), b"plain");
    e.release(fd).await;
    // A lost directory handle (or one pointing elsewhere) is repaired by
    // lookup (the brick may still reach the directory by gfid meanwhile:
    // it keeps resolved directories open).
    std::fs::remove_file(e.handle_path(outer.gfid)).expect("rm handle");
    e.lookup(Gfid::ROOT, "outer").await.expect("lookup");
    assert!(std::fs::symlink_metadata(e.handle_path(outer.gfid)).is_ok(), "handle made again");
    assert!(e.stat(outer.gfid).await.expect("stat").is_dir());
    std::fs::rename(e.brick.join("outer"), e.brick.join("moved-by-admin")).expect("mv");
    e.lookup(Gfid::ROOT, "moved-by-admin").await.expect("lookup");
    assert!(e.stat(outer.gfid).await.expect("after repair").is_dir());
    let target = format!("../../00/00/{}/moved-by-admin", Gfid::ROOT);
    assert_eq!(std::fs::read_link(e.handle_path(outer.gfid)).expect("handle"), PathBuf::from(&target));
    // A copy made with its xattrs does not steal the handle.
    std::fs::create_dir(e.brick.join("copy")).expect("mkdir");
    set_xattr(&e.brick.join("copy"), GFID_XATTR, &outer.gfid.0).expect("set xattr");
    assert_eq!(e.lookup(Gfid::ROOT, "copy").await.expect("lookup copy").gfid, outer.gfid);
    assert_eq!(std::fs::read_link(e.handle_path(outer.gfid)).expect("handle"), PathBuf::from(&target));
}

#[tokio::test]
async fn names_are_checked() {
    let e = env();
    let d = e.mkdir(Gfid::ROOT, "d").await;
    for bad in ["", ".", "..", "a/b", "../x", "/abs", "nul\0"] {
        let mk = e.run(Fop::Mkdir { loc: Loc::entry(d, bad), mode: 0o755, umask: 0 }).await;
        assert_eq!(mk.err(), Some(Errno::EINVAL), "mkdir {bad:?}");
        let cr = e.try_create(d, bad, Dict::new()).await;
        assert_eq!(cr.err(), Some(Errno::EINVAL), "create {bad:?}");
        let ul = e.run(Fop::Unlink { loc: Loc::entry(d, bad), flags: 0 }).await;
        assert_eq!(ul.err(), Some(Errno::EINVAL), "unlink {bad:?}");
        let mv = e.run(Fop::Rename { old: Loc::entry(Gfid::ROOT, "d"), new: Loc::entry(d, bad), flags: 0 }).await;
        assert_eq!(mv.err(), Some(Errno::EINVAL), "rename {bad:?}");
    }
    for bad in ["", "a/b", "../x", "nul\0"] {
        assert_eq!(e.lookup(d, bad).await.err(), Some(Errno::EINVAL), "lookup {bad:?}");
    }
    // Lookup accepts . and .., which never leave the brick.
    assert_eq!(e.lookup(d, ".").await.expect(".").gfid, d);
    assert_eq!(e.lookup(d, "..").await.expect("..").gfid, Gfid::ROOT);
    assert_eq!(e.lookup(Gfid::ROOT, "..").await.expect("root ..").gfid, Gfid::ROOT);
    let stat_dots = e.reply(Fop::Stat { loc: Loc::entry(d, "..") }).await;
    assert_eq!(stat_dots.err(), Some(Errno::EINVAL));
    // A loc with neither gfid nor entry.
    assert_eq!(e.reply(Fop::Stat { loc: Loc::default() }).await.err(), Some(Errno::EINVAL));
    assert_eq!(e.stat(Gfid::random()).await.err(), Some(Errno::ENOENT));
}

/// A file's path, content, mode, mtime, ctime and `trusted.x`.
type Snap = (PathBuf, Vec<u8>, u32, i64, i64, Option<Vec<u8>>);

/// Every file under `p`, as [`Snap`]s.
fn snapshot(p: &Path) -> Vec<Snap> {
    let mut out = Vec::new();
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        let md = std::fs::symlink_metadata(&d).expect("md");
        let content = if md.is_file() { std::fs::read(&d).expect("read") } else { Vec::new() };
        out.push((d.clone(), content, md.mode(), md.mtime(), md.ctime(), xattr(&d, "trusted.x")));
        if md.is_dir() {
            for ent in std::fs::read_dir(&d).expect("readdir") {
                stack.push(ent.expect("ent").path());
            }
        }
    }
    out.sort();
    out
}

async fn escape_attempts(e: &Env) {
    let outside = e.outside.display().to_string();
    // The outside directories carry the gfids of the brick directories that
    // will be swapped for symlinks to them, as a sibling brick of the same
    // volume would: checking the gfid after following is not enough.
    let (v1, v2) = (Gfid::random(), Gfid::random());
    std::fs::create_dir(e.outside.join("other")).expect("mkdir");
    set_xattr(&e.outside, GFID_XATTR, &v1.0).expect("set xattr");
    set_xattr(&e.outside.join("other"), GFID_XATTR, &v2.0).expect("set xattr");
    let before = snapshot(&e.outside);
    let d = e.mkdir(Gfid::ROOT, "d").await;
    let mut links = Vec::new();
    for (name, target) in [
        ("abs", outside.clone()),
        ("abs-file", format!("{outside}/secret")),
        ("rel", "../../outside".to_string()),
        ("rel-file", "../../outside/secret".to_string()),
        ("up", "../../..".to_string()),
    ] {
        let ia = e
            .entry_of(Fop::Symlink { target, loc: Loc::entry(d, name), umask: 0 }, Dict::new())
            .await
            .expect("symlink");
        links.push((name, ia.gfid));
    }
    for (name, g) in &links {
        // Used as a directory.
        let mk = e.run(Fop::Mkdir { loc: Loc::entry(*g, "made"), mode: 0o755, umask: 0 }).await;
        assert_eq!(mk.err(), Some(Errno::ENOTDIR), "{name}");
        assert_eq!(e.try_create(*g, "secret", Dict::new()).await.err(), Some(Errno::ENOTDIR), "{name}");
        assert_eq!(e.lookup(*g, "secret").await.err(), Some(Errno::ENOTDIR), "{name}");
        let od = e.run(Fop::Opendir { loc: Loc::gfid(*g), fd: e.fd_id() }).await;
        assert_eq!(od.err(), Some(Errno::ENOTDIR), "{name}");
        let mv = e.run(Fop::Rename { old: Loc::entry(Gfid::ROOT, "d"), new: Loc::entry(*g, "x"), flags: 0 }).await;
        assert_eq!(mv.err(), Some(Errno::ENOTDIR), "{name}");
        // Used as a file.
        assert_eq!(e.open(*g, libc::O_RDWR).await.err(), Some(Errno::ELOOP), "{name}");
        assert_eq!(e.run(Fop::Truncate { loc: Loc::gfid(*g), offset: 0 }).await.err(), Some(Errno::EINVAL), "{name}");
        let st = e.stat(*g).await.expect("stat");
        assert_eq!(st.file_type(), FileType::Symlink, "{name}");
        // Attribute and xattr changes land on the link, never its target.
        e.run(Fop::Setattr { loc: Loc::gfid(*g), attr: SetAttr { mode: Some(0o777), ..SetAttr::default() } })
            .await
            .expect("chmod link");
        let times = SetAttr { mtime: Some(TimeSet::At(Timespec { sec: 12345, nsec: 0 })), ..SetAttr::default() };
        e.run(Fop::Setattr { loc: Loc::gfid(*g), attr: times }).await.expect("utimes link");
        e.setx(Loc::gfid(*g), "trusted.x", b"on-link", 0).await.expect("xattr on link");
        assert_eq!(
            e.getx(Loc::gfid(*g), "trusted.x").await.expect("get").get_bytes("trusted.x").as_deref(),
            Some(&b"on-link"[..])
        );
        e.xattrop(*g, XattropOp::AddArray, "trusted.x2", &be32(&[1])).await.expect("xattrop on link");
        let r =
            e.entry_of(Fop::Link { old: Loc::gfid(*g), new: Loc::entry(d, format!("{name}-hard")) }, Dict::new()).await;
        assert!(r.is_ok(), "{name}: {r:?}");
        // Access by name goes to the link too.
        assert_eq!(e.lookup(d, name).await.expect("lookup").gfid, *g);
    }
    // A directory swapped for a symlink behind our back: its handle now
    // leads to the symlink, which must not be followed.
    let mkdir_as = |name: &'static str, g: Gfid| {
        e.entry_of(Fop::Mkdir { loc: Loc::entry(d, name), mode: 0o755, umask: 0 }, gfid_xdata(g))
    };
    let victim = mkdir_as("victim", v1).await.expect("mkdir").gfid;
    let vpath = e.brick.join("d/victim");
    std::fs::remove_dir(&vpath).expect("rmdir");
    std::os::unix::fs::symlink(&e.outside, &vpath).expect("swap in symlink");
    let r = e.stat(victim).await;
    assert!(r.is_err(), "resolved {r:?}");
    let mk = e.run(Fop::Mkdir { loc: Loc::entry(victim, "planted"), mode: 0o755, umask: 0 }).await;
    assert!(mk.is_err());
    let cr = e.try_create(victim, "planted-file", Dict::new()).await;
    assert!(cr.is_err());
    assert!(e.lookup(victim, "secret").await.is_err());
    let rel = e.brick.join("d/victim2");
    let v2 = mkdir_as("victim2", v2).await.expect("mkdir").gfid;
    std::fs::remove_dir(&rel).expect("rmdir");
    std::os::unix::fs::symlink("../../outside/other", &rel).expect("relative symlink");
    assert!(e.stat(v2).await.is_err());
    assert!(e.lookup(v2, "secret").await.is_err());
    assert!(e.run(Fop::Opendir { loc: Loc::gfid(v2), fd: e.fd_id() }).await.is_err());
    assert!(e.setx(Loc::gfid(v2), "trusted.x", b"no", 0).await.is_err());

    assert_eq!(snapshot(&e.outside), before, "something outside the brick changed");
    assert!(!e.outside.join("made").exists() && !e.outside.join("planted").exists());
}

#[tokio::test]
async fn client_symlinks_never_lead_outside() {
    escape_attempts(&env()).await;
}

#[tokio::test]
async fn client_symlinks_never_lead_outside_without_openat2() {
    let e = env();
    e.xl.inner.brick.force_walk();
    escape_attempts(&e).await;
}

#[tokio::test]
async fn deep_directories_resolve_by_gfid() {
    for walk in [false, true] {
        let e = env();
        if walk {
            e.xl.inner.brick.force_walk();
        }
        let mut cur = Gfid::ROOT;
        let mut chain = Vec::new();
        // Deeper than the kernel's 40-symlink limit on handle chains.
        for i in 0..60 {
            cur = e.mkdir(cur, &format!("level{i}")).await;
            chain.push(cur);
        }
        let (f, fd) = e.create(cur, "leaf").await;
        e.release(fd).await;
        for g in [chain[0], chain[30], chain[59]] {
            assert!(e.stat(g).await.expect("deep stat").is_dir(), "walk={walk}");
        }
        assert_eq!(e.lookup(cur, "leaf").await.expect("leaf").gfid, f);
        assert_eq!(names(&e.list(chain[59], 4096, true).await), vec![".", "..", "leaf"]);
    }
}

#[tokio::test]
async fn lookup_returns_small_file_content_when_asked() {
    use xlfs_sdk::dict::keys::CONTENT;
    let e = env();
    let (g, fd) = e.create(Gfid::ROOT, "small").await;
    e.write(fd, 0, b"hello quick-read").await;
    let (big, bfd) = e.create(Gfid::ROOT, "big").await;
    e.write(bfd, 0, &[7u8; 100]).await;
    e.mkdir(Gfid::ROOT, "dir").await;
    let ask = |max: u64| Dict::new().with(CONTENT, Value::U64(max));
    // Asked with room: the whole content, matching the reply's size.
    let r = e.runx(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "small") }, ask(64)).await.expect("lookup");
    assert_eq!(r.xdata.get_bytes(CONTENT).as_deref(), Some(&b"hello quick-read"[..]));
    assert!(matches!(r.reply, Reply::Entry { iatt, .. } if iatt.gfid == g && iatt.size == 16));
    // By gfid as well; exactly the limit is still small.
    let r = e.runx(Fop::Lookup { loc: Loc::gfid(g) }, ask(16)).await.expect("lookup");
    assert_eq!(r.xdata.get_bytes(CONTENT).as_deref(), Some(&b"hello quick-read"[..]));
    // Larger than the limit, a directory, or not asked: no content.
    let r = e.runx(Fop::Lookup { loc: Loc::gfid(big) }, ask(99)).await.expect("lookup");
    assert!(!r.xdata.contains(CONTENT));
    let r = e.runx(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "dir") }, ask(1 << 20)).await.expect("lookup");
    assert!(!r.xdata.contains(CONTENT));
    let r = e.run(Fop::Lookup { loc: Loc::gfid(g) }).await.expect("lookup");
    assert!(!r.xdata.contains(CONTENT));
    // An empty file has empty content.
    let (_, efd) = e.create(Gfid::ROOT, "empty").await;
    let r = e.runx(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "empty") }, ask(64)).await.expect("lookup");
    assert_eq!(r.xdata.get_bytes(CONTENT).as_deref(), Some(&b""[..]));
    for f in [fd, bfd, efd] {
        e.release(f).await;
    }
}

/// A lookup asking for several xattrs gets exactly those that exist, for
/// a file (read through its handle) and a directory, by name and by gfid.
#[tokio::test]
async fn lookup_returns_the_requested_xattrs_that_exist() {
    let e = env();
    let (f, fd) = e.create(Gfid::ROOT, "f").await;
    e.release(fd).await;
    let d = e.mkdir(Gfid::ROOT, "d").await;
    set_xattr(&e.brick.join("f"), "user.one", b"1").expect("set xattr");
    set_xattr(&e.brick.join("f"), "user.two", b"22").expect("set xattr");
    set_xattr(&e.brick.join("d"), "user.two", b"d2").expect("set xattr");
    let ask =
        Dict::new().with("user.one", Value::U64(0)).with("user.two", Value::U64(0)).with("user.absent", Value::U64(0));
    for (loc, want) in [
        (Loc::entry(Gfid::ROOT, "f"), vec![("user.one", &b"1"[..]), ("user.two", &b"22"[..])]),
        (Loc::gfid(f), vec![("user.one", &b"1"[..]), ("user.two", &b"22"[..])]),
        (Loc::entry(Gfid::ROOT, "d"), vec![("user.two", &b"d2"[..])]),
        (Loc::gfid(d), vec![("user.two", &b"d2"[..])]),
    ] {
        let r = e.runx(Fop::Lookup { loc: loc.clone() }, ask.clone()).await.expect("lookup");
        let mut got: Vec<(String, Vec<u8>)> =
            r.xdata.keys().map(|k| (k.clone(), r.xdata.get_bytes(k).map(|b| b.to_vec()).unwrap_or_default())).collect();
        got.sort();
        let want: Vec<(String, Vec<u8>)> = want.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        assert_eq!(got, want, "{loc:?}");
    }
    // One asked: read directly, present or not.
    let one = Dict::new().with("user.two", Value::U64(0));
    let r = e.runx(Fop::Lookup { loc: Loc::gfid(f) }, one).await.expect("lookup");
    assert_eq!(r.xdata.get_bytes("user.two").as_deref(), Some(&b"22"[..]));
}

/// A directory's gfid leads to it after a rename; after an rmdir and a
/// mkdir with the same gfid (heal) to the new one; after it is removed
/// behind the brick's back (its handle left) to nothing. Entry fops land
/// where the gfid is now (a guard for any caching of resolved directories).
#[tokio::test]
async fn a_directory_gfid_follows_renames_and_removal() {
    let e = env();
    let d = e.mkdir(Gfid::ROOT, "d").await;
    let (_, fd) = e.create(d, "one").await;
    e.release(fd).await;
    e.reply(Fop::Rename { old: Loc::entry(Gfid::ROOT, "d"), new: Loc::entry(Gfid::ROOT, "moved"), flags: 0 })
        .await
        .expect("rename");
    let (_, fd) = e.create(d, "two").await;
    e.release(fd).await;
    assert!(e.brick.join("moved/two").exists(), "created in the renamed directory");
    for name in ["one", "two"] {
        e.reply(Fop::Unlink { loc: Loc::entry(d, name), flags: 0 }).await.expect("unlink");
    }
    e.reply(Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, "moved"), flags: 0 }).await.expect("rmdir");
    assert_eq!(e.stat(d).await.err(), Some(Errno::ENOENT), "removed");
    let again = Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "again"), mode: 0o755, umask: 0 };
    assert_eq!(e.entry_of(again, gfid_xdata(d)).await.expect("mkdir with the same gfid").gfid, d);
    let (_, fd) = e.create(d, "three").await;
    e.release(fd).await;
    assert!(e.brick.join("again/three").exists(), "created in the new directory");
    // Removed behind the brick's back, its handle left dangling: gone.
    std::fs::remove_file(e.brick.join("again/three")).expect("rm");
    std::fs::remove_dir(e.brick.join("again")).expect("rmdir behind the brick");
    assert!(std::fs::symlink_metadata(e.handle_path(d)).is_ok(), "the handle is still there");
    assert_eq!(e.stat(d).await.err(), Some(Errno::ENOENT));
    let make =
        Fop::Create { loc: Loc::entry(d, "four"), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: e.fd_id() };
    assert_eq!(e.run(make).await.map(drop).err(), Some(Errno::ENOENT));
}

/// Directories resolved by gfid are kept open, at most `DIR_CACHE` of
/// them, and dropped when removed.
#[tokio::test]
async fn resolved_directories_are_kept_open_boundedly_until_removed() {
    let e = env();
    let cached = || {
        let d = e.xl.dump();
        d.iter().find(|(k, _)| k == "open-dirs-cached").map(|(_, v)| v.parse::<usize>().expect("number"))
    };
    let d = e.mkdir(Gfid::ROOT, "d").await;
    for _ in 0..3 {
        assert!(e.stat(d).await.expect("stat").is_dir());
        assert_eq!(cached(), Some(1), "opened once");
    }
    e.reply(Fop::Rmdir { loc: Loc::entry(Gfid::ROOT, "d"), flags: 0 }).await.expect("rmdir");
    assert_eq!(cached(), Some(0), "dropped with its handle");
    let mut dirs = Vec::new();
    for i in 0..handle::DIR_CACHE + 10 {
        let g = e.mkdir(Gfid::ROOT, &format!("d{i}")).await;
        e.stat(g).await.expect("stat");
        dirs.push(g);
    }
    let n = cached().expect("count");
    assert!((handle::DIR_CACHE / 2..=handle::DIR_CACHE).contains(&n), "{n} kept");
    // The oldest, no longer kept, still resolve.
    assert!(e.stat(dirs[0]).await.expect("stat").is_dir());
}
