//! Frames: the 20-byte prefix, [`FrameKind`], the pure decoder
//! ([`decode_frame`], fuzzed) and [`OutFrame`], an encoded frame with its
//! payload beside the prefix and header.

use super::*;

/// Bytes before a frame's header: len (4), kind (1), flags (1), reserved
/// (2), id (8), header_len (4).
pub const PREFIX_LEN: usize = 20;

/// The part of the prefix that `len` counts.
pub(super) const FIXED_AFTER_LEN: usize = PREFIX_LEN - 4;

/// Largest frame accepted before a connection's handshake is done.
pub const HANDSHAKE_MAX_FRAME: usize = 64 << 10;

/// The prefix's flags: both are sent only on a connection whose handshake
/// set up shared regions (the local transport, [`super::shm`]); each adds
/// one [`Descriptor`] to the payload section, in this order.
pub mod frame_flags {
    /// The payload is not in the frame: it lies in shared memory where the
    /// first descriptor says (a CALL: the client's send region; a REPLY: the
    /// client's receive region).
    pub const SHARED_DATA: u8 = 0x01;
    /// A CALL lends a chunk of the client's receive region for its reply's
    /// data: the last descriptor.
    pub const REPLY_AT: u8 = 0x02;
    /// Every flag this build knows.
    pub const KNOWN: u8 = SHARED_DATA | REPLY_AT;
}

/// Where shared bytes lie: an offset and a length in a region, 16 bytes on
/// the wire (two u64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Offset in the region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Bytes of one [`Descriptor`] on the wire.
pub const DESCRIPTOR_LEN: usize = 16;

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
    /// Unknown flags, or a reserved field that is not zero.
    #[error("frame flags {flags:#04x} and reserved field {reserved:#06x}: unknown flags set or reserved not zero")]
    Reserved {
        /// The flags byte.
        flags: u8,
        /// The reserved field.
        reserved: u16,
    },
    /// Shared-memory flags where none were agreed, or a payload section
    /// that is not the descriptors the flags announce.
    #[error("frame flags {flags:#04x} with a {payload}-byte payload section: {why}")]
    Shared {
        /// The flags byte.
        flags: u8,
        /// The payload section's length.
        payload: usize,
        /// What is wrong.
        why: &'static str,
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
    /// [`frame_flags`]; 0 on every connection without shared regions.
    pub flags: u8,
    /// The ABI-encoded header.
    pub header: Bytes,
    /// The bulk data beside the header (empty for most frames).
    pub payload: Bytes,
}

/// A checked prefix.
pub(super) struct Prefix {
    pub(super) size: usize,
    pub(super) kind: FrameKind,
    pub(super) flags: u8,
    pub(super) id: u64,
    pub(super) header_len: usize,
}

pub(super) fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub(super) fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Checks as much of the prefix at the start of `b` as is there: `Ok(None)`
/// when more bytes are needed to decide.
pub(super) fn parse_prefix(b: &[u8], max_frame: usize) -> Result<Option<Prefix>, FrameError> {
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
    if flags & !frame_flags::KNOWN != 0 || reserved != 0 {
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
    Ok(Some(Prefix { size: size as usize, kind, flags, id, header_len: header_len as usize }))
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
    Ok(Some(Frame { kind: p.kind, id: p.id, flags: p.flags, header, payload: body }))
}

impl Frame {
    /// The descriptors the flags announce: (shared data, reply chunk).
    /// The payload section must be exactly those descriptors.
    pub fn descriptors(&self) -> Result<(Option<Descriptor>, Option<Descriptor>), FrameError> {
        let f = self.flags;
        let n = usize::from(f & frame_flags::SHARED_DATA != 0) + usize::from(f & frame_flags::REPLY_AT != 0);
        let p = &self.payload;
        if p.len() != n * DESCRIPTOR_LEN {
            return Err(FrameError::Shared {
                flags: f,
                payload: p.len(),
                why: "not the descriptors the flags announce",
            });
        }
        let at = |i: usize| {
            let o = i * DESCRIPTOR_LEN;
            Descriptor { offset: le_u64(p, o).unwrap_or(0), len: le_u64(p, o + 8).unwrap_or(0) }
        };
        let data = (f & frame_flags::SHARED_DATA != 0).then(|| at(0));
        let reply = (f & frame_flags::REPLY_AT != 0).then(|| at(n - 1));
        Ok((data, reply))
    }
}

/// The size of the frame starting `buf`, once its length field is there
/// and valid (the reader reserves it at once, so the frame is read into one
/// buffer).
pub(super) fn frame_size(buf: &[u8], max_frame: usize) -> Result<Option<usize>, FrameError> {
    Ok(parse_prefix(buf, max_frame)?.map(|p| p.size))
}

/// An encoded frame ready to send: the prefix and header in one buffer, the
/// payload (shared, not copied) beside it.
#[derive(Clone, Debug)]
pub struct OutFrame {
    pub(super) head: Bytes,
    pub(super) payload: Bytes,
}

impl OutFrame {
    /// Builds a frame whose header `fill` appends to the buffer it is given
    /// (after the prefix), returning the payload.
    pub(super) fn build(
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

    /// The frame with its payload replaced by descriptors ([`frame_flags`]):
    /// `data` where the payload lies in shared memory, `reply` a chunk lent
    /// for the reply's data.
    pub fn with_descriptors(self, data: Option<Descriptor>, reply: Option<Descriptor>) -> OutFrame {
        let mut flags = 0;
        let mut payload = Vec::with_capacity(2 * DESCRIPTOR_LEN);
        for (flag, d) in [(frame_flags::SHARED_DATA, data), (frame_flags::REPLY_AT, reply)] {
            if let Some(d) = d {
                flags |= flag;
                payload.extend_from_slice(&d.offset.to_le_bytes());
                payload.extend_from_slice(&d.len.to_le_bytes());
            }
        }
        let mut head = self.head.to_vec();
        // The head's len fits u32 already and the new payload is smaller
        // than a u32 can hold.
        let len = (head.len() - 4 + payload.len()) as u32;
        head[0..4].copy_from_slice(&len.to_le_bytes());
        head[5] |= flags;
        OutFrame { head: Bytes::from(head), payload: Bytes::from(payload) }
    }

    /// The payload (the bulk data beside the header).
    pub fn payload(&self) -> &Bytes {
        &self.payload
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
