//! protocol/client: a leaf that sends every fop to one subvolume of a
//! remote protocol/server (GlusterFS's client xlator). Wire format:
//! `sdk/WIRE.md`; transport: [`super::rpc`].
//!
//! - **Connection.** On `ParentUp` it connects to `remote-host:remote-port`
//!   (a brick on this host through its Unix socket, the local transport,
//!   unless `transport.local` is off: payloads of 32 KiB and more then
//!   cross in shared memory, `sdk/WIRE.md` section 12; `dump()` says which
//!   as `transport`) and says `ChildConnecting`; after the handshake (ABI version,
//!   `remote-subvolume`, `username`/`password`) it says `ChildUp`. When the
//!   connection drops, or the server refuses the handshake (the server's
//!   reason is logged and shown by `dump()` as `last-error`), it says
//!   `ChildDown` and tries again, waiting `reconnect-min`, doubling up to
//!   `reconnect-max`, until `ParentDown` or `fini`. Events are sent only
//!   when they change the state.
//! - **Fops.** Many in flight on the connection, matched to replies by id.
//!   A fop alone on the connection writes its CALL to the socket itself;
//!   with others in flight, CALLs go through the connection's writer task,
//!   several per system call.
//!   While disconnected a fop fails at once with ENOTCONN; fops in flight
//!   when the connection drops fail with ENOTCONN; no fop waits longer than
//!   `frame-timeout` (then ENOTCONN, as GlusterFS's call bail). A read
//!   whose reply could not fit in `max-frame-size`, or a call that does not
//!   fit, is EINVAL.
//! - **Liveness.** A PING goes out every `min(ping-timeout / 3, 5 s)`; when
//!   nothing at all has arrived for `ping-timeout` the server is declared
//!   down (connection closed, `ChildDown`, fops in flight ENOTCONN).
//!   `ping-timeout 0` turns this off.
//! - **Fds across reconnects.** Every fd opened through this client is
//!   remembered (gfid, flags, file or directory). The server forgets a
//!   connection's fds when it ends, so after a reconnect each fd is opened
//!   again (by gfid, with the same fd id, without O_CREAT/O_EXCL/O_TRUNC)
//!   just before its next use, as GlusterFS's client_reopen does. An fd
//!   whose reopen fails, or that held POSIX locks when `strict-locks` is on
//!   (its locks are gone), is EBADF from then on. Locks do not survive a
//!   reconnect: the server frees a gone connection's locks.
//! - **Upcalls** from the server become [`Event::Upcall`]s for the parents.

mod connection;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinHandle;
use xlfs_sdk::abi::{self, AbiVersion};
use xlfs_sdk::options::{Opt, OptionDecl, kind};
use xlfs_sdk::{
    CallCtx, Dict, Errno, Event, EventFrom, EventSink, Fd, FdId, Fop, FopFuture, FopKind, FopResult, Gfid, InitCtx,
    InitError, LkCmd, Loc, LockType, Reply, Request, Response, Xlator, XlatorType,
};

use super::rpc::{
    self, Descriptor, Frame, FrameKind, FrameReader, HANDSHAKE_MAX_FRAME, Hello, Link, Message, Outgoing,
    SocketOptions, TlsStream, WireRead, hello_keys, limits_for, with_transport_options,
};
use connection::*;

/// The translator type.
pub const TYPE: XlatorType = XlatorType {
    name: "protocol/client",
    description: "sends fops to a subvolume of a remote protocol/server over TCP (or a local one's Unix socket)",
    options: OPTIONS,
    min_children: 0,
    max_children: 0,
    build,
};

const REMOTE_HOST: Opt<kind::Str> =
    Opt::optional("remote-host").desc("Host name or IPv4 address of the brick's server (required).");
const REMOTE_SUBVOLUME: Opt<kind::Str> =
    Opt::optional("remote-subvolume").desc("The server's subvolume to use, usually the brick directory (required).");
