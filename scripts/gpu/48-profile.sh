#!/usr/bin/env bash
# An ncu profile of one kernel on one benchmark row, with the stall samples per SASS instruction
# (bench/ncu_stalls.py). TILEATTN_PROFILE="KERNEL_REGEX [bench options] ROW", for example
# "fwd_kernel_sm90 32:512:32:64:0" or "bwd_kernel_sm90 --backward 8:2048:16:128:1"; skipped when unset.
# Uses the build step's benchmark binary.
set -euo pipefail
[ -n "${TILEATTN_PROFILE:-}" ] || { echo "TILEATTN_PROFILE is unset: nothing to profile"; exit 0; }
read -r kernel rest <<<"$TILEATTN_PROFILE"
# shellcheck disable=SC2086  # the bench options and row are separate words
ncu --kernel-name "regex:$kernel" --launch-skip 2 --launch-count 1 --set full --import-source no -f \
  -o "$OUT/profile" "$BUILD/src/cuda/tileattn_gpu_bench" --iters 3 $rest >"$OUT/profile.log" 2>&1
ncu -i "$OUT/profile.ncu-rep" --page details >"$OUT/profile-details.txt"
ncu -i "$OUT/profile.ncu-rep" --page source --csv --print-source sass >"$OUT/profile-source.csv"
python3 "$ROOT/bench/ncu_stalls.py" "$OUT/profile-source.csv" >"$OUT/profile-stalls.txt"
head -n 14 "$OUT/profile-stalls.txt" | sed 's/^/profile: /' >>"$OUT/summary.txt"
