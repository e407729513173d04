"""Where a kernel's warps wait, per SASS instruction, from an ncu source page.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SOURCE.csv
    python3 bench/ncu_stalls.py SOURCE.csv [--top N]

Prints the stall reasons' shares over all samples, then the N instructions with the most samples
(address, SASS, the three largest reasons), so a profile answers "which barrier or load do the
consumers wait at" without the ncu GUI.
"""
import argparse
import collections
import csv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source_csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    with open(args.source_csv, newline="") as f:
        rows = list(csv.reader(f))
    # ncu writes a title line above the header.
    head_at = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    header, data = rows[head_at], rows[head_at + 1:]
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = "Warp Stall Sampling (All Samples)"
    totals = collections.Counter()
    per = []
    for r in data:
        if len(r) < len(header):
            continue
        counts = {k: int(r[col[k]] or 0) for k in reasons}
        totals.update(counts)
        per.append((int(r[col[samples]] or 0), r[col["Address"]], r[col["Source"]].strip(), counts))
    total = sum(totals.values()) or 1
    print(f"samples: {total}")
    for k, v in totals.most_common(12):
        print(f"  {k[len('stall_'):]:26s} {100 * v / total:5.1f}%")
    print(f"top {args.top} instructions:")
    for s, addr, src, counts in sorted(per, key=lambda x: -x[0])[:args.top]:
        top = " ".join(f"{k[len('stall_'):]}={v}" for k, v in sorted(counts.items(), key=lambda x: -x[1])[:3] if v)
        print(f"  {100 * s / total:5.1f}% {addr:>8s} {src[:72]:72s} {top}")


if __name__ == "__main__":
    main()
