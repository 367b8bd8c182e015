//! protocol/server (being written; see the network issue).

use xlfs_sdk::{InitCtx, InitError, XlatorType};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "protocol/server",
    description: "not yet built",
    options: &[],
    min_children: 0,
    max_children: usize::MAX,
    build: |_ctx: InitCtx| Err(InitError::new("protocol/server is not built yet")),
};
