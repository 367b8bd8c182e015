//! Data I/O and inode attributes (GlusterFS's posix-inode-fd-ops.c): reads,
//! O_DIRECT writes, zerofill, copy_file_range, checksums, a change through
//! an fd answered with the attributes around it, set-user-ID dropping,
//! setattr, access checks and statfs.

use super::*;

/// Takes set-user-ID (always) and set-group-ID (when group-executable)
/// away from a regular file that a caller other than root wrote, truncated
/// or allocated, as the kernel does for a caller without CAP_FSETID. The
/// brick runs as root, so the kernel keeps those bits on its own writes;
/// this does it for the caller instead. That is what lets the FUSE client
/// hand the job over (FUSE_HANDLE_KILLPRIV_V2) and stop asking for
/// `security.capability` before every write. (The capability xattr itself
/// the brick's kernel removes on any write, whoever the caller.)
pub(super) fn drop_privs(fd: BorrowedFd<'_>, mode: u32, ctx: &CallCtx) -> Sys<()> {
    if ctx.uid == 0 || mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(());
    }
    let mut kill = mode & libc::S_ISUID;
    if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        kill |= libc::S_ISGID;
    }
    if kill == 0 { Ok(()) } else { sys::fchmod(fd, mode & 0o7777 & !kill) }
}

