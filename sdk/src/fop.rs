//! The fop model: [`Fop`] (one variant per file operation, GlusterFS's set),
//! [`Reply`] and the [`Request`]/[`Response`] pair a translator sees.
//!
//! Every fact about a fop is written once, in the table below (`fop_table!`): its ABI code and name, its fields, which of them are fds and
//! locations, the [`ReplyKind`] it answers with and its [`FopFlags`].
//! [`FopKind`], [`Fop`], [`Fop::kind`], [`Fop::fds`], [`Fop::loc`],
//! [`FopKind::flags`] and [`FopKind::reply`] are generated from it, and so
//! is the wire codec of [`Fop`] (`abi/codec.rs`); tests check it against
//! `sdk/ABI.md`.

use bytes::Bytes;

use crate::dict::Dict;
use crate::errno::Errno;
use crate::types::*;

/// What the fop table says about a fop besides its fields (a small bit set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FopFlags(u8);

impl FopFlags {
    /// No flag.
    pub const NONE: FopFlags = FopFlags(0);
    /// Changes data, metadata or the namespace: replicate makes it a
    /// transaction, a read-only gate refuses it.
    pub const MODIFYING: FopFlags = FopFlags(1);
    /// Only reads the volume (data, metadata or a directory) and holds
    /// nothing: any one healthy copy can answer it.
    pub const READ_ONLY: FopFlags = FopFlags(1 << 1);
    /// Acts on one or more open fds ([`Fop::fds`]); derived from the
    /// table's fd fields.
    pub const FD_BASED: FopFlags = FopFlags(1 << 2);
    /// Carries bulk data beside its header on the wire (writev's payload).
    pub const PAYLOAD: FopFlags = FopFlags(1 << 3);

    /// These flags and `other`'s.
    pub const fn with(self, other: FopFlags) -> FopFlags {
        FopFlags(self.0 | other.0)
    }

