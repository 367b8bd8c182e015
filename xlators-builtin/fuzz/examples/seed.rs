//! Writes a seed corpus for the `frame` target: one file per message kind
//! (and a few streams of several frames), valid frames the fuzzer mutates.
//! Usage: `cargo run --example seed -- corpus/frame`.

use std::sync::Arc;

use bytes::Bytes;
use xlfs_sdk::abi::AbiVersion;
use xlfs_sdk::{
    CallCtx, Dict, Errno, Event, Fd, FdId, Flock, Fop, Gfid, Iatt, LkCmd, Loc, LockType, Reply,
    Request, Response, Upcall, Value,
};
use xlfs_xlators::protocol::rpc::{Hello, HelloReply, Message, hello_keys};

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "corpus/frame".into());
    std::fs::create_dir_all(&dir).expect("corpus directory");
    let fd = Fd {
        id: FdId(3),
        gfid: Gfid::ROOT,
    };
    let ctx = CallCtx {
        uid: 1,
        gid: 2,
        groups: Arc::from(vec![3u32]),
        pid: 4,
        lk_owner: 5,
        client_id: Arc::from("c"),
        frame: Default::default(),
        lent: Default::default(),
    };
    let params = Dict::new()
        .with(hello_keys::VOLUME, Value::Str("/b1".into()))
        .with(hello_keys::CLIENT_ID, Value::Str("c".into()))
        .with(hello_keys::USERNAME, Value::Str("u".into()))
        .with(hello_keys::PASSWORD, Value::Str("p".into()));
    let msgs = vec![
        Message::Hello(Hello {
            version: AbiVersion::CURRENT,
            params,
        }),
        Message::HelloReply(HelloReply::refuse("no")),
        Message::HelloReply(HelloReply {
            version: AbiVersion::CURRENT,
            accepted: true,
            reason: String::new(),
            info: Dict::new().with("client-id", Value::Str("c#1".into())),
        }),
        Message::Call {
            ctx: ctx.clone(),
            req: Request::new(Fop::Lookup {
                loc: Loc::entry(Gfid::ROOT, "a"),
            }),
        },
        Message::Call {
            ctx: ctx.clone(),
            req: Request::new(Fop::Writev {
                fd,
                data: Bytes::from_static(b"abc"),
                offset: 9,
                flags: 0,
            }),
        },
        Message::Call {
            ctx,
            req: Request::new(Fop::Finodelk {
                domain: "d".into(),
                fd,
                cmd: LkCmd::SetLkw,
                lock: Flock::whole(LockType::Write, 1),
            }),
        },
        Message::Reply(Ok(Response::from(Reply::Read {
            data: Bytes::from_static(b"xyz"),
            iatt: Iatt::default(),
        }))),
        Message::Reply(Err(Errno::ENOENT)),
        Message::Ping,
        Message::Pong,
        Message::Upcall(Event::Upcall(Upcall::InodelkContention {
            gfid: Gfid::ROOT,
            domain: "d".into(),
            holder_client: "c#1".into(),
            holder_owner: 1,
        })),
        Message::Goodbye("bye".into()),
    ];
    let frames: Vec<Vec<u8>> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| m.to_frame(i as u64).expect("encodes").to_vec())
        .collect();
    for (i, f) in frames.iter().enumerate() {
        for sel in [3u8, 2] {
            std::fs::write(format!("{dir}/seed-{i}-{sel}"), [&[sel][..], f].concat())
                .expect("write seed");
        }
    }
    std::fs::write(
        format!("{dir}/seed-stream"),
        [vec![0x43u8], frames.concat()].concat(),
    )
    .expect("write seed");
}
