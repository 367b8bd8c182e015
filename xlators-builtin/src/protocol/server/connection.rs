//! One client connection (GlusterFS's server-handshake.c and the rpc
//! loop): accepting it, the HELLO handshake with its checks, the serve loop
//! that runs each CALL and sends its REPLY, and what a disconnect releases.

use std::os::fd::{AsRawFd, OwnedFd};

use bytes::Bytes;

use super::*;

/// A socket the server listens on: TCP, or the local transport's abstract
/// Unix socket.
pub(super) enum Listener {
    Tcp(std::net::TcpListener),
    Local(std::os::unix::net::UnixListener),
}

/// The tokio side of a [`Listener`].
enum Accepting {
    Tcp(TcpListener),
    Local(tokio::net::UnixListener),
}

/// A connection just accepted.
enum Accepted {
    Tcp(TcpStream, SocketAddr),
    Local(tokio::net::UnixStream),
}

impl Accepting {
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Accepting::Tcp(l) => l.accept().await.map(|(s, peer)| Accepted::Tcp(s, peer)),
            Accepting::Local(l) => l.accept().await.map(|(s, _)| Accepted::Local(s)),
        }
    }
}

/// Accepts connections until the server stops; past twice `max-clients`
/// open connections a new one is closed at once.
pub(super) async fn accept_loop(sh: Arc<Shared>, listener: Listener, _guard: TaskGuard) {
    let (listener, kind) = match listener {
        Listener::Tcp(l) => (TcpListener::from_std(l).map(Accepting::Tcp), "TCP"),
        Listener::Local(l) => (tokio::net::UnixListener::from_std(l).map(Accepting::Local), "local"),
    };
    let listener = match listener {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(server = %sh.name, error = %e, "cannot accept {kind} connections");
            return;
        }
    };
    let mut stop = sh.stop.subscribe();
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok(conn) => {
                sh.counters.accepted.fetch_add(1, Ordering::Relaxed);
                let open = sh.open.fetch_add(1, Ordering::AcqRel) + 1;
                let guard = OpenGuard(sh.clone());
                if open > sh.cfg.max_clients.saturating_mul(2) {
                    let peer = match &conn {
                        Accepted::Tcp(_, peer) => peer.to_string(),
                        Accepted::Local(s) => s
                            .peer_cred()
                            .ok()
                            .and_then(|c| c.pid())
                            .map_or("local".into(), |p| format!("local pid {p}")),
                    };
                    tracing::warn!(server = %sh.name, %peer, open, "too many connections: closed at once");
                    continue;
                }
                let task = TaskGuard::new(&sh);
                match conn {
                    Accepted::Tcp(stream, peer) => tokio::spawn(connection(sh.clone(), stream, peer, guard, task)),
                    Accepted::Local(stream) => tokio::spawn(local_connection(sh.clone(), stream, guard, task)),
                };
            }
            Err(e) => {
                tracing::warn!(server = %sh.name, error = %e, "{kind} accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    tracing::debug!(server = %sh.name, "no longer accepting {kind} connections");
}

/// Counts an accepted connection while it lives.
pub(super) struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits for a writer to send what is queued (bounded), else stops it.
pub(super) async fn finish_writer(writer: JoinHandle<std::io::Result<()>>) {
    let abort = writer.abort_handle();
    if tokio::time::timeout(FLUSH_TIMEOUT, writer).await.is_err() {
        abort.abort();
    }
}

/// How a connection reached the server, and what its peer brought.
pub(super) struct Wire {
    pub(super) rd: WireRead,
    pub(super) wr: WireWrite,
    pub(super) peer: SocketAddr,
    /// The TLS peer's certificate common name.
    pub(super) cn: Option<String>,
    /// Over the local transport: the client's regions, if it sent them and
    /// they mapped (`None` inside: local without shared memory).
    pub(super) local: Option<Option<PeerShm>>,
}

/// A TCP connection: socket options, TLS when configured, then served.
pub(super) async fn connection(sh: Arc<Shared>, stream: TcpStream, peer: SocketAddr, open: OpenGuard, task: TaskGuard) {
    if let Err(e) = sh.cfg.sock.apply(socket2::SockRef::from(&stream)) {
        tracing::debug!(%peer, error = %e, "socket options not applied");
    }
    let (rd, wr, cn) = match &sh.cfg.tls {
        None => {
            let (rd, wr) = rpc::plain(stream);
            (rd, wr, None)
        }
        Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, TlsStream::accept(stream, tls.clone())).await {
            Ok(Ok(halves)) => halves,
            Ok(Err(e)) => {
                sh.counters.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(server = %sh.name, %peer, "closing connection before the handshake: {e}");
                return;
            }
            Err(_) => {
                sh.counters.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(server = %sh.name, %peer, "no TLS handshake within {HANDSHAKE_TIMEOUT:?}: closed");
                return;
            }
        },
    };
    serve_connection(sh, Wire { rd, wr, peer, cn, local: None }, open, task).await;
}

