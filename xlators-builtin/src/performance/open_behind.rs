//! performance/open-behind: acknowledges opens of files for reading at
//! once and opens them below only when a fop needs the real fd, like
//! GlusterFS's open-behind.
//!
//! An OPEN of an existing file read-only (no `O_TRUNC`, `O_DIRECT`,
//! `O_CREAT`, `O_EXCL`, by gfid) is answered at once and remembered as not
//! opened yet. The first fop on that fd that needs it (read, lk, fgetxattr,
//! fsync, any other fd-based fop) first winds the real open (once;
//! concurrent fops wait for the same open, with the opener's credentials
//! and xdata), then itself; if that open fails, the fop and every later one
//! on the fd get its error. An FSTAT of a fd not opened yet is answered by
//! a STAT of its inode instead. FLUSH and RELEASE of a fd never opened
//! below are answered here and never go down, so a file read entirely from
//! performance/quick-read above costs no open, flush or release.
//!
//! An UNLINK that names its inode (the FUSE bridge does when the file is
//! still open) first opens that inode's deferred fds below, so they work
//! once the file has no name.
//!
//! With `lazy-open` off, the open is wound in the background at once and
//! the OPEN still answered without waiting for it. Other opens (for
//! writing, truncating, direct I/O) go down and are answered as before.
//!
//! The FUSE bridge's graph switch reopens every fd on the new graph with
//! OPEN (same fd id and flags, less create and truncate): such a reopen is
//! deferred again on the new graph, and the old graph's RELEASE of a fd
//! that was never opened there is answered here.
//!
//! Bounds: at most [`MAX_FDS`] fds not yet opened or opened late are
//! remembered; past that, opens go down at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use xlfs_sdk::options::{Opt, OptionDecl, kind};
use xlfs_sdk::slots::FdSlots;
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Errno, Fd, FdId, Fop, FopFuture, FopResult, InitCtx, InitError, Loc, Options, Reply, Request,
    Response, Xlator, XlatorType,
};

/// Most fds tracked at once (deferred, or opened late and not released).
pub const MAX_FDS: usize = 65536;

const LAZY: Opt<kind::Bool> = Opt::bool("lazy-open", true).desc(
    "Defer the open of a file opened read-only until a fop needs the open fd; a file only read from \
     quick-read's cache, then closed, is never opened. Off: the open is sent at once in the background.",
);
const READ_AFTER_OPEN: Opt<kind::Bool> = Opt::bool("read-after-open", true).desc(
    "A read on a deferred fd waits for the real open (GlusterFS's default). xlfs bricks have no anonymous \
     fds, so reads always open first; 'no' is accepted for volfile compatibility and behaves as 'yes'.",
);
const ANONYMOUS: Opt<kind::Bool> = Opt::bool("use-anonymous-fd", false).desc(
    "Serve fops of deferred fds through anonymous fds. xlfs bricks have no anonymous fds: accepted for \
     volfile compatibility, fops open the fd first either way.",
);

const OPTIONS: &[OptionDecl] = &[LAZY.decl, READ_AFTER_OPEN.decl, ANONYMOUS.decl];

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "performance/open-behind",
    description: "acknowledges read-only opens at once and opens below only when a fop needs the fd",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Acknowledged, not sent below.
    Lazy,
    /// The real open was wound (or is being wound).
    Started,
    /// Released; a fop arriving now gets EBADF.
    Released,
}

/// A fd whose open was acknowledged here.
struct LazyFd {
    ctx: CallCtx,
    /// The OPEN as it came.
    open: Request,
    phase: Mutex<Phase>,
    result: OnceCell<Result<(), Errno>>,
}

#[derive(Default)]
struct Stats {
    deferred: AtomicU64,
    avoided: AtomicU64,
    sent: AtomicU64,
    failed: AtomicU64,
    sync: AtomicU64,
    untracked: AtomicU64,
    fstat_as_stat: AtomicU64,
    flushes_absorbed: AtomicU64,
}

struct Inner {
    child: Child,
    fds: FdSlots<Arc<LazyFd>>,
    lazy: AtomicBool,
    read_after_open: AtomicBool,
    anonymous: AtomicBool,
    stats: Stats,
}

/// The open-behind translator.
pub struct OpenBehind {
    inner: Arc<Inner>,
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    Ok(Arc::new(OpenBehind::new(init)?))
}

/// Flags that make an open need the real fd at once.
const EAGER: i32 = libc::O_WRONLY
    | libc::O_RDWR
    | libc::O_TRUNC
    | libc::O_DIRECT
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_APPEND
    | libc::O_PATH
    | libc::O_TMPFILE;

