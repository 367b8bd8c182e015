//! protocol/server: the top of a brick's graph. It listens on TCP, lets
//! clients in after a handshake (ABI version, subvolume, `auth.addr` and
//! `auth.login`), and winds their calls into the subvolume they asked for.
//! The wire format is `sdk/WIRE.md`; the transport is [`super::rpc`].
//!
//! - **Listening.** The socket is bound when the translator is built (a bind
//!   error is an init error naming the address); connections are accepted
//!   once a child reports `ChildUp`. `dump()` reports the bound address as
//!   `listen` (useful with `transport.socket.listen-port 0`). Unless
//!   `transport.local` is off or TLS is on, it also listens on the abstract
//!   Unix socket named after that address (`listen-local`), for clients on
//!   this host: they may hand over shared regions, and then write data is
//!   read from the client's memory and read data put there, with no socket
//!   copies (`sdk/WIRE.md` section 12; a bad region or descriptor closes
//!   that connection).
//! - **Clients.** Each connection gets a client id of its own, the HELLO's
//!   `client-id` plus `#<connection number>`, which the server writes into
//!   every call's [`CallCtx::client_id`] (what the client sent there is
//!   ignored): a reconnect is a new client for locks, as in GlusterFS. Up to
//!   `max-clients` clients (connections beyond twice that many, counting
//!   those still in their handshake, are closed at once; a HELLO must come
//!   within [`HANDSHAKE_TIMEOUT`]); `max-inflight-per-client` calls of one
//!   connection run at once, and the connection is not read from while it
//!   has that many (backpressure; an in-flight slot is freed once its reply
//!   is written). The calls of a connection also hold at most
//!   `max-inflight-bytes-per-client` bytes (request frames and the data
//!   their replies may carry), so a client asking for large reads and never
//!   reading the replies holds a bounded amount of the brick's memory. A call is first run on the connection's reader task and
//!   its reply written from there when it finishes on its first poll (a
//!   stat or a page-cache write: no task spawned, no wake-up); one that
//!   would wait (a blocked lock, the blocking pool) goes on in a task of its
//!   own, so it never holds the reader up (`calls-spawned-total`). While
//!   more frames of a read are buffered, replies are held back and written
//!   together (at most 64, one vectored write).
//! - **Fds.** Clients choose their own fd ids; the server maps them to
//!   brick-unique ones per connection (`fds`), at most
//!   `max-fds-per-client`; an fd the connection did not open is EBADF.
//! - **Bad input.** A frame that is not a frame, is over `max-frame-size`,
//!   or whose header does not decode closes that connection (logged with
//!   the reason). The one exception is a CALL whose fop code is unknown: it
//!   is answered with ENOSYS (the id is known) and the connection stays.
//! - **Disconnect.** When a connection ends, its waiting lock requests are
//!   cancelled, its other calls finish (at most [`DRAIN_TIMEOUT`]), its fds
//!   are released down the graph (release / releasedir) and
//!   [`Event::ClientGone`] is broadcast to the whole brick graph, so
//!   features/locks frees its locks.
//! - **Auth.** `auth.addr.<subvolume>.reject` and `.allow` hold IP address
//!   patterns (`*` and `?` wildcards, no host name lookups); a subvolume
//!   with no `allow` option at all is open to every address not rejected.
//!   Then, if `auth.login.<subvolume>.allow` lists users, the HELLO must
//!   name one with its `auth.login.<user>.password`.
//! - **Upcalls.** Lock contention upcalls from below go to the connection
//!   of the holder they name; invalidations go to every client.
//! - **Profile.** A getxattr of `xlfs.profile` (or `xlfs.profile.reset`,
//!   which also zeroes the counters) on any inode is answered by the server
//!   itself with the brick graph's fop timings as text
//!   ([`xlfs_sdk::profile::GraphProfile`]): how `xlfs profile` reaches a
//!   brick through a mount's protocol/client or on its own.
//! - **Stopping.** `ParentDown` stops accepting and reading new requests;
//!   `fini` waits (at most [`DRAIN_TIMEOUT`]) for the calls in flight to be
//!   answered, says GOODBYE and closes every connection. `fini` blocks; call
//!   it from a thread that is not a current-thread runtime's own (there it
//!   does not wait).

