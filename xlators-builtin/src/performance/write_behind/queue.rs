//! The queues (GlusterFS's wb_inode liabilities): per inode the writes
//! (and setattrs, with setattr-behind) acknowledged but not yet completed,
//! in order, with what they make the inode look like to reads and stats;
//! per fd its flags and pending error; the bounded table of both.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Acknowledged, not sent yet.
    Queued,
    /// Sent, the child has not answered.
    InFlight,
    /// Failed, kept for a retry (resync-failed-syncs-after-fsync).
    Parked,
}

/// Most open fds remembered per inode (to send its deferred setattrs on).
pub(super) const MAX_OPEN_FDS: usize = 8;

/// A queued write, or a deferred setattr (`attr`), which is a barrier:
/// it is sent when everything queued before it has completed, and
/// nothing queued after it is sent before it has.
pub(super) struct Entry {
    pub(super) seq: u64,
    pub(super) fd: Fd,
    pub(super) ctx: CallCtx,
    pub(super) flags: u32,
    pub(super) xdata: Dict,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) chunks: Vec<Bytes>,
    pub(super) state: State,
    /// A flush or release waits for it: do not park it again on failure.
    pub(super) last_attempt: bool,
    /// A deferred setattr (sent as an fsetattr on `fd`; no data).
    pub(super) attr: Option<SetAttr>,
    /// When it was acknowledged (last merged): a setattr's ctime.
    pub(super) at: Timespec,
}

impl Entry {
    pub(super) fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }

    /// A deferred setattr overlaps everything.
    pub(super) fn overlaps(&self, other: &Entry) -> bool {
        self.attr.is_some() || other.attr.is_some() || (self.offset < other.end() && other.offset < self.end())
    }

    /// Marks the entry in flight and makes its child write, with `sync`
    /// (O_SYNC / O_DSYNC or 0) added to its flags: (seq, caller, request).
    pub(super) fn send(&mut self, sync: u32) -> (u64, CallCtx, Request) {
        self.state = State::InFlight;
        let fop = match self.attr {
            Some(attr) => Fop::Fsetattr { fd: self.fd, attr },
            None => Fop::Writev { fd: self.fd, data: self.data(), offset: self.offset, flags: self.flags | sync },
        };
        (self.seq, self.ctx.clone(), Request::with_xdata(fop, self.xdata.clone()))
    }

    pub(super) fn data(&mut self) -> Bytes {
        if self.chunks.len() != 1 {
            // In the shared send region when local bricks use one.
            self.chunks = vec![crate::protocol::rpc::shm::concat(&self.chunks)];
        }
        self.chunks.first().cloned().unwrap_or_default()
    }
}

pub(super) struct InodeWb {
    /// The last attributes seen from the child.
    pub(super) base: Option<Iatt>,
    /// Bumped at each change of `base` and when a change is sent, so that
    /// an overtaken reply is ignored.
    pub(super) generation: u64,
    /// Changes of the inode's attributes sent and not yet answered
    /// ([`Table::begin_change`]).
    pub(super) changing: u32,
    /// Another change was sent while one was in flight: which reply is
    /// newest is not known.
    pub(super) changes_overlapped: bool,
    /// When the last queued write was acknowledged (its mtime/ctime).
    pub(super) synth: Option<Timespec>,
    pub(super) entries: VecDeque<Entry>,
    pub(super) bytes: u64,
    pub(super) error: Option<Errno>,
    /// Callers waiting on this inode and background flushes: not idle.
    pub(super) busy: u32,
    /// Callers that need the queue sent now (partial batches included).
    pub(super) drainers: u32,
    /// Background flushes not yet answered by the child.
    pub(super) bg: u32,
    /// Fds open on the inode (seen opening, not yet released), at most
    /// [`MAX_OPEN_FDS`]: a deferred setattr is sent on one of them.
    pub(super) open_fds: Vec<FdId>,
    /// Fsyncs follow this inode's writes (an fsync found writes queued or
    /// in flight): a partial tail waits up to [`SYNC_HOLD`] for the fsync
    /// to carry it instead of trickling ahead of it.
    pub(super) sync_heavy: bool,
    /// A [`SYNC_HOLD`] timer is armed.
    pub(super) hold_timer: bool,
    pub(super) last_used: u64,
    /// The table's `clock` when a background write of the inode last came
    /// back, a change sent here was answered, or the attributes became
    /// unknown: attributes a child read before then may be older than what
    /// this translator answers. (Attributes merely seen in a reply are
    /// not a change: a listing read meanwhile saw the child's too.)
    pub(super) changed: u64,
    pub(super) notify: Arc<Notify>,
}