/// True for an open that can be acknowledged before it is made.
fn deferrable(loc: &Loc, flags: u32) -> bool {
    !loc.gfid.is_null() && (flags & libc::O_ACCMODE as u32) == libc::O_RDONLY as u32 && flags & EAGER as u32 == 0
}

impl Inner {
    /// Makes the real open of `lf` below (once); its result.
    async fn ensure_open(&self, lf: &LazyFd) -> Result<(), Errno> {
        {
            let mut p = lf.phase.lock();
            if *p == Phase::Released {
                return Err(Errno::EBADF);
            }
            *p = Phase::Started;
        }
        *lf.result.get_or_init(|| self.open_below(lf)).await
    }

    /// Winds the real open (run once per fd, by [`OnceCell`]).
    async fn open_below(&self, lf: &LazyFd) -> Result<(), Errno> {
        self.stats.sent.fetch_add(1, Ordering::Relaxed);
        let r = self.child.call(lf.ctx.clone(), lf.open.clone()).await.map(drop);
        if let Err(e) = r {
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, fop = ?lf.open.fop, "open-behind: the deferred open failed");
        }
        r
    }

    /// Opens every deferred fd the fop uses, then winds it.
    async fn with_fds_open(&self, ctx: CallCtx, req: Request) -> FopResult {
        for fd in req.fop.fds() {
            if let Some(lf) = self.fds.get(&fd.id) {
                self.ensure_open(&lf).await?;
            }
        }
        self.child.call(ctx, req).await
    }

    /// An unlink naming its inode: the fds of that inode acknowledged here
    /// are opened below first, so they keep working once the file has no
    /// name (GlusterFS's ob_unlink does the same).
    async fn unlink(&self, ctx: CallCtx, req: Request, gfid: xlfs_sdk::Gfid) -> FopResult {
        let mut pending = Vec::new();
        self.fds.retain(|_, lf| {
            if matches!(&lf.open.fop, Fop::Open { loc, .. } if loc.gfid == gfid) && *lf.phase.lock() != Phase::Released
            {
                pending.push(lf.clone());
            }
            true
        });
        for lf in pending {
            let _ = self.ensure_open(&lf).await;
        }
        self.child.call(ctx, req).await
    }

    fn open(self: &Arc<Self>, ctx: CallCtx, req: Request, id: FdId) -> FopFuture<'static> {
        let lazy = self.lazy.load(Ordering::Relaxed);
        // Without a runtime a background open cannot be spawned.
        let rt = if lazy { None } else { tokio::runtime::Handle::try_current().ok() };
        if !lazy && rt.is_none() {
            return self.sync_open(ctx, req);
        }
        // An id still known here from an open never released: replace it
        // only if it was never opened below.
        if let Some(old) = self.fds.get(&id) {
            if *old.phase.lock() != Phase::Lazy {
                return self.sync_open(ctx, req);
            }
            self.fds.remove(&id);
        }
        let lf = Arc::new(LazyFd { ctx, open: req, phase: Mutex::new(Phase::Lazy), result: OnceCell::new() });
        if self.fds.insert(id, lf.clone()).is_err() {
            self.stats.untracked.fetch_add(1, Ordering::Relaxed);
            return self.sync_open(lf.ctx.clone(), lf.open.clone());
        }
        self.stats.deferred.fetch_add(1, Ordering::Relaxed);
        if let Some(rt) = rt {
            let inner = self.clone();
            rt.spawn(async move {
                let _ = inner.ensure_open(&lf).await;
            });
        }
        Box::pin(std::future::ready(Ok(Response::from(Reply::Empty))))
    }

    fn sync_open(self: &Arc<Self>, ctx: CallCtx, req: Request) -> FopFuture<'static> {
        self.stats.sync.fetch_add(1, Ordering::Relaxed);
        let inner = self.clone();
        Box::pin(async move { inner.child.call(ctx, req).await })
    }

    async fn flush(&self, ctx: CallCtx, req: Request, fd: Fd) -> FopResult {
        if let Some(lf) = self.fds.get(&fd.id) {
            let phase = *lf.phase.lock();
            match phase {
                Phase::Lazy => {
                    self.stats.flushes_absorbed.fetch_add(1, Ordering::Relaxed);
                    return Ok(Response::from(Reply::Empty));
                }
                Phase::Released => return Err(Errno::EBADF),
                Phase::Started => self.ensure_open(&lf).await?,
            }
        }
        self.child.call(ctx, req).await
    }

    async fn release(&self, ctx: CallCtx, req: Request, fd: Fd) -> FopResult {
        let Some(lf) = self.fds.remove(&fd.id) else { return self.child.call(ctx, req).await };
        let was = std::mem::replace(&mut *lf.phase.lock(), Phase::Released);
        if was != Phase::Started {
            self.stats.avoided.fetch_add(1, Ordering::Relaxed);
            return Ok(Response::from(Reply::Empty));
        }
        // Opened (or being opened) below: release it there once it is.
        let opened = *lf.result.get_or_init(|| self.open_below(&lf)).await;
        match opened {
            Ok(()) => self.child.call(ctx, req).await,
            Err(_) => Ok(Response::from(Reply::Empty)),
        }
    }

    async fn fstat(&self, ctx: CallCtx, req: Request, fd: Fd) -> FopResult {
        let lazy = self.fds.get(&fd.id).filter(|lf| *lf.phase.lock() == Phase::Lazy).is_some();
        if lazy && !fd.gfid.is_null() {
            self.stats.fstat_as_stat.fetch_add(1, Ordering::Relaxed);
            let stat = Request::with_xdata(Fop::Stat { loc: Loc::gfid(fd.gfid) }, req.xdata);
            return self.child.call(ctx, stat).await;
        }
        self.with_fds_open(ctx, req).await
    }
}

