//! storage/posix: the translator that stores a brick's files in a local
//! directory, GlusterFS's posix xlator.
//!
//! Files and directories live under their real names in the brick
//! directory; every inode carries its gfid in the `trusted.gfid` xattr and is
//! reachable by gfid through `.glusterfs/xx/yy/<gfid>` handles (the `handle`
//! submodule documents the layout and how resolution stays inside the brick).
//! `.glusterfs` is invisible to clients.
//!
//! Every fop runs its system calls on tokio's blocking pool. Per-fd state
//! (the real descriptor) is kept in bounded [`FdSlots`] keyed by the
//! caller's [`FdId`]; `max-open-fds` bounds them (EMFILE beyond). An
//! unlinked file stays readable and writable through fds open on it: its
//! handle keeps the inode until the last such fd is released.
//!
//! Conventions worth knowing:
//! - `nlink` of a non-directory does not count its handle link, so a file
//!   with one name reports 1 (and an unlinked, still open file 0).
//! - readdir and readdirp return `.` and `..` (as GlusterFS does); `d_off`
//!   is the file system's own cookie, so a listing resumes from any returned
//!   `d_off`. `size` is spent at [`ENTRY_OVERHEAD`] plus the name per entry,
//!   and at least one entry is returned while any remain.
//! - xattrop replies with the values after the change (GlusterFS does the
//!   same); a value of all zeros only reads.
//! - Lookup (and xattrop) return, in the reply xdata, the value of each
//!   request xdata key that names an xattr (`trusted.*`, `user.*`,
//!   `security.*`, `system.*`) the inode has, and [`OPEN_FD_COUNT`] if asked.
//! - Readdirp does the same per entry: when the request xdata names xattrs
//!   (at most [`MAX_DIRENT_XATTR_NAMES`] are honoured), the reply xdata
//!   carries, for each returned entry other than `.` and `..` and each of
//!   those xattrs it has, the value under
//!   [`xlfs_sdk::dict::keys::dirent_xattr`]`(name, xattr)`
//!   (`"{name}/{xattr}"`), plus
//!   [`DIRENT_XATTRS`](xlfs_sdk::dict::keys::DIRENT_XATTRS) saying it did,
//!   so a missing key means the entry lacks that xattr. A batch ends early
//!   rather than carry more than [`MAX_DIRENT_XATTR_KEYS`] such keys (the
//!   wire's dict limit is 4096). performance/md-cache prefetches
//!   `security.selinux` and the POSIX ACLs of a whole listing this way.
//! - Access checks the caller's uid/gid/groups against the mode bits; no
//!   other fop checks permissions (the brick acts with its own rights).
//! - Lock fops, lease and ipc answer ENOSYS: features/locks sits above.
//! - Reads, rchecksum and similar buffers are bounded by [`MAX_IO`].

mod handle;
mod reserve;
mod sys;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use xlfs_sdk::dict::keys::{self, CONTENT, GFID_REQ, GFID_XATTR, VOLUME_ID_XATTR};
use xlfs_sdk::slots::FdSlots;
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Dict, DirEntry, Errno, Event, EventFrom, EventSink, FdId, FileType, Fop, FopFuture, FopResult, Gfid, Iatt,
    InitCtx, InitError, Loc, OptType, OptionDecl, Options, Reply, Request, Response, SeekWhat, SetAttr, Statvfs,
    Timespec, Value, XattropOp, Xlator, XlatorType, rename_flags, xattr_flags,
};

use handle::{Brick, BrickError, EntryOpts, Node, read_gfid, valid_name};
use sys::{Sys, Target, cstr};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "storage/posix",
    description: "stores a brick's files in a local directory, with gfid xattrs and .glusterfs handles",
    options: OPTIONS,
    min_children: 0,
    max_children: 0,
    build,
};

const OPTIONS: &[OptionDecl] = &[
    OptionDecl::new("directory", OptType::Path)
        .desc("The brick directory (required). Must exist; its root gets the root gfid and a .glusterfs handle store."),
    OptionDecl::new("volume-id", OptType::Str).desc(
        "The volume's uuid. The brick root's trusted.glusterfs.volume-id xattr must match it; a brick without \
         the xattr gets it set.",
    ),
    OptionDecl::new("shared-brick-count", OptType::Int).default("1").range(1.0, 1_048_576.0).desc(
        "How many bricks of the volume share this brick's file system; statfs sizes and inode counts are divided \
         by it, as GlusterFS does.",
    ),
    OptionDecl::new("fips-mode-rchecksum", OptType::Bool).default("off").desc(
        "Accepted for GlusterFS volfiles; has no effect: rchecksum's strong checksum is always SHA-256 \
         (what GlusterFS uses in FIPS mode).",
    ),
    OptionDecl::new("max-open-fds", OptType::Int)
        .default("65536")
        .range(1.0, 16_777_216.0)
        .desc("Most fds open at once on this brick; open, create and opendir beyond it fail with EMFILE."),
    OptionDecl::new("inline-fops", OptType::Bool).default("on").desc(
        "Run the fops that normally finish in the page cache (reads and writes up to 128 KiB, lookup, stat, \
         xattr reads and xattrop, open, flush, release, seek, statfs) on the calling task instead of handing \
         each to the blocking thread pool: two thread hand-offs fewer per fop, about 14% more pgbench TPS on a \
         replica-3 mount on 2 cores. fsync, directory and namespace fops always use the pool. Off: every fop \
         on the pool (GlusterFS's io-threads model), for disks where a page-cache miss is slow.",
    ),
    OptionDecl::new("reserve", OptType::Str).default(RESERVE_DEFAULT).desc(
        "Space the brick keeps free (GlusterFS's storage.reserve): a percentage of its file system (a bare \
         number or N%, 0 to 100; 0 turns it off) or a size (40MB). While less is available, writes, fallocate, \
         zero-fill, copy_file_range and the fops that make inodes fail with ENOSPC before changing anything; \
         deletes, truncation, renames and xattr fops (replicate's changelog) still work, and writes go through \
         again once space is freed. Checked on each such fop: statfs at most every 100 ms while more than twice \
         the reserve is left, on every such fop closer to it (bricks sharing a file system see each other).",
    ),
    OptionDecl::new("o-direct-min-size", OptType::Size).default("512KB").desc(
        "Writes of at least this many bytes, at a 4 KiB-aligned offset and of a 4 KiB multiple (write-behind's \
         aggregated 1MB writes), go around the brick's page cache (O_DIRECT through a second descriptor): the \
         brick copies no data into memory it then has to write back, which was 40% of the CPU of a sequential \
         write on a replica-3 volume on one machine. Smaller or unaligned writes, O_APPEND fds and file systems \
         without O_DIRECT stay buffered, and so does everything on a tmpfs or ramfs brick (its pages are the \
         store: nothing to go around, and the aligned copy would only cost). Reads of such data come from the disk, not the \
         brick's cache. 0: off (GlusterFS's behaviour).",
    ),
];

/// Request xdata key on lookup and xattrop: the reply xdata carries the
/// number of fds open on the inode (GlusterFS's `GLUSTERFS_OPEN_FD_COUNT`).
pub const OPEN_FD_COUNT: &str = "glusterfs.open-fd-count";

/// Largest readv, rchecksum or zero-fill buffer in bytes (EINVAL beyond).
pub const MAX_IO: usize = 64 << 20;

/// Bytes of readdir `size` each entry costs besides its name (about
/// GlusterFS's `gf_dirent_t`).
pub const ENTRY_OVERHEAD: usize = 216;

/// Most xattr names a readdirp's request xdata may ask for per entry; the
/// rest are ignored (their keys are simply absent, and so is nothing else).
pub const MAX_DIRENT_XATTR_NAMES: usize = 32;

/// Most per-entry xattr keys in one readdirp reply's xdata; a batch stops
/// before an entry whose keys would pass it (at least one entry is always
/// returned).
pub const MAX_DIRENT_XATTR_KEYS: usize = 2048;

/// Most bytes of file content one readdirp reply carries
/// ([`keys::READDIRP_CONTENT`]); entries past it come without.
pub const MAX_DIRENT_CONTENT: usize = 4 << 20;

/// The whole content of regular file `name` in directory `dir`, if it is
/// still what `iatt` (from the listing) describes after reading it.
fn entry_content(dir: BorrowedFd<'_>, name: &str, iatt: &Iatt) -> Option<Vec<u8>> {
    let cname = cstr(name.as_bytes()).ok()?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let file =
        sys::openat(dir, &cname, flags | libc::O_NOATIME, 0).or_else(|_| sys::openat(dir, &cname, flags, 0)).ok()?;
    read_unchanged(file.as_fd(), iatt.size, |st| {
        let after = self::iatt(st, iatt.gfid);
        (after.size, after.mtime, after.ctime, after.mode) == (iatt.size, iatt.mtime, iatt.ctime, iatt.mode)
    })
}

