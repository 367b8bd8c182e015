//! The cache itself (GlusterFS's md-cache inode ctx and nl-cache): per
//! gfid attributes and xattrs, dentries (negative ones too), whole-listing
//! marks, epochs that keep a stale reply from refilling what an
//! invalidation dropped, and the bounds and evictions.

use super::*;

pub(super) struct XattrVal {
    pub(super) name: Box<str>,
    /// None: known absent.
    pub(super) value: Option<Bytes>,
    pub(super) at: u64,
}

impl XattrVal {
    pub(super) fn bytes(&self) -> usize {
        self.name.len() + self.value.as_ref().map_or(0, Bytes::len)
    }
}

#[derive(Default)]
pub(super) struct Ino {
    pub(super) attr: Option<(Iatt, u64)>,
    pub(super) xattrs: Vec<XattrVal>,
    /// Generation of the last change or invalidation seen.
    pub(super) epoch: u64,
    /// Place in the eviction order.
    pub(super) tick: u64,
}

impl Ino {
    pub(super) fn xattr_bytes(&self) -> usize {
        self.xattrs.iter().map(XattrVal::bytes).sum()
    }
}

pub(super) struct Dentry {
    /// None: the name is known not to exist.
    pub(super) gfid: Option<Gfid>,
    pub(super) at: u64,
    pub(super) tick: u64,
}

#[derive(Default, Clone, Copy)]
pub(super) struct Stats {
    pub(super) stat_hits: u64,
    pub(super) stat_misses: u64,
    pub(super) lookup_hits: u64,
    pub(super) lookup_misses: u64,
    pub(super) negative_hits: u64,
    pub(super) getxattr_hits: u64,
    pub(super) absent_hits: u64,
    pub(super) getxattr_misses: u64,
    pub(super) statfs_hits: u64,
    pub(super) statfs_misses: u64,
    pub(super) invalidations: u64,
    pub(super) evictions: u64,
    pub(super) stale_fills: u64,
    pub(super) dirs_prefetched: u64,
}

pub(super) struct State {
    pub(super) cfg: Config,
    pub(super) inodes: HashMap<Gfid, Ino>,
    /// (tick, gfid) in fill order; entries whose tick moved on are stale.
    pub(super) inode_order: VecDeque<(u64, Gfid)>,
    pub(super) dirs: HashMap<Gfid, HashMap<String, Dentry>>,
    pub(super) dentries: usize,
    pub(super) dentry_order: VecDeque<(u64, Gfid, String)>,
    pub(super) tick: u64,
    pub(super) epoch: u64,
    /// Generations of inodes not in the table (evicted, forgotten, or
    /// invalidated while absent), the most recent [`RECENT_ABSENT`] of them.
    pub(super) recent: HashMap<Gfid, u64>,
    pub(super) recent_order: VecDeque<Gfid>,
    /// The latest generation among absent inodes no longer in `recent`
    /// (and of a flush): a fill of an inode in neither, from a fop wound
    /// before it, is dropped.
    pub(super) lost_epoch: u64,
    pub(super) xattr_bytes: usize,
    pub(super) statfs: Option<(Statvfs, u64)>,
    pub(super) stats: Stats,
    /// Directories read whole by `dir-prefetch`: when it started, and
    /// whether every name of the directory is in `dirs` (none evicted or
    /// dropped by an invalidation since).
    pub(super) listed: HashMap<Gfid, (u64, bool)>,
    /// Directories being read whole now: lookups there wait for the read
    /// (bounded by [`PREFETCH_WAIT`]) rather than ask the bricks meanwhile.
    pub(super) prefetching: HashMap<Gfid, Arc<tokio::sync::Notify>>,
}

pub(super) fn same_attrs(a: &Iatt, b: &Iatt) -> bool {
    (a.gfid, a.size, a.mtime, a.ctime, a.mode, a.nlink, a.uid, a.gid)
        == (b.gfid, b.size, b.mtime, b.ctime, b.mode, b.nlink, b.uid, b.gid)
}

