//! protocol/server over real loopback TCP: a brick (storage/posix in a
//! tempdir, features/locks, this server) or a server over a test child,
//! driven by protocol/client instances and by raw sockets. The harness is
//! shared with the client's tests.

mod connection;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use xlfs_sdk::abi::{self, AbiVersion};
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, EventSink, Fd, FdId, Flock, Fop, FopKind, FopResult, Gfid, Iatt,
    LkCmd, Loc, LockType, Options, Reply, Request, Upcall, Value, Xlator, XlatorType,
};

use xlfs_sdk::testing::{Gate, init_named, until};

use crate::protocol::client;
use crate::protocol::rpc::{self, FrameKind, Hello, HelloReply, Message, hello_keys};

/// How long a test waits for something that should happen soon.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

/// Awaits `f`, failing the test after [`PATIENCE`].
pub(crate) async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A built translator with its sink.
#[derive(Clone)]
pub(crate) struct Node {
    pub name: Arc<str>,
    pub xl: Arc<dyn Xlator>,
    pub sink: EventSink,
}

impl Node {
    pub(crate) fn build(ty: &XlatorType, name: &str, opts: &[(&str, &str)], children: Vec<Child>) -> Node {
        let (init, _) = init_named(name, ty.options, opts, &children);
        let sink = init.events.clone();
        let xl = match (ty.build)(init) {
            Ok(xl) => xl,
            Err(e) => panic!("{name} does not build: {e}"),
        };
        Node { name: Arc::from(name), xl, sink }
    }

    fn of(name: &str, xl: Arc<dyn Xlator>) -> Node {
        Node { name: Arc::from(name), xl, sink: EventSink::new() }
    }

    pub(crate) fn child(&self) -> Child {
        Child { name: self.name.clone(), xl: self.xl.clone() }
    }

    pub(crate) fn dump(&self, key: &str) -> String {
        self.xl.dump().into_iter().find(|(k, _)| k == key).map(|(_, v)| v).unwrap_or_default()
    }
}

/// A chain of nodes, bottom first, each the child of the next, linked as
/// the runtime's graph links them (events up, broadcasts to all).
pub(crate) struct Chain(Arc<Vec<Node>>);

impl Chain {
    pub(crate) fn link(nodes: Vec<Node>) -> Chain {
        let nodes = Arc::new(nodes);
        for pair in nodes.windows(2) {
            pair[0].sink.attach_parent(Arc::downgrade(&pair[1].xl), 0, pair[1].sink.clone());
        }
        for n in nodes.iter() {
            let weak: Weak<Vec<Node>> = Arc::downgrade(&nodes);
            n.sink.set_broadcast(move |ev| {
                if let Some(nodes) = weak.upgrade() {
                    broadcast(&nodes, ev);
                }
            });
        }
        Chain(nodes)
    }

    pub(crate) fn broadcast(&self, ev: Event) {
        broadcast(&self.0, &ev);
    }

    pub(crate) fn top(&self) -> &Node {
        self.0.last().expect("a chain has nodes")
    }
}

fn broadcast(nodes: &[Node], ev: &Event) {
    for n in nodes.iter().rev() {
        if let Some(up) = n.xl.notify(ev.clone(), EventFrom::Graph) {
            n.sink.send(up);
        }
    }
}

/// A brick: storage/posix in a tempdir, features/locks named `brick`, and
/// a protocol/server on an ephemeral loopback port.
pub(crate) struct Brick {
    _dir: tempfile::TempDir,
    pub posix: Node,
    pub locks: Node,
    pub chain: Chain,
}

pub(crate) const SUBVOL: &str = "brick";

