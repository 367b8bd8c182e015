//! Always-on fop timing of every graph node (`xlfs profile`).
//!
//! [`crate::graph::Graph::from_spec`] wraps every node it builds in a
//! [`Timed`] node: the parents' [`xlfs_sdk::Child`]ren and the
//! graph's top are the wrappers, so every call of a node, by a parent or by
//! the FUSE bridge, the client API or protocol/server, goes through one.
//! Built-in translators and plugins are timed alike and know nothing of it.
//!
//! A wrapper reads the clock when it is called and when the call's future
//! completes, and adds to its node's counters for the fop kind: calls,
//! total nanoseconds and self nanoseconds (the total minus the time the
//! node waited for its children on behalf of that call; what counts is
//! defined in [`xlfs_sdk::profile`]). The counters are a fixed array of
//! relaxed atomics per node indexed by [`FopKind::index`]: no lock, and
//! the only allocations are the wrapper's boxed future and, for a node
//! that has children, its call's [`Frame`]. A call whose future is dropped
//! before it completes (cancelled) is not counted, but ends its interval
//! in its parent's frame.
//!
//! [`Profiler`] holds every node's counters with the graph's names, types
//! and edges, makes [`GraphProfile`] snapshots and resets the counters.
//! [`collect`] adds, for each protocol/client node, the profile of the
//! brick it talks to, asked over that node's own connection (a getxattr
//! of [`PROFILE_KEY`] that protocol/server answers itself):
//! a [`ProfileBundle`], which `xlfs profile` joins and prints
//! ([`crate::cli::profile`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use xlfs_sdk::options::Options;
use xlfs_sdk::profile::{
    FopTimes, Frame, GraphProfile, NodeProfile, PROFILE_KEY, PROFILE_RESET_KEY, ticks, ticks_to_ns,
};
use xlfs_sdk::xlator::ReconfigureError;
use xlfs_sdk::{CallCtx, Child, Event, EventFrom, Fop, FopFuture, FopKind, FopResult, Loc, Reply, Request, Xlator};

/// One fop kind's counters of one node (times in clock ticks,
/// [`xlfs_sdk::profile::ticks`]).
#[derive(Default)]
struct KindStats {
    count: AtomicU64,
    total: AtomicU64,
    own: AtomicU64,
}

/// One node's counters, per fop kind: of the calls in a caller's latency
/// and of those behind ([`xlfs_sdk::profile`]).
pub struct NodeStats {
    kinds: [KindStats; FopKind::COUNT],
    behind: [KindStats; FopKind::COUNT],
}

impl Default for NodeStats {
    fn default() -> NodeStats {
        NodeStats {
            kinds: std::array::from_fn(|_| KindStats::default()),
            behind: std::array::from_fn(|_| KindStats::default()),
        }
    }
}

impl NodeStats {
    #[inline]
    fn record(&self, kind: FopKind, total: u64, own: u64, behind: bool) {
        let k = if behind { &self.behind[kind.index()] } else { &self.kinds[kind.index()] };
        k.count.fetch_add(1, Ordering::Relaxed);
        k.total.fetch_add(total, Ordering::Relaxed);
        k.own.fetch_add(own, Ordering::Relaxed);
    }

    /// The kinds called so far in a caller's latency, in code order.
    pub fn snapshot(&self) -> Vec<FopTimes> {
        NodeStats::times(&self.kinds)
    }

    /// The kinds called so far behind, in code order.
    pub fn snapshot_behind(&self) -> Vec<FopTimes> {
        NodeStats::times(&self.behind)
    }

    fn times(kinds: &[KindStats; FopKind::COUNT]) -> Vec<FopTimes> {
        FopKind::ALL
            .iter()
            .filter_map(|&kind| {
                let k = &kinds[kind.index()];
                let count = k.count.load(Ordering::Relaxed);
                (count > 0).then(|| FopTimes {
                    kind,
                    count,
                    total_ns: ticks_to_ns(k.total.load(Ordering::Relaxed)),
                    self_ns: ticks_to_ns(k.own.load(Ordering::Relaxed)),
                })
            })
            .collect()
    }

