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
//! - [`TlsStream`] puts a TLS session (rustls) under both halves when
//!   `transport.socket.ssl-enabled` is on ([`WireRead`], [`WireWrite`]).
//! - The local transport: a brick also listens on an abstract Unix socket
//!   named after its TCP address ([`local_socket_name`]); a client on the
//!   same host connects there instead and hands the brick shared memory
//!   regions, so write and read data cross by reference ([`shm`]).
//!
//! They live in `frames`, `messages`, `socket` and `tls`, re-exported
//! here; this file keeps the transport options both sides declare.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use xlfs_sdk::abi::{self, AbiVersion, DecodeError, HELLO_LEN, Limits};
use xlfs_sdk::{CallCtx, Dict, Event, FopResult, Request};

mod frames;
mod messages;
pub mod shm;
mod socket;
mod tls;
mod unix;

pub use frames::*;
pub use messages::*;
pub use socket::*;
pub use tls::*;

/// The GlusterFS transport options both protocol translators declare
/// (through `with_transport_options!`), read by
/// [`SocketOptions::from_options`] and [`check_transport`].
pub mod transport {
    use xlfs_sdk::options::{Opt, kind};

    /// `transport-type`.
    pub const TYPE: Opt<kind::Str> = Opt::str("transport-type", "tcp").desc("The transport; only 'tcp' is supported.");
    /// `transport.address-family`.
    pub const FAMILY: Opt<kind::Str> =
        Opt::one_of("transport.address-family", &["inet", "inet6", "unix", "inet-sdp"], "inet")
            .desc("Address family; only 'inet' (IPv4) is supported, others are an init error.");
    /// `transport.socket.ssl-enabled`.
    pub const SSL: Opt<kind::Bool> = Opt::bool("transport.socket.ssl-enabled", false).desc(
        "TLS on the connection, certificates checked both ways (own certificate, key and CA list below). A brick \
         with it on speaks only TLS: plain clients and clients without a certificate from its CAs are refused.",
    );
    /// `transport.socket.ssl-own-cert`.
    pub const SSL_OWN_CERT: Opt<kind::Str> = Opt::str("transport.socket.ssl-own-cert", "/etc/ssl/glusterfs.pem")
        .desc("This side's certificate (PEM, the chain after it if any).");
    /// `transport.socket.ssl-private-key`.
    pub const SSL_PRIVATE_KEY: Opt<kind::Str> = Opt::str("transport.socket.ssl-private-key", "/etc/ssl/glusterfs.key")
        .desc("The private key of ssl-own-cert (PEM).");
    /// `transport.socket.ssl-ca-list`.
    pub const SSL_CA_LIST: Opt<kind::Str> = Opt::str("transport.socket.ssl-ca-list", "/etc/ssl/glusterfs.ca")
        .desc("The CA certificates (PEM) the peer's certificate must be signed by.");
    /// `transport.socket.keepalive`.
    pub const KEEPALIVE: Opt<kind::Bool> = Opt::bool("transport.socket.keepalive", true)
        .desc("TCP keepalive probes on every connection, so a dead peer is noticed while idle.");
    /// `transport.socket.keepalive-time`.
    pub const KEEPALIVE_TIME: Opt<kind::Int> = Opt::int("transport.socket.keepalive-time", "20")
        .range(1.0, 86400.0)
        .desc("Seconds of idleness before the first keepalive probe.");
    /// `transport.socket.keepalive-interval`.
    pub const KEEPALIVE_INTERVAL: Opt<kind::Int> = Opt::int("transport.socket.keepalive-interval", "2")
        .range(1.0, 86400.0)
        .desc("Seconds between keepalive probes.");
    /// `transport.socket.keepalive-count`.
    pub const KEEPALIVE_COUNT: Opt<kind::Int> = Opt::int("transport.socket.keepalive-count", "9")
        .range(1.0, 127.0)
        .desc("Unanswered keepalive probes before the connection is declared dead.");
    /// `transport.local`.
    pub const LOCAL: Opt<kind::Bool> = Opt::bool("transport.local", true).desc(
        "A client: reach a brick on this host through the brick's Unix socket rather than TCP, with write and \
         read data in shared memory (no socket copies); TCP when the brick is elsewhere or does not offer it. A \
         brick: also listen on that socket (never with TLS on).",
    );
    /// `transport.local.shm-size`.
    pub const SHM_SIZE: Opt<kind::Size> = Opt::size("transport.local.shm-size", "64MB").range(0.0, 4294967296.0).desc(
        "A client: bytes of shared memory for payloads to local bricks, once per process for writes (the first \
             client's size) and again per local connection for reads (up to a quarter of it); 0 sends every \
             payload through the socket. Only pages used are resident.",
    );
    /// `transport.tcp-user-timeout`.
    pub const USER_TIMEOUT: Opt<kind::Time> = Opt::time("transport.tcp-user-timeout", "0")
        .range(0.0, 86400.0)
        .desc("Longest time sent data may stay unacknowledged before the connection is dropped (0: system default).");
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
        use transport::*;
        let secs =
            |opt: xlfs_sdk::options::Opt<xlfs_sdk::options::kind::Int>| Duration::from_secs(opt.count(o).max(1) as u64);
        let keepalive = KEEPALIVE
            .get(o)
            .then(|| (secs(KEEPALIVE_TIME), secs(KEEPALIVE_INTERVAL), KEEPALIVE_COUNT.get(o).clamp(1, 127) as u32));
        SocketOptions { keepalive, user_timeout: USER_TIMEOUT.get(o) }
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
/// TCP over IPv4 (with or without TLS).
pub fn check_transport(o: &xlfs_sdk::Options) -> Result<(), String> {
    use transport::*;
    match FAMILY.get(o) {
        "inet" => {}
        f => return Err(format!("transport.address-family {f}: only inet is supported")),
    }
    match TYPE.get(o) {
        t if t.eq_ignore_ascii_case("tcp") => {}
        t => return Err(format!("transport-type {t}: only tcp is supported")),
    }
    Ok(())
}

/// The abstract Unix socket a brick listening on TCP `addr` also listens
/// on (the local transport).
pub fn local_socket_name(addr: std::net::SocketAddr) -> String {
    format!("xlfs-brick/{addr}")
}

/// True when `ip` is an address of this host (in this network namespace):
/// a socket can be bound to it.
pub fn is_local_ip(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// The first byte a local-transport client sends, with its regions'
/// memfds (SCM_RIGHTS) or none.
pub mod local_preface {
    /// Two memfds follow: the send region, then the receive region.
    pub const SHARED: u8 = b'S';
    /// No shared memory: payloads go through the socket.
    pub const PLAIN: u8 = b'P';
}

/// An option array: the given declarations, then the GlusterFS transport
/// options both translators declare ([`transport`]).
macro_rules! with_transport_options {
    ($($decl:expr),* $(,)?) => {
        &[
            $($decl,)*
            $crate::protocol::rpc::transport::TYPE.decl,
            $crate::protocol::rpc::transport::FAMILY.decl,
            $crate::protocol::rpc::transport::SSL.decl,
            $crate::protocol::rpc::transport::SSL_OWN_CERT.decl,
            $crate::protocol::rpc::transport::SSL_PRIVATE_KEY.decl,
            $crate::protocol::rpc::transport::SSL_CA_LIST.decl,
            $crate::protocol::rpc::transport::KEEPALIVE.decl,
            $crate::protocol::rpc::transport::KEEPALIVE_TIME.decl,
            $crate::protocol::rpc::transport::KEEPALIVE_INTERVAL.decl,
            $crate::protocol::rpc::transport::KEEPALIVE_COUNT.decl,
            $crate::protocol::rpc::transport::USER_TIMEOUT.decl,
            $crate::protocol::rpc::transport::LOCAL.decl,
            $crate::protocol::rpc::transport::SHM_SIZE.decl,
        ]
    };
}
pub(crate) use with_transport_options;

#[cfg(test)]
mod tests;
