//! protocol/client against real servers over loopback (the harness is
//! protocol/server's) and against hand-made servers that misbehave.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use xlfs_sdk::abi::AbiVersion;
use xlfs_sdk::{Dict, Errno, Event, FdId, Flock, Fop, Gfid, LkCmd, Loc, LockType, Reply};

use crate::protocol::rpc::{FrameKind, FrameReader, HANDSHAKE_MAX_FRAME, HelloReply, Message, write_loop};
use crate::protocol::server::tests::{Brick, TestClient, create, entry_gfid, fd, read_data, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fds_are_reopened_after_the_server_comes_back() {
    let mut brick = Brick::start(&[]);
    let addr = brick.addr();
    let c = TestClient::up(addr, &[("strict-locks", "on")]).await;
    let kept = entry_gfid(c.run(create("kept", 1)).await);
    c.run(Fop::Writev { fd: fd(1, kept), data: "hello".into(), offset: 0, flags: 0 }).await.expect("write");
    c.run(Fop::Opendir { loc: Loc::root(), fd: FdId(2) }).await.expect("opendir");
    let doomed = entry_gfid(c.run(create("doomed", 3)).await);
    let locked = entry_gfid(c.run(create("locked", 4)).await);
    c.run(Fop::Lk { fd: fd(4, locked), cmd: LkCmd::SetLk, lock: Flock::whole(LockType::Write, 1) }).await.expect("lk");

    brick.stop_server().await;
    c.wait_downs(1).await;
    assert_eq!(c.run(Fop::Stat { loc: Loc::root() }).await, Err(Errno::ENOTCONN), "down: ENOTCONN at once");
    assert_eq!(c.run(Fop::Readv { fd: fd(1, kept), size: 5, offset: 0, flags: 0 }).await, Err(Errno::ENOTCONN));
    // While the client is away its file goes.
    brick.local(Fop::Unlink { loc: Loc::entry(Gfid::ROOT, "doomed"), flags: 0 }).await.expect("unlink");

    brick.restart_server(addr.port());
    c.wait_ups(2).await;
    assert_eq!(read_data(c.run(Fop::Readv { fd: fd(1, kept), size: 5, offset: 0, flags: 0 }).await), "hello");
    match c.run(Fop::Readdir { fd: fd(2, Gfid::ROOT), size: 65536, offset: 0 }).await.expect("readdir").reply {
        Reply::Dirents(es) => assert!(es.iter().any(|e| e.name == "kept")),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.dump("reopens-total"), "2");
    assert_eq!(c.run(Fop::Fstat { fd: fd(3, doomed) }).await, Err(Errno::EBADF), "its reopen failed");
    assert_eq!(c.run(Fop::Fstat { fd: fd(3, doomed) }).await, Err(Errno::EBADF), "and stays bad");
    assert_eq!(c.run(Fop::Fstat { fd: fd(4, locked) }).await, Err(Errno::EBADF), "strict-locks: not reopened");
    assert_eq!(c.dump("reopen-failures-total"), "2");
    c.run(Fop::Release { fd: fd(3, doomed) }).await.expect("releasing a bad fd is fine");
    c.run(Fop::Release { fd: fd(1, kept) }).await.expect("release");
    assert_eq!(c.run(Fop::Fstat { fd: fd(1, kept) }).await, Err(Errno::EBADF), "released on the server");
    c.stop();
    brick.stop_server().await;
}

/// A server that accepts the handshake and then never sends anything.
async fn silent_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (rd, wr) = s.into_split();
                let (tx, rx) = tokio::sync::mpsc::channel(8);
                tokio::spawn(write_loop(wr, rx));
                let mut r = FrameReader::new(rd, HANDSHAKE_MAX_FRAME);
                let Ok(Some(hello)) = r.next().await else {
                    return;
                };
                assert_eq!(hello.kind, FrameKind::Hello);
                let ok = HelloReply {
                    version: AbiVersion::CURRENT,
                    accepted: true,
                    reason: String::new(),
                    info: Dict::new(),
                };
                tx.send(Message::HelloReply(ok).to_frame(hello.id).expect("encodes").into()).await.expect("queued");
                r.set_max_frame(1 << 30);
                // Read (so the client's writes never block) and never answer.
                while let Ok(Some(_)) = r.next().await {}
                drop(tx);
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_is_declared_down_by_ping_timeout() {
    let addr = silent_server().await;
    let c = Arc::new(TestClient::up(addr, &[("ping-timeout", "300ms"), ("reconnect-min", "10s")]).await);
    let inflight = {
        let c = c.clone();
        tokio::spawn(async move { c.run(Fop::Stat { loc: Loc::root() }).await })
    };
    c.wait_downs(1).await;
    assert_eq!(
        within("the call", inflight).await.expect("join"),
        Err(Errno::ENOTCONN),
        "in flight when the server was declared down"
    );
    assert!(c.dump("last-error").contains("ping-timeout"), "{}", c.dump("last-error"));
    assert_eq!(c.dump("ping-timeouts-total"), "1");
    c.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_timeout_bounds_every_fop() {
    let addr = silent_server().await;
    let c = TestClient::up(addr, &[("ping-timeout", "0"), ("frame-timeout", "200ms")]).await;
    assert_eq!(c.run(Fop::Stat { loc: Loc::root() }).await, Err(Errno::ENOTCONN));
    assert_eq!(c.dump("frame-timeouts-total"), "1");
    assert_eq!(c.dump("inflight"), "0", "the timed-out call no longer waits");
    assert_eq!(c.count(&Event::ChildDown), 0, "the connection itself is fine");
    c.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reconnects_until_the_server_is_there() {
    // Nothing listens yet: ChildConnecting, then ChildDown, retried.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = probe.local_addr().expect("addr").port();
    drop(probe);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let c = TestClient::new(addr, &[]);
    c.start();
    c.wait_downs(1).await;
    assert_eq!(c.events.lock().first(), Some(&Event::ChildConnecting));
    assert_eq!(c.run(Fop::Stat { loc: Loc::root() }).await, Err(Errno::ENOTCONN));
    let mut brick = Brick::start(&[]);
    brick.restart_server(port);
    c.wait_ups(1).await;
    c.run(Fop::Stat { loc: Loc::root() }).await.expect("served");
    assert_eq!(c.count(&Event::ChildDown), 1, "state events only on change");
    c.stop();
    c.wait_downs(2).await;
    brick.stop_server().await;
}

#[test]
fn gluster_client_volfile_options_are_accepted() {
    let opts = [
        ("send-gids", "true"),
        ("strict-locks", "off"),
        ("transport.socket.keepalive-count", "9"),
        ("transport.socket.keepalive-interval", "2"),
        ("transport.socket.keepalive-time", "20"),
        ("transport.tcp-user-timeout", "0"),
        ("transport.socket.ssl-enabled", "off"),
        ("password", "c5f8ad01-1797-4cf4-8b65-38179060f463"),
        ("username", "31d20107-36ad-4db5-b4bf-e99d575e3031"),
        ("transport.address-family", "inet"),
        ("transport-type", "tcp"),
        ("remote-subvolume", "/srv/gb/b1"),
        ("remote-host", "vm"),
        ("ping-timeout", "42"),
    ];
    xlfs_sdk::Options::resolve(super::TYPE.options, opts).expect("the fixtures' options resolve");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let _e = rt.enter();
    let (init, _) = xlfs_sdk::testing::init_named("c", super::TYPE.options, &[("remote-host", "h")], &[]);
    let e = (super::TYPE.build)(init).err().expect("remote-subvolume is required");
    assert!(e.to_string().contains("'remote-subvolume' is required"), "{e}");
}
