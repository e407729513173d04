#!/usr/bin/env bash
# The CPU library and its tests once more under AddressSanitizer and UndefinedBehaviorSanitizer, in
# a small configuration (one SIMD target, no CUDA, tools or examples): every test but the long
# flash sweeps. Any report fails the run.
# SANITIZE_BUILD_DIR sets the build folder (default build-sanitize); JOBS the parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SANITIZE_BUILD_DIR:-build-sanitize}
sanitize="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# HWY_COMPILE_ONLY_STATIC: one SIMD target (the baseline -msse4.2 allows, a real x86 one) instead of
# every one Highway knows, for a short build.
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_CXX_FLAGS="-O1 -g -msse4.2 $sanitize -DHWY_COMPILE_ONLY_STATIC=1" \
  -DCMAKE_EXE_LINKER_FLAGS="$sanitize" -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" \
  -DTILEATTN_CUDA=OFF -DTILEATTN_TOOLS=OFF -DTILEATTN_EXAMPLES=OFF -DTILEATTN_PYTHON=OFF >/dev/null
cmake --build "$dir" -j "${JOBS:-$(nproc)}" --target tileattn_tests
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# The random sweeps (tens of seconds each, minutes under the sanitizers) are left out; the shorter
# flash tests take the same code paths. SANITIZE_TESTS overrides the filter ('*' runs everything).
long='*RandomSweep*:*Bf16ModelHeadDims*:FlashForward.Bf16LongKeysMatchReference:FlashForward.CopiedKeyRowsMatchDenseRowsBitwise'
exec "$dir/tests/tileattn_tests" --gtest_brief=1 --gtest_filter="${SANITIZE_TESTS:-*-$long}"
