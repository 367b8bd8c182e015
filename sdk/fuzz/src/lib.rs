//! Shared by the fuzz targets and the seed writer: how one fuzz input is
//! split into an ABI header and an optional payload, and the checks run on
//! every decoder.
#![deny(missing_docs)]

use std::fmt::Debug;

use bytes::Bytes;
use xlfs_sdk::abi::{self, Limits, Wire};
use xlfs_sdk::{CallCtx, Dict, DirEntry, Event, Fop, FopResult, Iatt, Reply, Request, Response, SetAttr, Value};

/// Splits a fuzz input: byte 0 bit 0 says whether a payload is present; if
/// so, the next two bytes (LE) are its length, and the payload is the last
/// that many bytes (clamped). The rest is the header.
pub fn split(data: &[u8]) -> (&[u8], Option<Bytes>) {
    let Some((&sel, rest)) = data.split_first() else { return (&[], None) };
    if sel & 1 == 0 || rest.len() < 2 {
        return (rest, None);
    }
    let n = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
    let rest = &rest[2..];
    let (header, payload) = rest.split_at(rest.len() - n.min(rest.len()));
    (header, Some(Bytes::copy_from_slice(payload)))
}

/// The inverse of [`split`], for writing seeds.
pub fn join(header: &[u8], payload: Option<&Bytes>) -> Vec<u8> {
    match payload {
        None => [&[0u8][..], header].concat(),
        Some(p) => {
            let n = u16::try_from(p.len()).unwrap_or(u16::MAX);
            [&[1u8][..], &n.to_le_bytes(), header, &p[..usize::from(n)]].concat()
        }
    }
}

/// Decodes as `T`; when that succeeds, the re-encoding must be the same
/// header and payload, and must decode to the same value.
fn check<T: Wire + PartialEq + Debug>(header: &[u8], payload: &Option<Bytes>, limits: &Limits) {
    let Ok(value) = abi::decode::<T>(header, payload.clone(), limits) else { return };
    let mut again = Vec::new();
    let payload2 = abi::encode(&value, &mut again);
    assert_eq!(again, header, "re-encoding {value:?} gives other bytes");
    assert_eq!(
        payload2.clone().unwrap_or_default(),
        payload.clone().unwrap_or_default(),
        "re-encoding {value:?} gives another payload"
    );
    let back: Result<T, _> = abi::decode(&again, payload2, limits);
    assert_eq!(back.as_ref(), Ok(&value), "re-encoded value decodes differently");
}

/// Feeds one fuzz input to every decoder.
pub fn run(data: &[u8]) {
    let (header, payload) = split(data);
    let limits = Limits::DEFAULT;
    check::<Fop>(header, &payload, &limits);
    check::<Reply>(header, &payload, &limits);
    check::<Request>(header, &payload, &limits);
    check::<Response>(header, &payload, &limits);
    check::<FopResult>(header, &payload, &limits);
    check::<Dict>(header, &payload, &limits);
    check::<Value>(header, &payload, &limits);
    check::<CallCtx>(header, &payload, &limits);
    check::<Event>(header, &payload, &limits);
    check::<DirEntry>(header, &payload, &limits);
    check::<Iatt>(header, &payload, &limits);
    check::<SetAttr>(header, &payload, &limits);
    if let Ok(peer) = abi::decode_hello(header) {
        let mut again = Vec::new();
        abi::encode_hello(peer, &mut again);
        assert_eq!(&again[..], &header[..abi::HELLO_LEN]);
        let _ = abi::check_compatible(abi::AbiVersion::CURRENT, peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xlfs_sdk::{Fd, Gfid, Loc};

    #[test]
    fn split_inverts_join() {
        let payload = Bytes::from_static(b"payload");
        assert_eq!(split(&join(b"head", Some(&payload))), (&b"head"[..], Some(payload)));
        assert_eq!(split(&join(b"head", None)), (&b"head"[..], None));
        assert_eq!(split(&[]), (&[][..], None));
    }

    #[test]
    fn valid_messages_pass_the_checks() {
        let writev = Request::new(Fop::Writev { fd: Fd::default(), data: Bytes::from_static(b"abc"), offset: 1, flags: 0 });
        let lookup = Request::with_xdata(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "a") }, Dict::new().with("k", Value::U64(1)));
        for req in [writev, lookup] {
            let mut header = Vec::new();
            let payload = abi::encode(&req, &mut header);
            let input = join(&header, payload.as_ref());
            let (h, p) = split(&input);
            assert_eq!(abi::decode::<Request>(h, p, &Limits::DEFAULT), Ok(req));
            run(&input);
        }
    }
}
