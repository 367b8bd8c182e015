//! What write-behind does per fop: queue a write or a setattr, serve a
//! read from the queue or wait for it, let fsync, flush and release settle
//! the queue, and give stats and readdirp entries their queued size and
//! times.

use super::*;

impl Inner {
    pub(super) async fn writev(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let Fop::Writev { fd, data, offset, flags } = &req.fop else { return self.child.call(ctx, req).await };
        let (fd, offset, len) = (*fd, *offset, data.len() as u64);
        let mut hold: Option<Hold> = None;
        loop {
            let notify = {
                let mut t = self.t.lock();
                if let Some(e) = t.take_error(&fd) {
                    return Err(e);
                }
                match t.slot(fd.gfid) {
                    Some(i) => i.notify.clone(),
                    None => break,
                }
            };
            let mut n = pin!(notify.notified());
            n.as_mut().enable();
            let acked = {
                let mut guard = self.t.lock();
                let t = &mut *guard;
                if let Some(e) = t.take_error(&fd) {
                    return Err(e);
                }
                let conf = t.conf;
                // An fd not seen opening has no known flags; past the fd
                // bound one might be O_SYNC, so such writes are not delayed.
                let (fd_flags, unknown) = match t.fds.get(&fd.id) {
                    Some(f) => (f.flags, false),
                    None => (0, t.fds.len() >= MAX_FDS),
                };
                let direct = if conf.strict_o_direct { O_DIRECT } else { 0 };
                let sync = t.closed
                    || unknown
                    || (flags | fd_flags) & (O_SYNC | O_DSYNC | direct) != 0
                    || fd_flags & O_APPEND != 0
                    || len == 0
                    || len > conf.window
                    || t.total.saturating_add(len) > conf.window.saturating_mul(TOTAL_WINDOWS)
                    || !have_runtime();
                let Table { inodes, stats, total, seq, .. } = t;
                let Some(i) = inodes.get_mut(&fd.gfid) else { break };
                if sync || i.base.is_none() {
                    break;
                }
                let room = i.bytes == 0 || (i.bytes + len <= conf.window && i.entries.len() < MAX_ENTRIES);
                if room {
                    let pre = i.view();
                    let merge = i.entries.back_mut().filter(|tail| {
                        tail.attr.is_none()
                            && tail.state == State::Queued
                            && tail.fd.id == fd.id
                            && tail.flags == *flags
                            && tail.xdata.is_empty()
                            && req.xdata.is_empty()
                            && tail.end() == offset
                            && tail.len + len <= conf.aggregate
                    });
                    match merge {
                        Some(tail) => {
                            tail.chunks.push(data.clone());
                            tail.len += len;
                            stats.writes_aggregated += 1;
                        }
                        None => {
                            *seq += 1;
                            i.entries.push_back(Entry {
                                seq: *seq,
                                fd,
                                ctx: ctx.clone(),
                                flags: *flags,
                                xdata: req.xdata.clone(),
                                offset,
                                len,
                                chunks: vec![data.clone()],
                                state: State::Queued,
                                last_attempt: false,
                                attr: None,
                                at: Timespec::default(),
                            });
                        }
                    }
                    i.bytes += len;
                    *total += len;
                    i.synth = Some(now_ts());
                    let post = i.view();
                    stats.writes_queued += 1;
                    stats.bytes_queued += len;
                    self.pump(t, fd.gfid);
                    // Both are known: the base was checked above.
                    Some(
                        pre.zip(post).map(|(pre, post)| Response::from(Reply::PrePost { pre, post })).ok_or(Errno::EIO),
                    )
                } else {
                    if hold.is_none() {
                        stats.window_waits += 1;
                        hold = Some(Hold::new(self, t, fd.gfid, true));
                    }
                    None
                }
            };
            if let Some(res) = acked {
                drop(hold); // locks the table: after the guard is gone
                return res;
            }
            n.await;
        }
        drop(hold);
        // Not delayed: earlier writes first, then this one, synchronously.
        self.drain(fd.gfid, false).await;
        {
            let mut t = self.t.lock();
            t.stats.writes_sync += 1;
            t.begin_change(fd.gfid);
        }
        let res = self.child.call(ctx, req).await;
        self.t.lock().end_change(fd.gfid, post_of(&res));
        res
    }

