//! cluster/distribute (also `cluster/dht`): spreads a volume's files over
//! its subvolumes by a hash of their names, GlusterFS's DHT.
//!
//! **Placement.** Every directory exists on every subvolume and carries, on
//! each, the range of the 32-bit name hash that subvolume holds
//! (`trusted.glusterfs.dht`, see `layout`; the hash is GlusterFS's
//! Davies-Meyer, see `hash`). A file lives on the subvolume its name
//! hashes to, or, when it was made elsewhere (a full subvolume, a rename),
//! its hashed subvolume holds a *link file* pointing at it: an empty
//! regular file of mode `01000` (sticky bit only) with the target
//! subvolume's name in `trusted.glusterfs.dht.linkto`, and the file's gfid.
//!
//! **Lookup** of a name asks the subvolume it hashes to and follows a link
//! file. A name not found there is looked for on every subvolume only when
//! the parent's layout is not settled (its commit hash says ranges moved)
//! or `lookup-optimize` is off. A directory is looked up on every
//! subvolume; a copy missing somewhere is made there (same gfid, mode and
//! owner), and a layout with a hole or an overlap is rewritten, under an
//! inodelk on the directory in domain `dht.layout.heal` on the first
//! subvolume. Attributes come from the hashed subvolume's copy.
//!
//! **Files.** create, mknod, symlink and link go to the hashed subvolume;
//! when it has less free space than `min-free-disk`, create and mknod make
//! the file on the subvolume with the most room and a link file on the
//! hashed one (link first, so the name is never on two subvolumes as data).
//! Every other fop on a file goes to the subvolume that holds it, cached
//! per inode (bounded; dropped on forget) and found again by a lookup
//! everywhere when unknown or when it answers ESTALE or ENOENT. An open fd
//! remembers its subvolume.
//!
//! **Directories.** mkdir makes the directory on the hashed subvolume
//! first, then on the others, then writes the layout; rmdir removes it from
//! every subvolume, the hashed one last; setattr, setxattr and removexattr
//! of a directory go to all. opendir opens every copy; readdir(p) reads the
//! subvolumes one after the other (see `readdir` for the offsets), taking
//! directories only from the first subvolume and skipping link files.
//!
//! **unlink** removes the data file, then the link file. **rename** of a
//! file is ordered so that exactly one of the two names is visible at every
//! moment (see `entry`). statfs sums the subvolumes.
//!
//! Xattrs named `trusted.glusterfs.dht*` are this translator's: clients
//! cannot set or remove them (EPERM), getxattr answers ENODATA and listings
//! and lookup replies leave them out.
//!
//! Errors: a fop sent to several subvolumes fails with the first error
//! other than ENOENT from them (a lookup or opendir needs every copy), so
//! a subvolume that is down fails what touches it.
//!
//! Options (declared below, where each is documented):
//! - `min-free-disk` (default `10%`): percentage or size;
//! - `lookup-optimize` (default on);
//! - `force-migration`, `lock-migration`: accepted for GlusterFS volfiles,
//!   without effect;
//! - `decommissioned-bricks` (default none): subvolumes being removed, which
//!   new and repaired layouts give no range.
//!
//! **Rebalance** (see `migrate`): a rebalance process asks its own
//! distribute node, through virtual setxattrs, to fix a directory's
//! layout, to move a file where its name hashes, and to settle a
//! directory; an fd or inode whose file was migrated under it is found
//! again and its fop sent again there (see `inode`).
//!
//! **Heal control** (see `heal_control`): replicate's heal runs and heal
//! info on the root go to every subvolume, and their answers are merged,
//! so `xlfs heal` and the self-heal daemon see every replica set.

mod entry;
mod hash;
mod heal_control;
mod inode;
mod layout;
mod lookup;
mod migrate;
mod readdir;
mod space;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use xlfs_sdk::options::{Opt, kind};
use xlfs_sdk::slots::{FdSlots, InodeSlots};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, FdId, Fop, FopFuture, FopResult, Gfid, InitCtx, InitError,
    OptionDecl, Options, Reply, Request, Response, Value, Xlator, XlatorType,
};

