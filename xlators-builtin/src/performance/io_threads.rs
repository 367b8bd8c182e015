//! performance/io-threads: bounds how many fops run in the translators below
//! at once, and orders the waiting ones by priority, like GlusterFS's
//! io-threads on a brick.
//!
//! GlusterFS runs each fop's wind on one of `thread-count` worker threads,
//! picked from four queues (high, normal, low, least). Here the workers are
//! permits: a fop takes a permit of its priority class before it is wound to
//! the child and gives it back when the child answers, so at most
//! `thread-count` fops (and at most `<class>-prio-threads` of each class) are
//! doing blocking work below at any time; storage/posix runs each fop's
//! syscalls on a blocking thread, so this is the bound on blocking syscalls
//! in flight. Waiting fops are granted high first, then normal, low, least,
//! FIFO within a class.
//!
//! Lock fops (lk, inodelk, entrylk and their f- forms), release, releasedir
//! and forget do no blocking I/O and may wait for a long time (a blocked
//! lock waits for another client's unlock), so they pass through without a
//! permit: in GlusterFS the worker returns as soon as the lock is queued;
//! holding a permit while blocked would let waiting lock requests starve the
//! unlocks they wait for.
//!
//! Nothing is queued without a caller waiting on it: the queue is bounded by
//! the requests in flight, which protocol/server bounds per connection.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use xlfs_sdk::options::{Opt, kind};
use xlfs_sdk::options::{OptType, OptionDecl};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{CallCtx, Child, FopFuture, FopKind, InitCtx, InitError, Options, Request, Xlator, XlatorType};

/// Priority classes, highest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Metadata reads: lookup, stat, open, readdir...
    High = 0,
    /// Namespace and attribute changes.
    Normal = 1,
    /// Data I/O: read, write, fsync, xattrop...
    Low = 2,
    /// Internal background work (self-heal); from callers with a pid of
    /// [`LEAST_PRIORITY_PID`] or above.
    Least = 3,
}

/// Callers whose [`CallCtx::pid`] is at least this (GlusterFS gives its
/// daemons negative pids) are scheduled at [`Priority::Least`].
pub const LEAST_PRIORITY_PID: u32 = CallCtx::DAEMON_PIDS;

/// The class of a fop, or `None` when it bypasses the pool.
pub fn priority(ctx: &CallCtx, kind: FopKind) -> Option<Priority> {
    use FopKind::*;
    let class = match kind {
        Lk | Inodelk | Finodelk | Entrylk | Fentrylk | Release | Releasedir | Forget => return None,
        Open | Stat | Fstat | Lookup | Access | Readlink | Opendir | Statfs | Readdir | Readdirp => Priority::High,
        Create | Flush | Lease | Unlink | Setattr | Fsetattr | Mknod | Mkdir | Rmdir | Symlink | Rename | Link
        | Setxattr | Getxattr | Fgetxattr | Fsetxattr | Removexattr | Fremovexattr | Ipc => Priority::Normal,
        Readv | Writev | Fsync | Truncate | Ftruncate | Fsyncdir | Xattrop | Fxattrop | Rchecksum | Fallocate
        | Discard | Zerofill | Seek | CopyFileRange => Priority::Low,
    };
    if ctx.is_daemon() { Some(Priority::Least) } else { Some(class) }
}

const THREADS: Opt<kind::Int> = Opt::int("thread-count", "16")
    .range(1.0, 64.0)
    .desc("Most fops doing blocking work below this translator at once (GlusterFS's worker threads).");
const HIGH: Opt<kind::Int> = Opt::int("high-prio-threads", "16")
    .range(1.0, 64.0)
    .desc("Most high-priority fops (lookup, stat, open, readdir...) at once.");
const NORMAL: Opt<kind::Int> = Opt::int("normal-prio-threads", "16")
    .range(1.0, 64.0)
    .desc("Most normal-priority fops (create, unlink, setattr, xattrs...) at once.");
const LOW: Opt<kind::Int> = Opt::int("low-prio-threads", "16")
    .range(1.0, 64.0)
    .desc("Most low-priority fops (read, write, fsync, xattrop...) at once.");
const LEAST: Opt<kind::Int> = Opt::int("least-prio-threads", "1")
    .range(1.0, 64.0)
    .desc("Most least-priority fops (internal background work such as self-heal) at once.");
const LEAST_ENABLED: Opt<kind::Bool> = Opt::bool("enable-least-priority", true)
    .desc("Schedule internal callers at least priority; off puts them in their fop's class.");

