#!/usr/bin/env bash
# Configures and builds tileattn into build/ (Release, Ninja). Arguments go to CMake's configure
# step, e.g. scripts/build.sh -DTILEATTN_CUDA=OFF. JOBS sets the parallelism (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "${JOBS:-$(nproc)}"
