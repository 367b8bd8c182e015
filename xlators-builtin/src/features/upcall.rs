//! features/upcall: tells clients that have an inode cached when another
//! client changes it (GlusterFS's upcall translator with
//! `cache-invalidation`), so client caches (md-cache, quick-read, the
//! kernel's through the FUSE bridge) can be kept for long and still be true.
//!
//! Every fop that names an inode (by fd, by gfid, an entry's parent, the
//! inode an entry reply returns, each readdirp entry) records its client as
//! interested in that inode, with the time. When a fop that changes an
//! inode succeeds, every *other* client that touched it within
//! `cache-invalidation-timeout` seconds is sent [`Upcall::InvalidateFor`]
//! (protocol/server delivers a plain `Invalidate` to that client only):
//! - data and metadata changes (write, truncate, setattr, xattrs,
//!   fallocate, ...) invalidate the inode;
//! - entry changes (create, mkdir, mknod, symlink, link, unlink, rmdir,
//!   rename) invalidate the parent directories (their entries changed) and
//!   the inode they act on (its link count or ctime changed).
//!
//! The changing client itself is not told: its caches saw the reply. The
//! filesystem's daemons (self-heal: [`CallCtx::is_daemon`]) cache nothing,
//! so their fops record no interest (a self-heal daemon that once looked
//! at a busy file was otherwise sent a message for each of its writes);
//! their changes are told like any other.
//!
//! Race: a client's interest is recorded when its fop returns, so a change
//! that lands while that fop runs (a lookup reading the old size while
//! another client's write completes) finds no one to tell, and the reply
//! on its way carries the old state. So every change also stamps the
//! inode's bucket with a sequence number, and a fop that sees a stamp later
//! than the sequence when it was wound tells its own client to drop what
//! its reply is about to fill (clients drop fills older than an
//! invalidation: md-cache and quick-read keep generations). A bucket
//! shared by two inodes costs at most a needless invalidation.
//! Memory is bounded: at most `cache-invalidation-max-inodes` inodes are
//! tracked, each with at most [`MAX_CLIENTS`] clients; expired entries are
//! dropped when the table is full.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use xlfs_sdk::options::{Opt, kind};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Event, EventSink, Fop, FopFuture, Gfid, InitCtx, InitError, OptionDecl, Options, Reply, Request,
    Response, Upcall, Xlator, XlatorType,
};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "features/upcall",
    description: "tells the clients that have an inode cached when another client changes it (cache invalidation)",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

const ON: Opt<kind::Bool> = Opt::bool("cache-invalidation", true).desc(
    "Send invalidations (GlusterFS: features.cache-invalidation, off there by default; on here so that client \
     caches can keep entries long and stay true).",
);
const TIMEOUT: Opt<kind::Int> = Opt::int("cache-invalidation-timeout", "600").range(1.0, 3600.0).desc(
    "Seconds a client stays interested in an inode after its last fop on it. Clients must not cache longer \
     than this: 600 matches the md-cache-timeout the generated client graph uses (GlusterFS recommends \
     setting both to 600; its own default here is 60).",
);
const MAX_INODES: Opt<kind::Int> = Opt::int("cache-invalidation-max-inodes", "262144")
    .range(16.0, 16_777_216.0)
    .desc("Most inodes tracked at once (about 100 bytes each plus 40 per client); the oldest are dropped first.");

const OPTIONS: &[OptionDecl] = &[ON.decl, TIMEOUT.decl, MAX_INODES.decl];

/// Most clients remembered per inode; beyond, the least recent is dropped
/// (it then misses invalidations only if it still caches past its own
/// timeout, which a client bounded by md-cache-timeout does not).
pub const MAX_CLIENTS: usize = 64;

struct Config {
    on: bool,
    timeout: Duration,
    max_inodes: usize,
}

impl Config {
    fn from(o: &Options) -> Config {
        Config { on: ON.get(o), timeout: Duration::from_secs(TIMEOUT.count(o) as u64), max_inodes: MAX_INODES.count(o) }
    }
}

/// The clients interested in one inode, with when each last touched it.
type Interest = Vec<(Arc<str>, Instant)>;

/// Buckets of [`Table::changed`].
const BUCKETS: usize = 4096;

