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
# COMMIT defaults to `git rev-parse HEAD` (marked -dirty where the tree differs); pass TILEATTN_COMMIT
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
# HEAD's commit, with "-dirty" where tracked files differ from it (a copy carrying uncommitted
# changes), so that a record never names a commit whose code it did not run.
tree_commit() {
  local c
  c=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null) || { echo unknown; return; }
  git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || c="$c-dirty"
  echo "$c"
}
export COMMIT=${TILEATTN_COMMIT:-$(tree_commit)}
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