    /// True if every flag of `other` is set.
    pub const fn contains(self, other: FopFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// The variant of [`Reply`] a reply is, without its fields. The numeric
/// value is the ABI v1 reply tag (`sdk/ABI.md` section 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)] // one per Reply variant, described there
pub enum ReplyKind {
    Empty = 0,
    Entry = 1,
    Attr = 2,
    PrePost = 3,
    Parent = 4,
    Rename = 5,
    Read = 6,
    Readlink = 7,
    Dirents = 8,
    Statfs = 9,
    Xattrs = 10,
    Lock = 11,
    Offset = 12,
    Checksum = 13,
    Copied = 14,
}

/// `[Option<_>; 2]` from zero, one or two fd expressions (no fop names more
/// than two fds).
macro_rules! fd_pair {
    () => {
        [None, None]
    };
    ($a:expr) => {
        [Some($a), None]
    };
    ($a:expr, $b:expr) => {
        [Some($a), Some($b)]
    };
}

/// `Some` of the first of the expressions, `None` without any.
macro_rules! first {
    () => {
        None
    };
    ($a:expr $(, $rest:expr)*) => {
        Some($a)
    };
}

/// Generates the fop model from [`fop_table!`].
macro_rules! fops {
    ($(
        $(#[doc = $doc:literal])*
        $kind:ident = $code:literal, $name:literal { $($field:ident: $ty:ty),* $(,)? }
        fds [$($fd:ident),*] locs [$($loc:ident),*] reply $reply:ident flags [$($flag:ident),*];
    )*) => {
        /// The operation a [`Fop`] performs, without its arguments. The
        /// numeric code is the ABI v1 fop code (stable; see `sdk/ABI.md`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum FopKind { $(#[doc = $name] $kind = $code,)* }

        /// One file operation with its arguments. Path-based fops take a [`Loc`],
        /// fd-based ones an [`Fd`]. Bulk data (`Writev::data`) is a [`Bytes`] so it
        /// is never copied on its way down the graph.
        #[derive(Clone, Debug, PartialEq, Eq)]
        #[allow(missing_docs)] // fields are described per variant and in sdk/ABI.md
        pub enum Fop { $($(#[doc = $doc])* $kind { $($field: $ty),* },)* }

        impl FopKind {
            /// Every kind, in code order.
            pub const ALL: &'static [FopKind] = &[$(FopKind::$kind,)*];

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

            /// The fop's fields, in wire order.
            pub const fn fields(self) -> &'static [&'static str] {
                match self { $(FopKind::$kind => &[$(stringify!($field)),*],)* }
            }

            /// The fields that are open fds ([`Fop::fds`]), in order.
            pub const fn fd_fields(self) -> &'static [&'static str] {
                match self { $(FopKind::$kind => &[$(stringify!($fd)),*],)* }
            }

            /// The fields that are locations, in order; [`Fop::loc`] is the
            /// first.
            pub const fn loc_fields(self) -> &'static [&'static str] {
                match self { $(FopKind::$kind => &[$(stringify!($loc)),*],)* }
            }

            /// The [`Reply`] variant a success answers with.
            pub const fn reply(self) -> ReplyKind {
                match self { $(FopKind::$kind => ReplyKind::$reply,)* }
            }

            /// The fop's flags ([`FopFlags::FD_BASED`] when it has fd fields).
            pub const fn flags(self) -> FopFlags {
                let f = match self { $(FopKind::$kind => FopFlags::NONE $(.with(FopFlags::$flag))*,)* };
                if self.fd_fields().is_empty() { f } else { f.with(FopFlags::FD_BASED) }
            }
        }

        impl Fop {
            /// The operation without arguments.
            pub fn kind(&self) -> FopKind {
                match self { $(Fop::$kind { .. } => FopKind::$kind,)* }
            }

            /// Every fd the fop acts on, in field order (both of
            /// copy_file_range's); none for a path-based fop.
            pub fn fds(&self) -> impl Iterator<Item = Fd> + Clone + use<> {
                let pair: [Option<Fd>; 2] = match self { $(Fop::$kind { $($fd,)* .. } => fd_pair!($(*$fd),*),)* };
                pair.into_iter().flatten()
            }

            /// Every fd the fop acts on, to rewrite in place (as
            /// protocol/server maps client fd ids to its own).
            pub fn fds_mut(&mut self) -> impl Iterator<Item = &mut Fd> {
                let pair: [Option<&mut Fd>; 2] = match self { $(Fop::$kind { $($fd,)* .. } => fd_pair!($($fd),*),)* };
                pair.into_iter().flatten()
            }

            /// The first fd the fop acts on (the input fd for
            /// copy_file_range; [`Fop::fds`] gives both).
            #[allow(unused_variables)] // the fds after the first
            pub fn fd(&self) -> Option<&Fd> {
                match self { $(Fop::$kind { $($fd,)* .. } => first!($($fd),*),)* }
            }

            /// The location a path-based fop acts on (the source for
            /// rename/link).
            #[allow(unused_variables)] // the locations after the first
            pub fn loc(&self) -> Option<&Loc> {
                match self { $(Fop::$kind { $($loc,)* .. } => first!($($loc),*),)* }
            }
        }
    };
}

/// The fop table itself, handed to `$each` (a macro taking the table's
/// syntax): `fops` here, `fop_codec` in `abi/codec.rs`. Each row: the fop's
/// doc, `Kind = ABI code, "NAME"`, its fields in wire order, then which
/// fields are fds and locations, the reply it answers with and its flags.
macro_rules! fop_table {
    ($each:ident) => {
        $each! {
            /// Resolve an entry (parent + name) or an inode (gfid); xdata may ask
            /// for xattrs (key set to any value) to be returned in the reply xdata.
            Lookup = 1, "LOOKUP" { loc: Loc } fds [] locs [loc] reply Entry flags [READ_ONLY];
            /// Attributes by location.
            Stat = 2, "STAT" { loc: Loc } fds [] locs [loc] reply Attr flags [READ_ONLY];
            /// Attributes of an open fd.
            Fstat = 3, "FSTAT" { fd: Fd } fds [fd] locs [] reply Attr flags [READ_ONLY];
            /// Change attributes by location.
            Setattr = 4, "SETATTR" { loc: Loc, attr: SetAttr } fds [] locs [loc] reply PrePost flags [MODIFYING];
            /// Change attributes of an open fd.
            Fsetattr = 5, "FSETATTR" { fd: Fd, attr: SetAttr } fds [fd] locs [] reply PrePost flags [MODIFYING];
            /// Set a file's size.
            Truncate = 6, "TRUNCATE" { loc: Loc, offset: u64 } fds [] locs [loc] reply PrePost flags [MODIFYING];
            /// Set an open file's size.
            Ftruncate = 7, "FTRUNCATE" { fd: Fd, offset: u64 } fds [fd] locs [] reply PrePost flags [MODIFYING];
            /// Check permission (`R_OK` 4, `W_OK` 2, `X_OK` 1, `F_OK` 0).
            Access = 8, "ACCESS" { loc: Loc, mask: u32 } fds [] locs [loc] reply Empty flags [READ_ONLY];
            /// Read a symlink's target.
            Readlink = 9, "READLINK" { loc: Loc, size: u32 } fds [] locs [loc] reply Readlink flags [READ_ONLY];
            /// Create a device, fifo, socket or regular file.
            Mknod = 10, "MKNOD" { loc: Loc, mode: u32, rdev: u64, umask: u32 } fds [] locs [loc] reply Entry flags [MODIFYING];
            /// Create a directory.
            Mkdir = 11, "MKDIR" { loc: Loc, mode: u32, umask: u32 } fds [] locs [loc] reply Entry flags [MODIFYING];
            /// Remove a non-directory entry.
            Unlink = 12, "UNLINK" { loc: Loc, flags: u32 } fds [] locs [loc] reply Parent flags [MODIFYING];
            /// Remove an empty directory.
            Rmdir = 13, "RMDIR" { loc: Loc, flags: u32 } fds [] locs [loc] reply Parent flags [MODIFYING];
            /// Create a symlink at `loc` pointing to `target`.
            Symlink = 14, "SYMLINK" { target: String, loc: Loc, umask: u32 } fds [] locs [loc] reply Entry flags [MODIFYING];
            /// Rename `old` to `new`; `flags` from [`rename_flags`].
            Rename = 15, "RENAME" { old: Loc, new: Loc, flags: u32 } fds [] locs [old, new] reply Rename flags [MODIFYING];
            /// Make `new` a hard link to the inode at `old`.
            Link = 16, "LINK" { old: Loc, new: Loc } fds [] locs [old, new] reply Entry flags [MODIFYING];
            /// Create and open a regular file; the opener chose `fd`.
            Create = 17, "CREATE" { loc: Loc, flags: u32, mode: u32, umask: u32, fd: FdId }
                fds [] locs [loc] reply Entry flags [MODIFYING];
            /// Open an existing file as `fd` with `O_*` flags.
            Open = 18, "OPEN" { loc: Loc, flags: u32, fd: FdId } fds [] locs [loc] reply Empty flags [];
            /// Read `size` bytes at `offset`.
            Readv = 19, "READ" { fd: Fd, size: u32, offset: u64, flags: u32 } fds [fd] locs [] reply Read flags [READ_ONLY];
            /// Write `data` at `offset`.
            Writev = 20, "WRITE" { fd: Fd, data: Bytes, offset: u64, flags: u32 }
                fds [fd] locs [] reply PrePost flags [MODIFYING, PAYLOAD];
            /// Called on each close(2) of a descriptor of the fd.
            Flush = 21, "FLUSH" { fd: Fd } fds [fd] locs [] reply Empty flags [];
            /// Flush data (and metadata unless `datasync`) to stable storage.
            Fsync = 22, "FSYNC" { fd: Fd, datasync: bool } fds [fd] locs [] reply PrePost flags [];
            /// Open a directory as `fd`.
            Opendir = 23, "OPENDIR" { loc: Loc, fd: FdId } fds [] locs [loc] reply Empty flags [];
            /// List entries from `offset` (0 or a previous `d_off`), up to `size` bytes.
            Readdir = 24, "READDIR" { fd: Fd, size: u32, offset: u64 } fds [fd] locs [] reply Dirents flags [READ_ONLY];
            /// Like readdir, with each entry's attributes.
            Readdirp = 25, "READDIRP" { fd: Fd, size: u32, offset: u64 } fds [fd] locs [] reply Dirents flags [READ_ONLY];
            /// Sync a directory.
            Fsyncdir = 26, "FSYNCDIR" { fd: Fd, datasync: bool } fds [fd] locs [] reply Empty flags [];
            /// Filesystem statistics.
            Statfs = 27, "STATFS" { loc: Loc } fds [] locs [loc] reply Statfs flags [READ_ONLY];
            /// Set the xattrs in `xattrs` (byte values); `flags` from [`xattr_flags`].
            Setxattr = 28, "SETXATTR" { loc: Loc, xattrs: Dict, flags: u32 } fds [] locs [loc] reply Empty flags [MODIFYING];
            /// Get one xattr by name, or all when `name` is empty.
            Getxattr = 29, "GETXATTR" { loc: Loc, name: String } fds [] locs [loc] reply Xattrs flags [READ_ONLY];
            /// Remove one xattr.
            Removexattr = 30, "REMOVEXATTR" { loc: Loc, name: String } fds [] locs [loc] reply Empty flags [MODIFYING];
            /// Setxattr on an open fd.
            Fsetxattr = 31, "FSETXATTR" { fd: Fd, xattrs: Dict, flags: u32 } fds [fd] locs [] reply Empty flags [MODIFYING];
            /// Getxattr on an open fd.
            Fgetxattr = 32, "FGETXATTR" { fd: Fd, name: String } fds [fd] locs [] reply Xattrs flags [READ_ONLY];
            /// Removexattr on an open fd.
            Fremovexattr = 33, "FREMOVEXATTR" { fd: Fd, name: String } fds [fd] locs [] reply Empty flags [MODIFYING];
            /// POSIX (fcntl) byte-range lock on an fd.
            Lk = 34, "LK" { fd: Fd, cmd: LkCmd, lock: Flock } fds [fd] locs [] reply Lock flags [];
            /// Internal inode lock in a named domain (not visible to POSIX locks).
            Inodelk = 35, "INODELK" { domain: String, loc: Loc, cmd: LkCmd, lock: Flock }
                fds [] locs [loc] reply Empty flags [];
            /// Inodelk by fd.
            Finodelk = 36, "FINODELK" { domain: String, fd: Fd, cmd: LkCmd, lock: Flock }
                fds [fd] locs [] reply Empty flags [];
            /// Lock a name (or, with no name, the whole directory) in a directory.
            Entrylk = 37, "ENTRYLK" { domain: String, loc: Loc, name: String, cmd: EntrylkCmd, ty: EntrylkType }
                fds [] locs [loc] reply Empty flags [];
            /// Entrylk by fd of the directory.
            Fentrylk = 38, "FENTRYLK" { domain: String, fd: Fd, name: String, cmd: EntrylkCmd, ty: EntrylkType }
                fds [fd] locs [] reply Empty flags [];
            /// Atomically combine `xattrs` with the stored values (a missing xattr
            /// counts as zeros); replies with the values after the change, as
            /// GlusterFS does. A value of all zeros only reads (nothing is written).
            Xattrop = 39, "XATTROP" { loc: Loc, op: XattropOp, xattrs: Dict } fds [] locs [loc] reply Xattrs flags [MODIFYING];
            /// Xattrop by fd.
            Fxattrop = 40, "FXATTROP" { fd: Fd, op: XattropOp, xattrs: Dict } fds [fd] locs [] reply Xattrs flags [MODIFYING];
            /// Allocate space (`mode` as fallocate(2): keep-size 1, punch-hole 2).
            Fallocate = 41, "FALLOCATE" { fd: Fd, mode: u32, offset: u64, len: u64 }
                fds [fd] locs [] reply PrePost flags [MODIFYING];
            /// Deallocate a range (punch a hole, keep the size).
            Discard = 42, "DISCARD" { fd: Fd, offset: u64, len: u64 } fds [fd] locs [] reply PrePost flags [MODIFYING];
            /// Write zeroes over a range.
            Zerofill = 43, "ZEROFILL" { fd: Fd, offset: u64, len: u64 } fds [fd] locs [] reply PrePost flags [MODIFYING];
            /// Find the next data or hole.
            Seek = 44, "SEEK" { fd: Fd, offset: u64, what: SeekWhat } fds [fd] locs [] reply Offset flags [READ_ONLY];
            /// Checksums of a range (for diff self-heal).
            Rchecksum = 45, "RCHECKSUM" { fd: Fd, offset: u64, len: u32 } fds [fd] locs [] reply Checksum flags [READ_ONLY];
            /// Acquire or release a lease.
            Lease = 46, "LEASE" { loc: Loc, cmd: LeaseCmd, lease_id: [u8; 16] } fds [] locs [loc] reply Empty flags [];
            /// A translator-to-translator message; `op` [`IPC_DRAIN`] is the one
            /// every translator knows.
            Ipc = 47, "IPC" { op: i32 } fds [] locs [] reply Empty flags [];
            /// Copy a range between two open files.
            CopyFileRange = 48, "COPY_FILE_RANGE" { fd_in: Fd, off_in: u64, fd_out: Fd, off_out: u64, len: u64, flags: u32 }
                fds [fd_in, fd_out] locs [] reply Copied flags [MODIFYING];
            /// The last reference to a file fd is gone; free what is kept for it.
            Release = 49, "RELEASE" { fd: Fd } fds [fd] locs [] reply Empty flags [];
            /// The last reference to a directory fd is gone.
            Releasedir = 50, "RELEASEDIR" { fd: Fd } fds [fd] locs [] reply Empty flags [];
            /// The caller forgets an inode; translators drop their context for it.
            Forget = 51, "FORGET" { gfid: Gfid } fds [] locs [] reply Empty flags [];
        }
    };
}
pub(crate) use fop_table;

fop_table!(fops);

impl FopKind {
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

    /// True for fops that change data, metadata or the namespace
    /// ([`FopFlags::MODIFYING`]).
    pub const fn is_modifying(self) -> bool {
        self.flags().contains(FopFlags::MODIFYING)
    }
}

// `FopKind::index` relies on the codes running 1, 2, ... without gaps.
const _: () = {
    let mut i = 0;
    while i < FopKind::COUNT {
        assert!(FopKind::ALL[i] as usize == i + 1, "fop codes must be contiguous from 1");
        i += 1;
    }
};

impl Fop {
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

    /// The directory holding the location a path-based fop acts on (the
    /// source's for rename and link); NULL for fops by fd or gfid alone.
    pub fn parent(&self) -> Gfid {
        self.loc().map_or(Gfid::NULL, |l| l.parent)
    }

    /// True for fops that change data, metadata or the namespace.
    pub fn is_modifying(&self) -> bool {
        self.kind().is_modifying()
    }
}

/// [`Fop::Ipc`] op: finish the work delayed behind replies already given
/// (queued writes, queued directory operations) before answering. Sent by
/// the mount before it unmounts or switches graphs; a translator that
/// delays work drains it and passes the fop on; the others pass it on.
/// The answer from the bottom of the graph (often ENOSYS) is ignored.
pub const IPC_DRAIN: i32 = 0x7866_0001;

/// A fop's successful result. Which variant answers which fop is
/// [`FopKind::reply`] (listed in `sdk/ABI.md` too); nothing enforces it at
/// run time, as in GlusterFS's callbacks: a caller unpacks a reply with the
/// `into_*` accessors, which give a [`WrongReply`] (EIO) for another variant.
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

/// A reply of another variant than the caller's fop answers with (a
/// translator broke [`FopKind::reply`]); the fop fails with EIO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a {got:?} reply where {expected:?} was expected")]
pub struct WrongReply {
    /// The variant the accessor unpacks.
    pub expected: ReplyKind,
    /// The variant the reply is.
    pub got: ReplyKind,
}

impl From<WrongReply> for Errno {
    fn from(_: WrongReply) -> Errno {
        Errno::EIO
    }
}

impl Reply {
    /// The variant, without its fields.
    pub fn kind(&self) -> ReplyKind {
        match self {
            Reply::Empty => ReplyKind::Empty,
            Reply::Entry { .. } => ReplyKind::Entry,
            Reply::Attr(_) => ReplyKind::Attr,
            Reply::PrePost { .. } => ReplyKind::PrePost,
            Reply::Parent { .. } => ReplyKind::Parent,
            Reply::Rename { .. } => ReplyKind::Rename,
            Reply::Read { .. } => ReplyKind::Read,
            Reply::Readlink { .. } => ReplyKind::Readlink,
            Reply::Dirents(_) => ReplyKind::Dirents,
            Reply::Statfs(_) => ReplyKind::Statfs,
            Reply::Xattrs(_) => ReplyKind::Xattrs,
            Reply::Lock(_) => ReplyKind::Lock,
            Reply::Offset(_) => ReplyKind::Offset,
            Reply::Checksum { .. } => ReplyKind::Checksum,
            Reply::Copied { .. } => ReplyKind::Copied,
        }
    }

    fn wrong(&self, expected: ReplyKind) -> WrongReply {
        WrongReply { expected, got: self.kind() }
    }
}

/// `Reply::into_*`: each unpacks one variant, or is a [`WrongReply`].
macro_rules! reply_accessors {
    ($($(#[doc = $doc:literal])* $fn:ident -> $ty:ty { $pat:pat => $out:expr } $kind:ident;)*) => {
        impl Reply {
            $(
                $(#[doc = $doc])*
                pub fn $fn(self) -> Result<$ty, WrongReply> {
                    match self {
                        $pat => Ok($out),
                        r => Err(r.wrong(ReplyKind::$kind)),
                    }
                }
            )*
        }
    };
}

reply_accessors! {
    /// The new or found entry's attributes ([`Reply::Entry`]: lookup,
    /// mknod, mkdir, symlink, link, create).
    into_entry -> Iatt { Reply::Entry { iatt, .. } => iatt } Entry;
    /// The attributes of [`Reply::Attr`] (stat, fstat).
    into_attr -> Iatt { Reply::Attr(iatt) => iatt } Attr;
    /// The attributes after the change ([`Reply::PrePost`]: setattr,
    /// truncate, writev, fsync, fallocate...).
    into_post -> Iatt { Reply::PrePost { post, .. } => post } PrePost;
    /// The attributes before and after the change ([`Reply::PrePost`]).
    into_pre_post -> (Iatt, Iatt) { Reply::PrePost { pre, post } => (pre, post) } PrePost;
    /// The data read ([`Reply::Read`]: readv).
    into_read -> Bytes { Reply::Read { data, .. } => data } Read;
    /// The symlink's target ([`Reply::Readlink`]).
    into_readlink -> String { Reply::Readlink { target, .. } => target } Readlink;
    /// The entries ([`Reply::Dirents`]: readdir, readdirp).
    into_dirents -> Vec<DirEntry> { Reply::Dirents(d) => d } Dirents;
    /// The statistics ([`Reply::Statfs`]).
    into_statfs -> Statvfs { Reply::Statfs(s) => s } Statfs;
    /// The xattrs ([`Reply::Xattrs`]: getxattr, fgetxattr, xattrop,
    /// fxattrop).
    into_xattrs -> Dict { Reply::Xattrs(d) => d } Xattrs;
    /// The lock ([`Reply::Lock`]: lk).
    into_lock -> Flock { Reply::Lock(l) => l } Lock;
    /// The offset found ([`Reply::Offset`]: seek).
    into_offset -> u64 { Reply::Offset(o) => o } Offset;
    /// The weak and strong checksums ([`Reply::Checksum`]: rchecksum).
    into_checksum -> (u32, [u8; 32]) { Reply::Checksum { weak, strong } => (weak, strong) } Checksum;
    /// The bytes copied ([`Reply::Copied`]: copy_file_range).
    into_copied -> u64 { Reply::Copied { len, .. } => len } Copied;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of the tables in `sdk/ABI.md`'s section `number`, as
    /// trimmed cells, without the header and rule rows.
    fn abi_rows(number: &str) -> Vec<Vec<&'static str>> {
        let abi = include_str!("../ABI.md");
        let start = abi.find(&format!("\n## {number}. ")).expect("section in ABI.md");
        let body = &abi[start + 1..];
        let body = &body[..body[1..].find("\n## ").map_or(body.len(), |e| e + 1)];
        body.lines()
            .filter(|l| l.starts_with('|'))
            .map(|l| l.trim_matches('|').split('|').map(str::trim).collect::<Vec<_>>())
            .filter(|cells| cells[0].parse::<u32>().is_ok())
            .collect()
    }

    /// `name: Type` pairs of an ABI.md field list (comments in
    /// parentheses may hold commas and colons of their own).
    fn abi_fields(list: &str) -> Vec<(&str, &str)> {
        list.split(", ")
            .filter_map(|piece| piece.split_once(": "))
            .filter(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .map(|(name, ty)| (name, ty.split_whitespace().next().unwrap_or("")))
            .collect()
    }

    #[test]
    fn table_matches_abi_md_fops() {
        let rows = abi_rows("4");
        assert_eq!(rows.len(), FopKind::COUNT, "one ABI.md row per fop");
        for row in rows {
            let code: u16 = row[0].parse().expect("code");
            let kind = FopKind::from_code(code).unwrap_or_else(|| panic!("code {code} of ABI.md not in the table"));
            assert_eq!(kind.name(), row[1], "{kind:?}");
            let fields = abi_fields(row[2]);
            let names: Vec<&str> = fields.iter().map(|f| f.0).collect();
            assert_eq!(names, kind.fields(), "{kind:?}: fields and their order");
            let of = |ty: &str| fields.iter().filter(|f| f.1 == ty).map(|f| f.0).collect::<Vec<_>>();
            assert_eq!(of("Fd"), kind.fd_fields(), "{kind:?}: fd fields");
            assert_eq!(of("Loc"), kind.loc_fields(), "{kind:?}: loc fields");
            assert_eq!(row[2].contains("**payload**"), kind.flags().contains(FopFlags::PAYLOAD), "{kind:?}");
        }
    }

    #[test]
    fn table_matches_abi_md_replies() {
        let mut answered = Vec::new();
        for row in abi_rows("5") {
            let tag: u8 = row[0].parse().expect("tag");
            let answers = row[3].split(" (").next().unwrap_or("");
            for name in answers.split(',').map(str::trim) {
                let kind = FopKind::from_name(name).unwrap_or_else(|| panic!("{name} of ABI.md not a fop"));
                let reply = kind.reply();
                assert_eq!((reply as u8, format!("{reply:?}").as_str()), (tag, row[1]), "{kind:?}");
                answered.push(kind);
            }
        }
        answered.sort();
        assert_eq!(answered, FopKind::ALL, "every fop answered by exactly one reply in ABI.md");
    }

    #[test]
    fn flags_are_consistent() {
        for &k in FopKind::ALL {
            let f = k.flags();
            assert!(!(f.contains(FopFlags::MODIFYING) && f.contains(FopFlags::READ_ONLY)), "{k:?}");
            assert_eq!(f.contains(FopFlags::FD_BASED), !k.fd_fields().is_empty(), "{k:?}");
            for field in k.fd_fields().iter().chain(k.loc_fields()) {
                assert!(k.fields().contains(field), "{k:?}: {field} is not a field");
            }
            assert_eq!(k.is_modifying(), f.contains(FopFlags::MODIFYING));
        }
    }

    #[test]
    fn reply_accessors() {
        let iatt = Iatt::default();
        assert_eq!(Reply::Attr(iatt).into_attr(), Ok(iatt));
        assert_eq!(Reply::Entry { iatt, postparent: iatt }.into_entry(), Ok(iatt));
        let wrong = Reply::Empty.into_entry().expect_err("empty is not an entry");
        assert_eq!(wrong, WrongReply { expected: ReplyKind::Entry, got: ReplyKind::Empty });
        assert_eq!(Errno::from(wrong), Errno::EIO);
        assert_eq!(Reply::Offset(7).into_offset(), Ok(7));
        assert!(Reply::Offset(7).into_xattrs().is_err());
    }
}