pub(super) fn is_dot(name: &str) -> bool {
    name == "." || name == ".."
}

pub(super) fn xattr_value(v: &Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b.clone()),
        Value::Str(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
        _ => None,
    }
}

pub(super) fn is_xattr_name(k: &str) -> bool {
    ["trusted.", "user.", "security.", "system."].iter().any(|p| k.starts_with(p))
}

impl State {
    pub(super) fn new(cfg: Config) -> State {
        State {
            cfg,
            inodes: HashMap::new(),
            inode_order: VecDeque::new(),
            dirs: HashMap::new(),
            dentries: 0,
            dentry_order: VecDeque::new(),
            tick: 0,
            epoch: 0,
            recent: HashMap::new(),
            recent_order: VecDeque::new(),
            lost_epoch: 0,
            listed: HashMap::new(),
            prefetching: HashMap::new(),
            xattr_bytes: 0,
            statfs: None,
            stats: Stats::default(),
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.cfg.timeout > 0
    }

    pub(super) fn nl_enabled(&self) -> bool {
        self.cfg.nl_timeout > 0
    }

    pub(super) fn fresh(&self, at: u64, now: u64) -> bool {
        now.saturating_sub(at) < self.cfg.timeout
    }

    pub(super) fn next_epoch(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }

    pub(super) fn attr(&self, g: Gfid, now: u64) -> Option<Iatt> {
        let (a, at) = self.inodes.get(&g)?.attr?;
        self.fresh(at, now).then_some(a)
    }

    pub(super) fn xattr(&self, g: Gfid, name: &str, now: u64) -> Option<Option<Bytes>> {
        let x = self.inodes.get(&g)?.xattrs.iter().find(|x| &*x.name == name)?;
        self.fresh(x.at, now).then(|| x.value.clone())
    }

    /// May a reply to a fop wound at generation `start` fill `g`?
    pub(super) fn may_fill(&mut self, g: Gfid, start: u64) -> bool {
        let ok = match self.inodes.get(&g) {
            Some(i) => i.epoch <= start,
            None => self.absent_epoch(g) <= start,
        };
        if !ok {
            self.stats.stale_fills += 1;
        }
        ok
    }

    /// The entry of `g`, made if absent (evicting the least recently
    /// filled when full), moved to the back of the eviction order.
    pub(super) fn ino_mut(&mut self, g: Gfid) -> &mut Ino {
        if !self.inodes.contains_key(&g) {
            while self.inodes.len() >= self.cfg.max_entries && self.evict_inode() {}
        }
        self.tick += 1;
        let tick = self.tick;
        self.inode_order.push_back((tick, g));
        if self.inode_order.len() > 2 * self.cfg.max_entries + 64 {
            let inodes = &self.inodes;
            self.inode_order.retain(|(t, g)| inodes.get(g).is_some_and(|i| i.tick == *t));
        }
        let epoch = self.absent_epoch(g);
        if self.recent.remove(&g).is_some() {
            self.recent_order.retain(|r| *r != g);
        }
        let i = self.inodes.entry(g).or_insert_with(|| Ino { epoch, ..Ino::default() });
        i.tick = tick;
        i
    }

    pub(super) fn evict_inode(&mut self) -> bool {
        while let Some((t, g)) = self.inode_order.pop_front() {
            if self.inodes.get(&g).is_some_and(|i| i.tick == t) {
                self.remove_inode(g);
                self.stats.evictions += 1;
                return true;
            }
        }
        false
    }

    pub(super) fn remove_inode(&mut self, g: Gfid) {
        if let Some(i) = self.inodes.remove(&g) {
            self.xattr_bytes = self.xattr_bytes.saturating_sub(i.xattr_bytes());
            self.forgot(g, i.epoch);
        }
    }

    /// The generation of an inode not in the table.
    pub(super) fn absent_epoch(&self, g: Gfid) -> u64 {
        self.recent.get(&g).map_or(self.lost_epoch, |e| (*e).max(self.lost_epoch))
    }

    /// Remembers the generation of an inode leaving (or not in) the table.
    pub(super) fn forgot(&mut self, g: Gfid, epoch: u64) {
        if epoch <= self.lost_epoch {
            return;
        }
        if self.recent.insert(g, epoch).is_none() {
            self.recent_order.push_back(g);
        }
        while self.recent_order.len() > RECENT_ABSENT {
            if let Some(old) = self.recent_order.pop_front()
                && let Some(e) = self.recent.remove(&old)
            {
                self.lost_epoch = self.lost_epoch.max(e);
            }
        }
    }

    /// Attributes from a read reply.
    pub(super) fn fill_attr(&mut self, g: Gfid, iatt: Iatt, start: u64, now: u64) {
        if g.is_null() || iatt.gfid != g || !self.enabled() {
            return;
        }
        if !self.may_fill(g, start) {
            tracing::trace!(gfid = %g, size = iatt.size, start, "stale fill dropped");
            return;
        }
        tracing::trace!(gfid = %g, size = iatt.size, start, "filled");
        self.ino_mut(g).attr = Some((iatt, now));
    }

    /// Attributes after a change made through this client: kept only if
    /// the cached ones are `pre` (or, without `pre`, if none are cached);
    /// otherwise another change raced this one and they are dropped.
    pub(super) fn update_attr(&mut self, g: Gfid, pre: Option<Iatt>, post: Iatt, now: u64) {
        if g.is_null() || !self.enabled() {
            return;
        }
        let epoch = self.next_epoch();
        let i = self.ino_mut(g);
        i.epoch = epoch;
        // A reply without real attributes (a translator below that answered
        // early, e.g. write-behind) says nothing.
        let keep = post.gfid == g
            && match (&i.attr, pre) {
                (None, _) => true,
                (Some((c, _)), Some(p)) => same_attrs(c, &p),
                (Some(_), None) => false,
            };
        i.attr = keep.then_some((post, now));
    }

    /// Attributes after a change made through this client, given without
    /// the attributes before (a directory after a create): kept unless the
    /// cached ones are newer (changed later, by a reply that overtook this).
    pub(super) fn advance_attr(&mut self, g: Gfid, post: Iatt, now: u64) {
        let pre = match self.inodes.get(&g).and_then(|i| i.attr) {
            Some((c, _)) if c.ctime <= post.ctime => Some(c),
            Some(_) => None,
            None => None,
        };
        match pre {
            Some(c) => self.update_attr(g, Some(c), post, now),
            None if self.inodes.get(&g).is_some_and(|i| i.attr.is_some()) => self.drop_attr(g),
            None => self.update_attr(g, None, post, now),
        }
    }

    /// Marks `g` changed (so fills from fops wound before are dropped) and
    /// returns the inode if cached.
    pub(super) fn touch(&mut self, g: Gfid) -> Option<&mut Ino> {
        let epoch = self.next_epoch();
        if !self.inodes.contains_key(&g) {
            self.forgot(g, epoch);
            return None;
        }
        let i = self.inodes.get_mut(&g)?;
        i.epoch = epoch;
        Some(i)
    }

    /// Drops `g`'s attributes.
    pub(super) fn drop_attr(&mut self, g: Gfid) {
        if g.is_null() {
            return;
        }
        if let Some(i) = self.touch(g) {
            i.attr = None;
        }
    }

    /// Drops `g`'s attributes and xattrs.
    pub(super) fn invalidate(&mut self, g: Gfid) {
        if g.is_null() {
            return;
        }
        tracing::trace!(gfid = %g, epoch = self.epoch + 1, "invalidated");
        if let Some(i) = self.touch(g) {
            i.attr = None;
            let freed = i.xattr_bytes();
            i.xattrs.clear();
            self.xattr_bytes = self.xattr_bytes.saturating_sub(freed);
        }
    }

    /// What a new inode `g` made in `parent` is known to lack: a
    /// capability and user xattrs always; a security label, and ACLs, when
    /// the parent is known to have no label, or no default ACL (the kernel
    /// asks for the capability before the first write of every new file).
    pub(super) fn new_inode_xattrs(&mut self, parent: Gfid, g: Gfid, now: u64) {
        let names = self.cfg.prefetch.clone();
        let epoch = self.epoch;
        for n in names.iter() {
            let absent = match n.as_str() {
                CAPABILITY => true,
                SELINUX => self.xattr(parent, SELINUX, now) == Some(None),
                ACL_ACCESS | ACL_DEFAULT => self.xattr(parent, ACL_DEFAULT, now) == Some(None),
                other => other.starts_with("user."),
            };
            if absent {
                self.set_xattr(g, n, None, epoch, now);
            }
        }
    }

    /// Drops cached xattrs of `g` whose names `which` selects.
    pub(super) fn drop_xattrs(&mut self, g: Gfid, which: impl Fn(&str) -> bool) {
        let Some(i) = self.inodes.get_mut(&g) else { return };
        let before = i.xattr_bytes();
        i.xattrs.retain(|x| !which(&x.name));
        let freed = before - i.xattr_bytes();
        self.xattr_bytes = self.xattr_bytes.saturating_sub(freed);
    }

    /// Caches xattr `name` of `g` (None: known absent).
    pub(super) fn set_xattr(&mut self, g: Gfid, name: &str, value: Option<Bytes>, start: u64, now: u64) {
        if g.is_null() || !self.enabled() || !self.may_fill(g, start) {
            return;
        }
        let (old, count) = match self.inodes.get(&g) {
            Some(i) => (i.xattrs.iter().find(|x| &*x.name == name).map(XattrVal::bytes), i.xattrs.len()),
            None => (None, 0),
        };
        let add = name.len() + value.as_ref().map_or(0, Bytes::len);
        let total = self.xattr_bytes - old.unwrap_or(0) + add;
        let too_big = value.as_ref().is_some_and(|v| v.len() > MAX_XATTR_VALUE) || total > MAX_XATTR_BYTES;
        if too_big || (old.is_none() && count >= MAX_XATTRS_PER_INODE) {
            self.drop_xattrs(g, |n| n == name);
            return;
        }
        self.xattr_bytes = total;
        let i = self.ino_mut(g);
        match i.xattrs.iter_mut().find(|x| &*x.name == name) {
            Some(x) => {
                x.value = value;
                x.at = now;
            }
            None => i.xattrs.push(XattrVal { name: name.into(), value, at: now }),
        }
    }

    pub(super) fn dentry(&self, parent: Gfid, name: &str) -> Option<&Dentry> {
        self.dirs.get(&parent)?.get(name)
    }

    /// Caches entry `name` in `parent` as `gfid`, or as absent.
    pub(super) fn set_dentry(&mut self, parent: Gfid, name: &str, gfid: Option<Gfid>, start: u64, now: u64) {
        let on = if gfid.is_some() { self.enabled() } else { self.nl_enabled() };
        let record = on && !is_dot(name) && !parent.is_null() && !gfid.is_some_and(|g| g.is_null());
        if !record || !self.may_fill(parent, start) {
            // A name that exists but is not recorded: a whole listing of
            // the parent no longer holds every name, so it must not answer
            // lookups of missing names with ENOENT.
            if gfid.is_some() {
                self.drop_dentry(parent, name);
                self.listed.remove(&parent);
            } else if !record {
                self.drop_dentry(parent, name);
            }
            return;
        }
        let present = self.dentry(parent, name).is_some();
        if !present {
            while self.dentries >= self.cfg.max_entries && self.evict_dentry() {}
        }
        self.tick += 1;
        let tick = self.tick;
        self.dentry_order.push_back((tick, parent, name.to_string()));
        if self.dentry_order.len() > 2 * self.cfg.max_entries + 64 {
            let dirs = &self.dirs;
            self.dentry_order.retain(|(t, p, n)| dirs.get(p).and_then(|d| d.get(n)).is_some_and(|d| d.tick == *t));
        }
        let dir = self.dirs.entry(parent).or_default();
        match dir.get_mut(name) {
            Some(d) => *d = Dentry { gfid, at: now, tick },
            None => {
                dir.insert(name.to_string(), Dentry { gfid, at: now, tick });
                self.dentries += 1;
            }
        }
    }

    pub(super) fn evict_dentry(&mut self) -> bool {
        while let Some((t, p, n)) = self.dentry_order.pop_front() {
            if self.dentry(p, &n).is_some_and(|d| d.tick == t) {
                self.drop_dentry(p, &n);
                self.listed.remove(&p);
                self.stats.evictions += 1;
                return true;
            }
        }
        false
    }

    /// Drops one entry; returns the gfid it named, if it was positive.
    pub(super) fn drop_dentry(&mut self, parent: Gfid, name: &str) -> Option<Gfid> {
        let dir = self.dirs.get_mut(&parent)?;
        let d = dir.remove(name)?;
        if dir.is_empty() {
            self.dirs.remove(&parent);
        }
        self.dentries -= 1;
        d.gfid
    }

    /// True when `dir` was read whole lately and nothing of it was dropped.
    pub(super) fn listed_whole(&self, dir: Gfid, now: u64) -> bool {
        self.cfg.dir_prefetch && self.listed.get(&dir).is_some_and(|(at, whole)| *whole && self.fresh(*at, now))
    }

    /// Whether a lookup miss in `dir` should read the directory whole: not
    /// read (or being read) lately. Marks it as being read.
    pub(super) fn want_prefetch(&mut self, dir: Gfid, now: u64) -> bool {
        if !self.cfg.dir_prefetch || dir.is_null() || self.listed.get(&dir).is_some_and(|(at, _)| self.fresh(*at, now))
        {
            return false;
        }
        if self.listed.len() >= self.cfg.max_entries {
            self.listed.retain(|_, (at, _)| now.saturating_sub(*at) < self.cfg.timeout);
            if self.listed.len() >= self.cfg.max_entries {
                return false;
            }
        }
        self.listed.insert(dir, (now, false));
        true
    }

    /// A prefetch of `dir` started at `at` read every name.
    pub(super) fn listed_done(&mut self, dir: Gfid, at: u64) {
        if let Some(e) = self.listed.get_mut(&dir)
            && e.0 == at
        {
            e.1 = true;
            self.stats.dirs_prefetched += 1;
        }
    }

    /// Drops every entry under `parent`.
    pub(super) fn drop_dir(&mut self, parent: Gfid) {
        self.listed.remove(&parent);
        if let Some(d) = self.dirs.remove(&parent) {
            self.dentries -= d.len();
        }
    }

    /// The inode a location names, when known.
    pub(super) fn loc_gfid(&self, loc: &Loc) -> Option<Gfid> {
        if !loc.gfid.is_null() {
            return Some(loc.gfid);
        }
        self.dentry(loc.parent, &loc.name).and_then(|d| d.gfid)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.inodes.is_empty() && self.dentries == 0 && self.statfs.is_none()
    }

    /// Forgets everything; fills of fops in flight are dropped.
    pub(super) fn flush_all(&mut self) {
        self.inodes.clear();
        self.inode_order.clear();
        self.dirs.clear();
        self.dentries = 0;
        self.dentry_order.clear();
        self.xattr_bytes = 0;
        self.statfs = None;
        self.recent.clear();
        self.recent_order.clear();
        self.listed.clear();
        self.lost_epoch = self.next_epoch();
    }

    /// Invalidates what a location names; when it cannot be told (an entry
    /// location not cached), everything.
    pub(super) fn invalidate_loc(&mut self, loc: &Loc) {
        match self.loc_gfid(loc) {
            Some(g) => self.invalidate(g),
            None if !self.is_empty() => self.flush_all(),
            None => {}
        }
    }

    /// An inode's invalidation: its attributes, xattrs and the entries
    /// under it; a null gfid means everything.
    pub(super) fn upcall(&mut self, g: Gfid) {
        self.stats.invalidations += 1;
        if g.is_null() {
            self.flush_all();
        } else {
            self.invalidate(g);
            self.drop_dir(g);
        }
    }
}