fn bucket(g: &Gfid) -> usize {
    u16::from_le_bytes([g.0[15], g.0[14]]) as usize % BUCKETS
}

/// The last changes to the inodes of one bucket: the latest, and the
/// latest by another client than the latest's (so each client's own
/// concurrent fops, which its caches already account for, are told apart).
#[derive(Clone, Default)]
struct Stamps([(u64, Option<Arc<str>>); 2]);

impl Stamps {
    fn stamp(&mut self, seq: u64, by: &str) {
        if self.0[0].1.as_deref() == Some(by) {
            self.0[0].0 = seq;
        } else {
            self.0[1] = std::mem::replace(&mut self.0[0], (seq, Some(Arc::from(by))));
        }
    }

    /// The latest change by a client other than `client`.
    fn by_others(&self, client: &str) -> u64 {
        let [latest, other] = &self.0;
        if latest.1.as_deref() == Some(client) { other.0 } else { latest.0 }
    }
}

struct Table {
    interest: HashMap<Gfid, Interest>,
    /// The last changes in each bucket of inodes.
    changed: Box<[Stamps]>,
}

/// The upcall translator.
pub struct UpcallXl {
    child: Child,
    events: EventSink,
    cfg: RwLock<Config>,
    table: Mutex<Table>,
    /// Bumped on every change (under the table lock, so a stamp is never
    /// older than a sequence read before it); read without the lock as
    /// each fop is wound.
    seq: AtomicU64,
    sent: AtomicU64,
    dropped_inodes: AtomicU64,
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let InitCtx { options, mut children, events, name, .. } = init;
    let child = children.pop().ok_or_else(|| InitError::new(format!("{name}: features/upcall needs a subvolume")))?;
    Ok(Arc::new(UpcallXl {
        child,
        events,
        cfg: RwLock::new(Config::from(&options)),
        table: Mutex::new(Table { interest: HashMap::new(), changed: vec![Stamps::default(); BUCKETS].into() }),
        seq: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        dropped_inodes: AtomicU64::new(0),
    }))
}

/// What a fop changes, once it succeeded.
enum Change {
    None,
    /// The inodes whose data or metadata changed.
    Inodes(Vec<Gfid>),
}

impl UpcallXl {
    /// The change sequence now: a fop wound after this sees changes
    /// stamped later as raced.
    fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Records `client` as interested in `gfids`, by a fop wound at change
    /// sequence `start`, and tells it about those of them changed since.
    fn touch(&self, client: &Arc<str>, gfids: &[Gfid], start: u64) {
        let cfg = self.cfg.read();
        if !cfg.on {
            return;
        }
        let now = Instant::now();
        let mut raced: Vec<Gfid> = Vec::new();
        {
            let mut table = self.table.lock();
            for g in gfids.iter().filter(|g| !g.is_null()) {
                if table.changed[bucket(g)].by_others(client) > start && !raced.contains(g) {
                    raced.push(*g);
                }
            }
            self.register(&cfg, &mut table.interest, client, gfids, now);
        }
        tracing::trace!(client = %client, ?gfids, start, ?raced, "interest");
        for gfid in raced {
            self.sent.fetch_add(1, Ordering::Relaxed);
            self.events.send(Event::Upcall(Upcall::InvalidateFor { gfid, client: client.to_string() }));
        }
    }

    fn register(&self, cfg: &Config, t: &mut HashMap<Gfid, Interest>, client: &Arc<str>, gfids: &[Gfid], now: Instant) {
        if t.len() + gfids.len() > cfg.max_inodes {
            let before = t.len();
            t.retain(|_, v| {
                v.retain(|(_, at)| now.duration_since(*at) < cfg.timeout);
                !v.is_empty()
            });
            // Still full: drop arbitrary ones (their clients' caches time
            // out on their own within md-cache-timeout).
            let excess = (t.len() + gfids.len()).saturating_sub(cfg.max_inodes);
            let victims: Vec<Gfid> = t.keys().take(excess).copied().collect();
            for g in victims {
                t.remove(&g);
            }
            self.dropped_inodes.fetch_add((before - t.len()) as u64, Ordering::Relaxed);
        }
        for g in gfids.iter().filter(|g| !g.is_null()) {
            let v = t.entry(*g).or_default();
            match v.iter_mut().find(|(c, _)| c == client) {
                Some(e) => e.1 = now,
                None => {
                    if v.len() >= MAX_CLIENTS
                        && let Some(oldest) = v.iter().enumerate().min_by_key(|(_, (_, at))| *at).map(|(i, _)| i)
                    {
                        v.swap_remove(oldest);
                    }
                    v.push((client.clone(), now));
                }
            }
        }
    }

