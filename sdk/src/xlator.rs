//! The [`Xlator`] trait every translator implements, how a translator holds
//! its [`Child`]ren, and the [`Event`]s that travel between graph nodes.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

use crate::ctx::CallCtx;
use crate::fop::{FopResult, Request};
use crate::options::Options;
use crate::profile::GraphProfile;
use crate::types::Gfid;

/// The future a fop call returns.
pub type FopFuture<'a> = Pin<Box<dyn Future<Output = FopResult> + Send + 'a>>;

/// A translator: one node of the graph. It receives fops from its parents
/// through [`Xlator::call`], handles them or forwards them to its children,
/// and answers with a reply or an errno.
///
/// Translators are built by their type's constructor (see [`XlatorType`]),
/// which plays GlusterFS's `init`; [`Xlator::fini`] is called once the graph
/// is done with the node.
pub trait Xlator: Send + Sync + 'static {
    /// Handles one fop. A translator forwards what it does not handle to its
    /// first child, like GlusterFS's default fops ([`Child::call`]).
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_>;

    /// An event arrived, from a child (upward: child up/down, upcalls) or
    /// from the graph (downward: parent up/down). Return the event to pass on
    /// to this node's parents, or `None` to stop it here. The default passes
    /// every event from a child on unchanged and keeps parent events.
    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        match from {
            EventFrom::Child(_) => Some(event),
            EventFrom::Graph => None,
        }
    }

    /// Applies changed option values to the running translator. The options
    /// are already validated. The default says the translator cannot, and the
    /// runtime then replaces it by a new instance instead.
    fn reconfigure(&self, _options: &Options) -> Result<(), ReconfigureError> {
        Err(ReconfigureError::Unsupported)
    }

    /// State for diagnosis (GlusterFS's statedump): key/value lines.
    fn dump(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Called once when the graph that holds this node is torn down.
    fn fini(&self) {}
}

/// Why reconfigure did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ReconfigureError {
    /// The translator does not support changing options while running.
    #[error("this translator does not support reconfigure")]
    Unsupported,
    /// The new values are refused.
    #[error("{0}")]
    Invalid(String),
}

/// A child of a translator: its volume name and the node itself.
#[derive(Clone)]
pub struct Child {
    /// The child's volume name in the volfile.
    pub name: Arc<str>,
    /// The child node.
    pub xl: Arc<dyn Xlator>,
}

impl Child {
    /// Winds a fop to this child.
    pub fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        self.xl.call(ctx, req)
    }
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Child({})", self.name)
    }
}

/// Where an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventFrom {
    /// From the child at this index in the node's `subvolumes` list.
    Child(usize),
    /// From the graph itself (parent up/down, sent to every node).
    Graph,
}

/// Events between graph nodes (GlusterFS's `notify` events).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The child can serve fops.
    ChildUp,
    /// The child cannot serve fops (for example its brick is unreachable).
    ChildDown,
    /// The child is trying to connect.
    ChildConnecting,
    /// The graph is active: leaves may start serving (and say ChildUp) and
    /// network clients may connect.
    ParentUp,
    /// The graph is going away.
    ParentDown,
    /// A notice from below about an inode (cache invalidation, lock
    /// contention), GlusterFS's upcalls.
    Upcall(Upcall),
    /// Sent by the graph to every node (from [`EventFrom::Graph`]) when a
    /// client is gone (disconnected, unmounted, dropped): release all it held
    /// (locks, fds), as GlusterFS's `client_destroy`.
    ClientGone {
        /// The [`CallCtx::client_id`](crate::CallCtx) of the client.
        client_id: String,
    },
}

/// A server-originated notice about an inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upcall {
    /// Another request waits for an inodelk the client holds: the holder
    /// should release it soon (drives eager-lock release).
    InodelkContention {
        /// The inode.
        gfid: Gfid,
        /// The lock domain.
        domain: String,
        /// The client holding the lock that is in the way.
        holder_client: String,
        /// That holder's lock owner.
        holder_owner: u64,
    },
    /// Likewise for an entrylk.
    EntrylkContention {
        /// The directory inode.
        gfid: Gfid,
        /// The lock domain.
        domain: String,
        /// The locked name.
        name: String,
        /// The client holding the lock.
        holder_client: String,
    },
    /// The inode changed through another client: drop cached data and
    /// attributes.
    Invalidate {
        /// The inode.
        gfid: Gfid,
    },
    /// Inside a brick: [`Upcall::Invalidate`] for one client only
    /// (features/upcall names the clients that have the inode cached;
    /// protocol/server sends each of them a plain `Invalidate`).
    InvalidateFor {
        /// The inode.
        gfid: Gfid,
        /// The [`CallCtx::client_id`](crate::CallCtx) to tell.
        client: String,
    },
}

type TopHook = Arc<dyn Fn(&Event) + Send + Sync>;
type ProfileHook = Arc<dyn Fn(bool) -> GraphProfile + Send + Sync>;
type DumpHook = Arc<dyn Fn() -> Vec<(String, String)> + Send + Sync>;

struct ParentLink {
    xl: Weak<dyn Xlator>,
    index: usize,
    sink: EventSink,
}

