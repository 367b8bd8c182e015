//! Names and attributes: lookup, getattr, setattr, readlink, the
//! entry-making fops (mknod, mkdir, symlink, link), unlink, rmdir, rename,
//! statfs, access and the xattr calls.

use std::sync::Arc;

use bytes::Bytes;
use fuser::{FileAttr, FileHandle, INodeNo, TimeOrNow};
use xlfs_sdk::dict::keys::{FRESH_LOOKUP, GFID_REQ};
use xlfs_sdk::types::rename_flags;
use xlfs_sdk::{Dict, Errno, FileType, Fop, Gfid, Iatt, Loc, SetAttr, Statvfs, TimeSet, Value};

use super::{Caller, Core, timespec};

/// What a setattr asks for, copied off the request.
pub(super) struct SetattrArgs {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub fh: Option<FileHandle>,
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => TimeSet::At(timespec(st)),
    }
}

/// xattr names the bricks keep for themselves; never shown or changed
/// through the mount.
/// True when `name` is an xattr the mount does not support with its
/// options (`acl`, `selinux` off, as GlusterFS's defaults): EOPNOTSUPP.
fn unsupported_xattr(opts: &super::options::MountOptions, name: &str) -> bool {
    (!opts.acl && (name == "system.posix_acl_access" || name == "system.posix_acl_default"))
        || (!opts.selinux && name == "security.selinux")
}

fn internal_xattr(name: &str) -> bool {
    name == "trusted.gfid"
        || name.starts_with("trusted.glusterfs.")
        || name.starts_with("trusted.afr.")
        || name.starts_with("trusted.xlfs.")
}

impl Core {
    /// lookup: the entry's attributes (one more lookup for the kernel), or
    /// `None` for a miss the kernel may remember (negative timeout).
    pub(super) async fn lookup(
        self: Arc<Self>,
        who: Caller,
        parent: INodeNo,
        name: String,
    ) -> Result<Option<FileAttr>, Errno> {
        let pg = self.gfid(parent)?;
        match self.call(self.ctx(who, 0, false), Fop::Lookup { loc: Loc::entry(pg, name.clone()) }).await {
            Ok(reply) => {
                let iatt = reply.into_entry()?;
                self.no_second_name(who, pg, &name, &iatt).await?;
                self.entry_attr(pg, &name, &iatt).map(Some)
            }
            Err(Errno::ENOENT) => {
                self.inodes.unlink(pg, &name);
                if self.opts.negative_timeout.is_zero() { Err(Errno::ENOENT) } else { Ok(None) }
            }
            Err(e) => Err(e),
        }
    }

    /// An entry answered with an inode that cannot have two names (a
    /// directory, or a file with one link) which the mount knows under
    /// another: asks for that other name again, past the caches. Still the
    /// same inode there: one answer is false (a translator aliasing a
    /// sibling), so EIO for this name. Gone or another inode: it was
    /// renamed (by another client), and the old name is dropped.
    async fn no_second_name(&self, who: Caller, parent: Gfid, name: &str, iatt: &Iatt) -> Result<(), Errno> {
        let single = iatt.file_type() == FileType::Directory || iatt.nlink <= 1;
        if !single || name == "." || name == ".." {
            return Ok(());
        }
        for (p, other) in self.inodes.other_names(iatt.gfid, parent, name) {
            let mut xdata = Dict::new();
            xdata.set_u64(FRESH_LOOKUP, 1);
            let again = self.call_x(self.ctx(who, 0, false), Fop::Lookup { loc: Loc::entry(p, &*other) }, xdata).await;
            match again.and_then(|r| Ok(r.into_entry()?)) {
                Ok(i) if i.gfid == iatt.gfid => {
                    super::warn_bad_reply(format_args!(
                        "{name:?} under {parent} answered with gfid {}, which {other:?} under {p} also has: EIO",
                        iatt.gfid
                    ));
                    return Err(Errno::EIO);
                }
                Ok(_) | Err(Errno::ENOENT) => self.inodes.unlink(p, &other),
                Err(_) => {}
            }
        }
        Ok(())
    }

