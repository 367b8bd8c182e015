//! The connection to the brick (GlusterFS's client-handshake.c): connect
//! and handshake, the reader that routes each frame to its waiting call or
//! as an event, and the loop that reconnects with backoff and pings.

use std::os::fd::AsRawFd;

use super::*;

impl Inner {
    /// Connects and does the handshake.
    pub(super) async fn connect(
        &self,
        generation: u64,
    ) -> Result<(Arc<Conn>, FrameReader<WireRead>, JoinHandle<std::io::Result<()>>), (String, bool)> {
        let cfg = &self.cfg;
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let plain = |e: String| (e, false);
        let local = self.connect_local().await;
        let (rd, wr, local) = match local {
            Some((stream, shm, ip)) => {
                let (rd, wr) = rpc::unix(stream).map_err(|e| plain(format!("local socket of {addr}: {e}")))?;
                (rd, wr, Some((shm, ip)))
            }
            None => {
                let (rd, wr) = self.connect_tcp(&addr).await?;
                (rd, wr, None)
            }
        };
        let (link, writer) = Link::spawn(wr);
        let mut reader = FrameReader::new(rd, HANDSHAKE_MAX_FRAME);
        let mut params = Dict::new();
        params.set_str(hello_keys::VOLUME, cfg.subvolume.clone());
        params.set_str(hello_keys::CLIENT_ID, self.client_id.clone());
        if let Some(u) = &cfg.username {
            params.set_str(hello_keys::USERNAME, u.clone());
        }
        if let Some(p) = &cfg.password {
            params.set_str(hello_keys::PASSWORD, p.clone());
        }
        if let Some((_, ip)) = &local {
            params.set_str(hello_keys::LOCAL_ADDR, ip.to_string());
        }
        let hello = Message::Hello(Hello { version: AbiVersion::CURRENT, params })
            .to_frame(0)
            .map_err(|e| plain(e.to_string()))?;
        let wait = if cfg.ping_timeout.is_zero() { HANDSHAKE_TIMEOUT } else { HANDSHAKE_TIMEOUT.min(cfg.ping_timeout) };
        let answer = async {
            if !link.send(hello.into()).await {
                return Err(format!("connection to {addr} closed during the handshake"));
            }
            match tokio::time::timeout(wait, reader.next()).await {
                Ok(Ok(Some(f))) => Ok(f),
                Ok(Ok(None)) => Err(format!("{addr} closed the connection during the handshake")),
                Ok(Err(e)) => Err(format!("handshake with {addr}: {e}")),
                Err(_) => Err(format!("no handshake answer from {addr} within {wait:?}")),
            }
        };
        let frame = match answer.await {
            Ok(f) => f,
            Err(e) => {
                link.abort();
                writer.abort();
                return Err(plain(e));
            }
        };
        let reply = match Message::from_frame(frame, &limits_for(HANDSHAKE_MAX_FRAME)) {
            Ok(Message::HelloReply(r)) => r,
            Ok(Message::Goodbye(reason)) => Err((format!("{addr} said goodbye during the handshake: {reason}"), true))?,
            Ok(m) => Err((format!("handshake with {addr}: unexpected {} frame", m.kind()), true))?,
            Err(e) => Err((format!("handshake with {addr}: {e}"), true))?,
        };
        if reply.version.major != abi::ABI_MAJOR {
            link.abort();
            writer.abort();
            return Err((format!("{addr} speaks ABI {}, this client {}", reply.version, AbiVersion::CURRENT), true));
        }
        if !reply.accepted {
            link.abort();
            writer.abort();
            return Err((format!("{addr} refused the connection to '{}': {}", cfg.subvolume, reply.reason), true));
        }
        reader.set_max_frame(cfg.max_frame);
        let assigned = reply.info.get_str(hello_keys::ASSIGNED_CLIENT_ID).unwrap_or_default().to_string();
        let shared = reply.info.get_u64(hello_keys::SHARED_MEMORY) == Some(1);
        let (shm, transport) = match local {
            Some((Some(shm), _)) if shared => (Some(shm), "unix+shm"),
            Some(_) => (None, "unix"),
            None if cfg.tls.is_some() => (None, "tls"),
            None => (None, "tcp"),
        };
        let conn = Arc::new(Conn { generation, link, pending: Mutex::new(Some(HashMap::new())), shm, transport });
        let mut st = self.status.lock();
        st.assigned_id = assigned;
        st.generation = generation;
        Ok((conn, reader, writer))
    }