mod auth;
mod connection;
mod fds;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use xlfs_sdk::options::{Opt, kind};

use parking_lot::{Condvar, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, TryAcquireError, watch};
use tokio::task::JoinHandle;
use xlfs_sdk::abi::{self, AbiVersion, DecodeError};
use xlfs_sdk::options::{OptType, OptionDecl};
use xlfs_sdk::profile::{PROFILE_KEY, PROFILE_RESET_KEY, STATEDUMP_KEY};
use xlfs_sdk::{
    CallCtx, Child, Dict, Errno, Event, EventFrom, EventSink, Fd, FdId, Fop, FopKind, FopResult, Gfid, InitCtx,
    InitError, Reply, Request, Response, Upcall, Xlator, XlatorType,
};

use self::auth::Auth;
use self::connection::*;
use self::fds::FdTable;
use super::rpc::{
    self, Descriptor, FrameKind, FrameReader, HANDSHAKE_MAX_FRAME, Held, HelloReply, Link, Message, MessageError,
    OUT_QUEUE, Outgoing, SocketOptions, TlsStream, WireRead, WireWrite, hello_keys, limits_for, with_transport_options,
};

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "protocol/server",
    description: "serves the brick graph below it to protocol/client peers over TCP (and a Unix socket for local ones)",
    options: OPTIONS,
    min_children: 1,
    max_children: usize::MAX,
    build,
};

const TRANSPORT_SOCKET_LISTEN_PORT: Opt<kind::Int> = Opt::int("transport.socket.listen-port", "49152")
    .range(0.0, 65535.0)
    .desc("TCP port to listen on; 0 picks any free port (see the `listen` key of the dump).");
const TRANSPORT_SOCKET_BIND_ADDRESS: Opt<kind::Str> =
    Opt::str("transport.socket.bind-address", "0.0.0.0").desc("IPv4 address (or host name) to listen on.");
const TRANSPORT_LISTEN_BACKLOG: Opt<kind::Int> = Opt::int("transport.listen-backlog", "1024")
    .range(1.0, 65535.0)
    .desc("Connections the kernel queues before they are accepted.");
const MAX_FRAME_SIZE: Opt<kind::Size> = Opt::size("max-frame-size", "128MB")
    .range(1048576.0, 4294967295.0)
    .desc("Largest frame accepted or sent (header and data); a bigger frame from a client closes its connection.");

const OPTIONS: &[OptionDecl] = with_transport_options![
    TRANSPORT_SOCKET_LISTEN_PORT.decl,
    TRANSPORT_SOCKET_BIND_ADDRESS.decl,
    TRANSPORT_LISTEN_BACKLOG.decl,
    OptionDecl::new("auth.addr.*.allow", OptType::List).desc(
        "Per subvolume (the * part, e.g. auth.addr./srv/b1.allow): client IP address patterns allowed, `*` and `?` \
         wildcards (127.0.0.*). A subvolume with no allow option at all is open to every address.",
    ),
    OptionDecl::new("auth.addr.*.reject", OptType::List)
        .desc("Per subvolume: client IP address patterns refused, checked before allow."),
    OptionDecl::new("auth.login.*.allow", OptType::List).desc(
        "Per subvolume: user names allowed; when set, a client must log in as one of them with the password in \
         auth.login.<user>.password.",
    ),
    OptionDecl::new("auth.login.*.password", OptType::Str).desc("The password of user * (auth.login.<user>.password)."),
    OptionDecl::new("auth.ssl-allow", OptType::List).default("*").desc(
        "With transport.socket.ssl-enabled: the client certificate common names (patterns, `*` and `?`) that may \
         connect; `*` admits every certificate signed by one of the CAs in transport.socket.ssl-ca-list.",
    ),
    OptionDecl::new("auth-path", OptType::Str).desc("Accepted for GlusterFS volfiles; has no effect."),
    MAX_FRAME_SIZE.decl,
    MAX_INFLIGHT.decl,
    MAX_INFLIGHT_BYTES.decl,
    MAX_CLIENTS.decl,
    MAX_FDS.decl,
];

const MAX_INFLIGHT: Opt<kind::Int> = Opt::int("max-inflight-per-client", "4096")
    .range(1.0, 1048576.0)
    .desc("Calls of one connection in flight at once; at the limit the connection is not read until one is answered.");
