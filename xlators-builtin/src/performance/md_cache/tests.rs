//! Tests of performance/md-cache over an in-memory child that counts the
//! fops reaching it, and over real storage/posix.

mod over_posix;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use xlfs_sdk::{DirEntry, EventSink, Fd, FdId, FopKind, SetAttr, TimeSet, Timespec};

use super::*;
use xlfs_sdk::testing::now as ready;

const SEC: u64 = 1_000_000_000;

/// A clock tests move by hand.
struct ManualClock(AtomicU64);

impl ManualClock {
    fn advance(&self, ns: u64) {
        self.0.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct Node {
    iatt: Iatt,
    xattrs: BTreeMap<String, Bytes>,
}

#[derive(Default)]
struct FsInner {
    nodes: HashMap<Gfid, Node>,
    names: BTreeMap<(Gfid, String), Gfid>,
    calls: Vec<Request>,
    next: u8,
    /// End listings asked for whole with "may miss names" (as distribute
    /// does while a rebalance moves files).
    inexact: bool,
}

/// A small file system in memory that answers at once, like storage/posix
/// in the parts md-cache relies on (lookup and readdirp xattr keys), and
/// records every request.
struct Fs(Mutex<FsInner>);

fn iatt_of(gfid: Gfid, mode: u32) -> Iatt {
    Iatt { gfid, ino: gfid.ino(), mode, nlink: 1, ..Iatt::default() }
}

impl Fs {
    fn new() -> Arc<Fs> {
        let mut inner = FsInner::default();
        inner.nodes.insert(Gfid::ROOT, Node { iatt: iatt_of(Gfid::ROOT, 0o040755), xattrs: BTreeMap::new() });
        Arc::new(Fs(Mutex::new(inner)))
    }

    /// Makes `name` in `parent` behind the cache's back.
    fn add(&self, parent: Gfid, name: &str, dir: bool) -> Gfid {
        let mut f = self.0.lock();
        f.make(parent, name, if dir { 0o040755 } else { 0o100644 })
    }

    /// Sets an xattr behind the cache's back.
    fn set_x(&self, g: Gfid, name: &str, v: &[u8]) {
        let mut f = self.0.lock();
        if let Some(n) = f.nodes.get_mut(&g) {
            n.xattrs.insert(name.into(), Bytes::copy_from_slice(v));
            n.iatt.ctime.sec += 1;
        }
    }

    /// Changes the size behind the cache's back.
    fn grow(&self, g: Gfid, size: u64) {
        if let Some(n) = self.0.lock().nodes.get_mut(&g) {
            n.iatt.size = size;
            n.iatt.ctime.sec += 1;
        }
    }

    fn count(&self, kind: FopKind) -> usize {
        self.0.lock().calls.iter().filter(|r| r.fop.kind() == kind).count()
    }

    fn last(&self, kind: FopKind) -> Option<Request> {
        self.0.lock().calls.iter().rev().find(|r| r.fop.kind() == kind).cloned()
    }
}

impl FsInner {
    fn make(&mut self, parent: Gfid, name: &str, mode: u32) -> Gfid {
        self.next += 1;
        let g = Gfid([0x10, self.next, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, self.next]);
        self.nodes.insert(g, Node { iatt: iatt_of(g, mode), xattrs: BTreeMap::new() });
        self.names.insert((parent, name.to_string()), g);
        self.changed(parent);
        g
    }

    fn changed(&mut self, g: Gfid) {
        if let Some(n) = self.nodes.get_mut(&g) {
            n.iatt.ctime.sec += 1;
            n.iatt.mtime.sec += 1;
        }
    }

    fn resolve(&self, loc: &Loc) -> Result<Gfid, Errno> {
        if loc.is_entry() {
            let g = *self.names.get(&(loc.parent, loc.name.clone())).ok_or(Errno::ENOENT)?;
            if !loc.gfid.is_null() && loc.gfid != g {
                return Err(Errno::ESTALE);
            }
            Ok(g)
        } else {
            self.nodes.contains_key(&loc.gfid).then_some(loc.gfid).ok_or(Errno::ESTALE)
        }
    }

    fn attr(&self, g: Gfid) -> Iatt {
        self.nodes.get(&g).map(|n| n.iatt).unwrap_or_default()
    }

    fn getxattr(&self, g: Gfid, name: &str) -> FopResult {
        let v = self.nodes.get(&g).and_then(|n| n.xattrs.get(name)).ok_or(Errno::ENODATA)?;
        Ok(Reply::Xattrs(Dict::new().with(name, Value::Bytes(v.clone()))).into())
    }

    fn handle(&mut self, req: &Request) -> FopResult {
        match &req.fop {
            Fop::Lookup { loc } => {
                let g = self.resolve(loc)?;
                let postparent = if loc.is_entry() { self.attr(loc.parent) } else { Iatt::default() };
                let mut xdata = Dict::new();
                for k in req.xdata.keys() {
                    if let Some(v) = self.nodes.get(&g).and_then(|n| n.xattrs.get(k)) {
                        xdata.set_bytes(k.clone(), v.clone());
                    }
                }
                Ok(Response { reply: Reply::Entry { iatt: self.attr(g), postparent }, xdata })
            }
            Fop::Stat { loc } => Ok(Reply::Attr(self.attr(self.resolve(loc)?)).into()),
            Fop::Fstat { fd } => Ok(Reply::Attr(self.attr(fd.gfid)).into()),
            Fop::Getxattr { loc, name } => {
                let g = self.resolve(loc)?;
                self.getxattr(g, name)
            }
            Fop::Fgetxattr { fd, name } => self.getxattr(fd.gfid, name),
            Fop::Setxattr { loc, xattrs, .. } => {
                let g = self.resolve(loc)?;
                let n = self.nodes.get_mut(&g).ok_or(Errno::ENOENT)?;
                for (k, v) in xattrs.iter() {
                    n.xattrs.insert(k.clone(), xattr_value(v).unwrap_or_default());
                }
                n.iatt.ctime.sec += 1;
                Ok(Reply::Empty.into())
            }
            Fop::Removexattr { loc, name } => {
                let g = self.resolve(loc)?;
                let n = self.nodes.get_mut(&g).ok_or(Errno::ENOENT)?;
                n.xattrs.remove(name).ok_or(Errno::ENODATA)?;
                n.iatt.ctime.sec += 1;
                Ok(Reply::Empty.into())
            }
            Fop::Setattr { loc, attr } => {
                let g = self.resolve(loc)?;
                let n = self.nodes.get_mut(&g).ok_or(Errno::ENOENT)?;
                let pre = n.iatt;
                if let Some(m) = attr.mode {
                    n.iatt.mode = (n.iatt.mode & !0o7777) | (m & 0o7777);
                }
                n.iatt.ctime.sec += 1;
                Ok(Reply::PrePost { pre, post: n.iatt }.into())
            }
            Fop::Writev { fd, data, offset, .. } => {
                let n = self.nodes.get_mut(&fd.gfid).ok_or(Errno::EBADF)?;
                let pre = n.iatt;
                n.iatt.size = n.iatt.size.max(offset + data.len() as u64);
                n.iatt.mtime.sec += 1;
                n.iatt.ctime.sec += 1;
                Ok(Reply::PrePost { pre, post: n.iatt }.into())
            }
            Fop::Create { loc, .. } | Fop::Mkdir { loc, .. } => {
                if self.names.contains_key(&(loc.parent, loc.name.clone())) {
                    return Err(Errno::EEXIST);
                }
                let mode = if matches!(req.fop, Fop::Mkdir { .. }) { 0o040755 } else { 0o100644 };
                let g = self.make(loc.parent, &loc.name, mode);
                Ok(Reply::Entry { iatt: self.attr(g), postparent: self.attr(loc.parent) }.into())
            }
            Fop::Unlink { loc, .. } => {
                let pre = self.attr(loc.parent);
                self.names.remove(&(loc.parent, loc.name.clone())).ok_or(Errno::ENOENT)?;
                self.changed(loc.parent);
                Ok(Reply::Parent { pre, post: self.attr(loc.parent) }.into())
            }
            Fop::Readdirp { fd, offset, .. } => {
                let mut entries = Vec::new();
                if *offset == 0 {
                    entries.push(DirEntry {
                        name: ".".into(),
                        d_off: 1,
                        iatt: self.attr(fd.gfid),
                        ..DirEntry::default()
                    });
                    for ((p, name), g) in &self.names {
                        if *p == fd.gfid {
                            let d_off = entries.len() as u64 + 1;
                            entries.push(DirEntry {
                                name: name.clone(),
                                d_off,
                                iatt: self.attr(*g),
                                ..DirEntry::default()
                            });
                        }
                    }
                }
                let names: Vec<&String> = req.xdata.keys().filter(|k| is_xattr_name(k)).collect();
                let mut xdata = Dict::new();
                if !names.is_empty() {
                    for e in entries.iter().filter(|e| !is_dot(&e.name)) {
                        for n in &names {
                            if let Some(v) = self.nodes.get(&e.iatt.gfid).and_then(|x| x.xattrs.get(*n)) {
                                xdata.set_bytes(keys::dirent_xattr(&e.name, n), v.clone());
                            }
                        }
                    }
                    xdata.set_u64(keys::DIRENT_XATTRS, names.len() as u64);
                }
                if entries.is_empty() && self.inexact && req.xdata.contains(keys::WHOLE_LISTING) {
                    xdata.set_u64(keys::WHOLE_LISTING, 0);
                }
                Ok(Response { reply: Reply::Dirents(entries), xdata })
            }
            Fop::Statfs { .. } => Ok(Reply::Statfs(Statvfs { blocks: 7, ..Statvfs::default() }).into()),
            Fop::Opendir { .. } | Fop::Forget { .. } | Fop::Release { .. } | Fop::Releasedir { .. } => {
                Ok(Reply::Empty.into())
            }
            _ => Err(Errno::ENOSYS),
        }
    }
}

impl Xlator for Fs {
    fn call(&self, _ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let mut f = self.0.lock();
        let res = f.handle(&req);
        f.calls.push(req);
        Box::pin(std::future::ready(res))
    }
}

struct T {
    md: Arc<MdCache>,
    fs: Arc<Fs>,
    clock: Arc<ManualClock>,
}

fn setup(opts: &[(&str, &str)]) -> T {
    let fs = Fs::new();
    setup_over(opts, fs.clone(), fs)
}

/// [`Fs`] with each reply changed by the function on its way up (a child
/// that answers otherwise than storage/posix).
struct Altered<F>(Arc<Fs>, F);

impl<F: Fn(&mut FopResult) + Send + Sync + 'static> Xlator for Altered<F> {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(async move {
            let mut r = self.0.call(ctx, req).await;
            (self.1)(&mut r);
            r
        })
    }
}

