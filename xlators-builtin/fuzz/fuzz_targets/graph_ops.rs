//! Random fop sequences through an in-process replicate / locks / posix
//! graph, checked against a model (see `src/graph.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| xlfs_xlators_fuzz::graph::check_graph_ops(data));
