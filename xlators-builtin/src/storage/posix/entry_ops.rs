//! Entry fops (GlusterFS's posix-entry-ops.c): lookup, the creating fops
//! (create, mknod, mkdir, symlink), unlink and rmdir, rename, and
//! readdir(p) with its per-entry xattrs and small-file content.

use super::*;

/// The whole content of regular file `name` in directory `dir`, if it is
/// still what `iatt` (from the listing) describes after reading it.
pub(super) fn entry_content(dir: BorrowedFd<'_>, name: &str, iatt: &Iatt) -> Option<Vec<u8>> {
    let cname = cstr(name.as_bytes()).ok()?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let file =
        sys::openat(dir, &cname, flags | libc::O_NOATIME, 0).or_else(|_| sys::openat(dir, &cname, flags, 0)).ok()?;
    read_unchanged(file.as_fd(), iatt.size, |st| {
        let after = self::iatt(st, iatt.gfid);
        (after.size, after.mtime, after.ctime, after.mode) == (iatt.size, iatt.mtime, iatt.ctime, iatt.mode)
    })
}

/// The first `size` bytes of `file`, if they all came and `same` holds
/// for the file's attributes after reading (nothing changed it meanwhile).
pub(super) fn read_unchanged(
    file: BorrowedFd<'_>,
    size: u64,
    same: impl FnOnce(&libc::stat) -> bool,
) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; usize::try_from(size).ok()?];
    let n = sys::pread_full(file, &mut buf, 0).ok()?;
    let st = sys::fstat(file).ok()?;
    (n == buf.len() && same(&st)).then_some(buf)
}

/// Largest readdir `size` honoured.
pub(super) const MAX_READDIR: usize = 4 << 20;

pub(super) fn file_type(d_type: u8) -> FileType {
    match d_type {
        libc::DT_REG => FileType::Regular,
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_BLK => FileType::BlockDev,
        libc::DT_CHR => FileType::CharDev,
        libc::DT_FIFO => FileType::Fifo,
        libc::DT_SOCK => FileType::Socket,
        _ => FileType::Unknown,
    }
}

/// The gfid a creating fop asked for in its xdata.
pub(super) fn gfid_req(xdata: &Dict) -> Sys<Option<Gfid>> {
    let g = match xdata.get(GFID_REQ) {
        None => return Ok(None),
        Some(Value::Gfid(g)) => *g,
        Some(Value::Bytes(b)) => Gfid(<[u8; 16]>::try_from(b.as_ref()).map_err(|_| Errno::EINVAL)?),
        Some(Value::Str(s)) => Gfid::parse(s).ok_or(Errno::EINVAL)?,
        Some(_) => return Err(Errno::EINVAL),
    };
    Ok((!g.is_null()).then_some(g))
}

/// The xattrs a creating fop's xdata asks to be set on the new inode as it
/// is made: keys under [`CREATE_XATTR_PREFIX`] with byte or string values
/// (cluster/distribute's link files get their `linkto` this way, so no
/// lookup sees a link file without it over the network).
pub(super) fn create_xattrs(xdata: &Dict) -> Vec<(CString, Vec<u8>)> {
    xdata
        .iter()
        .filter(|(k, _)| k.starts_with(CREATE_XATTR_PREFIX))
        .filter_map(|(k, v)| {
            let v = match v {
                Value::Bytes(b) => b.to_vec(),
                Value::Str(s) => s.as_bytes().to_vec(),
                _ => return None,
            };
            Some((cstr(k.as_bytes()).ok()?, v))
        })
        .collect()
}

/// What a creating fop makes.
pub(super) enum Make<'a> {
    File { flags: i32 },
    Dir,
    Node { fmt: u32, rdev: u64 },
    Symlink(&'a std::ffi::CStr),
}

