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

pub mod features {
    //! Brick-side features.
    pub mod locks;
}

pub mod debug {
    //! Diagnosis and fault injection.
    pub mod error_gen;
    pub mod io_stats;
}

/// Every built-in translator type.
pub fn builtin_types() -> Vec<XlatorType> {
    vec![storage::posix::TYPE, features::locks::TYPE, debug::io_stats::TYPE, debug::error_gen::TYPE]
}
