//! The in-process client API, like GlusterFS's libgfapi: path-based file
//! operations over the top of a translator graph, without FUSE or a network.
//! Tests, benchmarks and examples use it.
//!
//! Paths are resolved from the volume root by a `lookup` per component, so
//! the client never serves stale names; `..` walks back up the resolved path.
//! A [`File`] is an open fd; [`File::close`] flushes and releases it (a file
//! dropped without `close` is released in the background).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use xlfs_sdk::types::rename_flags;
use xlfs_sdk::{
    CallCtx, Child, Dict, DirEntry, EntrylkCmd, EntrylkType, Errno, Fd, FdId, Flock, Fop, Gfid, Iatt, LkCmd, Loc,
    Reply, Request, Response, SetAttr, Statvfs, Value,
};

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

struct Shared {
    top: Child,
    next_fd: AtomicU64,
}

/// A client of one graph: cheap to clone; clones share fd numbering and
/// may carry different lock owners ([`Client::with_lk_owner`]).
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    ctx: CallCtx,
}

/// A resolved path: the inode's gfid and its parent entry.
#[derive(Clone, Debug)]
struct Resolved {
    parent: Gfid,
    name: String,
    iatt: Iatt,
}

impl Client {
    /// A client over `top`, calling as root with a fresh client id.
    pub fn new(top: Child) -> Client {
        let id = format!("api-{}-{}", std::process::id(), NEXT_CLIENT.fetch_add(1, Ordering::Relaxed));
        Client::with_ctx(top, CallCtx::root(id))
    }

    /// A client over `top` calling with `ctx`.
    pub fn with_ctx(top: Child, ctx: CallCtx) -> Client {
        Client { shared: Arc::new(Shared { top, next_fd: AtomicU64::new(1) }), ctx }
    }

    /// The same client with another lock owner: POSIX locks and inodelks of
    /// different owners conflict.
    pub fn with_lk_owner(&self, owner: u64) -> Client {
        Client { shared: self.shared.clone(), ctx: self.ctx.with_lk_owner(owner) }
    }

    /// The same client calling with pid `pid` (a daemon's, such as
    /// [`CallCtx::SELF_HEAL_PID`]).
    pub fn with_pid(&self, pid: u32) -> Client {
        Client { shared: self.shared.clone(), ctx: CallCtx { pid, ..self.ctx.clone() } }
    }

    /// The caller identity this client uses.
    pub fn ctx(&self) -> &CallCtx {
        &self.ctx
    }

    /// Sends one fop to the top of the graph.
    pub async fn call(&self, fop: Fop) -> Result<Response, Errno> {
        self.call_x(fop, Dict::new()).await
    }

    /// Sends one fop with xdata.
    pub async fn call_x(&self, fop: Fop, xdata: Dict) -> Result<Response, Errno> {
        self.shared.top.call(self.ctx.clone(), Request::with_xdata(fop, xdata)).await
    }

    async fn reply(&self, fop: Fop) -> Result<Reply, Errno> {
        Ok(self.call(fop).await?.reply)
    }

    fn new_fd(&self) -> FdId {
        FdId(self.shared.next_fd.fetch_add(1, Ordering::Relaxed))
    }

    async fn lookup_entry(&self, parent: Gfid, name: &str) -> Result<Iatt, Errno> {
        Ok(self.reply(Fop::Lookup { loc: Loc::entry(parent, name) }).await?.into_entry()?)
    }

    async fn root_iatt(&self) -> Result<Iatt, Errno> {
        Ok(self.reply(Fop::Lookup { loc: Loc::root() }).await?.into_entry()?)
    }

    /// Resolves a path; `/` and `` are the root.
    async fn resolve(&self, path: &str) -> Result<Resolved, Errno> {
        let mut stack: Vec<Resolved> =
            vec![Resolved { parent: Gfid::NULL, name: String::new(), iatt: self.root_iatt().await? }];
        for comp in path.split('/') {
            match comp {
                "" | "." => continue,
                ".." => {
                    if stack.len() > 1 {
                        stack.pop();
                    }
                }
                name => {
                    let Some(cur) = stack.last() else { return Err(Errno::EIO) };
                    if !cur.iatt.is_dir() {
                        return Err(Errno::ENOTDIR);
                    }
                    let parent = cur.iatt.gfid;
                    let iatt = self.lookup_entry(parent, name).await?;
                    stack.push(Resolved { parent, name: name.to_string(), iatt });
                }
            }
        }
        stack.pop().ok_or(Errno::EIO)
    }

