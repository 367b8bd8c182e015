//! storage/posix: the translator that stores a brick's files in a local
//! directory, GlusterFS's posix xlator.
//!
//! Files and directories live under their real names in the brick
//! directory; every inode carries its gfid in the `trusted.gfid` xattr and is
//! reachable by gfid through `.glusterfs/xx/yy/<gfid>` handles (the `handle`
//! submodule documents the layout and how resolution stays inside the brick).
//! `.glusterfs` is invisible to clients. Directories resolved by gfid are
//! kept open (at most 1024, dropped when removed; the dump's
//! `open-dirs-cached`): a directory's handle leads through its parents'
//! handles up to the root, and every entry fop resolves its parent.
//!
//! A fop that normally finishes in the page cache runs its system calls on
//! the calling task (`inline-fops`); one that may wait for the disk (an
//! fsync, an O_DSYNC write, a truncation) goes to a sync thread, which then
//! carries the fop on to its reply (`task::offload`), when the fop is run
//! where it arrived; in a task of its own it blocks in place
//! (`task::block_in_task`), or on tokio's blocking pool where the runtime
//! cannot block in place. Per-fd state
//! (the real descriptor) is kept in bounded [`FdSlots`] keyed by the
//! caller's [`FdId`]; `max-open-fds` bounds them (EMFILE beyond). An
//! unlinked file stays readable and writable through fds open on it: its
//! handle moves to `.glusterfs/unlink/<gfid>` and keeps the inode (found by
//! gfid, for a reopen after a graph switch) until the last such fd is
//! released; a brick start drops what a stopped brick left there.
//!
//! Conventions worth knowing:
//! - `nlink` of a non-directory does not count its handle link, so a file
//!   with one name reports 1 (and an unlinked, still open file 0).
//! - readdir and readdirp return `.` and `..` (as GlusterFS does); `d_off`
//!   is the file system's own cookie, so a listing resumes from any returned
//!   `d_off`. `size` is spent at [`ENTRY_OVERHEAD`] plus the name per entry,
//!   and at least one entry is returned while any remain.
//! - xattrop replies with the values after the change (GlusterFS does the
//!   same); a value of all zeros only reads. A missing xattr counts as
//!   zeros, and replicate's counters (`trusted.afr.*`) that return to zero
//!   are removed (at once, or at the inode's last close here while it is
//!   open), so a file at rest keeps only its gfid and its times, which fit
//!   in a 256-byte ext4 inode (`mdata`).
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
//!   When more than one xattr is asked for (here and in lookup's xdata),
//!   the inode's xattr names are listed once and only those present are
//!   read: most asked are absent, and each read by name walks a path.
//! - Creating fops set the request xdata's [`CREATE_XATTR_PREFIX`] keys
//!   (`trusted.glusterfs.dht*`) as xattrs of the new inode.
//! - Access checks the caller's uid/gid/groups against the mode bits; no
//!   other fop checks permissions (the brick acts with its own rights).
//! - Lock fops, lease and ipc answer ENOSYS: features/locks sits above.
//! - Reads, rchecksum and similar buffers are bounded by [`MAX_IO`].

mod entry_ops;
mod fd_table;
mod gen_cache;
mod handle;
mod inode_fd_ops;
mod mdata;
mod purge;
mod reserve;
mod sys;
#[cfg(test)]
mod tests;
mod xattr;

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use xlfs_sdk::dict::keys::OPEN_FD_COUNT;
use xlfs_sdk::options::{Opt, kind};

use bytes::Bytes;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use xlfs_sdk::ctx::LentMem;
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

use entry_ops::*;
use fd_table::*;
use inode_fd_ops::*;
use xattr::*;

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "storage/posix",
    description: "stores a brick's files in a local directory, with gfid xattrs and .glusterfs handles",
    options: OPTIONS,
    min_children: 0,
    max_children: 0,
    build,
};

const DIRECTORY: Opt<kind::PathKind> = Opt::optional("directory")
    .desc("The brick directory (required). Must exist; its root gets the root gfid and a .glusterfs handle store.");
