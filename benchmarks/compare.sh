#!/usr/bin/env bash
# Runs one workload against the in-process engine, our PS over gRPC, and Redis, and prints
# a table with the ratios grpc/redis and grpc/inproc. Starts a ps-server and a redis-server
# on loopback itself and stops them (by pid) when done.
#
#   benchmarks/compare.sh [--quick] [--rows=N] [--seconds=S] [--ops=pull,push] [ps-bench flags]
#
# Defaults: 1,000,000 rows, dim 64, batch 1024, 8 in flight, uniform ids, Adagrad, 10 s per
# run. --quick: 100,000 rows, 3 s per run (under a minute in all).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${PS_BUILD_DIR:-build}/bin"
ROWS=1000000
SECONDS_PER_RUN=10
OPS="pull,push"
EXTRA=()
for arg in "$@"; do
  case "$arg" in
    --quick) ROWS=100000; SECONDS_PER_RUN=3 ;;
    --rows=*) ROWS="${arg#--rows=}" ;;
    --seconds=*) SECONDS_PER_RUN="${arg#--seconds=}" ;;
    --ops=*) OPS="${arg#--ops=}" ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) EXTRA+=("$arg") ;;
  esac
done
for b in ps-server ps-bench; do
  [ -x "$BIN/$b" ] || { echo "compare.sh: $BIN/$b missing: run scripts/build.sh" >&2; exit 1; }
done
command -v redis-server >/dev/null || { echo "compare.sh: redis-server missing: run scripts/install_deps.sh" >&2; exit 1; }

source scripts/lib.sh
RUN_DIR="$PS_RUN_DIR"

ps_start_server ps "$BIN/ps-server" --threads=2
REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ps_spawn redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$RUN_DIR"
for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

: >"$RUN_DIR/results.jsonl"
for op in ${OPS//,/ }; do
  for target in inproc grpc redis; do
    echo "== $target $op ($ROWS rows, ${SECONDS_PER_RUN}s)" >&2
    "$BIN/ps-bench" --target="$target" --servers="$PS_ADDR" --redis="127.0.0.1:$REDIS_PORT" \
      --op="$op" --rows="$ROWS" --seconds="$SECONDS_PER_RUN" "${EXTRA[@]}" \
      | tail -n 1 >>"$RUN_DIR/results.jsonl"
  done
done

python3 - "$RUN_DIR/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
w = rows[0]
print(f"\nworkload: {w['rows']} rows, dim {w['dim']}, batch {w['batch']}, "
      f"{w['dist']} ids, {w['optimizer']}")
print(f"{'op':6} {'target':7} {'rows/s':>12} {'MB/s':>8} {'p50 us':>8} {'p99 us':>8} {'inflight':>8}")
by = {}
for r in rows:
    by[(r['op'], r['target'])] = r
    print(f"{r['op']:6} {r['target']:7} {r['rows_per_s']:>12,.0f} {r['mb_per_s']:>8.0f} "
          f"{r['p50_us']:>8.0f} {r['p99_us']:>8.0f} {r['inflight']:>8}")
for op in sorted({r['op'] for r in rows}):
    g, i, d = by.get((op, 'grpc')), by.get((op, 'inproc')), by.get((op, 'redis'))
    if g and d and i:
        print(f"{op}: grpc/redis = {g['rows_per_s'] / d['rows_per_s']:.2f}x, "
              f"grpc/inproc = {g['rows_per_s'] / i['rows_per_s']:.2f}")
PY
