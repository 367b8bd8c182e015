//! Tests of the RPC transport: message round trips, WIRE.md's examples,
//! framing errors, and links and readers over real sockets.

use std::sync::Arc;

use proptest::prelude::*;
use xlfs_sdk::{Errno, Fd, FdId, Fop, Gfid, Iatt, Loc, Reply, Response, Upcall, Value};

use super::*;

const MAX: usize = 1 << 20;

fn round_trip(m: &Message, id: u64) -> Message {
    let f = m.to_frame(id).expect("encodes");
    let mut buf = BytesMut::from(&f.to_vec()[..]);
    let frame = decode_frame(&mut buf, MAX).expect("valid frame").expect("whole frame");
    assert!(buf.is_empty(), "the frame used every byte");
    assert_eq!((frame.kind, frame.id), (m.kind(), id));
    Message::from_frame(frame, &limits_for(MAX)).expect("decodes")
}

fn ctx() -> CallCtx {
    CallCtx {
        uid: 1000,
        gid: 100,
        groups: Arc::from(vec![4u32, 24, 27]),
        pid: 77,
        lk_owner: 0xabc,
        client_id: Arc::from("me"),
        frame: Default::default(),
        lent: Default::default(),
    }
}

#[test]
fn every_message_round_trips() {
    let data = Bytes::from(vec![7u8; 100_000]);
    let fd = Fd { id: FdId(3), gfid: Gfid::ROOT };
    let mut params = Dict::new();
    params.set_str(hello_keys::VOLUME, "/b1");
    params.set_str(hello_keys::CLIENT_ID, "c1");
    let msgs = [
        Message::Hello(Hello { version: AbiVersion::CURRENT, params }),
        Message::HelloReply(HelloReply::refuse("no such subvolume 'x'")),
        Message::HelloReply(HelloReply {
            version: AbiVersion::new(1, 3),
            accepted: true,
            reason: String::new(),
            info: Dict::new().with("client-id", Value::Str("c1#4".into())),
        }),
        Message::Call { ctx: ctx(), req: Request::new(Fop::Lookup { loc: Loc::entry(Gfid::ROOT, "a") }) },
        Message::Call { ctx: ctx(), req: Request::new(Fop::Writev { fd, data: data.clone(), offset: 9, flags: 0 }) },
        Message::Reply(Ok(Response::from(Reply::Read { data: data.clone(), iatt: Iatt::default() }))),
        Message::Reply(Err(Errno::ENOENT)),
        Message::Ping,
        Message::Pong,
        Message::Upcall(Event::Upcall(Upcall::Invalidate { gfid: Gfid::ROOT })),
        Message::Goodbye("server is shutting down".into()),
    ];
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(&round_trip(m, i as u64 * 1000 + 1), m);
    }
}

