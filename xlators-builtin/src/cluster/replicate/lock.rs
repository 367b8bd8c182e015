//! AFR's internal locks on the children (GlusterFS's `afr-lk-common.c`):
//! inodelks for data and metadata transactions, entrylks for entry
//! transactions, all in the lock domain named after the replicate volume.
//!
//! Locks are first tried without waiting on every child at once; if any
//! child answers EAGAIN, everything taken is given back and the locks are
//! taken again waiting, one at a time, lock by lock and child by child in
//! child order. Every client takes them in the same order, so two clients
//! cannot deadlock each holding a part of the set. A child that fails with
//! anything but EAGAIN is left out (the transaction blames it).

use xlfs_sdk::dict::keys::INODELK_COUNT;
use xlfs_sdk::{
    CallCtx, Dict, EntrylkCmd, EntrylkType, Errno, Fd, Flock, Fop, FopResult, Gfid, LkCmd, Loc, LockType, Request,
    Value,
};

use super::Inner;
use super::pending::{Mask, bit, members};

/// GlusterFS's metadata-lock range start (`LLONG_MAX - 1`); features/locks
/// keeps such locks in `<domain>:metadata`.
pub const METADATA_START: u64 = i64::MAX as u64 - 1;

/// One lock a transaction takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// An inodelk on the whole file (data) or on the metadata range.
    Inode {
        /// The inode.
        gfid: Gfid,
        /// Lock through this fd (finodelk) when set.
        fd: Option<Fd>,
        /// The metadata range instead of the whole file.
        metadata: bool,
    },
    /// An entrylk on a name in a directory (or the whole directory when the
    /// name is empty).
    Entry {
        /// The directory.
        dir: Gfid,
        /// The name.
        name: String,
    },
}

/// What a lock call does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Try,
    Wait,
    Unlock,
}

/// Locks held on some children.
#[derive(Clone, Debug)]
pub struct Held {
    /// The caller identity the locks were taken with (AFR's own lock owner).
    pub ctx: CallCtx,
    /// What is locked.
    pub targets: Vec<Target>,
    /// Where.
    pub locked: Mask,
    /// The highest inodelk count a child reported with a grant (0: none).
    pub inodelk_count: u32,
}

impl Inner {
    fn lock_fop(&self, t: &Target, op: Op, owner: u64) -> Fop {
        let domain = self.name.clone();
        match t {
            Target::Inode { gfid, fd, metadata } => {
                let (start, ty) = (
                    if *metadata { METADATA_START } else { 0 },
                    match op {
                        Op::Unlock => LockType::Unlock,
                        _ => LockType::Write,
                    },
                );
                let lock = Flock { ty, start, len: 0, pid: 0, owner };
                let cmd = if op == Op::Wait { LkCmd::SetLkw } else { LkCmd::SetLk };
                match fd {
                    Some(fd) if op != Op::Unlock => Fop::Finodelk { domain, fd: *fd, cmd, lock },
                    _ => Fop::Inodelk { domain, loc: Loc::gfid(*gfid), cmd, lock },
                }
            }
            Target::Entry { dir, name } => Fop::Entrylk {
                domain,
                loc: Loc::gfid(*dir),
                name: name.clone(),
                cmd: match op {
                    Op::Try => EntrylkCmd::LockNb,
                    Op::Wait => EntrylkCmd::Lock,
                    Op::Unlock => EntrylkCmd::Unlock,
                },
                ty: EntrylkType::Write,
            },
        }
    }

    fn lock_xdata(&self, want_count: bool) -> Dict {
        let mut x = Dict::new();
        if want_count {
            x.set(INODELK_COUNT, Value::Str(self.name.clone()));
        }
        x
    }

    async fn lock_one(&self, ctx: &CallCtx, i: usize, t: &Target, op: Op, want_count: bool) -> FopResult {
        let req =
            Request::with_xdata(self.lock_fop(t, op, ctx.lk_owner), self.lock_xdata(want_count && op != Op::Unlock));
        self.wind(i, ctx.clone(), req).await
    }

    /// Takes `targets` on the children in `candidates` with the lock owner
    /// in `ctx`. Returns the locks (possibly on fewer children); Err if no
    /// child could be locked.
    pub async fn lock(
        &self,
        ctx: CallCtx,
        targets: Vec<Target>,
        candidates: Mask,
        want_count: bool,
    ) -> Result<Held, Errno> {
        let mut held = Held { ctx, targets, locked: 0, inodelk_count: 0 };
        // Per child, how many of the targets it holds (a prefix, in order).
        let n = self.children.len();
        let mut got = vec![0usize; n];
        let mut excluded: Mask = 0;
        let mut contended = false;
        let mut first_err = None;
        // Non-blocking pass: each target on every candidate at once.
        for (ti, t) in held.targets.iter().enumerate() {
            let live = candidates & !excluded;
            let futs = members(live).map(|i| {
                let h = &held;
                async move { (i, self.lock_one(&h.ctx, i, t, Op::Try, want_count).await) }
            });
            for (i, r) in super::join_all(futs.collect()).await {
                match r {
                    Ok(rsp) => {
                        got[i] = ti + 1;
                        note_count(&mut held.inodelk_count, &rsp.xdata);
                    }
                    Err(Errno::EAGAIN) => contended = true,
                    Err(e) => {
                        first_err.get_or_insert(e);
                        excluded |= bit(i);
                    }
                }
            }
            if contended {
                break;
            }
        }
        if contended {
            // Give everything back, then wait lock by lock, child by child.
            self.unlock_prefixes(&held, &got).await;
            got.iter_mut().for_each(|g| *g = 0);
            held.inodelk_count = 0;
            for (ti, t) in held.targets.iter().enumerate() {
                for i in members(candidates & !excluded) {
                    match self.lock_one(&held.ctx, i, t, Op::Wait, want_count).await {
                        Ok(rsp) => {
                            got[i] = ti + 1;
                            note_count(&mut held.inodelk_count, &rsp.xdata);
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                            excluded |= bit(i);
                        }
                    }
                }
            }
        }
        // Children that did not get every target give back what they got.
        let all = held.targets.len();
        let partial: Vec<usize> = got.iter().map(|&g| if g == all { 0 } else { g }).collect();
        if partial.iter().any(|&g| g > 0) {
            self.unlock_prefixes(&held, &partial).await;
        }
        held.locked = (0..n).filter(|&i| got[i] == all && all > 0).fold(0, |m, i| m | bit(i));
        if held.locked == 0 {
            return Err(first_err.unwrap_or(Errno::ENOTCONN));
        }
        Ok(held)
    }

    /// Releases the first `got[i]` targets on each child `i`.
    async fn unlock_prefixes(&self, held: &Held, got: &[usize]) {
        let futs =
            (0..got.len()).flat_map(|i| held.targets[..got[i]].iter().map(move |t| (i, t))).map(|(i, t)| async move {
                let _ = self.lock_one(&held.ctx, i, t, Op::Unlock, false).await;
            });
        super::join_all(futs.collect()).await;
    }

    /// Releases every lock held.
    pub async fn unlock(&self, held: &Held) {
        let all = held.targets.len();
        let got: Vec<usize> =
            (0..self.children.len()).map(|i| if held.locked & bit(i) != 0 { all } else { 0 }).collect();
        self.unlock_prefixes(held, &got).await;
    }
}

/// Keeps the highest inodelk count seen in reply xdata.
pub fn note_count(into: &mut u32, xdata: &Dict) {
    if let Some(c) = xdata.get_u64(INODELK_COUNT) {
        *into = (*into).max(u32::try_from(c).unwrap_or(u32::MAX));
    }
}
