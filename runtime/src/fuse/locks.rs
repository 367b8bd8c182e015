//! POSIX locks (getlk, setlk, setlkw) and flock, as `lk` fops.
//!
//! FUSE's lock owner becomes the fop's `lk_owner`: for fcntl locks the
//! kernel names the process's file table, for flock (and OFD locks) the open
//! file, so the two never share an owner. flock arrives as a whole-file lock
//! (the mount asks for FUSE_FLOCK_LOCKS) and is released with the fd
//! (Release); fcntl locks are released by the flush of each close.
//!
//! **Waiting without blocking.** A SETLKW waits in a task, never on a
//! reader thread. fuser 0.18 answers FUSE_INTERRUPT itself with ENOSYS, after
//! which the kernel sends no more interrupts and a process waiting for a
//! lock could not be signalled. So while a SETLKW waits, the bridge looks at
//! the caller's `/proc/PID/status` every [`SIGNAL_POLL`]: once a signal is
//! pending that the caller neither blocks nor ignores (or the caller is
//! gone), the waiting fop is dropped, which takes the request off the
//! brick's wait queue, and the kernel is answered EINTR (it restarts the
//! call if the signal's handler asks for that).

use std::sync::Arc;
use std::time::Duration;

use fuser::FileHandle;
use xlfs_sdk::{Errno, Flock, Fop, LkCmd, LockType, Reply};

use super::{Caller, Core};

/// How often a waiting SETLKW checks its caller for pending signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// FUSE's `OFFSET_MAX`: a lock to the end of the file.
const OFFSET_MAX: u64 = i64::MAX as u64;

/// A lock as FUSE describes it: an inclusive byte range and an `F_*` type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FuseLock {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    pub pid: u32,
}

fn to_flock(l: &FuseLock, owner: u64) -> Result<Flock, Errno> {
    let ty = match l.typ {
        libc::F_RDLCK => LockType::Read,
        libc::F_WRLCK => LockType::Write,
        libc::F_UNLCK => LockType::Unlock,
        _ => return Err(Errno::EINVAL),
    };
    let len = if l.end >= OFFSET_MAX {
        0
    } else if l.end < l.start {
        return Err(Errno::EINVAL);
    } else {
        l.end - l.start + 1
    };
    Ok(Flock { ty, start: l.start, len, pid: l.pid, owner })
}

fn from_flock(f: &Flock) -> FuseLock {
    let typ = match f.ty {
        LockType::Read => libc::F_RDLCK,
        LockType::Write => libc::F_WRLCK,
        LockType::Unlock => libc::F_UNLCK,
    };
    let end = if f.len == 0 { OFFSET_MAX } else { f.start.saturating_add(f.len - 1).min(OFFSET_MAX) };
    FuseLock { start: f.start, end, typ, pid: f.pid }
}