    /// Resolves everything but the last component: (parent gfid, name).
    async fn resolve_parent(&self, path: &str) -> Result<(Gfid, String), Errno> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = match trimmed.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => ("", trimmed),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(Errno::EINVAL);
        }
        let parent = self.resolve(dir).await?;
        if !parent.iatt.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok((parent.iatt.gfid, name.to_string()))
    }

    async fn loc(&self, path: &str) -> Result<Loc, Errno> {
        let r = self.resolve(path).await?;
        Ok(Loc { gfid: r.iatt.gfid, parent: r.parent, name: r.name })
    }

    async fn entry_loc(&self, path: &str) -> Result<Loc, Errno> {
        let (parent, name) = self.resolve_parent(path).await?;
        Ok(Loc::entry(parent, name))
    }

    /// xdata for a fop that makes an inode in `parent` (see [`Gfid::random_in`]).
    fn new_entry_xdata(parent: Gfid) -> Dict {
        Dict::new().with(xlfs_sdk::dict::keys::GFID_REQ, Value::Gfid(Gfid::random_in(parent)))
    }

    async fn entry_reply(&self, fop: Fop) -> Result<Iatt, Errno> {
        let x = Self::new_entry_xdata(fop.parent());
        Ok(self.call_x(fop, x).await?.reply.into_entry()?)
    }

    /// Attributes of a path (following nothing: a symlink's own attributes).
    pub async fn stat(&self, path: &str) -> Result<Iatt, Errno> {
        Ok(self.resolve(path).await?.iatt)
    }

    /// Creates a directory.
    pub async fn mkdir(&self, path: &str, mode: u32) -> Result<Iatt, Errno> {
        let loc = self.entry_loc(path).await?;
        self.entry_reply(Fop::Mkdir { loc, mode, umask: 0 }).await
    }

    /// Removes an empty directory.
    pub async fn rmdir(&self, path: &str) -> Result<(), Errno> {
        let loc = self.loc(path).await?;
        self.reply(Fop::Rmdir { loc, flags: 0 }).await.map(drop)
    }

    /// Removes a name.
    pub async fn unlink(&self, path: &str) -> Result<(), Errno> {
        let loc = self.loc(path).await?;
        self.reply(Fop::Unlink { loc, flags: 0 }).await.map(drop)
    }

    /// Renames `from` to `to`, replacing `to` if it exists.
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), Errno> {
        self.rename_flags(from, to, 0).await
    }

    /// Renames with [`rename_flags`] (NOREPLACE, EXCHANGE).
    pub async fn rename_flags(&self, from: &str, to: &str, flags: u32) -> Result<(), Errno> {
        let old = self.loc(from).await?;
        let mut new = self.entry_loc(to).await?;
        if flags & rename_flags::EXCHANGE != 0 {
            new = self.loc(to).await?;
        }
        self.reply(Fop::Rename { old, new, flags }).await.map(drop)
    }

    /// Makes `new` a hard link to `existing`.
    pub async fn link(&self, existing: &str, new: &str) -> Result<Iatt, Errno> {
        let old = self.loc(existing).await?;
        let new = self.entry_loc(new).await?;
        Ok(self.reply(Fop::Link { old, new }).await?.into_entry()?)
    }

    /// Creates a symlink at `path` pointing to `target`.
    pub async fn symlink(&self, target: &str, path: &str) -> Result<Iatt, Errno> {
        let loc = self.entry_loc(path).await?;
        self.entry_reply(Fop::Symlink { target: target.to_string(), loc, umask: 0 }).await
    }

    /// Reads a symlink's target.
    pub async fn readlink(&self, path: &str) -> Result<String, Errno> {
        let loc = self.loc(path).await?;
        Ok(self.reply(Fop::Readlink { loc, size: 4096 }).await?.into_readlink()?)
    }

    /// Sets a file's size.
    pub async fn truncate(&self, path: &str, size: u64) -> Result<(), Errno> {
        let loc = self.loc(path).await?;
        self.reply(Fop::Truncate { loc, offset: size }).await.map(drop)
    }

    /// Changes attributes.
    pub async fn setattr(&self, path: &str, attr: SetAttr) -> Result<Iatt, Errno> {
        let loc = self.loc(path).await?;
        Ok(self.reply(Fop::Setattr { loc, attr }).await?.into_post()?)
    }

    /// Sets one extended attribute (`flags` from [`xlfs_sdk::types::xattr_flags`]).
    pub async fn setxattr(&self, path: &str, name: &str, value: &[u8], flags: u32) -> Result<(), Errno> {
        let loc = self.loc(path).await?;
        let mut xattrs = Dict::new();
        xattrs.set_bytes(name, Bytes::copy_from_slice(value));
        self.reply(Fop::Setxattr { loc, xattrs, flags }).await.map(drop)
    }

    /// Reads one extended attribute.
    pub async fn getxattr(&self, path: &str, name: &str) -> Result<Bytes, Errno> {
        let loc = self.loc(path).await?;
        self.reply(Fop::Getxattr { loc, name: name.to_string() })
            .await?
            .into_xattrs()?
            .get_bytes(name)
            .ok_or(Errno::ENODATA)
    }

    /// Lists the extended attributes (all names and values).
    pub async fn listxattr(&self, path: &str) -> Result<Dict, Errno> {
        let loc = self.loc(path).await?;
        Ok(self.reply(Fop::Getxattr { loc, name: String::new() }).await?.into_xattrs()?)
    }

    /// Removes an extended attribute.
    pub async fn removexattr(&self, path: &str, name: &str) -> Result<(), Errno> {
        let loc = self.loc(path).await?;
        self.reply(Fop::Removexattr { loc, name: name.to_string() }).await.map(drop)
    }

    /// Filesystem statistics.
    pub async fn statfs(&self) -> Result<Statvfs, Errno> {
        Ok(self.reply(Fop::Statfs { loc: Loc::root() }).await?.into_statfs()?)
    }

    /// Creates (or, without `O_EXCL`, opens) a regular file.
    pub async fn create(&self, path: &str, flags: i32, mode: u32) -> Result<File, Errno> {
        let loc = self.entry_loc(path).await?;
        let id = self.new_fd();
        let x = Self::new_entry_xdata(loc.parent);
        let fop = Fop::Create { loc, flags: (flags | libc::O_CREAT) as u32, mode, umask: 0, fd: id };
        match self.call_x(fop, x).await {
            Ok(r) => Ok(self.file(id, r.reply.into_entry()?.gfid, false)),
            Err(Errno::EEXIST) if flags & libc::O_EXCL == 0 => self.open(path, flags & !libc::O_CREAT).await,
            Err(e) => Err(e),
        }
    }

    /// Opens an existing file with `O_*` flags.
    pub async fn open(&self, path: &str, flags: i32) -> Result<File, Errno> {
        let loc = self.loc(path).await?;
        let gfid = loc.gfid;
        let id = self.new_fd();
        self.reply(Fop::Open { loc, flags: flags as u32, fd: id }).await?;
        Ok(self.file(id, gfid, false))
    }

    fn file(&self, id: FdId, gfid: Gfid, dir: bool) -> File {
        File { client: self.clone(), fd: Fd { id, gfid }, dir, closed: false }
    }

    /// Lists a directory (readdirp), without `.` and `..`.
    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>, Errno> {
        let loc = self.loc(path).await?;
        let gfid = loc.gfid;
        let id = self.new_fd();
        self.reply(Fop::Opendir { loc, fd: id }).await?;
        let mut dir = self.file(id, gfid, true);
        let res = dir.read_all_entries().await;
        let closed = dir.close().await;
        let mut out = res?;
        closed?;
        out.retain(|e| e.name != "." && e.name != "..");
        Ok(out)
    }

    /// Takes, tests or releases an internal inode lock in `domain`.
    pub async fn inodelk(&self, path: &str, domain: &str, cmd: LkCmd, lock: Flock) -> Result<Response, Errno> {
        let loc = self.loc(path).await?;
        self.call(Fop::Inodelk { domain: domain.to_string(), loc, cmd, lock }).await
    }

    /// Takes or releases an entry lock on `name` in directory `dir`.
    pub async fn entrylk(
        &self,
        dir: &str,
        domain: &str,
        name: &str,
        cmd: EntrylkCmd,
        ty: EntrylkType,
    ) -> Result<(), Errno> {
        let loc = self.loc(dir).await?;
        self.reply(Fop::Entrylk { domain: domain.to_string(), loc, name: name.to_string(), cmd, ty }).await.map(drop)
    }
}

