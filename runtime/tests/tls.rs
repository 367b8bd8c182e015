//! TLS between clients and bricks end to end (issue 17, item 2): real
//! `xlfs brick` processes with `transport.socket.ssl-enabled`, a FUSE
//! mount by a real `xlfs mount` process and in-process client graphs.
//!
//! - a FUSE mount over TLS works, and a relay on the path sees none of the
//!   file's bytes (the same relay in front of a plain brick does);
//! - the brick refuses, and logs why, a plain client, a client whose
//!   certificate another CA signed, and a client whose certificate name is
//!   not in `auth.ssl-allow`;
//! - a client refuses a brick (a man in the middle) whose certificate
//!   another CA signed, and says why;
//! - the volume keys of `xlfs daemon`, and `xlfs up --ssl-*`, turn it on
//!   for bricks, mounts and the heal daemon.

mod kit;

use std::time::Duration;

use kit::fuse_mount::FuseMount;
use kit::raw::Raw;
use kit::tls::Tap;
use kit::{Brick, BrickConfig, mount_with, wait_state};
use xlfs_runtime::client::Client;
use xlfs_runtime::graph::TopState;
use xlfs_sdk::Errno;
use xlfs_sdk::testing::pki::Pki;

const GUARD: Duration = Duration::from_secs(20);

/// 64 KiB of text that must not be readable on the wire.
fn secret() -> Vec<u8> {
    let word = format!("xlfs-secret-{:016x}-", rand_u64());
    word.as_bytes().iter().copied().cycle().take(64 << 10).collect()
}

fn rand_u64() -> u64 {
    u64::from_le_bytes(xlfs_sdk::Gfid::random().0[..8].try_into().expect("8 bytes"))
}

/// Mounts `brick` through a recording relay with the client `options`,
/// writes `data` to a file and reads it back through FUSE; whether the
/// relay saw the data's first 32 bytes.
fn write_through_tap(brick: &Brick, options: &[(&str, &str)], data: &[u8]) -> bool {
    let tap = Tap::start(brick.addr());
    let volfile = kit::client_volfile_to(tap.port, &brick.subvolume(), options);
    let m = FuseMount::start(&volfile, "");
    let f = m.path().join("secret.txt");
    std::fs::write(&f, data).expect("write through the mount");
    let back = std::fs::read(&f).expect("read through the mount");
    assert!(back == data, "the file reads back as written");
    drop(m);
    assert_eq!(std::fs::read(brick.dir().join("secret.txt")).expect("on the brick"), data);
    let (saw, total) = tap.saw(&data[..32]);
    assert!(total > data.len(), "the relay carried the traffic ({total} bytes)");
    saw
}

#[test]
fn a_fuse_mount_over_tls_hides_the_data_on_the_wire() {
    let pki = Pki::new("xlfs");
    let brick_id = pki.issue("brick", &["127.0.0.1", "localhost"]);
    let client_id = pki.issue("client-a", &[]);
    let data = secret();

    let plain = Brick::start();
    assert!(write_through_tap(&plain, &[], &data), "without TLS the relay reads the file (the check can fail)");

    let mut server = brick_id.options();
    server.push(("auth.ssl-allow", "client-*"));
    let brick = Brick::start_with(BrickConfig::server_options(&server));
    assert!(!write_through_tap(&brick, &client_id.options(), &data), "with TLS the relay sees none of the file");
}

