use std::pin::pin;
use std::task::Poll;

use proptest::prelude::*;
use xlfs_sdk::{Fd, FdId};

use super::*;
use xlfs_sdk::testing::{MockChild, Sent, ctx, init, now, poll};

const G: Gfid = Gfid([7; 16]);
const D: &str = "dom";

fn setup(opts: &[(&str, &str)]) -> (Locks, Arc<MockChild>, Sent) {
    let mock = MockChild::new();
    let (init, sent) = init(OPTIONS, opts, &[mock.child()]);
    (Locks::new(init).expect("builds"), mock, sent)
}

fn fl(ty: LockType, start: u64, len: u64) -> Flock {
    Flock { ty, start, len, pid: 0, owner: 0 }
}

fn fd(id: u64) -> Fd {
    Fd { id: FdId(id), gfid: G }
}

fn ilk(cmd: LkCmd, ty: LockType, start: u64, len: u64) -> Request {
    ilk_in(D, cmd, ty, start, len)
}

fn ilk_in(domain: &str, cmd: LkCmd, ty: LockType, start: u64, len: u64) -> Request {
    Request::new(Fop::Finodelk { domain: domain.into(), fd: fd(1), cmd, lock: fl(ty, start, len) })
}

fn elk(name: &str, cmd: EntrylkCmd, ty: EntrylkType) -> Request {
    Request::new(Fop::Fentrylk { domain: D.into(), fd: fd(1), name: name.into(), cmd, ty })
}

fn plk(fd_id: u64, cmd: LkCmd, ty: LockType, start: u64, len: u64) -> Request {
    Request::new(Fop::Lk { fd: fd(fd_id), cmd, lock: fl(ty, start, len) })
}

fn ok(r: FopResult) {
    if let Err(e) = r {
        panic!("expected success, got {e:?}");
    }
}

fn lock_reply(r: FopResult) -> Flock {
    match r {
        Ok(Response { reply: Reply::Lock(f), .. }) => f,
        other => panic!("expected a lock reply, got {other:?}"),
    }
}

fn upcalls(sent: &Sent) -> Vec<Upcall> {
    sent.lock()
        .iter()
        .filter_map(|e| match e {
            Event::Upcall(u) => Some(u.clone()),
            _ => None,
        })
        .collect()
}

use LockType::{Read, Unlock, Write};

#[test]
fn conflicting_inodelk_waits_until_unlock() {
    let (xl, _, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 1));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, 0, 0))));
    let mut waiting = pin!(xl.call(b, ilk(LkCmd::SetLkw, Write, 100, 10)));
    assert!(poll(waiting.as_mut()).is_pending());
    assert!(poll(waiting.as_mut()).is_pending());
    ok(now(xl.call(a, ilk(LkCmd::SetLk, Unlock, 0, 0))));
    match poll(waiting.as_mut()) {
        Poll::Ready(r) => ok(r),
        Poll::Pending => panic!("waiter not granted after unlock"),
    }
}

#[test]
fn nonblocking_conflict_is_eagain_and_ranges_matter() {
    let (xl, _, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 1));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, 10, 10))));
    assert_eq!(now(xl.call(b.clone(), ilk(LkCmd::SetLk, Write, 19, 1))), Err(Errno::EAGAIN));
    assert_eq!(now(xl.call(b.clone(), ilk(LkCmd::SetLk, Read, 0, 0))), Err(Errno::EAGAIN));
    // Disjoint ranges, and other domains, do not conflict.
    ok(now(xl.call(b.clone(), ilk(LkCmd::SetLk, Write, 20, 5))));
    ok(now(xl.call(b.clone(), ilk(LkCmd::SetLk, Write, 0, 10))));
    ok(now(xl.call(b.clone(), ilk_in("other", LkCmd::SetLk, Write, 0, 0))));
    // GlusterFS's metadata range is its own domain.
    ok(now(xl.call(b, ilk(LkCmd::SetLk, Write, METADATA_START, 0))));
}

#[test]
fn read_locks_share_and_same_owner_never_conflicts() {
    let (xl, _, _) = setup(&[]);
    ok(now(xl.call(ctx("A", 1), ilk(LkCmd::SetLk, Read, 0, 0))));
    ok(now(xl.call(ctx("B", 1), ilk(LkCmd::SetLk, Read, 0, 0))));
    assert_eq!(now(xl.call(ctx("C", 1), ilk(LkCmd::SetLk, Write, 5, 5))), Err(Errno::EAGAIN));
    let (xl, _, _) = setup(&[]);
    ok(now(xl.call(ctx("A", 1), ilk(LkCmd::SetLk, Write, 0, 0))));
    ok(now(xl.call(ctx("A", 1), ilk(LkCmd::SetLk, Write, 0, 0))));
    ok(now(xl.call(ctx("A", 1), ilk(LkCmd::SetLkw, Read, 5, 5))));
    // The owner is (client, lk_owner): either one differing conflicts.
    assert_eq!(now(xl.call(ctx("A", 2), ilk(LkCmd::SetLk, Read, 0, 1))), Err(Errno::EAGAIN));
    assert_eq!(now(xl.call(ctx("B", 1), ilk(LkCmd::SetLk, Read, 0, 1))), Err(Errno::EAGAIN));
}