const PING_TIMEOUT: Opt<kind::Time> = Opt::time("ping-timeout", "42").range(0.0, 1013.0).desc(
    "Declare the brick down when nothing has arrived from it for this long (pings keep an idle connection \
     busy); 0 turns pings off.",
);
const FRAME_TIMEOUT: Opt<kind::Time> = Opt::time("frame-timeout", "1800")
    .range(0.001, 604800.0)
    .desc("Longest a fop waits for its reply; then it fails with ENOTCONN.");
const RECONNECT_MIN: Opt<kind::Time> = Opt::time("reconnect-min", "100ms")
    .range(0.001, 3600.0)
    .desc("First wait before reconnecting; doubled after each failed attempt.");
const RECONNECT_MAX: Opt<kind::Time> =
    Opt::time("reconnect-max", "3s").range(0.001, 3600.0).desc("Longest wait between reconnect attempts.");
const REMOTE_PORT: Opt<kind::Int> =
    Opt::int("remote-port", "49152").range(1.0, 65535.0).desc("TCP port of the brick's server.");
const USERNAME: Opt<kind::Str> = Opt::optional("username").desc("Login name sent in the handshake (for auth.login).");
const PASSWORD: Opt<kind::Str> = Opt::optional("password").desc("Login password sent in the handshake.");
const MAX_FRAME_SIZE: Opt<kind::Size> = Opt::size("max-frame-size", "128MB")
    .range(1048576.0, 4294967295.0)
    .desc("Largest frame sent or accepted; a bigger frame from the server closes the connection.");
const SEND_GIDS: Opt<kind::Bool> =
    Opt::bool("send-gids", true).desc("Send the caller's supplementary groups with each fop; off sends none.");
const STRICT_LOCKS: Opt<kind::Bool> = Opt::bool("strict-locks", false)
    .desc("After a reconnect, do not reopen fds that held POSIX locks (their locks are lost): they fail with EBADF.");

const OPTIONS: &[OptionDecl] = with_transport_options![
    REMOTE_HOST.decl,
    REMOTE_PORT.decl,
    REMOTE_SUBVOLUME.decl,
    PING_TIMEOUT.decl,
    FRAME_TIMEOUT.decl,
    USERNAME.decl,
    PASSWORD.decl,
    MAX_FRAME_SIZE.decl,
    RECONNECT_MIN.decl,
    RECONNECT_MAX.decl,
    SEND_GIDS.decl,
    STRICT_LOCKS.decl,
];

/// Longest wait for the TCP connection and for the HELLO_REPLY.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a closing connection's last frames to be written.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);
/// Most fops in flight at once; more wait for a slot (within frame-timeout).
const MAX_PENDING: usize = 1 << 16;
/// Room for a read reply's header beside its data.
const REPLY_OVERHEAD: usize = 64 << 10;
/// Longest ping interval.
const MAX_PING_INTERVAL: Duration = Duration::from_secs(5);

fn build(init: InitCtx) -> Result<Arc<dyn Xlator>, InitError> {
    let name = init.name.clone();
    Client::new(init).map(|c| Arc::new(c) as Arc<dyn Xlator>).map_err(|e| InitError::new(format!("{name}: {e}")))
}

#[derive(Debug)]
struct Config {
    host: String,
    port: u16,
    subvolume: String,
    ping_timeout: Duration,
    frame_timeout: Duration,
    username: Option<String>,
    password: Option<String>,
    max_frame: usize,
    reconnect_min: Duration,
    reconnect_max: Duration,
    send_gids: bool,
    strict_locks: bool,
    sock: SocketOptions,
    /// TLS (`transport.socket.ssl-enabled`).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `transport.local`: try the brick's local socket first.
    local: bool,
    /// `transport.local.shm-size` (0: no shared memory).
    shm_size: usize,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    enotconn: AtomicU64,
    frame_timeouts: AtomicU64,
    connects: AtomicU64,
    disconnects: AtomicU64,
    ping_timeouts: AtomicU64,
    upcalls: AtomicU64,
    reopens: AtomicU64,
    reopen_failures: AtomicU64,
    /// CALLs whose payload the brick read from shared memory.
    shared_calls: AtomicU64,
    /// REPLYs whose data the brick put in a lent chunk.
    shared_replies: AtomicU64,
}

