//! Extended attributes: set, get and remove (the gfid and `.glusterfs`
//! protected), xattrop's counter arithmetic, and the xattrs a lookup's
//! xdata asks for (GlusterFS: the xattr half of posix-inode-fd-ops.c and
//! posix-helpers.c).

use super::*;

/// An xattr value's bytes.
pub(super) fn xattr_bytes(v: &Value) -> Cow<'_, [u8]> {
    match v {
        Value::Bytes(b) => Cow::Borrowed(b.as_ref()),
        Value::Str(s) => Cow::Borrowed(s.as_bytes()),
        Value::Gfid(g) => Cow::Owned(g.0.to_vec()),
        Value::I64(i) => Cow::Owned(i.to_string().into_bytes()),
        Value::U64(u) => Cow::Owned(u.to_string().into_bytes()),
    }
}

pub(super) fn xattr_name(name: &str) -> Sys<CString> {
    if name.is_empty() {
        return Err(Errno::EINVAL);
    }
    cstr(name.as_bytes())
}

/// The prefix of replicate's changelog counters (`trusted.afr.dirty`,
/// `trusted.afr.<child>`), removed when they return to zero (by xattrop,
/// or at the inode's last close while it is open).
const CHANGELOG_PREFIX: &str = "trusted.afr.";

pub(super) fn is_xattr_key(k: &str) -> bool {
    ["trusted.", "user.", "security.", "system."].iter().any(|p| k.starts_with(p))
}

impl Inner {
    /// The reply xdata for a request that names xattrs or asks for the open
    /// fd count.
    pub(super) fn fill_xdata(&self, t: Target<'_>, gfid: Gfid, req: &Dict) -> Dict {
        let mut out = Dict::new();
        let present = t.names_if_several(req.keys().filter(|k| is_xattr_key(k)).count());
        for key in req.keys() {
            if key == OPEN_FD_COUNT {
                out.set_u64(key.clone(), u64::from(self.open_count(gfid)));
            } else if is_xattr_key(key)
                && sys::has_xattr(present.as_deref(), key.as_bytes())
                && let Ok(name) = cstr(key.as_bytes())
                && let Ok(v) = t.getxattr(&name)
            {
                out.set_bytes(key.clone(), v);
            }
        }
        out
    }

    pub(super) fn xattrop(&self, t: Target<'_>, gfid: Gfid, op: XattropOp, xattrs: &Dict, xdata: &Dict) -> FopResult {
        let width = match op {
            XattropOp::AddArray => 4,
            XattropOp::AddArray64 => 8,
        };
        let mut items = Vec::with_capacity(xattrs.len());
        for (k, v) in xattrs.iter() {
            if is_protected(gfid, k) {
                return Err(Errno::EPERM);
            }
            let Value::Bytes(b) = v else { return Err(Errno::EINVAL) };
            if b.len() % width != 0 || b.len() > 65536 {
                return Err(Errno::EINVAL);
            }
            items.push((xattr_name(k)?, k, b));
        }
        let _i = self.brick.inode_locks.lock_all(&[&[&gfid.0]]);
        let mut out = Dict::new();
        for (name, key, delta) in items {
            let mut cur = vec![0u8; delta.len()];
            match t.getxattr_into(&name, &mut cur) {
                // A shorter stored value counts as zero-padded.
                Ok(_) | Err(Errno::ENODATA) => {}
                Err(e) => return Err(e),
            }
            if delta.iter().any(|&b| b != 0) {
                add_arrays(&mut cur, delta, width);
                // Replicate's counters back at zero are removed (absent
                // reads as zero): with them gone a file's xattrs fit in a
                // 256-byte inode (see `mdata::COMPACT_LEN`). While the
                // inode is open the next transaction would raise them
                // again (allocating the xattr block it just freed, a
                // database's files every second): zeros are kept until
                // its last close.
                let at_zero = key.starts_with(CHANGELOG_PREFIX) && cur.iter().all(|&b| b == 0);
                if at_zero && self.open_count(gfid) == 0 {
                    match t.removexattr(&name) {
                        Ok(()) | Err(Errno::ENODATA) => {}
                        Err(e) => return Err(e),
                    }
                } else {
                    t.setxattr(&name, &cur, 0)?;
                    if at_zero {
                        let mut z = self.zeroed.lock();
                        let names = z.entry(gfid).or_default();
                        if !names.contains(&name) {
                            names.push(name);
                        }
                    }
                }
            }
            out.set_bytes(key.clone(), cur);
        }
        let mut rsp = Response::from(Reply::Xattrs(out));
        rsp.xdata = self.fill_xdata(t, gfid, xdata);
        Ok(rsp)
    }

