//! storage/posix (being written; see the foundation issue).

use xlfs_sdk::{InitCtx, InitError, XlatorType};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "storage/posix",
    description: "not yet built",
    options: &[],
    min_children: 0,
    max_children: usize::MAX,
    build: |_ctx: InitCtx| Err(InitError::new("storage/posix is not built yet")),
};