/// The first `size` bytes of `file`, if they all came and `same` holds
/// for the file's attributes after reading (nothing changed it meanwhile).
fn read_unchanged(file: BorrowedFd<'_>, size: u64, same: impl FnOnce(&libc::stat) -> bool) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; usize::try_from(size).ok()?];
    let n = sys::pread_full(file, &mut buf, 0).ok()?;
    let st = sys::fstat(file).ok()?;
    (n == buf.len() && same(&st)).then_some(buf)
}

/// Largest readdir `size` honoured.
const MAX_READDIR: usize = 4 << 20;

/// Why the translator could not be set up.
#[derive(Debug, thiserror::Error)]
enum SetupError {
    #[error("option 'directory' is required: the brick directory")]
    NoDirectory,
    #[error(transparent)]
    Brick(#[from] BrickError),
    #[error("option 'volume-id': '{0}' is not a uuid")]
    BadVolumeId(String),
    #[error("option 'reserve': '{0}' is neither a percentage (0 to 100, e.g. 1 or 2.5%) nor a size (e.g. 40MB)")]
    BadReserve(String),
    #[error(
        "option 'volume-id' is {configured} but brick {path} has {VOLUME_ID_XATTR} {found}: \
         this directory belongs to another volume"
    )]
    VolumeIdMismatch { configured: Gfid, found: String, path: String },
    #[error("brick {path}: cannot {what} {VOLUME_ID_XATTR}: {errno}")]
    VolumeIdXattr { path: String, what: &'static str, errno: Errno },
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let name = init.name.clone();
    Posix::new(init).map(|p| Arc::new(p) as Arc<dyn Xlator>).map_err(|e| InitError::new(format!("{name}: {e}")))
}

fn parse_reserve(o: &Options) -> Result<reserve::Spec, SetupError> {
    let raw = o.str("reserve").unwrap_or(RESERVE_DEFAULT);
    reserve::Spec::parse(raw).ok_or_else(|| SetupError::BadReserve(raw.to_string()))
}

/// `o-direct-min-size` (0: off).
fn direct_min(o: &Options) -> u64 {
    o.size("o-direct-min-size").unwrap_or(DIRECT_MIN_DEFAULT)
}

/// `reserve` when the option is not given (GlusterFS's default).
const RESERVE_DEFAULT: &str = "1";

fn parse_volume_id(o: &Options) -> Result<Option<Gfid>, SetupError> {
    o.str("volume-id").map(|s| Gfid::parse(s.trim()).ok_or_else(|| SetupError::BadVolumeId(s.to_string()))).transpose()
}

/// An fd opened through this brick.
struct OpenFd {
    fd: OwnedFd,
    gfid: Gfid,
    dir: bool,
    direct: bool,
    /// The open flags (access mode, O_APPEND...).
    flags: i32,
    /// The same file opened again with `O_DIRECT`, for writes of at least
    /// `o-direct-min-size` (opened at the first such write; None when the
    /// file system refuses O_DIRECT or the fd cannot write).
    bypass: std::sync::OnceLock<Option<OwnedFd>>,
    client: Arc<str>,
    /// Serialises seek + getdents on directory fds.
    lock: Mutex<()>,
}

impl OpenFd {
    /// The `O_DIRECT` twin of a writable regular-file fd, opened on first use.
    fn bypass(&self) -> Option<BorrowedFd<'_>> {
        let writable = matches!(self.flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR);
        if self.dir || self.direct || !writable || self.flags & libc::O_APPEND != 0 {
            return None;
        }
        self.bypass
            .get_or_init(|| match sys::reopen(self.fd.as_fd(), libc::O_WRONLY | libc::O_DIRECT) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::debug!(gfid = %self.gfid, error = %e, "no O_DIRECT twin: writes stay buffered");
                    None
                }
            })
            .as_ref()
            .map(AsFd::as_fd)
    }

    fn iatt(&self) -> Sys<Iatt> {
        Ok(iatt(&sys::fstat(self.fd.as_fd())?, self.gfid))
    }
    fn file(&self) -> Sys<BorrowedFd<'_>> {
        if self.dir { Err(Errno::EISDIR) } else { Ok(self.fd.as_fd()) }
    }
}

/// storage/posix.
struct Posix {
    inner: Arc<Inner>,
    events: EventSink,
}

struct Inner {
    brick: Brick,
    volume_id: Option<Gfid>,
    max_fds: AtomicUsize,
    shared: AtomicU64,
    /// `inline-fops`.
    inline: AtomicBool,
    /// `o-direct-min-size` (0: off).
    direct_min: AtomicU64,
    /// The brick is on tmpfs or ramfs: `o-direct-min-size` does not apply.
    in_memory: bool,
    /// `reserve`.
    reserve: reserve::Reserve,
    fds: FdSlots<Arc<OpenFd>>,
    nfds: AtomicUsize,
    /// Open fds per inode (entries exist only while some fd is open).
    open: Mutex<HashMap<Gfid, u32>>,
}

impl Posix {
    fn new(init: InitCtx) -> Result<Posix, SetupError> {
        let o = &init.options;
        let dir = o.path("directory").ok_or(SetupError::NoDirectory)?;
        let volume_id = parse_volume_id(o)?;
        let brick = Brick::open(dir)?;
        if let Some(want) = volume_id {
            check_volume_id(&brick, want)?;
        }
        let max = usize::try_from(o.int("max-open-fds").unwrap_or(65536)).unwrap_or(65536).max(1);
        let inner = Inner {
            volume_id,
            max_fds: AtomicUsize::new(max),
            inline: AtomicBool::new(o.bool("inline-fops").unwrap_or(true)),
            direct_min: AtomicU64::new(direct_min(o)),
            in_memory: sys::in_memory(brick.root_fd()),
            reserve: reserve::Reserve::new(parse_reserve(o)?),
            shared: AtomicU64::new(o.int("shared-brick-count").and_then(|v| u64::try_from(v).ok()).unwrap_or(1).max(1)),
            // The counter bounds the total; the slot map's own capacity only
            // backs it up (it is per shard).
            fds: FdSlots::with_capacity(max.max(65536).saturating_mul(16)),
            nfds: AtomicUsize::new(0),
            open: Mutex::new(HashMap::new()),
            brick,
        };
        tracing::info!(brick = %dir.display(), "storage/posix ready");
        Ok(Posix { inner: Arc::new(inner), events: init.events })
    }
}

fn check_volume_id(brick: &Brick, want: Gfid) -> Result<(), SetupError> {
    let path = brick.path.display().to_string();
    let t = Target::Fd(brick.root_fd());
    let key = CString::new(VOLUME_ID_XATTR).unwrap_or_default();
    match t.getxattr(&key) {
        Ok(v) if v == want.0 => Ok(()),
        Ok(v) => {
            let found = <[u8; 16]>::try_from(v.as_slice())
                .map(|b| Gfid(b).to_string())
                .unwrap_or_else(|_| format!("({} bytes, not a uuid)", v.len()));
            Err(SetupError::VolumeIdMismatch { configured: want, found, path })
        }
        Err(Errno::ENODATA) => t
            .setxattr(&key, &want.0, libc::XATTR_CREATE)
            .map_err(|errno| SetupError::VolumeIdXattr { path, what: "set", errno }),
        Err(errno) => Err(SetupError::VolumeIdXattr { path, what: "read", errno }),
    }
}

/// Builds an [`Iatt`]; a non-directory's handle link is not counted.
#[allow(clippy::unnecessary_cast)] // stat field widths differ between targets
fn iatt(st: &libc::stat, gfid: Gfid) -> Iatt {
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let nlink = st.st_nlink as u64;
    let nlink = if !is_dir && !gfid.is_null() { nlink.saturating_sub(1) } else { nlink };
    let ts = |sec: i64, nsec: i64| Timespec { sec, nsec: nsec.clamp(0, 999_999_999) as u32 };
    Iatt {
        gfid,
        ino: if gfid.is_null() { 0 } else { gfid.ino() },
        dev: st.st_dev as u64,
        mode: st.st_mode as u32,
        nlink: u32::try_from(nlink).unwrap_or(u32::MAX),
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u64,
        size: st.st_size.max(0) as u64,
        blksize: st.st_blksize.max(0) as u32,
        blocks: st.st_blocks.max(0) as u64,
        atime: ts(st.st_atime as i64, st.st_atime_nsec as i64),
        mtime: ts(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime: ts(st.st_ctime as i64, st.st_ctime_nsec as i64),
    }
}

/// Takes set-user-ID (always) and set-group-ID (when group-executable)
/// away from a regular file that a caller other than root wrote, truncated
/// or allocated, as the kernel does for a caller without CAP_FSETID. The
/// brick runs as root, so the kernel keeps those bits on its own writes;
/// this does it for the caller instead. That is what lets the FUSE client
/// hand the job over (FUSE_HANDLE_KILLPRIV_V2) and stop asking for
/// `security.capability` before every write. (The capability xattr itself
/// the brick's kernel removes on any write, whoever the caller.)
fn drop_privs(fd: BorrowedFd<'_>, mode: u32, ctx: &CallCtx) -> Sys<()> {
    if ctx.uid == 0 || mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    let mut kill = mode & libc::S_ISUID;
    if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        kill |= libc::S_ISGID;
    }
    if kill == 0 { Ok(()) } else { sys::fchmod(fd, mode & 0o7777 & !kill) }
}

