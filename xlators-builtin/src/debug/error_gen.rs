//! debug/error-gen: fault injection (GlusterFS's `debug/error-gen`).
//!
//! It forwards fops to its child, but fails some of them at once with an
//! errno instead: each enabled fop fails with probability `failure`
//! percent, or, with `random-failure`, one fop in every 3 to 44 (a new
//! random gap after each failure, as GlusterFS does). The errno is
//! `error-no`, or when that is empty one picked at random among those the
//! fop can plausibly return. Release, releasedir and forget are never
//! failed (they free state below and cannot report errors in GlusterFS).
//!
//! Randomness comes from a SplitMix64 generator advanced with one atomic
//! add per draw; `seed` makes runs reproducible (a single caller then sees
//! the same sequence of failures every run), otherwise it is seeded from
//! the OS.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use xlfs_sdk::options::{Opt, kind};
use xlfs_sdk::{
    CallCtx, Child, Errno, FopFuture, FopKind, InitCtx, InitError, OptionDecl, Request, Xlator, XlatorType,
};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "debug/error-gen",
    description: "fault injection: fails a chosen share of chosen fops with a chosen errno",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build: |init| Ok(Arc::new(ErrorGen::new(init)?)),
};

const FAILURE: Opt<kind::Percent> = Opt::percent("failure", "0").desc("Percentage of enabled fops to fail.");
const ERROR_NO: Opt<kind::Str> = Opt::str("error-no", "").desc(
    "The errno to fail with, by name (ENOSPC, EIO, ...); empty: for each failure, one the fop can \
     plausibly return, picked at random.",
);
const ENABLE: Opt<kind::List> = Opt::optional("enable").desc(
    "Comma-separated fops that may fail, by GlusterFS name (LOOKUP, WRITE, READ, FINODELK, ...) or xlfs \
     name (writev, readv), any case. Default: all.",
);
const ERROR_FOPS: Opt<kind::List> =
    Opt::optional("error-fops").desc("Another name for 'enable' (GlusterFS accepts both).");
const RANDOM: Opt<kind::Bool> = Opt::bool("random-failure", false).desc(
    "Ignore 'failure' and fail one enabled fop every 3 to 44 fops, the gap chosen at random after each \
     failure (GlusterFS's random-failure).",
);
const SEED: Opt<kind::Int> = Opt::optional("seed")
    .desc("Seed of the pseudo-random generator, for reproducible runs (xlfs addition). Default: from the OS.");

const OPTIONS: &[OptionDecl] = &[FAILURE.decl, ERROR_NO.decl, ENABLE.decl, ERROR_FOPS.decl, RANDOM.decl, SEED.decl];

/// SplitMix64: one atomic add per draw, so it is shared without a lock.
struct Rng(AtomicU64);

