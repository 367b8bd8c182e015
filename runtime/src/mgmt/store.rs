//! The cluster store: where the daemon keeps volume specs.
//!
//! [`Store`] is deliberately small (get, put, delete, list, each with a
//! revision) so that an etcd implementation can replace the embedded one:
//! a revision is a store-wide counter that grows with every change (etcd's
//! `mod_revision`), and [`Store::put`] / [`Store::delete`] take the
//! revision the caller read, refusing with [`StoreError::Conflict`] if the
//! volume changed since (etcd's transaction on `mod_revision`).
//!
//! [`FileStore`], the default, keeps one TOML file per volume in
//! `STATE_DIR/volumes/NAME.toml` (the revision and the spec), written
//! atomically: a temporary file, fsynced, renamed over the old one, and the
//! directory fsynced. It serves one daemon: it has no peers. Of the brick
//! states it keeps the ports on disk (`brick-ports.json`), so that after
//! a daemon restart the bricks come back where mounts expect them.
//!
//! [`etcd::EtcdStore`] keeps the same in etcd, shared by the daemons of
//! several nodes: then the store also carries what each daemon publishes
//! for the others (its bricks' [`BrickState`]s, the [`Peer`]s of the
//! cluster) and tells each daemon of changes ([`Store::changes`]).

pub mod etcd;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::spec::{BrickSpec, VolumeSpec};

/// A spec with the revision at which it was last written.
#[derive(Clone, Debug, PartialEq)]
pub struct Versioned {
    /// The spec.
    pub spec: VolumeSpec,
    /// The store revision of its last change.
    pub revision: u64,
}

/// What a put or delete expects to find.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expect {
    /// The volume must not exist (create).
    Absent,
    /// The volume must be at this revision (read-modify-write).
    Revision(u64),
}

/// Why the store refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or writing a file failed.
    #[error("store {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A stored file does not parse.
    #[error("store {}: {why}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        why: String,
    },
    /// The spec could not be written as TOML.
    #[error("volume {name}: cannot store the spec: {why}")]
    Encode {
        /// The volume.
        name: String,
        /// Why.
        why: String,
    },
    /// The volume changed (or appeared, or went) since the caller read it.
    #[error("volume {0} was changed by someone else meanwhile; try again")]
    Conflict(String),
    /// A store URL that does not parse.
    #[error("store {url}: {why}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The shared store did not answer.
    #[error("cluster store {endpoint}: {why}")]
    Unavailable {
        /// The endpoint tried last.
        endpoint: String,
        /// Why.
        why: String,
    },
    /// A key in the shared store does not parse.
    #[error("cluster store key {key}: {why}")]
    CorruptKey {
        /// The key.
        key: String,
        /// The parser's message.
        why: String,
    },
    /// Peers need a store the daemons share.
    #[error(
        "this daemon keeps its state in {0}, which no other node shares: start every node's daemon with --store etcd://HOST:PORT to have peers"
    )]
    NoPeers(String),
}

/// What the daemon serving a brick publishes about it for the others.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BrickState {
    /// The port it listens on (or last listened on).
    pub port: Option<u16>,
    /// Its process, while it runs.
    pub pid: Option<u32>,
    /// Restarts after unexpected exits.
    pub restarts: u32,
    /// Free bytes on its file system.
    pub disk_free: Option<u64>,
    /// Why it could not be started, if it could not.
    pub error: Option<String>,
    /// The revision of the volume's spec the daemon had acted on.
    #[serde(default)]
    pub seen: u64,
}

/// A node of the cluster: its name (the HOST of its bricks' `HOST:DIR`)
/// and where its daemon answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// The node's name.
    pub node: String,
    /// Its daemon's `HOST:PORT`.
    pub address: String,
}