#[test]
fn unlock_must_match_and_getlk_is_einval() {
    let (xl, _, _) = setup(&[]);
    let a = ctx("A", 1);
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, 0, 10))));
    assert_eq!(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Unlock, 0, 5))), Err(Errno::EINVAL));
    assert_eq!(now(xl.call(ctx("B", 1), ilk(LkCmd::SetLk, Unlock, 0, 10))), Err(Errno::EINVAL));
    assert_eq!(now(xl.call(a.clone(), ilk(LkCmd::GetLk, Write, 0, 10))), Err(Errno::EINVAL));
    assert_eq!(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, u64::MAX, 2))), Err(Errno::EINVAL));
    ok(now(xl.call(a, ilk(LkCmd::SetLk, Unlock, 0, 10))));
    assert_eq!(xl.table.total.load(Ordering::Relaxed), 0);
    assert_eq!(xl.dump()[0], ("inodes".to_string(), "0".to_string()), "state freed with the last lock");
}

#[test]
fn waiting_writer_is_not_starved_by_readers() {
    let (xl, _, _) = setup(&[]);
    let (a, b, c) = (ctx("A", 1), ctx("B", 1), ctx("C", 1));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Read, 0, 0))));
    let mut writer = pin!(xl.call(b.clone(), ilk(LkCmd::SetLkw, Write, 0, 0)));
    assert!(poll(writer.as_mut()).is_pending());
    // A reader that would be compatible with A must not overtake B.
    assert_eq!(now(xl.call(c.clone(), ilk(LkCmd::SetLk, Read, 0, 0))), Err(Errno::EAGAIN));
    let mut reader = pin!(xl.call(c.clone(), ilk(LkCmd::SetLkw, Read, 0, 0)));
    assert!(poll(reader.as_mut()).is_pending());
    // But A, already in the domain, may nest another lock.
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Read, 0, 1))));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Unlock, 0, 1))));
    ok(now(xl.call(a, ilk(LkCmd::SetLk, Unlock, 0, 0))));
    assert!(matches!(poll(writer.as_mut()), Poll::Ready(Ok(_))), "writer first");
    assert!(poll(reader.as_mut()).is_pending());
    ok(now(xl.call(b, ilk(LkCmd::SetLk, Unlock, 0, 0))));
    assert!(matches!(poll(reader.as_mut()), Poll::Ready(Ok(_))));
}

#[test]
fn entrylk_names_and_whole_directory() {
    let (xl, _, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 1));
    use EntrylkCmd::{Lock, LockNb, Unlock as EUnlock};
    use EntrylkType::{Read as ER, Write as EW};
    ok(now(xl.call(a.clone(), elk("x", LockNb, EW))));
    assert_eq!(now(xl.call(b.clone(), elk("x", LockNb, EW))), Err(Errno::EAGAIN));
    ok(now(xl.call(b.clone(), elk("y", LockNb, EW))));
    // The whole directory conflicts with every name.
    assert_eq!(now(xl.call(b.clone(), elk("", LockNb, EW))), Err(Errno::EAGAIN));
    let mut dir = pin!(xl.call(ctx("C", 1), elk("", Lock, EW)));
    assert!(poll(dir.as_mut()).is_pending());
    // Unlock must match name, type and owner.
    assert_eq!(now(xl.call(a.clone(), elk("x", EUnlock, ER))), Err(Errno::EINVAL));
    assert_eq!(now(xl.call(b.clone(), elk("x", EUnlock, EW))), Err(Errno::EINVAL));
    ok(now(xl.call(a.clone(), elk("x", EUnlock, EW))));
    assert!(poll(dir.as_mut()).is_pending(), "y is still held");
    ok(now(xl.call(b.clone(), elk("y", EUnlock, EW))));
    assert!(matches!(poll(dir.as_mut()), Poll::Ready(Ok(_))));
    assert_eq!(now(xl.call(a.clone(), elk("z", LockNb, ER))), Err(Errno::EAGAIN), "directory is locked");

    // Read entry locks share.
    let (xl, _, _) = setup(&[]);
    ok(now(xl.call(a.clone(), elk("", LockNb, ER))));
    ok(now(xl.call(b.clone(), elk("n", LockNb, ER))));
    assert_eq!(now(xl.call(b.clone(), elk("n2", LockNb, EW))), Err(Errno::EAGAIN));
    assert_eq!(now(xl.call(b, elk(&"n".repeat(300), LockNb, EW))), Err(Errno::ENAMETOOLONG));
}