impl InodeWb {
    pub(super) fn new(tick: u64) -> InodeWb {
        InodeWb {
            base: None,
            generation: 0,
            changing: 0,
            changes_overlapped: false,
            synth: None,
            entries: VecDeque::new(),
            bytes: 0,
            error: None,
            busy: 0,
            drainers: 0,
            bg: 0,
            open_fds: Vec::new(),
            sync_heavy: false,
            hold_timer: false,
            last_used: tick,
            changed: 0,
            notify: Arc::new(Notify::new()),
        }
    }

    pub(super) fn idle(&self) -> bool {
        self.entries.is_empty() && self.error.is_none() && self.busy == 0 && self.bg == 0 && self.changing == 0
    }

    /// Idle, and no read of attributes that began at `oldest` (the oldest
    /// in flight) needs the state to correct its reply.
    pub(super) fn removable(&self, oldest: Option<u64>) -> bool {
        self.idle() && oldest.is_none_or(|s| self.changed <= s)
    }

    /// The attributes as the application sees them: the child's, grown by
    /// the queued writes, changed by the queued setattrs.
    pub(super) fn view(&self) -> Option<Iatt> {
        let mut a = self.base?;
        self.grow(&mut a);
        // A setattr's times hold unless a write queued after it sets the
        // mtime again (grow has given the writes' time).
        let last_write = self.entries.iter().rposition(|e| e.attr.is_none());
        for (k, e) in self.entries.iter().enumerate() {
            if let Some(s) = &e.attr {
                let mut s = *s;
                if last_write.is_some_and(|w| w > k) {
                    s.mtime = None;
                }
                s.apply(&mut a, e.at);
            }
        }
        Some(a)
    }

    /// True when a deferred setattr is queued or in flight.
    pub(super) fn has_setattrs(&self) -> bool {
        self.entries.iter().any(|e| e.attr.is_some())
    }

    /// Grows attributes by the queued writes: size, blocks, times.
    pub(super) fn grow(&self, a: &mut Iatt) {
        if let Some(end) = self.entries.iter().filter(|e| e.attr.is_none()).map(Entry::end).max() {
            if end > a.size {
                a.size = end;
                a.blocks = a.blocks.max(end.div_ceil(512));
            }
            if let Some(t) = self.synth {
                a.mtime = a.mtime.max(t);
                a.ctime = a.ctime.max(t);
            }
        }
    }

    /// Takes attributes from a completed write: a write never shrinks a
    /// file, so a reply overtaken by a later write does not either.
    pub(super) fn absorb_write(&mut self, post: Iatt) {
        let mut a = post;
        if let Some(b) = self.base {
            a.size = a.size.max(b.size);
            a.blocks = a.blocks.max(b.blocks);
            if a.gfid.is_null() {
                a.gfid = b.gfid;
            }
        }
        self.base = Some(a);
        self.generation += 1;
    }

