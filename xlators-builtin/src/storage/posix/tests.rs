//! Tests of storage/posix against real directories.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use xlfs_sdk::dict::keys::GFID_REQ;
use xlfs_sdk::testing::{init_named, set_xattr, xattr};
use xlfs_sdk::{Fd, TimeSet};

use super::*;

mod entry_ops;
mod fd_table;
mod inode_fd_ops;
mod mdata;
mod xattr;

struct Env {
    _tmp: tempfile::TempDir,
    brick: PathBuf,
    outside: PathBuf,
    xl: Arc<Posix>,
    ctx: CallCtx,
    next: AtomicU64,
}

fn options(brick: &Path, extra: &[(&str, &str)]) -> Options {
    let dir = brick.display().to_string();
    let mut given: Vec<(&str, &str)> = vec![("directory", dir.as_str())];
    given.extend_from_slice(extra);
    Options::resolve(TYPE.options, given).expect("options")
}

fn init(brick: &Path, extra: &[(&str, &str)]) -> InitCtx {
    let dir = brick.display().to_string();
    let mut given: Vec<(&str, &str)> = vec![("directory", dir.as_str())];
    given.extend_from_slice(extra);
    init_named("test-posix", TYPE.options, &given, &[]).0
}

fn env_with(extra: &[(&str, &str)]) -> Env {
    let tmp = tempfile::tempdir().expect("tempdir");
    let brick = tmp.path().join("brick");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&brick).expect("brick");
    std::fs::create_dir(&outside).expect("outside");
    std::fs::write(outside.join("secret"), b"secret").expect("secret");
    let xl = Arc::new(Posix::new(init(&brick, extra)).expect("posix"));
    Env { _tmp: tmp, brick, outside, xl, ctx: CallCtx::root("test"), next: AtomicU64::new(1) }
}

fn env() -> Env {
    env_with(&[])
}

fn bytes_xdata(key: &str, v: &[u8]) -> Dict {
    let mut d = Dict::new();
    d.set_bytes(key, v.to_vec());
    d
}

fn gfid_xdata(g: Gfid) -> Dict {
    Dict::new().with(GFID_REQ, Value::Gfid(g))
}