/// A local-transport connection: its preface (one byte, with the client's
/// two region memfds or none), the regions mapped, then served.
pub(super) async fn local_connection(
    sh: Arc<Shared>,
    stream: tokio::net::UnixStream,
    open: OpenGuard,
    task: TaskGuard,
) {
    let pid = stream.peer_cred().ok().and_then(|c| c.pid()).unwrap_or(0);
    let peer = SocketAddr::from(([127, 0, 0, 1], 0));
    let preface = async {
        loop {
            stream.readable().await?;
            match stream.try_io(tokio::io::Interest::READABLE, || rpc::shm::recv_fds(stream.as_raw_fd(), 2)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    };
    let (tag, fds) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, preface).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            sh.counters.closed_bad_input.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(server = %sh.name, pid, "local connection closed before its handshake: {e}");
            return;
        }
        Err(_) => {
            tracing::warn!(server = %sh.name, pid, "no local preface within {HANDSHAKE_TIMEOUT:?}: closed");
            return;
        }
    };
    let shm = match (tag, <[OwnedFd; 2]>::try_from(fds)) {
        (rpc::local_preface::SHARED, Ok([send, recv])) => {
            match (rpc::shm::Mapping::from_peer(send, false), rpc::shm::Mapping::from_peer(recv, true)) {
                (Ok(send), Ok(recv)) => Some(PeerShm { send, recv }),
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(server = %sh.name, pid, "{e}: payloads of this local client go through the socket");
                    None
                }
            }
        }
        (rpc::local_preface::PLAIN, Ok(_)) | (rpc::local_preface::PLAIN, Err(_)) => None,
        (tag, _) => {
            sh.counters.closed_bad_input.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(server = %sh.name, pid, tag, "bad local preface: closed");
            return;
        }
    };
    let (rd, wr) = match rpc::unix(stream) {
        Ok(halves) => halves,
        Err(e) => {
            tracing::warn!(server = %sh.name, pid, "local connection not served: {e}");
            return;
        }
    };
    serve_connection(sh, Wire { rd, wr, peer, cn: None, local: Some(shm) }, open, task).await;
}

