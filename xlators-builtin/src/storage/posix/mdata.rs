//! Times kept as the client stamped them (GlusterFS's `ctime` feature,
//! posix-metadata.c): a copy's own ctime, mtime and atime are set by its
//! brick's clock, differ between the copies of a replica set, and move
//! when the bricks' own bookkeeping (replicate's changelog xattrs, the
//! index) touches the inode. So a client's features/utime stamps each
//! change with one time ([`UTIME`] in the xdata, the same for every copy),
//! and this brick stores the inode's times in the xattr [`MDATA_XATTR`]:
//!
//! - data (write, truncate, fallocate, discard, zero-fill, copy_file_range
//!   into it, open with O_TRUNC): mtime and ctime;
//! - attributes (setattr, xattrs): ctime, and the atime and mtime a setattr
//!   sets (a time given, or the stamp for "now");
//! - an inode made (create, mknod, mkdir, symlink): all three; its parent's
//!   mtime and ctime; a link, unlink, rmdir or rename: the parents' mtime
//!   and ctime, and the inode's ctime.
//!
//! Every attribute this brick answers with carries the stored times of the
//! inode (an inode without them, made before the feature or by a fop with
//! no stamp, shows its own). Fops without a stamp (heal's data writes, the
//! bricks' bookkeeping) leave the stored times alone; heal gives a sink
//! the source's times through a stamped setattr.
//!
//! The stored times are cached per gfid ([`Cache`], bounded), so a stat
//! costs no extra system call once the inode has been seen.
//!
//! Writing the xattr is a metadata change the file system journals, and
//! the next fdatasync of the file must then commit the journal: a database
//! whose every WAL write is followed by an fdatasync paid for one commit
//! per write (pgbench: 1330 against 1480 TPS with `ctime` off). So data
//! changes of an inode within [`DEFER_WINDOW`] of the last one written are
//! kept in memory only ([`Deferred`]) and written once the window is over
//! (a timer), at the inode's release, before a full fsync, before its
//! xattr is read by name, and when the brick stops. As on a local file
//! system, whose journal commits times within seconds, a crash may lose
//! the last second of times, never data: fdatasync and O_DSYNC promise no
//! times. The first data change after a quiet window is written at once.
//! A regular file made by a create (an fd open on it) keeps its first
//! times in memory the same way, for a window or until its release (where
//! replicate's counters back at zero are removed first, see `xattr`): a
//! small file is written and closed within it, and its gfid with either
//! its raised dirty counter or its times fits in a 256-byte inode, where
//! all three took an xattr block allocated and freed per file.

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use xlfs_sdk::{Errno, Fop, Gfid, Iatt, Reply, Response, SetAttr, TimeSet, Timespec};

use super::Inner;
use super::handle::handle_rel;
use super::sys::Target;

pub use xlfs_sdk::dict::keys::UTIME;

/// The xattr holding an inode's times.
pub const MDATA_XATTR: &str = "trusted.xlfs.mdata";
pub(super) const MDATA_C: &CStr = c"trusted.xlfs.mdata";
/// The first encoding's version (its first byte): the three times as
/// big-endian `i64` seconds and `u32` nanoseconds, 37 bytes. Still read,
/// and written for a time the compact encoding cannot hold.
const VERSION: u8 = 1;
const LEN: usize = 1 + 3 * 12;
/// The compact encoding: the three times (ctime, mtime, atime) as
/// big-endian `i64` nanoseconds since the epoch (1677 to 2262), 24 bytes,
/// told from the first by its length. With the gfid it is 88 bytes of
/// ext4 xattr entries, what a 256-byte inode holds: a file at rest (its
/// replicate counters back at zero, so removed) keeps its xattrs in its
/// inode, and a cold stat or listing reads no extra block per file (each
/// cost a random read: ~90 against ~20 us per entry on this project's
/// disk).
pub(super) const COMPACT_LEN: usize = 3 * 8;
/// Gfids whose times are cached (two generations of half as many).
const CACHE_ENTRIES: usize = 1 << 16;

/// An inode's stored times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mdata {
    /// Change time.
    pub ctime: Timespec,
    /// Modification time.
    pub mtime: Timespec,
    /// Access time.
    pub atime: Timespec,
}

impl Mdata {
    fn of(ia: &Iatt) -> Mdata {
        Mdata { ctime: ia.ctime, mtime: ia.mtime, atime: ia.atime }
    }

    fn times(&self) -> [Timespec; 3] {
        [self.ctime, self.mtime, self.atime]
    }

