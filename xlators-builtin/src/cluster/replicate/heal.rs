//! Self-heal (GlusterFS's `afr-self-heal-*.c`), split-brain resolution and
//! the control interface the heal daemon drives.
//!
//! Healing one inode (by gfid) takes, kind by kind, AFR's own lock in the
//! volume's lock domain (an inodelk on the whole file for data, on the
//! metadata range for metadata, an entrylk on the whole directory for
//! entries), so it never races a writer; other clients' eager locks are
//! given up through their lock-contention policy. Under the lock it reads
//! every copy's pending counters again and judges them
//! ([`pending::verdict`]): sources, sinks, or a split-brain. Then:
//! - data: copies the source's contents to the sinks, `full` (every
//!   block) or `diff` (only blocks whose rchecksum differs), in blocks of
//!   [`BLOCK`] bytes, `data-self-heal-window-size` blocks at a time;
//!   truncates sinks to the source's size and gives them its times;
//! - metadata: mode, owner, times, and the `user.*` / `trusted.*` xattrs
//!   (not `trusted.afr.*`, `trusted.gfid`, `trusted.glusterfs.*`);
//! - entries (directories): names on a source missing on a copy are made
//!   there with the same gfid, type, mode and symlink target (a gfid the
//!   copy already has becomes a hard link), and the new inode is blamed on
//!   the source so it is healed next (and stays in the index if that does
//!   not happen now); names on a sink that no source has are removed
//!   (directories with their contents). With no clear source (every copy
//!   blames itself, or an entry split-brain) the names of all copies are
//!   merged and nothing is removed. A name whose gfid differs between
//!   copies (a gfid split-brain) is left alone and the directory's heal
//!   reported failed.
//!
//! Finally the counters that blamed the healed copies are taken back with
//! an xattrop on every copy, so a healed inode is clean and leaves the
//! index of every brick.
//!
//! Split-brain (data or metadata; every copy that does not blame itself is
//! blamed by another) is logged with the gfid; data reads of such a file
//! and metadata reads of such an inode fail with EIO, lookups work. A
//! policy picks the source: `favorite-child-policy` during any heal, or
//! the resolve request below.
//!
//! Control interface (virtual xattrs, answered by replicate itself so they
//! work through any translators above it):
//! - setxattr on the root, [`RUN_KEY`] = `index` (or empty) heals every
//!   gfid listed in the children's indices (features/index); `full` crawls
//!   the whole tree instead. [`GFID_KEY`] = `<gfid>` heals one inode (and
//!   what its entry heal creates). The reply xdata carries
//!   [`HEALED_KEY`], [`FAILED_KEY`], [`SPLIT_KEY`] and [`REMAINING_KEY`]
//!   (decimal strings; remaining = gfids still listed in some index after
//!   the run, or in the one inode's case, whether it still needs heal) and
//!   [`REPORT_KEY`]: one line per inode not healed, `<gfid> failed <errno>`
//!   or `<gfid> split-brain <kinds>`.
//! - getxattr on the root, [`INFO_KEY`]: per child a line
//!   `<name>: up, <n> entries to heal` (n: gfids its index lists; `1
//!   entry`) or `<name>: down`, then one line per listed gfid (at most
//!   [`INFO_MAX`] per child): `  <gfid> <kinds needing heal or "-">`, with
//!   ` split-brain <kinds>` appended for split-brain ones, or
//!   `  <gfid> gone` when no copy exists any more.
//! - setxattr on a file or directory, [`RESOLVE_KEY`] = `bigger-file`,
//!   `latest-mtime` or `source-brick:<child>` (a child's volume name or
//!   pending name): heals the inode with that choice of source for any
//!   split-brain kind. Reply xdata as for [`GFID_KEY`], plus
//!   [`RESULT_KEY`]: `resolved`, `not in split-brain`, or
//!   `unresolved: <why>`.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::dict::keys::{GFID_REQ, GFID_XATTR};
use xlfs_sdk::{
    CallCtx, Dict, DirEntry, Errno, Fd, FdId, FileType, Fop, FopResult, Gfid, Iatt, Loc, Reply, Request, Response,
    SetAttr, TimeSet, Value, XattropOp,
};

use super::Inner;
use super::lock::Target;
use super::pending::{self, Kind, Mask, Verdict, bit, members};
use crate::features::index::{COUNT_KEY, PURGE_KEY, XATTROP_KEY};

/// Setxattr key on the root: heal what the indices list (`index`) or the whole tree (`full`).
pub const RUN_KEY: &str = "xlfs.heal.run";
/// Setxattr key on the root: heal the inode with this gfid.
pub const GFID_KEY: &str = "xlfs.heal.gfid";
/// Getxattr key on the root: what needs heal, per child.
pub const INFO_KEY: &str = "xlfs.heal.info";
/// Setxattr key on an inode: resolve its split-brain with a policy.
pub const RESOLVE_KEY: &str = "xlfs.split-brain.resolve";
/// Reply xdata: inodes healed.
pub const HEALED_KEY: &str = "xlfs.heal.healed";
/// Reply xdata: inodes that could not be healed.
pub const FAILED_KEY: &str = "xlfs.heal.failed";
/// Reply xdata: inodes left in split-brain.
pub const SPLIT_KEY: &str = "xlfs.heal.split-brain";
/// Reply xdata: gfids still needing heal afterwards.
pub const REMAINING_KEY: &str = "xlfs.heal.remaining";
/// Reply xdata: one line per inode not healed.
pub const REPORT_KEY: &str = "xlfs.heal.report";
/// Reply xdata of a resolve: what became of the split-brain.
pub const RESULT_KEY: &str = "xlfs.heal.result";

/// Data heal block size.
pub const BLOCK: u64 = 128 << 10;
/// Most gfids `xlfs.heal.info` shows per child.
pub const INFO_MAX: usize = 1024;
/// Most entries read from one directory.
const MAX_DIR_ENTRIES: usize = 1 << 20;
/// Most inodes queued behind one heal (new entries to heal next); more
/// stay blamed on disk and are found by the next run.
const MAX_QUEUE: usize = 1 << 16;
/// Most gfids one run remembers as done (a run over a bigger index may heal one twice).
const MAX_SEEN: usize = 1 << 20;
/// Most lines in [`REPORT_KEY`].
const MAX_REPORT: usize = 256;
/// Fd ids AFR uses for its own heal fds on the children.
const HEAL_FD_BASE: u64 = 0x6865_616c_0000_0000;

