//! Management: what `xlfs daemon` (GlusterFS's glusterd) does on a node.
//!
//! - [`spec`]: volume specs (typed, shown as TOML);
//! - [`store`]: where specs are kept ([`store::Store`], a small
//!   revisioned key-value interface; [`store::FileStore`] embedded in the
//!   state directory, [`store::etcd::EtcdStore`] shared by several nodes);
//! - [`cluster`]: peers, bricks on other nodes, and each daemon following
//!   the shared store to serve its own bricks;
//! - [`bricks`]: brick directories on this node (checks, the volume-id
//!   mark, files left);
//! - [`gluster_info`]: a `gluster volume info` listing, to create the same
//!   volume (`volume create NAME --from-info FILE`);
//! - [`keys`]: `volume set` keys, checked against the translators' option
//!   declarations;
//! - [`volgen`]: the client volfile of a volume;
//! - [`supervisor`]: brick processes (start, restart with backoff, stop)
//!   and the portmapper;
//! - [`shd`]: a self-heal daemon (`xlfs heal --daemon`) per started
//!   volume, following its volfile;
//! - [`protocol`]: the CLI's framed JSON requests and responses;
//! - [`rebalance`]: `volume rebalance`'s crawl, run by the daemon as a
//!   client of the volume, and its progress;
//! - [`daemon`]: request handling and the TCP server.
//!
//! The CLI side is `runtime/src/cli/daemon.rs` (`xlfs daemon`, `xlfs
//! volume`), and `xlfs mount HOST:/VOLUME` in `runtime/src/cli/mount.rs`.

pub mod bricks;
pub mod cluster;
pub mod daemon;
pub mod gluster_info;
pub mod keys;
pub mod protocol;
pub mod rebalance;
pub mod shd;
pub mod spec;
pub mod store;
pub mod supervisor;
pub mod volgen;