/// An fd opened through this client.
#[derive(Clone, Copy, Debug)]
struct FdRec {
    gfid: Gfid,
    flags: u32,
    dir: bool,
    /// The connection it is open on.
    generation: u64,
    /// Its reopen failed: EBADF.
    bad: bool,
    /// It was granted a POSIX lock (for strict-locks).
    locked: bool,
}

/// One connection to the server.
struct Conn {
    generation: u64,
    /// The socket's write side: a fop writes its CALL itself when the
    /// socket is free.
    link: Link,
    /// Reply waiters by request id; None once the connection is closed.
    pending: Mutex<Option<HashMap<u64, Waiter>>>,
    /// The regions the brick mapped (local transport with shared memory).
    shm: Option<Shm>,
    /// "tcp", "tls", "unix" or "unix+shm".
    transport: &'static str,
}

/// A call waiting for its reply.
struct Waiter {
    tx: oneshot::Sender<FopResult>,
    /// The chunk of the receive region lent for the reply's data.
    lent: Option<Chunk>,
}

/// The shared regions of a local connection.
struct Shm {
    /// The process's send region (read-only for the brick).
    send: Arc<Region>,
    /// This connection's receive region (read-write for the brick).
    recv: Arc<Region>,
}

/// A CALL ready to go over a connection: the frame, the payload to keep
/// alive until the reply (the brick reads it from shared memory), and the
/// chunk lent for the reply's data.
struct Prepared {
    frame: rpc::OutFrame,
    keep: Option<Bytes>,
    lent: Option<Chunk>,
}

impl Conn {
    /// Puts a call's payload in shared memory (where it is already, or a
    /// copy) and lends a chunk for a read's reply, when the connection has
    /// shared regions and the sizes make it worth it.
    fn prepare(&self, frame: rpc::OutFrame, reply_size: usize) -> Prepared {
        let plain = |frame| Prepared { frame, keep: None, lent: None };
        let Some(shm) = &self.shm else {
            return plain(frame);
        };
        let payload = frame.payload().clone();
        let data = match payload.len() >= shm::SHARED_MIN {
            true => match shm.send.locate(&payload) {
                Some(_) => Some(payload.clone()),
                None => shm.send.alloc(payload.len()).map(|mut c| {
                    c.as_mut_slice().copy_from_slice(&payload);
                    c.freeze()
                }),
            },
            false => None,
        };
        // The payload section holds descriptors only: a chunk is lent only
        // when no inline payload has to go too.
        let lent = match reply_size >= shm::SHARED_MIN && (payload.is_empty() || data.is_some()) {
            true => shm.recv.alloc(reply_size),
            false => None,
        };
        if data.is_none() && lent.is_none() {
            return plain(frame);
        }
        let desc = |(offset, len)| Descriptor { offset, len };
        let data_at = data.as_ref().and_then(|d| shm.send.locate(d)).map(desc);
        let reply_at = lent.as_ref().map(|c| Descriptor { offset: c.offset(), len: c.len() as u64 });
        Prepared { frame: frame.with_descriptors(data_at, reply_at), keep: data, lent }
    }

    fn try_send(&self, out: Outgoing) {
        self.link.try_send(out);
    }

    /// Closes: no more frames (those queued are still written), every
    /// waiter fails with ENOTCONN (the chunks they lent are buried: the
    /// brick may still fill them).
    fn close(&self) {
        self.link.close();
        let waiters = self.pending.lock().take();
        for w in waiters.into_iter().flat_map(HashMap::into_values) {
            if let Some(c) = w.lent {
                shm::bury(c);
            }
        }
    }

