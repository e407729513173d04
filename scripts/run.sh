#!/usr/bin/env bash
# The two commands for a fresh machine:
#   scripts/run.sh bench [flags]   install what is missing, build the tool, run `tileattn bench [flags]`
#   scripts/run.sh test  [args]    install what is missing, build, run the whole test suite (ctest,
#                                  then the Python package's pytest suite against its built wheel)
# TILEATTN_CMAKE_ARGS adds flags to the CMake configure step (the CUDA backend follows TILEATTN_CUDA,
# default AUTO: built only where nvcc and a GPU are found); JOBS sets the parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
case "$what" in
  bench|test) shift ;;
  *) echo "usage: scripts/run.sh bench|test [args]" >&2; exit 2 ;;
esac
scripts/setup.sh
if [ "$what" = bench ]; then
  # shellcheck disable=SC2086  # TILEATTN_CMAKE_ARGS is a list of flags
  TILEATTN_BUILD_TARGETS=tileattn_cli scripts/build.sh ${TILEATTN_CMAKE_ARGS:-}
  exec build/tileattn bench "$@"
fi
# shellcheck disable=SC2086
scripts/build.sh ${TILEATTN_CMAKE_ARGS:-}
ctest --test-dir build --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
exec scripts/python_tests.sh
