//! A raw peer of a brick: a blocking TCP connection that speaks the wire
//! protocol (`sdk/WIRE.md`) frame by frame, without protocol/client's
//! checks, for tests that send what a well-behaved client never would
//! (bad frames, hostile values, floods, never reading replies).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use xlfs_sdk::abi::AbiVersion;
use xlfs_sdk::{CallCtx, Dict, Errno, Fop, FopResult, Request, Value};
use xlfs_xlators::protocol::rpc::{self, FrameKind, Message};

/// How long a raw peer waits for a frame before the test fails: a hang
/// guard.
pub const RAW_GUARD: Duration = Duration::from_secs(20);

/// A raw connection to a brick.
pub struct Raw {
    pub sock: TcpStream,
    buf: BytesMut,
    next_id: u64,
}

impl Raw {
    /// Connects to `addr` without a handshake.
    pub fn connect(addr: SocketAddr) -> Raw {
        let sock = TcpStream::connect(addr).expect("connect to the brick");
        sock.set_read_timeout(Some(RAW_GUARD)).expect("read timeout");
        Raw { sock, buf: BytesMut::new(), next_id: 1 }
    }

    /// Connects to `addr` and shakes hands for `volume` as `client_id`;
    /// panics when refused.
    pub fn hello(addr: SocketAddr, volume: &str, client_id: &str) -> Raw {
        let mut raw = Raw::connect(addr);
        let params = Dict::new()
            .with(rpc::hello_keys::VOLUME, Value::Str(volume.into()))
            .with(rpc::hello_keys::CLIENT_ID, Value::Str(client_id.into()));
        raw.send_msg(&Message::Hello(rpc::Hello { version: AbiVersion::CURRENT, params }), 0);
        match raw.recv().map(|(_, m)| m) {
            Some(Message::HelloReply(r)) => assert!(r.accepted, "handshake refused: {}", r.reason),
            other => panic!("expected HELLO_REPLY, got {other:?}"),
        }
        raw
    }

    /// A second handle on the same connection (for a reader thread beside
    /// a sender); its buffer starts empty.
    pub fn try_clone(&self) -> Raw {
        Raw { sock: self.sock.try_clone().expect("clone the socket"), buf: BytesMut::new(), next_id: 1 << 40 }
    }

    /// Writes bytes as they are (the brick may already have closed: what
    /// matters is what it does, so a failed write is not an error here).
    pub fn send(&mut self, bytes: &[u8]) -> bool {
        self.sock.write_all(bytes).is_ok()
    }

    /// Sends a message with frame id `id`.
    pub fn send_msg(&mut self, m: &Message, id: u64) -> bool {
        self.send(&m.to_frame(id).expect("the message encodes").to_vec())
    }

    /// Sends `fop` as a CALL from `ctx` and returns its request id.
    pub fn send_call(&mut self, ctx: &CallCtx, fop: Fop) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_msg(&Message::Call { ctx: ctx.clone(), req: Request::new(fop) }, id);
        id
    }

    /// The next whole frame, or None once the brick closed the connection.
    pub fn recv_frame(&mut self) -> Option<rpc::Frame> {
        loop {
            if let Some(f) = rpc::decode_frame(&mut self.buf, 1 << 30).expect("the brick sends valid frames") {
                return Some(f);
            }
            let mut chunk = [0u8; 65536];
            match self.sock.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) => {
                    return None;
                }
                Err(e) => panic!("reading from the brick: {e}"),
            }
        }
    }

    /// The next frame's id and message, or None once the brick closed.
    pub fn recv(&mut self) -> Option<(u64, Message)> {
        let f = self.recv_frame()?;
        let id = f.id;
        Some((id, Message::from_frame(f, &rpc::limits_for(1 << 30)).expect("the brick's frames decode")))
    }

    /// The reply to request `id` (upcalls and pongs before it are skipped).
    pub fn reply_to(&mut self, id: u64) -> FopResult {
        loop {
            match self.recv() {
                Some((got, Message::Reply(r))) if got == id => return r,
                Some((got, Message::Reply(_))) => panic!("a reply to {got} came while waiting for {id}"),
                Some(_) => {}
                None => panic!("the brick closed the connection instead of answering call {id}"),
            }
        }
    }

    /// Runs `fop` as `ctx` and waits for its result.
    pub fn call_as(&mut self, ctx: &CallCtx, fop: Fop) -> FopResult {
        let id = self.send_call(ctx, fop);
        self.reply_to(id)
    }

    /// Runs `fop` as root.
    pub fn call(&mut self, fop: Fop) -> FopResult {
        self.call_as(&CallCtx::root("raw"), fop)
    }

    /// The error `fop` fails with; panics when it succeeds.
    pub fn fails(&mut self, fop: Fop) -> Errno {
        let what = format!("{fop:?}");
        match self.call(fop) {
            Err(e) => e,
            Ok(r) => panic!("{:.200} succeeded: {r:?}", what),
        }
    }

    /// True once the brick closed the connection (frames before are
    /// skipped, but a REPLY among them fails the test).
    pub fn closed(&mut self, what: &str) -> bool {
        while let Some(frame) = self.recv_frame() {
            assert_ne!(frame.kind, FrameKind::Reply, "{what}: the brick answered instead of dropping the connection");
        }
        true
    }
}
