#!/usr/bin/env bash
# The end-to-end training record (bench/train_e2e.py: whole models trained with each attention
# implementation; step time, tokens/s and peak memory, speedup over SDPA's cuDNN backend) with the
# package the python-install step installed. TILEATTN_E2E_MODELS (e.g. "gpt2-124m llama-gqa") and
# TILEATTN_E2E_SEQLENS (e.g. "1024 4096") narrow it, so that a run fits one call's time limit.
set -euo pipefail
site=$BUILD/python-site
[ -d "$site/tileattn" ] || { echo "no package in $site: run the python-install step first" >&2; exit 1; }
cd "$ROOT"
# shellcheck disable=SC2086  # the lists are word-split on purpose
PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 python3 bench/train_e2e.py --out "$OUT/e2e-${COMMIT:0:7}.json" \
  ${TILEATTN_E2E_MODELS:+--models $TILEATTN_E2E_MODELS} ${TILEATTN_E2E_SEQLENS:+--seqlens $TILEATTN_E2E_SEQLENS} \
  2>&1 | tee "$OUT/bench-e2e.log"
tail -n 20 "$OUT/bench-e2e.log" | sed 's/^/e2e: /' >>"$OUT/summary.txt"
