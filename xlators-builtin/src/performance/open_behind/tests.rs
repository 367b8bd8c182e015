//! open-behind over a recording mock child.

use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use xlfs_sdk::{
    CallCtx, Child, Errno, Fd, FdId, Fop, FopFuture, FopKind, Gfid, Loc, Options, Reply, Request, Response, Xlator,
};

use super::*;
use xlfs_sdk::testing::{MockChild, ctx, init, init_named, now, poll};

const G: Gfid = Gfid([0x61; 16]);

fn setup(opts: &[(&str, &str)]) -> (Arc<OpenBehind>, Arc<MockChild>) {
    let mock = MockChild::new();
    let (ictx, _sent) = init(OPTIONS, opts, &[mock.child()]);
    (Arc::new(OpenBehind::new(ictx).expect("build")), mock)
}

fn fd(id: u64) -> Fd {
    Fd { id: FdId(id), gfid: G }
}

fn open_fop(id: u64, flags: i32) -> Fop {
    Fop::Open { loc: Loc::gfid(G), flags: flags as u32, fd: FdId(id) }
}

fn read_fop(id: u64) -> Fop {
    Fop::Readv { fd: fd(id), size: 16, offset: 0, flags: 0 }
}

fn call(ob: &OpenBehind, fop: Fop) -> FopResult {
    now(ob.call(ctx("c", 1), Request::new(fop)))
}

fn dump(ob: &OpenBehind, key: &str) -> String {
    ob.dump().into_iter().find(|(k, _)| k == key).map(|(_, v)| v).unwrap_or_default()
}

#[test]
fn open_flush_release_of_an_unused_fd_sends_nothing() {
    let (ob, mock) = setup(&[]);
    assert_eq!(call(&ob, open_fop(1, libc::O_RDONLY)).map(|r| r.reply), Ok(Reply::Empty));
    assert_eq!(call(&ob, Fop::Flush { fd: fd(1) }).map(|r| r.reply), Ok(Reply::Empty));
    assert_eq!(call(&ob, Fop::Release { fd: fd(1) }).map(|r| r.reply), Ok(Reply::Empty));
    assert!(mock.kinds().is_empty(), "{:?}", mock.kinds());
    assert_eq!((dump(&ob, "opens-deferred").as_str(), dump(&ob, "opens-avoided").as_str()), ("1", "1"));
    assert_eq!(dump(&ob, "fds"), "0");
}

#[test]
fn the_first_read_opens_below_then_flush_and_release_go_down() {
    let (ob, mock) = setup(&[]);
    let opener = ctx("opener", 7);
    now(ob.call(opener.clone(), Request::new(open_fop(1, libc::O_RDONLY | libc::O_NOATIME)))).expect("open");
    assert!(mock.kinds().is_empty());
    match call(&ob, read_fop(1)) {
        Ok(Response { reply: Reply::Read { data, .. }, .. }) => assert_eq!(data.len(), 16),
        r => panic!("{r:?}"),
    }
    call(&ob, read_fop(1)).expect("second read");
    call(&ob, Fop::Flush { fd: fd(1) }).expect("flush");
    call(&ob, Fop::Release { fd: fd(1) }).expect("release");
    // The fd was really opened, so flush (POSIX lock cleanup) and release
    // go down after it; the open was sent once, as the opener asked.
    let expect = [FopKind::Open, FopKind::Readv, FopKind::Readv, FopKind::Flush, FopKind::Release];
    assert_eq!(mock.kinds(), expect);
    let (octx, oreq) = mock.calls()[0].clone();
    assert_eq!(octx, opener);
    assert_eq!(oreq.fop, open_fop(1, libc::O_RDONLY | libc::O_NOATIME));
    assert_eq!((dump(&ob, "opens-sent").as_str(), dump(&ob, "opens-avoided").as_str()), ("1", "0"));
}

