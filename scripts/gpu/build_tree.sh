# Sourced by the build steps (not a step itself: no number in its name).
# candidate_tree SRC: SRC made a copy of this tree with TILEATTN_CANDIDATE's patch applied (the
# candidate that the build-candidate and python-install steps build beside this tree).
# build_tree SRC BUILDDIR LOG LABEL [cmake --build arguments...]: configures SRC into BUILDDIR with the
# CUDA backend on and CMAKE_ARGS, builds (all cores; the arguments may name targets), writes the log
# to LOG and adds to the summary what ptxas said of the kernels this build compiled (kernel_report;
# where BUILDDIR holds an earlier build, only what changed since compiles, even in a fresh copy of
# the tree, whose files source_times.py gives their times back).

# kernel_report LOG LABEL: the nonzero spill counts ("LABEL spills: ...") and the kernels whose wgmma
# products ptxas serialized ("LABEL: wgmma serialized (C7514): KERNEL"). A serialized kernel runs and
# passes its tests; only its speed shows it, and which C++ triggers it is fragile (the same source
# was serialized in one build configuration and not in another: bench/notes/backward.md).
kernel_report() {
  local log=$1 label=$2
  grep -B1 -A0 "spill stores" "$log" | grep -v "0 bytes spill stores" | grep spill \
    | sed "s/^ */$label spills: /" | sort | uniq -c | head -n 20 | tee -a "$OUT/summary.txt" || true
  grep -o "(C7514).*function '[^']*'" "$log" | sed "s/.*function '\(.*\)'/\1/" | sort -u \
    | { c++filt 2>/dev/null || cat; } | sed -e "s/(.*//" -e "s/^/$label: wgmma serialized (C7514): /" \
    | tee -a "$OUT/summary.txt" || true
}

build_tree() {
  local src=$1 build=$2 log=$3 label=$4
  shift 4
  mkdir -p "$build"
  python3 "$ROOT/scripts/gpu/source_times.py" restore "$src" "$build/source-times.txt" >"$log"
  # A call's configuration is its arguments alone: the options a call narrows are cleared from the
  # folder's cache first (-U), so that a call without them builds the defaults, not an earlier
  # call's narrow set.
  # shellcheck disable=SC2086  # CMAKE_ARGS is a list of arguments
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTILEATTN_CUDA=ON -DTILEATTN_CUDA_RESOURCE_USAGE=ON \
    -U TILEATTN_CUDA_DTYPES -U TILEATTN_CUDA_HDIMS -U TILEATTN_TESTS -U CMAKE_CUDA_ARCHITECTURES \
    $CMAKE_ARGS >>"$log" 2>&1
  cmake --build "$build" -j "$(nproc)" "$@" >>"$log" 2>&1 || { tail -n 60 "$log"; return 1; }
  python3 "$ROOT/scripts/gpu/source_times.py" save "$src" "$build/source-times.txt"
  kernel_report "$log" "$label"
}

candidate_tree() {
  local src=$1 patch_file
  patch_file=$(cd "$ROOT" && realpath "$TILEATTN_CANDIDATE")
  rm -rf "$src" && mkdir -p "$src"
  tar -C "$ROOT" --exclude='./build*' --exclude='./.deps' --exclude='./.git' -cf - . | tar -C "$src" -xf -
  ln -s "$ROOT/.deps" "$src/.deps"
  # A repository of its own, so that git apply patches this copy whatever repository holds it.
  git -C "$src" init -q && git -C "$src" apply "$patch_file"
}
