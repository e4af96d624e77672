#!/usr/bin/env bash
# Time from kill -9 to serving for a durable pod holding N stored rows, eager start
# against --lazy_start (the same database copied). Starts its own ps-server on loopback
# (data in a temporary dir) and stops it by pid.
#
#   benchmarks/recovery.sh [--rows=N] [--push_seconds=S] [--idle_seconds=I]
#
# Defaults: 2M rows, dim 64, Adagrad; uniform pushes (batch 4096) for 20 s store most rows;
# the kill comes right after the pushes (the log holds what materialization has not
# caught up with) or after --idle_seconds without pushes (the log is nearly empty).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${PS_BUILD_DIR:-build}/bin"
ROWS=2000000
PUSH_SECS=20
IDLE_SECS=0
for arg in "$@"; do
  case "$arg" in
    --rows=*) ROWS="${arg#--rows=}" ;;
    --push_seconds=*) PUSH_SECS="${arg#--push_seconds=}" ;;
    --idle_seconds=*) IDLE_SECS="${arg#--idle_seconds=}" ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "recovery.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
source scripts/lib.sh
export PS_START_TIMEOUT_S=600

ps_start_server fill "$BIN/ps-server" --data_dir="$PS_RUN_DIR/db"
"$BIN/ps-bench" --target=grpc --servers="$PS_ADDR" --op=push --optimizer=adagrad --dim=64 \
  --batch=4096 --rows="$ROWS" --inflight=8 --seconds="$PUSH_SECS" --populate=false >/dev/null
sleep "$IDLE_SECS"
kill -9 "${PS_PIDS[-1]}"; wait "${PS_PIDS[-1]}" 2>/dev/null || true
cp -r "$PS_RUN_DIR/db" "$PS_RUN_DIR/db-lazy"

echo "| start | kill -9 to serving s | recovery log line |"
echo "|---|---|---|"
for mode in eager lazy; do
  dir="$PS_RUN_DIR/db"; args=()
  [ "$mode" = lazy ] && { dir="$PS_RUN_DIR/db-lazy"; args=(--lazy_start); }
  start=$(date +%s.%N)
  ps_start_server "$mode" "$BIN/ps-server" --data_dir="$dir" "${args[@]}"
  end=$(date +%s.%N)
  line=$(grep -o 'recovered .*' "$PS_RUN_DIR/$mode.log" | head -1 | sed "s|$PS_RUN_DIR/||")
  printf '| %s | %.1f | %s |\n' "$mode" "$(echo "$end - $start" | bc)" "$line"
  if [ "$mode" = lazy ]; then
    for _ in $(seq 1 600); do
      grep -q 'in the background in' "$PS_RUN_DIR/$mode.log" && break
      sleep 1
    done
    echo
    grep -o 'loaded .* in the background in .*' "$PS_RUN_DIR/$mode.log" || true
  fi
  kill -TERM "${PS_PIDS[-1]}"; wait "${PS_PIDS[-1]}" 2>/dev/null || true
done
