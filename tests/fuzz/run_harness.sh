#!/usr/bin/env bash
# Runs one libFuzzer harness of a fuzz build: first every seed of its corpus, then new
# inputs for SECONDS (0: the seeds only).
# Usage: tests/fuzz/run_harness.sh FUZZ_BUILD_DIR HARNESS SECONDS [libFuzzer flags...]
#   e.g. tests/fuzz/run_harness.sh build-fuzz fuzz_wire 60
# New inputs the fuzzer keeps go to FUZZ_BUILD_DIR/fuzz/work/HARNESS (kept across runs
# with PS_FUZZ_WORK=keep, as scripts/fuzz.sh does; else a fresh one each run), never into
# the repository's seeds. A crash's reproducer is written to
# FUZZ_BUILD_DIR/fuzz/crashes/HARNESS/ and its path printed, with the command that
# replays it. PS_FUZZ_SEED fixes libFuzzer's seed (default 1; 0: random).
# Exit: 0 nothing found, 1 a crash, leak, timeout or out-of-memory, 77 the harness is not
# built (clang++-14 or libfuzzer-14-dev missing).
set -uo pipefail
dir="$1"
name="$2"
seconds="$3"
shift 3
bin="$dir/fuzz/$name"
if [ ! -x "$bin" ]; then
  echo "run_harness: skipped: $bin is not built (needs clang-14 and libfuzzer-14-dev;" \
       "scripts/fuzz.sh builds it)"
  exit 77
fi
corpus="$(awk -v n="$name" '$1 == n { print $2 }' "$dir/fuzz/harnesses.txt")"
if [ -z "$corpus" ] || [ ! -d "$corpus" ]; then
  echo "run_harness: $name has no seed corpus in $dir/fuzz/harnesses.txt"
  exit 1
fi
work="$dir/fuzz/work/$name"
crashes="$dir/fuzz/crashes/$name"
if [ "${PS_FUZZ_WORK:-fresh}" != "keep" ]; then rm -rf "$work"; fi
mkdir -p "$work" "$crashes"
log="$dir/fuzz/$name.log"
if [ "$seconds" -gt 0 ]; then limit=(-max_total_time="$seconds"); else limit=(-runs=0); fi
# An input larger than a few KB teaches nothing a smaller one does not, and a single
# allocation beyond 512 MB from inputs this small is a bug in itself.
"$bin" "${limit[@]}" -seed="${PS_FUZZ_SEED:-1}" -max_len=4096 -timeout=30 -rss_limit_mb=2048 \
  -malloc_limit_mb=512 -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
  -artifact_prefix="$crashes/" "$@" "$work" "$corpus" >"$log" 2>&1
rc=$?
runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)"
if [ "$rc" -eq 0 ]; then
  echo "$name: ${runs:-?} inputs in ${seconds}s (seeds: $corpus), nothing found"
  exit 0
fi
tail -n 60 "$log"
echo
echo "$name FAILED (exit $rc); full log: $log"
repro="$(grep -o 'Test unit written to .*' "$log" | sed 's/^Test unit written to //' | tail -1)"
if [ -n "$repro" ]; then
  echo "reproducer: $repro"
  echo "replay it:  $bin $repro"
fi
exit 1
