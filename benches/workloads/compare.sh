#!/bin/bash
# Usage: benches/workloads/compare.sh WORKLOAD [ROUNDS] [WORKDIR]
#   WORKLOAD: smallfile | fio-seq | pgbench
# Runs one of ../shared/bench's workloads side by side in one session, interleaved
# round by round (xlfs, GlusterFS, local ext4, xlfs, GlusterFS, ...):
#   xlfs      `xlfs up` (release build) with its defaults: replica 3 on this disk;
#             XLFS_UP_ARGS adds arguments to `xlfs up` (e.g. "-o writeback-cache")
#   glusterfs GlusterFS 10.3 replica 3 with its defaults (../shared/bench/gluster-ref.sh)
#   ext4      a local directory on the same disk (the physical reference)
#   xlfs-base the same as xlfs with another build (XLFS_BASE=path/to/xlfs), to
#             compare two builds in one run
# SYSTEMS (default "xlfs glusterfs ext4") picks and orders the columns.
# Raw lines go to WORKDIR/results.txt; the table (median, min-max, rounds,
# ratios to GlusterFS and to ext4) is printed and written to WORKDIR/table.md.
# Workload knobs pass through the environment: NDIRS/NFILES (smallfile),
# SIZE/NJ (fio-seq), TXNS (pgbench).
# Needs root and `cargo build --release`.
set -euo pipefail
WORKLOAD=${1:?usage: compare.sh smallfile|fio-seq|pgbench [ROUNDS] [WORKDIR]}
ROUNDS=${2:-3} WORK=${3:-/srv/xlfs-compare}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BENCH=${BENCH:-$ROOT/../shared/bench}
XLFS=$ROOT/target/release/xlfs
SYSTEMS=${SYSTEMS:-xlfs glusterfs ext4}
[ -x "$XLFS" ] || { echo "compare.sh: $XLFS missing: run cargo build --release" >&2; exit 1; }
mkdir -p "$WORK"; OUT=$WORK/results.txt; : > "$OUT"

GD=$WORK/glref ED=$WORK/ext4
bin() { if [ "$1" = xlfs-base ]; then echo "${XLFS_BASE:?XLFS_BASE=path of the other xlfs build}"; else echo "$XLFS"; fi; }
xlfs_down() { # SYSTEM
    local b d=$WORK/$1; b=$(bin "$1")
    mountpoint -q "$d/mnt" && "$b" umount "$d/mnt" >/dev/null 2>&1
    [ -d "$d" ] && "$b" down "$d" >/dev/null 2>&1
    rm -rf "$d"
}
cleanup() {
    set +e
    for s in $SYSTEMS; do case $s in xlfs*) xlfs_down "$s" ;; esac; done
    [ -d "$GD" ] && bash "$BENCH/gluster-ref.sh" down "$GD" >/dev/null 2>&1
    rm -rf "$ED"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# System NAME -> MNT and REMOUNT for the workload scripts.
up() {
    case $1 in
    xlfs*)
        local b xd=$WORK/$1; b=$(bin "$1")
        if ! mountpoint -q "$xd/mnt"; then
            "$b" down "$xd" >/dev/null 2>&1 || true
            # shellcheck disable=SC2086
            "$b" up "$xd" ${XLFS_UP_ARGS:-} >/dev/null
        fi
        MNT=$xd/mnt
        local o; o=$(grep -o -- '-o [^ ]*' <<<"${XLFS_UP_ARGS:-}" || true)
        REMOUNT="$b umount $MNT && $b mount --volfile $xd/client.vol --log-file $xd/logs/mount.log $o $MNT >/dev/null"
        ;;
    glusterfs)
        eval "$(bash "$BENCH/gluster-ref.sh" up "$GD")"
        ;;
    ext4)
        mkdir -p "$ED"; MNT=$ED; REMOUNT=':'
        ;;
    esac
    chmod 755 "$MNT"
}

run() { # SYSTEM: one round of the workload, each result line prefixed with SYSTEM
    case $WORKLOAD in
    smallfile) bash "$BENCH/smallfile.sh" "$MNT" "$REMOUNT" 1 ;;
    fio-seq) bash "$BENCH/fio-seq.sh" "$MNT" "$REMOUNT" "${SIZE:-512m}" "${NJ:-1}" 1 ;;
    pgbench) bash "$BENCH/pgbench.sh" "$MNT" "$REMOUNT" 1 ;;
    *) echo "compare.sh: unknown workload $WORKLOAD" >&2; exit 2 ;;
    esac 2>&1 | sed "s/^/$1 | /" | tee -a "$OUT"
}

for r in $(seq "$ROUNDS"); do
    for s in $SYSTEMS; do
        echo "== round $r/$ROUNDS: $s" >&2
        up "$s"
        run "$s"
    done
done
python3 "$ROOT/benches/workloads/table.py" "$OUT" | tee "$WORK/table.md"
