#!/usr/bin/env bash
# Host time per eager call (bench/overhead.py: the overhead record, tileattn / SDPA per entry point and
# pass, and the native calls alone; torch.profiler tables of the fwd+bwd calls in overhead-profile.txt)
# with the package the python-install step installed.
set -euo pipefail
site=$BUILD/python-site
[ -d "$site/tileattn" ] || { echo "no package in $site: run the python-install step first" >&2; exit 1; }
cd "$ROOT"
PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 python3 bench/overhead.py --breakdown --profile "$OUT/overhead-profile.txt" \
  --out "$OUT/overhead-${COMMIT:0:7}.json" 2>&1 | tee "$OUT/bench-overhead.log"
grep -E " (fwd|fwd\+bwd|bwd) " "$OUT/bench-overhead.log" | sed 's/^/overhead: /' >>"$OUT/summary.txt"