const MAX_INFLIGHT_BYTES: Opt<kind::Size> =
    Opt::size("max-inflight-bytes-per-client", "64MB").range(1048576.0, 17179869184.0).desc(
        "Bytes one connection's calls may hold at once, from the request frame until the reply is written: the \
         frame and the data a read or readdir may return. At the limit the connection is not read until replies are \
         written (a client that never reads its replies holds no more); a single larger call runs alone.",
    );
const MAX_CLIENTS: Opt<kind::Int> = Opt::int("max-clients", "1024")
    .range(1.0, 1048576.0)
    .desc("Connected clients at once; a client beyond is refused at the handshake.");
const MAX_FDS: Opt<kind::Int> = Opt::int("max-fds-per-client", "65536")
    .range(1.0, 16777216.0)
    .desc("Fds one connection may have open; opens beyond fail with EMFILE.");

/// Longest a connection may take to send its HELLO.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the calls in flight on a closing connection (or a stopping
/// server) are waited for before they are cancelled.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a closing connection's last frames may take to be written.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest client id accepted in a HELLO.
const MAX_CLIENT_ID: usize = 1024;
/// Upcalls queued for one client before new ones are dropped.
const UPCALL_QUEUE_ROOM: usize = OUT_QUEUE / 2;
/// Most replies a connection's reader holds back to send together.
const CORK_FRAMES: usize = 64;
/// Clients listed one by one in the dump.
const DUMP_CLIENTS: usize = 256;

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let name = init.name.clone();
    Server::new(init).map(|s| Arc::new(s) as Arc<dyn Xlator>).map_err(|e| InitError::new(format!("{name}: {e}")))
}

#[derive(Debug)]
struct Config {
    max_frame: usize,
    max_inflight: usize,
    /// The byte budget of a connection, in KiB.
    max_inflight_kib: u32,
    max_clients: usize,
    max_fds: usize,
    sock: SocketOptions,
    auth: Auth,
    /// TLS (`transport.socket.ssl-enabled`): the only way in when set.
    tls: Option<Arc<rustls::ServerConfig>>,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    calls: AtomicU64,
    /// Calls that did not finish on their first poll (run in a task).
    calls_spawned: AtomicU64,
    closed_bad_input: AtomicU64,
    upcalls_dropped: AtomicU64,
    /// REPLYs whose data went in the chunk the client lent: read there by
    /// the graph, or copied there.
    shared_replies_direct: AtomicU64,
    shared_replies_copied: AtomicU64,
}

/// Live tasks (accept loop, connections), so `fini` can wait for them.
#[derive(Default)]
struct TaskCount {
    n: Mutex<usize>,
    zero: Condvar,
}

struct TaskGuard(Arc<Shared>);

impl TaskGuard {
    fn new(sh: &Arc<Shared>) -> TaskGuard {
        *sh.tasks.n.lock() += 1;
        TaskGuard(sh.clone())
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let mut n = self.0.tasks.n.lock();
        *n -= 1;
        if *n == 0 {
            self.0.tasks.zero.notify_all();
        }
    }
}

/// State shared by the translator, its accept loop and its connections.
struct Shared {
    name: String,
    children: Vec<Child>,
    events: EventSink,
    rt: Handle,
    cfg: Config,
    listener: Mutex<Option<std::net::TcpListener>>,
    /// The local transport's abstract Unix socket, when offered.
    unix_listener: Mutex<Option<std::os::unix::net::UnixListener>>,
    /// Its name (for the dump), when offered.
    unix_name: Option<String>,
    local: SocketAddr,
    /// Handshaken connections by their client id.
    conns: Mutex<HashMap<Arc<str>, Arc<Conn>>>,
    /// Accepted connections, handshaken or not.
    open: AtomicUsize,
    next_conn: AtomicU64,
    next_fd: AtomicU64,
    /// Set on ParentDown / fini: stop accepting and reading.
    stop: watch::Sender<bool>,
    tasks: TaskCount,
    counters: Counters,
}