fn setup_over(opts: &[(&str, &str)], fs: Arc<Fs>, child: Arc<dyn Xlator>) -> T {
    let clock = Arc::new(ManualClock(AtomicU64::new(SEC)));
    let o = Options::resolve(OPTIONS, opts.iter().copied()).expect("options");
    let md = Arc::new(MdCache::new(Child { name: Arc::from("fs"), xl: child }, config(&o), clock.clone()));
    T { md, fs, clock }
}

impl T {
    fn run(&self, fop: Fop) -> FopResult {
        self.runx(fop, Dict::new())
    }
    fn runx(&self, fop: Fop, xdata: Dict) -> FopResult {
        ready(self.md.call(CallCtx::root("t"), Request::with_xdata(fop, xdata)))
    }
    fn lookup(&self, parent: Gfid, name: &str) -> Result<Iatt, Errno> {
        match self.run(Fop::Lookup { loc: Loc::entry(parent, name) })?.reply {
            Reply::Entry { iatt, .. } => Ok(iatt),
            r => panic!("lookup replied {r:?}"),
        }
    }
    fn stat(&self, g: Gfid) -> Iatt {
        match self.run(Fop::Stat { loc: Loc::gfid(g) }).expect("stat").reply {
            Reply::Attr(a) => a,
            r => panic!("stat replied {r:?}"),
        }
    }
    fn getx(&self, g: Gfid, name: &str) -> Result<Bytes, Errno> {
        match self.run(Fop::Getxattr { loc: Loc::gfid(g), name: name.into() })?.reply {
            Reply::Xattrs(d) => Ok(d.get_bytes(name).expect("the name in the reply")),
            r => panic!("getxattr replied {r:?}"),
        }
    }
    fn readdirp(&self, dir: Gfid) -> Response {
        let fd = Fd { id: FdId(9), gfid: dir };
        self.run(Fop::Readdirp { fd, size: 4096, offset: 0 }).expect("readdirp")
    }
    fn dump(&self, key: &str) -> u64 {
        let v = self.md.dump().into_iter().find(|(k, _)| k == key).map(|(_, v)| v);
        v.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no numeric dump key {key}"))
    }
}

