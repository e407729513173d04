#!/usr/bin/env bash
# Every GPU test (CTest label gpu).
set -uo pipefail
cd "$BUILD"
ctest -L gpu --output-on-failure -j 4 --timeout 600 >"$OUT/test.log" 2>&1
rc=$?
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/test.log" | tail -n 20 | tee -a "$OUT/summary.txt"
exit $rc