impl Inner {
    pub(super) fn lookup(&self, loc: &Loc, xdata: &Dict) -> FopResult {
        let (node, postparent) = if loc.is_entry() {
            let parent = self.dir(loc.parent)?;
            let o = EntryOpts { gfid_req: gfid_req(xdata)?, dots: true, check_handle: true, locked: false };
            let node = self.brick.lookup_entry(&parent, &loc.name, o)?;
            if !loc.gfid.is_null() && node.gfid != loc.gfid {
                return Err(Errno::ESTALE);
            }
            let pp = self.node_iatt(&parent)?;
            (node, pp)
        } else if !loc.gfid.is_null() {
            (self.resolve_gfid(loc.gfid)?, Iatt::default())
        } else {
            return Err(Errno::EINVAL);
        };
        let mut rsp = Response::from(Reply::Entry { iatt: iatt(&node.st, node.gfid), postparent });
        rsp.xdata = self.fill_xdata(self.brick.target(&node), node.gfid, xdata);
        if let Some(max) = xdata.get_u64(CONTENT)
            && let Some(data) = self.small_content(&node, max)
        {
            rsp.xdata.set_bytes(CONTENT, data);
        }
        Ok(rsp)
    }

    /// The whole content of a regular file no larger than `max` (for
    /// [`CONTENT`] on lookup), or None when it is not one, is larger than
    /// a dict value may be on the wire, or changed while being read (the
    /// reply's attributes must describe the bytes).
    pub(super) fn small_content(&self, node: &Node, max: u64) -> Option<Bytes> {
        let size = u64::try_from(node.st.st_size).ok()?;
        let cap = xlfs_sdk::abi::Limits::DEFAULT.max_string as u64;
        if node.fmt() != libc::S_IFREG || size > max.min(cap) {
            return None;
        }
        let same = |st: &libc::stat| {
            (st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec)
                == (
                    node.st.st_ino,
                    node.st.st_size,
                    node.st.st_mtime,
                    node.st.st_mtime_nsec,
                    node.st.st_ctime,
                    node.st.st_ctime_nsec,
                )
        };
        let file = sys::openat(self.brick.gfs(), node.handle(), libc::O_RDONLY | libc::O_NOFOLLOW, 0).ok()?;
        read_unchanged(file.as_fd(), size, same).map(Bytes::from)
    }