impl Env {
    async fn runx(&self, fop: Fop, xdata: Dict) -> FopResult {
        self.xl.call(self.ctx.clone(), Request::with_xdata(fop, xdata)).await
    }
    async fn run(&self, fop: Fop) -> FopResult {
        self.runx(fop, Dict::new()).await
    }
    async fn reply(&self, fop: Fop) -> Result<Reply, Errno> {
        self.run(fop).await.map(|r| r.reply)
    }
    fn fd_id(&self) -> FdId {
        FdId(self.next.fetch_add(1, Ordering::Relaxed))
    }
    fn handle_path(&self, g: Gfid) -> PathBuf {
        self.brick.join(".glusterfs").join(handle::handle_rel(&g).to_str().expect("utf8"))
    }
    /// How many handles are parked in `.glusterfs/unlink`.
    fn parked(&self) -> usize {
        std::fs::read_dir(self.brick.join(".glusterfs/unlink")).expect("unlink dir").count()
    }
    async fn entry_of(&self, fop: Fop, xdata: Dict) -> Result<Iatt, Errno> {
        match self.runx(fop, xdata).await?.reply {
            Reply::Entry { iatt, .. } => Ok(iatt),
            r => panic!("unexpected reply {r:?}"),
        }
    }
    async fn lookup(&self, parent: Gfid, name: &str) -> Result<Iatt, Errno> {
        self.entry_of(Fop::Lookup { loc: Loc::entry(parent, name) }, Dict::new()).await
    }
    async fn stat(&self, g: Gfid) -> Result<Iatt, Errno> {
        match self.reply(Fop::Stat { loc: Loc::gfid(g) }).await? {
            Reply::Attr(a) => Ok(a),
            r => panic!("unexpected reply {r:?}"),
        }
    }
    async fn mkdir(&self, parent: Gfid, name: &str) -> Gfid {
        self.entry_of(Fop::Mkdir { loc: Loc::entry(parent, name), mode: 0o755, umask: 0 }, Dict::new())
            .await
            .expect("mkdir")
            .gfid
    }
    async fn try_create(&self, parent: Gfid, name: &str, xdata: Dict) -> Result<(Gfid, Fd), Errno> {
        let id = self.fd_id();
        let fop =
            Fop::Create { loc: Loc::entry(parent, name), flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id };
        let iatt = self.entry_of(fop, xdata).await?;
        Ok((iatt.gfid, Fd { id, gfid: iatt.gfid }))
    }
    async fn create(&self, parent: Gfid, name: &str) -> (Gfid, Fd) {
        self.try_create(parent, name, Dict::new()).await.expect("create")
    }
    async fn open(&self, g: Gfid, flags: i32) -> Result<Fd, Errno> {
        let id = self.fd_id();
        self.run(Fop::Open { loc: Loc::gfid(g), flags: flags as u32, fd: id }).await?;
        Ok(Fd { id, gfid: g })
    }
    async fn write(&self, fd: Fd, offset: u64, data: &[u8]) {
        let r = self.reply(Fop::Writev { fd, data: Bytes::copy_from_slice(data), offset, flags: 0 }).await;
        assert!(matches!(r, Ok(Reply::PrePost { .. })), "{r:?}");
    }
    async fn read(&self, fd: Fd, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        match self.reply(Fop::Readv { fd, size, offset, flags: 0 }).await? {
            Reply::Read { data, .. } => Ok(data.to_vec()),
            r => panic!("unexpected reply {r:?}"),
        }
    }
    async fn release(&self, fd: Fd) {
        self.run(Fop::Release { fd }).await.expect("release");
    }
    async fn opendir(&self, g: Gfid) -> Fd {
        let id = self.fd_id();
        self.run(Fop::Opendir { loc: Loc::gfid(g), fd: id }).await.expect("opendir");
        Fd { id, gfid: g }
    }
    async fn readdir(&self, fd: Fd, size: u32, offset: u64, plus: bool) -> Vec<DirEntry> {
        let fop = if plus { Fop::Readdirp { fd, size, offset } } else { Fop::Readdir { fd, size, offset } };
        match self.reply(fop).await.expect("readdir") {
            Reply::Dirents(d) => d,
            r => panic!("unexpected reply {r:?}"),
        }
    }
    /// The whole listing, in calls of `size`.
    async fn list(&self, dir: Gfid, size: u32, plus: bool) -> Vec<DirEntry> {
        let fd = self.opendir(dir).await;
        let (mut all, mut off) = (Vec::new(), 0);
        loop {
            let batch = self.readdir(fd, size, off, plus).await;
            let Some(last) = batch.last() else { break };
            off = last.d_off;
            all.extend(batch);
            assert!(all.len() < 100_000, "listing does not end");
        }
        self.run(Fop::Releasedir { fd }).await.expect("releasedir");
        all
    }
    async fn getx(&self, loc: Loc, name: &str) -> Result<Dict, Errno> {
        match self.reply(Fop::Getxattr { loc, name: name.into() }).await? {
            Reply::Xattrs(d) => Ok(d),
            r => panic!("unexpected reply {r:?}"),
        }
    }
    async fn setx(&self, loc: Loc, key: &str, v: &[u8], flags: u32) -> Result<(), Errno> {
        self.run(Fop::Setxattr { loc, xattrs: bytes_xdata(key, v), flags }).await.map(drop)
    }
    async fn xattrop(&self, g: Gfid, op: XattropOp, key: &str, v: &[u8]) -> Result<Vec<u8>, Errno> {
        match self.reply(Fop::Xattrop { loc: Loc::gfid(g), op, xattrs: bytes_xdata(key, v) }).await? {
            Reply::Xattrs(d) => Ok(d.get_bytes(key).expect("key in reply").to_vec()),
            r => panic!("unexpected reply {r:?}"),
        }
    }
}

fn be32(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_be_bytes()).collect()
}

fn be64(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_be_bytes()).collect()
}

fn names(entries: &[DirEntry]) -> Vec<String> {
    let mut n: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    n.sort();
    n
}

#[test]
fn type_and_options() {
    assert_eq!(TYPE.name, "storage/posix");
    assert_eq!((TYPE.min_children, TYPE.max_children), (0, 0));
    for o in TYPE.options {
        assert!(!o.description.is_empty(), "{} has no description", o.name);
    }
    // The GlusterFS brick volfile's posix options are all accepted.
    let o = Options::resolve(
        TYPE.options,
        [
            ("shared-brick-count", "3"),
            ("fips-mode-rchecksum", "on"),
            ("volume-id", "76b60fc5-d0c8-4fd8-9174-bf87139f7df3"),
            ("directory", "/srv/gb/b1"),
        ],
    )
    .expect("gluster options");
    assert_eq!(o.int("max-open-fds"), Some(65536));
}

