#!/usr/bin/env bash
# The main job, locally: installs what is missing, builds, starts a PS cluster of two
# ps-server pods on loopback (static map: --shard=0/2 and 1/2), runs a pull/push workload
# against it through the C++ client, prints what happened, and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh >/dev/null
BIN="${PS_BUILD_DIR:-build}/bin"
RUN_DIR="$(mktemp -d /tmp/ps-demo.XXXXXX)"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$RUN_DIR"
}
trap cleanup EXIT

NUM_PS=2
SERVERS=""
for i in $(seq 0 $((NUM_PS - 1))); do
  "$BIN/ps-server" --host=127.0.0.1 --port=0 --port_file="$RUN_DIR/ps-$i.port" \
    --shard="$i/$NUM_PS" --num_vshards=256 --threads=2 2>"$RUN_DIR/ps-$i.log" &
  PIDS+=($!)
done
for i in $(seq 0 $((NUM_PS - 1))); do
  for _ in $(seq 1 100); do [ -s "$RUN_DIR/ps-$i.port" ] && break; sleep 0.1; done
  [ -s "$RUN_DIR/ps-$i.port" ] || { echo "ps-$i did not start:"; cat "$RUN_DIR/ps-$i.log"; exit 1; }
  SERVERS="${SERVERS:+$SERVERS,}127.0.0.1:$(cat "$RUN_DIR/ps-$i.port")"
done
echo "== started $NUM_PS ps-server pods: $SERVERS"

run() {
  echo "== ps-bench $*"
  "$BIN/ps-bench" --target=grpc --servers="$SERVERS" --rows=200000 --dim=64 --batch=1024 \
    --inflight=8 --seconds=4 "$@" | grep -v '^{'
}
run --op=push --optimizer=adagrad
run --op=pull --optimizer=adagrad
run --op=mixed --optimizer=adagrad --dist=zipf:1.1 --show_stats
echo "== stopping the pods"
