//! The RPC transport shared by protocol/client and protocol/server: frames
//! over TCP, the messages they carry, and the socket loops that read and
//! write them. The wire format, field by field, is `sdk/WIRE.md`.
//!
//! A frame is a 20-byte prefix (`len: u32` counting the bytes after it,
//! `kind: u8`, `flags: u8`, `reserved: u16`, `id: u64`, `header_len: u32`),
//! an ABI v1 header, and a payload: the bulk data (`WRITE`'s data, a read
//! reply's data) that [`abi::encode`] keeps out of the header.
//!
//! - [`decode_frame`] is the pure decoder: it takes whole frames off the
//!   front of a `BytesMut` without copying their payload and refuses a bad
//!   prefix as soon as its bytes are there (so an oversized frame is refused
//!   before it is buffered). It never panics (fuzzed: `xlators-builtin/fuzz`).
//! - [`Message`] is what a frame means: [`Message::to_frame`] encodes
//!   ([`OutFrame`]: the prefix and header in one buffer, the payload
//!   beside it), [`Message::from_frame`] decodes.
//! - [`FrameReader`] and [`Link`] are the socket halves: the reader reads
//!   into one `BytesMut` and splits frames off it; a link lets the task
//!   that made a frame write it itself when the socket is free (no hand-off
//!   to a writer task), and otherwise queues it for whoever holds the socket
//!   or for the connection's writer task. Writes are vectored, several
//!   frames per system call, so payloads go from their `Bytes` to the socket
//!   without a copy. [`write_loop`] is the plain queue-and-task writer for
//!   any `AsyncWrite` (tests, tools).

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use xlfs_sdk::abi::{self, AbiVersion, DecodeError, HELLO_LEN, Limits};
use xlfs_sdk::{CallCtx, Dict, Event, FopResult, Request};

/// Bytes before a frame's header: len (4), kind (1), flags (1), reserved
/// (2), id (8), header_len (4).
pub const PREFIX_LEN: usize = 20;
/// The part of the prefix that `len` counts.
const FIXED_AFTER_LEN: usize = PREFIX_LEN - 4;
/// Largest frame accepted before a connection's handshake is done.
pub const HANDSHAKE_MAX_FRAME: usize = 64 << 10;
/// Longest reason string in a HELLO_REPLY or GOODBYE.
pub const MAX_REASON: usize = 4096;
/// Frames queued for a connection's writer.
pub(crate) const OUT_QUEUE: usize = 1024;
/// Most frames (and at most this many bytes, see [`write_loop`]) sent in
/// one system call.
const BATCH_FRAMES: usize = 64;
const BATCH_BYTES: usize = 4 << 20;
/// Bytes read from the socket at a time when no frame size is known yet.
const READ_CHUNK: usize = 64 << 10;

/// Keys of the HELLO frame's parameter dict.
pub mod hello_keys {
    /// The subvolume the client wants (protocol/client's `remote-subvolume`).
    pub const VOLUME: &str = "volume";
    /// The client's own id (unique per client process and translator).
    pub const CLIENT_ID: &str = "client-id";
    /// The login name, for subvolumes with an `auth.login.*.allow` list.
    pub const USERNAME: &str = "username";
    /// The login password.
    pub const PASSWORD: &str = "password";
    /// In an accepting HELLO_REPLY's info: the id the server gave this
    /// connection (what lock upcalls name as the holder).
    pub const ASSIGNED_CLIENT_ID: &str = "client-id";
}

macro_rules! frame_kinds {
    ($($kind:ident = $code:expr, $name:expr;)*) => {
        /// What a frame carries.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum FrameKind { $(#[doc = $name] $kind = $code,)* }

        impl FrameKind {
            /// The kind with this code.
            pub fn from_code(code: u8) -> Option<FrameKind> {
                match code { $($code => Some(FrameKind::$kind),)* _ => None }
            }
            /// The upper-case name used in `sdk/WIRE.md` and logs.
            pub fn name(self) -> &'static str {
                match self { $(FrameKind::$kind => $name,)* }
            }
        }
    };
}

frame_kinds! {
    Hello = 1, "HELLO";
    HelloReply = 2, "HELLO_REPLY";
    Call = 3, "CALL";
    Reply = 4, "REPLY";
    Ping = 5, "PING";
    Pong = 6, "PONG";
    Upcall = 7, "UPCALL";
    Goodbye = 8, "GOODBYE";
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why bytes are not a frame. Any of these closes the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame (all of it, length field included) is over the limit.
    #[error("frame of {size} bytes is over the maximum frame size of {max} bytes")]
    TooLarge {
        /// The frame's size.
        size: u64,
        /// The receiver's (or sender's) maximum.
        max: u64,
    },
    /// `len` is below the fixed part of the prefix.
    #[error("frame length {len} is below the {FIXED_AFTER_LEN} bytes of the fixed prefix")]
    TooShort {
        /// The length read.
        len: u32,
    },
    /// An unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Flags or the reserved field are not zero.
    #[error("frame flags {flags:#04x} and reserved field {reserved:#06x} must be zero")]
    Reserved {
        /// The flags byte.
        flags: u8,
        /// The reserved field.
        reserved: u16,
    },
    /// `header_len` is more than the frame holds.
    #[error("header length {header_len} is over the {available} bytes the frame holds after its prefix")]
    HeaderTooLong {
        /// The header length read.
        header_len: u32,
        /// Bytes after the prefix.
        available: u64,
    },
}

/// A received frame: its header and payload share the read buffer's memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// What it carries.
    pub kind: FrameKind,
    /// The request id (CALL/REPLY, PING/PONG), 0 for the others.
    pub id: u64,
    /// The ABI-encoded header.
    pub header: Bytes,
    /// The bulk data beside the header (empty for most frames).
    pub payload: Bytes,
}

