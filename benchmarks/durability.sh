#!/usr/bin/env bash
# Push throughput of a durable pod in each --durability mode against the in-memory pod,
# then recovery time after kill -9. Starts its own ps-server per run on loopback (data in a
# temporary dir) and stops it by pid.
#
#   benchmarks/durability.sh [--rows=N] [--seconds=S] [--modes=memory,process,periodic,machine]
#                            [--recovery_rows=N] [--recovery_seconds=S]
#
# Defaults: the compare.sh workload (1M rows, dim 64, batch 1024, 8 in flight, Adagrad,
# uniform ids), 8 s per mode; recovery: uniform pushes over 1M rows for 15 s (batch 4096),
# SIGKILL, restart on the same dir, time until the port is open again.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${PS_BUILD_DIR:-build}/bin"
ROWS=1000000
SECS=8
MODES="memory,process,periodic,machine"
REC_ROWS=1000000
REC_SECS=15
for arg in "$@"; do
  case "$arg" in
    --rows=*) ROWS="${arg#--rows=}" ;;
    --seconds=*) SECS="${arg#--seconds=}" ;;
    --modes=*) MODES="${arg#--modes=}" ;;
    --recovery_rows=*) REC_ROWS="${arg#--recovery_rows=}" ;;
    --recovery_seconds=*) REC_SECS="${arg#--recovery_seconds=}" ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) echo "durability.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
source scripts/lib.sh
export PS_START_TIMEOUT_S=120

field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }

echo "| pod | push rows/s | p50 ms | p99 ms |"
echo "|---|---|---|---|"
n=0
for mode in ${MODES//,/ }; do
  n=$((n + 1))
  args=()
  [ "$mode" = memory ] || args=(--data_dir="$PS_RUN_DIR/data-$n" --durability="$mode")
  ps_start_server "pod-$n" "$BIN/ps-server" "${args[@]}"
  out=$("$BIN/ps-bench" --target=grpc --servers="$PS_ADDR" --op=push --optimizer=adagrad \
    --dim=64 --batch=1024 --rows="$ROWS" --inflight=8 --seconds="$SECS" --populate | tail -1)
  kill -TERM "${PS_PIDS[-1]}"; wait "${PS_PIDS[-1]}" 2>/dev/null || true
  printf '| %s | %s | %.1f | %.1f |\n' "$mode" "$(echo "$out" | field rows_per_s)" \
    "$(echo "$out" | field p50_us | awk '{print $1/1000}')" \
    "$(echo "$out" | field p99_us | awk '{print $1/1000}')"
done

# Recovery: pushes, SIGKILL, restart on the same dir.
ps_start_server rec "$BIN/ps-server" --data_dir="$PS_RUN_DIR/rec" --durability=process
"$BIN/ps-bench" --target=grpc --servers="$PS_ADDR" --op=push --optimizer=adagrad --dim=64 \
  --batch=4096 --rows="$REC_ROWS" --inflight=8 --seconds="$REC_SECS" --populate=false >/dev/null
kill -9 "${PS_PIDS[-1]}"; wait "${PS_PIDS[-1]}" 2>/dev/null || true
rm -f "$PS_RUN_DIR/rec.port"
start=$(date +%s.%N)
ps_start_server rec "$BIN/ps-server" --data_dir="$PS_RUN_DIR/rec" --durability=process
end=$(date +%s.%N)
echo
echo "recovery after kill -9 (${REC_ROWS} rows, ${REC_SECS} s of pushes):" \
  "$(echo "$end - $start" | bc) s to serving"
grep -h recovered "$PS_RUN_DIR/rec.log" | sed 's/^.*\] /  /'
