//! The framing of fop messages (`xlfs_on_fop`, `wind`) and of the bulk
//! data that crosses beside them as buffer handles.

use bytes::Bytes;

use crate::abi::{self, DecodeError, Limits};
use crate::{CallCtx, Fop, FopResult, Reply, Request};

/// The bytes before a fop message's caller context: its length, a `u32`.
pub const CALL_HEADER: usize = 4;

/// Encodes a fop message (`xlfs_on_fop`, `wind`): `u32` length of the
/// caller context (0: none, meaning the frame's own), the CallCtx, then
/// the Request. A WRITE's data must already be taken out
/// ([`take_fop_data`]): it crosses as a buffer handle.
pub fn encode_call(ctx: Option<&CallCtx>, req: &Request, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend_from_slice(&[0; CALL_HEADER]);
    if let Some(ctx) = ctx {
        abi::encode(ctx, out);
        let n = (out.len() - at - CALL_HEADER) as u32;
        out[at..at + CALL_HEADER].copy_from_slice(&n.to_le_bytes());
    }
    abi::encode(req, out);
}

/// Decodes a fop message; the WRITE data, if any, is empty.
pub fn decode_call(bytes: &[u8], limits: &Limits) -> Result<(Option<CallCtx>, Request), DecodeError> {
    let (ctx_bytes, req_bytes) = split_call(bytes)?;
    let ctx = if ctx_bytes.is_empty() { None } else { Some(abi::decode::<CallCtx>(ctx_bytes, None, limits)?) };
    let req = abi::decode::<Request>(req_bytes, None, limits)?;
    Ok((ctx, req))
}

/// A fop message's two parts, undecoded: the caller context's bytes
/// (empty: none) and the Request's.
pub fn split_call(bytes: &[u8]) -> Result<(&[u8], &[u8]), DecodeError> {
    let Some((len, rest)) = bytes.split_first_chunk::<CALL_HEADER>() else {
        return Err(DecodeError::Truncated { offset: 0, needed: CALL_HEADER as u64, remaining: bytes.len() });
    };
    let n = u32::from_le_bytes(*len) as usize;
    if n > rest.len() {
        return Err(DecodeError::Truncated { offset: CALL_HEADER, needed: n as u64, remaining: rest.len() });
    }
    Ok(rest.split_at(n))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dict, Errno, Fd, FdId, Gfid, Loc, Response};

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
}