    pub(super) async fn getattr(
        self: Arc<Self>,
        who: Caller,
        ino: INodeNo,
        fh: Option<FileHandle>,
    ) -> Result<FileAttr, Errno> {
        // The kernel drops its attributes after each write and asks again
        // at once: performance/md-cache answers from the write's reply.
        let gfid = self.gfid(ino)?;
        let ctx = self.ctx(who, 0, false);
        let reply = match fh.map(|h| self.fd(h)) {
            Some(Ok(fd)) => self.call(ctx, Fop::Fstat { fd }).await?,
            _ => self.call(ctx, Fop::Stat { loc: Loc::gfid(gfid) }).await?,
        };
        Ok(self.kernel_attr(&reply.into_attr()?, ino.0))
    }

    /// setattr: truncate first (by fd when the kernel gives one), then the
    /// other attributes in one fop; answers with the attributes after.
    pub(super) async fn setattr(self: Arc<Self>, who: Caller, ino: INodeNo, a: SetattrArgs) -> Result<FileAttr, Errno> {
        let gfid = self.gfid(ino)?;
        let fd = a.fh.and_then(|h| self.fd(h).ok());
        if a.size.is_some() || a.mtime.is_some() {
            self.data.changing(gfid);
        }
        let mut post = None;
        if let Some(size) = a.size {
            let ctx = self.ctx(who, 0, false);
            let fop = match fd {
                Some(fd) => Fop::Ftruncate { fd, offset: size },
                None => Fop::Truncate { loc: Loc::gfid(gfid), offset: size },
            };
            post = Some(self.call(ctx, fop).await?.into_post()?);
        }
        let attr = SetAttr {
            mode: a.mode.map(|m| m & 0o7777),
            uid: a.uid,
            gid: a.gid,
            atime: a.atime.map(time_set),
            mtime: a.mtime.map(time_set),
        };
        if attr != SetAttr::default() {
            let ctx = self.ctx(who, 0, true);
            let fop = match fd {
                Some(fd) => Fop::Fsetattr { fd, attr },
                None => Fop::Setattr { loc: Loc::gfid(gfid), attr },
            };
            post = Some(self.call(ctx, fop).await?.into_post()?);
        }
        let iatt = match post {
            Some(p) => p,
            None => self.call(self.ctx(who, 0, false), Fop::Stat { loc: Loc::gfid(gfid) }).await?.into_attr()?,
        };
        Ok(self.kernel_attr(&iatt, ino.0))
    }

    pub(super) async fn readlink(self: Arc<Self>, who: Caller, ino: INodeNo) -> Result<String, Errno> {
        let loc = Loc::gfid(self.gfid(ino)?);
        Ok(self
            .call(self.ctx(who, 0, false), Fop::Readlink { loc, size: libc::PATH_MAX as u32 })
            .await?
            .into_readlink()?)
    }

    /// mknod, mkdir, symlink: `fop` builds the fop for the new entry's
    /// location; the new inode gets a gfid chosen here (as GlusterFS's FUSE
    /// bridge does, so that every replica gives it the same one).
    pub(super) async fn make_entry(
        self: Arc<Self>,
        who: Caller,
        parent: INodeNo,
        name: String,
        fop: impl FnOnce(Loc) -> Fop,
    ) -> Result<FileAttr, Errno> {
        let pg = self.gfid(parent)?;
        let xdata = new_entry_xdata(pg);
        let iatt = self.call_x(self.ctx(who, 0, true), fop(Loc::entry(pg, name.clone())), xdata).await?.into_entry()?;
        self.entry_attr(pg, &name, &iatt)
    }

