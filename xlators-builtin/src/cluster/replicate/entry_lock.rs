//! Directory delegation: the eager lock for entry transactions.
//!
//! Without it every create, mknod, mkdir, symlink, link, unlink and rename
//! takes an entrylk on its name on every child, sends the fop, and unlocks:
//! three round trips, each waited for. With `entry-eager-lock` on, the first
//! entry transaction in a directory takes an entrylk on the *whole*
//! directory (AFR's domain, no name) on every child and keeps it; later
//! entry transactions in that directory by this client join the held lock
//! and cost one round trip (the fop itself). Two transactions on the same
//! name never run at once, so every child applies them in the same order.
//!
//! Counters work as for any optimistic entry transaction: nothing is
//! written while every child succeeds; a fop that fails on some children
//! blames them on the directory at once (`blame`).
//!
//! The delegation ends (unlock) when:
//! - no entry transaction used it for `post-op-delay-secs`,
//! - another client (or another lock owner of this one, such as rmdir or
//!   heal) waits for an entrylk in the directory: the locks translator sends
//!   an entrylk contention upcall and the delegation is returned as soon as
//!   the transactions using it finish,
//! - a child came up since it was taken (its lock on that child may be gone),
//! - the graph goes away.
//!
//! A delegation is only taken when every child is up and locks; otherwise
//! entry transactions take their per-name locks as before.
//!
//! **Known names.** While the delegation is held nobody else can add or
//! remove a name in the directory, so once it is taken the directory is
//! listed in the background (if its entries are not stale on any child, it
//! has at most [`MAX_KNOWN`] names, and all delegated directories' names
//! together stay within [`MAX_KNOWN_TOTAL`], so that a client's memory is
//! bounded however many large directories it works in); from then on a
//! lookup of a name the listing and this client's own entry fops say is
//! absent is answered ENOENT without asking the bricks (the lookup before
//! every create). The listing (a stat and a readdir of one child, side by
//! side) starts when the delegation is taken; entry fops that run while it
//! is read are replayed onto it, and those that could be answered early
//! once the names are known (`async_dirops`) wait for it. The dump's
//! `entry-eager-lock.known-names` counts the names kept.

use std::collections::{HashMap, HashSet};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;
use xlfs_sdk::{CallCtx, Fop, Gfid, Iatt, Reply, Request, Response, SetAttr, Timespec};

use super::Inner;
use super::lock::{Held, Target};
use super::pending::{Kind, Mask, all};
use super::transaction::{Outcome, evaluate};

/// Most directories with a delegation (held or being taken) at once;
/// beyond, entry transactions take per-name locks.
pub const MAX_DIRS: usize = 4096;

/// Largest directory whose names are kept while delegated.
pub const MAX_KNOWN: usize = 16384;

/// Most names kept for all delegated directories together (about 100
/// bytes each); a directory whose names would go beyond is not known.
pub const MAX_KNOWN_TOTAL: usize = 262_144;

/// The name a fop on the delegated directory itself is joined under (no
/// entry name is empty).
pub const SELF: &str = "";

/// Gives `a` what a setattr sets, as `from` has it: mode, owner and times.
pub(super) fn set_by_setattr(a: &mut Iatt, from: &Iatt) {
    (a.mode, a.uid, a.gid, a.atime, a.mtime, a.ctime) =
        (from.mode, from.uid, from.gid, from.atime, from.mtime, from.ctime);
}

/// What an entry fop did to a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameChange {
    /// Added, with its inode when known.
    Added(Option<Name>),
    Removed,
}

/// What is known of a name in a delegated directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name {
    pub gfid: Gfid,
    pub dir: bool,
}

impl Name {
    fn of(iatt: &Iatt) -> Option<Name> {
        (!iatt.gfid.is_null()).then_some(Name { gfid: iatt.gfid, dir: iatt.mode & libc::S_IFMT == libc::S_IFDIR })
    }
}

/// The directory's names while the delegation is held.
enum Known {
    /// Not known (listing not started, failed, or too big).
    No,
    /// Being listed: the changes made meanwhile, to replay.
    Listing(Vec<(String, NameChange)>),
    /// The names, with their inodes where known, and the directory's own
    /// attributes (kept current by this client's entry fops).
    Yes(Names, Iatt),
}

/// The known names of one delegated directory, with their inodes where
/// known, counted in the translator's total ([`MAX_KNOWN_TOTAL`]) while
/// they are kept.
pub struct Names {
    map: HashMap<String, Option<Name>>,
    total: Arc<AtomicUsize>,
}

impl Names {
    fn new(total: &Arc<AtomicUsize>) -> Names {
        Names { map: HashMap::new(), total: total.clone() }
    }

