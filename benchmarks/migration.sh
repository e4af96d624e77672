#!/usr/bin/env bash
# Live migration figures: ps-master + 2 durable pods loaded with ROWS rows (ps-bench
# populates them, then keeps pushing through the master during the moves), a third pod
# joins, `ps-admin rebalance` moves a third of the vshards onto it, `ps-admin drain ps-2`
# moves them back. Prints per operation the wall time, rows and MB moved, MB/s, and the
# fence per move (median, max): as the master measures it (from the fence request to both
# pods told of the commit) and as the source pod measures it (from its fence to learning
# of the commit: the time pushes to the vshards were refused).
#
#   benchmarks/migration.sh [ROWS=200000] [DIM=32] [VSHARDS=64]
# Uses build/bin (or $PS_BUILD_DIR/bin). Loopback only; stops exactly what it started.
set -uo pipefail
cd "$(dirname "$0")/.."
ROWS="${1:-200000}"
DIM="${2:-32}"
. benchmarks/cluster_lib.sh
cluster_init migration "${3:-64}"

start_master
start_pod 0
start_pod 1
# Load: ps-bench creates every row, then pushes for the rest of the run.
start_push_load "$ROWS" "$DIM" 30

start_pod 2
for _ in $(seq 1 100); do
  "$BIN/ps-admin" --master="$MASTER" shards | grep -q "ps-2 .*LIVE" && break
  sleep 0.1
done

report() {
  "$BIN/ps-admin" --master="$MASTER" --json status >"$DIR/status.json"
  /usr/bin/python3 -c '
import json, statistics, sys
s = json.load(sys.stdin)
moves = [m for m in s.get("moves", []) if m.get("state") == "COMMITTED" and int(m.get("move_id", 0)) > int(sys.argv[1])]
rows = sum(int(m.get("rows", 0)) for m in moves)
mb = sum(int(m.get("bytes", 0)) for m in moves) / 1e6
fences = sorted(float(m.get("fence_ms", 0)) for m in moves)
secs = sum(float(m.get("copy_seconds", 0)) for m in moves)
print(f"  {len(moves)} moves, {rows} rows, {mb:.1f} MB, {secs:.2f} s in moves "
      f"({mb / max(secs, 1e-9):.1f} MB/s); fence median {statistics.median(fences):.1f} ms, "
      f"max {fences[-1]:.1f} ms")
print(max(int(m.get("move_id", 0)) for m in moves), file=open(sys.argv[2], "w"))
' "$1" "$DIR/last" <"$DIR/status.json"
}

t0=$(date +%s.%N)
"$BIN/ps-admin" --master="$MASTER" rebalance
t1=$(date +%s.%N)
echo "rebalance 2 -> 3 pods: $(echo "$t1 - $t0" | bc) s wall"
report 0
last=$(cat "$DIR/last")
t0=$(date +%s.%N)
"$BIN/ps-admin" --master="$MASTER" drain ps-2
t1=$(date +%s.%N)
echo "drain ps-2 (3 -> 2 pods): $(echo "$t1 - $t0" | bc) s wall"
report "$last"
kill -KILL "$BENCH" 2>/dev/null || true
echo "fence as the source pods saw it (first push refused to the new owner told), ms:"
grep -ho "fenced for [0-9.]*" "$DIR"/ps-*.log | awk '{print $3}' | sort -n |
  awk '{a[NR]=$1} END {if (NR) printf "  %d moves: median %.1f, max %.1f\n", NR, a[int((NR+1)/2)], a[NR]}'

