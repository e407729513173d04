#!/usr/bin/env bash
# ncu profiles of kernels on benchmark rows, each with its details page, its raw metrics and the stall
# samples per SASS instruction (bench/ncu_stalls.py). TILEATTN_PROFILE="KERNEL_REGEX [bench options]
# ROW", for example "fwd_kernel_sm90 32:512:32:64:0" or "bwd_kernel_sm90 --backward 8:2048:16:128:1";
# several separated by ';' are profiled in turn (profile-1, profile-2, ...; one alone writes
# profile). Skipped when unset. Uses the build step's benchmark binary; with the build-candidate
# step's program present, each is profiled on it too (candidate-profile...).
set -euo pipefail
[ -n "${TILEATTN_PROFILE:-}" ] || { echo "TILEATTN_PROFILE is unset: nothing to profile"; exit 0; }
IFS=';' read -ra entries <<<"$TILEATTN_PROFILE"
programs=("$BUILD/src/cuda/tileattn_gpu_bench")
[ -n "${TILEATTN_CANDIDATE:-}" ] && programs+=("$BUILD-candidate/src/cuda/tileattn_gpu_bench")
for program in "${programs[@]}"; do
  prefix=$([ "$program" = "${programs[0]}" ] && echo profile || echo candidate-profile)
  for i in "${!entries[@]}"; do
    name=$([ ${#entries[@]} -eq 1 ] && echo "$prefix" || echo "$prefix-$((i + 1))")
    read -r kernel rest <<<"${entries[$i]}"
    # shellcheck disable=SC2086  # the bench options and row are separate words
    ncu --kernel-name "regex:$kernel" --launch-skip 2 --launch-count 1 --set full --import-source no -f \
      -o "$OUT/$name" "$program" --iters 3 $rest >"$OUT/$name.log" 2>&1
    ncu -i "$OUT/$name.ncu-rep" --page details >"$OUT/$name-details.txt"
    ncu -i "$OUT/$name.ncu-rep" --page raw --csv >"$OUT/$name-raw.csv"
    ncu -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass >"$OUT/$name-source.csv"
    python3 "$ROOT/bench/ncu_stalls.py" "$OUT/$name-source.csv" >"$OUT/$name-stalls.txt"
    rm -f "$OUT/$name.ncu-rep"  # the pages above hold what is read; the report is tens of MB
    { echo "$kernel $rest"
      grep -E "^ +(Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Executed Ipc Active) " \
        "$OUT/$name-details.txt" | head -n 5
      head -n 14 "$OUT/$name-stalls.txt"; } | sed "s/^/$name: /" >>"$OUT/summary.txt"
  done
done
