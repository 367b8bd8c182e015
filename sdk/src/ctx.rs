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
    /// Memory the caller lends for a read's data (see [`Lent`]). Never
    /// encoded; ignored by comparisons.
    pub lent: Lent,
}

/// Memory lent for the data of a read: a brick's protocol/server lends the
/// chunk of a local client's shared memory that the client lent for the
/// reply, so the translator that reads (storage/posix) reads into it and
/// the data reaches the client with no copy on the way. Any translator may
/// ignore it (the data is then copied there). One use: the first
/// [`Lent::take`] gets it.
#[derive(Clone, Default)]
pub struct Lent(Option<Arc<LentSlot>>);

/// The one-use slot a [`Lent`] shares between its clones.
type LentSlot = std::sync::Mutex<Option<Box<dyn LentMem>>>;

/// The memory behind a [`Lent`].
pub trait LentMem: Send {
    /// How many bytes it holds.
    fn capacity(&self) -> usize;
    /// The bytes to fill.
    fn as_mut_slice(&mut self) -> &mut [u8];
    /// The first `len` bytes (at most the slice's length), as `Bytes`
    /// over the lent memory.
    fn freeze(self: Box<Self>, len: usize) -> bytes::Bytes;
}

impl Lent {
    /// Lends `mem`.
    pub fn new(mem: Box<dyn LentMem>) -> Lent {
        Lent(Some(Arc::new(std::sync::Mutex::new(Some(mem)))))
    }

    /// The memory, once.
    pub fn take(&self) -> Option<Box<dyn LentMem>> {
        self.0.as_ref()?.lock().ok()?.take()
    }
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Lent(some)" } else { "Lent(none)" })
    }
}

impl PartialEq for Lent {
    fn eq(&self, _: &Lent) -> bool {
        true
    }
}

impl Eq for Lent {}

impl std::hash::Hash for Lent {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

impl CallCtx {
    /// Pids from here up are the filesystem's own daemons, not an
    /// application (GlusterFS gives them negative pids): performance/io-threads
    /// runs their fops at least priority, and features/upcall does not count
    /// them as caching what they touch.
    pub const DAEMON_PIDS: u32 = 0xffff_ff00;
    /// The pid of self-heal's fops, in the self-heal daemon and in a mount's
    /// background heal (GlusterFS's `GF_CLIENT_PID_SELF_HEALD`, -6).
    pub const SELF_HEAL_PID: u32 = -6i32 as u32;

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
            lent: Lent::default(),
        }
    }
    /// A root caller for self-heal's fops (pid [`CallCtx::SELF_HEAL_PID`]).
    pub fn self_heal(client_id: impl Into<Arc<str>>) -> CallCtx {
        CallCtx { pid: CallCtx::SELF_HEAL_PID, ..CallCtx::root(client_id) }
    }

    /// Whether the caller is one of the filesystem's daemons
    /// ([`CallCtx::DAEMON_PIDS`]).
    pub fn is_daemon(&self) -> bool {
        self.pid >= CallCtx::DAEMON_PIDS
    }

    /// The same caller with another lock owner.
    pub fn with_lk_owner(&self, owner: u64) -> CallCtx {
        CallCtx { lk_owner: owner, ..self.clone() }
    }
}
