#!/usr/bin/env python3
"""tileattn's CPU flash attention against PyTorch's CPU scaled_dot_product_attention.

usage: python3 bench/cpu_vs_torch.py OUTDIR [--threads N] [--cli PATH] [--commit SHA] [--budget SECONDS]
                                     [--rounds R] [--layout bshd|bhsd]

Forward and backward, fp32 and bf16, seqlen 1k to 8k, head dims 64 and 128 at model width 1024
(heads = 1024 / hdim), batch 1; non-causal first, then causal while the time budget lasts. Both
sides use the same thread count: ours through `tileattn bench --json --threads N` (which also checks
its results against the fp64 reference), PyTorch through torch.set_num_threads(N) with its CPU flash
kernel forced. Both read q, k, v (and write the gradients) in one layout: bshd, [batch, seqlen,
heads, d] as tileattn's API and FlashAttention take them (PyTorch gets the [batch, heads, seqlen,
d] view of that memory), or bhsd, PyTorch's own contiguous layout. Writes
OUTDIR/<date>-cpu-fwd-bwd-<layout>.json in the DESIGN.md record format and prints our
speedup over PyTorch per row. On a shared host, --rounds R runs the whole grid R times, ours and
PyTorch's taking turns, and keeps each row's fastest time.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH = 1024
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CLI_DTYPES = {"fp32": "f32", "bf16": "bf16"}


def fwd_flops(batch, heads, seqlen, hdim, causal):
    f = 4.0 * batch * heads * seqlen * seqlen * hdim
    return f / 2 if causal else f


def repeats(flops):
    return 3 if flops > 2e10 else 5


def median_ms(fn, n):
    fn()  # warm-up
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def row(grid, impl, layout, dtype, batch, seqlen, heads, hdim, causal, ms, flops):
    return {"grid": grid, "impl": impl, "dtype": dtype, "batch": batch, "seqlen_q": seqlen,
            "seqlen_k": seqlen, "heads_q": heads, "heads_kv": heads, "hdim": hdim, "causal": causal,
            "page_size": None, "ms": ms, "tflops": flops / ms / 1e9, "tbps": None, "layout": layout}


def torch_tensor(layout, batch, heads, seqlen, hdim, dtype):
    """A [batch, heads, seqlen, hdim] tensor whose memory is laid out as `layout`."""
    if layout == "bhsd":
        return torch.randn(batch, heads, seqlen, hdim, dtype=dtype)
    return torch.randn(batch, seqlen, heads, hdim, dtype=dtype).transpose(1, 2)


def torch_rows(layout, dtype, batch, heads, hdim, seqlens, causal):
    out = []
    for s in seqlens:
        ff = fwd_flops(batch, heads, s, hdim, causal)
        n = repeats(ff)
        q, k, v, do = (torch_tensor(layout, batch, heads, s, hdim, TORCH_DTYPES[dtype]) for _ in range(4))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            with torch.no_grad():
                ms = median_ms(lambda: sdpa(q, k, v, is_causal=causal), n)
            out.append(row("cpu-fwd", "torch-cpu", layout, dtype, batch, s, heads, hdim, causal, ms, ff))
            for t in (q, k, v):
                t.requires_grad_(True)
            o = sdpa(q, k, v, is_causal=causal)
            ms = median_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), n)
            out.append(row("cpu-bwd", "torch-cpu", layout, dtype, batch, s, heads, hdim, causal, ms, 2.5 * ff))
    return out


def tileattn_rows(cli, threads, layout, dtype, batch, heads, hdim, seqlens, causal):
    cmd = [cli, "bench", "--json", "--bwd", "--no-standard", "--backend", "cpu_flash", "--layout", layout,
           "--threads", str(threads), "--dtype", CLI_DTYPES[dtype], "--batch", str(batch),
           "--heads", str(heads), "--hdim", str(hdim), "--seqlens", ",".join(map(str, seqlens))]
    if causal:
        cmd.append("--causal")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"cpu_vs_torch: {' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}{res.stdout}")
    return json.loads(res.stdout)["rows"]


def ceilings(cli, threads):
    """TFLOP/s of a square matrix product in PyTorch, fp32 and bf16, on the current thread count:
    2048^3, or 512^3 where one of those takes over 50 ms (no native bf16: seconds for 2048^3); and
    the CPU's fp32 multiply-add peak on the same threads (`tileattn peak`)."""
    out = {}
    for name, dtype in (("matmul_fp32_tflops", torch.float32), ("matmul_bf16_tflops", torch.bfloat16)):
        a, b = torch.randn(512, 512, dtype=dtype), torch.randn(512, 512, dtype=dtype)
        t0 = time.perf_counter()
        torch.mm(a, b)
        ms = (time.perf_counter() - t0) * 1e3
        n = 512
        if ms <= 50:
            n = 2048
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            ms = median_ms(lambda: torch.mm(a, b), 5)
        out[name] = float(f"{2.0 * n ** 3 / ms / 1e9:.4g}")
    res = subprocess.run([cli, "peak", "--threads", str(threads), "--json"], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"cpu_vs_torch: {cli} peak failed ({res.returncode}):\n{res.stderr}")
    out["fma_fp32_tflops"] = json.loads(res.stdout)["fma_fp32_tflops"]
    return out