/// Handshakes and serves a connection until it ends, then releases what
/// its client held.
pub(super) async fn serve_connection(sh: Arc<Shared>, wire: Wire, _open: OpenGuard, _task: TaskGuard) {
    let Wire { rd, wr, peer, cn, local } = wire;
    let (link, writer) = Link::spawn(wr);
    let mut reader = FrameReader::new(rd, HANDSHAKE_MAX_FRAME);
    let conn = match handshake(&sh, &mut reader, &link, peer, cn.as_deref(), local).await {
        Ok(conn) => conn,
        Err(()) => {
            link.close();
            drop(link);
            finish_writer(writer).await;
            return;
        }
    };
    let peer = conn.peer;
    reader.set_max_frame(sh.cfg.max_frame);
    let (why, graceful) = serve(&sh, &conn, &mut reader).await;
    drop(reader);
    if graceful {
        tracing::info!(client = %conn.client_id, %peer, "closing: {why}");
        if !conn.drained(DRAIN_TIMEOUT).await {
            tracing::warn!(client = %conn.client_id, "calls still running after {DRAIN_TIMEOUT:?}: cancelled");
        }
        conn.cancel.send_replace(Cancel::All);
        if let Ok(f) = Message::Goodbye(why.clone()).to_frame(0) {
            conn.send(f.into()).await;
        }
        conn.link.close();
        finish_writer(writer).await;
    } else {
        tracing::info!(client = %conn.client_id, %peer, "disconnected: {why}");
        writer.abort();
        conn.link.abort();
        conn.cancel.send_replace(Cancel::Locks);
        if !conn.drained(DRAIN_TIMEOUT).await {
            tracing::warn!(client = %conn.client_id, "calls still running after {DRAIN_TIMEOUT:?}: cancelled");
        }
        conn.cancel.send_replace(Cancel::All);
    }
    client_gone(&sh, &conn).await;
}

/// Releases what a gone client held: its fds, then (through the graph) its
/// locks and anything else kept per client.
pub(super) async fn client_gone(sh: &Shared, conn: &Arc<Conn>) {
    sh.conns.lock().remove(&conn.client_id);
    let slots = conn.fds.lock().drain();
    let n = slots.len();
    for s in slots {
        let fd = Fd { id: s.brick, gfid: s.gfid };
        let fop = if s.dir { Fop::Releasedir { fd } } else { Fop::Release { fd } };
        let _ = conn.child.call(CallCtx::root(conn.client_id.clone()), Request::new(fop)).await;
    }
    sh.events.broadcast(Event::ClientGone { client_id: conn.client_id.to_string() });
    tracing::debug!(client = %conn.client_id, fds = n, "client gone: fds released, ClientGone sent");
}

/// Refuses a client: says why in a HELLO_REPLY and logs it (the caller
/// closes the link, so the connection ends once it is written).
pub(super) async fn refuse(sh: &Shared, tx: &Link, id: u64, peer: SocketAddr, reason: String) {
    sh.counters.refused.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(server = %sh.name, %peer, "client refused: {reason}");
    if let Ok(f) = Message::HelloReply(HelloReply::refuse(reason)).to_frame(id) {
        tx.send(f.into()).await;
    }
}

