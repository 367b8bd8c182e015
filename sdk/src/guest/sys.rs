//! The plugin ABI v1's raw contract, shared by the hosts (`xlfs-runtime`)
//! and the guest SDK: export and import names, flags, the native host
//! vtable, the plugin descriptor's encoding and the framing of the messages
//! that cross the boundary. `sdk/PLUGIN-ABI.md` is the specification; this
//! module is its reference implementation and is compiled with or without
//! the `guest` feature.

use std::ffi::c_void;

use bytes::Bytes;

use crate::abi::{self, AbiVersion, DecodeError, Limits};
use crate::options::{OptType, OptionDecl};
use crate::policy::lock_contention::{Decision, Interest, LockView};
use crate::policy::read_ahead::{Advice, Range};
use crate::{CallCtx, Event, Fop, FopFlags, FopKind, FopResult, Reply, Request};

/// The WebAssembly import module of every host function.
pub const IMPORT_MODULE: &str = "xlfs";
/// The version marker export's name starts with this, followed by
/// `<major>_<minor>` (`xlfs_abi_version_1_0`).
pub const VERSION_PREFIX: &str = "xlfs_abi_version_";

/// The guest's exports (functions, plus `memory` for WebAssembly).
pub mod exports {
    /// Allocates guest memory for the host to write a message into.
    pub const ALLOC: &str = "xlfs_alloc";
    /// Frees what [`ALLOC`] returned.
    pub const FREE: &str = "xlfs_free";
    /// Declares the plugin (options, fop and event masks, children).
    pub const DESCRIBE: &str = "xlfs_describe";
    /// Builds an instance from its options.
    pub const INIT: &str = "xlfs_init";
    /// A fop arrived.
    pub const ON_FOP: &str = "xlfs_on_fop";
    /// A wound call's reply arrived.
    pub const ON_REPLY: &str = "xlfs_on_reply";
    /// A timer fired.
    pub const ON_TIMER: &str = "xlfs_on_timer";
    /// An event arrived.
    pub const ON_EVENT: &str = "xlfs_on_event";
    /// The instance is done.
    pub const FINI: &str = "xlfs_fini";
    /// A WebAssembly guest's linear memory.
    pub const MEMORY: &str = "memory";
}

/// The host functions' WebAssembly import names (module [`IMPORT_MODULE`]);
/// the native vtable has a field of each name.
pub mod imports {
    /// Wind a call to a child.
    pub const WIND: &str = "wind";
    /// Unwind a frame.
    pub const UNWIND: &str = "unwind";
    /// Arm a timer.
    pub const TIMER_SET: &str = "timer_set";
    /// Cancel a timer.
    pub const TIMER_CANCEL: &str = "timer_cancel";
    /// Read a per-inode value.
    pub const INODE_CTX_GET: &str = "inode_ctx_get";
    /// Set a per-inode value.
    pub const INODE_CTX_SET: &str = "inode_ctx_set";
    /// Delete a per-inode value.
    pub const INODE_CTX_DEL: &str = "inode_ctx_del";
    /// Read a per-fd value.
    pub const FD_CTX_GET: &str = "fd_ctx_get";
    /// Set a per-fd value.
    pub const FD_CTX_SET: &str = "fd_ctx_set";
    /// Delete a per-fd value.
    pub const FD_CTX_DEL: &str = "fd_ctx_del";
    /// Log a line.
    pub const LOG: &str = "log";
    /// A monotonic clock.
    pub const NOW_NS: &str = "now_ns";
    /// Length of a buffer.
    pub const BUF_LEN: &str = "buf_len";
    /// Copy bytes out of a buffer.
    pub const BUF_READ: &str = "buf_read";
    /// Make a buffer from guest bytes.
    pub const BUF_NEW: &str = "buf_new";
    /// A sub-range of a buffer, without a copy.
    pub const BUF_SLICE: &str = "buf_slice";
    /// Release a buffer handle.
    pub const BUF_FREE: &str = "buf_free";
    /// Hand the descriptor to the host (only during `xlfs_describe`).
    pub const DECLARE: &str = "declare";
}

/// `wind` flag: the frame ends with this call; the host unwinds the frame
/// with the child's result itself and does not call `xlfs_on_reply`.
pub const WIND_TAIL: u32 = 1;
/// The buffer handle meaning "no buffer".
pub const NO_BUF: u32 = 0;
/// `xlfs_on_event`'s `from` for an event from the graph (not a child).
pub const FROM_GRAPH: i32 = -1;
/// `xlfs_on_event` result: pass the event on to the node's parents.
pub const EVENT_PASS: i32 = 1;
/// `xlfs_on_event` result: stop the event here.
pub const EVENT_STOP: i32 = 0;
/// A handler's result when it did its work.
pub const HANDLER_OK: i32 = 0;
/// A handler's result when it failed (a caught panic); the host treats it
/// as a crash of the instance.
pub const HANDLER_FAILED: i32 = -1;
/// `max_children` in a descriptor meaning "no limit".
pub const UNLIMITED_CHILDREN: u32 = u32::MAX;

/// Log levels of the `log` host function.
pub mod log_level {
    /// Something failed.
    pub const ERROR: u32 = 1;
    /// Something is odd.
    pub const WARN: u32 = 2;
    /// Normal operation.
    pub const INFO: u32 = 3;
    /// Detail for debugging.
    pub const DEBUG: u32 = 4;
    /// Everything.
    pub const TRACE: u32 = 5;
}

/// The name of the version marker export for `v`: `xlfs_abi_version_1_0`.
pub fn version_symbol(v: AbiVersion) -> String {
    format!("{VERSION_PREFIX}{}_{}", v.major, v.minor)
}

