//! performance/write-behind: acknowledges writes as soon as they are queued
//! and sends them to the child in the background, aggregated, like
//! GlusterFS's write-behind on a client. It sits above cluster/replicate,
//! where one write waits for every brick, so a writer no longer pays that
//! round trip per write.
//!
//! **Queue.** Each inode has a queue of writes acknowledged but not yet
//! completed by the child (GlusterFS's liabilities), in arrival order. A
//! write contiguous with the queue's tail (same fd, no xdata) is merged into
//! it up to `aggregate-size` bytes. Entries are sent from the head in order:
//! an entry never overtakes an earlier one it overlaps (with
//! `strict-write-ordering` nothing overtakes anything: one child write at a
//! time), so the final data is what the application wrote last. A partial
//! tail batch waits for more data while another write of the inode is in
//! flight (with `trickling-writes`; without it, until something needs the
//! queue drained), which is how small writes aggregate.
//!
//! **Window.** The queued bytes of an inode stay below `cache-size`; a write
//! that does not fit waits until the queue drains below it. The number of
//! queue entries per inode ([`MAX_ENTRIES`]), of inodes with state
//! ([`MAX_INODES`], idle ones are evicted oldest first), of fds tracked
//! ([`MAX_FDS`]) and the bytes queued over all inodes ([`TOTAL_WINDOWS`]
//! windows) are bounded too; past the global byte bound a write is sent
//! synchronously instead.
//!
//! **Attributes.** The write reply is `PrePost`, and upper layers use it (the
//! FUSE bridge answers GETATTR from the last write's post attributes). So
//! the translator keeps per inode the last attributes that passed through
//! (create/lookup entries, stat/fstat, readv, and the pre/post replies of
//! writes, setattr, truncate, fsync, fallocate...) and synthesizes a queued
//! write's `post` from them: size grown to cover every queued write, blocks
//! recomputed, mtime/ctime now. A write on an inode with no known attributes
//! is sent synchronously and its real reply seeds them: nothing is invented.
//! A reply that was overtaken by a later change of the inode's attributes
//! (a generation count) does not overwrite them, nor does one to a fop sent
//! before another client's change was announced (an invalidation upcall),
//! whether the inode was tracked here then or not.
//!
//! **Reads and attributes of a dirty inode.** A read entirely covered by
//! queued data is answered from the queue; otherwise the queued writes it
//! could see are drained first. Stat, fstat and lookup by gfid of an inode
//! with queued writes drain first, so their answers are exact. Readdirp
//! entries and lookups by name do not drain; the child may also have read
//! the file before a write that was already acknowledged reached it, and
//! answered after it came back. So an entry of an inode with writes queued,
//! or one whose write came back (or attributes changed) while the readdirp
//! or lookup was in flight, gets this translator's size and times, and the
//! file content read with it (quick-read's) is taken out of the reply: the
//! kernel, md-cache and quick-read above would otherwise keep a size or
//! bytes from before a write the application saw finish. The state of such
//! an inode is kept until those fops end.
//!
//! **Barriers.** Fsync, flush (without flush-behind), release, truncate,
//! ftruncate, setattr and fsetattr (unless taken behind, below),
//! fallocate, discard, zerofill, copy_file_range (both inodes), lk, seek
//! and rchecksum wait for the inode's queued writes to complete, then go
//! down.
//!
//! **Setattr behind** (`setattr-behind`, xlfs only). A setattr of the
//! mode, owner or times of a regular file that is open here (an fd seen
//! opening it) and whose attributes are known is answered at once, with
//! the attributes it will give, when its outcome can be told here: the
//! caller is root, or the owner changing mode (no set-id bit) or times,
//! and it is not a new owner of a set-id file (the brick would clear the
//! set-id bits). It is queued as a barrier entry: sent (as an fsetattr on
//! one of the file's fds, stamped with the time it was answered, which
//! the bricks keep as the ctime) when everything queued before it has
//! completed, and nothing queued after it is sent before it has
//! completed. A queued setattr not yet sent takes the next ones in
//! unless that would reorder a chmod before a chown; so tar's futimens,
//! fchown and fchmod after a file's data cost one child fop, sent behind
//! the data, and no round trip the application waits for. Every other
//! fop on the inode (xattrs, ACLs, access, a read, a stat) waits for the
//! queued setattrs first; listings and lookups by name show them. A
//! failure is reported like a write's. With `flush-behind` a
//! flush answers at once (with a deferred error if one is pending) and is
//! sent after the queue drains; release waits for those background flushes
//! too, so the brick never sees a release before the fd's writes and flush.
//!
//! **Fsync in one round.** An fsync that finds its inode's only queued
//! write not yet sent (and nothing in flight) sends that write with
//! `O_DSYNC` (`O_SYNC` for a full fsync) and answers with its reply: the
//! child writes and then fsyncs the file, and every other write of the
//! inode has already completed there, so one round does what a write
//! round and an fsync round did. An fsync that finds writes queued or in
//! flight marks the inode as one that fsyncs follow; its partial tail then
//! waits up to [`SYNC_HOLD`] for the fsync instead of trickling ahead (if
//! none comes, it is sent and the inode trickles again).
//!
//! **Writes not delayed.** Writes with `O_SYNC`/`O_DSYNC` (in the write's
//! flags or the fd's open flags, recorded from open and create), on
//! `O_APPEND` fds (the brick chooses their offset) and, with
//! `strict-O_DIRECT` (on here by default), `O_DIRECT` writes drain the
//! inode's earlier writes and are then sent synchronously.
//!
//! **Errors.** A background write that fails is logged (`warn`, with the
//! gfid) and its errno is kept on the inode and on the fd that wrote it; the
//! next write, fsync or flush on the file returns it and clears it (the fd's
//! own error is still returned by that fd's close even if another fd
//! consumed the inode's). Without `resync-failed-syncs-after-fsync` the
//! failed data is dropped, as GlusterFS does; with it the failed writes stay
//! queued and are retried by the next fsync (which still fails with the
//! error), drain or full window, until a flush or release makes a last
//! attempt.
//!
//! Background sends are tokio tasks; `fini` aborts those still running (and
//! logs what was not written).
//!
//! The queues are `queue`, the per-fop rules `fops`; this file holds the
//! options, sending a queue to the child and the Xlator impl.

