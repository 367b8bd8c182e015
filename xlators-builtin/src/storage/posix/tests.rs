//! Tests of storage/posix against real directories.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use xlfs_sdk::dict::keys::GFID_REQ;
use xlfs_sdk::{Fd, TimeSet};

use super::*;

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
    InitCtx { name: "test-posix".into(), options: options(brick, extra), children: vec![], events: EventSink::new() }
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

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let n = CString::new(name).expect("name");
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid strings and a buffer of the given length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

fn set_xattr(path: &Path, name: &str, v: &[u8]) {
    let p = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let n = CString::new(name).expect("name");
    // SAFETY: valid strings and a value of the given length.
    let r = unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    assert_eq!(r, 0, "setxattr {}", path.display());
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
    let no_dir = InitCtx {
        name: "p".into(),
        options: Options::resolve(TYPE.options, []).expect("options"),
        children: vec![],
        events: EventSink::new(),
    };
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
    assert_eq!(e.lookup(Gfid::ROOT, "closed").await.expect("new").gfid, src);
    e.reply(Fop::Rename { old: Loc::entry(Gfid::ROOT, "closed"), new: Loc::entry(Gfid::ROOT, "open"), flags: 0 })
        .await
        .expect("rename over open");
    assert!(e.handle_path(open).exists(), "an open file keeps its handle");
    assert_eq!(e.read(o, 0, 100).await.expect("read"), b"still here");
    e.release(o).await;
    assert!(std::fs::symlink_metadata(e.handle_path(open)).is_err());
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

#[tokio::test]
async fn xattrs_and_their_protection() {
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
    // Wrapping, like the C code's 32-bit arithmetic.
    let w = "trusted.wrap";
    e.xattrop(f, XattropOp::AddArray, w, &be32(&[i32::MAX])).await.expect("max");
    assert_eq!(e.xattrop(f, XattropOp::AddArray, w, &be32(&[1])).await.expect("wrap"), be32(&[i32::MIN]));

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

#[tokio::test]
async fn readdirp_returns_the_requested_xattrs_of_each_entry() {
    let e = env();
    let d = e.mkdir(Gfid::ROOT, "d").await;
    e.create(d, "plain").await;
    e.create(d, "tagged").await;
    e.mkdir(d, "sub").await;
    set_xattr(&e.brick.join("d/tagged"), "user.tag", b"t1");
    set_xattr(&e.brick.join("d/sub"), "user.tag", b"s1");
    set_xattr(&e.brick.join("d/sub"), "user.other", b"o");
    let ask = Dict::new().with("user.tag", Value::U64(0)).with("user.absent", Value::U64(0));
    let fd = e.opendir(d).await;
    let rsp = e.runx(Fop::Readdirp { fd, size: 1 << 20, offset: 0 }, ask.clone()).await.expect("readdirp");
    let Reply::Dirents(entries) = &rsp.reply else { panic!("{:?}", rsp.reply) };
    assert_eq!(names(entries), [".", "..", "plain", "sub", "tagged"]);
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
    assert!(e.handle_path(f).exists(), "open file's handle must stay");
    assert_eq!(e.lookup(Gfid::ROOT, "f").await.err(), Some(Errno::ENOENT));
    assert_eq!(e.stat(f).await.err(), Some(Errno::ENOENT), "no name left");
    e.write(fd, 6, b" after").await;
    assert_eq!(e.read(second, 0, 100).await.expect("read"), b"before after");
    match e.reply(Fop::Fstat { fd }).await.expect("fstat") {
        Reply::Attr(a) => assert_eq!((a.gfid, a.nlink, a.size), (f, 0, 12)),
        r => panic!("{r:?}"),
    }
    e.release(fd).await;
    assert!(e.handle_path(f).exists(), "one fd is still open");
    assert_eq!(e.read(second, 0, 6).await.expect("read"), b"before");
    e.release(second).await;
    assert!(std::fs::symlink_metadata(e.handle_path(f)).is_err(), "handle must go with the last fd");
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
    // A lost directory handle (or one pointing elsewhere) is repaired by lookup.
    std::fs::remove_file(e.handle_path(outer.gfid)).expect("rm handle");
    assert_eq!(e.stat(outer.gfid).await.err(), Some(Errno::ENOENT));
    e.lookup(Gfid::ROOT, "outer").await.expect("lookup");
    assert!(e.stat(outer.gfid).await.expect("stat").is_dir());
    std::fs::rename(e.brick.join("outer"), e.brick.join("moved-by-admin")).expect("mv");
    e.lookup(Gfid::ROOT, "moved-by-admin").await.expect("lookup");
    assert!(e.stat(outer.gfid).await.expect("after repair").is_dir());
    let target = format!("../../00/00/{}/moved-by-admin", Gfid::ROOT);
    assert_eq!(std::fs::read_link(e.handle_path(outer.gfid)).expect("handle"), PathBuf::from(&target));
    // A copy made with its xattrs does not steal the handle.
    std::fs::create_dir(e.brick.join("copy")).expect("mkdir");
    set_xattr(&e.brick.join("copy"), GFID_XATTR, &outer.gfid.0);
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
    set_xattr(&e.outside, GFID_XATTR, &v1.0);
    set_xattr(&e.outside.join("other"), GFID_XATTR, &v2.0);
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
    let probe = e.brick.join("probe");
    let supported =
        std::fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(&probe).is_ok_and(|f| {
            let buf = sys::AlignedBuf::zeroed(4096).expect("buf");
            // SAFETY: an aligned 4 KiB buffer written to an open fd.
            unsafe { libc::pwrite(f.as_raw_fd(), buf.as_slice().as_ptr().cast(), 4096, 0) == 4096 }
        });
    std::fs::remove_file(&probe).expect("rm probe");
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

/// A tmpfs of a given size mounted for one test (root only), detached on
/// every exit path.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(size: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = |s: &str| CString::new(s).expect("cstr");
        let (src, at, data) = (c("tmpfs"), c(dir.path().to_str().expect("utf-8")), c(&format!("size={size}")));
        // SAFETY: valid strings; mounting over our own empty temp dir.
        let r = unsafe { libc::mount(src.as_ptr(), at.as_ptr(), src.as_ptr(), 0, data.as_ptr().cast()) };
        (r == 0).then_some(SmallFs { dir })
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

fn available(path: &Path) -> u64 {
    let f = std::fs::File::open(path).expect("open");
    let v = sys::fstatvfs(f.as_fd()).expect("statvfs");
    v.f_bavail * v.f_frsize
}

#[tokio::test]
async fn the_reserve_refuses_what_takes_space_and_lets_writes_resume() {
    let Some(fs) = SmallFs::mount("16m") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let brick = fs.path().join("brick");
    std::fs::create_dir(&brick).expect("brick");
    let mut e = env_with(&[]);
    e.xl = Arc::new(Posix::new(init(&brick, &[("reserve", "25%")])).expect("posix"));
    e.brick = brick.clone();
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
