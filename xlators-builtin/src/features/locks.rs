//! features/locks: the brick's lock server (GlusterFS's `features/locks`).
//!
//! It answers the lock fops itself and forwards every other fop to its one
//! child unchanged:
//!
//! - **inodelk / finodelk**: byte-range locks per (inode, domain), read
//!   (shared) or write (exclusive), owned by (client, lk_owner). Locks of
//!   one owner never conflict. `SetLk` fails with EAGAIN on conflict,
//!   `SetLkw` waits; waiters are granted in arrival order and a new request
//!   does not overtake a conflicting waiter (no writer starvation) unless
//!   its owner already holds a lock in the domain. Unlock must name exactly
//!   the range of a granted lock of the owner (else EINVAL); `GetLk` is
//!   EINVAL. As in GlusterFS, a lock on the special range
//!   `start = i64::MAX - 1, len = 0` lives in the domain `<domain>:metadata`.
//! - **entrylk / fentrylk**: locks on a name in a directory, or with an empty
//!   name on the whole directory (which conflicts with every name). Read
//!   entry locks share with each other; anything with a write lock
//!   conflicts. (GlusterFS treats every entrylk as exclusive; nothing there
//!   takes read entrylks.) `Lock` waits, `LockNb` fails with EAGAIN, `Unlock`
//!   must match name, type and owner (else EINVAL).
//! - **lk**: POSIX record locks (see `posix`): merge/split per owner, GETLK
//!   reports the first conflicting lock (or type Unlock), SETLK fails with
//!   EAGAIN, SETLKW waits. Flush releases the caller's (client, lk_owner)
//!   locks on the inode (close(2) semantics); Release releases the locks
//!   taken through that fd. An `lk` whose xdata has [`keys::LK_FLOCK`] is a
//!   flock(2): the same rules in a lock space of its own, so a flock never
//!   conflicts with an fcntl lock (as on a local file system), and a flush
//!   does not drop it (its release does).
//!
//! **Clients going away.** [`Event::ClientGone`] from the graph releases all
//! the client held (inodelks, entrylks, posix locks), grants the waiters
//! that can now go, and fails the client's own waiting requests with
//! ENOTCONN (GlusterFS answers EAGAIN, but the caller is gone either way and
//! ENOTCONN says why). A waiting request whose future is dropped removes
//! itself from the blocked list; if it had been granted in the same instant,
//! its inodelk/entrylk is released again (a posix lock stays with its owner
//! until flush or release, as after an interrupted fcntl).
//!
//! **Contention.** When a lock request conflicts with granted locks (waiting
//! or not, as GlusterFS does), each holder in the way is sent
//! [`Upcall::InodelkContention`] (or `EntrylkContention`) through the event
//! sink, at most once per `notify-contention-delay` per granted lock.
//!
//! **Lock counts.** A request (any fop) whose xdata has
//! [`keys::INODELK_COUNT`] (a string value names one domain, anything else
//! means all), [`keys::ENTRYLK_COUNT`] (likewise) or [`keys::POSIXLK_COUNT`]
//! gets the number of such locks (granted + waiting) on the inode in the
//! reply's xdata as U64. The keys are removed before the fop goes on.
//!
//! **Memory.** At most `max-locks` granted + waiting locks in all; new
//! locks beyond get ENOLCK. An inode's state is freed with its last lock.

mod posix;
mod queue;
mod table;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use xlfs_sdk::options::{Opt, kind};

use parking_lot::Mutex;
use xlfs_sdk::dict::keys;
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Dict, EntrylkCmd, EntrylkType, Errno, Event, EventFrom, EventSink, Fd, Flock, Fop, FopFuture,
    FopKind, FopResult, Gfid, InitCtx, InitError, LkCmd, Loc, LockType, OptionDecl, Options, Reply, Request, Response,
    Upcall, Value, Xlator, XlatorType,
};

use self::posix::{PosixLk, PosixLocks};
use self::queue::{Attempt, Contention, DomainLock, Pending, Queue};
use self::table::*;

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "features/locks",
    description: "lock server: inodelk, entrylk and POSIX locks with waiting, fairness, contention upcalls and lock counts",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