#[test]
fn path_based_locks_resolve_the_entry() {
    let (xl, mock, _) = setup(&[]);
    let loc = Loc::entry(Gfid::ROOT, "dir");
    let req = Request::new(Fop::Entrylk {
        domain: D.into(),
        loc: loc.clone(),
        name: "n".into(),
        cmd: EntrylkCmd::LockNb,
        ty: EntrylkType::Write,
    });
    ok(now(xl.call(ctx("A", 1), req)));
    assert_eq!(mock.kinds(), vec![FopKind::Lookup]);
    let by_fd = Request::new(Fop::Fentrylk {
        domain: D.into(),
        fd: Fd { id: FdId(9), gfid: MockChild::ENTRY_GFID },
        name: "n".into(),
        cmd: EntrylkCmd::LockNb,
        ty: EntrylkType::Write,
    });
    assert_eq!(now(xl.call(ctx("B", 1), by_fd)), Err(Errno::EAGAIN));
    let by_gfid =
        Request::new(Fop::Inodelk { domain: D.into(), loc: Loc::gfid(G), cmd: LkCmd::SetLk, lock: fl(Write, 0, 0) });
    ok(now(xl.call(ctx("A", 1), by_gfid)));
    assert_eq!(now(xl.call(ctx("B", 1), ilk(LkCmd::SetLk, Write, 0, 0))), Err(Errno::EAGAIN));
    assert_eq!(mock.kinds().len(), 1, "lock fops are not forwarded");
}

#[test]
fn posix_merge_split_and_getlk() {
    let (xl, _, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 1));
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Read, 0, 100))));
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Write, 40, 20)))); // upgrade in place
    let f = lock_reply(now(xl.call(b.clone(), plk(2, LkCmd::GetLk, Read, 0, 0))));
    assert_eq!((f.ty, f.start, f.len, f.owner), (Write, 40, 20, 1));
    let f = lock_reply(now(xl.call(b.clone(), plk(2, LkCmd::GetLk, Write, 0, 10))));
    assert_eq!((f.ty, f.start, f.len), (Read, 0, 40));
    let f = lock_reply(now(xl.call(a.clone(), plk(1, LkCmd::GetLk, Write, 0, 0))));
    assert_eq!((f.ty, f.start, f.len), (Unlock, 0, 0), "own locks never conflict");
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Unlock, 0, 50)))); // split
    ok(now(xl.call(b.clone(), plk(2, LkCmd::SetLk, Write, 0, 50))));
    assert_eq!(now(xl.call(b.clone(), plk(2, LkCmd::SetLk, Write, 55, 1))), Err(Errno::EAGAIN));
    ok(now(xl.call(b.clone(), plk(2, LkCmd::SetLk, Read, 60, 40)))); // A holds read there
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Read, 50, 10)))); // downgrade W->R
    ok(now(xl.call(b.clone(), plk(2, LkCmd::SetLk, Read, 50, 10))));
    // Unlocking a range with no lock is fine (POSIX).
    ok(now(xl.call(b.clone(), plk(2, LkCmd::SetLk, Unlock, 1000, 10))));
    assert_eq!(now(xl.call(b, plk(2, LkCmd::GetLk, Unlock, 0, 0))), Err(Errno::EINVAL));
}

#[test]
fn posix_setlkw_waits() {
    let (xl, _, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 1));
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Write, 0, 10))));
    let mut w = pin!(xl.call(b, plk(2, LkCmd::SetLkw, Write, 5, 10)));
    assert!(poll(w.as_mut()).is_pending());
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Unlock, 0, 5))));
    assert!(poll(w.as_mut()).is_pending(), "5..9 still held");
    ok(now(xl.call(a, plk(1, LkCmd::SetLk, Unlock, 5, 5))));
    let f = match poll(w.as_mut()) {
        Poll::Ready(r) => lock_reply(r),
        Poll::Pending => panic!("not granted"),
    };
    assert_eq!((f.ty, f.start, f.len), (Write, 5, 10));
}