    pub(super) async fn link(
        self: Arc<Self>,
        who: Caller,
        ino: INodeNo,
        newparent: INodeNo,
        name: String,
    ) -> Result<FileAttr, Errno> {
        let (g, np) = (self.gfid(ino)?, self.gfid(newparent)?);
        let fop = Fop::Link { old: Loc::gfid(g), new: Loc::entry(np, name.clone()) };
        let iatt = self.call(self.ctx(who, 0, true), fop).await?.into_entry()?;
        self.entry_attr(np, &name, &iatt)
    }

    /// unlink or rmdir.
    pub(super) async fn remove(
        self: Arc<Self>,
        who: Caller,
        parent: INodeNo,
        name: String,
        dir: bool,
    ) -> Result<(), Errno> {
        let pg = self.gfid(parent)?;
        let mut loc = Loc::entry(pg, name.clone());
        // A directory: name the inode the kernel means (a brick refuses
        // with ESTALE, and the kernel looks again, if the name is another
        // directory's by now), so that cluster/replicate can remove it under
        // the delegation it holds of it (`rm -r` unlinked its names under
        // it) instead of returning that and locking the name. A file still
        // open here: name its inode, so the translators that opened it
        // lazily (performance/open-behind) open it for real first and its
        // fds keep working after the unlink, as POSIX says.
        if let Some(g) = self.inodes.resolve(pg, &name)
            && (dir || self.fds.is_open_on(g))
        {
            loc.gfid = g;
        }
        let fop = if dir { Fop::Rmdir { loc, flags: 0 } } else { Fop::Unlink { loc, flags: 0 } };
        self.call(self.ctx(who, 0, true), fop).await?;
        if dir {
            self.inodes.rmdir(pg, &name);
        } else {
            self.inodes.unlink(pg, &name);
        }
        Ok(())
    }

    /// rename with RENAME_NOREPLACE and RENAME_EXCHANGE (the flags share
    /// their values with the fop model's); RENAME_WHITEOUT is EINVAL.
    pub(super) async fn rename(
        self: Arc<Self>,
        who: Caller,
        parent: INodeNo,
        name: String,
        newparent: INodeNo,
        newname: String,
        flags: u32,
    ) -> Result<(), Errno> {
        let known = rename_flags::NOREPLACE | rename_flags::EXCHANGE;
        if flags & !known != 0 {
            return Err(Errno::EINVAL);
        }
        let (pg, np) = (self.gfid(parent)?, self.gfid(newparent)?);
        let fop = Fop::Rename { old: Loc::entry(pg, name.clone()), new: Loc::entry(np, newname.clone()), flags };
        self.call(self.ctx(who, 0, true), fop).await?;
        if flags & rename_flags::EXCHANGE != 0 {
            self.inodes.unlink(pg, &name);
            self.inodes.unlink(np, &newname);
        } else {
            self.inodes.rename(pg, &name, np, &newname);
        }
        Ok(())
    }

    pub(super) async fn statfs(self: Arc<Self>, who: Caller, ino: INodeNo) -> Result<Statvfs, Errno> {
        let g = self.gfid(ino).unwrap_or(Gfid::ROOT);
        Ok(self.call(self.ctx(who, 0, false), Fop::Statfs { loc: Loc::gfid(g) }).await?.into_statfs()?)
    }

    pub(super) async fn access(self: Arc<Self>, who: Caller, ino: INodeNo, mask: u32) -> Result<(), Errno> {
        let loc = Loc::gfid(self.gfid(ino)?);
        self.call(self.ctx(who, 0, true), Fop::Access { loc, mask }).await.map(drop)
    }

    pub(super) async fn setxattr(
        self: Arc<Self>,
        who: Caller,
        ino: INodeNo,
        name: String,
        value: Bytes,
        flags: u32,
    ) -> Result<(), Errno> {
        if internal_xattr(&name) {
            return Err(Errno::EPERM);
        }
        if unsupported_xattr(&self.opts, &name) {
            return Err(Errno::EOPNOTSUPP);
        }
        let loc = Loc::gfid(self.gfid(ino)?);
        let mut xattrs = Dict::new();
        xattrs.set_bytes(name, value);
        let flags = flags & (xlfs_sdk::types::xattr_flags::CREATE | xlfs_sdk::types::xattr_flags::REPLACE);
        self.call(self.ctx(who, 0, true), Fop::Setxattr { loc, xattrs, flags }).await.map(drop)
    }

