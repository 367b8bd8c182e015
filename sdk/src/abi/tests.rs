//! Round trips, prefixes, hostile input and handshake rules of ABI v1.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Debug;
use std::sync::Arc;

use bytes::Bytes;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::strategy::{Union, ValueTree};
use proptest::test_runner::{Config, TestRunner};

use super::codec::IATT_SIZE;
use super::*;
use crate::types::*;
use crate::{CallCtx, Dict, Errno, Event, Fop, FopFlags, FopKind, FopResult, Reply, Request, Response, Upcall, Value};

mod strategies;

use strategies::*;

// ---- allocation accounting: bytes allocated by the current thread ----

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

struct CountingAlloc;

fn count(bytes: usize) {
    let _ = ALLOCATED.try_with(|c| c.set(c.get().saturating_add(bytes)));
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs `f`, returning its result and the bytes this thread allocated.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

// ---- helpers ----

fn enc<T: Wire>(v: &T) -> (Vec<u8>, Option<Bytes>) {
    let mut buf = Vec::new();
    let payload = encode(v, &mut buf);
    (buf, payload)
}

fn dec<T: Wire>(header: &[u8], payload: Option<Bytes>) -> Result<T, DecodeError> {
    decode(header, payload, &Limits::DEFAULT)
}

/// Decodes what `v` encodes to, and checks the value and its re-encoding
/// (the encoding is canonical) are the same.
fn round_trip<T: Wire + PartialEq + Debug>(v: &T) -> Result<(), TestCaseError> {
    let (buf, payload) = enc(v);
    let back: T = dec(&buf, payload.clone()).map_err(|e| TestCaseError::fail(format!("{e} decoding {v:?}")))?;
    prop_assert_eq!(&back, v);
    let (again, payload2) = enc(&back);
    prop_assert_eq!(again, buf);
    prop_assert_eq!(payload2, payload);
    Ok(())
}

/// Every strict prefix of `v`'s header fails to decode, with or without
/// its payload.
fn prefixes_fail<T: Wire + Debug>(v: &T) {
    let (buf, payload) = enc(v);
    for n in 0..buf.len() {
        assert!(dec::<T>(&buf[..n], payload.clone()).is_err(), "prefix {n}/{} of {v:?} decoded", buf.len());
        assert!(dec::<T>(&buf[..n], None).is_err(), "prefix {n}/{} of {v:?} decoded without payload", buf.len());
    }
}

fn sample<S: Strategy>(s: &S, runner: &mut TestRunner) -> S::Value {
    s.new_tree(runner).expect("strategy").current()
}

// ---- round trips ----

proptest! {
    #[test]
    fn fop_round_trips(v in fop()) { round_trip(&v)?; }

    #[test]
    fn reply_round_trips(v in reply()) { round_trip(&v)?; }

    #[test]
    fn request_round_trips(v in request()) { round_trip(&v)?; }

    #[test]
    fn response_round_trips(v in response()) { round_trip(&v)?; }

    #[test]
    fn result_round_trips(v in fop_result()) { round_trip(&v)?; }

    #[test]
    fn dict_round_trips(v in dict()) { round_trip(&v)?; }

    #[test]
    fn call_ctx_round_trips(v in call_ctx()) { round_trip(&v)?; }

    #[test]
    fn event_round_trips(v in event()) { round_trip(&v)?; }

    #[test]
    fn value_types_round_trip(
        g in gfid(), i in iatt(), l in loc(), f in fd(), a in set_attr(), k in flock(),
        d in dirent(), s in statvfs(), e in any::<i32>(), t in timespec(),
    ) {
        round_trip(&g)?;
        round_trip(&i)?;
        round_trip(&l)?;
        round_trip(&f)?;
        round_trip(&a)?;
        round_trip(&k)?;
        round_trip(&d)?;
        round_trip(&s)?;
        round_trip(&Errno(e))?;
        round_trip(&t)?;
    }
}

#[test]
fn every_fop_kind_is_encodable_and_round_trips() {
    let mut runner = TestRunner::new(Config::with_cases(32));
    for &kind in FopKind::ALL {
        runner
            .run(&fop_of(kind), |fop| {
                prop_assert_eq!(fop.kind(), kind);
                let (buf, payload) = enc(&fop);
                prop_assert_eq!(&buf[..2], &(kind as u16).to_le_bytes()[..]);
                prop_assert_eq!(payload.is_some(), kind.flags().contains(FopFlags::PAYLOAD));
                // The table's fd and loc fields are the ones the fop carries.
                prop_assert_eq!(fop.fds().count(), kind.fd_fields().len());
                prop_assert_eq!(fop.clone().fds_mut().count(), kind.fd_fields().len());
                prop_assert_eq!(fop.fd().copied(), fop.fds().next());
                prop_assert_eq!(fop.loc().is_some(), !kind.loc_fields().is_empty());
                round_trip(&fop)
            })
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    }
    // Codes outside FopKind's are refused.
    for code in [0u16, FopKind::ALL.len() as u16 + 1, u16::MAX] {
        assert_eq!(dec::<Fop>(&code.to_le_bytes(), None), Err(DecodeError::UnknownFop(code)));
    }
}

#[test]
fn every_reply_variant_round_trips_with_its_tag() {
    let mut runner = TestRunner::new(Config::with_cases(32));
    for (tag, strategy) in reply_variants().into_iter().enumerate() {
        runner
            .run(&strategy, |reply| {
                let (buf, payload) = enc(&reply);
                prop_assert_eq!(buf[0] as usize, tag);
                prop_assert_eq!(reply.kind() as usize, tag);
                prop_assert_eq!(payload.is_some(), matches!(reply, Reply::Read { .. }));
                round_trip(&reply)
            })
            .unwrap_or_else(|e| panic!("reply tag {tag}: {e}"));
    }
    assert_eq!(dec::<Reply>(&[15], None), Err(DecodeError::UnknownTag { what: "reply", tag: 15 }));
}

#[test]
fn strict_prefixes_fail_to_decode() {
    let mut runner = TestRunner::deterministic();
    for &kind in FopKind::ALL {
        let fop = sample(&fop_of(kind), &mut runner);
        prefixes_fail(&fop);
        let xdata = Dict::new().with("k", Value::U64(1)).with("s", Value::Str("v".into()));
        prefixes_fail(&Request { fop, xdata });
    }
    for strategy in reply_variants() {
        let reply = sample(&strategy, &mut runner);
        prefixes_fail(&reply);
        let resp = Response { reply, xdata: sample(&dict(), &mut runner) };
        prefixes_fail(&resp);
        prefixes_fail::<FopResult>(&Ok(resp));
    }
    prefixes_fail::<FopResult>(&Err(Errno::ENOENT));
    for _ in 0..16 {
        prefixes_fail(&sample(&event(), &mut runner));
        prefixes_fail(&sample(&call_ctx(), &mut runner));
        prefixes_fail(&sample(&dict(), &mut runner));
    }
    let mut hello = Vec::new();
    encode_hello(AbiVersion::CURRENT, &mut hello);
    for n in 0..hello.len() {
        assert!(decode_hello(&hello[..n]).is_err());
    }
}

// ---- the byte layout of ABI.md ----

#[test]
fn layout_matches_abi_md() {
    let req =
        Request::with_xdata(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "a") }, Dict::new().with("k", Value::U64(7)));
    let mut want = vec![1, 0];
    want.extend([0; 16]);
    want.extend(Gfid::ROOT.0);
    want.extend([1, 0, 0, 0, b'a']);
    want.extend([1, 0, 0, 0, 1, 0, 0, 0, b'k', 1, 7, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(enc(&req), (want, None));

    let data = Bytes::from_static(b"abc");
    let fop = Fop::Writev { fd: Fd { id: FdId(5), gfid: Gfid::ROOT }, data: data.clone(), offset: 9, flags: 2 };
    let mut want = vec![20, 0, 5, 0, 0, 0, 0, 0, 0, 0];
    want.extend(Gfid::ROOT.0);
    want.extend([3, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0]);
    assert_eq!(enc(&fop), (want, Some(data)));

    assert_eq!(enc(&FopResult::Err(Errno::ENOENT)).0, [1, 2, 0, 0, 0]);
    assert_eq!(enc(&Event::ClientGone { client_id: "c".into() }).0, [6, 1, 0, 0, 0, b'c']);
    assert_eq!(enc(&Iatt::default()).0.len(), IATT_SIZE);
    assert_eq!(enc(&Statvfs::default()).0.len(), 88);
    assert_eq!(enc(&Flock::whole(LockType::Write, 1)).0.len(), 29);
    assert_eq!(enc(&Reply::Empty).0, [0]);

    let mut hello = Vec::new();
    encode_hello(AbiVersion::new(1, 0), &mut hello);
    assert_eq!(hello, *b"XLFS\x01\x00\x00\x00");
}

// ---- payloads ----

#[test]
fn payload_travels_beside_the_header_without_copy() {
    let data = Bytes::from(vec![7u8; 100_000]);
    let req = Request::new(Fop::Writev { fd: Fd::default(), data: data.clone(), offset: 0, flags: 0 });
    let (header, payload) = enc(&req);
    assert!(header.len() < 100, "data went into the header");
    let back: Request = dec(&header, payload).expect("decode");
    let Fop::Writev { data: got, .. } = &back.fop else { panic!("not a writev: {back:?}") };
    assert_eq!(got.as_ptr(), data.as_ptr(), "payload was copied");

    let resp: FopResult = Ok(Reply::Read { data: data.clone(), iatt: Iatt::default() }.into());
    let (header, payload) = enc(&resp);
    assert!(header.len() < 200);
    let back: FopResult = dec(&header, payload).expect("decode");
    let Ok(Response { reply: Reply::Read { data: got, .. }, .. }) = &back else { panic!("{back:?}") };
    assert_eq!(got.as_ptr(), data.as_ptr(), "payload was copied");
}

#[test]
fn payload_mismatches_are_errors() {
    let fop = Fop::Writev { fd: Fd::default(), data: Bytes::from_static(b"0123456789"), offset: 0, flags: 0 };
    let (header, _) = enc(&fop);
    let short = Some(Bytes::from_static(b"01234"));
    assert_eq!(dec::<Fop>(&header, short), Err(DecodeError::PayloadMismatch { declared: 10, actual: 5 }));
    assert_eq!(dec::<Fop>(&header, None), Err(DecodeError::PayloadMismatch { declared: 10, actual: 0 }));

    // Empty data: an absent and an empty payload are the same.
    let empty = Fop::Writev { fd: Fd::default(), data: Bytes::new(), offset: 0, flags: 0 };
    let (header, payload) = enc(&empty);
    assert_eq!(payload, Some(Bytes::new()));
    assert_eq!(dec::<Fop>(&header, None), Ok(empty.clone()));
    assert_eq!(
        dec::<Fop>(&header, Some(Bytes::from_static(b"x"))),
        Err(DecodeError::PayloadMismatch { declared: 0, actual: 1 })
    );

    // A value without a data field takes no payload.
    let (header, payload) = enc(&Fop::Lookup { loc: Loc::root() });
    assert_eq!(payload, None);
    assert!(dec::<Fop>(&header, Some(Bytes::new())).is_ok());
    assert_eq!(
        dec::<Fop>(&header, Some(Bytes::from_static(b"xyz"))),
        Err(DecodeError::PayloadMismatch { declared: 0, actual: 3 })
    );

    // A declared length over the limit.
    let mut header = vec![20, 0];
    header.extend([0; 24]);
    header.extend(u64::MAX.to_le_bytes());
    header.extend([0; 12]);
    assert!(matches!(dec::<Fop>(&header, None), Err(DecodeError::TooLong { what: "payload", .. })));
}

// ---- hostile input ----

/// Header of a LOOKUP up to its name's length prefix.
fn lookup_up_to_name(name_len: u32) -> Vec<u8> {
    let mut h = vec![1, 0];
    h.extend([0; 32]);
    h.extend(name_len.to_le_bytes());
    h
}

#[test]
fn huge_length_prefixes_do_not_allocate() {
    assert!(allocated_by(|| Vec::<u8>::with_capacity(4096)).1 >= 4096, "allocation counter is not counting");
    let limits = Limits::DEFAULT;
    type Decoder = fn(&[u8], &Limits) -> Result<(), DecodeError>;
    let cases: Vec<(Vec<u8>, Decoder)> = vec![
        // A name of 4 GiB.
        (lookup_up_to_name(u32::MAX), |h, l| decode::<Fop>(h, None, l).map(drop)),
        // A name at the limit with 3 bytes behind it.
        ([lookup_up_to_name(4096), vec![b'a'; 3]].concat(), |h, l| decode::<Fop>(h, None, l).map(drop)),
        // 65536 dirents (the limit) and no bytes for them.
        ([vec![8], 65536u32.to_le_bytes().to_vec()].concat(), |h, l| decode::<Reply>(h, None, l).map(drop)),
        // u32::MAX dirents.
        ([vec![8], u32::MAX.to_le_bytes().to_vec()].concat(), |h, l| decode::<Reply>(h, None, l).map(drop)),
        // 4096 dict keys and a few bytes.
        ([vec![10], 4096u32.to_le_bytes().to_vec(), vec![0; 40]].concat(), |h, l| {
            decode::<Reply>(h, None, l).map(drop)
        }),
        // A dict string value of 1 MiB with nothing behind it.
        (
            [vec![10], 1u32.to_le_bytes().to_vec(), vec![1, 0, 0, 0, b'k', 2], (1u32 << 20).to_le_bytes().to_vec()]
                .concat(),
            |h, l| decode::<Reply>(h, None, l).map(drop),
        ),
        // 65536 groups and no bytes for them.
        ([vec![0; 8], 65536u32.to_le_bytes().to_vec()].concat(), |h, l| decode::<CallCtx>(h, None, l).map(drop)),
        // u32::MAX groups.
        ([vec![0; 8], u32::MAX.to_le_bytes().to_vec()].concat(), |h, l| decode::<CallCtx>(h, None, l).map(drop)),
    ];
    for (i, (header, decoder)) in cases.iter().enumerate() {
        let (result, bytes) = allocated_by(|| decoder(header, &limits));
        let err = result.expect_err("hostile input decoded");
        assert!(
            matches!(err, DecodeError::TooLong { .. } | DecodeError::Truncated { .. }),
            "case {i}: unexpected {err:?}"
        );
        assert!(bytes < 1024, "case {i}: decoding {} bytes allocated {bytes} bytes ({err})", header.len());
    }
}

#[test]
fn limits_are_enforced_and_configurable() {
    let (header, _) = enc(&Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "x".repeat(4097)) });
    assert_eq!(dec::<Fop>(&header, None), Err(DecodeError::TooLong { what: "name", len: 4097, max: 4096 }));

    let dirents = Reply::Dirents(vec![DirEntry::default(); 3]);
    let (header, _) = enc(&dirents);
    let small = Limits { max_dirents: 2, ..Limits::DEFAULT };
    assert!(matches!(decode::<Reply>(&header, None, &small), Err(DecodeError::TooLong { what: "dirent list", .. })));
    assert_eq!(decode::<Reply>(&header, None, &Limits { max_dirents: 3, ..small }), Ok(dirents));

    let tiny = Limits { max_header: 4, ..Limits::DEFAULT };
    assert!(matches!(decode::<Reply>(&header, None, &tiny), Err(DecodeError::TooLong { what: "header", .. })));

    let keys: Dict = (0..5).map(|i| (format!("k{i}"), Value::U64(i))).collect();
    let (header, _) = enc(&keys);
    let few = Limits { max_dict_keys: 4, ..Limits::DEFAULT };
    assert!(matches!(decode::<Dict>(&header, None, &few), Err(DecodeError::TooLong { what: "dict", .. })));

    let long = Dict::new().with("k", Value::Bytes(Bytes::from(vec![0; 100])));
    let (header, _) = enc(&long);
    let short = Limits { max_string: 99, ..Limits::DEFAULT };
    assert!(matches!(decode::<Dict>(&header, None, &short), Err(DecodeError::TooLong { what: "dict bytes", .. })));

    let writev = Fop::Writev { fd: Fd::default(), data: Bytes::from(vec![1; 10]), offset: 0, flags: 0 };
    let (header, payload) = enc(&writev);
    let small_payload = Limits { max_payload: 9, ..Limits::DEFAULT };
    assert!(matches!(
        decode::<Fop>(&header, payload, &small_payload),
        Err(DecodeError::TooLong { what: "payload", .. })
    ));
}