    /// Tells every other client interested in `gfids` that they changed.
    fn invalidate(&self, from: &str, gfids: &[Gfid]) {
        let cfg = self.cfg.read();
        if !cfg.on {
            return;
        }
        let now = Instant::now();
        let mut out: Vec<(Gfid, Arc<str>)> = Vec::new();
        {
            let mut table = self.table.lock();
            let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
            for g in gfids {
                table.changed[bucket(g)].stamp(seq, from);
            }
            let t = &mut table.interest;
            for g in gfids {
                if let Some(v) = t.get_mut(g) {
                    v.retain(|(_, at)| now.duration_since(*at) < cfg.timeout);
                    out.extend(v.iter().filter(|(c, _)| &**c != from).map(|(c, _)| (*g, c.clone())));
                    if v.is_empty() {
                        t.remove(g);
                    }
                }
            }
        }
        tracing::trace!(from = %from, ?gfids, ?out, "changed");
        for (gfid, client) in out {
            self.sent.fetch_add(1, Ordering::Relaxed);
            self.events.send(Event::Upcall(Upcall::InvalidateFor { gfid, client: client.to_string() }));
        }
    }
}

/// The inodes a request names (before it runs).
fn named(fop: &Fop) -> Vec<Gfid> {
    let mut v = Vec::with_capacity(2);
    match fop {
        Fop::Rename { old, new, .. } => {
            v.extend([old.gfid, old.parent, new.gfid, new.parent]);
        }
        Fop::Link { old, new } => v.extend([old.gfid, new.parent]),
        Fop::CopyFileRange { fd_in, fd_out, .. } => v.extend([fd_in.gfid, fd_out.gfid]),
        _ => {
            if let Some(l) = fop.loc() {
                v.extend([l.gfid, l.parent]);
            }
            if let Some(fd) = fop.fd() {
                v.push(fd.gfid);
            }
        }
    }
    v.retain(|g| !g.is_null());
    v
}

/// The inodes a reply names (entries found or made, readdirp entries).
fn answered(rsp: &Response) -> Vec<Gfid> {
    match &rsp.reply {
        Reply::Entry { iatt, .. } | Reply::Rename { iatt } => vec![iatt.gfid],
        Reply::Dirents(d) => d.iter().map(|e| e.iatt.gfid).filter(|g| !g.is_null()).collect(),
        _ => Vec::new(),
    }
}

/// What a successful fop changed: the inode for data and metadata fops;
/// the parents and the inode for entry fops.
fn changed(fop: &Fop, rsp: &Response) -> Change {
    use Fop::*;
    let with_reply = |mut v: Vec<Gfid>| {
        v.extend(answered(rsp));
        v.retain(|g| !g.is_null());
        v.sort_unstable_by_key(|g| g.0);
        v.dedup();
        Change::Inodes(v)
    };
    match fop {
        Writev { .. }
        | Ftruncate { .. }
        | Truncate { .. }
        | Setattr { .. }
        | Fsetattr { .. }
        | Setxattr { .. }
        | Fsetxattr { .. }
        | Removexattr { .. }
        | Fremovexattr { .. }
        | Fallocate { .. }
        | Discard { .. }
        | Zerofill { .. } => with_reply(named(fop)),
        CopyFileRange { fd_out, .. } => Change::Inodes(vec![fd_out.gfid]),
        Create { .. }
        | Mkdir { .. }
        | Mknod { .. }
        | Symlink { .. }
        | Link { .. }
        | Unlink { .. }
        | Rmdir { .. }
        | Rename { .. } => with_reply(named(fop)),
        _ => Change::None,
    }
}

