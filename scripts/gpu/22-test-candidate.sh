#!/usr/bin/env bash
# Every GPU test on the candidate build (the build-candidate step's tree), so that a kernel change
# is tested and timed against its baseline in one call. Skipped when TILEATTN_CANDIDATE is unset.
set -uo pipefail
[ -n "${TILEATTN_CANDIDATE:-}" ] || { echo "TILEATTN_CANDIDATE is unset: no candidate to test"; exit 0; }
cmake --build "$BUILD-candidate" -j "$(nproc)" --target tileattn_gpu_tests >>"$OUT/build-candidate.log" 2>&1 \
  || { tail -n 60 "$OUT/build-candidate.log"; exit 1; }
cd "$BUILD-candidate"
ctest -L gpu --output-on-failure -j 4 --timeout 600 >"$OUT/test-candidate.log" 2>&1
rc=$?
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/test-candidate.log" | tail -n 20 | sed 's/^/candidate: /' \
  | tee -a "$OUT/summary.txt"
exit $rc
