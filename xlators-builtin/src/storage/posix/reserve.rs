//! `reserve`: the free space a brick keeps back (GlusterFS's
//! `storage.reserve`).
//!
//! When what a fop would take leaves less space available on the brick's
//! file system than the reserve, the fops that take space (writes, fallocate, zero-fill,
//! copy_file_range, and the entry fops that make inodes) fail with ENOSPC
//! before touching anything, so a nearly full brick still has room for
//! replicate's changelog xattrs and an administrator's repairs. Deletes,
//! truncation, renames and xattr fops are never refused, and writes go
//! through again as soon as space is freed.
//!
//! GlusterFS reads the free space in a thread every 5 s, so a burst of
//! writes can run past its reserve. Here it is read with `fstatvfs` at most
//! once per [`REFRESH`] while the space left is more than twice the
//! reserve (in between, what the admitted fops asked for is subtracted),
//! and on every such fop once it is closer than that, counting the fops
//! admitted and still running: other bricks or programs writing to the
//! same file system can only overrun it by what they have in flight, and
//! a refusal is never based on a stale figure.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use xlfs_sdk::Errno;
use xlfs_sdk::options::Share;

use super::sys::{self, Sys};

/// How long a reading of the free space is trusted (with the estimate).
pub const REFRESH: Duration = Duration::from_millis(100);

struct Reading {
    /// The reserve.
    spec: Share,
    /// Bytes available (to unprivileged users) when read.
    free: u64,
    /// The file system's size.
    total: u64,
    /// Bytes admitted since the reading and finished (not in it).
    taken: u64,
    /// Bytes admitted and not finished yet (in no reading).
    pending: u64,
    at: Option<Instant>,
}

impl Reading {
    fn left(&self) -> u64 {
        self.free.saturating_sub(self.taken).saturating_sub(self.pending)
    }
}

/// The reserve of one brick: its spec and the last reading, under one
/// lock (taken once per space-taking fop).
pub struct Reserve {
    reading: Mutex<Reading>,
}

/// A fop admitted by [`Reserve::admit`]: its bytes count as pending until
/// it is dropped (when the fop has finished).
pub struct Admitted<'a> {
    reserve: &'a Reserve,
    grow: u64,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut r = self.reserve.reading.lock();
        r.pending = r.pending.saturating_sub(self.grow);
        r.taken = r.taken.saturating_add(self.grow);
    }
}

impl Reserve {
    /// A reserve of `spec`.
    pub fn new(spec: Share) -> Reserve {
        Reserve { reading: Mutex::new(Reading { spec, free: 0, total: 0, taken: 0, pending: 0, at: None }) }
    }

    /// Changes the reserve (reconfigure).
    pub fn set(&self, spec: Share) {
        let mut r = self.reading.lock();
        r.spec = spec;
        r.at = None;
    }

    /// Admits a fop that takes about `grow` bytes on the file system of
    /// `fd`, or refuses it with ENOSPC when what it takes would leave less
    /// than the reserve available (counting the fops admitted and not
    /// finished yet).
    pub fn admit(&self, fd: BorrowedFd<'_>, grow: u64) -> Sys<Admitted<'_>> {
        let mut r = self.reading.lock();
        let spec = r.spec;
        if spec.is_zero() {
            return Ok(Admitted { reserve: self, grow: 0 });
        }
        let stale = r.at.is_none_or(|t| t.elapsed() >= REFRESH);
        if stale || r.left() < spec.bytes(r.total).saturating_mul(2) {
            let v = sys::fstatvfs(fd)?;
            let frsize = v.f_frsize;
            r.free = v.f_bavail.saturating_mul(frsize);
            r.total = v.f_blocks.saturating_mul(frsize);
            r.taken = 0;
            r.at = Some(Instant::now());
        }
        if r.left().saturating_sub(grow) < spec.bytes(r.total) {
            return Err(Errno::ENOSPC);
        }
        r.pending = r.pending.saturating_add(grow);
        Ok(Admitted { reserve: self, grow })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_is_a_percentage_or_a_size() {
        assert_eq!(Share::parse("1"), Some(Share::Percent(1.0)));
        assert_eq!(Share::parse("2.5%"), Some(Share::Percent(2.5)));
        assert_eq!(Share::parse("40MB"), Some(Share::Bytes(40 << 20)));
        assert_eq!(Share::parse("0"), Some(Share::Percent(0.0)));
        assert_eq!(Share::parse("101"), None);
        assert_eq!(Share::parse("lots"), None);
        assert_eq!(Share::Percent(10.0).bytes(1000), 100);
        assert!(Share::Percent(0.0).is_zero() && Share::Bytes(0).is_zero() && !Share::Bytes(1).is_zero());
    }
}