#[test]
fn unknown_tags_are_errors() {
    fn unknown<T>(what: &'static str, tag: u8) -> Result<T, DecodeError> {
        Err(DecodeError::UnknownTag { what, tag })
    }
    assert_eq!(dec::<Event>(&[7], None), unknown("event", 7));
    assert_eq!(dec::<Event>(&[5, 4], None), unknown("upcall", 4));
    assert_eq!(dec::<FopResult>(&[2], None), unknown("result", 2));
    assert_eq!(dec::<Value>(&[5], None), unknown("dict value", 5));
    assert_eq!(dec::<Reply>(&[255], None), unknown("reply", 255));
    // FSYNC with datasync = 2.
    let mut fsync = vec![22, 0];
    fsync.extend([0; 24]);
    fsync.push(2);
    assert_eq!(dec::<Fop>(&fsync, None), unknown("bool", 2));
    // SETATTR with an option flag of 2.
    let mut setattr = lookup_up_to_name(0);
    setattr[0] = 4;
    setattr.push(2);
    assert_eq!(dec::<Fop>(&setattr, None), unknown("option", 2));
    // A dirent of file type 8.
    let mut dirents = vec![8, 1, 0, 0, 0, 0, 0, 0, 0];
    dirents.extend([0; 8]);
    dirents.push(8);
    dirents.extend([0; IATT_SIZE]);
    assert_eq!(dec::<Reply>(&dirents, None), unknown("file type", 8));
    // LK with cmd 3.
    let mut lk = vec![34, 0];
    lk.extend([0; 24]);
    lk.push(3);
    lk.extend([0; 29]);
    assert_eq!(dec::<Fop>(&lk, None), unknown("lk cmd", 3));
}

