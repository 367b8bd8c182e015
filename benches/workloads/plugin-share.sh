#!/bin/bash
# Usage: benches/workloads/plugin-share.sh PLUGIN.wasm [PLACEMENT] [WORKDIR]
# A plugin's share of the machine's busy CPU on a real mount: `xlfs up` with
# the plugin (tail winds on, at PLACEMENT: cluster (default) or top), then,
# each under `perf record -a`: untar of ../shared/bench's fixture tarball (or
# /srv/bench-fixtures/dist-packages.tar) and `xlfs sync`; `cat` of every
# untarred file three times; a remount, `rm -rf` and `xlfs sync`. Prints per
# phase the samples in the plugin (its compiled code, the host's plugin code
# and wasmtime) over all samples not idle. Needs root, perf and
# `cargo build --release`. Throughput ratios within a few per cent cannot be
# read on a noisy machine; a share of CPU on a CPU-bound phase can.
set -euo pipefail
PLUGIN=${1:?usage: plugin-share.sh PLUGIN.wasm [cluster|top] [WORKDIR]}
PLACEMENT=${2:-cluster}
WORK=${3:-/srv/xlfs-plugin-share}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
X=$ROOT/target/release/xlfs
TAR=${TAR:-/srv/bench-fixtures/dist-packages.tar}
[ -f "$TAR" ] || { echo "plugin-share.sh: no tarball at $TAR (set TAR=...)" >&2; exit 2; }
UP=(--plugin "pt=wasm:$PLUGIN" --plugin pt.tail=on --plugin "pt.placement=$PLACEMENT")
D=$WORK/vol-$$ M=$WORK/vol-$$/mnt DATA=$WORK/perf-$$.data
cleanup() { "$X" down "$D" > /dev/null 2>&1 || true; rm -rf "$D" "$DATA" "$DATA.old"; rmdir "$WORK" 2> /dev/null || true; }
trap cleanup EXIT
mkdir -p "$D"
"$X" up "$D" "${UP[@]}" > /dev/null
phase() { # NAME COMMAND
  perf record -q -a -F 2000 -o "$DATA" 2> /dev/null & local pp=$!
  sleep 0.3
  bash -c "$2"
  kill -INT $pp; wait $pp || true
  perf report -i "$DATA" --no-children --sort comm,dso,sym --stdio 2> /dev/null | grep -v '^#' | awk -v n="$1" '
    NF >= 3 { p = $1; sub("%", "", p); if ($2 == "swapper") next; busy += p
              if ($3 ~ /cwasm/ || $0 ~ /plugin::|wasmtime|wasm\[0\]/) pl += p }
    END { printf "%-8s plugin %.2f%% of busy samples (busy %.1f%% of all)\n", n, 100 * pl / busy, busy }'
}
mkdir "$M/u"
phase untar "tar -xf '$TAR' -C '$M/u' && '$X' sync '$M'"
phase read "for i in 1 2 3; do find '$M/u' -type f -exec cat {} + > /dev/null; done"
"$X" down "$D" > /dev/null
"$X" up "$D" "${UP[@]}" > /dev/null
phase rm "rm -rf '$M/u' && '$X' sync '$M'"