impl Brick {
    pub(crate) fn start(server_opts: &[(&str, &str)]) -> Brick {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().display().to_string();
        let posix = Node::build(&crate::storage::posix::TYPE, "posix", &[("directory", &path)], vec![]);
        let locks = Node::build(
            &crate::features::locks::TYPE,
            SUBVOL,
            &[("notify-contention-delay", "0")],
            vec![posix.child()],
        );
        let chain = server_chain(vec![posix.clone(), locks.clone()], server_opts);
        Brick { _dir: dir, posix, locks, chain }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        listen_addr(self.chain.top())
    }

    /// Stops the server the way the brick does on SIGTERM (ParentDown, then
    /// fini from a blocking thread).
    pub(crate) async fn stop_server(&self) {
        stop(self.chain.top()).await;
    }

    /// A new server on the same port over the same posix and locks.
    pub(crate) fn restart_server(&mut self, port: u16) {
        let port = port.to_string();
        self.chain =
            server_chain(vec![self.posix.clone(), self.locks.clone()], &[("transport.socket.listen-port", &port)]);
    }

    /// A fop straight into the brick (below the server).
    pub(crate) async fn local(&self, fop: Fop) -> FopResult {
        self.locks.xl.call(CallCtx::root("local"), Request::new(fop)).await
    }
}

/// Puts a server (listening on 127.0.0.1, port 0 unless given) on top of
/// `below` and activates the chain.
pub(crate) fn server_chain(mut below: Vec<Node>, opts: &[(&str, &str)]) -> Chain {
    let mut all: Vec<(&str, &str)> =
        vec![("transport.socket.bind-address", "127.0.0.1"), ("transport.socket.listen-port", "0")];
    all.extend_from_slice(opts);
    let all = dedup_last(all);
    let top = below.last().expect("a child").child();
    below.push(Node::build(&super::TYPE, "server", &all, vec![top]));
    let chain = Chain::link(below);
    chain.broadcast(Event::ParentUp);
    chain
}

/// Keeps the last value given for each key.
fn dedup_last<'a>(opts: Vec<(&'a str, &'a str)>) -> Vec<(&'a str, &'a str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for (k, v) in opts {
        out.retain(|(k2, _)| *k2 != k);
        out.push((k, v));
    }
    out
}

pub(crate) fn listen_addr(server: &Node) -> SocketAddr {
    server.dump("listen").parse().expect("the dump names the listen address")
}

pub(crate) async fn stop(server: &Node) {
    let xl = server.xl.clone();
    assert_eq!(xl.notify(Event::ParentDown, EventFrom::Graph), None);
    tokio::task::spawn_blocking(move || xl.fini()).await.expect("fini");
}

/// A protocol/client with its events recorded.
pub(crate) struct TestClient {
    pub xl: Arc<dyn Xlator>,
    pub events: Arc<Mutex<Vec<Event>>>,
}

impl TestClient {
    /// A client of `addr`'s `brick` subvolume with quick reconnects, then
    /// `opts`; not started.
    pub(crate) fn new(addr: SocketAddr, opts: &[(&str, &str)]) -> TestClient {
        let port = addr.port().to_string();
        let mut all = vec![
            ("remote-host", "127.0.0.1"),
            ("remote-port", port.as_str()),
            ("remote-subvolume", SUBVOL),
            ("reconnect-min", "20ms"),
            ("reconnect-max", "100ms"),
        ];
        all.extend_from_slice(opts);
        let all = dedup_last(all);
        let node = Node::build(&client::TYPE, "client", &all, vec![]);
        let events: Arc<Mutex<Vec<Event>>> = Arc::default();
        let seen = events.clone();
        node.sink.set_hook(move |e| seen.lock().push(e.clone()));
        TestClient { xl: node.xl, events }
    }

    /// Starts the client (ParentUp).
    pub(crate) fn start(&self) {
        assert_eq!(self.xl.notify(Event::ParentUp, EventFrom::Graph), None);
    }

    /// Starts it and waits for it to be up.
    pub(crate) async fn up(addr: SocketAddr, opts: &[(&str, &str)]) -> TestClient {
        let c = TestClient::new(addr, opts);
        c.start();
        c.wait_ups(1).await;
        c
    }