mod fops;
mod queue;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use xlfs_sdk::dict::keys;
use xlfs_sdk::options::{Opt, OptionDecl, kind};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, Fd, FdId, FileType, Fop, FopFuture, FopResult, Gfid, Iatt, InitCtx,
    InitError, Options, Reply, Request, Response, SetAttr, Timespec, Upcall, Xlator, XlatorType,
};

use queue::*;

/// Most inodes with write-behind state; idle ones are evicted past it.
pub const MAX_INODES: usize = 16384;
/// Most fds whose open flags and errors are tracked.
pub const MAX_FDS: usize = 65536;
/// Most queue entries per inode (small scattered writes do not merge).
pub const MAX_ENTRIES: usize = 1024;
/// Most batches of one inode in flight to the child at once.
pub const MAX_IN_FLIGHT: usize = 16;
/// Bytes queued over all inodes are bounded by this many `cache-size`s.
pub const TOTAL_WINDOWS: u64 = 16;
/// How long a partial write of an inode that fsyncs follow waits for that
/// fsync before it is sent anyway (and the inode trickles again).
pub const SYNC_HOLD: std::time::Duration = std::time::Duration::from_millis(1);

const CACHE_SIZE: Opt<kind::Size> = Opt::size("cache-size", "4MB").range(524288.0, 1073741824.0).desc(
    "Size of the write-behind buffer of a single file (inode): bytes acknowledged to the application \
         but not yet written by the child. A write that does not fit waits until earlier writes drain. \
         (GlusterFS's default is 1MB; 4MB keeps four 1MB child writes in flight, measured in \
         benches/RESULTS.md.)",
);
const WINDOW_SIZE: Opt<kind::Size> = Opt::optional("window-size")
    .range(524288.0, 1073741824.0)
    .desc("Old name of cache-size (GlusterFS accepts both keys); cache-size wins when both are given.");
