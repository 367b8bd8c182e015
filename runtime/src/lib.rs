//! # xlfs-runtime
//!
//! The core runtime around the translators: the volfile parser
//! ([`volfile`]), the translator registry ([`registry`]) and graph
//! ([`graph`]), the inode and fd tables ([`inode`], [`fd`]), the FUSE bridge
//! ([`fuse`]), live reload of a mount's graph ([`reload`]), and the
//! in-process client API ([`client`], like GlusterFS's libgfapi). The `xlfs` binary is in `main.rs`.
#![deny(missing_docs)]

pub mod cli;
pub mod client;
pub mod fd;
pub mod fuse;
pub mod graph;
pub mod inode;
pub mod mgmt;
pub mod plugin;
pub mod profile;
pub mod registry;
pub mod reload;
pub mod volfile;
