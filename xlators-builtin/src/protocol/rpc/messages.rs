//! What a frame means: [`Message`] (HELLO and its reply, CALL, REPLY,
//! PING/PONG, UPCALL, GOODBYE), encoded into an [`OutFrame`] and decoded
//! from a [`Frame`] within ABI [`Limits`].

use super::*;

/// Longest reason string in a HELLO_REPLY or GOODBYE.
pub const MAX_REASON: usize = 4096;

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
    /// Over the local transport: the brick's IP address the client dialed
    /// (an address of this host, which the server checks), taken as the
    /// client's address by `auth.addr`; 127.0.0.1 when absent.
    pub const LOCAL_ADDR: &str = "local-addr";
    /// In an accepting HELLO_REPLY's info, over the local transport: true
    /// when the server mapped the regions the client sent, so both sides
    /// may use the shared-memory frame flags.
    pub const SHARED_MEMORY: &str = "shared-memory";
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

pub(super) fn put_string(out: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..floor_char_boundary(s, MAX_REASON)];
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
}

pub(super) fn floor_char_boundary(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    (0..=max).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// A cursor over a hand-encoded header (the parts that are not one ABI
/// value: the hello prefix, status bytes, reason strings).
pub(super) struct Cursor<'a> {
    pub(super) b: &'a [u8],
    pub(super) pos: usize,
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
pub(super) fn callctx_len(h: &[u8]) -> Result<usize, DecodeError> {
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

pub(super) fn no_payload(p: &Bytes) -> Result<(), DecodeError> {
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
