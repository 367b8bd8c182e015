//! The translator test kit (feature `testing`), for xlfs's own tests and
//! for plugin and translator authors: children to put under a translator
//! ([`MockChild`] records and answers, [`Gate`] holds fops until released,
//! [`Faulty`] fails or drops what passes through it, [`NullLeaf`] answers
//! and forgets), an [`InitCtx`] builder that captures events, hand polling
//! of futures ([`poll`], [`now`]), waits with a deadline ([`eventually`],
//! [`until`]), xattr helpers for files on a brick, and test certificates
//! for TLS ([`pki`]).
//!
//! ```
//! use xlfs_sdk::testing::{MockChild, init, now};
//! use xlfs_sdk::{CallCtx, Fop, FopKind, Loc, Request, Xlator};
//! let mock = MockChild::new();
//! let (ictx, _events) = init(&[], &[], &[mock.child()]);
//! let leaf = &ictx.children[0].xl;
//! now(leaf.call(CallCtx::root("t"), Request::new(Fop::Stat { loc: Loc::root() }))).unwrap();
//! assert_eq!(mock.kinds(), [FopKind::Stat]);
//! ```

#[cfg(not(all(target_family = "wasm", target_os = "unknown")))]
pub mod pki;

use std::future::Future;
use std::path::Path;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::{
    CallCtx, Child, Errno, Event, EventSink, Fop, FopFuture, FopKind, FopResult, Gfid, Iatt, InitCtx, OptionDecl,
    Options, Reply, Request, Response, Xlator,
};

/// The answer a leaf gives `fop` when told nothing else: `Lookup` an entry
/// (the loc's gfid, or [`MockChild::ENTRY_GFID`]), `Readv` `size` zero
/// bytes (at most 1 MiB), attribute fops attributes, `Lk` the lock,
/// anything else `Empty`.
pub fn default_reply(fop: &Fop) -> Reply {
    let iatt = Iatt { gfid: fop.gfid(), ..Iatt::default() };
    match fop {
        Fop::Lookup { loc } => {
            let gfid = if loc.gfid.is_null() { MockChild::ENTRY_GFID } else { loc.gfid };
            Reply::Entry { iatt: Iatt { gfid, ..iatt }, postparent: Iatt::default() }
        }
        Fop::Readv { size, .. } => Reply::Read { data: Bytes::from(vec![0u8; (*size).min(1 << 20) as usize]), iatt },
        Fop::Stat { .. } | Fop::Fstat { .. } => Reply::Attr(iatt),
        Fop::Writev { .. } | Fop::Truncate { .. } | Fop::Ftruncate { .. } | Fop::Fsync { .. } => {
            Reply::PrePost { pre: iatt, post: iatt }
        }
        Fop::Lk { lock, .. } => Reply::Lock(*lock),
        _ => Reply::Empty,
    }
}

/// A child that records each call and answers it at once: with
/// [`default_reply`], with the answer set for its kind
/// ([`MockChild::answer`]), or with the errno set by
/// [`MockChild::fail_with`].
#[derive(Default)]
pub struct MockChild {
    calls: Mutex<Vec<(CallCtx, Request)>>,
    fail: Mutex<Option<Errno>>,
    answers: Mutex<Vec<(FopKind, FopResult)>>,
}

impl MockChild {
    /// The gfid a lookup of an entry without gfid resolves to.
    pub const ENTRY_GFID: Gfid = Gfid([0xe0; 16]);

    /// A new mock.
    pub fn new() -> Arc<MockChild> {
        Arc::new(MockChild::default())
    }
    /// The calls seen so far.
    pub fn calls(&self) -> Vec<(CallCtx, Request)> {
        self.calls.lock().clone()
    }
    /// The kinds of the calls seen so far.
    pub fn kinds(&self) -> Vec<FopKind> {
        self.calls.lock().iter().map(|(_, r)| r.fop.kind()).collect()
    }
    /// Makes every later call fail with `e` (or succeed again with None).
    pub fn fail_with(&self, e: Option<Errno>) {
        *self.fail.lock() = e;
    }
    /// Answers every later call of `kind` with `res`, until set again.
    pub fn answer(&self, kind: FopKind, res: FopResult) {
        let mut a = self.answers.lock();
        a.retain(|(k, _)| *k != kind);
        a.push((kind, res));
    }
    /// This mock as a child named `mock`.
    pub fn child(self: &Arc<Self>) -> Child {
        Child { name: Arc::from("mock"), xl: self.clone() }
    }
}

