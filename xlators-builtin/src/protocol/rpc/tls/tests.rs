use bytes::{Bytes, BytesMut};
use tokio::net::{TcpListener, TcpStream};
use xlfs_sdk::testing::pki::Pki;

use super::*;
use crate::protocol::rpc::{FrameReader, Link, Message, OutFrame};

/// A certificate for `cn` valid for `sans`, as the files of one side.
fn issue(pki: &Pki, cn: &str, sans: &[&str]) -> TlsFiles {
    let id = pki.issue(cn, sans);
    TlsFiles { cert: id.cert, key: id.key, ca: id.ca }
}

/// A server and a client TLS session over loopback; the server's peer
/// name, or the two sides' errors.
async fn pair(
    server: &TlsFiles,
    client: &TlsFiles,
    host: &str,
) -> Result<((WireRead, WireWrite, Option<String>), (WireRead, WireWrite)), (String, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let scfg = server.server_config().expect("server config");
    let ccfg = client.client_config().expect("client config");
    let accept = tokio::spawn(async move {
        let (s, _) = listener.accept().await.expect("accept");
        TlsStream::accept(s, scfg).await
    });
    let sock = TcpStream::connect(addr).await.expect("connect");
    let c = TlsStream::connect(sock, ccfg, host).await;
    let s = accept.await.expect("join");
    match (s, c) {
        (Ok(s), Ok(c)) => Ok((s, c)),
        (s, c) => Err((
            s.err().map(|e| e.to_string()).unwrap_or_default(),
            c.err().map(|e| e.to_string()).unwrap_or_default(),
        )),
    }
}

fn frame(id: u64, len: usize) -> OutFrame {
    let data = Bytes::from((0..len).map(|i| (i as u64 ^ id) as u8).collect::<Vec<u8>>());
    Message::Reply(Ok(xlfs_sdk::Response::from(xlfs_sdk::Reply::Read { data, iatt: xlfs_sdk::Iatt::default() })))
        .to_frame(id)
        .expect("frame")
}

