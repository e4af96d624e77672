#!/usr/bin/env bash
# Configures and builds everything into ${PS_BUILD_DIR:-build} (binaries in bin/), or only
# the CMake targets named in $PS_TARGETS (space-separated; docker/Dockerfile builds those
# it ships).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${PS_BUILD_DIR:-build}"
JOBS="${PS_JOBS:-2}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${PS_BUILD_TYPE:-RelWithDebInfo}" >/dev/null
TARGETS=()
read -ra TARGETS <<<"${PS_TARGETS:-}"
[ ${#TARGETS[@]} -eq 0 ] || TARGETS=(--target "${TARGETS[@]}")
cmake --build "$BUILD_DIR" -j "$JOBS" "${TARGETS[@]}"