/// The store of volume specs (see the module documentation).
pub trait Store: Send + Sync {
    /// The volume named `name`, if any.
    fn get(&self, name: &str) -> Result<Option<Versioned>, StoreError>;
    /// Writes `spec` (keyed by its name) if the stored one is as
    /// `expect`ed; returns the new revision.
    fn put(&self, spec: &VolumeSpec, expect: Expect) -> Result<u64, StoreError>;
    /// Removes the volume if it is at revision `expect`.
    fn delete(&self, name: &str, expect: u64) -> Result<(), StoreError>;
    /// Every volume, by name.
    fn list(&self) -> Result<Vec<Versioned>, StoreError>;
    /// What the daemons serving `volume`'s bricks published about them.
    fn brick_states(&self, volume: &str) -> Result<BTreeMap<BrickSpec, BrickState>, StoreError>;
    /// Publishes (`None`: withdraws) the state of a brick this daemon serves.
    fn publish(&self, volume: &str, brick: &BrickSpec, state: Option<&BrickState>) -> Result<(), StoreError>;
    /// The cluster's nodes other than those never added.
    fn peers(&self) -> Result<Vec<Peer>, StoreError>;
    /// Records a node.
    fn put_peer(&self, peer: &Peer) -> Result<(), StoreError>;
    /// Forgets a node.
    fn remove_peer(&self, node: &str) -> Result<(), StoreError>;
    /// A receiver that changes when another daemon changes the store;
    /// `None` when no other daemon can.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
    /// Where the store is, for messages.
    fn describe(&self) -> String;
    /// An id of the store, the same for every daemon that shares it.
    fn cluster(&self) -> String;
}

/// The file as stored: the revision, then the spec.
#[derive(Serialize, Deserialize)]
struct StoredFile {
    revision: u64,
    volume: VolumeSpec,
}

/// The embedded store: one TOML file per volume under a directory.
pub struct FileStore {
    dir: PathBuf,
    /// The revision counter; the lock also serializes writers.
    revision: Mutex<u64>,
    /// Brick states: only this daemon's, in memory but for the ports.
    states: Mutex<BTreeMap<(String, BrickSpec), BrickState>>,
}

impl FileStore {
    /// Opens (making it if needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<FileStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io { path: dir.to_path_buf(), source })?;
        // Leftovers of a write cut short.
        for e in read_dir(dir)? {
            if e.extension().is_some_and(|x| x == "tmp") {
                let _ = std::fs::remove_file(&e);
            }
        }
        let s = FileStore { dir: dir.to_path_buf(), revision: Mutex::new(0), states: Mutex::default() };
        s.load_ports()?;
        let top = s.list()?.iter().map(|v| v.revision).max().unwrap_or(0);
        let marker = s.read_marker()?;
        *s.revision.lock() = top.max(marker);
        Ok(s)
    }

    /// The store's current revision (0 when nothing was ever written).
    pub fn revision(&self) -> u64 {
        *self.revision.lock()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.toml"))
    }

    fn ports_path(&self) -> PathBuf {
        self.dir.join("brick-ports.json")
    }

    /// The ports the bricks had when the daemon last ran.
    fn load_ports(&self) -> Result<(), StoreError> {
        let path = self.ports_path();
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        let list: Vec<(String, String, u16)> = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError::Corrupt { path: path.clone(), why: e.to_string() })?;
        let mut states = self.states.lock();
        for (volume, brick, port) in list {
            let brick =
                BrickSpec::parse(&brick).map_err(|e| StoreError::Corrupt { path: path.clone(), why: e.to_string() })?;
            states.insert((volume, brick), BrickState { port: Some(port), ..BrickState::default() });
        }
        Ok(())
    }

    fn save_ports(&self, states: &BTreeMap<(String, BrickSpec), BrickState>) -> Result<(), StoreError> {
        let list: Vec<(&str, String, u16)> =
            states.iter().filter_map(|((v, b), s)| s.port.map(|p| (v.as_str(), b.to_string(), p))).collect();
        let bytes = serde_json::to_vec(&list)
            .map_err(|e| StoreError::Encode { name: "brick ports".into(), why: e.to_string() })?;
        write_atomic(&self.ports_path(), &bytes)
    }

    /// The revision of the last delete, which no volume file remembers.
    fn marker_path(&self) -> PathBuf {
        self.dir.join("revision")
    }

    fn read_marker(&self) -> Result<u64, StoreError> {
        let path = self.marker_path();
        match std::fs::read_to_string(&path) {
            Ok(s) => s.trim().parse().map_err(|_| StoreError::Corrupt { path, why: "not a number".into() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    fn read(&self, path: &Path) -> Result<Option<Versioned>, StoreError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StoreError::Io { path: path.to_path_buf(), source }),
        };
        let f: StoredFile =
            toml::from_str(&text).map_err(|e| StoreError::Corrupt { path: path.to_path_buf(), why: e.to_string() })?;
        Ok(Some(Versioned { spec: f.volume, revision: f.revision }))
    }

    fn check(&self, name: &str, expect: Expect) -> Result<(), StoreError> {
        let now = self.read(&self.path(name))?.map(|v| v.revision);
        let ok = match expect {
            Expect::Absent => now.is_none(),
            Expect::Revision(r) => now == Some(r),
        };
        if ok { Ok(()) } else { Err(StoreError::Conflict(name.to_string())) }
    }
}

