#!/usr/bin/env bash
# The benchmark report: every grid for tileattn and the PyTorch peers through the Python package,
# with JSON and PNG plots under the output folder (needs the python-install step's package).
set -euo pipefail
export PYTHONPATH=$BUILD/python-site${PYTHONPATH:+:$PYTHONPATH}
PYTHONUNBUFFERED=1 python3 "$ROOT/bench/report.py" "$OUT" --commit "$COMMIT" 2>&1 | tee "$OUT/report.log" | tail -n 40