const NOTIFY_CONTENTION: Opt<kind::Bool> = Opt::bool("notify-contention", true).desc(
    "When a lock request conflicts with a granted inodelk or entrylk, send the holder a contention upcall \
         asking it to release the lock soon (drives eager-lock release).",
);
const NOTIFY_CONTENTION_DELAY: Opt<kind::Time> = Opt::time("notify-contention-delay", "5")
    .range(0.0, 60.0)
    .desc("Least time between two contention upcalls about the same granted lock (0: every conflict).");
const MAX_LOCKS: Opt<kind::Int> = Opt::int("max-locks", "1000000")
    .range(1.0, 1e12)
    .desc("Most granted plus waiting locks (all kinds, all inodes); new lock requests beyond get ENOLCK.");
const ENFORCE_MANDATORY_LOCK: Opt<kind::Bool> = Opt::bool("enforce-mandatory-lock", false)
    .desc("Accepted for GlusterFS volfiles; mandatory locking is not implemented, so 'on' is refused.");
const MANDATORY_LOCKING: Opt<kind::Str> =
    Opt::one_of("mandatory-locking", &["off", "file", "forced", "optimal"], "off")
        .desc("Accepted for GlusterFS volfiles; mandatory locking is not implemented, so only 'off' is accepted.");

const OPTIONS: &[OptionDecl] = &[
    NOTIFY_CONTENTION.decl,
    NOTIFY_CONTENTION_DELAY.decl,
    MAX_LOCKS.decl,
    ENFORCE_MANDATORY_LOCK.decl,
    MANDATORY_LOCKING.decl,
];

/// Longest lock domain name accepted.
const MAX_DOMAIN: usize = 1024;
/// Longest entry name accepted (NAME_MAX).
const MAX_NAME: usize = 255;
/// GlusterFS's metadata-lock range start (`LLONG_MAX - 1`).
const METADATA_START: u64 = i64::MAX as u64 - 1;
/// Most inodes listed by dump().
const DUMP_INODES: usize = 256;

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    Ok(Arc::new(Locks::new(init)?))
}

/// Which queue a waiting request sits in.
enum WaitKind {
    Inodelk(String),
    Entrylk(String),
    /// A record lock; true in the flock space.
    Posix(bool),
}

/// A queued request being waited for. Dropped before its answer is seen,
/// it takes the request (or the lock it was just granted) back out.
struct Wait<'a> {
    xl: &'a Locks,
    gfid: Gfid,
    kind: WaitKind,
    id: u64,
    pending: Pending,
    done: bool,
}

impl Wait<'_> {
    async fn wait(mut self) -> Result<(), Errno> {
        let r = (&mut self.pending).await.unwrap_or(Err(Errno::ENOTCONN));
        self.done = true;
        r
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.xl.cancel(self.gfid, &self.kind, self.id);
        }
    }
}

/// Which lock counts a request asked for; `Some(None)` means all domains.
struct CountRequest {
    inodelk: Option<Option<String>>,
    entrylk: Option<Option<String>>,
    posix: bool,
}

impl CountRequest {
    /// Takes the count keys out of `xdata`; None if there are none.
    fn take(xdata: &mut Dict) -> Option<CountRequest> {
        if xdata.is_empty() {
            return None;
        }
        let domain = |v: Value| match v {
            Value::Str(s) if !s.is_empty() => Some(s),
            _ => None,
        };
        let req = CountRequest {
            inodelk: xdata.remove(keys::INODELK_COUNT).map(domain),
            entrylk: xdata.remove(keys::ENTRYLK_COUNT).map(domain),
            posix: xdata.remove(keys::POSIXLK_COUNT).is_some(),
        };
        (req.inodelk.is_some() || req.entrylk.is_some() || req.posix).then_some(req)
    }