const OPTIONS: &[OptionDecl] = &[
    THREADS.decl,
    HIGH.decl,
    NORMAL.decl,
    LOW.decl,
    LEAST.decl,
    LEAST_ENABLED.decl,
    OptionDecl::new("idle-time", OptType::Time)
        .default("120s")
        .desc("Accepted for GlusterFS volfiles; permits have no idle threads to reap."),
];

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "performance/io-threads",
    description: "bounds concurrent blocking work below it, with priority queues",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Limits {
    total: usize,
    per_class: [usize; 4],
    least_enabled: bool,
}

impl Limits {
    fn from_options(o: &Options) -> Limits {
        let n = |opt: Opt<kind::Int>| opt.count(o).max(1);
        Limits {
            total: n(THREADS),
            per_class: [n(HIGH), n(NORMAL), n(LOW), n(LEAST)],
            least_enabled: LEAST_ENABLED.get(o),
        }
    }
}

struct State {
    limits: Limits,
    running: usize,
    running_class: [usize; 4],
    queues: [VecDeque<oneshot::Sender<()>>; 4],
    granted: u64,
    queued: u64,
}

/// The permit scheduler, shared by the translator and its permits.
struct Pool {
    state: Mutex<State>,
}

/// A slot in the pool; given back on drop.
struct Permit {
    pool: Arc<Pool>,
    class: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut st = self.pool.state.lock();
        st.running -= 1;
        st.running_class[self.class] -= 1;
        Pool::grant_waiters(&mut st);
    }
}

impl Pool {
    fn new(limits: Limits) -> Arc<Pool> {
        Arc::new(Pool {
            state: Mutex::new(State {
                limits,
                running: 0,
                running_class: [0; 4],
                queues: Default::default(),
                granted: 0,
                queued: 0,
            }),
        })
    }

    fn has_room(st: &State, class: usize) -> bool {
        st.running < st.limits.total && st.running_class[class] < st.limits.per_class[class]
    }

    /// Hands free slots to the first waiters, highest class first. A waiter
    /// whose caller went away (receiver dropped) is skipped.
    fn grant_waiters(st: &mut State) {
        'outer: while st.running < st.limits.total {
            for class in 0..4 {
                if !Self::has_room(st, class) {
                    continue;
                }
                while let Some(tx) = st.queues[class].pop_front() {
                    if tx.send(()).is_ok() {
                        st.running += 1;
                        st.running_class[class] += 1;
                        st.granted += 1;
                        continue 'outer;
                    }
                }
            }
            break;
        }
    }

    async fn acquire(self: &Arc<Self>, prio: Priority) -> Permit {
        let mut waiting = {
            let mut st = self.state.lock();
            let mut class = prio as usize;
            if class == Priority::Least as usize && !st.limits.least_enabled {
                class = Priority::Low as usize;
            }
            if Self::has_room(&st, class) && st.queues[class].is_empty() {
                st.running += 1;
                st.running_class[class] += 1;
                st.granted += 1;
                return Permit { pool: self.clone(), class };
            }
            let (tx, rx) = oneshot::channel();
            st.queues[class].push_back(tx);
            st.queued += 1;
            Waiting { pool: self.clone(), class, rx: Some(rx) }
        };
        let granted = match waiting.rx.as_mut() {
            Some(rx) => rx.await.is_ok(),
            None => false,
        };
        waiting.rx = None;
        if !granted {
            // The sender went away unsent only if the pool did; count the
            // slot so the permit's drop stays balanced.
            let mut st = self.state.lock();
            st.running += 1;
            st.running_class[waiting.class] += 1;
        }
        Permit { pool: self.clone(), class: waiting.class }
    }
}

/// A queued request; if its caller goes away after being granted but before
/// taking the permit, the slot is given back on drop.
struct Waiting {
    pool: Arc<Pool>,
    class: usize,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                drop(Permit { pool: self.pool.clone(), class: self.class });
            }
        }
    }
}

/// The io-threads translator.
pub struct IoThreads {
    child: Child,
    pool: Arc<Pool>,
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let child = init.children.into_iter().next().ok_or_else(|| InitError::new("needs one child"))?;
    Ok(Arc::new(IoThreads { child, pool: Pool::new(Limits::from_options(&init.options)) }))
}