fn payload_ok(f: &crate::protocol::rpc::Frame) -> bool {
    f.payload.iter().enumerate().all(|(i, b)| *b == (i as u64 ^ f.id) as u8)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_cross_a_tls_session_whole_and_in_order_both_ways() {
    let pki = Pki::new("xlfs");
    let brick = issue(&pki, "brick", &["localhost", "127.0.0.1"]);
    let client = issue(&pki, "client-a", &[]);
    let ((srd, swr, cn), (crd, cwr)) = pair(&brick, &client, "127.0.0.1").await.expect("handshake");
    assert_eq!(cn.as_deref(), Some("client-a"), "the brick sees the client's certificate name");
    let (slink, swriter) = Link::spawn(swr);
    let (clink, cwriter) = Link::spawn(cwr);
    // Many tasks send frames from 0 bytes to 3 MiB (past TLS_WRITE_CHUNK and
    // the socket's buffers, so records wait in the session) each way.
    let sizes = [0usize, 1, 100, 16 << 10, 300 << 10, 3 << 20];
    let send = |link: Link, base: u64| {
        tokio::spawn(async move {
            for (i, &n) in sizes.iter().enumerate() {
                assert!(link.send(frame(base + i as u64, n).into()).await, "sent");
            }
        })
    };
    let readers = [(srd, 100u64), (crd, 200u64)].map(|(rd, base)| {
        tokio::spawn(async move {
            let mut r = FrameReader::new(rd, 64 << 20);
            let mut seen = Vec::new();
            while seen.len() < sizes.len() * 2 {
                let f = r.next().await.expect("read").expect("a frame");
                assert!(payload_ok(&f), "frame {} arrived intact", f.id);
                seen.push((f.id, f.payload.len()));
            }
            (base, seen)
        })
    });
    let senders =
        [send(clink.clone(), 100), send(clink.clone(), 110), send(slink.clone(), 200), send(slink.clone(), 210)];
    for s in senders {
        s.await.expect("sender");
    }
    for r in readers {
        let (base, seen) = r.await.expect("reader");
        for task in [base, base + 10] {
            let ids: Vec<u64> =
                seen.iter().filter(|(id, _)| (task..task + 10).contains(id)).map(|(id, _)| *id).collect();
            assert_eq!(ids, (task..task + sizes.len() as u64).collect::<Vec<_>>(), "one task's frames in order");
        }
    }
    drop((slink, clink));
    swriter.await.expect("join").expect("server writer ends cleanly");
    cwriter.await.expect("join").expect("client writer ends cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_checked_both_ways() {
    let pki = Pki::new("xlfs");
    let other = Pki::new("evil");
    let brick = issue(&pki, "brick", &["localhost", "127.0.0.1"]);
    let client = issue(&pki, "client-a", &[]);

    // A client whose certificate another CA signed: the brick refuses it.
    let mallory = TlsFiles { ca: pki.ca(), ..issue(&other, "mallory", &[]) };
    let (s, _) = pair(&brick, &mallory, "127.0.0.1").await.err().expect("refused");
    assert!(s.contains("certificate") && s.contains("UnknownIssuer"), "brick side: {s}");

    // A brick whose certificate another CA signed (a man in the middle):
    // the client refuses it.
    let mitm = TlsFiles { ca: pki.ca(), ..issue(&other, "brick", &["localhost", "127.0.0.1"]) };
    let (_, c) = pair(&mitm, &client, "127.0.0.1").await.err().expect("refused");
    assert!(c.contains("certificate") && c.contains("UnknownIssuer"), "client side: {c}");

    // A brick certificate from the right CA for another host.
    let elsewhere = issue(&pki, "brick", &["brick9.example"]);
    let (_, c) = pair(&elsewhere, &client, "127.0.0.1").await.err().expect("refused");
    assert!(c.contains("certificate not valid for name \"127.0.0.1\""), "client side: {c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_peer_fails_the_handshake() {
    let pki = Pki::new("xlfs");
    let scfg = issue(&pki, "brick", &["127.0.0.1"]).server_config().expect("config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accept = tokio::spawn(async move {
        let (s, _) = listener.accept().await.expect("accept");
        TlsStream::accept(s, scfg).await.err().expect("refused").to_string()
    });
    let mut plain = TcpStream::connect(addr).await.expect("connect");
    let hello = Message::Ping.to_frame(1).expect("frame").to_vec();
    tokio::io::AsyncWriteExt::write_all(&mut plain, &hello).await.expect("write");
    let why = accept.await.expect("join");
    assert!(why.starts_with("TLS handshake: "), "{why}");
}

#[test]
fn missing_or_bad_files_name_the_option_and_the_file() {
    let pki = Pki::new("xlfs");
    let good = issue(&pki, "brick", &["127.0.0.1"]);
    let cases = [
        (
            TlsFiles { ca: "/nonexistent/ca.pem".into(), ..good.clone() },
            "transport.socket.ssl-ca-list /nonexistent/ca.pem",
        ),
        (
            TlsFiles { cert: "/nonexistent/c.pem".into(), ..good.clone() },
            "transport.socket.ssl-own-cert /nonexistent/c.pem",
        ),
        (TlsFiles { key: good.cert.clone(), ..good.clone() }, "transport.socket.ssl-private-key"),
        (TlsFiles { cert: good.key.clone(), ..good.clone() }, "transport.socket.ssl-own-cert"),
    ];
    for (files, want) in cases {
        let e = files.server_config().expect_err("refused").to_string();
        assert!(e.contains(want), "{e} names {want}");
        let e = files.client_config().expect_err("refused").to_string();
        assert!(e.contains(want), "{e} names {want}");
    }
}

#[test]
fn subject_cn_reads_the_subject_not_the_issuer() {
    let pki = Pki::new("xlfs");
    let files = issue(&pki, "client-7", &["x.example"]);
    let der = CertificateDer::from_pem_file(&files.cert).expect("der");
    assert_eq!(subject_cn(&der).as_deref(), Some("client-7"));
    let ca = CertificateDer::from_pem_file(pki.ca()).expect("der");
    assert_eq!(subject_cn(&ca).as_deref(), Some("xlfs CA"));
    // Garbage and truncations never panic.
    for cut in 0..der.len() {
        let _ = subject_cn(&der[..cut]);
    }
    let _ = subject_cn(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]);
    assert_eq!(subject_cn(&BytesMut::zeroed(64)), None);
}
