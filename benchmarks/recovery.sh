#!/usr/bin/env bash
# Time from kill -9 to serving for a durable pod holding N stored rows, eager start
# against --lazy_start (the same database copied). Starts its own ps-server on loopback
# (data in a temporary dir) and stops it by pid.
#
#   benchmarks/recovery.sh [--rows=N] [--push_seconds=S] [--idle_seconds=I] [--modes=eager,lazy]
#
# Defaults: 2M rows, dim 64, Adagrad. Every row is stored first (benchmarks/fill_rows.py
# pushes each id once; a clean stop materializes them), then the pod restarts, loads its
# rows, and takes uniform pushes (batch 4096) for S = 20 s; the kill comes right after the
# pushes (the log holds what materialization has not caught up with) or after
# --idle_seconds without pushes (the log is nearly empty).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${PS_BUILD_DIR:-build}/bin"
ROWS=2000000
PUSH_SECS=20
IDLE_SECS=0
MODES="eager,lazy"
for arg in "$@"; do
  case "$arg" in
    --rows=*) ROWS="${arg#--rows=}" ;;
    --push_seconds=*) PUSH_SECS="${arg#--push_seconds=}" ;;
    --idle_seconds=*) IDLE_SECS="${arg#--idle_seconds=}" ;;
    --modes=*) MODES="${arg#--modes=}" ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "recovery.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
source scripts/lib.sh
export PS_START_TIMEOUT_S=900
PY_PATH="client/python:${PS_BUILD_DIR:-build}/python"

ps_start_server fill "$BIN/ps-server" --data_dir="$PS_RUN_DIR/db"
PYTHONPATH="$PY_PATH" /usr/bin/python3 benchmarks/fill_rows.py --server="$PS_ADDR" --rows="$ROWS"
kill -TERM "${PS_PIDS[-1]}"; wait "${PS_PIDS[-1]}" 2>/dev/null || true  # materializes every row
ps_start_server push "$BIN/ps-server" --data_dir="$PS_RUN_DIR/db" --lazy_start
# Pushes at full speed only once every row is in memory again.
for _ in $(seq 1 900); do
  grep -q -E 'loaded .* in the background in|lazy start skipped' "$PS_RUN_DIR/push.log" && break
  sleep 1
done
"$BIN/ps-bench" --target=grpc --servers="$PS_ADDR" --op=push --optimizer=adagrad --dim=64 \
  --batch=4096 --rows="$ROWS" --inflight=8 --seconds="$PUSH_SECS" --populate=false | tail -1
sleep "$IDLE_SECS"
kill -9 "${PS_PIDS[-1]}"; wait "${PS_PIDS[-1]}" 2>/dev/null || true
echo "data dir: $(du -sh "$PS_RUN_DIR/db" | cut -f1), push log $(du -sh "$PS_RUN_DIR/db/pushlog" 2>/dev/null | cut -f1)"
modes=(${MODES//,/ })
for ((i = 1; i < ${#modes[@]}; i++)); do cp -r "$PS_RUN_DIR/db" "$PS_RUN_DIR/db-${modes[$i]}"; done

echo "| start | kill -9 to serving s | recovery log line |"
echo "|---|---|---|"
for ((i = 0; i < ${#modes[@]}; i++)); do
  mode="${modes[$i]}"
  dir="$PS_RUN_DIR/db"; args=()
  [ "$i" -gt 0 ] && dir="$PS_RUN_DIR/db-$mode"
  [ "$mode" = lazy ] && args=(--lazy_start)
  # An eager start of a big table, also where the pod would start lazily by itself.
  help=$("$BIN/ps-server" --help 2>&1 || true)
  if [ "$mode" = eager ] && [[ "$help" == *lazy_start_rows* ]]; then
    args=(--lazy_start_rows=0)
  fi
  start=$(date +%s.%N)
  ps_start_server "$mode" "$BIN/ps-server" --data_dir="$dir" "${args[@]}"
  end=$(date +%s.%N)
  line=$(grep -o 'recovered .*' "$PS_RUN_DIR/$mode.log" | head -1 | sed "s|$PS_RUN_DIR/||")
  printf '| %s | %.1f | %s |\n' "$mode" "$(echo "$end - $start" | bc)" "$line"
  # Right away (a lazy start is still loading): a sample of rows, compared at the end.
  pulled=$(PYTHONPATH="$PY_PATH" /usr/bin/python3 benchmarks/pull_rows.py --server="$PS_ADDR" \
    --rows="$ROWS" --out="$PS_RUN_DIR/pull-$mode.npy")
  echo "  $mode: $pulled"
  if [ "$mode" = lazy ]; then
    for _ in $(seq 1 900); do
      grep -q -E 'loaded .* in the background in|lazy start skipped' "$PS_RUN_DIR/$mode.log" && break
      sleep 1
    done
    echo
    grep -o -E '(applied the recovered log|loaded) .* in the background in .*' "$PS_RUN_DIR/$mode.log" || true
  fi
  kill -TERM "${PS_PIDS[-1]}"; wait "${PS_PIDS[-1]}" 2>/dev/null || true
  [ "$i" -gt 0 ] && rm -rf "$dir"
done
if [ "${#modes[@]}" -gt 1 ]; then
  /usr/bin/python3 benchmarks/pull_rows.py --compare "$PS_RUN_DIR/pull-${modes[0]}.npy" \
    "$PS_RUN_DIR/pull-${modes[1]}.npy"
fi
