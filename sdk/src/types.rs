//! The value types fops are made of: [`Gfid`], [`Iatt`], [`Loc`], [`Fd`],
//! lock descriptions and the rest.

use std::fmt;

/// A 128-bit GlusterFS-style file id, the same on every brick of a volume.
/// The root directory's is `00000000-0000-0000-0000-000000000001`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gfid(pub [u8; 16]);

impl Gfid {
    /// The null gfid, meaning "not known".
    pub const NULL: Gfid = Gfid([0; 16]);
    /// The volume root.
    pub const ROOT: Gfid = Gfid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

    /// True for [`Gfid::NULL`].
    pub fn is_null(&self) -> bool {
        self.0 == [0; 16]
    }

    /// A fresh random (version 4) gfid. Not on `wasm32-unknown-unknown`,
    /// which has no source of randomness (plugins get gfids from the host).
    #[cfg(not(all(target_family = "wasm", target_os = "unknown")))]
    pub fn random() -> Gfid {
        let mut b = [0u8; 16];
        crate::rand::fill(&mut b);
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        Gfid(b)
    }

    /// A fresh random gfid for an inode made in directory `parent`: its
    /// first two bytes are a hash of `parent`, the same for every inode made
    /// there, and the rest random (version 4, 106 random bits).
    ///
    /// A brick keeps each inode's handle in `.glusterfs/<byte 0>/<byte 1>/`,
    /// so with wholly random gfids the handles of one directory's files are
    /// spread over 65536 handle directories: removing (or making) each file
    /// reads a handle directory of its own from the disk once the cache is
    /// cold. Made here, the files of a directory share one. The cost: a
    /// handle directory holds as many entries as the largest directory
    /// that hashes to it, so on an ext4 brick without `large_dir` (a
    /// two-level htree, some 20 million 36-character names) a single
    /// directory of that many files reaches the handle directory's limit
    /// before its own.
    #[cfg(not(all(target_family = "wasm", target_os = "unknown")))]
    pub fn random_in(parent: Gfid) -> Gfid {
        let mut g = Gfid::random();
        // splitmix64's finalizer over both halves: every bit of `parent`
        // moves the two bytes taken.
        let mix = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let x = u128::from_le_bytes(parent.0);
        let h = mix(x as u64 ^ mix((x >> 64) as u64));
        g.0[..2].copy_from_slice(&h.to_be_bytes()[..2]);
        g
    }

    /// Parses the canonical `8-4-4-4-12` hex form (either case).
    pub fn parse(s: &str) -> Option<Gfid> {
        let s = s.as_bytes();
        if s.len() != 36 || DASHES.iter().any(|&i| s[i] != b'-') {
            return None;
        }
        let mut digits =
            s.iter().enumerate().filter(|(i, _)| !DASHES.contains(i)).map(|(_, &c)| (c as char).to_digit(16));
        let mut out = [0u8; 16];
        for byte in &mut out {
            let hi = digits.next()??;
            let lo = digits.next()??;
            *byte = (hi * 16 + lo) as u8;
        }
        Some(Gfid(out))
    }

    /// The canonical `8-4-4-4-12` lower-case hex form as bytes: what
    /// `Display` writes, made without the formatting machinery (a brick
    /// builds a handle path from it for every fop).
    pub fn canonical(&self) -> [u8; 36] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [b'-'; 36];
        let mut at = 0;
        for byte in self.0 {
            if DASHES.contains(&at) {
                at += 1;
            }
            out[at] = HEX[usize::from(byte >> 4)];
            out[at + 1] = HEX[usize::from(byte & 15)];
            at += 2;
        }
        out
    }

    /// A 64-bit inode number derived from the gfid (as GlusterFS's FUSE bridge
    /// does); the root is 1.
    pub fn ino(&self) -> u64 {
        if *self == Gfid::ROOT {
            return 1;
        }
        u64::from_be_bytes(self.0[8..16].try_into().unwrap_or([0; 8]))
    }
}

