//! readdir and readdirp over every subvolume (GlusterFS's `dht_readdirp`):
//! the subvolumes are read one after the other, each from its own offset,
//! and the offset handed to the caller says which subvolume and where in
//! it.
//!
//! **Offsets.** With `b` bits enough for the subvolume index (at least
//! one), a child offset `o` of subvolume `i` becomes:
//! - `o << b | i` when `o < 2^(63-b)` (bit 63 clear): exact;
//! - else `1 << 63 | (o & !(2^b - 1) & !(1 << 63)) | i` (bit 63 set): the
//!   low `b` bits and bit 63 of the child's offset are lost. Only hash-
//!   ordered directories (ext4's htree) give offsets that large; there the
//!   offset is a hash position and resuming a little before it can only
//!   return again an entry whose 63-bit hash position differs from the
//!   next one's in the last `b` bits alone (GlusterFS's `gf_itransform`
//!   makes the same trade).
//!
//! Offset 0 is the start of subvolume 0. A subvolume that returns nothing
//! from an offset is done: the listing goes on at the start of the next.
//!
//! **What is listed.** Directories (with `.` and `..`) only from subvolume
//! 0, where every directory exists, with the attributes of all their
//! copies merged (a lookup of each); link files (mode `01000` with a
//! linkto xattr, whatever their size: a migrated source kept as a link
//! file on a subvolume being removed still holds its old data) never.
//! A readdir is sent as a readdirp, so that link files can be told apart,
//! and answered without the attributes.
//!
//! **Files moving during a listing.** A rebalance may move a file between
//! the reads of two subvolumes: from one read later to one read earlier
//! it would be in neither listing (a link file on both when each was
//! read), the other way in both (GlusterFS's readdir has both windows).
//! While a directory's layout is unsettled (as last read: files move only
//! then) each directory fd keeps the names it gave out ([`Given`], at most
//! [`GIVEN_MAX`]): a data file's name given already is skipped, and a link
//! file leading back to a subvolume read already is looked up and listed,
//! with the data's attributes and xattrs, when it has data and was not
//! given. A listing asked for with [`WHOLE_LISTING`] (a cache that then
//! answers ENOENT for names not in it) also says at its end that it may
//! miss names when the layout read again from the bricks is unsettled
//! (one remembered as settled is not tracked).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use xlfs_sdk::dict::keys::{DIRENT_XATTRS, WHOLE_LISTING, dirent_xattr, parse_dirent_xattr};

use parking_lot::Mutex;
use xlfs_sdk::{
    CallCtx, Dict, DirEntry, Errno, Fd, FileType, Fop, FopResult, Gfid, Iatt, Loc, Reply, Request, Response, Value,
};

use super::{Inner, LINK_MODE, LINKTO_XATTR, is_private};

/// Bits of the offset that hold the subvolume index for `n` subvolumes.
pub fn index_bits(n: usize) -> u32 {
    (usize::BITS - n.saturating_sub(1).leading_zeros()).max(1)
}

const HUGE: u64 = 1 << 63;

/// The caller's offset for child offset `off` of subvolume `i`.
pub fn encode(off: u64, i: usize, n: usize) -> u64 {
    let b = index_bits(n);
    let low = (1u64 << b) - 1;
    if off < 1u64 << (63 - b) { (off << b) | i as u64 } else { HUGE | (off & !low & !HUGE) | i as u64 }
}

/// The subvolume and child offset of a caller's offset; None when it names
/// no subvolume.
pub fn decode(cookie: u64, n: usize) -> Option<(usize, u64)> {
    let b = index_bits(n);
    let low = (1u64 << b) - 1;
    let i = usize::try_from(cookie & low).ok().filter(|i| *i < n)?;
    let off = if cookie & HUGE == 0 { cookie >> b } else { cookie & !low & !HUGE };
    Some((i, off))
}

/// Most names a [`Given`] keeps; a listing beyond it is not deduplicated.
const GIVEN_MAX: usize = 65536;

/// The names a listing of an unsettled directory gave out on one fd.
#[derive(Default)]
pub(super) struct Given {
    names: HashSet<String>,
    /// Past [`GIVEN_MAX`]: no longer kept.
    full: bool,
}