/// Reads the version out of a marker export's name (`xlfs_abi_version_1_0`
/// is v1.0); `None` for any other name.
pub fn parse_version_symbol(name: &str) -> Option<AbiVersion> {
    let rest = name.strip_prefix(VERSION_PREFIX)?;
    let (major, minor) = rest.split_once('_')?;
    let num =
        |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u16>().ok()).flatten();
    Some(AbiVersion::new(num(major)?, num(minor)?))
}

/// The host functions of a native (dylib) guest: the same functions a
/// WebAssembly guest imports from module [`IMPORT_MODULE`], each taking
/// [`HostVtable::ctx`] first. The host passes a pointer to this table to
/// `xlfs_describe` and `xlfs_init`; it stays valid until `xlfs_fini`.
/// Fields are only ever appended (by minor versions); `size` says how many
/// the host has.
#[repr(C)]
#[allow(missing_docs)] // each function is the import of the same name, see PLUGIN-ABI.md
pub struct HostVtable {
    /// `size_of::<HostVtable>()` as the host built it.
    pub size: u32,
    /// The host's ABI major version.
    pub major: u16,
    /// The host's ABI minor version.
    pub minor: u16,
    /// The host's context, passed back as each function's first argument.
    pub ctx: *mut c_void,
    pub wind: unsafe extern "C" fn(*mut c_void, u64, u32, u32, *const u8, u32, u32) -> i64,
    pub unwind: unsafe extern "C" fn(*mut c_void, u64, *const u8, u32, u32) -> i32,
    pub timer_set: unsafe extern "C" fn(*mut c_void, u64) -> i64,
    pub timer_cancel: unsafe extern "C" fn(*mut c_void, u64) -> i32,
    pub inode_ctx_get: unsafe extern "C" fn(*mut c_void, *const u8, *mut u64) -> i32,
    pub inode_ctx_set: unsafe extern "C" fn(*mut c_void, *const u8, u64) -> i32,
    pub inode_ctx_del: unsafe extern "C" fn(*mut c_void, *const u8) -> i32,
    pub fd_ctx_get: unsafe extern "C" fn(*mut c_void, u64, *mut u64) -> i32,
    pub fd_ctx_set: unsafe extern "C" fn(*mut c_void, u64, u64) -> i32,
    pub fd_ctx_del: unsafe extern "C" fn(*mut c_void, u64) -> i32,
    pub log: unsafe extern "C" fn(*mut c_void, u32, *const u8, u32),
    pub now_ns: unsafe extern "C" fn(*mut c_void) -> u64,
    pub buf_len: unsafe extern "C" fn(*mut c_void, u32) -> i64,
    pub buf_read: unsafe extern "C" fn(*mut c_void, u32, u64, *mut u8, u32) -> i64,
    pub buf_new: unsafe extern "C" fn(*mut c_void, *const u8, u32) -> i64,
    pub buf_slice: unsafe extern "C" fn(*mut c_void, u32, u64, u64) -> i64,
    pub buf_free: unsafe extern "C" fn(*mut c_void, u32) -> i32,
    pub declare: unsafe extern "C" fn(*mut c_void, *const u8, u32) -> i32,
}

/// A set of fop kinds, by ABI fop code (bit `c % 64` of word `c / 64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FopSet(pub [u64; 2]);

impl FopSet {
    /// No fop.
    pub const NONE: FopSet = FopSet([0; 2]);
    /// Every fop of this ABI version.
    pub const ALL: FopSet = {
        let mut s = FopSet::NONE;
        let mut i = 0;
        while i < FopKind::ALL.len() {
            s = s.with(FopKind::ALL[i]);
            i += 1;
        }
        s
    };

    /// Every fop that changes data, metadata or the namespace
    /// ([`FopKind::is_modifying`]): what a read-only gate must see.
    pub const MODIFYING: FopSet = FopSet::having(FopFlags::MODIFYING);

    /// Every fop with all of `flags` ([`FopKind::flags`]).
    pub const fn having(flags: FopFlags) -> FopSet {
        let mut s = FopSet::NONE;
        let mut i = 0;
        while i < FopKind::ALL.len() {
            if FopKind::ALL[i].flags().contains(flags) {
                s = s.with(FopKind::ALL[i]);
            }
            i += 1;
        }
        s
    }

    /// The kinds listed.
    pub const fn of(kinds: &[FopKind]) -> FopSet {
        let mut s = FopSet::NONE;
        let mut i = 0;
        while i < kinds.len() {
            s = s.with(kinds[i]);
            i += 1;
        }
        s
    }

    /// This set and `kind`.
    pub const fn with(mut self, kind: FopKind) -> FopSet {
        let code = kind as u16 as usize;
        self.0[code / 64] |= 1 << (code % 64);
        self
    }

    /// This set without `kind`.
    pub const fn without(mut self, kind: FopKind) -> FopSet {
        let code = kind as u16 as usize;
        self.0[code / 64] &= !(1 << (code % 64));
        self
    }

    /// True if `kind` is in the set.
    pub const fn contains(&self, kind: FopKind) -> bool {
        let code = kind as u16 as usize;
        self.0[code / 64] & (1 << (code % 64)) != 0
    }
}

/// A set of event kinds, by the ABI v1 event tag (`sdk/ABI.md` section 7):
/// bit 0 ChildUp ... bit 5 Upcall, bit 6 ClientGone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EventSet(pub u64);