/// A local client's regions, mapped here.
struct PeerShm {
    /// Its send region (read-only here): CALL payloads.
    send: Arc<rpc::shm::Mapping>,
    /// Its receive region for this connection (read-write here): the data
    /// of replies to calls that lend a chunk of it.
    recv: Arc<rpc::shm::Mapping>,
}

/// How far a closing connection's calls are cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Cancel {
    None,
    /// Lock requests (they may wait for ever).
    Locks,
    /// Everything still running.
    All,
}

/// One handshaken connection.
struct Conn {
    client_id: Arc<str>,
    peer: SocketAddr,
    /// The client's shared regions (local transport only).
    shm: Option<PeerShm>,
    /// "tcp", "tls", "unix" or "unix+shm", for the dump.
    transport: &'static str,
    child: Child,
    /// The socket's write side: a reply is written by the task that has
    /// it when the socket is free.
    link: Link,
    fds: Mutex<FdTable>,
    /// Free in-flight slots.
    inflight: Arc<Semaphore>,
    /// Free KiB of the byte budget (`max-inflight-bytes-per-client`).
    budget: Arc<Semaphore>,
    /// Calls running (on the reader or in tasks of their own).
    running: AtomicUsize,
    /// Notified when `running` drops to zero.
    idle: tokio::sync::Notify,
    cancel: watch::Sender<Cancel>,
}

impl Conn {
    async fn send(&self, out: Outgoing) -> bool {
        self.link.send(out).await
    }

    /// Runs one call: fd ids translated, opens and releases kept in the
    /// table.
    async fn dispatch(&self, next_fd: &AtomicU64, ctx: CallCtx, mut req: Request) -> FopResult {
        let kind = req.fop.kind();
        match &mut req.fop {
            Fop::Open { fd, loc, .. } | Fop::Create { fd, loc, .. } | Fop::Opendir { fd, loc } => {
                let client = *fd;
                let brick = FdId(next_fd.fetch_add(1, Ordering::Relaxed));
                self.fds.lock().reserve(client, brick, kind == FopKind::Opendir, loc.gfid)?;
                *fd = brick;
                let res = self.child.call(ctx, req).await;
                let gfid = match &res {
                    Ok(Response { reply: Reply::Entry { iatt, .. }, .. }) => iatt.gfid,
                    _ => Gfid::NULL,
                };
                self.fds.lock().opened(client, res.is_ok(), gfid);
                res
            }
            Fop::Release { fd } | Fop::Releasedir { fd } => {
                fd.id = self.fds.lock().take(fd.id)?.brick;
                self.child.call(ctx, req).await
            }
            fop => {
                {
                    let mut table = self.fds.lock();
                    for fd in fop.fds_mut() {
                        table.translate(fd)?;
                    }
                }
                self.child.call(ctx, req).await
            }
        }
    }

    /// Waits (at most `limit`) until no call is running.
    async fn drained(&self, limit: Duration) -> bool {
        let idle = async {
            loop {
                let notified = self.idle.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.running.load(Ordering::Acquire) == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, idle).await.is_ok()
    }
}

/// Counts a call task as running while alive.
struct Running(Arc<Conn>);

impl Running {
    fn new(conn: &Arc<Conn>) -> Running {
        conn.running.fetch_add(1, Ordering::AcqRel);
        Running(conn.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The protocol/server translator.
struct Server {
    shared: Arc<Shared>,
}

/// Binds the local transport's abstract Unix socket for the TCP address
/// `tcp`; None (logged) when it cannot be bound, e.g. another brick of this
/// host already holds the name: clients then use TCP.
fn bind_local(tcp: SocketAddr) -> Option<std::os::unix::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let name = rpc::local_socket_name(tcp);
    let bound = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| l.set_nonblocking(true).map(|()| l));
    match bound {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(socket = %name, error = %e, "local transport not offered: clients on this host use TCP");
            None
        }
    }
}

/// Binds a listening IPv4 TCP socket.
fn bind(host: &str, port: u16, backlog: i32) -> Result<std::net::TcpListener, String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot listen on {host}:{port}: {e}");
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| fail(&e))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| fail(&"no IPv4 address"))?;
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .map_err(|e| fail(&e))?;
    sock.set_reuse_address(true).map_err(|e| fail(&e))?;
    sock.bind(&addr.into()).map_err(|e| fail(&e))?;
    sock.listen(backlog).map_err(|e| fail(&e))?;
    sock.set_nonblocking(true).map_err(|e| fail(&e))?;
    Ok(sock.into())
}