/// A checked prefix.
struct Prefix {
    size: usize,
    kind: FrameKind,
    id: u64,
    header_len: usize,
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Checks as much of the prefix at the start of `b` as is there: `Ok(None)`
/// when more bytes are needed to decide.
fn parse_prefix(b: &[u8], max_frame: usize) -> Result<Option<Prefix>, FrameError> {
    let Some(len) = le_u32(b, 0) else {
        return Ok(None);
    };
    let size = u64::from(len) + 4;
    if size > max_frame as u64 {
        return Err(FrameError::TooLarge { size, max: max_frame as u64 });
    }
    if (len as usize) < FIXED_AFTER_LEN {
        return Err(FrameError::TooShort { len });
    }
    let Some(&kind) = b.get(4) else {
        return Ok(None);
    };
    let kind = FrameKind::from_code(kind).ok_or(FrameError::UnknownKind(kind))?;
    let (Some(&flags), Some(r)) = (b.get(5), b.get(6..8)) else {
        return Ok(None);
    };
    let reserved = u16::from_le_bytes([r[0], r[1]]);
    if flags != 0 || reserved != 0 {
        return Err(FrameError::Reserved { flags, reserved });
    }
    let (Some(id), Some(header_len)) = (le_u64(b, 8), le_u32(b, 16)) else {
        return Ok(None);
    };
    let available = size - PREFIX_LEN as u64;
    if u64::from(header_len) > available {
        return Err(FrameError::HeaderTooLong { header_len, available });
    }
    // size <= max_frame, a usize.
    Ok(Some(Prefix { size: size as usize, kind, id, header_len: header_len as usize }))
}

/// Takes the first whole frame off the front of `buf`: `Ok(None)` when
/// `buf` holds only part of one (nothing is consumed), an error as soon as
/// the bytes there cannot start a valid frame of at most `max_frame` bytes.
/// The frame's header and payload are split off `buf` without a copy.
pub fn decode_frame(buf: &mut BytesMut, max_frame: usize) -> Result<Option<Frame>, FrameError> {
    let Some(p) = parse_prefix(buf, max_frame)? else {
        return Ok(None);
    };
    if buf.len() < p.size {
        return Ok(None);
    }
    let mut body = buf.split_to(p.size).freeze();
    body.advance(PREFIX_LEN);
    let header = body.split_to(p.header_len);
    Ok(Some(Frame { kind: p.kind, id: p.id, header, payload: body }))
}

/// The size of the frame starting `buf`, once its length field is there
/// and valid (the reader reserves it at once, so the frame is read into one
/// buffer).
fn frame_size(buf: &[u8], max_frame: usize) -> Result<Option<usize>, FrameError> {
    Ok(parse_prefix(buf, max_frame)?.map(|p| p.size))
}

/// An encoded frame ready to send: the prefix and header in one buffer, the
/// payload (shared, not copied) beside it.
#[derive(Clone, Debug)]
pub struct OutFrame {
    head: Bytes,
    payload: Bytes,
}

impl OutFrame {
    /// Builds a frame whose header `fill` appends to the buffer it is given
    /// (after the prefix), returning the payload.
    fn build(
        kind: FrameKind,
        id: u64,
        fill: impl FnOnce(&mut Vec<u8>) -> Option<Bytes>,
    ) -> Result<OutFrame, FrameError> {
        let mut head = Vec::with_capacity(256);
        head.resize(PREFIX_LEN, 0);
        let payload = fill(&mut head).unwrap_or_default();
        let size = head.len() as u64 + payload.len() as u64;
        let too_large = || FrameError::TooLarge { size, max: u64::from(u32::MAX) + 4 };
        let len = u32::try_from(size - 4).map_err(|_| too_large())?;
        let header_len = u32::try_from(head.len() - PREFIX_LEN).map_err(|_| too_large())?;
        head[0..4].copy_from_slice(&len.to_le_bytes());
        head[4] = kind as u8;
        head[8..16].copy_from_slice(&id.to_le_bytes());
        head[16..20].copy_from_slice(&header_len.to_le_bytes());
        Ok(OutFrame { head: Bytes::from(head), payload })
    }

    /// The whole frame's size in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// Never true: a frame has at least its prefix.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Refuses a frame over `max` bytes.
    pub fn check_size(&self, max: usize) -> Result<(), FrameError> {
        if self.len() > max {
            return Err(FrameError::TooLarge { size: self.len() as u64, max: max as u64 });
        }
        Ok(())
    }

    /// The whole frame in one buffer (a copy; for tests and tools).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.head);
        v.extend_from_slice(&self.payload);
        v
    }
}

/// Encodes any frame, valid or not, byte for byte: for tests that send
/// hostile input. `len` and `header_len` are computed from the slices.
pub fn encode_raw_frame(kind: u8, flags: u8, reserved: u16, id: u64, header: &[u8], payload: &[u8]) -> Vec<u8> {
    let len = (FIXED_AFTER_LEN + header.len() + payload.len()) as u32;
    let mut v = Vec::with_capacity(4 + len as usize);
    v.extend_from_slice(&len.to_le_bytes());
    v.push(kind);
    v.push(flags);
    v.extend_from_slice(&reserved.to_le_bytes());
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&(header.len() as u32).to_le_bytes());
    v.extend_from_slice(header);
    v.extend_from_slice(payload);
    v
}

/// The client's opening message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The ABI version the client speaks.
    pub version: AbiVersion,
    /// [`hello_keys`]: volume, client-id, username, password. Empty when
    /// the version's major is not this build's (the rest is not read).
    pub params: Dict,
}

