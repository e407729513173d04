#!/usr/bin/env bash
# Copies this machine's installed build dependencies (Highway, GoogleTest; Debian packages
# libhwy-dev and libgtest-dev) into PREFIX, so that a machine without them (one that cannot reach a
# package registry) can build the project: put PREFIX at .deps/prefix of the copy there and
# scripts/gpu_check.sh uses it.
#
#   scripts/stage_deps.sh [PREFIX]   (default: .deps/prefix)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-$root/.deps/prefix}
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
lib=/usr/lib/$multiarch
mkdir -p "$prefix/include" "$prefix/lib/$multiarch/cmake"
cp -a /usr/include/hwy /usr/include/gtest /usr/include/gmock "$prefix/include/"
cp -a "$lib"/libhwy*.so* "$lib"/libgtest*.a "$lib"/libgmock*.a "$prefix/lib/$multiarch/"
cp -a "$lib/cmake/hwy" "$lib/cmake/GTest" "$prefix/lib/$multiarch/cmake/"
[ -d "$lib/pkgconfig" ] && mkdir -p "$prefix/lib/$multiarch/pkgconfig" && cp -a "$lib"/pkgconfig/libhwy*.pc "$prefix/lib/$multiarch/pkgconfig/" 2>/dev/null || true
du -sh "$prefix"