const VOLUME_ID: Opt<kind::Str> = Opt::optional("volume-id").desc(
    "The volume's uuid. The brick root's trusted.glusterfs.volume-id xattr must match it; a brick without \
         the xattr gets it set.",
);
const SHARED_BRICK_COUNT: Opt<kind::Int> = Opt::int("shared-brick-count", "1").range(1.0, 1_048_576.0).desc(
    "How many bricks of the volume share this brick's file system; statfs sizes and inode counts are divided \
         by it, as GlusterFS does.",
);
const MAX_OPEN_FDS: Opt<kind::Int> = Opt::int("max-open-fds", "65536")
    .range(1.0, 16_777_216.0)
    .desc("Most fds open at once on this brick; open, create and opendir beyond it fail with EMFILE.");
const INLINE_FOPS: Opt<kind::Bool> = Opt::bool("inline-fops", true).desc(
    "Run the fops that normally finish in the page cache (reads and writes up to 128 KiB, lookup, stat, \
         xattr reads and xattrop, open without O_TRUNC, create without O_TRUNC or with O_EXCL, mkdir, mknod, symlink, link, \
         setattr (owner, mode, times), flush, release, seek, statfs; unlink while unlink-behind frees the files it removes) on \
         the calling task, as part of reading the request, instead of handing each to a sync thread: no thread hand-off \
         per fop (against the blocking pool, about 14% more pgbench TPS on a replica-3 mount on 2 cores; 10-21% less \
         CPU per file for rm -rf; creates 12% and an untar 15% sooner). fsync, O_SYNC/O_DSYNC writes, truncate and \
         truncating opens, fallocate, rename and rmdir always go to a sync thread. Journaled file systems gain too: \
         bricks on XFS and on ext4 with a journal untarred 20-30% sooner with it on, also while a 1 GiB write ran \
         on the same mount. Off: every fop does (GlusterFS's io-threads model), for disks where a page-cache miss \
         is slow.",
);
const RESERVE: Opt<kind::Str> = Opt::str("reserve", "1").desc(
    "Space the brick keeps free (GlusterFS's storage.reserve): a percentage of its file system (a bare \
         number or N%, 0 to 100; 0 turns it off) or a size (40MB). While less is available, writes, fallocate, \
         zero-fill, copy_file_range and the fops that make inodes fail with ENOSPC before changing anything; \
         deletes, truncation, renames and xattr fops (replicate's changelog) still work, and writes go through \
         again once space is freed. Checked on each such fop: statfs at most every 100 ms while more than twice \
         the reserve is left, on every such fop closer to it (bricks sharing a file system see each other).",
);
const O_DIRECT_MIN_SIZE: Opt<kind::Size> = Opt::size("o-direct-min-size", "512KB").desc(
        "Writes of at least this many bytes, at a 4 KiB-aligned offset and of a 4 KiB multiple (write-behind's \
         aggregated 1MB writes), go around the brick's page cache (O_DIRECT through a second descriptor): the \
         brick copies no data into memory it then has to write back, which was 40% of the CPU of a sequential \
         write on a replica-3 volume on one machine. Smaller or unaligned writes, O_APPEND fds and file systems \
         without O_DIRECT stay buffered, and so does everything on a tmpfs or ramfs brick (its pages are the \
         store: nothing to go around, and the aligned copy would only cost). Reads of such data come from the disk, not the \
         brick's cache. 0: off (GlusterFS's behaviour).",
    );
