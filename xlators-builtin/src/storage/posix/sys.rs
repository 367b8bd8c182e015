//! Safe wrappers over the Linux system calls storage/posix makes.
//!
//! Every call here acts relative to a directory descriptor and never
//! follows a symbolic link in its last component: the brick's safety rests on
//! that. The one exception is [`chmod_fd_path`], which takes an `O_PATH`
//! descriptor whose type the caller has checked. Errors come back as the
//! [`Errno`] the kernel reported; EINTR is retried.

use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use xlfs_sdk::Errno;

/// A syscall's result.
pub(crate) type Sys<T> = Result<T, Errno>;

fn errno() -> Errno {
    Errno::from_io(&std::io::Error::last_os_error())
}

/// Evaluates a libc call until it does not fail with EINTR; -1 becomes the
/// errno.
macro_rules! sys {
    ($e:expr) => {{
        loop {
            // SAFETY: each call site passes valid descriptors, NUL-terminated
            // strings that outlive the call and buffers with their true length.
            let r = unsafe { $e };
            if r == -1 {
                let e = errno();
                if e == Errno::EINTR {
                    continue;
                }
                break Err(e);
            }
            break Ok(r);
        }
    }};
}

/// A NUL-terminated copy of `b`; EINVAL if it holds a NUL.
pub(crate) fn cstr(b: &[u8]) -> Sys<CString> {
    CString::new(b).map_err(|_| Errno::EINVAL)
}

/// A file offset as the kernel takes it; EINVAL beyond `i64::MAX`.
pub(crate) fn off(o: u64) -> Sys<libc::off_t> {
    libc::off_t::try_from(o).map_err(|_| Errno::EINVAL)
}

fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by the kernel as a new descriptor that
    // nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `openat` with `O_CLOEXEC` added.
