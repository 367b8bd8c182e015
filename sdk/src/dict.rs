//! [`Dict`]: GlusterFS's `dict_t`, the xdata that rides along with fops and
//! replies and the container for extended attributes.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::types::Gfid;

/// A typed value in a [`Dict`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A signed integer.
    I64(i64),
    /// An unsigned integer.
    U64(u64),
    /// A UTF-8 string.
    Str(String),
    /// Raw bytes (xattr values are always bytes).
    Bytes(Bytes),
    /// A gfid.
    Gfid(Gfid),
}

/// String keys to typed values, ordered by key so its encoding is stable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dict {
    map: BTreeMap<String, Value>,
}

impl Dict {
    /// An empty dict.
    pub fn new() -> Dict {
        Dict::default()
    }
    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    /// Sets a key.
    pub fn set(&mut self, key: impl Into<String>, v: Value) {
        self.map.insert(key.into(), v);
    }
    /// Builder form of [`Dict::set`].
    pub fn with(mut self, key: impl Into<String>, v: Value) -> Dict {
        self.set(key, v);
        self
    }
    /// Sets a byte value.
    pub fn set_bytes(&mut self, key: impl Into<String>, v: impl Into<Bytes>) {
        self.map.insert(key.into(), Value::Bytes(v.into()));
    }
    /// Sets an unsigned integer.
    pub fn set_u64(&mut self, key: impl Into<String>, v: u64) {
        self.map.insert(key.into(), Value::U64(v));
    }
    /// Sets a string.
    pub fn set_str(&mut self, key: impl Into<String>, v: impl Into<String>) {
        self.map.insert(key.into(), Value::Str(v.into()));
    }
    /// The value of a key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }
    /// True if the key is present.
    pub fn contains(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }
    /// Removes a key, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key)
    }
    /// A byte value (strings are returned as their bytes).
    pub fn get_bytes(&self, key: &str) -> Option<Bytes> {
        match self.map.get(key)? {
            Value::Bytes(b) => Some(b.clone()),
            Value::Str(s) => Some(Bytes::copy_from_slice(s.as_bytes())),
            _ => None,
        }
    }
    /// An integer value, converting between the integer kinds.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        match self.map.get(key)? {
            Value::U64(v) => Some(*v),
            Value::I64(v) => u64::try_from(*v).ok(),
            Value::Str(s) => s.parse().ok(),
            _ => None,
        }
    }
    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.map.get(key)? {
            Value::Str(s) => Some(s),
            Value::Bytes(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }
    /// Iterates in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Value)> {
        self.map.iter()
    }
    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.map.keys()
    }
}

impl FromIterator<(String, Value)> for Dict {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Dict {
        Dict { map: iter.into_iter().collect() }
    }
}

impl IntoIterator for Dict {
    type Item = (String, Value);
    type IntoIter = std::collections::btree_map::IntoIter<String, Value>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.into_iter()
    }
}