pub use self::hash::dm_hash;
pub use self::layout::{LAYOUT_XATTR, Layout, Range};
pub use self::migrate::{BUSY, Decision, FIX_LAYOUT_KEY, MIGRATE_KEY, MIGRATED_KEY, SETTLE_KEY, SKIPPED_KEY, decide};

use self::space::Space;

/// The xattr of a link file naming the subvolume that holds the data.
pub const LINKTO_XATTR: &str = "trusted.glusterfs.dht.linkto";
/// Every xattr whose name starts with this is the translator's own.
const PRIVATE_PREFIX: &str = "trusted.glusterfs.dht";
/// The mode bits of a link file (a regular file with the sticky bit only).
pub const LINK_MODE: u32 = 0o1000;
/// The inodelk domain of layout repairs.
pub const HEAL_DOMAIN: &str = "dht.layout.heal";
/// Most subvolumes (the readdir offset keeps their index in 8 bits).
pub const MAX_CHILDREN: usize = 256;
/// Inodes and fds whose subvolume is remembered, and directories whose
/// layout is (a full table forgets nothing: the fop finds it again).
const CACHE_CAP: usize = 1 << 20;

const MIN_FREE_DISK: Opt<kind::Str> = Opt::str("min-free-disk", "10%").desc(
    "Free space a subvolume keeps for the files already on it: a percentage of its size (10 or 10%) or a size \
     (40GB). A create or mknod whose name hashes to a subvolume with less available makes the file on the \
     subvolume with the most room (and a link file on the hashed one); when none has more, on the hashed one. \
     Each subvolume's statfs is trusted for 1 s.",
);
const LOOKUP_OPTIMIZE: Opt<kind::Bool> = Opt::bool("lookup-optimize", true).desc(
    "A name not found on the subvolume it hashes to does not exist, unless the parent directory's layout is \
     unsettled (its commit hash says ranges moved since files were placed): only then is it looked for on every \
     subvolume. Off: every such miss is looked for everywhere (one lookup per subvolume per negative lookup).",
);
const FORCE_MIGRATION: Opt<kind::Bool> = Opt::bool("force-migration", false).desc(
    "Accepted for GlusterFS volfiles; no effect (xlfs migrates files with open fds always: writers wait on the \
     migration's lock and follow the file).",
);
const LOCK_MIGRATION: Opt<kind::Bool> = Opt::bool("lock-migration", false)
    .desc("Accepted for GlusterFS volfiles; no effect (POSIX locks on a migrated file are not moved with it).");

const DECOMMISSIONED: Opt<kind::Str> = Opt::str("decommissioned-bricks", "").desc(
    "Subvolumes being removed (remove-brick), comma-separated names: new and repaired directory layouts give them \
     no hash range, so no new name lands on them, and rebalance moves their files to the others. Set by the \
     volume generator during `xlfs volume remove-brick ... start`.",
);

const OPTIONS: &[OptionDecl] =
    &[MIN_FREE_DISK.decl, LOOKUP_OPTIMIZE.decl, FORCE_MIGRATION.decl, LOCK_MIGRATION.decl, DECOMMISSIONED.decl];

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "cluster/distribute",
    description: "distributes files over subvolumes by a hash of their names (DHT): layouts, link files, heal",
    options: OPTIONS,
    min_children: 1,
    max_children: MAX_CHILDREN,
    build,
};

/// The same translator under GlusterFS's other name for it.
pub const TYPE_DHT: XlatorType = XlatorType { name: "cluster/dht", ..TYPE };

/// Where an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    /// A non-directory, on this subvolume.
    File(usize),
    /// A directory (on every subvolume).
    Dir,
}

/// A directory's layout as last read, with the subvolumes that have it.
#[derive(Clone, Debug)]
struct DirInfo {
    layout: Layout,
    present: Vec<bool>,
}

impl DirInfo {
    fn settled(&self) -> bool {
        self.layout.settled(&self.present) && self.present.iter().all(|p| *p)
    }
}

/// Option values that reconfigure may change.
#[derive(Clone, Debug)]
struct Config {
    min_free: xlfs_sdk::options::Share,
    lookup_optimize: bool,
    decommissioned: Vec<String>,
}