    /// The xattr's value: compact when every time fits, else the first
    /// encoding.
    pub(super) fn encode(&self) -> Encoded {
        let mut out = Encoded([0u8; LEN], COMPACT_LEN);
        let ns = self.times().map(|t| i64::try_from(i128::from(t.sec) * NS + i128::from(t.nsec)).ok());
        if let [Some(c), Some(m), Some(a)] = ns {
            for (k, v) in [c, m, a].iter().enumerate() {
                out.0[8 * k..8 * k + 8].copy_from_slice(&v.to_be_bytes());
            }
            return out;
        }
        out.0[0] = VERSION;
        for (k, t) in self.times().iter().enumerate() {
            let at = 1 + 12 * k;
            out.0[at..at + 8].copy_from_slice(&t.sec.to_be_bytes());
            out.0[at + 8..at + 12].copy_from_slice(&t.nsec.to_be_bytes());
        }
        out.1 = LEN;
        out
    }

    pub(super) fn decode(v: &[u8]) -> Option<Mdata> {
        if v.len() == COMPACT_LEN {
            let t = |k: usize| {
                let ns = i128::from(i64::from_be_bytes(v[8 * k..8 * k + 8].try_into().ok()?));
                Some(Timespec { sec: ns.div_euclid(NS) as i64, nsec: ns.rem_euclid(NS) as u32 })
            };
            return Some(Mdata { ctime: t(0)?, mtime: t(1)?, atime: t(2)? });
        }
        if v.len() != LEN || v[0] != VERSION {
            return None;
        }
        let t = |k: usize| {
            let at = 1 + 12 * k;
            let sec = i64::from_be_bytes(v[at..at + 8].try_into().ok()?);
            let nsec = u32::from_be_bytes(v[at + 8..at + 12].try_into().ok()?);
            (nsec < 1_000_000_000).then_some(Timespec { sec, nsec })
        };
        Some(Mdata { ctime: t(0)?, mtime: t(1)?, atime: t(2)? })
    }

    /// `ia` with these times.
    pub fn apply(&self, ia: &mut Iatt) {
        (ia.ctime, ia.mtime, ia.atime) = (self.ctime, self.mtime, self.atime);
    }
}

const NS: i128 = 1_000_000_000;

/// An encoded [`Mdata`]: the bytes of the xattr's value.
pub(super) struct Encoded([u8; LEN], usize);

impl std::ops::Deref for Encoded {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0[..self.1]
    }
}

/// The directory flag of an inode of unknown type: read and written
/// through the resolved inode, which works for every type.
const ANY: bool = true;

/// What a stamped fop changed of one inode.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// Its content (or a directory's entries): mtime and ctime.
    Data,
    /// Its attributes: ctime, and the times a setattr sets.
    Attr { atime: Option<TimeSet>, mtime: Option<TimeSet> },
    /// Made by this fop: all three.
    New,
}

/// The stored times of recently seen gfids (None: the inode has none).
pub(super) type Cache = super::gen_cache::GenCache<Option<Mdata>>;

/// An empty cache of stored times.
pub(super) fn cache() -> Cache {
    Cache::new(CACHE_ENTRIES)
}

/// How long after the times of a data change are written later data
/// changes of the same inode are kept in memory only.
pub(super) const DEFER_WINDOW: Duration = Duration::from_secs(1);
/// Most inodes tracked for deferring; past it, times are written at once.
const DEFER_MAX: usize = 4096;

/// Inodes whose data-change times were written lately, and the times not
/// written yet.
#[derive(Default)]
pub(super) struct Deferred(Mutex<DeferredState>);

#[derive(Default)]
struct DeferredState {
    recent: HashMap<Gfid, Recent>,
    /// Entries of `recent` with times pending.
    pending: usize,
    /// A timer task is running to write what is due.
    timer: bool,
    /// When `recent` was last pruned because it was full.
    pruned: Option<Instant>,
}

#[derive(Clone, Copy)]
struct Recent {
    dir: bool,
    /// When its times were last written.
    written: Instant,
    /// Times kept in memory only.
    pending: Option<Mdata>,
}