    fn reset(&self) {
        for k in self.kinds.iter().chain(&self.behind) {
            k.count.store(0, Ordering::Relaxed);
            k.total.store(0, Ordering::Relaxed);
            k.own.store(0, Ordering::Relaxed);
        }
    }
}

/// A graph node as its parents see it: the translator, timed.
pub struct Timed {
    inner: Arc<dyn Xlator>,
    stats: Arc<NodeStats>,
    /// A leaf has no children to report, so its calls open no frame.
    leaf: bool,
    /// Fops enter the graph here (its top, a brick server's child): a call
    /// without a frame is a caller's, not a translator's own.
    entry: bool,
}

impl Timed {
    /// Wraps `inner`, counting into `stats`; `leaf` when it has no
    /// children, `entry` where fops enter the graph.
    pub fn new(inner: Arc<dyn Xlator>, stats: Arc<NodeStats>, leaf: bool, entry: bool) -> Timed {
        Timed { inner, stats, leaf, entry }
    }
}

impl Xlator for Timed {
    #[inline]
    fn call(&self, mut ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let kind = req.fop.kind();
        let start = ticks();
        let parent = std::mem::take(&mut ctx.frame);
        let counted = parent.child_started(start);
        // In no caller's latency: a call after its caller replied, one a
        // translator makes for itself (no frame, below the entry), and
        // what those calls call.
        let behind = parent.is_behind() || (!counted && !self.entry);
        let own = match (self.leaf, behind) {
            (true, _) => Frame::none(),
            (false, false) => Frame::open(start),
            (false, true) => Frame::open_behind(start),
        };
        ctx.frame = own.clone();
        let fut = self.inner.call(ctx, req);
        Box::pin(TimedCall { fut, start, kind, stats: &self.stats, parent, counted, behind, own, done: false })
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        self.inner.notify(event, from)
    }

    fn reconfigure(&self, options: &Options) -> Result<(), ReconfigureError> {
        self.inner.reconfigure(options)
    }

    fn dump(&self) -> Vec<(String, String)> {
        self.inner.dump()
    }

    fn fini(&self) {
        self.inner.fini()
    }
}

/// One timed call in progress.
struct TimedCall<'a> {
    fut: FopFuture<'a>,
    start: u64,
    kind: FopKind,
    stats: &'a NodeStats,
    /// The caller's frame, told when this call ends if `counted`.
    parent: Frame,
    counted: bool,
    behind: bool,
    /// This call's frame, which its child calls report to.
    own: Frame,
    done: bool,
}

impl Future for TimedCall<'_> {
    type Output = FopResult;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<FopResult> {
        let this = &mut *self;
        let out = std::task::ready!(this.fut.as_mut().poll(cx));
        let end = ticks();
        let total = end.saturating_sub(this.start);
        let busy = this.own.close(end);
        this.stats.record(this.kind, total, total.saturating_sub(busy), this.behind);
        if this.counted {
            this.parent.child_ended(end);
        }
        this.done = true;
        Poll::Ready(out)
    }
}

impl Drop for TimedCall<'_> {
    fn drop(&mut self) {
        if !self.done && self.counted {
            // Cancelled: not counted, but the parent no longer waits for it.
            self.parent.child_ended(ticks());
        }
    }
}

/// Every node's counters of one graph, with what a snapshot names.
pub struct Profiler {
    top: String,
    /// Indexed like the graph's nodes: name, type, children's names.
    nodes: Vec<(String, String, Vec<String>)>,
    stats: Vec<Arc<NodeStats>>,
    /// Parents before children, as snapshots list them.
    top_down: Vec<usize>,
    since: Mutex<Instant>,
}

impl Profiler {
    /// A profiler for nodes `(name, type, children)`, top first in
    /// `top_down`, each counting into the matching `stats`.
    pub fn new(
        top: String,
        nodes: Vec<(String, String, Vec<String>)>,
        stats: Vec<Arc<NodeStats>>,
        top_down: Vec<usize>,
    ) -> Profiler {
        Profiler { top, nodes, stats, top_down, since: Mutex::new(Instant::now()) }
    }