/// Reads and checks the HELLO; on success the connection is registered and
/// told its client id.
pub(super) async fn handshake(
    sh: &Arc<Shared>,
    reader: &mut FrameReader<WireRead>,
    tx: &Link,
    peer: SocketAddr,
    cn: Option<&str>,
    local: Option<Option<PeerShm>>,
) -> Result<Arc<Conn>, ()> {
    let frame = match tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.next()).await {
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => {
            tracing::debug!(%peer, "closed before its HELLO");
            return Err(());
        }
        Ok(Err(e)) => {
            sh.counters.closed_bad_input.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(server = %sh.name, %peer, "closing connection before the handshake: {e}");
            return Err(());
        }
        Err(_) => {
            tracing::warn!(server = %sh.name, %peer, "no HELLO within {HANDSHAKE_TIMEOUT:?}: closed");
            return Err(());
        }
    };
    let id = frame.id;
    let mut peer = peer;
    let checked = match frame.kind {
        _ if frame.flags != 0 => Err(format!("HELLO with frame flags {:#04x}", frame.flags)),
        FrameKind::Hello => Message::from_frame(frame, &limits_for(HANDSHAKE_MAX_FRAME))
            .map_err(|e| format!("malformed HELLO: {e}"))
            .and_then(|m| match m {
                Message::Hello(h) => {
                    if local.is_some() {
                        peer = local_peer(&h.params)?;
                    }
                    check_hello(sh, &h.params, h.version, peer, cn)
                }
                _ => Err("malformed HELLO".into()),
            }),
        other => Err(format!("expected HELLO as the first frame, got {other}")),
    };
    let (child, assigned) = match checked {
        Ok(ok) => ok,
        Err(reason) => {
            refuse(sh, tx, id, peer, reason).await;
            return Err(());
        }
    };
    let (cancel, _) = watch::channel(Cancel::None);
    let transport = match (&local, &sh.cfg.tls) {
        (Some(Some(_)), _) => "unix+shm",
        (Some(None), _) => "unix",
        (None, Some(_)) => "tls",
        (None, None) => "tcp",
    };
    let shm = local.flatten();
    let shared = shm.is_some();
    let conn = Arc::new(Conn {
        client_id: assigned.clone(),
        peer,
        shm,
        transport,
        child,
        link: tx.clone(),
        fds: Mutex::new(FdTable::new(sh.cfg.max_fds)),
        inflight: Arc::new(Semaphore::new(sh.cfg.max_inflight)),
        budget: Arc::new(Semaphore::new(sh.cfg.max_inflight_kib as usize)),
        running: AtomicUsize::new(0),
        idle: tokio::sync::Notify::new(),
        cancel,
    });
    let full = {
        let mut conns = sh.conns.lock();
        let full = conns.len() >= sh.cfg.max_clients;
        if !full {
            conns.insert(assigned.clone(), conn.clone());
        }
        full
    };
    if full {
        let reason = format!("too many clients: max-clients is {}", sh.cfg.max_clients);
        refuse(sh, tx, id, peer, reason).await;
        return Err(());
    }
    let mut info = Dict::new();
    info.set_str(hello_keys::ASSIGNED_CLIENT_ID, assigned.to_string());
    if shared {
        info.set_u64(hello_keys::SHARED_MEMORY, 1);
    }
    let reply = HelloReply { version: AbiVersion::CURRENT, accepted: true, reason: String::new(), info };
    if let Ok(f) = Message::HelloReply(reply).to_frame(id) {
        tx.send(f.into()).await;
    }
    tracing::info!(server = %sh.name, %peer, client = %assigned, subvolume = %conn.child.name, transport, "client connected");
    Ok(conn)
}

/// A local client's address for `auth.addr`: the brick address it dialed
/// ([`hello_keys::LOCAL_ADDR`]), which must be one of this host's (any
/// local process may connect over TCP from any of them), else 127.0.0.1.
pub(super) fn local_peer(p: &Dict) -> Result<SocketAddr, String> {
    let Some(addr) = p.get_str(hello_keys::LOCAL_ADDR) else {
        return Ok(SocketAddr::from(([127, 0, 0, 1], 0)));
    };
    let ip: std::net::IpAddr = addr.parse().map_err(|_| format!("local-addr '{addr}' is not an IP address"))?;
    if !rpc::is_local_ip(ip) {
        return Err(format!("local-addr {ip} is not an address of this host"));
    }
    Ok(SocketAddr::new(ip, 0))
}

/// The subvolume and the connection's client id, or why the client is
/// refused.
pub(super) fn check_hello(
    sh: &Shared,
    p: &Dict,
    version: AbiVersion,
    peer: SocketAddr,
    cn: Option<&str>,
) -> Result<(Child, Arc<str>), String> {
    abi::check_compatible(AbiVersion::CURRENT, version).map_err(|e| e.to_string())?;
    if *sh.stop.borrow() {
        return Err("the server is shutting down".into());
    }
    let volume = p.get_str(hello_keys::VOLUME).filter(|v| !v.is_empty()).ok_or("the HELLO names no volume")?;
    let child = sh.children.iter().find(|c| &*c.name == volume).ok_or_else(|| {
        let names: Vec<&str> = sh.children.iter().map(|c| &*c.name).collect();
        format!("no subvolume '{volume}' on this server (it serves: {})", names.join(", "))
    })?;
    let client_id = p.get_str(hello_keys::CLIENT_ID).unwrap_or_default();
    if client_id.is_empty() || client_id.len() > MAX_CLIENT_ID {
        return Err(format!("the HELLO needs a client-id of 1 to {MAX_CLIENT_ID} bytes"));
    }
    let ip = peer.ip().to_string();
    sh.cfg.auth.check(volume, &ip, p.get_str(hello_keys::USERNAME), p.get_str(hello_keys::PASSWORD))?;
    if sh.cfg.tls.is_some() {
        sh.cfg.auth.check_cn(cn)?;
    }
    let seq = sh.next_conn.fetch_add(1, Ordering::Relaxed);
    Ok((child.clone(), Arc::from(format!("{client_id}#{seq}"))))
}

