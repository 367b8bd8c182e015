//! The brick on disk: its root, the `.glusterfs` gfid handles, and how a
//! gfid or a (parent, name) pair is resolved to an inode without ever
//! leaving the brick directory.
//!
//! Layout (as GlusterFS): every inode has a `trusted.gfid` xattr (16 raw
//! bytes); `.glusterfs/xx/yy/<gfid>` (xx, yy the first two gfid bytes in hex)
//! is a hard link to each non-directory and a symlink to
//! `../../xx/yy/<parent-gfid>/<name>` for each directory; the root's handle
//! `.glusterfs/00/00/00000000-0000-0000-0000-000000000001` points to
//! `../../..`.
//!
//! Safety: names a client chose are only ever the last component of an `*at`
//! call that does not follow symlinks. Directory handles are followed either
//! by `openat2(RESOLVE_BENEATH)` on the brick root, which the kernel keeps
//! inside the brick, or (when `openat2` is unavailable or the chain is too
//! deep) by reading the handle symlinks ourselves and descending from the
//! root one `O_NOFOLLOW` name at a time. Either way the directory found must
//! carry the gfid asked for.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};
use xlfs_sdk::dict::keys::GFID_XATTR;
use xlfs_sdk::{Errno, Gfid};

use super::purge::{Purger, Work};
use super::sys::{self, Sys, Target, cstr};

/// The hidden directory that holds gfid handles.
pub(crate) const HIDDEN: &str = ".glusterfs";
/// Under [`HIDDEN`]: the handles of files unlinked while open, kept there
/// until their last close (GlusterFS: `.glusterfs/unlink`) and emptied at
/// brick start, when no fd can be open any more.
pub(crate) const UNLINK: &str = "unlink";
const ROOT_HANDLE_TARGET: &[u8] = b"../../..";
/// Deepest directory chain the userspace walk follows.
const MAX_DEPTH: usize = 4096;
const STRIPES: usize = 128;

/// Why a brick directory could not be prepared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrickError {
    /// The path is not an existing directory.
    #[error("option 'directory': {} is not a directory ({source})", path.display())]
    NotADirectory {
        /// The configured path.
        path: PathBuf,
        /// What the check found.
        source: std::io::Error,
    },
    /// A setup step failed.
    #[error("brick {}: cannot {what}: {errno}", path.display())]
    Setup {
        /// The brick.
        path: PathBuf,
        /// The step.
        what: &'static str,
        /// The error.
        errno: Errno,
    },
    /// The root carries another gfid: the path is a subdirectory of some
    /// other brick.
    #[error("brick {}: root has gfid {found}, expected {}", path.display(), Gfid::ROOT)]
    RootGfid {
        /// The brick.
        path: PathBuf,
        /// The gfid found.
        found: Gfid,
    },
}

/// An inode found on the brick.
#[derive(Clone)]
pub(crate) struct Node {
    /// Its gfid.
    pub gfid: Gfid,
    /// Attributes as found (from the handle for non-directories).
    pub st: libc::stat,
    /// An open descriptor for directories; `None` for everything else
    /// (reached through its handle).
    pub dir: Option<Arc<OwnedFd>>,
    handle: CString,
}

impl Node {
    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.dir.is_some()
    }
    /// The file type bits.
    pub fn fmt(&self) -> u32 {
        self.st.st_mode & libc::S_IFMT
    }
    /// The directory's descriptor; ENOTDIR for others.
    pub fn dir_fd(&self) -> Sys<BorrowedFd<'_>> {
        self.dir.as_deref().map(AsFd::as_fd).ok_or(Errno::ENOTDIR)
    }
    /// `xx/yy/<gfid>` relative to `.glusterfs`.
    pub fn handle(&self) -> &CStr {
        &self.handle
    }
}

/// How [`Brick::lookup_entry`] resolves a name.
#[derive(Clone, Copy, Default)]
pub(crate) struct EntryOpts {
    /// The gfid to give an inode found without one.
    pub gfid_req: Option<Gfid>,
    /// Accept `.` and `..` (lookup only).
    pub dots: bool,
    /// Verify (and repair) a directory's handle symlink.
    pub check_handle: bool,
    /// The caller already holds the entry lock of this name.
    pub locked: bool,
}

/// Striped mutexes: a lock per key hash, bounded in number.
pub(crate) struct Stripes(Box<[Mutex<()>]>);