/// How a split-brain source is picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// The biggest file (not for directories).
    Size,
    /// The latest modification time.
    Mtime,
    /// The latest change time.
    Ctime,
    /// A copy whose size and mtime more than half of the children share (as GlusterFS).
    Majority,
    /// This child.
    Child(usize),
}

impl Choice {
    /// favorite-child-policy's value.
    pub fn from_favorite(s: &str) -> Option<Choice> {
        match s {
            "size" => Some(Choice::Size),
            "mtime" => Some(Choice::Mtime),
            "ctime" => Some(Choice::Ctime),
            "majority" => Some(Choice::Majority),
            _ => None,
        }
    }
}

/// The data heal algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    /// Copy every block.
    Full,
    /// Copy blocks whose checksums differ.
    Diff,
    /// Full when every sink is empty, else diff (GlusterFS's default).
    Auto,
}

/// What a heal may do.
#[derive(Clone, Copy, Debug)]
struct How {
    kinds: [bool; 3],
    choice: Option<Choice>,
    /// Compare a directory's names on every copy even when no counter says
    /// they differ, and give every copy the names any copy has (the full
    /// crawl: an entry fop that reached some children only when its client
    /// died leaves no counter when it ran under a delegation).
    merge_entries: bool,
}

impl How {
    fn all() -> How {
        How { kinds: [true; 3], choice: None, merge_entries: false }
    }
}

/// What became of an inode (or one kind of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Done {
    Clean,
    Healed,
    SplitBrain,
    Gone,
}

/// Counts of a heal run.
#[derive(Default, Debug)]
struct Report {
    healed: u64,
    failed: u64,
    split: u64,
    lines: Vec<String>,
}

impl Report {
    fn line(&mut self, l: String) {
        if self.lines.len() < MAX_REPORT {
            self.lines.push(l);
        }
    }

    fn merge(&mut self, o: Report) {
        self.healed += o.healed;
        self.failed += o.failed;
        self.split += o.split;
        for l in o.lines {
            self.line(l);
        }
    }

    fn xdata(&self, remaining: u64) -> Dict {
        let mut d = Dict::new();
        d.set_str(HEALED_KEY, self.healed.to_string());
        d.set_str(FAILED_KEY, self.failed.to_string());
        d.set_str(SPLIT_KEY, self.split.to_string());
        d.set_str(REMAINING_KEY, remaining.to_string());
        d.set_str(REPORT_KEY, self.lines.join("\n"));
        d
    }
}

/// Heal bookkeeping kept in replicate's state.
pub(crate) struct HealState {
    next_fd: AtomicU64,
    /// Inodes queued or being healed in the background.
    queued: Mutex<HashSet<Gfid>>,
    /// Background heals running at once (background-self-heal-count at build time).
    running: tokio::sync::Semaphore,
    healed: AtomicU64,
    failed: AtomicU64,
    split: AtomicU64,
}

impl HealState {
    /// Bookkeeping allowing `concurrent` background heals.
    pub fn new(concurrent: usize) -> HealState {
        HealState {
            next_fd: AtomicU64::new(1),
            queued: Mutex::new(HashSet::new()),
            running: tokio::sync::Semaphore::new(concurrent.max(1)),
            healed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            split: AtomicU64::new(0),
        }
    }

    /// Dump lines.
    pub fn dump(&self) -> Vec<(String, String)> {
        vec![
            ("heal.healed".into(), self.healed.load(Ordering::Relaxed).to_string()),
            ("heal.failed".into(), self.failed.load(Ordering::Relaxed).to_string()),
            ("heal.split-brain".into(), self.split.load(Ordering::Relaxed).to_string()),
            ("heal.background-queued".into(), self.queued.lock().len().to_string()),
        ]
    }
}

/// One child's copy of an inode.
#[derive(Clone, Debug)]
struct Copy {
    iatt: Iatt,
    row: Vec<[i32; 3]>,
}

/// True for fops of the control interface.
pub(crate) fn is_control(fop: &Fop) -> bool {
    match fop {
        Fop::Setxattr { xattrs, .. } => {
            xattrs.contains(RUN_KEY) || xattrs.contains(GFID_KEY) || xattrs.contains(RESOLVE_KEY)
        }
        Fop::Getxattr { name, .. } => name == INFO_KEY,
        _ => false,
    }
}