/// Reads and runs calls until the connection ends; returns why, and
/// whether it is the server stopping (graceful) rather than the client
/// going or misbehaving.
pub(super) async fn serve(sh: &Arc<Shared>, conn: &Arc<Conn>, reader: &mut FrameReader<WireRead>) -> (String, bool) {
    let mut stop = sh.stop.subscribe();
    let limits = limits_for(sh.cfg.max_frame);
    let stopping = || ("the server is shutting down".to_string(), true);
    // While more frames are already buffered, the socket is corked so the
    // replies of calls answered at once go out together (one system call
    // for up to CORK_FRAMES of them). The cork is never held across a
    // wait: only reading a buffered frame happens under it.
    let mut cork: Option<rpc::Cork<'_>> = None;
    let mut corked = 0;
    loop {
        let permit = match conn.inflight.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(TryAcquireError::Closed) => return ("in-flight slots closed".into(), false),
            Err(TryAcquireError::NoPermits) => {
                // Slots come back as replies are written.
                cork = None;
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return stopping(),
                    p = conn.inflight.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return ("in-flight slots closed".into(), false),
                    },
                }
            }
        };
        if corked >= CORK_FRAMES || !reader.has_frame() {
            cork = None;
            corked = 0;
        }
        let frame = tokio::select! {
            _ = stop.wait_for(|s| *s) => return stopping(),
            f = reader.next() => f,
        };
        let bad = |e: &dyn std::fmt::Display| {
            sh.counters.closed_bad_input.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(server = %sh.name, client = %conn.client_id, peer = %conn.peer, "closing connection: {e}");
            (e.to_string(), false)
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => return ("the client closed the connection".into(), false),
            Err(rpc::RpcError::Io(e)) => return (format!("socket error: {e}"), false),
            Err(e) => return bad(&e),
        };
        let id = frame.id;
        let frame_bytes = frame.header.len() + frame.payload.len();
        let (frame, reply_at) = match resolve_shared(conn, frame) {
            Ok(f) => f,
            Err(e) => return bad(&e),
        };
        match frame.kind {
            FrameKind::Call => match Message::from_frame(frame, &limits) {
                Ok(Message::Call { ctx, req }) => {
                    sh.counters.calls.fetch_add(1, Ordering::Relaxed);
                    let cost = call_cost_kib(frame_bytes, &req.fop, sh.cfg.max_inflight_kib);
                    let bytes = match conn.budget.clone().try_acquire_many_owned(cost) {
                        Ok(b) => b,
                        Err(TryAcquireError::Closed) => return ("in-flight budget closed".into(), false),
                        Err(TryAcquireError::NoPermits) => {
                            // Bytes come back as replies are written.
                            cork = None;
                            tokio::select! {
                                _ = stop.wait_for(|s| *s) => return stopping(),
                                b = conn.budget.clone().acquire_many_owned(cost) => match b {
                                    Ok(b) => b,
                                    Err(_) => return ("in-flight budget closed".into(), false),
                                },
                            }
                        }
                    };
                    let held = Held { slot: Some(permit), bytes: Some(bytes) };
                    let call = run_call(sh.clone(), Running::new(conn), id, ctx, req, held, reply_at);
                    // Most fops (a stat, a write into the page cache) finish
                    // on their first poll: run them here and write the reply
                    // from this task, without a spawn and a wake-up. One that
                    // would wait (a blocked lock, the blocking pool) goes on
                    // in a task of its own once woken, so the reader never
                    // waits for it.
                    if crate::task::run_here(&sh.rt, call) {
                        sh.counters.calls_spawned.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(MessageError { source: DecodeError::UnknownFop(code), .. }) => {
                    tracing::debug!(client = %conn.client_id, code, "unknown fop code: ENOSYS");
                    cork = None;
                    send_reply(sh, conn, id, Err(Errno::ENOSYS), Held::slot(permit), None).await;
                }
                Ok(_) => return bad(&"CALL frame did not decode as a call"),
                Err(e) => return bad(&e),
            },
            FrameKind::Ping => {
                if let Ok(f) = Message::Pong.to_frame(id) {
                    cork = None;
                    conn.send(f.into()).await;
                }
            }
            FrameKind::Pong => {}
            FrameKind::Goodbye => {
                let why = match Message::from_frame(frame, &limits) {
                    Ok(Message::Goodbye(reason)) => format!("the client said goodbye: {reason}"),
                    _ => "the client said goodbye".to_string(),
                };
                return (why, false);
            }
            other => return bad(&format!("unexpected {other} frame from a client")),
        }
        if cork.is_none() && reader.has_frame() {
            cork = conn.link.cork();
        }
        corked += usize::from(cork.is_some());
    }
}