impl Stripes {
    fn new() -> Stripes {
        Stripes((0..STRIPES).map(|_| Mutex::new(())).collect())
    }
    fn index(bytes: &[&[u8]]) -> usize {
        // FNV-1a
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in bytes.iter().flat_map(|s| s.iter()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % STRIPES as u64) as usize
    }
    /// Locks the stripes of `keys` in index order (each once).
    pub fn lock_all(&self, keys: &[&[&[u8]]]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = keys.iter().map(|k| Stripes::index(k)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.0[i].lock()).collect()
    }
}

/// The brick directory and its handle store.
pub(crate) struct Brick {
    /// The configured path.
    pub path: PathBuf,
    root: Arc<OwnedFd>,
    gfs: OwnedFd,
    use_openat2: AtomicBool,
    /// Per-inode locks (xattrop, handle changes, open counts).
    pub inode_locks: Stripes,
    /// Per-entry locks (creation and gfid heal of a name).
    pub entry_locks: Stripes,
    /// Directories opened by gfid ([`DirCache`]).
    dirs: DirCache,
    /// Frees unlinked files behind the unlink (`purge.rs`), when
    /// `purge_behind` is on.
    purge: Purger,
    /// The `unlink-behind` option.
    pub purge_behind: AtomicBool,
    /// Whether a file's usual xattrs fit in its inode on this file system
    /// (None: not known), see `xattrs_fit_in_inode`.
    pub xattrs_in_inode: Option<bool>,
}

/// Most directories [`DirCache`] keeps open (two generations of half as
/// many).
pub(crate) const DIR_CACHE: usize = 1024;

/// Open descriptors of directories resolved by gfid, bounded. A directory's
/// handle is a symlink to `../../<parent's handle>/<name>`, so opening it
/// walks one symlink per level up to the root (with an `openat2` and two
/// `fstat`s around it); every entry fop resolves its parent that way. A
/// kept descriptor stays right through renames (it is the inode, which the
/// gfid names); a removed directory is dropped when its handle is removed
/// or repointed, and one found with no links left (removed behind the
/// brick's back) is resolved again.
type DirCache = super::gen_cache::GenCache<Arc<OwnedFd>>;

/// `xx/yy`: the two directories `g`'s handle is in (its first two bytes).
fn hex_dirs(g: &Gfid) -> [u8; 5] {
    let c = g.canonical();
    [c[0], c[1], b'/', c[2], c[3]]
}

/// `xx/yy/<gfid>`.
pub(crate) fn handle_rel(g: &Gfid) -> CString {
    handle_dir_path(g, &[&g.canonical()])
}

/// `xx/yy/` of `g` followed by `parts` (none holds a NUL).
fn handle_dir_path(g: &Gfid, parts: &[&[u8]]) -> CString {
    let mut rel = Vec::with_capacity(6 + parts.iter().map(|p| p.len()).sum::<usize>() + 1);
    rel.extend_from_slice(&hex_dirs(g));
    rel.push(b'/');
    for p in parts {
        rel.extend_from_slice(p);
    }
    // A formatted gfid holds no NUL.
    CString::new(rel).unwrap_or_default()
}

/// `unlink/<gfid>`: where an unlinked open file's handle waits for its last
/// close, and an unlinked closed file's for the purge thread.
pub(crate) fn parked_rel(g: &Gfid) -> CString {
    let mut rel = Vec::with_capacity(UNLINK.len() + 1 + 36 + 1);
    rel.extend_from_slice(UNLINK.as_bytes());
    rel.push(b'/');
    rel.extend_from_slice(&g.canonical());
    // A formatted gfid holds no NUL.
    CString::new(rel).unwrap_or_default()
}

/// The symlink target of a directory handle: `../../xx/yy/<parent>/<name>`.
fn dir_handle_target(parent: &Gfid, name: &[u8]) -> Sys<CString> {
    let mut t = format!("../../{}/", handle_rel(parent).to_string_lossy()).into_bytes();
    t.extend_from_slice(name);
    cstr(&t)
}

/// Parses a directory handle target into (parent gfid, name); `None` for
/// anything that is not exactly of our form.
fn parse_dir_handle(t: &[u8]) -> Option<(Gfid, &[u8])> {
    let rest = t.strip_prefix(b"../../")?;
    let (dirs, rest) = (rest.get(..6)?, rest.get(6..)?);
    let uuid = std::str::from_utf8(rest.get(..36)?).ok()?;
    let name = rest.get(36..)?.strip_prefix(b"/")?;
    let g = Gfid::parse(uuid)?;
    if dirs[..5] != hex_dirs(&g) || dirs[5] != b'/' || !valid_name(name) {
        return None;
    }
    Some((g, name))
}

