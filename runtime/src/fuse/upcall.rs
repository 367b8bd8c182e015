//! Invalidation upcalls from the bricks (another client changed an inode)
//! turned into FUSE notifications: the inode's attributes and cached data
//! are dropped (`inval_inode`), and so are the kernel's entries for the
//! names it is known by and, for a directory, the names cached under it
//! (`inval_entry`), so the next access looks them up again. Inodes the
//! kernel does not hold need nothing. If upcalls were lost (the channel
//! overflowed), every inode the kernel holds is invalidated.
//!
//! Notifications write to `/dev/fuse` and the kernel may wait on page
//! locks while handling them, so they run on the blocking pool.

use std::sync::Weak;

use fuser::INodeNo;
use tokio::sync::{broadcast, watch};
use xlfs_sdk::{Gfid, Upcall};

use super::Core;

/// Forwards upcalls to the kernel until the session ends or the graph
/// drops its sender.
pub(super) async fn watch(core: Weak<Core>, mut rx: broadcast::Receiver<Upcall>, mut ended: watch::Receiver<bool>) {
    loop {
        let got = tokio::select! {
            r = rx.recv() => r,
            _ = ended.wait_for(|e| *e) => return,
        };
        let Some(core) = core.upgrade() else { return };
        let gfids = match got {
            Ok(Upcall::Invalidate { gfid }) => Some(vec![gfid]),
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(lost = n, "upcalls lost; invalidating every cached inode");
                None
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let _ = tokio::task::spawn_blocking(move || invalidate(&core, gfids)).await;
    }
}

/// Invalidates the given inodes, or all cached ones.
fn invalidate(core: &Core, gfids: Option<Vec<Gfid>>) {
    let Some(n) = core.notifier.get() else { return };
    let gfids = match gfids {
        Some(g) => g,
        None => {
            for id in core.inodes.nodeids() {
                let _ = n.inval_inode(INodeNo(id), 0, 0);
            }
            return;
        }
    };
    for gfid in gfids {
        let Some(inode) = core.inodes.get(gfid) else { continue };
        if let Err(e) = n.inval_inode(INodeNo(inode.nodeid()), 0, 0) {
            tracing::debug!(%gfid, error = %e, "inval_inode");
        }
        for (parent, name) in core.inodes.names(gfid) {
            if let Some(p) = core.inodes.get(parent) {
                let _ = n.inval_entry(INodeNo(p.nodeid()), std::ffi::OsStr::new(&*name));
            }
        }
        for name in core.inodes.children(gfid) {
            let _ = n.inval_entry(INodeNo(inode.nodeid()), std::ffi::OsStr::new(&*name));
        }
        tracing::debug!(%gfid, "invalidated");
    }
}
