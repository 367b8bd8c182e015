//! [`CallCtx`]: who is calling, carried with every fop (GlusterFS's
//! `call_frame_t->root`).

use std::sync::Arc;

use crate::profile::Frame;

/// The caller's identity and lock owner.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CallCtx {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Arc<[u32]>,
    /// Process id of the caller (informational).
    pub pid: u32,
    /// The lock owner; POSIX locks and inodelks with the same owner from the
    /// same client never conflict.
    pub lk_owner: u64,
    /// The client this call comes from (a mount, an API client, a brick's
    /// view of a connected peer). Locks are released per client.
    pub client_id: Arc<str>,
    /// The timing frame of the fop being handled (see [`crate::profile`]):
    /// set by the runtime when it calls a node, passed on with the context
    /// so that the child calls a translator makes are subtracted from its
    /// self time. Never encoded; ignored by comparisons.
    pub frame: Frame,
}

impl CallCtx {
    /// A root caller for a given client (used by the in-process API, tests,
    /// and internal fops such as self-heal).
    pub fn root(client_id: impl Into<Arc<str>>) -> CallCtx {
        CallCtx {
            uid: 0,
            gid: 0,
            groups: Arc::from(Vec::new()),
            pid: 0,
            lk_owner: 0,
            client_id: client_id.into(),
            frame: Frame::none(),
        }
    }
    /// The same caller with another lock owner.
    pub fn with_lk_owner(&self, owner: u64) -> CallCtx {
        CallCtx { lk_owner: owner, ..self.clone() }
    }
}
