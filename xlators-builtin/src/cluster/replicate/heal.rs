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
//! - setxattr on the root, [`HEAL_RUN`] = `index` (or empty) heals every
//!   gfid listed in the children's indices (features/index); `full` crawls
//!   the whole tree instead. [`HEAL_GFID`] = `<gfid>` heals one inode (and
//!   what its entry heal creates). The reply xdata carries
//!   [`HEAL_HEALED`], [`HEAL_FAILED`], [`HEAL_SPLIT_BRAIN`] and [`HEAL_REMAINING`]
//!   (decimal strings; remaining = gfids still listed in some index after
//!   the run, or in the one inode's case, whether it still needs heal) and
//!   [`HEAL_REPORT`]: one line per inode not healed, `<gfid> failed <errno>`
//!   or `<gfid> split-brain <kinds>`.
//! - getxattr on the root, [`HEAL_INFO`]: per child a line
//!   `<name>: up, <n> entries to heal` (n: gfids its index lists; `1
//!   entry`) or `<name>: down`, then one line per listed gfid (at most
//!   [`INFO_MAX`] per child): `  <gfid> <kinds needing heal or "-">`, with
//!   ` split-brain <kinds>` appended for split-brain ones, or
//!   `  <gfid> gone` when no copy exists any more.
//! - setxattr on a file or directory, [`SPLIT_BRAIN_RESOLVE`] = `bigger-file`,
//!   `latest-mtime` or `source-brick:<child>` (a child's volume name or
//!   pending name): heals the inode with that choice of source for any
//!   split-brain kind. Reply xdata as for [`HEAL_GFID`], plus
//!   [`HEAL_RESULT`]: `resolved`, `not in split-brain`, or
//!   `unresolved: <why>`.
//!
//! This file holds what every kind shares (inspecting the copies, the
//! verdict under the lock, source choice); `data`, `metadata` and `entry`
//! heal one kind each, `crawl` decides what to heal, `control` answers the
//! virtual xattrs.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::dict::keys::{
    GFID_REQ, GFID_XATTR, HEAL_FAILED, HEAL_GFID, HEAL_HEALED, HEAL_INFO, HEAL_REMAINING, HEAL_REPORT, HEAL_RESULT,
    HEAL_RUN, HEAL_SPLIT_BRAIN, INDEX_COUNT, INDEX_PURGE, INDEX_XATTROP, SPLIT_BRAIN_RESOLVE,
};
use xlfs_sdk::{
    CallCtx, Dict, DirEntry, Errno, Fd, FdId, FileType, Fop, FopResult, Gfid, Iatt, Loc, Reply, Request, Response,
    SeekWhat, SetAttr, TimeSet, Value, XattropOp,
};

use super::lock::Target;
use super::pending::{self, Kind, Mask, Verdict, bit, members};
use super::{Inner, join_all};

mod control;
mod crawl;
mod data;
mod entry;
mod metadata;

pub(crate) use control::is_control;
use control::*;

/// Xdata that makes storage/posix keep `ctime` (a source's) as the
/// changed inode's ctime: a sink given the source's attributes shows its
/// times too.
fn stamped(ctime: xlfs_sdk::Timespec) -> Dict {
    Dict::new().with(xlfs_sdk::dict::keys::UTIME, Value::U64(ctime.to_nanos()))
}

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
/// Most lines in [`HEAL_REPORT`].
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
        d.set_str(HEAL_HEALED, self.healed.to_string());
        d.set_str(HEAL_FAILED, self.failed.to_string());
        d.set_str(HEAL_SPLIT_BRAIN, self.split.to_string());
        d.set_str(HEAL_REMAINING, remaining.to_string());
        d.set_str(HEAL_REPORT, self.lines.join("\n"));
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
struct ChildCopy {
    iatt: Iatt,
    /// What it says of every child ([`pending::row`]: the dirty counters folded in).
    row: Vec<[i32; 3]>,
    /// Its dirty counters.
    dirty: [i32; 3],
}