impl DeferredState {
    /// Whether `g` may be tracked: it is, or there is room (made by
    /// dropping what is past its window and has nothing pending, at most
    /// every quarter window: a storm of new inodes is written at once
    /// meanwhile).
    fn room_for(&mut self, g: &Gfid, now: Instant) -> bool {
        if self.recent.len() < DEFER_MAX || self.recent.contains_key(g) {
            return true;
        }
        if self.pruned.is_some_and(|t| now.duration_since(t) < DEFER_WINDOW / 4) {
            return false;
        }
        self.pruned = Some(now);
        self.recent.retain(|_, r| r.pending.is_some() || now.duration_since(r.written) < DEFER_WINDOW);
        self.recent.len() < DEFER_MAX
    }

    /// Takes `g`'s pending times, if any.
    fn take_one(&mut self, g: &Gfid, now: Instant) -> Option<(bool, Mdata)> {
        let r = self.recent.get_mut(g)?;
        let m = r.pending.take()?;
        r.written = now;
        self.pending -= 1;
        Some((r.dir, m))
    }
}

impl Deferred {
    /// Keeps `m` in memory if `g`'s times were written within the window.
    fn defer(&self, g: Gfid, m: Mdata) -> bool {
        let mut st = self.0.lock();
        let Some(r) = st.recent.get_mut(&g) else { return false };
        if r.written.elapsed() >= DEFER_WINDOW {
            return false;
        }
        let was = r.pending.replace(m);
        if was.is_none() {
            st.pending += 1;
        }
        true
    }

    /// Keeps the times of `g`, a file just made, in memory for a window
    /// (false: too many inodes are tracked, write them now).
    fn defer_new(&self, g: Gfid, m: Mdata) -> bool {
        let mut st = self.0.lock();
        let now = Instant::now();
        if !st.room_for(&g, now) {
            return false;
        }
        let was = st.recent.insert(g, Recent { dir: false, written: now, pending: Some(m) });
        if was.is_none_or(|r| r.pending.is_none()) {
            st.pending += 1;
        }
        true
    }

    /// `g`'s times were just written: a data change (`data`) opens a
    /// window; any write supersedes what was pending.
    fn written(&self, g: Gfid, dir: bool, data: bool) {
        let mut st = self.0.lock();
        let now = Instant::now();
        let _ = st.take_one(&g, now);
        if !data {
            return;
        }
        if st.room_for(&g, now) {
            st.recent.insert(g, Recent { dir, written: now, pending: None });
        }
    }

    fn pending(&self, g: &Gfid) -> Option<Mdata> {
        self.0.lock().recent.get(g).and_then(|r| r.pending)
    }

    /// Takes `g`'s pending times (whether a directory's, and the times).
    fn take_one(&self, g: Gfid) -> Option<(bool, Mdata)> {
        self.0.lock().take_one(&g, Instant::now())
    }

    /// Takes the pending times of every inode whose window is over (of
    /// every inode with `all`).
    fn take_due(&self, all: bool) -> Vec<(Gfid, bool, Mdata)> {
        let mut st = self.0.lock();
        let now = Instant::now();
        if st.pending == 0 {
            return Vec::new();
        }
        let due: Vec<Gfid> = st
            .recent
            .iter()
            .filter(|(_, r)| r.pending.is_some() && (all || now.duration_since(r.written) >= DEFER_WINDOW))
            .map(|(g, _)| *g)
            .collect();
        due.into_iter().filter_map(|g| st.take_one(&g, now).map(|(dir, m)| (g, dir, m))).collect()
    }

    /// True when something is pending and no timer runs: the caller starts
    /// one ([`Inner::write_due_times`] until it returns false).
    pub(super) fn wants_timer(&self) -> bool {
        let mut st = self.0.lock();
        if st.timer || st.pending == 0 {
            return false;
        }
        st.timer = true;
        true
    }

    /// The timer's end: false (and the timer is off) once nothing is
    /// pending.
    fn timer_goes_on(&self) -> bool {
        let mut st = self.0.lock();
        st.timer = st.pending > 0;
        st.timer
    }
}

