#!/usr/bin/env bash
# The backward grid: tileattn against PyTorch SDPA flash and cuDNN, in one run.
# TILEATTN_BENCH_QUICK=1 times seqlen 512 and 2048 only; TILEATTN_BENCH_SECTIONS (e.g. mha,gqa) picks
# the grid's sections and TILEATTN_BENCH_HDIMS (e.g. 64,128) its head dims (bench/gpu_bench.py).
# With TILEATTN_CANDIDATE set, the build-candidate step's program is timed beside ours.
set -euo pipefail
PYTHONUNBUFFERED=1 python3 "$ROOT/bench/gpu_bench.py" --backward --bench "$BUILD/src/cuda/tileattn_gpu_bench" \
  --out "$OUT/bench-bwd.json" --commit "$COMMIT" ${TILEATTN_BENCH_QUICK:+--quick} ${TILEATTN_BENCH_SECTIONS:+--sections "$TILEATTN_BENCH_SECTIONS"} \
  ${TILEATTN_BENCH_HDIMS:+--hdims "$TILEATTN_BENCH_HDIMS"} \
  ${TILEATTN_CANDIDATE:+--candidate "$BUILD-candidate/src/cuda/tileattn_gpu_bench"} \
  ${TILEATTN_CANDIDATE:+--candidate-commit "${TILEATTN_CANDIDATE_COMMIT:-$TILEATTN_CANDIDATE}"} 2>&1 | tee "$OUT/bench-bwd.log"
