#!/usr/bin/env bash
# Training throughput: a Python worker (client/python/examples/train_worker.py, DeepFM on
# Criteo-format data, rows and dense parameters on the PS, server-side Adagrad) against
# the same model trained in one local process (examples/baseline.py), on the same files
# and minibatches.
#
#   benchmarks/train_throughput.sh [--mode=pinned|two] [--records=N] [--holdout=N]
#       [--manifest=M.json] [--runs=R] [--per_task=N] [--seed=S] [--data_dir=DIR]
#       [--worker_args='--staleness=1 ...'] [--python_dir=DIR] [--keep]
#
# --mode=pinned (default): master + 2 durable pods (scripts/local-cluster.sh) pinned to
#   core 1 (taskset -c 1), one worker pinned to core 0, then baseline.py pinned to core 0.
# --mode=two: the cluster and two workers unpinned, against baseline.py unpinned.
# Data: --manifest (elastic_ps.manifest / elastic_ps.synth format), else elastic_ps.synth
#   writes --records (default 600000) + --holdout (60000) records, seed --seed (1), into
#   --data_dir (default: a temporary directory; an existing manifest there is reused).
# Each of --runs (default 1) runs the worker (a fresh cluster and job: 1 epoch, tasks of
# --per_task records, eval tasks on the held-out file) and then the baseline; figures are
# medians over the runs. Printed: both records/s, their ratio, the held-out AUC of both
# and the gap (baseline - PS), and as the last line one JSON object:
#   {"ratio", "auc_gap", "worker_records_per_s", "baseline_records_per_s", ...}
# worker_records_per_s counts the training loops (pinned: reading and parsing each task's
# records excluded, as baseline.py's figure excludes its reading; two: the wall clock from
# the first training task to the last report), like baseline_records_per_s; the *_wall_*
# figures and wall_ratio include reading the data (the worker: the wall clock from its
# first training task to its last report; the baseline: its reading and id mapping plus
# its training loop). cpu_ratio compares records per CPU-second of the worker process (all
# its threads, the pods' CPU not counted) and of the baseline: a figure less moved by other
# load on a shared machine than the wall clock is. process_cpu_ratio: the same for the
# processes' whole CPU time (start-up, reading, eval included; /usr/bin/time), which
# older workers without --summary report too. --python_dir: the client/python tree whose train_worker.py runs (to
# compare training loops, e.g. an older one extracted with `git archive`; a worker without
# --summary is timed from its --step_trace: the sum of its steps, and first to last step). Needs build/bin (or $PS_BUILD_DIR/bin)
# and build/python; uses /usr/bin/python3. Stops what it starts, by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
MODE=pinned RECORDS=600000 HOLDOUT=60000 MANIFEST="" RUNS=1 PER_TASK=10000 SEED=1
DATA_DIR="" WORKER_ARGS="" KEEP=0 PYDIR="$ROOT/client/python"
for arg in "$@"; do
  case "$arg" in
    --mode=*) MODE="${arg#*=}" ;;
    --records=*) RECORDS="${arg#*=}" ;;
    --holdout=*) HOLDOUT="${arg#*=}" ;;
    --manifest=*) MANIFEST="${arg#*=}" ;;
    --runs=*) RUNS="${arg#*=}" ;;
    --per_task=*) PER_TASK="${arg#*=}" ;;
    --seed=*) SEED="${arg#*=}" ;;
    --data_dir=*) DATA_DIR="${arg#*=}" ;;
    --worker_args=*) WORKER_ARGS="${arg#*=}" ;;
    --python_dir=*) PYDIR="$(cd "${arg#*=}" && pwd)" ;;
    --keep) KEEP=1 ;;
    -h | --help) sed -n 2,27p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train_throughput.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
case "$MODE" in pinned | two) ;; *) echo "train_throughput.sh: --mode is pinned or two" >&2; exit 2 ;; esac
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || { echo "train_throughput.sh: --runs must be >= 1" >&2; exit 2; }
BUILD="${PS_BUILD_DIR:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
export PS_BUILD_DIR="$BUILD"
for b in ps-master ps-server; do
  [ -x "$BUILD/bin/$b" ] || { echo "train_throughput.sh: $BUILD/bin/$b missing: run scripts/build.sh" >&2; exit 1; }
