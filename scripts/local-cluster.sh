#!/usr/bin/env bash
# A local cluster, the embedded default: ps-master and N ps-server pods as local processes
# with their own data dirs under DIR, supervised like a StatefulSet controller would (a pod
# or the master that dies is restarted with the same identity, port and data dir).
#
#   scripts/local-cluster.sh start --ps=N --dir=DIR [--num_vshards=V] [--lease_ms=MS]
#                                  [--tokens] [--workers=K --worker_cmd='CMD ARGS']
#   scripts/local-cluster.sh status --dir=DIR
#   scripts/local-cluster.sh stop --dir=DIR
#
# start prints `master=HOST:PORT` once the master and every pod serve. Workers (optional)
# run CMD K times with PS_MASTER=HOST:PORT and PS_WORKER_INDEX=i in the environment; they
# are not restarted (a lost worker's task goes back to the master's queue). Checkpoints
# (ps-admin checkpoint) go to DIR/checkpoints, exports (ps-transfer export) under
# DIR/exports. --tokens: the two credentials of the production overlay, made at the first
# start in DIR/worker.token and DIR/admin.token (mode 600): the master and the pods get
# both, workers only the worker token (PS_AUTH_TOKEN_FILE); ps-admin and ps-transfer need
# --admin_token_file=DIR/admin.token.
# Binaries come from build/bin, or $PS_BUILD_DIR/bin when PS_BUILD_DIR is set. Every process
# is recorded in DIR/*.pid with its start time; stop signals exactly those processes (a
# reused pid does not match), never by name.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SELF="$ROOT/scripts/local-cluster.sh"

usage() {
  sed -n '2,21p' "$SELF" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "local-cluster: $*" >&2
  exit 1
}

CMD="${1:-}"
[ -n "$CMD" ] || usage
shift
# The cluster's names and flags, shared with the Kubernetes manifests (one source of
# truth): NUM_VSHARDS, LEASE_MS, DURABILITY, MATERIALIZE_MS, PS_THREADS, MASTER_THREADS,
# *_SHUTDOWN_GRACE_MS, PS_POD_PREFIX. Ports are not taken from it: local processes share
# one host, so each binds port 0 and reports it through a port file.
# shellcheck disable=SC1091
source "$ROOT/docker/k8s/base/cluster.env"
NUM_PS="" DIR="" WORKERS=0 WORKER_CMD="" TOKENS=0
for arg in "$@"; do
  case "$arg" in
    --ps=*) NUM_PS="${arg#*=}" ;;
    --dir=*) DIR="${arg#*=}" ;;
    --num_vshards=*) NUM_VSHARDS="${arg#*=}" ;;
    --lease_ms=*) LEASE_MS="${arg#*=}" ;;
    --workers=*) WORKERS="${arg#*=}" ;;
    --worker_cmd=*) WORKER_CMD="${arg#*=}" ;;
    --tokens) TOKENS=1 ;;
    -h | --help) usage ;;
    *) echo "local-cluster: unknown argument $arg" >&2; usage ;;
  esac
done
[ -n "$DIR" ] || { echo "local-cluster: --dir=DIR is required" >&2; usage; }
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"

# proc_start PID: the process's start time (field 22 of /proc/PID/stat), empty for a zombie
# or a missing process. With the pid it identifies a process for good: a reused pid differs.
proc_start() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  # shellcheck disable=SC2086
  set -- $stat
  [ "$1" != Z ] || return 1
  echo "${20}"
}

# record NAME PID: writes DIR/NAME.pid as "PID STARTTIME".
record() { echo "$2 $(proc_start "$2")" >"$DIR/$1.pid"; }

# pid_alive NAME: true if DIR/NAME.pid names a live process that is the one we started.
pid_alive() {
  local f="$DIR/$1.pid" pid start now
  [ -s "$f" ] || return 1
  read -r pid start <"$f" || return 1
  now="$(proc_start "$pid")" || return 1
  [ -n "$start" ] && [ "$now" = "$start" ]
}

# wait_port NAME SECONDS: waits for DIR/NAME.port to hold a port while NAME runs.
wait_port() {
  local name="$1" tries=$(($2 * 20))
  for _ in $(seq 1 "$tries"); do
    if [ -s "$DIR/$name.port" ] && grep -qE '^[0-9]+$' "$DIR/$name.port"; then return 0; fi
    pid_alive "$name" || return 1
    sleep 0.05
  done
  return 1
}

# ---- the supervisor (runs in the background, started by `start`) ----

# server_tokens: the token flags of the master and the pods (both credentials, as the
# production overlay mounts them), none without --tokens.
server_tokens() {
  # shellcheck disable=SC2153  # TOKENS comes from cluster.conf
  [ "$TOKENS" = 1 ] || return 0
  echo "--auth_token_file=$DIR/worker.token"
  echo "--admin_token_file=$DIR/admin.token"
}