/// The inodes a stamped fop changed, and how: from the fop (before it
/// runs) and its reply.
fn changes(fop: &Fop, rsp: &Response) -> Vec<(Gfid, bool, Change)> {
    let mut out = Vec::new();
    let parent = |out: &mut Vec<(Gfid, bool, Change)>, g: Gfid| {
        if !g.is_null() {
            out.push((g, true, Change::Data));
        }
    };
    match (fop, &rsp.reply) {
        (
            Fop::Writev { .. }
            | Fop::Truncate { .. }
            | Fop::Ftruncate { .. }
            | Fop::Fallocate { .. }
            | Fop::Discard { .. }
            | Fop::Zerofill { .. },
            Reply::PrePost { post, .. },
        )
        | (Fop::CopyFileRange { .. }, Reply::Copied { post, .. }) => out.push((post.gfid, post.is_dir(), Change::Data)),
        (Fop::Setattr { attr, .. } | Fop::Fsetattr { attr, .. }, Reply::PrePost { post, .. }) => {
            let SetAttr { atime, mtime, .. } = *attr;
            out.push((post.gfid, post.is_dir(), Change::Attr { atime, mtime }));
        }
        (
            Fop::Create { .. } | Fop::Mknod { .. } | Fop::Mkdir { .. } | Fop::Symlink { .. },
            Reply::Entry { iatt, postparent },
        ) => {
            out.push((iatt.gfid, iatt.is_dir(), Change::New));
            parent(&mut out, postparent.gfid);
        }
        (Fop::Link { .. }, Reply::Entry { iatt, postparent }) => {
            out.push((iatt.gfid, false, Change::Attr { atime: None, mtime: None }));
            parent(&mut out, postparent.gfid);
        }
        (Fop::Unlink { .. } | Fop::Rmdir { .. }, Reply::Parent { post, .. }) => parent(&mut out, post.gfid),
        // Of an inode of either type: the directory case is found out
        // where its times are written (a gfid names one inode).
        (Fop::Setxattr { loc, .. } | Fop::Removexattr { loc, .. }, _) => {
            out.push((loc.gfid, ANY, Change::Attr { atime: None, mtime: None }));
        }
        (Fop::Fsetxattr { fd, .. } | Fop::Fremovexattr { fd, .. }, _) => {
            out.push((fd.gfid, ANY, Change::Attr { atime: None, mtime: None }));
        }
        (Fop::Open { loc, flags, .. }, _) if *flags & libc::O_TRUNC as u32 != 0 => {
            out.push((loc.gfid, false, Change::Data));
        }
        (Fop::Rename { old, new, .. }, Reply::Rename { iatt }) => {
            out.push((iatt.gfid, iatt.is_dir(), Change::Attr { atime: None, mtime: None }));
            parent(&mut out, old.parent);
            if new.parent != old.parent {
                parent(&mut out, new.parent);
            }
        }
        _ => {}
    }
    // The same inode twice (a rename within one directory names it once).
    let mut seen = std::collections::HashSet::new();
    out.retain(|(g, _, _)| !g.is_null() && seen.insert(*g));
    out
}