impl Given {
    fn has(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// Records `name` as given; false if it was already.
    fn give(&mut self, name: &str) -> bool {
        if self.full {
            return true;
        }
        if self.names.len() >= GIVEN_MAX {
            self.full = true;
            self.names = HashSet::new();
            return true;
        }
        self.names.insert(name.to_string())
    }
}

/// The subvolume name a link file's entry leads to.
fn linkto_of_entry(e: &DirEntry, xdata: &Dict) -> Option<String> {
    super::linkto_name(&xdata.get_bytes(&dirent_xattr(&e.name, LINKTO_XATTR))?)
}

/// True for a link file's entry (readdirp attributes and its xattr key).
fn is_link_entry(e: &DirEntry, xdata: &Dict) -> bool {
    e.iatt.file_type() == FileType::Regular
        && e.iatt.mode & 0o7777 == LINK_MODE
        && xdata.contains(&dirent_xattr(&e.name, LINKTO_XATTR))
}

impl Inner {
    pub(super) async fn readdir(
        &self,
        ctx: &CallCtx,
        fd: Fd,
        size: u32,
        offset: u64,
        plus: bool,
        xdata: Dict,
    ) -> FopResult {
        let n = self.n();
        let (mut i, mut off) = decode(offset, n).ok_or(Errno::EINVAL)?;
        let caller_asked =
            xdata.keys().any(|k| ["trusted.", "user.", "security.", "system."].iter().any(|p| k.starts_with(p)));
        let mut xd = xdata.clone();
        xd.set(LINKTO_XATTR, Value::U64(0));
        // An unsettled directory (a rebalance moves its files): the names
        // given out so far on this fd, so that a file that moved during
        // the listing is given once (see the module docs).
        let given = self.given_names(fd, offset);
        while i < n {
            let req = Request::with_xdata(Fop::Readdirp { fd, size, offset: off }, xd.clone());
            let rsp = self.wind(i, ctx, req).await?;
            let mut got = rsp.xdata;
            let entries = rsp.reply.into_dirents()?;
            let Some(last) = entries.last() else {
                i += 1;
                off = 0;
                continue;
            };
            let resume = last.d_off;
            let mut keep = Vec::with_capacity(entries.len());
            let mut names = Vec::new();
            for mut e in entries {
                let is_dir = e.d_type == FileType::Directory || e.iatt.is_dir();
                if is_dir && i != 0 {
                    continue;
                }
                if is_link_entry(&e, &got) {
                    // A link file leading to a subvolume read already: its
                    // file may have moved there since it was read.
                    let back = linkto_of_entry(&e, &got).and_then(|t| self.index_of(&t)).is_some_and(|t| t < i);
                    let Some(g) = given.as_deref().filter(|_| back) else { continue };
                    let Some(found) = self.moved_in(ctx, fd.gfid, e, &xdata, g, &mut got).await else { continue };
                    e = found;
                } else if let Some(g) = given.as_deref()
                    && !g.lock().give(&e.name)
                {
                    continue;
                }
                e.d_off = encode(e.d_off, i, n);
                if !plus {
                    e.iatt = Iatt::default();
                }
                names.push(e.name.clone());
                keep.push(e);
            }
            if keep.is_empty() {
                // Everything in this batch was skipped: read on.
                off = resume;
                continue;
            }
            if plus {
                self.merge_subdirs(ctx, &mut keep).await;
            }
            let mut out = Dict::new();
            for (k, v) in got {
                let private = is_private(&k);
                let per_entry = parse_dirent_xattr(&k).is_some_and(|(e, _)| names.iter().any(|n| n == e));
                if !private && (per_entry || parse_dirent_xattr(&k).is_none()) {
                    out.set(k, v);
                }
            }
            if !caller_asked {
                out.remove(DIRENT_XATTRS);
            }
            return Ok(Response { reply: Reply::Dirents(keep), xdata: out });
        }
        let mut end = Response::from(Reply::Dirents(Vec::new()));
        if xdata.contains(WHOLE_LISTING) && !self.settled_now(ctx, fd.gfid).await {
            end.xdata.set_u64(WHOLE_LISTING, 0);
        }
        Ok(end)
    }

    /// The record of names given out on `fd` when its directory is
    /// unsettled (as last read): a new one at offset 0, else the one
    /// kept; None for a settled directory, one listed past the bound, or
    /// when the table is full.
    fn given_names(&self, fd: Fd, offset: u64) -> Option<Arc<Mutex<Given>>> {
        if self.dirs.get(&fd.gfid).is_none_or(|d| d.settled()) {
            return None;
        }
        if offset == 0 {
            let g = Arc::new(Mutex::new(Given::default()));
            return self.listings.insert(fd.id, g.clone()).is_ok().then_some(g);
        }
        self.listings.get(&fd.id).filter(|g| !g.lock().full)
    }