#[test]
fn fstat_of_a_deferred_fd_is_a_stat_and_other_fd_fops_open_first() {
    let (ob, mock) = setup(&[]);
    call(&ob, open_fop(1, libc::O_RDONLY)).expect("open");
    assert!(matches!(call(&ob, Fop::Fstat { fd: fd(1) }), Ok(Response { reply: Reply::Attr(_), .. })));
    assert_eq!(mock.kinds(), [FopKind::Stat]);
    assert_eq!(mock.calls()[0].1.fop, Fop::Stat { loc: Loc::gfid(G) });
    call(&ob, Fop::Fgetxattr { fd: fd(1), name: "user.x".into() }).expect("fgetxattr");
    call(&ob, Fop::Fstat { fd: fd(1) }).expect("fstat");
    assert_eq!(mock.kinds(), [FopKind::Stat, FopKind::Open, FopKind::Fgetxattr, FopKind::Fstat]);
    // Copy from a deferred fd into another: both are opened first.
    call(&ob, open_fop(2, libc::O_RDONLY)).expect("open");
    call(&ob, open_fop(3, libc::O_RDONLY)).expect("open");
    let copy = Fop::CopyFileRange { fd_in: fd(2), off_in: 0, fd_out: fd(3), off_out: 0, len: 1, flags: 0 };
    call(&ob, copy).expect("copy");
    let tail: Vec<FopKind> = mock.kinds().split_off(4);
    assert_eq!(tail, [FopKind::Open, FopKind::Open, FopKind::CopyFileRange]);
    // Fops on fds this translator does not know pass straight through.
    call(&ob, read_fop(99)).expect("read");
    assert_eq!(mock.kinds().last(), Some(&FopKind::Readv));
}

#[test]
fn a_failed_deferred_open_fails_the_fop_that_needed_it_and_every_later_one() {
    let (ob, mock) = setup(&[]);
    mock.answer(FopKind::Open, Err(Errno::EACCES));
    call(&ob, open_fop(1, libc::O_RDONLY)).expect("acknowledged");
    assert_eq!(call(&ob, read_fop(1)).err(), Some(Errno::EACCES));
    assert_eq!(call(&ob, Fop::Fgetxattr { fd: fd(1), name: "user.x".into() }).err(), Some(Errno::EACCES));
    assert_eq!(call(&ob, Fop::Fstat { fd: fd(1) }).err(), Some(Errno::EACCES));
    assert_eq!(call(&ob, Fop::Flush { fd: fd(1) }).err(), Some(Errno::EACCES));
    assert_eq!(call(&ob, Fop::Release { fd: fd(1) }).map(|r| r.reply), Ok(Reply::Empty));
    assert_eq!(mock.kinds(), [FopKind::Open], "one open, nothing else went down");
    assert_eq!(dump(&ob, "opens-failed"), "1");
    // After release the fd is unknown: a fop on it passes through.
    call(&ob, read_fop(1)).expect("passes through");
}

#[test]
fn opens_that_need_the_fd_go_down_at_once() {
    let (ob, mock) = setup(&[]);
    for flags in [libc::O_RDWR, libc::O_WRONLY, libc::O_RDONLY | libc::O_TRUNC, libc::O_RDONLY | libc::O_DIRECT] {
        let before = mock.kinds().len();
        call(&ob, open_fop(1, flags)).expect("open");
        assert_eq!(mock.kinds().len(), before + 1, "flags {flags:#o} go down");
        call(&ob, Fop::Flush { fd: fd(1) }).expect("flush");
        call(&ob, Fop::Release { fd: fd(1) }).expect("release");
        assert_eq!(mock.kinds()[before..], [FopKind::Open, FopKind::Flush, FopKind::Release]);
    }
    // Their errors come back from the open itself.
    mock.answer(FopKind::Open, Err(Errno::EROFS));
    assert_eq!(call(&ob, open_fop(2, libc::O_RDWR)).err(), Some(Errno::EROFS));
    // Without a gfid nothing can be deferred.
    let by_name = Fop::Open { loc: Loc::entry(Gfid::ROOT, "f"), flags: 0, fd: FdId(3) };
    assert_eq!(call(&ob, by_name).err(), Some(Errno::EROFS));
    assert_eq!(dump(&ob, "opens-deferred"), "0");
}

/// A child whose opens wait until the test lets them through.
struct SlowOpen {
    mock: Arc<MockChild>,
    gate: tokio::sync::Semaphore,
}

impl Xlator for SlowOpen {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(async move {
            if matches!(req.fop, Fop::Open { .. }) {
                let _p = self.gate.acquire().await.map_err(|_| Errno::EIO)?;
            }
            self.mock.call(ctx, req).await
        })
    }
}

