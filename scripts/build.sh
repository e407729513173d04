#!/usr/bin/env bash
# Configures and builds tileattn into build/ (Release, Ninja) and says what it builds. Arguments go
# to CMake's configure step, e.g. scripts/build.sh -DTILEATTN_CUDA=OFF. JOBS sets the parallelism
# (default: all cores); TILEATTN_BUILD_TARGETS builds only the named targets (default: all).
# The CUDA backend follows TILEATTN_CUDA (default AUTO: only where nvcc and a GPU are found).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" | { grep '^-- tileattn:' || true; }
# shellcheck disable=SC2086  # a list of target names
cmake --build build -j "${JOBS:-$(nproc)}" ${TILEATTN_BUILD_TARGETS:+--target $TILEATTN_BUILD_TARGETS}