/// The server's answer to a [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloReply {
    /// The ABI version the server speaks.
    pub version: AbiVersion,
    /// True when the client may send calls.
    pub accepted: bool,
    /// Why the client was refused (empty when accepted).
    pub reason: String,
    /// When accepted: [`hello_keys::ASSIGNED_CLIENT_ID`].
    pub info: Dict,
}

impl HelloReply {
    /// A refusal from a server speaking this build's version.
    pub fn refuse(reason: impl Into<String>) -> HelloReply {
        HelloReply { version: AbiVersion::CURRENT, accepted: false, reason: reason.into(), info: Dict::new() }
    }
}

/// What a frame means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Client -> server, first frame of a connection (id 0).
    Hello(Hello),
    /// Server -> client, the answer to HELLO (id 0).
    HelloReply(HelloReply),
    /// Client -> server: one fop. The frame id is the request id.
    Call {
        /// The caller (the server replaces `client_id`).
        ctx: CallCtx,
        /// The fop; `WRITE`'s data travels as the frame payload.
        req: Request,
    },
    /// Server -> client: the result of the CALL with the same id; a read's
    /// data travels as the frame payload.
    Reply(FopResult),
    /// Are you there? Answered by PONG with the same id.
    Ping,
    /// The answer to PING.
    Pong,
    /// Server -> client: an [`Event::Upcall`].
    Upcall(Event),
    /// Either side, before it closes: why.
    Goodbye(String),
}

/// Why a frame's header does not decode as its kind says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} frame: {source}")]
pub struct MessageError {
    /// The frame's kind.
    pub kind: FrameKind,
    /// What is wrong.
    pub source: DecodeError,
}

/// The decode limits of a connection whose frames are at most `max_frame`.
pub fn limits_for(max_frame: usize) -> Limits {
    Limits { max_header: max_frame, max_payload: max_frame, ..Limits::DEFAULT }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..floor_char_boundary(s, MAX_REASON)];
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    (0..=max).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// A cursor over a hand-encoded header (the parts that are not one ABI
/// value: the hello prefix, status bytes, reason strings).
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let remaining = self.b.len().saturating_sub(self.pos);
        let out = self.pos.checked_add(n).and_then(|end| self.b.get(self.pos..end));
        let out = out.ok_or(DecodeError::Truncated { offset: self.pos, needed: n as u64, remaining })?;
        self.pos += n;
        Ok(out)
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().unwrap_or([0; 4])) as usize;
        if len > MAX_REASON {
            return Err(DecodeError::TooLong { what: "reason", len: len as u64, max: MAX_REASON as u64 });
        }
        let b = self.take(len)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| DecodeError::BadUtf8 { what: "reason" })
    }

    fn rest(&self) -> &'a [u8] {
        self.b.get(self.pos..).unwrap_or(&[])
    }

    /// The rest must be empty.
    fn finish(&self) -> Result<(), DecodeError> {
        match self.rest().len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }
}

/// Encoded length of the [`CallCtx`] at the start of a CALL header (ABI
/// v1: uid, gid, groups list, pid, lk_owner, client_id string).
fn callctx_len(h: &[u8]) -> Result<usize, DecodeError> {
    let truncated = |offset: usize, needed: usize| DecodeError::Truncated {
        offset,
        needed: needed as u64,
        remaining: h.len().saturating_sub(offset),
    };
    let groups = le_u32(h, 8).ok_or_else(|| truncated(8, 4))? as usize;
    let at = groups.checked_mul(4).and_then(|g| g.checked_add(24)).ok_or_else(|| truncated(12, usize::MAX))?;
    let name = le_u32(h, at).ok_or_else(|| truncated(at, 4))? as usize;
    let end = at.checked_add(4).and_then(|a| a.checked_add(name)).ok_or_else(|| truncated(at + 4, name))?;
    if end > h.len() {
        return Err(truncated(at + 4, name));
    }
    Ok(end)
}

fn no_payload(p: &Bytes) -> Result<(), DecodeError> {
    if p.is_empty() { Ok(()) } else { Err(DecodeError::PayloadMismatch { declared: 0, actual: p.len() as u64 }) }
}

impl Message {
    /// The frame kind that carries this message.
    pub fn kind(&self) -> FrameKind {
        match self {
            Message::Hello(_) => FrameKind::Hello,
            Message::HelloReply(_) => FrameKind::HelloReply,
            Message::Call { .. } => FrameKind::Call,
            Message::Reply(_) => FrameKind::Reply,
            Message::Ping => FrameKind::Ping,
            Message::Pong => FrameKind::Pong,
            Message::Upcall(_) => FrameKind::Upcall,
            Message::Goodbye(_) => FrameKind::Goodbye,
        }
    }

    /// Encodes the message as a frame with request id `id`. Bulk data is
    /// shared with the message, not copied. Fails only for a frame that
    /// cannot be represented (over 4 GiB).
    pub fn to_frame(&self, id: u64) -> Result<OutFrame, FrameError> {
        OutFrame::build(self.kind(), id, |out| match self {
            Message::Hello(h) => {
                abi::encode_hello(h.version, out);
                abi::encode(&h.params, out)
            }
            Message::HelloReply(r) => {
                abi::encode_hello(r.version, out);
                out.push(if r.accepted { 0 } else { 1 });
                put_string(out, &r.reason);
                abi::encode(&r.info, out)
            }
            Message::Call { ctx, req } => {
                abi::encode(ctx, out);
                abi::encode(req, out)
            }
            Message::Reply(res) => abi::encode(res, out),
            Message::Ping | Message::Pong => None,
            Message::Upcall(ev) => abi::encode(ev, out),
            Message::Goodbye(reason) => {
                put_string(out, reason);
                None
            }
        })
    }