#[test]
fn concurrent_fops_wait_for_one_open() {
    let mock = MockChild::new();
    let slow = Arc::new(SlowOpen { mock: mock.clone(), gate: tokio::sync::Semaphore::new(0) });
    let (ictx, _) = init_named("ob", OPTIONS, &[], &[Child { name: Arc::from("slow"), xl: slow.clone() }]);
    let ob = OpenBehind::new(ictx).expect("build");
    call(&ob, open_fop(1, libc::O_RDONLY)).expect("open");
    let mut a = pin!(ob.call(ctx("c", 1), Request::new(read_fop(1))));
    let mut b = pin!(ob.call(
        ctx("c", 2),
        Request::new(Fop::Lk {
            fd: fd(1),
            cmd: xlfs_sdk::LkCmd::GetLk,
            lock: xlfs_sdk::Flock::whole(xlfs_sdk::LockType::Read, 2)
        })
    ));
    assert!(poll(a.as_mut()).is_pending());
    assert!(poll(b.as_mut()).is_pending());
    assert!(mock.kinds().is_empty(), "the open is still waiting");
    slow.gate.add_permits(10);
    assert!(matches!(poll(a.as_mut()), Poll::Ready(Ok(_))));
    assert!(matches!(poll(b.as_mut()), Poll::Ready(Ok(_))));
    assert_eq!(mock.kinds(), [FopKind::Open, FopKind::Readv, FopKind::Lk], "one open for both");
}

#[tokio::test(flavor = "current_thread")]
async fn without_lazy_open_the_open_is_sent_in_the_background() {
    let (ob, mock) = setup(&[("lazy-open", "off")]);
    let r = ob.call(ctx("c", 1), Request::new(open_fop(1, libc::O_RDONLY))).await;
    assert_eq!(r.map(|r| r.reply), Ok(Reply::Empty));
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    assert_eq!(mock.kinds(), [FopKind::Open]);
    ob.call(ctx("c", 1), Request::new(read_fop(1))).await.expect("read");
    ob.call(ctx("c", 1), Request::new(Fop::Release { fd: fd(1) })).await.expect("release");
    assert_eq!(mock.kinds(), [FopKind::Open, FopKind::Readv, FopKind::Release]);
    // Reconfigured back to lazy.
    let o = Options::resolve(OPTIONS, [("lazy-open", "on")]).expect("options");
    ob.reconfigure(&o).expect("reconfigure");
    ob.call(ctx("c", 1), Request::new(open_fop(2, libc::O_RDONLY))).await.expect("open");
    ob.call(ctx("c", 1), Request::new(Fop::Release { fd: fd(2) })).await.expect("release");
    assert_eq!(mock.kinds().len(), 3);
    assert_eq!(dump(&ob, "lazy-open"), "true");
}

#[test]
fn a_reopen_after_a_graph_switch_is_lazy_again() {
    // The FUSE bridge reopens every fd on the new graph with OPEN (same id,
    // flags less O_CREAT/O_EXCL/O_TRUNC) and releases it on the old one.
    let (old, old_mock) = setup(&[]);
    let (new, new_mock) = setup(&[]);
    call(&old, open_fop(1, libc::O_RDONLY)).expect("open");
    call(&old, read_fop(1)).expect("read on the old graph");
    call(&new, open_fop(1, libc::O_RDONLY)).expect("reopen");
    assert!(new_mock.kinds().is_empty(), "lazy on the new graph");
    call(&old, Fop::Release { fd: fd(1) }).expect("release on the old graph");
    assert_eq!(old_mock.kinds(), [FopKind::Open, FopKind::Readv, FopKind::Release]);
    call(&new, read_fop(1)).expect("read on the new graph");
    assert_eq!(new_mock.kinds(), [FopKind::Open, FopKind::Readv]);
    // An open repeated for an id still deferred replaces it.
    call(&new, open_fop(2, libc::O_RDONLY)).expect("open");
    call(&new, open_fop(2, libc::O_RDONLY)).expect("open again");
    call(&new, Fop::Release { fd: fd(2) }).expect("release");
    assert_eq!(new_mock.kinds().len(), 2);
}
