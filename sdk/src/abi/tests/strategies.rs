//! Proptest strategies for every model type the ABI encodes: fops of each
//! kind, reply variants, dicts, caller contexts, upcalls and events.

use super::*;

pub(super) fn gfid() -> impl Strategy<Value = Gfid> {
    prop_oneof![Just(Gfid::NULL), Just(Gfid::ROOT), any::<[u8; 16]>().prop_map(Gfid)]
}

pub(super) fn name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9._-]{0,12}", "\\PC{0,8}"]
}

pub(super) fn timespec() -> impl Strategy<Value = Timespec> {
    (any::<i64>(), any::<u32>()).prop_map(|(sec, nsec)| Timespec { sec, nsec })
}

pub(super) fn iatt() -> impl Strategy<Value = Iatt> {
    let ids = (gfid(), any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>());
    let rest = (any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>(), timespec(), timespec(), timespec());
    (ids, rest).prop_map(
        |((gfid, ino, dev, mode, nlink, uid, gid), (rdev, size, blksize, blocks, atime, mtime, ctime))| Iatt {
            gfid,
            ino,
            dev,
            mode,
            nlink,
            uid,
            gid,
            rdev,
            size,
            blksize,
            blocks,
            atime,
            mtime,
            ctime,
        },
    )
}

pub(super) fn loc() -> impl Strategy<Value = Loc> {
    (gfid(), gfid(), name()).prop_map(|(gfid, parent, name)| Loc { gfid, parent, name })
}

pub(super) fn fd() -> impl Strategy<Value = Fd> {
    (any::<u64>(), gfid()).prop_map(|(id, gfid)| Fd { id: FdId(id), gfid })
}

pub(super) fn time_set() -> impl Strategy<Value = TimeSet> {
    prop_oneof![Just(TimeSet::Now), timespec().prop_map(TimeSet::At)]
}

pub(super) fn set_attr() -> impl Strategy<Value = SetAttr> {
    (
        any::<Option<u32>>(),
        any::<Option<u32>>(),
        any::<Option<u32>>(),
        proptest::option::of(time_set()),
        proptest::option::of(time_set()),
    )
        .prop_map(|(mode, uid, gid, atime, mtime)| SetAttr { mode, uid, gid, atime, mtime })
}

pub(super) fn flock() -> impl Strategy<Value = Flock> {
    let ty = prop_oneof![Just(LockType::Read), Just(LockType::Write), Just(LockType::Unlock)];
    (ty, any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>()).prop_map(|(ty, start, len, pid, owner)| Flock {
        ty,
        start,
        len,
        pid,
        owner,
    })
}

pub(super) fn lk_cmd() -> impl Strategy<Value = LkCmd> {
    prop_oneof![Just(LkCmd::GetLk), Just(LkCmd::SetLk), Just(LkCmd::SetLkw)]
}

pub(super) fn entrylk() -> impl Strategy<Value = (EntrylkCmd, EntrylkType)> {
    let cmd = prop_oneof![Just(EntrylkCmd::Lock), Just(EntrylkCmd::LockNb), Just(EntrylkCmd::Unlock)];
    (cmd, prop_oneof![Just(EntrylkType::Read), Just(EntrylkType::Write)])
}

pub(super) fn xattrop_op() -> impl Strategy<Value = XattropOp> {
    prop_oneof![Just(XattropOp::AddArray), Just(XattropOp::AddArray64)]
}

pub(super) fn data() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

pub(super) fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::I64),
        any::<u64>().prop_map(Value::U64),
        "\\PC{0,16}".prop_map(Value::Str),
        data().prop_map(Value::Bytes),
        gfid().prop_map(Value::Gfid),
    ]
}

pub(super) fn dict() -> impl Strategy<Value = Dict> {
    btree_map(name(), value(), 0..5).prop_map(|m| m.into_iter().collect())
}

pub(super) fn dirent() -> impl Strategy<Value = DirEntry> {
    let d_type = (0u8..8).prop_map(|t| {
        use FileType::*;
        [Unknown, Regular, Directory, Symlink, BlockDev, CharDev, Fifo, Socket][t as usize]
    });
    (name(), any::<u64>(), d_type, iatt()).prop_map(|(name, d_off, d_type, iatt)| DirEntry {
        name,
        d_off,
        d_type,
        iatt,
    })
}

