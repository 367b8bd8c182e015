//! End-to-end tests over the network: real `xlfs brick` processes on
//! loopback (started by the test kit), in-process client graphs
//! (protocol/client -> debug/io-stats) driven through the client API.
//! Covers the foundation workload over RPC, sharing between clients, lock
//! conflicts and their release when the holder dies, brick death and
//! restart, ping timeouts, authentication, malformed frames and the brick
//! command's own life cycle.

mod kit;

use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use kit::raw::Raw;
use kit::{Brick, BrickConfig, Cluster, Mount, TestProcess, mount, mount_to, mount_with, wait_state};
use tokio::task::JoinHandle;
use xlfs_runtime::client::Client;
use xlfs_runtime::graph::TopState;
use xlfs_sdk::abi;
use xlfs_sdk::{CallCtx, Dict, Errno, Flock, LkCmd, LockType};
use xlfs_xlators::protocol::rpc::{self, FrameKind, Message};

/// A generous bound for things that should happen quickly: a hang guard.
const GUARD: Duration = Duration::from_secs(20);

/// The ping timeout the death and hang tests configure.
const PING: (&str, &str) = ("ping-timeout", "2s");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_api_workload_over_the_network() {
    let mut brick = Brick::start();
    let m = mount(&brick).await;
    kit::workload::client_api(&m.client, &m.graph, brick.dir()).await;
    m.graph.shutdown();
    brick.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_see_each_others_writes() {
    let brick = Brick::start();
    let (a, b) = (mount(&brick).await, mount(&brick).await);
    let (ca, cb) = (&a.client, &b.client);

    let fa = ca.create("/shared", libc::O_RDWR, 0o644).await.expect("a creates");
    fa.write(0, Bytes::from_static(b"from a")).await.expect("a writes");
    let fb = cb.open("/shared", libc::O_RDWR).await.expect("b opens a's file");
    assert_eq!(&fb.read(0, 100).await.expect("b reads")[..], b"from a");
    fb.write(6, Bytes::from_static(b", and b")).await.expect("b writes");
    assert_eq!(&fa.read(0, 100).await.expect("a reads")[..], b"from a, and b");
    assert_eq!(fa.stat().await.expect("a fstat").size, 13);
    fa.close().await.expect("close a");
    fb.close().await.expect("close b");

    cb.mkdir("/from-b", 0o755).await.expect("b mkdir");
    let names: Vec<String> = ca.readdir("/").await.expect("a lists").into_iter().map(|e| e.name).collect();
    assert!(
        names.contains(&"from-b".to_string()) && names.contains(&"shared".to_string()),
        "a sees b's entries: {names:?}"
    );
    ca.setxattr("/from-b", "user.k", b"v", 0).await.expect("a setxattr");
    assert_eq!(&cb.getxattr("/from-b", "user.k").await.expect("b getxattr")[..], b"v");
    ca.unlink("/shared").await.expect("a unlinks");
    assert_eq!(cb.stat("/shared").await.expect_err("b sees it gone"), Errno::ENOENT);
    assert_eq!(std::fs::read_dir(brick.dir().join("from-b")).expect("on disk").count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_bricks_are_independent_volumes() {
    let cluster = Cluster::start(2);
    assert_ne!(cluster[0].port(), cluster[1].port());
    assert_ne!(cluster[0].dir(), cluster[1].dir());
    let (m0, m1) = (mount(&cluster[0]).await, mount(&cluster[1]).await);
    m0.client.mkdir("/only-on-0", 0o755).await.expect("mkdir on 0");
    assert_eq!(m1.client.stat("/only-on-0").await.expect_err("not on 1"), Errno::ENOENT);
    assert!(cluster[0].dir().join("only-on-0").is_dir());
    assert!(!cluster[1].dir().join("only-on-0").exists());
    // A client naming the other brick's subvolume is refused.
    let wrong = kit::graph_from(&kit::client_volfile_to(cluster[0].port(), &cluster[1].subvolume(), &[]));
    assert!(
        cluster[0].wait_log(&cluster[1].subvolume(), GUARD),
        "brick 0 logs the unknown subvolume:\n{}",
        cluster[0].log()
    );
    assert_eq!(Client::new(wrong.top()).stat("/").await.expect_err("refused"), Errno::ENOTCONN);
    assert_eq!(wrong.state(), TopState::Down);
}

/// Which lock the holder process takes.
#[derive(Clone, Copy, Debug)]
enum LockKind {
    Posix,
    Inode,
}

const LOCK_DOMAIN: &str = "kit.domain";
const LOCKED_FILE: &str = "/locked";

impl LockKind {
    fn name(self) -> &'static str {
        match self {
            LockKind::Posix => "posix",
            LockKind::Inode => "inode",
        }
    }

    /// Takes a whole-file write lock, waiting (SetLkw) or not (SetLk).
    async fn lock(self, c: &Client, file: &xlfs_runtime::client::File, cmd: LkCmd) -> Result<(), Errno> {
        let lock = Flock::whole(LockType::Write, c.ctx().lk_owner);
        match self {
            LockKind::Posix => file.lk(cmd, lock).await.map(drop),
            LockKind::Inode => c.inodelk(LOCKED_FILE, LOCK_DOMAIN, cmd, lock).await.map(drop),
        }
    }
}

/// Not a test on its own: the lock holder that the lock tests run as a
/// separate process (see [`TestProcess`]). Role: `KIND PORT SUBVOLUME`.
#[test]
#[ignore = "a helper process for the lock tests"]
fn lock_holder_process() {
    let Some(role) = kit::role() else { return };
    let mut words = role.split(' ');
    let (Some(kind), Some(port), Some(sub)) = (words.next(), words.next(), words.next()) else {
        panic!("bad role {role:?}")
    };
    let kind = if kind == "posix" { LockKind::Posix } else { LockKind::Inode };
    let port: u16 = port.parse().expect("port");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let m = mount_to(port, sub, &[]).await;
        let c = m.client.with_lk_owner(0x401d);
        let f = c.open(LOCKED_FILE, libc::O_RDWR).await.expect("holder opens");
        kind.lock(&c, &f, LkCmd::SetLk).await.expect("holder locks");
        println!("LOCKED");
        std::io::stdout().flush().expect("flush");
        tokio::time::sleep(Duration::from_secs(300)).await;
        drop((f, m));
    });
}

