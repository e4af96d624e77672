#!/usr/bin/env bash
# Re-replication copy rate: ps-master --replication=2 and 2 durable pods loaded with ROWS
# rows (ps-bench populates them, then keeps pushing through the master throughout). ps-1
# is SIGKILLed for good: ps-0 takes over its vshards and no vshard has a second copy. A
# new pod ps-2 registers; the master fills it as ps-0's follower (follower copies: the
# vshard-move copy from ps-0 while it serves, then its stream). Prints the rows and MB
# copied, the time the copies took (sum over copies, and wall from ps-2's start until every
# vshard had two copies), rows/s and MB/s, and the fence per copy (median, max).
#
#   benchmarks/rereplication.sh [ROWS=200000] [DIM=32] [VSHARDS=64]
# Uses build/bin (or $PS_BUILD_DIR/bin). Loopback only; stops exactly what it started.
set -uo pipefail
cd "$(dirname "$0")/.."
ROWS="${1:-200000}"
DIM="${2:-32}"
. benchmarks/cluster_lib.sh
cluster_init rereplication "${3:-64}"

start_master --lease_ms=1000 --replication=2
start_pod 0
start_pod 1
# Load: ps-bench creates every row, then pushes for the rest of the run.
start_push_load "$ROWS" "$DIM" 60

# ps-1 is gone for good; wait until ps-0 leads everything.
kill -KILL "${POD_PID[1]}"
for _ in $(seq 1 100); do
  grep -q "FAILOVER" "$DIR/master.log" && break
  sleep 0.1
done
t0=$(date +%s.%N)
start_pod 2
status() { "$BIN/ps-admin" --master="$MASTER" --json status >"$DIR/status.json"; }
copied() {
  /usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
print(sum(len(m.get("vshards", [])) for m in s.get("moves", [])
          if m.get("follower") and m.get("state") == "COMMITTED"))' "$DIR/status.json"
}
for _ in $(seq 1 1200); do
  status
  [[ "$(copied)" -ge "$VSHARDS" ]] && break
  sleep 0.1
done
t1=$(date +%s.%N)
kill -KILL "$BENCH" 2>/dev/null || true
/usr/bin/python3 -c '
import json, statistics, sys
s = json.load(open(sys.argv[1]))
moves = [m for m in s.get("moves", []) if m.get("follower") and m.get("state") == "COMMITTED"]
rows = sum(int(m.get("rows", 0)) for m in moves)
mb = sum(int(m.get("bytes", 0)) for m in moves) / 1e6
secs = sum(float(m.get("copy_seconds", 0)) for m in moves)
fences = sorted(float(m.get("fence_ms", 0)) for m in moves)
vs = sum(len(m.get("vshards", [])) for m in moves)
print(f"re-replication onto ps-2: {len(moves)} copies, {vs} vshards, {rows} rows, {mb:.1f} MB "
      f"in {secs:.2f} s of copies ({rows / max(secs, 1e-9):.0f} rows/s, "
      f"{mb / max(secs, 1e-9):.1f} MB/s); {float(sys.argv[2]):.2f} s wall from the new pod'"'"'s "
      f"start to two copies of every vshard; fence median {statistics.median(fences):.1f} ms, "
      f"max {fences[-1]:.1f} ms")
' "$DIR/status.json" "$(echo "$t1 - $t0" | bc)"
