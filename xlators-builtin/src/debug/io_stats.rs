//! debug/io-stats (being written; see the foundation issue).

use xlfs_sdk::{InitCtx, InitError, XlatorType};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "debug/io-stats",
    description: "not yet built",
    options: &[],
    min_children: 0,
    max_children: usize::MAX,
    build: |_ctx: InitCtx| Err(InitError::new("debug/io-stats is not built yet")),
};