impl Inner {
    /// Where the times of `g` are read and written: a directory through its
    /// descriptor (its handle is a symlink), anything else by its handle.
    fn mdata_io<R>(&self, g: Gfid, dir: bool, f: impl FnOnce(Target<'_>) -> Result<R, Errno>) -> Result<R, Errno> {
        if dir || g == Gfid::ROOT {
            let n = self.brick.resolve_gfid(g)?;
            f(self.brick.target(&n))
        } else {
            let h = handle_rel(&g);
            f(Target::At(self.brick.gfs(), &h))
        }
    }

    /// The stored times of `g` (cached), None when it has none.
    fn mdata(&self, g: Gfid, dir: bool) -> Option<Mdata> {
        if let Some(v) = self.times.get(&g) {
            return v;
        }
        if let Some(m) = self.deferred.pending(&g) {
            self.times.put(g, Some(m));
            return Some(m);
        }
        let v = match self.mdata_io(g, dir, |t| t.getxattr(MDATA_C)) {
            Ok(bytes) => Mdata::decode(&bytes),
            Err(Errno::ENODATA) => None,
            // Unreadable now (gone, or a race with its removal): not cached.
            Err(_) => return None,
        };
        self.times.put(g, v);
        v
    }

    /// Writes the times kept in memory for `g` (before its xattr is read by
    /// name, a full fsync, its release) through `t`, the inode the fop has
    /// at hand (its descriptor: no handle path to walk).
    pub(super) fn write_deferred_times(&self, g: Gfid, t: Target<'_>) {
        if let Some((_, m)) = self.deferred.take_one(g)
            && let Err(e) = t.setxattr(MDATA_C, &m.encode(), 0)
        {
            tracing::debug!(%g, "storing deferred times: {e}");
        }
    }

    /// Writes the times kept in memory whose window is over (every one
    /// with `all`); false once nothing is pending and the timer may stop.
    pub(super) fn write_due_times(&self, all: bool) -> bool {
        self.write_times(self.deferred.take_due(all));
        self.deferred.timer_goes_on()
    }

    fn write_times(&self, due: Vec<(Gfid, bool, Mdata)>) {
        for (g, dir, m) in due {
            if let Err(e) = self.mdata_io(g, dir, |t| t.setxattr(MDATA_C, &m.encode(), 0)) {
                // Gone meanwhile (unlinked, removed): nothing to keep.
                tracing::debug!(%g, "storing deferred times: {e}");
            }
        }
    }

    /// Records what stamped fop `fop` (answered `rsp`) changed at time `t`;
    /// returns the inodes' times before and after.
    pub(super) fn stamp(&self, fop: &Fop, rsp: &Response, t: Timespec) -> Vec<(Gfid, Option<Mdata>, Mdata)> {
        let mut out = Vec::new();
        // A full-sync write promises its times too: never deferred.
        let full_sync = matches!(fop, Fop::Writev { flags, .. } if *flags as i32 & libc::O_SYNC == libc::O_SYNC);
        for (g, dir, change) in changes(fop, rsp) {
            // Through the fop's own descriptor when it has one (a write's,
            // or the one a create just opened): no path to resolve.
            let open = match fop {
                Fop::Create { fd, .. } => self.fd(*fd).ok().filter(|o| o.gfid == g),
                _ => fop.fd().filter(|f| f.gfid == g).and_then(|f| self.fd(f.id).ok()),
            };
            let io = |f: &dyn Fn(Target<'_>) -> Result<(), Errno>| match &open {
                Some(o) => f(Target::Fd(o.fd.as_fd())),
                None => self.mdata_io(g, dir, f),
            };
            let before = if matches!(change, Change::New) { None } else { self.mdata(g, dir) };
            // An inode without stored times starts from its own (a new one
            // takes the stamp for all three).
            let base = match (before, change) {
                (Some(m), _) => m,
                (None, Change::New) => Mdata { ctime: t, mtime: t, atime: t },
                (None, _) => match self.mdata_io(g, dir, |t| t.stat()) {
                    Ok(st) => Mdata::of(&super::iatt(&st, g)),
                    Err(_) => continue,
                },
            };
            let at = |ts: Option<TimeSet>, keep: Timespec| match ts {
                None => keep,
                Some(TimeSet::Now) => t,
                Some(TimeSet::At(x)) => x,
            };
            let after = match change {
                Change::Data => Mdata { ctime: t, mtime: t, atime: base.atime },
                Change::Attr { atime, mtime } => {
                    Mdata { ctime: t, mtime: at(mtime, base.mtime), atime: at(atime, base.atime) }
                }
                Change::New => Mdata { ctime: t, mtime: t, atime: t },
            };
            let data = matches!(change, Change::Data) && !full_sync;
            // A file made with an fd open on it (create) gets its first
            // write and its close within the window most often: its times
            // wait for them, so that replicate's dirty counter, raised by
            // that write, is gone before they are written and the three
            // never share the inode (which holds the gfid and the times,
            // or the gfid and the counter: else an xattr block is
            // allocated and freed per file).
            let new_file = matches!((fop, change), (Fop::Create { .. }, Change::New)) && !dir && open.is_some();
            if (new_file && self.deferred.defer_new(g, after)) || (data && self.deferred.defer(g, after)) {
                self.times.put(g, Some(after));
                out.push((g, before, after));
                continue;
            }
            match io(&|tg| tg.setxattr(MDATA_C, &after.encode(), 0)) {
                Ok(()) => {
                    self.times.put(g, Some(after));
                    self.deferred.written(g, dir, data);
                    out.push((g, before, after));
                }
                Err(e) => tracing::debug!(%g, "storing the stamped times: {e}"),
            }
        }
        out
    }

    /// Gives every attribute in `rsp` its inode's stored times: a `pre`
    /// the times before `stamped`, the rest the times now.
    pub(super) fn with_times(&self, rsp: &mut Response, stamped: &[(Gfid, Option<Mdata>, Mdata)]) {
        let now = |ia: &mut Iatt| {
            if ia.gfid.is_null() {
                return;
            }
            let m = match stamped.iter().find(|(g, _, _)| *g == ia.gfid) {
                Some((_, _, after)) => Some(*after),
                None => self.mdata(ia.gfid, ia.is_dir()),
            };
            if let Some(m) = m {
                m.apply(ia);
            }
        };
        let before = |ia: &mut Iatt| match stamped.iter().find(|(g, _, _)| *g == ia.gfid) {
            Some((_, Some(b), _)) => b.apply(ia),
            // It had no stored times before this fop: its own were shown.
            Some((_, None, _)) => {}
            None => now(ia),
        };
        match &mut rsp.reply {
            Reply::Entry { iatt, postparent } => {
                now(iatt);
                now(postparent);
            }
            Reply::Attr(ia) | Reply::Rename { iatt: ia } | Reply::Read { iatt: ia, .. } => now(ia),
            Reply::Readlink { iatt, .. } => now(iatt),
            Reply::Copied { post, .. } => now(post),
            Reply::PrePost { pre, post } | Reply::Parent { pre, post } => {
                before(pre);
                now(post);
            }
            Reply::Dirents(entries) => {
                for e in entries.iter_mut() {
                    now(&mut e.iatt);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_files_are_deferred_past_the_bound_once_older_ones_are_done() {
        let d = Deferred::default();
        let t = Timespec { sec: 1_700_000_000, nsec: 0 };
        let m = Mdata { ctime: t, mtime: t, atime: t };
        let made: Vec<Gfid> = (0..DEFER_MAX).map(|_| Gfid::random()).collect();
        for g in &made {
            assert!(d.defer_new(*g, m));
        }
        assert!(!d.defer_new(Gfid::random(), m), "full of pending times: written at once");
        // Their releases wrote them; a window later there is room again.
        for g in &made {
            assert_eq!(d.take_one(*g), Some((false, m)));
        }
        std::thread::sleep(DEFER_WINDOW);
        assert!(d.defer_new(Gfid::random(), m));
        assert!(d.0.lock().recent.len() < DEFER_MAX);
    }

    #[test]
    fn times_round_trip_and_bad_values_are_refused() {
        let t = |sec, nsec| Timespec { sec, nsec };
        let m = Mdata { ctime: t(1_700_000_000, 5), mtime: t(-3, 999_999_999), atime: t(0, 0) };
        assert_eq!(m.encode().len(), COMPACT_LEN, "times from 1677 to 2262 are compact");
        assert_eq!(Mdata::decode(&m.encode()), Some(m));
        // Times the compact encoding cannot hold take the first one.
        let far = Mdata { ctime: t(1_700_000_000, 5), mtime: t(10_000_000_000, 7), atime: t(-10_000_000_000, 1) };
        assert_eq!(far.encode().len(), LEN);
        assert_eq!(Mdata::decode(&far.encode()), Some(far));
        // What a brick wrote before the compact encoding still reads.
        let mut v1 = vec![VERSION];
        for x in m.times() {
            v1.extend(x.sec.to_be_bytes());
            v1.extend(x.nsec.to_be_bytes());
        }
        assert_eq!(Mdata::decode(&v1), Some(m));
        let mut bad = far.encode().to_vec();
        bad[0] = 9;
        assert_eq!(Mdata::decode(&bad), None, "another version");
        assert_eq!(Mdata::decode(&m.encode()[..20]), None, "short");
        let mut big = far.encode().to_vec();
        big[9..13].copy_from_slice(&2_000_000_000u32.to_be_bytes());
        assert_eq!(Mdata::decode(&big), None, "nanoseconds out of range");
        assert_eq!(Timespec::from_nanos(1_500_000_000_250), t(1500, 250));
        assert_eq!(t(1500, 250).to_nanos(), 1_500_000_000_250);
    }

    #[test]
    fn deferred_times_are_counted_taken_and_superseded() {
        let d = Deferred::default();
        let g = Gfid([1; 16]);
        let t = Timespec { sec: 1, nsec: 0 };
        let m = Mdata { ctime: t, mtime: t, atime: t };
        assert!(!d.defer(g, m), "no window before a first write");
        d.written(g, false, true);
        assert!(d.defer(g, m) && d.defer(g, m));
        assert_eq!(d.0.lock().pending, 1);
        assert!(d.wants_timer());
        assert!(!d.wants_timer(), "one timer at a time");
        assert!(d.take_due(false).is_empty(), "the window is not over");
        assert_eq!(d.take_due(true), vec![(g, false, m)]);
        assert!(!d.timer_goes_on(), "nothing left: the timer stops");
        // Times written at once (an attribute change) supersede pending ones.
        assert!(d.defer(g, m));
        d.written(g, false, false);
        assert_eq!((d.pending(&g), d.0.lock().pending), (None, 0));
        assert!(!d.wants_timer());
        assert!(d.take_one(g).is_none());
    }
}