/// The examples of `sdk/WIRE.md`, byte for byte.
#[test]
fn wire_md_examples() {
    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace().map(|b| u8::from_str_radix(b, 16).expect("hex")).collect()
    }
    let ping = Message::Ping.to_frame(5).expect("encodes").to_vec();
    assert_eq!(ping, hex("10 00 00 00 05 00 00 00 05 00 00 00 00 00 00 00 00 00 00 00"));
    let bye = Message::Goodbye("bye".into()).to_frame(0).expect("encodes").to_vec();
    assert_eq!(bye, hex("17 00 00 00 08 00 00 00 00 00 00 00 00 00 00 00 07 00 00 00 03 00 00 00 62 79 65"));
    let params = Dict::new()
        .with(hello_keys::VOLUME, Value::Str("/b1".into()))
        .with(hello_keys::CLIENT_ID, Value::Str("c".into()));
    let hello = Message::Hello(Hello { version: AbiVersion::CURRENT, params }).to_frame(0).expect("encodes");
    assert_eq!(
        hello.to_vec(),
        hex("41 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 31 00 00 00
                 58 4c 46 53 01 00 00 00
                 02 00 00 00
                 09 00 00 00 63 6c 69 65 6e 74 2d 69 64 02 01 00 00 00 63
                 06 00 00 00 76 6f 6c 75 6d 65 02 03 00 00 00 2f 62 31")
    );
    let fd = Fd { id: FdId(5), gfid: Gfid::ROOT };
    let write = Message::Call {
        ctx: CallCtx::root("c"),
        req: Request::new(Fop::Writev { fd, data: Bytes::from_static(b"abc"), offset: 9, flags: 2 }),
    };
    let f = write.to_frame(9).expect("encodes");
    assert_eq!(f.head.len(), PREFIX_LEN + 79);
    assert_eq!(
        f.to_vec(),
        hex("62 00 00 00 03 00 00 00 09 00 00 00 00 00 00 00 4f 00 00 00
                 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 63
                 14 00 05 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01
                 03 00 00 00 00 00 00 00 09 00 00 00 00 00 00 00 02 00 00 00
                 00 00 00 00
                 61 62 63")
    );
}

#[test]
fn payload_is_beside_the_header_and_not_copied() {
    let data = Bytes::from(vec![1u8; 4096]);
    let m = Message::Call {
        ctx: ctx(),
        req: Request::new(Fop::Writev { fd: Fd::default(), data: data.clone(), offset: 0, flags: 0 }),
    };
    let f = m.to_frame(5).expect("encodes");
    assert_eq!(f.payload.as_ptr(), data.as_ptr(), "the frame shares the data");
    assert!(f.head.len() < 200, "the header does not hold the data");
    let mut buf = BytesMut::from(&f.to_vec()[..]);
    let base = buf.as_ptr() as usize;
    let frame = decode_frame(&mut buf, MAX).expect("ok").expect("whole");
    assert_eq!(frame.payload.as_ptr() as usize, base + f.head.len(), "payload split off the read buffer");
}

#[test]
fn partial_frames_wait_for_more_bytes() {
    let whole = Message::Goodbye("bye".into()).to_frame(0).expect("encodes").to_vec();
    for cut in 0..whole.len() {
        let mut buf = BytesMut::from(&whole[..cut]);
        assert_eq!(decode_frame(&mut buf, MAX), Ok(None), "cut at {cut}");
        assert_eq!(buf.len(), cut, "nothing consumed");
    }
    let mut two = BytesMut::from(&[whole.clone(), whole.clone()].concat()[..]);
    assert!(decode_frame(&mut two, MAX).expect("ok").is_some());
    assert!(decode_frame(&mut two, MAX).expect("ok").is_some());
    assert!(two.is_empty());
}

#[test]
fn bad_prefixes_are_refused_early() {
    let mut huge = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
    assert_eq!(decode_frame(&mut huge, MAX), Err(FrameError::TooLarge { size: (1u64 << 32) + 3, max: MAX as u64 }));
    let e = FrameError::TooLarge { size: 5_000_000, max: 1_048_576 }.to_string();
    assert!(e.contains("5000000") && e.contains("1048576"), "{e}");
    let mut short = BytesMut::from(&3u32.to_le_bytes()[..]);
    assert_eq!(decode_frame(&mut short, MAX), Err(FrameError::TooShort { len: 3 }));
    let mut kind = BytesMut::from(&encode_raw_frame(99, 0, 0, 1, b"", b"")[..5]);
    assert_eq!(decode_frame(&mut kind, MAX), Err(FrameError::UnknownKind(99)));
    let mut flags = BytesMut::from(&encode_raw_frame(5, 4, 0, 1, b"", b"")[..]);
    assert_eq!(decode_frame(&mut flags, MAX), Err(FrameError::Reserved { flags: 4, reserved: 0 }));
    let mut reserved = BytesMut::from(&encode_raw_frame(5, 0, 1, 1, b"", b"")[..]);
    assert_eq!(decode_frame(&mut reserved, MAX), Err(FrameError::Reserved { flags: 0, reserved: 1 }));
    let mut raw = encode_raw_frame(5, 0, 0, 1, b"abc", b"");
    raw[16..20].copy_from_slice(&10u32.to_le_bytes());
    let mut over = BytesMut::from(&raw[..]);
    assert_eq!(decode_frame(&mut over, MAX), Err(FrameError::HeaderTooLong { header_len: 10, available: 3 }));
}

#[test]
fn shared_memory_flags_announce_exactly_their_descriptors() {
    let d = |offset, len| Descriptor { offset, len };
    let out = Message::Ping.to_frame(3).expect("frame").with_descriptors(Some(d(4096, 10)), Some(d(8192, 1 << 20)));
    let mut buf = BytesMut::from(&out.to_vec()[..]);
    let f = decode_frame(&mut buf, MAX).expect("frame ok").expect("whole");
    assert_eq!(f.flags, frame_flags::SHARED_DATA | frame_flags::REPLY_AT);
    assert_eq!(f.descriptors(), Ok((Some(d(4096, 10)), Some(d(8192, 1 << 20)))));
    let only_reply = Message::Ping.to_frame(3).expect("frame").with_descriptors(None, Some(d(0, 7)));
    let mut buf = BytesMut::from(&only_reply.to_vec()[..]);
    let f = decode_frame(&mut buf, MAX).expect("frame ok").expect("whole");
    assert_eq!(f.descriptors(), Ok((None, Some(d(0, 7)))));
    // A payload section that is not what the flags announce.
    let mut raw = BytesMut::from(&encode_raw_frame(3, frame_flags::SHARED_DATA, 0, 1, b"", &[0; 15])[..]);
    let f = decode_frame(&mut raw, MAX).expect("frame ok").expect("whole");
    assert!(matches!(f.descriptors(), Err(FrameError::Shared { payload: 15, .. })));
}

#[test]
fn bad_headers_are_message_errors() {
    let limits = limits_for(MAX);
    let decode = |kind: u8, header: &[u8], payload: &[u8]| {
        let mut buf = BytesMut::from(&encode_raw_frame(kind, 0, 0, 9, header, payload)[..]);
        let frame = decode_frame(&mut buf, MAX).expect("frame ok").expect("whole");
        Message::from_frame(frame, &limits)
    };
    assert!(decode(FrameKind::Ping as u8, b"x", b"").is_err(), "ping has no header");
    assert!(decode(FrameKind::Goodbye as u8, &[3, 0, 0, 0, 0xff, 0xfe, 0xfd], b"").is_err(), "not UTF-8");
    assert!(decode(FrameKind::Call as u8, &[0; 11], b"").is_err(), "truncated call context");
    let mut call = Vec::new();
    abi::encode(&ctx(), &mut call);
    call.extend_from_slice(&999u16.to_le_bytes());
    let e = decode(FrameKind::Call as u8, &call, b"").expect_err("unknown fop");
    assert_eq!(e.source, DecodeError::UnknownFop(999));
    // A hello of another major decodes to its version alone.
    let mut h = Vec::new();
    abi::encode_hello(AbiVersion::new(2, 0), &mut h);
    h.extend_from_slice(b"whatever v2 sends");
    assert_eq!(
        decode(FrameKind::Hello as u8, &h, b"").expect("decodes"),
        Message::Hello(Hello { version: AbiVersion::new(2, 0), params: Dict::new() })
    );
}

#[test]
fn callctx_len_matches_the_encoding() {
    let mut h = Vec::new();
    abi::encode(&ctx(), &mut h);
    let n = h.len();
    h.extend_from_slice(b"rest");
    assert_eq!(callctx_len(&h), Ok(n));
    let mut huge = vec![0u8; 12];
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(callctx_len(&huge).is_err());
}

/// A connected loopback TCP pair.
async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    let (a, b) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
    (a.expect("connect"), b.expect("accept").0)
}

