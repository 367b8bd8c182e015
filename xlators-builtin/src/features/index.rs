//! features/index: the brick-side list of inodes that may need self-heal
//! (GlusterFS's index translator, its `xattrop` index).
//!
//! It watches the replies to xattrop and fxattrop calls that carry AFR's
//! pending counters (`trusted.afr.*`, or the prefixes of the watchlist
//! options): when a counter of the inode is non-zero after the call, the
//! inode's gfid is recorded; when a call leaves the counters it changed at
//! zero, the inode's counters are read back and, if every watched counter
//! is zero, the gfid is dropped.
//! Xattrops on one inode are serialized here, so a drop never races a
//! record for the same inode.
//!
//! With `index-base` set (the generated brick graph sets it to
//! `<brick>/.glusterfs/indices`) every recorded gfid is also a name
//! `<index-base>/xattrop/<gfid>`, read back when the brick starts, so the
//! index survives restarts; without it the index lives in memory only.
//! As GlusterFS's, each name is a hard link to one empty base file
//! (`xattrop-<uuid>`, a new one when the file system's link count limit is
//! reached): a link adds a directory entry only, where a new empty file
//! allocated an inode, which took 240-340 us on the brick disk here
//! against 5-10 us (and a transaction records and drops an entry on every
//! brick for every file it writes).
//! At most `index-max-entries` gfids are kept; beyond that new ones are
//! not recorded (counted in the dump as `dropped`; a full heal crawl still
//! finds them).
//!
//! Virtual xattrs on the volume root (the heal daemon reads them through
//! AFR's children):
//! - getxattr [`INDEX_XATTROP`]: the recorded gfids, sorted, one per line,
//!   at most `index-list-max` of them; getxattr `xlfs.index.xattrop:<gfid>`
//!   lists those after `<gfid>` (the next page). The reply also carries
//!   [`INDEX_COUNT`] with the number recorded, as a decimal string.
//! - a lookup whose xdata carries [`INDEX_COUNT`] is answered with that
//!   key set to the number recorded (AFR asks while a copy may be behind).
//! - setxattr [`INDEX_PURGE`] with gfids (one per line, at most 65536): each is checked
//!   again and dropped when its inode is gone or its counters are all zero
//!   (the heal daemon sends it for inodes it found clean or gone).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use xlfs_sdk::options::{Opt, kind};
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Fop, FopFuture, FopResult, Gfid, InitCtx, InitError, Loc, OptionDecl, Reply, Request,
    Response, Value, Xlator, XlatorType,
};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "features/index",
    description: "records on the brick the gfids whose AFR pending counters are raised (the self-heal index)",
    options: OPTIONS,
    min_children: 1,
    max_children: 1,
    build,
};

const BASE: Opt<kind::PathKind> = Opt::optional("index-base").desc(
    "Directory holding the index on disk (GlusterFS: <brick>/.glusterfs/indices); recorded gfids are empty \
     files in its 'xattrop' subdirectory and survive restarts. Not set: the index is kept in memory only.",
);
const PENDING_WATCH: Opt<kind::List> = Opt::list("xattrop-pending-watchlist", "trusted.afr.").desc(
    "Xattr name prefixes whose xattrop values are watched (GlusterFS gives trusted.afr.<volume>-); a gfid is \
     recorded while any watched value of its inode is non-zero.",
);
const DIRTY_WATCH: Opt<kind::List> = Opt::list("xattrop-dirty-watchlist", "trusted.afr.dirty")
    .desc("More watched xattr name prefixes (GlusterFS's dirty counters), treated like the pending ones.");
const MAX_ENTRIES: Opt<kind::Int> = Opt::int("index-max-entries", "1048576")
    .range(1.0, 67_108_864.0)
    .desc("Most gfids recorded at once; beyond that new ones are not recorded (a full heal still finds them).");
const LIST_MAX: Opt<kind::Int> = Opt::int("index-list-max", "4096")
    .range(1.0, 1_048_576.0)
    .desc("Most gfids one getxattr of xlfs.index.xattrop returns (ask for the next page with xlfs.index.xattrop:<last gfid>).");