    pub(crate) fn count(&self, ev: &Event) -> usize {
        self.events.lock().iter().filter(|e| *e == ev).count()
    }

    pub(crate) async fn wait_ups(&self, n: usize) {
        until(&format!("{n} ChildUp"), PATIENCE, || self.count(&Event::ChildUp) >= n).await;
    }

    pub(crate) async fn wait_downs(&self, n: usize) {
        until(&format!("{n} ChildDown"), PATIENCE, || self.count(&Event::ChildDown) >= n).await;
    }

    pub(crate) fn upcalls(&self) -> Vec<Upcall> {
        self.events
            .lock()
            .iter()
            .filter_map(|e| match e {
                Event::Upcall(u) => Some(u.clone()),
                _ => None,
            })
            .collect()
    }

    pub(crate) async fn run(&self, fop: Fop) -> FopResult {
        self.run_as(CallCtx::root("test"), fop).await
    }

    pub(crate) async fn run_as(&self, ctx: CallCtx, fop: Fop) -> FopResult {
        self.xl.call(ctx, Request::new(fop)).await
    }

    pub(crate) fn dump(&self, key: &str) -> String {
        self.xl.dump().into_iter().find(|(k, _)| k == key).map(|(_, v)| v).unwrap_or_default()
    }

    /// Stops the client (its connection closes).
    pub(crate) fn stop(&self) {
        self.xl.fini();
    }
}

pub(crate) fn entry_gfid(res: FopResult) -> Gfid {
    match res.expect("fop ok").reply {
        Reply::Entry { iatt, .. } => iatt.gfid,
        other => panic!("expected an entry, got {other:?}"),
    }
}

pub(crate) fn fd(id: u64, gfid: Gfid) -> Fd {
    Fd { id: FdId(id), gfid }
}

pub(crate) fn create(name: &str, fd: u64) -> Fop {
    Fop::Create {
        loc: Loc::entry(Gfid::ROOT, name),
        flags: libc::O_RDWR as u32,
        mode: 0o644,
        umask: 0o022,
        fd: FdId(fd),
    }
}

pub(crate) fn read_data(res: FopResult) -> Bytes {
    match res.expect("read ok").reply {
        Reply::Read { data, .. } => data,
        other => panic!("expected data, got {other:?}"),
    }
}

// ---- raw sockets ----

/// A socket a raw connection reads and writes.
pub(crate) trait Stream: Read + Write + Send {
    fn shutdown_write(&self);
}

impl Stream for std::net::TcpStream {
    fn shutdown_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

impl Stream for std::os::unix::net::UnixStream {
    fn shutdown_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

/// A blocking raw connection for hostile input.
pub(crate) struct Raw {
    s: Box<dyn Stream>,
    buf: BytesMut,
}

impl Raw {
    pub(crate) fn connect(addr: SocketAddr) -> Raw {
        let s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        Raw { s: Box::new(s), buf: BytesMut::new() }
    }

    /// A connection to the local transport of the server on `addr`, whose
    /// preface is `tag` with `fds`.
    pub(crate) fn connect_local(addr: SocketAddr, tag: u8, fds: &[std::os::fd::RawFd]) -> Raw {
        use std::os::fd::AsRawFd;
        use std::os::linux::net::SocketAddrExt;
        let name = rpc::local_socket_name(addr);
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
        let s = std::os::unix::net::UnixStream::connect_addr(&a).expect("connect to the local socket");
        s.set_read_timeout(Some(PATIENCE)).expect("timeout");
        rpc::shm::send_fds(s.as_raw_fd(), tag, fds).expect("preface");
        Raw { s: Box::new(s), buf: BytesMut::new() }
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) {
        // The server may already have closed; what matters is what it does.
        let _ = self.s.write_all(bytes);
    }

