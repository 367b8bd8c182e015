//! inode (being written).
