#!/usr/bin/env bash
# Installs what building and testing tileattn needs on Debian 12 and does nothing when it is all
# there. Needs root (or sudo) only when something is missing. With nvcc on the machine it also
# installs the CUTLASS/CuTe headers the CUDA backend compiles against. (The Python wheel's static
# Highway comes from Debian's source package through scripts/static_highway.sh, which needs patch.)
set -euo pipefail

packages=(cmake ninja-build g++ pkg-config libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev
          libopenblas-dev patch xz-utils)
cutlass_range="~=4.2.0"  # as pyproject.toml's build requirement

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# apt's chatter goes to a log that is shown only when it fails.
apt_install() {
  local log
  log=$(mktemp)
  if ! { as_root apt-get update -qq &&
         as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; } \
       >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done

nvcc_found() { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }
cutlass_ok() {
  python3 2>/dev/null - <<'PY'
import sys, importlib.metadata as m
sys.exit(not m.version("nvidia-cutlass").startswith("4.2."))
PY
}

# The Python package's tests run in a virtual environment (scripts/python_tests.sh).
command -v python3 >/dev/null || missing+=(python3)
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)

need_cutlass=0
if nvcc_found && ! cutlass_ok; then
  need_cutlass=1
  command -v python3 >/dev/null || missing+=(python3)
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

if [ "$need_cutlass" = 1 ]; then
  echo "setup: installing nvidia-cutlass$cutlass_range (CUDA backend headers)"
  # Debian's own Python refuses system-wide pip installs (PEP 668); this is a build machine.
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check \
    "nvidia-cutlass$cutlass_range"
fi