    /// getxattr. The kernel asks for `security.capability` before every
    /// write (to drop file capabilities) and `ls -l` for `security.selinux`
    /// and the ACL of every file: performance/md-cache answers those,
    /// their absence included, as GlusterFS's md-cache does.
    pub(super) async fn getxattr(self: Arc<Self>, who: Caller, ino: INodeNo, name: String) -> Result<Vec<u8>, Errno> {
        if internal_xattr(&name) {
            return Err(Errno::ENODATA);
        }
        if unsupported_xattr(&self.opts, &name) {
            return Err(Errno::EOPNOTSUPP);
        }
        let loc = Loc::gfid(self.gfid(ino)?);
        let d = self.call(self.ctx(who, 0, true), Fop::Getxattr { loc, name: name.clone() }).await?.into_xattrs()?;
        d.get(&name).map(value_bytes).ok_or(Errno::ENODATA)
    }

    /// listxattr: the names, each NUL-terminated, without the bricks' own.
    pub(super) async fn listxattr(self: Arc<Self>, who: Caller, ino: INodeNo) -> Result<Vec<u8>, Errno> {
        let loc = Loc::gfid(self.gfid(ino)?);
        let d = self.call(self.ctx(who, 0, true), Fop::Getxattr { loc, name: String::new() }).await?.into_xattrs()?;
        let mut out = Vec::new();
        for k in d.keys().filter(|k| !internal_xattr(k) && !unsupported_xattr(&self.opts, k)) {
            out.extend_from_slice(k.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    pub(super) async fn removexattr(self: Arc<Self>, who: Caller, ino: INodeNo, name: String) -> Result<(), Errno> {
        if internal_xattr(&name) {
            return Err(Errno::EPERM);
        }
        if unsupported_xattr(&self.opts, &name) {
            return Err(Errno::EOPNOTSUPP);
        }
        let loc = Loc::gfid(self.gfid(ino)?);
        self.call(self.ctx(who, 0, true), Fop::Removexattr { loc, name }).await.map(drop)
    }
}

/// xdata for a fop that makes an inode in directory `parent`: the gfid it
/// must get ([`Gfid::random_in`]: the handles of a directory's files share a
/// handle directory on the bricks).
pub(super) fn new_entry_xdata(parent: Gfid) -> Dict {
    Dict::new().with(GFID_REQ, Value::Gfid(Gfid::random_in(parent)))
}

/// An xattr value's bytes.
fn value_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::Bytes(b) => b.to_vec(),
        Value::Str(s) => s.as_bytes().to_vec(),
        Value::Gfid(g) => g.0.to_vec(),
        Value::I64(i) => i.to_string().into_bytes(),
        Value::U64(u) => u.to_string().into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_xattrs_are_hidden() {
        assert!(internal_xattr("trusted.gfid"));
        assert!(internal_xattr("trusted.glusterfs.volume-id"));
        assert!(internal_xattr("trusted.afr.vol-client-0"));
        assert!(!internal_xattr("trusted.user-thing"));
        assert!(!internal_xattr("user.x"));
        assert_eq!(value_bytes(&Value::Str("v".into())), b"v");
        assert_eq!(value_bytes(&Value::U64(12)), b"12");
    }

    #[test]
    fn times_map_to_the_fop_model() {
        assert_eq!(time_set(TimeOrNow::Now), TimeSet::Now);
        let t = std::time::UNIX_EPOCH + std::time::Duration::new(5, 6);
        assert_eq!(time_set(TimeOrNow::SpecificTime(t)), TimeSet::At(xlfs_sdk::Timespec { sec: 5, nsec: 6 }));
    }
}