const OPTIONS: &[OptionDecl] = &[BASE.decl, PENDING_WATCH.decl, DIRTY_WATCH.decl, MAX_ENTRIES.decl, LIST_MAX.decl];

use xlfs_sdk::dict::keys::{INDEX_COUNT, INDEX_PURGE, INDEX_XATTROP};

/// Most gfids one purge request checks.
const MAX_PURGE: usize = 65536;

/// Stripes of the per-inode xattrop serialization.
const STRIPES: usize = 64;

struct Index {
    child: Child,
    name: String,
    /// Watched xattr name prefixes.
    watch: Vec<String>,
    dir: Option<PathBuf>,
    /// The empty file the entries are hard links to (made on first use).
    base: Mutex<Option<PathBuf>>,
    set: Mutex<BTreeSet<Gfid>>,
    /// For gfids recorded by this process: the watched keys raised, as
    /// the xattrop replies said. A reply that lowers the last of them drops
    /// the gfid without reading every xattr again (gfids found on disk at
    /// start are not here: their other keys are unknown, so they are read).
    keys: Mutex<HashMap<Gfid, BTreeSet<String>>>,
    max: usize,
    list_max: usize,
    stripes: Vec<tokio::sync::Mutex<()>>,
    dropped: AtomicU64,
    io_errors: AtomicU64,
    /// Times every xattr of an inode was read again to decide.
    rechecks: AtomicU64,
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let InitCtx { name, options, mut children, .. } = init;
    let child = children.pop().ok_or_else(|| InitError::new(format!("{name}: features/index needs one subvolume")))?;
    let max = MAX_ENTRIES.count(&options);
    let list_max = LIST_MAX.count(&options);
    let dir = BASE.get(&options).map(|p| p.join("xattrop"));
    let mut set = BTreeSet::new();
    let mut base = None;
    if let Some(d) = &dir {
        std::fs::create_dir_all(d)
            .map_err(|e| InitError::new(format!("{name}: index directory {}: {e}", d.display())))?;
        (set, base) = load(d, max).map_err(|e| InitError::new(format!("{name}: reading {}: {e}", d.display())))?;
    }
    let watch: Vec<String> =
        [PENDING_WATCH, DIRTY_WATCH].iter().flat_map(|o| o.get(&options)).map(str::to_string).collect();
    Ok(Arc::new(Index {
        child,
        name,
        watch,
        dir,
        base: Mutex::new(base),
        set: Mutex::new(set),
        keys: Mutex::new(HashMap::new()),
        max,
        list_max,
        stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        dropped: AtomicU64::new(0),
        io_errors: AtomicU64::new(0),
        rechecks: AtomicU64::new(0),
    }))
}

/// Prefix of the base files the entries link to.
const BASE_PREFIX: &str = "xattrop-";

/// The gfids recorded in `dir` (at most `max`; other names are ignored),
/// and a base file found there.
fn load(dir: &Path, max: usize) -> std::io::Result<(BTreeSet<Gfid>, Option<PathBuf>)> {
    let mut out = BTreeSet::new();
    let mut base = None;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(BASE_PREFIX) {
            base.get_or_insert_with(|| e.path());
        }
        if let Some(g) = Gfid::parse(name) {
            if out.len() >= max {
                tracing::warn!(dir = %dir.display(), max, "index holds more entries than index-max-entries; the rest is ignored");
                break;
            }
            out.insert(g);
        }
    }
    Ok((out, base))
}

/// Makes `entry` a hard link to the base file in `dir`, making a new base
/// when there is none yet, it is gone, or it has as many links as the
/// file system allows.
fn link_entry(dir: &Path, base: &Mutex<Option<PathBuf>>, entry: &Path) -> std::io::Result<()> {
    for _ in 0..3 {
        let b = {
            let mut cur = base.lock();
            match &*cur {
                Some(b) => b.clone(),
                None => {
                    let b = dir.join(format!("{BASE_PREFIX}{}", Gfid::random()));
                    std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&b)?;
                    *cur = Some(b.clone());
                    b
                }
            }
        };
        match std::fs::hard_link(&b, entry) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EMLINK) || e.kind() == std::io::ErrorKind::NotFound => {
                let mut cur = base.lock();
                if cur.as_ref() == Some(&b) {
                    *cur = None;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EMLINK))
}