const AGGREGATE_SIZE: Opt<kind::Size> = Opt::size("aggregate-size", "1MB").range(4096.0, 1073741824.0).desc(
    "Contiguous queued writes are merged into one child write of up to this many bytes; must not \
         exceed cache-size. When not set: 1MB, or a quarter of cache-size if that is smaller. (GlusterFS's \
         default is 128KB; 1MB child writes cost a sequential writer about 15 % less CPU per GiB over \
         replica 3.)",
);
const FLUSH_BEHIND: Opt<kind::Bool> = Opt::bool("flush-behind", true).desc(
    "Answer flush (each close) at once, with the error of an earlier failed write if one is pending, \
         and send it to the child in the background after the file's queued writes.",
);
const STRICT_O_DIRECT: Opt<kind::Bool> = Opt::bool("strict-O_DIRECT", true).desc(
    "When on, writes on O_DIRECT fds (or with O_DIRECT in the write's flags) are not delayed: earlier \
         writes drain and the write is sent synchronously. When off, O_DIRECT is ignored, as GlusterFS's \
         default (off) does; xlfs defaults to on so that O_DIRECT writers get what they asked for. \
         O_SYNC and O_DSYNC writes are never delayed.",
);
const STRICT_WRITE_ORDERING: Opt<kind::Bool> = Opt::bool("strict-write-ordering", false).desc(
    "Do not let later writes overtake earlier ones even when they do not overlap: one child write per file at a time.",
);
const TRICKLING_WRITES: Opt<kind::Bool> = Opt::bool("trickling-writes", true).desc(
    "Send a partial batch at once when nothing else of the file is in flight; when off, a partial \
         batch waits until it reaches aggregate-size or something needs the queue drained (fsync, flush, \
         a read of it, a full window).",
);
const RESYNC_FAILED_SYNCS_AFTER_FSYNC: Opt<kind::Bool> = Opt::bool("resync-failed-syncs-after-fsync", false).desc(
    "If background writes fail, keep them queued and retry them (at the next fsync, which still fails \
         with the error, or drain) until a flush or a successful sync, instead of dropping them.",
);

const SETATTR_BEHIND: Opt<kind::Bool> = Opt::bool("setattr-behind", true).desc(
    "Answer a setattr of mode, owner or times of a file open on this client at once, from the attributes \
         known here, and send it behind the file's queued writes (as an fsetattr on one of its fds), as \
         writes are: tar's futimens, fchown and fchmod after each file's data then cost no round trip. Only \
         for root, or for the file's owner changing its mode (without set-id bits) or times; not for a \
         change of owner of a set-id file. A failure is returned by the next write, fsync or close of the \
         file. xlfs only.",
);

const OPTIONS: &[OptionDecl] = &[
    CACHE_SIZE.decl,
    WINDOW_SIZE.decl,
    AGGREGATE_SIZE.decl,
    FLUSH_BEHIND.decl,
    STRICT_O_DIRECT.decl,
    STRICT_WRITE_ORDERING.decl,
    TRICKLING_WRITES.decl,
    RESYNC_FAILED_SYNCS_AFTER_FSYNC.decl,
    SETATTR_BEHIND.decl,
];

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "performance/write-behind",
    description: "acknowledges writes once queued and sends them to the child in the background, aggregated",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

const O_SYNC: u32 = libc::O_SYNC as u32;
const O_DSYNC: u32 = libc::O_DSYNC as u32;
const O_DIRECT: u32 = libc::O_DIRECT as u32;
const O_APPEND: u32 = libc::O_APPEND as u32;
const O_TRUNC: u32 = libc::O_TRUNC as u32;

#[derive(Clone, Copy, Debug)]
struct Conf {
    window: u64,
    aggregate: u64,
    flush_behind: bool,
    strict_o_direct: bool,
    strict_ordering: bool,
    trickling: bool,
    resync: bool,
    setattr_behind: bool,
}