/// An open file or directory.
pub struct File {
    client: Client,
    fd: Fd,
    dir: bool,
    closed: bool,
}

impl File {
    /// The fd as fops name it.
    pub fn fd(&self) -> Fd {
        self.fd
    }

    /// The file's gfid.
    pub fn gfid(&self) -> Gfid {
        self.fd.gfid
    }

    async fn reply(&self, fop: Fop) -> Result<Reply, Errno> {
        self.client.reply(fop).await
    }

    /// Reads up to `size` bytes at `offset`; fewer at end of file.
    pub async fn read(&self, offset: u64, size: u32) -> Result<Bytes, Errno> {
        Ok(self.reply(Fop::Readv { fd: self.fd, size, offset, flags: 0 }).await?.into_read()?)
    }

    /// Writes all of `data` at `offset`; returns the file's attributes after.
    pub async fn write(&self, offset: u64, data: impl Into<Bytes>) -> Result<Iatt, Errno> {
        Ok(self.reply(Fop::Writev { fd: self.fd, data: data.into(), offset, flags: 0 }).await?.into_post()?)
    }

    /// Attributes of the open file.
    pub async fn stat(&self) -> Result<Iatt, Errno> {
        Ok(self.reply(Fop::Fstat { fd: self.fd }).await?.into_attr()?)
    }