/// Where the canonical form has its dashes.
const DASHES: [usize; 4] = [8, 13, 18, 23];

impl fmt::Display for Gfid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.canonical()).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Gfid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gfid({self})")
    }
}

/// The kind of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FileType {
    /// Not known (the iatt is empty).
    #[default]
    Unknown,
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Block device.
    BlockDev,
    /// Character device.
    CharDev,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
}

impl FileType {
    /// The type encoded in the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u32) -> FileType {
        match mode & 0o170000 {
            0o100000 => FileType::Regular,
            0o040000 => FileType::Directory,
            0o120000 => FileType::Symlink,
            0o060000 => FileType::BlockDev,
            0o020000 => FileType::CharDev,
            0o010000 => FileType::Fifo,
            0o140000 => FileType::Socket,
            _ => FileType::Unknown,
        }
    }
}

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timespec {
    /// Seconds.
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

impl Timespec {
    /// The current time of day (the epoch if the clock is before it).
    pub fn now() -> Timespec {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timespec { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() }
    }

    /// Nanoseconds since the epoch (0 before it, saturating far after).
    pub fn to_nanos(self) -> u64 {
        u64::try_from(self.sec).unwrap_or(0).saturating_mul(1_000_000_000).saturating_add(u64::from(self.nsec))
    }

    /// The time `ns` nanoseconds after the epoch.
    pub fn from_nanos(ns: u64) -> Timespec {
        Timespec { sec: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX), nsec: (ns % 1_000_000_000) as u32 }
    }
}

/// An inode's attributes, GlusterFS's `struct iatt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Iatt {
    /// The inode's gfid.
    pub gfid: Gfid,
    /// Inode number (derived from the gfid above the brick).
    pub ino: u64,
    /// Device of the brick.
    pub dev: u64,
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    /// Hard link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number for device files.
    pub rdev: u64,
    /// Size in bytes.
    pub size: u64,
    /// Preferred I/O block size.
    pub blksize: u32,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last data change.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
}

impl Iatt {
    /// The file type from the mode.
    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode)
    }
    /// True for directories.
    pub fn is_dir(&self) -> bool {
        self.file_type() == FileType::Directory
    }
}

/// Attribute changes for setattr; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// New permission bits (the type bits are ignored).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
}

impl SetAttr {
    /// Applies the changes to `a` as storage/posix does them (owner, mode,
    /// times), `now` standing for [`TimeSet::Now`] and becoming the ctime
    /// (unless the ctime is later already).
    pub fn apply(&self, a: &mut Iatt, now: Timespec) {
        if let Some(u) = self.uid {
            a.uid = u;
        }
        if let Some(g) = self.gid {
            a.gid = g;
        }
        if let Some(m) = self.mode {
            a.mode = (a.mode & 0o170000) | (m & 0o7777);
        }
        let time = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = self.atime {
            a.atime = time(t);
        }
        if let Some(t) = self.mtime {
            a.mtime = time(t);
        }
        a.ctime = a.ctime.max(now);
    }

    /// This setattr with `Now` as the time `now` it stands for.
    pub fn at(&self, now: Timespec) -> SetAttr {
        let fix = |t: Option<TimeSet>| t.map(|t| if t == TimeSet::Now { TimeSet::At(now) } else { t });
        SetAttr { atime: fix(self.atime), mtime: fix(self.mtime), ..*self }
    }

    /// One setattr that does what this one and then `later` do, when one
    /// can: not when this one sets the mode and `later` the owner (a new
    /// owner loses set-id bits on the brick, so that order matters).
    /// `Now` stays `Now`: where the two stand for different times, fix
    /// this one's first ([`SetAttr::at`]).
    pub fn then(&self, later: &SetAttr) -> Option<SetAttr> {
        if self.mode.is_some() && (later.uid.is_some() || later.gid.is_some()) {
            return None;
        }
        Some(SetAttr {
            mode: later.mode.or(self.mode),
            uid: later.uid.or(self.uid),
            gid: later.gid.or(self.gid),
            atime: later.atime.or(self.atime),
            mtime: later.mtime.or(self.mtime),
        })
    }