#[test]
fn stat_after_lookup_is_a_hit() {
    let t = setup(&[]);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    assert_eq!(t.lookup(Gfid::ROOT, "f").expect("lookup").gfid, g);
    assert_eq!(t.stat(g).gfid, g);
    assert_eq!(t.fs.count(FopKind::Stat), 0);
    assert_eq!((t.dump("stat-hits"), t.dump("stat-misses")), (1, 0));
    // Fstat and lookup by gfid as well.
    let fd = Fd { id: FdId(1), gfid: g };
    assert!(matches!(t.run(Fop::Fstat { fd }).expect("fstat").reply, Reply::Attr(a) if a.gfid == g));
    assert!(
        matches!(t.run(Fop::Lookup { loc: Loc::gfid(g) }).expect("lookup").reply, Reply::Entry { iatt, .. } if iatt.gfid == g)
    );
    assert_eq!((t.fs.count(FopKind::Fstat), t.fs.count(FopKind::Lookup)), (0, 1));
    // The revalidating lookup of the entry: the entry, the inode and the
    // parent (from the first lookup's postparent) are fresh.
    assert_eq!(t.lookup(Gfid::ROOT, "f").expect("lookup").gfid, g);
    assert_eq!(t.fs.count(FopKind::Lookup), 1);
    assert_eq!(t.dump("lookup-hits"), 2);
    // A stat with xdata is not answered from the cache.
    t.runx(Fop::Stat { loc: Loc::gfid(g) }, Dict::new().with("x", Value::U64(1))).expect("stat");
    assert_eq!(t.fs.count(FopKind::Stat), 1);
}

