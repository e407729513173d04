#!/usr/bin/env bash
# Builds Google Highway as a static, position-independent library into PREFIX (default
# .deps/hwy-static) from Debian's source package of the version the system's libhwy-dev has (with
# Debian's patches), so that a wheel's module carries Highway inside and needs no libhwy.so at run
# time. Put PREFIX first on CMAKE_PREFIX_PATH (scripts/build_wheels.sh does). Does nothing when PREFIX
# already holds the library.
#
#   scripts/static_highway.sh [PREFIX]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
prefix=${1:-$root/.deps/hwy-static}
if [ -f "$prefix/lib/libhwy.a" ] || ls "$prefix"/lib/*/libhwy.a >/dev/null 2>&1; then
  echo "static_highway: $prefix has libhwy.a"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# apt-get source with a private source list: the machine's own apt configuration stays as it is.
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
printf 'deb-src http://deb.debian.org/debian %s main\ndeb-src http://deb.debian.org/debian-security %s-security main\n' \
  "$suite" "$suite" >"$work/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
          -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" -o APT::Sandbox::User=root)
version=$(dpkg-query -W -f='${Version}' libhwy-dev 2>/dev/null || true)
apt-get "${apt_opts[@]}" update -qq
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only -qq "highway${version:+=$version}")

cd "$work/src"
tar xzf highway_*.orig.tar.gz
tar xJf highway_*.debian.tar.xz
src=$(echo highway-*/)
if [ -f debian/patches/series ]; then
  while read -r p; do
    [ -n "$p" ] && [ "${p#\#}" = "$p" ] && patch -s -d "$src" -p1 <"debian/patches/$p"
  done <debian/patches/series
fi

cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_INSTALL_LIBDIR=lib -DHWY_FORCE_STATIC_LIBS=ON -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DHWY_ENABLE_CONTRIB=OFF -DHWY_ENABLE_EXAMPLES=OFF \
  -DHWY_ENABLE_TESTS=OFF -DBUILD_TESTING=OFF >/dev/null
cmake --build "$work/build" -j "${JOBS:-$(nproc)}" >/dev/null
cmake --install "$work/build" >/dev/null
echo "static_highway: Highway ${version:-(latest)} installed into $prefix"