/// Well-known xdata keys.
pub mod keys {
    /// Ask locks to return the number of inodelks held on the inode in the
    /// reply's xdata (GlusterFS's `GLUSTERFS_INODELK_COUNT`); the value names
    /// the lock domain.
    pub const INODELK_COUNT: &str = "glusterfs.inodelk-count";
    /// Entry lock count, likewise.
    pub const ENTRYLK_COUNT: &str = "glusterfs.entrylk-count";
    /// Posix lock count, likewise.
    pub const POSIXLK_COUNT: &str = "glusterfs.posixlk-count";
    /// On an unlock `lk`: cancel, rather than unlock, the owner's requests
    /// still waiting for the range (a SETLKW whose caller was interrupted);
    /// granted locks are left as they are. features/locks answers the
    /// cancelled requests EINTR.
    pub const LK_CANCEL: &str = "xlfs.lk-cancel";
    /// On an `lk`: a BSD flock(2) lock, not a POSIX one. features/locks
    /// keeps flocks in a lock space of their own (they never conflict with
    /// fcntl locks); a flush does not drop them, the fd's release does.
    pub const LK_FLOCK: &str = "xlfs.lk-flock";
    /// On a lookup: answer from the subvolumes, not from a cache (the FUSE
    /// bridge asks so when it checks that an inode does not have two names
    /// it cannot have). Caches that answer lookups pass such a lookup on.
    pub const FRESH_LOOKUP: &str = "xlfs.fresh-lookup";
    /// On a create-type fop: the gfid the new inode must get (AFR sets the
    /// same gfid on every replica).
    pub const GFID_REQ: &str = "gfid-req";
    /// On a metadata fop to cluster/replicate: the caller holds a write
    /// inodelk covering the inode in replicate's own domain, with the
    /// caller's lock owner (distribute's file migration), so the
    /// transaction locks with that owner instead of a new one (granted at
    /// once, where a new owner would wait behind the caller's lock).
    pub const AFR_CALLER_LOCKED: &str = "xlfs.afr.caller-locked";
    /// On an open, from cluster/distribute: the name of its link files'
    /// xattr. storage/posix answers ESTALE, opening nothing, when the inode
    /// is a link file (a regular file of mode 01000 carrying that xattr): a
    /// migrated source keeps its name as a link file on a subvolume being
    /// removed, and an open by gfid would otherwise reach its dead copy
    /// (an `O_TRUNC` truncating that, not the data). On ESTALE distribute
    /// finds the file again by gfid and opens it where the data is.
    pub const OPEN_DATA_ONLY: &str = "xlfs.open-data-only";
    /// The xattr that stores an inode's gfid on a brick.
    pub const GFID_XATTR: &str = "trusted.gfid";
    /// The brick root's volume-id xattr.
    pub const VOLUME_ID_XATTR: &str = "trusted.glusterfs.volume-id";
    /// On fsync: make the whole file system that holds the fd durable
    /// (`syncfs(2)`) instead of the one file. One such call covers every
    /// write any file on the brick finished before it, so replicate shares
    /// one among the windows it ends at the same time (group commit).
    pub const SYNCFS: &str = "xlfs.syncfs";
    /// On a lookup (GlusterFS's `GF_CONTENT_KEY`): a u64 byte limit. When
    /// the inode is a regular file no larger than it, storage/posix puts
    /// the whole file content in the reply xdata under the same key
    /// (bytes), so performance/quick-read can answer reads without opening
    /// the file. cluster/replicate passes it up only from a copy a read
    /// would be served from.
    pub const CONTENT: &str = "glusterfs.content";

    /// Reply xdata key of a readdirp whose request xdata named xattrs
    /// (`security.selinux`, ...; performance/md-cache asks this way):
    /// storage/posix sets it, to the number of xattr names it looked up,
    /// when it put each returned entry's values under [`dirent_xattr`]
    /// keys. Only with this key present does a missing per-entry key mean
    /// "the entry has no such xattr" (a child that does not know the
    /// convention leaves it out).
    pub const DIRENT_XATTRS: &str = "xlfs.dirent-xattrs";

    /// On the opendir and the readdirps of a whole-directory read that
    /// performance/md-cache makes ahead of lookups (`dir-prefetch`): a
    /// flag. performance/readdir-ahead leaves such a directory fd alone;
    /// performance/quick-read asks for [`READDIRP_CONTENT`] on its readdirps.
    pub const DIR_PREFETCH: &str = "xlfs.dir-prefetch";

    /// On the readdirps of a whole-directory read whose names are then
    /// trusted to be all there are (performance/md-cache's
    /// `dir-prefetch`): a flag, asking whether the listing may be trusted
    /// so. The reply that ends the listing (no entries) carries it as 0
    /// when it may not: cluster/distribute's, when the directory's layout
    /// is unsettled (a rebalance moves its files, and a file that moved
    /// between the reads of two subvolumes is listed by neither).
    pub const WHOLE_LISTING: &str = "xlfs.whole-listing";

    /// On a readdirp: a u64 byte limit. storage/posix puts the whole
    /// content of each regular entry no larger under the entry's
    /// [`dirent_xattr`]`(name, `[`CONTENT`]`)` reply key (within a per-reply
    /// budget); cluster/replicate passes an entry's content on only when
    /// every child is up and no child's index lists the inode (no copy can
    /// be behind another), and removes it otherwise.
    pub const READDIRP_CONTENT: &str = "xlfs.readdirp-content";

    /// On an opendir, from performance/md-cache (GlusterFS's
    /// `GF_MDC_LOADED_KEY_NAMES`): the xattr names md-cache adds to every
    /// readdirp it sends, separated by spaces. performance/readdir-ahead
    /// takes the key out and asks for the same xattrs in the readdirps it
    /// sends ahead, so the entries it serves carry them.
    pub const MDC_LOADED_KEY_NAMES: &str = "glusterfs.mdc.loaded.key.names";