#[test]
fn lookup_prefetches_selinux_and_acls_and_getxattr_is_answered() {
    let t = setup(&[]);
    let labelled = t.fs.add(Gfid::ROOT, "labelled", false);
    let plain = t.fs.add(Gfid::ROOT, "plain", false);
    t.fs.set_x(labelled, SELINUX, b"system_u:object_r:x_t:s0");
    t.lookup(Gfid::ROOT, "labelled").expect("lookup");
    // The request carried the prefetch keys; the reply to the caller does not.
    let sent = t.fs.last(FopKind::Lookup).expect("lookup sent");
    for k in [SELINUX, CAPABILITY, ACL_ACCESS, ACL_DEFAULT] {
        assert!(sent.xdata.contains(k), "{k} not prefetched: {:?}", sent.xdata);
    }
    let rsp = t.run(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "plain") }).expect("lookup");
    assert!(rsp.xdata.is_empty(), "added keys leak: {:?}", rsp.xdata);
    assert_eq!(t.getx(labelled, SELINUX).as_deref(), Ok(&b"system_u:object_r:x_t:s0"[..]));
    assert_eq!(t.getx(plain, SELINUX), Err(Errno::ENODATA));
    assert_eq!(t.getx(plain, ACL_ACCESS), Err(Errno::ENODATA));
    assert_eq!(t.getx(labelled, ACL_ACCESS), Err(Errno::ENODATA));
    assert_eq!(t.fs.count(FopKind::Getxattr), 0);
    assert_eq!((t.dump("getxattr-hits"), t.dump("xattr-absent-hits"), t.dump("getxattr-misses")), (1, 3, 0));
    // A key the caller asked for itself stays in the reply.
    let ask = Dict::new().with(SELINUX, Value::U64(0));
    let rsp = t.runx(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "labelled") }, ask).expect("lookup");
    assert!(rsp.xdata.contains(SELINUX) && !rsp.xdata.contains(ACL_ACCESS), "{:?}", rsp.xdata);
    // A name not cached goes to the child.
    assert_eq!(t.getx(plain, "trusted.other"), Err(Errno::ENODATA));
    assert_eq!(t.fs.count(FopKind::Getxattr), 1);
}

/// A setattr of times only keeps the cached security and ACL xattrs; a
/// chmod or chown drops them, but keeps a capability known absent (the
/// kernel asks for it before a chown, right after tar or cp -a set the
/// times); one that is present goes.
#[test]
fn setattr_keeps_the_xattrs_it_cannot_change() {
    let t = setup(&[]);
    let plain = t.fs.add(Gfid::ROOT, "plain", false);
    let capable = t.fs.add(Gfid::ROOT, "capable", false);
    t.fs.set_x(capable, CAPABILITY, b"caps");
    t.lookup(Gfid::ROOT, "plain").expect("lookup");
    t.lookup(Gfid::ROOT, "capable").expect("lookup");
    let times = SetAttr { mtime: Some(TimeSet::At(Timespec { sec: 1, nsec: 0 })), ..SetAttr::default() };
    let chown = SetAttr { uid: Some(0), gid: Some(0), ..SetAttr::default() };
    for g in [plain, capable] {
        t.run(Fop::Setattr { loc: Loc::gfid(g), attr: times }).expect("utimes");
    }
    assert_eq!(t.getx(plain, CAPABILITY), Err(Errno::ENODATA));
    assert_eq!(t.getx(capable, CAPABILITY).as_deref(), Ok(&b"caps"[..]));
    assert_eq!(t.getx(plain, ACL_ACCESS), Err(Errno::ENODATA));
    assert_eq!(t.fs.count(FopKind::Getxattr), 0, "new times kept every cached xattr");
    for g in [plain, capable] {
        t.run(Fop::Setattr { loc: Loc::gfid(g), attr: chown }).expect("chown");
    }
    assert_eq!(t.getx(plain, CAPABILITY), Err(Errno::ENODATA));
    assert_eq!(t.fs.count(FopKind::Getxattr), 0, "an absent capability stays absent");
    t.fs.set_x(capable, CAPABILITY, b"still"); // as the brick would answer
    assert_eq!(t.getx(capable, CAPABILITY).as_deref(), Ok(&b"still"[..]));
    assert_eq!(t.getx(plain, ACL_ACCESS), Err(Errno::ENODATA));
    assert_eq!(t.fs.count(FopKind::Getxattr), 2, "a present capability and the ACL were dropped");
}

#[test]
fn readdirp_prefetches_every_entry() {
    let t = setup(&[("xattr-cache-list", "user.tag")]);
    let d = t.fs.add(Gfid::ROOT, "d", true);
    let a = t.fs.add(d, "a", false);
    let b = t.fs.add(d, "b", false);
    t.fs.set_x(b, SELINUX, b"ctx");
    t.fs.set_x(a, "user.tag", b"A");
    let rsp = t.readdirp(d);
    assert!(rsp.xdata.is_empty(), "added keys leak: {:?}", rsp.xdata);
    let sent = t.fs.last(FopKind::Readdirp).expect("readdirp sent");
    assert!(sent.xdata.contains(SELINUX) && sent.xdata.contains("user.tag"));
    assert_eq!(t.getx(a, SELINUX), Err(Errno::ENODATA));
    assert_eq!(t.getx(b, SELINUX).as_deref(), Ok(&b"ctx"[..]));
    assert_eq!(t.getx(a, "user.tag").as_deref(), Ok(&b"A"[..]));
    assert_eq!(t.getx(b, "user.tag"), Err(Errno::ENODATA));
    assert_eq!(t.getx(b, ACL_ACCESS), Err(Errno::ENODATA));
    assert_eq!(t.stat(a).gfid, a);
    assert_eq!(t.stat(d).gfid, d); // from the "." entry
    assert_eq!((t.fs.count(FopKind::Getxattr), t.fs.count(FopKind::Stat)), (0, 0));
    // The `ls -l` pattern: lookup of each listed name, answered too.
    assert_eq!(t.lookup(d, "a").expect("lookup").gfid, a);
    assert_eq!(t.fs.count(FopKind::Lookup), 0);
}

