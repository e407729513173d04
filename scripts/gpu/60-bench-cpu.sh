#!/usr/bin/env bash
# The CPU grid: tileattn's CPU flash forward and backward against PyTorch's CPU SDPA on all of this
# machine's cores, fp32 and bf16 (bench/cpu_vs_torch.py; a few minutes).
set -euo pipefail
PYTHONUNBUFFERED=1 python3 "$ROOT/bench/cpu_vs_torch.py" "$OUT" --cli "$BUILD/tileattn" \
  --threads "$(nproc)" --commit "$COMMIT" --budget "${TILEATTN_CPU_BENCH_BUDGET:-230}" 2>&1 | tee "$OUT/bench-cpu.log"
grep -E "speedup over torch" "$OUT/bench-cpu.log" | sed 's/^/cpu /' >>"$OUT/summary.txt"
