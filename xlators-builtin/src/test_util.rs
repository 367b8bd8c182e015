//! Helpers for the translators' unit tests: a recording mock child that
//! answers every fop at once, an [`InitCtx`] builder that captures the
//! events a translator sends, and hand polling of futures (so tests can
//! check that a request is still waiting without timers).

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use parking_lot::Mutex;
use xlfs_sdk::{
    CallCtx, Child, Errno, Event, EventSink, Fop, FopFuture, FopKind, FopResult, Gfid, Iatt, InitCtx, OptionDecl,
    Options, Reply, Request, Response, Xlator,
};

/// A child that records each call and answers it at once: `Lookup` with an
/// entry (the loc's gfid, or [`Mock::ENTRY_GFID`]), `Readv` with `size`
/// zero bytes, `Writev` and other attribute fops with attributes, `Lk` with
/// the lock, anything else with `Empty`; or with the errno set by
/// [`Mock::fail_with`].
#[derive(Default)]
pub struct Mock {
    calls: Mutex<Vec<(CallCtx, Request)>>,
    fail: Mutex<Option<Errno>>,
    answers: Mutex<Vec<(FopKind, FopResult)>>,
}

impl Mock {
    /// The gfid a lookup of an entry without gfid resolves to.
    pub const ENTRY_GFID: Gfid = Gfid([0xe0; 16]);

    /// A new mock.
    pub fn new() -> Arc<Mock> {
        Arc::new(Mock::default())
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

    /// Answers every later call of `kind` with `res` (instead of the
    /// default reply), until set again.
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

fn reply_for(fop: &Fop) -> Reply {
    let iatt = Iatt { gfid: fop.gfid(), ..Iatt::default() };
    match fop {
        Fop::Lookup { loc } => {
            let gfid = if loc.gfid.is_null() { Mock::ENTRY_GFID } else { loc.gfid };
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

impl Xlator for Mock {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let kind = req.fop.kind();
        let set = self.answers.lock().iter().find(|(k, _)| *k == kind).map(|(_, r)| r.clone());
        let res = match (*self.fail.lock(), set) {
            (Some(e), _) => Err(e),
            (None, Some(r)) => r,
            (None, None) => Ok(Response::from(reply_for(&req.fop))),
        };
        self.calls.lock().push((ctx, req));
        Box::pin(std::future::ready(res))
    }
}

/// Events a translator sent through its sink.
pub type Sent = Arc<Mutex<Vec<Event>>>;

/// An [`InitCtx`] for a translator with declarations `decls`, the given
/// options, and `mock` as only child; the second value collects the events
/// the translator sends.
pub fn init(decls: &[OptionDecl], opts: &[(&str, &str)], mock: &Arc<Mock>) -> (InitCtx, Sent) {
    let options = Options::resolve(decls, opts.iter().copied()).expect("valid test options");
    let events = EventSink::new();
    let sent: Sent = Arc::default();
    let s = sent.clone();
    events.set_hook(move |e| s.lock().push(e.clone()));
    (InitCtx { name: "test".into(), options, children: vec![mock.child()], events }, sent)
}

/// A caller: client `client` with lock owner `owner`.
pub fn ctx(client: &str, owner: u64) -> CallCtx {
    CallCtx::root(client).with_lk_owner(owner)
}

/// Polls a future once.
pub fn poll<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// Runs a future that must complete without waiting.
pub fn now<F: Future>(f: F) -> F::Output {
    match poll(pin!(f)) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the future is waiting, expected it to complete at once"),
    }
}