    /// Creates an inode at `loc` with the requested gfid, the caller as
    /// owner and exactly `perm` (the brick process's umask does not apply),
    /// and its handle. Returns it, the parent's attributes after, and for a
    /// file the open descriptor.
    pub(super) fn create_entry(
        &self,
        ctx: &CallCtx,
        loc: &Loc,
        xdata: &Dict,
        mode: u32,
        make: Make<'_>,
    ) -> Sys<(Node, Iatt, Option<OwnedFd>)> {
        let (parent, cname) = self.entry(loc, Errno::EPERM)?;
        let pfd = parent.dir_fd()?;
        let gfid = gfid_req(xdata)?.unwrap_or_else(Gfid::random);
        if gfid == Gfid::ROOT {
            return Err(Errno::EINVAL);
        }
        let _l = self.brick.entry_locks.lock_all(&[&[&parent.gfid.0, loc.name.as_bytes()]]);
        // A gfid already in use on this brick shows when its handle cannot
        // be made (EEXIST): not looked up first, as that lookup takes the
        // handle directory's lock once more per create, and the handles of a
        // directory's files share one handle directory (`Gfid::random_in`).
        let _i = self.brick.inode_locks.lock_all(&[&[&gfid.0]]);
        let perm = mode & 0o7777;
        let is_dir = matches!(make, Make::Dir);
        let is_lnk = matches!(make, Make::Symlink(_));
        let file = match make {
            Make::File { flags } => Some(sys::openat(pfd, &cname, flags | libc::O_CREAT | libc::O_EXCL, perm)?),
            Make::Dir => {
                sys::mkdirat(pfd, &cname, perm)?;
                None
            }
            Make::Node { fmt, rdev } => {
                sys::mknodat(pfd, &cname, fmt | perm, rdev)?;
                None
            }
            Make::Symlink(target) => {
                sys::symlinkat(target, pfd, &cname)?;
                None
            }
        };
        let handle_made = std::cell::Cell::new(false);
        let finish = || -> Sys<Node> {
            let dir = if is_dir {
                Some(Arc::new(sys::openat(pfd, &cname, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?))
            } else {
                None
            };
            let t = match (&dir, &file) {
                (Some(d), _) => Target::Fd(d.as_fd()),
                (None, Some(f)) => Target::Fd(f.as_fd()),
                (None, None) => Target::At(pfd, &cname),
            };
            t.setxattr(&CString::new(GFID_XATTR).unwrap_or_default(), &gfid.0, libc::XATTR_CREATE)?;
            for (k, v) in create_xattrs(xdata) {
                t.setxattr(&k, &v, 0)?;
            }
            let sgid = parent.st.st_mode & libc::S_ISGID != 0;
            let gid = if sgid { parent.st.st_gid } else { ctx.gid };
            let mut st = t.stat()?;
            if st.st_uid != ctx.uid || st.st_gid != gid {
                match t.chown(Some(ctx.uid), Some(gid)) {
                    Err(Errno::EPERM) if !sys::is_root() => {
                        tracing::debug!(name = %loc.name, "not root: new inode keeps the brick's owner");
                    }
                    r => r?,
                }
                // A chown may clear the set-id bits: see the mode as it is now.
                st = t.stat()?;
            }
            if !is_lnk {
                let want = perm | if is_dir && sgid { libc::S_ISGID } else { 0 };
                if st.st_mode & 0o7777 != want {
                    match t {
                        Target::Fd(fd) => sys::fchmod(fd, want)?,
                        Target::At(d, p) => sys::chmod_at_nofollow(d, p, want)?,
                    }
                }
            }
            match &dir {
                Some(_) => self.brick.make_dir_handle(&gfid, &parent.gfid, cname.as_bytes()),
                None => self.brick.make_link_handle(&gfid, pfd, &cname),
            }
            .inspect_err(|e| {
                if *e == Errno::EEXIST {
                    tracing::warn!(%gfid, name = %loc.name, "create refused: the requested gfid is in use on this brick");
                }
            })?;
            handle_made.set(true);
            match (dir, &file) {
                (Some(d), _) => self.brick.dir_node(gfid, d),
                (None, Some(f)) => Ok(self.brick.file_node(gfid, sys::fstat(f.as_fd())?)),
                (None, None) => self.brick.handle_node(gfid),
            }
        };
        match finish() {
            Ok(node) => Ok((node, self.node_iatt(&parent)?, file)),
            Err(e) => {
                let _ = sys::unlinkat(pfd, &cname, if is_dir { libc::AT_REMOVEDIR } else { 0 });
                // Another inode's handle (EEXIST above) stays.
                if handle_made.get() {
                    let _ = self.brick.remove_handle(&gfid);
                }
                Err(e)
            }
        }
    }

    pub(super) fn create(&self, ctx: &CallCtx, loc: &Loc, xdata: &Dict, flags: u32, mode: u32, id: FdId) -> FopResult {
        let r = self.reserve(id)?;
        let oflags = open_flags(flags);
        let (node, postparent, file) = match self.create_entry(ctx, loc, xdata, mode, Make::File { flags: oflags }) {
            Ok((n, pp, Some(f))) => (n, pp, f),
            Ok(_) => return Err(Errno::EIO),
            Err(Errno::EEXIST) if flags as i32 & libc::O_EXCL == 0 => {
                // Open what is there, as open(2) with O_CREAT does.
                let (parent, _) = self.entry(loc, Errno::EPERM)?;
                let o = EntryOpts { gfid_req: gfid_req(xdata)?, ..EntryOpts::default() };
                let n = match self.brick.lookup_entry(&parent, &loc.name, o) {
                    Err(Errno::ENOENT) => return Err(Errno::EEXIST),
                    r => r?,
                };
                openable(&n)?;
                let f = sys::openat(self.brick.gfs(), n.handle(), oflags, 0)?;
                let pp = self.node_iatt(&parent)?;
                (self.brick.handle_node(n.gfid)?, pp, f)
            }
            Err(e) => return Err(e),
        };
        let gfid = node.gfid;
        r.commit(self.open_fd(file, gfid, false, oflags, ctx))?;
        ok(Reply::Entry { iatt: iatt(&node.st, gfid), postparent })
    }

    /// Unlink or rmdir.
    pub(super) fn remove(&self, loc: &Loc, is_rmdir: bool) -> FopResult {
        let (parent, cname) = self.entry(loc, Errno::ENOENT)?;
        let _l = self.brick.entry_locks.lock_all(&[&[&parent.gfid.0, loc.name.as_bytes()]]);
        let node = self.brick.lookup_entry(&parent, &loc.name, EntryOpts { locked: true, ..EntryOpts::default() })?;
        match (is_rmdir, node.is_dir()) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            _ => {}
        }
        if !loc.gfid.is_null() && loc.gfid != node.gfid {
            return Err(Errno::ESTALE);
        }
        // The parent as resolved, a moment ago, is its state before.
        let pre = iatt(&parent.st, parent.gfid);
        sys::unlinkat(parent.dir_fd()?, &cname, if is_rmdir { libc::AT_REMOVEDIR } else { 0 })?;
        {
            let _i = self.brick.inode_locks.lock_all(&[&[&node.gfid.0]]);
            if is_rmdir {
                if let Err(e) = self.brick.remove_handle(&node.gfid) {
                    tracing::warn!(gfid = %node.gfid, error = %e, "cannot remove a removed directory's handle");
                }
            } else {
                self.forget_if_nameless(node.gfid);
            }
        }
        ok(Reply::Parent { pre, post: self.node_iatt(&parent)? })
    }