    /// A snapshot; with `reset` the counters then restart from zero.
    pub fn snapshot(&self, reset: bool) -> GraphProfile {
        let mut since = self.since.lock();
        let window_ms = since.elapsed().as_millis() as u64;
        let nodes = self
            .top_down
            .iter()
            .map(|&i| {
                let (name, ty, kids) = &self.nodes[i];
                NodeProfile {
                    name: name.clone(),
                    type_name: ty.clone(),
                    children: kids.clone(),
                    fops: self.stats[i].snapshot(),
                    behind: self.stats[i].snapshot_behind(),
                }
            })
            .collect();
        if reset {
            self.stats.iter().for_each(|s| s.reset());
            *since = Instant::now();
        }
        GraphProfile { top: self.top.clone(), window_ms, nodes }
    }
}

/// The translator type whose nodes lead to bricks.
pub const CLIENT_TYPE: &str = "protocol/client";

/// How long a brick may take to answer a profile request.
const BRICK_TIMEOUT: Duration = Duration::from_secs(10);

/// A brick's profile as reached through one protocol/client node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrickProfile {
    /// The protocol/client volume of the mount's graph.
    pub client: String,
    /// Its `remote-host:remote-port`.
    pub remote: String,
    /// Its `remote-subvolume` (the brick's path).
    pub subvolume: String,
    /// The brick graph's timings, or why they could not be had.
    pub profile: Result<GraphProfile, String>,
}

/// A graph's timings with those of the bricks its protocol/client nodes
/// talk to: what `xlfs profile` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileBundle {
    /// The graph asked (a mount's, or a brick's for `--brick`).
    pub graph: GraphProfile,
    /// One per protocol/client node, top first.
    pub bricks: Vec<BrickProfile>,
}

/// Asks a brick for its profile through `client` (a protocol/client node,
/// untimed): the virtual getxattr protocol/server answers itself.
pub async fn ask_brick(client: &Child, reset: bool) -> Result<GraphProfile, String> {
    let key = if reset { PROFILE_RESET_KEY } else { PROFILE_KEY };
    let text =
        ask_brick_key(client, key, "xlfs-profile", "the brick does not report a profile (an older xlfs?)").await?;
    GraphProfile::parse(&text).map_err(|e| e.to_string())
}

/// A brick's graph statedump (`VOLUME.key = value` lines, top first), asked
/// through protocol/client `client` as a getxattr of
/// [`STATEDUMP_KEY`](xlfs_sdk::profile::STATEDUMP_KEY).
pub async fn ask_brick_dump(client: &Child) -> Result<String, String> {
    let missing = "the brick does not answer statedump requests (an older xlfs?)";
    ask_brick_key(client, xlfs_sdk::profile::STATEDUMP_KEY, "xlfs-statedump", missing).await
}

/// The value protocol/server gives for its virtual xattr `key` (on the
/// root, through `client`, as caller `who`), as text; `missing` when the
/// brick's reply lacks it.
async fn ask_brick_key(client: &Child, key: &str, who: &str, missing: &str) -> Result<String, String> {
    let fop = Fop::Getxattr { loc: Loc::root(), name: key.to_string() };
    let reply = tokio::time::timeout(BRICK_TIMEOUT, client.call(CallCtx::root(who), fop.into()))
        .await
        .map_err(|_| format!("no answer within {BRICK_TIMEOUT:?}"))?
        .map_err(|e| format!("{e}"))?;
    let Reply::Xattrs(d) = reply.reply else { return Err("unexpected reply".into()) };
    let bytes = d.get_bytes(key).ok_or(missing)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `graph`'s timings and its bricks', asked concurrently; with `reset`
/// every set of counters restarts after its snapshot (a brick's for every
/// client it serves).
pub async fn collect(graph: &crate::graph::Graph, reset: bool) -> ProfileBundle {
    let clients = graph.nodes_of_type(CLIENT_TYPE);
    type Ask<'a> = Pin<Box<dyn Future<Output = Result<GraphProfile, String>> + Send + 'a>>;
    let asks: Vec<Ask<'_>> = clients.iter().map(|(c, _)| Box::pin(ask_brick(c, reset)) as Ask<'_>).collect();
    let answers = join_all(asks).await;
    let bricks = clients
        .iter()
        .zip(answers)
        .map(|((c, opts), profile)| BrickProfile {
            client: c.name.to_string(),
            remote: format!(
                "{}:{}",
                opts.str("remote-host").unwrap_or("?"),
                opts.int("remote-port").map_or("?".into(), |p| p.to_string())
            ),
            subvolume: opts.str("remote-subvolume").unwrap_or("?").to_string(),
            profile,
        })
        .collect();
    ProfileBundle { graph: graph.profile(reset), bricks }
}