pub(super) fn statvfs() -> impl Strategy<Value = Statvfs> {
    any::<[u64; 11]>().prop_map(|v| Statvfs {
        bsize: v[0],
        frsize: v[1],
        blocks: v[2],
        bfree: v[3],
        bavail: v[4],
        files: v[5],
        ffree: v[6],
        favail: v[7],
        fsid: v[8],
        flag: v[9],
        namemax: v[10],
    })
}

/// A strategy for fops of one kind; exhaustive over [`FopKind`].
pub(super) fn fop_of(kind: FopKind) -> BoxedStrategy<Fop> {
    use FopKind as K;
    let u32_ = any::<u32>;
    let u64_ = any::<u64>;
    match kind {
        K::Lookup => loc().prop_map(|loc| Fop::Lookup { loc }).boxed(),
        K::Stat => loc().prop_map(|loc| Fop::Stat { loc }).boxed(),
        K::Fstat => fd().prop_map(|fd| Fop::Fstat { fd }).boxed(),
        K::Setattr => (loc(), set_attr()).prop_map(|(loc, attr)| Fop::Setattr { loc, attr }).boxed(),
        K::Fsetattr => (fd(), set_attr()).prop_map(|(fd, attr)| Fop::Fsetattr { fd, attr }).boxed(),
        K::Truncate => (loc(), u64_()).prop_map(|(loc, offset)| Fop::Truncate { loc, offset }).boxed(),
        K::Ftruncate => (fd(), u64_()).prop_map(|(fd, offset)| Fop::Ftruncate { fd, offset }).boxed(),
        K::Access => (loc(), u32_()).prop_map(|(loc, mask)| Fop::Access { loc, mask }).boxed(),
        K::Readlink => (loc(), u32_()).prop_map(|(loc, size)| Fop::Readlink { loc, size }).boxed(),
        K::Mknod => (loc(), u32_(), u64_(), u32_())
            .prop_map(|(loc, mode, rdev, umask)| Fop::Mknod { loc, mode, rdev, umask })
            .boxed(),
        K::Mkdir => (loc(), u32_(), u32_()).prop_map(|(loc, mode, umask)| Fop::Mkdir { loc, mode, umask }).boxed(),
        K::Unlink => (loc(), u32_()).prop_map(|(loc, flags)| Fop::Unlink { loc, flags }).boxed(),
        K::Rmdir => (loc(), u32_()).prop_map(|(loc, flags)| Fop::Rmdir { loc, flags }).boxed(),
        K::Symlink => {
            (name(), loc(), u32_()).prop_map(|(target, loc, umask)| Fop::Symlink { target, loc, umask }).boxed()
        }
        K::Rename => (loc(), loc(), u32_()).prop_map(|(old, new, flags)| Fop::Rename { old, new, flags }).boxed(),
        K::Link => (loc(), loc()).prop_map(|(old, new)| Fop::Link { old, new }).boxed(),
        K::Create => (loc(), u32_(), u32_(), u32_(), u64_())
            .prop_map(|(loc, flags, mode, umask, fd)| Fop::Create { loc, flags, mode, umask, fd: FdId(fd) })
            .boxed(),
        K::Open => (loc(), u32_(), u64_()).prop_map(|(loc, flags, fd)| Fop::Open { loc, flags, fd: FdId(fd) }).boxed(),
        K::Readv => (fd(), u32_(), u64_(), u32_())
            .prop_map(|(fd, size, offset, flags)| Fop::Readv { fd, size, offset, flags })
            .boxed(),
        K::Writev => (fd(), data(), u64_(), u32_())
            .prop_map(|(fd, data, offset, flags)| Fop::Writev { fd, data, offset, flags })
            .boxed(),
        K::Flush => fd().prop_map(|fd| Fop::Flush { fd }).boxed(),
        K::Fsync => (fd(), any::<bool>()).prop_map(|(fd, datasync)| Fop::Fsync { fd, datasync }).boxed(),
        K::Opendir => (loc(), u64_()).prop_map(|(loc, fd)| Fop::Opendir { loc, fd: FdId(fd) }).boxed(),
        K::Readdir => (fd(), u32_(), u64_()).prop_map(|(fd, size, offset)| Fop::Readdir { fd, size, offset }).boxed(),
        K::Readdirp => (fd(), u32_(), u64_()).prop_map(|(fd, size, offset)| Fop::Readdirp { fd, size, offset }).boxed(),
        K::Fsyncdir => (fd(), any::<bool>()).prop_map(|(fd, datasync)| Fop::Fsyncdir { fd, datasync }).boxed(),
        K::Statfs => loc().prop_map(|loc| Fop::Statfs { loc }).boxed(),
        K::Setxattr => {
            (loc(), dict(), u32_()).prop_map(|(loc, xattrs, flags)| Fop::Setxattr { loc, xattrs, flags }).boxed()
        }
        K::Getxattr => (loc(), name()).prop_map(|(loc, name)| Fop::Getxattr { loc, name }).boxed(),
        K::Removexattr => (loc(), name()).prop_map(|(loc, name)| Fop::Removexattr { loc, name }).boxed(),
        K::Fsetxattr => {
            (fd(), dict(), u32_()).prop_map(|(fd, xattrs, flags)| Fop::Fsetxattr { fd, xattrs, flags }).boxed()
        }
        K::Fgetxattr => (fd(), name()).prop_map(|(fd, name)| Fop::Fgetxattr { fd, name }).boxed(),
        K::Fremovexattr => (fd(), name()).prop_map(|(fd, name)| Fop::Fremovexattr { fd, name }).boxed(),
        K::Lk => (fd(), lk_cmd(), flock()).prop_map(|(fd, cmd, lock)| Fop::Lk { fd, cmd, lock }).boxed(),
        K::Inodelk => (name(), loc(), lk_cmd(), flock())
            .prop_map(|(domain, loc, cmd, lock)| Fop::Inodelk { domain, loc, cmd, lock })
            .boxed(),
        K::Finodelk => (name(), fd(), lk_cmd(), flock())
            .prop_map(|(domain, fd, cmd, lock)| Fop::Finodelk { domain, fd, cmd, lock })
            .boxed(),
        K::Entrylk => (name(), loc(), name(), entrylk())
            .prop_map(|(domain, loc, name, (cmd, ty))| Fop::Entrylk { domain, loc, name, cmd, ty })
            .boxed(),
        K::Fentrylk => (name(), fd(), name(), entrylk())
            .prop_map(|(domain, fd, name, (cmd, ty))| Fop::Fentrylk { domain, fd, name, cmd, ty })
            .boxed(),
        K::Xattrop => {
            (loc(), xattrop_op(), dict()).prop_map(|(loc, op, xattrs)| Fop::Xattrop { loc, op, xattrs }).boxed()
        }
        K::Fxattrop => {
            (fd(), xattrop_op(), dict()).prop_map(|(fd, op, xattrs)| Fop::Fxattrop { fd, op, xattrs }).boxed()
        }
        K::Fallocate => (fd(), u32_(), u64_(), u64_())
            .prop_map(|(fd, mode, offset, len)| Fop::Fallocate { fd, mode, offset, len })
            .boxed(),
        K::Discard => (fd(), u64_(), u64_()).prop_map(|(fd, offset, len)| Fop::Discard { fd, offset, len }).boxed(),
        K::Zerofill => (fd(), u64_(), u64_()).prop_map(|(fd, offset, len)| Fop::Zerofill { fd, offset, len }).boxed(),
        K::Seek => (fd(), u64_(), prop_oneof![Just(SeekWhat::Data), Just(SeekWhat::Hole)])
            .prop_map(|(fd, offset, what)| Fop::Seek { fd, offset, what })
            .boxed(),
        K::Rchecksum => (fd(), u64_(), u32_()).prop_map(|(fd, offset, len)| Fop::Rchecksum { fd, offset, len }).boxed(),
        K::Lease => {
            (loc(), prop_oneof![Just(LeaseCmd::Read), Just(LeaseCmd::Write), Just(LeaseCmd::Unlock)], any::<[u8; 16]>())
                .prop_map(|(loc, cmd, lease_id)| Fop::Lease { loc, cmd, lease_id })
                .boxed()
        }
        K::Ipc => any::<i32>().prop_map(|op| Fop::Ipc { op }).boxed(),
        K::CopyFileRange => (fd(), u64_(), fd(), u64_(), u64_(), u32_())
            .prop_map(|(fd_in, off_in, fd_out, off_out, len, flags)| Fop::CopyFileRange {
                fd_in,
                off_in,
                fd_out,
                off_out,
                len,
                flags,
            })
            .boxed(),
        K::Release => fd().prop_map(|fd| Fop::Release { fd }).boxed(),
        K::Releasedir => fd().prop_map(|fd| Fop::Releasedir { fd }).boxed(),
        K::Forget => gfid().prop_map(|gfid| Fop::Forget { gfid }).boxed(),
    }
}

