//! Brick directories on this node: the checks `volume create` and
//! `add-brick` make, the volume-id mark (GlusterFS's
//! `trusted.glusterfs.volume-id` xattr) that keeps a directory from
//! serving two volumes, and the count of data files `remove-brick commit`
//! makes. A daemon does this for its own bricks, and for another node's
//! daemon that asks ([`super::cluster`]).

use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use xlfs_sdk::Gfid;

use super::daemon::{MgmtError, VOLUME_ID_XATTR};
use super::spec::BrickSpec;
use super::store::Versioned;

/// Checks `bricks` (all on this node) and marks them with volume `id`:
/// all or none. Returns them with their directories canonical. `mine`
/// says which hosts are this node: a directory of another node's brick
/// may have the same path.
pub(super) fn prepare(
    bricks: &[BrickSpec],
    force: bool,
    known: &[Versioned],
    mine: &dyn Fn(&str) -> bool,
    id: Gfid,
) -> Result<Vec<BrickSpec>, MgmtError> {
    let mut list: Vec<BrickSpec> = Vec::new();
    for b in bricks {
        let b = check(b, force, known, mine)?;
        if list.contains(&b) {
            return Err(MgmtError::Duplicate(b));
        }
        list.push(b);
    }
    let mut marked: Vec<&BrickSpec> = Vec::new();
    for b in &list {
        if let Err(source) = set_xattr(&b.dir, &id.0) {
            unmark(&marked);
            return Err(MgmtError::Xattr { brick: b.clone(), what: "setting", source });
        }
        marked.push(b);
    }
    Ok(list)
}

/// Checks a brick for create; returns it with its directory canonical.
fn check(b: &BrickSpec, force: bool, known: &[Versioned], mine: &dyn Fn(&str) -> bool) -> Result<BrickSpec, MgmtError> {
    let dir_err = |source| MgmtError::BrickDir { brick: b.clone(), source };
    let meta = std::fs::metadata(&b.dir).map_err(dir_err)?;
    if !meta.is_dir() {
        return Err(MgmtError::NotDir(b.clone()));
    }
    let dir = std::fs::canonicalize(&b.dir).map_err(dir_err)?;
    let b = BrickSpec { host: b.host.clone(), dir };
    let root = std::fs::metadata("/").map_err(dir_err)?;
    if meta.dev() == root.dev() && !force {
        return Err(MgmtError::RootFs(b));
    }
    for v in known {
        let clash = |o: &&BrickSpec| mine(&o.host) && (b.dir.starts_with(&o.dir) || o.dir.starts_with(&b.dir));
        if let Some(other) = v.spec.bricks.iter().find(clash) {
            return Err(MgmtError::InUse { brick: b, what: format!("volume {} (brick {other})", v.spec.name) });
        }
    }
    match get_xattr(&b.dir) {
        Ok(Some(id)) => {
            let id = <[u8; 16]>::try_from(id.as_slice()).map(|a| Gfid(a).to_string()).unwrap_or_else(|_| "?".into());
            let what = match known.iter().find(|v| v.spec.id == id) {
                Some(v) => format!("volume {} (id {id})", v.spec.name),
                None => format!("a volume with id {id} ({VOLUME_ID_XATTR} is set on it)"),
            };
            Err(MgmtError::InUse { brick: b, what })
        }
        Ok(None) => Ok(b),
        Err(source) => Err(MgmtError::Xattr { brick: b, what: "reading", source }),
    }
}

fn cpath(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn xattr_name() -> CString {
    CString::new(VOLUME_ID_XATTR).unwrap_or_default()
}

/// The brick's volume-id xattr, if set.
fn get_xattr(dir: &Path) -> std::io::Result<Option<Vec<u8>>> {
    let (p, n) = (cpath(dir)?, xattr_name());
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and a buffer of the length given.
    let rc = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENODATA) { Ok(None) } else { Err(e) };
    }
    Ok(Some(buf[..rc as usize].to_vec()))
}

fn set_xattr(dir: &Path, value: &[u8]) -> std::io::Result<()> {
    let (p, n) = (cpath(dir)?, xattr_name());
    // SAFETY: valid C strings and a value of the length given.
    let rc = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), libc::XATTR_CREATE) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Removes the mark from bricks (a failure is logged: the volume is gone
/// either way).
pub(super) fn unmark(bricks: &[&BrickSpec]) {
    for b in bricks {
        let r = cpath(&b.dir).and_then(|p| {
            let n = xattr_name();
            // SAFETY: valid C strings.
            let rc = unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) };
            if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
        });
        if let Err(e) = r
            && e.raw_os_error() != Some(libc::ENODATA)
        {
            tracing::warn!(brick = %b, "removing {VOLUME_ID_XATTR}: {e}");
        }
    }
}

/// Data files left in brick directory `dir` (regular files other than
/// link files, outside `.glusterfs`): how many, and one of them.
pub(super) fn data_files(dir: &Path) -> (u64, String) {
    let mut count = 0;
    let mut example = String::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if d == dir && e.file_name() == ".glusterfs" {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
            if m.is_dir() {
                todo.push(p);
            } else if !(m.is_file() && m.mode() & 0o7777 == 0o1000) {
                count += 1;
                if example.is_empty() {
                    example = p.display().to_string();
                }
            }
        }
    }
    (count, example)
}