/// Writes `bytes` to `path` atomically and durably.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| StoreError::Io { path: p, source }
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io(path))?;
    sync_dir(path)
}

fn sync_dir(path: &Path) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StoreError::Io { path: dir.to_path_buf(), source })
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let io = |source| StoreError::Io { path: dir.to_path_buf(), source };
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        v.push(e.map_err(io)?.path());
    }
    v.sort();
    Ok(v)
}

impl Store for FileStore {
    fn get(&self, name: &str) -> Result<Option<Versioned>, StoreError> {
        self.read(&self.path(name))
    }

    fn put(&self, spec: &VolumeSpec, expect: Expect) -> Result<u64, StoreError> {
        let mut rev = self.revision.lock();
        self.check(&spec.name, expect)?;
        let next = *rev + 1;
        let text = toml::to_string(&StoredFile { revision: next, volume: spec.clone() })
            .map_err(|e| StoreError::Encode { name: spec.name.clone(), why: e.to_string() })?;
        write_atomic(&self.path(&spec.name), text.as_bytes())?;
        *rev = next;
        Ok(next)
    }

    fn delete(&self, name: &str, expect: u64) -> Result<(), StoreError> {
        let mut rev = self.revision.lock();
        self.check(name, Expect::Revision(expect))?;
        let next = *rev + 1;
        write_atomic(&self.marker_path(), format!("{next}\n").as_bytes())?;
        let path = self.path(name);
        std::fs::remove_file(&path).map_err(|source| StoreError::Io { path: path.clone(), source })?;
        sync_dir(&path)?;
        *rev = next;
        let mut states = self.states.lock();
        states.retain(|(v, _), _| v != name);
        self.save_ports(&states)
    }

    fn list(&self) -> Result<Vec<Versioned>, StoreError> {
        let mut by_name = BTreeMap::new();
        for p in read_dir(&self.dir)? {
            if p.extension().is_some_and(|x| x == "toml")
                && let Some(v) = self.read(&p)?
            {
                by_name.insert(v.spec.name.clone(), v);
            }
        }
        Ok(by_name.into_values().collect())
    }

    fn brick_states(&self, volume: &str) -> Result<BTreeMap<BrickSpec, BrickState>, StoreError> {
        let states = self.states.lock();
        Ok(states.iter().filter(|((v, _), _)| v == volume).map(|((_, b), s)| (b.clone(), s.clone())).collect())
    }

    fn publish(&self, volume: &str, brick: &BrickSpec, state: Option<&BrickState>) -> Result<(), StoreError> {
        let key = (volume.to_string(), brick.clone());
        let mut states = self.states.lock();
        let old = match state {
            Some(s) => states.insert(key, s.clone()),
            None => states.remove(&key),
        };
        if old.and_then(|o| o.port) != state.and_then(|s| s.port) {
            self.save_ports(&states)?;
        }
        Ok(())
    }

