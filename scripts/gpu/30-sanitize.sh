#!/usr/bin/env bash
# compute-sanitizer over the GPU tests; any report fails the step.
#   memcheck:  every GPU test as `ctest -L gpu` runs them: the whole test binary on the device's
#              own kernels (the sm_90a ones on a Hopper GPU), then the forward and backward tests
#              again on the portable kernels (TILEATTN_CUDA_PORTABLE=1, as CTest's
#              gpu.portable_kernels does).
#   racecheck, synccheck, initcheck: one small case of every kernel family (forward and backward
#              on both kernel sets):
#     forward                GpuForward.StridedViews (causal, GQA, strided views)
#     backward               GpuBackward.VarlenWithEmptySequencesAndLargeLogits (varlen, then
#                            causal in the deterministic mode, then batched) and
#                            GpuBackward.SmallCaseOfEachHopperKernel (each Hopper kernel, both modes)
#     decode, tensor cores   GpuDecode.CudaGraphCaptureAndReplay (paged, 3 splits merged, graph)
#     decode append, rotary  GpuDecode.AppendWithRotaryOnEveryKernel (tensor-core kernel on pages
#                            of 16 and of 5, CUDA-core kernel at head dim 256, each split)
#     decode splits, combine GpuNanSemantics.DecodeSplitsAndCombine (1, 4 and 64 splits; combine)
#     variants               GpuVariant.SmallCasesOfEachVariant (chunks, document ids, block masks, dense masks,
#                            prefix lengths)
# The test names are the sources' (tests/gpu/); a name the binary does not list (a renamed test)
# fails the step before anything runs.
# TILEATTN_SANITIZE_TOOLS narrows the tools (default "memcheck racecheck synccheck initcheck").
# Time on an H100: racecheck, synccheck and initcheck 36 s together (2026-11-27); memcheck not
# timed yet (an estimate: 5-10 minutes, the random sweeps' fp64 oracle dominating).
set -uo pipefail
tests=$BUILD/tests/tileattn_gpu_tests
command -v compute-sanitizer >/dev/null || { echo "sanitize: compute-sanitizer not found" | tee -a "$OUT/summary.txt"; exit 1; }
log=$OUT/sanitize.log
: >"$log"
fwd_bwd='GpuForward.StridedViews:GpuBackward.VarlenWithEmptySequencesAndLargeLogits:GpuBackward.SmallCaseOfEachHopperKernel'
one_case="$fwd_bwd:GpuDecode.CudaGraphCaptureAndReplay:GpuDecode.AppendWithRotaryOnEveryKernel"
one_case+=':GpuNanSemantics.DecodeSplitsAndCombine:GpuVariant.SmallCasesOfEachVariant'

# Every named test must exist ("Suite." lines, then "  Test" lines).
listed=$("$tests" --gtest_list_tests) || { echo "sanitize: $tests does not run" | tee -a "$OUT/summary.txt"; exit 1; }
for name in ${one_case//:/ }; do
  if ! awk -v s="${name%%.*}." -v t="${name#*.}" '/^[^ ]/ { suite = $1 } /^  / && suite == s && $1 == t { found = 1 }
                                                 END { exit !found }' <<<"$listed"; then
    echo "sanitize: no test $name in $tests" | tee -a "$OUT/summary.txt"
    exit 1
  fi
done
rc=0

# run TOOL LABEL FILTER [ENV=VALUE...]: one sanitizer run, its summary line into summary.txt.
run() {
  local tool=$1 label=$2 filter=$3
  shift 3
  local t0 status
  t0=$(date +%s)
  echo "--- $tool, $label: $filter" >>"$log"
  # initcheck does not see the copy engine's stores (cp.async.bulk), so the dQ rows the Hopper
  # backward stores that way read as never written in the conversion kernel, which
  # GpuBackward.IgnoresWhatTheWorkspaceHeld checks instead (every workspace byte NaN beforehand).
  local opts=()
  [ "$tool" = initcheck ] && opts=(--kernel-name-exclude kns=dq_convert_kernel)
  env "$@" compute-sanitizer --tool "$tool" "${opts[@]}" --error-exitcode 1 "$tests" --gtest_filter="$filter" \
    >"$OUT/sanitize-part.log" 2>&1
  status=$?
  cat "$OUT/sanitize-part.log" >>"$log"
  # A skipped test (no usable GPU) checked nothing.
  if grep -q '^\[  SKIPPED \]' "$OUT/sanitize-part.log"; then
    echo "tests were skipped" >>"$log"
    status=1
  fi
  local summary
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize-part.log" | tail -n 1)
  echo "$tool ($label): ${summary:-no summary} [exit $status, $(($(date +%s) - t0)) s]" | tee -a "$OUT/summary.txt"
  [ $status -eq 0 ] || rc=1
}

for tool in ${TILEATTN_SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
  if [ "$tool" = memcheck ]; then
    run memcheck "every test" '*'
    run memcheck "portable kernels" 'GpuForward.*:GpuBackward.*:GpuVariant.*' TILEATTN_CUDA_PORTABLE=1
  else
    run "$tool" "one case per kernel" "$one_case"
    run "$tool" "one case per kernel, portable" "$fwd_bwd:GpuVariant.SmallCasesOfEachVariant" TILEATTN_CUDA_PORTABLE=1
  fi
done
rm -f "$OUT/sanitize-part.log"
exit $rc
