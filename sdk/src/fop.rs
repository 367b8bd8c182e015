//! The fop model: [`Fop`] (one variant per file operation, GlusterFS's set),
//! [`Reply`] and the [`Request`]/[`Response`] pair a translator sees.

use bytes::Bytes;

use crate::dict::Dict;
use crate::errno::Errno;
use crate::types::*;

macro_rules! fop_kinds {
    ($($kind:ident = $code:expr, $name:expr;)*) => {
        /// The operation a [`Fop`] performs, without its arguments. The
        /// numeric code is the ABI v1 fop code (stable; see `sdk/ABI.md`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum FopKind { $(#[doc = $name] $kind = $code,)* }

        impl FopKind {
            /// Every kind, in code order.
            pub const ALL: &'static [FopKind] = &[$(FopKind::$kind,)*];

            /// How many kinds there are: the length of a table indexed by
            /// [`FopKind::index`].
            pub const COUNT: usize = FopKind::ALL.len();

            /// A dense index, `0..FopKind::COUNT` (the code minus one: the
            /// codes are contiguous from 1, checked at compile time), for
            /// fixed per-kind tables such as the graph's fop timings.
            #[inline]
            pub const fn index(self) -> usize {
                self as usize - 1
            }

            /// GlusterFS's upper-case name (`"LOOKUP"`, `"FINODELK"`).
            pub fn name(self) -> &'static str {
                match self { $(FopKind::$kind => $name,)* }
            }

            /// The kind with this ABI code.
            pub fn from_code(code: u16) -> Option<FopKind> {
                match code { $($code => Some(FopKind::$kind),)* _ => None }
            }

            /// The kind with this name, in any case.
            pub fn from_name(name: &str) -> Option<FopKind> {
                let up = name.to_ascii_uppercase();
                match up.as_str() { $($name => Some(FopKind::$kind),)* _ => None }
            }
        }
    };
}

fop_kinds! {
    Lookup = 1, "LOOKUP";
    Stat = 2, "STAT";
    Fstat = 3, "FSTAT";
    Setattr = 4, "SETATTR";
    Fsetattr = 5, "FSETATTR";
    Truncate = 6, "TRUNCATE";
    Ftruncate = 7, "FTRUNCATE";
    Access = 8, "ACCESS";
    Readlink = 9, "READLINK";
    Mknod = 10, "MKNOD";
    Mkdir = 11, "MKDIR";
    Unlink = 12, "UNLINK";
    Rmdir = 13, "RMDIR";
    Symlink = 14, "SYMLINK";
    Rename = 15, "RENAME";
    Link = 16, "LINK";
    Create = 17, "CREATE";
    Open = 18, "OPEN";
    Readv = 19, "READ";
    Writev = 20, "WRITE";
    Flush = 21, "FLUSH";
    Fsync = 22, "FSYNC";
    Opendir = 23, "OPENDIR";
    Readdir = 24, "READDIR";
    Readdirp = 25, "READDIRP";
    Fsyncdir = 26, "FSYNCDIR";
    Statfs = 27, "STATFS";
    Setxattr = 28, "SETXATTR";
    Getxattr = 29, "GETXATTR";
    Removexattr = 30, "REMOVEXATTR";
    Fsetxattr = 31, "FSETXATTR";
    Fgetxattr = 32, "FGETXATTR";
    Fremovexattr = 33, "FREMOVEXATTR";
    Lk = 34, "LK";
    Inodelk = 35, "INODELK";
    Finodelk = 36, "FINODELK";
    Entrylk = 37, "ENTRYLK";
    Fentrylk = 38, "FENTRYLK";
    Xattrop = 39, "XATTROP";
    Fxattrop = 40, "FXATTROP";
    Fallocate = 41, "FALLOCATE";
    Discard = 42, "DISCARD";
    Zerofill = 43, "ZEROFILL";
    Seek = 44, "SEEK";
    Rchecksum = 45, "RCHECKSUM";
    Lease = 46, "LEASE";
    Ipc = 47, "IPC";
    CopyFileRange = 48, "COPY_FILE_RANGE";
    Release = 49, "RELEASE";
    Releasedir = 50, "RELEASEDIR";
    Forget = 51, "FORGET";
}

