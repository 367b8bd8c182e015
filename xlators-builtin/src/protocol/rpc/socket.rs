//! The socket loops: [`FrameReader`] splits frames off one read buffer;
//! [`Link`] lets the task that made a frame write it when the socket is
//! free, else queues it for the holder or the writer task, several frames
//! per vectored write; [`write_loop`] is the plain queue-and-task writer.

use super::*;

/// Frames queued for a connection's writer.
pub(crate) const OUT_QUEUE: usize = 1024;

/// Most frames (and at most this many bytes, see [`write_loop`]) sent in
/// one system call.
pub(super) const BATCH_FRAMES: usize = 64;

pub(super) const BATCH_BYTES: usize = 4 << 20;

/// Bytes read from the socket at a time when no frame size is known yet.
pub(super) const READ_CHUNK: usize = 64 << 10;

/// Why a connection's reader stopped.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The socket failed.
    #[error("socket error: {0}")]
    Io(#[from] io::Error),
    /// The peer sent bytes that are not a frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A frame's header does not decode.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed in the middle of a frame ({0} bytes of it received)")]
    Truncated(usize),
    /// The peer sent a frame this side does not accept (direction, state).
    #[error("unexpected {0} frame")]
    Unexpected(FrameKind),
    /// Nothing arrived in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Reads frames from a socket half into one buffer.
pub struct FrameReader<R> {
    rd: R,
    buf: BytesMut,
    max_frame: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader refusing frames over `max_frame` bytes.
    pub fn new(rd: R, max_frame: usize) -> FrameReader<R> {
        FrameReader { rd, buf: BytesMut::with_capacity(READ_CHUNK), max_frame }
    }

    /// A whole frame is already buffered: [`FrameReader::next`] returns
    /// without reading from the socket.
    pub fn has_frame(&self) -> bool {
        matches!(parse_prefix(&self.buf, self.max_frame), Ok(Some(p)) if self.buf.len() >= p.size)
    }

    /// Changes the largest frame accepted (after the handshake).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// The next frame; `Ok(None)` when the peer closed the connection
    /// between frames. Cancel-safe: bytes read stay buffered.
    pub async fn next(&mut self) -> Result<Option<Frame>, RpcError> {
        loop {
            if let Some(frame) = decode_frame(&mut self.buf, self.max_frame)? {
                return Ok(Some(frame));
            }
            let want = frame_size(&self.buf, self.max_frame)?.unwrap_or(0).max(self.buf.len() + READ_CHUNK);
            self.buf.reserve(want - self.buf.len());
            if self.rd.read_buf(&mut self.buf).await? == 0 {
                return match self.buf.len() {
                    0 => Ok(None),
                    n => Err(RpcError::Truncated(n)),
                };
            }
        }
    }
}

/// A frame queued for a connection's writer, with what to drop once it is
/// written (the server's in-flight slot and byte reservation for the
/// request it answers).
pub struct Outgoing {
    /// The frame.
    pub frame: OutFrame,
    /// Released after the frame is written.
    pub guard: Held,
}

/// What a queued frame keeps until it is written.
#[derive(Default)]
pub struct Held {
    /// An in-flight slot.
    pub slot: Option<OwnedSemaphorePermit>,
    /// A reservation of bytes.
    pub bytes: Option<OwnedSemaphorePermit>,
}

impl Held {
    /// Holds one in-flight slot.
    pub fn slot(p: OwnedSemaphorePermit) -> Held {
        Held { slot: Some(p), bytes: None }
    }
}

impl From<OutFrame> for Outgoing {
    fn from(frame: OutFrame) -> Outgoing {
        Outgoing { frame, guard: Held::default() }
    }
}

/// Writes queued frames until every sender is gone (then shuts the write
/// side down) or the socket fails. Frames waiting together go out in one
/// vectored write: heads and payloads as separate slices, never copied.
pub async fn write_loop<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::Receiver<Outgoing>) -> io::Result<()> {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(BATCH_FRAMES);
    let mut chunks: Vec<Bytes> = Vec::with_capacity(BATCH_FRAMES * 2);
    while let Some(first) = rx.recv().await {
        let mut bytes = first.frame.len();
        batch.push(first);
        while batch.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
            let Ok(next) = rx.try_recv() else { break };
            bytes += next.frame.len();
            batch.push(next);
        }
        for o in &batch {
            chunks.push(o.frame.head.clone());
            if !o.frame.payload.is_empty() {
                chunks.push(o.frame.payload.clone());
            }
        }
        write_chunks(&mut w, &mut chunks).await?;
        chunks.clear();
        batch.clear();
    }
    w.shutdown().await
}