impl Config {
    fn from_options(o: &Options) -> Result<Config, String> {
        let raw = MIN_FREE_DISK.get(o);
        let min_free = xlfs_sdk::options::Share::parse(raw).ok_or_else(|| {
            format!(
                "option 'min-free-disk': '{raw}' is neither a percentage (0 to 100, e.g. 10%) nor a size (e.g. 40GB)"
            )
        })?;
        let decommissioned =
            DECOMMISSIONED.get(o).split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        Ok(Config { min_free, lookup_optimize: LOOKUP_OPTIMIZE.get(o), decommissioned })
    }
}

/// Counters for dump().
#[derive(Default)]
struct Stats {
    lookups_everywhere: AtomicU64,
    /// Lookups everywhere sent a second time after finding no data.
    lookups_again: AtomicU64,
    links_followed: AtomicU64,
    links_made: AtomicU64,
    dirs_healed: AtomicU64,
    layouts_healed: AtomicU64,
    redirected_creates: AtomicU64,
    relocated: AtomicU64,
    migrated: AtomicU64,
    fds_moved: AtomicU64,
    /// Files listed from a subvolume read earlier, which they moved to
    /// during the listing.
    moved_listed: AtomicU64,
}

/// The translator's state.
struct Inner {
    name: String,
    children: Vec<Child>,
    cfg: RwLock<Config>,
    inodes: InodeSlots<Where>,
    dirs: InodeSlots<Arc<DirInfo>>,
    fds: FdSlots<Where>,
    /// Each open fd's open flags, to open it again where its file moved.
    fd_flags: FdSlots<u32>,
    /// Names given out per directory fd listing an unsettled directory.
    listings: FdSlots<Arc<parking_lot::Mutex<readdir::Given>>>,
    /// Serializes the moves of fds whose file migrated.
    fd_moves: tokio::sync::Mutex<()>,
    space: Space,
    /// Children up (bit i) and those that have said anything; whether the
    /// parents were told up.
    up: Mutex<(Vec<bool>, Vec<bool>, bool)>,
    owner_base: u64,
    next_owner: AtomicU64,
    stats: Stats,
}

/// cluster/distribute.
pub struct Distribute {
    inner: Arc<Inner>,
}

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    Ok(Arc::new(Distribute::new(init)?))
}

impl Distribute {
    /// Builds the translator from its init context.
    pub fn new(init: InitCtx) -> Result<Distribute, InitError> {
        let InitCtx { name, options, children, .. } = init;
        let err = |m: String| InitError::new(format!("{name}: {m}"));
        if children.is_empty() || children.len() > MAX_CHILDREN {
            return Err(err(format!(
                "cluster/distribute takes 1 to {MAX_CHILDREN} subvolumes, got {}",
                children.len()
            )));
        }
        let cfg = Config::from_options(&options).map_err(err)?;
        let n = children.len();
        let mut base = [0u8; 8];
        base.copy_from_slice(&Gfid::random().0[..8]);
        let inner = Inner {
            name,
            cfg: RwLock::new(cfg),
            inodes: InodeSlots::with_capacity(CACHE_CAP),
            dirs: InodeSlots::with_capacity(CACHE_CAP / 4),
            fds: FdSlots::with_capacity(CACHE_CAP),
            fd_flags: FdSlots::with_capacity(CACHE_CAP),
            listings: FdSlots::with_capacity(1024),
            fd_moves: tokio::sync::Mutex::new(()),
            space: Space::new(n),
            up: Mutex::new((vec![false; n], vec![false; n], false)),
            owner_base: u64::from_le_bytes(base),
            next_owner: AtomicU64::new(1),
            stats: Stats::default(),
            children,
        };
        Ok(Distribute { inner: Arc::new(inner) })
    }
}

/// The request xdata that asks a child for the translator's own xattrs
/// besides what the caller asked.
fn with_private_keys(xdata: &Dict) -> Dict {
    let mut x = xdata.clone();
    x.set(LAYOUT_XATTR, Value::U64(0));
    x.set(LINKTO_XATTR, Value::U64(0));
    x
}