fn conf(o: &Options) -> Result<Conf, String> {
    // window-size is GlusterFS's older name; cache-size wins when both are given.
    let window = match (CACHE_SIZE.given(o), WINDOW_SIZE.given(o)) {
        (None, Some(w)) => w,
        _ => CACHE_SIZE.get(o),
    };
    let aggregate = AGGREGATE_SIZE.given(o).unwrap_or_else(|| AGGREGATE_SIZE.get(o).min(window / 4));
    if window < aggregate {
        return Err(format!("cache-size ({window} bytes) is smaller than aggregate-size ({aggregate} bytes)"));
    }
    Ok(Conf {
        window,
        aggregate,
        flush_behind: FLUSH_BEHIND.get(o),
        strict_o_direct: STRICT_O_DIRECT.get(o),
        strict_ordering: STRICT_WRITE_ORDERING.get(o),
        trickling: TRICKLING_WRITES.get(o),
        resync: RESYNC_FAILED_SYNCS_AFTER_FSYNC.get(o),
        setattr_behind: SETATTR_BEHIND.get(o),
    })
}

struct Inner {
    child: Child,
    t: Mutex<Table>,
}

/// The write-behind translator.
pub struct WriteBehind {
    inner: Arc<Inner>,
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let conf = conf(&init.options).map_err(InitError::new)?;
    let child = init.children.into_iter().next().ok_or_else(|| InitError::new("needs one child"))?;
    Ok(Arc::new(WriteBehind { inner: Arc::new(Inner { child, t: Mutex::new(Table::new(conf)) }) }))
}

fn now_ts() -> Timespec {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Timespec { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() }
}

fn have_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// Marks an inode busy (and optionally draining) while a caller waits on it.
struct Hold {
    inner: Arc<Inner>,
    gfid: Gfid,
    drain: bool,
}

impl Hold {
    /// Holds `gfid`; with `drain`, parked writes are retried and partial
    /// batches sent at once.
    fn new(inner: &Arc<Inner>, t: &mut Table, gfid: Gfid, drain: bool) -> Hold {
        if let Some(i) = t.slot(gfid) {
            i.busy += 1;
            if drain {
                i.drainers += 1;
            }
        }
        if drain {
            inner.unpark(t, gfid, u64::MAX, false);
            inner.pump(t, gfid);
        }
        Hold { inner: inner.clone(), gfid, drain }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut t = self.inner.t.lock();
        if let Some(i) = t.inodes.get_mut(&self.gfid) {
            i.busy = i.busy.saturating_sub(1);
            if self.drain {
                i.drainers = i.drainers.saturating_sub(1);
            }
        }
    }
}

impl Inner {
    /// Spawns a background task tracked for `fini`.
    fn spawn(self: &Arc<Self>, t: &mut Table, f: impl Future<Output = ()> + Send + 'static) {
        let id = t.next_task;
        t.next_task += 1;
        let inner = self.clone();
        let h = tokio::spawn(async move {
            f.await;
            inner.t.lock().tasks.remove(&id);
        });
        t.tasks.insert(id, h.abort_handle());
    }

    /// Makes the parked writes up to `upto` queued again (a retry).
    fn unpark(&self, t: &mut Table, gfid: Gfid, upto: u64, last_attempt: bool) {
        let Table { inodes, stats, .. } = t;
        let Some(i) = inodes.get_mut(&gfid) else { return };
        for e in i.entries.iter_mut().filter(|e| e.seq <= upto) {
            if e.state == State::Parked {
                e.state = State::Queued;
                stats.retries += 1;
            }
            if last_attempt {
                e.last_attempt = true;
            }
        }
    }

