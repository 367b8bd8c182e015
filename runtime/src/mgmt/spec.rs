//! Volume specs: what the daemon keeps in its [store](super::store) per
//! volume, as typed serde structs, shown to users as TOML.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A volume's lifecycle state (GlusterFS: Created, Started, Stopped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeStatus {
    /// Made, never started.
    Created,
    /// Its bricks are served.
    Started,
    /// Stopped after being started.
    Stopped,
}

impl fmt::Display for VolumeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VolumeStatus::Created => "created",
            VolumeStatus::Started => "started",
            VolumeStatus::Stopped => "stopped",
        })
    }
}

/// One brick: a directory on a host.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BrickSpec {
    /// The node's host name or address (as clients reach it).
    pub host: String,
    /// The absolute, canonical brick directory on that host.
    pub dir: PathBuf,
}

impl fmt::Display for BrickSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.dir.display())
    }
}

/// Why a `HOST:DIR` brick argument was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("brick {0:?}: expected HOST:/ABSOLUTE/DIR")]
pub struct BadBrick(pub String);

impl BrickSpec {
    /// Parses `HOST:/DIR` (the directory as given, not yet canonical).
    pub fn parse(s: &str) -> Result<BrickSpec, BadBrick> {
        let bad = || BadBrick(s.to_string());
        let (host, dir) = s.split_once(":/").ok_or_else(bad)?;
        if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/' || c == ',') {
            return Err(bad());
        }
        let dir = format!("/{dir}");
        if dir.contains(|c: char| c.is_whitespace() || c == ',' || c == '#') {
            return Err(bad());
        }
        Ok(BrickSpec { host: host.to_string(), dir: PathBuf::from(dir) })
    }

    /// The same brick with its directory canonical where it exists here
    /// (symlinks and `..` resolved), as the daemon stores bricks; as given
    /// otherwise.
    pub fn canonical(&self) -> BrickSpec {
        BrickSpec {
            host: self.host.clone(),
            dir: std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone()),
        }
    }
}

/// A volume as the daemon keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeSpec {
    /// Its name (letters, digits, `-`, `_`).
    pub name: String,
    /// Its uuid, also in each brick root's `trusted.glusterfs.volume-id`.
    pub id: String,
    /// Copies of each file (bricks per replica set).
    pub replica: usize,
    /// Created, started or stopped.
    pub status: VolumeStatus,
    /// The bricks, in replica-set order.
    pub bricks: Vec<BrickSpec>,
    /// The keys users set (`xlfs volume set`), key to value.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// Bricks being removed (`volume remove-brick ... start`, whole replica
    /// sets): still served, given no new files, emptied by a rebalance;
    /// `remove-brick ... commit` drops them.
    #[serde(default)]
    pub removing: Vec<BrickSpec>,
}

/// Why a volume name was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("volume name {0:?}: use 1 to 64 letters, digits, '-' or '_', not starting with '-'")]
pub struct BadName(pub String);

/// Checks a volume name.
pub fn check_name(name: &str) -> Result<(), BadName> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok { Ok(()) } else { Err(BadName(name.to_string())) }
}

impl VolumeSpec {
    /// The spec as TOML, as `xlfs volume info` shows it.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot show as TOML: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bricks_parse_and_bad_ones_are_named() {
        let b = BrickSpec::parse("node1:/data/b1").expect("parses");
        assert_eq!((b.host.as_str(), b.dir.as_path()), ("node1", std::path::Path::new("/data/b1")));
        assert_eq!(b.to_string(), "node1:/data/b1");
        for bad in ["/data/b1", "node1:data", ":/x", "a b:/x", "h:/a b"] {
            assert_eq!(BrickSpec::parse(bad), Err(BadBrick(bad.to_string())), "{bad}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("vol_1-a").is_ok());
        for bad in ["", "-x", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spec_round_trips_through_toml() {
        let spec = VolumeSpec {
            name: "v".into(),
            id: "76b60fc5-d0c8-4fd8-9174-bf87139f7df3".into(),
            replica: 3,
            status: VolumeStatus::Started,
            bricks: vec![BrickSpec::parse("h:/b1").expect("brick")],
            options: [("performance.write-behind".to_string(), "off".to_string())].into(),
            removing: Vec::new(),
        };
        let text = spec.to_toml();
        assert!(text.contains("status = \"started\""), "{text}");
        assert_eq!(toml::from_str::<VolumeSpec>(&text).expect("parses"), spec);
    }
}