    /// The queued bytes of `[offset, end)`, if every byte is queued.
    pub(super) fn serve(&self, offset: u64, end: u64) -> Option<Bytes> {
        if end <= offset {
            return None;
        }
        let mut ranges: Vec<(u64, u64)> = self
            .entries
            .iter()
            .filter(|e| e.offset < end && e.end() > offset)
            .map(|e| (e.offset.max(offset), e.end().min(end)))
            .collect();
        ranges.sort_unstable();
        let mut covered = offset;
        for (s, e) in ranges {
            if s > covered {
                return None;
            }
            covered = covered.max(e);
        }
        if covered < end {
            return None;
        }
        let mut out = vec![0u8; (end - offset) as usize];
        for e in self.entries.iter().filter(|e| e.offset < end && e.end() > offset) {
            let mut pos = e.offset;
            for c in &e.chunks {
                let c_end = pos.saturating_add(c.len() as u64);
                let (s, t) = (pos.max(offset), c_end.min(end));
                if s < t {
                    out[(s - offset) as usize..(t - offset) as usize]
                        .copy_from_slice(&c[(s - pos) as usize..(t - pos) as usize]);
                }
                pos = c_end;
            }
        }
        Some(Bytes::from(out))
    }
}

pub(super) struct FdWb {
    pub(super) flags: u32,
    pub(super) error: Option<Errno>,
}

#[derive(Default, Clone, Copy)]
pub(super) struct Stats {
    pub(super) writes_queued: u64,
    pub(super) writes_aggregated: u64,
    pub(super) writes_sync: u64,
    pub(super) bytes_queued: u64,
    pub(super) batches_sent: u64,
    pub(super) bytes_sent: u64,
    pub(super) read_hits: u64,
    pub(super) reads_drained: u64,
    pub(super) errors_deferred: u64,
    pub(super) errors_returned: u64,
    pub(super) window_waits: u64,
    pub(super) retries: u64,
    pub(super) evictions: u64,
    pub(super) flushes_behind: u64,
    pub(super) fsyncs_merged: u64,
    pub(super) setattrs_behind: u64,
    pub(super) setattrs_merged: u64,
}

pub(super) struct Table {
    pub(super) conf: Conf,
    pub(super) inodes: HashMap<Gfid, InodeWb>,
    pub(super) fds: HashMap<FdId, FdWb>,
    /// Bytes queued over all inodes.
    pub(super) total: u64,
    /// Deferred setattrs queued or in flight over all inodes.
    pub(super) setattrs: usize,
    /// Last sequence number given to a queue entry.
    pub(super) seq: u64,
    pub(super) tick: u64,
    /// Counts changes of inodes (see [`InodeWb::changed`]).
    pub(super) clock: u64,
    /// The generation of inodes not in the table, and the first of a new
    /// slot: raised when another client changes an inode not here and
    /// above the last generation of a slot dropped, so that a reply to a
    /// fop sent before either does not seed the attributes.
    pub(super) absent_gen: u64,
    /// The `clock` when another client last changed an inode not here: a
    /// lookup by name that began before does not seed the attributes.
    pub(super) absent_changed: u64,
    /// Reads of attributes in flight ([`Reading`]): the `clock` each began
    /// at, and how many began then.
    pub(super) reads: BTreeMap<u64, u32>,
    pub(super) tasks: HashMap<u64, AbortHandle>,
    pub(super) next_task: u64,
    pub(super) closed: bool,
    pub(super) stats: Stats,
}

impl Table {
    pub(super) fn new(conf: Conf) -> Table {
        Table {
            conf,
            inodes: HashMap::new(),
            fds: HashMap::new(),
            total: 0,
            setattrs: 0,
            seq: 0,
            tick: 0,
            clock: 0,
            absent_gen: 0,
            absent_changed: 0,
            reads: BTreeMap::new(),
            tasks: HashMap::new(),
            next_task: 0,
            closed: false,
            stats: Stats::default(),
        }
    }

