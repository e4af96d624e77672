#!/usr/bin/env bash
# A/B helper: one gRPC run of ps-bench against a fresh ps-server from BINDIR, printing
# rows/s and the CPU time each process spent per batch (user+system, from /proc and
# time(1)), which is steadier than rows/s on a shared machine. Alternate old and new
# binary directories, run each a few times, and compare within a round:
#
#   for i in 1 2 3; do benchmarks/ab.sh /tmp/old/bin pull; benchmarks/ab.sh build/bin pull; done
#   benchmarks/ab.sh BINDIR push --optimizer=adagrad      # extra args go to ps-bench
#
# Env: SECS (timed seconds, default 5), SERVER_ARGS (extra ps-server flags). A 0.5 s run with --populate precedes the timed
# run (--populate=false), so row creation is not timed. The server is stopped by pid.
set -euo pipefail
BIN=$1
OP=$2
shift 2
PORT_FILE=$(mktemp)
rm -f "$PORT_FILE"
# shellcheck disable=SC2086
"$BIN/ps-server" --port=0 --port_file="$PORT_FILE" ${SERVER_ARGS:-} >/dev/null 2>&1 &
SPID=$!
trap 'kill $SPID 2>/dev/null; wait $SPID 2>/dev/null; rm -f "$PORT_FILE"' EXIT
for _ in $(seq 1 100); do [ -s "$PORT_FILE" ] && break; sleep 0.1; done
COMMON=(--target=grpc --servers=127.0.0.1:"$(cat "$PORT_FILE")" --op="$OP" --dim=64
  --batch=1024 --rows=1000000 --inflight=8 --optimizer=adagrad)
"$BIN/ps-bench" "${COMMON[@]}" --seconds=0.5 --populate "$@" >/dev/null
cpu() { awk '{print $14 + $15}' "/proc/$SPID/stat"; }
S0=$(cpu)
OUT=$({ /usr/bin/time -f "TIME %U %S" "$BIN/ps-bench" "${COMMON[@]}" --seconds="${SECS:-5}" \
  --populate=false "$@"; } 2>&1)
S1=$(cpu)
TICKS=$(getconf CLK_TCK)
echo "$OUT" | python3 -c '
import json, sys
s0, s1, ticks, name = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
lines = sys.stdin.read().splitlines()
j = json.loads([l for l in lines if l.startswith("{")][-1])
u, s = [float(x) for x in [l for l in lines if l.startswith("TIME")][-1].split()[1:]]
batches = j["rows_per_s"] * j["seconds"] / j["batch"]
print("%-5s %-24s %10.0f rows/s  p50 %6.0f us  CPU per batch: pod %5.0f us, client %5.0f us"
      % (j["op"], name, j["rows_per_s"], j["p50_us"], (s1 - s0) / ticks / batches * 1e6,
         (u + s) / batches * 1e6))
' "$S0" "$S1" "$TICKS" "$BIN"
