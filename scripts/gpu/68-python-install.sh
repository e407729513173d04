#!/usr/bin/env bash
# The Python package built for this GPU and installed under BUILD/python-site (no build isolation, so
# the build finds this machine's nanobind, scikit-build-core and CUTLASS). The python step and the
# Python benchmarks import it from there; its own step because the CUDA build alone takes minutes.
set -uo pipefail
site=$BUILD/python-site
# The package's own CMake flags (default: the build step's, with the CUDA backend on as there).
args=${TILEATTN_PY_CMAKE_ARGS-"-DTILEATTN_CUDA=ON${CMAKE_ARGS:+ $CMAKE_ARGS}"}
rm -rf "$site"  # pip --target keeps an existing package in place
SKBUILD_CMAKE_ARGS="${args// /;}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$site" "$ROOT" \
  >"$OUT/python-install.log" 2>&1 || { tail -n 40 "$OUT/python-install.log"; exit 1; }