#[test]
fn flush_releases_the_owners_posix_locks() {
    let (xl, mock, _) = setup(&[]);
    let (a1, a2, b) = (ctx("A", 1), ctx("A", 2), ctx("B", 1));
    ok(now(xl.call(a1.clone(), plk(1, LkCmd::SetLk, Write, 0, 10))));
    ok(now(xl.call(a2.clone(), plk(1, LkCmd::SetLk, Write, 10, 10))));
    let mut w = pin!(xl.call(b.clone(), plk(2, LkCmd::SetLkw, Write, 0, 5)));
    assert!(poll(w.as_mut()).is_pending());
    ok(now(xl.call(a1, Request::new(Fop::Flush { fd: fd(1) }))));
    assert!(matches!(poll(w.as_mut()), Poll::Ready(Ok(_))));
    assert_eq!(now(xl.call(b, plk(2, LkCmd::SetLk, Write, 15, 1))), Err(Errno::EAGAIN), "A/2 keeps its lock");
    assert_eq!(mock.kinds(), vec![FopKind::Flush], "flush goes on to the child");
}

#[test]
fn release_frees_locks_taken_through_the_fd() {
    let (xl, mock, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 1));
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Write, 0, 10))));
    ok(now(xl.call(a.clone(), plk(2, LkCmd::SetLk, Write, 20, 10))));
    // Another client's fd with the same id is another fd.
    ok(now(xl.call(b.clone(), Request::new(Fop::Release { fd: fd(1) }))));
    assert_eq!(now(xl.call(b.clone(), plk(3, LkCmd::SetLk, Write, 0, 1))), Err(Errno::EAGAIN));
    ok(now(xl.call(a, Request::new(Fop::Release { fd: fd(1) }))));
    ok(now(xl.call(b.clone(), plk(3, LkCmd::SetLk, Write, 0, 10))));
    assert_eq!(now(xl.call(b, plk(3, LkCmd::SetLk, Write, 25, 1))), Err(Errno::EAGAIN));
    assert_eq!(mock.kinds(), vec![FopKind::Release, FopKind::Release]);
}

#[test]
fn client_gone_releases_everything_and_grants_waiters() {
    let (xl, _, _) = setup(&[]);
    let (a, b, c) = (ctx("A", 1), ctx("B", 1), ctx("C", 1));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, 0, 0))));
    ok(now(xl.call(a.clone(), elk("x", EntrylkCmd::Lock, EntrylkType::Write))));
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Write, 0, 0))));
    ok(now(xl.call(c.clone(), ilk_in("c", LkCmd::SetLk, Write, 0, 0))));
    let mut w1 = pin!(xl.call(b.clone(), ilk(LkCmd::SetLkw, Read, 0, 1)));
    let mut w2 = pin!(xl.call(b.clone(), elk("x", EntrylkCmd::Lock, EntrylkType::Write)));
    let mut w3 = pin!(xl.call(b.clone(), plk(2, LkCmd::SetLkw, Read, 0, 0)));
    let mut gone = pin!(xl.call(a.clone(), ilk_in("c", LkCmd::SetLkw, Write, 0, 0)));
    for f in [w1.as_mut(), w2.as_mut(), w3.as_mut(), gone.as_mut()] {
        assert!(poll(f).is_pending());
    }
    assert_eq!(xl.notify(Event::ClientGone { client_id: "A".into() }, EventFrom::Graph), None);
    assert!(matches!(poll(w1.as_mut()), Poll::Ready(Ok(_))));
    assert!(matches!(poll(w2.as_mut()), Poll::Ready(Ok(_))));
    assert!(matches!(poll(w3.as_mut()), Poll::Ready(Ok(_))));
    assert_eq!(poll(gone.as_mut()), Poll::Ready(Err(Errno::ENOTCONN)));
    // B's three and C's one remain.
    assert_eq!(xl.table.total.load(Ordering::Relaxed), 4);
    // Other events from the graph stop here, child events pass on.
    assert_eq!(xl.notify(Event::ParentUp, EventFrom::Graph), None);
    assert_eq!(xl.notify(Event::ChildUp, EventFrom::Child(0)), Some(Event::ChildUp));
}

/// A brick that stops fails every request still waiting, at once (its
/// server's drain would otherwise wait for grants that never come); the
/// locks held stay until their clients go.
#[test]
fn stopping_fails_the_waiters_at_once() {
    let (xl, _, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 1));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, 0, 0))));
    ok(now(xl.call(a.clone(), elk("x", EntrylkCmd::Lock, EntrylkType::Write))));
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Write, 0, 0))));
    let mut w1 = pin!(xl.call(b.clone(), ilk(LkCmd::SetLkw, Read, 0, 1)));
    let mut w2 = pin!(xl.call(b.clone(), elk("x", EntrylkCmd::Lock, EntrylkType::Write)));
    let mut w3 = pin!(xl.call(b.clone(), plk(2, LkCmd::SetLkw, Read, 0, 0)));
    for f in [w1.as_mut(), w2.as_mut(), w3.as_mut()] {
        assert!(poll(f).is_pending());
    }
    assert_eq!(xl.notify(Event::ParentDown, EventFrom::Graph), None);
    for f in [w1.as_mut(), w2.as_mut(), w3.as_mut()] {
        assert_eq!(poll(f), Poll::Ready(Err(Errno::ENOTCONN)));
    }
    assert_eq!(xl.table.total.load(Ordering::Relaxed), 3, "A's three locks stay");
}