#[test]
fn readdirp_from_a_child_without_the_convention_caches_no_absence() {
    // Replies without their xdata (an old brick).
    let fs = Fs::new();
    let strip = Altered(fs.clone(), |r: &mut FopResult| {
        if let Ok(rsp) = r {
            rsp.xdata = Dict::new();
        }
    });
    let t = setup_over(&[], fs.clone(), Arc::new(strip));
    let a = fs.add(Gfid::ROOT, "a", false);
    fs.set_x(a, SELINUX, b"ctx");
    t.readdirp(Gfid::ROOT);
    assert_eq!(t.getx(a, SELINUX).as_deref(), Ok(&b"ctx"[..]));
    assert_eq!(fs.count(FopKind::Getxattr), 1);
}

/// Replicate answers an unlink under its directory delegation at once,
/// with the delegation's attributes of the directory as `pre`: those need
/// not be what a stat (answered by a brick, behind the queue) gave. The
/// directory's attributes after the unlink are still newer than the
/// cached ones, and `rm -r` stats the directory after every unlink.
#[test]
fn the_directory_after_an_unlink_is_cached_whatever_its_pre_said() {
    let fs = Fs::new();
    let own_pre = Altered(fs.clone(), |r: &mut FopResult| {
        if let Ok(Response { reply: Reply::Parent { pre, .. }, .. }) = r {
            pre.mtime.nsec += 1;
        }
    });
    let t = setup_over(&[], fs.clone(), Arc::new(own_pre));
    let d = fs.add(Gfid::ROOT, "d", true);
    for n in ["a", "b", "c"] {
        fs.add(d, n, false);
    }
    t.stat(d);
    t.readdirp(d); // as rm -r does: the names (and their inodes) are known
    for n in ["a", "b", "c"] {
        t.run(Fop::Unlink { loc: Loc::entry(d, n), flags: 0 }).expect("unlink");
        let after = fs.0.lock().nodes[&d].iatt;
        assert_eq!(t.stat(d), after, "the directory as the unlink of {n} left it");
    }
    assert_eq!(fs.count(FopKind::Stat), 1, "only the first stat went down");
    // One answered with older times than those cached (a reply overtaken
    // by a later change) drops them instead.
    let cached = t.stat(d);
    fs.add(d, "e", false);
    t.lookup(d, "e").expect("lookup");
    fs.0.lock().nodes.get_mut(&d).expect("d").iatt.ctime.sec -= 10;
    t.run(Fop::Unlink { loc: Loc::entry(d, "e"), flags: 0 }).expect("unlink");
    assert_ne!(t.stat(d), cached);
    assert_eq!(fs.count(FopKind::Stat), 2, "went down again");
}

#[test]
fn a_negative_lookup_is_a_hit_until_the_name_is_created() {
    let t = setup(&[]);
    assert_eq!(t.lookup(Gfid::ROOT, "n"), Err(Errno::ENOENT));
    assert_eq!(t.lookup(Gfid::ROOT, "n"), Err(Errno::ENOENT));
    assert_eq!(t.fs.count(FopKind::Lookup), 1);
    assert_eq!(t.dump("negative-lookup-hits"), 1);
    let fop = Fop::Create { loc: Loc::entry(Gfid::ROOT, "n"), flags: 0, mode: 0o644, umask: 0, fd: FdId(1) };
    let created = match t.run(fop).expect("create").reply {
        Reply::Entry { iatt, .. } => iatt.gfid,
        r => panic!("{r:?}"),
    };
    assert_eq!(t.lookup(Gfid::ROOT, "n").expect("now exists").gfid, created);
    assert_eq!(t.stat(created).gfid, created);
    // Unlink through the cache makes it a negative entry again.
    t.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "n"), flags: 0 }).expect("unlink");
    let before = t.fs.count(FopKind::Lookup);
    assert_eq!(t.lookup(Gfid::ROOT, "n"), Err(Errno::ENOENT));
    assert_eq!(t.fs.count(FopKind::Lookup), before);
    // The unlinked inode's attributes are not served any more.
    let stats = t.fs.count(FopKind::Stat);
    let _ = t.run(Fop::Stat { loc: Loc::gfid(created) });
    assert_eq!(t.fs.count(FopKind::Stat), stats + 1);
    // nl-cache off: every negative lookup goes down.
    let t = setup(&[("nl-cache", "off")]);
    assert_eq!(t.lookup(Gfid::ROOT, "n"), Err(Errno::ENOENT));
    assert_eq!(t.lookup(Gfid::ROOT, "n"), Err(Errno::ENOENT));
    assert_eq!(t.fs.count(FopKind::Lookup), 2);
}