/// A CALL whose payload lies in the client's send region gets it from
/// there (no copy), and the chunk it lends for its reply is checked; any
/// other frame must carry no shared-memory flags.
pub(super) fn resolve_shared(
    conn: &Conn,
    mut frame: rpc::Frame,
) -> Result<(rpc::Frame, Option<Descriptor>), rpc::FrameError> {
    if frame.flags == 0 {
        return Ok((frame, None));
    }
    let refuse = |why| rpc::FrameError::Shared { flags: frame.flags, payload: frame.payload.len(), why };
    let Some(shm) = conn.shm.as_ref() else {
        return Err(refuse("no shared regions were set up on this connection"));
    };
    if frame.kind != FrameKind::Call {
        return Err(refuse("only a CALL may name shared memory"));
    }
    let (data, reply_at) = frame.descriptors()?;
    if let Some(at) = reply_at
        && at.offset.checked_add(at.len).is_none_or(|end| end > shm.recv.size())
    {
        return Err(refuse("the reply chunk lies outside the receive region"));
    }
    frame.payload = match data {
        Some(d) => shm.send.bytes(d.offset, d.len).map_err(|_| refuse("the payload lies outside the send region"))?,
        None => Bytes::new(),
    };
    frame.flags = 0;
    Ok((frame, reply_at))
}

/// The part of a connection's byte budget a call holds until its reply is
/// written, in KiB: its frame and the data its reply may carry (a read's or
/// readdir's size). At most the whole budget, so a larger call still runs,
/// alone.
pub(super) fn call_cost_kib(frame_bytes: usize, fop: &Fop, budget_kib: u32) -> u32 {
    let reply = match fop {
        Fop::Readv { size, .. } | Fop::Readdir { size, .. } | Fop::Readdirp { size, .. } => *size as usize,
        _ => 0,
    };
    u32::try_from(frame_bytes.saturating_add(reply).div_ceil(1024)).unwrap_or(u32::MAX).clamp(1, budget_kib)
}

pub(super) fn is_lock_fop(kind: FopKind) -> bool {
    use FopKind::*;
    matches!(kind, Lk | Inodelk | Finodelk | Entrylk | Fentrylk | Lease)
}

