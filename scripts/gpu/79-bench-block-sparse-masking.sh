#!/usr/bin/env bash
# Where a block-sparse call's time goes (bench/block_sparse.py's documents and window masks with
# their element masks in part, none or listed full; bench/block_sparse_masking.py), with the package
# the python-install step installed; where it also built a candidate, the two alternate in separate
# processes (base, candidate, base, candidate) and the summary gives candidate / base per row, the
# faster of each side's runs. TILEATTN_BENCH_HDIMS (e.g. 128) narrows the head dims.
set -euo pipefail
site=$BUILD/python-site
[ -d "$site/tileattn" ] || { echo "no package in $site: run the python-install step first" >&2; exit 1; }
cd "$ROOT"
sides="base"
[ -d "$BUILD/python-site-candidate/tileattn" ] && sides="base candidate base candidate"
n=0
for side in $sides; do
  n=$((n + 1))
  dir=$site
  [ "$side" = candidate ] && dir=$BUILD/python-site-candidate
  PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 python3 bench/block_sparse_masking.py \
    "$OUT/block-sparse-masking-$n.json" ${TILEATTN_BENCH_HDIMS:+--hdims "$TILEATTN_BENCH_HDIMS"} \
    --commit "$COMMIT" --build "$side" --run "$n" 2>&1 | tee -a "$OUT/bench-block-sparse-masking.log"
done
python3 bench/block_sparse_masking.py --merge "$OUT/block-sparse-masking-${COMMIT:0:7}.json" \
  "$OUT"/block-sparse-masking-[0-9].json | sed 's/^/block-sparse masking: /' >>"$OUT/summary.txt"
rm -f "$OUT"/block-sparse-masking-[0-9].json
