//! Policies: small decision interfaces a built-in translator consults at
//! chosen points, so the decision can be swapped (by option, or for a
//! plugin module) without touching the translator.
//!
//! A policy sees plain-data events and a plain-data view of the state and
//! answers with a plain-data decision; nothing in the types is specific to
//! Rust, so the plugin hosts (WebAssembly, dylib) can encode them in the ABI.
//!
//! - [`lock_contention`]: when cluster/replicate releases an eager lock.
//! - [`read_ahead`]: what performance/read-ahead prefetches and drops.

pub mod lock_contention;
pub mod read_ahead;
