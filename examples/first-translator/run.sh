#!/bin/sh
# Runs the steps of README.md: build plugins/first-translator to .wasm,
# then load it from a volfile and use it through the in-process client.
# Needs: rustup target add wasm32-unknown-unknown
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${PLUGIN_TARGET_DIR:-$root/target/plugins}
cargo build --release --target wasm32-unknown-unknown \
    --manifest-path "$root/plugins/Cargo.toml" -p xlfs-plugin-first-translator --target-dir "$target"
cargo run --manifest-path "$root/Cargo.toml" -p xlfs-examples --example first_translator -- \
    "$target/wasm32-unknown-unknown/release/xlfs_plugin_first_translator.wasm"
