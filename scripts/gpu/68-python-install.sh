#!/usr/bin/env bash
# The Python package built for this GPU and installed under BUILD/python-site (no build isolation, so
# the build finds this machine's nanobind, scikit-build-core and CUTLASS). The python step and the
# Python benchmarks import it from there; its own step because the CUDA build alone takes minutes.
# With TILEATTN_CANDIDATE (a patch, as for the build-candidate step) the patched tree's package is
# built beside it, at the same time, into BUILD/python-site-candidate, for the Python benchmarks
# that time both (bench-block-sparse-masking).
set -uo pipefail
# The package's own CMake flags (default: the build step's, with the CUDA backend on as there).
args=${TILEATTN_PY_CMAKE_ARGS-"-DTILEATTN_CUDA=ON${CMAKE_ARGS:+ $CMAKE_ARGS}"}
jobs=$(nproc)
install() {  # install SRC SITE LOG
  rm -rf "$2"  # pip --target keeps an existing package in place
  SKBUILD_CMAKE_ARGS="${args// /;}" CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$2" "$1" \
    >"$3" 2>&1 || { tail -n 40 "$3"; return 1; }
}
if [ -z "${TILEATTN_CANDIDATE:-}" ]; then
  install "$ROOT" "$BUILD/python-site" "$OUT/python-install.log"
  exit
fi
. "$ROOT/scripts/gpu/build_tree.sh"
candidate_tree "$BUILD-python-candidate-src" || exit 1
echo "python candidate: $TILEATTN_CANDIDATE ${TILEATTN_CANDIDATE_COMMIT:-}" | tee -a "$OUT/summary.txt"
jobs=$(( ($(nproc) + 1) / 2 ))
install "$ROOT" "$BUILD/python-site" "$OUT/python-install.log" &
base=$!
install "$BUILD-python-candidate-src" "$BUILD/python-site-candidate" "$OUT/python-install-candidate.log" &
cand=$!
wait $base
rb=$?
wait $cand
rc=$?
exit $((rb || rc))
