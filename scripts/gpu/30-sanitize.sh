#!/usr/bin/env bash
# compute-sanitizer memcheck and racecheck on small cases of the GPU tests.
set -uo pipefail
tests=$BUILD/tests/tileattn_gpu_tests
filter=${TILEATTN_SANITIZE_FILTER:-GpuForward.StridedViews:GpuForward.RowsWithoutKeys:GpuForward.VarlenIgnoresRowsPastTheLastSequence:GpuDecode.CudaGraphCaptureAndReplay:GpuBackward.MaskedRowsAndUnseenKeysGetZeroGradients:GpuBackward.VarlenWithEmptySequencesAndLargeLogits:GpuVariant.SmallCasesOfEachVariant}
rc=0
for tool in memcheck racecheck; do
  echo "--- $tool" >>"$OUT/sanitize.log"
  compute-sanitizer --tool "$tool" --error-exitcode 1 "$tests" --gtest_filter="$filter" >>"$OUT/sanitize.log" 2>&1 || rc=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log" | tail -n 1 | sed "s/^/$tool: /" | tee -a "$OUT/summary.txt"
done
exit $rc
