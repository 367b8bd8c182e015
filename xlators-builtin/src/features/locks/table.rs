//! The lock table (GlusterFS's pl_inode_t and its domain lists): who holds
//! a lock ([`Owner`]), inodelks and entrylks per domain, the locks of one
//! inode, and the sharded gfid -> locks map that keeps an entry only while
//! it holds locks.

use super::*;

/// Who holds a lock: the client and its lock owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Owner {
    pub(super) client: Arc<str>,
    pub(super) lk_owner: u64,
}

impl Owner {
    pub(super) fn of(ctx: &CallCtx) -> Owner {
        Owner { client: ctx.client_id.clone(), lk_owner: ctx.lk_owner }
    }
}

/// An inodelk.
pub(super) struct InodeLk {
    pub(super) owner: Owner,
    pub(super) exclusive: bool,
    pub(super) start: u64,
    pub(super) end: u64,
}

impl DomainLock for InodeLk {
    fn owner(&self) -> &Owner {
        &self.owner
    }
    fn conflicts(&self, o: &Self) -> bool {
        self.start <= o.end && o.start <= self.end && (self.exclusive || o.exclusive)
    }
    fn contention(&self, gfid: Gfid, domain: &str) -> Upcall {
        Upcall::InodelkContention {
            gfid,
            domain: domain.to_owned(),
            holder_client: self.owner.client.to_string(),
            holder_owner: self.owner.lk_owner,
        }
    }
}

/// An entrylk; `name: None` locks the whole directory.
pub(super) struct EntryLk {
    pub(super) owner: Owner,
    pub(super) exclusive: bool,
    pub(super) name: Option<String>,
}

impl DomainLock for EntryLk {
    fn owner(&self) -> &Owner {
        &self.owner
    }
    fn conflicts(&self, o: &Self) -> bool {
        let names = match (&self.name, &o.name) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        names && (self.exclusive || o.exclusive)
    }
    fn contention(&self, gfid: Gfid, domain: &str) -> Upcall {
        Upcall::EntrylkContention {
            gfid,
            domain: domain.to_owned(),
            name: self.name.clone().unwrap_or_default(),
            holder_client: self.owner.client.to_string(),
        }
    }
}

/// The inodelks and entrylks of one domain on one inode.
#[derive(Default)]
pub(super) struct DomainLocks {
    pub(super) inodelk: Queue<InodeLk>,
    pub(super) entrylk: Queue<EntryLk>,
}

/// Picks a lock kind's queue out of a domain.
pub(super) trait Kind: DomainLock + Sized {
    fn queue(d: &mut DomainLocks) -> &mut Queue<Self>;
    fn wait_kind(domain: String) -> WaitKind;
}

impl Kind for InodeLk {
    fn queue(d: &mut DomainLocks) -> &mut Queue<Self> {
        &mut d.inodelk
    }
    fn wait_kind(domain: String) -> WaitKind {
        WaitKind::Inodelk(domain)
    }
}

impl Kind for EntryLk {
    fn queue(d: &mut DomainLocks) -> &mut Queue<Self> {
        &mut d.entrylk
    }
    fn wait_kind(domain: String) -> WaitKind {
        WaitKind::Entrylk(domain)
    }
}

/// Every lock on one inode.
#[derive(Default)]
pub(super) struct InodeLocks {
    pub(super) domains: HashMap<String, DomainLocks>,
    pub(super) posix: PosixLocks,
    /// flock(2) locks: POSIX locks' rules, in a space of their own (a
    /// flock never conflicts with an fcntl lock, as on a local file system).
    pub(super) flock: PosixLocks,
}

impl InodeLocks {
    pub(super) fn count(&self) -> usize {
        self.domains.values().map(|d| d.inodelk.len() + d.entrylk.len()).sum::<usize>()
            + self.posix.len()
            + self.flock.len()
    }

    /// The POSIX lock space, or the flock one.
    pub(super) fn space(&mut self, flock: bool) -> &mut PosixLocks {
        if flock { &mut self.flock } else { &mut self.posix }
    }

    /// Both record-lock spaces.
    pub(super) fn spaces(&mut self) -> [&mut PosixLocks; 2] {
        [&mut self.posix, &mut self.flock]
    }

    pub(super) fn domain(&mut self, name: &str) -> &mut DomainLocks {
        self.domains.entry(name.to_owned()).or_default()
    }

    pub(super) fn prune(&mut self) {
        self.domains.retain(|_, d| d.inodelk.len() + d.entrylk.len() > 0);
    }

    /// Locks in one domain (or all) of the kind `pick` selects.
    pub(super) fn count_in(&self, domain: Option<&str>, pick: impl Fn(&DomainLocks) -> usize) -> u64 {
        let n: usize = match domain {
            Some(d) => self.domains.get(d).map_or(0, &pick),
            None => self.domains.values().map(&pick).sum(),
        };
        n as u64
    }
}

pub(super) const SHARDS: usize = 32;

/// Gfid -> lock state, sharded; entries exist only while they hold locks.
pub(super) struct Table {
    pub(super) shards: Box<[Mutex<HashMap<Gfid, InodeLocks>>]>,
    /// Granted plus waiting locks in all shards.
    pub(super) total: AtomicUsize,
}

impl Table {
    pub(super) fn new() -> Table {
        Table { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(), total: AtomicUsize::new(0) }
    }

    pub(super) fn shard(&self, gfid: &Gfid) -> &Mutex<HashMap<Gfid, InodeLocks>> {
        let h = gfid.0.iter().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(*b as usize));
        &self.shards[h % SHARDS]
    }

    pub(super) fn account(&self, before: usize, after: usize) {
        if after > before {
            self.total.fetch_add(after - before, Ordering::Relaxed);
        } else if before > after {
            self.total.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// Runs `f` on the inode's state (created if `create`; `None` if absent
    /// and not created), then frees the state if it holds no locks.
    pub(super) fn update<R>(&self, gfid: Gfid, create: bool, f: impl FnOnce(&mut InodeLocks) -> R) -> Option<R> {
        let mut map = self.shard(&gfid).lock();
        let il = if create { map.entry(gfid).or_default() } else { map.get_mut(&gfid)? };
        let before = il.count();
        let r = f(il);
        il.prune();
        let after = il.count();
        if after == 0 {
            map.remove(&gfid);
        }
        self.account(before, after);
        Some(r)
    }

    /// Runs `f` on every inode's state, freeing what becomes empty.
    pub(super) fn update_all(&self, mut f: impl FnMut(Gfid, &mut InodeLocks)) {
        for shard in self.shards.iter() {
            let mut map = shard.lock();
            let (mut before, mut after) = (0, 0);
            map.retain(|gfid, il| {
                before += il.count();
                f(*gfid, il);
                il.prune();
                let n = il.count();
                after += n;
                n > 0
            });
            self.account(before, after);
        }
    }

    pub(super) fn peek<R>(&self, gfid: Gfid, f: impl FnOnce(Option<&InodeLocks>) -> R) -> R {
        f(self.shard(&gfid).lock().get(&gfid))
    }
}