    fn inflight(&self) -> usize {
        self.pending.lock().as_ref().map_or(0, HashMap::len)
    }
}

use rpc::shm::{self, Chunk, Region};

/// Removes a reply waiter that is not going to wait any more.
struct PendingGuard<'a> {
    conn: &'a Conn,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        let gone = self.conn.pending.lock().as_mut().and_then(|map| map.remove(&self.id));
        // Still waiting: the call ends without its reply, and the brick may
        // still fill the chunk it lent.
        if let Some(c) = gone.and_then(|w| w.lent) {
            shm::bury(c);
        }
    }
}

/// A call's shared payload, kept until its reply; buried if the call ends
/// without one (the brick may still be reading it).
struct Keep(Option<Bytes>);

impl Keep {
    /// The reply came: the brick is done with the payload.
    fn release(mut self) {
        self.0 = None;
    }
}

impl Drop for Keep {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            shm::bury(b);
        }
    }
}

#[derive(Debug, Default)]
struct Status {
    phase: &'static str,
    last_error: String,
    assigned_id: String,
    generation: u64,
}

struct Inner {
    name: String,
    cfg: Config,
    events: EventSink,
    rt: Handle,
    client_id: String,
    conn: Mutex<Option<Arc<Conn>>>,
    fds: Mutex<HashMap<FdId, FdRec>>,
    reopen: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
    slots: Semaphore,
    /// ParentUp sets it, ParentDown and fini clear it.
    run: watch::Sender<bool>,
    /// The connection manager task is alive.
    managing: AtomicBool,
    last_event: Mutex<Option<Event>>,
    status: Mutex<Status>,
    counters: Counters,
}

/// The protocol/client translator.
struct Client {
    inner: Arc<Inner>,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

impl Client {
    fn new(init: InitCtx) -> Result<Client, String> {
        let InitCtx { name, options: o, events, .. } = init;
        super::rpc::check_transport(&o)?;
        let rt =
            Handle::try_current().map_err(|_| "protocol/client must be built inside a tokio runtime".to_string())?;
        let required = |opt: Opt<kind::Str>| {
            opt.given(&o)
                .filter(|v| !v.trim().is_empty())
                .map(str::to_string)
                .ok_or_else(|| format!("option '{}' is required", opt.name()))
        };
        let reconnect_min = RECONNECT_MIN.get(&o);
        let cfg = Config {
            host: required(REMOTE_HOST)?,
            port: REMOTE_PORT.get(&o).clamp(1, 65535) as u16,
            subvolume: required(REMOTE_SUBVOLUME)?,
            ping_timeout: PING_TIMEOUT.get(&o),
            frame_timeout: FRAME_TIMEOUT.get(&o),
            username: USERNAME.given(&o).map(str::to_string),
            password: PASSWORD.given(&o).map(str::to_string),
            max_frame: MAX_FRAME_SIZE.get(&o).min(u64::from(u32::MAX)) as usize,
            reconnect_min,
            reconnect_max: RECONNECT_MAX.get(&o).max(reconnect_min),
            send_gids: SEND_GIDS.get(&o),
            strict_locks: STRICT_LOCKS.get(&o),
            sock: SocketOptions::from_options(&o),
            tls: rpc::TlsFiles::from_options(&o).map(|f| f.client_config()).transpose().map_err(|e| e.to_string())?,
            local: rpc::transport::LOCAL.get(&o),
            shm_size: usize::try_from(rpc::transport::SHM_SIZE.get(&o)).unwrap_or(usize::MAX),
        };
        let client_id = format!("{}-{}-{}-{}", hostname(), std::process::id(), name, Gfid::random());
        let (run, _) = watch::channel(false);
        Ok(Client {
            inner: Arc::new(Inner {
                name,
                cfg,
                events,
                rt,
                client_id,
                conn: Mutex::new(None),
                fds: Mutex::new(HashMap::new()),
                reopen: tokio::sync::Mutex::new(()),
                next_id: AtomicU64::new(1),
                slots: Semaphore::new(MAX_PENDING),
                run,
                managing: AtomicBool::new(false),
                last_event: Mutex::new(None),
                status: Mutex::new(Status { phase: "idle", ..Status::default() }),
                counters: Counters::default(),
            }),
        })
    }