/// Polls every future of `fs` together until all are done.
async fn join_all<T>(fs: Vec<Pin<Box<dyn Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut pending: Vec<Option<_>> = fs.into_iter().map(Some).collect();
    let mut results: Vec<Option<T>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (p, r) in pending.iter_mut().zip(results.iter_mut()) {
            if let Some(f) = p {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *r = Some(v);
                        *p = None;
                    }
                    Poll::Pending => all = false,
                }
            }
        }
        if all { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    results.into_iter().flatten().collect()
}

fn word(s: &str) -> String {
    if s.is_empty() || s.contains(char::is_whitespace) { "?".into() } else { s.to_string() }
}

impl ProfileBundle {
    /// The text form (what a mount's control socket sends): a `profile`
    /// line and the graph's [`GraphProfile::to_text`], then per brick a
    /// `brick CLIENT REMOTE SUBVOLUME` line and its profile, or an
    /// `unreachable CLIENT REMOTE SUBVOLUME REASON...` line.
    pub fn to_text(&self) -> String {
        let mut out = format!("profile\n{}", self.graph.to_text());
        for b in &self.bricks {
            let head = format!("{} {} {}", word(&b.client), word(&b.remote), word(&b.subvolume));
            match &b.profile {
                Ok(p) => out += &format!("brick {head}\n{}", p.to_text()),
                Err(why) => out += &format!("unreachable {head} {}\n", why.replace('\n', " ")),
            }
        }
        out
    }

    /// Parses [`ProfileBundle::to_text`]'s form.
    pub fn parse(text: &str) -> Result<ProfileBundle, String> {
        // Sections start at `profile`, `brick` and `unreachable` lines.
        let mut sections: Vec<(Vec<&str>, String)> = Vec::new();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.first() {
                Some(&"profile") | Some(&"brick") | Some(&"unreachable") => sections.push((words, String::new())),
                _ => match sections.last_mut() {
                    Some((_, body)) => {
                        body.push_str(line);
                        body.push('\n');
                    }
                    None if words.is_empty() => {}
                    None => return Err(format!("expected a profile line, found {line:?}")),
                },
            }
        }
        let mut it = sections.into_iter();
        let Some((head, body)) = it.next().filter(|(h, _)| h[0] == "profile") else {
            return Err("no profile section".into());
        };
        let _ = head;
        let graph = GraphProfile::parse(&body).map_err(|e| e.to_string())?;
        let mut bricks = Vec::new();
        for (head, body) in it {
            let [kind, client, remote, subvolume, rest @ ..] = head.as_slice() else {
                return Err(format!("bad brick line {:?}", head.join(" ")));
            };
            let profile = match *kind {
                "brick" => Ok(GraphProfile::parse(&body).map_err(|e| e.to_string())?),
                "unreachable" => Err(rest.join(" ")),
                _ => return Err(format!("unexpected section {kind}")),
            };
            bricks.push(BrickProfile {
                client: client.to_string(),
                remote: remote.to_string(),
                subvolume: subvolume.to_string(),
                profile,
            });
        }
        Ok(ProfileBundle { graph, bricks })
    }
}

#[cfg(test)]
mod tests {
    use xlfs_sdk::{Errno, Response};

    use super::*;

