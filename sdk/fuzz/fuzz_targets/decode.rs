//! Arbitrary bytes, split into a header and an optional payload, fed to
//! every ABI v1 decoder; what decodes must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| xlfs_sdk_fuzz::run(data));