/// A lock held by another client process conflicts; once that process is
/// killed (SIGKILL), the brick releases its locks and a waiter gets it.
async fn lock_dies_with_its_holder(kind: LockKind) {
    let brick = Brick::start();
    let m = mount(&brick).await;
    let c = m.client.with_lk_owner(0xc1);
    c.create(LOCKED_FILE, libc::O_RDWR, 0o644).await.expect("create").close().await.expect("close");

    let mut holder =
        TestProcess::spawn("lock_holder_process", &format!("{} {} {}", kind.name(), brick.port(), brick.subvolume()));
    holder.expect_line("LOCKED");

    let f = c.open(LOCKED_FILE, libc::O_RDWR).await.expect("open");
    assert_eq!(kind.lock(&c, &f, LkCmd::SetLk).await.expect_err("held by the other process"), Errno::EAGAIN);
    if let LockKind::Posix = kind {
        let conflict = f.lk(LkCmd::GetLk, Flock::whole(LockType::Write, 0)).await.expect("getlk");
        assert_eq!((conflict.ty, conflict.owner), (LockType::Write, 0x401d), "GETLK names the holder");
    }
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn({
        let c = c.clone();
        async move {
            let got = kind.lock(&c, &f, LkCmd::SetLkw).await;
            let _ = tx.send(());
            (got, f)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err(), "the waiter must wait while the holder lives");

    holder.kill();
    let (got, f) =
        tokio::time::timeout(GUARD, waiter).await.expect("the waiter is granted once the holder dies").expect("join");
    got.expect("the waiter's lock");
    // Released again: a third owner can take it after the waiter unlocks.
    let unlock = Flock::whole(LockType::Unlock, c.ctx().lk_owner);
    match kind {
        LockKind::Posix => drop(f.lk(LkCmd::SetLk, unlock).await.expect("unlock")),
        LockKind::Inode => drop(c.inodelk(LOCKED_FILE, LOCK_DOMAIN, LkCmd::SetLk, unlock).await.expect("unlock")),
    }
    let other = m.client.with_lk_owner(0xc2);
    let f2 = other.open(LOCKED_FILE, libc::O_RDWR).await.expect("open 2");
    kind.lock(&other, &f2, LkCmd::SetLk).await.expect("free again");
    f.close().await.expect("close");
    f2.close().await.expect("close 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posix_lock_conflicts_across_clients_and_is_released_when_the_holder_is_killed() {
    lock_dies_with_its_holder(LockKind::Posix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inodelk_conflicts_across_clients_and_is_released_when_the_holder_is_killed() {
    lock_dies_with_its_holder(LockKind::Inode).await;
}

/// Fops through `c` that must work: create, write, read back, close.
async fn works(c: &Client, path: &str) {
    let f = c.create(path, libc::O_RDWR, 0o644).await.expect("create");
    f.write(0, Bytes::from_static(b"alive")).await.expect("write");
    assert_eq!(&f.read(0, 16).await.expect("read")[..], b"alive");
    f.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_brick_fails_fops_with_enotconn_and_the_client_recovers_on_restart() {
    let mut brick = Brick::start();
    let m = mount_with(&brick, &[PING]).await;
    works(&m.client, "/before").await;

    // An in-flight fop: a SetLkw blocked behind another owner's lock.
    let (a, b) = (m.client.with_lk_owner(1), m.client.with_lk_owner(2));
    let fa = a.open("/before", libc::O_RDWR).await.expect("open a");
    let fb = b.open("/before", libc::O_RDWR).await.expect("open b");
    fa.lk(LkCmd::SetLk, Flock::whole(LockType::Write, 0)).await.expect("a locks");
    let blocked = tokio::spawn(async move { fb.lk(LkCmd::SetLkw, Flock::whole(LockType::Write, 0)).await });
    wait_blocked(&m).await;
    assert!(!blocked.is_finished(), "b waits for a's lock");

    brick.kill();
    let res = tokio::time::timeout(GUARD, blocked).await.expect("the in-flight fop ends").expect("join");
    assert_eq!(res.expect_err("in-flight fop fails"), Errno::ENOTCONN);
    assert!(wait_state(&m.graph, TopState::Down, GUARD).await, "ChildDown reaches the top");
    assert_eq!(m.client.stat("/before").await.expect_err("new fops fail"), Errno::ENOTCONN);
    assert_eq!(fa.stat().await.expect_err("fd fops fail"), Errno::ENOTCONN);

    brick.restart();
    assert!(wait_state(&m.graph, TopState::Up, GUARD).await, "the client reconnects by itself (ChildUp)");
    assert_eq!(m.client.stat("/before").await.expect("the brick's data survived").size, 5);
    works(&m.client, "/after").await;
    // The dead connection's lock is gone with it.
    let c = m.client.with_lk_owner(3);
    let f = c.open("/before", libc::O_RDWR).await.expect("open");
    f.lk(LkCmd::SetLk, Flock::whole(LockType::Write, 0)).await.expect("no stale lock after restart");
    f.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_brick_is_declared_dead_after_the_ping_timeout() {
    let brick = Brick::start();
    let m = mount_with(&brick, &[PING]).await;
    works(&m.client, "/f").await;
    brick.pause();
    // Nothing answers and the connection stays open: only the ping timeout
    // (2s, against a frame timeout of minutes) can end this fop.
    let res = tokio::time::timeout(GUARD, m.client.stat("/f")).await;
    assert_eq!(res.expect("the ping timeout ends the fop").expect_err("fails"), Errno::ENOTCONN);
    assert!(wait_state(&m.graph, TopState::Down, GUARD).await, "ChildDown reaches the top");
    assert_eq!(m.client.stat("/f").await.expect_err("new fops fail while it hangs"), Errno::ENOTCONN);
    brick.resume();
    assert!(wait_state(&m.graph, TopState::Up, GUARD).await, "reconnects once the brick answers again");
    works(&m.client, "/g").await;
}

/// A client graph that a brick refuses: its top never comes up (checked
/// once the brick has logged the refusal containing `why`) and its fops
/// fail with ENOTCONN.
async fn refused(brick: &Brick, options: &[(&str, &str)], why: &str) {
    let graph = kit::client_graph(brick, options);
    assert!(brick.wait_log(why, GUARD), "the brick log says why ({why:?}):\n{}", brick.log());
    assert_eq!(graph.state(), TopState::Down, "a refused client never comes up");
    assert_eq!(Client::new(graph.top()).stat("/").await.expect_err("refused"), Errno::ENOTCONN);
    assert!(!wait_state(&graph, TopState::Up, Duration::from_millis(500)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_outside_auth_allow_is_refused() {
    let brick = Brick::start_with(BrickConfig::allow(&["10.9.9.*"]));
    refused(&brick, &[], "client refused: address 127.0.0.1 is not allowed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_in_auth_reject_is_refused() {
    let brick = Brick::start_with(BrickConfig::server_options(&[("auth.addr.{dir}.reject", "127.0.0.1")]));
    refused(&brick, &[], "client refused: address 127.0.0.1 is rejected").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_a_wrong_password_is_refused() {
    let brick = Brick::start_with(BrickConfig::server_options(&[
        ("auth.login.{dir}.allow", "alice"),
        ("auth.login.alice.password", "s3cret"),
    ]));
    refused(&brick, &[("username", "alice"), ("password", "wrong")], "client refused: wrong password for user 'alice'")
        .await;
    refused(
        &brick,
        &[("username", "mallory"), ("password", "s3cret")],
        "client refused: user 'mallory' is not allowed",
    )
    .await;
    let ok = mount_with(&brick, &[("username", "alice"), ("password", "s3cret")]).await;
    works(&ok.client, "/alice").await;
}

/// Bad input for a brick, and what its log then says.
struct BadInput {
    what: &'static str,
    bytes: Vec<u8>,
    /// Close our sending side after the bytes.
    eof: bool,
    log: &'static str,
}

fn bad_inputs() -> Vec<BadInput> {
    let mut truncated = rpc::encode_raw_frame(FrameKind::Ping as u8, 0, 0, 1, &[], &[0u8; 80]);
    truncated.truncate(40);
    vec![
        BadInput {
            what: "garbage",
            bytes: b"GET / HTTP/1.1\r\nHost: xlfs\r\n\r\n".to_vec(),
            eof: false,
            log: "bytes is over the maximum frame size",
        },
        BadInput {
            what: "garbage with a small length",
            bytes: [&12u32.to_le_bytes()[..], &[0xee; 12]].concat(),
            eof: false,
            log: "frame length 12 is below",
        },
        BadInput {
            what: "an unknown frame kind",
            bytes: rpc::encode_raw_frame(0xee, 0, 0, 1, &[], &[]),
            eof: false,
            log: "unknown frame kind 238",
        },
        BadInput {
            what: "a truncated frame",
            bytes: truncated,
            eof: true,
            log: "connection closed in the middle of a frame (40 bytes of it received)",
        },
        BadInput {
            what: "a 4 GiB length prefix",
            bytes: [&u32::MAX.to_le_bytes()[..], &[0u8; 60]].concat(),
            eof: false,
            log: "frame of 4294967299 bytes is over the maximum frame size",
        },
    ]
}

/// Sends each bad input on a fresh connection (before or after the
/// handshake) and checks that the brick drops it and logs why.
fn send_bad_inputs(brick: &Brick, hello: bool) {
    for bad in bad_inputs() {
        let what = format!("{} ({} the handshake)", bad.what, if hello { "after" } else { "before" });
        let mut raw =
            if hello { Raw::hello(brick.addr(), &brick.subvolume(), "kit-raw") } else { Raw::connect(brick.addr()) };
        // The brick may drop us before everything is written.
        raw.send(&bad.bytes);
        if bad.eof {
            let _ = raw.sock.shutdown(std::net::Shutdown::Write);
        }
        raw.closed(&what);
        let prefix = if hello { "closing connection: " } else { "closing connection before the handshake: " };
        assert!(
            brick.wait_log_line(&[prefix, bad.log], GUARD),
            "{what}: the brick logs {prefix:?} {:?}:\n{}",
            bad.log,
            brick.log()
        );
    }
}

/// A CALL whose fop code (0xffff) is unknown is answered with ENOSYS and
/// the connection stays usable (a PING after it gets its PONG).
fn send_unknown_fop(brick: &Brick) {
    let mut raw = Raw::hello(brick.addr(), &brick.subvolume(), "kit-raw");
    let mut header = Vec::new();
    assert!(abi::encode(&CallCtx::root("kit-raw"), &mut header).is_none());
    header.extend_from_slice(&0xffffu16.to_le_bytes());
    assert!(abi::encode(&Dict::new(), &mut header).is_none());
    assert!(raw.send(&rpc::encode_raw_frame(FrameKind::Call as u8, 0, 0, 7, &header, &[])), "send call");
    assert!(raw.send_msg(&Message::Ping, 8), "send ping");
    let (mut replied, mut ponged) = (false, false);
    while !(replied && ponged) {
        let frame = raw.recv_frame().expect("the connection stays open");
        match (frame.kind, frame.id) {
            (FrameKind::Reply, 7) => {
                match Message::from_frame(frame, &rpc::limits_for(rpc::HANDSHAKE_MAX_FRAME)).expect("decodes") {
                    Message::Reply(r) => {
                        assert_eq!(r.expect_err("an unknown fop fails"), Errno::ENOSYS);
                        replied = true;
                    }
                    other => panic!("expected REPLY, got {other:?}"),
                }
            }
            (FrameKind::Pong, 8) => ponged = true,
            (kind, id) => panic!("unexpected {kind} frame {id}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_are_dropped_and_the_brick_keeps_serving() {
    let brick = std::sync::Arc::new(Brick::start());
    let m = mount(&brick).await;
    // A well-behaved client keeps writing and reading all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = tokio::spawn({
        let (c, stop) = (m.client.clone(), stop.clone());
        async move {
            let f = c.create("/busy", libc::O_RDWR, 0o644).await.expect("create");
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || n < 10 {
                let data = Bytes::from(n.to_le_bytes().to_vec());
                f.write(n * 8, data.clone()).await.expect("write while bad peers come and go");
                assert_eq!(f.read(n * 8, 8).await.expect("read"), data);
                n += 1;
            }
            f.close().await.expect("close");
            n
        }
    });

    let raw = tokio::task::spawn_blocking({
        let brick = brick.clone();
        move || {
            send_bad_inputs(&brick, false);
            send_bad_inputs(&brick, true);
            send_unknown_fop(&brick);
        }
    });
    raw.await.expect("raw peers");

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = tokio::time::timeout(GUARD, busy).await.expect("the busy client finishes").expect("busy client");
    assert!(n >= 10);
    assert_eq!(m.graph.state(), TopState::Up, "the good client never lost its connection");
    works(&m.client, "/after").await;
    let fresh = mount(&brick).await;
    works(&fresh.client, "/fresh").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_stop_the_brick_with_exit_0() {
    let mut brick = Brick::start();
    let m = mount(&brick).await;
    works(&m.client, "/f").await;
    brick.stop();
    assert!(brick.log().contains("SIGTERM"), "the log says why it stopped:\n{}", brick.log());
    assert_eq!(m.client.stat("/f").await.expect_err("the brick is gone"), Errno::ENOTCONN);

    let mut other = Brick::start();
    let status = other.stop_with(libc::SIGINT);
    assert!(status.success(), "SIGINT: {status}");
}

/// Waits until the mount's one call in flight (a lock request that must
/// wait) has been sent and stays unanswered, then a little longer.
async fn wait_blocked(m: &Mount) {
    let deadline = std::time::Instant::now() + GUARD;
    while m.graph.dump().iter().find(|(k, _)| k.ends_with(".inflight")).map(|(_, v)| v.as_str()) != Some("1") {
        assert!(std::time::Instant::now() < deadline, "the lock request never went out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A brick with one client whose SetLkw is blocked behind the same
/// client's other lock owner: a call in flight that cannot finish by itself.
async fn brick_with_a_blocked_waiter() -> (Brick, Mount, JoinHandle<Result<Flock, Errno>>) {
    let brick = Brick::start();
    let m = mount(&brick).await;
    works(&m.client, "/f").await;
    let (a, b) = (m.client.with_lk_owner(1), m.client.with_lk_owner(2));
    let fa = a.open("/f", libc::O_RDWR).await.expect("open a");
    let fb = b.open("/f", libc::O_RDWR).await.expect("open b");
    fa.lk(LkCmd::SetLk, Flock::whole(LockType::Write, 0)).await.expect("a locks");
    let blocked = tokio::spawn(async move {
        let r = fb.lk(LkCmd::SetLkw, Flock::whole(LockType::Write, 0)).await;
        drop(fa);
        r
    });
    wait_blocked(&m).await;
    assert!(!blocked.is_finished(), "b waits");
    (brick, m, blocked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_brick_with_a_blocked_lock_waiter() {
    let (mut brick, _m, blocked) = brick_with_a_blocked_waiter().await;
    brick.signal(libc::SIGTERM);
    // features/locks fails the waiting request as the brick stops (it
    // would never be granted), so the drain does not wait for it.
    let status = brick.wait_exit(Duration::from_secs(90));
    assert!(status.success(), "exit status {status}\n{}", brick.log());
    assert!(brick.log().contains("lock requests still waiting failed"), "{}", brick.log());
    assert!(!brick.log().contains("calls still running"), "the drain did not wait for it:\n{}", brick.log());
    let res = tokio::time::timeout(GUARD, blocked).await.expect("the waiter ends").expect("join");
    assert!(res.is_err(), "the waiter cannot be granted by a stopped brick: {res:?}");
}

/// A brick with a raw client that asked for large reads and reads none of
/// the replies: calls the stopping brick cannot finish delivering, so its
/// drain goes on (a waiting lock no longer holds it: it fails at once).
fn brick_with_unread_replies() -> (Brick, Raw) {
    let brick = Brick::start();
    let mut slow = Raw::hello(brick.addr(), &brick.subvolume(), "slow");
    let loc = xlfs_sdk::Loc::entry(xlfs_sdk::Gfid::ROOT, "sparse");
    let id = xlfs_sdk::FdId(1);
    let created = slow.call(xlfs_sdk::Fop::Create { loc, flags: libc::O_RDWR as u32, mode: 0o644, umask: 0, fd: id });
    let gfid = match created.expect("create").reply {
        xlfs_sdk::Reply::Entry { iatt, .. } => iatt.gfid,
        r => panic!("{r:?}"),
    };
    let fd = xlfs_sdk::Fd { id, gfid };
    slow.call(xlfs_sdk::Fop::Ftruncate { fd, offset: 4 << 30 }).expect("ftruncate");
    slow.sock.set_write_timeout(Some(Duration::from_secs(3))).expect("write timeout");
    let ctx = CallCtx::root("slow");
    for i in 0..64u64 {
        let fop = xlfs_sdk::Fop::Readv { fd, size: 8 << 20, offset: i << 23, flags: 0 };
        let m = Message::Call { ctx: ctx.clone(), req: xlfs_sdk::Request::new(fop) };
        if !slow.send(&m.to_frame(i + 100).expect("frame").to_vec()) {
            break;
        }
    }
    // Let the brick take some of them in (it then blocks writing replies).
    std::thread::sleep(Duration::from_millis(500));
    (brick, slow)
}

#[test]
fn a_second_signal_stops_a_draining_brick_at_once() {
    let (mut brick, _slow) = brick_with_unread_replies();
    brick.signal(libc::SIGTERM);
    assert!(brick.wait_log("stopping: no new connections", GUARD), "{}", brick.log());
    brick.signal(libc::SIGINT);
    let status = brick.wait_exit(kit::PROCESS_TIMEOUT);
    assert_eq!(status.code(), Some(1), "a forced stop is a failure exit\n{}", brick.log());
    assert!(
        brick.log().contains("SIGINT while stopping: stopped without waiting for in-flight fops"),
        "{}",
        brick.log()
    );
}

#[test]
fn a_brick_on_a_port_in_use_fails_with_a_clear_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let out =
        kit::run_xlfs(&["brick", "--dir", dir.path().to_str().expect("utf-8"), "--host", "127.0.0.1", "--port", &port]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail; stderr:\n{stderr}");
    assert!(out.stdout.is_empty(), "no start line: {:?}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains(&port) && stderr.contains("in use"), "names the port and the reason:\n{stderr}");
}

#[test]
fn a_brick_with_a_missing_dir_or_a_bad_volfile_fails_with_a_clear_message() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("missing");
    let out = kit::run_xlfs(&["brick", "--dir", missing.to_str().expect("utf-8"), "--port", "0"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("brick directory {}: ", missing.display())), "{stderr}");

    let vol = tmp.path().join("b.vol");
    let text = format!(
        "volume p\n    type storage/posix\n    option directory {}\nend-volume\n\
         volume s\n    type protocol/server\n    option no-such-option 1\n    subvolumes p\nend-volume\n",
        tmp.path().display()
    );
    std::fs::write(&vol, text).expect("write");
    let out = kit::run_xlfs(&["brick".as_ref(), "--volfile".as_ref(), vol.as_os_str()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}:7: ", vol.display())) && stderr.contains("no-such-option"), "{stderr}");
}