    /// A link file's entry `link` in directory `dir` whose file may have
    /// moved to a subvolume read already: the file's entry (the data's
    /// attributes, and in `got` the per-entry xattrs the caller asked
    /// for, the data's instead of the link file's) if it has data and was
    /// not given out yet.
    async fn moved_in(
        &self,
        ctx: &CallCtx,
        dir: Gfid,
        link: DirEntry,
        asked: &Dict,
        given: &Mutex<Given>,
        got: &mut Dict,
    ) -> Option<DirEntry> {
        if given.lock().has(&link.name) {
            return None;
        }
        let f = self.find(ctx, &Loc::entry(dir, link.name.clone()), asked).await.ok()?;
        let iatt = f.iatt();
        if iatt.is_dir() || !given.lock().give(&link.name) {
            return None;
        }
        let link_keys: Vec<String> =
            got.keys().filter(|k| parse_dirent_xattr(k).is_some_and(|(n, _)| n == link.name)).cloned().collect();
        for k in link_keys {
            got.remove(&k);
        }
        for (k, v) in f.rsp.xdata {
            if asked.contains(&k) && !is_private(&k) && parse_dirent_xattr(&k).is_none() {
                got.set(dirent_xattr(&link.name, &k), v);
            }
        }
        self.stats.moved_listed.fetch_add(1, Ordering::Relaxed);
        Some(DirEntry { iatt, d_type: iatt.file_type(), ..link })
    }

    /// Whether directory `dir`'s layout is settled on the bricks now (read
    /// again, not remembered): no file of it is being moved, so a listing
    /// missed none. One that settled while the listing was read was
    /// invalidated meanwhile (the settle is a setxattr on it), which the
    /// cache that asked sees.
    async fn settled_now(&self, ctx: &CallCtx, dir: xlfs_sdk::Gfid) -> bool {
        self.dirs.remove(&dir);
        self.layout_of(ctx, dir).await.is_ok_and(|d| d.settled())
    }
}

impl Inner {
    /// A subdirectory's attributes in a listing are one copy's (subvolume
    /// 0's); the other copies are asked (a stat each, at once) and their
    /// times merged in as a lookup merges them ([`super::merge_dir`]), so
    /// that what a listing feeds the kernel's cache and what a stat
    /// answers agree. A copy that does not answer is left out.
    async fn merge_subdirs(&self, ctx: &CallCtx, entries: &mut [DirEntry]) {
        let dirs: Vec<usize> = (0..entries.len())
            .filter(|&k| {
                let e = &entries[k];
                e.iatt.is_dir() && !e.iatt.gfid.is_null() && !matches!(e.name.as_str(), "." | "..")
            })
            .collect();
        if dirs.is_empty() || self.n() < 2 {
            return;
        }
        let stats = dirs
            .iter()
            .flat_map(|&k| {
                let gfid = entries[k].iatt.gfid;
                (1..self.n()).map(move |i| self.wind(i, ctx, Request::new(Fop::Stat { loc: Loc::gfid(gfid) })))
            })
            .collect();
        let mut answers = crate::cluster::replicate::join_all(stats).await.into_iter();
        for k in dirs {
            let mut merged = Response::from(Reply::Attr(entries[k].iatt));
            let mut copies: Vec<FopResult> = answers.by_ref().take(self.n() - 1).collect();
            super::merge_dir(&mut merged, &mut copies);
            if let Reply::Attr(iatt) = merged.reply {
                entries[k].iatt = iatt;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip() {
        for n in [1usize, 2, 3, 4, 5, 16, 200] {
            for i in [0, n / 2, n - 1] {
                for off in [0u64, 1, 12345, (1 << 40) + 7, (1 << 60) + 3, i64::MAX as u64 - 5] {
                    let (j, o) = decode(encode(off, i, n), n).expect("decodes");
                    assert_eq!(j, i, "n {n} off {off}");
                    let b = index_bits(n);
                    if off < 1u64 << (63 - b) {
                        assert_eq!(o, off);
                    } else {
                        assert!(o <= off && off - o < 1 << b, "n {n}: {off} -> {o}");
                    }
                }
            }
        }
        assert_eq!(index_bits(1), 1);
        assert_eq!(index_bits(3), 2);
        assert_eq!(index_bits(4), 2);
        assert_eq!(index_bits(5), 3);
        assert_eq!(decode(3, 3), None);
    }
}