impl Xlator for MockChild {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let kind = req.fop.kind();
        let set = self.answers.lock().iter().find(|(k, _)| *k == kind).map(|(_, r)| r.clone());
        let res = match (*self.fail.lock(), set) {
            (Some(e), _) => Err(e),
            (None, Some(r)) => r,
            (None, None) => Ok(Response::from(default_reply(&req.fop))),
        };
        self.calls.lock().push((ctx, req));
        Box::pin(std::future::ready(res))
    }
}

/// A leaf that answers every fop with [`default_reply`] and keeps nothing:
/// the cheapest child, for benchmarks and long runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct NullLeaf;

impl Xlator for NullLeaf {
    fn call(&self, _ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(std::future::ready(Ok(Response::from(default_reply(&req.fop)))))
    }
}

/// One fop held by a [`Gate`].
struct Held {
    gfid: Gfid,
    kind: FopKind,
    ticket: Arc<Ticket>,
}

/// The release of one held fop: a flag and the waker of its future.
#[derive(Default)]
struct Ticket {
    state: Mutex<(bool, Option<Waker>)>,
}

impl Ticket {
    fn open(&self) {
        let mut s = self.state.lock();
        s.0 = true;
        if let Some(w) = s.1.take() {
            w.wake();
        }
    }
}

impl Future for &Ticket {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.state.lock();
        if s.0 {
            return Poll::Ready(());
        }
        s.1 = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A child that holds every fop until the test releases it, then passes it
/// to `inner`: for tests that need a fop in flight (ordering, limits,
/// cancellation). [`Gate::open`] stops holding.
pub struct Gate {
    inner: Arc<dyn Xlator>,
    held: Mutex<Vec<Held>>,
    max_held: Mutex<usize>,
    seen: Mutex<Vec<FopKind>>,
    open: AtomicBool,
}

impl Gate {
    /// A gate in front of `inner`.
    pub fn new(inner: Arc<dyn Xlator>) -> Arc<Gate> {
        Arc::new(Gate {
            inner,
            held: Mutex::default(),
            max_held: Mutex::default(),
            seen: Mutex::default(),
            open: AtomicBool::new(false),
        })
    }
    /// A gate in front of a [`NullLeaf`].
    pub fn over_null() -> Arc<Gate> {
        Gate::new(Arc::new(NullLeaf))
    }
    /// A gate open from the start in front of `inner`: a pass-through that
    /// records the kind of every fop ([`Gate::arrived`]), to count what
    /// reaches a real child.
    pub fn passing(inner: Arc<dyn Xlator>) -> Arc<Gate> {
        let gate = Gate::new(inner);
        gate.open.store(true, Ordering::Release);
        gate
    }
    /// This gate as a child named `gate`.
    pub fn child(self: &Arc<Self>) -> Child {
        Child { name: Arc::from("gate"), xl: self.clone() }
    }
    /// How many fops it holds now.
    pub fn held(&self) -> usize {
        self.held.lock().len()
    }
    /// The most it ever held at once.
    pub fn max_held(&self) -> usize {
        *self.max_held.lock()
    }
    /// The kinds of every fop that arrived, in order.
    pub fn arrived(&self) -> Vec<FopKind> {
        self.seen.lock().clone()
    }
    /// Releases the `n` oldest held fops; returns how many it released.
    pub fn release(&self, n: usize) -> usize {
        let out: Vec<Held> = {
            let mut h = self.held.lock();
            let n = n.min(h.len());
            h.drain(..n).collect()
        };
        out.iter().for_each(|h| h.ticket.open());
        out.len()
    }
    /// Releases the held fops on `gfid`; returns how many.
    pub fn release_gfid(&self, gfid: Gfid) -> usize {
        self.release_where(|h| h.gfid == gfid)
    }
    /// Releases the held fops of `kind`; returns how many.
    pub fn release_kind(&self, kind: FopKind) -> usize {
        self.release_where(|h| h.kind == kind)
    }
    /// Releases every held fop.
    pub fn release_all(&self) -> usize {
        self.release(usize::MAX)
    }
    /// Releases every held fop and lets later ones through.
    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
        self.release_all();
    }

    fn release_where(&self, pick: impl Fn(&Held) -> bool) -> usize {
        let out: Vec<Held> = {
            let mut h = self.held.lock();
            let (take, keep) = h.drain(..).partition(|x| pick(x));
            *h = keep;
            take
        };
        out.iter().for_each(|h| h.ticket.open());
        out.len()
    }
}