pub(super) fn fop() -> impl Strategy<Value = Fop> {
    proptest::sample::select(FopKind::ALL).prop_flat_map(fop_of)
}

/// One strategy per reply variant, in tag order.
pub(super) fn reply_variants() -> Vec<BoxedStrategy<Reply>> {
    vec![
        Just(Reply::Empty).boxed(),
        (iatt(), iatt()).prop_map(|(iatt, postparent)| Reply::Entry { iatt, postparent }).boxed(),
        iatt().prop_map(Reply::Attr).boxed(),
        (iatt(), iatt()).prop_map(|(pre, post)| Reply::PrePost { pre, post }).boxed(),
        (iatt(), iatt()).prop_map(|(pre, post)| Reply::Parent { pre, post }).boxed(),
        iatt().prop_map(|iatt| Reply::Rename { iatt }).boxed(),
        (data(), iatt()).prop_map(|(data, iatt)| Reply::Read { data, iatt }).boxed(),
        (name(), iatt()).prop_map(|(target, iatt)| Reply::Readlink { target, iatt }).boxed(),
        vec(dirent(), 0..4).prop_map(Reply::Dirents).boxed(),
        statvfs().prop_map(Reply::Statfs).boxed(),
        dict().prop_map(Reply::Xattrs).boxed(),
        flock().prop_map(Reply::Lock).boxed(),
        any::<u64>().prop_map(Reply::Offset).boxed(),
        (any::<u32>(), any::<[u8; 32]>()).prop_map(|(weak, strong)| Reply::Checksum { weak, strong }).boxed(),
        (any::<u64>(), iatt()).prop_map(|(len, post)| Reply::Copied { len, post }).boxed(),
    ]
}

