#!/usr/bin/env bash
# Configures (the first time) and builds the clang build of the libFuzzer harnesses
# (tests/fuzz/CMakeLists.txt): only the target fuzz_all and what it needs.
# Usage: tests/fuzz/build_fuzz.sh SOURCE_DIR FUZZ_BUILD_DIR [--require]
# Without clang++-14 or libFuzzer (Debian: clang-14, libfuzzer-14-dev) it builds nothing
# and exits 0 (the harness tests then skip), or 1 with --require (scripts/fuzz.sh).
# PS_FUZZ_CXX names another clang; PS_JOBS the parallel jobs (2).
set -euo pipefail
src="$1"
dir="$2"
require="${3:-}"
cxx="${PS_FUZZ_CXX:-clang++-14}"

missing=""
if ! command -v "$cxx" >/dev/null 2>&1; then
  missing="$cxx (Debian package clang-14)"
elif [ ! -f "$("$cxx" -print-runtime-dir)/libclang_rt.fuzzer-x86_64.a" ]; then
  missing="libFuzzer for $cxx (Debian package libfuzzer-14-dev)"
fi
if [ -n "$missing" ]; then
  echo "build_fuzz: $missing is not installed: the fuzz harnesses are not built"
  [ "$require" = "--require" ] && exit 1
  exit 0
fi

mkdir -p "$dir"
# One build at a time in this directory (ctest's fixture and scripts/fuzz.sh may meet).
exec 9>"$dir/.build.lock"
flock 9
if [ ! -f "$dir/CMakeCache.txt" ]; then
  launcher=()
  if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake -S "$src" -B "$dir" -DCMAKE_CXX_COMPILER="$cxx" -DPS_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
fi
cmake --build "$dir" --target fuzz_all -j "${PS_JOBS:-2}"
