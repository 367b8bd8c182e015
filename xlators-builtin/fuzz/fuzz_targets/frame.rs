//! Arbitrary bytes fed to the RPC frame decoder as a stream, and each
//! frame's header to the message decoder of its kind (see `src/lib.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| xlfs_xlators_fuzz::run(data));