impl Index {
    fn watched_key(&self, k: &str) -> bool {
        self.watch.iter().any(|p| k.starts_with(p.as_str()))
    }

    /// True when some watched value in `d` has a non-zero byte.
    fn raised(&self, d: &Dict) -> bool {
        d.iter().any(|(k, v)| self.watched_key(k) && matches!(v, Value::Bytes(b) if b.iter().any(|&x| x != 0)))
    }

    fn watched(&self, d: &Dict) -> bool {
        d.keys().any(|k| self.watched_key(k))
    }

    fn stripe(&self, g: &Gfid) -> &tokio::sync::Mutex<()> {
        let h = g.0.iter().fold(0usize, |h, &b| h.wrapping_mul(31).wrapping_add(usize::from(b)));
        &self.stripes[h % STRIPES]
    }

    /// Records `g` (memory, then disk).
    fn add(&self, g: Gfid) {
        {
            let mut s = self.set.lock();
            if s.contains(&g) {
                return;
            }
            if s.len() >= self.max {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(volume = %self.name, max = self.max, "index full: gfids needing heal are no longer recorded");
                }
                return;
            }
            s.insert(g);
        }
        // The link and the unlink below run right here, as the brick's
        // inline fops do (a directory entry in cached metadata): handed to
        // a sync thread each cost a wake-up and two context switches, six
        // links and unlinks per written file over three bricks.
        if let Some(d) = &self.dir
            && link_entry(d, &self.base, &d.join(g.to_string())).is_err()
        {
            self.io_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(volume = %self.name, gfid = %g, "could not record the gfid in the on-disk index");
        }
    }

    /// Drops `g` (memory, then disk).
    fn remove(&self, g: Gfid) {
        self.keys.lock().remove(&g);
        if !self.set.lock().remove(&g) {
            return;
        }
        if let Some(d) = &self.dir
            && std::fs::remove_file(d.join(g.to_string())).is_err_and(|e| e.kind() != std::io::ErrorKind::NotFound)
        {
            self.io_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(volume = %self.name, gfid = %g, "could not drop the gfid from the on-disk index");
        }
    }

    /// Reads every counter of `g` again; drops it when none is raised or
    /// the inode is gone. Call with the stripe held.
    async fn recheck(&self, ctx: &CallCtx, g: Gfid) {
        if !self.set.lock().contains(&g) {
            return;
        }
        self.rechecks.fetch_add(1, Ordering::Relaxed);
        let r =
            self.child.call(ctx.clone(), Request::new(Fop::Getxattr { loc: Loc::gfid(g), name: String::new() })).await;
        match r {
            Ok(Response { reply: Reply::Xattrs(d), .. }) if !self.raised(&d) => self.remove(g),
            Err(Errno::ENOENT | Errno::ESTALE) => self.remove(g),
            _ => {}
        }
    }

    async fn xattrop(&self, ctx: CallCtx, req: Request) -> FopResult {
        let g = req.fop.gfid();
        if g.is_null() {
            return self.child.call(ctx, req).await;
        }
        let _serial = self.stripe(&g).lock().await;
        let rsp = self.child.call(ctx.clone(), req).await?;
        if let Reply::Xattrs(d) = &rsp.reply {
            let (mut up, mut down) = (BTreeSet::new(), Vec::new());
            for (k, v) in d.iter().filter(|(k, _)| self.watched_key(k)) {
                match v {
                    Value::Bytes(b) if b.iter().any(|&x| x != 0) => up.insert(k.to_string()),
                    _ => {
                        down.push(k.to_string());
                        false
                    }
                };
            }
            enum Then {
                Add,
                Remove,
                Recheck,
                Nothing,
            }
            let then = {
                let mut keys = self.keys.lock();
                match keys.get_mut(&g) {
                    Some(k) => {
                        k.extend(up);
                        k.retain(|x| !down.contains(x));
                        if k.is_empty() {
                            keys.remove(&g);
                            Then::Remove
                        } else {
                            Then::Nothing
                        }
                    }
                    // Recorded before this process started: other keys unknown.
                    None if self.set.lock().contains(&g) => {
                        if up.is_empty() {
                            Then::Recheck
                        } else {
                            Then::Nothing
                        }
                    }
                    None if up.is_empty() => Then::Nothing,
                    None => {
                        if keys.len() < self.max {
                            keys.insert(g, up);
                        }
                        Then::Add
                    }
                }
            };
            match then {
                Then::Add => self.add(g),
                Then::Remove => self.remove(g),
                Then::Recheck => self.recheck(&ctx, g).await,
                Then::Nothing => {}
            }
        }
        Ok(rsp)
    }

    /// The sorted gfids after `after`, at most `list_max`.
    fn page(&self, after: Option<Gfid>) -> Vec<Gfid> {
        let s = self.set.lock();
        match after {
            Some(a) => s
                .range((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
                .take(self.list_max)
                .copied()
                .collect(),
            None => s.iter().take(self.list_max).copied().collect(),
        }
    }

    fn list(&self, key: &str) -> FopResult {
        let after = match key.strip_prefix(INDEX_XATTROP) {
            Some("") => None,
            Some(rest) => Some(rest.strip_prefix(':').and_then(Gfid::parse).ok_or(Errno::EINVAL)?),
            None => return Err(Errno::ENODATA),
        };
        let text: String = self.page(after).iter().map(|g| format!("{g}\n")).collect();
        let mut d = Dict::new();
        d.set_bytes(key, text.into_bytes());
        d.set_str(INDEX_COUNT, self.set.lock().len().to_string());
        Ok(Reply::Xattrs(d).into())
    }

    async fn purge(&self, ctx: &CallCtx, v: &[u8]) -> FopResult {
        let text = std::str::from_utf8(v).map_err(|_| Errno::EINVAL)?;
        for g in text.split(['\n', ',', ' ']).filter(|s| !s.is_empty()).take(MAX_PURGE) {
            let g = Gfid::parse(g.trim()).ok_or(Errno::EINVAL)?;
            let _serial = self.stripe(&g).lock().await;
            self.recheck(ctx, g).await;
        }
        Ok(Reply::Empty.into())
    }
}

fn is_root(loc: &Loc) -> bool {
    loc.gfid == Gfid::ROOT && !loc.is_entry()
}

impl Xlator for Index {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        match &req.fop {
            Fop::Xattrop { xattrs, .. } | Fop::Fxattrop { xattrs, .. } if self.watched(xattrs) => {
                Box::pin(self.xattrop(ctx, req))
            }
            Fop::Getxattr { loc, name } if is_root(loc) && name.starts_with(INDEX_XATTROP) => {
                let r = self.list(name);
                Box::pin(std::future::ready(r))
            }
            Fop::Setxattr { loc, xattrs, .. } if is_root(loc) && xattrs.contains(INDEX_PURGE) => {
                let v = xattrs.get_bytes(INDEX_PURGE).unwrap_or_default();
                Box::pin(async move { self.purge(&ctx, &v).await })
            }
            // AFR asks while the volume may need heal (its `need_heal`).
            Fop::Lookup { .. } if req.xdata.contains(INDEX_COUNT) => Box::pin(async move {
                let mut rsp = self.child.call(ctx, req).await?;
                rsp.xdata.set_str(INDEX_COUNT, self.set.lock().len().to_string());
                Ok(rsp)
            }),
            Fop::Setxattr { xattrs, .. } | Fop::Fsetxattr { xattrs, .. } if self.watched(xattrs) => {
                // Counters written directly: what this index knows of the
                // inode's raised keys no longer holds.
                self.keys.lock().remove(&req.fop.gfid());
                self.child.call(ctx, req)
            }
            _ => self.child.call(ctx, req),
        }
    }

    fn dump(&self) -> Vec<(String, String)> {
        vec![
            ("index-base".into(), self.dir.as_ref().map_or("(memory)".into(), |d| d.display().to_string())),
            ("entries".into(), self.set.lock().len().to_string()),
            ("dropped".into(), self.dropped.load(Ordering::Relaxed).to_string()),
            ("io-errors".into(), self.io_errors.load(Ordering::Relaxed).to_string()),
            ("rechecks".into(), self.rechecks.load(Ordering::Relaxed).to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use xlfs_sdk::XattropOp;
    use xlfs_sdk::testing::{init_named, set_xattr, xattr};

    use super::*;
    use crate::cluster::replicate::pending;

    struct T {
        _tmp: tempfile::TempDir,
        brick: PathBuf,
        base: PathBuf,
        posix: Arc<dyn Xlator>,
    }

    impl T {
        fn new() -> T {
            let tmp = tempfile::tempdir().expect("tempdir");
            let brick = tmp.path().join("b");
            std::fs::create_dir(&brick).expect("brick");
            let dir = brick.display().to_string();
            let (ictx, _) = init_named("p", crate::storage::posix::TYPE.options, &[("directory", &dir)], &[]);
            let posix = (crate::storage::posix::TYPE.build)(ictx).expect("posix");
            let base = brick.join(".glusterfs").join("indices");
            T { _tmp: tmp, brick, base, posix }
        }

        fn index(&self, extra: &[(&str, &str)]) -> Arc<dyn Xlator> {
            let b = self.base.display().to_string();
            let mut given = vec![("index-base", b.as_str())];
            given.extend_from_slice(extra);
            build(init_named("idx", OPTIONS, &given, &[Child { name: "p".into(), xl: self.posix.clone() }]).0)
                .expect("index")
        }

        async fn file(&self, name: &str) -> Gfid {
            let g = Gfid::random();
            let x = Dict::new().with(xlfs_sdk::dict::keys::GFID_REQ, Value::Gfid(g));
            let fop = Fop::Mknod { loc: Loc::entry(Gfid::ROOT, name), mode: 0o100644, rdev: 0, umask: 0 };
            self.posix.call(CallCtx::root("t"), Request::with_xdata(fop, x)).await.expect("mknod");
            g
        }
    }

    async fn xop(ix: &Arc<dyn Xlator>, g: Gfid, key: &str, v: [i32; 3]) -> Dict {
        let mut d = Dict::new();
        d.set_bytes(key, pending::encode(v));
        let fop = Fop::Xattrop { loc: Loc::gfid(g), op: XattropOp::AddArray, xattrs: d };
        match ix.call(CallCtx::root("t"), Request::new(fop)).await.expect("xattrop").reply {
            Reply::Xattrs(d) => d,
            r => panic!("{r:?}"),
        }
    }

    async fn listed(ix: &Arc<dyn Xlator>, key: &str) -> (Vec<Gfid>, String) {
        let fop = Fop::Getxattr { loc: Loc::root(), name: key.into() };
        match ix.call(CallCtx::root("t"), Request::new(fop)).await.expect("getxattr").reply {
            Reply::Xattrs(d) => {
                let text = d.get_str(key).expect("list").to_string();
                (
                    text.lines().map(|l| Gfid::parse(l).expect("gfid")).collect(),
                    d.get_str(INDEX_COUNT).expect("count").into(),
                )
            }
            r => panic!("{r:?}"),
        }
    }

    #[tokio::test]
    async fn index_records_raised_counters_and_drops_them_when_all_are_zero() {
        let t = T::new();
        let ix = t.index(&[]);
        let g = t.file("f").await;
        xop(&ix, g, "trusted.afr.c-0", [1, 0, 0]).await;
        xop(&ix, g, "trusted.afr.c-1", [0, 1, 0]).await;
        assert_eq!(listed(&ix, INDEX_XATTROP).await, (vec![g], "1".into()));
        assert!(t.base.join("xattrop").join(g.to_string()).exists());
        // c-0 back to zero, but c-1 is still raised: kept.
        xop(&ix, g, "trusted.afr.c-0", [-1, 0, 0]).await;
        assert_eq!(listed(&ix, INDEX_XATTROP).await.0, vec![g]);
        xop(&ix, g, "trusted.afr.c-1", [0, -1, 0]).await;
        assert_eq!(listed(&ix, INDEX_XATTROP).await, (vec![], "0".into()));
        assert!(!t.base.join("xattrop").join(g.to_string()).exists());
        // Non-AFR xattrops are not watched.
        xop(&ix, g, "trusted.other", [1, 0, 0]).await;
        assert!(listed(&ix, INDEX_XATTROP).await.0.is_empty());
    }

    /// Entries are hard links to one base file, found again after a
    /// restart; a base removed behind the index's back is made anew.
    #[tokio::test]
    async fn entries_are_links_to_one_base_file() {
        use std::os::unix::fs::MetadataExt;
        let t = T::new();
        let ix = t.index(&[]);
        let dir = t.base.join("xattrop");
        let bases = || -> Vec<PathBuf> {
            let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
                .expect("index dir")
                .map(|e| e.expect("entry").path())
                .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(BASE_PREFIX)))
                .collect();
            v.sort();
            v
        };
        let (g, h) = (t.file("g").await, t.file("h").await);
        xop(&ix, g, "trusted.afr.c-0", [1, 0, 0]).await;
        xop(&ix, h, "trusted.afr.c-0", [1, 0, 0]).await;
        let first = bases();
        assert_eq!(first.len(), 1, "one base file");
        let ino = |p: &Path| std::fs::metadata(p).expect("stat").ino();
        assert_eq!(ino(&dir.join(g.to_string())), ino(&first[0]));
        assert_eq!(ino(&dir.join(h.to_string())), ino(&first[0]));
        assert_eq!(std::fs::metadata(&first[0]).expect("base").nlink(), 3);
        drop(ix);
        let ix = t.index(&[]);
        xop(&ix, g, "trusted.afr.c-0", [-1, 0, 0]).await;
        let k = t.file("k").await;
        xop(&ix, k, "trusted.afr.c-1", [0, 1, 0]).await;
        assert_eq!(bases(), first, "the base found at start is used");
        assert_eq!(std::fs::metadata(&first[0]).expect("base").nlink(), 3, "h and k");
        std::fs::remove_file(&first[0]).expect("remove the base");
        let m = t.file("m").await;
        xop(&ix, m, "trusted.afr.c-1", [0, 1, 0]).await;
        assert!(dir.join(m.to_string()).exists(), "recorded with a new base");
        assert_eq!(bases().len(), 1);
        let mut want = vec![h, k, m];
        want.sort();
        assert_eq!(listed(&ix, INDEX_XATTROP).await.0, want);
    }

    fn rechecks(ix: &Arc<dyn Xlator>) -> String {
        ix.dump().into_iter().find(|(k, _)| k == "rechecks").map(|(_, v)| v).unwrap_or_default()
    }

    #[tokio::test]
    async fn lowered_counters_drop_the_gfid_without_reading_xattrs_unless_recorded_before_a_restart() {
        let t = T::new();
        let ix = t.index(&[]);
        let (g, h) = (t.file("g").await, t.file("h").await);
        for f in [g, h] {
            xop(&ix, f, "trusted.afr.c-0", [1, 0, 0]).await;
            xop(&ix, f, "trusted.afr.c-1", [1, 0, 0]).await;
        }
        xop(&ix, g, "trusted.afr.c-0", [-1, 0, 0]).await;
        assert_eq!(listed(&ix, INDEX_XATTROP).await.0.len(), 2, "c-1 of g still raised");
        xop(&ix, g, "trusted.afr.c-1", [-1, 0, 0]).await;
        assert_eq!(listed(&ix, INDEX_XATTROP).await.0, vec![h]);
        assert_eq!(rechecks(&ix), "0", "the replies said it all");
        // A new process knows h only from disk: lowering one key reads the
        // rest, and c-1 keeps it listed.
        let ix2 = t.index(&[]);
        xop(&ix2, h, "trusted.afr.c-0", [-1, 0, 0]).await;
        assert_eq!((listed(&ix2, INDEX_XATTROP).await.0, rechecks(&ix2)), (vec![h], "1".to_string()));
        xop(&ix2, h, "trusted.afr.c-1", [-1, 0, 0]).await;
        assert!(listed(&ix2, INDEX_XATTROP).await.0.is_empty());
    }

    #[tokio::test]
    async fn index_survives_a_restart_pages_and_purges() {
        let t = T::new();
        let ix = t.index(&[("index-list-max", "2")]);
        let mut gs = Vec::new();
        for i in 0..3 {
            let g = t.file(&format!("f{i}")).await;
            xop(&ix, g, "trusted.afr.c-0", [0, 0, 1]).await;
            gs.push(g);
        }
        gs.sort();
        drop(ix);
        let ix = t.index(&[("index-list-max", "2")]);
        let (first, count) = listed(&ix, INDEX_XATTROP).await;
        assert_eq!((first.clone(), count.as_str()), (gs[..2].to_vec(), "3"));
        let (next, _) = listed(&ix, &format!("{INDEX_XATTROP}:{}", first[1])).await;
        assert_eq!(next, gs[2..].to_vec());
        // Purge: one file is gone, one has zero counters set behind the index's back, one stays raised.
        let unlink = Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "f0"), flags: 0 };
        t.posix.call(CallCtx::root("t"), Request::new(unlink)).await.expect("unlink");
        set_xattr(&t.brick.join("f1"), "trusted.afr.c-0", &pending::encode([0, 0, 0])).expect("set xattr");
        let text: String = gs.iter().map(|g| format!("{g}\n")).collect();
        let mut x = Dict::new();
        x.set_bytes(INDEX_PURGE, Bytes::from(text));
        ix.call(CallCtx::root("t"), Request::new(Fop::Setxattr { loc: Loc::root(), xattrs: x, flags: 0 }))
            .await
            .expect("purge");
        let g2 = read_gfid(&t.brick.join("f2"));
        assert_eq!(listed(&ix, INDEX_XATTROP).await.0, vec![g2]);
    }

    #[tokio::test]
    async fn index_watches_only_the_watchlists_glusterfs_gives() {
        let t = T::new();
        let ix = t.index(&[
            ("xattrop-pending-watchlist", "trusted.afr.rep3-"),
            ("xattrop-dirty-watchlist", "trusted.afr.dirty"),
        ]);
        let (a, b, d) = (t.file("a").await, t.file("b").await, t.file("d").await);
        xop(&ix, a, "trusted.afr.rep3-client-1", [1, 0, 0]).await;
        xop(&ix, b, "trusted.afr.other-client-1", [1, 0, 0]).await;
        xop(&ix, d, "trusted.afr.dirty", [0, 1, 0]).await;
        let mut want = vec![a, d];
        want.sort();
        assert_eq!(listed(&ix, INDEX_XATTROP).await.0, want);
    }

    #[tokio::test]
    async fn index_is_bounded() {
        let t = T::new();
        let ix = t.index(&[("index-max-entries", "1")]);
        let (a, b) = (t.file("a").await, t.file("b").await);
        xop(&ix, a, "trusted.afr.c-0", [1, 0, 0]).await;
        xop(&ix, b, "trusted.afr.c-0", [1, 0, 0]).await;
        assert_eq!(listed(&ix, INDEX_XATTROP).await.0, vec![a]);
        assert!(ix.dump().contains(&("dropped".to_string(), "1".to_string())));
    }

    fn read_gfid(p: &Path) -> Gfid {
        let v = xattr(p, "trusted.gfid").expect("a gfid");
        Gfid(v.try_into().expect("16 bytes"))
    }
}