impl EventSet {
    /// No event.
    pub const NONE: EventSet = EventSet(0);
    /// ChildUp.
    pub const CHILD_UP: EventSet = EventSet(1 << 0);
    /// ChildDown.
    pub const CHILD_DOWN: EventSet = EventSet(1 << 1);
    /// ChildConnecting.
    pub const CHILD_CONNECTING: EventSet = EventSet(1 << 2);
    /// ParentUp.
    pub const PARENT_UP: EventSet = EventSet(1 << 3);
    /// ParentDown.
    pub const PARENT_DOWN: EventSet = EventSet(1 << 4);
    /// Upcalls (lock contention, invalidation).
    pub const UPCALL: EventSet = EventSet(1 << 5);
    /// ClientGone.
    pub const CLIENT_GONE: EventSet = EventSet(1 << 6);

    /// Both sets.
    pub const fn union(self, other: EventSet) -> EventSet {
        EventSet(self.0 | other.0)
    }

    /// True if the set holds `event`'s kind.
    pub fn contains(&self, event: &Event) -> bool {
        let tag = match event {
            Event::ChildUp => 0,
            Event::ChildDown => 1,
            Event::ChildConnecting => 2,
            Event::ParentUp => 3,
            Event::ParentDown => 4,
            Event::Upcall(_) => 5,
            Event::ClientGone { .. } => 6,
        };
        self.0 & (1 << tag) != 0
    }
}

/// What a plugin declares about itself (`xlfs_describe` -> `declare`):
/// everything the host needs before building a node.
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    /// The plugin's name (for logs and `xlfs volfile check`).
    pub name: String,
    /// One line on what it does.
    pub description: String,
    /// Fewest children.
    pub min_children: u32,
    /// Most children ([`UNLIMITED_CHILDREN`] for no limit).
    pub max_children: u32,
    /// The fops that enter the guest; the rest pass to child 0 untouched.
    pub fops: FopSet,
    /// The events that enter the guest; the rest take the default path.
    pub events: EventSet,
    /// Declared options.
    pub options: Vec<DeclaredOption>,
}

/// One option a plugin declares (an owned [`OptionDecl`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DeclaredOption {
    /// The key.
    pub name: String,
    /// The type (enum words in `words`).
    pub ty: DeclaredType,
    /// The default, in textual form.
    pub default: Option<String>,
    /// Inclusive numeric bounds.
    pub range: Option<(f64, f64)>,
    /// What it does.
    pub description: String,
}

/// An option's type as declared by a plugin.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)] // as OptType
pub enum DeclaredType {
    Bool,
    Int,
    Size,
    Time,
    Percent,
    Str,
    Enum(Vec<String>),
    List,
    Path,
}

impl From<&OptionDecl> for DeclaredOption {
    fn from(d: &OptionDecl) -> DeclaredOption {
        let ty = match d.ty {
            OptType::Bool => DeclaredType::Bool,
            OptType::Int => DeclaredType::Int,
            OptType::Size => DeclaredType::Size,
            OptType::Time => DeclaredType::Time,
            OptType::Percent => DeclaredType::Percent,
            OptType::Str => DeclaredType::Str,
            OptType::Enum(words) => DeclaredType::Enum(words.iter().map(|w| w.to_string()).collect()),
            OptType::List => DeclaredType::List,
            OptType::Path => DeclaredType::Path,
            // Plugin ABI v1 has no module type: a plugin sees the text.
            OptType::Module => DeclaredType::Str,
        };
        DeclaredOption {
            name: d.name.to_string(),
            ty,
            default: d.default.map(String::from),
            range: d.range,
            description: d.description.to_string(),
        }
    }
}

/// Why a descriptor could not be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DescriptorError {
    /// It ends early.
    #[error("descriptor truncated at offset {0}")]
    Truncated(usize),
    /// A string is not UTF-8.
    #[error("descriptor string at offset {0} is not UTF-8")]
    BadUtf8(usize),
    /// A tag or flag out of range.
    #[error("descriptor has unknown {what} tag {tag}")]
    BadTag {
        /// What the tag selects.
        what: &'static str,
        /// The byte read.
        tag: u8,
    },
    /// A count or length over the descriptor limits.
    #[error("descriptor {what} {len} is over the limit {max}")]
    TooLong {
        /// What is too long.
        what: &'static str,
        /// The value read.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Bytes after the descriptor.
    #[error("{0} trailing bytes after the descriptor")]
    Trailing(usize),
    /// Contradictory content.
    #[error("descriptor: {0}")]
    Invalid(String),
}

/// Longest descriptor accepted, in bytes.
pub const MAX_DESCRIPTOR: usize = 1 << 20;
/// Most options a descriptor may declare.
pub const MAX_OPTIONS: usize = 256;
const MAX_STR: usize = 64 << 10;

