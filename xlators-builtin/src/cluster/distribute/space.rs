//! Free space: statfs of the volume (the subvolumes summed) and
//! `min-free-disk`, which sends new files away from a subvolume that is
//! nearly full.
//!
//! The sum is in the largest fragment size among the subvolumes (counts
//! from a subvolume with smaller blocks are scaled down), as GlusterFS
//! normalizes them; inode counts add up; the name length limit is the
//! smallest. Each subvolume's figures are kept for [`TTL`] for the
//! placement decision (a statfs per create would double its cost).

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use xlfs_sdk::options::Share;
use xlfs_sdk::{CallCtx, Dict, Errno, Fop, FopResult, Loc, Reply, Request, Response, Statvfs};

use super::{Inner, first_error};

/// How long a subvolume's statfs is trusted for placement.
pub const TTL: Duration = Duration::from_secs(1);

/// True when `st` has less available than `min` (`min-free-disk`).
pub fn short(min: Share, st: &Statvfs) -> bool {
    min.exceeds(st.bavail.saturating_mul(st.frsize.max(1)), st.blocks.saturating_mul(st.frsize.max(1)))
}

/// Cached statfs per subvolume.
pub struct Space {
    seen: Mutex<Vec<Option<(Instant, Statvfs)>>>,
}

impl Space {
    /// Nothing known about `n` subvolumes.
    pub fn new(n: usize) -> Space {
        Space { seen: Mutex::new(vec![None; n]) }
    }
}

/// The subvolumes' statistics as one file system.
pub fn sum(all: &[Statvfs]) -> Statvfs {
    let frsize = all.iter().map(|s| s.frsize.max(1)).max().unwrap_or(4096);
    let scale = |v: u64, f: u64| ((v as u128 * f.max(1) as u128) / frsize as u128) as u64;
    let mut out = Statvfs { bsize: all.iter().map(|s| s.bsize).max().unwrap_or(frsize), frsize, ..Statvfs::default() };
    out.namemax = all.iter().map(|s| s.namemax).filter(|n| *n > 0).min().unwrap_or(255);
    for s in all {
        out.blocks += scale(s.blocks, s.frsize);
        out.bfree += scale(s.bfree, s.frsize);
        out.bavail += scale(s.bavail, s.frsize);
        out.files = out.files.saturating_add(s.files);
        out.ffree = out.ffree.saturating_add(s.ffree);
        out.favail = out.favail.saturating_add(s.favail);
    }
    if let Some(first) = all.first() {
        out.fsid = first.fsid;
        out.flag = first.flag;
    }
    out
}

impl Inner {
    /// statfs on every subvolume, summed; the first error fails it.
    pub(super) async fn statfs(&self, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        let loc = match &fop {
            Fop::Statfs { loc } => loc.clone(),
            _ => return Err(Errno::EINVAL),
        };
        // Any directory of the volume exists on every subvolume: ask at the
        // root when the location is a file held by one of them.
        let loc = if self.inodes.get(&loc.gfid).is_some_and(|w| w != super::Where::Dir) { Loc::root() } else { loc };
        let req = Request::with_xdata(Fop::Statfs { loc }, xdata);
        let res = self.fan(&self.all(), ctx, &req).await;
        if let Some(e) = first_error(&res, &[]) {
            return Err(e);
        }
        let mut all = Vec::new();
        let now = Instant::now();
        let mut seen = Vec::new();
        for (i, r) in res.into_iter().enumerate() {
            let st = r?.reply.into_statfs()?;
            seen.push((i, st));
            all.push(st);
        }
        {
            let mut s = self.space.seen.lock();
            for (i, st) in seen {
                s[i] = Some((now, st));
            }
        }
        Ok(Response::from(Reply::Statfs(sum(&all))))
    }

    /// The subvolume's statfs, from the cache when fresh.
    async fn space_of(&self, ctx: &CallCtx, i: usize) -> Option<Statvfs> {
        if let Some((at, st)) = self.space.seen.lock()[i]
            && at.elapsed() < TTL
        {
            return Some(st);
        }
        let r = self.wind(i, ctx, Request::new(Fop::Statfs { loc: Loc::root() })).await;
        match r.and_then(|r| Ok(r.reply.into_statfs()?)) {
            Ok(st) => {
                self.space.seen.lock()[i] = Some((Instant::now(), st));
                Some(st)
            }
            Err(e) => {
                tracing::debug!(volume = %self.name, child = %self.children[i].name, "statfs: {e}");
                None
            }
        }
    }

    /// Where a new file hashed to `hashed` goes: there, unless it is short
    /// of `min-free-disk` and another subvolume has more room (the one with
    /// the most available space).
    pub(super) async fn placement(&self, ctx: &CallCtx, hashed: usize) -> usize {
        let min = self.cfg().min_free;
        let Some(h) = self.space_of(ctx, hashed).await else { return hashed };
        if !short(min, &h) {
            return hashed;
        }
        let avail = |s: &Statvfs| s.bavail.saturating_mul(s.frsize.max(1));
        let mut best = (hashed, avail(&h));
        for i in (0..self.n()).filter(|i| *i != hashed) {
            if let Some(s) = self.space_of(ctx, i).await
                && !short(min, &s)
                && avail(&s) > best.1
            {
                best = (i, avail(&s));
            }
        }
        best.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_free_forms_and_sums() {
        assert_eq!(Share::parse("10%"), Some(Share::Percent(10.0)));
        assert_eq!(Share::parse("7"), Some(Share::Percent(7.0)));
        assert_eq!(Share::parse("40MB"), Some(Share::Bytes(40 << 20)));
        assert_eq!(Share::parse("lots"), None);
        let a =
            Statvfs { frsize: 4096, bsize: 4096, blocks: 100, bfree: 50, bavail: 5, files: 10, ..Default::default() };
        let b =
            Statvfs { frsize: 1024, bsize: 1024, blocks: 400, bfree: 400, bavail: 400, files: 5, ..Default::default() };
        assert!(short(Share::Percent(10.0), &a) && !short(Share::Percent(10.0), &b));
        let s = sum(&[a, b]);
        assert_eq!((s.frsize, s.blocks, s.bfree, s.bavail, s.files), (4096, 200, 150, 105, 15));
    }
}
