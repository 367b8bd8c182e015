//! `volume rebalance`: a crawl of the volume, run by the daemon as a client
//! of the volume (an in-process graph of its client volfile, as GlusterFS's
//! rebalance process is one), that asks the graph's cluster/distribute node
//! through its virtual setxattrs (`xlfs_xlators::cluster::distribute`'s
//! `migrate` module) to fix each directory's layout, to move each file
//! whose name hashes to another replica set (`start`), and to settle each
//! directory whose files are all in place.
//!
//! Order per directory (GlusterFS's `gf_defrag_fix_layout` and
//! `gf_defrag_migrate_single_file`): the directory is looked up by name
//! (which makes it on the replica sets that lack it), its layout fixed,
//! its files moved, its layout settled when no file failed or was left
//! elsewhere, then its subdirectories. Before a `start`, the tree is
//! counted once, for the time-left estimate. A stop is seen between two
//! files. Progress lives in [`Progress`] and is shown by `status`.
//!
//! A step that fails with ENOTCONN (a replica set without quorum, or a
//! subvolume down) is not counted as failed: the run pauses, says which
//! step waits and why, tries it again every second and goes on from
//! there once the set is back (GlusterFS's rebalance likewise stops
//! rather than skip what it cannot reach). A file whose move was cut
//! short stays whole where it was; the link file the move left on the
//! destination is reused by the next try.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use xlfs_sdk::{CallCtx, Child, Dict, Errno, Fd, FdId, FileType, Fop, Gfid, Loc, Reply, Request, Value};
use xlfs_xlators::cluster::distribute::{BUSY, FIX_LAYOUT_KEY, MIGRATE_KEY, MIGRATED_KEY, SETTLE_KEY, SKIPPED_KEY};

use super::protocol::RebalanceStatus;

/// Bytes asked per readdirp.
const READDIR_SIZE: u32 = 128 << 10;
/// How often a paused run tries its step again.
const RETRY: Duration = Duration::from_secs(1);

/// What a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Layouts only.
    FixLayout,
    /// Layouts, then files.
    Rebalance,
    /// A rebalance that empties the sets a remove-brick is removing (the
    /// volfile names them decommissioned).
    RemoveBrick,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::FixLayout => "fix-layout",
            Kind::Rebalance => "rebalance",
            Kind::RemoveBrick => "remove-brick",
        }
    }

    /// Moves files.
    fn moves(self) -> bool {
        self != Kind::FixLayout
    }
}

/// How a run ended (or that it has not).
#[derive(Clone, Debug, PartialEq)]
enum State {
    Running,
    Completed,
    Stopped,
    Failed(String),
}

/// A run's counters, updated by the crawl and read by `status`.
pub struct Progress {
    name: String,
    kind: Kind,
    started: Instant,
    ended: Mutex<Option<Instant>>,
    state: Mutex<State>,
    last_error: Mutex<Option<String>>,
    /// What the run waits for while paused.
    paused: Mutex<Option<String>>,
    pauses: AtomicU64,
    stop: AtomicBool,
    dirs: AtomicU64,
    scanned: AtomicU64,
    moved: AtomicU64,
    skipped: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    /// A run of `kind` on volume `name`, starting now.
    pub fn new(name: &str, kind: Kind) -> Arc<Progress> {
        Arc::new(Progress {
            name: name.to_string(),
            kind,
            started: Instant::now(),
            ended: Mutex::new(None),
            state: Mutex::new(State::Running),
            last_error: Mutex::new(None),
            paused: Mutex::new(None),
            pauses: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            dirs: AtomicU64::new(0),
            scanned: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            total: AtomicU64::new(0),
        })
    }

    /// Still running.
    pub fn running(&self) -> bool {
        *self.state.lock() == State::Running
    }

    /// Asks the run to stop after the file in progress.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Records how the run ended.
    pub fn finish(&self, r: Result<(), String>) {
        let st = match r {
            Ok(()) if self.stop.load(Ordering::Relaxed) => State::Stopped,
            Ok(()) => State::Completed,
            Err(e) => State::Failed(e),
        };
        *self.state.lock() = st;
        *self.ended.lock() = Some(Instant::now());
    }