fn kinds_text(ks: &[Kind]) -> String {
    if ks.is_empty() {
        return "-".into();
    }
    ks.iter()
        .map(|k| match k {
            Kind::Data => "data",
            Kind::Metadata => "metadata",
            Kind::Entry => "entry",
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn healable_xattr(k: &str) -> bool {
    (k.starts_with("user.") || k.starts_with("trusted."))
        && !k.starts_with(pending::PREFIX)
        && k != GFID_XATTR
        && !k.starts_with("trusted.glusterfs.")
}

fn xattrs_of(r: FopResult) -> Result<Dict, Errno> {
    Ok(r?.reply.into_xattrs()?.into_iter().filter(|(k, _)| healable_xattr(k)).collect())
}

fn root_loc(loc: &Loc) -> bool {
    loc.gfid == Gfid::ROOT && !loc.is_entry()
}

impl Inner {
    fn heal_fd(&self) -> FdId {
        FdId(HEAL_FD_BASE | self.heal.next_fd.fetch_add(1, Ordering::Relaxed))
    }

    pub(super) async fn on(&self, i: usize, ctx: &CallCtx, fop: Fop) -> FopResult {
        self.wind(i, ctx.clone(), Request::new(fop)).await
    }

    async fn on_x(&self, i: usize, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        self.wind(i, ctx.clone(), Request::with_xdata(fop, xdata)).await
    }

    /// Every copy of `gfid` on `on` with its counters; also the children
    /// that said it does not exist.
    async fn inspect(&self, ctx: &CallCtx, gfid: Gfid, on: Mask) -> (Vec<Option<Copy>>, Mask) {
        let mut x = Dict::new();
        pending::request_keys(&self.keys, &mut x);
        let req = Request::with_xdata(Fop::Lookup { loc: Loc::gfid(gfid) }, x);
        let mut out = vec![None; self.children.len()];
        let mut gone = 0;
        for (i, r) in self.fan(ctx, on, &req).await {
            match r {
                Ok(Response { reply: Reply::Entry { iatt, .. }, xdata }) if iatt.gfid == gfid => {
                    out[i] = Some(Copy { iatt, row: pending::row(&self.keys, &xdata) })
                }
                Ok(_) => {}
                Err(Errno::ENOENT | Errno::ESTALE) => gone |= bit(i),
                Err(_) => {}
            }
        }
        (out, gone)
    }

    /// Records the outcome of a heal of `kind` in the inode's state.
    fn note_heal(&self, gfid: Gfid, kind: Kind, good: Mask, split: bool) {
        if let Some(st) = self.inodes.get(&gfid) {
            let mut s = st.s.lock();
            s.stale[kind as usize] &= !good;
            if split {
                s.split |= 1 << (kind as u8);
            } else {
                s.split &= !(1 << (kind as u8));
            }
        }
    }

    /// True when `gfid` is known to be in split-brain for `kind`.
    pub fn in_split_brain(&self, gfid: Gfid, kind: Kind) -> bool {
        self.inodes.get(&gfid).is_some_and(|st| st.s.lock().split & (1 << (kind as u8)) != 0)
    }

    /// Heals `gfid` and the inodes its entry heal makes, one after the other.
    async fn heal_tree(self: &Arc<Self>, ctx: &CallCtx, gfid: Gfid, how: How) -> (Report, Done) {
        let mut rep = Report::default();
        let mut first = Done::Clean;
        let mut queue = VecDeque::from([gfid]);
        let mut top = true;
        while let Some(g) = queue.pop_front() {
            match self.heal_one(ctx, g, how).await {
                Ok((done, new, split)) => {
                    if top {
                        first = done;
                    }
                    match done {
                        Done::Healed => rep.healed += 1,
                        Done::SplitBrain => {
                            rep.split += 1;
                            rep.line(format!("{g} split-brain {}", kinds_text(&split)));
                        }
                        Done::Clean | Done::Gone => {}
                    }
                    for n in new {
                        if queue.len() < MAX_QUEUE {
                            queue.push_back(n);
                        }
                    }
                }
                Err(e) => {
                    if top {
                        first = Done::Clean;
                    }
                    rep.failed += 1;
                    rep.line(format!("{g} failed {}", e.name().unwrap_or("EIO")));
                }
            }
            top = false;
        }
        self.heal.healed.fetch_add(rep.healed, Ordering::Relaxed);
        self.heal.failed.fetch_add(rep.failed, Ordering::Relaxed);
        self.heal.split.fetch_add(rep.split, Ordering::Relaxed);
        (rep, first)
    }

    /// Heals every kind of one inode; returns what became of it, the
    /// inodes its entry heal made (to heal next) and the kinds left in
    /// split-brain.
    async fn heal_one(
        self: &Arc<Self>,
        ctx: &CallCtx,
        gfid: Gfid,
        how: How,
    ) -> Result<(Done, Vec<Gfid>, Vec<Kind>), Errno> {
        let up = self.up_mask();
        let (copies, gone) = self.inspect(ctx, gfid, up).await;
        let have = copies.iter().enumerate().filter(|(_, c)| c.is_some()).fold(0, |m, (i, _)| m | bit(i));
        let Some(first) = copies.iter().flatten().next() else {
            return if up != 0 && gone == up { Ok((Done::Gone, vec![], vec![])) } else { Err(Errno::ENOTCONN) };
        };
        let kinds: &[Kind] = match first.iatt.file_type() {
            FileType::Directory => &[Kind::Entry, Kind::Metadata],
            FileType::Regular => &[Kind::Data, Kind::Metadata],
            _ => &[Kind::Metadata],
        };
        let mut done = Done::Clean;
        let mut new = Vec::new();
        let mut split = Vec::new();
        let mut err = None;
        for &k in kinds {
            if !how.kinds[k as usize] {
                continue;
            }
            match self.heal_kind(ctx, gfid, k, have, how).await {
                Ok((d, n)) => {
                    if d == Done::SplitBrain {
                        split.push(k);
                    }
                    done = done.max(d);
                    new.extend(n);
                }
                Err(e) => {
                    tracing::warn!(volume = %self.name, %gfid, kind = ?k, %e, "self-heal failed");
                    err.get_or_insert(e);
                }
            }
        }
        match err {
            Some(e) if done != Done::SplitBrain => Err(e),
            _ => Ok((done, new, split)),
        }
    }

    /// Heals one kind of an inode under AFR's lock for that kind.
    async fn heal_kind(
        self: &Arc<Self>,
        ctx: &CallCtx,
        gfid: Gfid,
        kind: Kind,
        have: Mask,
        how: How,
    ) -> Result<(Done, Vec<Gfid>), Errno> {
        let target = match kind {
            Kind::Data => Target::Inode { gfid, fd: None, metadata: false },
            Kind::Metadata => Target::Inode { gfid, fd: None, metadata: true },
            Kind::Entry => Target::Entry { dir: gfid, name: String::new() },
        };
        let lctx = CallCtx::root(ctx.client_id.clone()).with_lk_owner(self.new_owner());
        let held = self.lock(lctx, vec![target], have, false).await?;
        let r = self.heal_locked(&held.ctx, gfid, kind, held.locked, how).await;
        self.unlock(&held).await;
        r
    }

    async fn heal_locked(
        self: &Arc<Self>,
        ctx: &CallCtx,
        gfid: Gfid,
        kind: Kind,
        locked: Mask,
        how: How,
    ) -> Result<(Done, Vec<Gfid>), Errno> {
        let (copies, _) = self.inspect(ctx, gfid, locked).await;
        let part = copies.iter().enumerate().filter(|(_, c)| c.is_some()).fold(0, |m, (i, _)| m | bit(i));
        if part == 0 {
            return Ok((Done::Gone, vec![]));
        }
        let rows: Vec<Option<Vec<[i32; 3]>>> = copies.iter().map(|c| c.as_ref().map(|c| c.row.clone())).collect();
        let (sources, sinks) = match pending::verdict(&rows, kind) {
            Verdict::Clean if kind == Kind::Entry && how.merge_entries && part.count_ones() > 1 => (part, 0),
            Verdict::Clean => {
                self.note_heal(gfid, kind, part, false);
                return Ok((Done::Clean, vec![]));
            }
            Verdict::Heal { sources, sinks, uncertain: false } => (sources, sinks),
            Verdict::Heal { sources, uncertain: true, .. } => match kind {
                Kind::Entry => (sources, 0),
                _ => {
                    let src = pick_uncertain(kind, &copies, sources);
                    (bit(src), sources & !bit(src))
                }
            },
            Verdict::SplitBrain { copies: sb } => {
                if kind == Kind::Entry {
                    tracing::info!(volume = %self.name, %gfid, "entry split-brain: merging the names of every copy");
                    (part, 0)
                } else {
                    // A resolve request's bigger-file and latest-mtime judge data
                    // only (GlusterFS asks for source-brick for metadata);
                    // favorite-child-policy judges both.
                    let choice = match how.choice {
                        Some(Choice::Child(i)) => Some(Choice::Child(i)),
                        Some(c) if kind == Kind::Data => Some(c),
                        Some(_) => None,
                        None => self.cfg().favorite,
                    };
                    match choice.and_then(|c| choose(c, &copies, sb, self.children.len())) {
                        Some(src) => {
                            tracing::info!(volume = %self.name, %gfid, kind = ?kind, source = %self.children[src].name, "resolving split-brain");
                            (bit(src), part & !bit(src))
                        }
                        None => {
                            tracing::warn!(volume = %self.name, %gfid, kind = ?kind, "split-brain: no copy can be chosen as source");
                            self.note_heal(gfid, kind, 0, true);
                            return Ok((Done::SplitBrain, vec![]));
                        }
                    }
                }
            }
        };
        let Some(src) = members(sources).next() else { return Err(Errno::EIO) };
        let Some(src_iatt) = copies[src].as_ref().map(|c| c.iatt) else { return Err(Errno::EIO) };
        let (healed, new) = if sinks == 0 && kind != Kind::Entry {
            (0, vec![])
        } else {
            match kind {
                Kind::Data => (self.heal_data(ctx, gfid, src, sinks, &copies).await, vec![]),
                Kind::Metadata => (self.heal_metadata(ctx, gfid, src, sinks, &src_iatt).await, vec![]),
                Kind::Entry => self.heal_entry(ctx, gfid, sources, sinks).await?,
            }
        };
        let good = sources | healed;
        let mut reset = false;
        for i in members(part) {
            let Some(row) = rows[i].as_ref() else { continue };
            let delta = |j: usize| if good & bit(j) != 0 { row.get(j).map_or(0, |c| -c[kind as usize]) } else { 0 };
            if let Some(d) = pending::changelog(&self.keys, kind, delta) {
                reset = true;
                let fop = Fop::Xattrop { loc: Loc::gfid(gfid), op: XattropOp::AddArray, xattrs: d };
                if let Err(e) = self.on(i, ctx, fop).await {
                    tracing::warn!(volume = %self.name, %gfid, child = %self.children[i].name, %e, "could not reset pending counters");
                }
            }
        }
        self.note_heal(gfid, kind, good, false);
        if sinks & !healed != 0 {
            return Err(Errno::EIO);
        }
        let done = if sinks != 0 || reset || !new.is_empty() { Done::Healed } else { Done::Clean };
        Ok((done, new))
    }

    /// Copies the data of `src` to `sinks`; returns the sinks healed.
    async fn heal_data(&self, ctx: &CallCtx, gfid: Gfid, src: usize, sinks: Mask, copies: &[Option<Copy>]) -> Mask {
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
            let end = (b + window).min(blocks);
            let futs =
                (b..end).map(|k| self.copy_block(ctx, fd, src, live, k * BLOCK, BLOCK.min(size - k * BLOCK), diff));
            for failed in super::join_all(futs.collect()).await {
                live &= !failed;
            }
            b = end;
        }
        let times = SetAttr {
            atime: Some(TimeSet::At(src_iatt.atime)),
            mtime: Some(TimeSet::At(src_iatt.mtime)),
            ..Default::default()
        };
        for fop in
            [Fop::Ftruncate { fd, offset: size }, Fop::Fsync { fd, datasync: true }, Fop::Fsetattr { fd, attr: times }]
        {
            for (i, r) in self.fan(ctx, live, &Request::new(fop)).await {
                if let Err(e) = r {
                    tracing::warn!(volume = %self.name, %gfid, child = %self.children[i].name, %e, "data heal failed on a sink");
                    live &= !bit(i);
                }
            }
        }
        self.fan(ctx, opened | bit(src), &Request::new(Fop::Release { fd })).await;
        live
    }

    /// One block from `src` to those of `sinks` that need it; returns the
    /// sinks that failed.
    #[allow(clippy::too_many_arguments)]
    async fn copy_block(
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
        let w = Request::new(Fop::Writev { fd, data, offset, flags: 0 });
        self.fan(ctx, need, &w).await.into_iter().filter(|(_, r)| r.is_err()).fold(0, |m, (i, _)| m | bit(i))
    }

    /// Gives `sinks` the attributes and xattrs of `src`; returns the sinks healed.
    async fn heal_metadata(&self, ctx: &CallCtx, gfid: Gfid, src: usize, sinks: Mask, ia: &Iatt) -> Mask {
        let symlink = ia.file_type() == FileType::Symlink;
        let attr = SetAttr {
            mode: (!symlink).then_some(ia.mode & 0o7777),
            uid: Some(ia.uid),
            gid: Some(ia.gid),
            atime: Some(TimeSet::At(ia.atime)),
            mtime: Some(TimeSet::At(ia.mtime)),
        };
        let all_x = || Fop::Getxattr { loc: Loc::gfid(gfid), name: String::new() };
        let Ok(want) = xattrs_of(self.on(src, ctx, all_x()).await) else {
            tracing::warn!(volume = %self.name, %gfid, "metadata heal: cannot read the source's xattrs");
            return 0;
        };
        let futs = members(sinks).map(|i| {
            let want = &want;
            async move {
                self.on(i, ctx, Fop::Setattr { loc: Loc::gfid(gfid), attr }).await?;
                let have = xattrs_of(self.on(i, ctx, all_x()).await)?;
                for k in have.keys().filter(|k| !want.contains(k)) {
                    match self.on(i, ctx, Fop::Removexattr { loc: Loc::gfid(gfid), name: k.clone() }).await {
                        Ok(_) | Err(Errno::ENODATA) => {}
                        Err(e) => return Err(e),
                    }
                }
                let set: Dict =
                    want.iter().filter(|(k, v)| have.get(k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
                if !set.is_empty() {
                    self.on(i, ctx, Fop::Setxattr { loc: Loc::gfid(gfid), xattrs: set, flags: 0 }).await?;
                }
                Ok::<(), Errno>(())
            }
        });
        let mut healed = 0;
        for (i, r) in members(sinks).zip(super::join_all(futs.collect()).await) {
            match r {
                Ok(()) => healed |= bit(i),
                Err(e) => {
                    tracing::warn!(volume = %self.name, %gfid, child = %self.children[i].name, %e, "metadata heal failed on a sink")
                }
            }
        }
        healed
    }

    /// The entries of directory `dir` on child `i` (without `.` and `..`);
    /// E2BIG beyond `max` of them.
    pub(super) async fn list_dir(
        &self,
        ctx: &CallCtx,
        i: usize,
        dir: Gfid,
        max: usize,
    ) -> Result<Vec<DirEntry>, Errno> {
        let fd = Fd { id: self.heal_fd(), gfid: dir };
        self.on(i, ctx, Fop::Opendir { loc: Loc::gfid(dir), fd: fd.id }).await?;
        let mut out = Vec::new();
        let mut offset = 0;
        let r = loop {
            match self.on(i, ctx, Fop::Readdirp { fd, size: 64 << 10, offset }).await {
                Ok(Response { reply: Reply::Dirents(v), .. }) => {
                    let Some(last) = v.last() else { break Ok(()) };
                    offset = last.d_off;
                    out.extend(v.into_iter().filter(|e| e.name != "." && e.name != ".."));
                    if out.len() > max {
                        break Err(Errno::E2BIG);
                    }
                }
                Ok(_) => break Err(Errno::EIO),
                Err(e) => break Err(e),
            }
        };
        let _ = self.on(i, ctx, Fop::Releasedir { fd }).await;
        r.map(|()| out)
    }

    /// Entry heal of directory `dir`; returns the sinks healed and the
    /// inodes made on some copy (to heal next).
    async fn heal_entry(
        &self,
        ctx: &CallCtx,
        dir: Gfid,
        sources: Mask,
        sinks: Mask,
    ) -> Result<(Mask, Vec<Gfid>), Errno> {
        let part = sources | sinks;
        let futs = members(part).map(|i| async move { (i, self.list_dir(ctx, i, dir, MAX_DIR_ENTRIES).await) });
        let mut lists: Vec<Option<BTreeMap<String, DirEntry>>> = vec![None; self.children.len()];
        let mut failed: Mask = 0;
        for (i, r) in super::join_all(futs.collect()).await {
            match r {
                Ok(v) => lists[i] = Some(v.into_iter().map(|e| (e.name.clone(), e)).collect()),
                Err(e) => {
                    tracing::warn!(volume = %self.name, %dir, child = %self.children[i].name, %e, "entry heal: cannot list the directory");
                    failed |= bit(i);
                }
            }
        }
        let sources = sources & !failed;
        if sources == 0 {
            return Err(Errno::EIO);
        }
        // Every name the sources have, with the first source holding it.
        let mut union: BTreeMap<String, (usize, DirEntry)> = BTreeMap::new();
        for i in members(sources) {
            for (name, e) in lists[i].iter().flatten() {
                union.entry(name.clone()).or_insert((i, e.clone()));
            }
        }
        let mut new = Vec::new();
        for (name, (si, e)) in &union {
            for t in members(part & !failed) {
                let Some(list) = lists[t].as_ref() else { continue };
                match list.get(name) {
                    Some(have) if have.iatt.gfid == e.iatt.gfid || have.iatt.gfid.is_null() => {}
                    Some(have) => {
                        tracing::warn!(volume = %self.name, %dir, name = %name, child = %self.children[t].name,
                            theirs = %have.iatt.gfid, source = %e.iatt.gfid, "entry heal: gfid mismatch (gfid split-brain); left alone");
                        failed |= bit(t);
                    }
                    None => match self.make_entry(ctx, t, dir, name, *si, e).await {
                        Ok(true) => new.push(e.iatt.gfid),
                        Ok(false) => {}
                        Err(err) => {
                            tracing::warn!(volume = %self.name, %dir, name = %name, child = %self.children[t].name, %err, "entry heal: cannot create");
                            failed |= bit(t);
                        }
                    },
                }
            }
        }
        for t in members(sinks & !failed) {
            let Some(list) = lists[t].as_ref() else { continue };
            for (name, e) in list.iter().filter(|(n, _)| !union.contains_key(*n)) {
                if let Err(err) = self.remove_entry(ctx, t, dir, name, e).await {
                    tracing::warn!(volume = %self.name, %dir, name = %name, child = %self.children[t].name, %err, "entry heal: cannot remove");
                    failed |= bit(t);
                }
            }
        }
        new.sort();
        new.dedup();
        Ok((sinks & !failed, new))
    }

    /// Makes entry `name` of `dir` on child `t` like `e` on source `si`:
    /// a hard link if `t` has the inode already (false), else a new inode
    /// with the same gfid, blamed on the source so it is healed (true).
    async fn make_entry(
        &self,
        ctx: &CallCtx,
        t: usize,
        dir: Gfid,
        name: &str,
        si: usize,
        e: &DirEntry,
    ) -> Result<bool, Errno> {
        let g = e.iatt.gfid;
        let loc = Loc::entry(dir, name);
        let ty = e.iatt.file_type();
        if ty != FileType::Directory && self.on(t, ctx, Fop::Lookup { loc: Loc::gfid(g) }).await.is_ok() {
            self.on(t, ctx, Fop::Link { old: Loc::gfid(g), new: loc }).await?;
            return Ok(false);
        }
        let fop = match ty {
            FileType::Directory => Fop::Mkdir { loc, mode: e.iatt.mode & 0o7777, umask: 0 },
            FileType::Symlink => {
                let target =
                    self.on(si, ctx, Fop::Readlink { loc: Loc::gfid(g), size: 4096 }).await?.reply.into_readlink()?;
                Fop::Symlink { target, loc, umask: 0 }
            }
            _ => Fop::Mknod { loc, mode: e.iatt.mode, rdev: e.iatt.rdev, umask: 0 },
        };
        self.on_x(t, ctx, fop, Dict::new().with(GFID_REQ, Value::Gfid(g))).await?;
        let blame = match ty {
            FileType::Directory => [0, 1, 1],
            FileType::Regular => [1, 1, 0],
            _ => [0, 1, 0],
        };
        let mut d = Dict::new();
        d.set_bytes(self.keys[t].clone(), pending::encode(blame));
        self.on(si, ctx, Fop::Xattrop { loc: Loc::gfid(g), op: XattropOp::AddArray, xattrs: d }).await?;
        Ok(true)
    }

    /// Removes entry `name` of `dir` on child `t` (a directory with everything under it).
    async fn remove_entry(&self, ctx: &CallCtx, t: usize, dir: Gfid, name: &str, e: &DirEntry) -> Result<(), Errno> {
        if e.d_type != FileType::Directory && !e.iatt.is_dir() {
            return self.on(t, ctx, Fop::Unlink { loc: Loc::entry(dir, name), flags: 0 }).await.map(drop);
        }
        // Deepest directories last in `dirs`; their files go on the way down.
        let mut dirs = vec![(dir, name.to_string(), e.iatt.gfid)];
        let mut next = 0;
        while next < dirs.len() {
            let d = dirs[next].2;
            next += 1;
            for c in self.list_dir(ctx, t, d, MAX_DIR_ENTRIES).await? {
                if c.d_type == FileType::Directory || c.iatt.is_dir() {
                    if dirs.len() >= MAX_DIR_ENTRIES {
                        return Err(Errno::E2BIG);
                    }
                    dirs.push((d, c.name, c.iatt.gfid));
                } else {
                    self.on(t, ctx, Fop::Unlink { loc: Loc::entry(d, c.name), flags: 0 }).await?;
                }
            }
        }
        for (p, n, g) in dirs.into_iter().rev() {
            self.on(t, ctx, Fop::Rmdir { loc: Loc::entry(p, n).with_gfid(g), flags: 0 }).await?;
        }
        Ok(())
    }

    /// One page of child `i`'s index after `after`; None when the child has no index.
    pub(super) async fn index_page(&self, ctx: &CallCtx, i: usize, after: Option<Gfid>) -> Option<(Vec<Gfid>, u64)> {
        let key = after.map_or(XATTROP_KEY.to_string(), |g| format!("{XATTROP_KEY}:{g}"));
        match self.on(i, ctx, Fop::Getxattr { loc: Loc::root(), name: key.clone() }).await {
            Ok(Response { reply: Reply::Xattrs(d), .. }) => {
                let list = d.get_str(&key).unwrap_or("").lines().filter_map(Gfid::parse).collect();
                Some((list, d.get_u64(COUNT_KEY).unwrap_or(0)))
            }
            _ => None,
        }
    }

    /// Gfids listed in the indices of the children up (distinct, at most `max`).
    async fn indexed(&self, ctx: &CallCtx, max: usize) -> (Vec<Vec<Gfid>>, usize) {
        let mut per = vec![Vec::new(); self.children.len()];
        let mut all: HashSet<Gfid> = HashSet::new();
        for i in members(self.up_mask()) {
            let mut after = None;
            while let Some((page, _)) = self.index_page(ctx, i, after).await {
                let Some(last) = page.last().copied() else { break };
                after = Some(last);
                for g in page {
                    if all.len() < max || all.contains(&g) {
                        all.insert(g);
                        if per[i].len() < max {
                            per[i].push(g);
                        }
                    }
                }
                if all.len() >= max {
                    break;
                }
            }
        }
        (per, all.len())
    }

    /// Asks every child up to drop `gfids` from its index if they are clean.
    async fn purge(&self, ctx: &CallCtx, gfids: &[Gfid]) {
        if gfids.is_empty() {
            return;
        }
        let text: String = gfids.iter().map(|g| format!("{g}\n")).collect();
        let mut x = Dict::new();
        x.set_bytes(PURGE_KEY, text.into_bytes());
        self.fan(ctx, self.up_mask(), &Request::new(Fop::Setxattr { loc: Loc::root(), xattrs: x, flags: 0 })).await;
    }

    /// Heals what the indices list.
    async fn heal_index(self: &Arc<Self>, ctx: &CallCtx) -> Report {
        let mut rep = Report::default();
        let mut seen: HashSet<Gfid> = HashSet::new();
        let threads = self.cfg().shd_threads.max(1);
        for i in members(self.up_mask()) {
            let mut after = None;
            while let Some((page, _)) = self.index_page(ctx, i, after).await {
                let Some(last) = page.last().copied() else { break };
                after = Some(last);
                let todo: Vec<Gfid> = page.into_iter().filter(|g| seen.len() >= MAX_SEEN || seen.insert(*g)).collect();
                for chunk in todo.chunks(threads) {
                    let futs = chunk.iter().map(|g| self.heal_tree(ctx, *g, How::all()));
                    for (r, _) in super::join_all(futs.collect()).await {
                        rep.merge(r);
                    }
                }
                self.purge(ctx, &todo).await;
            }
        }
        rep
    }

    /// Heals the whole tree, directories before what they hold.
    async fn heal_full(self: &Arc<Self>, ctx: &CallCtx) -> Report {
        let mut rep = Report::default();
        let mut dirs = VecDeque::from([Gfid::ROOT]);
        while let Some(d) = dirs.pop_front() {
            let (r, _) = self.heal_tree(ctx, d, How { merge_entries: true, ..How::all() }).await;
            rep.merge(r);
            let mut listed = None;
            for i in members(self.up_mask()) {
                if let Ok(v) = self.list_dir(ctx, i, d, MAX_DIR_ENTRIES).await {
                    listed = Some(v);
                    break;
                }
            }
            for e in listed.unwrap_or_default() {
                if e.d_type == FileType::Directory || e.iatt.is_dir() {
                    if dirs.len() < MAX_QUEUE {
                        dirs.push_back(e.iatt.gfid);
                    }
                } else {
                    let (r, _) = self.heal_tree(ctx, e.iatt.gfid, How::all()).await;
                    rep.merge(r);
                }
            }
        }
        rep
    }

    /// The kinds `gfid` needs healed and the kinds in split-brain, from
    /// the copies up (None when no copy exists).
    async fn status(&self, ctx: &CallCtx, gfid: Gfid) -> Option<(Vec<Kind>, Vec<Kind>)> {
        let (copies, _) = self.inspect(ctx, gfid, self.up_mask()).await;
        if copies.iter().all(Option::is_none) {
            return None;
        }
        let rows: Vec<Option<Vec<[i32; 3]>>> = copies.iter().map(|c| c.as_ref().map(|c| c.row.clone())).collect();
        let (mut need, mut split) = (Vec::new(), Vec::new());
        for k in Kind::ALL {
            match pending::verdict(&rows, k) {
                Verdict::Clean => {}
                Verdict::SplitBrain { .. } if k != Kind::Entry => {
                    need.push(k);
                    split.push(k);
                }
                _ => {
                    // Blame of a child that is down or lacks the inode still needs heal.
                    need.push(k);
                }
            }
        }
        Some((need, split))
    }

    async fn info(&self, ctx: &CallCtx) -> String {
        let (per, _) = self.indexed(ctx, INFO_MAX).await;
        let up = self.up_mask();
        let mut out = String::new();
        for (i, c) in self.children.iter().enumerate() {
            if up & bit(i) == 0 {
                out += &format!("{}: down\n", c.name);
                continue;
            }
            let total = self.index_page(ctx, i, None).await.map_or(0, |(_, n)| n);
            let entries = if total == 1 { "entry" } else { "entries" };
            out += &format!("{}: up, {total} {entries} to heal\n", c.name);
            for g in &per[i] {
                match self.status(ctx, *g).await {
                    None => out += &format!("  {g} gone\n"),
                    Some((need, split)) => {
                        out += &format!("  {g} {}", kinds_text(&need));
                        if !split.is_empty() {
                            out += &format!(" split-brain {}", kinds_text(&split));
                        }
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    /// The control interface (see the module docs).
    pub async fn control(self: &Arc<Self>, ctx: &CallCtx, req: &Request) -> FopResult {
        let hctx = CallCtx::root(ctx.client_id.clone());
        match &req.fop {
            Fop::Getxattr { loc, .. } => {
                if !root_loc(loc) {
                    return Err(Errno::EINVAL);
                }
                let mut d = Dict::new();
                d.set_bytes(INFO_KEY, self.info(&hctx).await.into_bytes());
                Ok(Reply::Xattrs(d).into())
            }
            Fop::Setxattr { loc, xattrs, .. } => {
                if let Some(v) = xattrs.get_bytes(RESOLVE_KEY) {
                    return self.resolve_split(ctx, &hctx, loc, &v).await;
                }
                if !root_loc(loc) {
                    return Err(Errno::EINVAL);
                }
                if let Some(v) = xattrs.get_bytes(GFID_KEY) {
                    let g = std::str::from_utf8(&v).ok().and_then(|s| Gfid::parse(s.trim())).ok_or(Errno::EINVAL)?;
                    let (rep, _) = self.heal_tree(&hctx, g, How::all()).await;
                    self.purge(&hctx, &[g]).await;
                    let remaining = self.status(&hctx, g).await.map_or(0, |(need, _)| u64::from(!need.is_empty()));
                    return Ok(Response { reply: Reply::Empty, xdata: rep.xdata(remaining) });
                }
                let mode = xattrs.get_str(RUN_KEY).unwrap_or("").trim().to_string();
                let rep = match mode.as_str() {
                    "" | "index" => self.heal_index(&hctx).await,
                    "full" => self.heal_full(&hctx).await,
                    _ => return Err(Errno::EINVAL),
                };
                let (_, remaining) = self.indexed(&hctx, MAX_SEEN).await;
                Ok(Response { reply: Reply::Empty, xdata: rep.xdata(remaining as u64) })
            }
            _ => Err(Errno::EINVAL),
        }
    }

    async fn resolve_split(self: &Arc<Self>, ctx: &CallCtx, hctx: &CallCtx, loc: &Loc, v: &[u8]) -> FopResult {
        let policy = std::str::from_utf8(v).map_err(|_| Errno::EINVAL)?.trim();
        let choice = match policy {
            "bigger-file" => Choice::Size,
            "latest-mtime" => Choice::Mtime,
            p => {
                let name = p.strip_prefix("source-brick:").ok_or(Errno::EINVAL)?;
                let i = (0..self.children.len())
                    .find(|&i| &*self.children[i].name == name || self.pending_names[i] == name)
                    .ok_or(Errno::EINVAL)?;
                Choice::Child(i)
            }
        };
        let gfid = if loc.gfid.is_null() {
            match self.lookup(ctx, loc.clone(), Dict::new()).await?.reply {
                Reply::Entry { iatt, .. } => iatt.gfid,
                _ => return Err(Errno::EINVAL),
            }
        } else {
            loc.gfid
        };
        let before = self.status(hctx, gfid).await.ok_or(Errno::ENOENT)?;
        let (rep, _) = if before.1.is_empty() {
            (Report::default(), Done::Clean)
        } else {
            self.heal_tree(hctx, gfid, How { choice: Some(choice), ..How::all() }).await
        };
        let after = self.status(hctx, gfid).await;
        let result = match (&before.1.is_empty(), &after) {
            (true, _) => "not in split-brain".to_string(),
            (false, Some((_, split))) if !split.is_empty() => {
                let hint = if split.contains(&Kind::Metadata) && !matches!(choice, Choice::Child(_)) {
                    " (a metadata split-brain needs source-brick)"
                } else {
                    ""
                };
                format!("unresolved: the policy chose no source for {}{hint}", kinds_text(split))
            }
            (false, _) => "resolved".to_string(),
        };
        let mut xdata = rep.xdata(after.map_or(0, |(need, _)| u64::from(!need.is_empty())));
        xdata.set_str(RESULT_KEY, result);
        Ok(Response { reply: Reply::Empty, xdata })
    }

    /// Starts a background heal of `gfid` after a lookup found it stale,
    /// within background-self-heal-count and heal-wait-queue-length.
    pub fn background_heal(self: &Arc<Self>, client: Arc<str>, gfid: Gfid) {
        let cfg = self.cfg();
        let kinds = [cfg.data_heal, cfg.metadata_heal, cfg.entry_heal];
        if gfid.is_null() || !kinds.iter().any(|&k| k) || cfg.bg_count == 0 {
            return;
        }
        {
            let mut q = self.heal.queued.lock();
            if q.contains(&gfid) || q.len() >= cfg.bg_count + cfg.wait_qlen {
                return;
            }
            q.insert(gfid);
        }
        let Some(h) = self.handle() else {
            self.heal.queued.lock().remove(&gfid);
            return;
        };
        let me = self.clone();
        h.spawn(async move {
            if let Ok(_permit) = me.heal.running.acquire().await {
                let ctx = CallCtx::root(client);
                let (rep, _) = me.heal_tree(&ctx, gfid, How { kinds, ..How::all() }).await;
                tracing::debug!(volume = %me.name, %gfid, ?rep, "background self-heal done");
            }
            me.heal.queued.lock().remove(&gfid);
        });
    }
}

/// The source when no copy is known good: for data the biggest file
/// (then the latest mtime, then the lowest child); else the lowest child.
fn pick_uncertain(kind: Kind, copies: &[Option<Copy>], sources: Mask) -> usize {
    let first = members(sources).next().unwrap_or(0);
    if kind != Kind::Data {
        return first;
    }
    members(sources)
        .filter_map(|i| copies[i].as_ref().map(|c| (i, c.iatt)))
        .max_by(|(i, a), (j, b)| (a.size, a.mtime).cmp(&(b.size, b.mtime)).then(j.cmp(i)))
        .map_or(first, |(i, _)| i)
}

/// The source a split-brain policy picks among `cands` (None: it cannot
/// decide, e.g. two copies tie).
fn choose(c: Choice, copies: &[Option<Copy>], cands: Mask, n: usize) -> Option<usize> {
    let list: Vec<(usize, Iatt)> =
        members(cands).filter_map(|i| copies.get(i)?.as_ref().map(|c| (i, c.iatt))).collect();
    let unique_max = |key: &dyn Fn(&Iatt) -> (i64, u32)| {
        let best = list.iter().map(|(_, a)| key(a)).max()?;
        let mut it = list.iter().filter(|(_, a)| key(a) == best);
        let first = it.next()?.0;
        it.next().is_none().then_some(first)
    };
    match c {
        Choice::Child(i) => (cands & bit(i) != 0).then_some(i),
        Choice::Size => {
            if list.iter().any(|(_, a)| a.is_dir()) {
                return None;
            }
            unique_max(&|a| (i64::try_from(a.size).unwrap_or(i64::MAX), 0))
        }
        Choice::Mtime => unique_max(&|a| (a.mtime.sec, a.mtime.nsec)),
        Choice::Ctime => unique_max(&|a| (a.ctime.sec, a.ctime.nsec)),
        Choice::Majority => {
            let same = |a: &Iatt, b: &Iatt| a.size == b.size && a.mtime == b.mtime;
            let all: Vec<(usize, Iatt)> =
                copies.iter().enumerate().filter_map(|(i, c)| c.as_ref().map(|c| (i, c.iatt))).collect();
            list.iter().find(|(_, a)| all.iter().filter(|(_, b)| same(a, b)).count() * 2 > n).map(|(i, _)| *i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlfs_sdk::Timespec;

    fn copy(size: u64, mtime: i64) -> Option<Copy> {
        let iatt = Iatt { mode: 0o100644, size, mtime: Timespec { sec: mtime, nsec: 0 }, ..Default::default() };
        Some(Copy { iatt, row: vec![] })
    }

    #[test]
    fn policies_pick_a_unique_source_or_none() {
        let c = vec![copy(10, 5), copy(20, 3), copy(20, 4)];
        assert_eq!(choose(Choice::Size, &c, 0b011, 3), Some(1));
        assert_eq!(choose(Choice::Size, &c, 0b110, 3), None, "tie");
        assert_eq!(choose(Choice::Mtime, &c, 0b111, 3), Some(0));
        assert_eq!(choose(Choice::Child(2), &c, 0b111, 3), Some(2));
        assert_eq!(choose(Choice::Child(2), &c, 0b011, 3), None);
        let m = vec![copy(20, 4), copy(10, 5), copy(20, 4)];
        assert_eq!(choose(Choice::Majority, &m, 0b011, 3), Some(0));
        assert_eq!(choose(Choice::Majority, &c, 0b111, 3), None);
        assert_eq!(pick_uncertain(Kind::Data, &c, 0b111), 2);
        assert_eq!(pick_uncertain(Kind::Metadata, &c, 0b110), 1);
    }

    #[test]
    fn control_keys_are_recognized() {
        let mut x = Dict::new();
        x.set_str(RUN_KEY, "index");
        assert!(is_control(&Fop::Setxattr { loc: Loc::root(), xattrs: x, flags: 0 }));
        assert!(is_control(&Fop::Getxattr { loc: Loc::root(), name: INFO_KEY.into() }));
        assert!(!is_control(&Fop::Getxattr { loc: Loc::root(), name: "user.x".into() }));
        assert!(healable_xattr("user.a") && healable_xattr("trusted.x"));
        assert!(
            !healable_xattr("trusted.afr.c-0") && !healable_xattr(GFID_XATTR) && !healable_xattr("security.selinux")
        );
    }
}