// `FopKind::index` relies on the codes running 1, 2, ... without gaps.
const _: () = {
    let mut i = 0;
    while i < FopKind::COUNT {
        assert!(FopKind::ALL[i] as usize == i + 1, "fop codes must be contiguous from 1");
        i += 1;
    }
};

/// One file operation with its arguments. Path-based fops take a [`Loc`],
/// fd-based ones an [`Fd`]. Bulk data (`Writev::data`) is a [`Bytes`] so it
/// is never copied on its way down the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields are described per variant and in sdk/ABI.md
pub enum Fop {
    /// Resolve an entry (parent + name) or an inode (gfid); xdata may ask
    /// for xattrs (key set to any value) to be returned in the reply xdata.
    Lookup { loc: Loc },
    /// Attributes by location.
    Stat { loc: Loc },
    /// Attributes of an open fd.
    Fstat { fd: Fd },
    /// Change attributes by location.
    Setattr { loc: Loc, attr: SetAttr },
    /// Change attributes of an open fd.
    Fsetattr { fd: Fd, attr: SetAttr },
    /// Set a file's size.
    Truncate { loc: Loc, offset: u64 },
    /// Set an open file's size.
    Ftruncate { fd: Fd, offset: u64 },
    /// Check permission (`R_OK` 4, `W_OK` 2, `X_OK` 1, `F_OK` 0).
    Access { loc: Loc, mask: u32 },
    /// Read a symlink's target.
    Readlink { loc: Loc, size: u32 },
    /// Create a device, fifo, socket or regular file.
    Mknod { loc: Loc, mode: u32, rdev: u64, umask: u32 },
    /// Create a directory.
    Mkdir { loc: Loc, mode: u32, umask: u32 },
    /// Remove a non-directory entry.
    Unlink { loc: Loc, flags: u32 },
    /// Remove an empty directory.
    Rmdir { loc: Loc, flags: u32 },
    /// Create a symlink at `loc` pointing to `target`.
    Symlink { target: String, loc: Loc, umask: u32 },
    /// Rename `old` to `new`; `flags` from [`rename_flags`].
    Rename { old: Loc, new: Loc, flags: u32 },
    /// Make `new` a hard link to the inode at `old`.
    Link { old: Loc, new: Loc },
    /// Create and open a regular file; the opener chose `fd`.
    Create { loc: Loc, flags: u32, mode: u32, umask: u32, fd: FdId },
    /// Open an existing file as `fd` with `O_*` flags.
    Open { loc: Loc, flags: u32, fd: FdId },
    /// Read `size` bytes at `offset`.
    Readv { fd: Fd, size: u32, offset: u64, flags: u32 },
    /// Write `data` at `offset`.
    Writev { fd: Fd, data: Bytes, offset: u64, flags: u32 },
    /// Called on each close(2) of a descriptor of the fd.
    Flush { fd: Fd },
    /// Flush data (and metadata unless `datasync`) to stable storage.
    Fsync { fd: Fd, datasync: bool },
    /// Open a directory as `fd`.
    Opendir { loc: Loc, fd: FdId },
    /// List entries from `offset` (0 or a previous `d_off`), up to `size` bytes.
    Readdir { fd: Fd, size: u32, offset: u64 },
    /// Like readdir, with each entry's attributes.
    Readdirp { fd: Fd, size: u32, offset: u64 },
    /// Sync a directory.
    Fsyncdir { fd: Fd, datasync: bool },
    /// Filesystem statistics.
    Statfs { loc: Loc },
    /// Set the xattrs in `xattrs` (byte values); `flags` from [`xattr_flags`].
    Setxattr { loc: Loc, xattrs: Dict, flags: u32 },
    /// Get one xattr by name, or all when `name` is empty.
    Getxattr { loc: Loc, name: String },
    /// Remove one xattr.
    Removexattr { loc: Loc, name: String },
    /// Setxattr on an open fd.
    Fsetxattr { fd: Fd, xattrs: Dict, flags: u32 },
    /// Getxattr on an open fd.
    Fgetxattr { fd: Fd, name: String },
    /// Removexattr on an open fd.
    Fremovexattr { fd: Fd, name: String },
    /// POSIX (fcntl) byte-range lock on an fd.
    Lk { fd: Fd, cmd: LkCmd, lock: Flock },
    /// Internal inode lock in a named domain (not visible to POSIX locks).
    Inodelk { domain: String, loc: Loc, cmd: LkCmd, lock: Flock },
    /// Inodelk by fd.
    Finodelk { domain: String, fd: Fd, cmd: LkCmd, lock: Flock },
    /// Lock a name (or, with no name, the whole directory) in a directory.
    Entrylk { domain: String, loc: Loc, name: String, cmd: EntrylkCmd, ty: EntrylkType },
    /// Entrylk by fd of the directory.
    Fentrylk { domain: String, fd: Fd, name: String, cmd: EntrylkCmd, ty: EntrylkType },
    /// Atomically combine `xattrs` with the stored values (a missing xattr
    /// counts as zeros); replies with the values after the change, as
    /// GlusterFS does. A value of all zeros only reads (nothing is written).
    Xattrop { loc: Loc, op: XattropOp, xattrs: Dict },
    /// Xattrop by fd.
    Fxattrop { fd: Fd, op: XattropOp, xattrs: Dict },
    /// Allocate space (`mode` as fallocate(2): keep-size 1, punch-hole 2).
    Fallocate { fd: Fd, mode: u32, offset: u64, len: u64 },
    /// Deallocate a range (punch a hole, keep the size).
    Discard { fd: Fd, offset: u64, len: u64 },
    /// Write zeroes over a range.
    Zerofill { fd: Fd, offset: u64, len: u64 },
    /// Find the next data or hole.
    Seek { fd: Fd, offset: u64, what: SeekWhat },
    /// Checksums of a range (for diff self-heal).
    Rchecksum { fd: Fd, offset: u64, len: u32 },
    /// Acquire or release a lease.
    Lease { loc: Loc, cmd: LeaseCmd, lease_id: [u8; 16] },
    /// A translator-to-translator message; `op` [`IPC_DRAIN`] is the one
    /// every translator knows.
    Ipc { op: i32 },
    /// Copy a range between two open files.
    CopyFileRange { fd_in: Fd, off_in: u64, fd_out: Fd, off_out: u64, len: u64, flags: u32 },
    /// The last reference to a file fd is gone; free what is kept for it.
    Release { fd: Fd },
    /// The last reference to a directory fd is gone.
    Releasedir { fd: Fd },
    /// The caller forgets an inode; translators drop their context for it.
    Forget { gfid: Gfid },
}