    /// At an inode's last close (inode lock held): removes the counters an
    /// xattrop left at zero while it was open, if still zero.
    pub(super) fn remove_zeroed(&self, f: &OpenFd) {
        let Some(names) = self.zeroed.lock().remove(&f.gfid) else { return };
        let t = Target::Fd(f.fd.as_fd());
        for name in names {
            let mut v = [0u8; 64];
            let zero = matches!(t.getxattr_into(&name, &mut v), Ok(n) if v[..n].iter().all(|&b| b == 0));
            if zero && let Err(e) = t.removexattr(&name) {
                tracing::debug!(gfid = %f.gfid, error = %e, "cannot remove a changelog counter at zero");
            }
        }
    }
}

/// Element-wise wrapping add of big-endian integers `width` bytes wide.
pub(super) fn add_arrays(cur: &mut [u8], delta: &[u8], width: usize) {
    for (c, d) in cur.chunks_exact_mut(width).zip(delta.chunks_exact(width)) {
        if width == 4 {
            let v =
                i32::from_be_bytes([c[0], c[1], c[2], c[3]]).wrapping_add(i32::from_be_bytes([d[0], d[1], d[2], d[3]]));
            c.copy_from_slice(&v.to_be_bytes());
        } else {
            let mut a = [0u8; 8];
            let mut b = [0u8; 8];
            a.copy_from_slice(c);
            b.copy_from_slice(d);
            c.copy_from_slice(&i64::from_be_bytes(a).wrapping_add(i64::from_be_bytes(b)).to_be_bytes());
        }
    }
}

/// xattrs clients may not change: the gfid and the stored times anywhere,
/// the volume id on the root.
pub(super) fn is_protected(gfid: Gfid, name: &str) -> bool {
    name == GFID_XATTR || name == super::mdata::MDATA_XATTR || (gfid == Gfid::ROOT && name == VOLUME_ID_XATTR)
}

pub(super) fn set_xattrs(t: Target<'_>, gfid: Gfid, xattrs: &Dict, flags: u32) -> Sys<()> {
    if flags & !(xattr_flags::CREATE | xattr_flags::REPLACE) != 0 {
        return Err(Errno::EINVAL);
    }
    let mut f = 0;
    if flags & xattr_flags::CREATE != 0 {
        f |= libc::XATTR_CREATE;
    }
    if flags & xattr_flags::REPLACE != 0 {
        f |= libc::XATTR_REPLACE;
    }
    if xattrs.keys().any(|k| is_protected(gfid, k)) {
        return Err(Errno::EPERM);
    }
    for (k, v) in xattrs.iter() {
        t.setxattr(&xattr_name(k)?, &xattr_bytes(v), f)?;
    }
    Ok(())
}

pub(super) fn get_xattrs(t: Target<'_>, name: &str) -> Sys<Dict> {
    let mut out = Dict::new();
    if !name.is_empty() {
        out.set_bytes(name, t.getxattr(&xattr_name(name)?)?);
        return Ok(out);
    }
    for n in t.listxattr()? {
        let Ok(key) = String::from_utf8(n) else { continue };
        // The stored times are the brick's: heal gives them by a stamp.
        if key == super::mdata::MDATA_XATTR {
            continue;
        }
        match t.getxattr(&xattr_name(&key)?) {
            Ok(v) => out.set_bytes(key, v),
            Err(Errno::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

pub(super) fn remove_xattr(t: Target<'_>, gfid: Gfid, name: &str) -> Sys<()> {
    if is_protected(gfid, name) {
        return Err(Errno::EPERM);
    }
    t.removexattr(&xattr_name(name)?)
}
