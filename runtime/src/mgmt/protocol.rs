//! The control protocol between `xlfs volume` (and `xlfs mount`) and the
//! daemon: over TCP, one request and one response per exchange, each a
//! frame of a big-endian `u32` length and that many bytes of JSON
//! ([`Request`], [`Response`]). A connection may carry several exchanges.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::keys::KeyHelp;
use super::spec::VolumeSpec;

/// The largest frame either side accepts.
pub const MAX_FRAME: u32 = 16 << 20;

/// The daemon's default address (GlusterFS's glusterd port).
pub const DEFAULT_ADDR: &str = "127.0.0.1:24007";

/// How long a client waits for connecting and for each answer; `volume
/// start` waits for the bricks, which may take up to their start timeout.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the daemon holds a `getspec` whose volfile has not changed.
pub const SPEC_WAIT: Duration = Duration::from_secs(30);

/// A short digest of a volfile's text, for [`Request::Getspec`]'s `unless`.
pub fn volfile_digest(text: &str) -> u64 {
    use sha2::Digest;
    let d = sha2::Sha256::digest(text.as_bytes());
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// What the CLI asks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// `volume create NAME [replica N] HOST:DIR... [force]`.
    Create {
        /// The name.
        name: String,
        /// Copies per file (default: the brick count).
        replica: Option<usize>,
        /// `HOST:DIR` each.
        bricks: Vec<String>,
        /// Allow bricks on the root file system.
        force: bool,
        /// Keys to set from the start (`--from-info`), as (key, value).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        options: Vec<(String, String)>,
    },
    /// `volume start NAME [force]`.
    Start {
        /// The volume.
        name: String,
        /// Start the bricks that are down of a started volume.
        force: bool,
    },
    /// `volume stop NAME`.
    Stop {
        /// The volume.
        name: String,
    },
    /// `volume delete NAME`.
    Delete {
        /// The volume.
        name: String,
    },
    /// `volume info [NAME]`.
    Info {
        /// One volume, or all.
        name: Option<String>,
    },
    /// `volume status [NAME]`.
    Status {
        /// One volume, or all.
        name: Option<String>,
    },
    /// `volume set NAME KEY VALUE`.
    Set {
        /// The volume.
        name: String,
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// `volume reset NAME [KEY]`.
    Reset {
        /// The volume.
        name: String,
        /// One key, or every key.
        key: Option<String>,
    },
    /// `volume get NAME KEY|all`.
    Get {
        /// The volume.
        name: String,
        /// A key, or `all`.
        key: String,
    },
    /// `volume set help`.
    SetHelp,
    /// The client volfile of a volume, or the volfile of one of its bricks.
    Getspec {
        /// The volume.
        name: String,
        /// `HOST:DIR`: that brick's volfile instead.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        brick: Option<String>,
        /// The [`volfile_digest`] of the volfile the asker has: the daemon
        /// answers once the volfile differs, or after [`SPEC_WAIT`] (a
        /// mount following its volume; GlusterFS's daemon pushes changes
        /// likewise).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unless: Option<u64>,
    },
    /// Which port brick `HOST:DIR` listens on.
    Portmap {
        /// `HOST:DIR`.
        brick: String,
    },
    /// `volume heal NAME [info|full]`.
    Heal {
        /// The volume.
        name: String,
        /// What to do.
        action: HealAction,
    },
    /// `volume profile NAME start|info|stop`.
    Profile {
        /// The volume.
        name: String,
        /// What to do.
        #[serde(default)]
        action: ProfileAction,
    },
    /// `volume heal NAME split-brain POLICY PATH`.
    SplitBrain {
        /// The volume.
        name: String,
        /// `bigger-file`, `latest-mtime` or `source-brick`.
        policy: String,
        /// The path inside the volume.
        path: String,
        /// The good copy's brick (`HOST:DIR`), with `source-brick`.
        source_brick: Option<String>,
    },
    /// `volume statedump NAME`.
    Statedump {
        /// The volume.
        name: String,
    },
    /// `volume add-brick NAME [replica N] HOST:DIR... [force]`.
    AddBrick {
        /// The volume.
        name: String,
        /// The replica count, if given (it must be the volume's).
        replica: Option<usize>,
        /// `HOST:DIR` each, a whole number of replica sets.
        bricks: Vec<String>,
        /// Allow bricks on the root file system.
        force: bool,
    },
    /// `volume remove-brick NAME HOST:DIR... start|status|commit`.
    RemoveBrick {
        /// The volume.
        name: String,
        /// `HOST:DIR` each, whole replica sets.
        bricks: Vec<String>,
        /// What to do.
        action: RemoveAction,
    },
    /// `volume rebalance NAME fix-layout|start|status|stop`.
    Rebalance {
        /// The volume.
        name: String,
        /// What to do.
        action: RebalanceAction,
    },
    /// `peer add HOST[:PORT]`: the daemon there joins the cluster.
    PeerAdd {
        /// Its daemon's address.
        address: String,
    },
    /// `peer remove NODE`.
    PeerRemove {
        /// The node.
        node: String,
    },
    /// `peer list`.
    PeerList,
    /// Daemon to daemon: who are you, which cluster store do you use?
    Hello,
    /// Daemon to daemon: check these bricks of this node for a create or
    /// add-brick and mark them with the volume id (all or none).
    PrepareBricks {
        /// `HOST:DIR` each, all on the asked node.
        bricks: Vec<String>,
        /// Allow bricks on the root file system.
        force: bool,
        /// The volume id to mark them with.
        id: String,
    },
    /// Daemon to daemon: remove the volume-id mark from these bricks.
    ReleaseBricks {
        /// `HOST:DIR` each, all on the asked node.
        bricks: Vec<String>,
    },
    /// Daemon to daemon: the data files left on a brick of this node
    /// (remove-brick commit).
    BrickFiles {
        /// `HOST:DIR`.
        brick: String,
    },
}

/// What `volume remove-brick` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RemoveAction {
    /// Stop giving the sets new files and move their files to the others.
    Start,
    /// Show the progress of the move.
    Status,
    /// Drop the bricks from the volume, once no file is left on them.
    Commit,
}

