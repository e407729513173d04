#!/usr/bin/env python3
"""The CPU flash backward on short query sequences: many tiny varlen sequences and decode-like
seqlen_q = 1 against long keys, where a query tile holds far fewer rows than its 64 lanes; and a
control of ordinary sequences, whose tiles are full.

usage: python3 bench/cpu_short_backward.py OUT.json [--threads N] [--repeat R] [--label TEXT]

Per shape and dtype (fp32, and bf16: on a CPU with AMX its tile-unit path): the fastest of R
backward calls (ms) and the peak host memory the library held during one (scratch included), as
one record in the DESIGN.md format (grid "cpu-bwd-short"). Appends to OUT.json if it exists, so
that a before and an after run of the same commit line up in one file.
"""
import argparse
import datetime
import json
import os
import platform
import time

import numpy as np

import tileattn

SHAPES = [  # (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, hdim)
    ("varlen 1024 x 1 token", 1024, 1, 1, 8, 8, 64),
    ("varlen 256 x 1..7 tokens", 256, 7, 7, 8, 2, 64),
    ("seqlen_q 1, 4096 keys", 4, 1, 4096, 32, 8, 128),
    ("seqlen_q 4, 2048 keys", 8, 4, 2048, 16, 16, 64),
    ("2 x 1000 tokens", 2, 1000, 1000, 8, 8, 64),  # full tiles but each sequence's last: the control
]


def case(rng, name, batch, sq, sk, hq, hkv, d, dtype):
    varlen = name.startswith("varlen")
    if varlen:
        lq = rng.integers(1, sq + 1, batch) if sq > 1 else np.ones(batch, np.int64)
        lk = np.maximum(lq, rng.integers(1, sk + 1, batch))
        cu_q = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
        cu_k = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
        shape_q, shape_k = (int(cu_q[-1]), hq, d), (int(cu_k[-1]), hkv, d)
        extra = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int(lq.max()), max_seqlen_k=int(lk.max()))
    else:
        shape_q, shape_k = (batch, sq, hq, d), (batch, sk, hkv, d)
        extra = {}
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (shape_q, shape_k, shape_k))
    if dtype == "bf16":
        import ml_dtypes
        q, k, v = (x.astype(ml_dtypes.bfloat16) for x in (q, k, v))
    return q, k, v, extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    tileattn.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows = []
    for name, batch, sq, sk, hq, hkv, d in SHAPES:
        for dtype in ("f32", "bf16"):
            q, k, v, extra = case(rng, name, batch, sq, sk, hq, hkv, d, dtype)
            out, lse = tileattn.forward(q, k, v, causal=True, backend="cpu_flash", **extra)
            dout = rng.standard_normal(out.shape).astype(np.float32).astype(out.dtype)
            best = float("inf")
            for _ in range(args.repeat):
                tileattn.reset_peak_memory()
                t0 = time.perf_counter()
                tileattn.backward(dout, q, k, v, out, lse, causal=True, backend="cpu_flash", **extra)
                best = min(best, time.perf_counter() - t0)
            peak = tileattn.memory_stats().peak_bytes
            rows.append({"grid": "cpu-bwd-short", "impl": "tileattn", "label": args.label, "shape": name,
                         "dtype": dtype, "batch": batch, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq,
                         "heads_kv": hkv, "hdim": d, "causal": True, "ms": round(best * 1e3, 4),
                         "peak_host_bytes": peak, "threads": args.threads})
            print(f"{args.label:8s} {name:26s} {dtype:5s} {best * 1e3:9.3f} ms  peak {peak / 2**20:8.2f} MiB",
                  flush=True)
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.machine())
    record = {"device": model, "date": str(datetime.date.today()), "build_info": str(tileattn.build_info()),
              "rows": []}
    if os.path.exists(args.out):
        with open(args.out) as f:
            record = json.load(f)
    record["rows"].extend(rows)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