/// A REPLY frame whose id says who sent it and whose payload (of
/// `len` bytes) repeats the id, so a torn or mixed frame shows.
fn tagged(id: u64, len: usize) -> OutFrame {
    Message::Reply(Ok(Response::from(Reply::Read { data: Bytes::from(vec![id as u8; len]), iatt: Iatt::default() })))
        .to_frame(id)
        .expect("encodes")
}

fn check_tagged(f: Frame) -> u64 {
    let id = f.id;
    match Message::from_frame(f, &limits_for(MAX)).expect("decodes") {
        Message::Reply(Ok(Response { reply: Reply::Read { data, .. }, .. })) => {
            assert!(data.iter().all(|&b| b == id as u8), "frame {id} is whole")
        }
        m => panic!("unexpected {m:?}"),
    }
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_carries_the_frames_of_many_tasks_whole_and_in_order_per_task() {
    let (a, b) = tcp_pair().await;
    let (_rd, wr) = a.into_split();
    let (link, writer) = Link::spawn(wr);
    const TASKS: u64 = 8;
    const FRAMES: u64 = 150;
    let senders: Vec<_> = (0..TASKS)
        .map(|t| {
            let link = link.clone();
            tokio::spawn(async move {
                for i in 0..FRAMES {
                    // Sizes from none to more than a socket buffer, so
                    // that some sends are cut short and handed over.
                    let len = ((i * 7919 + t * 104_729) % 5) as usize * 70_000;
                    assert!(link.send(tagged(i * TASKS + t, len).into()).await, "sent");
                }
            })
        })
        .collect();
    let reader = tokio::spawn(async move {
        let mut r = FrameReader::new(b, MAX);
        let mut next = [0u64; TASKS as usize];
        while let Some(f) = r.next().await.expect("reads") {
            let id = check_tagged(f);
            let (t, i) = (id % TASKS, id / TASKS);
            assert_eq!(next[t as usize], i, "task {t}'s frames in order");
            next[t as usize] += 1;
        }
        next
    });
    for s in senders {
        s.await.expect("sender");
    }
    drop(link);
    writer.await.expect("join").expect("written");
    assert_eq!(reader.await.expect("reader"), [FRAMES; TASKS as usize], "every frame, then the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_link_queues_bounded_and_a_cancelled_send_leaves_no_trace() {
    let (a, b) = tcp_pair().await;
    let (_rd, wr) = a.into_split();
    let (link, writer) = Link::spawn(wr);
    // Nobody reads yet: the socket fills, then the queue.
    let guards = Arc::new(Semaphore::new(2 * OUT_QUEUE + 4096));
    let total = guards.available_permits();
    let mut accepted = 0u64;
    loop {
        let guard = guards.clone().try_acquire_owned().expect("guard");
        let out = Outgoing { frame: tagged(accepted, 4096), guard: Held::slot(guard) };
        if !link.try_send(out) {
            break;
        }
        accepted += 1;
        assert!(accepted < 100_000, "the queue is bounded");
    }
    assert_eq!(link.room(), 0);
    // A send that has to wait for room, cancelled while it waits.
    let mut waiting = Box::pin(link.send(tagged(u64::MAX - 1, 4096).into()));
    assert!(poll_once_test(waiting.as_mut()).is_pending(), "waits for room");
    drop(waiting);
    link.close();
    assert!(!link.send(tagged(u64::MAX - 2, 1).into()).await, "closed: refused");
    let mut r = FrameReader::new(b, MAX);
    let mut n = 0;
    while let Some(f) = r.next().await.expect("reads") {
        assert_eq!(check_tagged(f), n, "frames in order, none lost, none extra");
        n += 1;
    }
    assert_eq!(n, accepted);
    writer.await.expect("join").expect("written");
    assert_eq!(guards.available_permits(), total, "every guard dropped once written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_link_drops_its_queue_and_waiting_senders_give_up() {
    let (a, _b) = tcp_pair().await;
    let (_rd, wr) = a.into_split();
    let (link, writer) = Link::spawn(wr);
    let guards = Arc::new(Semaphore::new(100_000));
    while link.try_send(Outgoing {
        frame: tagged(1, 4096),
        guard: Held::slot(guards.clone().try_acquire_owned().expect("guard")),
    }) {}
    let waiter = {
        let link = link.clone();
        tokio::spawn(async move { link.send(tagged(2, 4096).into()).await })
    };
    link.abort();
    assert!(!waiter.await.expect("join"), "a sender waiting for room gives up");
    assert!(!link.try_send(tagged(3, 1).into()));
    writer.abort();
    let _ = writer.await;
    // What was queued is dropped, its guards with it.
    assert_eq!(guards.available_permits(), 100_000, "queued guards released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corked_link_sends_what_came_meanwhile_when_uncorked() {
    let (a, b) = tcp_pair().await;
    let (_rd, wr) = a.into_split();
    let (link, writer) = Link::spawn(wr);
    let mut r = FrameReader::new(b, MAX);
    let cork = link.cork().expect("the socket is free");
    assert!(link.cork().is_none(), "one owner at a time");
    for id in 0..3 {
        assert!(link.send(tagged(id, 10).into()).await, "queued");
    }
    {
        let other = link.clone();
        assert!(
            tokio::spawn(async move { other.send_deferred(tagged(3, 10).into()).await }).await.expect("join"),
            "queued from another task"
        );
    }
    assert_eq!(link.room(), OUT_QUEUE - 4, "all four wait in the queue");
    drop(cork);
    assert_eq!(link.room(), OUT_QUEUE, "written when uncorked");
    for id in 0..4 {
        assert_eq!(check_tagged(r.next().await.expect("reads").expect("frame")), id);
    }
    // Deferred sends on a free socket go through the writer task.
    assert!(link.send_deferred(tagged(4, 10).into()).await);
    assert_eq!(check_tagged(r.next().await.expect("reads").expect("frame")), 4);
    drop(link);
    writer.await.expect("join").expect("written");
    assert!(r.next().await.expect("clean end").is_none());
}

fn poll_once_test<F: Future + ?Sized>(f: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
    f.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

#[tokio::test]
async fn writer_and_reader_carry_frames_over_a_pipe() {
    let (a, b) = tokio::io::duplex(1 << 16);
    let (tx, rx) = mpsc::channel(OUT_QUEUE);
    let writer = tokio::spawn(write_loop(a, rx));
    let data = Bytes::from((0..300_000u32).map(|i| i as u8).collect::<Vec<_>>());
    let reply = Message::Reply(Ok(Response::from(Reply::Read { data: data.clone(), iatt: Iatt::default() })));
    for id in 0..10u64 {
        tx.send(reply.to_frame(id).expect("encodes").into()).await.expect("queued");
        tx.send(Message::Pong.to_frame(id).expect("encodes").into()).await.expect("queued");
    }
    drop(tx);
    let mut r = FrameReader::new(b, MAX);
    for id in 0..10u64 {
        let f = r.next().await.expect("reads").expect("frame");
        assert_eq!((f.kind, f.id), (FrameKind::Reply, id));
        assert_eq!(Message::from_frame(f, &limits_for(MAX)).expect("decodes"), reply);
        assert_eq!(r.next().await.expect("reads").expect("frame").kind, FrameKind::Pong);
    }
    assert!(r.next().await.expect("clean end").is_none());
    writer.await.expect("join").expect("written");
}

#[tokio::test]
async fn reader_reports_truncation_and_oversize() {
    let whole = Message::Goodbye("bye".into()).to_frame(0).expect("encodes").to_vec();
    let mut r = FrameReader::new(&whole[..whole.len() - 1], MAX);
    assert!(matches!(r.next().await, Err(RpcError::Truncated(n)) if n == whole.len() - 1));
    let big = encode_raw_frame(FrameKind::Ping as u8, 0, 0, 0, &[0; 100], b"");
    let mut r = FrameReader::new(&big[..], 64);
    let e = r.next().await.expect_err("too large");
    assert!(e.to_string().contains("120 bytes") && e.to_string().contains("64 bytes"), "{e}");
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256), max in 0usize..512) {
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(frame)) = decode_frame(&mut buf, max) {
            let _ = Message::from_frame(frame, &limits_for(max));
        }
    }
}
