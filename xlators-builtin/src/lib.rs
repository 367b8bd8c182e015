//! # xlfs-xlators
//!
//! The built-in translators, one module per translator, named as in
//! GlusterFS (`storage/posix` lives in `storage/posix.rs`). Each module
//! declares its options beside the code that reads them and exposes its
//! [`XlatorType`] as `TYPE`; [`builtin_types`] lists them all for the
//! runtime's registry.
#![deny(missing_docs)]

use xlfs_sdk::XlatorType;

pub mod storage {
    //! Translators that store data on a brick.
    pub mod posix;
}

pub mod cluster {
    //! Translators over several subvolumes.
    pub mod distribute;
    pub mod replicate;
}

pub mod features {
    //! Brick-side features, and the client's change stamps.
    pub mod index;
    pub mod locks;
    pub mod upcall;
    pub mod utime;
}

pub mod protocol {
    //! The network: the RPC transport and the client and server translators.
    pub mod client;
    pub mod rpc;
    pub mod server;
}

pub mod performance {
    //! Translators that trade work for speed.
    pub mod io_threads;
    pub mod md_cache;
    pub mod open_behind;
    pub mod quick_read;
    pub mod read_ahead;
    pub mod readdir_ahead;
    pub mod write_behind;
}

pub mod task;

pub mod debug {
    //! Diagnosis and fault injection.
    pub mod error_gen;
    pub mod io_stats;
}

/// Every built-in translator type.
pub fn builtin_types() -> Vec<XlatorType> {
    vec![
        storage::posix::TYPE,
        features::locks::TYPE,
        features::index::TYPE,
        features::upcall::TYPE,
        features::utime::TYPE,
        debug::io_stats::TYPE,
        debug::error_gen::TYPE,
        performance::io_threads::TYPE,
        performance::read_ahead::TYPE,
        performance::quick_read::TYPE,
        performance::open_behind::TYPE,
        performance::readdir_ahead::TYPE,
        performance::write_behind::TYPE,
        performance::md_cache::TYPE,
        protocol::client::TYPE,
        protocol::server::TYPE,
        cluster::replicate::TYPE,
        cluster::distribute::TYPE,
        cluster::distribute::TYPE_DHT,
    ]
}