/// A single path component we may create or look up: not empty, no `/` or
/// NUL, not `.` or `..`.
pub(crate) fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.iter().any(|&c| c == b'/' || c == 0)
}

/// Reads an inode's gfid xattr; `None` when absent, EIO when malformed.
pub(crate) fn read_gfid(t: Target<'_>) -> Sys<Option<Gfid>> {
    let mut buf = [0u8; 16];
    match t.getxattr_into(&gfid_key(), &mut buf) {
        Ok(16) => Ok(Some(Gfid(buf))),
        Ok(_) | Err(Errno::ERANGE) => Err(Errno::EIO),
        Err(Errno::ENODATA) => Ok(None),
        Err(e) => Err(e),
    }
}

fn gfid_key() -> CString {
    CString::new(GFID_XATTR).unwrap_or_default()
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn is_lnk(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

const DIR_FLAGS: i32 = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;

impl Brick {
    /// Opens (and on first use prepares) the brick at `path`: gives the root
    /// [`Gfid::ROOT`], creates `.glusterfs` and the root's handle.
    pub fn open(path: &Path) -> Result<Brick, BrickError> {
        let md =
            std::fs::metadata(path).map_err(|source| BrickError::NotADirectory { path: path.to_path_buf(), source })?;
        if !md.is_dir() {
            return Err(BrickError::NotADirectory {
                path: path.to_path_buf(),
                source: std::io::Error::from_raw_os_error(libc::ENOTDIR),
            });
        }
        let fail = |what: &'static str| move |errno: Errno| BrickError::Setup { path: path.to_path_buf(), what, errno };
        let cpath = cstr(path.as_os_str().as_encoded_bytes()).map_err(fail("use the path"))?;
        let cwd = at_fdcwd();
        let root =
            sys::openat(cwd, &cpath, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(fail("open the directory"))?;
        match read_gfid(Target::Fd(root.as_fd())).map_err(fail("read the root gfid"))? {
            Some(g) if g != Gfid::ROOT => return Err(BrickError::RootGfid { path: path.to_path_buf(), found: g }),
            Some(_) => {}
            None => Target::Fd(root.as_fd())
                .setxattr(&gfid_key(), &Gfid::ROOT.0, libc::XATTR_CREATE)
                .map_err(fail("set the root gfid (trusted xattrs need CAP_SYS_ADMIN)"))?,
        }
        let hidden = cstr(HIDDEN.as_bytes()).map_err(fail("name .glusterfs"))?;
        match sys::mkdirat(root.as_fd(), &hidden, 0o700) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(fail("create .glusterfs")(e)),
        }
        let gfs = sys::openat(root.as_fd(), &hidden, DIR_FLAGS, 0).map_err(fail("open .glusterfs"))?;
        match sys::mkdirat(gfs.as_fd(), &cstr(UNLINK.as_bytes()).map_err(fail("name .glusterfs/unlink"))?, 0o700) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(fail("create .glusterfs/unlink")(e)),
        }
        purge_parked(&path.join(HIDDEN).join(UNLINK));
        let purge = Purger::new(gfs.try_clone().map_err(|e| fail("open .glusterfs")(Errno::from_io(&e)))?);
        let xattrs_in_inode = xattrs_fit_in_inode(gfs.as_fd());
        if xattrs_in_inode == Some(false) {
            tracing::warn!(
                brick = %path.display(),
                "a file's xattrs at rest (gfid and times, 88 bytes in ext4's entries) do not fit in this file \
                 system's inodes: every file takes an extra 4 KiB block, written when it is made, read by every \
                 cold stat or listing and freed when it is removed; make brick file systems with inodes of at \
                 least 256 bytes (mkfs.ext4's default, -I 256; mkfs.xfs -i size=512)"
            );
        }
        let brick = Brick {
            path: path.to_path_buf(),
            root: Arc::new(root),
            gfs,
            use_openat2: AtomicBool::new(true),
            inode_locks: Stripes::new(),
            entry_locks: Stripes::new(),
            dirs: DirCache::new(DIR_CACHE),
            purge,
            purge_behind: AtomicBool::new(true),
            xattrs_in_inode,
        };
        let h = handle_rel(&Gfid::ROOT);
        match sys::readlinkat(brick.gfs.as_fd(), &h) {
            Ok(t) if t == ROOT_HANDLE_TARGET => {}
            Ok(_) => {
                sys::unlinkat(brick.gfs.as_fd(), &h, 0).map_err(fail("replace the root handle"))?;
                brick
                    .make_symlink_handle(&Gfid::ROOT, &cstr(ROOT_HANDLE_TARGET).map_err(fail("name"))?)
                    .map_err(fail("create the root handle"))?;
            }
            Err(Errno::ENOENT) => brick
                .make_symlink_handle(&Gfid::ROOT, &cstr(ROOT_HANDLE_TARGET).map_err(fail("name"))?)
                .map_err(fail("create the root handle"))?,
            Err(e) => return Err(fail("read the root handle")(e)),
        }
        Ok(brick)
    }

    /// The root directory's descriptor.
    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Directories kept open by gfid.
    pub fn dirs_cached(&self) -> usize {
        self.dirs.len()
    }

    /// The `.glusterfs` descriptor.
    pub fn gfs(&self) -> BorrowedFd<'_> {
        self.gfs.as_fd()
    }

    /// Where inode-level calls on `node` go.
    pub fn target<'a>(&'a self, node: &'a Node) -> Target<'a> {
        match &node.dir {
            Some(d) => Target::Fd(d.as_fd()),
            None => Target::At(self.gfs.as_fd(), &node.handle),
        }
    }

    /// The root as a node.
    pub fn root_node(&self) -> Sys<Node> {
        Ok(Node {
            gfid: Gfid::ROOT,
            st: sys::fstat(self.root.as_fd())?,
            dir: Some(self.root.clone()),
            handle: handle_rel(&Gfid::ROOT),
        })
    }

    /// Resolves a gfid through its handle. ENOENT when no inode has it (or
    /// a non-directory has no name left), ESTALE when what the handle leads
    /// to carries another gfid.
    pub fn resolve_gfid(&self, g: Gfid) -> Sys<Node> {
        if g == Gfid::ROOT {
            return self.root_node();
        }
        if g.is_null() {
            return Err(Errno::EINVAL);
        }
        let h = handle_rel(&g);
        if let Some(fd) = self.dirs.get(&g) {
            match sys::fstat(fd.as_fd()) {
                Ok(st) if st.st_nlink > 0 => return Ok(Node { gfid: g, st, dir: Some(fd), handle: h }),
                _ => self.dirs.remove(&g),
            }
        }
        let st = sys::fstatat(self.gfs.as_fd(), &h, 0)?;
        if is_lnk(&st) && st.st_nlink == 1 {
            // A directory handle (a symlink inode's handle is a hard link
            // to it, so it has at least two links while it has a name).
            let fd = Arc::new(self.open_dir_handle(&g, &h)?);
            let st = sys::fstat(fd.as_fd())?;
            self.dirs.put(g, fd.clone());
            return Ok(Node { gfid: g, st, dir: Some(fd), handle: h });
        }
        if is_dir(&st) || st.st_nlink <= 1 {
            return Err(Errno::ENOENT);
        }
        Ok(Node { gfid: g, st, dir: None, handle: h })
    }

    /// Resolves a non-directory whose names were all removed while it was
    /// open: its handle waits in `unlink/` ([`Brick::park_handle_if_nameless`]).
    pub fn resolve_unlinked(&self, g: Gfid) -> Sys<Node> {
        let h = parked_rel(&g);
        let st = sys::fstatat(self.gfs.as_fd(), &h, 0)?;
        if is_dir(&st) || is_lnk(&st) {
            return Err(Errno::ENOENT);
        }
        Ok(Node { gfid: g, st, dir: None, handle: h })
    }

    fn open_dir_handle(&self, g: &Gfid, h: &CStr) -> Sys<OwnedFd> {
        let fd = if self.use_openat2.load(Ordering::Relaxed) {
            let mut path = format!("{HIDDEN}/").into_bytes();
            path.extend_from_slice(h.to_bytes());
            match sys::openat2_beneath(self.root.as_fd(), &cstr(&path)?, libc::O_RDONLY | libc::O_DIRECTORY) {
                Ok(fd) => Some(fd),
                Err(Errno::ENOSYS | Errno::EPERM | Errno::E2BIG) => {
                    tracing::info!(brick = %self.path.display(), "openat2 unavailable; resolving directory handles by walking");
                    self.use_openat2.store(false, Ordering::Relaxed);
                    None
                }
                // Too deep for the kernel's symlink limit, a rename race, or
                // something trying to leave the brick: walk it ourselves.
                Err(Errno::ELOOP | Errno::EAGAIN | Errno::EXDEV) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let fd = match fd {
            Some(fd) => fd,
            None => self.walk_dir_handle(g)?,
        };
        match read_gfid(Target::Fd(fd.as_fd()))? {
            Some(found) if found == *g => Ok(fd),
            _ => Err(Errno::ESTALE),
        }
    }

    /// Resolves a directory gfid by reading the handle chain up to the root
    /// and descending with `O_NOFOLLOW` at each name.
    fn walk_dir_handle(&self, g: &Gfid) -> Sys<OwnedFd> {
        let mut names: Vec<CString> = Vec::new();
        let mut cur = *g;
        while cur != Gfid::ROOT {
            if names.len() >= MAX_DEPTH {
                return Err(Errno::ELOOP);
            }
            let target = match sys::readlinkat(self.gfs.as_fd(), &handle_rel(&cur)) {
                Err(Errno::EINVAL) => return Err(Errno::ENOTDIR),
                r => r?,
            };
            let (parent, name) = parse_dir_handle(&target).ok_or(Errno::ESTALE)?;
            names.push(cstr(name)?);
            cur = parent;
        }
        let mut fd = sys::openat(self.root.as_fd(), c".", DIR_FLAGS, 0)?;
        for name in names.iter().rev() {
            fd = sys::openat(fd.as_fd(), name, DIR_FLAGS, 0)?;
        }
        Ok(fd)
    }

    /// Resolves `name` in the directory `parent` (see [`EntryOpts`]). An
    /// inode without a gfid gets one (`gfid_req` or a fresh one) and its
    /// handle; a non-directory whose handle is missing gets it back.
    pub fn lookup_entry(&self, parent: &Node, name: &str, o: EntryOpts) -> Sys<Node> {
        let pfd = parent.dir_fd()?;
        match name {
            "." if o.dots => return Ok(parent.clone()),
            ".." if o.dots => {
                if parent.gfid == Gfid::ROOT {
                    return self.root_node();
                }
                let fd = sys::openat(pfd, c"..", DIR_FLAGS, 0)?;
                let g = read_gfid(Target::Fd(fd.as_fd()))?.ok_or(Errno::ESTALE)?;
                if g == Gfid::ROOT {
                    return self.root_node();
                }
                return self.dir_node(g, Arc::new(fd));
            }
            _ => {}
        }
        if !valid_name(name.as_bytes()) {
            return Err(Errno::EINVAL);
        }
        if self.is_hidden(parent, name) {
            return Err(Errno::ENOENT);
        }
        let cname = cstr(name.as_bytes())?;
        let st = sys::fstatat(pfd, &cname, 0)?;
        let dir = if is_dir(&st) { Some(Arc::new(sys::openat(pfd, &cname, DIR_FLAGS, 0)?)) } else { None };
        let at = match &dir {
            Some(d) => Target::Fd(d.as_fd()),
            None => Target::At(pfd, &cname),
        };
        let mut found = read_gfid(at)?;
        let mut _guard = None;
        if found.is_none() && !o.locked {
            // Creators hold this lock until the new inode has its gfid.
            _guard = Some(self.entry_locks.lock_all(&[&[&parent.gfid.0, name.as_bytes()]]));
            found = read_gfid(at)?;
        }
        let (gfid, healed) = match found {
            Some(g) => (g, false),
            None => {
                let g = o.gfid_req.unwrap_or_else(Gfid::random);
                if g.is_null() || g == Gfid::ROOT {
                    return Err(Errno::EINVAL);
                }
                if self.handle_exists(&g)? {
                    tracing::warn!(gfid = %g, name, "gfid heal refused: the gfid is in use on this brick");
                    return Err(Errno::EEXIST);
                }
                at.setxattr(&gfid_key(), &g.0, libc::XATTR_CREATE)?;
                tracing::debug!(gfid = %g, name, "gave a gfid to an inode that had none");
                (g, true)
            }
        };
        match dir {
            Some(d) => {
                if (healed || o.check_handle) && gfid != Gfid::ROOT {
                    self.check_dir_handle(&gfid, &parent.gfid, name.as_bytes())?;
                }
                self.dir_node(gfid, d)
            }
            None => {
                let handle = handle_rel(&gfid);
                let hst = match sys::fstatat(self.gfs.as_fd(), &handle, 0) {
                    Err(Errno::ENOENT) => {
                        let _l = self.inode_locks.lock_all(&[&[&gfid.0]]);
                        match self.make_link_handle(&gfid, pfd, &cname) {
                            Ok(()) | Err(Errno::EEXIST) => {}
                            Err(e) => return Err(e),
                        }
                        sys::fstatat(self.gfs.as_fd(), &handle, 0)?
                    }
                    r => r?,
                };
                // From here on the inode is reached through its handle, which
                // must be the inode found by name.
                if hst.st_ino != st.st_ino || hst.st_dev != st.st_dev {
                    return Err(Errno::ESTALE);
                }
                Ok(Node { gfid, st: hst, dir: None, handle })
            }
        }
    }

    /// Makes sure a directory's handle exists and names `parent`/`name`.
    fn check_dir_handle(&self, g: &Gfid, parent: &Gfid, name: &[u8]) -> Sys<()> {
        let want = dir_handle_target(parent, name)?;
        let _l = self.inode_locks.lock_all(&[&[&g.0]]);
        match sys::readlinkat(self.gfs.as_fd(), &handle_rel(g)) {
            Ok(t) if t == want.as_bytes() => Ok(()),
            Ok(_) => {
                // Moved behind our back (or a rename could not update it):
                // repoint it, unless it still leads to a directory with this
                // gfid, i.e. the gfid is duplicated (a copy made with its
                // xattrs); then the first one keeps it.
                if self.open_dir_handle(g, &handle_rel(g)).is_ok() {
                    tracing::warn!(gfid = %g, name = %String::from_utf8_lossy(name), "directory gfid is duplicated on this brick; keeping the existing handle");
                    return Ok(());
                }
                self.rewrite_dir_handle(g, parent, name)
            }
            Err(Errno::ENOENT) => self.make_dir_handle(g, parent, name),
            Err(e) => Err(e),
        }
    }

    /// A directory node from its open descriptor.
    pub fn dir_node(&self, gfid: Gfid, fd: Arc<OwnedFd>) -> Sys<Node> {
        Ok(Node { gfid, st: sys::fstat(fd.as_fd())?, dir: Some(fd), handle: handle_rel(&gfid) })
    }

    /// A non-directory node with its attributes as read from an open fd.
    pub fn file_node(&self, gfid: Gfid, st: libc::stat) -> Node {
        Node { gfid, st, dir: None, handle: handle_rel(&gfid) }
    }

    /// A non-directory node through its handle (whether or not it still has
    /// a name).
    pub fn handle_node(&self, gfid: Gfid) -> Sys<Node> {
        let handle = handle_rel(&gfid);
        let st = sys::fstatat(self.gfs.as_fd(), &handle, 0)?;
        Ok(Node { gfid, st, dir: None, handle })
    }

    /// True for `.glusterfs` in the root.
    pub fn is_hidden(&self, parent: &Node, name: &str) -> bool {
        parent.gfid == Gfid::ROOT && name == HIDDEN
    }

    /// True if a handle for `g` exists.
    pub fn handle_exists(&self, g: &Gfid) -> Sys<bool> {
        match sys::fstatat(self.gfs.as_fd(), &handle_rel(g), 0) {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes `.glusterfs/xx/yy` for `g`: the inner one first, as `xx`
    /// exists for all but a brick's first few hundred inodes, and the outer
    /// one only when that fails for its lack.
    fn handle_dirs(&self, g: &Gfid) -> Sys<()> {
        let inner = hex_dirs(g);
        let mk = |d: &[u8]| match sys::mkdirat(self.gfs.as_fd(), &cstr(d)?, 0o700) {
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(e),
        };
        match mk(&inner) {
            Err(Errno::ENOENT) => {
                mk(&inner[..2])?;
                mk(&inner)
            }
            r => r,
        }
    }

    /// Runs `make` (which creates `g`'s handle), making the handle's
    /// directories first only if it fails for their lack: after a brick's
    /// first few thousand inodes they all exist, and two mkdirs that fail
    /// with EEXIST per new inode cost a path walk and the parent's lock each.
    fn in_handle_dirs(&self, g: &Gfid, make: impl Fn() -> Sys<()>) -> Sys<()> {
        match make() {
            Err(Errno::ENOENT) => {
                self.handle_dirs(g)?;
                make()
            }
            r => r,
        }
    }

    fn make_symlink_handle(&self, g: &Gfid, target: &CStr) -> Sys<()> {
        let h = handle_rel(g);
        self.in_handle_dirs(g, || sys::symlinkat(target, self.gfs.as_fd(), &h))
    }

    /// Creates a directory's handle symlink for `parent`/`name`.
    pub fn make_dir_handle(&self, g: &Gfid, parent: &Gfid, name: &[u8]) -> Sys<()> {
        self.make_symlink_handle(g, &dir_handle_target(parent, name)?)
    }

    /// Points an existing directory handle at `parent`/`name` (atomically:
    /// a new symlink renamed over the old one).
    pub fn rewrite_dir_handle(&self, g: &Gfid, parent: &Gfid, name: &[u8]) -> Sys<()> {
        self.dirs.remove(g);
        self.handle_dirs(g)?;
        let tmp = handle_dir_path(g, &[b".", &g.canonical(), b".tmp"]);
        match sys::unlinkat(self.gfs.as_fd(), &tmp, 0) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(e),
        }
        sys::symlinkat(&dir_handle_target(parent, name)?, self.gfs.as_fd(), &tmp)?;
        sys::renameat2(self.gfs.as_fd(), &tmp, self.gfs.as_fd(), &handle_rel(g), 0)
    }

    /// Creates a non-directory's handle: a hard link to `dir`/`name`.
    pub fn make_link_handle(&self, g: &Gfid, dir: BorrowedFd<'_>, name: &CStr) -> Sys<()> {
        let h = handle_rel(g);
        self.in_handle_dirs(g, || sys::linkat(dir, name, self.gfs.as_fd(), &h))
    }

    /// Removes a handle (missing is fine).
    pub fn remove_handle(&self, g: &Gfid) -> Sys<()> {
        if *g == Gfid::ROOT {
            return Ok(());
        }
        self.dirs.remove(g);
        match sys::unlinkat(self.gfs.as_fd(), &handle_rel(g), 0) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Removes a non-directory's handle if it is the inode's last link; a
    /// handle not in its place may be parked (its file was unlinked while
    /// open, and this is its last close), and is dropped there.
    /// A regular file is left to the purge thread (`purge.rs`) when
    /// `unlink-behind` is on and its queue has room: its handle removed
    /// and a descriptor of it queued, or its handle parked.
    pub fn remove_handle_if_nameless(&self, g: &Gfid) -> Sys<()> {
        let h = handle_rel(g);
        // Every last close of a file asks, most of them for a file that has
        // names: one fstatat answers those.
        let st = match sys::fstatat(self.gfs.as_fd(), &h, 0) {
            Err(Errno::ENOENT) => return self.remove_parked(g),
            r => r?,
        };
        if st.st_nlink > 1 {
            return Ok(());
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || !self.frees_behind() {
            return if is_lnk(&st) && self.looks_like_dir_handle(g) { Ok(()) } else { self.remove_handle(g) };
        }
        if self.purge.can_hold() {
            match sys::openat(self.gfs.as_fd(), &h, libc::O_PATH | libc::O_NOFOLLOW, 0) {
                Ok(fd) => {
                    let now = sys::fstat(fd.as_fd())?;
                    if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev) || now.st_nlink > 1 {
                        // Linked or made again meanwhile: no longer nameless.
                        return Ok(());
                    }
                    sys::unlinkat(self.gfs.as_fd(), &h, 0)?;
                    self.purge.push(Work::Held(fd));
                    return Ok(());
                }
                Err(Errno::ENOENT) => return self.remove_parked(g),
                // No descriptor to spare (EMFILE, ENFILE): park it.
                Err(_) => {}
            }
        }
        sys::renameat2(self.gfs.as_fd(), &h, self.gfs.as_fd(), &parked_rel(g), 0)?;
        self.purge.push(Work::Parked(*g, st.st_ino));
        Ok(())
    }

    /// Moves the handle of a non-directory whose last name was removed
    /// while fds are open on it to `unlink/`, where it keeps the inode
    /// (and gfid-based calls find it) until the last close
    /// ([`Brick::remove_handle_if_nameless`]); a brick that stops first finds it there
    /// at its next start and drops it. Nothing to do when a name is left.
    pub fn park_handle_if_nameless(&self, g: &Gfid) -> Sys<()> {
        match sys::fstatat(self.gfs.as_fd(), &handle_rel(g), 0) {
            Ok(st) if st.st_nlink <= 1 && !is_dir(&st) && !is_lnk(&st) => {
                sys::renameat2(self.gfs.as_fd(), &handle_rel(g), self.gfs.as_fd(), &parked_rel(g), 0)
            }
            Ok(_) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// How many unlinked files wait for the purge thread.
    pub fn purge_pending(&self) -> usize {
        self.purge.pending()
    }

    /// Whether a file that loses its last name now goes to the purge
    /// thread (`unlink-behind` on and room in its queue) rather than being
    /// freed by the fop that removed the name.
    pub fn frees_behind(&self) -> bool {
        self.purge_behind.load(Ordering::Relaxed) && self.purge.has_room()
    }

    /// Frees every unlinked file waiting for the purge thread, now.
    pub fn purge_now(&self) {
        self.purge.now();
    }

    #[cfg(test)]
    pub fn purge_pause(&self, on: bool) {
        self.purge.pause(on);
    }

    #[cfg(test)]
    pub fn purge_max_held(&self) -> usize {
        self.purge.max_held()
    }

    #[cfg(test)]
    pub fn purge_held(&self) -> usize {
        self.purge.held()
    }

    /// Puts a parked handle back in its place (nothing parked is fine):
    /// the file has a name again.
    pub fn unpark_handle(&self, g: &Gfid) -> Sys<()> {
        match sys::fstatat(self.gfs.as_fd(), &parked_rel(g), 0) {
            Ok(_) => {
                self.handle_dirs(g)?;
                sys::renameat2(self.gfs.as_fd(), &parked_rel(g), self.gfs.as_fd(), &handle_rel(g), 0)
            }
            Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Drops a parked handle (missing is fine): the file's last fd closed.
    fn remove_parked(&self, g: &Gfid) -> Sys<()> {
        match sys::unlinkat(self.gfs.as_fd(), &parked_rel(g), 0) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn looks_like_dir_handle(&self, g: &Gfid) -> bool {
        sys::readlinkat(self.gfs.as_fd(), &handle_rel(g)).is_ok_and(|t| parse_dir_handle(&t).is_some())
            && matches!(read_gfid(Target::At(self.gfs.as_fd(), &handle_rel(g))), Ok(None))
    }

    #[cfg(test)]
    pub fn force_walk(&self) {
        self.use_openat2.store(false, Ordering::Relaxed);
    }
}

/// Whether the xattrs a replicated file carries at rest (its gfid and its
/// times; replicate's counters are removed when they return to zero) fit
/// in an inode of the file system holding `dir`: set on an unnamed file,
/// they fit if the file still has no block (ext4 counts an external xattr
/// block in `st_blocks`). None when it cannot be told (no `O_TMPFILE`, no
/// trusted xattrs).
pub(crate) fn xattrs_fit_in_inode(dir: BorrowedFd<'_>) -> Option<bool> {
    let f = sys::openat(dir, c".", libc::O_TMPFILE | libc::O_RDWR, 0o600).ok()?;
    let t = Target::Fd(f.as_fd());
    t.setxattr(&gfid_key(), &[1u8; 16], 0).ok()?;
    t.setxattr(super::mdata::MDATA_C, &[1u8; super::mdata::COMPACT_LEN], 0).ok()?;
    Some(t.stat().ok()?.st_blocks == 0)
}

/// Empties `unlink/` at brick start: what a brick that stopped (or
/// crashed) with unlinked files open left there. Logged, never fatal.
fn purge_parked(dir: &Path) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list the handles of unlinked files");
            return;
        }
    };
    let (mut dropped, mut bytes) = (0u64, 0u64);
    for e in entries.flatten() {
        let size = e.metadata().map_or(0, |m| m.len());
        match std::fs::remove_file(e.path()) {
            Ok(()) => (dropped, bytes) = (dropped + 1, bytes + size),
            Err(err) => {
                tracing::warn!(path = %e.path().display(), error = %err, "cannot drop a left-over unlinked file")
            }
        }
    }
    if dropped > 0 {
        tracing::info!(dir = %dir.display(), files = dropped, bytes, "dropped files unlinked before the brick last stopped (open then, or waiting to be freed)");
    }
}

/// `AT_FDCWD` as a borrowed descriptor, to open the configured absolute path.
fn at_fdcwd() -> BorrowedFd<'static> {
    // SAFETY: AT_FDCWD is a sentinel the *at calls accept in place of a
    // descriptor; it is never closed.
    unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_handle_targets_round_trip() {
        let p = Gfid::random();
        let t = dir_handle_target(&p, b"some name").expect("target");
        assert_eq!(parse_dir_handle(t.as_bytes()), Some((p, &b"some name"[..])));
        assert_eq!(parse_dir_handle(ROOT_HANDLE_TARGET), None);
        for bad in [&b"../../00/00/00000000-0000-0000-0000-000000000001/.."[..], b"/etc/passwd", b"../../zz/00/x/y"] {
            assert_eq!(parse_dir_handle(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        let wrong_dirs = format!("../../ff/ff/{p}/x");
        assert_eq!(parse_dir_handle(wrong_dirs.as_bytes()), None);
    }

    #[test]
    fn names() {
        for ok in ["a", "a b", "...", ".x"] {
            assert!(valid_name(ok.as_bytes()), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
            assert!(!valid_name(bad.as_bytes()), "{bad:?}");
        }
    }
}