#[derive(Default)]
struct SinkInner {
    parents: RwLock<Vec<ParentLink>>,
    hook: RwLock<Option<TopHook>>,
    graph: RwLock<Option<TopHook>>,
    profile: RwLock<Option<ProfileHook>>,
    dump: RwLock<Option<DumpHook>>,
}

/// How a translator sends events to its parents. The runtime gives each
/// node one at construction and links it to the parents once they exist;
/// events sent before that reach only the graph's hook (if any).
#[derive(Clone, Default)]
pub struct EventSink(Arc<SinkInner>);

impl EventSink {
    /// A sink with no parents yet.
    pub fn new() -> EventSink {
        EventSink::default()
    }

    /// Delivers `event` to every parent's [`Xlator::notify`], and on upward
    /// from there what each parent passes on.
    pub fn send(&self, event: Event) {
        let parents: Vec<(Arc<dyn Xlator>, usize, EventSink)> = self
            .0
            .parents
            .read()
            .iter()
            .filter_map(|p| p.xl.upgrade().map(|xl| (xl, p.index, p.sink.clone())))
            .collect();
        for (xl, index, sink) in parents {
            if let Some(next) = xl.notify(event.clone(), EventFrom::Child(index)) {
                sink.send(next);
            }
        }
        let hook = self.0.hook.read().clone();
        if let Some(hook) = hook {
            hook(&event);
        }
    }

    /// Runtime use: links a parent that holds this node as child `index`.
    pub fn attach_parent(&self, parent: Weak<dyn Xlator>, index: usize, parent_sink: EventSink) {
        self.0.parents.write().push(ParentLink { xl: parent, index, sink: parent_sink });
    }

    /// Sends a graph event to every node of the graph this node is in, as
    /// the graph itself does ([`EventFrom::Graph`]); protocol/server sends
    /// [`Event::ClientGone`] this way when a connection ends. Does nothing
    /// before the runtime has linked the sink to its graph.
    pub fn broadcast(&self, event: Event) {
        let graph = self.0.graph.read().clone();
        if let Some(graph) = graph {
            graph(&event);
        }
    }

    /// Runtime use: what [`EventSink::broadcast`] calls.
    pub fn set_broadcast(&self, f: impl Fn(&Event) + Send + Sync + 'static) {
        *self.0.graph.write() = Some(Arc::new(f));
    }

    /// A snapshot of the fop timings of the graph this node is in (see
    /// [`crate::profile`]); with `reset` the counters restart from zero
    /// after it is taken. protocol/server answers a brick's profile
    /// request with it. `None` before the runtime has linked the sink to
    /// its graph.
    pub fn graph_profile(&self, reset: bool) -> Option<GraphProfile> {
        let hook = self.0.profile.read().clone();
        hook.map(|h| h(reset))
    }

    /// Runtime use: what [`EventSink::graph_profile`] calls.
    pub fn set_profile(&self, f: impl Fn(bool) -> GraphProfile + Send + Sync + 'static) {
        *self.0.profile.write() = Some(Arc::new(f));
    }

    /// The diagnostic state of every node of the graph this node is in
    /// (GlusterFS's statedump: `VOLUME.key`, value, top first).
    /// protocol/server answers a brick's statedump request
    /// ([`crate::profile::STATEDUMP_KEY`]) with it. `None` before the
    /// runtime has linked the sink to its graph.
    pub fn graph_dump(&self) -> Option<Vec<(String, String)>> {
        let hook = self.0.dump.read().clone();
        hook.map(|h| h())
    }

    /// Runtime use: what [`EventSink::graph_dump`] calls.
    pub fn set_dump(&self, f: impl Fn() -> Vec<(String, String)> + Send + Sync + 'static) {
        *self.0.dump.write() = Some(Arc::new(f));
    }

    /// Runtime use: observes every event this sink sends (the graph watches
    /// its top node this way).
    pub fn set_hook(&self, hook: impl Fn(&Event) + Send + Sync + 'static) {
        *self.0.hook.write() = Some(Arc::new(hook));
    }
}

/// What a translator type's constructor receives (GlusterFS's `init`).
pub struct InitCtx {
    /// This node's volume name.
    pub name: String,
    /// Validated options with defaults applied.
    pub options: Options,
    /// The children, in `subvolumes` order.
    pub children: Vec<Child>,
    /// Where to send events for the parents.
    pub events: EventSink,
    /// The policy loaders the graph offers, for options that name a
    /// policy module ([`OptType::Module`](crate::OptType::Module)).
    pub policies: crate::policy::Policies,
}

/// Why a translator could not be built.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InitError(pub String);

impl InitError {
    /// An error with a message.
    pub fn new(msg: impl Into<String>) -> InitError {
        InitError(msg.into())
    }
}

/// A translator type: its volfile name (`storage/posix`), options, how many
/// children it takes, and its constructor.
#[derive(Clone)]
pub struct XlatorType {
    /// The `type` name in volfiles.
    pub name: &'static str,
    /// One line on what it does.
    pub description: &'static str,
    /// Declared options.
    pub options: &'static [crate::options::OptionDecl],
    /// Fewest children.
    pub min_children: usize,
    /// Most children (`usize::MAX` for no limit).
    pub max_children: usize,
    /// Builds an instance.
    pub build: fn(InitCtx) -> Result<Arc<dyn Xlator>, InitError>,
}

impl std::fmt::Debug for XlatorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "XlatorType({})", self.name)
    }
}