impl Xlator for Gate {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let kind = req.fop.kind();
        self.seen.lock().push(kind);
        if self.open.load(Ordering::Acquire) {
            return self.inner.call(ctx, req);
        }
        let ticket = Arc::new(Ticket::default());
        {
            let mut h = self.held.lock();
            h.push(Held { gfid: req.fop.gfid(), kind, ticket: ticket.clone() });
            let mut m = self.max_held.lock();
            *m = (*m).max(h.len());
        }
        Box::pin(async move {
            (&*ticket).await;
            self.inner.call(ctx, req).await
        })
    }
}

/// A pass-through child that can be taken "down" (every fop fails with
/// ENOTCONN, as a disconnected brick's do) or made to fail chosen kinds.
pub struct Faulty {
    inner: Child,
    down: AtomicBool,
    fail: Mutex<Option<(Vec<FopKind>, Errno)>>,
}

impl Faulty {
    /// A pass-through in front of `inner`.
    pub fn new(inner: Child) -> Arc<Faulty> {
        Arc::new(Faulty { inner, down: AtomicBool::new(false), fail: Mutex::default() })
    }
    /// Takes the child down (true) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::Release);
    }
    /// Makes fops of `kinds` fail with `e` (None: pass everything again).
    pub fn fail(&self, what: Option<(Vec<FopKind>, Errno)>) {
        *self.fail.lock() = what;
    }
}

impl Xlator for Faulty {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        if self.down.load(Ordering::Acquire) {
            return Box::pin(std::future::ready(Err(Errno::ENOTCONN)));
        }
        if let Some((kinds, e)) = &*self.fail.lock()
            && kinds.contains(&req.fop.kind())
        {
            return Box::pin(std::future::ready(Err(*e)));
        }
        self.inner.call(ctx, req)
    }
}

/// Events a translator sent through its sink.
pub type Sent = Arc<Mutex<Vec<Event>>>;

/// An [`InitCtx`] named `test` for a translator with declarations `decls`,
/// the given options and children; the second value collects the events
/// the translator sends. Panics on options the declarations refuse.
pub fn init(decls: &[OptionDecl], opts: &[(&str, &str)], children: &[Child]) -> (InitCtx, Sent) {
    init_named("test", decls, opts, children)
}

/// [`init`] for a node named `name`, as a volfile would name it: for tests
/// that stack several translators, whose names show in their dumps, their
/// xattrs and their errors. The context's `events` is the node's sink, to
/// link to a parent with [`EventSink::attach_parent`].
pub fn init_named(name: &str, decls: &[OptionDecl], opts: &[(&str, &str)], children: &[Child]) -> (InitCtx, Sent) {
    let options = Options::resolve(decls, opts.iter().copied()).unwrap_or_else(|e| panic!("{name}: test options: {e}"));
    let events = EventSink::new();
    let sent: Sent = Arc::default();
    let s = sent.clone();
    events.set_hook(move |e| s.lock().push(e.clone()));
    let policies = Default::default();
    (InitCtx { name: name.into(), options, children: children.to_vec(), events, policies }, sent)
}

/// A caller: client `client` with lock owner `owner`.
pub fn ctx(client: &str, owner: u64) -> CallCtx {
    CallCtx::root(client).with_lk_owner(owner)
}

/// Polls a future once, without a runtime.
pub fn poll<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// Runs a future that must complete without waiting; panics if it waits.
pub fn now<F: Future>(f: F) -> F::Output {
    match poll(pin!(f)) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the future is waiting, expected it to complete at once"),
    }
}

/// A small deterministic generator (xorshift64*) for tests that want the
/// same random sequence on every run.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index below `n` (0 when `n` is 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
}

/// How often [`eventually`] and [`until`] look again.
const POLL_EVERY: Duration = Duration::from_millis(10);

/// Waits (blocking the thread) until `check` holds, looking every 10 ms;
/// panics naming `what` and the last reason once `within` has passed.
pub fn eventually(what: &str, within: Duration, check: impl FnMut() -> Result<(), String>) {
    if let Err(why) = within_time(within, check) {
        panic!("{what}: not within {within:?}: {why}");
    }
}

/// [`eventually`] without the panic: `Err` with the last reason once
/// `within` has passed, for a caller that gathers more to say first.
pub fn within_time(within: Duration, mut check: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(why) if Instant::now() >= deadline => return Err(why),
            Err(_) => std::thread::sleep(POLL_EVERY),
        }
    }
}

/// [`eventually`] for async tests: waits until `cond` holds without
/// blocking the runtime's thread (a timer thread wakes the task), and
/// panics naming `what` once `within` has passed.
pub async fn until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        Nap::new(POLL_EVERY).await;
    }
}

/// A sleep that needs no runtime: a thread wakes the task once.
struct Nap {
    until: Instant,
    armed: bool,
}

