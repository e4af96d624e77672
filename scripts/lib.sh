# Shell helpers shared by the scripts that start processes (demo, compare). Source it.
# Every process started with ps_spawn is stopped, by pid, when the calling script exits.

PS_PIDS=()
PS_RUN_DIR="$(mktemp -d /tmp/ps-run.XXXXXX)"

ps_cleanup() {
  for pid in "${PS_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$PS_RUN_DIR"
}
trap ps_cleanup EXIT

# ps_spawn NAME CMD ARGS...: runs CMD in the background, stderr and stdout to
# $PS_RUN_DIR/NAME.log, and remembers its pid.
ps_spawn() {
  local name="$1"
  shift
  "$@" >"$PS_RUN_DIR/$name.log" 2>&1 &
  PS_PIDS+=($!)
}

# ps_start_server NAME BIN ARGS...: starts a ps-server on a free loopback port and sets
# PS_ADDR to host:port once it serves (fails with the server's log if it does not within
# ${PS_START_TIMEOUT_S:-10} s; a durable pod recovers before it opens its port). Do not call it in $(...): the pid would be recorded in a subshell and not stopped.
ps_start_server() {
  local name="$1" bin="$2"
  shift 2
  ps_spawn "$name" "$bin" --host=127.0.0.1 --port=0 --port_file="$PS_RUN_DIR/$name.port" "$@"
  for _ in $(seq 1 $((${PS_START_TIMEOUT_S:-10} * 10))); do
    if [ -s "$PS_RUN_DIR/$name.port" ]; then
      PS_ADDR="127.0.0.1:$(cat "$PS_RUN_DIR/$name.port")"
      return 0
    fi
    sleep 0.1
  done
  echo "$name did not start:" >&2
  cat "$PS_RUN_DIR/$name.log" >&2
  return 1
}
