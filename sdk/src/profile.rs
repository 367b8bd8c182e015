//! Per-translator fop timing: what the runtime measures at every edge of a
//! graph, and the form in which a graph's profile travels (`xlfs profile`).
//!
//! The runtime wraps every node of a graph so that each call of a node is
//! timed: per node and [`FopKind`], how many calls, their total time (from
//! the call until its reply) and their **self** time, the total minus the
//! time during which the node was waiting for one of its children *for that
//! fop*. Translators do nothing for this; the timing rides in
//! [`CallCtx::frame`](crate::CallCtx): when a node is called, the runtime
//! opens a [`Frame`] for that call and puts it in the context the node
//! receives, so a child called with that context (or a clone of it, even
//! from another task) reports its start and end to it.
//!
//! What counts as "waiting for a child":
//! - a child call made with the fop's context (or a clone) that starts
//!   while the fop is in progress; from its start to its end, or to the
//!   node's reply if that comes first;
//! - children called concurrently (a replicated write to three bricks)
//!   count once: the frame measures the union of their intervals, so self
//!   time is the time the node spent with no child call outstanding;
//! - a child call made after the node replied (write-behind's flush of an
//!   acknowledged write, a delayed post-op) or with a context the node made
//!   itself ([`CallCtx::root`](crate::CallCtx::root)) is not subtracted
//!   from anything: it is the child's own fop, counted apart as **behind**
//!   (in no caller's latency), and so are the calls it makes in turn
//!   (its frame is opened with [`Frame::open_behind`]).
//!
//! So for a graph whose nodes wait for each child call they make, one at a
//! time, the self times of all the calls one fop caused add up exactly to
//! the top's total (the same clock readings close a child's interval and
//! its own total). With children in parallel the union is exact up to the
//! order in which their ends reach the frame: a child that read the clock
//! last but reports first (its thread preempted in between) shortens the
//! busy period by that gap.
//!
//! A [`GraphProfile`] is a snapshot of those counters; it is exchanged as
//! text ([`GraphProfile::to_text`], [`GraphProfile::parse`]): a brick
//! answers the virtual getxattr [`PROFILE_KEY`] (or [`PROFILE_RESET_KEY`],
//! which also zeroes its counters) with it, and a mount's control socket
//! sends its own and its bricks' the same way.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::fop::FopKind;

/// The virtual xattr a brick's protocol/server answers with its graph's
/// profile (as [`GraphProfile::to_text`]), without passing it to the graph.
pub const PROFILE_KEY: &str = "xlfs.profile";
/// As [`PROFILE_KEY`], and the brick's counters restart from zero.
pub const PROFILE_RESET_KEY: &str = "xlfs.profile.reset";
/// The virtual xattr a brick's protocol/server answers with its graph's
/// statedump (`VOLUME.key = value` lines, top first), without passing it to
/// the graph.
pub const STATEDUMP_KEY: &str = "xlfs.statedump";

/// Set once the frame's fop has replied: later child calls are not its.
const CLOSED: u64 = 1 << 63;
/// Child calls in flight, bits 48..63.
const INFLIGHT_SHIFT: u32 = 48;
const INFLIGHT_MAX: u64 = (1 << 15) - 1;
/// The busy-time accumulator: ticks since the frame opened, modulo 2^48
/// (a day at 3 GHz). It is decreased by the time the first child of a busy
/// period starts and increased by the time its last one ends, so it holds
/// the union of the child intervals once no child is in flight.
const BUSY_MASK: u64 = (1 << INFLIGHT_SHIFT) - 1;

