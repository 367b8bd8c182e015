//! The cursor types and the per-type ABI v1 encoding. Field orders, tags and
//! sizes here are the contract written in `sdk/ABI.md`; change both together.

use std::sync::Arc;

use bytes::Bytes;

use super::{DecodeError, Limits};
use crate::ctx::CallCtx;
use crate::dict::{Dict, Value};
use crate::errno::Errno;
use crate::fop::{Fop, FopKind, Reply, Request, Response};
use crate::types::*;
use crate::xlator::{Event, Upcall};

/// Appends header bytes and keeps the message's payload aside.
pub struct Writer<'a> {
    buf: &'a mut Vec<u8>,
    payload: Option<Bytes>,
}

impl<'a> Writer<'a> {
    pub(super) fn new(buf: &'a mut Vec<u8>) -> Writer<'a> {
        Writer { buf, payload: None }
    }

    pub(super) fn into_payload(self) -> Option<Bytes> {
        self.payload
    }

    fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    fn u16(&mut self, v: u16) {
        self.raw(&v.to_le_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.raw(&v.to_le_bytes());
    }

    /// A u32 length or count. Lengths past u32::MAX cannot be represented;
    /// they are written as u32::MAX, which every receiver's limit refuses.
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }

    /// u32 length + bytes.
    fn blob(&mut self, b: &[u8]) {
        self.len(b.len());
        self.raw(b);
    }
}

/// Reads a header from a byte slice, holding the payload that came beside it.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    payload: Option<Bytes>,
    limits: &'a Limits,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8], payload: Option<Bytes>, limits: &'a Limits) -> Result<Reader<'a>, DecodeError> {
        check_limit("header", buf.len(), limits.max_header)?;
        Ok(Reader { buf, pos: 0, payload, limits })
    }

    /// Checks that the whole header was used, and the payload too.
    pub(super) fn finish(self) -> Result<(), DecodeError> {
        let left = self.remaining();
        if left > 0 {
            return Err(DecodeError::TrailingBytes(left));
        }
        match self.payload {
            Some(p) if !p.is_empty() => Err(DecodeError::PayloadMismatch { declared: 0, actual: p.len() as u64 }),
            _ => Ok(()),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        match self.pos.checked_add(n).and_then(|end| Some((end, self.buf.get(self.pos..end)?))) {
            Some((end, out)) => {
                self.pos = end;
                Ok(out)
            }
            None => Err(DecodeError::Truncated { offset: self.pos, needed: n as u64, remaining: self.remaining() }),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A u32 length prefix checked against `max`, then that many bytes.
    fn blob(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        check_limit(what, len, max)?;
        self.take(len)
    }

    fn string(&mut self, what: &'static str, max: usize) -> Result<String, DecodeError> {
        let b = self.blob(what, max)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| DecodeError::BadUtf8 { what })
    }

    /// A u32 element count checked against `max` and against the bytes left,
    /// given that each element takes at least `min_size` bytes; so a caller
    /// may preallocate the count returned.
    fn count(&mut self, what: &'static str, max: usize, min_size: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        check_limit(what, n, max)?;
        let needed = n.saturating_mul(min_size);
        if needed > self.remaining() {
            return Err(DecodeError::Truncated {
                offset: self.pos,
                needed: needed as u64,
                remaining: self.remaining(),
            });
        }
        Ok(n)
    }

    /// The u64 payload length, matched against the payload given.
    fn payload(&mut self) -> Result<Bytes, DecodeError> {
        let declared = u64::from_le_bytes(self.array()?);
        check_limit("payload", usize::try_from(declared).unwrap_or(usize::MAX), self.limits.max_payload)?;
        let data = self.payload.take().unwrap_or_default();
        if data.len() as u64 != declared {
            return Err(DecodeError::PayloadMismatch { declared, actual: data.len() as u64 });
        }
        Ok(data)
    }
}

fn check_limit(what: &'static str, len: usize, max: usize) -> Result<(), DecodeError> {
    if len > max {
        return Err(DecodeError::TooLong { what, len: len as u64, max: max as u64 });
    }
    Ok(())
}

fn unknown<T>(what: &'static str, tag: u8) -> Result<T, DecodeError> {
    Err(DecodeError::UnknownTag { what, tag })
}

/// How one type is written and read. Sealed: reached through
/// [`super::Wire`], [`super::encode`] and [`super::decode`].
pub trait Codec: Sized {
    /// Writes the value.
    fn put(&self, w: &mut Writer<'_>);
    /// Reads a value.
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

macro_rules! int_codec {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            fn put(&self, w: &mut Writer<'_>) {
                w.raw(&self.to_le_bytes());
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}

int_codec!(u16, u32, u64, i32, i64);

impl Codec for bool {
    fn put(&self, w: &mut Writer<'_>) {
        w.u8(*self as u8);
    }
    fn get(r: &mut Reader<'_>) -> Result<bool, DecodeError> {
        match r.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            t => unknown("bool", t),
        }
    }
}

impl<const N: usize> Codec for [u8; N] {
    fn put(&self, w: &mut Writer<'_>) {
        w.raw(self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.array()
    }
}

impl<T: Codec> Codec for Option<T> {
    fn put(&self, w: &mut Writer<'_>) {
        match self {
            None => w.u8(0),
            Some(v) => {
                w.u8(1);
                v.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(None),
            1 => Ok(Some(T::get(r)?)),
            t => unknown("option", t),
        }
    }
}

/// Strings of the fop model are names (entry and xattr names, lock
/// domains, client ids, symlink targets): u32 length + UTF-8, `max_name`.
impl Codec for String {
    fn put(&self, w: &mut Writer<'_>) {
        w.blob(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.string("name", r.limits.max_name)
    }
}

/// A `Bytes` field of the model is bulk data: the header holds its u64
/// length, the bytes travel as the payload.
impl Codec for Bytes {
    fn put(&self, w: &mut Writer<'_>) {
        w.raw(&(self.len() as u64).to_le_bytes());
        w.payload = Some(self.clone());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.payload()
    }
}

/// Fieldless enums: one u8 tag per variant.
macro_rules! tag_codec {
    ($t:ident, $what:expr, { $($var:ident = $tag:literal),* $(,)? }) => {
        impl Codec for $t {
            fn put(&self, w: &mut Writer<'_>) {
                w.u8(match self { $($t::$var => $tag,)* });
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                match r.u8()? {
                    $($tag => Ok($t::$var),)*
                    t => unknown($what, t),
                }
            }
        }
    };
}

tag_codec!(FileType, "file type", {
    Unknown = 0, Regular = 1, Directory = 2, Symlink = 3, BlockDev = 4, CharDev = 5, Fifo = 6, Socket = 7,
});
tag_codec!(LockType, "lock type", { Read = 0, Write = 1, Unlock = 2 });
tag_codec!(LkCmd, "lk cmd", { GetLk = 0, SetLk = 1, SetLkw = 2 });
tag_codec!(EntrylkCmd, "entrylk cmd", { Lock = 0, LockNb = 1, Unlock = 2 });
tag_codec!(EntrylkType, "entrylk type", { Read = 0, Write = 1 });
tag_codec!(XattropOp, "xattrop op", { AddArray = 0, AddArray64 = 1 });
tag_codec!(SeekWhat, "seek what", { Data = 0, Hole = 1 });
tag_codec!(LeaseCmd, "lease cmd", { Read = 0, Write = 1, Unlock = 2 });

/// Structs: their fields in order, nothing between.
macro_rules! struct_codec {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl Codec for $t {
            fn put(&self, w: &mut Writer<'_>) {
                $(self.$f.put(w);)*
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok($t { $($f: Codec::get(r)?,)* })
            }
        }
    };
}

/// Single-field tuple structs: the field.
macro_rules! newtype_codec {
    ($($t:ident),*) => {$(
        impl Codec for $t {
            fn put(&self, w: &mut Writer<'_>) {
                self.0.put(w);
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok($t(Codec::get(r)?))
            }
        }
    )*};
}

newtype_codec!(Gfid, FdId, Errno);
struct_codec!(Timespec { sec, nsec });
struct_codec!(Iatt { gfid, ino, dev, mode, nlink, uid, gid, rdev, size, blksize, blocks, atime, mtime, ctime });
struct_codec!(Loc { gfid, parent, name });
struct_codec!(Fd { id, gfid });
struct_codec!(SetAttr { mode, uid, gid, atime, mtime });
struct_codec!(Flock { ty, start, len, pid, owner });
struct_codec!(DirEntry { name, d_off, d_type, iatt });
struct_codec!(Statvfs { bsize, frsize, blocks, bfree, bavail, files, ffree, favail, fsid, flag, namemax });
struct_codec!(Request { fop, xdata });
struct_codec!(Response { reply, xdata });

/// Encoded size of an [`Iatt`].
pub(super) const IATT_SIZE: usize = 112;
/// Smallest encoded [`DirEntry`]: empty name, d_off, d_type, iatt.
const DIRENT_MIN: usize = 4 + 8 + 1 + IATT_SIZE;
/// Smallest encoded dict entry: empty key, tag, empty string.
const DICT_ENTRY_MIN: usize = 4 + 1 + 4;

impl Codec for TimeSet {
    fn put(&self, w: &mut Writer<'_>) {
        match self {
            TimeSet::Now => w.u8(0),
            TimeSet::At(t) => {
                w.u8(1);
                t.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(TimeSet::Now),
            1 => Ok(TimeSet::At(Codec::get(r)?)),
            t => unknown("time set", t),
        }
    }
}

impl Codec for Vec<DirEntry> {
    fn put(&self, w: &mut Writer<'_>) {
        w.len(self.len());
        for e in self {
            e.put(w);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.count("dirent list", r.limits.max_dirents, DIRENT_MIN)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(DirEntry::get(r)?);
        }
        Ok(out)
    }
}

impl Codec for Value {
    fn put(&self, w: &mut Writer<'_>) {
        match self {
            Value::I64(v) => {
                w.u8(0);
                v.put(w);
            }
            Value::U64(v) => {
                w.u8(1);
                v.put(w);
            }
            Value::Str(s) => {
                w.u8(2);
                w.blob(s.as_bytes());
            }
            Value::Bytes(b) => {
                w.u8(3);
                w.blob(b);
            }
            Value::Gfid(g) => {
                w.u8(4);
                g.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let max = r.limits.max_string;
        Ok(match r.u8()? {
            0 => Value::I64(Codec::get(r)?),
            1 => Value::U64(Codec::get(r)?),
            2 => Value::Str(r.string("dict string", max)?),
            3 => Value::Bytes(Bytes::copy_from_slice(r.blob("dict bytes", max)?)),
            4 => Value::Gfid(Codec::get(r)?),
            t => return unknown("dict value", t),
        })
    }
}

impl Codec for Dict {
    fn put(&self, w: &mut Writer<'_>) {
        w.len(self.len());
        for (k, v) in self.iter() {
            k.put(w);
            v.put(w);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.count("dict", r.limits.max_dict_keys, DICT_ENTRY_MIN)?;
        let mut entries: Vec<(String, Value)> = Vec::with_capacity(n);
        for _ in 0..n {
            let key = r.string("dict key", r.limits.max_name)?;
            if entries.last().is_some_and(|(prev, _)| *prev >= key) {
                return Err(DecodeError::UnsortedKeys);
            }
            let value = Value::get(r)?;
            entries.push((key, value));
        }
        Ok(entries.into_iter().collect())
    }
}

impl Codec for CallCtx {
    fn put(&self, w: &mut Writer<'_>) {
        self.uid.put(w);
        self.gid.put(w);
        w.len(self.groups.len());
        for g in self.groups.iter() {
            g.put(w);
        }
        self.pid.put(w);
        self.lk_owner.put(w);
        w.blob(self.client_id.as_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let uid = Codec::get(r)?;
        let gid = Codec::get(r)?;
        let n = r.count("groups", r.limits.max_groups, 4)?;
        let mut groups = Vec::with_capacity(n);
        for _ in 0..n {
            groups.push(r.u32()?);
        }
        Ok(CallCtx {
            uid,
            gid,
            groups: groups.into(),
            pid: Codec::get(r)?,
            lk_owner: Codec::get(r)?,
            client_id: Arc::from(String::get(r)?),
            frame: crate::profile::Frame::none(),
            lent: Default::default(),
        })
    }
}

impl Codec for Result<Response, Errno> {
    fn put(&self, w: &mut Writer<'_>) {
        match self {
            Ok(resp) => {
                w.u8(0);
                resp.put(w);
            }
            Err(e) => {
                w.u8(1);
                e.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(Ok(Codec::get(r)?)),
            1 => Ok(Err(Codec::get(r)?)),
            t => unknown("result", t),
        }
    }
}

/// Enums with fields: a u8 tag, then the variant's fields in order. Each
/// variant is written `Name(a, b) = tag` (tuple) or `Name { a, b } = tag`.
macro_rules! enum_codec {
    ($t:ident, $what:expr, {
        $(($var:ident $( ( $($tf:ident),* ) )? $( { $($sf:ident),* } )? = $tag:literal)),* $(,)?
    }) => {
        impl Codec for $t {
            fn put(&self, w: &mut Writer<'_>) {
                match self {
                    $($t::$var $( ( $($tf),* ) )? $( { $($sf),* } )? => {
                        w.u8($tag);
                        $($($tf.put(w);)*)?
                        $($($sf.put(w);)*)?
                    })*
                }
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(match r.u8()? {
                    $($tag => $t::$var $( ( $({ let $tf = Codec::get(r)?; $tf }),* ) )?
                        $( { $($sf: Codec::get(r)?),* } )?,)*
                    t => return unknown($what, t),
                })
            }
        }
    };
}

enum_codec!(Reply, "reply", {
    (Empty = 0),
    (Entry { iatt, postparent } = 1),
    (Attr(iatt) = 2),
    (PrePost { pre, post } = 3),
    (Parent { pre, post } = 4),
    (Rename { iatt } = 5),
    (Read { data, iatt } = 6),
    (Readlink { target, iatt } = 7),
    (Dirents(entries) = 8),
    (Statfs(statvfs) = 9),
    (Xattrs(xattrs) = 10),
    (Lock(lock) = 11),
    (Offset(offset) = 12),
    (Checksum { weak, strong } = 13),
    (Copied { len, post } = 14),
});

enum_codec!(Event, "event", {
    (ChildUp = 0),
    (ChildDown = 1),
    (ChildConnecting = 2),
    (ParentUp = 3),
    (ParentDown = 4),
    (Upcall(upcall) = 5),
    (ClientGone { client_id } = 6),
});

enum_codec!(Upcall, "upcall", {
    (InodelkContention { gfid, domain, holder_client, holder_owner } = 0),
    (EntrylkContention { gfid, domain, name, holder_client } = 1),
    (Invalidate { gfid } = 2),
    (InvalidateFor { gfid, client } = 3),
});

/// [`Fop`]: the u16 [`FopKind`] code, then the variant's fields in the
/// order of the fop table (`fop_table!` in `fop.rs`, the same as
/// `sdk/ABI.md` section 4, which a test checks). Both matches are
/// exhaustive, so no variant or code can be forgotten.
macro_rules! fop_codec {
    ($(
        $(#[doc = $doc:literal])*
        $var:ident = $code:literal, $name:literal { $($f:ident: $ty:ty),* $(,)? }
        fds [$($fd:ident),*] locs [$($loc:ident),*] reply $reply:ident flags [$($flag:ident),*];
    )*) => {
        impl Codec for Fop {
            fn put(&self, w: &mut Writer<'_>) {
                w.u16(self.kind() as u16);
                match self {
                    $(Fop::$var { $($f),* } => { $($f.put(w);)* })*
                }
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                let code = r.u16()?;
                let kind = FopKind::from_code(code).ok_or(DecodeError::UnknownFop(code))?;
                Ok(match kind {
                    $(FopKind::$var => Fop::$var { $($f: Codec::get(r)?),* },)*
                })
            }
        }
    };
}

crate::fop::fop_table!(fop_codec);
