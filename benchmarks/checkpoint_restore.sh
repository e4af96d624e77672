#!/usr/bin/env bash
# What restoring a cluster checkpoint costs at R = 2: ps-master --replication=2 and 2 durable
# pods loaded with ROWS rows (ps-bench populates them and keeps pushing while the checkpoint
# is taken). The checkpoint keeps each vshard's primary's copy only (master/checkpoints.h),
# so after a restore every follower is refilled from its primary by re-replication. The
# whole cluster is stopped and started on the checkpoint's copies. Prints the checkpoint's
# time, then the restore: rows and MB copied by the follower copies, their time (sum over
# copies), rows/s and MB/s, and the wall time from the pods' start until every vshard had
# two copies again.
#
#   benchmarks/checkpoint_restore.sh [ROWS=200000] [DIM=32] [VSHARDS=64]
# Uses build/bin (or $PS_BUILD_DIR/bin). Loopback only; stops exactly what it started.
set -uo pipefail
cd "$(dirname "$0")/.."
ROWS="${1:-200000}"
DIM="${2:-32}"
. benchmarks/cluster_lib.sh
cluster_init checkpoint-restore "${3:-64}"
CKPT="$DIR/checkpoints"

status() { "$BIN/ps-admin" --master="$MASTER" --json status >"$DIR/status.json"; }
start_master --lease_ms=3000 --replication=2 --checkpoint_dir="$CKPT"
start_pod 0 --checkpoint_root="$CKPT"
start_pod 1 --checkpoint_root="$CKPT"
start_push_load "$ROWS" "$DIM" 60
t0=$(date +%s.%N)
"$BIN/ps-admin" --master="$MASTER" checkpoint || exit 1
t1=$(date +%s.%N)
echo "checkpoint under load: $(/usr/bin/python3 -c "print(f'{$t1 - $t0:.2f}')") s"

# Everything stopped; the cluster started again on the checkpoint's copies.
for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
PIDS=()
rm -f "$DIR"/*.port
CK="$CKPT/ckpt-1"
start_master --lease_ms=3000 --replication=2 --data_dir="$CK/master"
t2=$(date +%s.%N)
start_pod 0 --data_dir="$CK/ps-0"
start_pod 1 --data_dir="$CK/ps-1"
for _ in $(seq 1 1200); do
  status
  /usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
sys.exit(0 if int(s["replication"]["under_replicated_vshards"]) == 0 else 1)' \
    "$DIR/status.json" && break
  sleep 0.1
done
t3=$(date +%s.%N)
/usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
moves = [m for m in s.get("moves", []) if m.get("follower") and m.get("state") == "COMMITTED"]
rows = sum(int(m.get("rows", 0)) for m in moves)
mb = sum(int(m.get("bytes", 0)) for m in moves) / 1e6
secs = sum(float(m.get("copy_seconds", 0)) for m in moves)
vs = sum(len(m.get("vshards", [])) for m in moves)
print(f"restore: {len(moves)} follower copies, {vs} vshards, {rows} rows, {mb:.1f} MB in "
      f"{secs:.2f} s of copies ({rows / max(secs, 1e-9):.0f} rows/s, "
      f"{mb / max(secs, 1e-9):.1f} MB/s); {float(sys.argv[2]):.2f} s wall from the pods'"'"' "
      f"start to two copies of every vshard")' "$DIR/status.json" \
  "$(/usr/bin/python3 -c "print($t3 - $t2)")"
