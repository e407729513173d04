#!/usr/bin/env bash
# The Python package's tests against its installed wheel, as a user gets it: builds the CPU wheel as
# a release does (scripts/build_wheels.sh: Highway linked in, auditwheel-checked), installs it with
# its test extras (PyTorch, transformers, pytest) into a virtual environment under build/, and runs
# the pytest suite there. The environment is kept between runs for its dependencies; the wheel is
# reinstalled each time. TILEATTN_WHEEL names a wheel to test instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=${TILEATTN_WHEEL:-}
if [ -z "$wheel" ]; then
  rm -rf build/wheelhouse
  scripts/build_wheels.sh cpu build/wheelhouse
  wheel=$(ls build/wheelhouse/tileattn-*.whl)
fi
venv=build/venv-wheel
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --force-reinstall --no-deps "$wheel"
"${pip[@]}" "$wheel[test]"
exec "$venv/bin/python" -m pytest tests/python -q -p no:cacheprovider
