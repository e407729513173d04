#!/usr/bin/env python3
"""Decode grid: tileattn (contiguous and paged caches) beside PyTorch SDPA's flash and cuDNN
backends, timed in the same run on the same GPU. Writes <outdir>/decode.json (the DESIGN.md
record format) and prints a table: bandwidth, share of the copy bandwidth, ratio to the best peer.

usage: gpu_decode.py OUTDIR --bench PATH_TO_tileattn_decode_bench [--commit SHA]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

GRID = [(1, 32768, 32, 8), (1, 131072, 32, 8), (16, 8192, 32, 8), (64, 4096, 32, 32), (1, 65536, 16, 16)]
HDIM = 128
PEERS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION}


def median_ms(fn, warmup=5, reps=40):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(start, end):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return t[reps // 2]


def peer_rows():
    """Each peer reads the GQA cache natively (enable_gqa) where its backend takes that; a backend
    that rejects it gets K/V expanded to equal head counts (materialized before timing)."""
    rows = []
    for batch, kv, hq, hkv in GRID:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(batch, hq, 1, HDIM, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(batch, hkv, kv, HDIM, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(batch, hkv, kv, HDIM, device="cuda", dtype=torch.bfloat16, generator=g)
        bytes_kv = 2 * batch * kv * hkv * HDIM * 2  # what a GQA-aware kernel must read
        for name, backend in PEERS.items():
            ms, how = None, None
            for how in (("native GQA", "expanded K/V") if hq != hkv else ("equal heads",)):
                try:
                    with sdpa_kernel(backend):
                        if how == "expanded K/V":
                            ke = k.repeat_interleave(hq // hkv, dim=1).contiguous()
                            ve = v.repeat_interleave(hq // hkv, dim=1).contiguous()
                            ms = median_ms(lambda: F.scaled_dot_product_attention(q, ke, ve))
                            del ke, ve
                        else:
                            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv))
                    break
                except RuntimeError as e:
                    print(f"# {name} {how} unavailable for {batch}x{kv} {hq}/{hkv}: {str(e).splitlines()[0]}",
                          file=sys.stderr)
            if ms is None:
                continue
            rows.append(dict(grid="decode", impl=name, dtype="bf16", batch=batch, seqlen_q=1, seqlen_k=kv,
                             heads_q=hq, heads_kv=hkv, hdim=HDIM, causal=False, page_size=None, ms=ms,
                             tflops=None, tbps=bytes_kv / (ms * 1e-3) / 1e12, peer_kv=how))
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--bench", required=True)
    ap.add_argument("--commit", default=os.environ.get("TILEATTN_COMMIT", "unknown"))
    args = ap.parse_args()
    run = subprocess.run([args.bench], check=True, capture_output=True, text=True)
    sys.stderr.write(run.stderr)  # the split-count sweep
    lines = run.stdout.splitlines()
    head = json.loads(lines[0])
    ours = [json.loads(line) for line in lines[1:]]
    peers = peer_rows()
    record = {"device": head["device"], "date": datetime.date.today().isoformat(), "commit": args.commit,
              "ceilings": {"copy_tbps": head["copy_tbps"]}, "rows": ours + peers}
    os.makedirs(args.outdir, exist_ok=True)
    with open(os.path.join(args.outdir, "decode.json"), "w") as f:
        json.dump(record, f, indent=1)

    copy = head["copy_tbps"]
    print(f"\ndecode, bf16, hdim {HDIM}, one query row; {head['device']}; copy bandwidth {copy:.2f} TB/s (read+write)")
    print(f"{'batch':>5} {'kv_len':>7} {'hq/hkv':>7} | {'ours TB/s':>9} {'%copy':>6} | {'flash ms':>8} {'cudnn ms':>8}"
          f" {'ours ms':>8} {'ratio':>6} | {'page16':>7} {'page256':>7} | {'graph ms':>8} {'%copy':>6} | {'call ms':>8}")
    for batch, kv, hq, hkv in GRID:
        def find(impl, page=None):
            for r in record["rows"]:
                if (r["impl"], r["batch"], r["seqlen_k"], r["heads_q"], r["heads_kv"], r["page_size"]) == (impl, batch, kv, hq, hkv, page):
                    return r
            return None
        o = find("tileattn")
        fl, cu = find("torch-flash"), find("torch-cudnn")
        best = min([r["ms"] for r in (fl, cu) if r] or [float("nan")])
        p16, p256 = find("tileattn", 16), find("tileattn", 256)
        fmt = lambda r: f"{r['ms']:8.4f}" if r else f"{'n/a':>8}"
        print(f"{batch:>5} {kv:>7} {hq:>3}/{hkv:<3} | {o['tbps']:9.3f} {100 * o['tbps'] / copy:5.1f}% | {fmt(fl)} {fmt(cu)}"
              f" {o['ms']:8.4f} {best / o['ms']:5.2f}x | {p16['ms'] / o['ms']:6.3f}x {p256['ms'] / o['ms']:6.3f}x"
              f" | {o['graph_ms']:8.4f} {100 * o['tbps'] * o['ms'] / o['graph_ms'] / copy:5.1f}% | {o['call_ms']:8.4f}")
    print("ratio = best peer time / our time (> 1: we are faster); page columns = paged time / contiguous time;\n"
          "every time but 'call' is the median of calls issued back to back (peers and ours alike);\n"
          "graph = our call replayed from a CUDA graph (device time without per-call host work);\n"
          "call = one call on an idle GPU, synchronized after each (host work and launch latency included);\n"
          "peers read the GQA cache natively (enable_gqa) where their backend takes it, else expanded K/V:")
    for r in peers:
        if r["heads_q"] != r["heads_kv"]:
            print(f"  {r['impl']} {r['batch']}x{r['seqlen_k']} {r['heads_q']}/{r['heads_kv']}: {r['peer_kv']}")


if __name__ == "__main__":
    main()
