//! debug/error-gen (being written; see the foundation issue).

use xlfs_sdk::{InitCtx, InitError, XlatorType};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "debug/error-gen",
    description: "not yet built",
    options: &[],
    min_children: 0,
    max_children: usize::MAX,
    build: |_ctx: InitCtx| Err(InitError::new("debug/error-gen is not built yet")),
};
