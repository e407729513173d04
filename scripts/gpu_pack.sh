#!/usr/bin/env bash
# Packs what the GPU check's test, sanitize, profile and benchmark steps run from a build made on
# another machine (one with nvcc and no GPU), so that the GPU machine runs them without building:
#
#   TILEATTN_GPU_STEPS="build build-candidate" scripts/gpu_check.sh OUT [cmake arguments...]
#   scripts/gpu_pack.sh ARCHIVE [BUILD_DIR]
#
# BUILD_DIR (default build-gpu, a folder of this tree) and its -candidate folder where present:
# their test and timing programs and CTest's files. On the GPU machine, in a copy of the tree at the
# same path (CTest's files and the programs' library paths are absolute): `tar -xJf ARCHIVE`, then
# scripts/gpu_check.sh with steps that need no build, e.g. TILEATTN_GPU_STEPS="test sanitize
# bench-bwd". The programs need the system libraries they were linked against there too: where one
# does not start, build there.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 ARCHIVE [BUILD_DIR]" >&2
  exit 2
fi
archive=$(realpath -m "$1")
build=${2:-build-gpu}
cd "$(dirname "$0")/.."
[ -d "$build" ] || { echo "gpu_pack: no build folder '$build' in $(pwd)" >&2; exit 1; }
files=()
for dir in "$build" "$build-candidate"; do
  [ -d "$dir" ] || continue
  for f in tests/tileattn_gpu_tests tests/tileattn_tests src/cuda/tileattn_gpu_bench src/cuda/tileattn_decode_bench; do
    if [ -f "$dir/$f" ]; then files+=("$dir/$f"); fi
  done
  while IFS= read -r f; do files+=("$f"); done < <(find "$dir" -path '*/CMakeFiles' -prune -o \
    \( -name CTestTestfile.cmake -o -name '*_include.cmake' -o -name '*_tests.cmake' \) -print)
done
tar -cJf "$archive" "${files[@]}"
echo "gpu_pack: ${#files[@]} files, $(du -h "$archive" | cut -f1) in $archive"