done
PY=/usr/bin/python3
export PYTHONPATH="$ROOT/client/python:$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
EX="$ROOT/client/python/examples"
WORKER_PYTHONPATH="$PYDIR:$BUILD/python"
TIMING=(--summary)  # how the worker reports its figures
PYTHONPATH="$WORKER_PYTHONPATH" $PY "$PYDIR/examples/train_worker.py" --help | grep -q -- --summary \
  || TIMING=(--step_trace)
if [ "$MODE" = pinned ]; then
  [ "$(nproc)" -ge 2 ] || { echo "train_throughput.sh: --mode=pinned needs 2 cores" >&2; exit 1; }
  CORE0=(taskset -c 0) CORE1=(taskset -c 1)
else
  CORE0=() CORE1=()
fi

# The processes' CPU seconds (user + system) into a file, when GNU time is installed.
# timed FILE CMD...: runs CMD in this (sub)shell's process, so $! of `timed ... &` is its pid.
timed() {
  local out="$1"
  shift
  if [ -x /usr/bin/time ]; then exec /usr/bin/time -q -f "%U %S" -o "$out" "$@"; fi
  exec "$@"
}

# shellcheck disable=SC1091
source scripts/lib.sh  # PS_RUN_DIR, and ps_cleanup on exit
RUN="$PS_RUN_DIR"
CLUSTER=""
WORKERS=()
cleanup() {
  set +e
  # A worker's pid is its /usr/bin/time (when present): stop the python under it first.
  for pid in "${WORKERS[@]}"; do pkill -TERM -P "$pid" 2>/dev/null; kill -TERM "$pid" 2>/dev/null; done
  for pid in "${WORKERS[@]}"; do wait "$pid" 2>/dev/null; done
  [ -n "$CLUSTER" ] && scripts/local-cluster.sh stop --dir="$CLUSTER" >/dev/null 2>&1
  if [ "$KEEP" = 1 ]; then echo "kept $RUN" >&2; PS_RUN_DIR=/nonexistent; fi
  ps_cleanup
}
trap cleanup EXIT

if [ -z "$MANIFEST" ]; then
  DATA_DIR="${DATA_DIR:-$RUN/data}"
  MANIFEST="$DATA_DIR/manifest.json"
  if [ -s "$MANIFEST" ]; then
    echo "== reusing the data of $MANIFEST"
  else
    echo "== generating data: $RECORDS training records in 4 files + $HOLDOUT held out (seed $SEED)"
    $PY -m elastic_ps.synth --out "$DATA_DIR" --records "$RECORDS" --files 4 --seed "$SEED" \
      --holdout "$HOLDOUT"
  fi
fi
# One pass over the files first, so that both sides read them from the page cache and
# their line indexes exist.
$PY -c "import sys; from elastic_ps import criteo, manifest; m = manifest.load(sys.argv[1]);
[criteo.count_records(e['path']) for e in m['files'] + [m['holdout']]]" "$MANIFEST"

