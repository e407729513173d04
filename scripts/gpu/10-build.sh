#!/usr/bin/env bash
# Configure and build everything (tests, benchmark programs) with all cores. The CUDA backend is
# built explicitly (TILEATTN_CUDA=ON, not AUTO): without nvcc this fails instead of leaving the GPU
# tests out; CMAKE_ARGS may narrow the architectures (default 80-real;90a-real), e.g.
# -DCMAKE_CUDA_ARCHITECTURES=90a-real on an H100.
set -euo pipefail
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt" || true
. "$ROOT/scripts/gpu/build_tree.sh"
build_tree "$ROOT" "$BUILD" "$OUT/build.log" build
# The register, spill and shared-memory report, one line per kernel this build compiled.
grep -A2 "Compiling entry function" "$OUT/build.log" | grep -E "entry function|spill|registers" \
  | sed -E 's/.*entry function .(_Z[^ ]*). for .(sm_[0-9a]+).*/\2 \1/' >"$OUT/resources.txt" || true