#[test]
fn cancelled_waiters_leave_the_queue() {
    let (xl, _, _) = setup(&[]);
    let (a, b, c) = (ctx("A", 1), ctx("B", 1), ctx("C", 1));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Read, 0, 0))));
    {
        let mut w = Box::pin(xl.call(b.clone(), ilk(LkCmd::SetLkw, Write, 0, 0)));
        assert!(poll(w.as_mut()).is_pending());
        assert_eq!(xl.table.total.load(Ordering::Relaxed), 2);
    }
    assert_eq!(xl.table.total.load(Ordering::Relaxed), 1);
    // With the writer gone, a reader is not held back by fairness.
    ok(now(xl.call(c.clone(), ilk(LkCmd::SetLk, Read, 0, 0))));
    ok(now(xl.call(c.clone(), ilk(LkCmd::SetLk, Unlock, 0, 0))));

    // Granted in the same instant as dropped: the lock is given back.
    let mut w = Box::pin(xl.call(b.clone(), ilk(LkCmd::SetLkw, Write, 0, 0)));
    assert!(poll(w.as_mut()).is_pending());
    ok(now(xl.call(a, ilk(LkCmd::SetLk, Unlock, 0, 0))));
    drop(w);
    ok(now(xl.call(c.clone(), ilk(LkCmd::SetLk, Write, 0, 0))));

    // Posix waiters, too.
    ok(now(xl.call(c.clone(), plk(1, LkCmd::SetLk, Write, 0, 0))));
    let mut p = Box::pin(xl.call(b, plk(2, LkCmd::SetLkw, Write, 0, 0)));
    assert!(poll(p.as_mut()).is_pending());
    assert_eq!(xl.table.total.load(Ordering::Relaxed), 3);
    drop(p);
    ok(now(xl.call(c, ilk(LkCmd::SetLk, Unlock, 0, 0))));
    assert_eq!(xl.table.total.load(Ordering::Relaxed), 1, "only C's posix lock is left");
}

#[test]
fn contention_upcall_once_per_delay_window() {
    let (xl, _, sent) = setup(&[]);
    let (a, b, c) = (ctx("A", 7), ctx("B", 1), ctx("C", 1));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, 0, 0))));
    let mut w = pin!(xl.call(b.clone(), ilk(LkCmd::SetLkw, Write, 0, 0)));
    assert!(poll(w.as_mut()).is_pending());
    let expect = Upcall::InodelkContention { gfid: G, domain: D.into(), holder_client: "A".into(), holder_owner: 7 };
    assert_eq!(upcalls(&sent), vec![expect.clone()]);
    assert_eq!(now(xl.call(c.clone(), ilk(LkCmd::SetLk, Write, 0, 0))), Err(Errno::EAGAIN));
    let mut w2 = pin!(xl.call(c.clone(), ilk(LkCmd::SetLkw, Read, 5, 5)));
    assert!(poll(w2.as_mut()).is_pending());
    assert_eq!(upcalls(&sent).len(), 1, "within the 5 s window nothing more is sent");

    // Delay 0: every conflicting request tells the holder again.
    let (xl, _, sent) = setup(&[("notify-contention-delay", "0")]);
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, 0, 0))));
    assert_eq!(now(xl.call(b.clone(), ilk(LkCmd::SetLk, Write, 0, 0))), Err(Errno::EAGAIN));
    assert_eq!(now(xl.call(c.clone(), ilk(LkCmd::SetLk, Write, 0, 0))), Err(Errno::EAGAIN));
    assert_eq!(upcalls(&sent), vec![expect.clone(), expect]);
    ok(now(xl.call(a.clone(), elk("n", EntrylkCmd::LockNb, EntrylkType::Write))));
    assert_eq!(now(xl.call(b.clone(), elk("", EntrylkCmd::LockNb, EntrylkType::Write))), Err(Errno::EAGAIN));
    assert_eq!(
        upcalls(&sent).last(),
        Some(&Upcall::EntrylkContention { gfid: G, domain: D.into(), name: "n".into(), holder_client: "A".into() })
    );

    // Switched off: nothing.
    let (xl, _, sent) = setup(&[("notify-contention", "off")]);
    ok(now(xl.call(a, ilk(LkCmd::SetLk, Write, 0, 0))));
    assert_eq!(now(xl.call(b, ilk(LkCmd::SetLk, Write, 0, 0))), Err(Errno::EAGAIN));
    assert!(upcalls(&sent).is_empty());
}