    pub(crate) fn send_msg(&mut self, m: &Message, id: u64) {
        self.send(&m.to_frame(id).expect("encodes").to_vec());
    }

    /// The next frame, or None when the server closed the connection.
    pub(crate) fn recv(&mut self) -> Option<Message> {
        loop {
            if let Some(f) = rpc::decode_frame(&mut self.buf, 1 << 30).expect("the server sends valid frames") {
                return Some(Message::from_frame(f, &rpc::limits_for(1 << 30)).expect("decodes"));
            }
            let mut chunk = [0u8; 65536];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// True once the server has closed the connection (frames before are
    /// skipped).
    pub(crate) fn closed(&mut self) -> bool {
        while self.recv().is_some() {}
        true
    }

    pub(crate) fn hello(&mut self, version: AbiVersion, volume: &str, user: Option<(&str, &str)>) -> HelloReply {
        let mut params = Dict::new().with(hello_keys::VOLUME, Value::Str(volume.into()));
        params.set_str(hello_keys::CLIENT_ID, "raw");
        if let Some((u, p)) = user {
            params.set_str(hello_keys::USERNAME, u);
            params.set_str(hello_keys::PASSWORD, p);
        }
        self.send_msg(&Message::Hello(Hello { version, params }), 0);
        match self.recv() {
            Some(Message::HelloReply(r)) => r,
            other => panic!("expected HELLO_REPLY, got {other:?}"),
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

/// A server over a child that answers `Stat { loc }` with the loc's gfid,
/// but only once the test releases the fop.
fn gate_server(opts: &[(&str, &str)]) -> (Arc<Gate>, Chain) {
    let gate = Gate::over_null();
    let chain = server_chain(vec![Node::of(SUBVOL, gate.clone())], opts);
    // The gate never says ChildUp; do it for it.
    chain.0[0].sink.send(Event::ChildUp);
    (gate, chain)
}

fn g(n: u64) -> Gfid {
    let mut b = [0u8; 16];
    b[8..].copy_from_slice(&n.to_be_bytes());
    b[0] = 0x5a;
    Gfid(b)
}

// ---- tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fops_round_trip_over_tcp() {
    fops_round_trip(&[("transport.local", "off")], "tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fops_round_trip_over_the_local_transport() {
    fops_round_trip(&[], "unix+shm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fops_round_trip_over_the_local_socket_without_shared_memory() {
    fops_round_trip(&[("transport.local.shm-size", "0")], "unix").await;
}

/// Every kind of fop through a client with `opts`, which must connect over
/// `transport`; with shared memory, the 1 MiB write and read cross in it.
async fn fops_round_trip(opts: &[(&str, &str)], transport: &str) {
    let brick = Brick::start(&[]);
    let c = TestClient::up(brick.addr(), opts).await;
    assert_eq!(c.dump("transport"), transport);
    let line = brick.chain.top().dump(&format!("client.{}", c.dump("server-client-id")));
    assert!(line.contains(&format!("transport {transport} ")), "{line}");

    let root = c.run(Fop::Lookup { loc: Loc::root() }).await;
    assert!(root.expect("lookup root").reply != Reply::Empty);
    let dir = entry_gfid(c.run(Fop::Mkdir { loc: Loc::entry(Gfid::ROOT, "d"), mode: 0o755, umask: 0 }).await);
    let file = entry_gfid(c.run(create("f", 1)).await);

    // 1 MiB through the payload path both ways.
    let data = Bytes::from((0..1u32 << 20).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>());
    let w = c.run(Fop::Writev { fd: fd(1, file), data: data.clone(), offset: 0, flags: 0 }).await.expect("write");
    assert!(matches!(w.reply, Reply::PrePost { post, .. } if post.size == 1 << 20), "{w:?}");
    assert_eq!(read_data(c.run(Fop::Readv { fd: fd(1, file), size: 1 << 20, offset: 0, flags: 0 }).await), data);
    // A short read into a lent chunk, and a small one inline.
    let tail =
        read_data(c.run(Fop::Readv { fd: fd(1, file), size: 1 << 20, offset: (1 << 20) - 40_000, flags: 0 }).await);
    assert_eq!(tail, data.slice((1 << 20) - 40_000..));
    assert_eq!(
        read_data(c.run(Fop::Readv { fd: fd(1, file), size: 10, offset: 5, flags: 0 }).await),
        data.slice(5..15)
    );
    let shared = (c.dump("shared-calls-total"), c.dump("shared-replies-total"));
    match transport {
        "unix+shm" => {
            assert_eq!(shared, ("1".into(), "2".into()), "the 1 MiB write and two large reads in shared memory")
        }
        _ => assert_eq!(shared, ("0".into(), "0".into())),
    }
    match c.run(Fop::Fstat { fd: fd(1, file) }).await.expect("fstat").reply {
        Reply::Attr(a) => assert_eq!((a.gfid, a.size), (file, 1 << 20)),
        other => panic!("{other:?}"),
    }

    // xattrs, xdata both ways (features/locks answers the count key).
    let xattrs = Dict::new().with("user.k", Value::Bytes(Bytes::from_static(b"v1")));
    c.run(Fop::Fsetxattr { fd: fd(1, file), xattrs, flags: 0 }).await.expect("fsetxattr");
    match c.run(Fop::Getxattr { loc: Loc::gfid(file), name: "user.k".into() }).await.expect("getxattr").reply {
        Reply::Xattrs(d) => assert_eq!(d.get_bytes("user.k").as_deref(), Some(&b"v1"[..])),
        other => panic!("{other:?}"),
    }
    let xdata = Dict::new().with(xlfs_sdk::dict::keys::INODELK_COUNT, Value::Str(String::new()));
    let r =
        c.xl.call(CallCtx::root("t"), Request::with_xdata(Fop::Stat { loc: Loc::gfid(file) }, xdata))
            .await
            .expect("stat");
    assert_eq!(r.xdata.get_u64(xlfs_sdk::dict::keys::INODELK_COUNT), Some(0));

    // Directories.
    c.run(Fop::Opendir { loc: Loc::gfid(Gfid::ROOT), fd: FdId(2) }).await.expect("opendir");
    match c.run(Fop::Readdirp { fd: fd(2, Gfid::ROOT), size: 65536, offset: 0 }).await.expect("readdirp").reply {
        Reply::Dirents(es) => {
            let names: Vec<&str> = es.iter().map(|e| e.name.as_str()).collect();
            assert!(names.contains(&"d") && names.contains(&"f"), "{names:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(c.run(Fop::Statfs { loc: Loc::root() }).await.expect("statfs").reply, Reply::Statfs(_)));
    c.run(Fop::Flush { fd: fd(1, file) }).await.expect("flush");
    c.run(Fop::Fsync { fd: fd(1, file), datasync: true }).await.expect("fsync");
    c.run(Fop::Rename { old: Loc::entry(Gfid::ROOT, "f"), new: Loc::entry(dir, "g"), flags: 0 }).await.expect("rename");

    // The server's fd table: an fd id the client never opened is EBADF,
    // reusing an open id is EBADF, release frees the id.
    assert_eq!(c.run(Fop::Fstat { fd: fd(99, file) }).await, Err(Errno::EBADF));
    assert_eq!(c.run(Fop::Open { loc: Loc::gfid(file), flags: 0, fd: FdId(1) }).await, Err(Errno::EBADF));
    let line = brick.chain.top().dump(&format!("client.{}", c.dump("server-client-id")));
    assert!(line.contains("fds 2"), "{line}");
    c.run(Fop::Release { fd: fd(1, file) }).await.expect("release");
    c.run(Fop::Releasedir { fd: fd(2, Gfid::ROOT) }).await.expect("releasedir");
    assert_eq!(c.run(Fop::Fstat { fd: fd(1, file) }).await, Err(Errno::EBADF));
    c.run(Fop::Unlink { loc: Loc::entry(dir, "g"), flags: 0 }).await.expect("unlink");
    assert_eq!(c.run(Fop::Lookup { loc: Loc::entry(dir, "g") }).await, Err(Errno::ENOENT));
    c.stop();
    brick.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_answered_out_of_order() {
    let (gate, chain) = gate_server(&[]);
    let c = Arc::new(TestClient::up(listen_addr(chain.top()), &[]).await);
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.run(Fop::Stat { loc: Loc::gfid(g(i)) }).await })
        })
        .collect();
    until("64 requests at the child", PATIENCE, || gate.held() == 64).await;
    assert_eq!(chain.top().dump("calls-spawned-total"), "64", "calls that wait run in tasks");
    // Answer newest first; each reply must reach the request it answers
    // while every older request is still waiting.
    for (i, t) in tasks.into_iter().enumerate().rev() {
        gate.release_gfid(g(i as u64));
        let res = within("the released request", t).await.expect("join").expect("stat");
        assert_eq!(res.reply, Reply::Attr(Iatt { gfid: g(i as u64), ..Iatt::default() }));
        assert_eq!(gate.held(), i, "older requests still in flight");
    }
    c.stop();
    stop(chain.top()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_calls_run_on_the_reader_and_a_blocked_lock_does_not_hold_it_up() {
    let brick = Brick::start(&[]);
    let c = Arc::new(TestClient::up(brick.addr(), &[]).await);
    let spawned = || brick.chain.top().dump("calls-spawned-total");
    // Two lock owners of the one client.
    let owner = |n| CallCtx { lk_owner: n, ..CallCtx::root("test") };
    let lock = |cmd, ty, n| Fop::Inodelk { domain: "dom".into(), loc: Loc::root(), cmd, lock: Flock::whole(ty, n) };
    c.run_as(owner(1), lock(LkCmd::SetLk, LockType::Write, 1)).await.expect("locked");
    let before = spawned();
    for _ in 0..10 {
        c.run(Fop::Stat { loc: Loc::root() }).await.expect("stat");
    }
    assert_eq!(spawned(), before, "a stat in the page cache finishes on its first poll: no task");
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move { c.run_as(owner(2), lock(LkCmd::SetLkw, LockType::Write, 2)).await })
    };
    until("the second lock request queued", PATIENCE, || brick.locks.dump("locks") == "2").await;
    assert_ne!(spawned(), before, "the blocked lock went on in a task of its own");
    // The connection is still read and answered while the lock waits.
    for _ in 0..10 {
        c.run(Fop::Stat { loc: Loc::root() }).await.expect("stat while a lock waits");
    }
    assert!(!waiting.is_finished());
    c.run_as(owner(1), lock(LkCmd::SetLk, LockType::Unlock, 1)).await.expect("unlocked");
    within("the waiting lock", waiting).await.expect("join").expect("granted once the first is unlocked");
    c.stop();
    brick.stop_server().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_at_max_inflight_is_not_read() {
    let (gate, chain) = gate_server(&[("max-inflight-per-client", "3")]);
    let c = Arc::new(TestClient::up(listen_addr(chain.top()), &[]).await);
    let tasks: Vec<_> = (0..8u64)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.run(Fop::Stat { loc: Loc::gfid(g(i)) }).await })
        })
        .collect();
    until("3 requests at the child", PATIENCE, || gate.held() == 3).await;
    // The rest stay unread until some are answered.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gate.held(), 3);
    while tasks.iter().any(|t| !t.is_finished()) {
        gate.release_all();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in tasks {
        t.await.expect("join").expect("answered");
    }
    assert_eq!(gate.max_held(), 3, "never more than max-inflight-per-client at once");
    c.stop();
    stop(chain.top()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_at_its_byte_budget_is_not_read() {
    let (gate, chain) = gate_server(&[("max-inflight-bytes-per-client", "1MB")]);
    let c = Arc::new(TestClient::up(listen_addr(chain.top()), &[]).await);
    let open = tokio::spawn({
        let c = c.clone();
        async move { c.run(Fop::Open { loc: Loc::gfid(g(1)), flags: 0, fd: FdId(1) }).await }
    });
    until("the open at the child", PATIENCE, || gate.held() == 1).await;
    gate.release_kind(FopKind::Open);
    open.await.expect("join").expect("opened");
    // Reads of 400 KiB: two fit in 1 MiB, a third waits for a reply.
    let tasks: Vec<_> = (0..6u64)
        .map(|i| {
            let c = c.clone();
            let fop = Fop::Readv { fd: fd(1, g(1)), size: 400 << 10, offset: i << 20, flags: 0 };
            tokio::spawn(async move { c.run(fop).await })
        })
        .collect();
    until("2 reads at the child", PATIENCE, || gate.held() == 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gate.held(), 2, "the third read is not read from the socket");
    while tasks.iter().any(|t| !t.is_finished()) {
        gate.release_all();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in tasks {
        assert_eq!(read_data(t.await.expect("join")).len(), 400 << 10);
    }
    assert_eq!(gate.max_held(), 2, "never more than max-inflight-bytes-per-client held at once");
    // A call larger than the whole budget still runs, alone.
    let big = tokio::spawn({
        let c = c.clone();
        async move { c.run(Fop::Readv { fd: fd(1, g(1)), size: 2 << 20, offset: 0, flags: 0 }).await }
    });
    until("the large read at the child", PATIENCE, || gate.held() == 1).await;
    gate.open();
    assert_eq!(read_data(big.await.expect("join")).len(), 1 << 20, "the null leaf answers at most 1 MiB");
    c.stop();
    stop(chain.top()).await;
}

#[test]
fn bind_errors_name_the_address() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let _e = rt.enter();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let opts = [("transport.socket.bind-address", "127.0.0.1"), ("transport.socket.listen-port", port.as_str())];
    let mock = xlfs_sdk::testing::MockChild::new();
    let (init, _) = init_named("srv", super::TYPE.options, &opts, &[mock.child()]);
    let e = (super::TYPE.build)(init).err().expect("port in use");
    assert!(e.to_string().contains(&format!("cannot listen on 127.0.0.1:{port}")), "{e}");

    let tls = [("transport.socket.ssl-enabled", "on")];
    let (init, _) = init_named("srv", super::TYPE.options, &tls, &[mock.child()]);
    let e = (super::TYPE.build)(init).err().expect("tls");
    assert!(e.to_string().contains("transport.socket.ssl-ca-list /etc/ssl/glusterfs.ca: no such file"), "{e}");
}

#[test]
fn gluster_brick_volfile_options_are_accepted() {
    let opts = [
        ("transport.listen-backlog", "1024"),
        ("transport.socket.keepalive-count", "9"),
        ("transport.socket.keepalive-interval", "2"),
        ("transport.socket.keepalive-time", "20"),
        ("transport.socket.ssl-enabled", "off"),
        ("transport.socket.keepalive", "1"),
        ("auth.addr./srv/gb/b1.allow", "*"),
        ("auth-path", "/srv/gb/b1"),
        ("auth.login.31d20107-36ad-4db5-b4bf-e99d575e3031.password", "c5f8ad01-1797-4cf4-8b65-38179060f463"),
        ("auth.login./srv/gb/b1.allow", "31d20107-36ad-4db5-b4bf-e99d575e3031"),
        ("transport.address-family", "inet"),
        ("transport-type", "tcp"),
    ];
    let o = Options::resolve(super::TYPE.options, opts).expect("the fixture's options resolve");
    super::auth::Auth::from_options(&o, &["/srv/gb/b1"]).expect("auth options parse");
}