impl Server {
    fn new(init: InitCtx) -> Result<Server, String> {
        let InitCtx { name, options: o, children, events, .. } = init;
        rpc::check_transport(&o)?;
        let rt =
            Handle::try_current().map_err(|_| "protocol/server must be built inside a tokio runtime".to_string())?;
        let names: Vec<&str> = children.iter().map(|c| &*c.name).collect();
        let auth = Auth::from_options(&o, &names)?;
        let cfg = Config {
            max_frame: MAX_FRAME_SIZE.get(&o).min(u64::from(u32::MAX)) as usize,
            max_inflight: MAX_INFLIGHT.count(&o).clamp(1, Semaphore::MAX_PERMITS),
            max_inflight_kib: u32::try_from(MAX_INFLIGHT_BYTES.get(&o) / 1024).unwrap_or(u32::MAX).max(1),
            max_clients: MAX_CLIENTS.count(&o).max(1),
            max_fds: MAX_FDS.count(&o).max(1),
            sock: SocketOptions::from_options(&o),
            auth,
            tls: rpc::TlsFiles::from_options(&o).map(|f| f.server_config()).transpose().map_err(|e| e.to_string())?,
        };
        let host = TRANSPORT_SOCKET_BIND_ADDRESS.get(&o);
        let port = TRANSPORT_SOCKET_LISTEN_PORT.get(&o).clamp(0, 65535) as u16;
        let listener = bind(host, port, TRANSPORT_LISTEN_BACKLOG.get(&o).clamp(1, 65535) as i32)?;
        let local = listener.local_addr().map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
        let unix_listener = match rpc::transport::LOCAL.get(&o) && cfg.tls.is_none() {
            true => bind_local(local),
            false => None,
        };
        let unix_name = unix_listener.as_ref().map(|_| rpc::local_socket_name(local));
        tracing::info!(server = %name, listen = %local, local = ?unix_name, subvolumes = %names.join(","), "listening");
        let (stop, _) = watch::channel(false);
        Ok(Server {
            shared: Arc::new(Shared {
                name,
                children,
                events,
                rt,
                cfg,
                listener: Mutex::new(Some(listener)),
                unix_listener: Mutex::new(unix_listener),
                unix_name,
                local,
                conns: Mutex::new(HashMap::new()),
                open: AtomicUsize::new(0),
                next_conn: AtomicU64::new(1),
                next_fd: AtomicU64::new(1),
                stop,
                tasks: TaskCount::default(),
                counters: Counters::default(),
            }),
        })
    }

    /// Starts accepting (once).
    fn start(&self) {
        let Some(listener) = self.shared.listener.lock().take() else {
            return;
        };
        if *self.shared.stop.borrow() {
            return;
        }
        let sh = self.shared.clone();
        let guard = TaskGuard::new(&sh);
        self.shared.rt.spawn(accept_loop(sh, Listener::Tcp(listener), guard));
        if let Some(unix) = self.shared.unix_listener.lock().take() {
            let sh = self.shared.clone();
            let guard = TaskGuard::new(&sh);
            self.shared.rt.spawn(accept_loop(sh, Listener::Local(unix), guard));
        }
    }

    fn route_upcall(&self, u: Upcall) {
        let targets: Vec<Arc<Conn>> = {
            let conns = self.shared.conns.lock();
            match &u {
                Upcall::InodelkContention { holder_client, .. } | Upcall::EntrylkContention { holder_client, .. } => {
                    conns.get(holder_client.as_str()).cloned().into_iter().collect()
                }
                Upcall::Invalidate { .. } => conns.values().cloned().collect(),
                Upcall::InvalidateFor { client, .. } => conns.get(client.as_str()).cloned().into_iter().collect(),
            }
        };
        // Clients only ever get the plain form.
        let u = match u {
            Upcall::InvalidateFor { gfid, .. } => Upcall::Invalidate { gfid },
            u => u,
        };
        if targets.is_empty() {
            tracing::debug!(upcall = ?u, "upcall for no connected client");
            return;
        }
        let frame = match Message::Upcall(Event::Upcall(u)).to_frame(0) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "upcall not encodable");
                return;
            }
        };
        for c in targets {
            let sent = c.link.room() > UPCALL_QUEUE_ROOM && c.link.try_send(frame.clone().into());
            if !sent {
                self.shared.counters.upcalls_dropped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(client = %c.client_id, "upcall dropped: the client's queue is full or closing");
            }
        }
    }
}