    pub(super) fn rename(&self, old: &Loc, new: &Loc, flags: u32) -> FopResult {
        use rename_flags::{EXCHANGE, NOREPLACE};
        if flags & !(EXCHANGE | NOREPLACE) != 0 || flags == EXCHANGE | NOREPLACE {
            return Err(Errno::EINVAL);
        }
        let (op, ocn) = self.entry(old, Errno::ENOENT)?;
        let (np, ncn) = self.entry(new, Errno::EPERM)?;
        let _l =
            self.brick.entry_locks.lock_all(&[&[&op.gfid.0, old.name.as_bytes()], &[&np.gfid.0, new.name.as_bytes()]]);
        let o = EntryOpts { locked: true, ..EntryOpts::default() };
        let src = self.brick.lookup_entry(&op, &old.name, o)?;
        if !old.gfid.is_null() && old.gfid != src.gfid {
            return Err(Errno::ESTALE);
        }
        let dst = match self.brick.lookup_entry(&np, &new.name, o) {
            Ok(n) => Some(n),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(e),
        };
        sys::renameat2(op.dir_fd()?, &ocn, np.dir_fd()?, &ncn, flags)?;
        let dst = dst.filter(|d| d.gfid != src.gfid);
        let mut keys: Vec<&[&[u8]]> = Vec::new();
        let src_key: [&[u8]; 1] = [&src.gfid.0];
        keys.push(&src_key);
        let dst_key: Option<[&[u8]; 1]> = dst.as_ref().map(|d| [&d.gfid.0[..]]);
        if let Some(k) = &dst_key {
            keys.push(k);
        }
        let _i = self.brick.inode_locks.lock_all(&keys);
        let fix = |r: Sys<()>, g: Gfid| {
            if let Err(e) = r {
                tracing::warn!(gfid = %g, error = %e, "rename: cannot update a handle (the next lookup repairs it)");
            }
        };
        if src.is_dir() {
            fix(self.brick.rewrite_dir_handle(&src.gfid, &np.gfid, new.name.as_bytes()), src.gfid);
        }
        if let Some(d) = &dst {
            if flags & EXCHANGE != 0 {
                if d.is_dir() {
                    fix(self.brick.rewrite_dir_handle(&d.gfid, &op.gfid, old.name.as_bytes()), d.gfid);
                }
            } else if d.is_dir() {
                fix(self.brick.remove_handle(&d.gfid), d.gfid);
            } else {
                self.forget_if_nameless(d.gfid);
            }
        }
        ok(Reply::Rename { iatt: self.node_iatt(&src)? })
    }

