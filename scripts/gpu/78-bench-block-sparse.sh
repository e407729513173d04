#!/usr/bin/env bash
# The block_sparse grid (bench/block_sparse.py): tileattn.flex_attention against torch's compiled
# flex_attention on the same BlockMasks and tileattn's dense kernel, forward and backward, with the
# package the python-install step installed. TILEATTN_BENCH_HDIMS (e.g. 64), TILEATTN_BENCH_SEQLENS
# (e.g. 8192) and TILEATTN_BENCH_PATTERNS (e.g. causal,random) narrow the grid, so that a run can be
# split into parts (each torch-flex pattern and pass is a compile of its own).
set -euo pipefail
site=$BUILD/python-site
[ -d "$site/tileattn" ] || { echo "no package in $site: run the python-install step first" >&2; exit 1; }
cd "$ROOT"
out=$OUT/block-sparse-${COMMIT:0:7}.json
PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 python3 bench/block_sparse.py "$out" \
  ${TILEATTN_BENCH_HDIMS:+--hdims "$TILEATTN_BENCH_HDIMS"} ${TILEATTN_BENCH_SEQLENS:+--seqlens "$TILEATTN_BENCH_SEQLENS"} \
  ${TILEATTN_BENCH_PATTERNS:+--patterns "$TILEATTN_BENCH_PATTERNS"} --commit "$COMMIT" 2>&1 | tee "$OUT/bench-block-sparse.log"
# The table's rows (tileattn's ms, then its speedup over torch-flex and over the dense kernel).
grep -E "^ *[0-9]+ +[0-9]+ " "$OUT/bench-block-sparse.log" | sed 's/^/block-sparse: /' >>"$OUT/summary.txt" || true
