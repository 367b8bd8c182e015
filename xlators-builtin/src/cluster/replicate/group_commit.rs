//! Group commit for `ensure-durability`.
//!
//! Before a window's post-op clears the counters of a file it wrote, the
//! writes must be on stable storage on every child (else a crash could
//! leave a copy behind while no counter says so). GlusterFS fsyncs each
//! file on each child; with many small files closed at once (untar, a
//! build, write-behind's flush-behind) that is one disk flush per file per
//! brick. Here a child's flush is shared: a caller asks for a `syncfs` of
//! the child's file system (fsync with [`SYNCFS`] in xdata), and every
//! caller that asked before that syncfs *started* is covered by it. While
//! one runs, the callers that arrive wait and the next one covers them all.
//!
//! A caller alone (no other ticket of the child uncovered) syncs just its
//! file (fdatasync of its fd) instead: a syncfs also writes back everything
//! else dirty on the brick's file system, which made one file's window end
//! take 150 ms during pgbench (bricks sharing their disk with other work)
//! and stalled the database's own fsyncs behind it.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;
use xlfs_sdk::dict::keys::SYNCFS;
use xlfs_sdk::{CallCtx, Dict, Fd, Fop, Request};

use super::Inner;
use super::pending::{Mask, bit, members};

/// Failed ranges remembered per child (callers wake long before more
/// syncfs calls fail than this).
const FAILURES_KEPT: usize = 64;

#[derive(Default)]
struct Child {
    /// Tickets handed out.
    asked: u64,
    /// Every ticket up to this one is covered by a finished syncfs.
    covered: u64,
    /// Ticket ranges (first, last) whose syncfs failed, oldest first.
    failed: std::collections::VecDeque<(u64, u64)>,
    running: bool,
}

impl Child {
    fn ok(&self, ticket: u64) -> bool {
        let forgotten = self.failed.len() >= FAILURES_KEPT && self.failed.front().is_some_and(|(lo, _)| ticket < *lo);
        !forgotten && !self.failed.iter().any(|(lo, hi)| (*lo..=*hi).contains(&ticket))
    }
}

/// Per-child group-commit state.
pub struct GroupCommit {
    children: Vec<Mutex<Child>>,
    changed: Notify,
    /// Syncs sent: of a child's whole file system, of one file.
    pub syncfs: AtomicU64,
    pub file_syncs: AtomicU64,
}

impl GroupCommit {
    /// State for `n` children.
    pub fn new(n: usize) -> GroupCommit {
        GroupCommit {
            children: (0..n).map(|_| Mutex::new(Child::default())).collect(),
            changed: Notify::new(),
            syncfs: AtomicU64::new(0),
            file_syncs: AtomicU64::new(0),
        }
    }
}

impl Inner {
    /// Makes every write finished before this call durable on the children
    /// in `targets`, through `fd` (open on them). Returns the children
    /// where that failed.
    pub async fn group_sync(&self, ctx: &CallCtx, fd: Fd, targets: Mask) -> Mask {
        let futs = members(targets).map(|i| async move { (i, self.sync_child(ctx, fd, i).await) });
        let mut failed = 0;
        for (i, ok) in super::join_all(futs.collect()).await {
            if !ok {
                failed |= bit(i);
            }
        }
        failed
    }

    async fn sync_child(&self, ctx: &CallCtx, fd: Fd, i: usize) -> bool {
        let gc = &self.group_commit;
        let ticket = {
            let mut c = gc.children[i].lock();
            c.asked += 1;
            c.asked
        };
        loop {
            let notified = gc.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // What this run covers, and whether that is only this caller's
            // ticket (then its file is enough).
            let run = {
                let mut c = gc.children[i].lock();
                if c.covered >= ticket {
                    return c.ok(ticket);
                }
                if c.running {
                    None
                } else {
                    c.running = true;
                    Some((c.asked, c.asked == ticket && c.covered + 1 == ticket))
                }
            };
            let Some((covers, alone)) = run else {
                notified.await;
                continue;
            };
            let mut xdata = Dict::new();
            if alone {
                gc.file_syncs.fetch_add(1, Ordering::Relaxed);
            } else {
                gc.syncfs.fetch_add(1, Ordering::Relaxed);
                xdata.set_u64(SYNCFS, 1);
            }
            let req = Request::with_xdata(Fop::Fsync { fd, datasync: true }, xdata);
            let ok = self.wind(i, ctx.clone(), req).await.is_ok();
            {
                let mut c = gc.children[i].lock();
                if !ok {
                    let first = c.covered + 1;
                    if c.failed.len() >= FAILURES_KEPT {
                        c.failed.pop_front();
                    }
                    c.failed.push_back((first, covers));
                }
                c.covered = covers;
                c.running = false;
            }
            gc.changed.notify_waiters();
        }
    }
}