: >"$RUN/results.jsonl"
for run in $(seq 1 "$RUNS"); do
  CLUSTER="$RUN/cluster-$run"
  echo "== run $run/$RUNS: cluster (master + 2 durable pods)${CORE1[*]:+ on core 1}"
  "${CORE1[@]}" scripts/local-cluster.sh start --ps=2 --dir="$CLUSTER" >"$RUN/cluster-$run.out"
  MASTER="$(sed -n 's/^master=//p' "$RUN/cluster-$run.out")"
  nworkers=1
  [ "$MODE" = two ] && nworkers=2
  echo "== run $run/$RUNS: $nworkers worker(s)${CORE0[*]:+ on core 0} $WORKER_ARGS"
  WORKERS=()
  for w in $(seq 1 "$nworkers"); do
    # shellcheck disable=SC2086  # WORKER_ARGS is a list of flags
    timed "$RUN/worker-$run-$w.time" env PYTHONPATH="$WORKER_PYTHONPATH" "${CORE0[@]}" \
      $PY "$PYDIR/examples/train_worker.py" \
      --master="$MASTER" --job="bench-$run" --manifest="$MANIFEST" \
      --records_per_task="$PER_TASK" --epochs=1 --eval_dir="$RUN/eval-$run" \
      "${TIMING[0]}=$RUN/worker-$run-$w.json" --log_every_s=1000 --name="worker-$w" \
      $WORKER_ARGS >"$RUN/worker-$run-$w.log" 2>&1 &
    WORKERS+=($!)
  done
  for pid in "${WORKERS[@]}"; do
    wait "$pid" || { echo "a worker failed:" >&2; tail -20 "$RUN"/worker-"$run"-*.log >&2; exit 1; }
  done
  WORKERS=()
  $PY "$EX/evaluate.py" --eval_dir="$RUN/eval-$run" --json="$RUN/auc-$run.json" >/dev/null
  scripts/local-cluster.sh stop --dir="$CLUSTER" >/dev/null
  CLUSTER=""
  echo "== run $run/$RUNS: baseline (1 process)${CORE0[*]:+ on core 0}"
  (timed "$RUN/baseline-$run.time" "${CORE0[@]}" $PY "$EX/baseline.py" --manifest="$MANIFEST" \
    --records_per_task="$PER_TASK" --json="$RUN/baseline-$run.json") >"$RUN/baseline-$run.log" 2>&1 \
    || { cat "$RUN/baseline-$run.log" >&2; exit 1; }
  $PY - "$RUN" "$run" "$MODE" >>"$RUN/results.jsonl" <<'PY'
import glob, json, sys
run_dir, run, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def summary(path):
    """The worker's --summary, or its figures from a --step_trace (older workers)."""
    lines = [json.loads(l) for l in open(path) if l.strip()]
    if len(lines) == 1 and "records" in lines[0]:
        return lines[0]
    steps = [s for l in lines for s in l["steps"]]
    # The old loop's minibatches: each task's steps cover its records.
    log = open(path.replace(".json", ".log")).read()
    import re
    records = sum(int(n) for n in re.findall(r"train task \d+ done: .*?, (\d+) records", log))
    return {"records": records, "records_per_s": records / sum(e - b for b, e in steps),
            "first_time": min(b for b, _ in steps), "last_time": max(e for _, e in steps),
            "max_in_flight": 1, "staleness": "-", "prefetch": "-", "dense_every": "-",
            "batch": "-"}


def cpu_seconds(path):
    """User + system seconds from /usr/bin/time's file, or None."""
    try:
        return sum(float(x) for x in open(path).read().split()[-2:])
    except (OSError, ValueError):
        return None


def process_cpu_ratio(records, base_records):
    """Records per CPU-second of the worker processes over the baseline's (whole
    processes: start-up, reading, eval tasks included)."""
    workers = [cpu_seconds(f) for f in glob.glob(f"{run_dir}/worker-{run}-*.time")]
    base = cpu_seconds(f"{run_dir}/baseline-{run}.time")
    if not workers or None in workers or not base:
        return None
    return (records / sum(workers)) / (base_records / base)


ws = [summary(f) for f in sorted(glob.glob(f"{run_dir}/worker-{run}-*.json"))]
base = json.load(open(f"{run_dir}/baseline-{run}.json"))
auc = json.load(open(f"{run_dir}/auc-{run}.json"))["auc"]
records = sum(w["records"] for w in ws)
span = max(w["last_time"] for w in ws) - min(w["first_time"] for w in ws)
wall = records / span
loop = ws[0]["records_per_s"] if mode == "pinned" else wall
print(json.dumps({"run": int(run), "workers": len(ws), "records": records,
                  "worker_records_per_s": loop, "worker_wall_records_per_s": wall,
                  "baseline_records_per_s": base["records_per_s"],
                  "baseline_wall_records_per_s":
                      base["records"] / (base["seconds"] + base.get("prepare_seconds", 0)),
                  "worker_cpu_records_per_s": records / sum(w["train_cpu_seconds"] for w in ws)
                      if all(w.get("train_cpu_seconds") for w in ws) else None,
                  "baseline_cpu_records_per_s": base["records"] / base["cpu_seconds"],
                  "process_cpu_ratio": process_cpu_ratio(records, base["records"]),
                  "auc_ps": auc,
                  "auc_baseline": base["auc"],
                  "max_in_flight": max(w["max_in_flight"] for w in ws),
                  "settings": {k: ws[0][k] for k in ("staleness", "prefetch", "dense_every",
                                                      "batch")}}))