impl Xlator for Server {
    fn call(&self, ctx: CallCtx, req: Request) -> xlfs_sdk::FopFuture<'_> {
        // Nothing sits above a server; a fop wound here goes to the first
        // subvolume, like any translator's default.
        match self.shared.children.first() {
            Some(c) => c.call(ctx, req),
            None => Box::pin(std::future::ready(Err(Errno::ENOTCONN))),
        }
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        match (from, event) {
            (EventFrom::Child(_), Event::Upcall(u)) => {
                self.route_upcall(u);
                None
            }
            (EventFrom::Child(_), Event::ChildUp) => {
                self.start();
                Some(Event::ChildUp)
            }
            (EventFrom::Child(_), e) => Some(e),
            (EventFrom::Graph, Event::ParentDown) => {
                self.shared.stop.send_replace(true);
                None
            }
            (EventFrom::Graph, _) => None,
        }
    }

    fn dump(&self) -> Vec<(String, String)> {
        let sh = &self.shared;
        let c = &sh.counters;
        let conns = sh.conns.lock();
        let mut out = vec![
            ("listen".to_string(), sh.local.to_string()),
            ("listen-local".to_string(), sh.unix_name.clone().unwrap_or_else(|| "none".into())),
            ("accepting".to_string(), (sh.listener.lock().is_none() && !*sh.stop.borrow()).to_string()),
            ("clients".to_string(), conns.len().to_string()),
            ("connections-open".to_string(), sh.open.load(Ordering::Relaxed).to_string()),
            ("accepted-total".to_string(), c.accepted.load(Ordering::Relaxed).to_string()),
            ("refused-total".to_string(), c.refused.load(Ordering::Relaxed).to_string()),
            ("calls-total".to_string(), c.calls.load(Ordering::Relaxed).to_string()),
            ("calls-spawned-total".to_string(), c.calls_spawned.load(Ordering::Relaxed).to_string()),
            ("closed-bad-input-total".to_string(), c.closed_bad_input.load(Ordering::Relaxed).to_string()),
            ("upcalls-dropped-total".to_string(), c.upcalls_dropped.load(Ordering::Relaxed).to_string()),
            ("shared-replies-direct-total".to_string(), c.shared_replies_direct.load(Ordering::Relaxed).to_string()),
            ("shared-replies-copied-total".to_string(), c.shared_replies_copied.load(Ordering::Relaxed).to_string()),
            ("max-frame-size".to_string(), sh.cfg.max_frame.to_string()),
        ];
        for (id, conn) in conns.iter().take(DUMP_CLIENTS) {
            let inflight = sh.cfg.max_inflight.saturating_sub(conn.inflight.available_permits());
            out.push((
                format!("client.{id}"),
                format!(
                    "peer {} transport {} subvolume {} inflight {inflight} fds {}",
                    conn.peer,
                    conn.transport,
                    conn.child.name,
                    conn.fds.lock().len()
                ),
            ));
        }
        out
    }

    fn fini(&self) {
        let sh = &self.shared;
        sh.stop.send_replace(true);
        drop(sh.listener.lock().take());
        drop(sh.unix_listener.lock().take());
        let on_current_thread_rt =
            Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if on_current_thread_rt {
            tracing::warn!(server = %sh.name, "fini on a current-thread runtime: not waiting for connections to close");
            return;
        }
        let mut n = sh.tasks.n.lock();
        let deadline = std::time::Instant::now() + DRAIN_TIMEOUT + FLUSH_TIMEOUT * 2;
        while *n > 0 {
            if sh.tasks.zero.wait_until(&mut n, deadline).timed_out() {
                tracing::warn!(server = %sh.name, tasks = *n, "fini: connections still closing, not waiting longer");
                break;
            }
        }
        tracing::info!(server = %sh.name, "stopped");
    }
}