impl Descriptor {
    /// Appends the encoding (`sdk/PLUGIN-ABI.md`, "Descriptor").
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_str(out, &self.name);
        put_str(out, &self.description);
        out.extend_from_slice(&self.min_children.to_le_bytes());
        out.extend_from_slice(&self.max_children.to_le_bytes());
        out.extend_from_slice(&(self.fops.0.len() as u32).to_le_bytes());
        for w in self.fops.0 {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&self.events.0.to_le_bytes());
        out.extend_from_slice(&(self.options.len() as u32).to_le_bytes());
        for o in &self.options {
            put_str(out, &o.name);
            let tag = match &o.ty {
                DeclaredType::Bool => 0u8,
                DeclaredType::Int => 1,
                DeclaredType::Size => 2,
                DeclaredType::Time => 3,
                DeclaredType::Percent => 4,
                DeclaredType::Str => 5,
                DeclaredType::Enum(_) => 6,
                DeclaredType::List => 7,
                DeclaredType::Path => 8,
            };
            out.push(tag);
            if let DeclaredType::Enum(words) = &o.ty {
                out.extend_from_slice(&(words.len() as u32).to_le_bytes());
                for w in words {
                    put_str(out, w);
                }
            }
            match &o.default {
                None => out.push(0),
                Some(d) => {
                    out.push(1);
                    put_str(out, d);
                }
            }
            match o.range {
                None => out.push(0),
                Some((lo, hi)) => {
                    out.push(1);
                    out.extend_from_slice(&lo.to_bits().to_le_bytes());
                    out.extend_from_slice(&hi.to_bits().to_le_bytes());
                }
            }
            put_str(out, &o.description);
        }
    }

    /// Reads a descriptor; hostile input gives an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Descriptor, DescriptorError> {
        if bytes.len() > MAX_DESCRIPTOR {
            return Err(DescriptorError::TooLong {
                what: "length",
                len: bytes.len() as u64,
                max: MAX_DESCRIPTOR as u64,
            });
        }
        let mut r = Rd { b: bytes, pos: 0 };
        let name = r.str()?;
        let description = r.str()?;
        let min_children = r.u32()?;
        let max_children = r.u32()?;
        if min_children > max_children {
            return Err(DescriptorError::Invalid(format!("min_children {min_children} > max_children {max_children}")));
        }
        let words = r.count("fop mask words", 64)?;
        let mut fops = FopSet::NONE;
        for w in 0..words {
            let bits = r.u64()?;
            // Codes this host does not know are never sent, so ignore them.
            if let Some(word) = fops.0.get_mut(w) {
                *word = bits;
            }
        }
        let known = FopSet::ALL;
        fops = FopSet([fops.0[0] & known.0[0], fops.0[1] & known.0[1]]);
        let events = EventSet(r.u64()?);
        let n = r.count("option count", MAX_OPTIONS)?;
        let mut options = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.str()?;
            let ty = match r.u8()? {
                0 => DeclaredType::Bool,
                1 => DeclaredType::Int,
                2 => DeclaredType::Size,
                3 => DeclaredType::Time,
                4 => DeclaredType::Percent,
                5 => DeclaredType::Str,
                6 => {
                    let k = r.count("enum word count", 1024)?;
                    let mut words = Vec::with_capacity(k);
                    for _ in 0..k {
                        words.push(r.str()?);
                    }
                    DeclaredType::Enum(words)
                }
                7 => DeclaredType::List,
                8 => DeclaredType::Path,
                tag => return Err(DescriptorError::BadTag { what: "option type", tag }),
            };
            let default = match r.u8()? {
                0 => None,
                1 => Some(r.str()?),
                tag => return Err(DescriptorError::BadTag { what: "default flag", tag }),
            };
            let range = match r.u8()? {
                0 => None,
                1 => Some((f64::from_bits(r.u64()?), f64::from_bits(r.u64()?))),
                tag => return Err(DescriptorError::BadTag { what: "range flag", tag }),
            };
            let description = r.str()?;
            if name.is_empty() {
                return Err(DescriptorError::Invalid("an option has an empty name".into()));
            }
            options.push(DeclaredOption { name, ty, default, range, description });
        }
        if r.pos != bytes.len() {
            return Err(DescriptorError::Trailing(bytes.len() - r.pos));
        }
        Ok(Descriptor { name, description, min_children, max_children, fops, events, options })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Rd<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DescriptorError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or(DescriptorError::Truncated(self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DescriptorError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DescriptorError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, DescriptorError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn count(&mut self, what: &'static str, max: usize) -> Result<usize, DescriptorError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DescriptorError::TooLong { what, len: n as u64, max: max as u64 });
        }
        Ok(n)
    }
    fn str(&mut self) -> Result<String, DescriptorError> {
        let n = self.count("string length", MAX_STR)?;
        let at = self.pos;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| DescriptorError::BadUtf8(at))
    }
}

/// Encodes a fop message (`xlfs_on_fop`, `wind`): `u32` length of the
/// caller context (0: none, meaning the frame's own), the CallCtx, then
/// the Request. A WRITE's data must already be taken out
/// ([`take_fop_data`]): it crosses as a buffer handle.
pub fn encode_call(ctx: Option<&CallCtx>, req: &Request, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    if let Some(ctx) = ctx {
        abi::encode(ctx, out);
        let n = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&n.to_le_bytes());
    }
    abi::encode(req, out);
}

/// Decodes a fop message; the WRITE data, if any, is empty.
pub fn decode_call(bytes: &[u8], limits: &Limits) -> Result<(Option<CallCtx>, Request), DecodeError> {
    let Some((len, rest)) = bytes.split_first_chunk::<4>() else {
        return Err(DecodeError::Truncated { offset: 0, needed: 4, remaining: bytes.len() });
    };
    let n = u32::from_le_bytes(*len) as usize;
    if n > rest.len() {
        return Err(DecodeError::Truncated { offset: 4, needed: n as u64, remaining: rest.len() });
    }
    let (ctx_bytes, req_bytes) = rest.split_at(n);
    let ctx = if n == 0 { None } else { Some(abi::decode::<CallCtx>(ctx_bytes, None, limits)?) };
    let req = abi::decode::<Request>(req_bytes, None, limits)?;
    Ok((ctx, req))
}

/// Takes a WRITE's data out of `fop` (leaving it empty).
pub fn take_fop_data(fop: &mut Fop) -> Option<Bytes> {
    match fop {
        Fop::Writev { data, .. } => Some(std::mem::take(data)),
        _ => None,
    }
}

