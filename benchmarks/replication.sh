#!/usr/bin/env bash
# Replication figures (issue 16), on loopback, each run on a fresh cluster (ps-master and two
# durable pods, --durability=process):
#
#   benchmarks/replication.sh throughput [ROUNDS=3] [SECONDS=10]
#     push rows/s with --replication=1 and --replication=2, alternated ROUNDS times (the
#     machine is shared and noisy): ps-bench --target=grpc through the master, push of 1024
#     ids x dim 64, Adagrad, 8 in flight, rows created first. Prints each run, the medians
#     and R=2 / R=1 (goal >= 0.6).
#     ACK=leader runs R=2 with --replication_ack=leader (the order lock and the follower's
#     work, without waiting for it).
#     OLD=DIR (another build's bin directory, e.g. a build of main) runs each round with
#     both builds in turn (old R=1, old R=2, new R=1, new R=2), and prints each build's
#     medians and ratio: on a shared machine only figures taken alternately compare.
#     DURABILITY=machine|periodic runs the pods in that mode (default process).
#   benchmarks/replication.sh failover [KILLS=5] [LEASE_MS=1000]
#     time from a primary's SIGKILL to pushes accepted again: --replication=2, a client
#     (Python SDK, benchmarks/push_probe.py) pushing 256-id batches in a loop, ps-0 killed;
#     the figure is from the kill to the end of the first push started after it that
#     succeeded (the client retries and follows the map), started once ps-0 was reaped.
#     Median and max over KILLS
#     clusters (goal <= 2 s with a 1 s lease).
#
# Uses build/bin and build/python (or $PS_BUILD_DIR). Loopback only; stops exactly the
# processes it started, by pid. KEEP=1 keeps the logs.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD="${PS_BUILD_DIR:-build}"
BIN="$BUILD/bin"
MODE="${1:-throughput}"
DIR="$(mktemp -d /tmp/ps-replication.XXXXXX)"
PIDS=()
VSHARDS=64
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap 'cleanup; [[ -n "${KEEP:-}" ]] && echo "logs in $DIR" || rm -rf "$DIR"' EXIT

wait_port() {
  for _ in $(seq 1 600); do
    [[ -s "$1" ]] && { cat "$1"; return; }
    sleep 0.05
  done
  echo "no port file $1" >&2
  exit 1
}

# start_cluster RUN R LEASE_MS [BIN]: master + ps-0, ps-1 under $DIR/RUN; sets MASTER and POD0.
start_cluster() {
  local run="$DIR/$1" r="$2" lease="$3" BIN="${4:-$BIN}"
  mkdir -p "$run"
  "$BIN/ps-master" --data_dir="$run/master" --num_ps=2 --num_vshards="$VSHARDS" \
    --replication="$r" --replication_ack="${ACK:-all}" --host=127.0.0.1 --port=0 --port_file="$run/master.port" \
    --lease_ms="$lease" >"$run/master.log" 2>&1 &
  PIDS+=($!)
  MASTER="127.0.0.1:$(wait_port "$run/master.port")"
  for i in 0 1; do
    "$BIN/ps-server" --master="$MASTER" --pod_id="ps-$i" --num_vshards="$VSHARDS" \
      --data_dir="$run/ps-$i" --durability="${DURABILITY:-process}" --host=127.0.0.1 --port=0 \
      --port_file="$run/ps-$i.port" >"$run/ps-$i.log" 2>&1 &
    PIDS+=($!)
    [[ $i == 0 ]] && POD0=$!
    wait_port "$run/ps-$i.port" >/dev/null
  done
  # Both pods registered (and, with R=2, each following the other).
  for _ in $(seq 1 200); do
    [[ $("$BIN/ps-admin" --master="$MASTER" shards 2>/dev/null | grep -c " LIVE ") == 2 ]] && return
    sleep 0.1
  done
  echo "cluster $1 did not come up" >&2
  exit 1
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}'; }

