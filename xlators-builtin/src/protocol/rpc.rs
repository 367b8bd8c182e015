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
//!
//! The three live in `frames`, `messages` and `socket`, re-exported here;
//! this file keeps the transport options both sides declare.

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

mod frames;
mod messages;
mod socket;

pub use frames::*;
pub use messages::*;
pub use socket::*;

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
mod tests;