    /// Decodes a frame's header and payload as its kind says. A HELLO or
    /// HELLO_REPLY of another ABI major decodes to its version alone (the
    /// rest is that version's business), so the peer can be told which
    /// versions disagree.
    pub fn from_frame(frame: Frame, limits: &Limits) -> Result<Message, MessageError> {
        let kind = frame.kind;
        Self::decode(frame, limits).map_err(|source| MessageError { kind, source })
    }

    fn decode(frame: Frame, limits: &Limits) -> Result<Message, DecodeError> {
        let Frame { kind, header, payload, .. } = frame;
        let h: &[u8] = &header;
        match kind {
            FrameKind::Hello | FrameKind::HelloReply => {
                no_payload(&payload)?;
                let version = abi::decode_hello(h)?;
                let foreign = version.major != abi::ABI_MAJOR;
                let mut c = Cursor { b: h, pos: HELLO_LEN };
                if kind == FrameKind::Hello {
                    let params = if foreign { Dict::new() } else { abi::decode(c.rest(), None, limits)? };
                    return Ok(Message::Hello(Hello { version, params }));
                }
                if foreign {
                    return Ok(Message::HelloReply(HelloReply {
                        version,
                        accepted: false,
                        reason: String::new(),
                        info: Dict::new(),
                    }));
                }
                let accepted = match c.take(1)?[0] {
                    0 => true,
                    1 => false,
                    tag => {
                        return Err(DecodeError::UnknownTag { what: "hello status", tag });
                    }
                };
                let reason = c.string()?;
                let info = abi::decode(c.rest(), None, limits)?;
                Ok(Message::HelloReply(HelloReply { version, accepted, reason, info }))
            }
            FrameKind::Call => {
                let n = callctx_len(h)?;
                let ctx = abi::decode(&h[..n], None, limits)?;
                let req = abi::decode(&h[n..], Some(payload), limits)?;
                Ok(Message::Call { ctx, req })
            }
            FrameKind::Reply => Ok(Message::Reply(abi::decode(h, Some(payload), limits)?)),
            FrameKind::Ping | FrameKind::Pong => {
                no_payload(&payload)?;
                Cursor { b: h, pos: 0 }.finish()?;
                Ok(if kind == FrameKind::Ping { Message::Ping } else { Message::Pong })
            }
            FrameKind::Upcall => Ok(Message::Upcall(abi::decode(h, Some(payload), limits)?)),
            FrameKind::Goodbye => {
                no_payload(&payload)?;
                let mut c = Cursor { b: h, pos: 0 };
                let reason = c.string()?;
                c.finish()?;
                Ok(Message::Goodbye(reason))
            }
        }
    }
}

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
/// written (the server's in-flight permit for the request it answers).
pub struct Outgoing {
    /// The frame.
    pub frame: OutFrame,
    /// Released after the frame is written.
    pub guard: Option<OwnedSemaphorePermit>,
}

