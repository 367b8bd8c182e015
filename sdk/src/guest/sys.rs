//! The plugin ABI v1's raw contract, shared by the hosts (`xlfs-runtime`)
//! and the guest SDK: export and import names, flags, the native host
//! vtable, the plugin descriptor's encoding and the framing of the messages
//! that cross the boundary. `sdk/PLUGIN-ABI.md` is the specification; this
//! module is its reference implementation and is compiled with or without
//! the `guest` feature.
//!
//! This file holds the guest's export names, the version marker and the
//! handler results; beside it:
//! - `sys/vtable.rs`: the host functions' import names, `wind` flags, log
//!   levels and the native host vtable;
//! - `sys/descriptor.rs`: the plugin descriptor (fop and event sets,
//!   declared options) and its encoding;
//! - `sys/message.rs`: the framing of fop messages and their data buffers;
//! - `sys/node.rs`: the optional translator exports of ABI v1.2 (dump and
//!   reconfigure);
//! - `sys/policy.rs`: the optional policy exports of ABI v1.1 and their
//!   messages.

use crate::abi::{self, AbiVersion};

mod descriptor;
mod message;
mod node;
mod policy;
mod vtable;

pub use descriptor::{
    DeclaredOption, DeclaredType, Descriptor, DescriptorError, EventSet, FopSet, MAX_DESCRIPTOR, MAX_OPTIONS,
    Placement, UNLIMITED_CHILDREN,
};
pub use message::{
    CALL_HEADER, decode_call, encode_call, put_fop_data, put_result_data, split_call, take_fop_data, take_result_data,
};
pub use node::{MAX_DUMP, NodeExports, RECONFIGURE_UNSUPPORTED, decode_dump, encode_dump, node_exports};
pub use policy::{
    LOCK_VIEW_LEN, LOCK_WANTS_INODELK_COUNT, LOCK_WANTS_OPEN_FD_COUNT, MAX_ADVICE, MAX_ADVICE_RANGES, PolicyExports,
    decode_advice, decode_decision, decode_lock_view, encode_advice, encode_decision, encode_lock_view, interest_bits,
    interest_from_bits, policy_exports,
};
pub use vtable::{HostVtable, IMPORT_MODULE, NO_BUF, WIND_AS_IS, WIND_TAIL, imports, log_level};

/// The version marker export's name starts with this, followed by
/// `<major>_<minor>` (`xlfs_abi_version_1_0`).
pub const VERSION_PREFIX: &str = "xlfs_abi_version_";

/// The guest's exports (functions, plus `memory` for WebAssembly).
pub mod exports {
    /// Allocates guest memory for the host to write a message into.
    pub const ALLOC: &str = "xlfs_alloc";
    /// Frees what [`ALLOC`] returned.
    pub const FREE: &str = "xlfs_free";
    /// Declares the plugin (options, fop and event masks, children).
    pub const DESCRIBE: &str = "xlfs_describe";
    /// Builds an instance from its options.
    pub const INIT: &str = "xlfs_init";
    /// A fop arrived.
    pub const ON_FOP: &str = "xlfs_on_fop";
    /// A wound call's reply arrived.
    pub const ON_REPLY: &str = "xlfs_on_reply";
    /// A timer fired.
    pub const ON_TIMER: &str = "xlfs_on_timer";
    /// An event arrived.
    pub const ON_EVENT: &str = "xlfs_on_event";
    /// The instance is done.
    pub const FINI: &str = "xlfs_fini";
    /// A WebAssembly guest's linear memory.
    pub const MEMORY: &str = "memory";
}

/// `xlfs_on_event`'s `from` for an event from the graph (not a child).
pub const FROM_GRAPH: i32 = -1;
/// `xlfs_on_event` result: pass the event on to the node's parents.
pub const EVENT_PASS: i32 = 1;
/// `xlfs_on_event` result: stop the event here.
pub const EVENT_STOP: i32 = 0;
/// A handler's result when it did its work.
pub const HANDLER_OK: i32 = 0;
/// A handler's result when it failed (a caught panic); the host treats it
/// as a crash of the instance.
pub const HANDLER_FAILED: i32 = -1;

/// The name of the version marker export for `v`: `xlfs_abi_version_1_0`.
pub fn version_symbol(v: AbiVersion) -> String {
    format!("{VERSION_PREFIX}{}_{}", v.major, v.minor)
}

/// Reads the version out of a marker export's name (`xlfs_abi_version_1_0`
/// is v1.0); `None` for any other name.
pub fn parse_version_symbol(name: &str) -> Option<AbiVersion> {
    let rest = name.strip_prefix(VERSION_PREFIX)?;
    let (major, minor) = rest.split_once('_')?;
    let num =
        |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u16>().ok()).flatten();
    Some(AbiVersion::new(num(major)?, num(minor)?))
}

/// The plugin ABI's version: the encoding's major ([`abi::ABI_MAJOR`]) and
/// the plugin interface's own minor, which moves without the encoding's
/// (v1.1 adds the policy exports, v1.2 `xlfs_dump` and `xlfs_reconfigure`,
/// v1.3 "as it came": [`WIND_AS_IS`] and an `unwind` with an empty message,
/// v1.4 the descriptor's [`Placement`]; the messages are encoding v1.0).
/// The host loads a plugin by ABI §8's rule against this version.
pub const PLUGIN_ABI: AbiVersion = AbiVersion::new(abi::ABI_MAJOR, 4);

/// The first plugin ABI minor with [`WIND_AS_IS`] and the empty `unwind`.
pub const AS_IS_MINOR: u16 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_symbols() {
        assert_eq!(version_symbol(AbiVersion::new(1, 0)), "xlfs_abi_version_1_0");
        assert_eq!(parse_version_symbol("xlfs_abi_version_2_13"), Some(AbiVersion::new(2, 13)));
        for bad in
            ["xlfs_abi_version_1", "xlfs_abi_version__0", "xlfs_abi_version_1_x", "xlfs_init", "xlfs_abi_version_1_0_0"]
        {
            assert_eq!(parse_version_symbol(bad), None, "{bad}");
        }
    }
}
