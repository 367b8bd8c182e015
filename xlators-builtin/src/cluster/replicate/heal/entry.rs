//! Entry self-heal (GlusterFS's afr-self-heal-entry.c): a directory's
//! names missing on a copy made there with the same gfid, extra names
//! removed, and a sink's name for another inode than the source's removed
//! and made again.

use super::*;

impl Inner {
    /// The entries of directory `dir` on child `i` (without `.` and `..`);
    /// E2BIG beyond `max` of them.
    pub(crate) async fn list_dir(
        &self,
        ctx: &CallCtx,
        i: usize,
        dir: Gfid,
        max: usize,
    ) -> Result<Vec<DirEntry>, Errno> {
        let fd = Fd { id: self.heal_fd(), gfid: dir };
        self.on(i, ctx, Fop::Opendir { loc: Loc::gfid(dir), fd: fd.id }).await?;
        let mut out = Vec::new();
        let mut offset = 0;
        let r = loop {
            match self.on(i, ctx, Fop::Readdirp { fd, size: 64 << 10, offset }).await {
                Ok(Response { reply: Reply::Dirents(v), .. }) => {
                    let Some(last) = v.last() else { break Ok(()) };
                    offset = last.d_off;
                    out.extend(v.into_iter().filter(|e| e.name != "." && e.name != ".."));
                    if out.len() > max {
                        break Err(Errno::E2BIG);
                    }
                }
                Ok(_) => break Err(Errno::EIO),
                Err(e) => break Err(e),
            }
        };
        let _ = self.on(i, ctx, Fop::Releasedir { fd }).await;
        r.map(|()| out)
    }

    /// Entry heal of directory `dir`; returns the sinks healed and the
    /// inodes made on some copy (to heal next).
    pub(super) async fn heal_entry(
        &self,
        ctx: &CallCtx,
        dir: Gfid,
        sources: Mask,
        sinks: Mask,
    ) -> Result<(Mask, Vec<Gfid>), Errno> {
        let part = sources | sinks;
        let futs = members(part).map(|i| async move { (i, self.list_dir(ctx, i, dir, MAX_DIR_ENTRIES).await) });
        let mut lists: Vec<Option<BTreeMap<String, DirEntry>>> = vec![None; self.children.len()];
        let mut failed: Mask = 0;
        for (i, r) in join_all(futs.collect()).await {
            match r {
                Ok(v) => lists[i] = Some(v.into_iter().map(|e| (e.name.clone(), e)).collect()),
                Err(e) => {
                    tracing::warn!(volume = %self.name, %dir, child = %self.children[i].name, %e, "entry heal: cannot list the directory");
                    failed |= bit(i);
                }
            }
        }
        let sources = sources & !failed;
        if sources == 0 {
            return Err(Errno::EIO);
        }
        // Every name the sources have, with the first source holding it.
        let mut union: BTreeMap<String, (usize, DirEntry)> = BTreeMap::new();
        for i in members(sources) {
            for (name, e) in lists[i].iter().flatten() {
                union.entry(name.clone()).or_insert((i, e.clone()));
            }
        }
        // A sink's entry naming another inode than the source's is stale
        // (the name was removed and made again, or renamed over, while the
        // sink was away): it goes, and the name is made again like a missing
        // one, as GlusterFS's entry heal deletes a sink's mismatching entry.
        // Between sources a mismatch is a gfid split-brain, left alone.
        let mut missing: Vec<(usize, &str, usize, &DirEntry)> = Vec::new();
        for (name, (si, e)) in &union {
            for t in members(part & !failed) {
                let Some(list) = lists[t].as_ref() else { continue };
                match list.get(name) {
                    Some(have) if have.iatt.gfid == e.iatt.gfid || have.iatt.gfid.is_null() => {}
                    Some(have) if sources & bit(t) == 0 => match self.remove_entry(ctx, t, dir, name, have).await {
                        Ok(()) => {
                            tracing::info!(volume = %self.name, %dir, name = %name, child = %self.children[t].name,
                                stale = %have.iatt.gfid, source = %e.iatt.gfid, "entry heal: a stale entry removed");
                            missing.push((t, name, *si, e));
                        }
                        Err(err) => {
                            tracing::warn!(volume = %self.name, %dir, name = %name, child = %self.children[t].name, %err, "entry heal: cannot remove a stale entry");
                            failed |= bit(t);
                        }
                    },
                    Some(have) => {
                        tracing::warn!(volume = %self.name, %dir, name = %name, child = %self.children[t].name,
                            theirs = %have.iatt.gfid, source = %e.iatt.gfid, "entry heal: gfid mismatch (gfid split-brain); left alone");
                        failed |= bit(t);
                    }
                    None => missing.push((t, name, *si, e)),
                }
            }
        }
        // Files first (a file renamed while a sink was away is still there
        // under its old name, to link to), then the sinks' extra names go,
        // then directories (a directory renamed is then gone under its old
        // name, and is made again with its gfid).
        let is_dir = |e: &DirEntry| e.d_type == FileType::Directory || e.iatt.is_dir();
        let mut new = Vec::new();
        for &(t, name, si, e) in missing.iter().filter(|m| !is_dir(m.3)) {
            self.make_missing(ctx, t, dir, name, si, e, &mut new, &mut failed).await;
        }
        for t in members(sinks & !failed) {
            let Some(list) = lists[t].as_ref() else { continue };
            for (name, e) in list.iter().filter(|(n, _)| !union.contains_key(*n)) {
                if let Err(err) = self.remove_entry(ctx, t, dir, name, e).await {
                    tracing::warn!(volume = %self.name, %dir, name = %name, child = %self.children[t].name, %err, "entry heal: cannot remove");
                    failed |= bit(t);
                }
            }
        }
        for &(t, name, si, e) in missing.iter().filter(|m| is_dir(m.3)) {
            self.make_missing(ctx, t, dir, name, si, e, &mut new, &mut failed).await;
        }
        new.sort();
        new.dedup();
        Ok((sinks & !failed, new))
    }

