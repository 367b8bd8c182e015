//! # xlfs-sdk
//!
//! Everything a translator author needs, and nothing of the runtime: the fop
//! model ([`Fop`], [`Reply`], [`Gfid`], [`Iatt`], [`Loc`], [`Dict`],
//! [`Errno`]), the async [`Xlator`] trait and how a translator holds its
//! children, per-inode and per-fd context [`slots`], option declarations
//! ([`options`]), and the ABI v1 byte encoding ([`abi`]) that carries the same
//! model over the network and across the plugin boundary (`sdk/ABI.md`).
//!
//! Dependencies point one way: `xlfs-sdk` <- `xlfs-xlators` <- `xlfs-runtime`.
#![deny(missing_docs)]

pub mod abi;
pub mod ctx;
pub mod dict;
pub mod errno;
pub mod fop;
pub mod guest;
pub mod options;
pub mod policy;
pub mod profile;
#[cfg(not(all(target_family = "wasm", target_os = "unknown")))]
mod rand;
pub mod slots;
#[cfg(feature = "testing")]
pub mod testing;
pub mod types;
pub mod xlator;

pub use ctx::CallCtx;
pub use dict::{Dict, Value};
pub use errno::Errno;
pub use fop::{Fop, FopFlags, FopKind, FopResult, IPC_DRAIN, Reply, ReplyKind, Request, Response, WrongReply};
pub use options::{OptType, OptValue, OptionDecl, Options};
pub use types::*;
pub use xlator::{Child, Event, EventFrom, EventSink, FopFuture, InitCtx, InitError, Upcall, Xlator, XlatorType};