    /// A test translator: calls each child `calls` times in a row (or all
    /// at once with `concurrent`), sleeping `sleep` before answering.
    struct Node {
        children: Vec<Child>,
        calls: usize,
        concurrent: bool,
        sleep: Duration,
        /// Also calls its first child after replying, in the background.
        background: bool,
    }

    impl Xlator for Node {
        fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
            Box::pin(async move {
                if let Some(c) = self.children.first().cloned().filter(|_| self.background) {
                    let (ctx, req) = (ctx.clone(), req.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        let _ = c.call(ctx, req).await;
                    });
                }
                if self.concurrent {
                    let calls: Vec<_> = self.children.iter().map(|c| c.call(ctx.clone(), req.clone())).collect();
                    for r in futures_join(calls).await {
                        r?;
                    }
                } else {
                    for c in &self.children {
                        for _ in 0..self.calls {
                            // From another task: the frame travels with the context.
                            let (c, ctx, req) = (c.clone(), ctx.clone(), req.clone());
                            tokio::spawn(async move { c.call(ctx, req).await }).await.map_err(|_| Errno::EIO)??;
                        }
                    }
                }
                tokio::time::sleep(self.sleep).await;
                Ok(Response { reply: Reply::Empty, xdata: Default::default() })
            })
        }
    }

    async fn futures_join(fs: Vec<FopFuture<'_>>) -> Vec<FopResult> {
        join_all(fs).await
    }

    /// One test node: (name, children indexes, calls per child,
    /// concurrent, sleep ms, background).
    type Spec<'a> = (&'a str, &'a [usize], usize, bool, u64, bool);

    /// A graph by hand from [`Spec`]s, the top first, leaves last.
    struct Built {
        tops: Vec<Arc<Timed>>,
        stats: Vec<Arc<NodeStats>>,
        profiler: Profiler,
    }

    fn build(spec: &[Spec<'_>]) -> Built {
        let stats: Vec<Arc<NodeStats>> = spec.iter().map(|_| Arc::new(NodeStats::default())).collect();
        let mut timed: Vec<Option<Arc<Timed>>> = spec.iter().map(|_| None).collect();
        for i in (0..spec.len()).rev() {
            let (_, kids, calls, concurrent, sleep, background) = spec[i];
            let children = kids
                .iter()
                .map(|&k| Child {
                    name: Arc::from(spec[k].0),
                    xl: timed[k].clone().expect("children first") as Arc<dyn Xlator>,
                })
                .collect();
            let node = Node { children, calls, concurrent, sleep: Duration::from_millis(sleep), background };
            timed[i] = Some(Arc::new(Timed::new(Arc::new(node), stats[i].clone(), kids.is_empty(), i == 0)));
        }
        let nodes = spec
            .iter()
            .map(|s| (s.0.to_string(), "test/node".to_string(), s.1.iter().map(|&k| spec[k].0.to_string()).collect()))
            .collect();
        let profiler = Profiler::new(spec[0].0.to_string(), nodes, stats.clone(), (0..spec.len()).collect());
        Built { tops: timed.into_iter().map(|t| t.expect("built")).collect(), stats, profiler }
    }

    fn stat() -> Request {
        Fop::Stat { loc: Loc::root() }.into()
    }

    fn times(s: &NodeStats) -> FopTimes {
        let v = s.snapshot();
        assert_eq!(v.len(), 1, "one fop kind: {v:?}");
        v[0]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn self_times_of_a_nested_graph_add_up_to_the_top_total_exactly() {
        // top -> mid (calls bottom twice, in other tasks) -> bottom;
        // top also calls side once.
        let g = build(&[
            ("top", &[1, 3], 1, false, 1, false),
            ("mid", &[2], 2, false, 2, false),
            ("bottom", &[], 0, false, 1, false),
            ("side", &[], 0, false, 1, false),
        ]);
        for _ in 0..3 {
            g.tops[0].call(CallCtx::root("t"), stat()).await.expect("ok");
        }
        let t: Vec<FopTimes> = g.stats.iter().map(|s| times(s)).collect();
        assert_eq!(t.iter().map(|t| t.count).collect::<Vec<_>>(), [3, 3, 6, 3], "calls per node");
        for x in &t {
            assert!(x.self_ns <= x.total_ns, "{x:?}");
        }
        assert_eq!(t[2].self_ns, t[2].total_ns, "a leaf's time is all its own");
        // Exact in clock ticks; each counter's conversion to nanoseconds
        // truncates, so sums of k converted counters may differ by k ns.
        let near = |a: u64, b: u64, k: u64| a.abs_diff(b) <= k;
        let sum: u64 = t.iter().map(|t| t.self_ns).sum();
        assert!(near(sum, t[0].total_ns, 4), "self times add up to the top's total: {t:?}");
        assert!(
            near(t[0].total_ns - t[0].self_ns, t[1].total_ns + t[3].total_ns, 3),
            "top waited exactly for its children: {t:?}"
        );
        assert!(
            near(t[1].total_ns - t[1].self_ns, t[2].total_ns, 2),
            "mid waited exactly for its two bottom calls: {t:?}"
        );
        // Each node sleeps: self is at least its sleeps (1 ms per call).
        assert!(t[1].self_ns >= 3 * 2_000_000, "{:?}", t[1]);

        let p = g.profiler.snapshot(true);
        assert_eq!(p.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["top", "mid", "bottom", "side"]);
        assert_eq!(p.node("bottom").and_then(|n| n.fop(FopKind::Stat)).map(|f| f.count), Some(6));
        assert!(g.profiler.snapshot(false).nodes.iter().all(|n| n.fops.is_empty()), "reset");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_children_are_waited_for_once() {
        let g = build(&[
            ("fan", &[1, 2, 3], 1, true, 0, false),
            ("a", &[], 0, false, 3, false),
            ("b", &[], 0, false, 3, false),
            ("c", &[], 0, false, 3, false),
        ]);
        g.tops[0].call(CallCtx::root("t"), stat()).await.expect("ok");
        let t: Vec<FopTimes> = g.stats.iter().map(|s| times(s)).collect();
        let waited = t[0].total_ns - t[0].self_ns;
        let longest = t[1..].iter().map(|t| t.total_ns).max().expect("children");
        let sum: u64 = t[1..].iter().map(|t| t.total_ns).sum();
        assert!(waited >= longest, "the fan waited at least for its slowest child: {waited} < {longest}");
        assert!(waited < sum, "parallel waits count once, not added: {waited} >= {sum}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_made_after_the_reply_is_not_subtracted() {
        let g = build(&[("wb", &[1], 0, false, 0, true), ("leaf", &[], 0, false, 1, false)]);
        g.tops[0].call(CallCtx::root("t"), stat()).await.expect("ok");
        for _ in 0..200 {
            if g.stats[1].snapshot_behind().first().is_some_and(|f| f.count == 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let wb = times(&g.stats[0]);
        assert!(g.stats[1].snapshot().is_empty(), "in no caller's latency");
        let leaf = g.stats[1].snapshot_behind();
        assert_eq!(leaf.iter().map(|f| f.count).sum::<u64>(), 1, "the background call is counted behind: {leaf:?}");
        assert_eq!(wb.self_ns, wb.total_ns, "nothing waited for during the fop");
        assert!(g.stats[0].snapshot_behind().is_empty(), "the top's own call is in its caller's latency");
    }

    #[tokio::test]
    async fn a_cancelled_call_is_not_counted_and_ends_its_interval() {
        let g = build(&[("slow", &[], 0, false, 10_000, false)]);
        let opened = ticks();
        let parent = Frame::open(opened);
        let ctx = CallCtx { frame: parent.clone(), ..CallCtx::root("t") };
        let call = g.tops[0].call(ctx, stat());
        assert!(tokio::time::timeout(Duration::from_millis(5), call).await.is_err(), "still sleeping");
        let dropped = ticks();
        assert!(g.stats[0].snapshot().is_empty(), "not counted");
        tokio::time::sleep(Duration::from_millis(2)).await;
        let busy = parent.close(ticks());
        assert!(busy > 0 && busy <= dropped - opened, "the interval ended at the drop: {busy}");
    }
}