/// Writes every chunk, as many per system call as fit in one iovec array.
pub(super) async fn write_chunks<W: AsyncWrite + Unpin>(w: &mut W, chunks: &mut [Bytes]) -> io::Result<()> {
    const IOV: usize = 64;
    let mut i = 0;
    while i < chunks.len() {
        let mut slices = [IoSlice::new(&[]); IOV];
        let n_slices = chunks[i..].iter().take(IOV).zip(slices.iter_mut()).map(|(c, s)| *s = IoSlice::new(c)).count();
        let mut n = w.write_vectored(&slices[..n_slices]).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes"));
        }
        while n > 0 && i < chunks.len() {
            let c = &mut chunks[i];
            if n >= c.len() {
                n -= c.len();
                i += 1;
            } else {
                c.advance(n);
                n = 0;
            }
        }
        while i < chunks.len() && chunks[i].is_empty() {
            i += 1;
        }
    }
    Ok(())
}

/// The write side of a TCP connection, shared by every task that sends on
/// it, so that a frame usually goes to the socket from the task that made
/// it instead of being handed to a writer task (a task wake-up saved at
/// each end of every round trip).
///
/// One task at a time owns the socket for writing ("busy"): a sender that
/// finds it free writes its frame at once with non-blocking vectored
/// writes ([`WireWrite`]: plain TCP or a TLS session), synchronously, so a
/// frame is never left half written by a cancelled fop; a sender that finds
/// it busy queues its frame (at most `OUT_QUEUE` queued, then it waits for
/// room). Whoever owns the socket empties the queue before letting go; when
/// the socket is full (`WouldBlock`) the rest, the cut frame first, goes to
/// the connection's writer task ([`Link::spawn`]), which waits for the
/// socket to be writable. Frames of different tasks may go out in any
/// order; the frames of one task go out in the order it sent them. When
/// the last clone of a link is dropped it is closed.
#[derive(Clone)]
pub struct Link {
    inner: Arc<LinkHandle>,
}

/// Closes the link when the last [`Link`] goes.
pub(super) struct LinkHandle(Arc<LinkInner>);

impl Drop for LinkHandle {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl std::ops::Deref for LinkHandle {
    type Target = LinkInner;

    fn deref(&self) -> &LinkInner {
        &self.0
    }
}

pub(super) struct LinkInner {
    pub(super) sock: WireWrite,
    pub(super) state: parking_lot::Mutex<LinkState>,
    /// Wakes the writer task: a hand-over, or closing.
    pub(super) wake: Notify,
    /// Room in the queue.
    pub(super) room: Arc<Semaphore>,
}

#[derive(Default)]
pub(super) struct LinkState {
    /// A task owns the socket for writing; it empties `queue` before
    /// letting go (so a non-empty queue always has an owner).
    pub(super) busy: bool,
    /// The owner is the writer task.
    pub(super) handed: bool,
    /// No frame is accepted any more.
    pub(super) closed: bool,
    pub(super) queue: VecDeque<Pending>,
}

/// A frame on its way out: what is left of it to write, the slice index
/// reached, and what to drop once it is written.
pub(super) struct Pending {
    pub(super) chunks: [Bytes; 2],
    pub(super) _guard: Held,
    pub(super) _room: Option<OwnedSemaphorePermit>,
}

impl Pending {
    fn new(out: Outgoing, room: Option<OwnedSemaphorePermit>) -> Pending {
        Pending { chunks: [out.frame.head, out.frame.payload], _guard: out.guard, _room: room }
    }

    fn done(&self) -> bool {
        self.chunks.iter().all(Bytes::is_empty)
    }
}

/// Why a non-blocking write stopped.
pub(super) enum Blocked {
    /// The socket is full: wait until it is writable.
    WouldBlock,
    /// The socket failed.
    Failed(io::Error),
}

/// Frames written by a direct sender, beyond its own, before the rest is
/// left to the writer task (so a fop does not carry the others' load).
pub(super) const DIRECT_DRAIN_ROUNDS: usize = 4;

impl Link {
    /// Wraps a connection's write half; the future returned is its writer
    /// task, to be spawned: it ends once the link is closed and everything
    /// queued is written, shutting the write side down.
    pub fn new(sock: impl Into<WireWrite>) -> (Link, impl Future<Output = io::Result<()>> + Send + 'static) {
        let sock = sock.into();
        let inner = Arc::new(LinkInner {
            sock,
            state: parking_lot::Mutex::new(LinkState::default()),
            wake: Notify::new(),
            room: Arc::new(Semaphore::new(OUT_QUEUE)),
        });
        let task = inner.clone().writer();
        (Link { inner: Arc::new(LinkHandle(inner)) }, task)
    }

