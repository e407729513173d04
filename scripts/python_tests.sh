#!/usr/bin/env bash
# Builds the Python package into a virtual environment under build/ and runs its tests.
# TILEATTN_PY_CMAKE_ARGS: CMake flags for the package's own build (default: TILEATTN_CMAKE_ARGS).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
args=${TILEATTN_PY_CMAKE_ARGS-${TILEATTN_CMAKE_ARGS:-}}
export SKBUILD_CMAKE_ARGS="${args// /;}"
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)}
"$venv/bin/python" -m pip install -q --disable-pip-version-check ".[test]"
exec "$venv/bin/python" -m pytest tests/python -q