#[test]
fn lock_counts_in_reply_xdata() {
    let (xl, mock, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 1));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Write, 0, 0))));
    let mut w = pin!(xl.call(b.clone(), ilk(LkCmd::SetLkw, Write, 0, 0)));
    assert!(poll(w.as_mut()).is_pending());
    ok(now(xl.call(a.clone(), ilk_in("other", LkCmd::SetLk, Write, 0, 0))));
    ok(now(xl.call(a.clone(), elk("n", EntrylkCmd::LockNb, EntrylkType::Write))));
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Read, 0, 10))));

    let asking = |key: &str, v: Value| {
        Request::with_xdata(Fop::Fxattrop { fd: fd(1), op: xlfs_sdk::XattropOp::AddArray, xattrs: Dict::new() }, {
            let mut d = Dict::new();
            d.set(key, v);
            d.set_str("keep", "me");
            d
        })
    };
    let r = now(xl.call(a.clone(), asking(keys::INODELK_COUNT, Value::Str(D.into())))).expect("ok");
    assert_eq!(r.xdata.get_u64(keys::INODELK_COUNT), Some(2), "granted + blocked in the domain");
    let r = now(xl.call(a.clone(), asking(keys::INODELK_COUNT, Value::U64(1)))).expect("ok");
    assert_eq!(r.xdata.get_u64(keys::INODELK_COUNT), Some(3), "all domains");
    let r = now(xl.call(a.clone(), asking(keys::ENTRYLK_COUNT, Value::U64(1)))).expect("ok");
    assert_eq!(r.xdata.get_u64(keys::ENTRYLK_COUNT), Some(1));
    let r = now(xl.call(a.clone(), asking(keys::POSIXLK_COUNT, Value::U64(1)))).expect("ok");
    assert_eq!(r.xdata.get_u64(keys::POSIXLK_COUNT), Some(1));
    for (_, req) in mock.calls() {
        assert_eq!(req.xdata.keys().collect::<Vec<_>>(), vec!["keep"], "count keys do not reach the child");
    }
    // On a lock fop, and on an inode without locks.
    let mut req = ilk(LkCmd::SetLk, Read, 0, 0);
    req.xdata.set_str(keys::INODELK_COUNT, D);
    let r = now(xl.call(a.clone(), req)).expect("A nests a lock");
    assert_eq!(r.xdata.get_u64(keys::INODELK_COUNT), Some(3), "counted after the lock is granted");
    let mut req = ilk_in("third", LkCmd::SetLk, Read, 0, 0);
    req.xdata.set_str(keys::INODELK_COUNT, "third");
    assert_eq!(now(xl.call(a.clone(), req)).expect("ok").xdata.get_u64(keys::INODELK_COUNT), Some(1));
    let mut req = Request::new(Fop::Lookup { loc: Loc::entry(G, "child") });
    req.xdata.set_u64(keys::INODELK_COUNT, 0);
    let r = now(xl.call(a, req)).expect("ok");
    assert_eq!(r.xdata.get_u64(keys::INODELK_COUNT), Some(0), "the looked-up inode, not its parent");
}

#[test]
fn max_locks_gives_enolck() {
    let (xl, _, _) = setup(&[("max-locks", "2")]);
    let a = ctx("A", 1);
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Read, 0, 1))));
    ok(now(xl.call(a.clone(), elk("n", EntrylkCmd::LockNb, EntrylkType::Read))));
    assert_eq!(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Read, 5, 1))), Err(Errno::ENOLCK));
    assert_eq!(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Read, 5, 1))), Err(Errno::ENOLCK));
    ok(now(xl.call(a.clone(), ilk(LkCmd::SetLk, Unlock, 0, 1))));
    ok(now(xl.call(a, plk(1, LkCmd::SetLk, Read, 5, 1))));
}

#[test]
fn mandatory_locking_is_refused() {
    let mock = MockChild::new();
    let (i, _) = init(OPTIONS, &[("enforce-mandatory-lock", "on")], &[mock.child()]);
    let e = Locks::new(i).err().expect("refused");
    assert!(e.to_string().contains("mandatory locking is not implemented"), "{e}");
    let (i, _) = init(OPTIONS, &[("enforce-mandatory-lock", "off")], &[mock.child()]);
    assert!(Locks::new(i).is_ok());
}

#[test]
fn dump_lists_the_locks() {
    let (xl, _, _) = setup(&[]);
    ok(now(xl.call(ctx("A", 1), ilk(LkCmd::SetLk, Write, 0, 0))));
    let d = xl.dump();
    let line = d.iter().find(|(k, _)| k.starts_with("inodelk.")).expect("inodelk line");
    assert!(line.1.contains("W 0-EOF by A/0x1") && line.1.contains("blocked 0"), "{line:?}");
    assert!(d.contains(&("locks".to_string(), "1".to_string())));
}

