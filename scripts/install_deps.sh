#!/usr/bin/env bash
# Installs the Debian 12 packages this project builds, tests and benchmarks with.
# Idempotent: installs only what is missing and prints nothing when all is there.
# Usage: scripts/install_deps.sh              build + test + benchmark packages
#        scripts/install_deps.sh --build      only what configuring and building needs (the
#                                             image's build stage, docker/Dockerfile)
#        scripts/install_deps.sh --container  only the container engine and mmdebstrap that
#                                             scripts/container-test.sh uses (optional: the
#                                             normal test run never needs them)
set -euo pipefail

# What `cmake` needs to configure and build every target (the configuration also finds
# the test and benchmark libraries, so they are here too).
BUILD_PACKAGES=(
  # toolchain
  build-essential cmake pkg-config ccache
  # RPC and serialization; protobuf-compiler-grpc also has the Python stubs' plugin
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  # storage, math, utilities
  librocksdb-dev libabsl-dev libeigen3-dev libgflags-dev libgoogle-glog-dev
  # test and benchmark libraries (find_package at configure time), the Redis client of
  # benchmarks/compare.sh
  libgtest-dev libgmock-dev libbenchmark-dev libhiredis-dev
  # the SDK's C++ extension (elastic_ps._core, the C++ client bound with pybind11)
  pybind11-dev python3-pybind11 python3-dev
)

# What the tests, benchmarks and tools run with, beyond the build.
TEST_PACKAGES=(
  clang-format rocksdb-tools
  # the libFuzzer harnesses (tests/fuzz, scripts/fuzz.sh): a clang build of them
  clang-14 libfuzzer-14-dev
  # the Redis peer for benchmarks/compare.sh
  redis-server
  # process tools used by the launcher and the integration tests
  procps
  # the Python worker SDK (client/python) and its tests; torch for the PyTorch module
  python3 python3-grpcio python3-numpy python3-protobuf python3-pytest python3-torch
  # observability and deployment tests: a real Prometheus scraping a local cluster,
  # certificates for the TLS tests, YAML for the Kubernetes manifest test
  prometheus openssl python3-yaml
)

# scripts/container-test.sh: a container engine (dockerd and its client) and mmdebstrap,
# which makes the debian:bookworm base images from Debian's archive (docker/base-image.sh).
CONTAINER_PACKAGES=(docker.io mmdebstrap)

case "${1:-}" in
  "") PACKAGES=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
  --build) PACKAGES=("${BUILD_PACKAGES[@]}") ;;
  --container) PACKAGES=("${CONTAINER_PACKAGES[@]}") ;;
  *) echo "install_deps: unknown argument $1 (--build, --container or none)" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done"
