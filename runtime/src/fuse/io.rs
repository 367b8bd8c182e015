//! Files: open, create, read, write, flush, release, fsync (and fsyncdir),
//! fallocate, lseek (SEEK_DATA, SEEK_HOLE) and copy_file_range.

use std::sync::Arc;

use bytes::Bytes;
use fuser::{FileAttr, FileHandle, FopenFlags, INodeNo};
use xlfs_sdk::{Errno, Fd, FdId, Fop, Gfid, Loc, Reply, SeekWhat};

use super::entry::new_entry_xdata;
use super::{Caller, Core};
use crate::fd::FdEntry;

/// Largest copy_file_range the kernel can be told about in one answer (its
/// reply carries a 32-bit count), page aligned.
const MAX_COPY: u64 = (u32::MAX as u64) & !0xfff;

impl Core {
    /// The `O_*` flags sent to the bricks for an open: with the writeback
    /// cache the kernel reads around partial writes of a write-only file and
    /// places appends itself, so write-only becomes read-write and
    /// `O_APPEND` is dropped (as libfuse's passthrough examples do).
    fn open_flags(&self, flags: u32) -> u32 {
        let mut f = flags;
        if self.opts.writeback_cache {
            if f & libc::O_ACCMODE as u32 == libc::O_WRONLY as u32 {
                f = (f & !(libc::O_ACCMODE as u32)) | libc::O_RDWR as u32;
            }
            f &= !(libc::O_APPEND as u32);
        }
        f
    }