    /// Readdir, or with `xattrs` readdirp: then the entries carry their
    /// attributes and the returned dict the named xattrs of each entry
    /// (see the module docs).
    pub(super) fn readdir(
        &self,
        f: &OpenFd,
        size: u32,
        offset: u64,
        plus: Option<(&[(&str, CString)], u64)>,
    ) -> Sys<(Vec<DirEntry>, Dict)> {
        let (xattrs, content_max) = plus.unwrap_or((&[], 0));
        let plus = plus.is_some();
        let mut content_used = 0usize;
        let mut found = Dict::new();
        let mut keys_used = 0usize;
        if !f.dir {
            return Err(Errno::ENOTDIR);
        }
        let fd = f.fd.as_fd();
        let _g = f.lock.lock();
        // d_off cookies are opaque 64-bit values; the kernel takes them back
        // bit for bit.
        sys::lseek(fd, offset as libc::off_t, libc::SEEK_SET)?;
        let limit = (size as usize).min(MAX_READDIR);
        let at_root = f.gfid == Gfid::ROOT;
        let mut buf = vec![0u8; 32 * 1024];
        let (mut used, mut out) = (0usize, Vec::new());
        'fill: loop {
            let n = sys::getdents(fd, &mut buf)?;
            if n == 0 {
                break;
            }
            for e in sys::parse_dirents(&buf[..n])? {
                if at_root && e.name == handle::HIDDEN.as_bytes() {
                    continue;
                }
                let Ok(name) = std::str::from_utf8(e.name) else {
                    tracing::warn!(name = %String::from_utf8_lossy(e.name), "readdir: skipping a name that is not UTF-8");
                    continue;
                };
                let cost = ENTRY_OVERHEAD + name.len() + 1;
                if !out.is_empty() && used + cost > limit {
                    break 'fill;
                }
                let mut values: Vec<(String, Vec<u8>)> = Vec::new();
                // The gfid below is read only if listed too.
                let mut present = None;
                if !xattrs.is_empty()
                    && name != "."
                    && name != ".."
                    && let Ok(cname) = cstr(name.as_bytes())
                {
                    let t = Target::At(fd, &cname);
                    present = t.names_if_several(xattrs.len());
                    for (xname, c) in xattrs {
                        if sys::has_xattr(present.as_deref(), c.to_bytes())
                            && let Ok(v) = t.getxattr(c)
                        {
                            values.push((keys::dirent_xattr(name, xname), v));
                        }
                    }
                }
                if !out.is_empty() && keys_used + values.len() > MAX_DIRENT_XATTR_KEYS {
                    break 'fill;
                }
                keys_used += values.len();
                for (k, v) in values {
                    found.set_bytes(k, v);
                }
                used += cost;
                let mut d_type = file_type(e.d_type);
                let iatt = if plus || d_type == FileType::Unknown {
                    self.child_iatt(fd, f.gfid, name, present.as_deref()).unwrap_or_default()
                } else {
                    Iatt::default()
                };
                if d_type == FileType::Unknown {
                    d_type = iatt.file_type();
                }
                if content_max > 0
                    && d_type == FileType::Regular
                    && iatt.size <= content_max
                    && content_used + iatt.size as usize <= MAX_DIRENT_CONTENT
                    && let Some(data) = entry_content(fd, name, &iatt)
                {
                    content_used += data.len();
                    found.set_bytes(keys::dirent_xattr(name, CONTENT), data);
                }
                out.push(DirEntry {
                    name: name.to_string(),
                    d_off: e.d_off,
                    d_type,
                    iatt: if plus { iatt } else { Iatt::default() },
                });
            }
        }
        if !xattrs.is_empty() {
            found.set_u64(keys::DIRENT_XATTRS, xattrs.len() as u64);
        }
        Ok((out, found))
    }

    /// Attributes of `name` in the open directory `dir` (readdirp), given
    /// the names of its xattrs if listed already.
    pub(super) fn child_iatt(
        &self,
        dir: BorrowedFd<'_>,
        dir_gfid: Gfid,
        name: &str,
        present: Option<&[Vec<u8>]>,
    ) -> Sys<Iatt> {
        if name == "." || (name == ".." && dir_gfid == Gfid::ROOT) {
            return Ok(iatt(&sys::fstat(dir)?, dir_gfid));
        }
        let cname = cstr(name.as_bytes())?;
        let st = sys::fstatat(dir, &cname, 0)?;
        let gfid = if sys::has_xattr(present, xlfs_sdk::dict::keys::GFID_XATTR.as_bytes()) {
            read_gfid(Target::At(dir, &cname)).ok().flatten().unwrap_or(Gfid::NULL)
        } else {
            Gfid::NULL
        };
        Ok(iatt(&st, gfid))
    }
}
