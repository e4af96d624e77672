#!/usr/bin/env bash
# The main job, locally: installs what is missing, builds, generates Criteo-format data from
# a hidden model, starts a local cluster (ps-master + two durable ps-server pods, supervised
# by scripts/local-cluster.sh like a StatefulSet), and trains a DeepFM for one epoch with two
# Python workers (asynchronous PS updates), showing progress. While it trains: one worker is
# SIGKILLed and another joins; one PS pod is SIGKILLed and restarted on its data dir. Ends
# with the held-out AUC, the same model trained in one process with torch.nn.EmbeddingBag,
# `ps-admin status`, and as the last line:
#   RESULT auc_ps=<f> auc_baseline=<f> records_trained=<n> records_in_epoch=<n>
#          tasks_failed=<n> seconds=<f>
# (seconds: wall time of the whole demo, install and build included). Stops everything it
# started. Sizes: DEMO_RECORDS (default 400000, ~125 MB), DEMO_HOLDOUT (40000),
# DEMO_RECORDS_PER_TASK (10000). DEMO_FAULTS=0 skips the kills (to measure throughput).
# DEMO_MANIFEST=M.json trains on your own Criteo-format data instead of generated data
# (M.json written by `python3 -m elastic_ps.manifest --out M.json --holdout H FILE...`).
# The workers run train_worker.py's defaults (pipelined: --staleness 1, --prefetch 1,
# --dense_every 1); DEMO_WORKER_ARGS adds flags to them.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
T0="$(date +%s.%N)"

scripts/install_deps.sh
echo "== building (scripts/build.sh)"
scripts/build.sh >/dev/null
BUILD="${PS_BUILD_DIR:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
BIN="$BUILD/bin"
PY=/usr/bin/python3
export PYTHONPATH="$ROOT/client/python:$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
export PS_BUILD_DIR="$BUILD"
EX="$ROOT/client/python/examples"

RECORDS="${DEMO_RECORDS:-400000}"
HOLDOUT="${DEMO_HOLDOUT:-40000}"
PER_TASK="${DEMO_RECORDS_PER_TASK:-10000}"
FAULTS="${DEMO_FAULTS:-1}"
JOB=deepfm-demo
RUN="$(mktemp -d /tmp/ps-demo.XXXXXX)"
CLUSTER="$RUN/cluster"
WORKER_PIDS=()
declare -A WPID  # worker name -> pid
MONITOR_PID=""

cleanup() {
  set +e
  [ -n "$MONITOR_PID" ] && kill "$MONITOR_PID" 2>/dev/null
  for pid in "${WORKER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${WORKER_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  [ -d "$CLUSTER" ] && scripts/local-cluster.sh stop --dir="$CLUSTER" >/dev/null 2>&1
  rm -rf "$RUN"
}
trap cleanup EXIT

elapsed() { $PY -c "import time; print(f'{time.time() - $T0:.1f}')"; }

if [ -n "${DEMO_MANIFEST:-}" ]; then
  # Your own data: a manifest of elastic_ps.manifest (docs/training.md), with --holdout.
  MANIFEST="$(cd "$(dirname "$DEMO_MANIFEST")" && pwd)/$(basename "$DEMO_MANIFEST")"
  echo "== data: $MANIFEST"
else
  echo "== generating data: $RECORDS training records in 4 files + $HOLDOUT held out"
  $PY -m elastic_ps.synth --out "$RUN/data" --records "$RECORDS" --files 4 --seed 1 \
    --holdout "$HOLDOUT"
  MANIFEST="$RUN/data/manifest.json"
fi

echo "== starting the cluster: ps-master + 2 durable ps-server pods (scripts/local-cluster.sh)"
# A short worker lease, so that a SIGKILLed worker's task is handed out again quickly.
scripts/local-cluster.sh start --ps=2 --dir="$CLUSTER" --lease_ms=3000 | tee "$RUN/cluster.out"
MASTER="$(sed -n 's/^master=//p' "$RUN/cluster.out")"

# start_worker NAME: a training worker in the background (it creates the job, idempotently).
start_worker() {
  # shellcheck disable=SC2086  # DEMO_WORKER_ARGS is a list of flags
  $PY "$EX/train_worker.py" --master="$MASTER" --job="$JOB" --manifest="$MANIFEST" \
    --records_per_task="$PER_TASK" --epochs=1 --eval_dir="$RUN/eval" --name="$1" \
    --trace="$RUN/trace.jsonl" --log_every_s=5 ${DEMO_WORKER_ARGS:-} >"$RUN/$1.log" 2>&1 &
  WORKER_PIDS+=($!)
  WPID[$1]=$!
  echo "   started $1 (pid $!)"
}