    /// Whether a caller with `uid` can know what this setattr does to an
    /// inode with attributes `a` before a brick does it (to answer it
    /// ahead, as write-behind and async-dirops do): the brick will not
    /// refuse it (root; or the owner changing the mode without set-id
    /// bits, or the times), and it changes nothing it does not say (a new
    /// owner of a set-id inode loses its set-id bits on the brick).
    pub fn predictable(&self, uid: u32, a: &Iatt) -> bool {
        const SET_ID: u32 = 0o6000;
        let owner_change = self.uid.is_some_and(|u| u != a.uid) || self.gid.is_some_and(|g| g != a.gid);
        if owner_change && a.mode & SET_ID != 0 {
            return false;
        }
        uid == 0
            || (uid == a.uid && self.uid.is_none() && self.gid.is_none() && self.mode.is_none_or(|m| m & SET_ID == 0))
    }
}

/// How a timestamp is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// The brick's current time.
    Now,
    /// This time.
    At(Timespec),
}

/// Where a path-based fop applies: an inode by gfid, or a name in a parent
/// directory (GlusterFS's `loc_t` without the string path).
///
/// Lookup and creating fops use `parent` + `name`; others may give just
/// `gfid`. When both are set, `gfid` names the inode expected at that entry.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Loc {
    /// The inode, or [`Gfid::NULL`] when not known yet.
    pub gfid: Gfid,
    /// The parent directory, or NULL when resolving by gfid alone.
    pub parent: Gfid,
    /// The entry name in `parent` (a single component, no `/`).
    pub name: String,
}

impl Loc {
    /// A location by gfid alone.
    pub fn gfid(gfid: Gfid) -> Loc {
        Loc { gfid, parent: Gfid::NULL, name: String::new() }
    }
    /// A location by parent and name.
    pub fn entry(parent: Gfid, name: impl Into<String>) -> Loc {
        Loc { gfid: Gfid::NULL, parent, name: name.into() }
    }
    /// The volume root.
    pub fn root() -> Loc {
        Loc::gfid(Gfid::ROOT)
    }
    /// Sets the expected gfid of an entry location.
    pub fn with_gfid(mut self, gfid: Gfid) -> Loc {
        self.gfid = gfid;
        self
    }
    /// True when the location names an entry (parent and name).
    pub fn is_entry(&self) -> bool {
        !self.parent.is_null() && !self.name.is_empty()
    }
}

/// An open file descriptor's id, chosen by the caller that opens it (the FUSE
/// bridge, the client API, protocol/server) and unique within that caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct FdId(pub u64);

/// An open fd as fd-based fops name it: its id and the inode it is open on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Fd {
    /// The fd's id.
    pub id: FdId,
    /// The inode the fd is open on.
    pub gfid: Gfid,
}

/// One directory entry from readdir or readdirp.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DirEntry {
    /// The entry name.
    pub name: String,
    /// The offset to continue from after this entry.
    pub d_off: u64,
    /// The entry's type.
    pub d_type: FileType,
    /// Attributes (readdirp only; zeroed for readdir).
    pub iatt: Iatt,
}

/// Filesystem statistics, `struct statvfs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Statvfs {
    /// Block size.
    pub bsize: u64,
    /// Fragment size.
    pub frsize: u64,
    /// Blocks in all.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Blocks free to unprivileged users.
    pub bavail: u64,
    /// Inodes in all.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Inodes free to unprivileged users.
    pub favail: u64,
    /// Filesystem id.
    pub fsid: u64,
    /// Mount flags.
    pub flag: u64,
    /// Longest name.
    pub namemax: u64,
}

/// The kind of a byte-range lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockType {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
    /// Release.
    Unlock,
}