    /// A TCP connection to the brick, under TLS when configured.
    async fn connect_tcp(&self, addr: &str) -> Result<(WireRead, rpc::WireWrite), (String, bool)> {
        let cfg = &self.cfg;
        let plain = |e: String| (e, false);
        let stream =
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect((cfg.host.as_str(), cfg.port))).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(plain(format!("cannot connect to {addr}: {e}"))),
                Err(_) => {
                    return Err(plain(format!("cannot connect to {addr}: no answer within {HANDSHAKE_TIMEOUT:?}")));
                }
            };
        if let Err(e) = cfg.sock.apply(socket2::SockRef::from(&stream)) {
            tracing::debug!(client = %self.name, error = %e, "socket options not applied");
        }
        match &cfg.tls {
            None => Ok(rpc::plain(stream)),
            Some(tls) => {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, TlsStream::connect(stream, tls.clone(), &cfg.host)).await
                {
                    Ok(Ok(halves)) => Ok(halves),
                    Ok(Err(e)) => Err((format!("{addr}: {e}"), true)),
                    Err(_) => Err((format!("{addr}: no TLS handshake within {HANDSHAKE_TIMEOUT:?}"), true)),
                }
            }
        }
    }

    /// The local transport, when the brick is on this host and offers it
    /// (`transport.local`, never with TLS): the Unix socket, its preface
    /// sent (the shared regions, unless `transport.local.shm-size` is 0 or
    /// they cannot be made), and the brick address dialed. None: use TCP.
    async fn connect_local(&self) -> Option<(tokio::net::UnixStream, Option<Shm>, std::net::IpAddr)> {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
        let cfg = &self.cfg;
        if !cfg.local || cfg.tls.is_some() {
            return None;
        }
        let ip = tokio::net::lookup_host((cfg.host.as_str(), cfg.port)).await.ok()?.find(|a| a.is_ipv4())?.ip();
        if !rpc::is_local_ip(ip) {
            return None;
        }
        let any = std::net::SocketAddr::from(([0, 0, 0, 0], cfg.port));
        let stream = [std::net::SocketAddr::new(ip, cfg.port), any].into_iter().find_map(|a| {
            let name = rpc::local_socket_name(a);
            UnixAddr::from_abstract_name(name.as_bytes()).and_then(|n| UnixStream::connect_addr(&n)).ok()
        })?;
        let shm = match cfg.shm_size {
            0 => None,
            size => shm::send_region(size).and_then(|send| match Region::create("xlfs-recv", (size / 4).max(1 << 20)) {
                Ok(recv) => Some(Shm { send, recv }),
                Err(e) => {
                    tracing::warn!(client = %self.name, error = %e, "no receive region: read data comes through the socket");
                    None
                }
            }),
        };
        let sent = match &shm {
            Some(s) => {
                shm::send_fds(stream.as_raw_fd(), rpc::local_preface::SHARED, &[s.send.raw_fd(), s.recv.raw_fd()])
            }
            None => shm::send_fds(stream.as_raw_fd(), rpc::local_preface::PLAIN, &[]),
        };
        let ready =
            sent.and_then(|()| stream.set_nonblocking(true)).and_then(|()| tokio::net::UnixStream::from_std(stream));
        match ready {
            Ok(s) => Some((s, shm, ip)),
            Err(e) => {
                tracing::debug!(client = %self.name, error = %e, "local transport failed: TCP instead");
                None
            }
        }
    }

    /// Serves a connection until it ends; returns why.
    pub(super) async fn run_connection(
        &self,
        conn: &Conn,
        reader: &mut FrameReader<WireRead>,
        run: &mut watch::Receiver<bool>,
    ) -> Result<String, String> {
        let ping = self.cfg.ping_timeout;
        let every = if ping.is_zero() {
            Duration::from_secs(3600)
        } else {
            (ping / 3).clamp(Duration::from_millis(10), MAX_PING_INTERVAL)
        };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_rx = Instant::now();
        let limits = limits_for(self.cfg.max_frame);
        loop {
            tokio::select! {
                _ = run.wait_for(|r| !*r) => return Ok("the client is stopping".into()),
                _ = tick.tick() => {
                    if ping.is_zero() {
                        continue;
                    }
                    if last_rx.elapsed() > ping {
                        self.counters.ping_timeouts.fetch_add(1, Ordering::Relaxed);
                        return Err(format!("{}:{} sent nothing within ping-timeout {ping:?}: declared down", self.cfg.host, self.cfg.port));
                    }
                    if let Ok(f) = Message::Ping.to_frame(0) {
                        conn.try_send(f.into());
                    }
                }
                f = reader.next() => match f {
                    Ok(Some(frame)) => {
                        last_rx = Instant::now();
                        self.on_frame(conn, frame, &limits)?;
                    }
                    Ok(None) => return Err(format!("{}:{} closed the connection", self.cfg.host, self.cfg.port)),
                    Err(e) => return Err(format!("connection to {}:{}: {e}", self.cfg.host, self.cfg.port)),
                },
            }
        }
    }

    pub(super) fn on_frame(&self, conn: &Conn, frame: Frame, limits: &xlfs_sdk::abi::Limits) -> Result<(), String> {
        let id = frame.id;
        match frame.kind {
            FrameKind::Reply => {
                let mut waiter = conn.pending.lock().as_mut().and_then(|m| m.remove(&id));
                let mut frame = frame;
                let lent = waiter.as_mut().and_then(|w| w.lent.take());
                if frame.flags != 0 {
                    self.counters.shared_replies.fetch_add(1, Ordering::Relaxed);
                    frame = shared_reply(frame, lent)
                        .map_err(|e| format!("{}:{} sent a bad shared reply: {e}", self.cfg.host, self.cfg.port))?;
                }
                let res = match Message::from_frame(frame, limits) {
                    Ok(Message::Reply(r)) => r,
                    Ok(_) | Err(_) => {
                        tracing::warn!(client = %self.name, id, "undecodable reply: EIO for that call");
                        Err(Errno::EIO)
                    }
                };
                match waiter {
                    Some(w) => {
                        let _ = w.tx.send(res);
                    }
                    None => tracing::debug!(client = %self.name, id, "reply for no waiting call"),
                }
            }
            FrameKind::Pong => {}
            FrameKind::Ping => {
                if let Ok(f) = Message::Pong.to_frame(id) {
                    conn.try_send(f.into());
                }
            }
            FrameKind::Upcall => match Message::from_frame(frame, limits) {
                Ok(Message::Upcall(Event::Upcall(u))) => {
                    self.counters.upcalls.fetch_add(1, Ordering::Relaxed);
                    self.events.send(Event::Upcall(u));
                }
                other => tracing::debug!(client = %self.name, ?other, "upcall frame ignored"),
            },
            FrameKind::Goodbye => {
                let reason = match Message::from_frame(frame, limits) {
                    Ok(Message::Goodbye(r)) => r,
                    _ => String::new(),
                };
                return Err(format!("{}:{} said goodbye: {reason}", self.cfg.host, self.cfg.port));
            }
            other => {
                return Err(format!("unexpected {other} frame from {}:{}", self.cfg.host, self.cfg.port));
            }
        }
        Ok(())
    }
}