pub(crate) fn openat(dir: BorrowedFd<'_>, path: &CStr, flags: i32, mode: u32) -> Sys<OwnedFd> {
    let fd = sys!(libc::openat(dir.as_raw_fd(), path.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint))?;
    Ok(owned(fd))
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2` that refuses to leave `dir` (no absolute symlinks, no `..`
/// above it, no magic links). Follows relative symlinks that stay beneath.
pub(crate) fn openat2_beneath(dir: BorrowedFd<'_>, path: &CStr, flags: i32) -> Sys<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
    };
    let fd = sys!(libc::syscall(
        libc::SYS_openat2,
        dir.as_raw_fd(),
        path.as_ptr(),
        &how as *const OpenHow,
        std::mem::size_of::<OpenHow>()
    ))?;
    let fd = RawFd::try_from(fd).map_err(|_| Errno::EIO)?;
    Ok(owned(fd))
}

/// `fstatat`; `flags` usually `AT_SYMLINK_NOFOLLOW` (always added).
pub(crate) fn fstatat(dir: BorrowedFd<'_>, path: &CStr, flags: i32) -> Sys<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    sys!(libc::fstatat(dir.as_raw_fd(), path.as_ptr(), st.as_mut_ptr(), flags | libc::AT_SYMLINK_NOFOLLOW))?;
    // SAFETY: fstatat succeeded and filled the buffer.
    Ok(unsafe { st.assume_init() })
}

/// `fstat`.
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> Sys<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    sys!(libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()))?;
    // SAFETY: fstat succeeded and filled the buffer.
    Ok(unsafe { st.assume_init() })
}

/// True when `fd` is on a file system kept in memory (tmpfs, ramfs), where
/// going around the page cache saves nothing: the pages are the store.
pub(crate) fn in_memory(fd: BorrowedFd<'_>) -> bool {
    let mut st = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a valid fd and a buffer of the right type.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstatfs succeeded and filled the buffer.
    let t = unsafe { st.assume_init() }.f_type;
    // ramfs's magic number (linux/magic.h); libc does not export it.
    const RAMFS_MAGIC: libc::__fsword_t = 0x8584_58f6;
    t == libc::TMPFS_MAGIC || t == RAMFS_MAGIC
}

/// `fstatvfs`.
pub(crate) fn fstatvfs(fd: BorrowedFd<'_>) -> Sys<libc::statvfs> {
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    sys!(libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()))?;
    // SAFETY: fstatvfs succeeded and filled the buffer.
    Ok(unsafe { st.assume_init() })
}

/// `mkdirat`.
pub(crate) fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Sys<()> {
    sys!(libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t)).map(drop)
}

/// `mknodat`.
pub(crate) fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, dev: u64) -> Sys<()> {
    sys!(libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, dev as libc::dev_t)).map(drop)
}

/// `symlinkat`: creates `name` in `dir` pointing at `target`.
pub(crate) fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Sys<()> {
    sys!(libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr())).map(drop)
}

/// `linkat` without following a symlink at `old`.
pub(crate) fn linkat(od: BorrowedFd<'_>, old: &CStr, nd: BorrowedFd<'_>, new: &CStr) -> Sys<()> {
    sys!(libc::linkat(od.as_raw_fd(), old.as_ptr(), nd.as_raw_fd(), new.as_ptr(), 0)).map(drop)
}

/// `unlinkat`; `flags` 0 or `AT_REMOVEDIR`.
pub(crate) fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> Sys<()> {
    sys!(libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags)).map(drop)
}

/// `renameat2`.
pub(crate) fn renameat2(od: BorrowedFd<'_>, old: &CStr, nd: BorrowedFd<'_>, new: &CStr, flags: u32) -> Sys<()> {
    sys!(libc::renameat2(od.as_raw_fd(), old.as_ptr(), nd.as_raw_fd(), new.as_ptr(), flags as libc::c_uint)).map(drop)
}

/// `readlinkat`: the target of the symlink at `path` (empty `path` with an
/// `O_PATH` descriptor reads that link).
pub(crate) fn readlinkat(dir: BorrowedFd<'_>, path: &CStr) -> Sys<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    let n = sys!(libc::readlinkat(dir.as_raw_fd(), path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()))?;
    let n = usize::try_from(n).map_err(|_| Errno::EIO)?;
    if n >= buf.len() {
        return Err(Errno::ENAMETOOLONG);
    }
    buf.truncate(n);
    Ok(buf)
}

/// Changes the mode of the inode an `O_PATH` descriptor refers to (through
/// its `/proc/self/fd` link). The caller has checked it is not a symlink.
pub(crate) fn chmod_fd_path(fd: BorrowedFd<'_>, mode: u32) -> Sys<()> {
    let p = proc_path(fd.as_raw_fd(), b"")?;
    sys!(libc::chmod(p.as_ptr(), mode as libc::mode_t)).map(drop)
}

/// `fchmod`.
pub(crate) fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> Sys<()> {
    sys!(libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t)).map(drop)
}

/// `/proc/self/fd/<fd>` or `/proc/self/fd/<fd>/<rest>`: a path that reaches
/// an open descriptor's inode (or a name in an open directory) without
/// looking any other component up.
pub(crate) fn proc_path(fd: RawFd, rest: &[u8]) -> Sys<CString> {
    let mut p = format!("/proc/self/fd/{fd}").into_bytes();
    if !rest.is_empty() {
        p.push(b'/');
        p.extend_from_slice(rest);
    }
    cstr(&p)
}

/// Where an inode-level call applies: an open descriptor, or a path relative
/// to a directory descriptor whose last component is never followed.
#[derive(Clone, Copy)]
pub(crate) enum Target<'a> {
    /// The inode an open (non-`O_PATH`) descriptor refers to.
    Fd(BorrowedFd<'a>),
    /// A name (or `a/b/name` of directories we own) under a directory.
    At(BorrowedFd<'a>, &'a CStr),
}

/// How an xattr call reaches its inode ([`Target::with_path`]).
enum Via<'a> {
    Fd(BorrowedFd<'a>),
    /// A name under a directory, with the `*xattrat` calls.
    At(BorrowedFd<'a>, &'a CStr),
    /// The `/proc/self/fd` path of a name under a directory.
    Path(&'a CStr),
}

/// Linux 6.13's `getxattrat`, `setxattrat`, `listxattrat` and
/// `removexattrat`: an xattr of a name in an open directory, without the
/// kernel resolving `/proc/self/fd/N/NAME` for it (a read costs 1.5 us
/// here against 3.8 through the `/proc` path; a brick reads a gfid so at
/// every lookup, unlink and listed entry). They are tried once, on `/`,
/// before the first use: an older kernel answers ENOSYS, and a seccomp
/// filter that does not know them (a container runtime's default profile)
/// EPERM; either way the `/proc` path is used from then on. A later ENOSYS
/// switches over as well.
mod xattrat {
    use std::ffi::CStr;
    use std::os::fd::{AsRawFd, BorrowedFd};
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::{Sys, errno};
    use xlfs_sdk::Errno;

    // The same numbers on every architecture that has them (they came after
    // the tables were unified).
    const SETXATTRAT: libc::c_long = 463;
    const GETXATTRAT: libc::c_long = 464;
    const LISTXATTRAT: libc::c_long = 465;
    const REMOVEXATTRAT: libc::c_long = 466;

    /// `struct xattr_args` (VER0).
    #[repr(C)]
    struct XattrArgs {
        value: u64,
        size: u32,
        flags: u32,
    }

    const UNKNOWN: u8 = 0;
    const YES: u8 = 1;
    const NO: u8 = 2;
    static AVAILABLE: AtomicU8 =
        AtomicU8::new(if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) { UNKNOWN } else { NO });

    pub(super) fn available() -> bool {
        match AVAILABLE.load(Ordering::Relaxed) {
            UNKNOWN => {
                let yes = usable(probe());
                if !yes {
                    tracing::info!("storage/posix: no getxattrat & co. here; xattrs by name go through /proc paths");
                }
                // A test may have said `missing` meanwhile: that stays.
                let _ = AVAILABLE.compare_exchange(
                    UNKNOWN,
                    if yes { YES } else { NO },
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                AVAILABLE.load(Ordering::Relaxed) == YES
            }
            v => v == YES,
        }
    }

    /// Whether the calls work, from what a user xattr read of `/` answered:
    /// the calls missing (ENOSYS) or refused by a filter (EPERM: reading a
    /// `user.` xattr of `/` is allowed to anyone) mean no.
    pub(super) fn usable(probe: super::Sys<isize>) -> bool {
        !matches!(probe, Err(Errno::ENOSYS | Errno::EPERM))
    }

    fn probe() -> super::Sys<isize> {
        // SAFETY: AT_FDCWD stands for a descriptor in the *at calls (the
        // path is absolute anyway); it is never closed.
        let cwd = unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) };
        get(cwd, c"/", c"user.xlfs.probe", std::ptr::null_mut(), 0)
    }

    /// The kernel has no `*xattrat` calls (or a test says so).
    pub(crate) fn missing() {
        AVAILABLE.store(NO, Ordering::Relaxed);
    }

    /// The flags for `path` under the directory: never follow the last
    /// component; an empty path is the directory itself.
    fn at_flags(path: &CStr) -> libc::c_int {
        libc::AT_SYMLINK_NOFOLLOW | if path.is_empty() { libc::AT_EMPTY_PATH } else { 0 }
    }

    pub(super) fn get(dir: BorrowedFd<'_>, path: &CStr, name: &CStr, buf: *mut u8, len: usize) -> Sys<isize> {
        let mut args = XattrArgs { value: buf as u64, size: u32::try_from(len).unwrap_or(u32::MAX), flags: 0 };
        let a: *mut XattrArgs = &mut args;
        // SAFETY: valid descriptor, NUL-terminated strings, `buf` valid for
        // `len` bytes (the caller's slice) and `args` for its size.
        let r = sys!(libc::syscall(
            GETXATTRAT,
            dir.as_raw_fd(),
            path.as_ptr(),
            at_flags(path),
            name.as_ptr(),
            a,
            size_of::<XattrArgs>(),
        ))?;
        Ok(r as isize)
    }

    pub(super) fn set(dir: BorrowedFd<'_>, path: &CStr, name: &CStr, value: &[u8], flags: i32) -> Sys<()> {
        let size = u32::try_from(value.len()).map_err(|_| Errno::E2BIG)?;
        let args = XattrArgs { value: value.as_ptr() as u64, size, flags: flags as u32 };
        let a: *const XattrArgs = &args;
        // SAFETY: as in `get`; the kernel only reads `value`.
        sys!(libc::syscall(
            SETXATTRAT,
            dir.as_raw_fd(),
            path.as_ptr(),
            at_flags(path),
            name.as_ptr(),
            a,
            size_of::<XattrArgs>(),
        ))
        .map(drop)
    }

    pub(super) fn list(dir: BorrowedFd<'_>, path: &CStr, buf: *mut u8, len: usize) -> Sys<isize> {
        // SAFETY: as in `get`.
        let r = sys!(libc::syscall(LISTXATTRAT, dir.as_raw_fd(), path.as_ptr(), at_flags(path), buf, len))?;
        Ok(r as isize)
    }

    pub(super) fn remove(dir: BorrowedFd<'_>, path: &CStr, name: &CStr) -> Sys<()> {
        // SAFETY: as in `get`.
        sys!(libc::syscall(REMOVEXATTRAT, dir.as_raw_fd(), path.as_ptr(), at_flags(path), name.as_ptr())).map(drop)
    }
}

/// Makes xattr calls by name go through `/proc/self/fd` paths, as on a
/// kernel without the `*xattrat` calls (for tests of that path).
#[cfg(test)]
pub(crate) fn xattrat_off() {
    xattrat::missing();
}

#[cfg(test)]
#[test]
fn the_xattrat_calls_are_used_unless_missing_or_filtered() {
    for (probe, want) in [
        (Err(Errno::ENOSYS), false),
        (Err(Errno::EPERM), false),
        (Err(Errno::ENODATA), true),
        (Err(Errno::EOPNOTSUPP), true),
        (Ok(0), true),
    ] {
        assert_eq!(xattrat::usable(probe), want, "{probe:?}");
    }
}

fn timespec(t: Option<xlfs_sdk::TimeSet>) -> libc::timespec {
    use xlfs_sdk::TimeSet;
    match t {
        None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        Some(TimeSet::Now) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        Some(TimeSet::At(ts)) => {
            libc::timespec { tv_sec: ts.sec as libc::time_t, tv_nsec: ts.nsec.min(999_999_999) as _ }
        }
    }
}

impl Target<'_> {
    /// Attributes, without following.
    pub(crate) fn stat(&self) -> Sys<libc::stat> {
        match *self {
            Target::Fd(fd) => fstat(fd),
            Target::At(dir, p) => fstatat(dir, p, 0),
        }
    }

    /// `lchown`; `None` leaves an id alone.
    pub(crate) fn chown(&self, uid: Option<u32>, gid: Option<u32>) -> Sys<()> {
        let u = uid.unwrap_or(u32::MAX) as libc::uid_t;
        let g = gid.unwrap_or(u32::MAX) as libc::gid_t;
        match *self {
            Target::Fd(fd) => sys!(libc::fchown(fd.as_raw_fd(), u, g)).map(drop),
            Target::At(dir, p) => {
                sys!(libc::fchownat(dir.as_raw_fd(), p.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW)).map(drop)
            }
        }
    }

    /// Sets access and modification times without following.
    pub(crate) fn utimes(&self, atime: Option<xlfs_sdk::TimeSet>, mtime: Option<xlfs_sdk::TimeSet>) -> Sys<()> {
        let ts = [timespec(atime), timespec(mtime)];
        match *self {
            Target::Fd(fd) => sys!(libc::futimens(fd.as_raw_fd(), ts.as_ptr())).map(drop),
            Target::At(dir, p) => {
                sys!(libc::utimensat(dir.as_raw_fd(), p.as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW)).map(drop)
            }
        }
    }

    /// Runs an xattr call on the target: by its descriptor, by the name in
    /// its directory with the kernel's `*xattrat` calls, or (a kernel
    /// without them) by its `/proc/self/fd` path.
    fn with_path<R>(&self, f: impl Fn(Via<'_>) -> Sys<R>) -> Sys<R> {
        match *self {
            Target::Fd(fd) => f(Via::Fd(fd)),
            Target::At(dir, p) => {
                if xattrat::available() {
                    match f(Via::At(dir, p)) {
                        Err(Errno::ENOSYS) => xattrat::missing(),
                        r => return r,
                    }
                }
                let path = proc_path(dir.as_raw_fd(), p.to_bytes())?;
                f(Via::Path(&path))
            }
        }
    }

    /// Reads an xattr into `buf`, returning its length (ERANGE if longer).
    pub(crate) fn getxattr_into(&self, name: &CStr, buf: &mut [u8]) -> Sys<usize> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        let n = self.with_path(|t| match t {
            Via::Fd(fd) => sys!(libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), ptr.cast(), len)),
            Via::At(dir, p) => xattrat::get(dir, p, name, ptr, len),
            Via::Path(p) => sys!(libc::lgetxattr(p.as_ptr(), name.as_ptr(), ptr.cast(), len)),
        })?;
        usize::try_from(n).map_err(|_| Errno::EIO)
    }

    /// Reads a whole xattr value.
    pub(crate) fn getxattr(&self, name: &CStr) -> Sys<Vec<u8>> {
        // Values are at most 64 KiB on Linux; try a small buffer first.
        let mut buf = vec![0u8; 256];
        for _ in 0..4 {
            match self.getxattr_into(name, &mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf);
                }
                Err(Errno::ERANGE) => {
                    let need = self.getxattr_into(name, &mut [])?;
                    buf = vec![0u8; need.max(buf.len() * 2).min(XATTR_SIZE_MAX)];
                }
                Err(e) => return Err(e),
            }
        }
        Err(Errno::ERANGE)
    }

    /// Sets an xattr; `flags` are `XATTR_CREATE` / `XATTR_REPLACE`.
    pub(crate) fn setxattr(&self, name: &CStr, value: &[u8], flags: i32) -> Sys<()> {
        self.with_path(|t| match t {
            Via::Fd(fd) => {
                sys!(libc::fsetxattr(fd.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags))
                    .map(drop)
            }
            Via::At(dir, p) => xattrat::set(dir, p, name, value, flags),
            Via::Path(p) => {
                sys!(libc::lsetxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), flags)).map(drop)
            }
        })
    }

    /// Removes an xattr.
    pub(crate) fn removexattr(&self, name: &CStr) -> Sys<()> {
        self.with_path(|t| match t {
            Via::Fd(fd) => sys!(libc::fremovexattr(fd.as_raw_fd(), name.as_ptr())).map(drop),
            Via::At(dir, p) => xattrat::remove(dir, p, name),
            Via::Path(p) => sys!(libc::lremovexattr(p.as_ptr(), name.as_ptr())).map(drop),
        })
    }

    /// The names of the xattrs, listed only when more than one (`asked`)
    /// is about to be read: reading an xattr by a path resolves the path
    /// again each time, so where several may be read and most are absent
    /// (md-cache's security and ACL names), one listing first saves the
    /// reads of those absent. `None`: not listed (read each; see
    /// [`has_xattr`]).
    pub(crate) fn names_if_several(&self, asked: usize) -> Option<Vec<Vec<u8>>> {
        if asked > 1 { self.listxattr().ok() } else { None }
    }

    /// The names of all xattrs.
    pub(crate) fn listxattr(&self) -> Sys<Vec<Vec<u8>>> {
        let list = |buf: &mut [u8]| {
            let (ptr, len) = (buf.as_mut_ptr(), buf.len());
            let n = self.with_path(|t| match t {
                Via::Fd(fd) => sys!(libc::flistxattr(fd.as_raw_fd(), ptr.cast(), len)),
                Via::At(dir, p) => xattrat::list(dir, p, ptr, len),
                Via::Path(p) => sys!(libc::llistxattr(p.as_ptr(), ptr.cast(), len)),
            })?;
            usize::try_from(n).map_err(|_| Errno::EIO)
        };
        let mut buf = vec![0u8; 1024];
        for _ in 0..4 {
            match list(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf.split(|&c| c == 0).filter(|s| !s.is_empty()).map(<[u8]>::to_vec).collect());
                }
                Err(Errno::ERANGE) => {
                    let need = list(&mut [])?;
                    buf = vec![0u8; need.max(buf.len() * 2).min(XATTR_LIST_MAX)];
                }
                Err(e) => return Err(e),
            }
        }
        Err(Errno::ERANGE)
    }
}

/// Whether `name` is among the listed xattr names
/// ([`Target::names_if_several`]; `None`: not listed, so maybe).
pub(crate) fn has_xattr(present: Option<&[Vec<u8>]>, name: &[u8]) -> bool {
    present.is_none_or(|p| p.iter().any(|n| n.as_slice() == name))
}

const XATTR_SIZE_MAX: usize = 65536;
const XATTR_LIST_MAX: usize = 65536;

/// `pread` that retries until `buf` is full or end of file; returns the
/// bytes read.
pub(crate) fn pread_full(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> Sys<usize> {
    pread_until(fd, buf, offset, false)
}

/// [`pread_full`] on an `O_DIRECT` descriptor: a read that comes back
/// short of a whole block has met the end of the file (reading on from
/// there, unaligned, would fail with EINVAL).
pub(crate) fn pread_direct(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> Sys<usize> {
    pread_until(fd, buf, offset, true)
}

fn pread_until(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64, direct: bool) -> Sys<usize> {
    let mut done = 0;
    while done < buf.len() {
        let at = off(offset.checked_add(done as u64).ok_or(Errno::EINVAL)?)?;
        let rest = &mut buf[done..];
        let n = sys!(libc::pread(fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len(), at))?;
        let n = usize::try_from(n).map_err(|_| Errno::EIO)?;
        done += n;
        if n == 0 || direct && !n.is_multiple_of(ALIGN) {
            break;
        }
    }
    Ok(done)
}

/// Reads up to `size` bytes at `offset` (fewer at end of file) into a new
/// buffer, which is not zeroed first: a 1 MiB read spends no time in
/// memset.
pub(crate) fn pread_vec(fd: BorrowedFd<'_>, size: usize, offset: u64) -> Sys<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(size);
    while buf.len() < size {
        let done = buf.len();
        let at = off(offset.checked_add(done as u64).ok_or(Errno::EINVAL)?)?;
        let rest = &mut buf.spare_capacity_mut()[..size - done];
        let n = sys!(libc::pread(fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len(), at))?;
        if n == 0 {
            break;
        }
        let n = usize::try_from(n).map_err(|_| Errno::EIO)?.min(size - done);
        // SAFETY: pread initialized the n bytes that follow the `done`
        // initialized ones, within the capacity.
        unsafe { buf.set_len(done + n) };
    }
    Ok(buf)
}

/// `pwrite` that retries short writes until all of `data` is written.
pub(crate) fn pwrite_all(fd: BorrowedFd<'_>, data: &[u8], offset: u64) -> Sys<()> {
    let mut done = 0;
    while done < data.len() {
        let at = off(offset.checked_add(done as u64).ok_or(Errno::EFBIG)?)?;
        let rest = &data[done..];
        let n = sys!(libc::pwrite(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len(), at))?;
        if n == 0 {
            return Err(Errno::EIO);
        }
        done += usize::try_from(n).map_err(|_| Errno::EIO)?;
    }
    Ok(())
}

/// `ftruncate`.
pub(crate) fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> Sys<()> {
    sys!(libc::ftruncate(fd.as_raw_fd(), off(len)?)).map(drop)
}

/// `syncfs`: every dirty inode of the file system holding `fd`.
pub(crate) fn syncfs(fd: BorrowedFd<'_>) -> Sys<()> {
    sys!(libc::syncfs(fd.as_raw_fd())).map(drop)
}

/// `fsync`, or `fdatasync` when `datasync`.
pub(crate) fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> Sys<()> {
    if datasync { sys!(libc::fdatasync(fd.as_raw_fd())).map(drop) } else { sys!(libc::fsync(fd.as_raw_fd())).map(drop) }
}

/// `fallocate`.
pub(crate) fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> Sys<()> {
    sys!(libc::fallocate(fd.as_raw_fd(), mode, off(offset)?, off(len)?)).map(drop)
}

/// `lseek`, returning the new offset.
pub(crate) fn lseek(fd: BorrowedFd<'_>, offset: libc::off_t, whence: i32) -> Sys<u64> {
    let r = sys!(libc::lseek(fd.as_raw_fd(), offset, whence))?;
    u64::try_from(r).map_err(|_| Errno::EIO)
}

/// One `copy_file_range` call; returns the bytes copied (0 at end of file).
pub(crate) fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: &mut i64,
    fd_out: BorrowedFd<'_>,
    off_out: &mut i64,
    len: usize,
    flags: u32,
) -> Sys<usize> {
    let n = sys!(libc::copy_file_range(fd_in.as_raw_fd(), off_in, fd_out.as_raw_fd(), off_out, len, flags))?;
    usize::try_from(n).map_err(|_| Errno::EIO)
}

/// One raw directory entry.
pub(crate) struct RawDirent<'a> {
    /// The offset of the entry after this one.
    pub d_off: u64,
    /// `DT_*`.
    pub d_type: u8,
    /// The name, without its NUL.
    pub name: &'a [u8],
}

/// `getdents64` into `buf`; returns the bytes filled (0 at the end).
pub(crate) fn getdents(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Sys<usize> {
    let n = sys!(libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), buf.len()))?;
    usize::try_from(n).map_err(|_| Errno::EIO)
}

/// Splits what `getdents` filled into entries; EIO on a malformed record.
pub(crate) fn parse_dirents(buf: &[u8]) -> Sys<Vec<RawDirent<'_>>> {
    const HDR: usize = 19; // d_ino 8, d_off 8, d_reclen 2, d_type 1
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let rec = buf.get(pos..pos + HDR).ok_or(Errno::EIO)?;
        let d_off = i64::from_ne_bytes(rec[8..16].try_into().map_err(|_| Errno::EIO)?);
        let reclen = u16::from_ne_bytes(rec[16..18].try_into().map_err(|_| Errno::EIO)?) as usize;
        let d_type = rec[18];
        if reclen < HDR {
            return Err(Errno::EIO);
        }
        let name_area = buf.get(pos + HDR..pos + reclen).ok_or(Errno::EIO)?;
        let len = name_area.iter().position(|&c| c == 0).unwrap_or(name_area.len());
        out.push(RawDirent { d_off: d_off as u64, d_type, name: &name_area[..len] });
        pos += reclen;
    }
    Ok(out)
}

/// Changes the mode of `dir`/`path` without following a symlink there (a
/// symlink's mode cannot change on Linux; it is left alone).
pub(crate) fn chmod_at_nofollow(dir: BorrowedFd<'_>, path: &CStr, mode: u32) -> Sys<()> {
    let fd = openat(dir, path, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
    let st = fstat(std::os::fd::AsFd::as_fd(&fd))?;
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        return Ok(());
    }
    chmod_fd_path(std::os::fd::AsFd::as_fd(&fd), mode)
}

/// Opens the file behind `fd` again with `flags` (no O_CREAT or O_TRUNC),
/// through its `/proc/self/fd` link.
pub(crate) fn reopen(fd: BorrowedFd<'_>, flags: i32) -> Sys<OwnedFd> {
    let p = proc_path(fd.as_raw_fd(), b"")?;
    let fd = sys!(libc::open(p.as_ptr(), (flags & !(libc::O_CREAT | libc::O_TRUNC)) | libc::O_CLOEXEC))?;
    // SAFETY: `open` just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Most bytes of the per-thread aligned buffer [`with_aligned_copy`] keeps.
const ALIGNED_KEPT: usize = 4 << 20;

thread_local! {
    static ALIGNED: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` on an [`ALIGN`]-aligned copy of `data`, in a buffer kept per
/// thread (up to [`ALIGNED_KEPT`] bytes) so that a stream of large writes
/// does not fault fresh pages in for every copy.
pub(crate) fn with_aligned_copy<R>(data: &[u8], f: impl FnOnce(&[u8]) -> Sys<R>) -> Sys<R> {
    if data.len() > ALIGNED_KEPT {
        return f(AlignedBuf::copy_of(data)?.as_slice());
    }
    ALIGNED.with(|cell| {
        let mut slot = cell.borrow_mut();
        let mut buf = match slot.take() {
            Some(b) if b.capacity() >= data.len() => b,
            _ => AlignedBuf::zeroed(data.len().max(1 << 20))?,
        };
        buf.prefix_mut(data.len())?.copy_from_slice(data);
        let r = f(&buf.as_slice()[..data.len()]);
        *slot = Some(buf);
        r
    })
}

/// True when the process runs as root.
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Buffer alignment for `O_DIRECT` I/O.
pub(crate) const ALIGN: usize = 4096;

/// A zeroed heap buffer aligned to [`ALIGN`], for `O_DIRECT` reads and
/// writes.
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain owned memory.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> Sys<AlignedBuf> {
        let size = len.max(1).div_ceil(ALIGN) * ALIGN;
        let layout = std::alloc::Layout::from_size_align(size, ALIGN).map_err(|_| Errno::EINVAL)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).ok_or(Errno::ENOMEM)?;
        Ok(AlignedBuf { ptr, len, layout })
    }

    /// An aligned copy of `data`.
    pub(crate) fn copy_of(data: &[u8]) -> Sys<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(data.len())?;
        b.as_mut_slice().copy_from_slice(data);
        Ok(b)
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to at least `len` initialised bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Bytes allocated (at least `len`).
    pub(crate) fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// The first `n` bytes of the allocation, mutably (`n` ≤ capacity).
    pub(crate) fn prefix_mut(&mut self, n: usize) -> Sys<&mut [u8]> {
        if n > self.capacity() {
            return Err(Errno::EINVAL);
        }
        self.len = self.len.max(n);
        // SAFETY: the allocation holds `capacity` zero-initialised bytes we own.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), n) })
    }

    /// The buffer cut to its first `n` bytes (at most its length).
    pub(crate) fn truncated(mut self, n: usize) -> AlignedBuf {
        self.len = self.len.min(n);
        self
    }

    /// The bytes, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
