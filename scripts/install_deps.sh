#!/usr/bin/env bash
# Installs the Debian 12 packages this project builds, tests and benchmarks with.
# Idempotent: installs only what is missing and prints nothing when all is there.
# Usage: scripts/install_deps.sh            (build + test + benchmark packages)
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake pkg-config clang-format
  # RPC and serialization
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  # storage, math, utilities
  librocksdb-dev rocksdb-tools libabsl-dev libeigen3-dev libgflags-dev libgoogle-glog-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # the libFuzzer harnesses (tests/fuzz, scripts/fuzz.sh): a clang build of them
  clang-14 libfuzzer-14-dev
  # the Redis peer for benchmarks/compare.sh
  libhiredis-dev redis-server
  # process tools used by the launcher and the integration tests
  procps
  # the Python worker SDK (client/python) and its tests; torch for the PyTorch module
  python3 python3-grpcio python3-numpy python3-protobuf python3-pytest python3-torch
  # the SDK's C++ extension (elastic_ps._core, the C++ client bound with pybind11)
  pybind11-dev python3-pybind11 python3-dev
  # observability and deployment tests: a real Prometheus scraping a local cluster,
  # certificates for the TLS tests, YAML for the Kubernetes manifest test
  prometheus openssl python3-yaml
)

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
