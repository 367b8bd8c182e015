//! Plugin overhead (ns per fop) over a null leaf, for a stat and for a
//! 128 KiB write: no translator, a native pass-through (debug/io-stats with
//! counting and latency off: fops go straight to its child), the dylib
//! passthrough plugin and the WebAssembly one, each with a full round trip
//! (the reply re-enters the plugin) and with tail winds (`tail on`: the
//! child's result goes straight up).
//!
//! The plugins are built from source first (`runtime/tests/plugin_kit`,
//! needs `rustup target add wasm32-unknown-unknown`).
//! `XLFS_BENCH_WASM=FILE` puts another build of the WebAssembly
//! pass-through in the `wasm` columns (to compare two builds of the guest
//! side in one bench binary).

#[path = "../../runtime/tests/plugin_kit/mod.rs"]
mod plugin_kit;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use xlfs_benches::{null_graph, runtime};
use xlfs_runtime::graph::Graph;
use xlfs_sdk::{CallCtx, Fd, FdId, Fop, Gfid, Loc, Request};

/// One node on the null leaf: its type and options.
type Layer<'a> = Option<(&'a str, Vec<(&'a str, String)>)>;

/// The null leaf with one node of type `ty` (options `opts`) on top, or alone.
fn graph(rt: &tokio::runtime::Runtime, layer: Layer<'_>) -> Graph {
    match layer {
        None => null_graph(rt, &[]),
        Some((ty, opts)) => {
            let opts: Vec<(&str, &str)> = opts.iter().map(|(k, v)| (*k, v.as_str())).collect();
            null_graph(rt, &[(ty, &opts)])
        }
    }
}

fn plugins(c: &mut Criterion) {
    let rt = runtime();
    let wasm =
        std::env::var("XLFS_BENCH_WASM").unwrap_or_else(|_| plugin_kit::wasm("passthrough").display().to_string());
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
