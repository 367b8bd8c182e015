//! What each fop does with the cache: the fops answered from it
//! ([`State::answer`]), what a fop sent on must note before it goes
//! ([`State::plan`]) and what its reply fills or drops ([`State::after`]).

use super::*;

impl State {
    /// Answers `req` from the cache when it can (counting hits and misses).
    pub(super) fn answer(&mut self, req: &Request, now: u64) -> Option<FopResult> {
        match &req.fop {
            Fop::Stat { loc } if !loc.gfid.is_null() && req.xdata.is_empty() && self.enabled() => {
                self.answer_attr(loc.gfid, now)
            }
            Fop::Fstat { fd } if req.xdata.is_empty() && self.enabled() => self.answer_attr(fd.gfid, now),
            Fop::Lookup { loc } if req.xdata.is_empty() => self.answer_lookup(loc, now),
            Fop::Getxattr { loc, name } if !loc.gfid.is_null() && req.xdata.is_empty() => {
                self.answer_xattr(loc.gfid, name, now)
            }
            Fop::Fgetxattr { fd, name } if req.xdata.is_empty() => self.answer_xattr(fd.gfid, name, now),
            Fop::Statfs { .. } if self.cfg.statfs && self.enabled() => match self.statfs {
                Some((s, at)) if self.fresh(at, now) => {
                    self.stats.statfs_hits += 1;
                    Some(Ok(Reply::Statfs(s).into()))
                }
                _ => {
                    self.stats.statfs_misses += 1;
                    None
                }
            },
            _ => None,
        }
    }

    pub(super) fn answer_attr(&mut self, g: Gfid, now: u64) -> Option<FopResult> {
        match self.attr(g, now) {
            Some(a) => {
                tracing::trace!(gfid = %g, size = a.size, "stat hit");
                self.stats.stat_hits += 1;
                Some(Ok(Reply::Attr(a).into()))
            }
            None => {
                self.stats.stat_misses += 1;
                None
            }
        }
    }

    pub(super) fn answer_lookup(&mut self, loc: &Loc, now: u64) -> Option<FopResult> {
        if loc.is_entry() {
            if let Some((gfid, at)) = self.dentry(loc.parent, &loc.name).map(|d| (d.gfid, d.at)) {
                match gfid {
                    None if loc.gfid.is_null() && now.saturating_sub(at) < self.cfg.nl_timeout => {
                        self.stats.negative_hits += 1;
                        return Some(Err(Errno::ENOENT));
                    }
                    Some(g) if self.fresh(at, now) && (loc.gfid.is_null() || loc.gfid == g) => {
                        if let (Some(iatt), Some(postparent)) = (self.attr(g, now), self.attr(loc.parent, now)) {
                            tracing::trace!(gfid = %g, size = iatt.size, "lookup hit");
                            self.stats.lookup_hits += 1;
                            return Some(Ok(Reply::Entry { iatt, postparent }.into()));
                        }
                    }
                    _ => {}
                }
            } else if loc.gfid.is_null() && self.listed_whole(loc.parent, now) {
                self.stats.negative_hits += 1;
                return Some(Err(Errno::ENOENT));
            }
        } else if !loc.gfid.is_null()
            && let Some(iatt) = self.attr(loc.gfid, now)
        {
            self.stats.lookup_hits += 1;
            return Some(Ok(Reply::Entry { iatt, postparent: Iatt::default() }.into()));
        }
        if self.enabled() || self.nl_enabled() {
            self.stats.lookup_misses += 1;
        }
        None
    }

    pub(super) fn answer_xattr(&mut self, g: Gfid, name: &str, now: u64) -> Option<FopResult> {
        if !self.enabled() || !self.cfg.cacheable(name) {
            return None;
        }
        match self.xattr(g, name, now) {
            Some(Some(v)) => {
                self.stats.getxattr_hits += 1;
                let mut d = Dict::new();
                d.set(name, Value::Bytes(v));
                Some(Ok(Reply::Xattrs(d).into()))
            }
            Some(None) => {
                self.stats.absent_hits += 1;
                Some(Err(Errno::ENODATA))
            }
            None => {
                self.stats.getxattr_misses += 1;
                None
            }
        }
    }