    /// The inode's state, created (evicting idle ones if the table is full)
    /// when absent; None when the table is full of busy inodes.
    pub(super) fn slot(&mut self, gfid: Gfid) -> Option<&mut InodeWb> {
        self.tick += 1;
        let tick = self.tick;
        if !self.inodes.contains_key(&gfid) {
            if gfid.is_null() {
                return None;
            }
            if self.inodes.len() >= MAX_INODES {
                self.evict();
            }
            if self.inodes.len() >= MAX_INODES {
                return None;
            }
            let mut i = InodeWb::new(tick);
            i.generation = self.absent_gen;
            self.inodes.insert(gfid, i);
        }
        let i = self.inodes.get_mut(&gfid)?;
        i.last_used = tick;
        Some(i)
    }

    /// Drops the idle quarter of the table used longest ago.
    pub(super) fn evict(&mut self) {
        let oldest = self.oldest_read();
        let mut idle: Vec<u64> = self.inodes.values().filter(|i| i.removable(oldest)).map(|i| i.last_used).collect();
        if idle.is_empty() {
            return;
        }
        let k = (MAX_INODES / 4).clamp(1, idle.len()) - 1;
        let (_, cut, _) = idle.select_nth_unstable(k);
        let cut = *cut;
        let before = self.inodes.len();
        let mut next_gen = self.absent_gen;
        self.inodes.retain(|_, i| {
            let keep = !(i.removable(oldest) && i.last_used <= cut);
            if !keep {
                next_gen = next_gen.max(i.generation + 1);
            }
            keep
        });
        self.absent_gen = next_gen;
        self.stats.evictions += (before - self.inodes.len()) as u64;
    }

    /// Drops the state of `gfid` (see [`Table::absent_gen`]).
    pub(super) fn remove(&mut self, gfid: &Gfid) {
        if let Some(i) = self.inodes.remove(gfid) {
            self.absent_gen = self.absent_gen.max(i.generation + 1);
        }
    }

    /// The deferred error to return on `fd` (its own first, else the
    /// inode's), cleared.
    pub(super) fn take_error(&mut self, fd: &Fd) -> Option<Errno> {
        let own = self.fds.get_mut(&fd.id).and_then(|f| f.error.take());
        let inode = self.inodes.get_mut(&fd.gfid).and_then(|i| i.error.take());
        let e = own.or(inode);
        if e.is_some() {
            self.stats.errors_returned += 1;
        }
        e
    }

    pub(super) fn oldest_read(&self) -> Option<u64> {
        self.reads.first_key_value().map(|(s, _)| *s)
    }

    /// Corrects attributes of a file read by the child in a fop that began
    /// at `since` (a [`Reading`]) if this translator's writes to it could be
    /// missing from them: writes still queued, or come back since. The
    /// child may have read the file before they reached it, while the
    /// writer has long had its answer. The size, blocks and times become
    /// the ones this translator would answer a stat with. True when
    /// corrected: other things read with them (the content quick-read asks
    /// for) may be stale too.
    pub(super) fn correct(&self, a: &mut Iatt, since: u64) -> bool {
        let Some(i) = self.inodes.get(&a.gfid) else { return false };
        if i.entries.is_empty() && i.changed <= since {
            return false;
        }
        match i.view() {
            Some(v) => {
                a.size = v.size;
                a.blocks = v.blocks;
                a.mode = v.mode;
                a.uid = v.uid;
                a.gid = v.gid;
                a.atime = v.atime;
                a.mtime = v.mtime;
                a.ctime = v.ctime;
            }
            None => i.grow(a),
        }
        true
    }

    /// The generation at which a lookup by name that began at `since`
    /// (its gfid unknown then) may seed `gfid`'s attributes, if it may
    /// (changes of a slot since are caught by [`Table::correct`] first).
    pub(super) fn generation_by_name(&self, gfid: Gfid, since: u64) -> Option<u64> {
        match self.inodes.get(&gfid) {
            Some(i) => Some(i.generation),
            None => (self.absent_changed <= since).then_some(self.absent_gen),
        }
    }

    pub(super) fn generation(&self, gfid: Gfid) -> u64 {
        self.inodes.get(&gfid).map_or(self.absent_gen, |i| i.generation)
    }