    /// The run as `status` shows it.
    pub fn status(&self) -> RebalanceStatus {
        let elapsed = self.ended.lock().unwrap_or_else(Instant::now).duration_since(self.started);
        let state = self.state.lock().clone();
        let (scanned, total) = (self.scanned.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed));
        let eta = match state {
            State::Running => eta(elapsed, scanned, total).map(|d| d.as_secs_f64()),
            _ => None,
        };
        let paused = self.paused.lock().clone();
        let error = match &state {
            State::Failed(e) => Some(e.clone()),
            State::Running if paused.is_some() => paused.clone(),
            _ => self.last_error.lock().clone(),
        };
        RebalanceStatus {
            name: self.name.clone(),
            kind: self.kind.name().to_string(),
            state: match state {
                State::Running if paused.is_some() => "paused",
                State::Running => "in progress",
                State::Completed => "completed",
                State::Stopped => "stopped",
                State::Failed(_) => "failed",
            }
            .to_string(),
            dirs: self.dirs.load(Ordering::Relaxed),
            scanned,
            moved: self.moved.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            total,
            elapsed_secs: elapsed.as_secs_f64(),
            eta_secs: eta,
            error,
            pauses: self.pauses.load(Ordering::Relaxed),
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Runs `op` until it does not fail with ENOTCONN, pausing the run
    /// meanwhile (`what` says which step waits). None when a stop was
    /// asked for while paused.
    async fn patiently<T, Fut>(&self, what: &str, mut op: impl FnMut() -> Fut) -> Option<Result<T, Errno>>
    where
        Fut: Future<Output = Result<T, Errno>>,
    {
        loop {
            match op().await {
                Err(Errno::ENOTCONN) => {
                    let mut paused = self.paused.lock();
                    if paused.is_none() {
                        self.pauses.fetch_add(1, Ordering::Relaxed);
                        let why = format!("paused at {what}: {}; trying again every {RETRY:?}", Errno::ENOTCONN);
                        tracing::warn!(volume = %self.name, "rebalance: {why}");
                        *paused = Some(why);
                    }
                }
                r => {
                    if self.paused.lock().take().is_some() {
                        tracing::info!(volume = %self.name, "rebalance: resumed at {what}");
                    }
                    return Some(r);
                }
            }
            if self.stopping() {
                *self.paused.lock() = None;
                return None;
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}

/// Time left for `total` files when `done` took `elapsed`: the rate so
/// far applied to what is left; None before the first file or without a
/// count.
pub fn eta(elapsed: Duration, done: u64, total: u64) -> Option<Duration> {
    if done == 0 || total == 0 {
        return None;
    }
    let left = total.saturating_sub(done);
    Some(elapsed.mul_f64(left as f64 / done as f64))
}

/// Why a directory could not be crawled.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {errno}")]
pub struct CrawlError {
    what: &'static str,
    path: String,
    errno: Errno,
}

/// Runs `kind` over the volume through its distribute node `dht`.
pub async fn run(dht: Child, kind: Kind, p: Arc<Progress>) -> Result<(), String> {
    let ctx = CallCtx::root("rebalance");
    if kind.moves() {
        let n = count(&dht, &ctx, &p).await.map_err(|e| e.to_string())?;
        p.total.store(n, Ordering::Relaxed);
    }
    let mut todo: Vec<(Gfid, String)> = vec![(Gfid::ROOT, "/".to_string())];
    while let Some((dir, path)) = todo.pop() {
        if p.stopping() {
            return Ok(());
        }
        let fix = || {
            let req = Request::new(Fop::Setxattr { loc: Loc::gfid(dir), xattrs: key(FIX_LAYOUT_KEY), flags: 0 });
            dht.call(ctx.clone(), req)
        };
        let Some(fixed) = p.patiently(&format!("fix-layout of {path}"), fix).await else { return Ok(()) };
        fixed.map_err(|errno| CrawlError { what: "fix-layout of", path: path.clone(), errno }.to_string())?;
        p.dirs.fetch_add(1, Ordering::Relaxed);
        let Some(entries) = p.patiently(&format!("listing {path}"), || list(&dht, &ctx, dir)).await else {
            return Ok(());
        };
        let entries = entries.map_err(|errno| CrawlError { what: "listing", path: path.clone(), errno }.to_string())?;
        let mut all_in_place = true;
        let mut busy = Vec::new();
        for (name, ty, gfid) in entries {
            let child = format!("{}{name}", if path == "/" { "/".to_string() } else { format!("{path}/") });
            if ty == FileType::Directory {
                let Some(looked) = p.patiently(&format!("lookup of {child}"), || lookup(&dht, &ctx, dir, &name)).await
                else {
                    return Ok(());
                };
                match looked {
                    Ok(gfid) => todo.push((gfid, child)),
                    Err(e) => {
                        all_in_place = false;
                        note(&p, format!("lookup of {child}: {e}"));
                    }
                }
                continue;
            }
            if !kind.moves() {
                continue;
            }
            if p.stopping() {
                return Ok(());
            }
            p.scanned.fetch_add(1, Ordering::Relaxed);
            match migrate_one(&dht, &ctx, &p, dir, &name, gfid, &child).await {
                None => return Ok(()),
                Some(Moved::Busy) => busy.push((name, gfid, child)),
                Some(Moved::Done(in_place)) => all_in_place &= in_place,
            }
        }
        // Files whose lock stayed taken: once more, after the others.
        for (name, gfid, child) in busy {
            if p.stopping() {
                return Ok(());
            }
            match migrate_one(&dht, &ctx, &p, dir, &name, gfid, &child).await {
                None => return Ok(()),
                Some(Moved::Busy) => {
                    all_in_place = false;
                    p.skipped.fetch_add(1, Ordering::Relaxed);
                    note(&p, format!("not moved: {child}: {BUSY}"));
                }
                Some(Moved::Done(in_place)) => all_in_place &= in_place,
            }
        }
        if kind.moves() && all_in_place {
            let settle = || {
                let req = Request::new(Fop::Setxattr { loc: Loc::gfid(dir), xattrs: key(SETTLE_KEY), flags: 0 });
                dht.call(ctx.clone(), req)
            };
            match p.patiently(&format!("settling {path}"), settle).await {
                None => return Ok(()),
                Some(Err(e)) => note(&p, format!("settling {path}: {e}")),
                Some(Ok(_)) => {}
            }
        }
    }
    Ok(())
}

/// What became of one file.
enum Moved {
    /// Moved, skipped or failed (counted); true when it is where its name
    /// hashes (or gone).
    Done(bool),
    /// Its lock stayed taken; not counted yet.
    Busy,
}

/// Asks distribute to move one file (pausing while its replica sets are
/// unreachable); counts the outcome. None when a stop was asked for.
async fn migrate_one(
    dht: &Child,
    ctx: &CallCtx,
    p: &Progress,
    dir: Gfid,
    name: &str,
    gfid: Gfid,
    child: &str,
) -> Option<Moved> {
    let mig = || {
        let req = Request::new(Fop::Setxattr {
            loc: Loc::entry(dir, name.to_string()).with_gfid(gfid),
            xattrs: key(MIGRATE_KEY),
            flags: 0,
        });
        dht.call(ctx.clone(), req)
    };
    Some(match p.patiently(&format!("moving {child}"), mig).await? {
        Ok(rsp) => match (rsp.xdata.get(MIGRATED_KEY), rsp.xdata.get(SKIPPED_KEY)) {
            (Some(Value::U64(b)), _) => {
                p.moved.fetch_add(1, Ordering::Relaxed);
                p.bytes.fetch_add(*b, Ordering::Relaxed);
                Moved::Done(true)
            }
            (_, Some(Value::Str(why))) if why == BUSY => Moved::Busy,
            (_, why) => {
                p.skipped.fetch_add(1, Ordering::Relaxed);
                match why {
                    Some(Value::Str(why)) if why == "in place" => Moved::Done(true),
                    why => {
                        tracing::info!(volume = %p.name, file = %child, "not moved: {why:?}");
                        Moved::Done(false)
                    }
                }
            }
        },
        // Gone since it was listed: nothing to move.
        Err(Errno::ENOENT | Errno::ESTALE) => {
            p.skipped.fetch_add(1, Ordering::Relaxed);
            Moved::Done(true)
        }
        Err(e) => {
            p.failed.fetch_add(1, Ordering::Relaxed);
            note(p, format!("moving {child}: {e}"));
            Moved::Done(false)
        }
    })
}

/// A subdirectory's gfid, looked up by name (which makes it on the
/// replica sets that lack it).
async fn lookup(dht: &Child, ctx: &CallCtx, dir: Gfid, name: &str) -> Result<Gfid, Errno> {
    let look = Request::new(Fop::Lookup { loc: Loc::entry(dir, name.to_string()) });
    dht.call(ctx.clone(), look).await.and_then(|r| r.reply.into_entry().map_err(Errno::from)).map(|iatt| iatt.gfid)
}

fn note(p: &Progress, e: String) {
    tracing::warn!(volume = %p.name, "rebalance: {e}");
    *p.last_error.lock() = Some(e);
}

fn key(k: &str) -> Dict {
    Dict::new().with(k, Value::U64(1))
}

/// Files in the tree (for the estimate).
async fn count(dht: &Child, ctx: &CallCtx, p: &Progress) -> Result<u64, CrawlError> {
    let mut n = 0;
    let mut todo = vec![Gfid::ROOT];
    while let Some(dir) = todo.pop() {
        if p.stop.load(Ordering::Relaxed) {
            break;
        }
        let err = |errno| CrawlError { what: "counting", path: dir.to_string(), errno };
        let Some(entries) = p.patiently("counting", || list(dht, ctx, dir)).await else { break };
        for (name, ty, _) in entries.map_err(err)? {
            if ty == FileType::Directory {
                // By name: a lookup makes the directory where it is missing
                // (a new replica set), so it can be opened everywhere.
                let Some(gfid) = p.patiently("counting", || lookup(dht, ctx, dir, &name)).await else { break };
                todo.push(gfid.map_err(err)?);
            } else {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// A directory's entries (name, type, gfid), `.` and `..` left out.
async fn list(dht: &Child, ctx: &CallCtx, dir: Gfid) -> Result<Vec<(String, FileType, Gfid)>, Errno> {
    let fd = Fd { id: FdId(rand_id()), gfid: dir };
    dht.call(ctx.clone(), Request::new(Fop::Opendir { loc: Loc::gfid(dir), fd: fd.id })).await?;
    let mut out = Vec::new();
    let mut offset = 0;
    let r = loop {
        let req = Request::new(Fop::Readdirp { fd, size: READDIR_SIZE, offset });
        let ents = match dht.call(ctx.clone(), req).await.map(|r| r.reply) {
            Ok(Reply::Dirents(e)) => e,
            Ok(_) => break Err(Errno::EIO),
            Err(e) => break Err(e),
        };
        let Some(last) = ents.last() else { break Ok(()) };
        offset = last.d_off;
        for e in ents {
            if e.name != "." && e.name != ".." {
                out.push((e.name, e.d_type, e.iatt.gfid));
            }
        }
    };
    let _ = dht.call(ctx.clone(), Request::new(Fop::Releasedir { fd })).await;
    r.map(|()| out)
}

fn rand_id() -> u64 {
    let g = Gfid::random();
    let mut b = [0u8; 8];
    b.copy_from_slice(&g.0[..8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_follows_the_rate() {
        assert_eq!(eta(Duration::from_secs(10), 0, 100), None);
        assert_eq!(eta(Duration::from_secs(10), 5, 0), None);
        assert_eq!(eta(Duration::from_secs(10), 25, 100), Some(Duration::from_secs(30)));
        assert_eq!(eta(Duration::from_secs(10), 120, 100), Some(Duration::ZERO), "more than counted: none left");
    }

    #[test]
    fn progress_shows_state_and_counts() {
        let p = Progress::new("v", Kind::Rebalance);
        p.total.store(10, Ordering::Relaxed);
        p.scanned.store(5, Ordering::Relaxed);
        p.moved.store(3, Ordering::Relaxed);
        let s = p.status();
        assert_eq!((s.state.as_str(), s.kind.as_str(), s.moved, s.total), ("in progress", "rebalance", 3, 10));
        assert!(s.eta_secs.is_some());
        p.request_stop();
        p.finish(Ok(()));
        let s = p.status();
        assert_eq!((s.state.as_str(), s.eta_secs), ("stopped", None));
        let f = Progress::new("v", Kind::FixLayout);
        f.finish(Err("boom".into()));
        assert_eq!((f.status().state.as_str(), f.status().error.as_deref()), ("failed", Some("boom")));
    }
}