start_master() {
  local port="$1" tokens
  mapfile -t tokens < <(server_tokens)
  rm -f "$DIR/master.port"
  # The flags of docker/k8s/base/master.yaml, with local ports and directories.
  "$BIN/ps-master" --host=127.0.0.1 --port="$port" --port_file="$DIR/master.port" \
    --metrics_port=0 --metrics_port_file="$DIR/master.metrics_port" \
    --data_dir="$DIR/master" --num_ps="$NUM_PS" --num_vshards="$NUM_VSHARDS" \
    --lease_ms="$LEASE_MS" --threads="$MASTER_THREADS" --replication="$REPLICATION" \
    --replication_ack="$REPLICATION_ACK" --replication_max_lag_ms="$REPLICATION_MAX_LAG_MS" \
    --checkpoint_dir="$DIR/checkpoints" "${tokens[@]}" \
    --shutdown_grace_ms="$MASTER_SHUTDOWN_GRACE_MS" >>"$DIR/master.log" 2>&1 &
  record master $!
}

start_pod() {
  local i="$1" port="$2" extra=()
  # shellcheck disable=SC2153  # POD_DATA_DIR comes from cluster.conf
  [ "$POD_DATA_DIR" = 1 ] && extra+=(--data_dir="$DIR/ps-$i" --durability="$DURABILITY"
    --materialize_ms="$MATERIALIZE_MS")
  # The roots of cluster.env's PS_CHECKPOINT_ROOT and PS_EXPORT_ROOT, here: one host, one
  # directory for the master's checkpoint_dir and every pod's copies.
  extra+=(--checkpoint_root="$DIR/checkpoints" --export_root="$DIR/exports")
  mapfile -t -O "${#extra[@]}" extra < <(server_tokens)
  rm -f "$DIR/ps-$i.port"
  # The flags of docker/k8s/base/ps.yaml, with local ports and directories.
  "$BIN/ps-server" --host=127.0.0.1 --port="$port" --port_file="$DIR/ps-$i.port" \
    --metrics_port=0 --metrics_port_file="$DIR/ps-$i.metrics_port" \
    --master="$MASTER" --pod_id="$PS_POD_PREFIX-$i" --num_vshards="$NUM_VSHARDS" \
    --threads="$PS_THREADS" --shutdown_grace_ms="$PS_SHUTDOWN_GRACE_MS" "${extra[@]}" \
    >>"$DIR/ps-$i.log" 2>&1 &
  record "ps-$i" $!
}

supervise() {
  # shellcheck disable=SC1091
  source "$DIR/cluster.conf"
  trap 'exit 0' TERM INT
  start_master 0
  wait_port master 20 || { echo "master did not start"; exit 1; }
  local master_port
  master_port="$(cat "$DIR/master.port")"
  MASTER="127.0.0.1:$master_port"
  declare -A pod_port
  for i in $(seq 0 $((NUM_PS - 1))); do start_pod "$i" 0; done
  for i in $(seq 0 $((NUM_PS - 1))); do
    wait_port "ps-$i" 20 || { echo "ps-$i did not start"; exit 1; }
    pod_port[$i]="$(cat "$DIR/ps-$i.port")"
  done
  # Workers get the worker token only (as in the production overlay).
  local worker_env=()
  [ "$TOKENS" = 1 ] && worker_env=("PS_AUTH_TOKEN_FILE=$DIR/worker.token")
  for i in $(seq 0 $((WORKERS - 1))); do
    env "${worker_env[@]}" PS_MASTER="$MASTER" PS_WORKER_INDEX="$i" sh -c "exec $WORKER_CMD" \
      >>"$DIR/worker-$i.log" 2>&1 &
    record "worker-$i" $!
  done
  echo "$MASTER" >"$DIR/master.address"
  echo "$(date '+%F %T') cluster up: master $MASTER, $NUM_PS pods"
  # Like a StatefulSet controller: restart what died, same identity, port and data dir.
  while true; do
    sleep 0.5
    if ! pid_alive master; then
      echo "$(date '+%F %T') master died; restarting on port $master_port"
      start_master "$master_port"
    fi
    for i in $(seq 0 $((NUM_PS - 1))); do
      if ! pid_alive "ps-$i"; then
        echo "$(date '+%F %T') ps-$i died; restarting on port ${pod_port[$i]}"
        start_pod "$i" "${pod_port[$i]}"
      fi
    done
  done
}

# ---- commands ----

stop_pid() {  # stop_pid NAME: SIGTERM, up to 10 s, then SIGKILL
  local name="$1" pid
  pid_alive "$name" || { rm -f "$DIR/$name.pid"; return 0; }
  read -r pid _ <"$DIR/$name.pid"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 200); do
    pid_alive "$name" || break
    sleep 0.05
  done
  if pid_alive "$name"; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$DIR/$name.pid"
}