    /// Attributes from a reply of a fop sent when the inode's generation
    /// was `generation`: taken unless something newer arrived meanwhile.
    pub(super) fn observe(&mut self, gfid: Gfid, generation: u64, iatt: Iatt, seed: bool) {
        if gfid.is_null() || !matches!(iatt.file_type(), FileType::Regular | FileType::Unknown) {
            return;
        }
        if !seed && !self.inodes.contains_key(&gfid) {
            return;
        }
        if let Some(i) = self.slot(gfid)
            && i.generation == generation
            && i.changing == 0
        {
            let mut a = iatt;
            if a.gfid.is_null() {
                a.gfid = gfid;
            }
            i.base = Some(a);
            i.generation += 1;
        }
    }

    /// A fop that changes the inode's attributes (truncate, setattr,
    /// fallocate, a synchronous write...) is being sent. Until it is
    /// answered ([`Table::end_change`]), no other reply's attributes are
    /// taken: one that read the file before the change, answered before
    /// the change's own reply or after it, would otherwise leave the size
    /// from before the change here, and every write queued after it would
    /// be answered with that size grown by the write.
    pub(super) fn begin_change(&mut self, gfid: Gfid) {
        if let Some(i) = self.slot(gfid) {
            i.changes_overlapped |= i.changing > 0;
            i.changing += 1;
            i.generation += 1;
        }
    }

    /// The change begun with [`Table::begin_change`] was answered: the
    /// attributes after it (None when it failed, or when its reply carries
    /// none) are the inode's. When changes overlapped, the last reply need
    /// not be the newest, so the attributes become unknown.
    pub(super) fn end_change(&mut self, gfid: Gfid, post: Option<Iatt>) {
        self.clock += 1;
        let now = self.clock;
        let Some(i) = self.inodes.get_mut(&gfid) else { return };
        i.changing = i.changing.saturating_sub(1);
        let known = i.changing == 0 && !i.changes_overlapped;
        if i.changing == 0 {
            i.changes_overlapped = false;
        }
        i.base = post.filter(|_| known).map(|mut a| {
            if a.gfid.is_null() {
                a.gfid = gfid;
            }
            a
        });
        i.generation += 1;
        i.changed = now;
    }

    /// The inode's attributes are no longer known here (truncated by an
    /// open, changed by another client): the next write seeds them anew.
    pub(super) fn unknown(&mut self, gfid: Gfid) {
        self.clock += 1;
        match self.inodes.get_mut(&gfid) {
            Some(i) => {
                i.base = None;
                i.generation += 1;
                i.changed = self.clock;
            }
            None => {
                self.absent_gen += 1;
                self.absent_changed = self.clock;
            }
        }
    }
}

/// A fop that reads attributes from the child (readdirp, lookup) is in
/// flight: inodes whose writes come back meanwhile keep their state until
/// it ends, so [`Table::correct`] can fix its reply.
pub(super) struct Reading<'a> {
    t: &'a Mutex<Table>,
    pub(super) since: u64,
}

impl<'a> Reading<'a> {
    pub(super) fn begin(t: &'a Mutex<Table>) -> Reading<'a> {
        let mut g = t.lock();
        let since = g.clock;
        *g.reads.entry(since).or_insert(0) += 1;
        Reading { t, since }
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let mut g = self.t.lock();
        if let Some(n) = g.reads.get_mut(&self.since) {
            *n -= 1;
            if *n == 0 {
                g.reads.remove(&self.since);
            }
        }
    }
}

/// Remembers an fd opened on `gfid` with `flags`.
pub(super) fn track_fd(t: &mut Table, fd: FdId, flags: u32, gfid: Gfid) {
    if t.fds.len() < MAX_FDS || t.fds.contains_key(&fd) {
        t.fds.insert(fd, FdWb { flags, error: None });
    }
    if let Some(i) = t.inodes.get_mut(&gfid)
        && i.open_fds.len() < MAX_OPEN_FDS
        && !i.open_fds.contains(&fd)
    {
        i.open_fds.push(fd);
    }
}
