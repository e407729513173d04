#!/usr/bin/env bash
# A second build, of this tree with a patch applied, that the benchmark steps time beside the first
# in every row (bench/gpu_bench.py --candidate): a kernel change judged against its baseline in one
# run. TILEATTN_CANDIDATE=PATCH (a diff against this tree, such as `git diff main topic`, as a path
# relative to the tree or absolute); TILEATTN_CANDIDATE_COMMIT names it in the records. Built with
# the build step's CMake arguments into $BUILD-candidate; skipped when TILEATTN_CANDIDATE is unset.
set -euo pipefail
[ -n "${TILEATTN_CANDIDATE:-}" ] || { echo "TILEATTN_CANDIDATE is unset: no candidate build"; exit 0; }
. "$ROOT/scripts/gpu/build_tree.sh"
patch_file=$(cd "$ROOT" && realpath "$TILEATTN_CANDIDATE")
src="$BUILD-candidate-src"
candidate_tree "$src"
# tar keeps the files' times, so a build directory left by another patch would keep the objects of
# files that patch changed and this one does not: start it afresh whenever the patch differs.
stamp="$BUILD-candidate/candidate.sha256"
if [ "$(cat "$stamp" 2>/dev/null)" != "$(sha256sum <"$patch_file")" ]; then rm -rf "$BUILD-candidate"; fi
echo "candidate: $TILEATTN_CANDIDATE ($(grep -c '^diff --git' "$patch_file") files) ${TILEATTN_CANDIDATE_COMMIT:-}" \
  | tee -a "$OUT/summary.txt"
build_tree "$src" "$BUILD-candidate" "$OUT/build-candidate.log" candidate --target tileattn_gpu_bench
sha256sum <"$patch_file" >"$stamp"