/// Puts data into a WRITE; false if `fop` is not a WRITE.
pub fn put_fop_data(fop: &mut Fop, bytes: Bytes) -> bool {
    match fop {
        Fop::Writev { data, .. } => {
            *data = bytes;
            true
        }
        _ => false,
    }
}

/// Takes a Read reply's data out of `result` (leaving it empty).
pub fn take_result_data(result: &mut FopResult) -> Option<Bytes> {
    match result {
        Ok(r) => match &mut r.reply {
            Reply::Read { data, .. } => Some(std::mem::take(data)),
            _ => None,
        },
        Err(_) => None,
    }
}

/// Puts data into a Read reply; false if `result` is not one.
pub fn put_result_data(result: &mut FopResult, bytes: Bytes) -> bool {
    match result {
        Ok(r) => match &mut r.reply {
            Reply::Read { data, .. } => {
                *data = bytes;
                true
            }
            _ => false,
        },
        Err(_) => false,
    }
}

/// The plugin ABI's version: the encoding's major ([`abi::ABI_MAJOR`]) and
/// the plugin interface's own minor, which moves without the encoding's
/// (v1.1 adds the policy exports, v1.2 `xlfs_dump` and `xlfs_reconfigure`;
/// the messages are encoding v1.0). The host loads a plugin by ABI §8's
/// rule against this version.
pub const PLUGIN_ABI: AbiVersion = AbiVersion::new(abi::ABI_MAJOR, 2);

/// The translator exports of ABI v1.2, each optional: the host probes for
/// them (in modules that declare v1.2 or newer) and does without.
pub mod node_exports {
    /// `int32_t (xlfs_inst, uint8_t *out, uint32_t cap)`: the instance's
    /// own state as an encoded Dict of Str values (ABI §3) written to
    /// `out`; returns the encoding's length. A length above `cap` means
    /// nothing was written: the host calls again with at least that much
    /// room (up to [`super::MAX_DUMP`]). `-1` failed (a crash), any other
    /// negative errno: nothing to report.
    pub const DUMP: &str = "xlfs_dump";
    /// `int32_t (xlfs_inst, const uint8_t *opts, uint32_t len)`: new
    /// options (a Dict, as `xlfs_init` gets them) for the running
    /// instance. `0` applied; [`super::RECONFIGURE_UNSUPPORTED`]
    /// (`-EOPNOTSUPP`): the plugin cannot, the host rebuilds the node; any
    /// other negative errno but `-1`: refused (the plugin logs why at error
    /// level first, naming the option), the old options stay; `-1` failed
    /// (a crash; the old options stay).
    pub const RECONFIGURE: &str = "xlfs_reconfigure";
}

/// Longest dump (`xlfs_dump`) the host accepts, in bytes.
pub const MAX_DUMP: usize = 1 << 20;
/// `xlfs_reconfigure`'s result when the plugin cannot change its options
/// in place (`-EOPNOTSUPP`): the host rebuilds the node instead.
pub const RECONFIGURE_UNSUPPORTED: i32 = -crate::Errno::EOPNOTSUPP.0;

/// Which ABI v1.2 translator exports a module has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeExports {
    /// `xlfs_dump` is there.
    pub dump: bool,
    /// `xlfs_reconfigure` is there.
    pub reconfigure: bool,
}

impl NodeExports {
    /// What a module of `version` with these export names has (nothing
    /// before v1.2).
    pub fn probe<'a>(version: AbiVersion, names: impl Iterator<Item = &'a str>) -> NodeExports {
        let mut found = NodeExports::default();
        if version.minor < 2 {
            return found;
        }
        for n in names {
            found.dump |= n == node_exports::DUMP;
            found.reconfigure |= n == node_exports::RECONFIGURE;
        }
        found
    }
}

/// Encodes a dump (`xlfs_dump`): the pairs as a Dict of Str values (a key
/// given twice keeps its last value; keys come back sorted).
pub fn encode_dump(pairs: &[(String, String)], out: &mut Vec<u8>) {
    let mut d = crate::Dict::new();
    for (k, v) in pairs {
        d.set_str(k.clone(), v.clone());
    }
    abi::encode(&d, out);
}

/// Decodes a dump; values that are not strings are shown as the ABI's
/// debug form of the value.
pub fn decode_dump(bytes: &[u8]) -> Result<Vec<(String, String)>, DecodeError> {
    let d = abi::decode::<crate::Dict>(bytes, None, &Limits::DEFAULT)?;
    Ok(d.iter()
        .map(|(k, v)| {
            let v = match v {
                crate::Value::Str(s) => s.clone(),
                other => format!("{other:?}"),
            };
            (k.clone(), v)
        })
        .collect())
}

