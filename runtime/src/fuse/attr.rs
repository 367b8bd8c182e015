//! Attribute conversion between the fop model and FUSE: [`Iatt`] to
//! [`FileAttr`], file types, and times both ways.

use super::*;

pub(super) fn system_time(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec.min(999_999_999))
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec.min(999_999_999).into())
    }
}

pub(super) fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let (sec, nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec == 0 { Timespec { sec, nsec: 0 } } else { Timespec { sec: sec - 1, nsec: 1_000_000_000 - nsec } }
        }
    }
}

pub(super) fn fuse_kind(t: FileType) -> fuser::FileType {
    match t {
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::BlockDev => fuser::FileType::BlockDevice,
        FileType::CharDev => fuser::FileType::CharDevice,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
        FileType::Regular | FileType::Unknown => fuser::FileType::RegularFile,
    }
}

/// The kernel's view of an inode's attributes; `nodeid` is also `st_ino`.
pub(super) fn file_attr(iatt: &Iatt, nodeid: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size: iatt.size,
        blocks: iatt.blocks,
        atime: system_time(iatt.atime),
        mtime: system_time(iatt.mtime),
        ctime: system_time(iatt.ctime),
        crtime: UNIX_EPOCH,
        kind: fuse_kind(iatt.file_type()),
        perm: (iatt.mode & 0o7777) as u16,
        nlink: iatt.nlink,
        uid: iatt.uid,
        gid: iatt.gid,
        rdev: iatt.rdev as u32,
        blksize: if iatt.blksize == 0 { 4096 } else { iatt.blksize },
        flags: 0,
    }
}
