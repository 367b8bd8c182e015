//! The `fuser::Filesystem` adapter (GlusterFS's fuse-bridge.c entry
//! points): [`Bridge`] takes each kernel request on a reader thread and
//! hands it to the per-group code in `entry`, `io`, `dir` and `locks`; also
//! how an error or an xattr value is replied.

use super::*;

/// A fuser reply that can carry an error.
pub(super) trait ErrorReply {
    fn error(self, e: fuser::Errno);
}

macro_rules! error_reply {
    ($($t:ty),*) => {$(
        impl ErrorReply for $t {
            fn error(self, e: fuser::Errno) {
                <$t>::error(self, e)
            }
        }
    )*};
}

error_reply!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyLock,
    ReplyLseek,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr
);

/// The `Filesystem` fuser drives: thin glue from each request to a task.
pub(super) struct Bridge {
    pub(super) core: Arc<Core>,
}

impl Bridge {
    fn attr_ttl(&self) -> Duration {
        self.core.opts.attribute_timeout
    }
}

/// Answers an entry reply with the mount's timeouts.
pub(super) fn reply_entry(reply: ReplyEntry, opts: &MountOptions, attr: Option<FileAttr>) {
    match attr {
        Some(a) => reply.entry_with_ttls(&opts.attribute_timeout, &opts.entry_timeout, &a, Generation(0)),
        None => {
            // A negative entry: node id 0, remembered for the negative timeout.
            let mut a = file_attr(&Iatt::default(), 0);
            a.kind = fuser::FileType::RegularFile;
            reply.entry_with_ttls(&Duration::ZERO, &opts.negative_timeout, &a, Generation(0))
        }
    }
}

impl Filesystem for Bridge {
    fn init(&mut self, _req: &FuseRequest, config: &mut KernelConfig) -> std::io::Result<()> {
        let o = &self.core.opts;
        let mut want = InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_FLOCK_LOCKS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES;
        if o.readdirplus {
            want |= InitFlags::FUSE_DO_READDIRPLUS;
        }
        // `auto-invalidation` is the bridge's own (`data_cache`): the kernel's
        // FUSE_AUTO_INVAL_DATA would drop a file's pages after each of its
        // writes. With HANDLE_KILLPRIV_V2 the bricks take set-user-ID and
        // set-group-ID away on writes and truncates (storage/posix), so the
        // kernel stops asking for security.capability before every write.
        want |= InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if o.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if o.direct_io {
            want |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        }
        let have = config.capabilities();
        if let Err(missing) = config.add_capabilities(want & have) {
            tracing::warn!(?missing, "kernel refused FUSE capabilities");
        }
        if !have.contains(want) {
            tracing::info!(missing = ?(want - have), "the kernel lacks some FUSE capabilities");
        }
        let _ = config.set_max_write(o.max_write).or_else(|max| config.set_max_write(max));
        let _ = config.set_max_readahead(o.max_readahead).or_else(|max| config.set_max_readahead(max));
        let _ = config.set_max_background(o.max_background);
        let _ = config.set_congestion_threshold((u32::from(o.max_background) * 3 / 4).max(1) as u16);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        tracing::debug!(?want, "FUSE init");
        Ok(())
    }

    fn destroy(&mut self) {
        tracing::debug!("FUSE session destroyed");
    }