def threads_per_core():
    """Hardware threads sharing cpu0's core (2 with SMT), or None where Linux does not say."""
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
            count = 0
            for part in f.read().strip().split(","):
                lo, _, hi = part.partition("-")
                count += int(hi or lo) - int(lo) + 1
            return count
    except (OSError, ValueError):
        return None


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def git_commit():
    res = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    return res.stdout.strip() if res.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--cli", default=os.path.join(REPO, "build", "tileattn"))
    ap.add_argument("--seqlens", default="1024,2048,4096,8192")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--commit", default=None, help="the record's commit (default: git rev-parse HEAD)")
    ap.add_argument("--budget", type=float, default=230.0,
                    help="seconds per round; causal configurations run only while they fit")
    ap.add_argument("--rounds", type=int, default=1, help="runs of the whole grid; each row keeps its fastest")
    ap.add_argument("--layout", choices=("bshd", "bhsd"), default="bshd",
                    help="memory layout of q, k, v and the gradients, the same on both sides")
    args = ap.parse_args()
    seqlens = [int(x) for x in args.seqlens.split(",")]
    hdims = [int(x) for x in args.hdims.split(",")]
    dtypes = args.dtypes.split(",")
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    fastest = {}
    for _ in range(args.rounds):
        round_start, noncausal_s = time.perf_counter(), {}
        for causal in (False, True):
            for dtype in dtypes:
                for hdim in hdims:
                    if causal:  # a causal run costs about half its non-causal one
                        left = args.budget - (time.perf_counter() - round_start)
                        if noncausal_s[(dtype, hdim)] / 2 > left:
                            print(f"skipping causal {dtype} hdim {hdim}: over the time budget", file=sys.stderr)
                            continue
                    t0 = time.perf_counter()
                    heads = WIDTH // hdim
                    for r in (tileattn_rows(args.cli, args.threads, args.layout, dtype, 1, heads, hdim, seqlens,
                                            causal) +
                              torch_rows(args.layout, dtype, 1, heads, hdim, seqlens, causal)):
                        k = (r["grid"], r["impl"], r["dtype"], r["hdim"], r["causal"], r["seqlen_q"])
                        if k not in fastest or r["ms"] < fastest[k]["ms"]:
                            fastest[k] = r
                    noncausal_s.setdefault((dtype, hdim), time.perf_counter() - t0)
    rows = list(fastest.values())

    date = datetime.date.today().isoformat()
    record = {"device": cpu_name(), "date": date, "commit": args.commit or git_commit(), "ceilings": ceilings(args.cli, args.threads),
              "threads": args.threads, "threads_per_core": threads_per_core(), "torch": torch.__version__,
              "rounds": args.rounds, "layout": args.layout, "rows": rows}
    os.makedirs(args.outdir, exist_ok=True)
    path = os.path.join(args.outdir, f"{date}-cpu-fwd-bwd-{args.layout}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")

    key = lambda r: (r["grid"], r["dtype"], r["hdim"], r["causal"], r["seqlen_q"])
    torch_ms = {key(r): r["ms"] for r in rows if r["impl"] == "torch-cpu"}
    print(f"{record['device']}, {args.threads} threads ({record['threads_per_core']} per core), "
          f"torch {torch.__version__}; {args.layout}, batch 1, width {WIDTH}; ceilings {record['ceilings']}")
    print(f"{'pass':4} {'dtype':5} {'hdim':>4} {'causal':6} {'seqlen':>6} | {'tileattn ms':>11} "
          f"{'torch ms':>9} | speedup")
    order = lambda r: (r["causal"], r["dtype"], r["hdim"], r["seqlen_q"], r["grid"] != "cpu-fwd")
    speedups = {"cpu-fwd": [], "cpu-bwd": []}
    for r in sorted((r for r in rows if r["impl"] == "tileattn"), key=order):
        t = torch_ms[key(r)]
        speedups[r["grid"]].append(t / r["ms"])
        print(f"{r['grid'][4:]:4} {r['dtype']:5} {r['hdim']:4} {str(r['causal']):6} {r['seqlen_q']:6} | "
              f"{r['ms']:11.2f} {t:9.2f} | {t / r['ms']:.2f}x")
    for grid, s in speedups.items():
        print(f"{grid[4:]} speedup over torch: min {min(s):.2f}x, geomean {statistics.geometric_mean(s):.2f}x")
    print(f"wrote {path} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
