#!/usr/bin/env bash
# The project's one GPU-machine check: build, every GPU test, the CPU tests on its host (AMX),
# compute-sanitizer, benchmarks.
#
#   scripts/gpu_check.sh OUTDIR [extra cmake arguments...]
#
# Runs the steps in scripts/gpu/ in name order (NN-name.sh); TILEATTN_GPU_STEPS="build test" runs
# only the named ones. Each step reads ROOT, BUILD, OUT, COMMIT and CMAKE_ARGS from the environment,
# writes its log under OUTDIR and may append lines to OUTDIR/summary.txt, which is printed last.
# A new section (another benchmark grid, a CPU bench) is a new file in scripts/gpu/.
# COMMIT: bench/record_commit.py's (HEAD, marked -dirty where the tree differs); pass TILEATTN_COMMIT
# where the copy has no .git or its HEAD is not the tree's commit.
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUTDIR [extra cmake arguments...]" >&2
  exit 2
fi
export OUT=$(mkdir -p "$1" && cd "$1" && pwd)
shift
export ROOT=$(cd "$(dirname "$0")/.." && pwd)
export BUILD=${TILEATTN_BUILD_DIR:-$ROOT/build-gpu}
# The commit every record names, as the Python benchmarks name it (TILEATTN_COMMIT, else HEAD marked
# -dirty where tracked files differ from it), so that a record never names code it did not run.
export COMMIT=$(python3 "$ROOT/bench/record_commit.py" 2>/dev/null || echo unknown)
export CMAKE_ARGS="$*"
# Dependencies staged by scripts/stage_deps.sh for a machine that lacks the packages.
if [ -d "$ROOT/.deps/prefix" ]; then
  export CMAKE_PREFIX_PATH="$ROOT/.deps/prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  for d in "$ROOT"/.deps/prefix/lib "$ROOT"/.deps/prefix/lib/*-linux-gnu; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
: >"$OUT/summary.txt"

status=0
for step in "$ROOT"/scripts/gpu/[0-9][0-9]-*.sh; do
  name=$(basename "$step" .sh)
  name=${name#[0-9][0-9]-}
  if [ -n "${TILEATTN_GPU_STEPS:-}" ] && [[ " $TILEATTN_GPU_STEPS " != *" $name "* ]]; then continue; fi
  echo "=== $name ==="
  t0=$(date +%s)
  if bash "$step"; then rc=0; else rc=$?; fi
  echo "step $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
  if [ $rc -ne 0 ]; then
    status=1
    [ "$name" = build ] && break  # nothing after it can run
  fi
done
echo
cat "$OUT/summary.txt"
exit $status