/// The policy exports (ABI v1.1, all optional): a module exporting every
/// function of one group provides that policy.
pub mod policy_exports {
    /// `int64_t (xlfs_inst, uint64_t page_size, uint32_t page_count)`: a
    /// new read-ahead stream; its id (> 0) or a negative errno.
    pub const RA_OPEN: &str = "xlfs_ra_open";
    /// `int32_t (xlfs_inst, uint64_t stream, uint64_t offset, uint64_t size,
    /// uint64_t at_ns, uint8_t *out, uint32_t cap)`: a read; writes the
    /// encoded advice to `out` and returns its length, or a negative errno.
    pub const RA_READ: &str = "xlfs_ra_read";
    /// `int32_t (xlfs_inst, uint64_t stream, uint64_t page_size, uint32_t
    /// page_count)`: the translator emptied the stream's cache.
    pub const RA_RESET: &str = "xlfs_ra_reset";
    /// `int32_t (xlfs_inst, uint64_t stream)`: the fd is released.
    pub const RA_CLOSE: &str = "xlfs_ra_close";
    /// The read-ahead group.
    pub const READ_AHEAD: &[&str] = &[RA_OPEN, RA_READ, RA_RESET, RA_CLOSE];
    /// `int32_t (xlfs_inst)`: the counts the policy wants, as
    /// [`super::LOCK_WANTS_INODELK_COUNT`] | [`super::LOCK_WANTS_OPEN_FD_COUNT`].
    pub const LOCK_INTEREST: &str = "xlfs_lock_interest";
    /// `int64_t (xlfs_inst, uint32_t event, const uint8_t *view, uint32_t
    /// len)`: the decision ([`super::encode_decision`]), or `-1` on failure.
    pub const LOCK_DECIDE: &str = "xlfs_lock_decide";
    /// The lock-contention group.
    pub const LOCK_CONTENTION: &[&str] = &[LOCK_INTEREST, LOCK_DECIDE];
}

/// Which policies a module's exports provide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyExports {
    /// Every read-ahead export is there.
    pub read_ahead: bool,
    /// Every lock-contention export is there.
    pub lock_contention: bool,
}

impl PolicyExports {
    /// What a module of `version` with these export names provides (nothing
    /// before v1.1).
    pub fn probe<'a>(version: AbiVersion, names: impl Iterator<Item = &'a str>) -> PolicyExports {
        if version.minor < 1 {
            return PolicyExports::default();
        }
        let names: Vec<&str> = names.collect();
        let all = |group: &[&str]| group.iter().all(|g| names.contains(g));
        PolicyExports {
            read_ahead: all(policy_exports::READ_AHEAD),
            lock_contention: all(policy_exports::LOCK_CONTENTION),
        }
    }
}

/// `xlfs_lock_interest` bit: report the inodelk count.
pub const LOCK_WANTS_INODELK_COUNT: i32 = 1;
/// `xlfs_lock_interest` bit: report the open fd count.
pub const LOCK_WANTS_OPEN_FD_COUNT: i32 = 2;
/// Most ranges of each kind in one read-ahead advice.
pub const MAX_ADVICE_RANGES: usize = 64;
/// The largest encoded advice: what the host's `out` buffer holds.
pub const MAX_ADVICE: usize = 1 + 2 * (4 + MAX_ADVICE_RANGES * 16);
/// Length of an encoded lock view (ABI v1.1; later minors may append).
pub const LOCK_VIEW_LEN: usize = 50;

/// The interest bits of `i`.
pub fn interest_bits(i: Interest) -> i32 {
    (if i.inodelk_count { LOCK_WANTS_INODELK_COUNT } else { 0 })
        | (if i.open_fd_count { LOCK_WANTS_OPEN_FD_COUNT } else { 0 })
}

/// The interest in bits `b` (unknown bits ignored).
pub fn interest_from_bits(b: i32) -> Interest {
    Interest { inodelk_count: b & LOCK_WANTS_INODELK_COUNT != 0, open_fd_count: b & LOCK_WANTS_OPEN_FD_COUNT != 0 }
}

/// A decision as `xlfs_lock_decide` returns it: `0` keep, `1` release now,
/// `n >= 2` release within `n - 1` ms (so `ReleaseAfter { ms: 0 }` is `1`).
pub fn encode_decision(d: Decision) -> i64 {
    match d {
        Decision::Keep => 0,
        Decision::ReleaseNow => 1,
        Decision::ReleaseAfter { ms } => i64::try_from(ms.saturating_add(1)).unwrap_or(i64::MAX),
    }
}

/// The decision `xlfs_lock_decide` returned; `None` for a negative value.
pub fn decode_decision(v: i64) -> Option<Decision> {
    match v {
        ..0 => None,
        0 => Some(Decision::Keep),
        1 => Some(Decision::ReleaseNow),
        n => Some(Decision::ReleaseAfter { ms: (n - 1) as u64 }),
    }
}

/// Encodes a lock view: gfid (16 bytes), held and contended (one byte
/// each, 0/1), then `u32` local_open_fds, brick_open_fds, inodelk_count,
/// in_flight, and `u64` txns, held_ms, little-endian: [`LOCK_VIEW_LEN`] bytes.
pub fn encode_lock_view(v: &LockView, out: &mut Vec<u8>) {
    out.extend_from_slice(&v.gfid.0);
    out.push(u8::from(v.held));
    out.push(u8::from(v.contended));
    for n in [v.local_open_fds, v.brick_open_fds, v.inodelk_count, v.in_flight] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&v.txns.to_le_bytes());
    out.extend_from_slice(&v.held_ms.to_le_bytes());
}

/// Decodes a lock view; bytes past [`LOCK_VIEW_LEN`] (a later minor's
/// fields) are ignored.
pub fn decode_lock_view(b: &[u8]) -> Option<LockView> {
    let b = b.get(..LOCK_VIEW_LEN)?;
    let u32_at = |i: usize| b.get(i..i + 4).and_then(|s| s.try_into().ok()).map(u32::from_le_bytes);
    let u64_at = |i: usize| b.get(i..i + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes);
    Some(LockView {
        gfid: crate::Gfid(b.get(..16)?.try_into().ok()?),
        held: b[16] != 0,
        contended: b[17] != 0,
        local_open_fds: u32_at(18)?,
        brick_open_fds: u32_at(22)?,
        inodelk_count: u32_at(26)?,
        in_flight: u32_at(30)?,
        txns: u64_at(34)?,
        held_ms: u64_at(42)?,
    })
}