    fn peers(&self) -> Result<Vec<Peer>, StoreError> {
        Ok(Vec::new())
    }

    fn put_peer(&self, _: &Peer) -> Result<(), StoreError> {
        Err(StoreError::NoPeers(self.describe()))
    }

    fn remove_peer(&self, _: &str) -> Result<(), StoreError> {
        Err(StoreError::NoPeers(self.describe()))
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn cluster(&self) -> String {
        format!("file:{}", self.dir.display())
    }
}

#[cfg(test)]
mod tests {
    use super::super::spec::{BrickSpec, VolumeStatus};
    use super::*;

    fn spec(name: &str) -> VolumeSpec {
        VolumeSpec {
            name: name.into(),
            id: "76b60fc5-d0c8-4fd8-9174-bf87139f7df3".into(),
            replica: 1,
            status: VolumeStatus::Created,
            bricks: vec![BrickSpec::parse("h:/b").expect("brick")],
            options: Default::default(),
            removing: Vec::new(),
        }
    }

    #[test]
    fn put_get_list_delete_with_revisions() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = FileStore::open(tmp.path()).expect("open");
        assert_eq!(s.revision(), 0);
        let r1 = s.put(&spec("a"), Expect::Absent).expect("create a");
        let r2 = s.put(&spec("b"), Expect::Absent).expect("create b");
        assert!(r2 > r1);
        assert!(matches!(s.put(&spec("a"), Expect::Absent), Err(StoreError::Conflict(_))));
        let mut a = s.get("a").expect("get").expect("a exists");
        assert_eq!(a.revision, r1);
        a.spec.status = VolumeStatus::Started;
        let r3 = s.put(&a.spec, Expect::Revision(r1)).expect("update");
        assert!(matches!(s.put(&a.spec, Expect::Revision(r1)), Err(StoreError::Conflict(_))), "stale revision");
        let names: Vec<String> = s.list().expect("list").into_iter().map(|v| v.spec.name).collect();
        assert_eq!(names, ["a", "b"]);
        s.delete("a", r3).expect("delete");
        assert!(s.get("a").expect("get").is_none());
        let after_delete = s.revision();
        assert!(after_delete > r3);
        // Reopened, it knows every volume and never reuses a revision.
        drop(s);
        let s = FileStore::open(tmp.path()).expect("reopen");
        assert_eq!(s.revision(), after_delete);
        assert_eq!(s.get("b").expect("get").map(|v| v.spec), Some(spec("b")));
        assert!(
            std::fs::read_dir(tmp.path()).expect("ls").flatten().all(|e| e.path().extension() != Some("tmp".as_ref()))
        );
    }

    #[test]
    fn brick_ports_outlive_a_restart_and_go_with_the_volume() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = FileStore::open(tmp.path()).expect("open");
        let r = s.put(&spec("a"), Expect::Absent).expect("create");
        let b = BrickSpec::parse("h:/b").expect("brick");
        let st = BrickState { port: Some(49200), pid: Some(7), ..BrickState::default() };
        s.publish("a", &b, Some(&st)).expect("publish");
        drop(s);
        let s = FileStore::open(tmp.path()).expect("reopen");
        let again = s.brick_states("a").expect("states");
        assert_eq!(again.get(&b).map(|s| (s.port, s.pid)), Some((Some(49200), None)), "the port, not the pid");
        assert_eq!(s.list().expect("list").len(), 1, "the ports file is not a volume");
        s.delete("a", r).expect("delete");
        drop(s);
        let s = FileStore::open(tmp.path()).expect("reopen");
        assert!(s.brick_states("a").expect("states").is_empty());
    }

    #[test]
    fn a_corrupt_file_is_named() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join("x.toml"), "not = [toml").expect("write");
        let e = FileStore::open(tmp.path()).err().expect("corrupt");
        assert!(e.to_string().contains("x.toml"), "{e}");
    }
}
