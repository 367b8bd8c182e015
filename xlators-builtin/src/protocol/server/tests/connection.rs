//! Tests of a connection's life: handshakes refused with a reason, hostile
//! input, a gone client's locks and fds, upcalls to the holder only, and
//! stopping with calls in flight.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_are_refused_with_a_reason() {
    let brick = Brick::start(&[
        ("auth.login.brick.allow", "alice"),
        ("auth.login.alice.password", "s3cret"),
        ("auth.addr.brick.reject", "127.0.0.2"),
    ]);
    let addr = brick.addr();
    type Login = Option<(&'static str, &'static str)>;
    let cases: Vec<(AbiVersion, &str, Login, &str)> = vec![
        (
            AbiVersion::CURRENT,
            "nope",
            Some(("alice", "s3cret")),
            "no subvolume 'nope' on this server (it serves: brick)",
        ),
        (AbiVersion::new(2, 0), SUBVOL, Some(("alice", "s3cret")), "host speaks v1.0, peer was built for v2.0"),
        (AbiVersion::CURRENT, SUBVOL, Some(("alice", "wrong")), "wrong password for user 'alice'"),
        (AbiVersion::CURRENT, SUBVOL, Some(("bob", "s3cret")), "user 'bob' is not allowed"),
        (AbiVersion::CURRENT, SUBVOL, None, "no username"),
    ];
    for (version, volume, user, why) in cases {
        let reply = blocking(move || {
            let mut raw = Raw::connect(addr);
            let r = raw.hello(version, volume, user);
            assert!(raw.closed());
            r
        })
        .await;
        assert!(!reply.accepted, "{volume} {user:?}");
        assert!(reply.reason.contains(why), "reason '{}' should say '{why}'", reply.reason);
    }
    let ok = blocking(move || Raw::connect(addr).hello(AbiVersion::CURRENT, SUBVOL, Some(("alice", "s3cret")))).await;
    assert!(ok.accepted, "{ok:?}");
    assert!(ok.info.get_str(hello_keys::ASSIGNED_CLIENT_ID).is_some_and(|id| id.starts_with("raw#")), "{ok:?}");

    // auth.addr: a reject pattern matching loopback.
    let rejecting = Brick::start(&[("auth.addr.brick.reject", "127.0.0.*")]);
    let addr2 = rejecting.addr();
    let r = blocking(move || Raw::connect(addr2).hello(AbiVersion::CURRENT, SUBVOL, None)).await;
    assert!(!r.accepted && r.reason.contains("address 127.0.0.1 is rejected"), "{r:?}");
    let allow_other = Brick::start(&[("auth.addr.brick.allow", "10.*")]);
    let addr3 = allow_other.addr();
    let r = blocking(move || Raw::connect(addr3).hello(AbiVersion::CURRENT, SUBVOL, None)).await;
    assert!(!r.accepted && r.reason.contains("not allowed"), "{r:?}");

    // A client with a wrong password stays down and shows the reason.
    let c = TestClient::new(addr, &[("username", "alice"), ("password", "wrong")]);
    c.start();
    until("the refusal", PATIENCE, || c.dump("last-error").contains("wrong password for user 'alice'")).await;
    c.wait_downs(1).await;
    assert_eq!(c.count(&Event::ChildUp), 0);
    assert_eq!(c.run(Fop::Stat { loc: Loc::root() }).await, Err(Errno::ENOTCONN));
    c.stop();
    let good = TestClient::up(addr, &[("username", "alice"), ("password", "s3cret")]).await;
    good.run(Fop::Stat { loc: Loc::root() }).await.expect("logged in");
    good.stop();
    for b in [&brick, &rejecting, &allow_other] {
        b.stop_server().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_closes_only_that_connection() {
    let brick = Brick::start(&[("max-frame-size", "1MB")]);
    let addr = brick.addr();
    let good = TestClient::up(addr, &[]).await;
    let hello = Message::Hello(Hello {
        version: AbiVersion::CURRENT,
        params: Dict::new()
            .with(hello_keys::VOLUME, Value::Str(SUBVOL.into()))
            .with(hello_keys::CLIENT_ID, Value::Str("evil".into())),
    });
    let mut ctx_bytes = Vec::new();
    abi::encode(&CallCtx::root("evil"), &mut ctx_bytes);
    let mut unknown_fop = ctx_bytes.clone();
    unknown_fop.extend_from_slice(&999u16.to_le_bytes());
    let mut bad_call = ctx_bytes.clone();
    bad_call.extend_from_slice(&(FopKind::Stat as u16).to_le_bytes());
    bad_call.extend_from_slice(&[1, 2, 3]);

    let mut truncated = Message::Ping.to_frame(1).expect("ping").to_vec();
    truncated.truncate(10);
    let cases: Vec<(&str, bool, Vec<u8>)> = vec![
        ("garbage", false, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("a truncated frame", false, truncated),
        ("a 0xFFFFFFFF length", false, vec![0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]),
        ("a CALL before the HELLO", false, rpc::encode_raw_frame(FrameKind::Call as u8, 0, 0, 1, &unknown_fop, &[])),
        ("a frame over max-frame-size", true, [&((2u32 << 20).to_le_bytes())[..], &[5, 0, 0, 0]].concat()),
        ("an undecodable CALL", true, rpc::encode_raw_frame(FrameKind::Call as u8, 0, 0, 1, &bad_call, &[])),
        ("an unknown frame kind", true, rpc::encode_raw_frame(0x77, 0, 0, 1, &[], &[])),
        ("a REPLY from a client", true, Message::Reply(Err(Errno::EIO)).to_frame(3).expect("reply").to_vec()),
    ];
    for (what, after_hello, bytes) in cases {
        let hello = hello.clone();
        blocking(move || {
            let mut raw = Raw::connect(addr);
            if after_hello {
                raw.send_msg(&hello, 0);
                assert!(matches!(raw.recv(), Some(Message::HelloReply(r)) if r.accepted), "{what}");
            }
            raw.send(&bytes);
            if what == "a truncated frame" {
                raw.s.shutdown_write();
            }
            assert!(raw.closed(), "{what}: the server closes the connection");
        })
        .await;
        good.run(Fop::Stat { loc: Loc::root() }).await.unwrap_or_else(|e| panic!("after {what}: {e:?}"));
    }
    assert!(brick.chain.top().dump("closed-bad-input-total").parse::<u32>().expect("counter") >= 5);

    // An unknown fop code is answered with ENOSYS; the connection stays.
    blocking(move || {
        let mut raw = Raw::connect(addr);
        raw.send_msg(&hello, 0);
        assert!(matches!(raw.recv(), Some(Message::HelloReply(r)) if r.accepted));
        raw.send(&rpc::encode_raw_frame(FrameKind::Call as u8, 0, 0, 41, &unknown_fop, &[]));
        raw.send_msg(&Message::Ping, 42);
        assert_eq!(raw.recv(), Some(Message::Reply(Err(Errno::ENOSYS))));
        assert_eq!(raw.recv(), Some(Message::Pong));
    })
    .await;
    good.run(Fop::Stat { loc: Loc::root() }).await.expect("still served");
    good.stop();
    brick.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_local_clients_close_only_their_connection() {
    use crate::protocol::rpc::{Descriptor, local_preface, shm};
    use std::os::fd::AsRawFd;
    let brick = Brick::start(&[]);
    let addr = brick.addr();
    let good = TestClient::up(addr, &[]).await;
    assert_eq!(good.dump("transport"), "unix+shm");
    let file = entry_gfid(good.run(create("f", 1)).await);
    fn hello(who: &str) -> Message {
        Message::Hello(Hello {
            version: AbiVersion::CURRENT,
            params: Dict::new()
                .with(hello_keys::VOLUME, Value::Str(SUBVOL.into()))
                .with(hello_keys::CLIENT_ID, Value::Str(who.into())),
        })
    }
    /// Accepted; whether with shared memory.
    fn accepted(raw: &mut Raw, who: &str) -> bool {
        raw.send_msg(&hello(who), 0);
        match raw.recv() {
            Some(Message::HelloReply(r)) if r.accepted => r.info.get_u64(hello_keys::SHARED_MEMORY) == Some(1),
            other => panic!("{who}: {other:?}"),
        }
    }
    // A write whose data, 64 KiB, the frame says lies in shared memory.
    let write = |offset: u64, len: u64| {
        let data = Bytes::from(vec![b'x'; len as usize]);
        let fop = Fop::Writev { fd: fd(1, file), data, offset: 0, flags: 0 };
        let m = Message::Call { ctx: CallCtx::root("evil"), req: Request::new(fop) };
        m.to_frame(5).expect("call").with_descriptors(Some(Descriptor { offset, len }), None).to_vec()
    };
    let send = shm::Region::create("evil-send", 1 << 20).expect("region");
    let recv = shm::Region::create("evil-recv", 1 << 20).expect("region");
    let (s, r) = (send.raw_fd(), recv.raw_fd());
    let plain_file = tempfile::tempfile().expect("file");
    plain_file.set_len(1 << 20).expect("size");
    let pf = plain_file.as_raw_fd();

    type Case = (&'static str, u8, Vec<std::os::fd::RawFd>, bool, Vec<u8>);
    let cases: Vec<Case> = vec![
        ("shared data on a connection without regions", local_preface::PLAIN, vec![], false, write(0, 65536)),
        ("a plain file for a region", local_preface::SHARED, vec![pf, pf], false, write(0, 65536)),
        ("data past the send region", local_preface::SHARED, vec![s, r], true, write(1 << 20, 65536)),
        ("data with an overflowing end", local_preface::SHARED, vec![s, r], true, write(u64::MAX - 10, 65536)),
        ("shared flags on a PING", local_preface::SHARED, vec![s, r], true, {
            Message::Ping
                .to_frame(1)
                .expect("ping")
                .with_descriptors(Some(Descriptor { offset: 0, len: 1 }), None)
                .to_vec()
        }),
        ("a reply chunk past the receive region", local_preface::SHARED, vec![s, r], true, {
            let fop = Fop::Readv { fd: fd(1, file), size: 65536, offset: 0, flags: 0 };
            let m = Message::Call { ctx: CallCtx::root("evil"), req: Request::new(fop) };
            let at = Descriptor { offset: (1 << 20) - 4096, len: 65536 };
            m.to_frame(6).expect("call").with_descriptors(None, Some(at)).to_vec()
        }),
    ];
    for (what, tag, fds, shared, bytes) in cases {
        blocking(move || {
            let mut raw = Raw::connect_local(addr, tag, &fds);
            assert_eq!(accepted(&mut raw, what), shared, "{what}: shared memory agreed");
            raw.send(&bytes);
            assert!(raw.closed(), "{what}: the server closes the connection");
        })
        .await;
        good.run(Fop::Fstat { fd: fd(1, file) }).await.unwrap_or_else(|e| panic!("after {what}: {e:?}"));
    }
    // Three fds, or a preface byte that means nothing: closed before the
    // handshake.
    for (what, tag, fds) in [("three fds", local_preface::SHARED, vec![s, r, s]), ("a bad tag", b'?', vec![])] {
        blocking(move || {
            let mut raw = Raw::connect_local(addr, tag, &fds);
            raw.send_msg(&hello(what), 0);
            assert!(raw.recv().is_none(), "{what}: closed without a HELLO_REPLY");
        })
        .await;
    }
    // A local client claiming another host's address for auth.addr is refused.
    blocking(move || {
        let mut raw = Raw::connect_local(addr, local_preface::PLAIN, &[]);
        let mut params = Dict::new().with(hello_keys::VOLUME, Value::Str(SUBVOL.into()));
        params.set_str(hello_keys::CLIENT_ID, "liar");
        params.set_str(hello_keys::LOCAL_ADDR, "192.0.2.1");
        raw.send_msg(&Message::Hello(Hello { version: AbiVersion::CURRENT, params }), 0);
        match raw.recv() {
            Some(Message::HelloReply(r)) => {
                assert!(!r.accepted && r.reason.contains("not an address of this host"), "{}", r.reason)
            }
            other => panic!("{other:?}"),
        }
    })
    .await;
    assert!(brick.chain.top().dump("closed-bad-input-total").parse::<u32>().expect("counter") >= 7);
    good.stop();
    brick.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_client_releases_its_locks_and_fds() {
    let brick = Brick::start(&[]);
    let a = TestClient::up(brick.addr(), &[]).await;
    let b = Arc::new(TestClient::up(brick.addr(), &[]).await);
    let lock =
        |ty| Fop::Inodelk { domain: "dom".into(), loc: Loc::root(), cmd: LkCmd::SetLk, lock: Flock::whole(ty, 1) };
    a.run(lock(LockType::Write)).await.expect("a locks");
    a.run(create("held", 5)).await.expect("a opens");
    assert_eq!(b.run(lock(LockType::Write)).await, Err(Errno::EAGAIN));
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move {
            b.run(Fop::Inodelk {
                domain: "dom".into(),
                loc: Loc::root(),
                cmd: LkCmd::SetLkw,
                lock: Flock::whole(LockType::Write, 2),
            })
            .await
        })
    };
    until("b's request queued at the lock server", PATIENCE, || brick.locks.dump("locks") == "2").await;
    assert!(!waiting.is_finished());
    assert_eq!(brick.posix.dump("open-fds"), "1");
    a.stop();
    within("b's lock", waiting).await.expect("join").expect("b gets the lock once a is gone");
    until("a's fd released on the brick", PATIENCE, || brick.posix.dump("open-fds") == "0").await;
    assert_eq!(brick.chain.top().dump("clients"), "1");
    b.stop();
    brick.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_upcalls_reach_the_holder_only() {
    let brick = Brick::start(&[]);
    let a = TestClient::up(brick.addr(), &[]).await;
    let b = TestClient::up(brick.addr(), &[]).await;
    let lock = |owner| Fop::Inodelk {
        domain: "dom".into(),
        loc: Loc::root(),
        cmd: LkCmd::SetLk,
        lock: Flock::whole(LockType::Write, owner),
    };
    a.run_as(CallCtx::root("a").with_lk_owner(7), lock(7)).await.expect("a locks");
    assert_eq!(b.run(lock(8)).await, Err(Errno::EAGAIN));
    until("a's contention upcall", PATIENCE, || !a.upcalls().is_empty()).await;
    match &a.upcalls()[0] {
        Upcall::InodelkContention { gfid, domain, holder_client, holder_owner } => {
            assert_eq!((*gfid, domain.as_str(), *holder_owner), (Gfid::ROOT, "dom", 7));
            assert_eq!(holder_client, &a.dump("server-client-id"));
        }
        other => panic!("{other:?}"),
    }
    // Anything queued for b before this reply would have arrived first.
    b.run(Fop::Stat { loc: Loc::root() }).await.expect("stat");
    assert!(b.upcalls().is_empty(), "{:?}", b.upcalls());
    a.stop();
    b.stop();
    brick.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_answers_calls_in_flight_then_says_goodbye() {
    let (gate, chain) = gate_server(&[]);
    let addr = listen_addr(chain.top());
    let c = Arc::new(TestClient::up(addr, &[("reconnect-min", "1s")]).await);
    let t = {
        let c = c.clone();
        tokio::spawn(async move { c.run(Fop::Stat { loc: Loc::gfid(g(1)) }).await })
    };
    until("the call at the child", PATIENCE, || gate.held() == 1).await;
    let server = chain.top().xl.clone();
    assert_eq!(server.notify(Event::ParentDown, EventFrom::Graph), None);
    let fini = tokio::task::spawn_blocking(move || server.fini());
    // fini has begun once the listener is gone; it then waits for the call.
    until("fini closes the listener", PATIENCE, || std::net::TcpStream::connect(addr).is_err()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!fini.is_finished(), "fini waits for the call in flight");
    gate.release_gfid(g(1));
    assert!(within("the answer", t).await.expect("join").is_ok(), "the call in flight is answered");
    within("fini", fini).await.expect("fini returns");
    c.wait_downs(1).await;
    until("the goodbye", PATIENCE, || c.dump("last-error").contains("said goodbye: the server is shutting down")).await;
    c.stop();
}