fn file_type(d_type: u8) -> FileType {
    match d_type {
        libc::DT_REG => FileType::Regular,
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_BLK => FileType::BlockDev,
        libc::DT_CHR => FileType::CharDev,
        libc::DT_FIFO => FileType::Fifo,
        libc::DT_SOCK => FileType::Socket,
        _ => FileType::Unknown,
    }
}

fn ok(r: Reply) -> FopResult {
    Ok(r.into())
}

/// The gfid a creating fop asked for in its xdata.
fn gfid_req(xdata: &Dict) -> Sys<Option<Gfid>> {
    let g = match xdata.get(GFID_REQ) {
        None => return Ok(None),
        Some(Value::Gfid(g)) => *g,
        Some(Value::Bytes(b)) => Gfid(<[u8; 16]>::try_from(b.as_ref()).map_err(|_| Errno::EINVAL)?),
        Some(Value::Str(s)) => Gfid::parse(s).ok_or(Errno::EINVAL)?,
        Some(_) => return Err(Errno::EINVAL),
    };
    Ok((!g.is_null()).then_some(g))
}

/// An xattr value's bytes.
fn xattr_bytes(v: &Value) -> Cow<'_, [u8]> {
    match v {
        Value::Bytes(b) => Cow::Borrowed(b.as_ref()),
        Value::Str(s) => Cow::Borrowed(s.as_bytes()),
        Value::Gfid(g) => Cow::Owned(g.0.to_vec()),
        Value::I64(i) => Cow::Owned(i.to_string().into_bytes()),
        Value::U64(u) => Cow::Owned(u.to_string().into_bytes()),
    }
}

fn xattr_name(name: &str) -> Sys<CString> {
    if name.is_empty() {
        return Err(Errno::EINVAL);
    }
    cstr(name.as_bytes())
}

fn is_xattr_key(k: &str) -> bool {
    ["trusted.", "user.", "security.", "system."].iter().any(|p| k.starts_with(p))
}

/// Open flags a client may pass; the rest (O_CREAT, O_EXCL, O_DIRECTORY,
/// O_PATH, O_TMPFILE, ...) are dropped and O_NOFOLLOW is always added.
fn open_flags(flags: u32) -> i32 {
    const PASS: i32 = libc::O_ACCMODE
        | libc::O_APPEND
        | libc::O_TRUNC
        | libc::O_SYNC
        | libc::O_DSYNC
        | libc::O_DIRECT
        | libc::O_NOATIME
        | libc::O_NONBLOCK
        | libc::O_LARGEFILE;
    (flags as i32 & PASS) | libc::O_NOFOLLOW | libc::O_NOCTTY
}

/// Adler-32.
fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65521;
    let (mut a, mut b) = (1u32, 0u32);
    // 5552 is the most bytes that cannot overflow `b` before the modulo.
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

/// What a creating fop makes.
enum Make<'a> {
    File { flags: i32 },
    Dir,
    Node { fmt: u32, rdev: u64 },
    Symlink(&'a std::ffi::CStr),
}

/// Releases an fd reservation unless it was committed.
struct Reservation<'a> {
    inner: &'a Inner,
    id: FdId,
    done: bool,
}