/// True for the translator's own xattrs (and per-entry reply keys of them).
fn is_private(key: &str) -> bool {
    let name = xlfs_sdk::dict::keys::parse_dirent_xattr(key).map_or(key, |(_, x)| x);
    name.starts_with(PRIVATE_PREFIX)
}

/// Reply xdata without the translator's own xattrs.
fn strip_private(mut d: Dict) -> Dict {
    let private: Vec<String> = d.keys().filter(|k| is_private(k)).cloned().collect();
    for k in private {
        d.remove(&k);
    }
    d
}

/// The subvolume name a link file points at, if `iatt` and `xdata` (its
/// lookup reply) are a link file's.
fn linkto_of(iatt: &xlfs_sdk::Iatt, xdata: &Dict) -> Option<String> {
    if iatt.mode & 0o7777 != LINK_MODE {
        return None;
    }
    linkto_xattr(iatt, xdata)
}

/// The subvolume a regular file's linkto xattr names, whatever its mode:
/// a link file's, or a migration's destination between its switch to a
/// data file and the end of the switch (`migrate.rs`, steps 4 to 6).
fn linkto_xattr(iatt: &xlfs_sdk::Iatt, xdata: &Dict) -> Option<String> {
    if iatt.file_type() != xlfs_sdk::FileType::Regular {
        return None;
    }
    linkto_name(&xdata.get_bytes(LINKTO_XATTR)?)
}

/// The subvolume name a linkto xattr's value holds (a trailing NUL, as
/// GlusterFS writes it, dropped).
fn linkto_name(v: &[u8]) -> Option<String> {
    let v = v.strip_suffix(&[0u8]).unwrap_or(v);
    std::str::from_utf8(v).ok().map(str::to_string)
}

/// The first error among `results` other than those `ignore` accepts.
fn first_error<'a>(results: impl IntoIterator<Item = &'a FopResult>, ignore: &[Errno]) -> Option<Errno> {
    results.into_iter().find_map(|r| r.as_ref().err().copied().filter(|e| !ignore.contains(e)))
}

impl Inner {
    fn n(&self) -> usize {
        self.children.len()
    }

    fn cfg(&self) -> Config {
        self.cfg.read().clone()
    }

    /// The subvolumes not being removed (all of them, or none if every
    /// one is named: then all, as nothing else could hold files).
    fn active(&self) -> Vec<bool> {
        let cfg = self.cfg.read();
        let a: Vec<bool> = self.children.iter().map(|c| !cfg.decommissioned.iter().any(|d| **d == *c.name)).collect();
        if a.iter().any(|x| *x) { a } else { vec![true; self.n()] }
    }

    /// Whether subvolume `i` is being removed (not [`Self::active`]); no
    /// allocation when nothing is.
    fn leaving(&self, i: usize) -> bool {
        !self.cfg.read().decommissioned.is_empty() && !self.active()[i]
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.children.iter().position(|c| &*c.name == name)
    }

