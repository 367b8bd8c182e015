//! features/utime: stamps every change a client makes with one time
//! (GlusterFS's `features/utime`, the client half of its `ctime`
//! feature). A fop that changes an inode's data, attributes or a
//! directory's entries gets this client's clock in its xdata ([`UTIME`],
//! nanoseconds since the epoch) unless it carries one already; it sits
//! above cluster/distribute and cluster/replicate, so every copy and every
//! subvolume a fop reaches gets the same time, and storage/posix keeps it
//! as the inode's ctime, mtime (and atime) instead of its own clock's
//! (see storage/posix's `ctime` option). Fops that change nothing pass
//! unchanged. It has no options.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use xlfs_sdk::dict::keys::UTIME;
use xlfs_sdk::{CallCtx, Child, Fop, FopFuture, InitCtx, InitError, Request, Timespec, Value, Xlator, XlatorType};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "features/utime",
    description: "stamps each change with the client's time, which the bricks keep as the inode's times",
    options: &[],
    min_children: 1,
    max_children: 1,
    build: |init| Ok(Arc::new(Utime::new(init)?)),
};

struct Utime {
    child: Child,
    stamped: AtomicU64,
}

/// True for fops whose changes storage/posix records from the stamp.
fn stamps(fop: &Fop) -> bool {
    match fop {
        // Replicate's own counters: bookkeeping, not a change to show.
        Fop::Xattrop { .. } | Fop::Fxattrop { .. } => false,
        Fop::Open { flags, .. } => *flags & libc::O_TRUNC as u32 != 0,
        Fop::Writev { .. } | Fop::Create { .. } | Fop::Fallocate { .. } | Fop::CopyFileRange { .. } => true,
        fop => fop.is_modifying(),
    }
}

impl Utime {
    fn new(init: InitCtx) -> Result<Utime, InitError> {
        let InitCtx { name, mut children, .. } = init;
        if children.len() != 1 {
            return Err(InitError::new(format!(
                "{name}: features/utime takes exactly one subvolume, got {}",
                children.len()
            )));
        }
        Ok(Utime { child: children.remove(0), stamped: AtomicU64::new(0) })
    }
}

impl Xlator for Utime {
    fn call(&self, ctx: CallCtx, mut req: Request) -> FopFuture<'_> {
        if stamps(&req.fop) && !req.xdata.contains(UTIME) {
            req.xdata.set(UTIME, Value::U64(Timespec::now().to_nanos()));
            self.stamped.fetch_add(1, Ordering::Relaxed);
        }
        self.child.call(ctx, req)
    }

    fn dump(&self) -> Vec<(String, String)> {
        vec![("stamped".to_string(), self.stamped.load(Ordering::Relaxed).to_string())]
    }
}

#[cfg(test)]
mod tests {
    use xlfs_sdk::testing::{MockChild, init};
    use xlfs_sdk::{Dict, Fd, FdId, Gfid, Loc};

    use super::*;

    #[tokio::test]
    async fn changes_are_stamped_once_and_reads_pass_unchanged() {
        let rec = MockChild::new();
        let (ictx, _) = init(&[], &[], &[rec.child()]);
        let u = Utime::new(ictx).expect("utime");
        let fd = Fd { id: FdId(1), gfid: Gfid::ROOT };
        let write = Fop::Writev { fd, data: bytes::Bytes::from_static(b"x"), offset: 0, flags: 0 };
        let _ = u.call(CallCtx::root("t"), Request::new(write)).await;
        let _ = u.call(CallCtx::root("t"), Request::new(Fop::Stat { loc: Loc::root() })).await;
        let given = Dict::new().with(UTIME, Value::U64(42));
        let mkdir = Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 };
        let _ = u.call(CallCtx::root("t"), Request::with_xdata(mkdir, given)).await;
        let xop = Fop::Fxattrop { fd, op: xlfs_sdk::XattropOp::AddArray, xattrs: Dict::new() };
        let _ = u.call(CallCtx::root("t"), Request::new(xop)).await;
        let seen = rec.calls();
        let stamp = |i: usize| seen[i].1.xdata.get_u64(UTIME);
        let now = Timespec::now().to_nanos();
        assert!(stamp(0).is_some_and(|t| t <= now && now - t < 60_000_000_000), "a write is stamped: {:?}", stamp(0));
        assert_eq!(stamp(1), None, "a stat is not");
        assert_eq!(stamp(2), Some(42), "a stamp already there is kept");
        assert_eq!(stamp(3), None, "replicate's counters are not");
        assert_eq!(u.dump(), vec![("stamped".to_string(), "1".to_string())]);
    }
}