#[test]
fn init_errors_name_the_option() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (no_dir, _) = init_named("p", TYPE.options, &[], &[]);
    let e = (TYPE.build)(no_dir).err().expect("no directory").to_string();
    assert!(e.contains("'directory'") && e.contains("required"), "{e}");

    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").expect("file");
    let e = (TYPE.build)(init(&file, &[])).err().expect("a file").to_string();
    assert!(e.contains("'directory'") && e.contains("not a directory"), "{e}");
    let e = (TYPE.build)(init(&tmp.path().join("missing"), &[])).err().expect("missing").to_string();
    assert!(e.contains("'directory'"), "{e}");
}

#[test]
fn volume_id_is_set_then_checked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = "76b60fc5-d0c8-4fd8-9174-bf87139f7df3";
    let b = "11111111-2222-3333-4444-555555555555";
    (TYPE.build)(init(tmp.path(), &[("volume-id", a)])).expect("fresh brick takes the id");
    let on_disk = xattr(tmp.path(), VOLUME_ID_XATTR).expect("volume-id set");
    assert_eq!(on_disk, Gfid::parse(a).expect("uuid").0);
    (TYPE.build)(init(tmp.path(), &[("volume-id", a)])).expect("same id");
    (TYPE.build)(init(tmp.path(), &[])).expect("no id configured");
    let e = (TYPE.build)(init(tmp.path(), &[("volume-id", b)])).err().expect("mismatch").to_string();
    assert!(e.contains(a) && e.contains(b), "{e}");
    let e = (TYPE.build)(init(tmp.path(), &[("volume-id", "nope")])).err().expect("bad").to_string();
    assert!(e.contains("'volume-id'"), "{e}");
}

#[tokio::test]
async fn root_layout_on_disk() {
    let e = env();
    assert_eq!(xattr(&e.brick, GFID_XATTR), Some(Gfid::ROOT.0.to_vec()));
    let root_handle = e.handle_path(Gfid::ROOT);
    assert!(root_handle.ends_with(".glusterfs/00/00/00000000-0000-0000-0000-000000000001"));
    assert_eq!(std::fs::read_link(&root_handle).expect("root handle"), PathBuf::from("../../.."));
    let root = e.stat(Gfid::ROOT).await.expect("root");
    assert!(root.is_dir());
    assert_eq!((root.gfid, root.ino), (Gfid::ROOT, 1));
    // A second init over the same brick is fine.
    Posix::new(init(&e.brick, &[])).expect("re-init");
}

#[tokio::test]
async fn misc_fops_and_errors() {
    let e = env();
    let (_, fd) = e.create(Gfid::ROOT, "f").await;
    for fop in [
        Fop::Lk { fd, cmd: xlfs_sdk::LkCmd::GetLk, lock: xlfs_sdk::Flock::whole(xlfs_sdk::LockType::Read, 1) },
        Fop::Inodelk {
            domain: "d".into(),
            loc: Loc::root(),
            cmd: xlfs_sdk::LkCmd::SetLk,
            lock: xlfs_sdk::Flock::whole(xlfs_sdk::LockType::Write, 1),
        },
        Fop::Entrylk {
            domain: "d".into(),
            loc: Loc::root(),
            name: "x".into(),
            cmd: xlfs_sdk::EntrylkCmd::Lock,
            ty: xlfs_sdk::EntrylkType::Write,
        },
        Fop::Lease { loc: Loc::root(), cmd: xlfs_sdk::LeaseCmd::Read, lease_id: [0; 16] },
        Fop::Ipc { op: 1 },
    ] {
        assert_eq!(e.run(fop).await.err(), Some(Errno::ENOSYS));
    }
    assert!(matches!(e.reply(Fop::Fsync { fd, datasync: true }).await, Ok(Reply::PrePost { .. })));
    assert!(matches!(e.reply(Fop::Fsync { fd, datasync: false }).await, Ok(Reply::PrePost { .. })));
    assert_eq!(e.reply(Fop::Flush { fd }).await, Ok(Reply::Empty));
    assert_eq!(e.reply(Fop::Forget { gfid: fd.gfid }).await, Ok(Reply::Empty));
    let dfd = e.opendir(Gfid::ROOT).await;
    assert_eq!(e.reply(Fop::Fsyncdir { fd: dfd, datasync: false }).await, Ok(Reply::Empty));
    assert_eq!(e.read(dfd, 0, 10).await.err(), Some(Errno::EISDIR));
    // Writes with O_SYNC in the fop flags.
    let r = e.reply(Fop::Writev { fd, data: Bytes::from_static(b"s"), offset: 0, flags: libc::O_SYNC as u32 }).await;
    assert!(matches!(r, Ok(Reply::PrePost { post, .. }) if post.size == 1));
    // A client going away releases its fds.
    assert_eq!(e.xl.inner.nfds.load(Ordering::Relaxed), 2);
    assert_eq!(e.xl.notify(Event::ClientGone { client_id: "someone-else".into() }, EventFrom::Graph), None);
    assert_eq!(e.xl.inner.nfds.load(Ordering::Relaxed), 2);
    e.xl.notify(Event::ClientGone { client_id: "test".into() }, EventFrom::Graph);
    assert_eq!(e.xl.inner.nfds.load(Ordering::Relaxed), 0);
    assert_eq!(e.read(fd, 0, 1).await.err(), Some(Errno::EBADF));
    assert!(e.xl.inner.open.lock().is_empty());
}

