//! The cost of the always-on fop timing of every graph node (`xlfs
//! profile`, `runtime/src/profile.rs`): a stat through a chain of
//! pass-through translators over the null leaf, built as a graph (every
//! node timed, as always) and the same translators linked by hand without
//! the graph (no timing), for a chain of 1 and of 7 pass-through nodes (7:
//! as many as a fop crosses on the default client graph, io-stats down to
//! protocol/client). The pass-through node forwards its child's future
//! as is, so the difference is the timing wrapper alone: two clock reads,
//! its boxed future, a frame for a node with children and three relaxed
//! atomic adds per node.
//!
//! Per node: (timed - raw) / (pass-through nodes + the leaf). Measured
//! (`benches/RESULTS.md`): 78-97 ns per node, about 1 % of the cheapest
//! fop on a mount.

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use xlfs_benches::{NULL, runtime};
use xlfs_runtime::graph::Graph;
use xlfs_runtime::registry::Registry;
use xlfs_sdk::testing::init_named;
use xlfs_sdk::{CallCtx, Child, Fop, FopFuture, Gfid, InitCtx, InitError, Loc, Request, Xlator, XlatorType};

/// Forwards every fop to its child, handing back the child's own future.
struct Pass {
    child: Child,
}

impl Xlator for Pass {
    fn call(&self, ctx: CallCtx, req: Request) -> FopFuture<'_> {
        self.child.call(ctx, req)
    }
}

const PASS: XlatorType = XlatorType {
    name: "bench/pass",
    description: "pass-through",
    options: &[],
    min_children: 1,
    max_children: 1,
    build: |init: InitCtx| -> Result<Arc<dyn Xlator>, InitError> {
        let child = init.children.into_iter().next().ok_or_else(|| InitError::new("one child"))?;
        Ok(Arc::new(Pass { child }))
    },
};

/// `depth` pass-through nodes over the null leaf, as a graph (timed).
fn timed(rt: &tokio::runtime::Runtime, depth: usize) -> Graph {
    let mut reg = Registry::builtin();
    reg.register(NULL).expect("bench/null");
    reg.register(PASS).expect("bench/pass");
    let mut v = "volume l0\n    type bench/null\nend-volume\n".to_string();
    for i in 1..=depth {
        v += &format!("volume l{i}\n    type bench/pass\n    subvolumes l{}\nend-volume\n", i - 1);
    }
    let g = Graph::from_str(&v, "profile-bench.vol", &reg).expect("builds");
    g.activate();
    rt.block_on(g.wait_up(Duration::from_secs(10))).expect("up");
    g
}

/// The same chain linked by hand: no graph, no timing.
fn raw(depth: usize) -> Arc<dyn Xlator> {
    let init = |children: Vec<Child>| init_named("raw", &[], &[], &children).0;
    let mut xl = (NULL.build)(init(Vec::new())).expect("null");
    for _ in 0..depth {
        xl = (PASS.build)(init(vec![Child { name: Arc::from("below"), xl }])).expect("pass");
    }
    xl
}

fn timing(c: &mut Criterion) {
    let rt = runtime();
    let ctx = CallCtx::root("bench");
    let stat = || Request::new(Fop::Stat { loc: Loc::gfid(Gfid::ROOT) });
    let mut group = c.benchmark_group("profile");
    group.throughput(Throughput::Elements(1));
    for depth in [1usize, 7] {
        let g = timed(&rt, depth);
        let top = g.top();
        let bare = raw(depth);
        group.bench_function(format!("stat-{depth}-pass-raw"), |b| {
            b.to_async(&rt).iter(|| bare.call(ctx.clone(), stat()))
        });
        group.bench_function(format!("stat-{depth}-pass-timed"), |b| {
            b.to_async(&rt).iter(|| top.call(ctx.clone(), stat()))
        });
        g.shutdown();
    }
    group.finish();
}

criterion_group!(benches, timing);
criterion_main!(benches);