impl Fop {
    /// The operation without arguments.
    pub fn kind(&self) -> FopKind {
        use Fop::*;
        match self {
            Lookup { .. } => FopKind::Lookup,
            Stat { .. } => FopKind::Stat,
            Fstat { .. } => FopKind::Fstat,
            Setattr { .. } => FopKind::Setattr,
            Fsetattr { .. } => FopKind::Fsetattr,
            Truncate { .. } => FopKind::Truncate,
            Ftruncate { .. } => FopKind::Ftruncate,
            Access { .. } => FopKind::Access,
            Readlink { .. } => FopKind::Readlink,
            Mknod { .. } => FopKind::Mknod,
            Mkdir { .. } => FopKind::Mkdir,
            Unlink { .. } => FopKind::Unlink,
            Rmdir { .. } => FopKind::Rmdir,
            Symlink { .. } => FopKind::Symlink,
            Rename { .. } => FopKind::Rename,
            Link { .. } => FopKind::Link,
            Create { .. } => FopKind::Create,
            Open { .. } => FopKind::Open,
            Readv { .. } => FopKind::Readv,
            Writev { .. } => FopKind::Writev,
            Flush { .. } => FopKind::Flush,
            Fsync { .. } => FopKind::Fsync,
            Opendir { .. } => FopKind::Opendir,
            Readdir { .. } => FopKind::Readdir,
            Readdirp { .. } => FopKind::Readdirp,
            Fsyncdir { .. } => FopKind::Fsyncdir,
            Statfs { .. } => FopKind::Statfs,
            Setxattr { .. } => FopKind::Setxattr,
            Getxattr { .. } => FopKind::Getxattr,
            Removexattr { .. } => FopKind::Removexattr,
            Fsetxattr { .. } => FopKind::Fsetxattr,
            Fgetxattr { .. } => FopKind::Fgetxattr,
            Fremovexattr { .. } => FopKind::Fremovexattr,
            Lk { .. } => FopKind::Lk,
            Inodelk { .. } => FopKind::Inodelk,
            Finodelk { .. } => FopKind::Finodelk,
            Entrylk { .. } => FopKind::Entrylk,
            Fentrylk { .. } => FopKind::Fentrylk,
            Xattrop { .. } => FopKind::Xattrop,
            Fxattrop { .. } => FopKind::Fxattrop,
            Fallocate { .. } => FopKind::Fallocate,
            Discard { .. } => FopKind::Discard,
            Zerofill { .. } => FopKind::Zerofill,
            Seek { .. } => FopKind::Seek,
            Rchecksum { .. } => FopKind::Rchecksum,
            Lease { .. } => FopKind::Lease,
            Ipc { .. } => FopKind::Ipc,
            CopyFileRange { .. } => FopKind::CopyFileRange,
            Release { .. } => FopKind::Release,
            Releasedir { .. } => FopKind::Releasedir,
            Forget { .. } => FopKind::Forget,
        }
    }