    /// Sends what may go now of the inode's queue, in order.
    fn pump(self: &Arc<Self>, t: &mut Table, gfid: Gfid) {
        if t.closed || !have_runtime() {
            return;
        }
        let conf = t.conf;
        let mut sends = Vec::new();
        let mut arm = false;
        {
            let Some(i) = t.inodes.get_mut(&gfid) else { return };
            let n = i.entries.len();
            let mut in_flight = i.entries.iter().filter(|e| e.state == State::InFlight).count();
            for idx in 0..n {
                let e = &i.entries[idx];
                match e.state {
                    State::InFlight => continue,
                    State::Parked => break,
                    State::Queued => {}
                }
                if in_flight >= MAX_IN_FLIGHT || (conf.strict_ordering && in_flight > 0) {
                    break;
                }
                // A setattr overlaps every entry: it waits here for all
                // those before it, and all after it wait for it.
                if i.entries.iter().take(idx).any(|p| p.state == State::InFlight && p.overlaps(e)) {
                    break;
                }
                if e.attr.is_some() {
                    let (seq, ctx, req) = i.entries[idx].send(0);
                    sends.push((seq, ctx, req, 0));
                    break;
                }
                let partial_tail = idx + 1 == n && e.len < conf.aggregate;
                let trickle = conf.trickling && in_flight == 0;
                if partial_tail && i.drainers == 0 && (!trickle || i.sync_heavy) {
                    arm = trickle && !i.hold_timer;
                    break;
                }
                let e = &mut i.entries[idx];
                in_flight += 1;
                let len = e.len;
                let (seq, ctx, req) = e.send(0);
                sends.push((seq, ctx, req, len));
            }
            if arm {
                i.hold_timer = true;
            }
        }
        if arm {
            let inner = self.clone();
            self.spawn(t, async move {
                tokio::time::sleep(SYNC_HOLD).await;
                let mut t = inner.t.lock();
                if let Some(i) = t.inodes.get_mut(&gfid) {
                    i.hold_timer = false;
                    // No fsync came for the held write: trickle again.
                    if i.entries.iter().any(|e| e.state == State::Queued) {
                        i.sync_heavy = false;
                    }
                }
                inner.pump(&mut t, gfid);
            });
        }
        for (seq, ctx, req, len) in sends {
            t.stats.batches_sent += 1;
            t.stats.bytes_sent += len;
            let inner = self.clone();
            self.spawn(t, async move {
                let res = inner.child.call(ctx, req).await;
                inner.landed(gfid, seq, res);
            });
        }
    }

    /// A background write came back.
    fn landed(self: &Arc<Self>, gfid: Gfid, seq: u64, res: FopResult) {
        let mut guard = self.t.lock();
        let t = &mut *guard;
        let resync = t.conf.resync;
        let Table { inodes, fds, stats, total, clock, setattrs, .. } = t;
        let Some(i) = inodes.get_mut(&gfid) else { return };
        let Some(pos) = i.entries.iter().position(|e| e.seq == seq) else { return };
        // Failed or not, the write may have reached the file.
        *clock += 1;
        i.changed = *clock;
        match res {
            Ok(resp) => {
                if let Some(e) = i.entries.remove(pos) {
                    i.bytes = i.bytes.saturating_sub(e.len);
                    *total = total.saturating_sub(e.len);
                    *setattrs -= usize::from(e.attr.is_some());
                }
                if let Reply::PrePost { post, .. } = resp.reply {
                    i.absorb_write(post);
                }
            }
            Err(errno) => {
                stats.errors_deferred += 1;
                i.error = Some(errno);
                let keep = resync && i.entries.get(pos).is_some_and(|e| !e.last_attempt && e.attr.is_none());
                if let Some(e) = i.entries.get_mut(pos) {
                    let what = if e.attr.is_some() { "setattr" } else { "write" };
                    tracing::warn!(
                        %gfid, fd = e.fd.id.0, offset = e.offset, len = e.len, error = %errno, retry = keep,
                        "write-behind: a background {what} failed; the error is returned by the next write, fsync or flush of the file"
                    );
                    if let Some(f) = fds.get_mut(&e.fd.id) {
                        f.error = Some(errno);
                    }
                    if keep {
                        e.state = State::Parked;
                    }
                }
                if !keep && let Some(e) = i.entries.remove(pos) {
                    i.bytes = i.bytes.saturating_sub(e.len);
                    *total = total.saturating_sub(e.len);
                    *setattrs -= usize::from(e.attr.is_some());
                }
            }
        }
        i.notify.notify_waiters();
        self.pump(t, gfid);
    }

