#!/usr/bin/env bash
# The main job, locally: installs what is missing, builds, starts a PS cluster of two
# ps-server pods on loopback (static map: --shard=0/2 and 1/2), runs a pull/push workload
# against it through the C++ client, prints what happened, and stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh >/dev/null
BIN="${PS_BUILD_DIR:-build}/bin"
source scripts/lib.sh

NUM_PS=2
SERVERS=""
for i in $(seq 0 $((NUM_PS - 1))); do
  ps_start_server "ps-$i" "$BIN/ps-server" --shard="$i/$NUM_PS" --num_vshards=256 --threads=2
  SERVERS="${SERVERS:+$SERVERS,}$PS_ADDR"
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
