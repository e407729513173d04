#!/usr/bin/env bash
# The decode grid: tileattn (contiguous and paged caches) against PyTorch SDPA flash and cuDNN.
set -euo pipefail
PYTHONUNBUFFERED=1 python3 "$ROOT/bench/gpu_decode.py" "$OUT" --bench "$BUILD/src/cuda/tileattn_decode_bench" \
  --commit "$COMMIT" 2>&1 | tee "$OUT/bench-decode.log"