throughput() {
  local rounds="${1:-3}" seconds="${2:-10}"
  local builds=(new)
  [[ -n "${OLD:-}" ]] && builds=(old new)
  for b in "${builds[@]}"; do : >"$DIR/$b-r1" && : >"$DIR/$b-r2"; done
  echo "push rows/s, R=1 and R=2 alternated (builds: ${builds[*]}), $rounds rounds of $seconds s (load $(cut -d' ' -f1-3 /proc/loadavg))"
  for round in $(seq 1 "$rounds"); do
    for b in "${builds[@]}"; do
      local bin="$BIN"
      [[ $b == old ]] && bin="$OLD"
      for r in 1 2; do
        start_cluster "t$round-$b-r$r" "$r" 10000 "$bin"
        local out
        out=$("$bin/ps-bench" --target=grpc --master="$MASTER" --op=push --optimizer=adagrad \
          --dim=64 --batch=1024 --rows=200000 --inflight=8 --threads=2 --seconds="$seconds" 2>&1 |
          grep "rows/s" | tail -1)
        local rate
        rate=$(echo "$out" | sed -n 's/.*: \([0-9]*\) rows\/s.*/\1/p')
        echo "  round $round $b R=$r: ${rate:-FAILED} rows/s  ($out; load $(cut -d' ' -f1 /proc/loadavg))"
        [[ -n "$rate" ]] && echo "$rate" >>"$DIR/$b-r$r"
        cleanup
      done
    done
  done
  for b in "${builds[@]}"; do
    local m1 m2
    m1=$(median <"$DIR/$b-r1")
    m2=$(median <"$DIR/$b-r2")
    echo "$b: median R=1: $m1 rows/s; R=2: $m2 rows/s; R=2/R=1 = $(echo "scale=3; $m2 / $m1" | bc)"
  done
}

failover() {
  local kills="${1:-5}" lease="${2:-1000}"
  : >"$DIR/gaps"
  echo "failover: $kills clusters, lease $lease ms (load $(cut -d' ' -f1-3 /proc/loadavg))"
  for k in $(seq 1 "$kills"); do
    start_cluster "f$k" 2 "$lease"
    local run="$DIR/f$k"
    PYTHONPATH="client/python:$BUILD/python" /usr/bin/python3 benchmarks/push_probe.py \
      --master="$MASTER" --out="$run/probe.txt" >"$run/probe.log" 2>&1 &
    local probe=$!
    PIDS+=($probe)
    for _ in $(seq 1 300); do
      [[ -f "$run/probe.txt" && $(wc -l <"$run/probe.txt") -ge 20 ]] && break
      sleep 0.1
    done
    # From the SIGKILL to the end of the first push started once ps-0 was reaped (a push
    # started between the signal and the death may still be answered by the dying pod).
    local t_kill t_dead
    t_kill=$(date +%s.%N)
    kill -KILL "$POD0"
    wait "$POD0" 2>/dev/null
    t_dead=$(date +%s.%N)
    sleep $((lease * 5 / 1000 + 3))
    kill "$probe" 2>/dev/null
    wait "$probe" 2>/dev/null
    local gap
    gap=$(awk -v t="$t_kill" -v d="$t_dead" '$1 > d {printf "%.0f\n", ($2 - t) * 1000; exit}' \
      "$run/probe.txt")
    echo "  kill $k: pushes accepted again after ${gap:-NEVER} ms ($(grep -c FAILOVER "$run/master.log") failover logged)"
    [[ -n "$gap" ]] && echo "$gap" >>"$DIR/gaps"
    cleanup
  done
  echo "from SIGKILL to pushes accepted: median $(median <"$DIR/gaps") ms, max $(sort -g "$DIR/gaps" | tail -1) ms over $(wc -l <"$DIR/gaps") kills"
}

case "$MODE" in
  throughput) throughput "${2:-3}" "${3:-10}" ;;
  failover) failover "${2:-5}" "${3:-1000}" ;;
  *) echo "usage: $0 throughput [ROUNDS] [SECONDS] | failover [KILLS] [LEASE_MS]" >&2; exit 2 ;;
esac