impl Inner {
    fn heal_fd(&self) -> FdId {
        FdId(HEAL_FD_BASE | self.heal.next_fd.fetch_add(1, Ordering::Relaxed))
    }

    pub(super) async fn on(&self, i: usize, ctx: &CallCtx, fop: Fop) -> FopResult {
        self.wind(i, ctx.clone(), Request::new(fop)).await
    }

    pub(super) async fn on_x(&self, i: usize, ctx: &CallCtx, fop: Fop, xdata: Dict) -> FopResult {
        self.wind(i, ctx.clone(), Request::with_xdata(fop, xdata)).await
    }

    /// Every copy of `gfid` on `on` with its counters; also the children
    /// that said it does not exist.
    async fn inspect(&self, ctx: &CallCtx, gfid: Gfid, on: Mask) -> (Vec<Option<ChildCopy>>, Mask) {
        let mut x = Dict::new();
        pending::request_keys(&self.keys, &mut x);
        let req = Request::with_xdata(Fop::Lookup { loc: Loc::gfid(gfid) }, x);
        let mut out = vec![None; self.children.len()];
        let mut gone = 0;
        for (i, r) in self.fan(ctx, on, &req).await {
            match r {
                Ok(Response { reply: Reply::Entry { iatt, .. }, xdata }) if iatt.gfid == gfid => {
                    out[i] =
                        Some(ChildCopy { iatt, row: pending::row(&self.keys, &xdata), dirty: pending::dirty(&xdata) })
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
        let lctx = CallCtx::self_heal(ctx.client_id.clone()).with_lk_owner(self.new_owner());
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
        // Each copy's counters of the good children go to zero, its dirty
        // counter too; a child not healed keeps what the copy said of it
        // (its own counter takes over the dirty part).
        let k = kind as usize;
        for i in members(part) {
            let Some(c) = copies[i].as_ref() else { continue };
            let dirty = c.dirty[k];
            let delta = |j: usize| {
                c.row.get(j).map_or(0, |r| if good & bit(j) != 0 { dirty.wrapping_sub(r[k]) } else { dirty })
            };
            if let Some(d) = pending::changelog(&self.keys, kind, -dirty, delta) {
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
}

/// The source when no copy is known good: for data the biggest file
/// (then the latest mtime, then the lowest child); else the lowest child.
fn pick_uncertain(kind: Kind, copies: &[Option<ChildCopy>], sources: Mask) -> usize {
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
fn choose(c: Choice, copies: &[Option<ChildCopy>], cands: Mask, n: usize) -> Option<usize> {
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
    use super::metadata::healable_xattr;
    use super::*;
    use xlfs_sdk::Timespec;

    fn copy(size: u64, mtime: i64) -> Option<ChildCopy> {
        let iatt = Iatt { mode: 0o100644, size, mtime: Timespec { sec: mtime, nsec: 0 }, ..Default::default() };
        Some(ChildCopy { iatt, row: vec![], dirty: [0; 3] })
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
        x.set_str(HEAL_RUN, "index");
        assert!(is_control(&Fop::Setxattr { loc: Loc::root(), xattrs: x, flags: 0 }));
        assert!(is_control(&Fop::Getxattr { loc: Loc::root(), name: HEAL_INFO.into() }));
        assert!(!is_control(&Fop::Getxattr { loc: Loc::root(), name: "user.x".into() }));
        assert!(healable_xattr("user.a") && healable_xattr("trusted.x"));
        assert!(healable_xattr("trusted.glusterfs.dht") && healable_xattr("trusted.glusterfs.dht.linkto"));
        assert!(!healable_xattr("trusted.glusterfs.volume-id"));
        assert!(
            !healable_xattr("trusted.afr.c-0") && !healable_xattr(GFID_XATTR) && !healable_xattr("security.selinux")
        );
    }
}
