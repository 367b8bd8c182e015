//! Writes a seed corpus for the `decode` target: valid encodings of a few
//! values of each message type. Usage: `cargo run --example seed -- corpus/decode`.

use bytes::Bytes;
use xlfs_sdk::abi::{self, AbiVersion, Wire};
use xlfs_sdk::*;

fn seed<T: Wire>(dir: &std::path::Path, name: &str, value: &T) -> std::io::Result<()> {
    let mut header = Vec::new();
    let payload = abi::encode(value, &mut header);
    std::fs::write(dir.join(name), xlfs_sdk_fuzz::join(&header, payload.as_ref()))
}

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus/decode".into()));
    std::fs::create_dir_all(&dir)?;
    let xdata = Dict::new()
        .with("glusterfs.inodelk-count", Value::Str("dom".into()))
        .with("gfid-req", Value::Gfid(Gfid::ROOT))
        .with("n", Value::I64(-1))
        .with("trusted.afr", Value::Bytes(Bytes::from_static(&[0; 12])))
        .with("u", Value::U64(7));
    let fd = Fd { id: FdId(3), gfid: Gfid::ROOT };
    let iatt = Iatt { gfid: Gfid::ROOT, mode: 0o40755, nlink: 2, ..Iatt::default() };
    let loc = Loc::entry(Gfid::ROOT, "file");
    let fops = [
        Fop::Lookup { loc: loc.clone() },
        Fop::Setattr { loc: loc.clone(), attr: SetAttr { mode: Some(0o644), atime: Some(TimeSet::Now), ..SetAttr::default() } },
        Fop::Writev { fd, data: Bytes::from_static(b"hello"), offset: 4096, flags: 0 },
        Fop::Setxattr { loc: loc.clone(), xattrs: xdata.clone(), flags: 1 },
        Fop::Finodelk { domain: "afr".into(), fd, cmd: LkCmd::SetLkw, lock: Flock::whole(LockType::Write, 9) },
        Fop::Entrylk { domain: "dht".into(), loc, name: "x".into(), cmd: EntrylkCmd::Lock, ty: EntrylkType::Write },
        Fop::CopyFileRange { fd_in: fd, off_in: 1, fd_out: fd, off_out: 2, len: 3, flags: 0 },
    ];
    for (i, fop) in fops.into_iter().enumerate() {
        seed(&dir, &format!("fop-{i}"), &fop)?;
        seed(&dir, &format!("request-{i}"), &Request::with_xdata(fop, xdata.clone()))?;
    }
    let entry = DirEntry { name: "a".into(), d_off: 1, d_type: FileType::Regular, iatt };
    let replies = [
        Reply::Entry { iatt, postparent: iatt },
        Reply::Read { data: Bytes::from_static(b"data"), iatt },
        Reply::Dirents(vec![entry.clone(), entry]),
        Reply::Xattrs(xdata.clone()),
        Reply::Checksum { weak: 1, strong: [2; 32] },
    ];
    for (i, reply) in replies.into_iter().enumerate() {
        seed(&dir, &format!("reply-{i}"), &reply)?;
        seed::<FopResult>(&dir, &format!("result-{i}"), &Ok(Response { reply, xdata: xdata.clone() }))?;
    }
    seed::<FopResult>(&dir, "result-err", &Err(Errno::ENOENT))?;
    seed(&dir, "ctx", &CallCtx { groups: vec![1, 2, 3].into(), ..CallCtx::root("client-1") })?;
    let upcall = Upcall::InodelkContention { gfid: Gfid::ROOT, domain: "afr".into(), holder_client: "c".into(), holder_owner: 5 };
    seed(&dir, "event-upcall", &Event::Upcall(upcall))?;
    seed(&dir, "event-gone", &Event::ClientGone { client_id: "c".into() })?;
    let mut hello = Vec::new();
    abi::encode_hello(AbiVersion::CURRENT, &mut hello);
    std::fs::write(dir.join("hello"), xlfs_sdk_fuzz::join(&hello, None))?;
    Ok(())
}