    /// Sends a fop to child `i`.
    fn wind(&self, i: usize, ctx: &CallCtx, req: Request) -> FopFuture<'_> {
        self.children[i].call(ctx.clone(), req)
    }

    /// Sends the same fop to the children in `to`, all at once; results in
    /// the same order.
    async fn fan(&self, to: &[usize], ctx: &CallCtx, req: &Request) -> Vec<FopResult> {
        let futs = to.iter().map(|&i| self.wind(i, ctx, req.clone())).collect();
        crate::cluster::replicate::join_all(futs).await
    }

    fn all(&self) -> Vec<usize> {
        (0..self.n()).collect()
    }

    /// A lock owner no other caller uses.
    fn owner(&self) -> u64 {
        self.owner_base ^ self.next_owner.fetch_add(1, Ordering::Relaxed)
    }

    fn remember(&self, gfid: Gfid, w: Where) {
        if gfid.is_null() {
            return;
        }
        if self.inodes.insert(gfid, w).is_err() {
            tracing::debug!(volume = %self.name, "inode location table full");
        }
    }

    async fn dispatch(&self, ctx: CallCtx, req: Request) -> FopResult {
        let open = match &req.fop {
            Fop::Open { fd, flags, .. } | Fop::Create { fd, flags, .. } => Some((*fd, *flags)),
            _ => None,
        };
        let r = self.dispatch_fop(ctx, req).await;
        if let (Some((fd, flags)), Ok(_)) = (open, &r) {
            let _ = self.fd_flags.insert(fd, flags);
        }
        r
    }

    async fn dispatch_fop(&self, ctx: CallCtx, req: Request) -> FopResult {
        let Request { fop, xdata } = req;
        match fop {
            Fop::Lookup { loc } => self.lookup(&ctx, loc, xdata).await,
            Fop::Mkdir { .. } => self.mkdir(&ctx, fop, xdata).await,
            Fop::Rmdir { .. } => self.rmdir(&ctx, fop, xdata).await,
            Fop::Create { .. } | Fop::Mknod { .. } | Fop::Symlink { .. } => self.make_file(&ctx, fop, xdata).await,
            Fop::Link { .. } => self.link(&ctx, fop, xdata).await,
            Fop::Unlink { .. } => self.unlink(&ctx, fop, xdata).await,
            Fop::Rename { .. } => self.rename(&ctx, fop, xdata).await,
            Fop::Opendir { .. } => self.opendir(&ctx, fop, xdata).await,
            Fop::Readdir { fd, size, offset } => self.readdir(&ctx, fd, size, offset, false, xdata).await,
            Fop::Readdirp { fd, size, offset } => self.readdir(&ctx, fd, size, offset, true, xdata).await,
            Fop::Statfs { .. } => self.statfs(&ctx, fop, xdata).await,
            Fop::Forget { gfid } => {
                self.inodes.remove(&gfid);
                self.dirs.remove(&gfid);
                // Forget is a notice: what the children answer changes nothing.
                let _ = self.fan(&self.all(), &ctx, &Request::with_xdata(Fop::Forget { gfid }, xdata)).await;
                Ok(Reply::Empty.into())
            }
            Fop::Ipc { op } => {
                let r = self.fan(&self.all(), &ctx, &Request::with_xdata(Fop::Ipc { op }, xdata)).await;
                r.into_iter().next().unwrap_or(Err(Errno::ENOTCONN))
            }
            Fop::Setxattr { loc, ref xattrs, .. } if xattrs.keys().any(|k| migrate::is_rebalance_key(k)) => {
                let key = xattrs.keys().find(|k| migrate::is_rebalance_key(k)).cloned().unwrap_or_default();
                self.rebalance_op(&ctx, loc, &key).await
            }
            fop if heal_control::is_heal_control(&fop) => {
                self.heal_control(&ctx, Request::with_xdata(fop, xdata)).await
            }
            Fop::Getxattr { ref name, .. } | Fop::Fgetxattr { ref name, .. } if is_private(name) => Err(Errno::ENODATA),
            Fop::Setxattr { ref xattrs, .. } | Fop::Fsetxattr { ref xattrs, .. }
                if xattrs.keys().any(|k| is_private(k)) =>
            {
                Err(Errno::EPERM)
            }
            Fop::Removexattr { ref name, .. } | Fop::Fremovexattr { ref name, .. } if is_private(name) => {
                Err(Errno::EPERM)
            }
            fop => self.inode_fop(&ctx, Request::with_xdata(fop, xdata)).await,
        }
    }
}