impl Rng {
    fn next(&self) -> u64 {
        let mut z = self.0.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    fn below(&self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// How often to fail.
enum Rate {
    /// Fail when a draw is below this (out of 2^64); `u64::MAX` means always.
    Share(u64),
    /// Fail at op number `next`, counting enabled fops.
    EveryFew { ops: AtomicU64, next: AtomicU64 },
}

struct ErrorGen {
    child: Child,
    /// Indexed by fop code.
    enabled: Vec<bool>,
    errno: Option<Errno>,
    rate: Rate,
    rng: Rng,
    failed: AtomicU64,
}

/// Random failure gaps: 3 to 44 fops, as GlusterFS (3 + rand() % 42).
fn gap(rng: &Rng) -> u64 {
    3 + rng.below(42)
}

impl ErrorGen {
    fn new(init: InitCtx) -> Result<ErrorGen, InitError> {
        let InitCtx { name, options, mut children, .. } = init;
        if children.len() != 1 {
            return Err(InitError::new(format!(
                "{name}: debug/error-gen takes exactly one subvolume, got {}",
                children.len()
            )));
        }
        let errno = match ERROR_NO.get(&options).trim() {
            "" => None,
            e => Some(Errno::from_name(&e.to_ascii_uppercase()).ok_or_else(|| {
                InitError::new(format!("{name}: error-no '{e}' is not an errno name xlfs knows (e.g. ENOSPC, EIO)"))
            })?),
        };
        let slots = FopKind::ALL.iter().map(|k| *k as usize + 1).max().unwrap_or(0);
        let mut enabled = vec![false; slots];
        match ENABLE.given(&options).or_else(|| ERROR_FOPS.given(&options)) {
            None => FopKind::ALL.iter().for_each(|k| enabled[*k as usize] = true),
            Some(names) => {
                for n in names {
                    let kind = fop_by_name(n).ok_or_else(|| {
                        InitError::new(format!("{name}: enable: '{n}' is not a fop name (LOOKUP, WRITE, READ, ...)"))
                    })?;
                    enabled[kind as usize] = true;
                }
            }
        }
        for k in [FopKind::Release, FopKind::Releasedir, FopKind::Forget] {
            enabled[k as usize] = false;
        }
        let seed = match SEED.given(&options) {
            Some(s) => s as u64,
            None => {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u128(
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
                );
                h.finish()
            }
        };
        let rng = Rng(AtomicU64::new(seed));
        let rate = if RANDOM.get(&options) {
            Rate::EveryFew { ops: AtomicU64::new(0), next: AtomicU64::new(gap(&rng)) }
        } else {
            let p = FAILURE.get(&options);
            Rate::Share(if p >= 100.0 { u64::MAX } else { (p / 100.0 * 18_446_744_073_709_551_616.0) as u64 })
        };
        Ok(ErrorGen { child: children.remove(0), enabled, errno, rate, rng, failed: AtomicU64::new(0) })
    }

    fn should_fail(&self) -> bool {
        match &self.rate {
            Rate::Share(0) => false,
            Rate::Share(u64::MAX) => true,
            Rate::Share(t) => self.rng.next() < *t,
            Rate::EveryFew { ops, next } => {
                let n = ops.fetch_add(1, Ordering::Relaxed) + 1;
                let due = next.load(Ordering::Relaxed);
                n >= due && next.compare_exchange(due, n + gap(&self.rng), Ordering::Relaxed, Ordering::Relaxed).is_ok()
            }
        }
    }

    fn pick_errno(&self, kind: FopKind) -> Errno {
        if let Some(e) = self.errno {
            return e;
        }
        let choices = plausible(kind);
        choices.get(self.rng.below(choices.len() as u64) as usize).copied().unwrap_or(Errno::EIO)
    }
}

/// A fop by GlusterFS name (`WRITE`) or xlfs name (`writev`), any case.
fn fop_by_name(name: &str) -> Option<FopKind> {
    FopKind::from_name(name)
        .or_else(|| FopKind::ALL.iter().copied().find(|k| format!("{k:?}").eq_ignore_ascii_case(name)))
}

/// Errnos a fop can plausibly fail with.
fn plausible(kind: FopKind) -> &'static [Errno] {
    use FopKind::*;
    const E: Errno = Errno::EIO;
    match kind {
        Lookup => &[Errno::ENOENT, Errno::ENOTDIR, Errno::ENAMETOOLONG, Errno::EACCES, Errno::EAGAIN],
        Stat | Access | Readlink => &[Errno::ENOENT, Errno::EACCES, Errno::ENOMEM, E],
        Fstat => &[Errno::EBADF, Errno::ENOMEM, E],
        Setattr | Fsetattr => &[Errno::EACCES, Errno::EPERM, Errno::EROFS, E],
        Truncate | Ftruncate => &[Errno::EACCES, Errno::EFBIG, Errno::EISDIR, Errno::EINTR, E],
        Mknod | Mkdir | Create | Symlink => {
            &[Errno::EACCES, Errno::EEXIST, Errno::ENOSPC, Errno::EDQUOT, Errno::EROFS, Errno::ENAMETOOLONG]
        }
        Unlink => &[Errno::EACCES, Errno::EBUSY, Errno::ENOENT, Errno::EISDIR, Errno::EROFS],
        Rmdir => &[Errno::EACCES, Errno::EBUSY, Errno::ENOENT, Errno::ENOTEMPTY, Errno::EROFS],
        Rename | Link => &[Errno::EACCES, Errno::EEXIST, Errno::EXDEV, Errno::EMLINK, Errno::ENOSPC, Errno::ENOENT],
        Open | Opendir => &[Errno::EACCES, Errno::ENOENT, Errno::EMFILE, Errno::ENFILE, Errno::ENOMEM],
        Readv => &[Errno::EBADF, Errno::EINVAL, Errno::EISDIR, E],
        Writev | CopyFileRange => &[Errno::ENOSPC, Errno::EDQUOT, Errno::EFBIG, Errno::EBADF, E],
        Flush | Fsync | Fsyncdir => &[Errno::EBADF, Errno::ENOSPC, Errno::EROFS, E],
        Readdir | Readdirp => &[Errno::EBADF, Errno::ENOENT, Errno::EINVAL, E],
        Statfs => &[Errno::EACCES, Errno::ENOSYS, E],
        Getxattr | Fgetxattr | Removexattr | Fremovexattr => &[Errno::ENODATA, Errno::EACCES, Errno::ERANGE, E],
        Setxattr | Fsetxattr => &[Errno::ENOSPC, Errno::EACCES, Errno::E2BIG, Errno::EEXIST, E],
        Lk | Inodelk | Finodelk | Entrylk | Fentrylk => &[Errno::EAGAIN, Errno::EINTR, Errno::ENOLCK, Errno::EACCES],
        Xattrop | Fxattrop => &[Errno::ENOSPC, Errno::EROFS, Errno::EACCES, E],
        Fallocate | Discard | Zerofill => &[Errno::ENOSPC, Errno::EOPNOTSUPP, Errno::EBADF, E],
        Seek => &[Errno::ENXIO, Errno::EINVAL, Errno::EBADF],
        _ => &[E],
    }
}

impl Xlator for ErrorGen {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let kind = req.fop.kind();
        if self.enabled.get(kind as usize).copied().unwrap_or(false) && self.should_fail() {
            let e = self.pick_errno(kind);
            self.failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(fop = kind.name(), errno = ?e, "error-gen: injecting failure");
            return Box::pin(std::future::ready(Err(e)));
        }
        self.child.call(ctx, req)
    }

    fn dump(&self) -> Vec<(String, String)> {
        let rate = match &self.rate {
            Rate::Share(t) => format!("{:.4}%", *t as f64 / 18_446_744_073_709_551_616.0 * 100.0),
            Rate::EveryFew { .. } => "random 1 in 3..44".to_string(),
        };
        let enabled: Vec<&str> = FopKind::ALL.iter().filter(|k| self.enabled[**k as usize]).map(|k| k.name()).collect();
        vec![
            ("failure".to_string(), rate),
            ("error-no".to_string(), self.errno.map_or("per fop".to_string(), |e| format!("{e:?}"))),
            ("enabled".to_string(), enabled.join(",")),
            ("failed".to_string(), self.failed.load(Ordering::Relaxed).to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use xlfs_sdk::{Fd, FdId, Fop, Gfid, Loc};

    use super::*;
    use xlfs_sdk::testing::{MockChild, ctx, init, now};

    fn setup(opts: &[(&str, &str)]) -> Result<(ErrorGen, Arc<MockChild>), InitError> {
        let mock = MockChild::new();
        let (i, _) = init(OPTIONS, opts, &[mock.child()]);
        Ok((ErrorGen::new(i)?, mock))
    }

    fn stat() -> Request {
        Request::new(Fop::Stat { loc: Loc::root() })
    }

    fn outcomes(xl: &ErrorGen, n: usize) -> Vec<Option<Errno>> {
        (0..n).map(|_| now(xl.call(ctx("A", 1), stat())).err()).collect()
    }

    #[test]
    fn failure_rate_is_about_right_and_seed_reproduces() {
        let (xl, mock) = setup(&[("failure", "10%"), ("seed", "42"), ("error-no", "enospc")]).expect("builds");
        let runs = outcomes(&xl, 10_000);
        let failed = runs.iter().filter(|r| r.is_some()).count();
        assert!((800..=1200).contains(&failed), "{failed} failures of 10000 at 10%");
        assert!(runs.iter().flatten().all(|e| *e == Errno::ENOSPC));
        assert_eq!(mock.kinds().len(), 10_000 - failed, "failed fops are not forwarded");
        let (again, _) = setup(&[("failure", "10%"), ("seed", "42"), ("error-no", "ENOSPC")]).expect("builds");
        assert_eq!(outcomes(&again, 10_000), runs, "same seed, same failures");
        let (other, _) = setup(&[("failure", "10%"), ("seed", "43")]).expect("builds");
        assert_ne!(
            outcomes(&other, 10_000).iter().map(Option::is_some).collect::<Vec<_>>(),
            runs.iter().map(Option::is_some).collect::<Vec<_>>()
        );
        assert_eq!(xl.dump().last(), Some(&("failed".to_string(), failed.to_string())));
    }

    #[test]
    fn default_is_no_failure_and_full_rate_always_fails() {
        let (xl, _) = setup(&[]).expect("builds");
        assert!(outcomes(&xl, 1000).iter().all(Option::is_none));
        let (xl, _) = setup(&[("failure", "100")]).expect("builds");
        let errs = outcomes(&xl, 200);
        assert!(errs.iter().all(|e| e.is_some_and(|e| plausible(FopKind::Stat).contains(&e))), "{errs:?}");
    }

    #[test]
    fn enable_list_restricts_fops() {
        let (xl, mock) = setup(&[("failure", "100"), ("enable", "WRITE, lookup,Readv")]).expect("builds");
        let fd = Fd { id: FdId(1), gfid: Gfid([2; 16]) };
        let c = ctx("A", 1);
        assert!(
            now(xl.call(c.clone(), Request::new(Fop::Writev { fd, data: Bytes::new(), offset: 0, flags: 0 }))).is_err()
        );
        assert!(now(xl.call(c.clone(), Request::new(Fop::Readv { fd, size: 1, offset: 0, flags: 0 }))).is_err());
        assert!(now(xl.call(c.clone(), Request::new(Fop::Lookup { loc: Loc::root() }))).is_err());
        assert!(now(xl.call(c.clone(), stat())).is_ok());
        assert!(now(xl.call(c.clone(), Request::new(Fop::Release { fd }))).is_ok());
        assert_eq!(mock.kinds(), vec![FopKind::Stat, FopKind::Release]);
        // Release is never failed, even when enabled by default.
        let (xl, _) = setup(&[("failure", "100")]).expect("builds");
        assert!(now(xl.call(c, Request::new(Fop::Release { fd }))).is_ok());
    }

    #[test]
    fn random_failure_gaps() {
        let (xl, _) = setup(&[("random-failure", "on"), ("seed", "7"), ("error-no", "EIO")]).expect("builds");
        let runs = outcomes(&xl, 2000);
        let at: Vec<usize> = runs.iter().enumerate().filter(|(_, r)| r.is_some()).map(|(i, _)| i + 1).collect();
        assert!(at.len() >= 2000 / 44 && at.len() <= 2000 / 3, "{} failures", at.len());
        assert!((3..=44).contains(&at[0]));
        assert!(at.windows(2).all(|w| (3..=44).contains(&(w[1] - w[0]))), "{at:?}");
    }

    #[test]
    fn bad_options_are_refused() {
        let e = setup(&[("error-no", "ENOTANERRNO")]).err().expect("refused");
        assert!(e.to_string().contains("ENOTANERRNO"), "{e}");
        let e = setup(&[("enable", "write,frobnicate")]).err().expect("refused");
        assert!(e.to_string().contains("frobnicate"), "{e}");
        assert_eq!(fop_by_name("copy_file_range"), Some(FopKind::CopyFileRange));
        assert_eq!(fop_by_name("copyfilerange"), Some(FopKind::CopyFileRange));
    }
}