/// The clock of the timings: [`ticks`] reads it, [`ticks_to_ns`] converts.
///
/// On x86_64, when the kernel itself keeps time with the TSC (its
/// clocksource is `tsc`, so the counter is invariant and synchronized
/// across CPUs), the clock is the TSC read with `rdtsc`: a third of the
/// cost of `Instant::now()` (14 ns against 38 ns on the project's VM), which
/// matters as every node reads it twice per fop. Ticks are converted to
/// nanoseconds only when counters are read, with a rate measured once
/// against `Instant` (10 ms, at the first conversion). Elsewhere the clock
/// is `Instant` in nanoseconds since the first reading.
struct Clock {
    tsc: bool,
    epoch: Instant,
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let tsc = cfg!(target_arch = "x86_64")
            && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                .is_ok_and(|s| s.trim() == "tsc");
        Clock { tsc, epoch: Instant::now() }
    })
}

/// Reads the timing clock (see [`ticks_to_ns`]).
#[inline]
pub fn ticks() -> u64 {
    let c = clock();
    #[cfg(target_arch = "x86_64")]
    if c.tsc {
        // SAFETY: rdtsc has no preconditions; it only reads a counter.
        return unsafe { std::arch::x86_64::_rdtsc() };
    }
    c.epoch.elapsed().as_nanos() as u64
}

/// Nanoseconds per tick of [`ticks`], as a rate measured once.
fn ns_per_tick() -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(|| {
        if !clock().tsc {
            return 1.0;
        }
        let (i0, t0) = clock_pair();
        while i0.elapsed() < Duration::from_millis(10) {
            std::hint::spin_loop();
        }
        let (i1, t1) = clock_pair();
        let rate = (i1 - i0).as_nanos() as f64 / t1.saturating_sub(t0).max(1) as f64;
        if rate.is_finite() && rate > 0.0 { rate } else { 1.0 }
    })
}

/// An [`Instant`] and the [`ticks`] at the same moment: the reading of
/// the tightest of a few tick brackets around `Instant::now()`. A process
/// preempted between two unbracketed readings (a busy machine starting a
/// brick) would skew the rate by the preemption over the 10 ms window:
/// a millisecond makes every profile time 10 % long.
fn clock_pair() -> (Instant, u64) {
    let bracket = || {
        let before = ticks();
        let now = Instant::now();
        let width = ticks().saturating_sub(before);
        (width, now, before + width / 2)
    };
    let mut best = bracket();
    for _ in 1..16 {
        let b = bracket();
        if b.0 < best.0 {
            best = b;
        }
    }
    (best.1, best.2)
}

/// Converts a number of [`ticks`] to nanoseconds.
pub fn ticks_to_ns(t: u64) -> u64 {
    if t == 0 { 0 } else { (t as f64 * ns_per_tick()) as u64 }
}

/// The state of one timed call: when it started (in [`ticks`]) and how
/// long it has waited for children. One atomic word, so concurrent
/// children on several threads need no lock.
#[derive(Debug)]
pub struct FrameCell {
    start: u64,
    /// The call is in no caller's latency (made after its caller replied,
    /// or by a translator for itself), nor are its children's.
    behind: bool,
    state: AtomicU64,
}

/// The timing frame of the fop a node is handling, carried in
/// [`CallCtx::frame`](crate::CallCtx). Translators pass it on by passing the
/// context on; only the runtime opens and reads frames. Empty (no
/// allocation) outside a timed graph and for leaves, which have no
/// children to report. Compares equal to any other frame, so contexts
/// compare by identity and owner only.
#[derive(Clone, Default)]
pub struct Frame(Option<Arc<FrameCell>>);

impl Frame {
    /// No frame: child calls made with it are not attributed to anyone.
    pub const fn none() -> Frame {
        Frame(None)
    }

    /// A frame for a call that started at `start` ([`ticks`]).
    pub fn open(start: u64) -> Frame {
        Frame(Some(Arc::new(FrameCell { start, behind: false, state: AtomicU64::new(0) })))
    }

    /// A frame for a call that is in no caller's latency (see the module
    /// doc): its child calls are behind too.
    pub fn open_behind(start: u64) -> Frame {
        Frame(Some(Arc::new(FrameCell { start, behind: true, state: AtomicU64::new(0) })))
    }