pub(super) fn reply() -> impl Strategy<Value = Reply> {
    Union::new(reply_variants())
}

pub(super) fn request() -> impl Strategy<Value = Request> {
    (fop(), dict()).prop_map(|(fop, xdata)| Request { fop, xdata })
}

pub(super) fn response() -> impl Strategy<Value = Response> {
    (reply(), dict()).prop_map(|(reply, xdata)| Response { reply, xdata })
}

pub(super) fn fop_result() -> impl Strategy<Value = FopResult> {
    prop_oneof![response().prop_map(Ok), any::<i32>().prop_map(|e| Err(Errno(e)))]
}

pub(super) fn call_ctx() -> impl Strategy<Value = CallCtx> {
    (any::<u32>(), any::<u32>(), vec(any::<u32>(), 0..8), any::<u32>(), any::<u64>(), name()).prop_map(
        |(uid, gid, groups, pid, lk_owner, client)| CallCtx {
            uid,
            gid,
            groups: Arc::from(groups),
            pid,
            lk_owner,
            client_id: Arc::from(client),
            frame: Default::default(),
            lent: Default::default(),
        },
    )
}

pub(super) fn upcall() -> impl Strategy<Value = Upcall> {
    prop_oneof![
        (gfid(), name(), name(), any::<u64>()).prop_map(|(gfid, domain, holder_client, holder_owner)| {
            Upcall::InodelkContention { gfid, domain, holder_client, holder_owner }
        }),
        (gfid(), name(), name(), name()).prop_map(|(gfid, domain, name, holder_client)| {
            Upcall::EntrylkContention { gfid, domain, name, holder_client }
        }),
        gfid().prop_map(|gfid| Upcall::Invalidate { gfid }),
        (gfid(), name()).prop_map(|(gfid, client)| Upcall::InvalidateFor { gfid, client }),
    ]
}

pub(super) fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        Just(Event::ChildUp),
        Just(Event::ChildDown),
        Just(Event::ChildConnecting),
        Just(Event::ParentUp),
        Just(Event::ParentDown),
        upcall().prop_map(Event::Upcall),
        name().prop_map(|client_id| Event::ClientGone { client_id }),
    ]
}
