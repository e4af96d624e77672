#!/usr/bin/env bash
# The main job, locally: installs what is missing, builds, starts a PS cluster of two
# durable ps-server pods on loopback (static map: --shard=0/2 and 1/2, each with its own
# --data_dir), runs a pull/push workload against it through the C++ client, kills one pod
# with SIGKILL and restarts it on its data dir (it recovers its rows), prints what
# happened, and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh >/dev/null
BIN="${PS_BUILD_DIR:-build}/bin"
source scripts/lib.sh

NUM_PS=2
ADDRS=()
start_pod() {
  ps_start_server "ps-$1" "$BIN/ps-server" --shard="$1/$NUM_PS" --num_vshards=256 --threads=2 \
    --data_dir="$PS_RUN_DIR/data/ps-$1" --durability=process
  ADDRS[$1]="$PS_ADDR"
  SERVERS="$(IFS=,; echo "${ADDRS[*]}")"
}
for i in $(seq 0 $((NUM_PS - 1))); do start_pod "$i"; done
echo "== started $NUM_PS durable ps-server pods: $SERVERS (data in $PS_RUN_DIR/data)"

run() {
  echo "== ps-bench $*"
  "$BIN/ps-bench" --target=grpc --servers="$SERVERS" --rows=200000 --dim=64 --batch=1024 \
    --inflight=8 --seconds=4 "$@" | grep -v '^{'
}
run --op=push --optimizer=adagrad
run --op=pull --optimizer=adagrad
run --op=mixed --optimizer=adagrad --dist=zipf:1.1 --show_stats

echo "== SIGKILL ps-0 and restart it on its data dir"
kill -9 "${PS_PIDS[0]}"
wait "${PS_PIDS[0]}" 2>/dev/null || true
rm -f "$PS_RUN_DIR/ps-0.port"
start_pod 0
grep -h "recovered" "$PS_RUN_DIR/ps-0.log" | sed 's/^.*\] /   /' || true
run --op=pull --optimizer=adagrad --show_stats
echo "== stopping the pods"