    /// Sets the size.
    pub async fn truncate(&self, size: u64) -> Result<(), Errno> {
        self.reply(Fop::Ftruncate { fd: self.fd, offset: size }).await.map(drop)
    }

    /// Flushes to stable storage.
    pub async fn fsync(&self, datasync: bool) -> Result<(), Errno> {
        self.reply(Fop::Fsync { fd: self.fd, datasync }).await.map(drop)
    }

    /// A POSIX record lock call (fcntl F_GETLK/F_SETLK/F_SETLKW) under the
    /// client's lock owner. Returns the granted lock, or for GETLK the
    /// conflicting one (type Unlock if none).
    pub async fn lk(&self, cmd: LkCmd, mut lock: Flock) -> Result<Flock, Errno> {
        lock.owner = self.client.ctx.lk_owner;
        Ok(self.reply(Fop::Lk { fd: self.fd, cmd, lock }).await?.into_lock()?)
    }

    /// Sets xattrs on the open file.
    pub async fn fsetxattr(&self, xattrs: Dict, flags: u32) -> Result<(), Errno> {
        self.reply(Fop::Fsetxattr { fd: self.fd, xattrs, flags }).await.map(drop)
    }

    async fn read_all_entries(&mut self) -> Result<Vec<DirEntry>, Errno> {
        let mut out = Vec::new();
        let mut offset = 0;
        loop {
            let batch = self.reply(Fop::Readdirp { fd: self.fd, size: 128 * 1024, offset }).await?.into_dirents()?;
            let Some(last) = batch.last() else { return Ok(out) };
            offset = last.d_off;
            out.extend(batch);
        }
    }

    /// Flushes (for files) and releases the fd.
    pub async fn close(mut self) -> Result<(), Errno> {
        self.closed = true;
        let flushed = if self.dir { Ok(Reply::Empty) } else { self.reply(Fop::Flush { fd: self.fd }).await };
        let release = if self.dir { Fop::Releasedir { fd: self.fd } } else { Fop::Release { fd: self.fd } };
        let released = self.reply(release).await;
        flushed?;
        released.map(drop)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let fop = if self.dir { Fop::Releasedir { fd: self.fd } } else { Fop::Release { fd: self.fd } };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            rt.spawn(async move {
                let _ = client.call(fop).await;
            });
        }
    }
}

/// Re-exported so callers can build lock requests and flags.
pub use xlfs_sdk::LockType;
