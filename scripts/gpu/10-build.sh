#!/usr/bin/env bash
# Configure and build everything (tests, benchmark programs) with all cores. The CUDA backend is
# built explicitly (TILEATTN_CUDA=ON, not AUTO): without nvcc this fails instead of leaving the GPU
# tests out; CMAKE_ARGS may narrow the architectures (default 80-real;90a-real), e.g.
# -DCMAKE_CUDA_ARCHITECTURES=90a-real on an H100.
set -euo pipefail
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt" || true
# shellcheck disable=SC2086
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTILEATTN_CUDA=ON -DTILEATTN_CUDA_RESOURCE_USAGE=ON $CMAKE_ARGS \
  >"$OUT/build.log" 2>&1
cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { tail -n 60 "$OUT/build.log"; exit 1; }
# The kernels' register, spill and shared-memory report, one line per kernel.
grep -A2 "Compiling entry function" "$OUT/build.log" | grep -E "entry function|spill|registers" \
  | sed -E 's/.*entry function .(_Z[^ ]*). for .(sm_[0-9a]+).*/\2 \1/' >"$OUT/resources.txt" || true
grep -B1 -A0 "spill stores" "$OUT/build.log" | grep -v "0 bytes spill stores" | grep spill \
  | sed 's/^ */spills: /' | sort | uniq -c | head -n 20 | tee -a "$OUT/summary.txt" || true