#[test]
fn setxattr_and_removexattr_update_the_cached_xattr() {
    let t = setup(&[("xattr-cache-list", "trusted.tag")]);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    assert_eq!(t.getx(g, "trusted.tag"), Err(Errno::ENODATA));
    let set = |v: &'static [u8]| Fop::Setxattr {
        loc: Loc::gfid(g),
        xattrs: Dict::new().with("trusted.tag", Value::Bytes(Bytes::from_static(v))),
        flags: 0,
    };
    t.run(set(b"v1")).expect("setxattr");
    assert_eq!(t.getx(g, "trusted.tag").as_deref(), Ok(&b"v1"[..]));
    t.run(Fop::Removexattr { loc: Loc::gfid(g), name: "trusted.tag".into() }).expect("removexattr");
    assert_eq!(t.getx(g, "trusted.tag"), Err(Errno::ENODATA));
    assert_eq!(t.fs.count(FopKind::Getxattr), 0);
    // The change moved ctime: the attributes are fetched again.
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), 1);
    // user.* read by getxattr is cached (cache-xattrs); a set updates it.
    t.fs.set_x(g, "user.u", b"1");
    assert_eq!(t.getx(g, "user.u").as_deref(), Ok(&b"1"[..]));
    assert_eq!(t.getx(g, "user.u").as_deref(), Ok(&b"1"[..]));
    assert_eq!(t.fs.count(FopKind::Getxattr), 1);
    let fop = Fop::Setxattr { loc: Loc::gfid(g), xattrs: Dict::new().with("user.u", Value::Str("2".into())), flags: 0 };
    t.run(fop).expect("setxattr");
    assert_eq!(t.getx(g, "user.u").as_deref(), Ok(&b"2"[..]));
    // security.* and system.* values may be rewritten by the kernel: a set
    // drops them, the next getxattr asks the child.
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    let fop = Fop::Setxattr {
        loc: Loc::gfid(g),
        xattrs: Dict::new().with(ACL_ACCESS, Value::Bytes(Bytes::from_static(b"acl"))),
        flags: 0,
    };
    t.run(fop).expect("setxattr");
    assert_eq!(t.getx(g, ACL_ACCESS).as_deref(), Ok(&b"acl"[..]));
    assert_eq!(t.fs.count(FopKind::Getxattr), 2);
    // A failed modifying fop drops the inode.
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    let stats = t.fs.count(FopKind::Stat);
    assert!(t.run(Fop::Removexattr { loc: Loc::gfid(Gfid([0x55; 16])), name: "user.u".into() }).is_err());
    assert!(t.run(Fop::Fremovexattr { fd: Fd { id: FdId(3), gfid: g }, name: "user.u".into() }).is_err());
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), stats + 1);
}

#[test]
fn setattr_and_writes_update_attributes_from_their_replies() {
    let t = setup(&[]);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    t.fs.set_x(Gfid::ROOT, "user.x", b""); // an unrelated change elsewhere
    let attr = SetAttr { mode: Some(0o600), ..SetAttr::default() };
    t.run(Fop::Setattr { loc: Loc::gfid(g), attr }).expect("setattr");
    assert_eq!(t.stat(g).mode & 0o7777, 0o600);
    let fd = Fd { id: FdId(1), gfid: g };
    t.run(Fop::Writev { fd, data: Bytes::from_static(b"hello"), offset: 0, flags: 0 }).expect("write");
    assert_eq!(t.stat(g).size, 5);
    assert_eq!(t.fs.count(FopKind::Stat), 0);
    // A write whose `pre` is not what is cached (the file changed behind
    // the cache's back) drops the attributes instead of trusting `post`.
    t.fs.grow(g, 100);
    t.run(Fop::Writev { fd, data: Bytes::from_static(b"x"), offset: 0, flags: 0 }).expect("write");
    assert_eq!(t.stat(g).size, 100);
    assert_eq!(t.fs.count(FopKind::Stat), 1);
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), 1);
    // A failed modifying fop drops them too.
    assert!(t.run(Fop::Fallocate { fd, mode: 0, offset: 0, len: 10 }).is_err());
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), 2);
}

#[test]
fn an_invalidation_upcall_drops_the_inode_and_is_passed_on() {
    let t = setup(&[]);
    let d = t.fs.add(Gfid::ROOT, "d", true);
    let g = t.fs.add(d, "f", false);
    t.lookup(Gfid::ROOT, "d").expect("lookup");
    t.lookup(d, "f").expect("lookup");
    assert_eq!(t.lookup(d, "missing"), Err(Errno::ENOENT));
    let ev = Event::Upcall(Upcall::Invalidate { gfid: d });
    assert_eq!(t.md.notify(ev.clone(), EventFrom::Child(0)), Some(ev));
    assert_eq!(t.dump("invalidations"), 1);
    // d's attributes and the entries under it are gone; f's attributes stay.
    t.stat(d);
    assert_eq!(t.fs.count(FopKind::Stat), 1);
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), 1);
    let lookups = t.fs.count(FopKind::Lookup);
    assert_eq!(t.lookup(d, "missing"), Err(Errno::ENOENT));
    assert_eq!(t.fs.count(FopKind::Lookup), lookups + 1);
    // A null gfid drops everything; graph events are not passed up.
    t.md.notify(Event::Upcall(Upcall::Invalidate { gfid: Gfid::NULL }), EventFrom::Child(0));
    assert_eq!((t.dump("inodes"), t.dump("dentries")), (0, 0));
    assert_eq!(t.md.notify(Event::ParentUp, EventFrom::Graph), None);
}

#[test]
fn the_upcall_reaches_the_parents_through_the_graph_sink() {
    // md-cache over a child whose sink it is linked to, and a hook above.
    let fs = Fs::new();
    let t = setup_over(&[], fs.clone(), fs);
    let child_sink = EventSink::new();
    let top_sink = EventSink::new();
    let seen: Arc<Mutex<Vec<Event>>> = Arc::default();
    let s = seen.clone();
    top_sink.set_hook(move |e| s.lock().push(e.clone()));
    let md: Arc<dyn Xlator> = t.md.clone();
    child_sink.attach_parent(Arc::downgrade(&md), 0, top_sink);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    child_sink.send(Event::Upcall(Upcall::Invalidate { gfid: g }));
    assert_eq!(*seen.lock(), vec![Event::Upcall(Upcall::Invalidate { gfid: g })]);
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), 1);
}