    /// Request xdata key on lookup and xattrop: storage/posix puts the
    /// number of fds open on the inode in the reply xdata under it
    /// (GlusterFS's `GLUSTERFS_OPEN_FD_COUNT`); cluster/replicate's eager
    /// lock reads it.
    pub const OPEN_FD_COUNT: &str = "glusterfs.open-fd-count";
    /// Lookup xdata: cluster/replicate asks which child is on this host;
    /// a child that knows answers a u64 (non-zero: local).
    pub const IS_LOCAL: &str = "xlfs.is-local";

    /// Getxattr key on a brick's root: features/index lists the gfids it
    /// recorded (ask for the next page with `"{INDEX_XATTROP}:<last gfid>"`).
    pub const INDEX_XATTROP: &str = "xlfs.index.xattrop";
    /// features/index's reply key with the number of recorded gfids.
    pub const INDEX_COUNT: &str = "xlfs.index.xattrop-count";
    /// Setxattr key on a brick's root: features/index checks these gfids
    /// again and drops the clean ones.
    pub const INDEX_PURGE: &str = "xlfs.index.purge";

    /// Xdata key of a fop that changes an inode: the client's time of the
    /// change (nanoseconds since the epoch, u64), which storage/posix keeps
    /// as the inode's times (features/utime stamps it).
    pub const UTIME: &str = "xlfs.utime";

    /// Setxattr key on the root, to cluster/replicate: heal what the
    /// indices list (`index`) or the whole tree (`full`).
    pub const HEAL_RUN: &str = "xlfs.heal.run";
    /// Setxattr key on the root: heal the inode with this gfid.
    pub const HEAL_GFID: &str = "xlfs.heal.gfid";
    /// Getxattr key on the root: what needs heal, per child.
    pub const HEAL_INFO: &str = "xlfs.heal.info";
    /// Setxattr key on an inode: resolve its split-brain with a policy.
    pub const SPLIT_BRAIN_RESOLVE: &str = "xlfs.split-brain.resolve";
    /// Heal reply xdata: inodes healed.
    pub const HEAL_HEALED: &str = "xlfs.heal.healed";
    /// Heal reply xdata: inodes that could not be healed.
    pub const HEAL_FAILED: &str = "xlfs.heal.failed";
    /// Heal reply xdata: inodes left in split-brain.
    pub const HEAL_SPLIT_BRAIN: &str = "xlfs.heal.split-brain";
    /// Heal reply xdata: gfids still needing heal afterwards.
    pub const HEAL_REMAINING: &str = "xlfs.heal.remaining";
    /// Heal reply xdata: one line per inode not healed.
    pub const HEAL_REPORT: &str = "xlfs.heal.report";
    /// Reply xdata of a split-brain resolve: what became of it.
    pub const HEAL_RESULT: &str = "xlfs.heal.result";

    /// The readdirp reply xdata key that carries the value of xattr `xattr`
    /// of the entry named `entry`: `"{entry}/{xattr}"`. Unambiguous because
    /// an entry name never contains `/`; see [`parse_dirent_xattr`].
    pub fn dirent_xattr(entry: &str, xattr: &str) -> String {
        let mut k = String::with_capacity(entry.len() + 1 + xattr.len());
        k.push_str(entry);
        k.push('/');
        k.push_str(xattr);
        k
    }

    /// Splits a [`dirent_xattr`] key into the entry name and the xattr name;
    /// `None` for keys of any other form (no `/`, or an empty part).
    pub fn parse_dirent_xattr(key: &str) -> Option<(&str, &str)> {
        let (entry, xattr) = key.split_once('/')?;
        (!entry.is_empty() && !xattr.is_empty()).then_some((entry, xattr))
    }
}

#[cfg(test)]
mod tests {
    use super::keys::{dirent_xattr, parse_dirent_xattr};

    #[test]
    fn dirent_xattr_keys_round_trip() {
        let k = dirent_xattr("a.txt", "security.selinux");
        assert_eq!(k, "a.txt/security.selinux");
        assert_eq!(parse_dirent_xattr(&k), Some(("a.txt", "security.selinux")));
        // An xattr name may contain '/'; the entry name never does.
        assert_eq!(parse_dirent_xattr("f/user.a/b"), Some(("f", "user.a/b")));
        assert_eq!(parse_dirent_xattr("glusterfs.inodelk-count"), None);
        assert_eq!(parse_dirent_xattr("/user.a"), None);
        assert_eq!(parse_dirent_xattr("f/"), None);
    }
}