    fn fill(&self, il: Option<&InodeLocks>, xdata: &mut Dict) {
        if let Some(d) = &self.inodelk {
            xdata.set_u64(keys::INODELK_COUNT, il.map_or(0, |il| il.count_in(d.as_deref(), |d| d.inodelk.len())));
        }
        if let Some(d) = &self.entrylk {
            xdata.set_u64(keys::ENTRYLK_COUNT, il.map_or(0, |il| il.count_in(d.as_deref(), |d| d.entrylk.len())));
        }
        if self.posix {
            xdata.set_u64(keys::POSIXLK_COUNT, il.map_or(0, |il| (il.posix.len() + il.flock.len()) as u64));
        }
    }
}

/// The translator.
struct Locks {
    child: Child,
    events: EventSink,
    table: Table,
    next_id: AtomicU64,
    notify: AtomicBool,
    delay_ms: AtomicU64,
    max_locks: AtomicUsize,
}

impl Locks {
    fn new(init: InitCtx) -> Result<Locks, InitError> {
        let InitCtx { name, options, mut children, events, .. } = init;
        if ENFORCE_MANDATORY_LOCK.get(&options) || MANDATORY_LOCKING.get(&options) != "off" {
            return Err(InitError::new(format!(
                "{name}: mandatory locking is not implemented; set 'enforce-mandatory-lock off' and 'mandatory-locking off'"
            )));
        }
        let child = match children.len() {
            1 => children.remove(0),
            n => {
                return Err(InitError::new(format!("{name}: features/locks takes exactly one subvolume, got {n}")));
            }
        };
        let xl = Locks {
            child,
            events,
            table: Table::new(),
            next_id: AtomicU64::new(1),
            notify: AtomicBool::new(true),
            delay_ms: AtomicU64::new(5000),
            max_locks: AtomicUsize::new(1_000_000),
        };
        xl.apply_options(&options);
        Ok(xl)
    }