    /// Whether this is the frame of a call in no caller's latency.
    pub fn is_behind(&self) -> bool {
        self.0.as_ref().is_some_and(|c| c.behind)
    }

    /// Whether there is a frame (and it has not been closed).
    pub fn is_open(&self) -> bool {
        self.0.as_ref().is_some_and(|c| c.state.load(Ordering::Acquire) & CLOSED == 0)
    }

    fn rel(cell: &FrameCell, at: u64) -> u64 {
        at.saturating_sub(cell.start) & BUSY_MASK
    }

    /// A child call started at `at` on this frame's behalf. Returns whether
    /// it is counted (the frame is open); only then must
    /// [`Frame::child_ended`] follow.
    pub fn child_started(&self, at: u64) -> bool {
        let Some(cell) = &self.0 else { return false };
        let t = Frame::rel(cell, at);
        cell.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let inflight = (s & !CLOSED) >> INFLIGHT_SHIFT;
                if s & CLOSED != 0 || inflight >= INFLIGHT_MAX {
                    return None;
                }
                let busy = if inflight == 0 { (s & BUSY_MASK).wrapping_sub(t) & BUSY_MASK } else { s & BUSY_MASK };
                Some(((inflight + 1) << INFLIGHT_SHIFT) | busy)
            })
            .is_ok()
    }

    /// A counted child call ended (replied or was dropped) at `at`. Does
    /// nothing once the frame is closed.
    pub fn child_ended(&self, at: u64) {
        let Some(cell) = &self.0 else { return };
        let t = Frame::rel(cell, at);
        let _ = cell.state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            let inflight = (s & !CLOSED) >> INFLIGHT_SHIFT;
            if s & CLOSED != 0 || inflight == 0 {
                return None;
            }
            let busy = if inflight == 1 { (s & BUSY_MASK).wrapping_add(t) & BUSY_MASK } else { s & BUSY_MASK };
            Some(((inflight - 1) << INFLIGHT_SHIFT) | busy)
        });
    }

    /// The frame's call replied at `at`: no later child call counts.
    /// Returns the ticks during which at least one counted child
    /// call was in flight (a child still running counts until `at`).
    pub fn close(&self, at: u64) -> u64 {
        let Some(cell) = &self.0 else { return 0 };
        let t = Frame::rel(cell, at);
        let s = cell.state.swap(CLOSED, Ordering::AcqRel);
        if s & CLOSED != 0 {
            return 0;
        }
        let busy = s & BUSY_MASK;
        if (s & !CLOSED) >> INFLIGHT_SHIFT > 0 { busy.wrapping_add(t) & BUSY_MASK } else { busy }
    }
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Frame(open)" } else { "Frame(none)" })
    }
}

impl PartialEq for Frame {
    fn eq(&self, _: &Frame) -> bool {
        true
    }
}

impl Eq for Frame {}

impl std::hash::Hash for Frame {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// One node's counters for one fop kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FopTimes {
    /// The fop.
    pub kind: FopKind,
    /// Calls that replied.
    pub count: u64,
    /// Their total time, from call to reply, in nanoseconds.
    pub total_ns: u64,
    /// Their self time (total minus time waiting for children), in
    /// nanoseconds.
    pub self_ns: u64,
}

/// One node of a profiled graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeProfile {
    /// The volume name.
    pub name: String,
    /// Its translator type (`cluster/replicate`).
    pub type_name: String,
    /// Its children's volume names.
    pub children: Vec<String>,
    /// Counters of the fop kinds it was called for in a caller's latency
    /// (from the graph's entry, or by a parent waiting for the call), in
    /// code order.
    pub fops: Vec<FopTimes>,
    /// Counters of the calls in no caller's latency: made after the caller
    /// replied (write-behind's writes, flush-behind, async directory
    /// operations) or by translators for themselves (heal, the graph's own
    /// requests), in code order.
    pub behind: Vec<FopTimes>,
}