impl Xlator for IoThreads {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let Some(prio) = priority(&ctx, req.fop.kind()) else {
            return self.child.call(ctx, req);
        };
        Box::pin(async move {
            let _permit = self.pool.acquire(prio).await;
            self.child.call(ctx, req).await
        })
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        let mut st = self.pool.state.lock();
        st.limits = Limits::from_options(options);
        Pool::grant_waiters(&mut st);
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let st = self.pool.state.lock();
        vec![
            ("thread-count".into(), st.limits.total.to_string()),
            ("running".into(), st.running.to_string()),
            ("queued-now".into(), st.queues.iter().map(VecDeque::len).sum::<usize>().to_string()),
            ("granted-total".into(), st.granted.to_string()),
            ("queued-total".into(), st.queued.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use xlfs_sdk::testing::{Gate, init, until};
    use xlfs_sdk::{Fd, Fop, Gfid, Loc};

    use super::*;

    const WITHIN: Duration = Duration::from_secs(10);

    fn setup(opts: &[(&str, &str)]) -> (Arc<Gate>, Arc<dyn Xlator>) {
        let gate = Gate::over_null();
        let (ictx, _) = init(OPTIONS, opts, &[gate.child()]);
        (gate, build(ictx).expect("builds"))
    }

    fn fd() -> Fd {
        Fd { id: xlfs_sdk::FdId(1), gfid: Gfid::ROOT }
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn bounds_concurrency_and_serves_high_priority_first() {
        let (gate, xl) = setup(&[("thread-count", "2")]);
        let ctx = CallCtx::root("t");
        let mut tasks = Vec::new();
        for i in 0..4 {
            let (xl, ctx) = (xl.clone(), ctx.clone());
            tasks.push(tokio::spawn(async move {
                xl.call(ctx, Fop::Readv { fd: fd(), size: 1, offset: i, flags: 0 }.into()).await
            }));
        }
        until("two reads at the child", WITHIN, || gate.held() == 2).await;
        settle().await;
        assert_eq!(gate.held(), 2, "only thread-count fops run");
        let (xl2, ctx2) = (xl.clone(), ctx.clone());
        tasks.push(tokio::spawn(async move { xl2.call(ctx2, Fop::Stat { loc: Loc::root() }.into()).await }));
        settle().await;
        assert_eq!(gate.release(1), 1);
        until("a third fop at the child", WITHIN, || gate.arrived().len() == 3).await;
        assert_eq!(gate.arrived()[2], FopKind::Stat, "the queued stat overtakes queued reads");
        gate.open();
        for t in tasks {
            t.await.expect("join").expect("fop ok");
        }
        assert_eq!(gate.max_held(), 2);
    }

    #[tokio::test]
    async fn lock_fops_bypass_the_pool() {
        let (gate, xl) = setup(&[("thread-count", "1")]);
        let ctx = CallCtx::root("t");
        let (xl1, ctx1) = (xl.clone(), ctx.clone());
        let held = tokio::spawn(async move { xl1.call(ctx1, Fop::Fsync { fd: fd(), datasync: false }.into()).await });
        settle().await;
        let lk = Fop::Lk {
            fd: fd(),
            cmd: xlfs_sdk::LkCmd::SetLkw,
            lock: xlfs_sdk::Flock::whole(xlfs_sdk::LockType::Write, 1),
        };
        let (xl2, ctx2) = (xl.clone(), ctx.clone());
        let lock = tokio::spawn(async move { xl2.call(ctx2, lk.into()).await });
        until("the lock at the child while the pool is full", WITHIN, || gate.held() == 2).await;
        assert_eq!(gate.arrived(), [FopKind::Fsync, FopKind::Lk]);
        gate.open();
        held.await.expect("join").expect("ok");
        lock.await.expect("join").expect("ok");
    }

    #[tokio::test]
    async fn cancelled_waiters_give_their_turn_away() {
        let (gate, xl) = setup(&[("thread-count", "1")]);
        let ctx = CallCtx::root("t");
        let (xl1, ctx1) = (xl.clone(), ctx.clone());
        let first = tokio::spawn(async move { xl1.call(ctx1, Fop::Stat { loc: Loc::root() }.into()).await });
        until("the first stat at the child", WITHIN, || gate.held() == 1).await;
        let (xl2, ctx2) = (xl.clone(), ctx.clone());
        let cancelled = tokio::spawn(async move { xl2.call(ctx2, Fop::Stat { loc: Loc::root() }.into()).await });
        settle().await;
        cancelled.abort();
        let (xl3, ctx3) = (xl.clone(), ctx.clone());
        let third = tokio::spawn(async move { xl3.call(ctx3, Fop::Stat { loc: Loc::root() }.into()).await });
        settle().await;
        gate.open();
        first.await.expect("join").expect("ok");
        third.await.expect("join").expect("third runs after the cancelled one");
        assert_eq!(gate.arrived().len(), 2);
        assert_eq!(xl.dump().iter().find(|(k, _)| k == "running").map(|(_, v)| v.as_str()), Some("0"));
    }

    #[test]
    fn internal_callers_get_least_priority() {
        let mut ctx = CallCtx::root("shd");
        assert_eq!(priority(&ctx, FopKind::Writev), Some(Priority::Low));
        ctx.pid = LEAST_PRIORITY_PID;
        assert_eq!(priority(&ctx, FopKind::Lookup), Some(Priority::Least));
        assert_eq!(priority(&ctx, FopKind::Inodelk), None);
    }
}
