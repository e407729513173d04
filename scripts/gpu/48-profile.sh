#!/usr/bin/env bash
# ncu profiles of kernels on benchmark rows, each with its details page, its raw metrics and the stall
# samples per SASS instruction (bench/ncu_stalls.py). TILEATTN_PROFILE="KERNEL_REGEX [bench options]
# ROW", for example "fwd_kernel_sm90 32:512:32:64:0" or "bwd_kernel_sm90 --backward 8:2048:16:128:1";
# several separated by ';' are profiled in turn (profile-1, profile-2, ...; one alone writes
# profile). Skipped when unset. Uses the build step's benchmark binary; with the build-candidate
# step's program present, each is profiled on it too (candidate-profile...). An entry whose second
# word is py:SCRIPT runs that Python script with the rest as its arguments on the python-install
# step's package (and the candidate's, where that step built one), for the kernels only Python calls
# reach: "fwd_kernel_sm90 py:bench/block_sparse_masking.py x.json --hdims 128 --cases documents:rule
# --passes fwd --no-kernel-times".
set -euo pipefail
[ -n "${TILEATTN_PROFILE:-}" ] || { echo "TILEATTN_PROFILE is unset: nothing to profile"; exit 0; }
IFS=';' read -ra entries <<<"$TILEATTN_PROFILE"
sides=(base)
[ -n "${TILEATTN_CANDIDATE:-}" ] && sides+=(candidate)
for side in "${sides[@]}"; do
  prefix=$([ "$side" = base ] && echo profile || echo candidate-profile)
  suffix=$([ "$side" = base ] && echo "" || echo "-candidate")
  for i in "${!entries[@]}"; do
    name=$([ ${#entries[@]} -eq 1 ] && echo "$prefix" || echo "$prefix-$((i + 1))")
    read -r kernel rest <<<"${entries[$i]}"
    if [[ $rest == py:* ]]; then
      rest=${rest#py:}
      launch=(env "PYTHONPATH=$BUILD/python-site$suffix" python3)
    else
      launch=("$BUILD$suffix/src/cuda/tileattn_gpu_bench" --iters 3)
    fi
    # shellcheck disable=SC2086  # the bench options and row (or script and arguments) are separate words
    (cd "$ROOT" && ncu --kernel-name "regex:$kernel" --launch-skip 2 --launch-count 1 --set full --import-source no \
      -f -o "$OUT/$name" "${launch[@]}" $rest) >"$OUT/$name.log" 2>&1
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
