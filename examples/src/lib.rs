//! Runnable walkthroughs: see `examples/` (run with `cargo run -p xlfs-examples --example NAME`).
