#!/usr/bin/env bash
# Incremental export figures: one durable pod stores ROWS rows (benchmarks/fill_rows.py),
# then ROUNDS times: a full export (which prints a cursor), pushes to PCT% of the rows
# (distinct random ids), and a delta export since that cursor (ps-transfer export
# --since). Prints each export's wall time (ps-transfer from start to exit), rows and
# bytes on disk, then the medians.
#
#   benchmarks/delta_export.sh [ROWS=1000000] [DIM=32] [PCT=1] [ROUNDS=3]
# Uses build/bin (or $PS_BUILD_DIR/bin) and /usr/bin/python3 with the SDK. Loopback only;
# stops exactly what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${PS_BUILD_DIR:-build}"
BIN="$BUILD/bin"
ROWS="${1:-1000000}"
DIM="${2:-32}"
PCT="${3:-1}"
ROUNDS="${4:-3}"
DIR="$(mktemp -d /tmp/ps-delta-export.XXXXXX)"
PID=""
cleanup() {
  [[ -n "$PID" ]] && { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }
  [[ -n "${KEEP:-}" ]] || rm -rf "$DIR"
}
trap cleanup EXIT

"$BIN/ps-server" --host=127.0.0.1 --port=0 --port_file="$DIR/pod.port" --data_dir="$DIR/pod" \
  --durability=process --export_root="$DIR" >"$DIR/pod.log" 2>&1 &
PID=$!
for _ in $(seq 1 200); do [[ -s "$DIR/pod.port" ]] && break; sleep 0.05; done
SERVER="127.0.0.1:$(cat "$DIR/pod.port")"
export PYTHONPATH="client/python:$BUILD/python"
/usr/bin/python3 benchmarks/fill_rows.py --server="$SERVER" --rows="$ROWS" --dim="$DIM"

# Pushes one gradient to PCT% of [0, ROWS), distinct ids, seed $1.
touch_rows() {
  /usr/bin/python3 - "$SERVER" "$ROWS" "$DIM" "$PCT" "$1" <<'PY'
import sys
import numpy as np
from elastic_ps import PsClient
server, rows, dim, pct, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
ids = np.random.default_rng(seed).choice(rows, size=int(rows * pct / 100), replace=False).astype(np.int64)
with PsClient(servers=[server], deadline_s=60.0) as ps:
    for at in range(0, len(ids), 16384):
        chunk = ids[at:at + 16384]
        ps.push(f"bench_d{dim}_adagrad", chunk, np.full((len(chunk), dim), 0.01, np.float32))
print(f"pushed to {len(ids)} rows", file=sys.stderr)
PY
}

# Runs one export into $1 (extra flags after it); prints "seconds rows bytes cursor".
export_once() {
  local out="$1"; shift
  local t0 t1 line
  t0=$(date +%s.%N)
  line=$("$BIN/ps-transfer" --servers="$SERVER" --dir="$out" "$@" export | tail -1)
  t1=$(date +%s.%N)
  local rows cursor bytes
  rows=$(sed -E 's/.*"rows":([0-9]+).*/\1/' <<<"$line")
  cursor=$(sed -E 's/.*"cursor":"([^"]*)".*/\1/' <<<"$line")
  bytes=$(du -sb "$out" | cut -f1)
  echo "$(echo "$t1 - $t0" | bc) $rows $bytes $cursor"
}

FULL=(); DELTA=()
for r in $(seq 1 "$ROUNDS"); do
  read -r fs frows fbytes cursor < <(export_once "$DIR/full-$r")
  touch_rows "$r"
  read -r ds drows dbytes _ < <(export_once "$DIR/delta-$r" --since="$cursor")
  printf 'round %d: full %.2f s, %d rows, %.1f MB; delta %.3f s, %d rows, %.2f MB\n' \
    "$r" "$fs" "$frows" "$(echo "$fbytes / 1000000" | bc -l)" "$ds" "$drows" \
    "$(echo "$dbytes / 1000000" | bc -l)"
  FULL+=("$fs $fbytes"); DELTA+=("$ds $dbytes")
  rm -rf "$DIR/full-$r" "$DIR/delta-$r"
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
fmed=$(printf '%s\n' "${FULL[@]}" | cut -d' ' -f1 | median)
dmed=$(printf '%s\n' "${DELTA[@]}" | cut -d' ' -f1 | median)
fb=$(printf '%s\n' "${FULL[@]}" | cut -d' ' -f2 | median)
db=$(printf '%s\n' "${DELTA[@]}" | cut -d' ' -f2 | median)
printf 'median: full %.2f s, %.1f MB; delta (%s%% changed) %.3f s, %.2f MB: %.1fx faster, %.1fx fewer bytes\n' \
  "$fmed" "$(echo "$fb / 1000000" | bc -l)" "$PCT" "$dmed" "$(echo "$db / 1000000" | bc -l)" \
  "$(echo "$fmed / $dmed" | bc -l)" "$(echo "$fb / $db" | bc -l)"
