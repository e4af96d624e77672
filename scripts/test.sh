#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test (ctest: the `unit`
# and `integration` labels). Extra arguments go to ctest, e.g. scripts/test.sh -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
cd "${PS_BUILD_DIR:-build}"
ctest --output-on-failure -j2 "$@"