    /// Starts the connection manager unless it runs.
    fn start(&self) {
        self.inner.run.send_replace(true);
        if !self.inner.managing.swap(true, Ordering::AcqRel) {
            let inner = self.inner.clone();
            self.inner.rt.spawn(async move {
                loop {
                    manage(&inner).await;
                    inner.managing.store(false, Ordering::Release);
                    // A ParentUp that came while the manager was ending.
                    if !*inner.run.borrow() || inner.managing.swap(true, Ordering::AcqRel) {
                        break;
                    }
                }
            });
        }
    }
}

impl Xlator for Client {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        Box::pin(self.inner.call(ctx, req))
    }

    fn notify(&self, event: Event, from: EventFrom) -> Option<Event> {
        match (from, event) {
            (EventFrom::Graph, Event::ParentUp) => {
                self.start();
                None
            }
            (EventFrom::Graph, Event::ParentDown) => {
                self.inner.run.send_replace(false);
                None
            }
            (EventFrom::Graph, _) => None,
            (EventFrom::Child(_), e) => Some(e),
        }
    }

    fn dump(&self) -> Vec<(String, String)> {
        let i = &self.inner;
        let c = &i.counters;
        let st = i.status.lock();
        let inflight = i.conn.lock().as_ref().map_or(0, |c| c.inflight());
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        vec![
            ("state".into(), st.phase.to_string()),
            ("remote".into(), format!("{}:{}", i.cfg.host, i.cfg.port)),
            ("transport".into(), i.conn.lock().as_ref().map_or("none", |c| c.transport).to_string()),
            ("remote-subvolume".into(), i.cfg.subvolume.clone()),
            ("client-id".into(), i.client_id.clone()),
            ("server-client-id".into(), st.assigned_id.clone()),
            ("connection".into(), st.generation.to_string()),
            ("inflight".into(), inflight.to_string()),
            ("fds".into(), i.fds.lock().len().to_string()),
            ("calls-total".into(), n(&c.calls)),
            ("enotconn-total".into(), n(&c.enotconn)),
            ("frame-timeouts-total".into(), n(&c.frame_timeouts)),
            ("connects-total".into(), n(&c.connects)),
            ("disconnects-total".into(), n(&c.disconnects)),
            ("ping-timeouts-total".into(), n(&c.ping_timeouts)),
            ("upcalls-total".into(), n(&c.upcalls)),
            ("reopens-total".into(), n(&c.reopens)),
            ("reopen-failures-total".into(), n(&c.reopen_failures)),
            ("shared-calls-total".into(), n(&c.shared_calls)),
            ("shared-replies-total".into(), n(&c.shared_replies)),
            ("last-error".into(), st.last_error.clone()),
        ]
    }

    fn fini(&self) {
        self.inner.run.send_replace(false);
    }
}

impl Inner {
    fn current(&self) -> Option<Arc<Conn>> {
        self.conn.lock().clone()
    }

    /// Sends a state event to the parents unless it is the last one sent.
    fn emit(&self, e: Event) {
        {
            let mut last = self.last_event.lock();
            if last.as_ref() == Some(&e) {
                return;
            }
            *last = Some(e.clone());
        }
        tracing::debug!(client = %self.name, event = ?e, "state event");
        self.events.send(e);
    }

