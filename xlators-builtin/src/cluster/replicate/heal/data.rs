//! Data self-heal (GlusterFS's afr-self-heal-data.c): copies the source's
//! contents to the sinks, whole or by differing blocks, then truncates them
//! to its size. Blocks of zeros are not written where a sink reads zeros
//! already, and punched where it does not, so sparse files stay sparse;
//! the source's holes are found with SEEK_DATA and skipped whole.

use super::*;

impl Inner {
    /// Copies the data of `src` to `sinks`; returns the sinks healed.
    pub(super) async fn heal_data(
        &self,
        ctx: &CallCtx,
        gfid: Gfid,
        src: usize,
        sinks: Mask,
        copies: &[Option<ChildCopy>],
    ) -> Mask {
        let cfg = self.cfg();
        let size = copies[src].as_ref().map_or(0, |c| c.iatt.size);
        let src_iatt = copies[src].as_ref().map(|c| c.iatt).unwrap_or_default();
        let diff = match cfg.heal_algo {
            Algo::Full => false,
            Algo::Diff => true,
            Algo::Auto => members(sinks).any(|i| copies[i].as_ref().is_some_and(|c| c.iatt.size > 0)),
        };
        let fd = Fd { id: self.heal_fd(), gfid };
        let open = |flags: i32| Fop::Open { loc: Loc::gfid(gfid), flags: flags as u32, fd: fd.id };
        if self.on(src, ctx, open(libc::O_RDONLY)).await.is_err() {
            tracing::warn!(volume = %self.name, %gfid, "data heal: cannot open the source");
            return 0;
        }
        let mut live = 0;
        for (i, r) in self.fan(ctx, sinks, &Request::new(open(libc::O_RDWR))).await {
            if r.is_ok() {
                live |= bit(i);
            }
        }
        let opened = live;
        let blocks = size.div_ceil(BLOCK);
        let window = cfg.heal_window.max(1) as u64;
        let mut b = 0;
        while b < blocks && live != 0 {
            // A hole of the source of a block or more is skipped, once the
            // sinks read zeros there: a sparse file's apparent size is no
            // work (a byte at 1 TiB used to mean millions of block reads).
            let at = b * BLOCK;
            if let Some(next) = self.next_data(ctx, src, fd, at, size).await
                && next.min(size) >= at + BLOCK
                && self.clear_range(ctx, fd, live, at, next.min(size)).await
            {
                b = next.min(size) / BLOCK;
                continue;
            }
            let end = (b + window).min(blocks);
            let futs =
                (b..end).map(|k| self.copy_block(ctx, fd, src, live, k * BLOCK, BLOCK.min(size - k * BLOCK), diff));
            for failed in join_all(futs.collect()).await {
                live &= !failed;
            }
            b = end;
        }
        let times = SetAttr {
            atime: Some(TimeSet::At(src_iatt.atime)),
            mtime: Some(TimeSet::At(src_iatt.mtime)),
            ..Default::default()
        };
        // The times last: stamped with the source's ctime, so the sinks
        // keep the source's times (storage/posix's `ctime`).
        for req in [
            Request::new(Fop::Ftruncate { fd, offset: size }),
            Request::new(Fop::Fsync { fd, datasync: true }),
            Request::with_xdata(Fop::Fsetattr { fd, attr: times }, stamped(src_iatt.ctime)),
        ] {
            for (i, r) in self.fan(ctx, live, &req).await {
                if let Err(e) = r {
                    tracing::warn!(volume = %self.name, %gfid, child = %self.children[i].name, %e, "data heal failed on a sink");
                    live &= !bit(i);
                }
            }
        }
        self.fan(ctx, opened | bit(src), &Request::new(Fop::Release { fd })).await;
        live
    }

    /// Where child `i`'s next data at or after `at` starts (`size` when
    /// there is none); None when it cannot tell (no SEEK there).
    async fn next_data(&self, ctx: &CallCtx, i: usize, fd: Fd, at: u64, size: u64) -> Option<u64> {
        match self.on(i, ctx, Fop::Seek { fd, offset: at, what: SeekWhat::Data }).await {
            Ok(Response { reply: Reply::Offset(o), .. }) => Some(o.max(at)),
            Err(Errno::ENXIO) => Some(size.max(at)),
            _ => None,
        }
    }

