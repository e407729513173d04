#!/usr/bin/env bash
# The Python package on this GPU: installed (no build isolation, so the build finds this machine's
# nanobind, scikit-build-core and CUTLASS), then its whole pytest suite, the GPU tests included,
# the README's Python snippet and the Hugging Face example.
set -uo pipefail
site=$BUILD/python-site
# The package's own CMake flags (default: the build step's, with the CUDA backend on as there).
args=${TILEATTN_PY_CMAKE_ARGS-"-DTILEATTN_CUDA=ON${CMAKE_ARGS:+ $CMAKE_ARGS}"}
rm -rf "$site"  # pip --target keeps an existing package in place
SKBUILD_CMAKE_ARGS="${args// /;}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$site" "$ROOT" \
  >"$OUT/python-install.log" 2>&1 || { tail -n 40 "$OUT/python-install.log"; exit 1; }
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
cd "$ROOT"
python3 -m pytest tests/python -q -p no:cacheprovider >"$OUT/python-test.log" 2>&1
rc=$?
tail -n 3 "$OUT/python-test.log" | sed 's/^/pytest: /' | tee -a "$OUT/summary.txt"
# The README's Python snippet, exactly as a newcomer would paste it.
python3 -c 'import re; src = open("README.md").read()
exec(compile(re.search(r"## Python\n\n```python\n(.*?)```", src, re.S).group(1), "README.md", "exec"))' \
  >"$OUT/readme-snippet.log" 2>&1 || rc=1
tail -n 2 "$OUT/readme-snippet.log" | sed 's/^/README snippet: /' | tee -a "$OUT/summary.txt"
python3 examples/hf_llama.py >"$OUT/hf-llama.log" 2>&1 || rc=1
tail -n 4 "$OUT/hf-llama.log" | sed 's/^/hf example: /' | tee -a "$OUT/summary.txt"
exit $rc