#[test]
fn parent_up_reports_child_up() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ctx = init(tmp.path(), &[]);
    let sink = ctx.events.clone();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    sink.set_hook(move |ev| s.lock().push(ev.clone()));
    let xl = Posix::new(ctx).expect("posix");
    assert_eq!(xl.notify(Event::ParentUp, EventFrom::Graph), None);
    assert_eq!(seen.lock().as_slice(), &[Event::ChildUp]);
    xl.notify(Event::ParentDown, EventFrom::Graph);
    assert_eq!(seen.lock().last(), Some(&Event::ChildDown));
}

#[test]
fn reconfigure_changes_limits_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let xl = Posix::new(init(tmp.path(), &[])).expect("posix");
    xl.reconfigure(&options(tmp.path(), &[("max-open-fds", "7"), ("shared-brick-count", "4")])).expect("reconfigure");
    assert_eq!(xl.inner.max_fds.load(Ordering::Relaxed), 7);
    assert_eq!(xl.inner.shared.load(Ordering::Relaxed), 4);
    let other = tempfile::tempdir().expect("tempdir");
    assert!(matches!(xl.reconfigure(&options(other.path(), &[])), Err(ReconfigureError::Unsupported)));
    let dump = xl.dump();
    assert!(dump.iter().any(|(k, v)| k == "max-open-fds" && v == "7"), "{dump:?}");
}

#[test]
fn only_fops_that_stay_in_the_page_cache_run_inline() {
    let f = Loc::entry(Gfid::ROOT, "f");
    let unlink = Fop::Unlink { loc: f.clone(), flags: 0 };
    // A removed file is freed by the purge thread only with unlink-behind.
    assert!(inline_ok(&unlink, || true));
    assert!(!inline_ok(&unlink, || false), "an unlink frees the file in the fop");
    let create = |flags: i32| Fop::Create { loc: f.clone(), flags: flags as u32, mode: 0o644, umask: 0, fd: FdId(1) };
    let open = |flags: i32| Fop::Open { loc: f.clone(), flags: flags as u32, fd: FdId(1) };
    let inline = [
        Fop::Stat { loc: f.clone() },
        Fop::Mkdir { loc: f.clone(), mode: 0o755, umask: 0 },
        Fop::Setattr { loc: f.clone(), attr: SetAttr { mode: Some(0o600), ..SetAttr::default() } },
        create(libc::O_WRONLY | libc::O_EXCL),
        create(libc::O_WRONLY | libc::O_TRUNC | libc::O_EXCL),
        open(libc::O_RDWR),
    ];
    for fop in &inline {
        assert!(inline_ok(fop, || false), "{fop:?} stays in cached metadata");
    }
    let blocking = [
        Fop::Truncate { loc: f.clone(), offset: 0 },
        Fop::Rename { old: f.clone(), new: Loc::entry(Gfid::ROOT, "g"), flags: 0 },
        Fop::Rmdir { loc: f.clone(), flags: 0 },
        Fop::Fsync { fd: Fd::default(), datasync: true },
        // Truncating an existing file frees its blocks.
        create(libc::O_WRONLY | libc::O_TRUNC),
        open(libc::O_WRONLY | libc::O_TRUNC),
    ];
    for fop in &blocking {
        assert!(!inline_ok(fop, || true), "{fop:?} may wait for the disk");
    }
}

