//! ABI v1: the stable little-endian byte encoding of the fop model.
//!
//! The same bytes carry fops, replies, xdata, caller contexts and events over
//! the network (client <-> brick) and across the plugin boundary. The
//! contract, field by field, is `sdk/ABI.md`; this module is its reference
//! implementation.
//!
//! - [`encode`] appends a value's header bytes to a reusable `Vec<u8>` and
//!   returns its bulk data (`Fop::Writev::data`, `Reply::Read::data`)
//!   separately: bulk data travels beside the header, never through it.
//! - [`decode`] reads a value back from header bytes plus that payload; the
//!   payload `Bytes` is moved into the value without a copy. Decoding hostile
//!   input returns a [`DecodeError`], never panics, and allocates at most in
//!   proportion to the input, within [`Limits`].
//! - [`encode_hello`] / [`decode_hello`] and [`check_compatible`] are the
//!   version handshake.
//!
//! The encoding is canonical: decoders refuse every non-canonical form (a
//! bool other than 0 or 1, unsorted dict keys, trailing bytes), so one value
//! has exactly one header encoding.

use std::fmt;

use bytes::Bytes;

mod codec;
#[cfg(test)]
mod tests;

use codec::{Codec, Reader, Writer};

/// The ABI major version this build speaks; a different major is refused.
pub const ABI_MAJOR: u16 = 1;
/// The ABI minor version this build speaks; bumped by additive changes.
pub const ABI_MINOR: u16 = 0;
/// The four bytes a handshake message starts with.
pub const MAGIC: [u8; 4] = *b"XLFS";
/// Length of the handshake message of every ABI version.
pub const HELLO_LEN: usize = 8;

/// Limits a decoder enforces on untrusted input. Every length or count read
/// from the input is checked against these and against the bytes left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest header accepted, in bytes.
    pub max_header: usize,
    /// Longest payload (bulk data beside the header), in bytes.
    pub max_payload: usize,
    /// Longest name: entry names, xattr names and dict keys, lock domains,
    /// client ids, symlink targets.
    pub max_name: usize,
    /// Longest dict string or byte value.
    pub max_string: usize,
    /// Most keys in one dict.
    pub max_dict_keys: usize,
    /// Most entries in one readdir reply.
    pub max_dirents: usize,
    /// Most supplementary groups in a caller context.
    pub max_groups: usize,
}

impl Limits {
    /// The defaults (see `sdk/ABI.md`).
    pub const DEFAULT: Limits = Limits {
        max_header: 64 << 20,
        max_payload: 64 << 20,
        max_name: 4096,
        max_string: 1 << 20,
        max_dict_keys: 4096,
        max_dirents: 65536,
        max_groups: 65536,
    };
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}

/// Why bytes could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ends before the value does.
    #[error("truncated: {needed} bytes needed at offset {offset}, {remaining} left")]
    Truncated {
        /// Where the missing field starts.
        offset: usize,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the input.
        remaining: usize,
    },
    /// A fop code no [`FopKind`](crate::FopKind) has.
    #[error("unknown fop code {0}")]
    UnknownFop(u16),
    /// A variant tag (or bool, or option flag) out of range.
    #[error("unknown {what} tag {tag}")]
    UnknownTag {
        /// What the tag selects.
        what: &'static str,
        /// The tag read.
        tag: u8,
    },
    /// A string is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    BadUtf8 {
        /// Which string.
        what: &'static str,
    },
    /// A length or count is over its [`Limits`].
    #[error("{what} length {len} is over the limit {max}")]
    TooLong {
        /// What is too long.
        what: &'static str,
        /// The length or count read.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Bytes remain after the value.
    #[error("{0} trailing bytes after the value")]
    TrailingBytes(usize),
    /// The payload beside the header is not as long as the header says
    /// (a header without a data field declares 0).
    #[error("payload length mismatch: header declares {declared} bytes, {actual} given")]
    PayloadMismatch {
        /// Length recorded in the header.
        declared: u64,
        /// Length of the payload given.
        actual: u64,
    },
    /// Dict keys are not in strictly ascending byte order (or repeat).
    #[error("dict keys are not in strictly ascending order")]
    UnsortedKeys,
    /// A handshake message does not start with [`MAGIC`].
    #[error("bad handshake magic {0:02x?}")]
    BadMagic([u8; 4]),
}

/// A type with an ABI v1 encoding: the model types listed in `sdk/ABI.md`
/// ([`Fop`](crate::Fop), [`Reply`](crate::Reply), [`Request`](crate::Request),
/// [`Response`](crate::Response), [`FopResult`](crate::FopResult),
/// [`Dict`](crate::Dict), [`CallCtx`](crate::CallCtx),
/// [`Event`](crate::Event), ...). Sealed: use [`encode`] and [`decode`].
pub trait Wire: Codec {}