impl OpenBehind {
    fn new(init: InitCtx) -> Result<OpenBehind, InitError> {
        let child = init.children.into_iter().next().ok_or_else(|| InitError::new("needs one child"))?;
        let o = &init.options;
        Ok(OpenBehind {
            inner: Arc::new(Inner {
                child,
                fds: FdSlots::with_capacity(MAX_FDS),
                lazy: AtomicBool::new(LAZY.get(o)),
                read_after_open: AtomicBool::new(READ_AFTER_OPEN.get(o)),
                anonymous: AtomicBool::new(ANONYMOUS.get(o)),
                stats: Stats::default(),
            }),
        })
    }
}

impl Xlator for OpenBehind {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let inner = &self.inner;
        match &req.fop {
            Fop::Open { loc, flags, fd } => {
                let (lazy, id) = (deferrable(loc, *flags), *fd);
                if lazy { inner.open(ctx, req, id) } else { inner.sync_open(ctx, req) }
            }
            Fop::Flush { fd } => {
                let fd = *fd;
                Box::pin(inner.flush(ctx, req, fd))
            }
            Fop::Release { fd } => {
                let fd = *fd;
                Box::pin(inner.release(ctx, req, fd))
            }
            Fop::Fstat { fd } => {
                let fd = *fd;
                Box::pin(inner.fstat(ctx, req, fd))
            }
            Fop::Unlink { loc, .. } if !loc.gfid.is_null() => {
                let gfid = loc.gfid;
                Box::pin(inner.unlink(ctx, req, gfid))
            }
            fop => {
                if fop.fds().any(|fd| inner.fds.get(&fd.id).is_some()) {
                    Box::pin(inner.with_fds_open(ctx, req))
                } else {
                    inner.child.call(ctx, req)
                }
            }
        }
    }

    fn reconfigure(&self, o: &Options) -> Result<(), ReconfigureError> {
        let i = &self.inner;
        i.lazy.store(LAZY.get(o), Ordering::Relaxed);
        i.read_after_open.store(READ_AFTER_OPEN.get(o), Ordering::Relaxed);
        i.anonymous.store(ANONYMOUS.get(o), Ordering::Relaxed);
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let i = &self.inner;
        let s = &i.stats;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        vec![
            ("lazy-open".into(), i.lazy.load(Ordering::Relaxed).to_string()),
            ("read-after-open".into(), i.read_after_open.load(Ordering::Relaxed).to_string()),
            ("use-anonymous-fd".into(), i.anonymous.load(Ordering::Relaxed).to_string()),
            ("fds".into(), i.fds.len().to_string()),
            ("opens-deferred".into(), n(&s.deferred)),
            ("opens-avoided".into(), n(&s.avoided)),
            ("opens-sent".into(), n(&s.sent)),
            ("opens-failed".into(), n(&s.failed)),
            ("opens-sync".into(), n(&s.sync)),
            ("opens-untracked".into(), n(&s.untracked)),
            ("fstat-as-stat".into(), n(&s.fstat_as_stat)),
            ("flushes-absorbed".into(), n(&s.flushes_absorbed)),
        ]
    }
}

#[cfg(test)]
mod tests;