    /// The fd a fd-based fop acts on (the input fd for copy_file_range).
    pub fn fd(&self) -> Option<&Fd> {
        use Fop::*;
        match self {
            Fstat { fd }
            | Fsetattr { fd, .. }
            | Ftruncate { fd, .. }
            | Readv { fd, .. }
            | Writev { fd, .. }
            | Flush { fd }
            | Fsync { fd, .. }
            | Readdir { fd, .. }
            | Readdirp { fd, .. }
            | Fsyncdir { fd, .. }
            | Fsetxattr { fd, .. }
            | Fgetxattr { fd, .. }
            | Fremovexattr { fd, .. }
            | Lk { fd, .. }
            | Finodelk { fd, .. }
            | Fentrylk { fd, .. }
            | Fxattrop { fd, .. }
            | Fallocate { fd, .. }
            | Discard { fd, .. }
            | Zerofill { fd, .. }
            | Seek { fd, .. }
            | Rchecksum { fd, .. }
            | Release { fd }
            | Releasedir { fd } => Some(fd),
            CopyFileRange { fd_in, .. } => Some(fd_in),
            _ => None,
        }
    }

    /// The location a path-based fop acts on (the source for rename/link).
    pub fn loc(&self) -> Option<&Loc> {
        use Fop::*;
        match self {
            Lookup { loc }
            | Stat { loc }
            | Setattr { loc, .. }
            | Truncate { loc, .. }
            | Access { loc, .. }
            | Readlink { loc, .. }
            | Mknod { loc, .. }
            | Mkdir { loc, .. }
            | Unlink { loc, .. }
            | Rmdir { loc, .. }
            | Symlink { loc, .. }
            | Create { loc, .. }
            | Open { loc, .. }
            | Opendir { loc, .. }
            | Statfs { loc }
            | Setxattr { loc, .. }
            | Getxattr { loc, .. }
            | Removexattr { loc, .. }
            | Inodelk { loc, .. }
            | Entrylk { loc, .. }
            | Xattrop { loc, .. }
            | Lease { loc, .. } => Some(loc),
            Rename { old, .. } | Link { old, .. } => Some(old),
            _ => None,
        }
    }

    /// The inode this fop is about, when it names one (by fd or by a loc's
    /// gfid); NULL for entry locations not yet resolved.
    pub fn gfid(&self) -> Gfid {
        if let Fop::Forget { gfid } = self {
            return *gfid;
        }
        if let Some(fd) = self.fd() {
            return fd.gfid;
        }
        self.loc().map(|l| l.gfid).unwrap_or(Gfid::NULL)
    }

