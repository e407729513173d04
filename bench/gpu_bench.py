#!/usr/bin/env python3
"""The forward (or, with --backward, the backward) benchmark grid of DESIGN.md on one GPU: tileattn
(through its timing program) and PyTorch SDPA's flash and cuDNN backends, timed in the same run on
the same inputs' layout. A peer's backward is timed as torch.autograd.grad of its own forward's
output; FLOPs of the backward are 2.5x the forward's.

    gpu_bench.py --bench BUILD/src/cuda/tileattn_gpu_bench --out OUT.json --commit SHA [--quick] [--backward]

With --backward the grid also times tileattn's deterministic mode (impl "tileattn-deterministic",
its own column), the cost of bitwise-reproducible gradients.

Writes the DESIGN.md benchmark record and prints a table last: TFLOP/s of each implementation and
tileattn's time ratio to the best peer (best peer time / tileattn time: >= 1.0 means at least as fast).
"""
import argparse
import datetime
import json
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TOKENS, WIDTH = 16384, 2048
HDIMS = (64, 128, 256)
SEQLENS = (512, 2048, 8192, 16384)
SETS = 3  # input sets rotated between calls so that L2 never holds a call's inputs


def grid(quick):
    seqlens = (512, 2048) if quick else SEQLENS
    for d in HDIMS:
        for s in seqlens:
            for causal in (False, True):
                yield dict(batch=TOKENS // s, seqlen=s, heads=WIDTH // d, hdim=d, causal=causal)


def flops(r, backward):
    fwd = 4.0 * r["batch"] * r["heads"] * r["seqlen"] ** 2 * r["hdim"] * (0.5 if r["causal"] else 1.0)
    return 2.5 * fwd if backward else fwd


def time_ms(fn, iters):
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        start[i].record()
        fn(i)
        stop[i].record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(start, stop))
    return times[len(times) // 2]


def peer_rows(r, iters, backward):
    shape = (r["batch"], r["seqlen"], r["heads"], r["hdim"])  # BSHD storage, as tileattn reads it
    sets = [[torch.randn(shape, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_(backward)
             for _ in range(4)] for _ in range(SETS)]
    out = []
    for impl, backend in (("torch-flash", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)):
        outs = []
        if backward:
            with sdpa_kernel(backend):
                try:
                    outs = [F.scaled_dot_product_attention(q, k, v, is_causal=r["causal"]) for q, k, v, _ in sets]
                except RuntimeError as e:
                    print(f"{impl} failed on {r}: {e}", file=sys.stderr)
                    continue

        def call(i):
            q, k, v, do = sets[i % SETS]
            if backward:
                torch.autograd.grad(outs[i % SETS], (q, k, v), do, retain_graph=True)
                return
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=r["causal"])
        try:
            ms = time_ms(call, iters)
        except RuntimeError as e:  # a backend that refuses the shape
            print(f"{impl} failed on {r}: {e}", file=sys.stderr)
            continue
        out.append(record(r, impl, ms, backward))
        del outs
    del sets
    torch.cuda.empty_cache()
    return out


def record(r, impl, ms, backward):
    return {"grid": "bwd" if backward else "fwd", "impl": impl, "dtype": "bf16", "batch": r["batch"],
            "seqlen_q": r["seqlen"], "seqlen_k": r["seqlen"], "heads_q": r["heads"], "heads_kv": r["heads"],
            "hdim": r["hdim"], "causal": r["causal"], "page_size": None, "ms": round(ms, 5),
            "tflops": round(flops(r, backward) / (ms * 1e-3) / 1e12, 2), "tbps": None}


def ceilings():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda i: a @ b, 20)
    x = torch.empty(1 << 28, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    copy_ms = time_ms(lambda i: y.copy_(x), 20)
    return {"matmul_bf16_tflops": round(2 * 8192 ** 3 / (ms * 1e-3) / 1e12, 1),
            "copy_tbps": round(2 * x.numel() * 4 / (copy_ms * 1e-3) / 1e12, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of the tileattn_gpu_bench program")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="seqlen 512 and 2048 only")
    ap.add_argument("--backward", action="store_true", help="the backward grid")
    args = ap.parse_args()

    rows = list(grid(args.quick))
    specs = [f"{r['batch']}:{r['seqlen']}:{r['heads']}:{r['hdim']}:{int(r['causal'])}" for r in rows]
    # Ours and the peers row by row, each row's implementations one after the other, so that all of
    # them meet the GPU in the same state (clocks, temperature) rather than ours first for the grid.
    modes = [["--backward"], ["--backward", "--deterministic"]] if args.backward else [[]]
    records = []
    for r, spec in zip(rows, specs):
        for mode in modes:
            ours = subprocess.run([args.bench, "--iters", str(args.iters)] + mode + [spec], check=True,
                                  capture_output=True, text=True)
            records += [json.loads(line) for line in ours.stdout.splitlines() if line.startswith("{")]
        records += peer_rows(r, args.iters, args.backward)

    doc = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": args.commit,
           "ceilings": ceilings(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "rows": records}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)

    key = lambda x: (x["hdim"], x["seqlen_q"], x["causal"])
    by = {}
    for x in records:
        by.setdefault(key(x), {})[x["impl"]] = x
    print(f"\n{doc['device']}  torch {doc['torch']}  cudnn {doc['cudnn']}  ceilings {doc['ceilings']}")
    if args.backward:
        print("backward: extra device memory per call = workspace_bytes in the JSON (D and the fp32 dQ rows)")
    else:
        print("extra device memory per call: workspace 0 B, lse only (lse_bytes per row in the JSON)")
    det = " determ." if args.backward else ""
    print(f"{'hdim':>4} {'seqlen':>6} {'causal':>6} | {'tileattn':>8} {'flash':>8} {'cudnn':>8}{det} | TFLOP/s | "
          f"{'vs flash':>8} {'vs best':>8}")
    for k in sorted(by):
        row = by[k]
        t = row.get("tileattn", {}).get("ms")
        fl = row.get("torch-flash", {}).get("ms")
        cu = row.get("torch-cudnn", {}).get("ms")
        tf = lambda impl: f"{row[impl]['tflops']:8.1f}" if impl in row else f"{'-':>8}"
        best = min([m for m in (fl, cu) if m], default=None)
        vs_flash = f"{fl / t:8.3f}" if t and fl else f"{'-':>8}"
        vs_best = f"{best / t:8.3f}" if t and best else f"{'-':>8}"
        det = " " + tf("tileattn-deterministic") if args.backward else ""
        print(f"{k[0]:>4} {k[1]:>6} {str(k[2]):>6} | {tf('tileattn')} {tf('torch-flash')} {tf('torch-cudnn')}{det} |"
              f"         | {vs_flash} {vs_best}")


if __name__ == "__main__":
    main()
