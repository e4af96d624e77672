#!/usr/bin/env bash
# A/B helper for durable pods: one gRPC Adagrad push run (dim 64, batch 1024, 8 in flight,
# 1M uniform ids) against a fresh ps-server from BINDIR with a temporary --data_dir,
# printing rows/s and the CPU time the server and ps-bench spent per 1024-row batch
# (steadier than rows/s on a shared machine). Alternate old and new binary directories:
#
#   for i in 1 2; do benchmarks/ab_durable.sh /tmp/old/bin process 8; \
#                    benchmarks/ab_durable.sh build/bin process 8; done
#   benchmarks/ab_durable.sh BINDIR memory|process|machine|periodic [SECS] [server flags...]
#
# A 1 s populate run precedes the timed one. The server is stopped by pid.
set -euo pipefail
BIN="$1"; MODE="$2"; SECS="${3:-8}"; shift $(($# < 3 ? $# : 3))
DIR=$(mktemp -d /tmp/ab_durable.XXXX)
args=()
[ "$MODE" = memory ] || args=(--data_dir="$DIR/data" --durability="$MODE")
"$BIN/ps-server" --host=127.0.0.1 --port=0 --port_file="$DIR/port" "${args[@]}" "$@" >"$DIR/server.log" 2>&1 &
SPID=$!
for _ in $(seq 1 300); do [ -s "$DIR/port" ] && break; sleep 0.1; done
ADDR="127.0.0.1:$(cat $DIR/port)"
# populate first (not measured), then measure
"$BIN/ps-bench" --target=grpc --servers="$ADDR" --op=push --optimizer=adagrad --dim=64 --batch=1024 --rows=1000000 --inflight=8 --seconds=1 --populate >/dev/null 2>&1
s0=$(awk '{print $14+$15}' /proc/$SPID/stat)
load=$(cut -d' ' -f1 /proc/loadavg)
out=$( { /usr/bin/time -f "CLIENTCPU %U %S" "$BIN/ps-bench" --target=grpc --servers="$ADDR" --op=push --optimizer=adagrad --dim=64 --batch=1024 --rows=1000000 --inflight=8 --seconds="$SECS" --populate=false; } 2>&1 )
s1=$(awk '{print $14+$15}' /proc/$SPID/stat)
kill -TERM $SPID; wait $SPID 2>/dev/null || true
rps=$(echo "$out" | grep -o '"rows_per_s":[0-9.]*' | cut -d: -f2)
ccpu=$(echo "$out" | awk '/CLIENTCPU/{print $2+$3}')
hz=$(getconf CLK_TCK)
awk -v m="$MODE" -v r="$rps" -v s="$SECS" -v sc="$((s1-s0))" -v hz="$hz" -v cc="$ccpu" -v l="$load" 'BEGIN{b=r*s/1024; printf "%s rows/s=%d server_ms/batch=%.3f client_ms/batch=%.3f load=%s\n", m, r, sc/hz*1000/b, cc*1000/b, l}'
rm -rf "$DIR"