/// Adler-32.
pub(super) fn adler32(data: &[u8]) -> u32 {
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

impl Inner {
    /// Whether an I/O of `len` bytes at `offset` goes around the page
    /// cache under the threshold `min` (`o-direct-min-size`,
    /// `o-direct-read-min-size`; 0 off): at least that large, 4 KiB
    /// aligned, and not on a tmpfs or ramfs brick.
    pub(super) fn goes_around(&self, min: &AtomicU64, offset: u64, len: usize) -> bool {
        let min = min.load(Ordering::Relaxed);
        min != 0 && !self.in_memory && len as u64 >= min && direct_aligned(offset, len)
    }

    /// A change of a file's data through an fd: `op`, then what the caller
    /// loses by it ([`drop_privs`]), answered with the attributes around it.
    pub(super) fn prepost(&self, id: FdId, ctx: &CallCtx, op: impl FnOnce(BorrowedFd<'_>) -> Sys<()>) -> FopResult {
        let f = self.fd(id)?;
        let pre = f.iatt()?;
        op(f.file()?)?;
        drop_privs(f.file()?, pre.mode, ctx)?;
        ok(Reply::PrePost { pre, post: f.iatt()? })
    }

    pub(super) fn statfs(&self) -> Sys<Statvfs> {
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
}

pub(super) fn apply_attr(t: Target<'_>, a: &SetAttr) -> Sys<()> {
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

/// `a` without what the inode already has (`pre`): a chown to the owner
/// it has, a chmod to the mode it has (an untar as root asks for both on
/// every file; each dirties the inode in the journal). Only for bricks
/// that show the stored times (mdata): the file system's own ctime, which
/// the skipped calls would have moved, is not seen. A chown clears the
/// set-id bits and the file capabilities even when the owner stays, so it
/// is kept when the inode has a set-id bit, and the capabilities are
/// removed in its place.
pub(super) fn without_noops(t: Target<'_>, a: &SetAttr, pre: &Iatt) -> Sys<SetAttr> {
    let mut a = *a;
    let same_owner = a.uid.is_none_or(|u| u == pre.uid) && a.gid.is_none_or(|g| g == pre.gid);
    let set_id = pre.mode & (libc::S_ISUID | libc::S_ISGID) != 0;
    if (a.uid.is_some() || a.gid.is_some()) && same_owner && !set_id {
        // Only regular files carry capabilities.
        if pre.mode & libc::S_IFMT == libc::S_IFREG {
            match t.removexattr(c"security.capability") {
                Ok(()) | Err(Errno::ENODATA | Errno::EOPNOTSUPP) => {}
                Err(e) => return Err(e),
            }
        }
        (a.uid, a.gid) = (None, None);
    }
    if a.mode.is_some_and(|m| m & 0o7777 == pre.mode & 0o7777) {
        a.mode = None;
    }
    Ok(a)
}

/// POSIX permission check of `mask` (`R_OK` 4, `W_OK` 2, `X_OK` 1) for the
/// caller.
pub(super) fn access_ok(st: &libc::stat, ctx: &CallCtx, mask: u32) -> bool {
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

/// True when a write of `len` bytes at `offset` meets O_DIRECT's alignment.
pub(super) fn direct_aligned(offset: u64, len: usize) -> bool {
    offset.is_multiple_of(sys::ALIGN as u64) && len.is_multiple_of(sys::ALIGN)
}

/// Writes `data` through the `O_DIRECT` descriptor `direct` (from an
/// aligned copy when the buffer itself is not aligned); falls back to the
/// buffered `file` when the file system refuses the alignment (EINVAL
/// comes before anything is written).
pub(super) fn write_direct(direct: BorrowedFd<'_>, file: BorrowedFd<'_>, data: &[u8], offset: u64) -> Sys<()> {
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

/// Reads into `dst` through the `O_DIRECT` descriptor `direct` (`dst`
/// and `offset` aligned); falls back to the buffered `file` when the file
/// system refuses the alignment, as [`write_direct`] does.
fn read_direct(direct: BorrowedFd<'_>, file: BorrowedFd<'_>, dst: &mut [u8], offset: u64) -> Sys<usize> {
    match sys::pread_direct(direct, dst, offset) {
        Err(Errno::EINVAL) if direct.as_raw_fd() != file.as_raw_fd() => sys::pread_full(file, dst, offset),
        r => r,
    }
}

/// Reads up to `size` bytes at `offset` (fewer at end of file). With
/// `around` (`o-direct-read-min-size`, the read aligned), the read goes
/// around the brick's page cache through the fd's `O_DIRECT` twin, as a
/// read on an fd opened `O_DIRECT` always does.
pub(super) fn read_at(
    f: &OpenFd,
    size: usize,
    offset: u64,
    lent: Option<Box<dyn LentMem>>,
    around: bool,
) -> Sys<Bytes> {
    if size > MAX_IO {
        return Err(Errno::EINVAL);
    }
    let file = f.file()?;
    let direct = if f.direct { Some(file) } else { around.then(|| f.read_bypass()).flatten() };
    // Into the memory the caller lent (a local client's shared chunk, page
    // aligned, so O_DIRECT reads need no buffer of their own).
    if let Some(mut mem) = lent.filter(|m| m.capacity() >= size) {
        let dst = &mut mem.as_mut_slice()[..size];
        let aligned = (dst.as_ptr() as usize).is_multiple_of(sys::ALIGN) && direct_aligned(offset, size);
        let n = match direct {
            None => Some(sys::pread_full(file, dst, offset)?),
            Some(d) if aligned => Some(read_direct(d, file, dst, offset)?),
            Some(_) => None,
        };
        if let Some(n) = n {
            return Ok(mem.freeze(n));
        }
    }
    if let Some(d) = direct {
        let mut buf = sys::AlignedBuf::zeroed(size)?;
        let n = read_direct(d, file, buf.as_mut_slice(), offset)?;
        // As below: a short read does not keep the whole buffer.
        return Ok(if n < size / 2 {
            Bytes::copy_from_slice(&buf.as_slice()[..n])
        } else {
            Bytes::from_owner(buf.truncated(n))
        });
    }
    let mut buf = sys::pread_vec(file, size, offset)?;
    let n = buf.len();
    // A short read (end of file) gives back what it did not fill, so the
    // reply does not hold the whole requested size until it is written.
    if n < size / 2 {
        buf.shrink_to_fit();
    }
    Ok(Bytes::from(buf))
}

/// Writes zeroes over a range (extending the file if needed).
pub(super) fn zerofill(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Sys<()> {
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
pub(super) fn copy_range(
    fi: BorrowedFd<'_>,
    off_in: u64,
    fo: BorrowedFd<'_>,
    off_out: u64,
    len: u64,
    flags: u32,
) -> Sys<u64> {
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
