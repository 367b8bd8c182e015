//! The check the `frame` fuzz target runs, shared with the seed writer
//! (the `graph_ops` target's is [`graph`]).
//!
//! One input: byte 0 picks the maximum frame size (small ones exercise the
//! "frame too large" path) and where the rest is cut in two. The rest is
//! decoded as a byte stream, whole and in two chunks, with
//! `rpc::decode_frame`; every frame is decoded as the message its kind
//! says. Checked: nothing panics; both feedings give the same frames and
//! the same error; a message that decodes re-encodes to exactly the frame's
//! bytes (the encoding is canonical), except a HELLO / HELLO_REPLY of a
//! foreign ABI major, which decodes to its version alone.
#![deny(missing_docs)]

pub mod graph;

use bytes::BytesMut;
use xlfs_sdk::abi::ABI_MAJOR;
use xlfs_xlators::protocol::rpc::{self, Frame, FrameError, Message};

/// The maximum frame sizes byte 0 chooses from.
pub const MAX_FRAMES: [usize; 4] = [24, 4096, rpc::HANDSHAKE_MAX_FRAME, 1 << 30];

/// Decodes every frame of `stream`, fed as the chunks given; returns the
/// frames with their bytes, and the error that stopped decoding.
fn frames(chunks: &[&[u8]], max: usize) -> (Vec<(Frame, Vec<u8>)>, Option<FrameError>) {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let snapshot = buf.to_vec();
            match rpc::decode_frame(&mut buf, max) {
                Ok(Some(f)) => {
                    let used = snapshot.len() - buf.len();
                    out.push((f, snapshot[..used].to_vec()));
                }
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

/// Runs the checks on one input.
pub fn run(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let max = MAX_FRAMES[usize::from(sel & 3)];
    let cut = if rest.is_empty() { 0 } else { usize::from(sel >> 2) * 997 % (rest.len() + 1) };
    let whole = frames(&[rest], max);
    let split = frames(&[&rest[..cut], &rest[cut..]], max);
    assert_eq!(whole, split, "feeding the bytes in two chunks changes what decodes");
    let limits = rpc::limits_for(max);
    for (frame, bytes) in whole.0 {
        let (kind, id) = (frame.kind, frame.id);
        let Ok(msg) = Message::from_frame(frame, &limits) else {
            continue;
        };
        assert_eq!(msg.kind(), kind);
        let foreign = match &msg {
            Message::Hello(h) => h.version.major != ABI_MAJOR,
            Message::HelloReply(r) => r.version.major != ABI_MAJOR,
            _ => false,
        };
        if !foreign {
            let again = msg.to_frame(id).expect("a decoded message encodes").to_vec();
            assert_eq!(again, bytes, "{msg:?} re-encodes to other bytes");
        }
    }
}
