#!/usr/bin/env bash
# Installs what the tests need and a fresh Debian machine lacks; does
# nothing for what is there already. Needs root (apt-get).
# - Debian packages: attr (getfattr/setfattr for on-disk checks), gcc
#   (runtime/tests/plugin_examples.rs builds plugins/c-passthrough), g++
#   (runtime/tests/native_panics.rs builds plugins/c-passthrough/throwing.cpp),
#   fuse3,
#   git, util-linux's flock and postgresql (the FUSE mount tests in
#   runtime/tests/fuse.rs and runtime/tests/postgres.rs), fio, jq, bc (the
#   workload scripts in ../shared/bench), iproute2 (ip, tc), e2fsprogs
#   (mkfs.ext4) and mount (mount, losetup) for the network-namespace,
#   link-fault and full-disk tests in runtime/tests/partitions.rs;
#   etcd-server (the cluster store of runtime/tests/cluster.rs);
# - the wasm32-unknown-unknown target (the plugin tests build plugins/ for
#   WebAssembly, runtime/tests/plugin_kit);
# - cargo-nextest (the test runner).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

need=()
for pkg in attr gcc g++ fuse3 git postgresql fio jq bc iproute2 e2fsprogs mount etcd-server; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing: ${need[*]}" >&2
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "error: cargo not found: the machine's Rust toolchain is required" >&2; exit 1; }
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    rustup target add wasm32-unknown-unknown || {
        echo "error: cannot install the wasm32-unknown-unknown target (rustup target add wasm32-unknown-unknown): the plugin tests need it" >&2
        exit 1
    }
fi
if ! command -v cargo-nextest >/dev/null; then
    cargo install cargo-nextest --locked
fi