    /// [`Inner::make_entry`] unless child `t` already `failed`; a new
    /// inode goes to `new`, a failure to `failed`.
    #[allow(clippy::too_many_arguments)]
    async fn make_missing(
        &self,
        ctx: &CallCtx,
        t: usize,
        dir: Gfid,
        name: &str,
        si: usize,
        e: &DirEntry,
        new: &mut Vec<Gfid>,
        failed: &mut Mask,
    ) {
        if *failed & bit(t) != 0 {
            return;
        }
        match self.make_entry(ctx, t, dir, name, si, e).await {
            Ok(true) => new.push(e.iatt.gfid),
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(volume = %self.name, %dir, name = %name, child = %self.children[t].name, %err, "entry heal: cannot create");
                *failed |= bit(t);
            }
        }
    }

    /// Makes entry `name` of `dir` on child `t` like `e` on source `si`:
    /// a hard link if `t` has the inode already (false), else a new inode
    /// with the same gfid, blamed on the source so it is healed (true).
    pub(super) async fn make_entry(
        &self,
        ctx: &CallCtx,
        t: usize,
        dir: Gfid,
        name: &str,
        si: usize,
        e: &DirEntry,
    ) -> Result<bool, Errno> {
        let g = e.iatt.gfid;
        let loc = Loc::entry(dir, name);
        let ty = e.iatt.file_type();
        if ty != FileType::Directory && self.on(t, ctx, Fop::Lookup { loc: Loc::gfid(g) }).await.is_ok() {
            self.on(t, ctx, Fop::Link { old: Loc::gfid(g), new: loc }).await?;
            return Ok(false);
        }
        let fop = match ty {
            FileType::Directory => Fop::Mkdir { loc, mode: e.iatt.mode & 0o7777, umask: 0 },
            FileType::Symlink => {
                let target =
                    self.on(si, ctx, Fop::Readlink { loc: Loc::gfid(g), size: 4096 }).await?.reply.into_readlink()?;
                Fop::Symlink { target, loc, umask: 0 }
            }
            _ => Fop::Mknod { loc, mode: e.iatt.mode, rdev: e.iatt.rdev, umask: 0 },
        };
        self.on_x(t, ctx, fop, Dict::new().with(GFID_REQ, Value::Gfid(g))).await?;
        let blame = match ty {
            FileType::Directory => [0, 1, 1],
            FileType::Regular => [1, 1, 0],
            _ => [0, 1, 0],
        };
        let mut d = Dict::new();
        d.set_bytes(self.keys[t].clone(), pending::encode(blame));
        self.on(si, ctx, Fop::Xattrop { loc: Loc::gfid(g), op: XattropOp::AddArray, xattrs: d }).await?;
        Ok(true)
    }

    /// Removes entry `name` of `dir` on child `t` (a directory with everything under it).
    pub(super) async fn remove_entry(
        &self,
        ctx: &CallCtx,
        t: usize,
        dir: Gfid,
        name: &str,
        e: &DirEntry,
    ) -> Result<(), Errno> {
        if e.d_type != FileType::Directory && !e.iatt.is_dir() {
            return self.on(t, ctx, Fop::Unlink { loc: Loc::entry(dir, name), flags: 0 }).await.map(drop);
        }
        // Deepest directories last in `dirs`; their files go on the way down.
        let mut dirs = vec![(dir, name.to_string(), e.iatt.gfid)];
        let mut next = 0;
        while next < dirs.len() {
            let d = dirs[next].2;
            next += 1;
            for c in self.list_dir(ctx, t, d, MAX_DIR_ENTRIES).await? {
                if c.d_type == FileType::Directory || c.iatt.is_dir() {
                    if dirs.len() >= MAX_DIR_ENTRIES {
                        return Err(Errno::E2BIG);
                    }
                    dirs.push((d, c.name, c.iatt.gfid));
                } else {
                    self.on(t, ctx, Fop::Unlink { loc: Loc::entry(d, c.name), flags: 0 }).await?;
                }
            }
        }
        for (p, n, g) in dirs.into_iter().rev() {
            self.on(t, ctx, Fop::Rmdir { loc: Loc::entry(p, n).with_gfid(g), flags: 0 }).await?;
        }
        Ok(())
    }
}