/// A byte-range lock, `struct flock` with a lock owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flock {
    /// Read, write or unlock.
    pub ty: LockType,
    /// First byte.
    pub start: u64,
    /// Length; 0 means to the end of the file.
    pub len: u64,
    /// The process id of the holder (informational; reported by GETLK).
    pub pid: u32,
    /// The lock owner; locks of one owner never conflict with each other.
    pub owner: u64,
}

impl Flock {
    /// A lock over the whole file.
    pub fn whole(ty: LockType, owner: u64) -> Flock {
        Flock { ty, start: 0, len: 0, pid: 0, owner }
    }
    /// The last byte covered (inclusive), `u64::MAX` for "to end of file".
    pub fn end(&self) -> u64 {
        if self.len == 0 { u64::MAX } else { self.start.saturating_add(self.len - 1) }
    }
}

/// What an lk or inodelk call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LkCmd {
    /// Report a conflicting lock (or Unlock if none).
    GetLk,
    /// Acquire or release without waiting; EAGAIN on conflict.
    SetLk,
    /// Acquire, waiting for conflicting locks to go.
    SetLkw,
}

/// What an entrylk call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntrylkCmd {
    /// Acquire, waiting.
    Lock,
    /// Acquire without waiting; EAGAIN on conflict.
    LockNb,
    /// Release.
    Unlock,
}

/// Entry lock kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntrylkType {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
}

/// How xattrop combines the given values with the stored ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XattropOp {
    /// Element-wise add of big-endian 32-bit integers (AFR's pending counters).
    AddArray,
    /// Element-wise add of big-endian 64-bit integers.
    AddArray64,
}

/// What seek looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SeekWhat {
    /// The next data at or after the offset.
    Data,
    /// The next hole at or after the offset.
    Hole,
}

/// A lease request (GlusterFS's `gf_lease`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseCmd {
    /// Read lease.
    Read,
    /// Read-write lease.
    Write,
    /// Give up a lease.
    Unlock,
}

/// Flags for rename.
pub mod rename_flags {
    /// Fail with EEXIST if the target exists.
    pub const NOREPLACE: u32 = 1;
    /// Swap the two entries atomically.
    pub const EXCHANGE: u32 = 2;
}