#[test]
fn fops_run_without_a_tokio_runtime() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let xl = Posix::new(init(tmp.path(), &[])).expect("posix");
    let fut = xl.call(CallCtx::root("x"), Request::new(Fop::Stat { loc: Loc::root() }));
    // A minimal executor: the future completes on first poll.
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut fut = fut;
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Ok(Response { reply: Reply::Attr(a), .. })) => assert_eq!(a.gfid, Gfid::ROOT),
        other => panic!("{other:?}"),
    }
}

/// A tmpfs of a given size mounted for one test (root only), detached on
/// every exit path.
struct SmallFs {
    dir: tempfile::TempDir,
    /// The image of a loop-mounted file system (dropped after the mount).
    _image: Option<tempfile::TempDir>,
}

impl SmallFs {
    fn mount(size: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = |s: &str| CString::new(s).expect("cstr");
        let (src, at, data) = (c("tmpfs"), c(dir.path().to_str().expect("utf-8")), c(&format!("size={size}")));
        // SAFETY: valid strings; mounting over our own empty temp dir.
        let r = unsafe { libc::mount(src.as_ptr(), at.as_ptr(), src.as_ptr(), 0, data.as_ptr().cast()) };
        (r == 0).then_some(SmallFs { dir, _image: None })
    }

