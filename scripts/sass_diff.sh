#!/usr/bin/env bash
# Compares the machine code (SASS) of every CUDA object of two builds of the library, so that a
# change meant to leave the kernels as they are (a refactor) can be shown to, on a machine without a
# GPU:
#
#   scripts/sass_diff.sh BUILD_BEFORE BUILD_AFTER
#
# Both builds configured alike (the same dtypes, head dims and architectures; a narrow build is
# enough for the kernels it holds). Instruction addresses and the per-path hashes of anonymous
# namespaces are left out of the comparison; encodings, scheduling bits included, are kept. Prints a
# line per object and exits 1 when any differs (or is missing from the second build), 2 on a usage
# error. CUOBJDUMP names the cuobjdump to use (default: the one on PATH, then CUDA_HOME's).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_BEFORE BUILD_AFTER" >&2
  exit 2
fi
tool=${CUOBJDUMP:-$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")}
if [ ! -x "$tool" ]; then
  echo "$0: no cuobjdump at $tool; set CUOBJDUMP" >&2
  exit 2
fi
objects=src/cuda/CMakeFiles/tileattn_cuda_kernels.dir
if [ ! -d "$1/$objects" ]; then
  echo "$0: $1 holds no CUDA objects ($objects): a build with the CUDA backend is needed" >&2
  exit 2
fi
sass() {
  "$tool" -sass "$1" | sed -E 's#/\*[0-9a-f]{4,}\*/##; s#_GLOBAL__N__[0-9a-f]{8}_#_GLOBAL__N__#g' | grep -v '^[[:space:]]*$'
}
status=0
while IFS= read -r o; do
  functions=$(sass "$1/$objects/$o" | grep -c 'Function :' || true)
  if [ ! -f "$2/$objects/$o" ]; then
    echo "missing   $o"
    status=1
  elif cmp -s <(sass "$1/$objects/$o") <(sass "$2/$objects/$o"); then
    echo "same      $o ($functions functions)"
  else
    echo "different $o ($functions functions)"
    status=1
  fi
done < <(cd "$1/$objects" && find . -name '*.o' | sed 's#^\./##' | sort)
exit $status