/// A REPLY whose data the brick put in the chunk its call lent: the data
/// as a slice of that chunk (taken from the waiter, it is freed once the
/// caller drops the data).
fn shared_reply(mut frame: Frame, lent: Option<Chunk>) -> Result<Frame, String> {
    let (data, reply_at) = frame.descriptors().map_err(|e| e.to_string())?;
    let (Some(d), None, Some(chunk)) = (data, reply_at, lent) else {
        return Err(format!("flags {:#04x} on a reply to a call that lent no chunk", frame.flags));
    };
    if d.offset != chunk.offset() || d.len > chunk.len() as u64 {
        return Err(format!(
            "data at {}+{} is not in the chunk lent at {}+{}",
            d.offset,
            d.len,
            chunk.offset(),
            chunk.len()
        ));
    }
    frame.flags = 0;
    frame.payload = chunk.freeze().slice(..d.len as usize);
    Ok(frame)
}

/// Connects, serves, reconnects with backoff, until told to stop.
pub(super) async fn manage(inner: &Arc<Inner>) {
    let mut run = inner.run.subscribe();
    let mut backoff = inner.cfg.reconnect_min;
    let mut generation = inner.status.lock().generation;
    while *run.borrow() {
        inner.status.lock().phase = "connecting";
        if inner.last_event.lock().is_none() {
            inner.emit(Event::ChildConnecting);
        }
        generation += 1;
        let attempt = tokio::select! {
            _ = run.wait_for(|r| !*r) => break,
            a = inner.connect(generation) => a,
        };
        match attempt {
            Ok((conn, mut reader, writer)) => {
                inner.counters.connects.fetch_add(1, Ordering::Relaxed);
                *inner.conn.lock() = Some(conn.clone());
                inner.status.lock().phase = "connected";
                tracing::info!(client = %inner.name, remote = %format!("{}:{}", inner.cfg.host, inner.cfg.port), subvolume = %inner.cfg.subvolume, "connected");
                inner.emit(Event::ChildUp);
                let why = inner.run_connection(&conn, &mut reader, &mut run).await;
                drop(reader);
                inner.conn.lock().take();
                if why.is_ok()
                    && let Ok(f) = Message::Goodbye("the client is stopping".into()).to_frame(0)
                {
                    conn.try_send(f.into());
                }
                conn.close();
                let abort = writer.abort_handle();
                if tokio::time::timeout(FLUSH_TIMEOUT, writer).await.is_err() {
                    abort.abort();
                }
                inner.counters.disconnects.fetch_add(1, Ordering::Relaxed);
                inner.status.lock().phase = "disconnected";
                let msg = why.unwrap_or_else(|e| e);
                inner.set_error(msg, false);
                inner.emit(Event::ChildDown);
                backoff = inner.cfg.reconnect_min;
            }
            Err((msg, refused)) => {
                inner.status.lock().phase = "disconnected";
                inner.set_error(msg, refused);
                inner.emit(Event::ChildDown);
            }
        }
        tokio::select! {
            _ = run.wait_for(|r| !*r) => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = backoff.saturating_mul(2).min(inner.cfg.reconnect_max);
    }
    inner.status.lock().phase = "stopped";
    if let Some(c) = inner.conn.lock().take() {
        c.close();
    }
    if inner.last_event.lock().is_some() {
        inner.emit(Event::ChildDown);
    }
}