const O_DIRECT_READ_MIN_SIZE: Opt<kind::Size> = Opt::size("o-direct-read-min-size", "512KB").desc(
    "Reads of at least this many bytes, at a 4 KiB-aligned offset and of a 4 KiB multiple (the kernel's \
         readahead on a client: a sequential read), go around the brick's page cache (O_DIRECT through a second \
         descriptor, into the reply's buffer or a local client's shared memory): the client keeps what it read \
         in its own page cache, so a second copy of the same pages on the brick cost a copy and fresh memory \
         per read (on this project's 2-core machine the brick's page faults were most of its CPU in a \
         sequential read). Dirty pages of the range are written first by the kernel, so such a read sees \
         every write. Smaller or unaligned reads stay buffered, as does everything on a tmpfs or ramfs brick. \
         Another client reading the same file later reads it from the disk, not the brick's cache. 0: off \
         (GlusterFS's behaviour).",
);
const CTIME: Opt<kind::Bool> = Opt::bool("ctime", true).desc(
    "Keep each inode's ctime, mtime and atime as the client stamped them (features/utime in the client \
         graph), in the xattr trusted.xlfs.mdata, and answer with those (GlusterFS's storage.ctime, on by \
         default there too): the copies of a replica set then show the same times, and the bricks' own \
         bookkeeping (replicate's changelog, the index) does not move them, so tar and make see no change \
         that did not happen. A file's data changes within a second of the last one written are kept in \
         memory and written once the second is over, at release, before a full fsync or when the brick \
         stops (an fdatasync promises no times; writing them each time cost a journal commit per WAL \
         write). Off: every copy shows its own file system's times.",
);
const UNLINK_BEHIND: Opt<kind::Bool> = Opt::bool("unlink-behind", true).desc(
    "Free a regular file whose last name an unlink or rename removed (and that no fd holds open) on a thread \
         of the brick, not in the fop (CephFS's purge queue; MooseFS's chunkservers delete chunks behind the \
         master likewise): the handle, its last link, is removed with a descriptor of the file kept for the \
         thread, whose close frees it (at most 1024 such, or an eighth of the open-file limit; beyond, the handle moves to .glusterfs/unlink and is \
         dropped there). Freeing the blocks (data, and an xattr block where the xattrs do not fit in the inode) is most \
         of an unlink's time on a file system mounted with discard. At most 65536 files wait (beyond, the unlink frees its file itself); a fop \
         that changes the file system and fails with ENOSPC while files wait frees them and runs again; when the brick stops, \
         the files kept by a descriptor are freed as it exits and the parked ones at its next start (if the machine itself \
         crashes, the brick file system's orphan recovery frees the former, or e2fsck on an ext4 without a journal). \
         statfs shows the space once freed. \
         Off: the unlink frees the file.",
);

const OPTIONS: &[OptionDecl] = &[
    DIRECTORY.decl,
    VOLUME_ID.decl,
    SHARED_BRICK_COUNT.decl,
    OptionDecl::new("fips-mode-rchecksum", OptType::Bool).default("off").desc(
        "Accepted for GlusterFS volfiles; has no effect: rchecksum's strong checksum is always SHA-256 \
         (what GlusterFS uses in FIPS mode).",
    ),
    MAX_OPEN_FDS.decl,
    INLINE_FOPS.decl,
    RESERVE.decl,
    O_DIRECT_MIN_SIZE.decl,
    O_DIRECT_READ_MIN_SIZE.decl,
    CTIME.decl,
    UNLINK_BEHIND.decl,
];

/// Creating fops (create, mknod, mkdir, symlink) set the request xdata's
/// keys that start with this as xattrs of the new inode, with the gfid,
/// before answering (GlusterFS's posix sets a creating fop's xattrs the
/// same way): cluster/distribute's link files.
pub const CREATE_XATTR_PREFIX: &str = "trusted.glusterfs.dht";

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

fn parse_reserve(o: &Options) -> Result<xlfs_sdk::options::Share, SetupError> {
    let raw = RESERVE.get(o);
    xlfs_sdk::options::Share::parse(raw).ok_or_else(|| SetupError::BadReserve(raw.to_string()))
}

fn parse_volume_id(o: &Options) -> Result<Option<Gfid>, SetupError> {
    VOLUME_ID.given(o).map(|s| Gfid::parse(s.trim()).ok_or_else(|| SetupError::BadVolumeId(s.to_string()))).transpose()
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
    /// `o-direct-read-min-size` (0: off).
    direct_read_min: AtomicU64,
    /// The brick is on tmpfs or ramfs: `o-direct-min-size` and
    /// `o-direct-read-min-size` do not apply.
    in_memory: bool,
    /// `reserve`.
    reserve: reserve::Reserve,
    fds: FdSlots<Arc<OpenFd>>,
    nfds: AtomicUsize,
    /// Open fds per inode (entries exist only while some fd is open).
    open: Mutex<HashMap<Gfid, u32>>,
    /// Replicate's counters an xattrop brought back to zero while the inode
    /// was open, removed at its last close (`xattr`).
    zeroed: Mutex<HashMap<Gfid, Vec<CString>>>,
    /// `ctime`: stamped times kept and answered with (see `mdata`).
    ctime: AtomicBool,
    /// Stored times of recently seen inodes.
    times: mdata::Cache,
    /// Data-change times not written yet (see `mdata`).
    deferred: mdata::Deferred,
}

