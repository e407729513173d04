#!/usr/bin/env bash
# The CPU tests (CTest label cpu) on this machine's processor: on a Xeon with AMX (Sapphire Rapids
# or later) they run the bf16 forward's and backward's tile paths, which machines without AMX, CI's
# among them, never reach.
set -uo pipefail
cd "$BUILD"
ctest -L cpu --output-on-failure -j "$(nproc)" --timeout 600 >"$OUT/test-cpu.log" 2>&1
rc=$?
amx=$(grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null && echo "with AMX" || echo "without AMX")
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/test-cpu.log" | tail -n 20 | sed "s/^/cpu ($amx): /" |
  tee -a "$OUT/summary.txt"
exit $rc