    /// What to do with the reply of a fop the cache did not answer; None
    /// when it needs nothing. Adds the prefetch keys to lookup and readdirp.
    pub(super) fn plan(&mut self, req: &mut Request) -> Option<Plan> {
        use Fop::*;
        match &req.fop {
            Forget { gfid } => {
                self.remove_inode(*gfid);
                self.drop_dir(*gfid);
                return None;
            }
            Open { flags, .. } if *flags & libc::O_TRUNC as u32 == 0 => return None,
            Opendir { .. } => {
                // performance/readdir-ahead below reads ahead with these.
                if self.enabled() && !self.cfg.prefetch.is_empty() && !req.xdata.contains(keys::MDC_LOADED_KEY_NAMES) {
                    req.xdata.set_str(keys::MDC_LOADED_KEY_NAMES, self.cfg.prefetch.join(" "));
                }
                return None;
            }
            Statfs { .. } if !self.cfg.statfs => return None,
            Access { .. }
            | Flush { .. }
            | Readdir { .. }
            | Release { .. }
            | Releasedir { .. }
            | Lk { .. }
            | Inodelk { .. }
            | Finodelk { .. }
            | Entrylk { .. }
            | Fentrylk { .. }
            | Seek { .. }
            | Rchecksum { .. }
            | Lease { .. }
            | Ipc { .. }
            | Fsyncdir { .. } => return None,
            _ => {}
        }
        if !self.enabled() && !self.nl_enabled() {
            return None;
        }
        let (mut names, mut added, mut asked) = (Vec::new(), Vec::new(), false);
        if matches!(req.fop, Lookup { .. } | Readdirp { .. }) && self.enabled() {
            asked = req.xdata.keys().any(|k| is_xattr_name(k));
            for n in self.cfg.prefetch.iter() {
                if !req.xdata.contains(n) {
                    req.xdata.set_u64(n.clone(), 0);
                    added.push(n.clone());
                }
                names.push(n.clone());
            }
            for k in req.xdata.keys() {
                if self.cfg.cacheable(k) && !names.contains(k) {
                    names.push(k.clone());
                }
            }
        }
        Some(Plan { fop: req.fop.clone(), start: self.epoch, names, added, asked })
    }