impl Xlator for UpcallXl {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(async move {
            // Internal fops (AFR's changelog, locks) are not client caching.
            let internal = matches!(
                req.fop.kind(),
                xlfs_sdk::FopKind::Xattrop
                    | xlfs_sdk::FopKind::Fxattrop
                    | xlfs_sdk::FopKind::Inodelk
                    | xlfs_sdk::FopKind::Finodelk
                    | xlfs_sdk::FopKind::Entrylk
                    | xlfs_sdk::FopKind::Fentrylk
                    | xlfs_sdk::FopKind::Forget
                    | xlfs_sdk::FopKind::Release
                    | xlfs_sdk::FopKind::Releasedir
            );
            if internal || !self.cfg.read().on {
                return self.child.call(ctx, req).await;
            }
            let fop = req.fop.clone();
            let before = named(&fop);
            let start = self.seq();
            let r = self.child.call(ctx.clone(), req).await;
            if tracing::enabled!(tracing::Level::TRACE) {
                let sizes: Vec<(Gfid, u64)> = match r.as_ref().map(|x| &x.reply) {
                    Ok(Reply::Entry { iatt, .. }) => vec![(iatt.gfid, iatt.size)],
                    Ok(Reply::Dirents(d)) => d.iter().map(|e| (e.iatt.gfid, e.iatt.size)).collect(),
                    Ok(Reply::PrePost { post, .. }) | Ok(Reply::Attr(post)) => vec![(post.gfid, post.size)],
                    _ => Vec::new(),
                };
                tracing::trace!(client = %ctx.client_id, fop = ?fop.kind(), start, ok = r.is_ok(), ?sizes, "fop");
            }
            if let Ok(rsp) = &r {
                // A daemon (self-heal) caches nothing: telling it about
                // later changes would only cost a message per change.
                if !ctx.is_daemon() {
                    let mut touched = before;
                    touched.extend(answered(rsp));
                    self.touch(&ctx.client_id, &touched, start);
                }
                if let Change::Inodes(g) = changed(&fop, rsp) {
                    self.invalidate(&ctx.client_id, &g);
                }
            }
            r
        })
    }

    fn reconfigure(&self, o: &Options) -> Result<(), ReconfigureError> {
        *self.cfg.write() = Config::from(o);
        if !self.cfg.read().on {
            self.table.lock().interest.clear();
        }
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let cfg = self.cfg.read();
        vec![
            ("cache-invalidation".into(), cfg.on.to_string()),
            ("cache-invalidation-timeout".into(), cfg.timeout.as_secs().to_string()),
            ("inodes".into(), self.table.lock().interest.len().to_string()),
            ("invalidations-sent".into(), self.sent.load(Ordering::Relaxed).to_string()),
            ("inodes-dropped".into(), self.dropped_inodes.load(Ordering::Relaxed).to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlfs_sdk::testing::init_named;
    use xlfs_sdk::{Dict, DirEntry, Errno, EventFrom, FdId, FileType, Iatt, Loc};

    /// A leaf that answers entry fops with an entry of `NEW`, and
    /// everything else with success.
    struct Leaf;
    const NEW: Gfid = Gfid([7; 16]);
    const DIR: Gfid = Gfid([3; 16]);
    const FILE: Gfid = Gfid([5; 16]);

    impl Xlator for Leaf {
        fn call(&self, _ctx: CallCtx, req: Request) -> FopFuture<'_> {
            let iatt = Iatt { gfid: NEW, ..Iatt::default() };
            let reply = match req.fop {
                Fop::Lookup { .. } | Fop::Create { .. } | Fop::Mkdir { .. } => {
                    Reply::Entry { iatt, postparent: Iatt::default() }
                }
                Fop::Readdirp { .. } => Reply::Dirents(vec![DirEntry {
                    name: "f".into(),
                    d_off: 1,
                    d_type: FileType::Regular,
                    iatt: Iatt { gfid: FILE, ..Iatt::default() },
                }]),
                Fop::Unlink { .. } => Reply::Parent { pre: Iatt::default(), post: Iatt::default() },
                Fop::Stat { ref loc } if loc.gfid == Gfid([9; 16]) => {
                    return Box::pin(std::future::ready(Err(Errno::ENOENT)));
                }
                _ => Reply::Empty,
            };
            Box::pin(std::future::ready(Ok(Response { reply, xdata: Dict::new() })))
        }
    }

    struct Top(Mutex<Vec<Upcall>>);
    impl Xlator for Top {
        fn call(&self, _: CallCtx, _: Request) -> FopFuture<'_> {
            Box::pin(std::future::ready(Err(Errno::ENOSYS)))
        }
        fn notify(&self, event: Event, _: EventFrom) -> Option<Event> {
            if let Event::Upcall(u) = event {
                self.0.lock().push(u);
            }
            None
        }
    }

    /// [`Leaf`], with lookups held until the gate opens.
    struct Gated(Arc<tokio::sync::Semaphore>);
    impl Xlator for Gated {
        fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
            Box::pin(async move {
                if matches!(req.fop, Fop::Lookup { .. }) {
                    let _pass = self.0.acquire().await.expect("gate");
                }
                Leaf.call(ctx, req).await
            })
        }
    }

    fn node(opts: &[(&str, &str)]) -> (Arc<dyn Xlator>, Arc<Top>) {
        node_over(opts, Arc::new(Leaf))
    }

    fn node_over(opts: &[(&str, &str)], leaf: Arc<dyn Xlator>) -> (Arc<dyn Xlator>, Arc<Top>) {
        let (ictx, _) = init_named("up", OPTIONS, opts, &[Child { name: Arc::from("leaf"), xl: leaf }]);
        let sink = ictx.events.clone();
        let xl = build(ictx).expect("build");
        let top = Arc::new(Top(Mutex::new(Vec::new())));
        let top_dyn: Arc<dyn Xlator> = top.clone();
        sink.attach_parent(Arc::downgrade(&top_dyn), 0, EventSink::new());
        (xl, top)
    }

    fn fd(gfid: Gfid) -> xlfs_sdk::Fd {
        xlfs_sdk::Fd { id: FdId(1), gfid }
    }

    fn sent(top: &Top) -> Vec<(Gfid, String)> {
        let mut v: Vec<(Gfid, String)> = top
            .0
            .lock()
            .drain(..)
            .filter_map(|u| match u {
                Upcall::InvalidateFor { gfid, client } => Some((gfid, client)),
                _ => None,
            })
            .collect();
        v.sort_by(|a, b| (a.0.0, &a.1).cmp(&(b.0.0, &b.1)));
        v
    }

    #[tokio::test]
    async fn a_write_invalidates_the_other_clients_that_read_the_inode_not_the_writer() {
        let (xl, top) = node(&[]);
        let (a, b, c) = (CallCtx::root("a"), CallCtx::root("b"), CallCtx::root("c"));
        xl.call(a.clone(), Fop::Fstat { fd: fd(FILE) }.into()).await.expect("a stats");
        xl.call(b.clone(), Fop::Readv { fd: fd(FILE), size: 1, offset: 0, flags: 0 }.into()).await.expect("b reads");
        xl.call(c.clone(), Fop::Fstat { fd: fd(DIR) }.into()).await.expect("c looks elsewhere");
        assert!(sent(&top).is_empty(), "reads invalidate nothing");
        let w = Fop::Writev { fd: fd(FILE), data: bytes::Bytes::from_static(b"x"), offset: 0, flags: 0 };
        xl.call(a.clone(), w.into()).await.expect("a writes");
        assert_eq!(sent(&top), vec![(FILE, "b".to_string())]);
        // An unsuccessful change tells no one.
        let st = Fop::Stat { loc: Loc::gfid(Gfid([9; 16])) };
        xl.call(b.clone(), st.into()).await.expect_err("fails");
        assert!(sent(&top).is_empty());
    }

    #[tokio::test]
    async fn a_daemon_is_told_nothing_but_its_changes_are_told() {
        let (xl, top) = node(&[]);
        let (app, heal) = (CallCtx::root("app"), CallCtx::self_heal("shd"));
        let w = || Fop::Writev { fd: fd(FILE), data: bytes::Bytes::from_static(b"x"), offset: 0, flags: 0 };
        xl.call(heal.clone(), Fop::Fstat { fd: fd(FILE) }.into()).await.expect("heal inspects");
        xl.call(app.clone(), w().into()).await.expect("the application writes");
        assert!(sent(&top).is_empty(), "self-heal caches nothing and is not told");
        xl.call(app.clone(), Fop::Fstat { fd: fd(FILE) }.into()).await.expect("the application stats");
        xl.call(heal.clone(), w().into()).await.expect("heal writes");
        assert_eq!(sent(&top), vec![(FILE, "app".to_string())], "a heal's change is told to the caches");
    }

    #[tokio::test]
    async fn entry_changes_invalidate_the_parent_and_readdirp_entries_count_as_cached() {
        let (xl, top) = node(&[]);
        let (a, b) = (CallCtx::root("a"), CallCtx::root("b"));
        xl.call(b.clone(), Fop::Readdirp { fd: fd(DIR), size: 4096, offset: 0 }.into()).await.expect("b lists");
        xl.call(
            a.clone(),
            Fop::Create { loc: Loc::entry(DIR, "n"), flags: 0, mode: 0o644, umask: 0, fd: FdId(2) }.into(),
        )
        .await
        .expect("a creates");
        assert_eq!(sent(&top), vec![(DIR, "b".to_string())], "b's listing of DIR is stale");
        xl.call(a.clone(), Fop::Unlink { loc: Loc { gfid: FILE, parent: DIR, name: "f".into() }, flags: 0 }.into())
            .await
            .expect("a unlinks the file b got from readdirp");
        assert_eq!(sent(&top), vec![(DIR, "b".to_string()), (FILE, "b".to_string())]);
    }

    #[tokio::test]
    async fn a_change_landing_while_another_clients_lookup_runs_is_told_to_it() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (xl, top) = node_over(&[], Arc::new(Gated(gate.clone())));
        let (a, b) = (CallCtx::root("a"), CallCtx::root("b"));
        let write = || Fop::Writev { fd: fd(NEW), data: bytes::Bytes::from_static(b"x"), offset: 0, flags: 0 };
        // b looks the name up; a's write lands before b's lookup returns,
        // when no one has shown interest in NEW yet.
        let lookup = |ctx: CallCtx| {
            let xl = xl.clone();
            tokio::spawn(async move { xl.call(ctx, Fop::Lookup { loc: Loc::entry(DIR, "f") }.into()).await })
        };
        let looking = lookup(b.clone());
        tokio::task::yield_now().await;
        xl.call(a.clone(), write().into()).await.expect("a writes");
        assert!(sent(&top).is_empty(), "no one showed interest yet");
        gate.add_permits(1);
        looking.await.expect("task").expect("b's lookup");
        assert_eq!(sent(&top), vec![(NEW, "b".to_string())], "b's reply may carry the old state");
        // A client's own write beside its own lookup: its caches know.
        let looking = lookup(a.clone());
        tokio::task::yield_now().await;
        xl.call(a.clone(), write().into()).await.expect("a writes");
        gate.add_permits(1);
        looking.await.expect("task").expect("a's lookup");
        assert_eq!(sent(&top), vec![(NEW, "b".to_string())], "b is told again, a never");
        // A lookup that nothing raced: nothing more.
        gate.add_permits(1);
        xl.call(b.clone(), Fop::Lookup { loc: Loc::entry(DIR, "f") }.into()).await.expect("b looks again");
        assert!(sent(&top).is_empty());
    }

    #[tokio::test]
    async fn off_sends_nothing_and_interest_expires() {
        let (xl, top) = node(&[("cache-invalidation", "off")]);
        let (a, b) = (CallCtx::root("a"), CallCtx::root("b"));
        xl.call(b.clone(), Fop::Fstat { fd: fd(FILE) }.into()).await.expect("b");
        xl.call(a.clone(), Fop::Ftruncate { fd: fd(FILE), offset: 0 }.into()).await.expect("a");
        assert!(sent(&top).is_empty());
        let (xl, top) = node(&[("cache-invalidation-max-inodes", "16")]);
        for k in 0..64u8 {
            xl.call(b.clone(), Fop::Fstat { fd: fd(Gfid([k; 16])) }.into()).await.expect("b");
        }
        let dump: HashMap<String, String> = xl.dump().into_iter().collect();
        assert!(dump["inodes"].parse::<usize>().expect("count") <= 16, "bounded: {dump:?}");
        drop(top);
    }
}