    /// Waits until `done` holds for the table (checked under its lock),
    /// woken by the inode's notifications. Returns at once if the inode has
    /// no state.
    async fn wait<R>(&self, gfid: Gfid, mut done: impl FnMut(&mut Table) -> Option<R>) -> Option<R> {
        loop {
            let notify = self.t.lock().inodes.get(&gfid).map(|i| i.notify.clone())?;
            let mut n = pin!(notify.notified());
            n.as_mut().enable();
            {
                let mut t = self.t.lock();
                if !t.inodes.contains_key(&gfid) {
                    return None;
                }
                if let Some(r) = done(&mut t) {
                    return Some(r);
                }
            }
            n.await;
        }
    }

    /// Waits until every write queued on `gfid` so far has been sent and
    /// answered (or parked after failing). `last_attempt`: parked writes are
    /// retried one last time and dropped if they fail again.
    async fn drain(self: &Arc<Self>, gfid: Gfid, last_attempt: bool) {
        let (upto, _hold) = {
            let mut t = self.t.lock();
            if t.inodes.get(&gfid).is_none_or(|i| i.entries.is_empty()) {
                return;
            }
            let upto = t.seq;
            self.unpark(&mut t, gfid, upto, last_attempt);
            (upto, Hold::new(self, &mut t, gfid, true))
        };
        self.wait(gfid, |t| {
            let i = t.inodes.get(&gfid)?;
            i.entries.iter().all(|e| e.seq > upto || e.state == State::Parked).then_some(())
        })
        .await;
    }

    /// Waits until the inode's background flushes are answered.
    async fn wait_bg(&self, gfid: Gfid) {
        self.wait(gfid, |t| t.inodes.get(&gfid).is_none_or(|i| i.bg == 0).then_some(())).await;
    }
}