/// A byte-map model of POSIX locks over bytes 0..N plus one cell standing
/// for every byte from N to the end of file.
const N: usize = 12;

#[derive(Clone, Debug)]
struct Op {
    owner: u64,
    kind: u8, // 0 read, 1 write, 2 unlock
    start: u64,
    len: u64,
}

fn op() -> impl Strategy<Value = Op> {
    (0u64..3, 0u8..3, 0u64..N as u64).prop_flat_map(|(owner, kind, start)| {
        (0..=(N as u64 - start)).prop_map(move |len| Op { owner, kind, start, len })
    })
}

fn cells(start: u64, len: u64) -> std::ops::Range<usize> {
    start as usize..if len == 0 { N + 1 } else { (start + len) as usize }
}

proptest! {
    #[test]
    fn posix_locks_match_a_byte_model(ops in proptest::collection::vec(op(), 1..40)) {
        // model[cell][owner] = None | Some(exclusive)
        let mut model = vec![[None::<bool>; 3]; N + 1];
        let mut pl = PosixLocks::default();
        let owner = |o: u64| Owner { client: Arc::from("c"), lk_owner: o };
        for (i, op) in ops.iter().enumerate() {
            let end = if op.len == 0 { u64::MAX } else { op.start + op.len - 1 };
            let req = PosixLk { owner: owner(op.owner), fd: FdId(1), exclusive: op.kind == 1, start: op.start, end, pid: 0 };
            let range = cells(op.start, op.len);
            let o = op.owner as usize;
            if op.kind == 2 {
                pl.apply(&req, true);
                for c in range { model[c][o] = None; }
            } else {
                let conflict = range.clone().any(|c| (0..3).any(|p| p != o && match model[c][p] {
                    Some(excl) => excl || req.exclusive,
                    None => false,
                }));
                let got = pl.conflict(&req).cloned();
                prop_assert_eq!(got.is_some(), conflict, "GETLK at op {}", i);
                if let Some(g) = got {
                    // It is a lock the model has, in the way of the request.
                    prop_assert!(g.owner != req.owner && (g.exclusive || req.exclusive));
                    let gl = if g.end == u64::MAX { 0 } else { g.end - g.start + 1 };
                    for c in cells(g.start, gl) { prop_assert_eq!(model[c][g.owner.lk_owner as usize], Some(g.exclusive)); }
                }
                match pl.lock(i as u64, req.clone(), false) {
                    Attempt::Granted => {
                        prop_assert!(!conflict);
                        for c in range { model[c][o] = Some(req.exclusive); }
                    }
                    Attempt::WouldBlock => prop_assert!(conflict),
                    Attempt::Queued(_) => prop_assert!(false, "non-blocking request queued"),
                }
            }
            // The granted ranges equal the model, one owner's ranges are
            // disjoint, and touching ranges of one owner and type are merged.
            let mut seen = vec![[None::<bool>; 3]; N + 1];
            for l in &pl.granted {
                let len = if l.end == u64::MAX { 0 } else { l.end - l.start + 1 };
                for c in cells(l.start, len) {
                    let slot = &mut seen[c][l.owner.lk_owner as usize];
                    prop_assert!(slot.is_none(), "overlapping ranges of one owner");
                    *slot = Some(l.exclusive);
                }
                for m in &pl.granted {
                    if m.owner == l.owner && m.exclusive == l.exclusive {
                        prop_assert!(l.end.checked_add(1) != Some(m.start), "unmerged neighbours {:?} {:?}", l, m);
                    }
                }
            }
            prop_assert_eq!(&seen, &model);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_locks_exclude_under_concurrency() {
    use std::sync::atomic::AtomicUsize;
    let (xl, _, _) = setup(&[("notify-contention-delay", "0")]);
    let xl = Arc::new(xl);
    // Holders inside the critical section, per lock kind (inodelk, posix).
    let inside = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let (xl, inside) = (xl.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let me = ctx(&format!("client-{}", t % 3), t);
            for i in 0..50u64 {
                // Half the tasks use the inodelk, half a posix lock, on overlapping ranges.
                let (lock, unlock) = if t % 2 == 0 {
                    (ilk(LkCmd::SetLkw, Write, i % 4, 8), ilk(LkCmd::SetLk, Unlock, i % 4, 8))
                } else {
                    (plk(t, LkCmd::SetLkw, Write, i % 4, 8), plk(t, LkCmd::SetLk, Unlock, i % 4, 8))
                };
                xl.call(me.clone(), lock).await.expect("granted");
                let kind = (t % 2) as usize;
                assert_eq!(inside[kind].fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                tokio::task::yield_now().await;
                inside[kind].fetch_sub(1, Ordering::SeqCst);
                xl.call(me.clone(), unlock).await.expect("unlocked");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(xl.table.total.load(Ordering::Relaxed), 0);
    assert_eq!(xl.dump()[0], ("inodes".to_string(), "0".to_string()));
}

/// An unlock marked LK_CANCEL takes the owner's waiting requests for the
/// range off the queue (EINTR) and leaves granted locks alone; the next
/// waiter is then granted when the holder unlocks.
#[test]
fn a_cancel_takes_waiting_requests_off_the_queue() {
    use xlfs_sdk::dict::keys::LK_CANCEL;
    let (xl, _, _) = setup(&[]);
    let (a, b, c) = (ctx("A", 1), ctx("B", 1), ctx("C", 1));
    ok(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Write, 0, 10))));
    ok(now(xl.call(b.clone(), plk(2, LkCmd::SetLk, Read, 50, 10))));
    let mut wb = pin!(xl.call(b.clone(), plk(2, LkCmd::SetLkw, Write, 0, 10)));
    let mut wc = pin!(xl.call(c.clone(), plk(3, LkCmd::SetLkw, Write, 0, 10)));
    assert!(poll(wb.as_mut()).is_pending() && poll(wc.as_mut()).is_pending());
    let mut cancel = plk(2, LkCmd::SetLk, Unlock, 0, 10);
    cancel.xdata.set_u64(LK_CANCEL, 1);
    ok(now(xl.call(b.clone(), cancel)));
    assert_eq!(poll(wb.as_mut()), Poll::Ready(Err(Errno::EINTR)));
    assert!(poll(wc.as_mut()).is_pending(), "another owner's wait stays");
    ok(now(xl.call(a, plk(1, LkCmd::SetLk, Unlock, 0, 10))));
    assert!(matches!(poll(wc.as_mut()), Poll::Ready(Ok(_))), "C, not B's cancelled wait, gets the range");
    // B's read lock elsewhere is untouched: C cannot write there.
    assert_eq!(now(xl.call(c, plk(3, LkCmd::SetLk, Write, 50, 1))), Err(Errno::EAGAIN));
}

/// flock(2) locks ([`LK_FLOCK`]) follow POSIX locks' rules in a space of
/// their own: a flock and an fcntl lock on the same range never conflict;
/// flocks conflict with each other; a flush leaves a flock, the fd's
/// release drops it; a cancel marked flock cancels only there.
#[test]
fn flocks_live_apart_from_posix_locks() {
    use xlfs_sdk::dict::keys::{LK_CANCEL, LK_FLOCK};
    let (xl, _, _) = setup(&[]);
    let (a, b) = (ctx("A", 1), ctx("B", 2));
    let flk = |fd_id, cmd, ty| {
        let mut r = plk(fd_id, cmd, ty, 0, 0);
        r.xdata.set_u64(LK_FLOCK, 1);
        r
    };
    ok(now(xl.call(a.clone(), flk(1, LkCmd::SetLk, Write))));
    ok(now(xl.call(b.clone(), plk(2, LkCmd::SetLk, Write, 0, 0))));
    assert_eq!(now(xl.call(b.clone(), flk(2, LkCmd::SetLk, Write))), Err(Errno::EAGAIN), "flocks conflict");
    assert_eq!(now(xl.call(a.clone(), plk(1, LkCmd::SetLk, Read, 5, 1))), Err(Errno::EAGAIN), "POSIX locks conflict");
    // B waits for a flock; a cancel in the POSIX space does not touch it.
    let mut wait = pin!(xl.call(b.clone(), flk(2, LkCmd::SetLkw, Write)));
    assert!(poll(wait.as_mut()).is_pending());
    let mut cancel = plk(2, LkCmd::SetLk, Unlock, 0, 0);
    cancel.xdata.set_u64(LK_CANCEL, 1);
    ok(now(xl.call(b.clone(), cancel)));
    assert!(poll(wait.as_mut()).is_pending(), "a POSIX cancel leaves the flock wait");
    // A's flush (a close of any of its fds) keeps its flock.
    ok(now(xl.call(a.clone(), Request::new(Fop::Flush { fd: fd(1) }))));
    assert!(poll(wait.as_mut()).is_pending(), "a flush leaves a flock");
    ok(now(xl.call(a, Request::new(Fop::Release { fd: fd(1) }))));
    assert!(matches!(poll(wait.as_mut()), Poll::Ready(Ok(_))), "the release drops A's flock");
    // B's POSIX lock is still there, and its release drops both kinds.
    ok(now(xl.call(b.clone(), Request::new(Fop::Release { fd: fd(2) }))));
    assert_eq!(xl.table.total.load(Ordering::Relaxed), 0);
}