PY
  tail -1 "$RUN/results.jsonl" | $PY -c "import json, sys; r = json.load(sys.stdin); print(
    f\"   worker {r['worker_records_per_s']:.0f} records/s (wall {r['worker_wall_records_per_s']:.0f}),\"
    f\" baseline {r['baseline_records_per_s']:.0f} (wall {r['baseline_wall_records_per_s']:.0f}):\"
    f\" ratio {r['worker_records_per_s'] / r['baseline_records_per_s']:.3f};\"
    f\" AUC {r['auc_ps']:.4f} vs {r['auc_baseline']:.4f}\")"
done

$PY - "$RUN/results.jsonl" "$MODE" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = lambda k: statistics.median(r[k] for r in rows)
w, wall = med("worker_records_per_s"), med("worker_wall_records_per_s")
b, bwall = med("baseline_records_per_s"), med("baseline_wall_records_per_s")
gap = statistics.median(r["auc_baseline"] - r["auc_ps"] for r in rows)
s = rows[0]["settings"]
print(f"\nmode {sys.argv[2]}: {rows[0]['workers']} worker(s), {rows[0]['records']} records, "
      f"{len(rows)} run(s), medians; worker settings {s}")
print(f"worker   {w:9.0f} records/s (training loop; with reading the data {wall:.0f})")
print(f"baseline {b:9.0f} records/s (training loop; with reading the data {bwall:.0f})")
print(f"ratio    {w / b:9.3f}   (with reading the data {wall / bwall:.3f})")
cpu = [r["worker_cpu_records_per_s"] / r["baseline_cpu_records_per_s"] for r in rows
       if r["worker_cpu_records_per_s"]]
cpu_ratio = statistics.median(cpu) if cpu else None
pcpu = [r["process_cpu_ratio"] for r in rows if r.get("process_cpu_ratio")]
process_cpu_ratio = statistics.median(pcpu) if pcpu else None
if cpu_ratio:
    print(f"per CPU-second of the process (all its threads; the pods' CPU not counted): "
          f"ratio {cpu_ratio:.3f}")
if process_cpu_ratio:
    print(f"per CPU-second of the whole processes (start-up, reading, eval included): "
          f"ratio {process_cpu_ratio:.3f}")
print(f"AUC      PS {med('auc_ps'):.4f}  baseline {med('auc_baseline'):.4f}  gap {gap:+.4f}")
print(json.dumps({"ratio": round(w / b, 4), "auc_gap": round(gap, 5),
                  "worker_records_per_s": round(w), "baseline_records_per_s": round(b),
                  "worker_wall_records_per_s": round(wall),
                  "baseline_wall_records_per_s": round(bwall), "wall_ratio": round(wall / bwall, 4),
                  "cpu_ratio": round(cpu_ratio, 4) if cpu_ratio else None,
                  "process_cpu_ratio": round(process_cpu_ratio, 4) if process_cpu_ratio else None,
                  "auc_ps": round(med("auc_ps"), 5), "auc_baseline": round(med("auc_baseline"), 5),
                  "mode": sys.argv[2], "workers": rows[0]["workers"], "runs": len(rows),
                  "records": rows[0]["records"], "max_in_flight": max(r["max_in_flight"] for r in rows),
                  "settings": s, "per_run": [[round(r["worker_records_per_s"]),
                                              round(r["baseline_records_per_s"])] for r in rows],
                  "load_average": [round(x, 1) for x in __import__("os").getloadavg()]}))
PY
