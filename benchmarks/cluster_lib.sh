# Sourced by the benchmark scripts that run a local cluster (migration.sh,
# rereplication.sh): ps-master and durable ps-server pods on loopback under one run
# directory, a ps-bench push load through the master, and on exit exactly the processes
# started stopped (and the directory removed unless KEEP is set).
#
#   cluster_init NAME VSHARDS          BIN (build/bin or $PS_BUILD_DIR/bin), DIR, the trap
#   start_master [FLAG...]             MASTER=127.0.0.1:PORT (--num_ps=2, lease 3 s unless
#                                      FLAGs say otherwise: later flags win)
#   start_pod I [FLAG...]              pod ps-I, durable (process); its pid in POD_PID[I]
#   start_push_load ROWS DIM SECONDS   BENCH: ps-bench pushing (adagrad, batch 256);
#                                      returns once its rows exist, plus a second
BIN=""
DIR=""
VSHARDS=""
MASTER=""
BENCH=""
PIDS=()
declare -A POD_PID

cluster_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -n "${KEEP:-}" || -z "$DIR" ]] || rm -rf "$DIR"
}

cluster_init() {
  BIN="${PS_BUILD_DIR:-build}/bin"
  VSHARDS="$2"
  DIR="$(mktemp -d "/tmp/ps-$1.XXXXXX")"
  trap cluster_cleanup EXIT
}

# Prints the port written to port file $1 (waits up to 10 s; exits the script if none).
wait_port() {
  for _ in $(seq 1 200); do
    [[ -s "$1" ]] && { cat "$1"; return; }
    sleep 0.05
  done
  echo "no port file $1" >&2
  exit 1
}

start_master() {
  "$BIN/ps-master" --data_dir="$DIR/master" --num_ps=2 --num_vshards="$VSHARDS" \
    --host=127.0.0.1 --port=0 --port_file="$DIR/master.port" --lease_ms=3000 "$@" \
    >"$DIR/master.log" 2>&1 &
  PIDS+=($!)
  MASTER="127.0.0.1:$(wait_port "$DIR/master.port")"
}

start_pod() {
  local i="$1"
  shift
  "$BIN/ps-server" --master="$MASTER" --pod_id="ps-$i" --num_vshards="$VSHARDS" \
    --data_dir="$DIR/ps-$i" --durability=process --host=127.0.0.1 --port=0 \
    --port_file="$DIR/ps-$i.port" "$@" >"$DIR/ps-$i.log" 2>&1 &
  POD_PID[$i]=$!
  PIDS+=($!)
  wait_port "$DIR/ps-$i.port" >/dev/null
}

start_push_load() {
  "$BIN/ps-bench" --target=grpc --master="$MASTER" --num_vshards="$VSHARDS" --op=push \
    --rows="$1" --dim="$2" --batch=256 --threads=1 --inflight=2 --optimizer=adagrad \
    --seconds="$3" >"$DIR/bench.log" 2>&1 &
  BENCH=$!
  PIDS+=($BENCH)
  # ps-bench logs when it starts timing, once every row exists.
  for _ in $(seq 1 600); do
    grep -qi "timed\|running\|populated" "$DIR/bench.log" 2>/dev/null && break
    sleep 0.1
  done
  sleep 1
}