    fn apply_options(&self, o: &Options) {
        self.notify.store(NOTIFY_CONTENTION.get(o), Ordering::Relaxed);
        let delay = NOTIFY_CONTENTION_DELAY.get(o);
        self.delay_ms.store(delay.as_millis().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
        let max = MAX_LOCKS.get(o);
        self.max_locks.store(usize::try_from(max).unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// The clock for contention notices, None when they are off.
    fn clock(&self) -> Option<(Instant, Duration)> {
        self.notify
            .load(Ordering::Relaxed)
            .then(|| (Instant::now(), Duration::from_millis(self.delay_ms.load(Ordering::Relaxed))))
    }

    fn send(&self, upcalls: Vec<Upcall>) {
        for u in upcalls {
            tracing::debug!(upcall = ?u, "lock contention");
            self.events.send(Event::Upcall(u));
        }
    }

    fn new_lock_id(&self) -> Result<u64, Errno> {
        if self.table.total.load(Ordering::Relaxed) >= self.max_locks.load(Ordering::Relaxed) {
            tracing::debug!("lock table full (max-locks reached): ENOLCK");
            return Err(Errno::ENOLCK);
        }
        Ok(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Waits for a queued request unless the attempt already decided.
    async fn settle(&self, attempt: Attempt, gfid: Gfid, kind: WaitKind, id: u64) -> Result<(), Errno> {
        match attempt {
            Attempt::Granted => Ok(()),
            Attempt::WouldBlock => Err(Errno::EAGAIN),
            Attempt::Queued(pending) => Wait { xl: self, gfid, kind, id, pending, done: false }.wait().await,
        }
    }

    async fn domain_lock<L: Kind>(&self, gfid: Gfid, domain: String, lock: L, block: bool) -> Result<(), Errno> {
        let id = self.new_lock_id()?;
        let clock = self.clock();
        let (attempt, upcalls) = self
            .table
            .update(gfid, true, |il| {
                let mut c = Contention::new(gfid, &domain, clock);
                let a = L::queue(il.domain(&domain)).lock(id, lock, block, &mut c);
                (a, c.out)
            })
            .ok_or(Errno::ENOMEM)?;
        self.send(upcalls);
        self.settle(attempt, gfid, L::wait_kind(domain), id).await
    }

    fn domain_unlock<L: Kind>(&self, gfid: Gfid, domain: &str, is_it: impl Fn(&L) -> bool) -> Result<(), Errno> {
        let clock = self.clock();
        let (found, upcalls) = self
            .table
            .update(gfid, false, |il| {
                let Some(d) = il.domains.get_mut(domain) else {
                    return (false, Vec::new());
                };
                let q = L::queue(d);
                let mut c = Contention::new(gfid, domain, clock);
                let found = q.unlock(is_it);
                if found {
                    q.grant_blocked(&mut c);
                }
                (found, c.out)
            })
            .unwrap_or_default();
        self.send(upcalls);
        if found { Ok(()) } else { Err(Errno::EINVAL) }
    }

    fn cancel(&self, gfid: Gfid, kind: &WaitKind, id: u64) {
        fn in_domain<L: Kind>(
            il: &mut InodeLocks,
            gfid: Gfid,
            domain: &str,
            id: u64,
            clock: Option<(Instant, Duration)>,
        ) -> Vec<Upcall> {
            let Some(d) = il.domains.get_mut(domain) else {
                return Vec::new();
            };
            let q = L::queue(d);
            let mut c = Contention::new(gfid, domain, clock);
            if q.cancel(id) {
                q.grant_blocked(&mut c);
            }
            c.out
        }
        let clock = self.clock();
        let upcalls = self
            .table
            .update(gfid, false, |il| match kind {
                WaitKind::Inodelk(d) => in_domain::<InodeLk>(il, gfid, d, id, clock),
                WaitKind::Entrylk(d) => in_domain::<EntryLk>(il, gfid, d, id, clock),
                WaitKind::Posix(flock) => {
                    let space = il.space(*flock);
                    if space.cancel(id) {
                        space.grant_blocked();
                    }
                    Vec::new()
                }
            })
            .unwrap_or_default();
        self.send(upcalls);
    }

    async fn inodelk(&self, ctx: &CallCtx, gfid: Gfid, domain: String, cmd: LkCmd, fl: Flock) -> Result<(), Errno> {
        let (start, end) = range(&fl)?;
        check_domain(&domain)?;
        let domain = if start == METADATA_START && fl.len == 0 && !domain.ends_with(":metadata") {
            format!("{domain}:metadata")
        } else {
            domain
        };
        let owner = Owner::of(ctx);
        let block = match cmd {
            LkCmd::GetLk => return Err(Errno::EINVAL),
            LkCmd::SetLk => false,
            LkCmd::SetLkw => true,
        };
        let exclusive = match fl.ty {
            LockType::Unlock => {
                return self
                    .domain_unlock::<InodeLk>(gfid, &domain, |l| l.owner == owner && l.start == start && l.end == end);
            }
            LockType::Read => false,
            LockType::Write => true,
        };
        self.domain_lock(gfid, domain, InodeLk { owner, exclusive, start, end }, block).await
    }

    async fn entrylk(
        &self,
        ctx: &CallCtx,
        gfid: Gfid,
        domain: String,
        name: String,
        cmd: EntrylkCmd,
        ty: EntrylkType,
    ) -> Result<(), Errno> {
        check_domain(&domain)?;
        if name.len() > MAX_NAME {
            return Err(Errno::ENAMETOOLONG);
        }
        let owner = Owner::of(ctx);
        let exclusive = ty == EntrylkType::Write;
        let name = (!name.is_empty()).then_some(name);
        let block = match cmd {
            EntrylkCmd::Unlock => {
                return self.domain_unlock::<EntryLk>(gfid, &domain, |l| {
                    l.owner == owner && l.name == name && l.exclusive == exclusive
                });
            }
            EntrylkCmd::Lock => true,
            EntrylkCmd::LockNb => false,
        };
        self.domain_lock(gfid, domain, EntryLk { owner, exclusive, name }, block).await
    }

    /// A record lock fop, in the POSIX lock space or (`flock`) the flock one.
    async fn lk(&self, ctx: &CallCtx, fd: Fd, cmd: LkCmd, fl: Flock, flock: bool) -> Result<Flock, Errno> {
        if fd.gfid.is_null() {
            return Err(Errno::EBADF);
        }
        let (start, end) = range(&fl)?;
        let req = |exclusive| PosixLk { owner: Owner::of(ctx), fd: fd.id, exclusive, start, end, pid: fl.pid };
        let exclusive = match (cmd, fl.ty) {
            (LkCmd::GetLk, LockType::Unlock) => return Err(Errno::EINVAL),
            (_, LockType::Unlock) => {
                self.table.update(fd.gfid, false, |il| {
                    let space = il.space(flock);
                    space.apply(&req(false), true);
                    space.grant_blocked();
                });
                return Ok(fl);
            }
            (_, ty) => ty == LockType::Write,
        };
        if cmd == LkCmd::GetLk {
            let probe = req(exclusive);
            let found = self.table.peek(fd.gfid, |il| {
                il.and_then(|il| if flock { &il.flock } else { &il.posix }.conflict(&probe).map(PosixLk::to_flock))
            });
            return Ok(found.unwrap_or(Flock { ty: LockType::Unlock, ..fl }));
        }
        let id = self.new_lock_id()?;
        let block = cmd == LkCmd::SetLkw;
        let attempt = self
            .table
            .update(fd.gfid, true, |il| il.space(flock).lock(id, req(exclusive), block))
            .ok_or(Errno::ENOMEM)?;
        self.settle(attempt, fd.gfid, WaitKind::Posix(flock), id).await.map(|()| fl)
    }

    /// `lk` with [`keys::LK_CANCEL`]: the owner's requests waiting for
    /// the range are failed (EINTR) and leave the queue; nothing granted
    /// changes.
    fn cancel_lk(&self, ctx: &CallCtx, fd: Fd, fl: Flock, flock: bool) -> Result<Flock, Errno> {
        let (start, end) = range(&fl)?;
        let owner = Owner::of(ctx);
        let n = self.table.update(fd.gfid, false, |il| il.space(flock).cancel_waiting(&owner, start, end)).unwrap_or(0);
        tracing::debug!(gfid = %fd.gfid, cancelled = n, "lk cancel");
        Ok(fl)
    }

    /// The inode a path-based lock fop names, looked up when only the entry
    /// is given.
    async fn resolve(&self, ctx: &CallCtx, loc: &Loc) -> Result<Gfid, Errno> {
        if !loc.gfid.is_null() {
            return Ok(loc.gfid);
        }
        if !loc.is_entry() {
            return Err(Errno::EINVAL);
        }
        match self.child.call(ctx.clone(), Request::new(Fop::Lookup { loc: loc.clone() })).await?.reply {
            Reply::Entry { iatt, .. } if !iatt.gfid.is_null() => Ok(iatt.gfid),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Runs one fop that needs this translator; returns the result and the
    /// inode whose lock counts the reply may carry.
    async fn handle(&self, ctx: CallCtx, req: Request) -> (FopResult, Gfid) {
        let empty = |r: Result<(), Errno>| r.map(|()| Response::from(Reply::Empty));
        let Request { fop, xdata } = req;
        match fop {
            Fop::Inodelk { domain, loc, cmd, lock } => match self.resolve(&ctx, &loc).await {
                Ok(g) => (empty(self.inodelk(&ctx, g, domain, cmd, lock).await), g),
                Err(e) => (Err(e), Gfid::NULL),
            },
            Fop::Finodelk { domain, fd, cmd, lock } => {
                (empty(self.inodelk(&ctx, fd.gfid, domain, cmd, lock).await), fd.gfid)
            }
            Fop::Entrylk { domain, loc, name, cmd, ty } => match self.resolve(&ctx, &loc).await {
                Ok(g) => (empty(self.entrylk(&ctx, g, domain, name, cmd, ty).await), g),
                Err(e) => (Err(e), Gfid::NULL),
            },
            Fop::Fentrylk { domain, fd, name, cmd, ty } => {
                (empty(self.entrylk(&ctx, fd.gfid, domain, name, cmd, ty).await), fd.gfid)
            }
            Fop::Lk { fd, lock, .. } if xdata.contains(keys::LK_CANCEL) => {
                (self.cancel_lk(&ctx, fd, lock, xdata.contains(keys::LK_FLOCK)).map(|f| Reply::Lock(f).into()), fd.gfid)
            }
            Fop::Lk { fd, cmd, lock } => {
                let flock = xdata.contains(keys::LK_FLOCK);
                (self.lk(&ctx, fd, cmd, lock, flock).await.map(|f| Reply::Lock(f).into()), fd.gfid)
            }
            fop => {
                match &fop {
                    Fop::Flush { fd } => {
                        let owner = Owner::of(&ctx);
                        self.table.update(fd.gfid, false, |il| {
                            if il.posix.release_owner(&owner) {
                                il.posix.grant_blocked();
                            }
                        });
                    }
                    Fop::Release { fd } => {
                        self.table.update(fd.gfid, false, |il| {
                            for space in il.spaces() {
                                if space.release_fd(&ctx.client_id, fd.id) {
                                    space.grant_blocked();
                                }
                            }
                        });
                    }
                    _ => {}
                }
                let mut gfid = fop.gfid();
                if gfid.is_null() {
                    gfid = fop.parent();
                }
                let lookup = fop.kind() == FopKind::Lookup;
                let res = self.child.call(ctx, Request { fop, xdata }).await;
                if let (true, Ok(Response { reply: Reply::Entry { iatt, .. }, .. })) = (lookup, &res)
                    && !iatt.gfid.is_null()
                {
                    gfid = iatt.gfid;
                }
                (res, gfid)
            }
        }
    }

    /// The brick is stopping: every request still waiting for a lock
    /// fails with ENOTCONN at once (the client sees the brick go), so the
    /// server's drain does not wait for grants that would never come.
    fn stopping(&self) {
        let mut failed = 0usize;
        self.table.update_all(|_, il| {
            for d in il.domains.values_mut() {
                failed += d.inodelk.blocked.len() + d.entrylk.blocked.len();
                queue::fail_waiters(&mut d.inodelk.blocked, |_| true, Errno::ENOTCONN);
                queue::fail_waiters(&mut d.entrylk.blocked, |_| true, Errno::ENOTCONN);
            }
            for space in il.spaces() {
                failed += space.blocked.len();
                queue::fail_waiters(&mut space.blocked, |_| true, Errno::ENOTCONN);
            }
        });
        if failed > 0 {
            tracing::info!(failed, "stopping: lock requests still waiting failed");
        }
    }

    fn client_gone(&self, client: &str) {
        let clock = self.clock();
        let mut upcalls = Vec::new();
        let mut released = 0usize;
        self.table.update_all(|gfid, il| {
            for (name, d) in il.domains.iter_mut() {
                let mut c = Contention::new(gfid, name, clock);
                let n = d.inodelk.purge_client(client, Errno::ENOTCONN);
                if n > 0 {
                    d.inodelk.grant_blocked(&mut c);
                }
                let m = d.entrylk.purge_client(client, Errno::ENOTCONN);
                if m > 0 {
                    d.entrylk.grant_blocked(&mut c);
                }
                released += n + m;
                upcalls.append(&mut c.out);
            }
            for space in il.spaces() {
                let p = space.purge_client(client, Errno::ENOTCONN);
                if p > 0 {
                    released += p;
                    space.grant_blocked();
                }
            }
        });
        if released > 0 {
            tracing::info!(client, released, "client gone: released its locks");
        }
        self.send(upcalls);
    }
}

/// The inclusive byte range of a lock; EINVAL if it overflows.
fn range(fl: &Flock) -> Result<(u64, u64), Errno> {
    match fl.len {
        0 => Ok((fl.start, u64::MAX)),
        n => fl.start.checked_add(n - 1).map(|end| (fl.start, end)).ok_or(Errno::EINVAL),
    }
}

fn check_domain(domain: &str) -> Result<(), Errno> {
    if domain.len() > MAX_DOMAIN { Err(Errno::EINVAL) } else { Ok(()) }
}

fn handles(kind: FopKind) -> bool {
    use FopKind::*;
    matches!(kind, Inodelk | Finodelk | Entrylk | Fentrylk | Lk | Flush | Release)
}

impl Xlator for Locks {
    fn call(&self, ctx: CallCtx, mut req: Request) -> FopFuture<'_> {
        let counts = CountRequest::take(&mut req.xdata);
        if counts.is_none() && !handles(req.fop.kind()) {
            return self.child.call(ctx, req);
        }
        Box::pin(async move {
            let (mut res, gfid) = self.handle(ctx, req).await;
            if let (Some(counts), Ok(resp)) = (&counts, &mut res)
                && !gfid.is_null()
            {
                self.table.peek(gfid, |il| counts.fill(il, &mut resp.xdata));
            }
            res
        })
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        match (from, event) {
            (EventFrom::Graph, Event::ClientGone { client_id }) => {
                self.client_gone(&client_id);
                None
            }
            (EventFrom::Graph, Event::ParentDown) => {
                self.stopping();
                None
            }
            (EventFrom::Graph, _) => None,
            (EventFrom::Child(_), e) => Some(e),
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        if ENFORCE_MANDATORY_LOCK.get(options) || MANDATORY_LOCKING.get(options) != "off" {
            return Err(ReconfigureError::Invalid("mandatory locking is not implemented".into()));
        }
        self.apply_options(options);
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let mut out = vec![
            ("locks".to_string(), self.table.total.load(Ordering::Relaxed).to_string()),
            ("max-locks".to_string(), self.max_locks.load(Ordering::Relaxed).to_string()),
        ];
        let mut inodes = 0usize;
        for shard in self.table.shards.iter() {
            for (gfid, il) in shard.lock().iter() {
                inodes += 1;
                if inodes > DUMP_INODES {
                    continue;
                }
                for (name, d) in &il.domains {
                    if d.inodelk.len() > 0 {
                        let g = d.inodelk.granted.iter();
                        let g = g.map(|g| (g.lock.exclusive, &g.lock.owner, span(g.lock.start, g.lock.end)));
                        out.push((format!("inodelk.{gfid}.{name}"), dump_line(g, d.inodelk.blocked.len())));
                    }
                    if d.entrylk.len() > 0 {
                        let g = d.entrylk.granted.iter();
                        let g =
                            g.map(|g| (g.lock.exclusive, &g.lock.owner, g.lock.name.clone().unwrap_or("<dir>".into())));
                        out.push((format!("entrylk.{gfid}.{name}"), dump_line(g, d.entrylk.blocked.len())));
                    }
                }
                for (kind, space) in [("posixlk", &il.posix), ("flock", &il.flock)] {
                    if space.len() == 0 {
                        continue;
                    }
                    let g = space.granted.iter().map(|l| (l.exclusive, &l.owner, span(l.start, l.end)));
                    out.push((format!("{kind}.{gfid}"), dump_line(g, space.blocked.len())));
                }
            }
        }
        out.insert(0, ("inodes".to_string(), inodes.to_string()));
        if inodes > DUMP_INODES {
            out.push(("truncated".to_string(), format!("{} more inodes not listed", inodes - DUMP_INODES)));
        }
        out
    }
}

fn span(start: u64, end: u64) -> String {
    if end == u64::MAX { format!("{start}-EOF") } else { format!("{start}-{end}") }
}

/// One dump value: the granted locks (type, owner, what) and how many wait.
fn dump_line<'a>(granted: impl Iterator<Item = (bool, &'a Owner, String)>, blocked: usize) -> String {
    let g: Vec<String> = granted
        .map(|(x, o, what)| format!("{} {what} by {}/{:#x}", if x { "W" } else { "R" }, o.client, o.lk_owner))
        .collect();
    format!("granted [{}] blocked {blocked}", g.join(", "))
}
