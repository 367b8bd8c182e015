#!/bin/bash
# Usage: benches/workloads/pgbench-replica3.sh [RUNS] [WORKDIR]
# pgbench (../shared/bench/pgbench.sh: -c 4 -j 2, TXNS per client, default 2000)
# on a replica-3 FUSE mount, side by side in one session:
#   xlfs (xlfs up, release build) with each lock-contention policy: the default
#   (notify), inodelk-count and fd-count; GlusterFS 10.3 with default options
#   (../shared/bench/gluster-ref.sh); and local ext4 as the ceiling.
# Needs: cargo build --release; PostgreSQL 15; root. Prints one line per run.
set -euo pipefail
RUNS=${1:-2} WORK=${2:-/srv/xlfs-bench}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=${BENCH:-$ROOT/../shared/bench}
XLFS=$ROOT/target/release/xlfs
mkdir -p "$WORK"
run() { # NAME MOUNT
    echo "== $1"
    chmod 755 "$2"
    bash "$BENCH/pgbench.sh" "$2" ':' "$RUNS" | grep -E '^pgbench c='
}
for policy in default inodelk-count fd-count; do
    d=$WORK/xlfs-$policy; rm -rf "$d"
    if [ $policy = default ]; then "$XLFS" up "$d" >/dev/null; else "$XLFS" up "$d" --afr lock-contention-policy=$policy >/dev/null; fi
    chmod 755 "$d"
    run "xlfs replica 3, lock-contention-policy $policy" "$d/mnt" || true
    "$XLFS" down "$d" >/dev/null; rm -rf "$d"
done
eval "$(bash "$BENCH/gluster-ref.sh" up "$WORK/glref")"
run "GlusterFS 10.3 replica 3, default options" "$MNT" || true
bash "$BENCH/gluster-ref.sh" down "$WORK/glref" >/dev/null || true
mkdir -p "$WORK/ext4"; run "local ext4 (no FUSE, no replication)" "$WORK/ext4" || true
rm -rf "$WORK/ext4"