/// What `volume rebalance` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebalanceAction {
    /// Rewrite every directory's layout over all replica sets.
    FixLayout,
    /// fix-layout, then move every file whose name hashes elsewhere.
    Start,
    /// Show the progress of the last or current run.
    Status,
    /// Stop the current run after the file in progress.
    Stop,
}

/// A rebalance run's progress, as `volume rebalance NAME status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RebalanceStatus {
    /// The volume.
    pub name: String,
    /// `fix-layout`, `rebalance` or `remove-brick`.
    pub kind: String,
    /// `not started`, `in progress`, `paused` (waiting for a replica set
    /// to be reachable again), `completed`, `stopped` or `failed`.
    pub state: String,
    /// Directories whose layout was fixed.
    pub dirs: u64,
    /// Files looked at.
    pub scanned: u64,
    /// Files moved to another replica set.
    pub moved: u64,
    /// Files left where they are (already in place, or not movable).
    pub skipped: u64,
    /// Files whose move failed (they stay where they were, whole).
    pub failed: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Files counted before the run (0 while counting).
    pub total: u64,
    /// Seconds since the run started.
    pub elapsed_secs: f64,
    /// Estimated seconds left (None until there is a rate).
    pub eta_secs: Option<f64>,
    /// Why the run failed, or the last failure.
    pub error: Option<String>,
    /// Times the run paused because a replica set could not be reached.
    #[serde(default)]
    pub pauses: u64,
}

/// What `volume profile` does. Every brick counts fops and their times
/// all the time (about 1 % of a fop); `start` opens a new window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProfileAction {
    /// Zero every brick's counts: `info` shows what follows.
    Start,
    /// The counts since `start` (or since the bricks started).
    #[default]
    Info,
    /// Keep the counts as they are now: `info` shows them until `start`.
    Stop,
}

/// What `volume heal` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HealAction {
    /// Heal what the indices list.
    Index,
    /// Heal the whole tree.
    Full,
    /// List what needs healing, per brick.
    Info,
}

/// One brick's heal info.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BrickHeal {
    /// `HOST:DIR`.
    pub brick: String,
    /// Its replicate child is up.
    pub up: bool,
    /// Entries its index lists.
    pub entries: u64,
    /// One line per gfid: the kinds of heal it needs, split-brain.
    pub detail: Vec<String>,
}

/// One brick's graph dump.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BrickDump {
    /// `HOST:DIR`.
    pub brick: String,
    /// `node.key = value` lines, top first; empty when the brick did not
    /// answer.
    pub dump: Vec<String>,
    /// Why there is no dump.
    pub error: Option<String>,
}

/// One brick's state, as `volume status` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BrickStatus {
    /// The host.
    pub host: String,
    /// The directory.
    pub dir: String,
    /// The port it listens on (or last listened on).
    pub port: Option<u16>,
    /// Its process, while it runs.
    pub pid: Option<u32>,
    /// Serving now.
    pub up: bool,
    /// Free bytes on the brick's file system.
    pub disk_free: Option<u64>,
    /// Times it was restarted after dying.
    pub restarts: u32,
}

/// One volume's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeState {
    /// The volume.
    pub name: String,
    /// created, started, stopped.
    pub status: String,
    /// Its bricks.
    pub bricks: Vec<BrickStatus>,
    /// Its self-heal daemon, while the volume is started.
    #[serde(default)]
    pub shd: Option<super::shd::ShdStatus>,
}

/// One key's value for `volume get`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: String,
    /// Set by a user (else the default).
    pub set: bool,
}