/// Encodes read-ahead advice: `u8` reset (0/1), then the prefetch and the
/// drop ranges, each as a `u32` count and that many (`u64` offset, `u64`
/// len), little-endian. Ranges past [`MAX_ADVICE_RANGES`] of a kind are
/// left out.
pub fn encode_advice(a: &Advice, out: &mut Vec<u8>) {
    out.push(u8::from(a.reset));
    for ranges in [&a.prefetch, &a.drop] {
        let n = ranges.len().min(MAX_ADVICE_RANGES);
        out.extend_from_slice(&(n as u32).to_le_bytes());
        for r in &ranges[..n] {
            out.extend_from_slice(&r.offset.to_le_bytes());
            out.extend_from_slice(&r.len.to_le_bytes());
        }
    }
}

/// Decodes read-ahead advice; `None` if it is malformed, has more than
/// [`MAX_ADVICE_RANGES`] ranges of a kind, or has bytes left over.
pub fn decode_advice(b: &[u8]) -> Option<Advice> {
    let mut pos = 0usize;
    let mut take = |n: usize| {
        let s = b.get(pos..pos.checked_add(n)?)?;
        pos += n;
        Some(s)
    };
    let reset = match take(1)?[0] {
        0 => false,
        1 => true,
        _ => return None,
    };
    let mut lists = [Vec::new(), Vec::new()];
    for list in &mut lists {
        let n = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        if n > MAX_ADVICE_RANGES {
            return None;
        }
        for _ in 0..n {
            let offset = u64::from_le_bytes(take(8)?.try_into().ok()?);
            let len = u64::from_le_bytes(take(8)?.try_into().ok()?);
            list.push(Range { offset, len });
        }
    }
    if take(1).is_some() {
        return None;
    }
    let [prefetch, drop] = lists;
    Some(Advice { prefetch, drop, reset })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dict, Errno, Fd, FdId, Gfid, Loc, Response};

    fn sample() -> Descriptor {
        const DECLS: &[OptionDecl] = &[
            OptionDecl::new("level", OptType::Enum(&["debug", "info"])).default("info").desc("how loud"),
            OptionDecl::new("count", OptType::Int).default("3").range(1.0, 10.0),
            OptionDecl::new("fops", OptType::List),
        ];
        Descriptor {
            name: "t".into(),
            description: "a test".into(),
            min_children: 1,
            max_children: UNLIMITED_CHILDREN,
            fops: FopSet::of(&[FopKind::Writev, FopKind::Forget]),
            events: EventSet::CHILD_UP.union(EventSet::UPCALL),
            options: DECLS.iter().map(DeclaredOption::from).collect(),
        }
    }

    #[test]
    fn descriptor_round_trips_and_refuses_every_truncation() {
        let d = sample();
        let mut b = Vec::new();
        d.encode(&mut b);
        assert_eq!(Descriptor::decode(&b), Ok(d));
        for cut in 0..b.len() {
            assert!(Descriptor::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        b.push(0);
        assert_eq!(Descriptor::decode(&b), Err(DescriptorError::Trailing(1)));
    }

    #[test]
    fn descriptor_refuses_bad_tags_and_huge_counts() {
        let mut d = sample();
        d.options.truncate(1);
        let mut b = Vec::new();
        d.encode(&mut b);
        // The option's type tag follows everything before the options and
        // the option's name.
        let mut head = Vec::new();
        Descriptor { options: Vec::new(), ..d.clone() }.encode(&mut head);
        let tag_at = head.len() + 4 + d.options[0].name.len();
        assert_eq!(b[tag_at], 6, "the enum tag");
        let mut bad = b.clone();
        bad[tag_at] = 42;
        assert!(matches!(Descriptor::decode(&bad), Err(DescriptorError::BadTag { what: "option type", tag: 42 })));
        let mut huge = Vec::new();
        put_str(&mut huge, "n");
        put_str(&mut huge, "");
        huge.extend_from_slice(&0u32.to_le_bytes());
        huge.extend_from_slice(&1u32.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Descriptor::decode(&huge), Err(DescriptorError::TooLong { .. })));
    }

    #[test]
    fn fop_and_event_sets() {
        let s = FopSet::of(&[FopKind::Lookup, FopKind::Forget]);
        assert!(s.contains(FopKind::Lookup) && s.contains(FopKind::Forget) && !s.contains(FopKind::Stat));
        assert!(!s.without(FopKind::Lookup).contains(FopKind::Lookup));
        assert!(FopKind::ALL.iter().all(|&k| FopSet::ALL.contains(k)));
        for &k in FopKind::ALL {
            assert_eq!(FopSet::MODIFYING.contains(k), k.is_modifying(), "{k:?}");
        }
        assert!(FopSet::MODIFYING.contains(FopKind::Xattrop) && FopSet::MODIFYING.contains(FopKind::Fxattrop));
        let e = EventSet::CHILD_UP.union(EventSet::CLIENT_GONE);
        assert!(e.contains(&Event::ChildUp) && e.contains(&Event::ClientGone { client_id: "c".into() }));
        assert!(!e.contains(&Event::ParentUp));
    }

    #[test]
    fn version_symbols() {
        assert_eq!(version_symbol(AbiVersion::new(1, 0)), "xlfs_abi_version_1_0");
        assert_eq!(parse_version_symbol("xlfs_abi_version_2_13"), Some(AbiVersion::new(2, 13)));
        for bad in
            ["xlfs_abi_version_1", "xlfs_abi_version__0", "xlfs_abi_version_1_x", "xlfs_init", "xlfs_abi_version_1_0_0"]
        {
            assert_eq!(parse_version_symbol(bad), None, "{bad}");
        }
    }

    #[test]
    fn call_messages_carry_ctx_and_leave_data_out() {
        let fd = Fd { id: FdId(3), gfid: Gfid::ROOT };
        let mut req = Request::with_xdata(
            Fop::Writev { fd, data: Bytes::from_static(b"abc"), offset: 9, flags: 0 },
            Dict::new().with("k", crate::Value::U64(1)),
        );
        let data = take_fop_data(&mut req.fop).expect("a write");
        assert_eq!(&data[..], b"abc");
        let ctx = CallCtx::root("me");
        for c in [None, Some(&ctx)] {
            let mut b = Vec::new();
            encode_call(c, &req, &mut b);
            let (got_ctx, mut got) = decode_call(&b, &Limits::DEFAULT).expect("decodes");
            assert_eq!(got_ctx.as_ref(), c);
            assert!(put_fop_data(&mut got.fop, data.clone()));
            assert!(matches!(&got.fop, Fop::Writev { data, offset: 9, .. } if &data[..] == b"abc"));
            for cut in 0..b.len() {
                assert!(decode_call(&b[..cut], &Limits::DEFAULT).is_err(), "cut {cut}");
            }
        }
        assert!(!put_fop_data(&mut Fop::Stat { loc: Loc::root() }, data));
        let mut r: FopResult =
            Ok(Response::from(Reply::Read { data: Bytes::from_static(b"x"), iatt: Default::default() }));
        assert_eq!(take_result_data(&mut r).as_deref(), Some(&b"x"[..]));
        assert!(put_result_data(&mut r, Bytes::from_static(b"y")));
        assert_eq!(take_result_data(&mut Err(Errno::EIO)), None);
    }

    #[test]
    fn policy_messages_round_trip_and_refuse_garbage() {
        let a = Advice { prefetch: vec![Range { offset: 4096, len: 8192 }], drop: vec![Range::ALL], reset: true };
        let mut b = Vec::new();
        encode_advice(&a, &mut b);
        assert!(b.len() <= MAX_ADVICE);
        assert_eq!(decode_advice(&b), Some(a));
        for n in 0..b.len() {
            assert_eq!(decode_advice(&b[..n]), None, "truncated at {n}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode_advice(&long), None);
        let many = Advice { prefetch: vec![Range { offset: 0, len: 1 }; MAX_ADVICE_RANGES + 5], ..Advice::default() };
        b.clear();
        encode_advice(&many, &mut b);
        assert_eq!(decode_advice(&b).map(|a| a.prefetch.len()), Some(MAX_ADVICE_RANGES));
        b[1..5].copy_from_slice(&(MAX_ADVICE_RANGES as u32 + 1).to_le_bytes());
        assert_eq!(decode_advice(&b), None);

        let v = LockView {
            gfid: crate::Gfid([3; 16]),
            held: true,
            local_open_fds: 2,
            brick_open_fds: 3,
            inodelk_count: 4,
            in_flight: 5,
            txns: 6,
            held_ms: 7,
            contended: true,
        };
        b.clear();
        encode_lock_view(&v, &mut b);
        assert_eq!(b.len(), LOCK_VIEW_LEN);
        b.extend_from_slice(b"later");
        assert_eq!(decode_lock_view(&b), Some(v));
        assert_eq!(decode_lock_view(&b[..LOCK_VIEW_LEN - 1]), None);

        for d in [Decision::Keep, Decision::ReleaseNow, Decision::ReleaseAfter { ms: 250 }] {
            assert_eq!(decode_decision(encode_decision(d)), Some(d));
        }
        assert_eq!(decode_decision(encode_decision(Decision::ReleaseAfter { ms: 0 })), Some(Decision::ReleaseNow));
        assert_eq!(decode_decision(-1), None);
        let i = Interest { inodelk_count: false, open_fd_count: true };
        assert_eq!(interest_from_bits(interest_bits(i)), i);
    }

    #[test]
    fn node_exports_are_probed_from_v1_2_on_and_dumps_round_trip() {
        let names = ["xlfs_init", "xlfs_dump", "xlfs_reconfigure"];
        let all = NodeExports { dump: true, reconfigure: true };
        assert_eq!(NodeExports::probe(AbiVersion::new(1, 2), names.iter().copied()), all);
        assert_eq!(NodeExports::probe(AbiVersion::new(1, 1), names.iter().copied()), NodeExports::default());
        let only = NodeExports::probe(AbiVersion::new(1, 2), ["xlfs_dump"].into_iter());
        assert_eq!(only, NodeExports { dump: true, reconfigure: false });
        let pairs = vec![("b".to_string(), "2".to_string()), ("a".to_string(), "x y".to_string())];
        let mut b = Vec::new();
        encode_dump(&pairs, &mut b);
        assert_eq!(decode_dump(&b).expect("decodes"), [pairs[1].clone(), pairs[0].clone()]);
        for cut in 0..b.len() {
            assert!(decode_dump(&b[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn policy_exports_are_probed_from_v1_1_on() {
        let names = ["xlfs_init", "xlfs_ra_open", "xlfs_ra_read", "xlfs_ra_reset", "xlfs_ra_close", "xlfs_lock_decide"];
        let p = PolicyExports::probe(AbiVersion::new(1, 1), names.iter().copied());
        assert_eq!(p, PolicyExports { read_ahead: true, lock_contention: false });
        assert_eq!(PolicyExports::probe(AbiVersion::new(1, 0), names.iter().copied()), PolicyExports::default());
    }
}