impl Posix {
    fn new(init: InitCtx) -> Result<Posix, SetupError> {
        let o = &init.options;
        let dir = DIRECTORY.get(o).ok_or(SetupError::NoDirectory)?;
        let volume_id = parse_volume_id(o)?;
        let brick = Brick::open(dir)?;
        brick.purge_behind.store(UNLINK_BEHIND.get(o), Ordering::Relaxed);
        if let Some(want) = volume_id {
            check_volume_id(&brick, want)?;
        }
        let max = MAX_OPEN_FDS.count(o).max(1);
        let inner = Inner {
            volume_id,
            max_fds: AtomicUsize::new(max),
            inline: AtomicBool::new(INLINE_FOPS.get(o)),
            direct_min: AtomicU64::new(O_DIRECT_MIN_SIZE.get(o)),
            direct_read_min: AtomicU64::new(O_DIRECT_READ_MIN_SIZE.get(o)),
            in_memory: sys::in_memory(brick.root_fd()),
            reserve: reserve::Reserve::new(parse_reserve(o)?),
            shared: AtomicU64::new(SHARED_BRICK_COUNT.count(o).max(1) as u64),
            // The counter bounds the total; the slot map's own capacity only
            // backs it up (it is per shard).
            fds: FdSlots::with_capacity(max.max(65536).saturating_mul(16)),
            nfds: AtomicUsize::new(0),
            open: Mutex::new(HashMap::new()),
            zeroed: Mutex::new(HashMap::new()),
            ctime: AtomicBool::new(CTIME.get(o)),
            times: mdata::cache(),
            deferred: mdata::Deferred::default(),
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

/// Whether the brick opens `n` for a client: regular files only. A FUSE
/// client's kernel opens FIFOs, sockets and device nodes itself and never
/// asks; a client that asks anyway would hang a brick thread on a FIFO or
/// read the brick host's devices.
fn openable(n: &Node) -> Sys<()> {
    match n.fmt() {
        libc::S_IFREG => Ok(()),
        libc::S_IFDIR => Err(Errno::EISDIR),
        libc::S_IFLNK => Err(Errno::ELOOP),
        _ => Err(Errno::ENXIO),
    }
}

fn ok(r: Reply) -> FopResult {
    Ok(r.into())
}

impl Inner {
    fn dir(&self, g: Gfid) -> Sys<Node> {
        let n = self.brick.resolve_gfid(g)?;
        if n.is_dir() { Ok(n) } else { Err(Errno::ENOTDIR) }
    }

    /// Resolves a gfid, also of a file unlinked while open here: its parked
    /// handle keeps it until the last close, and POSIX says it lives until
    /// then (stat, a nameless lookup and a reopen after a graph switch find
    /// it).
    fn resolve_gfid(&self, g: Gfid) -> Sys<Node> {
        match self.brick.resolve_gfid(g) {
            Err(Errno::ENOENT) if self.open_count(g) > 0 => self.brick.resolve_unlinked(g),
            r => r,
        }
    }

    /// Resolves a location: by gfid when it has one, else by parent + name.
    fn resolve(&self, loc: &Loc) -> Sys<Node> {
        if !loc.gfid.is_null() {
            return self.resolve_gfid(loc.gfid);
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

    /// A fop, its reply given the inodes' stored times (`ctime` on; a
    /// stamped change recorded first: see `mdata`).
    fn dispatch(&self, ctx: &CallCtx, req: Request) -> FopResult {
        // Space the purge thread has not freed yet (`unlink-behind`) is
        // freed before a fop that changes the file system (a write, a
        // create, replicate's xattrop...) is refused for want of it. Only
        // those: an fsync's ENOSPC reports a write-back that failed, once,
        // and running it again would hide that.
        let again = (req.fop.is_modifying() && self.brick.purge_pending() > 0).then(|| req.clone());
        match self.dispatch_stamped(ctx, req) {
            Err(Errno::ENOSPC) if let Some(req) = again => {
                self.brick.purge_now();
                self.dispatch_stamped(ctx, req)
            }
            r => r,
        }
    }

    fn dispatch_stamped(&self, ctx: &CallCtx, req: Request) -> FopResult {
        if !self.ctime.load(Ordering::Relaxed) {
            return self.dispatch_fop(ctx, req);
        }
        let stamp = req.xdata.get_u64(mdata::UTIME).map(Timespec::from_nanos);
        let fop = stamp.map(|_| req.fop.clone());
        let mut rsp = self.dispatch_fop(ctx, req)?;
        let stamped = match (stamp, &fop) {
            (Some(t), Some(fop)) => self.stamp(fop, &rsp, t),
            _ => Vec::new(),
        };
        self.with_times(&mut rsp, &stamped);
        Ok(rsp)
    }

    /// Applies a setattr to the inode `pre` describes; where the stored
    /// times are shown, without the parts that change nothing.
    fn set_attr(&self, t: Target<'_>, attr: &SetAttr, pre: &Iatt) -> Sys<()> {
        if self.ctime.load(Ordering::Relaxed) {
            apply_attr(t, &inode_fd_ops::without_noops(t, attr, pre)?)
        } else {
            apply_attr(t, attr)
        }
    }

    fn dispatch_fop(&self, ctx: &CallCtx, req: Request) -> FopResult {
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
                self.set_attr(t, &attr, &pre)?;
                ok(Reply::PrePost { pre, post: iatt(&t.stat()?, n.gfid) })
            }
            Fop::Fsetattr { fd, attr } => {
                let f = self.fd(fd.id)?;
                let pre = f.iatt()?;
                self.set_attr(Target::Fd(f.fd.as_fd()), &attr, &pre)?;
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
                // Under the inode lock an unlink of the inode's last name
                // either sees this name (and keeps the handle) or has
                // removed the handle before the link looks for it.
                let _i = self.brick.inode_locks.lock_all(&[&[&src.gfid.0]]);
                sys::linkat(self.brick.gfs(), src.handle(), np.dir_fd()?, &ncn)?;
                // A file unlinked while open has a name again (replicate's
                // entry heal links a name to an inode by gfid): its handle
                // leaves `.glusterfs/unlink`.
                self.brick.unpark_handle(&src.gfid)?;
                let n = self.brick.handle_node(src.gfid)?;
                let postparent = self.node_iatt(&np)?;
                ok(Reply::Entry { iatt: iatt(&n.st, n.gfid), postparent })
            }
            Fop::Open { loc, flags, fd } => {
                let r = self.reserve(fd)?;
                let n = self.resolve(&loc)?;
                openable(&n)?;
                if let Some(linkto) = xdata.get_str(keys::OPEN_DATA_ONLY)
                    && n.st.st_mode & 0o7777 == 0o1000
                    && self.brick.target(&n).getxattr(&xattr::xattr_name(linkto)?).is_ok()
                {
                    return Err(Errno::ESTALE);
                }
                let flags = open_flags(flags);
                // Under the inode lock an unlink of the last name either
                // counts this fd (and parks the handle) or has removed the
                // handle before the open.
                let _i = self.brick.inode_locks.lock_all(&[&[&n.gfid.0]]);
                let file = sys::openat(self.brick.gfs(), n.handle(), flags, 0)?;
                if flags & libc::O_TRUNC != 0 {
                    drop_privs(file.as_fd(), sys::fstat(file.as_fd())?.st_mode, ctx)?;
                }
                r.commit(self.open_fd(file, n.gfid, false, flags, ctx))?;
                ok(Reply::Empty)
            }
            Fop::Readv { fd, size, offset, .. } => {
                let f = self.fd(fd.id)?;
                let around = self.goes_around(&self.direct_read_min, offset, size as usize);
                let data = read_at(&f, size as usize, offset, ctx.lent.take(), around)?;
                ok(Reply::Read { data, iatt: f.iatt()? })
            }
            Fop::Writev { fd, data, offset, flags } => {
                let f = self.fd(fd.id)?;
                let file = f.file()?;
                let pre = f.iatt()?;
                let around = self.goes_around(&self.direct_min, offset, data.len());
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
                if !datasync {
                    self.write_deferred_times(f.gfid, Target::Fd(f.fd.as_fd()));
                }
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
                if name == mdata::MDATA_XATTR {
                    self.write_deferred_times(n.gfid, self.brick.target(&n));
                }
                ok(Reply::Xattrs(get_xattrs(self.brick.target(&n), &name)?))
            }
            Fop::Fgetxattr { fd, name } => {
                let f = self.fd(fd.id)?;
                if name == mdata::MDATA_XATTR {
                    self.write_deferred_times(f.gfid, Target::Fd(f.fd.as_fd()));
                }
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
                let data = read_at(&f, len as usize, offset, None, false)?;
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
                // Counters at zero go first (at the last close), then the
                // times: both fit in the inode, all three do not.
                self.closed(&f);
                self.write_deferred_times(f.gfid, Target::Fd(f.fd.as_fd()));
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

/// Largest read or write `inline-fops` runs on the calling task.
const INLINE_MAX: usize = 128 * 1024;

/// Fops that normally finish in the page cache (see `inline-fops`);
/// `freed_behind`, asked for an unlink only: a file it removes now is
/// freed by the purge thread ([`handle::Brick::frees_behind`]).
fn inline_ok(fop: &Fop, freed_behind: impl FnOnce() -> bool) -> bool {
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
        | Fop::Opendir { .. }
        | Fop::Flush { .. }
        | Fop::Release { .. }
        | Fop::Releasedir { .. }
        | Fop::Statfs { .. }
        | Fop::Seek { .. } => true,
        // New inodes and names: allocations in cached metadata. An open
        // that truncates frees the file's blocks (a discard each, on a file
        // system mounted with discard): the pool; with O_EXCL (every create
        // async-dirops sends) there is nothing to truncate.
        Fop::Open { flags, .. } => *flags as i32 & libc::O_TRUNC == 0,
        Fop::Create { flags, .. } => *flags as i32 & (libc::O_TRUNC | libc::O_EXCL) != libc::O_TRUNC,
        Fop::Mkdir { .. } | Fop::Mknod { .. } | Fop::Symlink { .. } | Fop::Link { .. } => true,
        // Owner, mode and times: the inode in cache (a size is truncate's).
        Fop::Setattr { .. } | Fop::Fsetattr { .. } => true,
        // A name removed: the directory and the inode (which the lookup
        // before it read) change in the cache, and a file that loses its
        // last name is freed by the purge thread, not here.
        Fop::Unlink { .. } => freed_behind(),
        _ => false,
    }
}

/// Writes the deferred times whose window is over, every window, until
/// none is left (or the brick is gone); without a runtime, now.
fn write_deferred_times_later(inner: std::sync::Weak<Inner>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        if let Some(i) = inner.upgrade() {
            i.write_due_times(true);
        }
        return;
    };
    rt.spawn(async move {
        loop {
            tokio::time::sleep(mdata::DEFER_WINDOW).await;
            let Some(i) = inner.upgrade() else { return };
            match tokio::task::spawn_blocking(move || i.write_due_times(false)).await {
                Ok(true) => {}
                Ok(false) | Err(_) => return,
            }
        }
    });
}

/// Runs `f`, a fop that may wait for the disk, where it cannot hold up
/// other work ([`crate::task::blocking`]); a panic in it is EIO.
async fn blocking(f: impl FnOnce() -> FopResult + Send + 'static) -> FopResult {
    crate::task::blocking(f).await.unwrap_or_else(|| {
        tracing::error!("storage/posix: a fop's blocking call panicked");
        Err(Errno::EIO)
    })
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
            let inline = inner.inline.load(Ordering::Relaxed) && inline_ok(&req.fop, || inner.brick.frees_behind());
            // Only a stamped fop can leave times deferred (see `mdata`).
            let stamped = req.xdata.contains(mdata::UTIME);
            let me = inner.clone();
            let run = move || {
                let _e = span.enter();
                let r = inner.dispatch(&ctx, req);
                if let Err(e) = &r {
                    tracing::debug!(error = %e, "failed");
                }
                r
            };
            let r = if inline { run() } else { blocking(run).await };
            if stamped && me.deferred.wants_timer() {
                write_deferred_times_later(Arc::downgrade(&me));
            }
            r
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
        if DIRECTORY.get(o) != Some(self.inner.brick.path.as_path()) || vid != self.inner.volume_id {
            return Err(ReconfigureError::Unsupported);
        }
        self.inner.max_fds.store(MAX_OPEN_FDS.count(o).max(1), Ordering::Relaxed);
        self.inner.shared.store(SHARED_BRICK_COUNT.count(o).max(1) as u64, Ordering::Relaxed);
        self.inner.inline.store(INLINE_FOPS.get(o), Ordering::Relaxed);
        self.inner.brick.purge_behind.store(UNLINK_BEHIND.get(o), Ordering::Relaxed);
        self.inner.direct_min.store(O_DIRECT_MIN_SIZE.get(o), Ordering::Relaxed);
        self.inner.direct_read_min.store(O_DIRECT_READ_MIN_SIZE.get(o), Ordering::Relaxed);
        self.inner.ctime.store(CTIME.get(o), Ordering::Relaxed);
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
            ("open-dirs-cached".into(), i.brick.dirs_cached().to_string()),
            ("xattrs-in-inode".into(), i.brick.xattrs_in_inode.map_or("unknown".into(), |f| f.to_string())),
        ]
    }

    fn fini(&self) {
        self.inner.write_due_times(true);
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
