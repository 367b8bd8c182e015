//! The brick's fd table (GlusterFS keeps it in the fd ctx, posix-helpers.c):
//! [`OpenFd`], the real descriptor behind a caller's [`FdId`], its
//! `O_DIRECT` twin, reserving a slot before an open and releasing it, and
//! the count of open fds per inode that keeps an unlinked file's handle.

use std::sync::OnceLock;

use super::*;

/// An fd opened through this brick.
pub(super) struct OpenFd {
    pub(super) fd: OwnedFd,
    pub(super) gfid: Gfid,
    pub(super) dir: bool,
    pub(super) direct: bool,
    /// The open flags (access mode, O_APPEND...).
    pub(super) flags: i32,
    /// The same file opened again with `O_DIRECT`, for writes of at least
    /// `o-direct-min-size` (opened at the first such write; None when the
    /// file system refuses O_DIRECT or the fd cannot write).
    pub(super) bypass: OnceLock<Option<OwnedFd>>,
    /// Its `O_RDONLY | O_DIRECT` twin, for reads of at least
    /// `o-direct-read-min-size` (opened at the first such read).
    pub(super) read_bypass: OnceLock<Option<OwnedFd>>,
    pub(super) client: Arc<str>,
    /// Serialises seek + getdents on directory fds.
    pub(super) lock: Mutex<()>,
}

impl OpenFd {
    /// The `O_DIRECT` twin of a writable regular-file fd, opened on first use.
    pub(super) fn bypass(&self) -> Option<BorrowedFd<'_>> {
        let writable = matches!(self.flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR);
        if !writable || self.flags & libc::O_APPEND != 0 {
            return None;
        }
        self.twin(&self.bypass, libc::O_WRONLY, "writes")
    }

    /// The `O_DIRECT` twin of a readable regular-file fd, for reads,
    /// opened on first use.
    pub(super) fn read_bypass(&self) -> Option<BorrowedFd<'_>> {
        let readable = matches!(self.flags & libc::O_ACCMODE, libc::O_RDONLY | libc::O_RDWR);
        if !readable {
            return None;
        }
        self.twin(&self.read_bypass, libc::O_RDONLY, "reads")
    }

    /// The file opened again with `access | O_DIRECT` into `cell` (once;
    /// None for directories, fds already `O_DIRECT`, and file systems that
    /// refuse it: then `what` stay buffered).
    fn twin<'a>(&self, cell: &'a OnceLock<Option<OwnedFd>>, access: i32, what: &str) -> Option<BorrowedFd<'a>> {
        if self.dir || self.direct {
            return None;
        }
        cell.get_or_init(|| match sys::reopen(self.fd.as_fd(), access | libc::O_DIRECT) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::debug!(gfid = %self.gfid, error = %e, "no O_DIRECT twin: {what} stay buffered");
                None
            }
        })
        .as_ref()
        .map(AsFd::as_fd)
    }

    pub(super) fn iatt(&self) -> Sys<Iatt> {
        Ok(iatt(&sys::fstat(self.fd.as_fd())?, self.gfid))
    }

    pub(super) fn file(&self) -> Sys<BorrowedFd<'_>> {
        if self.dir { Err(Errno::EISDIR) } else { Ok(self.fd.as_fd()) }
    }
}

/// Open flags a client may pass; the rest (O_CREAT, O_EXCL, O_DIRECTORY,
/// O_PATH, O_TMPFILE, ...) are dropped and O_NOFOLLOW is always added.
pub(super) fn open_flags(flags: u32) -> i32 {
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

/// Releases an fd reservation unless it was committed.
pub(super) struct Reservation<'a> {
    pub(super) inner: &'a Inner,
    pub(super) id: FdId,
    pub(super) done: bool,
}

impl Reservation<'_> {
    pub(super) fn commit(mut self, fd: OpenFd) -> Sys<()> {
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
    pub(super) fn fd(&self, id: FdId) -> Sys<Arc<OpenFd>> {
        self.fds.get(&id).ok_or(Errno::EBADF)
    }

    /// Claims room for one more fd with id `id`.
    pub(super) fn reserve(&self, id: FdId) -> Sys<Reservation<'_>> {
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

    pub(super) fn open_count(&self, g: Gfid) -> u32 {
        self.open.lock().get(&g).copied().unwrap_or(0)
    }

    /// Bookkeeping after an fd left the table.
    pub(super) fn closed(&self, f: &OpenFd) {
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
        if left == 0 {
            self.remove_zeroed(f);
        }
        if left == 0 && !f.dir {
            self.forget_if_nameless(f.gfid);
        }
    }

    /// With the inode lock held, for a non-directory that may have lost its
    /// last name: drops its handle (parked or not) when no fd is open on it,
    /// else parks the handle until the last close
    /// ([`Brick::park_handle_if_nameless`]).
    ///
    /// [`Brick::park_handle_if_nameless`]: super::handle::Brick::park_handle_if_nameless
    pub(super) fn forget_if_nameless(&self, g: Gfid) {
        let r = if self.open_count(g) == 0 {
            self.brick.remove_handle_if_nameless(&g)
        } else {
            self.brick.park_handle_if_nameless(&g)
        };
        if let Err(e) = r {
            tracing::warn!(gfid = %g, error = %e, "cannot remove or park the handle of an unlinked file");
        }
    }

    pub(super) fn open_fd(&self, fd: OwnedFd, gfid: Gfid, dir: bool, flags: i32, ctx: &CallCtx) -> OpenFd {
        OpenFd {
            fd,
            gfid,
            dir,
            direct: flags & libc::O_DIRECT != 0,
            flags,
            bypass: OnceLock::new(),
            read_bypass: OnceLock::new(),
            client: ctx.client_id.clone(),
            lock: Mutex::new(()),
        }
    }
}
