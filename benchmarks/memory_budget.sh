#!/usr/bin/env bash
# A durable pod with and without --memory_budget_mb on a Zipf workload: push, then pull,
# over gRPC (ps-bench), and the pod's resident memory (VmRSS) at the end. Starts its own
# ps-server per run on loopback (data in a temporary dir) and stops it by pid.
#
#   benchmarks/memory_budget.sh [--rows=N] [--seconds=S] [--budget_mb=M] [--dist=zipf:S]
#                               [--populate]
#
# Defaults: 1M rows, dim 64, Adagrad (552 bytes a row resident: 552 MB), budget 128 MB,
# zipf:1.1, batch 1024, 8 in flight, 5 s per op. --populate creates every row (by pulls)
# before the push run; the pod's memory then peaks at the whole table before the first
# eviction (RSS keeps that peak: freed row slots are reused, not returned).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${PS_BUILD_DIR:-build}/bin"
ROWS=1000000
SECS=5
BUDGET=128
DIST=zipf:1.1
POPULATE=--populate=false
for arg in "$@"; do
  case "$arg" in
    --rows=*) ROWS="${arg#--rows=}" ;;
    --seconds=*) SECS="${arg#--seconds=}" ;;
    --budget_mb=*) BUDGET="${arg#--budget_mb=}" ;;
    --dist=*) DIST="${arg#--dist=}" ;;
    --populate) POPULATE=--populate ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "memory_budget.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
source scripts/lib.sh
export PS_START_TIMEOUT_S=120

field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }

echo "| pod | op | rows/s | p50 ms | p99 ms | resident rows | row memory MB | pod RSS MB |"
echo "|---|---|---|---|---|---|---|---|"
n=0
for budget in 0 "$BUDGET"; do
  n=$((n + 1))
  ps_start_server "pod-$n" "$BIN/ps-server" --data_dir="$PS_RUN_DIR/data-$n" \
    --memory_budget_mb="$budget"
  pid="${PS_PIDS[-1]}"
  populate=$POPULATE
  for op in push pull; do
    out=$("$BIN/ps-bench" --target=grpc --servers="$PS_ADDR" --op="$op" --optimizer=adagrad \
      --dim=64 --batch=1024 --rows="$ROWS" --dist="$DIST" --inflight=8 --seconds="$SECS" \
      "$populate" --show_stats)
    stats=$(echo "$out" | sed -n 's/^pod 0: \([0-9]*\) rows, \([0-9.]*\) MB.*/\1 \2/p')
    out=$(echo "$out" | tail -1)
    populate=--populate=false
    rss=$(awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status")
    label=$([ "$budget" = 0 ] && echo "all in memory" || echo "budget ${budget} MB")
    printf '| %s | %s | %s | %.1f | %.1f | %s | %s | %s |\n' "$label" "$op" \
      "$(echo "$out" | field rows_per_s)" \
      "$(echo "$out" | field p50_us | awk '{print $1/1000}')" \
      "$(echo "$out" | field p99_us | awk '{print $1/1000}')" \
      "${stats%% *}" "${stats##* }" "$rss"
  done
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
done