    fn set_error(&self, msg: String, refused: bool) {
        let mut st = self.status.lock();
        if st.last_error != msg {
            if refused {
                tracing::warn!(client = %self.name, "{msg}");
            } else {
                tracing::info!(client = %self.name, "{msg}");
            }
        } else {
            tracing::debug!(client = %self.name, "{msg}");
        }
        st.last_error = msg;
    }

    async fn call(&self, ctx: CallCtx, req: Request) -> FopResult {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let kind = req.fop.kind();
        let res = match tokio::time::timeout(self.cfg.frame_timeout, self.call_inner(ctx, req)).await {
            Ok(r) => r,
            Err(_) => {
                self.counters.frame_timeouts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(client = %self.name, fop = kind.name(), "no reply within frame-timeout {:?}", self.cfg.frame_timeout);
                Err(Errno::ENOTCONN)
            }
        };
        if res == Err(Errno::ENOTCONN) {
            self.counters.enotconn.fetch_add(1, Ordering::Relaxed);
        }
        res
    }

    async fn call_inner(&self, mut ctx: CallCtx, req: Request) -> FopResult {
        let _slot = self.slots.acquire().await.map_err(|_| Errno::ENOTCONN)?;
        let conn = self.current().ok_or(Errno::ENOTCONN)?;
        if !self.cfg.send_gids {
            ctx.groups = Arc::from(Vec::new());
        }
        match req.fop.kind() {
            FopKind::Release | FopKind::Releasedir => {
                let rec = req.fop.fd().and_then(|fd| self.fds.lock().remove(&fd.id));
                if rec.is_some_and(|r| r.bad || r.generation != conn.generation) {
                    // The server already let go of it with the old connection.
                    return Ok(Response::from(Reply::Empty));
                }
            }
            _ => {
                for fd in req.fop.fds() {
                    self.ensure_open(&conn, &ctx, fd).await?;
                }
            }
        }
        let open = match &req.fop {
            Fop::Open { loc, flags, fd } | Fop::Create { loc, flags, fd, .. } => Some((*fd, loc.gfid, *flags, false)),
            Fop::Opendir { loc, fd } => Some((*fd, loc.gfid, 0, true)),
            _ => None,
        };
        let locked = match &req.fop {
            Fop::Lk { fd, cmd, lock } if *cmd != LkCmd::GetLk && lock.ty != LockType::Unlock => Some(fd.id),
            _ => None,
        };
        let res = self.roundtrip(&conn, ctx, req).await;
        if let Ok(resp) = &res
            && (open.is_some() || locked.is_some())
        {
            let mut fds = self.fds.lock();
            if let Some((id, gfid, flags, dir)) = open {
                let gfid = match (&resp.reply, gfid.is_null()) {
                    (Reply::Entry { iatt, .. }, true) => iatt.gfid,
                    _ => gfid,
                };
                let rec = FdRec { gfid, flags, dir, generation: conn.generation, bad: false, locked: false };
                fds.insert(id, rec);
            }
            if let Some(r) = locked.and_then(|id| fds.get_mut(&id)) {
                r.locked = true;
            }
        }
        res
    }