    /// [`Link::new`] with its writer task spawned.
    pub fn spawn(sock: impl Into<WireWrite>) -> (Link, JoinHandle<io::Result<()>>) {
        let (link, task) = Link::new(sock);
        (link, tokio::spawn(task))
    }

    /// Sends a frame: written at once when the socket is free, else queued
    /// (waiting for room when the queue is full). False when the link is
    /// closed or the socket failed. Cancel-safe: a frame is either wholly
    /// handed over or not sent at all.
    pub async fn send(&self, out: Outgoing) -> bool {
        self.send_as(out, true).await
    }

    /// Sends a frame through the writer task even when the socket is free
    /// (so frames that several tasks send at about the same time go out
    /// together, in one system call); otherwise as [`Link::send`].
    pub async fn send_deferred(&self, out: Outgoing) -> bool {
        self.send_as(out, false).await
    }

    async fn send_as(&self, out: Outgoing, direct: bool) -> bool {
        let out = match self.inner.offer(out, None, direct) {
            Ok(sent) => return sent,
            Err(out) => out,
        };
        let Ok(room) = self.inner.room.clone().acquire_owned().await else {
            return false;
        };
        self.inner.offer(out, Some(room), direct).unwrap_or(false)
    }

    /// Sends a frame unless that would wait for room in the queue (then it
    /// is dropped); false when dropped or closed.
    pub fn try_send(&self, out: Outgoing) -> bool {
        self.inner.offer(out, None, true).unwrap_or(false)
    }

    /// Takes the socket, when it is free, without writing: until the guard
    /// is dropped, frames sent are queued, and dropping it writes them all
    /// together (as [`Link::send`] would write one). For a task about to
    /// send several frames in a row (the server answering the calls of one
    /// read). Never hold it across a wait: nothing queued is written while
    /// it is held.
    pub fn cork(&self) -> Option<Cork<'_>> {
        let mut st = self.inner.state.lock();
        if st.closed || st.busy {
            return None;
        }
        st.busy = true;
        Some(Cork { link: self })
    }

    /// Room left in the queue.
    pub fn room(&self) -> usize {
        self.inner.room.available_permits()
    }

    /// Accepts no more frames; what is queued is still written, then the
    /// writer task shuts the write side down and ends.
    pub fn close(&self) {
        self.inner.close();
    }

    /// Accepts no more frames and drops the queued ones (with their
    /// guards); senders waiting for room give up.
    pub fn abort(&self) {
        self.inner.abort();
    }
}

impl LinkInner {
    fn close(&self) {
        let idle = {
            let mut st = self.state.lock();
            st.closed = true;
            !st.busy
        };
        if idle {
            self.wake.notify_one();
        }
    }

    /// Writes `out` now if the socket is free (and `direct`; else hands it
    /// to the writer task), or queues it if there is room (`room`, or a
    /// slot taken now), without waiting: `Err(out)` when the queue is full.
    fn offer(&self, out: Outgoing, room: Option<OwnedSemaphorePermit>, direct: bool) -> Result<bool, Outgoing> {
        let mut st = self.state.lock();
        if st.closed {
            return Ok(false);
        }
        if !st.busy {
            st.busy = true;
            if direct {
                drop(st);
                drop(room);
                let mut batch = VecDeque::with_capacity(1);
                batch.push_back(Pending::new(out, None));
                return Ok(self.write_owned(batch));
            }
            st.handed = true;
            st.queue.push_back(Pending::new(out, room));
            drop(st);
            self.wake.notify_one();
            return Ok(true);
        }
        let room = match room {
            Some(r) => r,
            None => match self.room.clone().try_acquire_owned() {
                Ok(r) => r,
                Err(_) => return Err(out),
            },
        };
        st.queue.push_back(Pending::new(out, Some(room)));
        Ok(true)
    }