/// Runs one call and queues its reply (unless the connection is closing
/// and the call is cancelled).
pub(super) async fn run_call(
    sh: Arc<Shared>,
    running: Running,
    id: u64,
    mut ctx: CallCtx,
    req: Request,
    held: Held,
    reply_at: Option<Descriptor>,
) {
    let conn = running.0.clone();
    ctx.client_id = conn.client_id.clone();
    // The chunk the client lent for the reply is lent on to the graph, so
    // storage/posix reads straight into it.
    if let (Some(at), Some(shm)) = (reply_at, &conn.shm)
        && let Ok(mem) = shm.recv.lend(at.offset, at.len)
    {
        ctx.lent = xlfs_sdk::ctx::Lent::new(mem);
    }
    let level = if is_lock_fop(req.fop.kind()) { Cancel::Locks } else { Cancel::All };
    if matches!(&req.fop, Fop::Getxattr { name, .. } if name == STATEDUMP_KEY) {
        let res = statedump_reply(&sh);
        send_reply(&sh, &conn, id, res, held, None).await;
        return;
    }
    if let Some(reset) = profile_request(&req.fop) {
        let res = profile_reply(&sh, reset);
        send_reply(&sh, &conn, id, res, held, None).await;
        return;
    }
    let mut cancel = conn.cancel.subscribe();
    let res = tokio::select! {
        r = conn.dispatch(&sh.next_fd, ctx, req) => r,
        _ = cancel.wait_for(|c| *c >= level) => return,
    };
    send_reply(&sh, &conn, id, res, held, reply_at).await;
    drop(running);
}

/// `Some(reset)` for a brick profile request: a getxattr of
/// [`PROFILE_KEY`] or [`PROFILE_RESET_KEY`] (on any inode), which the
/// server answers itself, so it is not counted in the timings it reports.
pub(super) fn profile_request(fop: &Fop) -> Option<bool> {
    match fop {
        Fop::Getxattr { name, .. } if name == PROFILE_KEY => Some(false),
        Fop::Getxattr { name, .. } if name == PROFILE_RESET_KEY => Some(true),
        _ => None,
    }
}

/// The brick graph's fop timings as the value of the requested key.
pub(super) fn profile_reply(sh: &Shared, reset: bool) -> FopResult {
    let profile = sh.events.graph_profile(reset).ok_or(Errno::ENODATA)?;
    tracing::debug!(server = %sh.name, reset, "profile requested");
    let key = if reset { PROFILE_RESET_KEY } else { PROFILE_KEY };
    let mut d = Dict::new();
    d.set_bytes(key, profile.to_text().into_bytes());
    Ok(Response { reply: Reply::Xattrs(d), xdata: Dict::new() })
}

/// The brick graph's statedump as the value of [`STATEDUMP_KEY`].
pub(super) fn statedump_reply(sh: &Shared) -> FopResult {
    let dump = sh.events.graph_dump().ok_or(Errno::ENODATA)?;
    tracing::debug!(server = %sh.name, "statedump requested");
    let text: String = dump.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
    let mut d = Dict::new();
    d.set_bytes(STATEDUMP_KEY, text.into_bytes());
    Ok(Response { reply: Reply::Xattrs(d), xdata: Dict::new() })
}

/// Sends a call's reply; data that fits the chunk the call lent
/// (`reply_at`) is put there and the REPLY names it instead of carrying it.
pub(super) async fn send_reply(
    sh: &Shared,
    conn: &Conn,
    id: u64,
    res: FopResult,
    held: Held,
    reply_at: Option<Descriptor>,
) {
    let frame = Message::Reply(res).to_frame(id).and_then(|f| f.check_size(sh.cfg.max_frame).map(|()| f));
    let frame = match frame {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(client = %conn.client_id, id, "reply not sent ({e}): EINVAL instead");
            match Message::Reply(Err(Errno::EINVAL)).to_frame(id) {
                Ok(f) => f,
                Err(_) => return,
            }
        }
    };
    let frame = match (reply_at, &conn.shm) {
        (Some(at), Some(shm)) if !frame.payload().is_empty() && frame.payload().len() as u64 <= at.len => {
            let len = frame.payload().len() as u64;
            // Read into the lent chunk already (posix), or copied there.
            let there = shm.recv.locate(frame.payload()) == Some(at.offset);
            let counter = if there { &sh.counters.shared_replies_direct } else { &sh.counters.shared_replies_copied };
            if there || shm.recv.write(at.offset, frame.payload()).is_ok() {
                counter.fetch_add(1, Ordering::Relaxed);
                frame.with_descriptors(Some(Descriptor { offset: at.offset, len }), None)
            } else {
                frame
            }
        }
        _ => frame,
    };
    conn.send(Outgoing { frame, guard: held }).await;
}
