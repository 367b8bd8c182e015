//! protocol/client (being written; see the network issue).

use xlfs_sdk::{InitCtx, InitError, XlatorType};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "protocol/client",
    description: "not yet built",
    options: &[],
    min_children: 0,
    max_children: usize::MAX,
    build: |_ctx: InitCtx| Err(InitError::new("protocol/client is not built yet")),
};
