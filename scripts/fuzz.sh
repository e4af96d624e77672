#!/usr/bin/env bash
# Fuzzes every libFuzzer harness (tests/fuzz) for SECONDS each (default 60): builds the
# clang build of the harnesses in ${PS_BUILD_DIR:-build}-fuzz if needed, then runs each
# harness over its seeds and on for SECONDS, keeping what it learns in
# <fuzz build>/fuzz/work/<harness> across runs. Prints each crash's reproducer path.
# Usage: scripts/fuzz.sh [SECONDS] [HARNESS...]   e.g. scripts/fuzz.sh 600 fuzz_wire
# PS_FUZZ_SEED: libFuzzer's seed (default 0: a new one each run).
# Needs clang-14 and libfuzzer-14-dev (scripts/install_deps.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
[ $# -gt 0 ] && shift
dir="${PS_BUILD_DIR:-build}-fuzz"
tests/fuzz/build_fuzz.sh "$PWD" "$dir" --require
if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  mapfile -t harnesses < <(awk '{ print $1 }' "$dir/fuzz/harnesses.txt")
fi
failed=()
for h in "${harnesses[@]}"; do
  if ! PS_FUZZ_WORK=keep PS_FUZZ_SEED="${PS_FUZZ_SEED:-0}" \
      tests/fuzz/run_harness.sh "$dir" "$h" "$seconds"; then
    failed+=("$h")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} of ${#harnesses[@]} harnesses found something: ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#harnesses[@]} harnesses, ${seconds}s each: nothing found"