impl Reservation<'_> {
    fn commit(mut self, fd: OpenFd) -> Sys<()> {
        let gfid = fd.gfid;
        let fd = Arc::new(fd);
        let mut fresh = false;
        self.inner
            .fds
            .with_or_insert(
                self.id,
                || {
                    fresh = true;
                    fd.clone()
                },
                |_| (),
            )
            .map_err(|_| Errno::EMFILE)?;
        if !fresh {
            return Err(Errno::EBADF);
        }
        *self.inner.open.lock().entry(gfid).or_insert(0) += 1;
        self.done = true;
        Ok(())
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.inner.nfds.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Inner {
    fn fd(&self, id: FdId) -> Sys<Arc<OpenFd>> {
        self.fds.get(&id).ok_or(Errno::EBADF)
    }

    /// Claims room for one more fd with id `id`.
    fn reserve(&self, id: FdId) -> Sys<Reservation<'_>> {
        if self.fds.with(&id, |_| ()).is_some() {
            return Err(Errno::EBADF);
        }
        let prev = self.nfds.fetch_add(1, Ordering::AcqRel);
        let r = Reservation { inner: self, id, done: false };
        if prev >= self.max_fds.load(Ordering::Relaxed) {
            return Err(Errno::EMFILE);
        }
        Ok(r)
    }

    fn open_count(&self, g: Gfid) -> u32 {
        self.open.lock().get(&g).copied().unwrap_or(0)
    }

    /// Bookkeeping after an fd left the table.
    fn closed(&self, f: &OpenFd) {
        self.nfds.fetch_sub(1, Ordering::AcqRel);
        let _l = self.brick.inode_locks.lock_all(&[&[&f.gfid.0]]);
        let left = {
            let mut open = self.open.lock();
            match open.get_mut(&f.gfid) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    *n
                }
                _ => {
                    open.remove(&f.gfid);
                    0
                }
            }
        };
        if left == 0 && !f.dir {
            self.forget_if_nameless(f.gfid);
        }
    }

    /// With the inode lock held: drops the handle of a non-directory that
    /// has no name and no open fd left.
    fn forget_if_nameless(&self, g: Gfid) {
        if self.open_count(g) == 0
            && let Err(e) = self.brick.remove_handle_if_nameless(&g)
        {
            tracing::warn!(gfid = %g, error = %e, "cannot remove the handle of an unlinked file");
        }
    }

    fn dir(&self, g: Gfid) -> Sys<Node> {
        let n = self.brick.resolve_gfid(g)?;
        if n.is_dir() { Ok(n) } else { Err(Errno::ENOTDIR) }
    }

    /// Resolves a location: by gfid when it has one, else by parent + name.
    fn resolve(&self, loc: &Loc) -> Sys<Node> {
        if !loc.gfid.is_null() {
            return self.brick.resolve_gfid(loc.gfid);
        }
        if !loc.is_entry() {
            return Err(Errno::EINVAL);
        }
        let parent = self.dir(loc.parent)?;
        self.brick.lookup_entry(&parent, &loc.name, EntryOpts::default())
    }

    /// The parent and name of an entry location; `hidden` is the answer for
    /// `.glusterfs` in the root.
    fn entry(&self, loc: &Loc, hidden: Errno) -> Sys<(Node, CString)> {
        if loc.parent.is_null() || !valid_name(loc.name.as_bytes()) {
            return Err(Errno::EINVAL);
        }
        let parent = self.dir(loc.parent)?;
        if self.brick.is_hidden(&parent, &loc.name) {
            return Err(hidden);
        }
        Ok((parent, cstr(loc.name.as_bytes())?))
    }

    fn node_iatt(&self, n: &Node) -> Sys<Iatt> {
        Ok(iatt(&self.brick.target(n).stat()?, n.gfid))
    }

    fn dispatch(&self, ctx: &CallCtx, req: Request) -> FopResult {
        let Request { fop, xdata } = req;
        // Held until the fop has finished: its bytes count as pending.
        let _space = takes_space(&fop).map(|grow| self.reserve.admit(self.brick.root_fd(), grow)).transpose()?;
        match fop {
            Fop::Lookup { loc } => self.lookup(&loc, &xdata),
            Fop::Stat { loc } => {
                let n = self.resolve(&loc)?;
                ok(Reply::Attr(iatt(&n.st, n.gfid)))
            }
            Fop::Fstat { fd } => ok(Reply::Attr(self.fd(fd.id)?.iatt()?)),
            Fop::Setattr { loc, attr } => {
                let n = self.resolve(&loc)?;
                let t = self.brick.target(&n);
                let pre = iatt(&n.st, n.gfid);
                apply_attr(t, &attr)?;
                ok(Reply::PrePost { pre, post: iatt(&t.stat()?, n.gfid) })
            }
            Fop::Fsetattr { fd, attr } => {
                let f = self.fd(fd.id)?;
                let pre = f.iatt()?;
                apply_attr(Target::Fd(f.fd.as_fd()), &attr)?;
                ok(Reply::PrePost { pre, post: f.iatt()? })
            }
            Fop::Truncate { loc, offset } => {
                let n = self.resolve(&loc)?;
                match n.fmt() {
                    libc::S_IFREG => {}
                    libc::S_IFDIR => return Err(Errno::EISDIR),
                    _ => return Err(Errno::EINVAL),
                }
                let fd = sys::openat(
                    self.brick.gfs(),
                    n.handle(),
                    libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
                    0,
                )?;
                let pre = iatt(&sys::fstat(fd.as_fd())?, n.gfid);
                sys::ftruncate(fd.as_fd(), offset)?;
                drop_privs(fd.as_fd(), pre.mode, ctx)?;
                ok(Reply::PrePost { pre, post: iatt(&sys::fstat(fd.as_fd())?, n.gfid) })
            }
            Fop::Ftruncate { fd, offset } => self.prepost(fd.id, ctx, |f| sys::ftruncate(f, offset)),
            Fop::Access { loc, mask } => {
                let n = self.resolve(&loc)?;
                if access_ok(&n.st, ctx, mask) { ok(Reply::Empty) } else { Err(Errno::EACCES) }
            }
            Fop::Readlink { loc, .. } => {
                let n = self.resolve(&loc)?;
                if n.fmt() != libc::S_IFLNK {
                    return Err(Errno::EINVAL);
                }
                let t = sys::readlinkat(self.brick.gfs(), n.handle())?;
                let target = String::from_utf8(t).map_err(|_| Errno::EINVAL)?;
                ok(Reply::Readlink { target, iatt: iatt(&n.st, n.gfid) })
            }
            Fop::Mknod { loc, mode, rdev, umask } => {
                let fmt = match mode & libc::S_IFMT {
                    0 => libc::S_IFREG,
                    f @ (libc::S_IFREG | libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK) => f,
                    _ => return Err(Errno::EINVAL),
                };
                let (node, postparent, _) =
                    self.create_entry(ctx, &loc, &xdata, mode & !umask, Make::Node { fmt, rdev })?;
                ok(Reply::Entry { iatt: iatt(&node.st, node.gfid), postparent })
            }
            Fop::Mkdir { loc, mode, umask } => {
                let (node, postparent, _) = self.create_entry(ctx, &loc, &xdata, mode & !umask, Make::Dir)?;
                ok(Reply::Entry { iatt: iatt(&node.st, node.gfid), postparent })
            }
            Fop::Symlink { target, loc, .. } => {
                if target.is_empty() {
                    return Err(Errno::ENOENT);
                }
                let t = cstr(target.as_bytes())?;
                let (node, postparent, _) = self.create_entry(ctx, &loc, &xdata, 0o777, Make::Symlink(&t))?;
                ok(Reply::Entry { iatt: iatt(&node.st, node.gfid), postparent })
            }
            Fop::Create { loc, flags, mode, umask, fd } => self.create(ctx, &loc, &xdata, flags, mode & !umask, fd),
            Fop::Unlink { loc, .. } => self.remove(&loc, false),
            Fop::Rmdir { loc, .. } => self.remove(&loc, true),
            Fop::Rename { old, new, flags } => self.rename(&old, &new, flags),
            Fop::Link { old, new } => {
                let src = self.resolve(&old)?;
                if src.is_dir() {
                    return Err(Errno::EPERM);
                }
                let (np, ncn) = self.entry(&new, Errno::EPERM)?;
                let _l = self.brick.entry_locks.lock_all(&[&[&np.gfid.0, new.name.as_bytes()]]);
                sys::linkat(self.brick.gfs(), src.handle(), np.dir_fd()?, &ncn)?;
                let n = self.brick.handle_node(src.gfid)?;
                let postparent = self.node_iatt(&np)?;
                ok(Reply::Entry { iatt: iatt(&n.st, n.gfid), postparent })
            }
            Fop::Open { loc, flags, fd } => {
                let r = self.reserve(fd)?;
                let n = self.resolve(&loc)?;
                match n.fmt() {
                    libc::S_IFDIR => return Err(Errno::EISDIR),
                    libc::S_IFLNK => return Err(Errno::ELOOP),
                    _ => {}
                }
                let flags = open_flags(flags);
                let file = sys::openat(self.brick.gfs(), n.handle(), flags, 0)?;
                if flags & libc::O_TRUNC != 0 {
                    drop_privs(file.as_fd(), sys::fstat(file.as_fd())?.st_mode, ctx)?;
                }
                r.commit(self.open_fd(file, n.gfid, false, flags, ctx))?;
                ok(Reply::Empty)
            }
            Fop::Readv { fd, size, offset, .. } => {
                let f = self.fd(fd.id)?;
                let data = read_at(&f, size as usize, offset)?;
                ok(Reply::Read { data: Bytes::from(data), iatt: f.iatt()? })
            }
            Fop::Writev { fd, data, offset, flags } => {
                let f = self.fd(fd.id)?;
                let file = f.file()?;
                let pre = f.iatt()?;
                let min = self.direct_min.load(Ordering::Relaxed);
                let around =
                    min != 0 && !self.in_memory && data.len() as u64 >= min && direct_aligned(offset, data.len());
                match around.then(|| f.bypass()).flatten() {
                    Some(twin) => write_direct(twin, file, &data, offset)?,
                    None if f.direct => write_direct(file, file, &data, offset)?,
                    None => sys::pwrite_all(file, &data, offset)?,
                }
                drop_privs(file, pre.mode, ctx)?;
                let sync = flags as i32 & (libc::O_SYNC | libc::O_DSYNC);
                if sync != 0 {
                    sys::fsync(file, sync & libc::O_SYNC != libc::O_SYNC)?;
                }
                ok(Reply::PrePost { pre, post: f.iatt()? })
            }
            Fop::Flush { fd } => self.fd(fd.id).and(ok(Reply::Empty)),
            Fop::Fsync { fd, datasync } => {
                let f = self.fd(fd.id)?;
                let pre = f.iatt()?;
                if xdata.contains(xlfs_sdk::dict::keys::SYNCFS) {
                    sys::syncfs(f.fd.as_fd())?;
                } else {
                    sys::fsync(f.fd.as_fd(), datasync)?;
                }
                ok(Reply::PrePost { pre, post: f.iatt()? })
            }
            Fop::Opendir { loc, fd } => {
                let r = self.reserve(fd)?;
                let n = self.resolve(&loc)?;
                // A descriptor of its own: readdir moves its position.
                let d = sys::openat(n.dir_fd()?, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                r.commit(self.open_fd(d, n.gfid, true, 0, ctx))?;
                ok(Reply::Empty)
            }
            Fop::Readdir { fd, size, offset } => {
                ok(Reply::Dirents(self.readdir(&*self.fd(fd.id)?, size, offset, None)?.0))
            }
            Fop::Readdirp { fd, size, offset } => {
                let names: Vec<(&str, CString)> = xdata
                    .keys()
                    .filter(|k| is_xattr_key(k))
                    .filter_map(|k| cstr(k.as_bytes()).ok().map(|c| (k.as_str(), c)))
                    .take(MAX_DIRENT_XATTR_NAMES)
                    .collect();
                let content = xdata.get_u64(keys::READDIRP_CONTENT).unwrap_or(0);
                let (entries, xattrs) = self.readdir(&*self.fd(fd.id)?, size, offset, Some((&names, content)))?;
                Ok(Response { reply: Reply::Dirents(entries), xdata: xattrs })
            }
            Fop::Fsyncdir { fd, datasync } => {
                let f = self.fd(fd.id)?;
                sys::fsync(f.fd.as_fd(), datasync)?;
                ok(Reply::Empty)
            }
            Fop::Statfs { loc } => {
                self.resolve(&loc)?;
                ok(Reply::Statfs(self.statfs()?))
            }
            Fop::Setxattr { loc, xattrs, flags } => {
                let n = self.resolve(&loc)?;
                set_xattrs(self.brick.target(&n), n.gfid, &xattrs, flags)?;
                ok(Reply::Empty)
            }
            Fop::Fsetxattr { fd, xattrs, flags } => {
                let f = self.fd(fd.id)?;
                set_xattrs(Target::Fd(f.fd.as_fd()), f.gfid, &xattrs, flags)?;
                ok(Reply::Empty)
            }
            Fop::Getxattr { loc, name } => {
                let n = self.resolve(&loc)?;
                ok(Reply::Xattrs(get_xattrs(self.brick.target(&n), &name)?))
            }
            Fop::Fgetxattr { fd, name } => {
                let f = self.fd(fd.id)?;
                ok(Reply::Xattrs(get_xattrs(Target::Fd(f.fd.as_fd()), &name)?))
            }
            Fop::Removexattr { loc, name } => {
                let n = self.resolve(&loc)?;
                remove_xattr(self.brick.target(&n), n.gfid, &name)?;
                ok(Reply::Empty)
            }
            Fop::Fremovexattr { fd, name } => {
                let f = self.fd(fd.id)?;
                remove_xattr(Target::Fd(f.fd.as_fd()), f.gfid, &name)?;
                ok(Reply::Empty)
            }
            Fop::Xattrop { loc, op, xattrs } => {
                let n = self.resolve(&loc)?;
                self.xattrop(self.brick.target(&n), n.gfid, op, &xattrs, &xdata)
            }
            Fop::Fxattrop { fd, op, xattrs } => {
                let f = self.fd(fd.id)?;
                self.xattrop(Target::Fd(f.fd.as_fd()), f.gfid, op, &xattrs, &xdata)
            }
            Fop::Fallocate { fd, mode, offset, len } => {
                self.prepost(fd.id, ctx, |f| sys::fallocate(f, mode as i32, offset, len))
            }
            Fop::Discard { fd, offset, len } => self.prepost(fd.id, ctx, |f| {
                sys::fallocate(f, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
            }),
            Fop::Zerofill { fd, offset, len } => self.prepost(fd.id, ctx, |f| zerofill(f, offset, len)),
            Fop::Seek { fd, offset, what } => {
                let f = self.fd(fd.id)?;
                let whence = match what {
                    SeekWhat::Data => libc::SEEK_DATA,
                    SeekWhat::Hole => libc::SEEK_HOLE,
                };
                ok(Reply::Offset(sys::lseek(f.file()?, sys::off(offset).map_err(|_| Errno::ENXIO)?, whence)?))
            }
            Fop::Rchecksum { fd, offset, len } => {
                let f = self.fd(fd.id)?;
                let data = read_at(&f, len as usize, offset)?;
                let mut rsp =
                    Response::from(Reply::Checksum { weak: adler32(&data), strong: Sha256::digest(&data).into() });
                if xdata.contains("check-zero-filled") {
                    rsp.xdata.set_u64("buf-has-zeroes", u64::from(data.iter().all(|&b| b == 0)));
                }
                Ok(rsp)
            }
            Fop::CopyFileRange { fd_in, off_in, fd_out, off_out, len, flags } => {
                let (fi, fo) = (self.fd(fd_in.id)?, self.fd(fd_out.id)?);
                let n = copy_range(fi.file()?, off_in, fo.file()?, off_out, len, flags)?;
                ok(Reply::Copied { len: n, post: fo.iatt()? })
            }
            Fop::Release { fd } | Fop::Releasedir { fd } => {
                let f = self.fds.remove(&fd.id).ok_or(Errno::EBADF)?;
                self.closed(&f);
                ok(Reply::Empty)
            }
            Fop::Forget { .. } => ok(Reply::Empty),
            Fop::Lk { .. }
            | Fop::Inodelk { .. }
            | Fop::Finodelk { .. }
            | Fop::Entrylk { .. }
            | Fop::Fentrylk { .. }
            | Fop::Lease { .. }
            | Fop::Ipc { .. } => Err(Errno::ENOSYS),
        }
    }

    fn open_fd(&self, fd: OwnedFd, gfid: Gfid, dir: bool, flags: i32, ctx: &CallCtx) -> OpenFd {
        OpenFd {
            fd,
            gfid,
            dir,
            direct: flags & libc::O_DIRECT != 0,
            flags,
            bypass: std::sync::OnceLock::new(),
            client: ctx.client_id.clone(),
            lock: Mutex::new(()),
        }
    }

    /// A change of a file's data through an fd: `op`, then what the caller
    /// loses by it ([`drop_privs`]), answered with the attributes around it.
    fn prepost(&self, id: FdId, ctx: &CallCtx, op: impl FnOnce(BorrowedFd<'_>) -> Sys<()>) -> FopResult {
        let f = self.fd(id)?;
        let pre = f.iatt()?;
        op(f.file()?)?;
        drop_privs(f.file()?, pre.mode, ctx)?;
        ok(Reply::PrePost { pre, post: f.iatt()? })
    }

    fn lookup(&self, loc: &Loc, xdata: &Dict) -> FopResult {
        let (node, postparent) = if loc.is_entry() {
            let parent = self.dir(loc.parent)?;
            let o = EntryOpts { gfid_req: gfid_req(xdata)?, dots: true, check_handle: true, locked: false };
            let node = self.brick.lookup_entry(&parent, &loc.name, o)?;
            if !loc.gfid.is_null() && node.gfid != loc.gfid {
                return Err(Errno::ESTALE);
            }
            let pp = self.node_iatt(&parent)?;
            (node, pp)
        } else if !loc.gfid.is_null() {
            (self.brick.resolve_gfid(loc.gfid)?, Iatt::default())
        } else {
            return Err(Errno::EINVAL);
        };
        let mut rsp = Response::from(Reply::Entry { iatt: iatt(&node.st, node.gfid), postparent });
        rsp.xdata = self.fill_xdata(self.brick.target(&node), node.gfid, xdata);
        if let Some(max) = xdata.get_u64(CONTENT)
            && let Some(data) = self.small_content(&node, max)
        {
            rsp.xdata.set_bytes(CONTENT, data);
        }
        Ok(rsp)
    }

    /// The whole content of a regular file no larger than `max` (for
    /// [`CONTENT`] on lookup), or None when it is not one, is larger than
    /// a dict value may be on the wire, or changed while being read (the
    /// reply's attributes must describe the bytes).
    fn small_content(&self, node: &Node, max: u64) -> Option<Bytes> {
        let size = u64::try_from(node.st.st_size).ok()?;
        let cap = xlfs_sdk::abi::Limits::DEFAULT.max_string as u64;
        if node.fmt() != libc::S_IFREG || size > max.min(cap) {
            return None;
        }
        let same = |st: &libc::stat| {
            (st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec)
                == (
                    node.st.st_ino,
                    node.st.st_size,
                    node.st.st_mtime,
                    node.st.st_mtime_nsec,
                    node.st.st_ctime,
                    node.st.st_ctime_nsec,
                )
        };
        let file = sys::openat(self.brick.gfs(), node.handle(), libc::O_RDONLY | libc::O_NOFOLLOW, 0).ok()?;
        read_unchanged(file.as_fd(), size, same).map(Bytes::from)
    }

    /// The reply xdata for a request that names xattrs or asks for the open
    /// fd count.
    fn fill_xdata(&self, t: Target<'_>, gfid: Gfid, req: &Dict) -> Dict {
        let mut out = Dict::new();
        for key in req.keys() {
            if key == OPEN_FD_COUNT {
                out.set_u64(key.clone(), u64::from(self.open_count(gfid)));
            } else if is_xattr_key(key)
                && let Ok(name) = cstr(key.as_bytes())
                && let Ok(v) = t.getxattr(&name)
            {
                out.set_bytes(key.clone(), v);
            }
        }
        out
    }

    /// Creates an inode at `loc` with the requested gfid, the caller as
    /// owner and exactly `perm` (the brick process's umask does not apply),
    /// and its handle. Returns it, the parent's attributes after, and for a
    /// file the open descriptor.
    fn create_entry(
        &self,
        ctx: &CallCtx,
        loc: &Loc,
        xdata: &Dict,
        mode: u32,
        make: Make<'_>,
    ) -> Sys<(Node, Iatt, Option<OwnedFd>)> {
        let (parent, cname) = self.entry(loc, Errno::EPERM)?;
        let pfd = parent.dir_fd()?;
        let gfid = gfid_req(xdata)?.unwrap_or_else(Gfid::random);
        if gfid == Gfid::ROOT {
            return Err(Errno::EINVAL);
        }
        let _l = self.brick.entry_locks.lock_all(&[&[&parent.gfid.0, loc.name.as_bytes()]]);
        let _i = self.brick.inode_locks.lock_all(&[&[&gfid.0]]);
        if self.brick.handle_exists(&gfid)? {
            tracing::warn!(%gfid, name = %loc.name, "create refused: the requested gfid is in use on this brick");
            return Err(Errno::EEXIST);
        }
        let perm = mode & 0o7777;
        let is_dir = matches!(make, Make::Dir);
        let is_lnk = matches!(make, Make::Symlink(_));
        let file = match make {
            Make::File { flags } => Some(sys::openat(pfd, &cname, flags | libc::O_CREAT | libc::O_EXCL, perm)?),
            Make::Dir => {
                sys::mkdirat(pfd, &cname, perm)?;
                None
            }
            Make::Node { fmt, rdev } => {
                sys::mknodat(pfd, &cname, fmt | perm, rdev)?;
                None
            }
            Make::Symlink(target) => {
                sys::symlinkat(target, pfd, &cname)?;
                None
            }
        };
        let finish = || -> Sys<Node> {
            let dir = if is_dir {
                Some(Arc::new(sys::openat(pfd, &cname, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?))
            } else {
                None
            };
            let t = match (&dir, &file) {
                (Some(d), _) => Target::Fd(d.as_fd()),
                (None, Some(f)) => Target::Fd(f.as_fd()),
                (None, None) => Target::At(pfd, &cname),
            };
            t.setxattr(&CString::new(GFID_XATTR).unwrap_or_default(), &gfid.0, libc::XATTR_CREATE)?;
            let sgid = parent.st.st_mode & libc::S_ISGID != 0;
            let gid = if sgid { parent.st.st_gid } else { ctx.gid };
            let st = t.stat()?;
            if st.st_uid != ctx.uid || st.st_gid != gid {
                match t.chown(Some(ctx.uid), Some(gid)) {
                    Err(Errno::EPERM) if !sys::is_root() => {
                        tracing::debug!(name = %loc.name, "not root: new inode keeps the brick's owner");
                    }
                    r => r?,
                }
            }
            if !is_lnk {
                let want = perm | if is_dir && sgid { libc::S_ISGID } else { 0 };
                if t.stat()?.st_mode & 0o7777 != want {
                    match t {
                        Target::Fd(fd) => sys::fchmod(fd, want)?,
                        Target::At(d, p) => sys::chmod_at_nofollow(d, p, want)?,
                    }
                }
            }
            match dir {
                Some(d) => {
                    self.brick.make_dir_handle(&gfid, &parent.gfid, cname.as_bytes())?;
                    self.brick.dir_node(gfid, d)
                }
                None => {
                    self.brick.make_link_handle(&gfid, pfd, &cname)?;
                    self.brick.handle_node(gfid)
                }
            }
        };
        match finish() {
            Ok(node) => Ok((node, self.node_iatt(&parent)?, file)),
            Err(e) => {
                let _ = sys::unlinkat(pfd, &cname, if is_dir { libc::AT_REMOVEDIR } else { 0 });
                let _ = self.brick.remove_handle(&gfid);
                Err(e)
            }
        }
    }

    fn create(&self, ctx: &CallCtx, loc: &Loc, xdata: &Dict, flags: u32, mode: u32, id: FdId) -> FopResult {
        let r = self.reserve(id)?;
        let oflags = open_flags(flags);
        let (node, postparent, file) = match self.create_entry(ctx, loc, xdata, mode, Make::File { flags: oflags }) {
            Ok((n, pp, Some(f))) => (n, pp, f),
            Ok(_) => return Err(Errno::EIO),
            Err(Errno::EEXIST) if flags as i32 & libc::O_EXCL == 0 => {
                // Open what is there, as open(2) with O_CREAT does.
                let (parent, _) = self.entry(loc, Errno::EPERM)?;
                let o = EntryOpts { gfid_req: gfid_req(xdata)?, ..EntryOpts::default() };
                let n = match self.brick.lookup_entry(&parent, &loc.name, o) {
                    Err(Errno::ENOENT) => return Err(Errno::EEXIST),
                    r => r?,
                };
                match n.fmt() {
                    libc::S_IFDIR => return Err(Errno::EISDIR),
                    libc::S_IFLNK => return Err(Errno::ELOOP),
                    _ => {}
                }
                let f = sys::openat(self.brick.gfs(), n.handle(), oflags, 0)?;
                let pp = self.node_iatt(&parent)?;
                (self.brick.handle_node(n.gfid)?, pp, f)
            }
            Err(e) => return Err(e),
        };
        let gfid = node.gfid;
        r.commit(self.open_fd(file, gfid, false, oflags, ctx))?;
        ok(Reply::Entry { iatt: iatt(&node.st, gfid), postparent })
    }

    /// Unlink or rmdir.
    fn remove(&self, loc: &Loc, is_rmdir: bool) -> FopResult {
        let (parent, cname) = self.entry(loc, Errno::ENOENT)?;
        let _l = self.brick.entry_locks.lock_all(&[&[&parent.gfid.0, loc.name.as_bytes()]]);
        let node = self.brick.lookup_entry(&parent, &loc.name, EntryOpts { locked: true, ..EntryOpts::default() })?;
        match (is_rmdir, node.is_dir()) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            _ => {}
        }
        if !loc.gfid.is_null() && loc.gfid != node.gfid {
            return Err(Errno::ESTALE);
        }
        let pre = self.node_iatt(&parent)?;
        sys::unlinkat(parent.dir_fd()?, &cname, if is_rmdir { libc::AT_REMOVEDIR } else { 0 })?;
        {
            let _i = self.brick.inode_locks.lock_all(&[&[&node.gfid.0]]);
            if is_rmdir {
                if let Err(e) = self.brick.remove_handle(&node.gfid) {
                    tracing::warn!(gfid = %node.gfid, error = %e, "cannot remove a removed directory's handle");
                }
            } else {
                self.forget_if_nameless(node.gfid);
            }
        }
        ok(Reply::Parent { pre, post: self.node_iatt(&parent)? })
    }

    fn rename(&self, old: &Loc, new: &Loc, flags: u32) -> FopResult {
        use rename_flags::{EXCHANGE, NOREPLACE};
        if flags & !(EXCHANGE | NOREPLACE) != 0 || flags == EXCHANGE | NOREPLACE {
            return Err(Errno::EINVAL);
        }
        let (op, ocn) = self.entry(old, Errno::ENOENT)?;
        let (np, ncn) = self.entry(new, Errno::EPERM)?;
        let _l =
            self.brick.entry_locks.lock_all(&[&[&op.gfid.0, old.name.as_bytes()], &[&np.gfid.0, new.name.as_bytes()]]);
        let o = EntryOpts { locked: true, ..EntryOpts::default() };
        let src = self.brick.lookup_entry(&op, &old.name, o)?;
        if !old.gfid.is_null() && old.gfid != src.gfid {
            return Err(Errno::ESTALE);
        }
        let dst = match self.brick.lookup_entry(&np, &new.name, o) {
            Ok(n) => Some(n),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(e),
        };
        sys::renameat2(op.dir_fd()?, &ocn, np.dir_fd()?, &ncn, flags)?;
        let dst = dst.filter(|d| d.gfid != src.gfid);
        let mut keys: Vec<&[&[u8]]> = Vec::new();
        let src_key: [&[u8]; 1] = [&src.gfid.0];
        keys.push(&src_key);
        let dst_key: Option<[&[u8]; 1]> = dst.as_ref().map(|d| [&d.gfid.0[..]]);
        if let Some(k) = &dst_key {
            keys.push(k);
        }
        let _i = self.brick.inode_locks.lock_all(&keys);
        let fix = |r: Sys<()>, g: Gfid| {
            if let Err(e) = r {
                tracing::warn!(gfid = %g, error = %e, "rename: cannot update a handle (the next lookup repairs it)");
            }
        };
        if src.is_dir() {
            fix(self.brick.rewrite_dir_handle(&src.gfid, &np.gfid, new.name.as_bytes()), src.gfid);
        }
        if let Some(d) = &dst {
            if flags & EXCHANGE != 0 {
                if d.is_dir() {
                    fix(self.brick.rewrite_dir_handle(&d.gfid, &op.gfid, old.name.as_bytes()), d.gfid);
                }
            } else if d.is_dir() {
                fix(self.brick.remove_handle(&d.gfid), d.gfid);
            } else {
                self.forget_if_nameless(d.gfid);
            }
        }
        ok(Reply::Rename { iatt: self.node_iatt(&src)? })
    }

    /// Readdir, or with `xattrs` readdirp: then the entries carry their
    /// attributes and the returned dict the named xattrs of each entry
    /// (see the module docs).
    fn readdir(
        &self,
        f: &OpenFd,
        size: u32,
        offset: u64,
        plus: Option<(&[(&str, CString)], u64)>,
    ) -> Sys<(Vec<DirEntry>, Dict)> {
        let (xattrs, content_max) = plus.unwrap_or((&[], 0));
        let plus = plus.is_some();
        let mut content_used = 0usize;
        let mut found = Dict::new();
        let mut keys_used = 0usize;
        if !f.dir {
            return Err(Errno::ENOTDIR);
        }
        let fd = f.fd.as_fd();
        let _g = f.lock.lock();
        // d_off cookies are opaque 64-bit values; the kernel takes them back
        // bit for bit.
        sys::lseek(fd, offset as libc::off_t, libc::SEEK_SET)?;
        let limit = (size as usize).min(MAX_READDIR);
        let at_root = f.gfid == Gfid::ROOT;
        let mut buf = vec![0u8; 32 * 1024];
        let (mut used, mut out) = (0usize, Vec::new());
        'fill: loop {
            let n = sys::getdents(fd, &mut buf)?;
            if n == 0 {
                break;
            }
            for e in sys::parse_dirents(&buf[..n])? {
                if at_root && e.name == handle::HIDDEN.as_bytes() {
                    continue;
                }
                let Ok(name) = std::str::from_utf8(e.name) else {
                    tracing::warn!(name = %String::from_utf8_lossy(e.name), "readdir: skipping a name that is not UTF-8");
                    continue;
                };
                let cost = ENTRY_OVERHEAD + name.len() + 1;
                if !out.is_empty() && used + cost > limit {
                    break 'fill;
                }
                let mut values: Vec<(String, Vec<u8>)> = Vec::new();
                if !xattrs.is_empty()
                    && name != "."
                    && name != ".."
                    && let Ok(cname) = cstr(name.as_bytes())
                {
                    let t = Target::At(fd, &cname);
                    for (xname, c) in xattrs {
                        if let Ok(v) = t.getxattr(c) {
                            values.push((keys::dirent_xattr(name, xname), v));
                        }
                    }
                }
                if !out.is_empty() && keys_used + values.len() > MAX_DIRENT_XATTR_KEYS {
                    break 'fill;
                }
                keys_used += values.len();
                for (k, v) in values {
                    found.set_bytes(k, v);
                }
                used += cost;
                let mut d_type = file_type(e.d_type);
                let iatt = if plus || d_type == FileType::Unknown {
                    self.child_iatt(fd, f.gfid, name).unwrap_or_default()
                } else {
                    Iatt::default()
                };
                if d_type == FileType::Unknown {
                    d_type = iatt.file_type();
                }
                if content_max > 0
                    && d_type == FileType::Regular
                    && iatt.size <= content_max
                    && content_used + iatt.size as usize <= MAX_DIRENT_CONTENT
                    && let Some(data) = entry_content(fd, name, &iatt)
                {
                    content_used += data.len();
                    found.set_bytes(keys::dirent_xattr(name, CONTENT), data);
                }
                out.push(DirEntry {
                    name: name.to_string(),
                    d_off: e.d_off,
                    d_type,
                    iatt: if plus { iatt } else { Iatt::default() },
                });
            }
        }
        if !xattrs.is_empty() {
            found.set_u64(keys::DIRENT_XATTRS, xattrs.len() as u64);
        }
        Ok((out, found))
    }

    /// Attributes of `name` in the open directory `dir` (readdirp).
    fn child_iatt(&self, dir: BorrowedFd<'_>, dir_gfid: Gfid, name: &str) -> Sys<Iatt> {
        if name == "." || (name == ".." && dir_gfid == Gfid::ROOT) {
            return Ok(iatt(&sys::fstat(dir)?, dir_gfid));
        }
        let cname = cstr(name.as_bytes())?;
        let st = sys::fstatat(dir, &cname, 0)?;
        let gfid = read_gfid(Target::At(dir, &cname)).ok().flatten().unwrap_or(Gfid::NULL);
        Ok(iatt(&st, gfid))
    }

    fn statfs(&self) -> Sys<Statvfs> {
        let v = sys::fstatvfs(self.brick.root_fd())?;
        let shared = self.shared.load(Ordering::Relaxed).max(1);
        #[allow(clippy::unnecessary_cast)]
        Ok(Statvfs {
            bsize: v.f_bsize as u64,
            frsize: v.f_frsize as u64,
            blocks: v.f_blocks as u64 / shared,
            bfree: v.f_bfree as u64 / shared,
            bavail: v.f_bavail as u64 / shared,
            files: v.f_files as u64 / shared,
            ffree: v.f_ffree as u64 / shared,
            favail: v.f_favail as u64 / shared,
            fsid: v.f_fsid as u64,
            flag: v.f_flag as u64,
            namemax: v.f_namemax as u64,
        })
    }

    fn xattrop(&self, t: Target<'_>, gfid: Gfid, op: XattropOp, xattrs: &Dict, xdata: &Dict) -> FopResult {
        let width = match op {
            XattropOp::AddArray => 4,
            XattropOp::AddArray64 => 8,
        };
        let mut items = Vec::with_capacity(xattrs.len());
        for (k, v) in xattrs.iter() {
            if is_protected(gfid, k) {
                return Err(Errno::EPERM);
            }
            let Value::Bytes(b) = v else { return Err(Errno::EINVAL) };
            if b.len() % width != 0 || b.len() > 65536 {
                return Err(Errno::EINVAL);
            }
            items.push((xattr_name(k)?, k, b));
        }
        let _i = self.brick.inode_locks.lock_all(&[&[&gfid.0]]);
        let mut out = Dict::new();
        for (name, key, delta) in items {
            let mut cur = vec![0u8; delta.len()];
            match t.getxattr_into(&name, &mut cur) {
                // A shorter stored value counts as zero-padded.
                Ok(_) | Err(Errno::ENODATA) => {}
                Err(e) => return Err(e),
            }
            if delta.iter().any(|&b| b != 0) {
                add_arrays(&mut cur, delta, width);
                t.setxattr(&name, &cur, 0)?;
            }
            out.set_bytes(key.clone(), cur);
        }
        let mut rsp = Response::from(Reply::Xattrs(out));
        rsp.xdata = self.fill_xdata(t, gfid, xdata);
        Ok(rsp)
    }
}

/// Element-wise wrapping add of big-endian integers `width` bytes wide.
fn add_arrays(cur: &mut [u8], delta: &[u8], width: usize) {
    for (c, d) in cur.chunks_exact_mut(width).zip(delta.chunks_exact(width)) {
        if width == 4 {
            let v =
                i32::from_be_bytes([c[0], c[1], c[2], c[3]]).wrapping_add(i32::from_be_bytes([d[0], d[1], d[2], d[3]]));
            c.copy_from_slice(&v.to_be_bytes());
        } else {
            let mut a = [0u8; 8];
            let mut b = [0u8; 8];
            a.copy_from_slice(c);
            b.copy_from_slice(d);
            c.copy_from_slice(&i64::from_be_bytes(a).wrapping_add(i64::from_be_bytes(b)).to_be_bytes());
        }
    }
}

/// xattrs clients may not change: the gfid anywhere, the volume id on the
/// root.
fn is_protected(gfid: Gfid, name: &str) -> bool {
    name == GFID_XATTR || (gfid == Gfid::ROOT && name == VOLUME_ID_XATTR)
}

fn set_xattrs(t: Target<'_>, gfid: Gfid, xattrs: &Dict, flags: u32) -> Sys<()> {
    if flags & !(xattr_flags::CREATE | xattr_flags::REPLACE) != 0 {
        return Err(Errno::EINVAL);
    }
    let mut f = 0;
    if flags & xattr_flags::CREATE != 0 {
        f |= libc::XATTR_CREATE;
    }
    if flags & xattr_flags::REPLACE != 0 {
        f |= libc::XATTR_REPLACE;
    }
    if xattrs.keys().any(|k| is_protected(gfid, k)) {
        return Err(Errno::EPERM);
    }
    for (k, v) in xattrs.iter() {
        t.setxattr(&xattr_name(k)?, &xattr_bytes(v), f)?;
    }
    Ok(())
}

fn get_xattrs(t: Target<'_>, name: &str) -> Sys<Dict> {
    let mut out = Dict::new();
    if !name.is_empty() {
        out.set_bytes(name, t.getxattr(&xattr_name(name)?)?);
        return Ok(out);
    }
    for n in t.listxattr()? {
        let Ok(key) = String::from_utf8(n) else { continue };
        match t.getxattr(&xattr_name(&key)?) {
            Ok(v) => out.set_bytes(key, v),
            Err(Errno::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn remove_xattr(t: Target<'_>, gfid: Gfid, name: &str) -> Sys<()> {
    if is_protected(gfid, name) {
        return Err(Errno::EPERM);
    }
    t.removexattr(&xattr_name(name)?)
}

fn apply_attr(t: Target<'_>, a: &SetAttr) -> Sys<()> {
    if a.uid.is_some() || a.gid.is_some() {
        t.chown(a.uid, a.gid)?;
    }
    if let Some(m) = a.mode {
        match t {
            Target::Fd(fd) => sys::fchmod(fd, m & 0o7777)?,
            Target::At(d, p) => sys::chmod_at_nofollow(d, p, m & 0o7777)?,
        }
    }
    if a.atime.is_some() || a.mtime.is_some() {
        t.utimes(a.atime, a.mtime)?;
    }
    Ok(())
}

/// POSIX permission check of `mask` (`R_OK` 4, `W_OK` 2, `X_OK` 1) for the
/// caller.
fn access_ok(st: &libc::stat, ctx: &CallCtx, mask: u32) -> bool {
    let mask = mask & 7;
    if mask == 0 {
        return true;
    }
    let mode = st.st_mode;
    if ctx.uid == 0 {
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        return mask & 1 == 0 || is_dir || mode & 0o111 != 0;
    }
    let bits = if ctx.uid == st.st_uid {
        mode >> 6
    } else if ctx.gid == st.st_gid || ctx.groups.contains(&st.st_gid) {
        mode >> 3
    } else {
        mode
    } & 7;
    bits & mask == mask
}

/// About how many bytes `fop` takes on the brick's file system, for the
/// fops the reserve may refuse (None: never refused).
fn takes_space(fop: &Fop) -> Option<u64> {
    const INODE: u64 = 4096;
    match fop {
        Fop::Writev { data, .. } => Some(data.len() as u64),
        Fop::Fallocate { len, mode, .. } if mode & libc::FALLOC_FL_PUNCH_HOLE as u32 == 0 => Some(*len),
        Fop::Zerofill { len, .. } | Fop::CopyFileRange { len, .. } => Some(*len),
        Fop::Create { .. } | Fop::Mknod { .. } | Fop::Mkdir { .. } | Fop::Symlink { .. } | Fop::Link { .. } => {
            Some(INODE)
        }
        _ => None,
    }
}

/// `o-direct-min-size` when the option is not given.
const DIRECT_MIN_DEFAULT: u64 = 512 * 1024;

/// True when a write of `len` bytes at `offset` meets O_DIRECT's alignment.
fn direct_aligned(offset: u64, len: usize) -> bool {
    offset.is_multiple_of(sys::ALIGN as u64) && len.is_multiple_of(sys::ALIGN)
}

/// Writes `data` through the `O_DIRECT` descriptor `direct` (from an
/// aligned copy when the buffer itself is not aligned); falls back to the
/// buffered `file` when the file system refuses the alignment (EINVAL
/// comes before anything is written).
fn write_direct(direct: BorrowedFd<'_>, file: BorrowedFd<'_>, data: &[u8], offset: u64) -> Sys<()> {
    let r = if (data.as_ptr() as usize).is_multiple_of(sys::ALIGN) {
        sys::pwrite_all(direct, data, offset)
    } else {
        sys::with_aligned_copy(data, |buf| sys::pwrite_all(direct, buf, offset))
    };
    match r {
        Err(Errno::EINVAL) if direct.as_raw_fd() != file.as_raw_fd() => sys::pwrite_all(file, data, offset),
        r => r,
    }
}

/// Reads up to `size` bytes at `offset` (fewer at end of file).
fn read_at(f: &OpenFd, size: usize, offset: u64) -> Sys<Vec<u8>> {
    if size > MAX_IO {
        return Err(Errno::EINVAL);
    }
    let file = f.file()?;
    if f.direct {
        let mut buf = sys::AlignedBuf::zeroed(size)?;
        let n = sys::pread_full(file, buf.as_mut_slice(), offset)?;
        return Ok(buf.as_slice()[..n].to_vec());
    }
    let mut buf = vec![0u8; size];
    let n = sys::pread_full(file, &mut buf, offset)?;
    buf.truncate(n);
    Ok(buf)
}

/// Writes zeroes over a range (extending the file if needed).
fn zerofill(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Sys<()> {
    match sys::fallocate(fd, libc::FALLOC_FL_ZERO_RANGE, offset, len) {
        Err(Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINVAL) => {}
        r => return r,
    }
    let chunk = vec![0u8; (len.min(1 << 20)) as usize];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        sys::pwrite_all(fd, &chunk[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Copies up to `len` bytes; falls back to read + write where the kernel
/// cannot copy between the two files.
fn copy_range(fi: BorrowedFd<'_>, off_in: u64, fo: BorrowedFd<'_>, off_out: u64, len: u64, flags: u32) -> Sys<u64> {
    let (mut oi, mut oo) = (sys::off(off_in)?, sys::off(off_out)?);
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(1 << 30) as usize;
        match sys::copy_file_range(fi, &mut oi, fo, &mut oo, want, flags) {
            Ok(0) => return Ok(done),
            Ok(n) => done += n as u64,
            Err(Errno::EXDEV | Errno::ENOSYS | Errno::EOPNOTSUPP) if done == 0 && flags == 0 => break,
            Err(e) => return Err(e),
        }
    }
    if done >= len {
        return Ok(done);
    }
    let mut buf = vec![0u8; (len - done).min(1 << 20) as usize];
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let n = sys::pread_full(fi, &mut buf[..want], off_in + done)?;
        if n == 0 {
            break;
        }
        sys::pwrite_all(fo, &buf[..n], off_out + done)?;
        done += n as u64;
    }
    Ok(done)
}

/// Largest read or write `inline-fops` runs on the calling task.
const INLINE_MAX: usize = 128 * 1024;

/// Fops that normally finish in the page cache (see `inline-fops`).
fn inline_ok(fop: &Fop) -> bool {
    match fop {
        Fop::Readv { size, .. } => (*size as usize) <= INLINE_MAX,
        // An O_SYNC / O_DSYNC write fsyncs: the pool, like fsync.
        Fop::Writev { data, flags, .. } => {
            data.len() <= INLINE_MAX && *flags as i32 & (libc::O_SYNC | libc::O_DSYNC) == 0
        }
        Fop::Stat { .. }
        | Fop::Fstat { .. }
        | Fop::Lookup { .. }
        | Fop::Getxattr { .. }
        | Fop::Fgetxattr { .. }
        | Fop::Xattrop { .. }
        | Fop::Fxattrop { .. }
        | Fop::Access { .. }
        | Fop::Readlink { .. }
        | Fop::Open { .. }
        | Fop::Opendir { .. }
        | Fop::Flush { .. }
        | Fop::Release { .. }
        | Fop::Releasedir { .. }
        | Fop::Statfs { .. }
        | Fop::Seek { .. } => true,
        _ => false,
    }
}

/// Runs `f` on the blocking pool (inline when there is no tokio runtime).
async fn blocking(f: impl FnOnce() -> FopResult + Send + 'static) -> FopResult {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => rt.spawn_blocking(f).await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "storage/posix: a fop's blocking task failed");
            Err(Errno::EIO)
        }),
        Err(_) => f(),
    }
}

impl Xlator for Posix {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let kind = req.fop.kind();
            let span = tracing::debug_span!("posix", fop = kind.name(), gfid = %req.fop.gfid());
            if matches!(req.fop, Fop::Forget { .. }) {
                return ok(Reply::Empty);
            }
            let inline = inner.inline.load(Ordering::Relaxed) && inline_ok(&req.fop);
            let run = move || {
                let _e = span.enter();
                let r = inner.dispatch(&ctx, req);
                if let Err(e) = &r {
                    tracing::debug!(error = %e, "failed");
                }
                r
            };
            if inline { run() } else { blocking(run).await }
        })
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        match (from, event) {
            (EventFrom::Graph, Event::ParentUp) => {
                self.events.send(Event::ChildUp);
                None
            }
            (EventFrom::Graph, Event::ParentDown) => {
                self.events.send(Event::ChildDown);
                None
            }
            (EventFrom::Graph, Event::ClientGone { client_id }) => {
                let mut gone = Vec::new();
                self.inner.fds.retain(|_, f| {
                    if *f.client == *client_id {
                        gone.push(f.clone());
                        false
                    } else {
                        true
                    }
                });
                for f in &gone {
                    self.inner.closed(f);
                }
                if !gone.is_empty() {
                    tracing::debug!(client = %client_id, fds = gone.len(), "released the fds of a gone client");
                }
                None
            }
            (EventFrom::Graph, _) => None,
            (EventFrom::Child(_), e) => Some(e),
        }
    }

    fn reconfigure(&self, o: &Options) -> Result<(), ReconfigureError> {
        let vid = parse_volume_id(o).map_err(|e| ReconfigureError::Invalid(e.to_string()))?;
        if o.path("directory") != Some(self.inner.brick.path.as_path()) || vid != self.inner.volume_id {
            return Err(ReconfigureError::Unsupported);
        }
        if let Some(n) = o.int("max-open-fds").and_then(|v| usize::try_from(v).ok()) {
            self.inner.max_fds.store(n.max(1), Ordering::Relaxed);
        }
        if let Some(n) = o.int("shared-brick-count").and_then(|v| u64::try_from(v).ok()) {
            self.inner.shared.store(n.max(1), Ordering::Relaxed);
        }
        self.inner.inline.store(o.bool("inline-fops").unwrap_or(true), Ordering::Relaxed);
        self.inner.direct_min.store(direct_min(o), Ordering::Relaxed);
        self.inner.reserve.set(parse_reserve(o).map_err(|e| ReconfigureError::Invalid(e.to_string()))?);
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let i = &self.inner;
        vec![
            ("directory".into(), i.brick.path.display().to_string()),
            ("volume-id".into(), i.volume_id.map(|g| g.to_string()).unwrap_or_default()),
            ("open-fds".into(), i.nfds.load(Ordering::Relaxed).to_string()),
            ("max-open-fds".into(), i.max_fds.load(Ordering::Relaxed).to_string()),
            ("shared-brick-count".into(), i.shared.load(Ordering::Relaxed).to_string()),
        ]
    }

    fn fini(&self) {
        let mut all = Vec::new();
        self.inner.fds.retain(|_, f| {
            all.push(f.clone());
            false
        });
        for f in &all {
            self.inner.closed(f);
        }
    }
}