    pub(super) async fn readv(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let Fop::Readv { fd, size, offset, .. } = &req.fop else { return self.child.call(ctx, req).await };
        let (gfid, offset) = (fd.gfid, *offset);
        let end = offset.saturating_add(u64::from(*size));
        let must_drain = {
            let mut guard = self.t.lock();
            let t = &mut *guard;
            match t.inodes.get(&gfid) {
                Some(i) if !i.entries.is_empty() => {
                    let view = i.view();
                    let eof = view.map_or(0, |a| a.size);
                    let served = view.and_then(|a| i.serve(offset, end.min(eof)).map(|d| (d, a)));
                    if let Some((data, iatt)) = served {
                        t.stats.read_hits += 1;
                        return Ok(Response::from(Reply::Read { data, iatt }));
                    }
                    // Queued writes at or past the read could change its bytes
                    // or its end; a queued setattr, the attributes it returns.
                    let dirty = i.has_setattrs() || i.entries.iter().any(|e| e.end() > offset);
                    if dirty {
                        t.stats.reads_drained += 1;
                    }
                    dirty
                }
                _ => false,
            }
        };
        if must_drain {
            self.drain(gfid, false).await;
        }
        self.forward(gfid, ctx, req).await
    }

    /// Sends a fop down and takes the attributes of its reply.
    pub(super) async fn forward(&self, gfid: Gfid, ctx: CallCtx, req: Request) -> FopResult {
        if changes_attributes(&req.fop) {
            let opened = match &req.fop {
                Fop::Open { flags, fd, loc } => Some((*fd, *flags, loc.gfid)),
                _ => None,
            };
            self.t.lock().begin_change(gfid);
            let res = self.child.call(ctx, req).await;
            let mut t = self.t.lock();
            t.end_change(gfid, post_of(&res));
            if let (Some((fd, flags, g)), true) = (opened, res.is_ok()) {
                track_fd(&mut t, fd, flags, g);
            }
            drop(t);
            return res;
        }
        let generation = self.t.lock().generation(gfid);
        let reading = matches!(req.fop, Fop::Lookup { .. }).then(|| Reading::begin(&self.t));
        let seed = matches!(req.fop, Fop::Create { .. } | Fop::Lookup { .. } | Fop::Stat { .. } | Fop::Fstat { .. });
        let fop = req.fop.clone();
        let mut res = self.child.call(ctx, req).await;
        if let Ok(resp) = &mut res {
            let mut t = self.t.lock();
            let opened = match (&fop, &resp.reply) {
                (Fop::Open { flags, fd, loc }, _) => Some((*fd, *flags, loc.gfid)),
                (Fop::Create { flags, fd, .. }, Reply::Entry { iatt, .. }) => Some((*fd, *flags, iatt.gfid)),
                _ => None,
            };
            // A lookup by name can reach an inode with queued writes without
            // draining them, or read it before writes in flight landed: it
            // shows their size and times, not the child's, and no content;
            // and the child's older attributes are not taken.
            if let (Some(r), Reply::Entry { iatt, .. }) = (&reading, &mut resp.reply)
                && t.correct(iatt, r.since)
            {
                resp.xdata.remove(keys::CONTENT);
                return res;
            }
            match &resp.reply {
                Reply::Entry { iatt, .. } => {
                    // By name: not changed since the lookup began (above),
                    // nor, if not here, invalidated.
                    let g = if iatt.gfid.is_null() { gfid } else { iatt.gfid };
                    let at = match &reading {
                        _ if g == gfid => Some(generation),
                        Some(r) => t.generation_by_name(g, r.since),
                        None => Some(t.generation(g)),
                    };
                    if let Some(at) = at {
                        t.observe(g, at, *iatt, seed);
                    }
                }
                Reply::Attr(iatt) | Reply::Read { iatt, .. } => t.observe(gfid, generation, *iatt, seed),
                Reply::PrePost { post, .. } => t.observe(gfid, generation, *post, false),
                _ => {}
            }
            if let Some((fd, flags, g)) = opened {
                track_fd(&mut t, fd, flags, g);
            }
        }
        res
    }

    /// A setattr: answered at once and queued when it may be
    /// ([`Inner::setattr_behind`]), else sent after the queued writes.
    pub(super) async fn setattr(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        if let Some(res) = self.setattr_behind(&ctx, &req) {
            return res;
        }
        let g = [req.fop.gfid()];
        self.barrier(&g, ctx, req).await
    }