impl NodeProfile {
    /// The counters for `kind`, if it was called for it.
    pub fn fop(&self, kind: FopKind) -> Option<&FopTimes> {
        self.fops.iter().find(|f| f.kind == kind)
    }
}

/// A snapshot of a graph's fop timings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphProfile {
    /// The top volume.
    pub top: String,
    /// Milliseconds over which the counters were taken (since the graph
    /// was built or the counters last reset).
    pub window_ms: u64,
    /// The nodes, top first (parents before children).
    pub nodes: Vec<NodeProfile>,
}

/// Why profile text did not parse.
#[derive(Debug, thiserror::Error)]
#[error("profile line {line}: {what}")]
pub struct ProfileParseError {
    /// The line (from 1).
    pub line: usize,
    /// What was wrong.
    pub what: String,
}

impl GraphProfile {
    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&NodeProfile> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Where fops enter the graph's timed part: the top, or for a brick
    /// (whose top, protocol/server, is not called but receives fops from
    /// the network) the server's first child.
    pub fn entry(&self) -> Option<&NodeProfile> {
        let top = self.node(&self.top)?;
        match top.children.first() {
            Some(c) if top.type_name == "protocol/server" => self.node(c),
            _ => Some(top),
        }
    }

    /// The text form: a `graph TOP WINDOW_MS` line, then per node a
    /// `node NAME TYPE CHILD,CHILD` line (`-` for none) followed by one
    /// `fop KIND COUNT TOTAL_NS SELF_NS` line per fop kind, then one
    /// `behind KIND COUNT TOTAL_NS SELF_NS` line per kind called behind.
    pub fn to_text(&self) -> String {
        let mut out = format!("graph {} {}\n", self.top, self.window_ms);
        for n in &self.nodes {
            let kids = if n.children.is_empty() { "-".to_string() } else { n.children.join(",") };
            let _ = writeln!(out, "node {} {} {}", n.name, n.type_name, kids);
            for (word, list) in [("fop", &n.fops), ("behind", &n.behind)] {
                for f in list {
                    let _ = writeln!(out, "{word} {} {} {} {}", f.kind.name(), f.count, f.total_ns, f.self_ns);
                }
            }
        }
        out
    }