    /// Writes as owner of the socket: `batch`, then what others queued
    /// meanwhile (a few rounds), then lets go or hands over to the writer
    /// task. Never waits. False when the socket failed.
    fn write_owned(&self, mut batch: VecDeque<Pending>) -> bool {
        let mut rounds = 0;
        loop {
            match self.try_write(&mut batch) {
                Ok(()) => {}
                Err(Blocked::WouldBlock) => {
                    let mut st = self.state.lock();
                    while let Some(p) = batch.pop_back() {
                        st.queue.push_front(p);
                    }
                    st.handed = true;
                    drop(st);
                    self.wake.notify_one();
                    return true;
                }
                Err(Blocked::Failed(e)) => {
                    self.fail(&e);
                    let mut st = self.state.lock();
                    st.busy = false;
                    st.handed = false;
                    drop(st);
                    self.wake.notify_one();
                    return false;
                }
            }
            rounds += 1;
            let mut st = self.state.lock();
            if st.queue.is_empty() {
                st.busy = false;
                let closed = st.closed;
                drop(st);
                if closed {
                    self.wake.notify_one();
                }
                return true;
            }
            if rounds > DIRECT_DRAIN_ROUNDS {
                st.handed = true;
                drop(st);
                self.wake.notify_one();
                return true;
            }
            take_batch(&mut st.queue, &mut batch);
        }
    }

    /// Writes the frames of `batch` (front first) with non-blocking
    /// vectored writes, dropping each once it is written.
    fn try_write(&self, batch: &mut VecDeque<Pending>) -> Result<(), Blocked> {
        const IOV: usize = 64;
        while !batch.is_empty() {
            let mut slices = [IoSlice::new(&[]); IOV];
            let mut n_slices = 0;
            for c in batch.iter().flat_map(|p| p.chunks.iter()) {
                if n_slices == IOV {
                    break;
                }
                if !c.is_empty() {
                    slices[n_slices] = IoSlice::new(c);
                    n_slices += 1;
                }
            }
            let mut n = match self.sock.try_write_vectored(&slices[..n_slices]) {
                Ok(0) => {
                    return Err(Blocked::Failed(io::Error::new(io::ErrorKind::WriteZero, "socket accepted no bytes")));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(Blocked::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Blocked::Failed(e)),
            };
            while let Some(p) = batch.front_mut() {
                for c in p.chunks.iter_mut() {
                    let k = n.min(c.len());
                    c.advance(k);
                    n -= k;
                }
                if !p.done() {
                    break;
                }
                batch.pop_front();
            }
        }
        // TLS records the socket did not take yet: the writer task waits
        // for the socket and comes back here to send them.
        match self.sock.flush() {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(Blocked::WouldBlock),
            Err(e) => Err(Blocked::Failed(e)),
        }
    }

    /// The writer task: writes what is handed to it, waiting for the socket
    /// when it is full, until the link is closed and idle.
    async fn writer(self: Arc<Self>) -> io::Result<()> {
        let mut batch: VecDeque<Pending> = VecDeque::with_capacity(BATCH_FRAMES);
        loop {
            let idle = {
                let mut st = self.state.lock();
                if st.handed {
                    if st.queue.is_empty() {
                        st.handed = false;
                        st.busy = false;
                    } else {
                        take_batch(&mut st.queue, &mut batch);
                    }
                }
                if batch.is_empty() && st.closed && !st.busy {
                    break;
                }
                batch.is_empty()
            };
            if idle {
                self.wake.notified().await;
                continue;
            }
            loop {
                match self.try_write(&mut batch) {
                    Ok(()) => break,
                    Err(Blocked::WouldBlock) => {
                        if let Err(e) = self.sock.writable().await {
                            self.fail(&e);
                            return Err(e);
                        }
                    }
                    Err(Blocked::Failed(e)) => {
                        self.fail(&e);
                        return Err(e);
                    }
                }
            }
        }
        self.sock.shutdown(std::net::Shutdown::Write)
    }

    /// The socket failed: nothing more is sent; the read side is shut down
    /// too so the connection's reader notices and the connection ends.
    fn fail(&self, e: &io::Error) {
        tracing::debug!(error = %e, "connection write failed");
        self.abort();
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    fn abort(&self) {
        let dropped = {
            let mut st = self.state.lock();
            st.closed = true;
            std::mem::take(&mut st.queue)
        };
        self.room.close();
        drop(dropped);
        self.wake.notify_one();
    }
}

/// The socket taken by [`Link::cork`]; dropping it writes what was queued.
pub struct Cork<'a> {
    link: &'a Link,
}

impl Drop for Cork<'_> {
    fn drop(&mut self) {
        self.link.inner.write_owned(VecDeque::new());
    }
}

/// Moves up to a batch of frames (and bytes) from the front of `queue`.
pub(super) fn take_batch(queue: &mut VecDeque<Pending>, batch: &mut VecDeque<Pending>) {
    let mut bytes = 0;
    while batch.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
        let Some(p) = queue.pop_front() else { break };
        bytes += p.chunks.iter().map(Bytes::len).sum::<usize>();
        batch.push_back(p);
    }
}