    /// Queues a setattr of a regular file whose attributes are known and
    /// that is open here, when its outcome can be told now
    /// ([`SetAttr::predictable`]), and answers it from the attributes it will give. A
    /// queued setattr not yet sent takes a later one in (GlusterFS's
    /// write-behind does not do this). None: send it now.
    pub(super) fn setattr_behind(self: &Arc<Self>, ctx: &CallCtx, req: &Request) -> Option<FopResult> {
        let (gfid, given_fd, attr) = match &req.fop {
            Fop::Setattr { loc, attr } => (loc.gfid, None, *attr),
            Fop::Fsetattr { fd, attr } => (fd.gfid, Some(fd.id), *attr),
            _ => return None,
        };
        let mut guard = self.t.lock();
        let t = &mut *guard;
        if !t.conf.setattr_behind || t.closed || !have_runtime() || !req.xdata.is_empty() {
            return None;
        }
        let Table { inodes, seq, stats, setattrs, .. } = t;
        let i = inodes.get_mut(&gfid)?;
        let base = i.base?;
        let fd = given_fd.or_else(|| i.open_fds.last().copied())?;
        if i.error.is_some()
            || i.entries.len() >= MAX_ENTRIES
            || base.file_type() != FileType::Regular
            || !attr.predictable(ctx.uid, &base)
        {
            return None;
        }
        let pre = i.view()?;
        let at = now_ts();
        let stamp = Dict::new().with(keys::UTIME, xlfs_sdk::Value::U64(at.to_nanos()));
        let same_caller = |c: &CallCtx| (c.uid, c.gid, &c.groups) == (ctx.uid, ctx.gid, &ctx.groups);
        let tail = i.entries.back_mut().filter(|e| e.state == State::Queued && same_caller(&e.ctx));
        match tail.and_then(|e| Some((e.attr.as_ref()?.at(e.at).then(&attr)?, e))) {
            Some((m, e)) => {
                e.attr = Some(m);
                e.at = at;
                e.xdata = stamp;
                stats.setattrs_merged += 1;
            }
            None => {
                *seq += 1;
                *setattrs += 1;
                i.entries.push_back(Entry {
                    seq: *seq,
                    fd: Fd { id: fd, gfid },
                    ctx: ctx.clone(),
                    flags: 0,
                    xdata: stamp,
                    offset: 0,
                    len: 0,
                    chunks: Vec::new(),
                    state: State::Queued,
                    last_attempt: false,
                    attr: Some(attr),
                    at,
                });
            }
        }
        stats.setattrs_behind += 1;
        let post = i.view()?;
        self.pump(t, gfid);
        Some(Ok(Response::from(Reply::PrePost { pre, post })))
    }

    /// The inodes `fop` acts on that have a deferred setattr queued.
    pub(super) fn behind_setattrs(&self, fop: &Fop) -> Vec<Gfid> {
        let t = self.t.lock();
        if t.setattrs == 0 {
            return Vec::new();
        }
        let mut g = vec![fop.gfid()];
        if let Fop::Rename { new, .. } = fop {
            g.push(new.gfid);
        }
        g.retain(|g| t.inodes.get(g).is_some_and(InodeWb::has_setattrs));
        g
    }

    /// Drains the queues of `gfids`, then forwards.
    pub(super) async fn barrier(self: &Arc<Self>, gfids: &[Gfid], ctx: CallCtx, req: Request) -> FopResult {
        for g in gfids {
            self.drain(*g, false).await;
        }
        let target = gfids.last().copied().unwrap_or(Gfid::NULL);
        self.forward(target, ctx, req).await
    }

    /// Takes the inode's only queued write, when nothing else of it is
    /// queued or in flight, to send it as the fsync's own write (with
    /// O_DSYNC, or O_SYNC for a full fsync). Notes that fsyncs follow the
    /// inode's writes when it has any.
    pub(super) fn take_for_fsync(&self, gfid: Gfid, datasync: bool) -> Option<(u64, CallCtx, Request)> {
        let mut guard = self.t.lock();
        let t = &mut *guard;
        if t.closed || !have_runtime() {
            return None;
        }
        let i = t.inodes.get_mut(&gfid)?;
        if i.entries.is_empty() {
            return None;
        }
        i.sync_heavy = true;
        let [e] = i.entries.make_contiguous() else { return None };
        if e.state != State::Queued || e.attr.is_some() {
            return None;
        }
        let len = e.len;
        let sent = e.send(if datasync { O_DSYNC } else { O_SYNC });
        t.stats.fsyncs_merged += 1;
        t.stats.batches_sent += 1;
        t.stats.bytes_sent += len;
        Some(sent)
    }

    pub(super) async fn fsync(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let fd = req.fop.fd().copied().unwrap_or_default();
        let datasync = matches!(req.fop, Fop::Fsync { datasync: true, .. });
        // Write and fsync in one round: the brick fsyncs the file right
        // after this write, and every other write of the inode has already
        // completed there, so the fsync covers them too.
        if let Some((seq, wctx, wreq)) = self.take_for_fsync(fd.gfid, datasync) {
            let res = self.child.call(wctx, wreq).await;
            let reply = res.as_ref().ok().map(|r| r.reply.clone());
            self.landed(fd.gfid, seq, res);
            if let Some(e) = self.t.lock().take_error(&fd) {
                return Err(e);
            }
            let (pre, post) = reply.ok_or(Errno::EIO)?.into_pre_post()?;
            return Ok(Response::from(Reply::PrePost { pre, post }));
        }
        self.drain(fd.gfid, false).await;
        if let Some(e) = self.t.lock().take_error(&fd) {
            return Err(e);
        }
        self.forward(fd.gfid, ctx, req).await
    }