    /// An ext4 of `mib` MiB with inodes of `inode_size` bytes, loop-mounted
    /// (None without root, `mkfs.ext4` or loop devices).
    fn ext4(mib: u64, inode_size: u32) -> Option<SmallFs> {
        let image = tempfile::tempdir().expect("tempdir");
        let img = image.path().join("fs.img");
        std::fs::File::create(&img).and_then(|f| f.set_len(mib << 20)).expect("image");
        let run = |cmd: &mut std::process::Command| cmd.output().is_ok_and(|o| o.status.success());
        let size = inode_size.to_string();
        if !run(std::process::Command::new("mkfs.ext4").args(["-q", "-F", "-I", &size]).arg(&img)) {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        run(std::process::Command::new("mount").args(["-o", "loop"]).arg(&img).arg(dir.path()))
            .then_some(SmallFs { dir, _image: Some(image) })
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let at = CString::new(self.dir.path().to_str().unwrap_or_default()).unwrap_or_default();
        // SAFETY: detaching the mount this value made.
        unsafe { libc::umount2(at.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A brick with options `opts` on a tmpfs of `size` (None, said, without
/// root).
fn on_small_fs(size: &str, opts: &[(&str, &str)]) -> Option<(SmallFs, Env)> {
    let Some(fs) = SmallFs::mount(size) else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return None;
    };
    let brick = fs.path().join("brick");
    std::fs::create_dir(&brick).expect("brick");
    let mut e = env_with(&[]);
    e.xl = Arc::new(Posix::new(init(&brick, opts)).expect("posix"));
    e.brick = brick;
    Some((fs, e))
}

fn available(path: &Path) -> u64 {
    let f = std::fs::File::open(path).expect("open");
    let v = sys::fstatvfs(f.as_fd()).expect("statvfs");
    v.f_bavail * v.f_frsize
}

#[tokio::test]
async fn the_reserve_refuses_what_takes_space_and_lets_writes_resume() {
    let Some((_fs, e)) = on_small_fs("16m", &[("reserve", "25%")]) else { return };
    let brick = e.brick.clone();
    let (g, fd) = e.create(Gfid::ROOT, "f").await;
    let mb = 1usize << 20;
    let mut written = 0u64;
    let refused = loop {
        let chunk = vec![(written >> 20) as u8; mb];
        match e.reply(Fop::Writev { fd, data: Bytes::from(chunk), offset: written, flags: 0 }).await {
            Ok(_) => written += mb as u64,
            Err(err) => break err,
        }
        assert!(written < 16 * mb as u64, "the reserve never refused a write");
    };
    assert_eq!(refused, Errno::ENOSPC);
    let left = available(&brick);
    assert!(left >= 3 * mb as u64, "the reserve (4 MiB) is kept: {left} bytes available");
    assert!(written >= 8 * mb as u64, "writes went on until the reserve: {written}");
    // What was written is intact; what makes inodes is refused too; what
    // replicate's changelog needs and deletes are not.
    let last = written - mb as u64;
    assert_eq!(e.read(fd, last, mb as u32).await.expect("read"), vec![(last >> 20) as u8; mb]);
    assert_eq!(e.try_create(Gfid::ROOT, "g", Dict::new()).await.err(), Some(Errno::ENOSPC));
    let mkdir = e.entry_of(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 }, Dict::new()).await;
    assert_eq!(mkdir.err(), Some(Errno::ENOSPC));
    let changelog = e.xattrop(g, XattropOp::AddArray, "trusted.afr.v-client-0", &be32(&[1, 0, 0])).await;
    assert!(changelog.is_ok(), "a changelog xattrop is never refused: {changelog:?}");
    // Freeing space lets writes through at once.
    assert!(e.reply(Fop::Ftruncate { fd, offset: 2 * mb as u64 }).await.is_ok());
    e.write(fd, 2 * mb as u64, &vec![9u8; mb]).await;
    // Off: writes go until the file system itself is full.
    e.xl.reconfigure(&options(&brick, &[("reserve", "0")])).expect("reconfigure");
    let mut at = 3 * mb as u64;
    let full = loop {
        match e.reply(Fop::Writev { fd, data: Bytes::from(vec![1u8; mb]), offset: at, flags: 0 }).await {
            Ok(_) => at += mb as u64,
            Err(err) => break err,
        }
        assert!(at < 32 * mb as u64, "a 16 MiB file system never filled");
    };
    assert_eq!(full, Errno::ENOSPC);
    assert!(available(&brick) < mb as u64, "with no reserve the file system fills");
    assert!(matches!(
        e.xl.reconfigure(&options(&brick, &[("reserve", "lots")])),
        Err(ReconfigureError::Invalid(m)) if m.contains("'reserve'")
    ));
    e.release(fd).await;
}

/// Creates `name` in the root with `mbs` MiB (chunk k filled with k).
async fn fill_mb(e: &Env, name: &str, mbs: usize) -> Gfid {
    let (g, fd) = e.create(Gfid::ROOT, name).await;
    for k in 0..mbs {
        let data = Bytes::from(vec![k as u8; 1 << 20]);
        e.reply(Fop::Writev { fd, data, offset: (k << 20) as u64, flags: 0 }).await.expect("write");
    }
    e.release(fd).await;
    g
}

/// `unlink-behind`: an unlinked closed file is freed by the brick's purge
/// thread, not in the unlink; a write that finds no room while files wait
/// frees them and goes through; off, the unlink frees the file.
#[tokio::test]
async fn unlinked_files_are_freed_behind_and_before_a_write_runs_out_of_room() {
    let Some((_fs, e)) = on_small_fs("16m", &[("reserve", "0"), ("unlink-behind", "on")]) else { return };
    let brick = e.brick.clone();
    let mb = 1usize << 20;
    let unlink = |name: &'static str| Fop::Unlink { loc: Loc::entry(Gfid::ROOT, name), flags: 0 };

    e.xl.inner.brick.purge_pause(true);
    let a = fill_mb(&e, "a", 12).await;
    e.run(unlink("a")).await.expect("unlink");
    assert_eq!(e.xl.inner.brick.purge_pending(), 1, "a waits for the purge thread");
    assert_eq!(e.parked(), 0, "by a descriptor: no name left for a");
    assert_eq!(e.stat(a).await.err(), Some(Errno::ENOENT), "gone by gfid at once");
    assert!(available(&brick) <= 4 * mb as u64, "not freed yet: {}", available(&brick));
    // 8 MiB more do not fit until a is freed: the write that finds no
    // room frees it and goes on.
    let b = fill_mb(&e, "b", 8).await;
    assert_eq!(e.xl.inner.brick.purge_pending(), 0, "a freed for the write");
    assert_eq!(e.xl.inner.brick.purge_held(), 0);
    assert_eq!(e.stat(b).await.expect("b").size, 8 * mb as u64);
    // The thread frees what it is given.
    e.xl.inner.brick.purge_pause(false);
    e.run(unlink("b")).await.expect("unlink");
    xlfs_sdk::testing::until("b freed by the purge thread", std::time::Duration::from_secs(10), || {
        e.parked() == 0 && available(&brick) > 12 * mb as u64
    })
    .await;
    // Off: the unlink frees the file itself.
    e.xl.reconfigure(&options(&brick, &[("reserve", "0"), ("unlink-behind", "off")])).expect("reconfigure");
    e.xl.inner.brick.purge_pause(true);
    fill_mb(&e, "c", 2).await;
    e.run(unlink("c")).await.expect("unlink");
    assert_eq!(e.parked(), 0);
    assert_eq!(e.xl.inner.brick.purge_pending(), 0);
}

/// An unlinked file whose handle cannot be opened for want of a
/// descriptor is parked, never left with its handle in place.
#[tokio::test]
async fn an_unlink_without_a_descriptor_to_spare_parks_the_file() {
    if std::env::var_os("NEXTEST").is_none() {
        // The limit is the process's: tests sharing it would fail at random.
        eprintln!("skipped: lowers the process's open-file limit; runs under cargo nextest (a process per test)");
        return;
    }
    let e = env_with(&[("unlink-behind", "on")]);
    e.xl.inner.brick.purge_pause(true);
    let (g, fd) = e.create(Gfid::ROOT, "f").await;
    e.release(fd).await;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit on a valid struct; this test's
    // process is its own (nextest, checked above).
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    // No new descriptor at all (the limit bounds descriptor numbers).
    let low = libc::rlimit { rlim_cur: 0, rlim_max: lim.rlim_max };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let r = e.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "f"), flags: 0 }).await;
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    r.expect("unlink");
    assert_eq!(e.parked(), 1, "parked for want of a descriptor");
    assert_eq!(e.stat(g).await.err(), Some(Errno::ENOENT));
    e.xl.inner.brick.purge_pause(false);
    xlfs_sdk::testing::until("freed", std::time::Duration::from_secs(10), || e.parked() == 0).await;
}

/// Past the files it may keep by descriptors (`MAX_HELD`, or an eighth
/// of the open-file limit), an unlinked file's handle is
/// parked in `unlink/` instead; the thread frees both kinds, and none of
/// them is reachable by gfid meanwhile.
#[tokio::test]
async fn past_the_held_descriptors_unlinked_files_are_parked() {
    let e = env_with(&[("unlink-behind", "on")]);
    e.xl.inner.brick.purge_pause(true);
    let held = e.xl.inner.brick.purge_max_held();
    assert!(held > 0 && held <= super::purge::MAX_HELD);
    let n = held + 2;
    let mut gfids = Vec::new();
    for i in 0..n {
        let (g, fd) = e.create(Gfid::ROOT, &format!("f{i}")).await;
        e.release(fd).await;
        gfids.push(g);
    }
    for i in 0..n {
        e.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, format!("f{i}")), flags: 0 }).await.expect("unlink");
    }
    assert_eq!(e.xl.inner.brick.purge_pending(), n);
    assert_eq!(e.parked(), 2, "the two past the held descriptors are parked");
    for g in [gfids[0], gfids[n - 1]] {
        assert_eq!(e.stat(g).await.err(), Some(Errno::ENOENT), "held or parked, gone by gfid");
        assert!(!e.handle_path(g).exists(), "{g}'s handle is gone from its handle directory");
    }
    assert_eq!(e.xl.inner.brick.purge_held(), held);
    e.xl.inner.brick.purge_pause(false);
    xlfs_sdk::testing::until("all freed by the purge thread", std::time::Duration::from_secs(30), || {
        e.xl.inner.brick.purge_pending() == 0 && e.parked() == 0
    })
    .await;
    // Freed, the held descriptors' places are free again.
    assert_eq!(e.xl.inner.brick.purge_held(), 0);
    e.xl.inner.brick.purge_pause(true);
    let (_, fd) = e.create(Gfid::ROOT, "again").await;
    e.release(fd).await;
    e.run(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "again"), flags: 0 }).await.expect("unlink");
    assert_eq!((e.parked(), e.xl.inner.brick.purge_held()), (0, 1), "held again, not parked");
    e.xl.inner.brick.purge_pause(false);
}