    /// Reopens `fd` on `conn` if it was opened on an earlier connection.
    async fn ensure_open(&self, conn: &Arc<Conn>, ctx: &CallCtx, fd: Fd) -> Result<(), Errno> {
        let decided = |fds: &HashMap<FdId, FdRec>| match fds.get(&fd.id) {
            None => Some(Ok(())),
            Some(r) if r.bad => Some(Err(Errno::EBADF)),
            Some(r) if r.generation == conn.generation => Some(Ok(())),
            Some(_) => None,
        };
        if let Some(r) = decided(&self.fds.lock()) {
            return r;
        }
        let _one_at_a_time = self.reopen.lock().await;
        let rec = {
            let fds = self.fds.lock();
            if let Some(r) = decided(&fds) {
                return r;
            }
            match fds.get(&fd.id) {
                Some(r) => *r,
                None => return Ok(()),
            }
        };
        let gfid = if rec.gfid.is_null() { fd.gfid } else { rec.gfid };
        let fail = |why: String| {
            self.counters.reopen_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(client = %self.name, fd = fd.id.0, %gfid, "fd not reopened after reconnect: {why}; EBADF from now on");
            if let Some(r) = self.fds.lock().get_mut(&fd.id) {
                r.bad = true;
            }
            Err(Errno::EBADF)
        };
        if self.cfg.strict_locks && rec.locked {
            return fail("it held POSIX locks and strict-locks is on".into());
        }
        if gfid.is_null() {
            return fail("its gfid is not known".into());
        }
        let no_create = (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32;
        let fop = match rec.dir {
            true => Fop::Opendir { loc: Loc::gfid(gfid), fd: fd.id },
            false => Fop::Open { loc: Loc::gfid(gfid), flags: rec.flags & !no_create, fd: fd.id },
        };
        match self.roundtrip(conn, ctx.clone(), Request::new(fop)).await {
            Ok(_) => {
                self.counters.reopens.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(client = %self.name, fd = fd.id.0, %gfid, "fd reopened");
                if let Some(r) = self.fds.lock().get_mut(&fd.id) {
                    r.generation = conn.generation;
                    r.gfid = gfid;
                }
                Ok(())
            }
            Err(Errno::ENOTCONN) => Err(Errno::ENOTCONN),
            Err(e) => fail(format!("reopen failed with {e:?}")),
        }
    }

    /// Sends one call on `conn` and waits for its reply.
    async fn roundtrip(&self, conn: &Conn, ctx: CallCtx, req: Request) -> FopResult {
        if let Fop::Readv { size, .. } = &req.fop
            && (*size as usize).saturating_add(REPLY_OVERHEAD) > self.cfg.max_frame
        {
            tracing::warn!(client = %self.name, size, "read reply could not fit in max-frame-size {}: EINVAL", self.cfg.max_frame);
            return Err(Errno::EINVAL);
        }
        let reply_size = match &req.fop {
            Fop::Readv { size, .. } => *size as usize,
            _ => 0,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Message::Call { ctx, req }.to_frame(id).and_then(|f| f.check_size(self.cfg.max_frame).map(|()| f));
        let frame = frame.map_err(|e| {
            tracing::warn!(client = %self.name, "call not sent: {e}");
            Errno::EINVAL
        })?;
        // `keep` lives until the reply: the brick reads it from shared
        // memory until then.
        let Prepared { frame, keep, lent } = conn.prepare(frame, reply_size);
        if keep.is_some() {
            self.counters.shared_calls.fetch_add(1, Ordering::Relaxed);
        }
        let keep = Keep(keep);
        let (tx, rx) = oneshot::channel();
        let Some(inflight) = self.conn_pending_insert(conn, id, Waiter { tx, lent }) else {
            return Err(Errno::ENOTCONN);
        };
        let _guard = PendingGuard { conn, id };
        // Alone on the connection, the call writes itself to the socket (no
        // hand-off to the writer task); with others in flight it goes
        // through the writer task, which sends the calls made meanwhile
        // together, in one system call.
        let sent = if inflight == 1 {
            conn.link.send(frame.into()).await
        } else {
            conn.link.send_deferred(frame.into()).await
        };
        if !sent {
            return Err(Errno::ENOTCONN);
        }
        match rx.await {
            Ok(res) => {
                keep.release();
                res
            }
            Err(_) => Err(Errno::ENOTCONN),
        }
    }

    /// Registers a reply waiter; the calls then in flight (this one
    /// included), or None when the connection is closed.
    fn conn_pending_insert(&self, conn: &Conn, id: u64, w: Waiter) -> Option<usize> {
        let mut pending = conn.pending.lock();
        let map = pending.as_mut()?;
        map.insert(id, w);
        Some(map.len())
    }
}