    /// What the kernel is told about an open file.
    fn fopen_flags(&self) -> FopenFlags {
        let mut f = FopenFlags::empty();
        if self.opts.direct_io {
            f |= FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        } else if self.opts.keep_cache {
            f |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        f
    }

    /// Registers an open in the fd table; the id is the FUSE file handle.
    pub(super) fn new_fd(&self, gfid: Gfid, flags: u32, is_dir: bool) -> Result<FdId, Errno> {
        self.fds.open(FdEntry { gfid, flags, is_dir })
    }

    pub(super) async fn open(
        self: Arc<Self>,
        who: Caller,
        ino: INodeNo,
        flags: i32,
    ) -> Result<(FileHandle, FopenFlags), Errno> {
        let gfid = self.gfid(ino)?;
        let flags = self.open_flags(flags as u32);
        if flags & libc::O_TRUNC as u32 != 0 {
            self.data.changing(gfid);
        }
        let id = self.new_fd(gfid, flags, false)?;
        match self.call(self.ctx(who, 0, true), Fop::Open { loc: Loc::gfid(gfid), flags, fd: id }).await {
            Ok(_) => Ok((FileHandle(id.0), self.fopen_flags())),
            Err(e) => {
                self.fds.release(id);
                Err(e)
            }
        }
    }

    pub(super) async fn create(
        self: Arc<Self>,
        who: Caller,
        parent: INodeNo,
        name: String,
        mode: u32,
        umask: u32,
        flags: u32,
    ) -> Result<(FileAttr, FileHandle, FopenFlags), Errno> {
        let pg = self.gfid(parent)?;
        let flags = self.open_flags(flags);
        // The fd's gfid is set once the reply names the inode.
        let id = self.new_fd(Gfid::NULL, flags, false)?;
        let fop = Fop::Create { loc: Loc::entry(pg, name.clone()), flags, mode, umask, fd: id };
        let iatt = match self.call_x(self.ctx(who, 0, true), fop, new_entry_xdata(pg)).await {
            Ok(Reply::Entry { iatt, .. }) => iatt,
            other => {
                self.fds.release(id);
                return Err(other.err().unwrap_or(Errno::EIO));
            }
        };
        self.fds.set_gfid(id, iatt.gfid);
        let attr = self.entry_attr(pg, &name, &iatt)?;
        Ok((attr, FileHandle(id.0), self.fopen_flags()))
    }

    pub(super) async fn read(
        self: Arc<Self>,
        who: Caller,
        owner: u64,
        fh: FileHandle,
        offset: u64,
        size: u32,
    ) -> Result<Bytes, Errno> {
        let fd = self.fd(fh)?;
        Ok(self.call(self.ctx(who, owner, false), Fop::Readv { fd, size, offset, flags: 0 }).await?.into_read()?)
    }

    pub(super) async fn write(
        self: Arc<Self>,
        who: Caller,
        owner: u64,
        fh: FileHandle,
        offset: u64,
        data: Bytes,
    ) -> Result<u32, Errno> {
        let fd = self.fd(fh)?;
        let len = data.len() as u32;
        self.data.changing(fd.gfid);
        self.call(self.ctx(who, owner, false), Fop::Writev { fd, data, offset, flags: 0 }).await?;
        Ok(len)
    }

    /// flush (each close(2)): the bricks release the POSIX locks of
    /// `lock_owner` on the file.
    pub(super) async fn flush(self: Arc<Self>, who: Caller, fh: FileHandle, lock_owner: u64) -> Result<(), Errno> {
        let fd = self.fd(fh)?;
        self.flush_locks(self.ctx(who, lock_owner, false), fd).await
    }

    /// release (the last close): a flush first when the kernel asks for it,
    /// then Release, which also drops the flock held through the fd.
    pub(super) async fn release(
        self: Arc<Self>,
        who: Caller,
        fh: FileHandle,
        owner: Option<u64>,
        flush: bool,
    ) -> Result<(), Errno> {
        let fd = self.fd(fh)?;
        let ctx = self.ctx(who, owner.unwrap_or(0), false);
        if flush && let Err(e) = self.flush_locks(ctx.clone(), fd).await {
            tracing::debug!(error = %e, "flush before release");
        }
        self.release_locks(ctx, fd, false).await
    }

    /// fsync or fsyncdir.
    pub(super) async fn fsync(
        self: Arc<Self>,
        who: Caller,
        fh: FileHandle,
        datasync: bool,
        dir: bool,
    ) -> Result<(), Errno> {
        let fd = self.fd(fh)?;
        let fop = if dir { Fop::Fsyncdir { fd, datasync } } else { Fop::Fsync { fd, datasync } };
        self.call(self.ctx(who, 0, false), fop).await.map(drop)
    }

    pub(super) async fn fallocate(
        self: Arc<Self>,
        who: Caller,
        fh: FileHandle,
        offset: u64,
        len: u64,
        mode: u32,
    ) -> Result<(), Errno> {
        let fd = self.fd(fh)?;
        self.data.changing(fd.gfid);
        self.call(self.ctx(who, 0, false), Fop::Fallocate { fd, mode, offset, len }).await.map(drop)
    }

    /// lseek: the kernel handles SEEK_SET, SEEK_CUR and SEEK_END itself and
    /// sends only SEEK_DATA and SEEK_HOLE.
    pub(super) async fn lseek(
        self: Arc<Self>,
        who: Caller,
        fh: FileHandle,
        offset: i64,
        whence: i32,
    ) -> Result<i64, Errno> {
        let fd = self.fd(fh)?;
        let what = match whence {
            libc::SEEK_DATA => SeekWhat::Data,
            libc::SEEK_HOLE => SeekWhat::Hole,
            _ => return Err(Errno::EINVAL),
        };
        let offset = u64::try_from(offset).map_err(|_| Errno::ENXIO)?;
        let found = self.call(self.ctx(who, 0, false), Fop::Seek { fd, offset, what }).await?.into_offset()?;
        i64::try_from(found).map_err(|_| Errno::EOVERFLOW)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn copy_file_range(
        self: Arc<Self>,
        who: Caller,
        fh_in: FileHandle,
        off_in: u64,
        fh_out: FileHandle,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> Result<u32, Errno> {
        let (fd_in, fd_out): (Fd, Fd) = (self.fd(fh_in)?, self.fd(fh_out)?);
        self.data.changing(fd_out.gfid);
        let fop = Fop::CopyFileRange { fd_in, off_in, fd_out, off_out, len: len.min(MAX_COPY), flags };
        let copied = self.call(self.ctx(who, 0, false), fop).await?.into_copied()?;
        u32::try_from(copied).map_err(|_| Errno::EOVERFLOW)
    }
}