    pub fn get(&self, name: &str) -> Option<&Option<Name>> {
        self.map.get(name)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn insert(&mut self, name: String, n: Option<Name>) {
        if self.map.insert(name, n).is_none() {
            self.total.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn remove(&mut self, name: &str) {
        if self.map.remove(name).is_some() {
            self.total.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn apply(&mut self, changes: impl IntoIterator<Item = (String, NameChange)>) {
        for (name, ch) in changes {
            match ch {
                NameChange::Added(n) => self.insert(name, n),
                NameChange::Removed => self.remove(&name),
            }
        }
    }

    /// Whether they may be kept: the directory within [`MAX_KNOWN`] and all
    /// directories' names within [`MAX_KNOWN_TOTAL`].
    fn within_bounds(&self) -> bool {
        self.map.len() <= MAX_KNOWN && self.total.load(Ordering::Relaxed) <= MAX_KNOWN_TOTAL
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        self.total.fetch_sub(self.map.len(), Ordering::Relaxed);
    }
}

/// An entry fop that may be answered before the bricks see it
/// (`async_dirops`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Early {
    /// Create or mkdir of a name known absent, as this inode.
    Add(Name),
    /// Unlink of a name known to be this non-directory.
    Remove,
    /// Rmdir of a name known to be this directory, itself known empty and
    /// retired ([`Inner::retire_dir`]).
    RemoveDir(Gfid),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Unlocked,
    /// Being locked or unlocked.
    Busy,
    Held,
}

struct State {
    phase: Phase,
    held: Option<Held>,
    /// `Inner::generation` when the lock was taken.
    generation: u64,
    /// Names with a transaction in flight.
    busy: HashSet<String>,
    in_flight: usize,
    /// Of those, transactions sent to the children before they are
    /// answered ([`Inner::delegated_txn`]): their changes to the names are
    /// known only once they finish.
    sync_in_flight: usize,
    idle_since: Instant,
    /// Return it once the transactions in flight finish.
    release: bool,
    timer: bool,
    known: Known,
    /// Bumped each time the delegation is taken (a listing started under
    /// an earlier one is dropped).
    epoch: u64,
}

impl State {
    /// Where the held lock is and its owner, for a ticket.
    fn held_lock(&self) -> Option<(Mask, CallCtx)> {
        self.held.as_ref().map(|h| (h.locked, h.ctx.clone()))
    }

    /// No delegation, nothing known.
    fn unlocked() -> State {
        State {
            phase: Phase::Unlocked,
            held: None,
            generation: 0,
            busy: HashSet::new(),
            in_flight: 0,
            sync_in_flight: 0,
            idle_since: Instant::now(),
            release: false,
            timer: false,
            known: Known::No,
            epoch: 0,
        }
    }
}

struct Dir {
    s: Mutex<State>,
    changed: Notify,
}

/// The delegations of one replicate translator.
#[derive(Default)]
pub struct Dirs {
    map: Mutex<HashMap<Gfid, Arc<Dir>>>,
    /// Delegations taken, used by a transaction, and returned.
    pub taken: AtomicU64,
    pub joined: AtomicU64,
    pub returned: AtomicU64,
    /// Listings that made a delegated directory's names known.
    pub listed: AtomicU64,
    /// Lookups answered ENOENT from the known names.
    pub absent_hits: AtomicU64,
    /// Names kept for all delegated directories.
    known_names: Arc<AtomicUsize>,
}

/// The names an entry fop that succeeded everywhere added or removed in
/// its directory (`names` as the transaction locked them: the entry, or
/// old then new for rename); `None` for a fop this does not know.
fn name_changes(fop: &Fop, names: &[String], made: Option<&Iatt>) -> Option<Vec<(String, NameChange)>> {
    use NameChange::*;
    let first = names.first()?.clone();
    Some(match fop {
        Fop::Create { .. } | Fop::Mknod { .. } | Fop::Mkdir { .. } | Fop::Symlink { .. } | Fop::Link { .. } => {
            vec![(first, Added(made.and_then(Name::of)))]
        }
        Fop::Unlink { .. } | Fop::Rmdir { .. } => vec![(first, Removed)],
        Fop::Rename { .. } => vec![(first, Removed), (names.get(1)?.clone(), Added(None))],
        _ => return None,
    })
}

impl Dirs {
    /// Directories with a delegation held now.
    pub fn held(&self) -> usize {
        self.map.lock().values().filter(|d| d.s.lock().phase == Phase::Held).count()
    }

    /// Names kept for all delegated directories now.
    pub fn known_names(&self) -> usize {
        self.known_names.load(Ordering::Relaxed)
    }
}

/// A transaction's place in a delegation. One dropped without being left
/// (its transaction panicked, or was dropped with the runtime) leaves the
/// delegation with the directory's names unknown, so that the delegation
/// can still be returned to a client that asks for it.
pub struct Ticket {
    dir: Arc<Dir>,
    /// The directory's gfid.
    at: Gfid,
    names: Vec<String>,
    locked: Mask,
    lk_ctx: CallCtx,
    owner: Weak<Inner>,
    left: bool,
    /// Joined by [`Inner::delegated_txn`] (counted in `sync_in_flight`).
    sync: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        if let Some(inner) = self.owner.upgrade() {
            tracing::warn!(volume = %inner.name, dir = %self.at,
                "a transaction under a directory delegation ended without finishing: its names are now unknown");
            inner.leave(&self.dir, &self.names, self.sync, None);
        }
    }
}

impl Inner {
    /// Runs an entry transaction whose names are all in `dir` under that
    /// directory's delegation. `None` when no delegation can be had (not
    /// every child up or lockable, too many directories): the caller takes
    /// per-name locks instead.
    pub async fn delegated_txn(
        self: &Arc<Self>,
        ctx: &CallCtx,
        dir: Gfid,
        names: Vec<String>,
        req: &Request,
    ) -> Option<(Outcome, Mask)> {
        let t = self.join_delegation(ctx, dir, names).await?;
        let (out, blamed) = self.fan_delegated(ctx, &t, req).await;
        // What the fop did to the directory's names: nothing when it
        // failed everywhere, unknown when it failed somewhere.
        let changes = if out.ok == 0 {
            Some(Vec::new())
        } else if out.failed != 0 || out.result.is_err() {
            None
        } else {
            let made = match &out.result {
                Ok(Response { reply: Reply::Entry { iatt, .. }, .. }) => Some(iatt),
                _ => None,
            };
            name_changes(&req.fop, &t.names, made)
        };
        self.leave_delegation(t, changes);
        Some((out, blamed))
    }

    /// Joins the held delegation of `dir` at once (no wait, no lock) for
    /// an entry fop on `name` that this client can answer itself: a create
    /// or mkdir of a name known absent, an unlink of a name known to be a
    /// non-directory, an rmdir of a name known to be a directory retired
    /// for it. The known names change now, as if the fop had run.
    /// Returns the ticket (keeping the delegation until the fop has run on
    /// the children), the directory's attributes before and after the
    /// change, and the inode an unlink removes. `None` when any of that is not so.
    pub fn join_early(
        self: &Arc<Self>,
        dir: Gfid,
        name: &str,
        what: Early,
    ) -> Option<(Ticket, Iatt, Iatt, Option<Gfid>)> {
        let (t, (before, after, removed)) = self.join_held(dir, name, |set, attr| {
            let before = *attr;
            let removed = match (what, set.get(name)) {
                (Early::Add(n), None) => {
                    set.insert(name.to_string(), Some(n));
                    if n.dir {
                        attr.nlink = attr.nlink.saturating_add(1);
                    }
                    None
                }
                (Early::Remove, Some(Some(n))) if !n.dir => {
                    let g = n.gfid;
                    set.remove(name);
                    Some(g)
                }
                (Early::RemoveDir(g), Some(Some(n))) if n.dir && n.gfid == g => {
                    set.remove(name);
                    attr.nlink = attr.nlink.saturating_sub(1);
                    Some(g)
                }
                _ => return None,
            };
            let now = xlfs_sdk::Timespec::now();
            (attr.mtime, attr.ctime) = (now, now);
            Some((before, *attr, removed))
        })?;
        Some((t, before, after, removed))
    }

    /// Joins the held delegation of directory `dir` at once for a setattr
    /// of the directory itself (`attr`, by a caller with `uid`, stamped
    /// `at`) whose outcome is known here ([`SetAttr::predictable`]): the
    /// directory's known attributes change now, as the bricks will change
    /// them (after those of the setattrs joined before). Returns the ticket
    /// and the attributes before and after. `None` when not so.
    pub fn join_early_setattr(
        self: &Arc<Self>,
        uid: u32,
        dir: Gfid,
        attr: &SetAttr,
        at: Timespec,
    ) -> Option<(Ticket, Iatt, Iatt)> {
        let (t, (before, after)) = self.join_held(dir, SELF, |_, a| {
            if !a.is_dir() || a.gfid != dir || !attr.predictable(uid, a) {
                return None;
            }
            let before = *a;
            attr.apply(a, at);
            // storage/posix keeps the stamp as the ctime.
            a.ctime = at;
            Some((before, *a))
        })?;
        Some((t, before, after))
    }

    /// Joins the held delegation of `dir` for a fop on `name` ([`SELF`]:
    /// the directory itself) if it is held with its names known, every
    /// child up, and nothing on `name` is in flight (a name's fops run one
    /// at a time; the directory's may queue); `f` changes the known
    /// names and attributes as the fop will (None: it cannot be told).
    fn join_held<R>(
        self: &Arc<Self>,
        dir: Gfid,
        name: &str,
        f: impl FnOnce(&mut Names, &mut Iatt) -> Option<R>,
    ) -> Option<(Ticket, R)> {
        if !self.cfg().entry_eager_lock || dir.is_null() {
            return None;
        }
        let d = self.dirs.map.lock().get(&dir).cloned()?;
        let mut s = d.s.lock();
        if !self.in_use(&s) || self.up_mask() != all(self.children.len()) || s.busy.contains(name) {
            return None;
        }
        let (held_locked, held_ctx) = s.held_lock()?;
        let Known::Yes(set, attr) = &mut s.known else { return None };
        let r = f(set, attr)?;
        if !set.within_bounds() {
            s.known = Known::No;
        }
        // Fops on the directory itself may be joined one after another
        // (its queue keeps them in order); a name takes one at a time.
        if name != SELF {
            s.busy.insert(name.to_string());
        }
        s.in_flight += 1;
        s.idle_since = Instant::now();
        self.dirs.joined.fetch_add(1, Ordering::Relaxed);
        let t = self.ticket(d.clone(), dir, vec![name.to_string()], held_locked, held_ctx);
        Some((t, r))
    }

    /// Leaves the delegation a ticket of [`Inner::join_early_setattr`]
    /// joined, once its setattr ran: `clean` when it did what was answered
    /// (else the directory's known names and attributes are forgotten).
    pub fn leave_early_setattr(self: &Arc<Self>, t: Ticket, clean: bool) {
        self.leave_delegation(t, clean.then(Vec::new));
    }

    /// A directory this client has just made (`gfid`, attributes `iatt`)
    /// is empty and nobody else knows it yet: its delegation is set up as
    /// held, with its names known (none), before the lock exists, so entry
    /// fops in it can be answered early at once. The lock itself is taken
    /// by [`Inner::take_promised`], which the caller queues right behind the
    /// mkdir (`async_dirops`); until then the returned ticket keeps the
    /// delegation. `None` when no delegation can be had.
    pub fn promise_delegation(self: &Arc<Self>, ctx: &CallCtx, gfid: Gfid, iatt: Iatt) -> Option<Ticket> {
        let n = self.children.len();
        if !self.cfg().entry_eager_lock || gfid.is_null() || self.up_mask() != all(n) {
            return None;
        }
        let lk_ctx = ctx.with_lk_owner(self.new_owner());
        let held = Held {
            ctx: lk_ctx.clone(),
            targets: vec![Target::Entry { dir: gfid, name: String::new() }],
            locked: all(n),
            inodelk_count: 0,
        };
        let d = Arc::new(Dir {
            s: Mutex::new(State {
                phase: Phase::Held,
                held: Some(held),
                generation: self.generation.load(Ordering::Acquire),
                in_flight: 1,
                known: Known::Yes(Names::new(&self.dirs.known_names), iatt),
                epoch: 1,
                ..State::unlocked()
            }),
            changed: Notify::new(),
        });
        {
            let mut map = self.dirs.map.lock();
            if map.len() >= MAX_DIRS {
                map.retain(|_, d| d.s.lock().phase != Phase::Unlocked);
            }
            if map.len() >= MAX_DIRS || map.contains_key(&gfid) {
                return None;
            }
            map.insert(gfid, d.clone());
        }
        self.dirs.taken.fetch_add(1, Ordering::Relaxed);
        Some(self.ticket(d, gfid, Vec::new(), all(n), lk_ctx))
    }

    /// Takes the lock of a delegation promised by
    /// [`Inner::promise_delegation`] (after its mkdir reached the
    /// children). If it cannot be had everywhere, the delegation is
    /// returned once the fops using it finish (they were answered already;
    /// one that then fails is reported as any queued fop).
    pub async fn take_promised(self: &Arc<Self>, t: Ticket) {
        let n = self.children.len();
        let target = Target::Entry { dir: t.at, name: String::new() };
        let got = self.lock(t.lk_ctx.clone(), vec![target], all(n), false).await;
        {
            let mut s = t.dir.s.lock();
            match got {
                Ok(h) => {
                    if h.locked != all(n) {
                        s.release = true;
                    }
                    s.held = Some(h);
                }
                Err(e) => {
                    tracing::warn!(volume = %self.name, dir = %t.at, "directory delegation not granted: {e}");
                    s.release = true;
                    if let Some(h) = s.held.as_mut() {
                        h.locked = 0;
                    }
                }
            }
        }
        self.leave_delegation(t, Some(Vec::new()));
    }

    /// A setattr of `dir` went to the bricks: the delegation's attributes
    /// of the directory take its mode, owner and times (inodes answered
    /// early take the directory's set-group-ID bit and group from them).
    pub fn note_dir_attr(&self, dir: Gfid, post: &Iatt) {
        let Some(d) = self.dirs.map.lock().get(&dir).cloned() else { return };
        let mut s = d.s.lock();
        if let Known::Yes(_, a) = &mut s.known {
            set_by_setattr(a, post);
        }
    }

    /// Runs an entry fop joined early ([`Inner::join_early`]) on the
    /// children under its ticket and leaves the delegation.
    pub async fn run_early(self: &Arc<Self>, ctx: &CallCtx, t: Ticket, req: &Request) -> (Outcome, Mask) {
        let (out, blamed) = self.fan_delegated(ctx, &t, req).await;
        // The names already say what the fop did; a failure anywhere makes
        // them unknown.
        let clean = out.failed == 0 && out.result.is_ok();
        self.leave_delegation(t, clean.then(Vec::new));
        (out, blamed)
    }

    /// Sends an entry fop under ticket `t` to the children the delegation
    /// holds and records on the directory what the changelog must know:
    /// the children that failed where others succeeded are blamed; a fop
    /// failed everywhere but lost on some connection is marked uncertain.
    /// Returns the outcome and the children blamed.
    async fn fan_delegated(&self, ctx: &CallCtx, t: &Ticket, req: &Request) -> (Outcome, Mask) {
        let mut out = evaluate(self.fan(ctx, t.locked, req).await);
        self.check_fop_quorum(&mut out);
        if out.ok != 0 && out.failed != 0 {
            self.blame(&t.lk_ctx, t.at, Kind::Entry, t.locked, out.failed).await;
        } else if out.ok == 0 && out.unknown != 0 {
            self.mark_uncertain(&t.lk_ctx, Kind::Entry, vec![t.at]).await;
        }
        let blamed = if out.ok == 0 { 0 } else { out.failed & all(self.children.len()) };
        (out, blamed)
    }

    async fn join_delegation(self: &Arc<Self>, ctx: &CallCtx, dir: Gfid, names: Vec<String>) -> Option<Ticket> {
        if !self.cfg().entry_eager_lock || dir.is_null() {
            return None;
        }
        let d = {
            let mut map = self.dirs.map.lock();
            if let Some(d) = map.get(&dir) {
                d.clone()
            } else {
                if map.len() >= MAX_DIRS {
                    map.retain(|_, d| d.s.lock().phase != Phase::Unlocked);
                    if map.len() >= MAX_DIRS {
                        return None;
                    }
                }
                let d = Arc::new(Dir { s: Mutex::new(State::unlocked()), changed: Notify::new() });
                map.insert(dir, d.clone());
                d
            }
        };
        let n = self.children.len();
        enum Step {
            Wait,
            Return(Option<Held>),
            Take,
        }
        loop {
            let notified = d.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let step = {
                let mut s = d.s.lock();
                match s.phase {
                    Phase::Held => {
                        let gen_now = self.generation.load(Ordering::Acquire);
                        if s.generation != gen_now || self.up_mask() != all(n) {
                            s.release = true;
                        }
                        if s.release {
                            if s.in_flight == 0 {
                                s.phase = Phase::Busy;
                                Step::Return(s.held.take())
                            } else {
                                Step::Wait
                            }
                        } else if names.iter().all(|nm| !s.busy.contains(nm)) {
                            let (locked, lk_ctx) = s.held_lock()?;
                            let t = self.sync_ticket(&mut s, d.clone(), dir, names.clone(), locked, lk_ctx);
                            s.busy.extend(names.iter().cloned());
                            self.dirs.joined.fetch_add(1, Ordering::Relaxed);
                            return Some(t);
                        } else {
                            Step::Wait
                        }
                    }
                    Phase::Busy => Step::Wait,
                    Phase::Unlocked => {
                        if self.up_mask() != all(n) {
                            return None;
                        }
                        s.phase = Phase::Busy;
                        s.release = false;
                        Step::Take
                    }
                }
            };
            match step {
                Step::Wait => notified.await,
                Step::Return(held) => self.return_delegation(&d, held).await,
                Step::Take => {
                    let generation = self.generation.load(Ordering::Acquire);
                    let lctx = ctx.with_lk_owner(self.new_owner());
                    let target = Target::Entry { dir, name: String::new() };
                    let got = match self.lock(lctx, vec![target], all(n), false).await {
                        Ok(h) if h.locked == all(n) => Some(h),
                        Ok(h) => {
                            self.unlock(&h).await;
                            None
                        }
                        Err(_) => None,
                    };
                    let ticket = {
                        let mut s = d.s.lock();
                        match got {
                            Some(h) => {
                                // The transaction that took the delegation
                                // always uses it, even if a contention upcall
                                // came meanwhile: every hand-over makes progress.
                                let t =
                                    self.sync_ticket(&mut s, d.clone(), dir, names.clone(), h.locked, h.ctx.clone());
                                s.phase = Phase::Held;
                                s.held = Some(h);
                                s.generation = generation;
                                s.idle_since = Instant::now();
                                s.busy.extend(names.iter().cloned());
                                s.epoch += 1;
                                s.known = Known::No;
                                self.dirs.taken.fetch_add(1, Ordering::Relaxed);
                                self.dirs.joined.fetch_add(1, Ordering::Relaxed);
                                self.ensure_delegation_timer(&d, &mut s);
                                self.start_listing(ctx, dir, &d, &mut s);
                                Some(t)
                            }
                            None => {
                                s.phase = Phase::Unlocked;
                                None
                            }
                        }
                    };
                    d.changed.notify_waiters();
                    return ticket;
                }
            }
        }
    }

    fn ticket(self: &Arc<Self>, dir: Arc<Dir>, at: Gfid, names: Vec<String>, locked: Mask, lk_ctx: CallCtx) -> Ticket {
        Ticket { dir, at, names, locked, lk_ctx, owner: Arc::downgrade(self), left: false, sync: false }
    }

    /// A ticket of [`Inner::delegated_txn`], counted in flight (and in
    /// `sync_in_flight`) in `s`.
    fn sync_ticket(
        self: &Arc<Self>,
        s: &mut State,
        dir: Arc<Dir>,
        at: Gfid,
        names: Vec<String>,
        locked: Mask,
        lk_ctx: CallCtx,
    ) -> Ticket {
        s.in_flight += 1;
        s.sync_in_flight += 1;
        let mut t = self.ticket(dir, at, names, locked, lk_ctx);
        t.sync = true;
        t
    }

    fn leave_delegation(self: &Arc<Self>, mut t: Ticket, changes: Option<Vec<(String, NameChange)>>) {
        t.left = true;
        self.leave(&t.dir, &t.names, t.sync, changes);
    }

    /// A ticket's transaction is done with the delegation of `d`, having
    /// made `changes` to its names (None: unknown).
    fn leave(self: &Arc<Self>, d: &Arc<Dir>, names: &[String], sync: bool, changes: Option<Vec<(String, NameChange)>>) {
        {
            let mut s = d.s.lock();
            if sync {
                s.sync_in_flight -= 1;
            }
            for nm in names {
                s.busy.remove(nm);
            }
            match (changes, &mut s.known) {
                (None, k) => *k = Known::No,
                (Some(c), Known::Listing(log)) => log.extend(c),
                (Some(c), Known::Yes(set, attr)) => {
                    let (added, now) = (!c.is_empty(), xlfs_sdk::Timespec::now());
                    set.apply(c);
                    if added {
                        (attr.mtime, attr.ctime) = (now, now);
                    }
                    if !set.within_bounds() {
                        s.known = Known::No;
                    }
                }
                (Some(_), Known::No) => {}
            }
            s.in_flight -= 1;
            s.idle_since = Instant::now();
            if s.release && s.in_flight == 0 && s.phase == Phase::Held {
                self.spawn_return(d, &mut s);
            } else {
                self.ensure_delegation_timer(d, &mut s);
            }
        }
        d.changed.notify_waiters();
    }

    /// Lists the directory in the background, if its entries are not
    /// stale anywhere, to know its names while the delegation is held.
    fn start_listing(self: &Arc<Self>, ctx: &CallCtx, dir: Gfid, d: &Arc<Dir>, s: &mut State) {
        let stale = self.inodes.get(&dir).map_or(0, |st| st.s.lock().stale[Kind::Entry as usize]);
        if stale != 0 {
            return;
        }
        let Some(h) = self.handle() else { return };
        let Some(i) = (0..self.children.len()).find(|i| self.up_mask() & super::pending::bit(*i) != 0) else { return };
        s.known = Known::Listing(Vec::new());
        let (me, d2, epoch) = (self.clone(), d.clone(), s.epoch);
        let lctx = CallCtx::root(ctx.client_id.clone());
        h.spawn(async move {
            // The directory's attributes and its names, read side by side:
            // the entry fops that run meanwhile are replayed onto both.
            let (attr, listed) = tokio::join!(
                me.on(i, &lctx, Fop::Stat { loc: xlfs_sdk::Loc::gfid(dir) }),
                me.list_dir(&lctx, i, dir, MAX_KNOWN)
            );
            let attr = match attr {
                Ok(Response { reply: Reply::Attr(a), .. }) => Some(a),
                _ => None,
            };
            me.finish_listing(&d2, epoch, attr, listed.ok());
            // Fops waiting for the names ([`Inner::wait_listing`]) go on.
            d2.changed.notify_waiters();
        });
    }

    /// Keeps the names a listing read (with the changes made meanwhile
    /// replayed onto them), unless the delegation changed hands since it
    /// started (`epoch`) or the listing failed.
    fn finish_listing(&self, d: &Dir, epoch: u64, attr: Option<Iatt>, listed: Option<Vec<xlfs_sdk::DirEntry>>) {
        let mut s = d.s.lock();
        if s.epoch != epoch || s.phase != Phase::Held {
            return;
        }
        let log = match std::mem::replace(&mut s.known, Known::No) {
            Known::Listing(log) => log,
            _ => return,
        };
        if let (Some(entries), Some(mut attr)) = (listed, attr) {
            let mut set = Names::new(&self.dirs.known_names);
            set.apply(entries.into_iter().map(|e| (e.name, NameChange::Added(Name::of(&e.iatt)))));
            if !log.is_empty() {
                let now = xlfs_sdk::Timespec::now();
                (attr.mtime, attr.ctime) = (now, now);
            }
            set.apply(log);
            if set.within_bounds() {
                self.dirs.listed.fetch_add(1, Ordering::Relaxed);
                s.known = Known::Yes(set, attr);
            }
        }
    }

    /// Waits while the names of `dir`'s delegation are being listed (it
    /// was taken a moment ago by another fop): an entry fop that can be
    /// answered early once they are known waits for the listing (two
    /// round trips side by side, once) rather than run synchronously (a
    /// round trip each, one after another: `rm -r` unlinked about five
    /// files of each directory so while its listing ran).
    pub async fn wait_listing(&self, dir: Gfid) {
        let Some(d) = self.dirs.map.lock().get(&dir).cloned() else { return };
        loop {
            let notified = d.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !matches!(d.s.lock().known, Known::Listing(_)) {
                return;
            }
            notified.await;
        }
    }

    /// True when `name` is known absent from `dir`: this client holds the
    /// directory's delegation and its listing does not have the name.
    pub fn known_absent(&self, dir: Gfid, name: &str) -> bool {
        let absent = self.with_known(dir, |set| (!set.contains_key(name)).then_some(())).is_some();
        if absent {
            self.dirs.absent_hits.fetch_add(1, Ordering::Relaxed);
        }
        absent
    }

    /// The directory named `name` in `dir`, when this client holds the
    /// delegation of `dir` with its names known and knows that name as a
    /// directory.
    pub fn known_subdir(&self, dir: Gfid, name: &str) -> Option<Gfid> {
        self.with_known(dir, |set| match set.get(name) {
            Some(Some(n)) if n.dir && !n.gfid.is_null() => Some(n.gfid),
            _ => None,
        })
    }

    /// Retires this client's delegation of directory `dir` for its rmdir:
    /// held, and either `early` (an rmdir answered here: its names are
    /// known and there are none, every unlink in it answered, and no
    /// transaction that may still add one is running there) or with
    /// nothing running there at all (an rmdir sent now, whose outcome the
    /// bricks tell). No fop joins the delegation from then on (a create in
    /// the directory takes the usual path, which fails as the bricks say
    /// once the rmdir has run); the returned ticket keeps its lock, the
    /// whole-directory entrylk an rmdir takes, until the rmdir has run,
    /// and leaving it ([`Inner::leave_retired`]) returns the delegation.
    pub fn retire_dir(self: &Arc<Self>, dir: Gfid, early: bool) -> Option<Ticket> {
        if !self.cfg().entry_eager_lock || dir.is_null() {
            return None;
        }
        let d = self.dirs.map.lock().get(&dir).cloned()?;
        let mut s = d.s.lock();
        let quiet = if early {
            s.sync_in_flight == 0 && matches!(&s.known, Known::Yes(set, _) if set.is_empty())
        } else {
            s.in_flight == 0
        };
        if !quiet || !self.in_use(&s) || self.up_mask() != all(self.children.len()) {
            return None;
        }
        let (locked, lk_ctx) = s.held_lock()?;
        s.release = true;
        s.known = Known::No;
        s.in_flight += 1;
        self.dirs.joined.fetch_add(1, Ordering::Relaxed);
        drop(s);
        Some(self.ticket(d, dir, Vec::new(), locked, lk_ctx))
    }

    /// Leaves a ticket of [`Inner::retire_dir`]: the delegation is
    /// returned once nothing else uses it.
    pub fn leave_retired(self: &Arc<Self>, t: Ticket) {
        self.leave_delegation(t, None);
    }

    /// True when this client holds the delegation of `dir` with its names
    /// and attributes known (a fop on the directory may be answered early).
    pub fn knows_dir(&self, dir: Gfid) -> bool {
        self.with_known(dir, |_| Some(())).is_some()
    }

    /// `f` of the known names of `dir` if its delegation is held and they
    /// are known; None otherwise.
    fn with_known<R>(&self, dir: Gfid, f: impl FnOnce(&Names) -> Option<R>) -> Option<R> {
        let d = self.dirs.map.lock().get(&dir).cloned()?;
        let s = d.s.lock();
        match &s.known {
            Known::Yes(set, _) if self.in_use(&s) => f(set),
            _ => None,
        }
    }

    /// Whether a delegation may be joined: held, not being returned, and
    /// taken under the current graph generation.
    fn in_use(&self, s: &State) -> bool {
        s.phase == Phase::Held && !s.release && s.generation == self.generation.load(Ordering::Acquire)
    }

    /// Unlocks a delegation taken out of its state (phase Busy) and marks
    /// it unlocked.
    async fn return_delegation(&self, d: &Arc<Dir>, held: Option<Held>) {
        if let Some(h) = held {
            self.unlock(&h).await;
            self.dirs.returned.fetch_add(1, Ordering::Relaxed);
        }
        {
            let mut s = d.s.lock();
            s.phase = Phase::Unlocked;
            s.release = false;
            s.known = Known::No;
        }
        d.changed.notify_waiters();
    }

    /// Returns the delegation in the background (called with its state
    /// locked, phase Held, nothing in flight).
    fn spawn_return(self: &Arc<Self>, d: &Arc<Dir>, s: &mut State) {
        let Some(h) = self.handle() else { return };
        let held = s.held.take();
        s.phase = Phase::Busy;
        let (me, d2) = (self.clone(), d.clone());
        h.spawn(async move { me.return_delegation(&d2, held).await });
    }

    fn ensure_delegation_timer(self: &Arc<Self>, d: &Arc<Dir>, s: &mut State) {
        if s.timer || s.phase != Phase::Held {
            return;
        }
        let Some(h) = self.handle() else { return };
        s.timer = true;
        let (me, d2) = (self.clone(), d.clone());
        h.spawn(async move { me.delegation_timer(d2).await });
    }

    /// Returns the delegation once it has been idle for post-op-delay-secs.
    async fn delegation_timer(self: Arc<Self>, d: Arc<Dir>) {
        loop {
            let delay = self.cfg().post_op_delay;
            let next = {
                let mut s = d.s.lock();
                if s.phase != Phase::Held {
                    s.timer = false;
                    return;
                }
                let now = Instant::now();
                let idle_end = s.idle_since + delay;
                if s.in_flight == 0 && (s.release || now >= idle_end) {
                    s.timer = false;
                    s.phase = Phase::Busy;
                    Err(s.held.take())
                } else {
                    Ok(if s.in_flight > 0 { now + delay.max(Duration::from_millis(10)) } else { idle_end })
                }
            };
            match next {
                Ok(wake) => tokio::time::sleep_until(tokio::time::Instant::from_std(wake)).await,
                Err(held) => {
                    // The entry stays in the map (a joiner may hold it);
                    // unlocked entries are pruned when the map is full.
                    self.return_delegation(&d, held).await;
                    return;
                }
            }
        }
    }

    /// Another lock owner waits for an entrylk in `dir`: return the
    /// delegation as soon as nothing uses it.
    pub fn entry_contention(self: &Arc<Self>, dir: Gfid) {
        let Some(d) = self.dirs.map.lock().get(&dir).cloned() else { return };
        let mut s = d.s.lock();
        match s.phase {
            Phase::Unlocked => {}
            // Being taken: returned after the transaction taking it.
            Phase::Busy => s.release = true,
            Phase::Held => {
                s.release = true;
                if s.in_flight == 0 {
                    self.spawn_return(&d, &mut s);
                }
            }
        }
    }

    /// Returns this client's delegation of `dir`, if it holds one, and
    /// waits until it is returned: a transaction about to take per-name
    /// locks there (rmdir, a rename across directories) would otherwise
    /// wait for the contention upcall.
    pub async fn surrender_delegation(self: &Arc<Self>, dir: Gfid) {
        let Some(d) = self.dirs.map.lock().get(&dir).cloned() else { return };
        loop {
            let notified = d.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let ret = {
                let mut s = d.s.lock();
                match s.phase {
                    Phase::Unlocked => return,
                    Phase::Held if s.in_flight == 0 => {
                        s.phase = Phase::Busy;
                        Some(s.held.take())
                    }
                    Phase::Held => {
                        s.release = true;
                        None
                    }
                    Phase::Busy => None,
                }
            };
            match ret {
                Some(held) => {
                    self.return_delegation(&d, held).await;
                    return;
                }
                None => notified.await,
            }
        }
    }

    /// Returns every delegation not in use (graph going away).
    pub fn release_delegations(self: &Arc<Self>) {
        let dirs: Vec<Arc<Dir>> = self.dirs.map.lock().values().cloned().collect();
        for d in dirs {
            let mut s = d.s.lock();
            if s.phase == Phase::Held {
                s.release = true;
                if s.in_flight == 0 {
                    self.spawn_return(&d, &mut s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_of_all_directories_are_bounded_together() {
        let total = Arc::new(AtomicUsize::new(0));
        let full = |tag: usize| {
            let mut set = Names::new(&total);
            set.apply((0..MAX_KNOWN).map(|k| (format!("{tag}.{k}"), NameChange::Added(None))));
            set
        };
        let mut a = full(0);
        assert!(a.within_bounds());
        a.insert("one too many".into(), None);
        assert!(!a.within_bounds(), "a directory beyond MAX_KNOWN");
        a.remove("one too many");
        a.insert("0.0".into(), None);
        assert_eq!(total.load(Ordering::Relaxed), MAX_KNOWN, "a name known again is counted once");
        let mut sets: Vec<Names> = (1..MAX_KNOWN_TOTAL / MAX_KNOWN).map(full).collect();
        assert!(a.within_bounds() && sets.iter().all(Names::within_bounds), "exactly at the total");
        let mut b = Names::new(&total);
        b.insert("over".into(), None);
        assert!(!b.within_bounds() && !a.within_bounds(), "beyond the total, whichever directory asks");
        drop(a);
        assert_eq!(
            total.load(Ordering::Relaxed),
            MAX_KNOWN_TOTAL - MAX_KNOWN + 1,
            "a dropped set gives its names back"
        );
        assert!(b.within_bounds());
        sets.clear();
        drop(b);
        assert_eq!(total.load(Ordering::Relaxed), 0);
    }
}
