#!/usr/bin/env bash
# Where the time of a gRPC pull or push goes, layer by layer, measured back to back on
# this machine (the issue's workload: 64-dim rows, batch 1024, 8 calls in flight):
#   1. tcp      loopback TCP alone (benchmarks/tcp_ceiling.py)
#   2. grpc     gRPC alone: fixed responses, no PS work (build/bin/grpc-ceiling), with the
#               client on one completion-queue thread as PsClient is
#   3. engine   the embedding table in process, one thread (build/bin/embedding-microbench)
#   4. ps       ps-bench against a ps-server (benchmarks/ab.sh), with CPU per batch
# Each layer runs ROUNDS times (default 2). Usage:
#   benchmarks/floors.sh [pull|push|both]
set -euo pipefail
cd "$(dirname "$0")/.."
OPS=${1:-both}
ROUNDS=${ROUNDS:-2}
BIN=${PS_BUILD_DIR:-build}/bin
[ "$OPS" = both ] && OPS="pull push"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
  echo "--- round $r"
  benchmarks/tcp_ceiling.py 3
  for op in $OPS; do
    "$BIN/grpc-ceiling" --op="$op" --seconds=3 --client_cq_threads=1
    if [ "$op" = pull ]; then filter='BM_Pull/64$'; else filter='BM_Push/2$'; fi
    "$BIN/embedding-microbench" --benchmark_min_time=1 --benchmark_filter="$filter" 2>/dev/null |
      awk '/^BM_/ {match($0, /items_per_second=[^ ]*/);
                   print "engine " $1 ": " $4 " " $5 " CPU per 1024 rows, " substr($0, RSTART, RLENGTH)}'
    SECS=3 benchmarks/ab.sh "$BIN" "$op"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