cmd_start() {
  [[ "$NUM_PS" =~ ^[1-9][0-9]*$ ]] || { echo "local-cluster: --ps=N (N >= 1) is required" >&2; usage; }
  [[ "$WORKERS" =~ ^[0-9]+$ ]] || usage
  if [ "$WORKERS" -gt 0 ] && [ -z "$WORKER_CMD" ]; then
    die "--workers=$WORKERS needs --worker_cmd='CMD ARGS' (there is no worker binary yet)"
  fi
  pid_alive supervisor && die "a cluster is already running in $DIR (stop it first)"
  local build="${PS_BUILD_DIR:-build}"
  [[ "$build" = /* ]] || build="$ROOT/$build"
  local bin="$build/bin"
  for b in ps-master ps-server; do
    [ -x "$bin/$b" ] || die "$bin/$b not found: build first (scripts/build.sh)"
  done
  # Pods get their own data dir only if this ps-server has durable storage.
  local pod_data_dir=0
  # (The whole help is read: `grep -q` would end the pipe early, and pipefail would take
  # ps-server's SIGPIPE for a missing flag.)
  local help
  help="$("$bin/ps-server" --help 2>/dev/null || true)"
  [[ "$help" == *--data_dir* ]] && pod_data_dir=1
  rm -f "$DIR"/*.port "$DIR/master.address"
  if [ "$TOKENS" = 1 ]; then
    # Two different random tokens, readable by this user only; kept across restarts.
    local t
    for t in worker admin; do
      [ -s "$DIR/$t.token" ] && continue
      (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$DIR/$t.token")
    done
  fi
  {
    printf 'BIN=%q\nNUM_PS=%q\nNUM_VSHARDS=%q\nLEASE_MS=%q\n' "$bin" "$NUM_PS" "$NUM_VSHARDS" "$LEASE_MS"
    printf 'WORKERS=%q\nWORKER_CMD=%q\nPOD_DATA_DIR=%q\n' "$WORKERS" "$WORKER_CMD" "$pod_data_dir"
    printf 'TOKENS=%q\n' "$TOKENS"
  } >"$DIR/cluster.conf"
  nohup "$SELF" _supervise --dir="$DIR" >>"$DIR/supervisor.log" 2>&1 </dev/null &
  record supervisor $!
  for _ in $(seq 1 600); do
    if [ -s "$DIR/master.address" ]; then
      echo "master=$(cat "$DIR/master.address")"
      echo "dir=$DIR pods=$NUM_PS logs=$DIR/*.log"
      [ "$TOKENS" = 1 ] && echo "admin_token_file=$DIR/admin.token worker_token_file=$DIR/worker.token"
      return 0
    fi
    pid_alive supervisor || break
    sleep 0.05
  done
  echo "local-cluster: the cluster did not come up; supervisor log:" >&2
  tail -20 "$DIR/supervisor.log" >&2 || true
  cmd_stop >/dev/null
  exit 1
}

cmd_stop() {
  # The supervisor first, so that nothing is restarted; then the workers, pods, master.
  stop_pid supervisor
  local names=()
  for f in "$DIR"/worker-*.pid "$DIR"/ps-*.pid "$DIR"/master.pid; do
    [ -e "$f" ] && names+=("$(basename "$f" .pid)")
  done
  for name in "${names[@]}"; do stop_pid "$name"; done
  rm -f "$DIR/master.address"
  echo "stopped ${#names[@]} processes in $DIR"
}

cmd_status() {
  local running=0
  for f in "$DIR"/supervisor.pid "$DIR"/master.pid "$DIR"/ps-*.pid "$DIR"/worker-*.pid; do
    [ -e "$f" ] || continue
    local name
    name="$(basename "$f" .pid)"
    if pid_alive "$name"; then
      running=1
      local port=""
      [ -s "$DIR/$name.port" ] && port=" 127.0.0.1:$(cat "$DIR/$name.port")"
      [ -s "$DIR/$name.metrics_port" ] &&
        port+=", metrics http://127.0.0.1:$(cat "$DIR/$name.metrics_port")/metrics"
      echo "$name: running, pid $(cut -d' ' -f1 "$f")$port"
    else
      echo "$name: not running"
    fi
  done
  [ "$running" = 1 ] || { echo "no cluster running in $DIR"; return 1; }
  if [ -s "$DIR/master.address" ]; then
    # shellcheck disable=SC1091
    source "$DIR/cluster.conf"
    echo "master=$(cat "$DIR/master.address")"
    local token=()
    [ "${TOKENS:-0}" = 1 ] && token=(--admin_token_file="$DIR/admin.token")
    [ -x "$BIN/ps-admin" ] && echo &&
      "$BIN/ps-admin" --master="$(cat "$DIR/master.address")" "${token[@]}" status
  fi
  return 0
}

case "$CMD" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  _supervise) supervise ;;
  *) echo "local-cluster: unknown command $CMD" >&2; usage ;;
esac
