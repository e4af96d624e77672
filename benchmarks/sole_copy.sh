#!/usr/bin/env bash
# The cost of acknowledging a sole copy's pushes only once the log is fsynced (issue 16:
# --durability=periodic, a vshard whose ack set is empty; docs/architecture.md,
# "Replication"). On loopback, each run on a fresh cluster: ps-master --replication=2 and
# two durable pods with --durability=periodic (--flush_ms 100), lease 1 s.
#
#   benchmarks/sole_copy.sh [ROUNDS=3] [SECONDS=10]
#     push rows/s and the pods' push latency in two states, alternated ROUNDS times (the
#     machine is shared and noisy): "replicated" (both pods live: every vshard has a
#     follower; nothing waits for an fsync) and "sole" (ps-1 SIGKILLed, its lease run out:
#     ps-0 leads every vshard with an empty ack set, and re-replication waits for a second
#     live pod). ps-bench --target=grpc through the master, push of 1024 ids x dim DIM
#     (64) over ROWS (200000) rows, Adagrad, 8 in flight x 2 threads, rows created first
#     (in the replicated state).
#     OLD=DIR (another build's bin directory, e.g. a build of main) runs each round with
#     both builds in turn, so the sole state's cost shows against a build that acknowledges
#     at once.
#
# Uses build/bin (or $PS_BUILD_DIR). Loopback only; stops exactly the processes it started,
# by pid. KEEP=1 keeps the logs.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
SECONDS_PER_RUN="${2:-10}"
NEW_BIN="${PS_BUILD_DIR:-build}/bin"
DIM="${DIM:-64}"
ROWS="${ROWS:-200000}"
source benchmarks/cluster_lib.sh
cluster_init sole-copy 64
rmdir "$DIR"

median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}'; }

# run_state BUILD_BIN STATE: one cluster; prints "rate p50_ms" of the timed push run.
run_state() {
  local bin="$1" state="$2"
  BIN="$bin"
  DIR="$(mktemp -d /tmp/ps-sole-copy-run.XXXXXX)"
  start_master --replication=2 --lease_ms=1000
  for i in 0 1; do start_pod "$i" --durability=periodic --flush_ms=100; done
  for _ in $(seq 1 200); do
    [[ $("$BIN/ps-admin" --master="$MASTER" shards 2>/dev/null | grep -c " LIVE ") == 2 ]] && break
    sleep 0.1
  done
  # Rows first (both copies get them), so that the timed run only updates.
  "$BIN/ps-bench" --target=grpc --master="$MASTER" --op=push --optimizer=adagrad --dim="$DIM" \
    --batch=1024 --rows="$ROWS" --inflight=8 --threads=2 --seconds=1 >"$DIR/warm.log" 2>&1
  if [[ $state == sole ]]; then
    kill -KILL "${POD_PID[1]}"
    # The lease runs out (1 s) and ps-0 is promoted for every vshard, with no follower.
    for _ in $(seq 1 100); do
      grep -q "FAILOVER" "$DIR/master.log" && break
      sleep 0.1
    done
    sleep 0.5
  fi
  local out
  out=$("$BIN/ps-bench" --target=grpc --master="$MASTER" --op=push --optimizer=adagrad \
    --dim="$DIM" --batch=1024 --rows="$ROWS" --inflight=8 --threads=2 --populate=false \
    --seconds="$SECONDS_PER_RUN" 2>&1 | grep "rows/s" | tail -1)
  echo "$out" >"$DIR/bench.txt"
  local rate
  rate=$(echo "$out" | sed -n 's/.*: \([0-9]*\) rows\/s.*/\1/p')
  echo "${rate:-0} $out"
  cluster_cleanup
  PIDS=()
}

builds=(new)
[[ -n "${OLD:-}" ]] && builds=(old new)
OUT="$(mktemp -d /tmp/ps-sole-copy-figures.XXXXXX)"
echo "push rows/s at R=2, --durability=periodic, replicated vs sole copy (builds: ${builds[*]}), $ROUNDS rounds of $SECONDS_PER_RUN s (load $(cut -d' ' -f1-3 /proc/loadavg))"
for round in $(seq 1 "$ROUNDS"); do
  for b in "${builds[@]}"; do
    bin="$NEW_BIN"
    [[ $b == old ]] && bin="$OLD"
    for state in replicated sole; do
      line=$(run_state "$bin" "$state")
      echo "  round $round $b $state: $line (load $(cut -d' ' -f1 /proc/loadavg))"
      echo "${line%% *}" >>"$OUT/$b-$state"
    done
  done
done
for b in "${builds[@]}"; do
  echo "$b: median replicated $(median <"$OUT/$b-replicated") rows/s; sole copy $(median <"$OUT/$b-sole") rows/s"
done
rm -rf "$OUT"