impl Nap {
    fn new(d: Duration) -> Nap {
        Nap { until: Instant::now() + d, armed: false }
    }
}

impl Future for Nap {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Poll::Ready(());
        }
        if !self.armed {
            self.armed = true;
            let w = cx.waker().clone();
            std::thread::spawn(move || {
                std::thread::sleep(left);
                w.wake();
            });
        }
        Poll::Pending
    }
}

/// An extended attribute of the file at `path` (not following a final
/// symlink), or None when it has none or cannot be read.
pub fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let (p, n) = c_path_name(path, name)?;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let len = usize::try_from(r).ok()?;
    buf.truncate(len);
    Some(buf)
}

/// Sets an extended attribute of the file at `path`.
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (p, n) = c_path_name(path, name).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: valid C strings and a value of the given length.
    let r = unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Removes an extended attribute of the file at `path`.
pub fn remove_xattr(path: &Path, name: &str) -> std::io::Result<()> {
    let (p, n) = c_path_name(path, name).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: valid C strings.
    let r = unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

fn c_path_name(path: &Path, name: &str) -> Option<(std::ffi::CString, std::ffi::CString)> {
    Some((std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?, std::ffi::CString::new(name).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fd, FdId, Loc};

    fn stat(g: Gfid) -> Request {
        Request::new(Fop::Stat { loc: Loc { gfid: g, ..Loc::root() } })
    }

    #[test]
    fn a_gate_holds_until_released_and_counts() {
        let gate = Gate::over_null();
        let (a, b) = (Gfid([1; 16]), Gfid([2; 16]));
        let mut fa = gate.call(CallCtx::root("t"), stat(a));
        let mut fb = gate.call(CallCtx::root("t"), stat(b));
        assert!(poll(fa.as_mut()).is_pending() && poll(fb.as_mut()).is_pending());
        assert_eq!((gate.held(), gate.max_held()), (2, 2));
        assert_eq!(gate.release_gfid(b), 1);
        assert!(poll(fa.as_mut()).is_pending());
        assert!(matches!(poll(fb.as_mut()), Poll::Ready(Ok(_))));
        gate.open();
        assert!(matches!(poll(fa.as_mut()), Poll::Ready(Ok(_))));
        now(gate.call(CallCtx::root("t"), stat(a))).expect("an open gate passes fops");
        assert_eq!(gate.arrived(), [FopKind::Stat; 3]);
        let mock = MockChild::new();
        let passing = Gate::passing(mock.clone());
        now(passing.call(CallCtx::root("t"), stat(a))).expect("a passing gate holds nothing");
        assert_eq!(
            (passing.arrived(), mock.kinds(), passing.max_held()),
            (vec![FopKind::Stat], vec![FopKind::Stat], 0)
        );
    }

    #[test]
    fn init_named_names_the_node_and_collects_its_events() {
        let mock = MockChild::new();
        let (ictx, sent) = init_named("afr-0", &[], &[], &[mock.child()]);
        assert_eq!((ictx.name.as_str(), ictx.children.len()), ("afr-0", 1));
        ictx.events.send(Event::ChildUp);
        assert_eq!(*sent.lock(), [Event::ChildUp]);
        let refused = std::panic::catch_unwind(|| init_named("x", &[], &[("no-such", "1")], &[]));
        assert!(refused.is_err(), "options the declarations refuse panic");
    }

    #[test]
    fn faulty_fails_what_it_is_told() {
        let mock = MockChild::new();
        let f = Faulty::new(mock.child());
        let fd = Fd { id: FdId(1), gfid: Gfid([3; 16]) };
        f.fail(Some((vec![FopKind::Fstat], Errno::EIO)));
        assert_eq!(now(f.call(CallCtx::root("t"), Request::new(Fop::Fstat { fd }))).err(), Some(Errno::EIO));
        now(f.call(CallCtx::root("t"), stat(Gfid::ROOT))).expect("other kinds pass");
        f.set_down(true);
        assert_eq!(now(f.call(CallCtx::root("t"), stat(Gfid::ROOT))).err(), Some(Errno::ENOTCONN));
        assert_eq!(mock.kinds(), [FopKind::Stat]);
    }

    #[test]
    fn until_waits_for_a_condition_and_eventually_gives_up() {
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            f.store(true, Ordering::Release);
        });
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(until("flag", Duration::from_secs(10), || flag.load(Ordering::Acquire)));
        let r = std::panic::catch_unwind(|| eventually("never", Duration::from_millis(30), || Err("no".into())));
        assert!(r.is_err());
    }
}