echo "== training one epoch with two workers (DeepFM, async PS updates, server-side Adagrad)"
start_worker worker-a
start_worker worker-b
$PY "$EX/monitor.py" --master="$MASTER" --job="$JOB" --logs="$RUN/worker-*.log" \
  --state="$RUN/state" --every_s=2 --until_done --timeout_s=900 &
MONITOR_PID=$!

RECORDS_DONE=0 RECORDS_TOTAL=0 TASKS_FAILED=0
killed_worker=0 killed_pod=0
[ "$FAULTS" = 1 ] || killed_worker=1 killed_pod=1
while kill -0 "$MONITOR_PID" 2>/dev/null; do
  sleep 1
  # shellcheck disable=SC1091
  [ -s "$RUN/state" ] && source "$RUN/state"
  [ "$RECORDS_TOTAL" -gt 0 ] || continue
  if [ "$killed_worker" = 0 ] && [ $((RECORDS_DONE * 4)) -ge "$RECORDS_TOTAL" ]; then
    killed_worker=1
    echo "== elasticity: SIGKILL worker-a (pid ${WPID[worker-a]}); its task returns to the queue" \
      "when its lease expires; worker-c joins"
    { kill -KILL "${WPID[worker-a]}" && wait "${WPID[worker-a]}"; } 2>/dev/null || true
    start_worker worker-c
  fi
  if [ "$killed_pod" = 0 ] && [ $((RECORDS_DONE * 2)) -ge "$RECORDS_TOTAL" ]; then
    killed_pod=1
    read -r pod_pid _ <"$CLUSTER/ps-1.pid"
    echo "== elasticity: SIGKILL PS pod ps-1 (pid $pod_pid); the supervisor restarts it on the" \
      "same port and data dir, clients retry"
    kill -KILL "$pod_pid"
  fi
done
wait "$MONITOR_PID" && rc=0 || rc=$?
MONITOR_PID=""
[ "$rc" = 0 ] || [ "$rc" = 3 ] || { echo "demo: the job did not finish (monitor exit $rc)"; exit 1; }
# shellcheck disable=SC1091
source "$RUN/state"
for pid in "${WORKER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
WORKER_PIDS=()

echo "== what happened"
grep -h "died; restarting" "$CLUSTER/supervisor.log" | sed 's/^/   supervisor: /' || true
if [ "$FAULTS" = 1 ]; then
  grep -h "recovered" "$CLUSTER/ps-1.log" | tail -1 | sed 's/^.*\] /   ps-1 after its restart: /' || true
fi
for w in worker-a worker-b worker-c; do
  [ -f "$RUN/$w.log" ] || continue
  echo "   $w: $(grep -c 'train task .* done' "$RUN/$w.log" || true) training tasks," \
    "$(grep -c 'eval task .* done' "$RUN/$w.log" || true) eval tasks;" \
    "$(tail -1 "$RUN/$w.log")"
done
echo "   task reports accepted: $(grep -c '"kind": "train"' "$RUN/trace.jsonl") training," \
  "$(grep -c '"kind": "eval"' "$RUN/trace.jsonl") eval"

echo "== held-out AUC of the PS-trained model (from the workers' eval tasks)"
$PY "$EX/evaluate.py" --eval_dir="$RUN/eval" --json="$RUN/auc_ps.json"
echo "== baseline: the same DeepFM in one process with torch.nn.EmbeddingBag + torch Adagrad"
$PY "$EX/baseline.py" --manifest="$MANIFEST" --records_per_task="$PER_TASK" \
  --json="$RUN/auc_baseline.json"

echo "== ps-admin status"
"$BIN/ps-admin" --master="$MASTER" status
echo "== ps-admin tables (rows, admission, eviction per table)"
"$BIN/ps-admin" --master="$MASTER" tables

AUC_PS="$($PY -c "import json; print(f\"{json.load(open('$RUN/auc_ps.json'))['auc']:.4f}\")")"
AUC_BASE="$($PY -c "import json; print(f\"{json.load(open('$RUN/auc_baseline.json'))['auc']:.4f}\")")"
echo "RESULT auc_ps=$AUC_PS auc_baseline=$AUC_BASE records_trained=$RECORDS_DONE" \
  "records_in_epoch=$RECORDS_TOTAL tasks_failed=$TASKS_FAILED seconds=$(elapsed)"