    fn lookup(&self, req: &FuseRequest, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.lookup(who, parent, name?).await }, {
            let c = self.core.clone();
            move |r, a| reply_entry(r, &c.opts, a)
        });
    }

    fn forget(&self, _req: &FuseRequest, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    // batch_forget: fuser 0.18 does not export the type of its argument,
    // so its default (forget for each node) is what runs; that is this
    // `forget`, which needs no fop and no wait.

    fn getattr(&self, req: &FuseRequest, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let (c, who, ttl) = (self.core.clone(), Caller::from(req), self.attr_ttl());
        self.core.run(reply, async move { c.getattr(who, ino, fh).await }, move |r, a| r.attr(&ttl, &a));
    }

    fn setattr(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let (c, who, ttl) = (self.core.clone(), Caller::from(req), self.attr_ttl());
        let set = entry::SetattrArgs { mode, uid, gid, size, atime, mtime, fh };
        self.core.run(reply, async move { c.setattr(who, ino, set).await }, move |r, a| r.attr(&ttl, &a));
    }

    fn readlink(&self, req: &FuseRequest, ino: INodeNo, reply: ReplyData) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.readlink(who, ino).await }, |r, t| r.data(t.as_bytes()));
    }

    fn mknod(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        let fop = move |loc| Fop::Mknod { loc, mode, rdev: rdev.into(), umask };
        self.entry_op(reply, async move { c.make_entry(who, parent, name?, fop).await });
    }

    fn mkdir(&self, req: &FuseRequest, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        let fop = move |loc| Fop::Mkdir { loc, mode, umask };
        self.entry_op(reply, async move { c.make_entry(who, parent, name?, fop).await });
    }

    fn unlink(&self, req: &FuseRequest, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.remove(who, parent, name?, false).await }, |r, ()| r.ok());
    }

    fn rmdir(&self, req: &FuseRequest, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.remove(who, parent, name?, true).await }, |r, ()| r.ok());
    }

    fn symlink(&self, req: &FuseRequest, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(link_name));
        let target = name_str(target.as_os_str());
        self.entry_op(reply, async move {
            let target = target?;
            c.make_entry(who, parent, name?, move |loc| Fop::Symlink { target, loc, umask: 0 }).await
        });
    }

    fn rename(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let (name, newname) = (name_str(name), name_str(newname));
        self.core.run(
            reply,
            async move { c.rename(who, parent, name?, newparent, newname?, flags.bits()).await },
            |r, ()| r.ok(),
        );
    }

    fn link(&self, req: &FuseRequest, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(newname));
        self.entry_op(reply, async move { c.link(who, ino, newparent, name?).await });
    }

    fn open(&self, req: &FuseRequest, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.open(who, ino, flags.0).await }, |r, (fh, f)| r.opened(fh, f));
    }

    fn read(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let owner = lock_owner.map_or(0, |o| o.0);
        self.core.run(reply, async move { c.read(who, owner, fh, offset, size).await }, |r, d| r.data(&d));
    }

    fn write(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let owner = lock_owner.map_or(0, |o| o.0);
        // In the shared send region when local bricks use one, so the
        // payload reaches them without another copy.
        let data = xlfs_xlators::protocol::rpc::shm::copy_from(data);
        self.core.run(reply, async move { c.write(who, owner, fh, offset, data).await }, |r, n| r.written(n));
    }

    fn flush(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.flush(who, fh, lock_owner.0).await }, |r, ()| r.ok());
    }

    fn release(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let owner = lock_owner.map(|o| o.0);
        // Noted here, in the order the kernel sent it (see `locks::Unlocking`).
        let unlocking = self.core.release_unlocks(fh);
        self.core.run(
            reply,
            async move {
                let r = c.release(who, fh, owner, flush).await;
                drop(unlocking);
                r
            },
            |r, ()| r.ok(),
        );
    }

    fn fsync(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.fsync(who, fh, datasync, false).await }, |r, ()| r.ok());
    }

    fn opendir(&self, req: &FuseRequest, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.opendir(who, ino).await }, |r, (fh, f)| r.opened(fh, f));
    }

    fn readdir(&self, req: &FuseRequest, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.spawn(async move { c.readdir(who, ino, fh, offset, reply).await });
    }

    fn readdirplus(&self, req: &FuseRequest, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.spawn(async move { c.readdirplus(who, ino, fh, offset, reply).await });
    }

    fn releasedir(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.releasedir(who, fh).await }, |r, ()| r.ok());
    }

    fn fsyncdir(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.fsync(who, fh, datasync, true).await }, |r, ()| r.ok());
    }

    fn statfs(&self, req: &FuseRequest, ino: INodeNo, reply: ReplyStatfs) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.statfs(who, ino).await }, |r, s| {
            let (bsize, frsize) = (s.bsize.min(u32::MAX.into()) as u32, s.frsize.min(u32::MAX.into()) as u32);
            r.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, bsize, s.namemax.min(255) as u32, frsize)
        });
    }

    fn setxattr(
        &self,
        req: &FuseRequest,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        let value = bytes::Bytes::copy_from_slice(value);
        self.core.run(reply, async move { c.setxattr(who, ino, name?, value, flags as u32).await }, |r, ()| r.ok());
    }

    fn getxattr(&self, req: &FuseRequest, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.getxattr(who, ino, name?).await }, move |r, v| xattr_reply(r, size, &v));
    }

    fn listxattr(&self, req: &FuseRequest, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.listxattr(who, ino).await }, move |r, v| xattr_reply(r, size, &v));
    }

    fn removexattr(&self, req: &FuseRequest, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        self.core.run(reply, async move { c.removexattr(who, ino, name?).await }, |r, ()| r.ok());
    }

    fn access(&self, req: &FuseRequest, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.access(who, ino, mask.bits() as u32).await }, |r, ()| r.ok());
    }

    fn create(
        &self,
        req: &FuseRequest,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (c, who, name) = (self.core.clone(), Caller::from(req), name_str(name));
        let ttl = self.attr_ttl();
        self.core.run(
            reply,
            async move { c.create(who, parent, name?, mode, umask, flags as u32).await },
            move |r, (attr, fh, f)| r.created(&ttl, &attr, Generation(0), fh, f),
        );
    }

    fn getlk(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let lk = locks::FuseLock { start, end, typ, pid };
        self.core.run(reply, async move { c.getlk(who, fh, lock_owner.0, lk).await }, |r, l| {
            r.locked(l.start, l.end, l.typ, l.pid)
        });
    }

    fn setlk(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let lk = locks::FuseLock { start, end, typ, pid };
        self.core.run(reply, async move { c.setlk(who, fh, lock_owner.0, lk, sleep, flock).await }, |r, ()| r.ok());
    }

    fn fallocate(
        &self,
        req: &FuseRequest,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.fallocate(who, fh, offset, length, mode as u32).await }, |r, ()| r.ok());
    }

    fn lseek(&self, req: &FuseRequest, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        self.core.run(reply, async move { c.lseek(who, fh, offset, whence).await }, |r, o| r.offset(o));
    }

    fn copy_file_range(
        &self,
        req: &FuseRequest,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let (c, who) = (self.core.clone(), Caller::from(req));
        let flags = flags.bits() as u32;
        self.core.run(
            reply,
            async move { c.copy_file_range(who, fh_in, offset_in, fh_out, offset_out, len, flags).await },
            |r, n| r.written(n),
        );
    }
}

impl Bridge {
    /// Runs an entry-making fop and answers with the entry.
    fn entry_op(&self, reply: ReplyEntry, fut: impl Future<Output = Result<FileAttr, Errno>> + Send + 'static) {
        let c = self.core.clone();
        self.core.run(reply, fut, move |r, a| reply_entry(r, &c.opts, Some(a)));
    }
}

/// Answers getxattr/listxattr: the size when asked for it, ERANGE when the
/// value does not fit.
pub(super) fn xattr_reply(r: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        r.size(v.len() as u32);
    } else if v.len() > size as usize {
        r.error(fuser::Errno::ERANGE);
    } else {
        r.data(v);
    }
}
