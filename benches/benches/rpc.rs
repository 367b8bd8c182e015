//! The RPC path over loopback: an in-process protocol/client talking TCP to
//! an in-process protocol/server over storage/posix (on tmpfs when there is
//! one), so what is measured is framing, the connection and the server's
//! dispatch, not a disk.
//! - `rpc/stat`: stat round trips per second, 1 and 16 requests in flight;
//! - `rpc/writev-128k`: 128 KiB writes (MiB/s), 1 and 16 in flight.
//!
//! "In flight" is the number of tasks issuing fops back to back on the one
//! connection; each criterion iteration is one fop.

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use xlfs_benches::{graph, runtime, scratch_dir};
use xlfs_runtime::client::Client;
use xlfs_runtime::graph::Graph;
use xlfs_sdk::{Fd, Fop, Loc};

/// The request depths measured.
const DEPTHS: [u64; 2] = [1, 16];

/// The write size.
const WRITE: usize = 128 * 1024;

/// The writes cycle over this much of the file.
const WRITE_SPAN: u64 = 64 << 20;

/// A server graph (posix -> server on an ephemeral loopback port) and a
/// client graph connected to it.
struct Pair {
    _dir: tempfile::TempDir,
    server: Graph,
    client: Graph,
}

impl Pair {
    fn start(rt: &tokio::runtime::Runtime) -> Pair {
        // The protocol translators spawn their tasks on the current runtime.
        let _enter = rt.enter();
        let dir = scratch_dir();
        let server = graph(
            rt,
            &format!(
                "volume bench-posix\n    type storage/posix\n    option directory {}\nend-volume\n\
                 volume bench-server\n    type protocol/server\n    option transport.socket.listen-port 0\n    \
                 option transport.socket.bind-address 127.0.0.1\n    option auth.addr.bench-posix.allow *\n    \
                 subvolumes bench-posix\nend-volume\n",
                dir.path().display()
            ),
        );
        let listen = server
            .dump()
            .into_iter()
            .find(|(k, _)| k.ends_with(".listen"))
            .map(|(_, v)| v)
            .expect("the server dumps its listen address");
        let port = listen.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).expect("host:port");
        let client = graph(
            rt,
            &format!(
                "volume bench-client\n    type protocol/client\n    option remote-host 127.0.0.1\n    \
                 option remote-port {port}\n    option remote-subvolume bench-posix\nend-volume\n"
            ),
        );
        Pair { _dir: dir, server, client }
    }
}

/// Runs `iters` calls of `op(worker, i)` spread over `depth` concurrent
/// tasks and returns the elapsed time.
async fn spread<F, Fut>(depth: u64, iters: u64, op: F) -> Duration
where
    F: Fn(u64, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let start = Instant::now();
    let tasks: Vec<_> = (0..depth)
        .map(|w| {
            let n = iters / depth + u64::from(w < iters % depth);
            let op = op.clone();
            tokio::spawn(async move {
                for i in 0..n {
                    op(w, i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("bench task");
    }
    start.elapsed()
}

fn rpc(c: &mut Criterion) {
    let rt = runtime();
    let pair = Pair::start(&rt);
    let client = Client::new(pair.client.top());
    let file = rt.block_on(client.create("/f", libc::O_RDWR, 0o644)).expect("create");
    let fd: Fd = file.fd();

    let mut group = c.benchmark_group("rpc/stat");
    group.throughput(Throughput::Elements(1));
    for depth in DEPTHS {
        group.bench_with_input(BenchmarkId::from_parameter(depth), &depth, |b, &depth| {
            b.to_async(&rt).iter_custom(|iters| {
                let client = client.clone();
                spread(depth, iters, move |_, _| {
                    let client = client.clone();
                    async move {
                        client.call(Fop::Stat { loc: Loc::gfid(fd.gfid) }).await.expect("stat");
                    }
                })
            })
        });
    }
    group.finish();

    let block = Bytes::from(vec![0x5a; WRITE]);
    let mut group = c.benchmark_group("rpc/writev-128k");
    group.throughput(Throughput::Bytes(WRITE as u64));
    for depth in DEPTHS {
        group.bench_with_input(BenchmarkId::from_parameter(depth), &depth, |b, &depth| {
            b.to_async(&rt).iter_custom(|iters| {
                let (client, block) = (client.clone(), block.clone());
                spread(depth, iters, move |w, i| {
                    let (client, data) = (client.clone(), block.clone());
                    let offset = ((i * depth + w) * WRITE as u64) % WRITE_SPAN;
                    async move {
                        client.call(Fop::Writev { fd, data, offset, flags: 0 }).await.expect("writev");
                    }
                })
            })
        });
    }
    group.finish();

    rt.block_on(file.close()).expect("close");
    pair.client.shutdown();
    pair.server.shutdown();
}

criterion_group!(benches, rpc);
criterion_main!(benches);