/// Flags for setxattr.
pub mod xattr_flags {
    /// Fail with EEXIST if the attribute exists.
    pub const CREATE: u32 = 1;
    /// Fail with ENODATA if the attribute does not exist.
    pub const REPLACE: u32 = 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gfids_made_in_a_directory_share_their_first_two_bytes_only() {
        let parent = Gfid::random();
        let made: Vec<Gfid> = (0..64).map(|_| Gfid::random_in(parent)).collect();
        for g in &made {
            assert_eq!(g.0[..2], made[0].0[..2], "one handle directory for {parent}'s inodes");
            assert_eq!((g.0[6] >> 4, g.0[8] >> 6), (4, 2), "a version 4 uuid: {g}");
        }
        let mut distinct = made.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), made.len(), "the rest is random");
        assert!(made.iter().all(|g| g.ino() != made[0].ino() || g == &made[0]), "inode numbers differ");
        // Other directories' inodes spread over the handle directories.
        let buckets: std::collections::HashSet<[u8; 2]> =
            (0..1000).map(|_| Gfid::random_in(Gfid::random()).0[..2].try_into().expect("2 bytes")).collect();
        assert!(buckets.len() > 950, "1000 directories in {} handle directories", buckets.len());
        let siblings: std::collections::HashSet<u8> =
            (0u8..=255).map(|i| Gfid::random_in(Gfid([i; 16])).0[0]).collect();
        assert!(siblings.len() > 128, "gfids that differ little still spread: {} first bytes", siblings.len());
    }

    #[test]
    fn a_gfid_reads_back_from_its_canonical_form_and_nothing_else() {
        for g in [Gfid::NULL, Gfid::ROOT, Gfid([0xff; 16]), Gfid::random(), Gfid::random()] {
            let by_bytes: String =
                g.0.iter()
                    .enumerate()
                    .map(|(i, b)| format!("{}{b:02x}", if matches!(i, 4 | 6 | 8 | 10) { "-" } else { "" }))
                    .collect();
            assert_eq!(g.to_string(), by_bytes);
            assert_eq!(g.canonical(), by_bytes.as_bytes());
            assert_eq!(Gfid::parse(&by_bytes), Some(g));
            assert_eq!(Gfid::parse(&by_bytes.to_uppercase()), Some(g), "either case");
        }
        let good = "00000000-0000-0000-0000-000000000001";
        assert_eq!(Gfid::parse(good), Some(Gfid::ROOT));
        for bad in [
            "",
            &good[1..],
            "000000000-000-0000-0000-000000000001",
            "00000000-0000-0000-0000-00000000000g",
            "00000000+0000-0000-0000-000000000001",
            "00000000-0000-0000-0000-0000000000001",
        ] {
            assert_eq!(Gfid::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_setattr_is_predictable_for_root_and_for_the_owner_within_bounds() {
        let file = Iatt { mode: 0o100644, uid: 1000, gid: 100, ..Iatt::default() };
        let mode = |m| SetAttr { mode: Some(m), ..SetAttr::default() };
        let times = SetAttr { mtime: Some(TimeSet::Now), ..SetAttr::default() };
        let chown = SetAttr { uid: Some(7), ..SetAttr::default() };
        assert!(chown.predictable(0, &file) && mode(0o4755).predictable(0, &file), "root");
        assert!(times.predictable(1000, &file) && mode(0o600).predictable(1000, &file), "the owner");
        assert!(!mode(0o2755).predictable(1000, &file), "the owner setting a set-id bit");
        assert!(!SetAttr { gid: Some(100), ..SetAttr::default() }.predictable(1000, &file), "the owner's chgrp");
        assert!(!times.predictable(1001, &file), "another user");
        let setuid = Iatt { mode: 0o104755, ..file };
        assert!(!chown.predictable(0, &setuid), "a new owner of a set-id file");
        assert!(SetAttr { uid: Some(1000), ..SetAttr::default() }.predictable(0, &setuid), "the same owner");

        let mut a = file;
        let now = Timespec { sec: 50, nsec: 0 };
        let at = Timespec { sec: 7, nsec: 0 };
        SetAttr {
            mode: Some(0o4700),
            uid: Some(1),
            gid: None,
            atime: Some(TimeSet::At(at)),
            mtime: Some(TimeSet::Now),
        }
        .apply(&mut a, now);
        assert_eq!((a.mode, a.uid, a.gid, a.atime, a.mtime, a.ctime), (0o104700, 1, 100, at, now, now));
    }

    #[test]
    fn two_setattrs_make_one_unless_an_owner_follows_a_mode() {
        let t = |sec| Timespec { sec, nsec: 0 };
        let chown = SetAttr { uid: Some(7), gid: Some(8), ..SetAttr::default() };
        let chmod = SetAttr { mode: Some(0o750), ..SetAttr::default() };
        let touch = SetAttr { atime: Some(TimeSet::Now), mtime: Some(TimeSet::At(t(5))), ..SetAttr::default() };
        // tar's order: owner, mode, times.
        let one = chown.then(&chmod).and_then(|m| m.then(&touch)).expect("merged");
        assert_eq!(one, SetAttr { uid: Some(7), gid: Some(8), mode: Some(0o750), ..touch });
        assert_eq!(chmod.then(&chown), None, "a new owner after a mode (set-id bits)");
        assert_eq!(chmod.then(&SetAttr { mode: Some(0o700), ..SetAttr::default() }).and_then(|m| m.mode), Some(0o700));
        // A Now fixed to the time it stood for before a later one is merged.
        let fixed = touch.at(t(9));
        assert_eq!((fixed.atime, fixed.mtime), (Some(TimeSet::At(t(9))), Some(TimeSet::At(t(5)))));
        assert_eq!(fixed.then(&chmod).and_then(|m| m.atime), Some(TimeSet::At(t(9))));
    }
}