    /// Updates the cache from a reply, and strips the keys the plan added.
    pub(super) fn after(&mut self, p: Plan, res: &mut FopResult, now: u64) {
        let start = p.start;
        tracing::trace!(fop = ?p.fop.kind(), start, epoch = self.epoch, ok = res.is_ok(), "reply");
        match (&p.fop, res) {
            (Fop::Lookup { loc }, Ok(rsp)) => {
                if let Reply::Entry { iatt, postparent } = &rsp.reply {
                    let g = iatt.gfid;
                    self.fill_attr(g, *iatt, start, now);
                    if loc.is_entry() {
                        if postparent.gfid == loc.parent {
                            self.fill_attr(loc.parent, *postparent, start, now);
                        }
                        self.set_dentry(loc.parent, &loc.name, Some(g), start, now);
                    }
                    for n in &p.names {
                        match rsp.xdata.get(n) {
                            None => self.set_xattr(g, n, None, start, now),
                            Some(v) => match xattr_value(v) {
                                Some(b) => self.set_xattr(g, n, Some(b), start, now),
                                None => self.drop_xattrs(g, |x| x == n.as_str()),
                            },
                        }
                    }
                }
                for a in &p.added {
                    rsp.xdata.remove(a);
                }
            }
            (Fop::Lookup { loc }, Err(e)) => {
                if *e == Errno::ENOENT && loc.is_entry() && loc.gfid.is_null() {
                    self.set_dentry(loc.parent, &loc.name, None, start, now);
                } else if matches!(*e, Errno::ENOENT | Errno::ESTALE) {
                    if loc.is_entry() {
                        self.drop_dentry(loc.parent, &loc.name);
                    }
                    self.invalidate(loc.gfid);
                }
            }
            (Fop::Readdirp { fd, .. }, Ok(rsp)) => {
                if let Reply::Dirents(entries) = &rsp.reply {
                    let covered = !p.names.is_empty() && rsp.xdata.contains(keys::DIRENT_XATTRS);
                    for e in entries {
                        let g = e.iatt.gfid;
                        if g.is_null() {
                            continue;
                        }
                        self.fill_attr(g, e.iatt, start, now);
                        if is_dot(&e.name) {
                            continue;
                        }
                        self.set_dentry(fd.gfid, &e.name, Some(g), start, now);
                        if covered {
                            for n in &p.names {
                                let v = rsp.xdata.get(&keys::dirent_xattr(&e.name, n)).map(xattr_value);
                                match v {
                                    None => self.set_xattr(g, n, None, start, now),
                                    Some(Some(b)) => self.set_xattr(g, n, Some(b), start, now),
                                    Some(None) => self.drop_xattrs(g, |x| x == n.as_str()),
                                }
                            }
                        }
                    }
                }
                if !p.added.is_empty() {
                    let x = std::mem::take(&mut rsp.xdata);
                    rsp.xdata = x
                        .into_iter()
                        .filter(|(k, _)| match keys::parse_dirent_xattr(k) {
                            Some((_, n)) => !p.added.iter().any(|a| a == n),
                            None => p.asked || k != keys::DIRENT_XATTRS,
                        })
                        .collect();
                }
            }
            (Fop::Stat { .. } | Fop::Fstat { .. }, r) => match r {
                Ok(Response { reply: Reply::Attr(a), .. }) => {
                    let g = if a.gfid.is_null() { p.fop.gfid() } else { a.gfid };
                    self.fill_attr(g, *a, start, now);
                }
                Err(Errno::ENOENT | Errno::ESTALE) => self.invalidate(p.fop.gfid()),
                _ => {}
            },
            (Fop::Readv { fd, .. }, Ok(Response { reply: Reply::Read { iatt, .. }, .. })) => {
                self.fill_attr(fd.gfid, *iatt, start, now);
            }
            (Fop::Readlink { loc, .. }, Ok(Response { reply: Reply::Readlink { iatt, .. }, .. })) => {
                let g = if iatt.gfid.is_null() { loc.gfid } else { iatt.gfid };
                self.fill_attr(g, *iatt, start, now);
            }
            (Fop::Getxattr { name, .. } | Fop::Fgetxattr { name, .. }, r) if self.cfg.cacheable(name) => {
                let g = p.fop.gfid();
                match r {
                    Ok(Response { reply: Reply::Xattrs(d), .. }) => {
                        if let Some(b) = d.get(name).and_then(xattr_value) {
                            self.set_xattr(g, name, Some(b), start, now);
                        }
                    }
                    Err(Errno::ENODATA) => self.set_xattr(g, name, None, start, now),
                    Err(Errno::ENOENT | Errno::ESTALE) => self.invalidate(g),
                    _ => {}
                }
            }
            (
                Fop::Setattr { .. }
                | Fop::Fsetattr { .. }
                | Fop::Truncate { .. }
                | Fop::Ftruncate { .. }
                | Fop::Writev { .. }
                | Fop::Fsync { .. }
                | Fop::Fallocate { .. }
                | Fop::Discard { .. }
                | Fop::Zerofill { .. },
                r,
            ) => match r {
                Ok(Response { reply: Reply::PrePost { pre, post }, .. }) => {
                    let g = match p.fop.gfid() {
                        g if g.is_null() => post.gfid,
                        g => g,
                    };
                    self.update_attr(g, Some(*pre), *post, now);
                    let cap_absent = |s: &Self| {
                        s.inodes
                            .get(&g)
                            .is_some_and(|i| i.xattrs.iter().any(|x| &*x.name == CAPABILITY && x.value.is_none()))
                    };
                    match &p.fop {
                        // chmod rewrites the access ACL, chown kills
                        // capabilities, and either may change other security
                        // xattrs: those go, but a capability known absent
                        // stays absent (neither can add one). New times
                        // change no xattr (tar and cp -a set them right
                        // before a chown, which the kernel checks the
                        // capability for).
                        Fop::Setattr { attr, .. } | Fop::Fsetattr { attr, .. } => {
                            if attr.mode.is_some() || attr.uid.is_some() || attr.gid.is_some() {
                                let cap_absent = cap_absent(self);
                                self.drop_xattrs(g, |n| {
                                    (n.starts_with("security.") || n.starts_with("system."))
                                        && !(cap_absent && n == CAPABILITY)
                                })
                            }
                        }
                        Fop::Fsync { .. } => {}
                        // A write may kill a capability the file has; one it
                        // is known not to have stays absent (the kernel asks
                        // before every write).
                        _ if cap_absent(self) => {}
                        _ => self.drop_xattrs(g, |n| n == CAPABILITY),
                    }
                }
                _ => match p.fop.loc() {
                    Some(loc) => self.invalidate_loc(loc),
                    None => self.invalidate(p.fop.gfid()),
                },
            },
            (Fop::CopyFileRange { fd_out, .. }, r) => match r {
                Ok(Response { reply: Reply::Copied { post, .. }, .. }) => {
                    self.update_attr(fd_out.gfid, None, *post, now);
                    self.drop_xattrs(fd_out.gfid, |n| n == CAPABILITY);
                }
                _ => self.invalidate(fd_out.gfid),
            },
            (
                Fop::Create { loc, .. }
                | Fop::Mknod { loc, .. }
                | Fop::Mkdir { loc, .. }
                | Fop::Symlink { loc, .. }
                | Fop::Link { new: loc, .. },
                r,
            ) => match r {
                Ok(Response { reply: Reply::Entry { iatt, postparent }, .. }) => {
                    if postparent.gfid == loc.parent {
                        self.advance_attr(loc.parent, *postparent, now);
                    } else {
                        self.drop_attr(loc.parent);
                    }
                    let epoch = self.epoch;
                    self.set_dentry(loc.parent, &loc.name, Some(iatt.gfid), epoch, now);
                    self.update_attr(iatt.gfid, None, *iatt, now);
                    if !matches!(p.fop, Fop::Link { .. }) {
                        self.new_inode_xattrs(loc.parent, iatt.gfid, now);
                    }
                    // A directory just made is empty: its names are all
                    // known (absent) until an invalidation says otherwise.
                    if matches!(p.fop, Fop::Mkdir { .. })
                        && self.cfg.dir_prefetch
                        && self.listed.len() < self.cfg.max_entries
                    {
                        self.listed.insert(iatt.gfid, (now, true));
                    }
                }
                _ => {
                    self.drop_dentry(loc.parent, &loc.name);
                    self.listed.remove(&loc.parent);
                    self.drop_attr(loc.parent);
                    if let Fop::Link { old, .. } = &p.fop {
                        self.invalidate_loc(old);
                    }
                }
            },
            (Fop::Unlink { loc, .. } | Fop::Rmdir { loc, .. }, r) => {
                let target = self.loc_gfid(loc);
                self.drop_dentry(loc.parent, &loc.name);
                match r {
                    Ok(Response { reply: Reply::Parent { post, .. }, .. }) => {
                        // As after a create: kept unless newer ones are
                        // cached. Not "only if the cached ones are `pre`":
                        // an unlink answered early has the directory
                        // delegation's attributes as `pre`, which a stat
                        // answered by a brick (behind the queue) never
                        // equals, and `rm -r` stats the directory after
                        // every unlink (the kernel's permission check).
                        self.advance_attr(loc.parent, *post, now);
                        let epoch = self.epoch;
                        self.set_dentry(loc.parent, &loc.name, None, epoch, now);
                    }
                    _ => {
                        self.listed.remove(&loc.parent);
                        self.drop_attr(loc.parent);
                    }
                }
                match target {
                    Some(t) => {
                        self.invalidate(t);
                        self.drop_dir(t);
                    }
                    // Its attributes (nlink) may be cached by gfid.
                    None if !self.is_empty() => self.flush_all(),
                    None => {}
                }
            }
            (Fop::Rename { old, new, flags }, r) => {
                let src = self.loc_gfid(old);
                let dst = self.dentry(new.parent, &new.name).map(|d| d.gfid);
                let dst = if new.gfid.is_null() { dst } else { Some(Some(new.gfid)) };
                self.drop_dentry(old.parent, &old.name);
                self.drop_dentry(new.parent, &new.name);
                self.drop_attr(old.parent);
                self.drop_attr(new.parent);
                match r {
                    Ok(Response { reply: Reply::Rename { iatt }, .. }) => {
                        if flags & rename_flags::EXCHANGE == 0 {
                            let epoch = self.epoch;
                            self.set_dentry(new.parent, &new.name, Some(iatt.gfid), epoch, now);
                            self.set_dentry(old.parent, &old.name, None, epoch, now);
                        }
                        self.update_attr(iatt.gfid, None, *iatt, now);
                    }
                    _ => {
                        self.listed.remove(&old.parent);
                        self.listed.remove(&new.parent);
                        if let Some(s) = src {
                            self.invalidate(s);
                        }
                    }
                }
                match dst {
                    Some(Some(d)) if src != Some(d) => {
                        self.invalidate(d);
                        self.drop_dir(d);
                    }
                    Some(_) => {} // known absent, or the source itself
                    None if !self.is_empty() => self.flush_all(),
                    None => {}
                }
            }
            (Fop::Setxattr { xattrs, .. } | Fop::Fsetxattr { xattrs, .. }, r) => {
                let Some(g) = self.fop_gfid(&p.fop) else { return };
                if r.is_err() {
                    self.invalidate(g);
                    return;
                }
                self.drop_attr(g);
                let epoch = self.epoch;
                for (k, v) in xattrs.iter() {
                    if !self.cfg.cacheable(k) {
                        continue;
                    }
                    match xattr_value(v) {
                        Some(b) if k.starts_with("user.") || k.starts_with("trusted.") => {
                            self.set_xattr(g, k, Some(b), epoch, now)
                        }
                        _ => self.drop_xattrs(g, |n| n == k.as_str()),
                    }
                }
            }
            (Fop::Removexattr { name, .. } | Fop::Fremovexattr { name, .. }, r) => {
                let Some(g) = self.fop_gfid(&p.fop) else { return };
                match r {
                    Ok(_) | Err(Errno::ENODATA) => {
                        self.drop_attr(g);
                        let epoch = self.epoch;
                        if self.cfg.cacheable(name) {
                            self.set_xattr(g, name, None, epoch, now);
                        }
                    }
                    Err(_) => self.invalidate(g),
                }
            }
            (Fop::Xattrop { .. } | Fop::Fxattrop { .. } | Fop::Open { .. }, _) => {
                if let Some(g) = self.fop_gfid(&p.fop) {
                    self.invalidate(g);
                }
            }
            (Fop::Statfs { .. }, Ok(Response { reply: Reply::Statfs(s), .. })) if self.cfg.statfs && self.enabled() => {
                self.statfs = Some((*s, now));
            }
            _ => {}
        }
    }

    /// The inode a fop acts on; None (after flushing everything, as it may
    /// be any cached inode) for an entry location not cached.
    pub(super) fn fop_gfid(&mut self, fop: &Fop) -> Option<Gfid> {
        if let Some(fd) = fop.fd() {
            return Some(fd.gfid);
        }
        let loc = fop.loc()?;
        let g = self.loc_gfid(loc);
        if g.is_none() && !self.is_empty() {
            self.flush_all();
        }
        g
    }
}

/// What to do with a reply.
pub(super) struct Plan {
    pub(super) fop: Fop,
    /// The generation when the fop was wound.
    pub(super) start: u64,
    /// The cacheable xattr names the request asks for (lookup, readdirp).
    pub(super) names: Vec<String>,
    /// The names md-cache added to the request's xdata.
    pub(super) added: Vec<String>,
    /// Whether the caller's own xdata named any xattr.
    pub(super) asked: bool,
}
