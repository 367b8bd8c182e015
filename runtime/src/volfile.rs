//! volfile (being written).