#[test]
fn malformed_input_is_refused() {
    // Trailing bytes.
    let (mut header, _) = enc(&Fop::Lookup { loc: Loc::root() });
    header.push(0);
    assert_eq!(dec::<Fop>(&header, None), Err(DecodeError::TrailingBytes(1)));

    // A name that is not UTF-8.
    let mut bad = lookup_up_to_name(2);
    bad.extend([0xc3, 0x28]);
    assert_eq!(dec::<Fop>(&bad, None), Err(DecodeError::BadUtf8 { what: "name" }));

    // Dict keys out of order, and repeated.
    let entry = |k: u8| vec![1, 0, 0, 0, k, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    let dict = |keys: &[u8]| [2u32.to_le_bytes().to_vec(), entry(keys[0]), entry(keys[1])].concat();
    assert!(dec::<Dict>(&dict(b"ab"), None).is_ok());
    assert_eq!(dec::<Dict>(&dict(b"ba"), None), Err(DecodeError::UnsortedKeys));
    assert_eq!(dec::<Dict>(&dict(b"aa"), None), Err(DecodeError::UnsortedKeys));

    // Empty input.
    assert!(matches!(dec::<Request>(&[], None), Err(DecodeError::Truncated { offset: 0, .. })));
}

proptest! {
    /// Arbitrary bytes never panic any decoder, and what decodes re-encodes
    /// to the same bytes.
    #[test]
    fn arbitrary_bytes_never_panic(header in vec(any::<u8>(), 0..256), payload in proptest::option::of(data())) {
        fn check<T: Wire + PartialEq + Debug>(h: &[u8], p: &Option<Bytes>) -> Result<(), TestCaseError> {
            if let Ok(v) = dec::<T>(h, p.clone()) {
                let (again, payload) = enc(&v);
                prop_assert_eq!(&again[..], h);
                prop_assert_eq!(payload.unwrap_or_default(), p.clone().unwrap_or_default());
            }
            Ok(())
        }
        check::<Fop>(&header, &payload)?;
        check::<Reply>(&header, &payload)?;
        check::<Request>(&header, &payload)?;
        check::<FopResult>(&header, &payload)?;
        check::<Dict>(&header, &payload)?;
        check::<CallCtx>(&header, &payload)?;
        check::<Event>(&header, &payload)?;
        let _ = decode_hello(&header);
    }
}

// ---- handshake ----

#[test]
fn handshake_compatibility_rule() {
    let v = AbiVersion::new;
    assert_eq!(check_compatible(v(1, 0), v(1, 0)), Ok(()));
    assert_eq!(check_compatible(v(1, 3), v(1, 1)), Ok(()));

    let err = check_compatible(v(1, 1), v(1, 2)).expect_err("1.1 host must refuse a 1.2 plugin");
    assert_eq!(err, VersionError::MinorTooNew { host: v(1, 1), peer: v(1, 2) });
    let msg = err.to_string();
    assert!(msg.contains("v1.1") && msg.contains("v1.2"), "{msg}");

    for (host, peer) in [(v(1, 0), v(2, 0)), (v(2, 0), v(1, 0))] {
        let err = check_compatible(host, peer).expect_err("major mismatch must be refused");
        assert_eq!(err, VersionError::MajorMismatch { host, peer });
        let msg = err.to_string();
        assert!(msg.contains(&host.to_string()) && msg.contains(&peer.to_string()), "{msg}");
    }
    assert_eq!(AbiVersion::CURRENT, v(ABI_MAJOR, ABI_MINOR));
}

#[test]
fn hello_round_trips_and_tolerates_later_extensions() {
    let mut buf = Vec::new();
    encode_hello(AbiVersion::CURRENT, &mut buf);
    assert_eq!(buf.len(), HELLO_LEN);
    assert_eq!(decode_hello(&buf), Ok(AbiVersion::CURRENT));

    // A later version's hello, with bytes this version does not know.
    let mut later = Vec::new();
    encode_hello(AbiVersion::new(2, 7), &mut later);
    later.extend(b"future fields");
    let peer = decode_hello(&later).expect("any version's hello decodes");
    assert_eq!(peer, AbiVersion::new(2, 7));
    assert!(check_compatible(AbiVersion::CURRENT, peer).is_err());

    assert_eq!(decode_hello(b"NOPE\x01\x00\x00\x00"), Err(DecodeError::BadMagic(*b"NOPE")));
    assert!(matches!(decode_hello(b"XLFS\x01"), Err(DecodeError::Truncated { .. })));
}
