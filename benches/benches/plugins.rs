//! Plugin overhead (ns per fop) over a null leaf, for a stat and for a
//! 128 KiB write: no translator, a native pass-through (debug/io-stats with
//! counting and latency off: fops go straight to its child), the dylib
//! passthrough plugin and the WebAssembly one, each with a full round trip
//! (the reply re-enters the plugin) and with tail winds (`tail on`: the
//! child's result goes straight up).
//!
//! The plugins are built from source first (`runtime/tests/plugin_kit`,
//! needs `rustup target add wasm32-unknown-unknown`).

#[path = "../../runtime/tests/plugin_kit/mod.rs"]
mod plugin_kit;

use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use xlfs_benches::runtime;
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;
use xlfs_sdk::{
    CallCtx, Fd, FdId, Fop, FopFuture, Gfid, Iatt, InitCtx, InitError, Loc, Reply, Request, Response, Xlator,
    XlatorType,
};

/// A leaf that answers every fop at once.
struct Null;

impl Xlator for Null {
    fn call(&self, _ctx: CallCtx, req: Request) -> FopFuture<'_> {
        let reply = match req.fop {
            Fop::Stat { .. } | Fop::Fstat { .. } => Reply::Attr(Iatt { gfid: req.fop.gfid(), ..Iatt::default() }),
            Fop::Writev { .. } => Reply::PrePost { pre: Iatt::default(), post: Iatt::default() },
            _ => Reply::Empty,
        };
        Box::pin(async move { Ok(Response::from(reply)) })
    }

    fn notify(&self, event: xlfs_sdk::Event, from: xlfs_sdk::EventFrom) -> Option<xlfs_sdk::Event> {
        (from == xlfs_sdk::EventFrom::Graph && event == xlfs_sdk::Event::ParentUp).then_some(xlfs_sdk::Event::ChildUp)
    }
}

const NULL: XlatorType = XlatorType {
    name: "bench/null",
    description: "answers every fop at once",
    options: &[],
    min_children: 0,
    max_children: 0,
    build: |_: InitCtx| -> Result<Arc<dyn Xlator>, InitError> { Ok(Arc::new(Null)) },
};

/// One node on the null leaf: its type and options.
type Layer<'a> = Option<(&'a str, Vec<(&'a str, String)>)>;

/// The null leaf with one node of type `ty` (options `opts`) on top, or alone.
fn graph(rt: &tokio::runtime::Runtime, layer: Layer<'_>) -> Graph {
    let mut reg = Registry::builtin();
    reg.register(NULL).expect("register bench/null");
    let mut v = "volume l0\n    type bench/null\nend-volume\n".to_string();
    if let Some((ty, opts)) = layer {
        v.push_str(&format!("volume l1\n    type {ty}\n"));
        for (k, val) in opts {
            v.push_str(&format!("    option {k} {val}\n"));
        }
        v.push_str("    subvolumes l0\nend-volume\n");
    }
    let g = Graph::from_str(&v, "bench.vol", &reg).expect("bench volfile builds");
    g.activate();
    rt.block_on(g.wait_up(std::time::Duration::from_secs(10))).expect("up");
    g
}

fn plugins(c: &mut Criterion) {
    let rt = runtime();
    let wasm = plugin_kit::wasm("passthrough").display().to_string();
    let dylib = plugin_kit::dylib("passthrough").display().to_string();
    let ctx = CallCtx::root("bench");
    let fd = Fd { id: FdId(1), gfid: Gfid::ROOT };
    let data = Bytes::from(vec![0u8; 128 * 1024]);
    let stat = || Request::new(Fop::Stat { loc: Loc::gfid(Gfid::ROOT) });
    let write = || Request::new(Fop::Writev { fd, data: data.clone(), offset: 0, flags: 0 });
    let plugin = |module: &str, tail: &str| vec![("module", module.to_string()), ("tail", tail.to_string())];
    let configs: Vec<(&str, Layer<'_>)> = vec![
        ("none", None),
        (
            "native",
            Some(("debug/io-stats", vec![("count-fop-hits", "off".into()), ("latency-measurement", "off".into())])),
        ),
        ("dylib", Some(("plugin/dylib", plugin(&dylib, "off")))),
        ("dylib-tail", Some(("plugin/dylib", plugin(&dylib, "on")))),
        ("wasm", Some(("plugin/wasm", plugin(&wasm, "off")))),
        ("wasm-tail", Some(("plugin/wasm", plugin(&wasm, "on")))),
    ];
    let mut group = c.benchmark_group("plugins");
    group.throughput(Throughput::Elements(1));
    for (name, layer) in configs {
        let g = graph(&rt, layer);
        let top = g.top();
        group.bench_function(format!("stat/{name}"), |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), stat())));
        group.bench_function(format!("write-128k/{name}"), |b| b.to_async(&rt).iter(|| top.call(ctx.clone(), write())));
        g.shutdown();
    }
    group.finish();
}

criterion_group!(benches, plugins);
criterion_main!(benches);
