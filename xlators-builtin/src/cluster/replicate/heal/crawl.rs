//! What to heal and when (GlusterFS's afr-self-heald.c): the index sweep,
//! the full crawl, a gfid and the inodes its entry heal makes, and the
//! background heal a lookup starts.

use super::*;

impl Inner {
    /// Heals `gfid` and the inodes its entry heal makes, one after the other.
    pub(super) async fn heal_tree(self: &Arc<Self>, ctx: &CallCtx, gfid: Gfid, how: How) -> (Report, Done) {
        let mut rep = Report::default();
        let mut first = Done::Clean;
        let mut queue = VecDeque::from([gfid]);
        let mut top = true;
        while let Some(g) = queue.pop_front() {
            match self.heal_one(ctx, g, how).await {
                Ok((done, new, split)) => {
                    if top {
                        first = done;
                    }
                    match done {
                        Done::Healed => rep.healed += 1,
                        Done::SplitBrain => {
                            rep.split += 1;
                            rep.line(format!("{g} split-brain {}", kinds_text(&split)));
                        }
                        Done::Clean | Done::Gone => {}
                    }
                    for n in new {
                        if queue.len() < MAX_QUEUE {
                            queue.push_back(n);
                        }
                    }
                }
                Err(e) => {
                    if top {
                        first = Done::Clean;
                    }
                    rep.failed += 1;
                    rep.line(format!("{g} failed {}", e.name().unwrap_or("EIO")));
                }
            }
            top = false;
        }
        self.heal.healed.fetch_add(rep.healed, Ordering::Relaxed);
        self.heal.failed.fetch_add(rep.failed, Ordering::Relaxed);
        self.heal.split.fetch_add(rep.split, Ordering::Relaxed);
        (rep, first)
    }

    /// One page of child `i`'s index after `after`; None when the child has no index.
    pub(crate) async fn index_page(&self, ctx: &CallCtx, i: usize, after: Option<Gfid>) -> Option<(Vec<Gfid>, u64)> {
        let key = after.map_or(INDEX_XATTROP.to_string(), |g| format!("{INDEX_XATTROP}:{g}"));
        match self.on(i, ctx, Fop::Getxattr { loc: Loc::root(), name: key.clone() }).await {
            Ok(Response { reply: Reply::Xattrs(d), .. }) => {
                let list = d.get_str(&key).unwrap_or("").lines().filter_map(Gfid::parse).collect();
                Some((list, d.get_u64(INDEX_COUNT).unwrap_or(0)))
            }
            _ => None,
        }
    }

    /// Gfids listed in the indices of the children up (distinct, at most `max`).
    pub(super) async fn indexed(&self, ctx: &CallCtx, max: usize) -> (Vec<Vec<Gfid>>, usize) {
        let mut per = vec![Vec::new(); self.children.len()];
        let mut all: HashSet<Gfid> = HashSet::new();
        for i in members(self.up_mask()) {
            let mut after = None;
            while let Some((page, _)) = self.index_page(ctx, i, after).await {
                let Some(last) = page.last().copied() else { break };
                after = Some(last);
                for g in page {
                    if all.len() < max || all.contains(&g) {
                        all.insert(g);
                        if per[i].len() < max {
                            per[i].push(g);
                        }
                    }
                }
                if all.len() >= max {
                    break;
                }
            }
        }
        (per, all.len())
    }

    /// Asks every child up to drop `gfids` from its index if they are clean.
    pub(super) async fn purge(&self, ctx: &CallCtx, gfids: &[Gfid]) {
        if gfids.is_empty() {
            return;
        }
        let text: String = gfids.iter().map(|g| format!("{g}\n")).collect();
        let mut x = Dict::new();
        x.set_bytes(INDEX_PURGE, text.into_bytes());
        self.fan(ctx, self.up_mask(), &Request::new(Fop::Setxattr { loc: Loc::root(), xattrs: x, flags: 0 })).await;
    }

    /// Heals what the indices list.
    pub(super) async fn heal_index(self: &Arc<Self>, ctx: &CallCtx) -> Report {
        let mut rep = Report::default();
        let mut seen: HashSet<Gfid> = HashSet::new();
        let threads = self.cfg().shd_threads.max(1);
        for i in members(self.up_mask()) {
            let mut after = None;
            while let Some((page, _)) = self.index_page(ctx, i, after).await {
                let Some(last) = page.last().copied() else { break };
                after = Some(last);
                let todo: Vec<Gfid> = page.into_iter().filter(|g| seen.len() >= MAX_SEEN || seen.insert(*g)).collect();
                for chunk in todo.chunks(threads) {
                    let futs = chunk.iter().map(|g| self.heal_tree(ctx, *g, How::all()));
                    for (r, _) in join_all(futs.collect()).await {
                        rep.merge(r);
                    }
                }
                self.purge(ctx, &todo).await;
            }
        }
        rep
    }

    /// Heals the whole tree, directories before what they hold.
    pub(super) async fn heal_full(self: &Arc<Self>, ctx: &CallCtx) -> Report {
        let mut rep = Report::default();
        let mut dirs = VecDeque::from([Gfid::ROOT]);
        while let Some(d) = dirs.pop_front() {
            let (r, _) = self.heal_tree(ctx, d, How { merge_entries: true, ..How::all() }).await;
            rep.merge(r);
            let mut listed = None;
            for i in members(self.up_mask()) {
                if let Ok(v) = self.list_dir(ctx, i, d, MAX_DIR_ENTRIES).await {
                    listed = Some(v);
                    break;
                }
            }
            for e in listed.unwrap_or_default() {
                if e.d_type == FileType::Directory || e.iatt.is_dir() {
                    if dirs.len() < MAX_QUEUE {
                        dirs.push_back(e.iatt.gfid);
                    }
                } else {
                    let (r, _) = self.heal_tree(ctx, e.iatt.gfid, How::all()).await;
                    rep.merge(r);
                }
            }
        }
        rep
    }

    /// Starts a background heal of `gfid` after a lookup found it stale,
    /// within background-self-heal-count and heal-wait-queue-length.
    pub fn background_heal(self: &Arc<Self>, client: Arc<str>, gfid: Gfid) {
        let cfg = self.cfg();
        let kinds = [cfg.data_heal, cfg.metadata_heal, cfg.entry_heal];
        if gfid.is_null() || !kinds.iter().any(|&k| k) || cfg.bg_count == 0 {
            return;
        }
        {
            let mut q = self.heal.queued.lock();
            if q.contains(&gfid) || q.len() >= cfg.bg_count + cfg.wait_qlen {
                return;
            }
            q.insert(gfid);
        }
        let Some(h) = self.handle() else {
            self.heal.queued.lock().remove(&gfid);
            return;
        };
        let me = self.clone();
        h.spawn(async move {
            if let Ok(_permit) = me.heal.running.acquire().await {
                let ctx = CallCtx::self_heal(client);
                let (rep, _) = me.heal_tree(&ctx, gfid, How { kinds, ..How::all() }).await;
                tracing::debug!(volume = %me.name, %gfid, ?rep, "background self-heal done");
            }
            me.heal.queued.lock().remove(&gfid);
        });
    }
}