#[test]
fn entries_expire_after_the_timeout() {
    let t = setup(&[("md-cache-timeout", "2"), ("nl-cache-timeout", "5")]);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    assert_eq!(t.lookup(Gfid::ROOT, "gone"), Err(Errno::ENOENT));
    t.clock.advance(2 * SEC - 1);
    t.stat(g);
    assert_eq!(t.getx(g, SELINUX), Err(Errno::ENODATA));
    assert_eq!((t.fs.count(FopKind::Stat), t.fs.count(FopKind::Getxattr)), (0, 0));
    t.clock.advance(1);
    t.stat(g);
    assert_eq!(t.getx(g, SELINUX), Err(Errno::ENODATA));
    assert_eq!((t.fs.count(FopKind::Stat), t.fs.count(FopKind::Getxattr)), (1, 1));
    assert_eq!(t.dump("stat-misses"), 1);
    // The negative entry has its own, longer timeout.
    let lookups = t.fs.count(FopKind::Lookup);
    assert_eq!(t.lookup(Gfid::ROOT, "gone"), Err(Errno::ENOENT));
    assert_eq!(t.fs.count(FopKind::Lookup), lookups);
    t.clock.advance(3 * SEC);
    assert_eq!(t.lookup(Gfid::ROOT, "gone"), Err(Errno::ENOENT));
    assert_eq!(t.fs.count(FopKind::Lookup), lookups + 1);
}

#[test]
fn a_timeout_of_zero_disables_the_cache() {
    let t = setup(&[("md-cache-timeout", "0")]);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    assert!(t.fs.last(FopKind::Lookup).expect("sent").xdata.is_empty(), "no prefetch when off");
    t.stat(g);
    t.stat(g);
    assert_eq!(t.lookup(Gfid::ROOT, "n"), Err(Errno::ENOENT));
    assert_eq!(t.lookup(Gfid::ROOT, "n"), Err(Errno::ENOENT));
    assert_eq!((t.fs.count(FopKind::Stat), t.fs.count(FopKind::Lookup)), (2, 3));
    assert_eq!((t.dump("inodes"), t.dump("dentries")), (0, 0));
}

#[test]
fn the_cache_stays_within_its_bound() {
    let t = setup(&[("md-cache-max-entries", "16")]);
    let gfids: Vec<Gfid> = (0..100).map(|i| t.fs.add(Gfid::ROOT, &format!("f{i}"), false)).collect();
    for (i, _) in gfids.iter().enumerate() {
        t.lookup(Gfid::ROOT, &format!("f{i}")).expect("lookup");
        assert!(t.dump("inodes") <= 16 && t.dump("dentries") <= 16, "at {i}");
    }
    for i in 0..100 {
        assert_eq!(t.lookup(Gfid::ROOT, &format!("n{i}")), Err(Errno::ENOENT));
    }
    assert!(t.dump("dentries") <= 16);
    assert!(t.dump("evictions") > 0);
    // The most recent fill is still there.
    t.stat(gfids[99]);
    assert_eq!(t.fs.count(FopKind::Stat), 0);
    t.stat(gfids[0]);
    assert_eq!(t.fs.count(FopKind::Stat), 1);
    let st = t.md.state.lock();
    assert!(st.inode_order.len() <= 2 * 16 + 64 && st.dentry_order.len() <= 2 * 16 + 64);
}

#[test]
fn a_slow_reply_does_not_overwrite_a_newer_change() {
    let t = setup(&[]);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    // A stat wound before a setattr, answered after it: its (older)
    // attributes must not land.
    let mut req = Request::new(Fop::Stat { loc: Loc::gfid(g) });
    let old = t.fs.0.lock().attr(g);
    let plan = {
        let mut st = t.md.state.lock();
        st.inodes.get_mut(&g).expect("cached").attr = None; // force a miss
        st.plan(&mut req).expect("planned")
    };
    let attr = SetAttr { mode: Some(0o600), ..SetAttr::default() };
    t.run(Fop::Setattr { loc: Loc::gfid(g), attr }).expect("setattr");
    let mut res: FopResult = Ok(Reply::Attr(old).into());
    t.md.state.lock().after(plan, &mut res, t.clock.now_ns());
    assert_eq!(t.stat(g).mode & 0o7777, 0o600);
    assert_eq!(t.dump("stale-fills-dropped"), 1);
    // Likewise a negative lookup overtaken by a create of the name.
    let mut req = Request::new(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "late") });
    let plan = t.md.state.lock().plan(&mut req).expect("planned");
    let fop = Fop::Create { loc: Loc::entry(Gfid::ROOT, "late"), flags: 0, mode: 0o644, umask: 0, fd: FdId(1) };
    t.run(fop).expect("create");
    let mut res: FopResult = Err(Errno::ENOENT);
    t.md.state.lock().after(plan, &mut res, t.clock.now_ns());
    assert!(t.lookup(Gfid::ROOT, "late").is_ok());
    // An inode not cached and invalidated while a stat of it is in flight:
    // that stat's reply is dropped, a concurrent one of another inode lands.
    let (x, y) = (t.fs.add(Gfid::ROOT, "x", false), t.fs.add(Gfid::ROOT, "y", false));
    let mut rx = Request::new(Fop::Stat { loc: Loc::gfid(x) });
    let mut ry = Request::new(Fop::Stat { loc: Loc::gfid(y) });
    let (px, py) = {
        let mut st = t.md.state.lock();
        (st.plan(&mut rx).expect("planned"), st.plan(&mut ry).expect("planned"))
    };
    t.md.notify(Event::Upcall(Upcall::Invalidate { gfid: x }), EventFrom::Child(0));
    let ax = t.fs.0.lock().attr(x);
    let ay = t.fs.0.lock().attr(y);
    t.md.state.lock().after(px, &mut Ok(Reply::Attr(ax).into()), t.clock.now_ns());
    t.md.state.lock().after(py, &mut Ok(Reply::Attr(ay).into()), t.clock.now_ns());
    let stats = t.fs.count(FopKind::Stat);
    t.stat(y);
    assert_eq!(t.fs.count(FopKind::Stat), stats);
    t.stat(x);
    assert_eq!(t.fs.count(FopKind::Stat), stats + 1);
}