    /// Parses [`GraphProfile::to_text`]'s form (unknown line kinds and fop
    /// names are skipped, so a newer peer's additions do not break it).
    pub fn parse(text: &str) -> Result<GraphProfile, ProfileParseError> {
        let mut graph: Option<GraphProfile> = None;
        for (i, line) in text.lines().enumerate() {
            let err = |what: &str| ProfileParseError { line: i + 1, what: what.to_string() };
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [] => {}
                ["graph", top, ms] => {
                    if graph.is_some() {
                        return Err(err("a second graph line"));
                    }
                    let window_ms = ms.parse().map_err(|_| err("bad window"))?;
                    graph = Some(GraphProfile { top: top.to_string(), window_ms, nodes: Vec::new() });
                }
                ["node", name, ty, kids] => {
                    let g = graph.as_mut().ok_or_else(|| err("node before graph"))?;
                    let children = if *kids == "-" { Vec::new() } else { kids.split(',').map(String::from).collect() };
                    g.nodes.push(NodeProfile {
                        name: name.to_string(),
                        type_name: ty.to_string(),
                        children,
                        fops: Vec::new(),
                        behind: Vec::new(),
                    });
                }
                [word @ ("fop" | "behind"), kind, count, total, own] => {
                    let node = graph.as_mut().and_then(|g| g.nodes.last_mut()).ok_or_else(|| err("fop before node"))?;
                    let Some(kind) = FopKind::from_name(kind) else { continue };
                    let num = |w: &str| w.parse::<u64>().map_err(|_| err("bad number"));
                    let f = FopTimes { kind, count: num(count)?, total_ns: num(total)?, self_ns: num(own)? };
                    if *word == "fop" { node.fops.push(f) } else { node.behind.push(f) }
                }
                [w, ..] if ["graph", "node", "fop", "behind"].contains(w) => {
                    return Err(err("wrong number of fields"));
                }
                _ => {}
            }
        }
        graph.ok_or(ProfileParseError { line: 0, what: "no graph line".into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: u64, ticks: u64) -> u64 {
        base + ticks
    }

    #[test]
    fn sequential_children_add_up_exactly() {
        let t0 = ticks();
        let f = Frame::open(t0);
        assert!(f.child_started(at(t0, 100)));
        f.child_ended(at(t0, 350));
        assert!(f.child_started(at(t0, 400)));
        f.child_ended(at(t0, 1000));
        assert_eq!(f.close(at(t0, 1200)), 250 + 600);
        assert!(!f.is_open());
    }

    #[test]
    fn overlapping_children_count_as_their_union() {
        let t0 = ticks();
        let f = Frame::open(t0);
        assert!(f.child_started(at(t0, 100)));
        assert!(f.child_started(at(t0, 150)));
        assert!(f.child_started(at(t0, 200)));
        f.child_ended(at(t0, 500));
        f.child_ended(at(t0, 600));
        f.child_ended(at(t0, 700));
        assert_eq!(f.close(at(t0, 900)), 600, "100..700 once, not three times");
    }

    #[test]
    fn a_child_still_running_at_the_reply_counts_until_the_reply_only() {
        let t0 = ticks();
        let f = Frame::open(t0);
        assert!(f.child_started(at(t0, 100)));
        assert_eq!(f.close(at(t0, 300)), 200);
        f.child_ended(at(t0, 5000));
        assert!(!f.child_started(at(t0, 6000)), "after the reply a call is not the fop's");
        assert_eq!(f.close(at(t0, 7000)), 0, "closed once");
    }

    #[test]
    fn no_frame_counts_nothing() {
        let f = Frame::none();
        assert!(!f.child_started(ticks()));
        f.child_ended(ticks());
        assert_eq!(f.close(ticks()), 0);
        assert_eq!(Frame::open(ticks()), Frame::none(), "frames never make contexts differ");
    }

    #[test]
    fn the_clock_runs_forward_at_a_known_rate() {
        let a = ticks();
        std::thread::sleep(Duration::from_millis(2));
        let b = ticks();
        assert!(b > a);
        assert!(ticks_to_ns(b - a) >= 1_000_000, "2 ms slept: {} ns", ticks_to_ns(b - a));
    }

    #[test]
    fn text_round_trips() {
        let g = GraphProfile {
            top: "/srv/b1-server".into(),
            window_ms: 1234,
            nodes: vec![
                NodeProfile {
                    name: "/srv/b1-server".into(),
                    type_name: "protocol/server".into(),
                    children: vec!["/srv/b1".into()],
                    fops: vec![],
                    behind: vec![],
                },
                NodeProfile {
                    name: "/srv/b1".into(),
                    type_name: "debug/io-stats".into(),
                    children: vec![],
                    fops: vec![FopTimes { kind: FopKind::Writev, count: 3, total_ns: 3000, self_ns: 100 }],
                    behind: vec![FopTimes { kind: FopKind::Fsync, count: 1, total_ns: 900, self_ns: 900 }],
                },
            ],
        };
        let back = GraphProfile::parse(&g.to_text()).expect("parses");
        assert_eq!(back, g);
        assert_eq!(
            back.entry().map(|n| n.name.as_str()),
            Some("/srv/b1"),
            "a server top is not called; its child is the entry"
        );
        assert!(GraphProfile::parse("node a b -\n").is_err());
        assert!(GraphProfile::parse("graph t 1\nnode a b -\nfop WRITE 1 x 2\n").is_err());
    }
}