/// Parses one hexadecimal signal mask line of `/proc/PID/status`.
fn mask(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// True if the status text shows a signal that would interrupt a wait: one
/// pending for the thread or the process, not blocked and not ignored.
fn signal_pending(status: &str) -> bool {
    let pending = mask(status, "SigPnd:") | mask(status, "ShdPnd:");
    let kill = 1u64 << (libc::SIGKILL - 1);
    pending & (kill | !(mask(status, "SigBlk:") | mask(status, "SigIgn:"))) != 0
}

/// Resolves once the thread `pid` has a signal pending that would interrupt
/// it, or is gone.
async fn interrupted(pid: u32) {
    if pid == 0 {
        return std::future::pending().await;
    }
    let path = format!("/proc/{pid}/status");
    loop {
        tokio::time::sleep(SIGNAL_POLL).await;
        match tokio::fs::read_to_string(&path).await {
            Ok(s) if !signal_pending(&s) => {}
            _ => return,
        }
    }
}

impl Core {
    pub(super) async fn getlk(self: Arc<Self>, who: Caller, fh: FileHandle, owner: u64, lk: FuseLock) -> Result<FuseLock, Errno> {
        let fd = self.fd(fh)?;
        let lock = to_flock(&lk, owner)?;
        match self.call(self.ctx(who, owner, false), Fop::Lk { fd, cmd: LkCmd::GetLk, lock }).await? {
            Reply::Lock(f) if f.ty == LockType::Unlock => Ok(FuseLock { typ: libc::F_UNLCK, pid: 0, ..lk }),
            Reply::Lock(f) => Ok(from_flock(&f)),
            _ => Err(Errno::EIO),
        }
    }

    pub(super) async fn setlk(self: Arc<Self>, who: Caller, fh: FileHandle, owner: u64, lk: FuseLock, sleep: bool) -> Result<(), Errno> {
        let fd = self.fd(fh)?;
        let lock = to_flock(&lk, owner)?;
        let wait = sleep && lock.ty != LockType::Unlock;
        let cmd = if wait { LkCmd::SetLkw } else { LkCmd::SetLk };
        let fop = self.call(self.ctx(who, owner, false), Fop::Lk { fd, cmd, lock });
        if !wait {
            return fop.await.map(drop);
        }
        tokio::select! {
            r = fop => r.map(drop),
            () = interrupted(who.pid) => {
                tracing::debug!(pid = who.pid, "SETLKW interrupted by a signal");
                Err(Errno::EINTR)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_convert_both_ways() {
        let l = FuseLock { start: 10, end: 19, typ: libc::F_WRLCK, pid: 7 };
        let f = to_flock(&l, 99).expect("valid");
        assert_eq!(f, Flock { ty: LockType::Write, start: 10, len: 10, pid: 7, owner: 99 });
        assert_eq!(from_flock(&f), l);
        let whole = FuseLock { start: 0, end: OFFSET_MAX, typ: libc::F_RDLCK, pid: 1 };
        let f = to_flock(&whole, 1).expect("valid");
        assert_eq!((f.len, f.ty), (0, LockType::Read));
        assert_eq!(from_flock(&f), whole);
        assert_eq!(to_flock(&FuseLock { start: 5, end: 4, typ: libc::F_RDLCK, pid: 0 }, 0), Err(Errno::EINVAL));
        assert_eq!(to_flock(&FuseLock { start: 0, end: 1, typ: 42, pid: 0 }, 0), Err(Errno::EINVAL));
        let one = FuseLock { start: 3, end: 3, typ: libc::F_UNLCK, pid: 0 };
        assert_eq!(to_flock(&one, 0).expect("valid").len, 1);
    }

    #[test]
    fn pending_signals_are_read_from_status() {
        let status = |pnd: &str, shd: &str, blk: &str, ign: &str| {
            format!("Name:\tx\nSigQ:\t0/1\nSigPnd:\t{pnd}\nShdPnd:\t{shd}\nSigBlk:\t{blk}\nSigIgn:\t{ign}\nSigCgt:\t0\n")
        };
        let z = "0000000000000000";
        let usr1 = format!("{:016x}", 1u64 << (libc::SIGUSR1 - 1));
        let kill = format!("{:016x}", 1u64 << (libc::SIGKILL - 1));
        assert!(!signal_pending(&status(z, z, z, z)));
        assert!(signal_pending(&status(&usr1, z, z, z)), "thread-directed");
        assert!(signal_pending(&status(z, &usr1, z, z)), "process-directed");
        assert!(!signal_pending(&status(&usr1, z, &usr1, z)), "blocked");
        assert!(!signal_pending(&status(z, &usr1, z, &usr1)), "ignored");
        assert!(signal_pending(&status(z, &kill, "ffffffffffffffff", z)), "SIGKILL always counts");
        assert!(!signal_pending("garbage"));
    }

    #[tokio::test]
    async fn a_vanished_caller_counts_as_interrupted() {
        // No such process: resolves after the first poll.
        tokio::time::timeout(Duration::from_secs(10), interrupted(u32::MAX - 1)).await.expect("resolves");
        // Our own thread has nothing pending: does not resolve.
        let own = std::process::id();
        assert!(tokio::time::timeout(SIGNAL_POLL * 4, interrupted(own)).await.is_err());
    }
}
