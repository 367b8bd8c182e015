//! Arbitrary bytes to `xlfs_runtime_fuzz::options` (src/lib.rs says what is checked).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| xlfs_runtime_fuzz::options(data));