    pub(super) async fn flush(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let fd = req.fop.fd().copied().unwrap_or_default();
        {
            let mut guard = self.t.lock();
            let t = &mut *guard;
            if let Some(e) = t.take_error(&fd) {
                return Err(e);
            }
            if t.conf.flush_behind && !t.closed && have_runtime() {
                t.stats.flushes_behind += 1;
                let upto = t.seq;
                self.unpark(t, fd.gfid, upto, true);
                let tracked = t.slot(fd.gfid).map(|i| i.bg += 1).is_some();
                if tracked {
                    let inner = self.clone();
                    self.spawn(t, async move {
                        inner.drain(fd.gfid, true).await;
                        if let Err(e) = inner.child.call(ctx, req).await {
                            tracing::debug!(gfid = %fd.gfid, error = %e, "write-behind: background flush failed");
                        }
                        let mut t = inner.t.lock();
                        if let Some(i) = t.inodes.get_mut(&fd.gfid) {
                            i.bg = i.bg.saturating_sub(1);
                            i.notify.notify_waiters();
                        }
                    });
                    return Ok(Response::from(Reply::Empty));
                }
            }
        }
        self.drain(fd.gfid, true).await;
        if let Some(e) = self.t.lock().take_error(&fd) {
            return Err(e);
        }
        self.child.call(ctx, req).await
    }

    pub(super) async fn release(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let fd = req.fop.fd().copied().unwrap_or_default();
        // No later setattr is sent on it; those queued are, before it goes.
        if let Some(i) = self.t.lock().inodes.get_mut(&fd.gfid) {
            i.open_fds.retain(|f| *f != fd.id);
        }
        self.drain(fd.gfid, true).await;
        self.wait_bg(fd.gfid).await;
        let res = self.child.call(ctx, req).await;
        if let Some(f) = self.t.lock().fds.remove(&fd.id)
            && let Some(e) = f.error
        {
            tracing::warn!(gfid = %fd.gfid, fd = fd.id.0, error = %e, "write-behind: fd released with a write error never returned to it");
        }
        res
    }

    /// `IPC_DRAIN`: every queued write and background flush is sent and
    /// answered, then the fop goes on down.
    pub(super) async fn drain_all(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopResult {
        let gfids: Vec<Gfid> = self.t.lock().inodes.keys().copied().collect();
        for g in gfids {
            self.drain(g, false).await;
            self.wait_bg(g).await;
        }
        self.child.call(ctx, req).await
    }

    pub(super) async fn lookup_or_stat(self: &Arc<Self>, gfid: Gfid, ctx: CallCtx, req: Request) -> FopResult {
        let dirty = self.t.lock().inodes.get(&gfid).is_some_and(|i| !i.entries.is_empty());
        if dirty {
            self.drain(gfid, false).await;
        }
        self.forward(gfid, ctx, req).await
    }

    pub(super) async fn readdirp(&self, ctx: CallCtx, req: Request) -> FopResult {
        let reading = Reading::begin(&self.t);
        let mut res = self.child.call(ctx, req).await;
        if let Ok(Response { reply: Reply::Dirents(entries), xdata }) = &mut res {
            let t = self.t.lock();
            for d in entries.iter_mut() {
                if t.correct(&mut d.iatt, reading.since) {
                    xdata.remove(&keys::dirent_xattr(&d.name, keys::CONTENT));
                }
            }
        }
        res
    }
}

/// Fops that change the attributes of the inode they are forwarded for
/// (see [`Table::begin_change`]); an open with `O_TRUNC` truncates the file.
fn changes_attributes(fop: &Fop) -> bool {
    match fop {
        Fop::Open { flags, .. } => flags & O_TRUNC != 0,
        Fop::Setattr { .. }
        | Fop::Fsetattr { .. }
        | Fop::Truncate { .. }
        | Fop::Ftruncate { .. }
        | Fop::Fallocate { .. }
        | Fop::Discard { .. }
        | Fop::Zerofill { .. }
        | Fop::CopyFileRange { .. } => true,
        _ => false,
    }
}

/// The attributes after a change, from its reply.
fn post_of(res: &FopResult) -> Option<Iatt> {
    match res {
        Ok(Response { reply: Reply::PrePost { post, .. } | Reply::Copied { post, .. }, .. }) => Some(*post),
        _ => None,
    }
}
