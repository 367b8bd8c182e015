//! The control interface the heal daemon and `xlfs heal` drive through
//! virtual xattrs: run a heal, heal one gfid, heal info, and split-brain
//! resolution by policy.

use super::*;

/// True for fops of the control interface.
pub(crate) fn is_control(fop: &Fop) -> bool {
    match fop {
        Fop::Setxattr { xattrs, .. } => {
            xattrs.contains(HEAL_RUN) || xattrs.contains(HEAL_GFID) || xattrs.contains(SPLIT_BRAIN_RESOLVE)
        }
        Fop::Getxattr { name, .. } => name == HEAL_INFO,
        _ => false,
    }
}

pub(super) fn kinds_text(ks: &[Kind]) -> String {
    if ks.is_empty() {
        return "-".into();
    }
    ks.iter()
        .map(|k| match k {
            Kind::Data => "data",
            Kind::Metadata => "metadata",
            Kind::Entry => "entry",
        })
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn root_loc(loc: &Loc) -> bool {
    loc.gfid == Gfid::ROOT && !loc.is_entry()
}

impl Inner {
    /// The kinds `gfid` needs healed and the kinds in split-brain, from
    /// the copies up (None when no copy exists).
    pub(super) async fn status(&self, ctx: &CallCtx, gfid: Gfid) -> Option<(Vec<Kind>, Vec<Kind>)> {
        let (copies, _) = self.inspect(ctx, gfid, self.up_mask()).await;
        if copies.iter().all(Option::is_none) {
            return None;
        }
        let rows: Vec<Option<Vec<[i32; 3]>>> = copies.iter().map(|c| c.as_ref().map(|c| c.row.clone())).collect();
        let (mut need, mut split) = (Vec::new(), Vec::new());
        for k in Kind::ALL {
            match pending::verdict(&rows, k) {
                Verdict::Clean => {}
                Verdict::SplitBrain { .. } if k != Kind::Entry => {
                    need.push(k);
                    split.push(k);
                }
                _ => {
                    // Blame of a child that is down or lacks the inode still needs heal.
                    need.push(k);
                }
            }
        }
        Some((need, split))
    }

    pub(super) async fn info(&self, ctx: &CallCtx) -> String {
        let (per, _) = self.indexed(ctx, INFO_MAX).await;
        let up = self.up_mask();
        let mut out = String::new();
        for (i, c) in self.children.iter().enumerate() {
            if up & bit(i) == 0 {
                out += &format!("{}: down\n", c.name);
                continue;
            }
            let total = self.index_page(ctx, i, None).await.map_or(0, |(_, n)| n);
            let entries = if total == 1 { "entry" } else { "entries" };
            out += &format!("{}: up, {total} {entries} to heal\n", c.name);
            for g in &per[i] {
                match self.status(ctx, *g).await {
                    None => out += &format!("  {g} gone\n"),
                    Some((need, split)) => {
                        out += &format!("  {g} {}", kinds_text(&need));
                        if !split.is_empty() {
                            out += &format!(" split-brain {}", kinds_text(&split));
                        }
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// The control interface (see the module docs).
    pub async fn control(self: &Arc<Self>, ctx: &CallCtx, req: &Request) -> FopResult {
        let hctx = CallCtx::self_heal(ctx.client_id.clone());
        match &req.fop {
            Fop::Getxattr { loc, .. } => {
                if !root_loc(loc) {
                    return Err(Errno::EINVAL);
                }
                let mut d = Dict::new();
                d.set_bytes(HEAL_INFO, self.info(&hctx).await.into_bytes());
                Ok(Reply::Xattrs(d).into())
            }
            Fop::Setxattr { loc, xattrs, .. } => {
                if let Some(v) = xattrs.get_bytes(SPLIT_BRAIN_RESOLVE) {
                    return self.resolve_split(ctx, &hctx, loc, &v).await;
                }
                if !root_loc(loc) {
                    return Err(Errno::EINVAL);
                }
                if let Some(v) = xattrs.get_bytes(HEAL_GFID) {
                    let g = std::str::from_utf8(&v).ok().and_then(|s| Gfid::parse(s.trim())).ok_or(Errno::EINVAL)?;
                    let (rep, _) = self.heal_tree(&hctx, g, How::all()).await;
                    self.purge(&hctx, &[g]).await;
                    let remaining = self.status(&hctx, g).await.map_or(0, |(need, _)| u64::from(!need.is_empty()));
                    return Ok(Response { reply: Reply::Empty, xdata: rep.xdata(remaining) });
                }
                let mode = xattrs.get_str(HEAL_RUN).unwrap_or("").trim().to_string();
                let rep = match mode.as_str() {
                    "" | "index" => self.heal_index(&hctx).await,
                    "full" => self.heal_full(&hctx).await,
                    _ => return Err(Errno::EINVAL),
                };
                let (_, remaining) = self.indexed(&hctx, MAX_SEEN).await;
                Ok(Response { reply: Reply::Empty, xdata: rep.xdata(remaining as u64) })
            }
            _ => Err(Errno::EINVAL),
        }
    }

    pub(super) async fn resolve_split(
        self: &Arc<Self>,
        ctx: &CallCtx,
        hctx: &CallCtx,
        loc: &Loc,
        v: &[u8],
    ) -> FopResult {
        let policy = std::str::from_utf8(v).map_err(|_| Errno::EINVAL)?.trim();
        let choice = match policy {
            "bigger-file" => Choice::Size,
            "latest-mtime" => Choice::Mtime,
            p => {
                let name = p.strip_prefix("source-brick:").ok_or(Errno::EINVAL)?;
                let i = (0..self.children.len())
                    .find(|&i| &*self.children[i].name == name || self.pending_names[i] == name)
                    .ok_or(Errno::EINVAL)?;
                Choice::Child(i)
            }
        };
        let gfid = if loc.gfid.is_null() {
            match self.lookup(ctx, loc.clone(), Dict::new()).await?.reply {
                Reply::Entry { iatt, .. } => iatt.gfid,
                _ => return Err(Errno::EINVAL),
            }
        } else {
            loc.gfid
        };
        let before = self.status(hctx, gfid).await.ok_or(Errno::ENOENT)?;
        let (rep, _) = if before.1.is_empty() {
            (Report::default(), Done::Clean)
        } else {
            self.heal_tree(hctx, gfid, How { choice: Some(choice), ..How::all() }).await
        };
        let after = self.status(hctx, gfid).await;
        let result = match (&before.1.is_empty(), &after) {
            (true, _) => "not in split-brain".to_string(),
            (false, Some((_, split))) if !split.is_empty() => {
                let hint = if split.contains(&Kind::Metadata) && !matches!(choice, Choice::Child(_)) {
                    " (a metadata split-brain needs source-brick)"
                } else {
                    ""
                };
                format!("unresolved: the policy chose no source for {}{hint}", kinds_text(split))
            }
            (false, _) => "resolved".to_string(),
        };
        let mut xdata = rep.xdata(after.map_or(0, |(need, _)| u64::from(!need.is_empty())));
        xdata.set_str(HEAL_RESULT, result);
        Ok(Response { reply: Reply::Empty, xdata })
    }
}