#[test]
fn statfs_is_cached_only_when_asked() {
    let t = setup(&[]);
    for _ in 0..2 {
        t.run(Fop::Statfs { loc: Loc::root() }).expect("statfs");
    }
    assert_eq!(t.fs.count(FopKind::Statfs), 2);
    let t = setup(&[("md-cache-statfs", "on")]);
    for _ in 0..2 {
        assert!(
            matches!(t.run(Fop::Statfs { loc: Loc::root() }).expect("statfs").reply, Reply::Statfs(s) if s.blocks == 7)
        );
    }
    assert_eq!(t.fs.count(FopKind::Statfs), 1);
}

#[test]
fn forget_and_reconfigure() {
    let t = setup(&[]);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    t.lookup(Gfid::ROOT, "f").expect("lookup");
    t.run(Fop::Forget { gfid: g }).expect("forget");
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), 1);
    assert_eq!(t.fs.count(FopKind::Forget), 1);
    let o = Options::resolve(OPTIONS, [("md-cache-timeout", "0"), ("cache-selinux", "off")]).expect("options");
    t.md.reconfigure(&o).expect("reconfigure");
    assert_eq!((t.dump("inodes"), t.dump("dentries")), (0, 0));
    t.stat(g);
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), 3);
    // cache-invalidation on without a timeout given: 600 s.
    let o = Options::resolve(OPTIONS, [("cache-invalidation", "on")]).expect("options");
    t.md.reconfigure(&o).expect("reconfigure");
    t.stat(g);
    t.clock.advance(599 * SEC);
    t.stat(g);
    assert_eq!(t.fs.count(FopKind::Stat), 4);
    let o = Options::resolve(OPTIONS, [("cache-invalidation", "on"), ("md-cache-timeout", "1")]).expect("options");
    t.md.reconfigure(&o).expect("reconfigure");
    assert_eq!(
        t.md.dump().into_iter().find(|(k, _)| k == "md-cache-timeout").map(|(_, v)| v).as_deref(),
        Some("1000ms")
    );
}

#[test]
fn a_known_absent_capability_stays_absent_across_writes() {
    let t = setup(&[("md-cache-timeout", "600")]);
    let g = t.fs.add(Gfid::ROOT, "f", false);
    t.lookup(Gfid::ROOT, "f").expect("lookup prefetches security.capability");
    let fd = Fd { id: FdId(3), gfid: g };
    for k in 0..3u64 {
        assert_eq!(t.getx(g, "security.capability"), Err(Errno::ENODATA));
        let w = Fop::Writev { fd, data: Bytes::from_static(b"x"), offset: k, flags: 0 };
        let _ = t.run(w);
    }
    assert_eq!(t.fs.count(FopKind::Getxattr), 0, "the kernel's capability check before each write is a cache hit");
}

#[test]
fn a_name_not_recorded_ends_the_whole_listing_of_its_directory() {
    // A directory just made is known to be empty (listed whole): lookups of
    // names it lacks are ENOENT without asking. A create in it whose entry
    // cannot be recorded (its reply raced a change of the directory) must
    // end that, or the new name reads as missing until the cache expires
    // (seen through FUSE as `mv`/`cat` of a file just written: ENOENT).
    let t = setup(&[("cache-invalidation", "on")]);
    let d = match t.run(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 }).expect("mkdir").reply {
        Reply::Entry { iatt, .. } => iatt.gfid,
        r => panic!("mkdir replied {r:?}"),
    };
    assert_eq!(t.lookup(d, "x"), Err(Errno::ENOENT), "a new directory is listed whole");
    let g = t.fs.add(d, "f", false);
    {
        let mut st = t.md.state.lock();
        let start = st.epoch;
        st.touch(d);
        let now = t.clock.now_ns();
        st.set_dentry(d, "f", Some(g), start, now);
    }
    assert_eq!(t.lookup(d, "f").expect("the name exists").gfid, g);
}
