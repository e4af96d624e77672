#!/usr/bin/env bash
# scripts/local-cluster.sh end to end: start 2 pods, both register LIVE; a SIGKILLed pod is
# restarted with the same identity and address; stop leaves none of its processes behind.
# Run by ctest with PS_BUILD_DIR set to the build tree.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="$(mktemp -d /tmp/local_cluster_test.XXXXXX)"
LC="$ROOT/scripts/local-cluster.sh"
ADMIN="$PS_BUILD_DIR/bin/ps-admin"
cleanup() {
  "$LC" stop --dir="$DIR" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$DIR"/*.log; do echo "---- $f" >&2; tail -20 "$f" >&2; done
  exit 1
}

# live_pods: the number of LIVE pods the master reports.
live_pods() {
  local json
  json="$("$ADMIN" --master="$MASTER" --json status)" || return 0
  grep -o '"state":"LIVE"' <<<"$json" | wc -l
}

await_live() {
  for _ in $(seq 1 100); do
    [ "$(live_pods)" = 2 ] && return 0
    sleep 0.1
  done
  fail "expected 2 LIVE pods: $("$ADMIN" --master="$MASTER" status)"
}

out="$("$LC" start --ps=2 --dir="$DIR" --num_vshards=16 --lease_ms=500)"
MASTER="$(echo "$out" | sed -n 's/^master=//p')"
[ -n "$MASTER" ] || fail "no master= line in: $out"
await_live

read -r old_pid _ <"$DIR/ps-0.pid"
old_port="$(cat "$DIR/ps-0.port")"
kill -KILL "$old_pid"
new_pid="$old_pid"
for _ in $(seq 1 100); do
  # The supervisor rewrites the pid file: a read may race with it.
  read -r new_pid _ <"$DIR/ps-0.pid" 2>/dev/null || true
  [ -n "$new_pid" ] && [ "$new_pid" != "$old_pid" ] && break
  sleep 0.1
done
[ -n "$new_pid" ] && [ "$new_pid" != "$old_pid" ] || fail "ps-0 was not restarted"
# The restarted pod writes its port file once it serves (the old one is removed first).
new_port=""
for _ in $(seq 1 100); do
  new_port="$(cat "$DIR/ps-0.port" 2>/dev/null || true)"
  [ -n "$new_port" ] && break
  sleep 0.1
done
await_live
[ "$new_port" = "$old_port" ] || fail "ps-0 came back on another port ('$new_port')"
status="$("$LC" status --dir="$DIR")"
grep -q "^ps-0: running" <<<"$status" || fail "status does not show ps-0: $status"

pids=()
for f in "$DIR"/*.pid; do read -r p _ <"$f"; pids+=("$p"); done
stopped="$("$LC" stop --dir="$DIR")"
grep -q "stopped 3 processes" <<<"$stopped" || fail "stop said: $stopped"
# Exited processes may linger as zombies until init reaps them: those count as stopped.
running() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ]
}
for p in "${pids[@]}"; do
  if running "$p"; then fail "pid $p still running after stop"; fi
done
if "$LC" status --dir="$DIR" >/dev/null; then fail "status says running after stop"; fi
echo PASS
