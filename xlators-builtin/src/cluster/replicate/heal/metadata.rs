//! Metadata self-heal (GlusterFS's afr-self-heal-metadata.c): mode, owner,
//! times and the healable xattrs of the source, given to the sinks.

use super::*;

/// Xattrs a sink is given (and has removed when the source lacks them):
/// user and trusted ones, distribute's layouts and link targets among them
/// (a migration that removed a link target while a copy was down must not
/// leave that copy a link file); not the changelog, the gfid or the
/// bricks' other own `trusted.glusterfs.*` (the volume id).
pub(super) fn healable_xattr(k: &str) -> bool {
    (k.starts_with("user.") || k.starts_with("trusted."))
        && !k.starts_with(pending::PREFIX)
        && k != GFID_XATTR
        && (!k.starts_with("trusted.glusterfs.") || k.starts_with("trusted.glusterfs.dht"))
}

pub(super) fn xattrs_of(r: FopResult) -> Result<Dict, Errno> {
    Ok(r?.reply.into_xattrs()?.into_iter().filter(|(k, _)| healable_xattr(k)).collect())
}

impl Inner {
    /// Gives `sinks` the attributes and xattrs of `src`; returns the sinks healed.
    pub(super) async fn heal_metadata(&self, ctx: &CallCtx, gfid: Gfid, src: usize, sinks: Mask, ia: &Iatt) -> Mask {
        let symlink = ia.file_type() == FileType::Symlink;
        let attr = SetAttr {
            mode: (!symlink).then_some(ia.mode & 0o7777),
            uid: Some(ia.uid),
            gid: Some(ia.gid),
            atime: Some(TimeSet::At(ia.atime)),
            mtime: Some(TimeSet::At(ia.mtime)),
        };
        let all_x = || Fop::Getxattr { loc: Loc::gfid(gfid), name: String::new() };
        let Ok(want) = xattrs_of(self.on(src, ctx, all_x()).await) else {
            tracing::warn!(volume = %self.name, %gfid, "metadata heal: cannot read the source's xattrs");
            return 0;
        };
        let futs = members(sinks).map(|i| {
            let want = &want;
            async move {
                self.on_x(i, ctx, Fop::Setattr { loc: Loc::gfid(gfid), attr }, stamped(ia.ctime)).await?;
                let have = xattrs_of(self.on(i, ctx, all_x()).await)?;
                for k in have.keys().filter(|k| !want.contains(k)) {
                    match self.on(i, ctx, Fop::Removexattr { loc: Loc::gfid(gfid), name: k.clone() }).await {
                        Ok(_) | Err(Errno::ENODATA) => {}
                        Err(e) => return Err(e),
                    }
                }
                let set: Dict =
                    want.iter().filter(|(k, v)| have.get(k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
                if !set.is_empty() {
                    self.on(i, ctx, Fop::Setxattr { loc: Loc::gfid(gfid), xattrs: set, flags: 0 }).await?;
                }
                Ok::<(), Errno>(())
            }
        });
        let mut healed = 0;
        for (i, r) in members(sinks).zip(join_all(futs.collect()).await) {
            match r {
                Ok(()) => healed |= bit(i),
                Err(e) => {
                    tracing::warn!(volume = %self.name, %gfid, child = %self.children[i].name, %e, "metadata heal failed on a sink")
                }
            }
        }
        healed
    }
}