impl Xlator for Distribute {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(self.inner.dispatch(ctx, req))
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        let me = &self.inner;
        let i = match from {
            EventFrom::Child(i) if i < me.n() => i,
            EventFrom::Child(_) => return None,
            EventFrom::Graph => return None,
        };
        match event {
            // Up once every child has said up or down and one is up (or all
            // are up); down when none is left.
            Event::ChildUp | Event::ChildDown => {
                let mut s = me.up.lock();
                s.0[i] = event == Event::ChildUp;
                s.1[i] = true;
                let any = s.0.iter().any(|u| *u);
                let ready = s.0.iter().all(|u| *u) || (any && s.1.iter().all(|h| *h));
                if event == Event::ChildDown {
                    tracing::warn!(volume = %me.name, child = %me.children[i].name, "child down");
                }
                if !s.2 && ready {
                    s.2 = true;
                    Some(Event::ChildUp)
                } else if s.2 && !any {
                    s.2 = false;
                    Some(Event::ChildDown)
                } else {
                    None
                }
            }
            Event::ChildConnecting => (!me.up.lock().2).then_some(Event::ChildConnecting),
            e => Some(e),
        }
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        let cfg = Config::from_options(options).map_err(ReconfigureError::Invalid)?;
        let layouts_change = self.inner.cfg.read().decommissioned != cfg.decommissioned;
        *self.inner.cfg.write() = cfg;
        if layouts_change {
            // Read layouts again: rebalance rewrites them over the others.
            self.inner.dirs.retain(|_, _| false);
        }
        Ok(())
    }

    fn dump(&self) -> Vec<(String, String)> {
        let me = &self.inner;
        let cfg = me.cfg();
        let up = me.up.lock().0.clone();
        let mut out = vec![
            ("min-free-disk".to_string(), cfg.min_free.to_string()),
            ("lookup-optimize".to_string(), cfg.lookup_optimize.to_string()),
        ];
        for (i, c) in me.children.iter().enumerate() {
            out.push((format!("child.{i}"), format!("{} {}", c.name, if up[i] { "up" } else { "down" })));
        }
        let s = &me.stats;
        for (k, v) in [
            ("lookups-everywhere", &s.lookups_everywhere),
            ("lookups-again", &s.lookups_again),
            ("links-followed", &s.links_followed),
            ("links-made", &s.links_made),
            ("dirs-healed", &s.dirs_healed),
            ("layouts-healed", &s.layouts_healed),
            ("redirected-creates", &s.redirected_creates),
            ("relocated", &s.relocated),
            ("migrated", &s.migrated),
            ("fds-moved", &s.fds_moved),
            ("moved-listed", &s.moved_listed),
        ] {
            out.push((k.to_string(), v.load(Ordering::Relaxed).to_string()));
        }
        out.push(("inodes".into(), me.inodes.len().to_string()));
        out.push(("dirs".into(), me.dirs.len().to_string()));
        out.push(("fds".into(), me.fds.len().to_string()));
        out
    }
}

/// The entry attributes of a lookup-type reply.
/// The attributes a reply carries about its inode (not its parent's).
fn inode_iatt(reply: &mut Reply) -> Option<&mut xlfs_sdk::Iatt> {
    match reply {
        Reply::Entry { iatt, .. } | Reply::Attr(iatt) | Reply::PrePost { post: iatt, .. } => Some(iatt),
        _ => None,
    }
}

/// A directory's attributes as one (GlusterFS's `dht_iatt_merge`): every
/// subvolume holds a copy, changed as names land on it, so `into` (one
/// copy's reply) gets the latest times and the largest size and blocks of
/// all the copies' replies in `all`. Every path (lookup, stat, setattr)
/// then gives the same answer, and a name made on any subvolume moves the
/// directory's times (`tar` and `make` compare them).
fn merge_dir(into: &mut Response, all: &mut [FopResult]) {
    let Some(t) = inode_iatt(&mut into.reply) else { return };
    for r in all.iter_mut().flatten() {
        let Some(o) = inode_iatt(&mut r.reply) else { continue };
        if o.gfid != t.gfid {
            continue;
        }
        t.atime = t.atime.max(o.atime);
        t.mtime = t.mtime.max(o.mtime);
        t.ctime = t.ctime.max(o.ctime);
        t.size = t.size.max(o.size);
        t.blocks = t.blocks.max(o.blocks);
    }
}

fn entry_iatt(rsp: &Response) -> Result<xlfs_sdk::Iatt, Errno> {
    match &rsp.reply {
        Reply::Entry { iatt, .. } => Ok(*iatt),
        _ => Err(Errno::EIO),
    }
}

/// The fd id of an opendir/open fop.
fn fd_id_of(fop: &Fop) -> Option<FdId> {
    match fop {
        Fop::Open { fd, .. } | Fop::Opendir { fd, .. } | Fop::Create { fd, .. } => Some(*fd),
        _ => None,
    }
}