impl Xlator for WriteBehind {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let inner = self.inner.clone();
        match &req.fop {
            Fop::Writev { .. } => Box::pin(async move { inner.writev(ctx, req).await }),
            Fop::Readv { .. } => Box::pin(async move { inner.readv(ctx, req).await }),
            Fop::Fsync { .. } => Box::pin(async move { inner.fsync(ctx, req).await }),
            Fop::Flush { .. } => Box::pin(async move { inner.flush(ctx, req).await }),
            Fop::Release { .. } => Box::pin(async move { inner.release(ctx, req).await }),
            Fop::Ipc { op } if *op == xlfs_sdk::IPC_DRAIN => Box::pin(async move { inner.drain_all(ctx, req).await }),
            Fop::Fstat { fd } => {
                let g = fd.gfid;
                Box::pin(async move { inner.lookup_or_stat(g, ctx, req).await })
            }
            Fop::Stat { loc } | Fop::Lookup { loc } => {
                let g = loc.gfid;
                Box::pin(async move { inner.lookup_or_stat(g, ctx, req).await })
            }
            Fop::Open { loc, flags, .. } if flags & O_TRUNC != 0 => {
                let g = [loc.gfid];
                Box::pin(async move { inner.barrier(&g, ctx, req).await })
            }
            Fop::Open { loc, .. } | Fop::Create { loc, .. } => {
                let g = loc.gfid;
                Box::pin(async move { inner.forward(g, ctx, req).await })
            }
            Fop::Setattr { .. } | Fop::Fsetattr { .. } => Box::pin(async move { inner.setattr(ctx, req).await }),
            Fop::Truncate { loc, .. } => {
                let g = [loc.gfid];
                Box::pin(async move { inner.barrier(&g, ctx, req).await })
            }
            Fop::Ftruncate { fd, .. }
            | Fop::Fallocate { fd, .. }
            | Fop::Discard { fd, .. }
            | Fop::Zerofill { fd, .. }
            | Fop::Lk { fd, .. }
            | Fop::Seek { fd, .. }
            | Fop::Rchecksum { fd, .. } => {
                let g = [fd.gfid];
                Box::pin(async move { inner.barrier(&g, ctx, req).await })
            }
            Fop::CopyFileRange { fd_in, fd_out, .. } => {
                let g = [fd_in.gfid, fd_out.gfid];
                Box::pin(async move { inner.barrier(&g, ctx, req).await })
            }
            Fop::Readdirp { .. } => Box::pin(async move { inner.readdirp(ctx, req).await }),
            Fop::Forget { gfid } => {
                let mut t = self.inner.t.lock();
                let oldest = t.oldest_read();
                if t.inodes.get(gfid).is_some_and(|i| i.removable(oldest)) {
                    t.remove(gfid);
                }
                drop(t);
                self.inner.child.call(ctx, req)
            }
            _ => {
                // Anything else on an inode with a deferred setattr (its
                // xattrs, ACLs, an access check...) comes after it.
                let behind = inner.behind_setattrs(&req.fop);
                if behind.is_empty() {
                    return self.inner.child.call(ctx, req);
                }
                Box::pin(async move {
                    for g in behind {
                        inner.drain(g, false).await;
                    }
                    inner.child.call(ctx, req).await
                })
            }
        }
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        if let Event::Upcall(Upcall::Invalidate { gfid }) = &event {
            self.inner.t.lock().unknown(*gfid);
        }
        match from {
            EventFrom::Child(_) => Some(event),
            EventFrom::Graph => None,
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        let c = conf(options).map_err(ReconfigureError::Invalid)?;
        let mut t = self.inner.t.lock();
        t.conf = c;
        let gfids: Vec<Gfid> = t.inodes.keys().copied().collect();
        for g in gfids {
            self.inner.pump(&mut t, g);
            if let Some(i) = t.inodes.get(&g) {
                i.notify.notify_waiters();
            }
        }
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let t = self.inner.t.lock();
        let c = t.conf;
        let s = t.stats;
        let entries: usize = t.inodes.values().map(|i| i.entries.len()).sum();
        let pending: usize = t.inodes.values().filter(|i| i.error.is_some()).count();
        [
            ("cache-size", c.window.to_string()),
            ("aggregate-size", c.aggregate.to_string()),
            ("flush-behind", c.flush_behind.to_string()),
            ("strict-O_DIRECT", c.strict_o_direct.to_string()),
            ("strict-write-ordering", c.strict_ordering.to_string()),
            ("trickling-writes", c.trickling.to_string()),
            ("resync-failed-syncs-after-fsync", c.resync.to_string()),
            ("inodes", t.inodes.len().to_string()),
            ("fds", t.fds.len().to_string()),
            ("queue-entries", entries.to_string()),
            ("queued-bytes", t.total.to_string()),
            ("background-tasks", t.tasks.len().to_string()),
            ("errors-pending", pending.to_string()),
            ("writes-queued", s.writes_queued.to_string()),
            ("writes-aggregated", s.writes_aggregated.to_string()),
            ("writes-sync", s.writes_sync.to_string()),
            ("bytes-queued", s.bytes_queued.to_string()),
            ("batches-sent", s.batches_sent.to_string()),
            ("bytes-sent", s.bytes_sent.to_string()),
            ("read-hits", s.read_hits.to_string()),
            ("reads-drained", s.reads_drained.to_string()),
            ("errors-deferred", s.errors_deferred.to_string()),
            ("errors-returned", s.errors_returned.to_string()),
            ("window-waits", s.window_waits.to_string()),
            ("retries", s.retries.to_string()),
            ("evictions", s.evictions.to_string()),
            ("flushes-behind", s.flushes_behind.to_string()),
            ("fsyncs-merged", s.fsyncs_merged.to_string()),
            ("setattr-behind", c.setattr_behind.to_string()),
            ("setattrs-behind", s.setattrs_behind.to_string()),
            ("setattrs-merged", s.setattrs_merged.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn fini(&self) {
        let mut t = self.inner.t.lock();
        t.closed = true;
        for (_, h) in t.tasks.drain() {
            h.abort();
        }
        for (gfid, i) in t.inodes.drain() {
            if !i.entries.is_empty() {
                tracing::warn!(%gfid, bytes = i.bytes, writes = i.entries.len(), "write-behind: queued writes dropped at fini");
            }
            i.notify.notify_waiters();
        }
        t.fds.clear();
        t.total = 0;
        t.setattrs = 0;
    }
}

#[cfg(test)]
mod tests;