/// A successful answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Reply {
    /// Done; what was done.
    Done {
        /// For people.
        message: String,
    },
    /// Volume specs (info).
    Volumes {
        /// The specs.
        volumes: Vec<VolumeSpec>,
    },
    /// Volume states (status).
    Status {
        /// The states.
        volumes: Vec<VolumeState>,
    },
    /// Key values (get).
    Values {
        /// The values.
        values: Vec<KeyValue>,
    },
    /// Every key (set help).
    Help {
        /// The keys.
        keys: Vec<KeyHelp>,
    },
    /// A client volfile (getspec).
    Spec {
        /// The volfile text.
        volfile: String,
        /// The store revision of the spec it was made from.
        revision: u64,
    },
    /// A brick's port (portmap).
    Port {
        /// The port.
        port: u16,
    },
    /// Heal info per brick.
    HealInfo {
        /// The volume.
        name: String,
        /// Its bricks.
        bricks: Vec<BrickHeal>,
    },
    /// The bricks' fop timings (profile info), as
    /// [`ProfileBundle::to_text`](crate::profile::ProfileBundle::to_text).
    Profile {
        /// The bundle's text.
        bundle: String,
    },
    /// Each brick's graph dump (statedump).
    Statedump {
        /// The dumps.
        bricks: Vec<BrickDump>,
    },
    /// A rebalance's progress.
    Rebalance {
        /// The progress.
        status: RebalanceStatus,
    },
    /// Who a daemon is.
    Hello {
        /// Its node name (`--node`), if it has one.
        node: Option<String>,
        /// The id of the cluster store it uses.
        cluster: String,
    },
    /// Bricks checked and marked, their directories canonical.
    Bricks {
        /// `HOST:DIR` each.
        bricks: Vec<String>,
    },
    /// The cluster's nodes.
    Peers {
        /// Each node.
        peers: Vec<PeerStatus>,
    },
    /// Data files left on a brick.
    Files {
        /// How many.
        count: u64,
        /// One of them.
        example: String,
    },
}

/// One node of the cluster, as `peer list` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Its name.
    pub node: String,
    /// Its daemon's address.
    pub address: String,
    /// Its daemon answered just now.
    pub connected: bool,
    /// It is the daemon that answered this request.
    pub this: bool,
}

/// The daemon's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Response {
    /// It worked.
    Ok(Reply),
    /// It was refused; the message says why and nothing changed.
    Error(String),
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The daemon could not be reached.
    #[error("cannot reach the xlfs daemon at {addr}: {source} (is `xlfs daemon` running there?)")]
    Unreachable {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The exchange failed midway.
    #[error("xlfs daemon at {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// No answer in time.
    #[error("xlfs daemon at {addr}: no answer within {CALL_TIMEOUT:?}")]
    Timeout {
        /// The address.
        addr: String,
    },
    /// The daemon refused the request.
    #[error("{0}")]
    Refused(String),
}

fn invalid(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

/// Reads one frame and decodes it; `None` at a clean end of stream.
pub async fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(invalid(format!("frame of {len} bytes is over the {MAX_FRAME} limit")));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf).await?;
    serde_json::from_slice(&buf).map(Some).map_err(|e| invalid(format!("bad frame: {e}")))
}

/// Encodes and writes one frame.
pub async fn write_frame<T: Serialize>(w: &mut (impl AsyncWrite + Unpin), msg: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| invalid(e.to_string()))?;
    let len =
        u32::try_from(body.len()).ok().filter(|l| *l <= MAX_FRAME).ok_or_else(|| invalid("frame too big".into()))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await
}

/// Sends `req` to the daemon at `addr` and returns its reply.
pub async fn call(addr: &str, req: &Request) -> Result<Reply, ProtocolError> {
    let io = |source| ProtocolError::Io { addr: addr.to_string(), source };
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| ProtocolError::Unreachable { addr: addr.to_string(), source })?;
        write_frame(&mut s, req).await.map_err(io)?;
        match read_frame::<Response>(&mut s).await.map_err(io)? {
            Some(Response::Ok(reply)) => Ok(reply),
            Some(Response::Error(why)) => Err(ProtocolError::Refused(why)),
            None => Err(io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed without an answer"))),
        }
    };
    tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(ProtocolError::Timeout { addr: addr.to_string() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_oversized_ones_are_refused() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let req = Request::Create {
            name: "v".into(),
            replica: Some(3),
            bricks: vec!["h:/b".into()],
            force: true,
            options: Vec::new(),
        };
        write_frame(&mut a, &req).await.expect("write");
        assert_eq!(read_frame::<Request>(&mut b).await.expect("read"), Some(req));
        a.write_all(&(MAX_FRAME + 1).to_be_bytes()).await.expect("write");
        assert!(read_frame::<Request>(&mut b).await.is_err());
        drop(a);
        let (mut a, mut b) = tokio::io::duplex(64);
        drop(std::mem::replace(&mut a, tokio::io::duplex(1).0));
        assert!(read_frame::<Request>(&mut b).await.expect("clean end").is_none());
    }

    #[tokio::test]
    async fn an_unreachable_daemon_is_named() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        drop(l);
        let e = call(&addr, &Request::SetHelp).await.expect_err("nobody listens");
        assert!(e.to_string().starts_with(&format!("cannot reach the xlfs daemon at {addr}")), "{e}");
    }
}