/// A client graph that never comes up; the brick logs `why`, if given.
async fn refused(brick: &Brick, options: &[(&str, &str)], why: Option<&str>) -> xlfs_runtime::graph::Graph {
    let graph = kit::client_graph(brick, options);
    if let Some(why) = why {
        assert!(brick.wait_log(why, GUARD), "the brick log says why ({why:?}):\n{}", brick.log());
    }
    assert!(!wait_state(&graph, TopState::Up, Duration::from_millis(500)).await, "a refused client never comes up");
    assert_eq!(Client::new(graph.top()).stat("/").await.expect_err("refused"), Errno::ENOTCONN);
    graph
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_checked_both_ways() {
    let pki = Pki::new("xlfs");
    let evil = Pki::new("evil");
    let brick_id = pki.issue("brick", &["127.0.0.1"]);
    let mut server = brick_id.options();
    server.push(("auth.ssl-allow", "client-*"));
    let brick = Brick::start_with(BrickConfig::server_options(&server));

    refused(&brick, &[], Some("closing connection before the handshake: TLS handshake:")).await;
    let forged = evil.issue("client-forged", &[]).trusting(&pki.ca());
    refused(&brick, &forged.options(), Some("UnknownIssuer")).await;
    let mallory = pki.issue("mallory", &[]);
    refused(&brick, &mallory.options(), Some("client refused: certificate name 'mallory' is not allowed")).await;

    let good = pki.issue("client-b", &[]);
    let m = mount_with(&brick, &good.options()).await;
    m.client.mkdir("/ok", 0o755).await.expect("a client with a good certificate works");
    assert!(brick.dir().join("ok").is_dir());

    // A man in the middle: a brick with a certificate from another CA.
    let mitm = Brick::start_with(BrickConfig::server_options(&evil.issue("brick", &["127.0.0.1"]).options()));
    let g = refused(&mitm, &good.options(), None).await;
    let dump = g.dump();
    let why = dump.iter().find(|(k, _)| k.ends_with("last-error")).map(|(_, v)| v.clone()).unwrap_or_default();
    assert!(why.contains("invalid peer certificate") && why.contains("UnknownIssuer"), "the client says why: {why:?}");
}

/// `client.ssl`, `server.ssl`, `ssl.*` and `auth.ssl-allow` set on a
/// volume of `xlfs daemon`: the bricks start with TLS only, the client
/// mounted by name (and the self-heal daemon) use it, and a plain peer gets
/// no answer from a brick.
#[test]
fn volume_keys_turn_tls_on_for_bricks_and_clients() {
    use kit::daemon::Daemon;
    let pki = Pki::new("xlfs");
    let node = pki.issue("node1", &["127.0.0.1", "localhost"]);
    let tmp = tempfile::Builder::new().prefix("xlfs-tls-vol-").tempdir().expect("tempdir");
    let dirs: Vec<String> = (0..3)
        .map(|i| {
            let d = tmp.path().join(format!("b{i}"));
            std::fs::create_dir_all(&d).expect("brick dir");
            format!("127.0.0.1:{}", std::fs::canonicalize(&d).expect("canonical").display())
        })
        .collect();
    let d = Daemon::start();
    let mut create = vec!["create", "tv", "replica", "3"];
    create.extend(dirs.iter().map(String::as_str));
    create.push("force");
    d.ok(&create);
    for (k, v) in [
        ("client.ssl", "on"),
        ("server.ssl", "on"),
        ("ssl.own-cert", node.cert.as_str()),
        ("ssl.private-key", node.key.as_str()),
        ("ssl.ca-list", node.ca.as_str()),
        ("auth.ssl-allow", "other,node*"),
    ] {
        d.ok(&["set", "tv", k, v]);
    }
    let bad = d.refused(&["set", "tv", "server.ssl", "maybe"]);
    assert!(bad.contains("server.ssl") && bad.contains("maybe"), "{bad}");
    d.ok(&["start", "tv"]);

    let m = FuseMount::start_by_name(&format!("{}:/tv", d.addr()), "", &[]);
    let data = secret();
    std::fs::write(m.path().join("f"), &data).expect("write over TLS");
    assert!(std::fs::read(m.path().join("f")).expect("read over TLS") == data);
    drop(m);

    let status: serde_json::Value = serde_json::from_str(&d.ok(&["status", "tv", "--json"])).expect("JSON");
    let port = status["volumes"][0]["bricks"][0]["port"].as_u64().expect("a brick port") as u16;
    assert_plain_hello_unanswered(port);
}

/// A plain peer that says HELLO to the brick on `port` (TLS only) gets
/// nothing but a closed connection.
fn assert_plain_hello_unanswered(port: u16) {
    let mut raw = Raw::connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    let hello = xlfs_xlators::protocol::rpc::Message::Hello(xlfs_xlators::protocol::rpc::Hello {
        version: xlfs_sdk::abi::AbiVersion::CURRENT,
        params: xlfs_sdk::Dict::new(),
    });
    raw.send_msg(&hello, 0);
    assert!(raw.recv_frame().is_none(), "the brick on port {port} answers a plain peer with nothing");
}

/// `xlfs up` with `--ssl-own-cert`, `--ssl-private-key`, `--ssl-ca-list`
/// and `--ssl-allow`: the bricks take TLS only, the mount and the heal
/// daemon use it, a plain peer gets no answer from a brick, and a flag
/// given without the others is refused before anything starts.
#[test]
fn up_with_tls_serves_the_mount_and_refuses_plain_peers() {
    let pki = Pki::new("xlfs");
    let node = pki.issue("node1", &["127.0.0.1", "localhost"]);
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("vol");
    let _down = kit::Down(dir.clone());
    let d = dir.to_str().expect("utf-8");
    let half = kit::run_xlfs(&["up", d, "--ssl-own-cert", &node.cert]);
    let why = String::from_utf8_lossy(&half.stderr);
    assert!(!half.status.success() && why.contains("--ssl-private-key"), "{why}");

    let up = kit::run_xlfs(&[
        "up",
        d,
        "--ssl-own-cert",
        &node.cert,
        "--ssl-private-key",
        &node.key,
        "--ssl-ca-list",
        &node.ca,
        "--ssl-allow",
        "other,node*",
    ]);
    let text = String::from_utf8_lossy(&up.stdout).into_owned();
    assert!(up.status.success(), "xlfs up: {}{text}", String::from_utf8_lossy(&up.stderr));
    let vol = std::fs::read_to_string(dir.join("client.vol")).expect("client.vol");
    assert_eq!(vol.matches("option transport.socket.ssl-enabled on\n").count(), 3, "{vol}");
    let data = secret();
    std::fs::write(dir.join("mnt/f"), &data).expect("write over TLS");
    assert!(std::fs::read(dir.join("mnt/f")).expect("read over TLS") == data);

    // Each brick's line: "brick b0: DIR on 127.0.0.1:PORT (pid ...".
    let port: u16 = text
        .lines()
        .find_map(|l| l.split(" on 127.0.0.1:").nth(1)?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("a brick port in {text}"));
    assert_plain_hello_unanswered(port);
}