/// The brick tells whether a file's xattrs fit in its inodes: on tmpfs
/// (in memory) they do; on an ext4 with 128-byte inodes (no room for
/// xattrs in the inode) they take a block; with 256 (mkfs.ext4's default)
/// or 512-byte inodes they fit.
#[test]
fn the_brick_tells_whether_a_files_xattrs_fit_in_its_inode() {
    let Some(tmpfs) = SmallFs::mount("4m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let dir = |fs: &SmallFs| std::fs::File::open(fs.path()).expect("open the file system's root");
    assert_eq!(handle::xattrs_fit_in_inode(dir(&tmpfs).as_fd()), Some(true), "tmpfs");
    let brick = tmpfs.path().join("brick");
    std::fs::create_dir(&brick).expect("brick");
    let xl = Posix::new(init(&brick, &[])).expect("posix");
    assert!(xl.dump().contains(&("xattrs-in-inode".to_string(), "true".to_string())), "{:?}", xl.dump());
    let Some(small) = SmallFs::ext4(8, 128) else {
        eprintln!("skipped: no mkfs.ext4 or loop devices");
        return;
    };
    assert_eq!(handle::xattrs_fit_in_inode(dir(&small).as_fd()), Some(false), "ext4 with 128-byte inodes");
    let Some(usual) = SmallFs::ext4(8, 256) else { return };
    assert_eq!(handle::xattrs_fit_in_inode(dir(&usual).as_fd()), Some(true), "ext4 with 256-byte inodes");
    let Some(roomy) = SmallFs::ext4(8, 512) else { return };
    assert_eq!(handle::xattrs_fit_in_inode(dir(&roomy).as_fd()), Some(true), "ext4 with 512-byte inodes");
}

/// On ext4 with 256-byte inodes a file keeps its xattrs in its inode all
/// along the usual life of a small file (create, write, close): the gfid
/// and replicate's dirty counter while it is written, the gfid and its
/// compact times at rest. Times written while the counter is raised (a
/// file open for long) take a block, which goes once the counter is back
/// at zero and the file is closed (at once if it is not open).
#[tokio::test]
async fn a_file_keeps_its_xattrs_in_a_256_byte_inode() {
    let Some(fs) = SmallFs::ext4(8, 256) else {
        eprintln!("skipped: no mkfs.ext4, loop devices or root");
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let brick = fs.path().join("brick");
    std::fs::create_dir(&brick).expect("brick");
    let outside = tmp.path().to_path_buf();
    let xl = Arc::new(Posix::new(init(&brick, &[])).expect("posix"));
    let e = Env { _tmp: tmp, brick: brick.clone(), outside, xl, ctx: CallCtx::root("test"), next: AtomicU64::new(1) };
    let made = Timespec { sec: 1_700_000_000, nsec: 123_456_789 };
    let stamp = || Dict::new().with(crate::storage::posix::mdata::UTIME, Value::U64(made.to_nanos()));
    let (g, fd) = e.try_create(Gfid::ROOT, "f", stamp()).await.expect("create");
    let f = brick.join("f");
    // In file system blocks (mkfs makes 1 KiB blocks on a small image).
    let blocks = || {
        let m = std::fs::symlink_metadata(&f).expect("stat f");
        m.blocks() * 512 / m.blksize()
    };
    let times = || xattr(&f, crate::storage::posix::mdata::MDATA_XATTR);
    let dirty = "trusted.afr.dirty";
    assert_eq!(times(), None, "a new file's times wait for its first write and close");
    assert_eq!(e.stat(g).await.expect("stat").mtime, made, "and are answered meanwhile");
    assert_eq!(e.xattrop(g, XattropOp::AddArray, dirty, &be32(&[1, 0, 0])).await.expect("pre-op"), be32(&[1, 0, 0]));
    let w = Fop::Writev { fd, data: Bytes::from_static(b"data"), offset: 0, flags: 0 };
    e.runx(w, stamp()).await.expect("write");
    assert_eq!(blocks(), 1, "the data block only: the gfid and the raised counter are in the inode");
    assert_eq!(e.xattrop(g, XattropOp::AddArray, dirty, &be32(&[-1, 0, 0])).await.expect("post-op"), be32(&[0, 0, 0]));
    assert_eq!(xattr(&f, dirty), Some(be32(&[0, 0, 0])), "kept while the file is open");
    e.release(fd).await;
    assert_eq!(xattr(&f, dirty), None, "a counter back at zero is removed at the last close");
    assert_eq!(times().map(|t| t.len()), Some(crate::storage::posix::mdata::COMPACT_LEN), "then the times are written");
    assert_eq!(blocks(), 1, "the data block only: the gfid and the times are in the inode");
    // A counter raised beside the times takes a block; back at zero on a
    // file not open, it is removed at once, and the block goes.
    e.xattrop(g, XattropOp::AddArray, dirty, &be32(&[0, 1, 0])).await.expect("pre-op");
    assert_eq!(blocks(), 2, "gfid, times and counter do not fit: the test tells the cases apart");
    e.xattrop(g, XattropOp::AddArray, dirty, &be32(&[0, -1, 0])).await.expect("post-op");
    assert_eq!((xattr(&f, dirty), blocks()), (None, 1));
    // A counter left raised (a copy blamed) stays, open or not.
    let fd = e.open(g, libc::O_RDWR).await.expect("open");
    let blame = "trusted.afr.test-client-1";
    e.xattrop(g, XattropOp::AddArray, blame, &be32(&[1, 0, 0])).await.expect("blame");
    e.release(fd).await;
    assert_eq!(xattr(&f, blame), Some(be32(&[1, 0, 0])));
}