    /// Makes `[from, to)` read zeros on `sinks` (a hole of the source):
    /// left alone where a sink has no data there, punched where it has.
    /// False when some sink cannot say or cannot punch (the range is then
    /// copied block by block).
    async fn clear_range(&self, ctx: &CallCtx, fd: Fd, sinks: Mask, from: u64, to: u64) -> bool {
        let mut dirty = 0;
        for i in members(sinks) {
            match self.next_data(ctx, i, fd, from, u64::MAX).await {
                Some(next) if next < to => dirty |= bit(i),
                Some(_) => {}
                None => return false,
            }
        }
        let punch = Request::new(Fop::Discard { fd, offset: from, len: to - from });
        self.fan(ctx, dirty, &punch).await.iter().all(|(_, r)| r.is_ok())
    }

    /// One block from `src` to those of `sinks` that need it; returns the
    /// sinks that failed.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn copy_block(
        &self,
        ctx: &CallCtx,
        fd: Fd,
        src: usize,
        sinks: Mask,
        offset: u64,
        len: u64,
        diff: bool,
    ) -> Mask {
        let len32 = u32::try_from(len).unwrap_or(u32::MAX);
        let need = if diff {
            let sums = self.fan(ctx, sinks | bit(src), &Request::new(Fop::Rchecksum { fd, offset, len: len32 })).await;
            let sum = |r: &FopResult| match r {
                Ok(Response { reply: Reply::Checksum { weak, strong }, .. }) => Some((*weak, *strong)),
                _ => None,
            };
            let want = sums.iter().find(|(i, _)| *i == src).and_then(|(_, r)| sum(r));
            sums.iter()
                .filter(|(i, r)| *i != src && (want.is_none() || sum(r) != want))
                .fold(0, |m, (i, _)| m | bit(*i))
        } else {
            sinks
        };
        if need == 0 {
            return 0;
        }
        let data: Bytes = match self.on(src, ctx, Fop::Readv { fd, size: len32, offset, flags: 0 }).await {
            Ok(Response { reply: Reply::Read { data, .. }, .. }) => data,
            _ => return need,
        };
        if data.is_empty() {
            return 0;
        }
        if data.iter().all(|b| *b == 0) {
            return self.zero_block(ctx, fd, need, offset, len).await;
        }
        let w = Request::new(Fop::Writev { fd, data, offset, flags: 0 });
        self.fan(ctx, need, &w).await.into_iter().filter(|(_, r)| r.is_err()).fold(0, |m, (i, _)| m | bit(i))
    }

    /// A block of zeros (a hole, or written zeros) in the source: a sink
    /// that reads zeros there already (a hole, or past its end) is left
    /// alone, so a sparse file stays sparse; the others get a hole punched
    /// (DISCARD), or zeros written where they cannot punch. Returns the
    /// sinks that failed.
    async fn zero_block(&self, ctx: &CallCtx, fd: Fd, sinks: Mask, offset: u64, len: u64) -> Mask {
        let size = u32::try_from(len).unwrap_or(u32::MAX);
        let mut dirty = 0;
        let mut failed = 0;
        for (i, r) in self.fan(ctx, sinks, &Request::new(Fop::Readv { fd, size, offset, flags: 0 })).await {
            match r {
                Ok(Response { reply: Reply::Read { data, .. }, .. }) if data.iter().all(|b| *b == 0) => {}
                Ok(_) => dirty |= bit(i),
                Err(_) => failed |= bit(i),
            }
        }
        if dirty == 0 {
            return failed;
        }
        let punch = Request::new(Fop::Discard { fd, offset, len });
        let mut unpunched = 0;
        for (i, r) in self.fan(ctx, dirty, &punch).await {
            if r.is_err() {
                unpunched |= bit(i);
            }
        }
        if unpunched != 0 {
            let zeros = Request::new(Fop::Writev { fd, data: Bytes::from(vec![0u8; len as usize]), offset, flags: 0 });
            failed |= self
                .fan(ctx, unpunched, &zeros)
                .await
                .into_iter()
                .filter(|(_, r)| r.is_err())
                .fold(0, |m, (i, _)| m | bit(i));
        }
        failed
    }
}