    /// True for fops that change data, metadata or the namespace.
    pub fn is_modifying(&self) -> bool {
        use FopKind::*;
        matches!(
            self.kind(),
            Setattr
                | Fsetattr
                | Truncate
                | Ftruncate
                | Mknod
                | Mkdir
                | Unlink
                | Rmdir
                | Symlink
                | Rename
                | Link
                | Create
                | Writev
                | Setxattr
                | Removexattr
                | Fsetxattr
                | Fremovexattr
                | Xattrop
                | Fxattrop
                | Fallocate
                | Discard
                | Zerofill
                | CopyFileRange
        )
    }
}

/// [`Fop::Ipc`] op: finish the work delayed behind replies already given
/// (queued writes, queued directory operations) before answering. Sent by
/// the mount before it unmounts or switches graphs; a translator that
/// delays work drains it and passes the fop on; the others pass it on.
/// The answer from the bottom of the graph (often ENOSYS) is ignored.
pub const IPC_DRAIN: i32 = 0x7866_0001;

/// A fop's successful result. Which variant answers which fop is listed in
/// `sdk/ABI.md` and enforced by nothing but convention and tests, as in
/// GlusterFS's callbacks.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields are described per variant and in sdk/ABI.md
pub enum Reply {
    /// No payload: access, flush, setxattr, removexattr, (f)inodelk,
    /// (f)entrylk, open, opendir, release, forget, lease, ipc, fsyncdir.
    Empty,
    /// An entry and its parent after the change: lookup, mknod, mkdir,
    /// symlink, link, create.
    Entry { iatt: Iatt, postparent: Iatt },
    /// Attributes: stat, fstat.
    Attr(Iatt),
    /// Attributes before and after: setattr, fsetattr, truncate, ftruncate,
    /// writev, fsync, fallocate, discard, zerofill.
    PrePost { pre: Iatt, post: Iatt },
    /// The parent directory before and after: unlink, rmdir.
    Parent { pre: Iatt, post: Iatt },
    /// The renamed inode: rename.
    Rename { iatt: Iatt },
    /// Data read and the file's attributes: readv.
    Read { data: Bytes, iatt: Iatt },
    /// A symlink target: readlink.
    Readlink { target: String, iatt: Iatt },
    /// Directory entries: readdir, readdirp. Empty at end of directory.
    Dirents(Vec<DirEntry>),
    /// statfs.
    Statfs(Statvfs),
    /// xattrs: getxattr, fgetxattr, xattrop, fxattrop.
    Xattrs(Dict),
    /// lk: the granted lock, or for GETLK the conflicting one (type Unlock
    /// when there is none).
    Lock(Flock),
    /// seek: the offset found.
    Offset(u64),
    /// rchecksum: a weak (Adler-32) and a strong (SHA-256) checksum.
    Checksum { weak: u32, strong: [u8; 32] },
    /// copy_file_range: bytes copied and the destination's attributes.
    Copied { len: u64, post: Iatt },
}

/// A fop on its way down, with its xdata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The operation.
    pub fop: Fop,
    /// Extra key/values for translators along the way.
    pub xdata: Dict,
}

impl Request {
    /// A request without xdata.
    pub fn new(fop: Fop) -> Request {
        Request { fop, xdata: Dict::new() }
    }
    /// A request with xdata.
    pub fn with_xdata(fop: Fop, xdata: Dict) -> Request {
        Request { fop, xdata }
    }
}

impl From<Fop> for Request {
    fn from(fop: Fop) -> Request {
        Request::new(fop)
    }
}

/// A successful reply on its way up, with its xdata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The result.
    pub reply: Reply,
    /// Extra key/values (lock counts, requested xattrs, ...).
    pub xdata: Dict,
}

impl From<Reply> for Response {
    fn from(reply: Reply) -> Response {
        Response { reply, xdata: Dict::new() }
    }
}

/// What every fop call returns: a [`Response`] or an errno.
pub type FopResult = Result<Response, Errno>;