impl From<OutFrame> for Outgoing {
    fn from(frame: OutFrame) -> Outgoing {
        Outgoing { frame, guard: None }
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
async fn write_chunks<W: AsyncWrite + Unpin>(w: &mut W, chunks: &mut [Bytes]) -> io::Result<()> {
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
/// writes ([`OwnedWriteHalf::try_write_vectored`]), synchronously, so a
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
struct LinkHandle(Arc<LinkInner>);

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

struct LinkInner {
    sock: OwnedWriteHalf,
    state: parking_lot::Mutex<LinkState>,
    /// Wakes the writer task: a hand-over, or closing.
    wake: Notify,
    /// Room in the queue.
    room: Arc<Semaphore>,
}

#[derive(Default)]
struct LinkState {
    /// A task owns the socket for writing; it empties `queue` before
    /// letting go (so a non-empty queue always has an owner).
    busy: bool,
    /// The owner is the writer task.
    handed: bool,
    /// No frame is accepted any more.
    closed: bool,
    queue: VecDeque<Pending>,
}

/// A frame on its way out: what is left of it to write, the slice index
/// reached, and what to drop once it is written.
struct Pending {
    chunks: [Bytes; 2],
    _guard: Option<OwnedSemaphorePermit>,
    _room: Option<OwnedSemaphorePermit>,
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
enum Blocked {
    /// The socket is full: wait until it is writable.
    WouldBlock,
    /// The socket failed.
    Failed(io::Error),
}

/// Frames written by a direct sender, beyond its own, before the rest is
/// left to the writer task (so a fop does not carry the others' load).
const DIRECT_DRAIN_ROUNDS: usize = 4;

impl Link {
    /// Wraps a connection's write half; the future returned is its writer
    /// task, to be spawned: it ends once the link is closed and everything
    /// queued is written, shutting the write side down.
    pub fn new(sock: OwnedWriteHalf) -> (Link, impl Future<Output = io::Result<()>> + Send + 'static) {
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
    pub fn spawn(sock: OwnedWriteHalf) -> (Link, JoinHandle<io::Result<()>>) {
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
        Ok(())
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
        socket2::SockRef::from(self.sock.as_ref()).shutdown(std::net::Shutdown::Write)
    }

    /// The socket failed: nothing more is sent; the read side is shut down
    /// too so the connection's reader notices and the connection ends.
    fn fail(&self, e: &io::Error) {
        tracing::debug!(error = %e, "connection write failed");
        self.abort();
        let _ = socket2::SockRef::from(self.sock.as_ref()).shutdown(std::net::Shutdown::Both);
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
fn take_batch(queue: &mut VecDeque<Pending>, batch: &mut VecDeque<Pending>) {
    let mut bytes = 0;
    while batch.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
        let Some(p) = queue.pop_front() else { break };
        bytes += p.chunks.iter().map(Bytes::len).sum::<usize>();
        batch.push_back(p);
    }
}

/// TCP socket options from the `transport.socket.*` options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    /// `transport.socket.keepalive`, with time, interval and count.
    pub keepalive: Option<(Duration, Duration, u32)>,
    /// `transport.tcp-user-timeout` (0: the system default).
    pub user_timeout: Duration,
}

impl SocketOptions {
    /// Reads the shared transport options (`transport.socket.keepalive*`,
    /// `transport.tcp-user-timeout`).
    pub fn from_options(o: &xlfs_sdk::Options) -> SocketOptions {
        let secs = |k: &str, d: i64| Duration::from_secs(o.int(k).unwrap_or(d).max(1) as u64);
        let keepalive = o.bool("transport.socket.keepalive").unwrap_or(true).then(|| {
            let count = o.int("transport.socket.keepalive-count").unwrap_or(9).clamp(1, 127) as u32;
            (secs("transport.socket.keepalive-time", 20), secs("transport.socket.keepalive-interval", 2), count)
        });
        SocketOptions { keepalive, user_timeout: o.time("transport.tcp-user-timeout").unwrap_or_default() }
    }

    /// Applies them to a socket.
    pub fn apply(&self, s: socket2::SockRef<'_>) -> io::Result<()> {
        s.set_tcp_nodelay(true)?;
        if let Some((time, interval, count)) = self.keepalive {
            s.set_tcp_keepalive(
                &socket2::TcpKeepalive::new().with_time(time).with_interval(interval).with_retries(count),
            )?;
        }
        if !self.user_timeout.is_zero() {
            s.set_tcp_user_timeout(Some(self.user_timeout))?;
        }
        Ok(())
    }
}

/// Checks the GlusterFS transport options both translators accept: only
/// TCP over IPv4, without TLS.
pub fn check_transport(o: &xlfs_sdk::Options) -> Result<(), String> {
    if o.bool("transport.socket.ssl-enabled") == Some(true) {
        return Err("transport.socket.ssl-enabled on: TLS is not supported yet".into());
    }
    if let Some(f) = o.str("transport.address-family").filter(|f| *f != "inet") {
        return Err(format!("transport.address-family {f}: only inet is supported"));
    }
    if let Some(t) = o.str("transport-type").filter(|t| !t.eq_ignore_ascii_case("tcp")) {
        return Err(format!("transport-type {t}: only tcp is supported"));
    }
    Ok(())
}

/// An option array: the given declarations, then the GlusterFS transport
/// options both translators declare (read by [`SocketOptions::from_options`]
/// and [`check_transport`]).
macro_rules! with_transport_options {
    ($($decl:expr),* $(,)?) => {
        &[
            $($decl,)*
            ::xlfs_sdk::options::OptionDecl::new("transport-type", ::xlfs_sdk::options::OptType::Str).default("tcp").desc("The transport; only 'tcp' is supported."),
            ::xlfs_sdk::options::OptionDecl::new("transport.address-family", ::xlfs_sdk::options::OptType::Enum(&["inet", "inet6", "unix", "inet-sdp"]))
                .default("inet")
                .desc("Address family; only 'inet' (IPv4) is supported, others are an init error."),
            ::xlfs_sdk::options::OptionDecl::new("transport.socket.ssl-enabled", ::xlfs_sdk::options::OptType::Bool)
                .default("off")
                .desc("TLS on the connection; not supported yet, so 'on' is an init error."),
            ::xlfs_sdk::options::OptionDecl::new("transport.socket.keepalive", ::xlfs_sdk::options::OptType::Bool)
                .default("on")
                .desc("TCP keepalive probes on every connection, so a dead peer is noticed while idle."),
            ::xlfs_sdk::options::OptionDecl::new("transport.socket.keepalive-time", ::xlfs_sdk::options::OptType::Int)
                .default("20")
                .range(1.0, 86400.0)
                .desc("Seconds of idleness before the first keepalive probe."),
            ::xlfs_sdk::options::OptionDecl::new("transport.socket.keepalive-interval", ::xlfs_sdk::options::OptType::Int)
                .default("2")
                .range(1.0, 86400.0)
                .desc("Seconds between keepalive probes."),
            ::xlfs_sdk::options::OptionDecl::new("transport.socket.keepalive-count", ::xlfs_sdk::options::OptType::Int)
                .default("9")
                .range(1.0, 127.0)
                .desc("Unanswered keepalive probes before the connection is declared dead."),
            ::xlfs_sdk::options::OptionDecl::new("transport.tcp-user-timeout", ::xlfs_sdk::options::OptType::Time)
                .default("0")
                .range(0.0, 86400.0)
                .desc("Longest time sent data may stay unacknowledged before the connection is dropped (0: system default)."),
        ]
    };
}
pub(crate) use with_transport_options;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use xlfs_sdk::{Errno, Fd, FdId, Fop, Gfid, Iatt, Loc, Reply, Response, Upcall, Value};

    use super::*;

    const MAX: usize = 1 << 20;

    fn round_trip(m: &Message, id: u64) -> Message {
        let f = m.to_frame(id).expect("encodes");
        let mut buf = BytesMut::from(&f.to_vec()[..]);
        let frame = decode_frame(&mut buf, MAX).expect("valid frame").expect("whole frame");
        assert!(buf.is_empty(), "the frame used every byte");
        assert_eq!((frame.kind, frame.id), (m.kind(), id));
        Message::from_frame(frame, &limits_for(MAX)).expect("decodes")
    }

    fn ctx() -> CallCtx {
        CallCtx {
            uid: 1000,
            gid: 100,
            groups: Arc::from(vec![4u32, 24, 27]),
            pid: 77,
            lk_owner: 0xabc,
            client_id: Arc::from("me"),
            frame: Default::default(),
        }
    }

    #[test]
    fn every_message_round_trips() {
        let data = Bytes::from(vec![7u8; 100_000]);
        let fd = Fd { id: FdId(3), gfid: Gfid::ROOT };
        let mut params = Dict::new();
        params.set_str(hello_keys::VOLUME, "/b1");
        params.set_str(hello_keys::CLIENT_ID, "c1");
        let msgs = [
            Message::Hello(Hello { version: AbiVersion::CURRENT, params }),
            Message::HelloReply(HelloReply::refuse("no such subvolume 'x'")),
            Message::HelloReply(HelloReply {
                version: AbiVersion::new(1, 3),
                accepted: true,
                reason: String::new(),
                info: Dict::new().with("client-id", Value::Str("c1#4".into())),
            }),
            Message::Call { ctx: ctx(), req: Request::new(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "a") }) },
            Message::Call {
                ctx: ctx(),
                req: Request::new(Fop::Writev { fd, data: data.clone(), offset: 9, flags: 0 }),
            },
            Message::Reply(Ok(Response::from(Reply::Read { data: data.clone(), iatt: Iatt::default() }))),
            Message::Reply(Err(Errno::ENOENT)),
            Message::Ping,
            Message::Pong,
            Message::Upcall(Event::Upcall(Upcall::Invalidate { gfid: Gfid::ROOT })),
            Message::Goodbye("server is shutting down".into()),
        ];
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(&round_trip(m, i as u64 * 1000 + 1), m);
        }
    }

    /// The examples of `sdk/WIRE.md`, byte for byte.
    #[test]
    fn wire_md_examples() {
        fn hex(s: &str) -> Vec<u8> {
            s.split_whitespace().map(|b| u8::from_str_radix(b, 16).expect("hex")).collect()
        }
        let ping = Message::Ping.to_frame(5).expect("encodes").to_vec();
        assert_eq!(ping, hex("10 00 00 00 05 00 00 00 05 00 00 00 00 00 00 00 00 00 00 00"));
        let bye = Message::Goodbye("bye".into()).to_frame(0).expect("encodes").to_vec();
        assert_eq!(bye, hex("17 00 00 00 08 00 00 00 00 00 00 00 00 00 00 00 07 00 00 00 03 00 00 00 62 79 65"));
        let params = Dict::new()
            .with(hello_keys::VOLUME, Value::Str("/b1".into()))
            .with(hello_keys::CLIENT_ID, Value::Str("c".into()));
        let hello = Message::Hello(Hello { version: AbiVersion::CURRENT, params }).to_frame(0).expect("encodes");
        assert_eq!(
            hello.to_vec(),
            hex("41 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 31 00 00 00
                 58 4c 46 53 01 00 00 00
                 02 00 00 00
                 09 00 00 00 63 6c 69 65 6e 74 2d 69 64 02 01 00 00 00 63
                 06 00 00 00 76 6f 6c 75 6d 65 02 03 00 00 00 2f 62 31")
        );
        let fd = Fd { id: FdId(5), gfid: Gfid::ROOT };
        let write = Message::Call {
            ctx: CallCtx::root("c"),
            req: Request::new(Fop::Writev { fd, data: Bytes::from_static(b"abc"), offset: 9, flags: 2 }),
        };
        let f = write.to_frame(9).expect("encodes");
        assert_eq!(f.head.len(), PREFIX_LEN + 79);
        assert_eq!(
            f.to_vec(),
            hex("62 00 00 00 03 00 00 00 09 00 00 00 00 00 00 00 4f 00 00 00
                 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 63
                 14 00 05 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01
                 03 00 00 00 00 00 00 00 09 00 00 00 00 00 00 00 02 00 00 00
                 00 00 00 00
                 61 62 63")
        );
    }

    #[test]
    fn payload_is_beside_the_header_and_not_copied() {
        let data = Bytes::from(vec![1u8; 4096]);
        let m = Message::Call {
            ctx: ctx(),
            req: Request::new(Fop::Writev { fd: Fd::default(), data: data.clone(), offset: 0, flags: 0 }),
        };
        let f = m.to_frame(5).expect("encodes");
        assert_eq!(f.payload.as_ptr(), data.as_ptr(), "the frame shares the data");
        assert!(f.head.len() < 200, "the header does not hold the data");
        let mut buf = BytesMut::from(&f.to_vec()[..]);
        let base = buf.as_ptr() as usize;
        let frame = decode_frame(&mut buf, MAX).expect("ok").expect("whole");
        assert_eq!(frame.payload.as_ptr() as usize, base + f.head.len(), "payload split off the read buffer");
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let whole = Message::Goodbye("bye".into()).to_frame(0).expect("encodes").to_vec();
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(decode_frame(&mut buf, MAX), Ok(None), "cut at {cut}");
            assert_eq!(buf.len(), cut, "nothing consumed");
        }
        let mut two = BytesMut::from(&[whole.clone(), whole.clone()].concat()[..]);
        assert!(decode_frame(&mut two, MAX).expect("ok").is_some());
        assert!(decode_frame(&mut two, MAX).expect("ok").is_some());
        assert!(two.is_empty());
    }

    #[test]
    fn bad_prefixes_are_refused_early() {
        let mut huge = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        assert_eq!(decode_frame(&mut huge, MAX), Err(FrameError::TooLarge { size: (1u64 << 32) + 3, max: MAX as u64 }));
        let e = FrameError::TooLarge { size: 5_000_000, max: 1_048_576 }.to_string();
        assert!(e.contains("5000000") && e.contains("1048576"), "{e}");
        let mut short = BytesMut::from(&3u32.to_le_bytes()[..]);
        assert_eq!(decode_frame(&mut short, MAX), Err(FrameError::TooShort { len: 3 }));
        let mut kind = BytesMut::from(&encode_raw_frame(99, 0, 0, 1, b"", b"")[..5]);
        assert_eq!(decode_frame(&mut kind, MAX), Err(FrameError::UnknownKind(99)));
        let mut flags = BytesMut::from(&encode_raw_frame(5, 1, 0, 1, b"", b"")[..]);
        assert_eq!(decode_frame(&mut flags, MAX), Err(FrameError::Reserved { flags: 1, reserved: 0 }));
        let mut raw = encode_raw_frame(5, 0, 0, 1, b"abc", b"");
        raw[16..20].copy_from_slice(&10u32.to_le_bytes());
        let mut over = BytesMut::from(&raw[..]);
        assert_eq!(decode_frame(&mut over, MAX), Err(FrameError::HeaderTooLong { header_len: 10, available: 3 }));
    }

    #[test]
    fn bad_headers_are_message_errors() {
        let limits = limits_for(MAX);
        let decode = |kind: u8, header: &[u8], payload: &[u8]| {
            let mut buf = BytesMut::from(&encode_raw_frame(kind, 0, 0, 9, header, payload)[..]);
            let frame = decode_frame(&mut buf, MAX).expect("frame ok").expect("whole");
            Message::from_frame(frame, &limits)
        };
        assert!(decode(FrameKind::Ping as u8, b"x", b"").is_err(), "ping has no header");
        assert!(decode(FrameKind::Goodbye as u8, &[3, 0, 0, 0, 0xff, 0xfe, 0xfd], b"").is_err(), "not UTF-8");
        assert!(decode(FrameKind::Call as u8, &[0; 11], b"").is_err(), "truncated call context");
        let mut call = Vec::new();
        abi::encode(&ctx(), &mut call);
        call.extend_from_slice(&999u16.to_le_bytes());
        let e = decode(FrameKind::Call as u8, &call, b"").expect_err("unknown fop");
        assert_eq!(e.source, DecodeError::UnknownFop(999));
        // A hello of another major decodes to its version alone.
        let mut h = Vec::new();
        abi::encode_hello(AbiVersion::new(2, 0), &mut h);
        h.extend_from_slice(b"whatever v2 sends");
        assert_eq!(
            decode(FrameKind::Hello as u8, &h, b"").expect("decodes"),
            Message::Hello(Hello { version: AbiVersion::new(2, 0), params: Dict::new() })
        );
    }

    #[test]
    fn callctx_len_matches_the_encoding() {
        let mut h = Vec::new();
        abi::encode(&ctx(), &mut h);
        let n = h.len();
        h.extend_from_slice(b"rest");
        assert_eq!(callctx_len(&h), Ok(n));
        let mut huge = vec![0u8; 12];
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(callctx_len(&huge).is_err());
    }

    /// A connected loopback TCP pair.
    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let (a, b) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        (a.expect("connect"), b.expect("accept").0)
    }

    /// A REPLY frame whose id says who sent it and whose payload (of
    /// `len` bytes) repeats the id, so a torn or mixed frame shows.
    fn tagged(id: u64, len: usize) -> OutFrame {
        Message::Reply(Ok(Response::from(Reply::Read {
            data: Bytes::from(vec![id as u8; len]),
            iatt: Iatt::default(),
        })))
        .to_frame(id)
        .expect("encodes")
    }

    fn check_tagged(f: Frame) -> u64 {
        let id = f.id;
        match Message::from_frame(f, &limits_for(MAX)).expect("decodes") {
            Message::Reply(Ok(Response { reply: Reply::Read { data, .. }, .. })) => {
                assert!(data.iter().all(|&b| b == id as u8), "frame {id} is whole")
            }
            m => panic!("unexpected {m:?}"),
        }
        id
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn link_carries_the_frames_of_many_tasks_whole_and_in_order_per_task() {
        let (a, b) = tcp_pair().await;
        let (_rd, wr) = a.into_split();
        let (link, writer) = Link::spawn(wr);
        const TASKS: u64 = 8;
        const FRAMES: u64 = 150;
        let senders: Vec<_> = (0..TASKS)
            .map(|t| {
                let link = link.clone();
                tokio::spawn(async move {
                    for i in 0..FRAMES {
                        // Sizes from none to more than a socket buffer, so
                        // that some sends are cut short and handed over.
                        let len = ((i * 7919 + t * 104_729) % 5) as usize * 70_000;
                        assert!(link.send(tagged(i * TASKS + t, len).into()).await, "sent");
                    }
                })
            })
            .collect();
        let reader = tokio::spawn(async move {
            let mut r = FrameReader::new(b, MAX);
            let mut next = [0u64; TASKS as usize];
            while let Some(f) = r.next().await.expect("reads") {
                let id = check_tagged(f);
                let (t, i) = (id % TASKS, id / TASKS);
                assert_eq!(next[t as usize], i, "task {t}'s frames in order");
                next[t as usize] += 1;
            }
            next
        });
        for s in senders {
            s.await.expect("sender");
        }
        drop(link);
        writer.await.expect("join").expect("written");
        assert_eq!(reader.await.expect("reader"), [FRAMES; TASKS as usize], "every frame, then the end");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_link_queues_bounded_and_a_cancelled_send_leaves_no_trace() {
        let (a, b) = tcp_pair().await;
        let (_rd, wr) = a.into_split();
        let (link, writer) = Link::spawn(wr);
        // Nobody reads yet: the socket fills, then the queue.
        let guards = Arc::new(Semaphore::new(2 * OUT_QUEUE + 4096));
        let total = guards.available_permits();
        let mut accepted = 0u64;
        loop {
            let guard = guards.clone().try_acquire_owned().expect("guard");
            let out = Outgoing { frame: tagged(accepted, 4096), guard: Some(guard) };
            if !link.try_send(out) {
                break;
            }
            accepted += 1;
            assert!(accepted < 100_000, "the queue is bounded");
        }
        assert_eq!(link.room(), 0);
        // A send that has to wait for room, cancelled while it waits.
        let mut waiting = Box::pin(link.send(tagged(u64::MAX - 1, 4096).into()));
        assert!(poll_once_test(waiting.as_mut()).is_pending(), "waits for room");
        drop(waiting);
        link.close();
        assert!(!link.send(tagged(u64::MAX - 2, 1).into()).await, "closed: refused");
        let mut r = FrameReader::new(b, MAX);
        let mut n = 0;
        while let Some(f) = r.next().await.expect("reads") {
            assert_eq!(check_tagged(f), n, "frames in order, none lost, none extra");
            n += 1;
        }
        assert_eq!(n, accepted);
        writer.await.expect("join").expect("written");
        assert_eq!(guards.available_permits(), total, "every guard dropped once written");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_aborted_link_drops_its_queue_and_waiting_senders_give_up() {
        let (a, _b) = tcp_pair().await;
        let (_rd, wr) = a.into_split();
        let (link, writer) = Link::spawn(wr);
        let guards = Arc::new(Semaphore::new(100_000));
        while link.try_send(Outgoing {
            frame: tagged(1, 4096),
            guard: Some(guards.clone().try_acquire_owned().expect("guard")),
        }) {}
        let waiter = {
            let link = link.clone();
            tokio::spawn(async move { link.send(tagged(2, 4096).into()).await })
        };
        link.abort();
        assert!(!waiter.await.expect("join"), "a sender waiting for room gives up");
        assert!(!link.try_send(tagged(3, 1).into()));
        writer.abort();
        let _ = writer.await;
        // What was queued is dropped, its guards with it.
        assert_eq!(guards.available_permits(), 100_000, "queued guards released");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_corked_link_sends_what_came_meanwhile_when_uncorked() {
        let (a, b) = tcp_pair().await;
        let (_rd, wr) = a.into_split();
        let (link, writer) = Link::spawn(wr);
        let mut r = FrameReader::new(b, MAX);
        let cork = link.cork().expect("the socket is free");
        assert!(link.cork().is_none(), "one owner at a time");
        for id in 0..3 {
            assert!(link.send(tagged(id, 10).into()).await, "queued");
        }
        {
            let other = link.clone();
            assert!(
                tokio::spawn(async move { other.send_deferred(tagged(3, 10).into()).await }).await.expect("join"),
                "queued from another task"
            );
        }
        assert_eq!(link.room(), OUT_QUEUE - 4, "all four wait in the queue");
        drop(cork);
        assert_eq!(link.room(), OUT_QUEUE, "written when uncorked");
        for id in 0..4 {
            assert_eq!(check_tagged(r.next().await.expect("reads").expect("frame")), id);
        }
        // Deferred sends on a free socket go through the writer task.
        assert!(link.send_deferred(tagged(4, 10).into()).await);
        assert_eq!(check_tagged(r.next().await.expect("reads").expect("frame")), 4);
        drop(link);
        writer.await.expect("join").expect("written");
        assert!(r.next().await.expect("clean end").is_none());
    }

    fn poll_once_test<F: Future + ?Sized>(f: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
        f.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    }

    #[tokio::test]
    async fn writer_and_reader_carry_frames_over_a_pipe() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (tx, rx) = mpsc::channel(OUT_QUEUE);
        let writer = tokio::spawn(write_loop(a, rx));
        let data = Bytes::from((0..300_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let reply = Message::Reply(Ok(Response::from(Reply::Read { data: data.clone(), iatt: Iatt::default() })));
        for id in 0..10u64 {
            tx.send(reply.to_frame(id).expect("encodes").into()).await.expect("queued");
            tx.send(Message::Pong.to_frame(id).expect("encodes").into()).await.expect("queued");
        }
        drop(tx);
        let mut r = FrameReader::new(b, MAX);
        for id in 0..10u64 {
            let f = r.next().await.expect("reads").expect("frame");
            assert_eq!((f.kind, f.id), (FrameKind::Reply, id));
            assert_eq!(Message::from_frame(f, &limits_for(MAX)).expect("decodes"), reply);
            assert_eq!(r.next().await.expect("reads").expect("frame").kind, FrameKind::Pong);
        }
        assert!(r.next().await.expect("clean end").is_none());
        writer.await.expect("join").expect("written");
    }

    #[tokio::test]
    async fn reader_reports_truncation_and_oversize() {
        let whole = Message::Goodbye("bye".into()).to_frame(0).expect("encodes").to_vec();
        let mut r = FrameReader::new(&whole[..whole.len() - 1], MAX);
        assert!(matches!(r.next().await, Err(RpcError::Truncated(n)) if n == whole.len() - 1));
        let big = encode_raw_frame(FrameKind::Ping as u8, 0, 0, 0, &[0; 100], b"");
        let mut r = FrameReader::new(&big[..], 64);
        let e = r.next().await.expect_err("too large");
        assert!(e.to_string().contains("120 bytes") && e.to_string().contains("64 bytes"), "{e}");
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256), max in 0usize..512) {
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(frame)) = decode_frame(&mut buf, max) {
                let _ = Message::from_frame(frame, &limits_for(max));
            }
        }
    }
}