macro_rules! wire {
    ($($t:ty),* $(,)?) => { $(impl Wire for $t {})* };
}

wire!(
    crate::Gfid,
    crate::Timespec,
    crate::Iatt,
    crate::Loc,
    crate::FdId,
    crate::Fd,
    crate::SetAttr,
    crate::Flock,
    crate::DirEntry,
    crate::Statvfs,
    crate::Errno,
    crate::Dict,
    crate::Value,
    crate::Fop,
    crate::Reply,
    crate::Request,
    crate::Response,
    crate::FopResult,
    crate::CallCtx,
    crate::Event,
    crate::Upcall,
);

/// Appends the header encoding of `value` to `out` (which is not cleared, so
/// one buffer can be reused) and returns the bulk data that travels beside
/// it: `Some` exactly when the value has a data field (`Fop::Writev`,
/// `Reply::Read`, and what contains them), even when that data is empty.
///
/// Encoding does not check [`Limits`]; the receiver does.
pub fn encode<T: Wire>(value: &T, out: &mut Vec<u8>) -> Option<Bytes> {
    let mut w = Writer::new(out);
    value.put(&mut w);
    w.into_payload()
}

/// Decodes a whole value from `header` and the payload that came beside it
/// (`None` and an empty payload are the same). The payload is moved into the
/// value without a copy. Trailing bytes, or a payload the header does not
/// account for, are errors.
pub fn decode<T: Wire>(header: &[u8], payload: Option<Bytes>, limits: &Limits) -> Result<T, DecodeError> {
    let mut r = Reader::new(header, payload, limits)?;
    let value = T::get(&mut r)?;
    r.finish()?;
    Ok(value)
}

/// An ABI version, `v{major}.{minor}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AbiVersion {
    /// Incompatible changes bump it.
    pub major: u16,
    /// Additive changes bump it.
    pub minor: u16,
}

impl AbiVersion {
    /// The version this build speaks: [`ABI_MAJOR`].[`ABI_MINOR`].
    pub const CURRENT: AbiVersion = AbiVersion { major: ABI_MAJOR, minor: ABI_MINOR };

    /// A version.
    pub const fn new(major: u16, minor: u16) -> AbiVersion {
        AbiVersion { major, minor }
    }
}

impl fmt::Display for AbiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}", self.major, self.minor)
    }
}

/// Why a peer or plugin cannot work with this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Different major versions never work together.
    #[error("ABI major version mismatch: host speaks {host}, peer was built for {peer}")]
    MajorMismatch {
        /// The host's version.
        host: AbiVersion,
        /// The peer's version.
        peer: AbiVersion,
    },
    /// The peer needs additions the host does not have.
    #[error("peer was built for ABI {peer}, newer than the host's {host}")]
    MinorTooNew {
        /// The host's version.
        host: AbiVersion,
        /// The peer's version.
        peer: AbiVersion,
    },
}

/// Decides whether a peer or plugin built for ABI `peer` works with a host
/// speaking `host`: iff the majors are equal and `peer.minor <= host.minor`.
pub fn check_compatible(host: AbiVersion, peer: AbiVersion) -> Result<(), VersionError> {
    if host.major != peer.major {
        Err(VersionError::MajorMismatch { host, peer })
    } else if peer.minor > host.minor {
        Err(VersionError::MinorTooNew { host, peer })
    } else {
        Ok(())
    }
}

/// Appends the handshake message for `version` ([`HELLO_LEN`] bytes:
/// [`MAGIC`], major u16, minor u16).
pub fn encode_hello(version: AbiVersion, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.major.to_le_bytes());
    out.extend_from_slice(&version.minor.to_le_bytes());
}

/// Reads a handshake message. Bytes after the first [`HELLO_LEN`] are
/// ignored (reserved for later versions), so any version's hello decodes and
/// [`check_compatible`] can name it.
pub fn decode_hello(bytes: &[u8]) -> Result<AbiVersion, DecodeError> {
    let Some(hello) = bytes.first_chunk::<HELLO_LEN>() else {
        return Err(DecodeError::Truncated { offset: 0, needed: HELLO_LEN as u64, remaining: bytes.len() });
    };
    let magic = [hello[0], hello[1], hello[2], hello[3]];
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    Ok(AbiVersion { major: u16::from_le_bytes([hello[4], hello[5]]), minor: u16::from_le_bytes([hello[6], hello[7]]) })
}
