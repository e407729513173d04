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


def graph_replay_ms(fn, calls=10):
    """Device time of one call: `calls` calls captured in a CUDA graph, replayed back to back. On the
    short rows a Python call of SDPA takes longer than its kernel, so back-to-back events time the
    host; the graph removes that, as it does for ours (`graph_ms`)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return median_ms(g.replay, warmup=2, reps=20) / calls


def peer_rows():
    """Each peer reads the GQA cache natively (enable_gqa) where its backend takes that; a backend
    that rejects it gets K/V expanded to equal head counts (materialized before timing). Both cache
    layouts: "bhsd" ([batch, heads, kv, d], SDPA's own) and "bshd" ([batch, kv, heads, d], a
    serving engine's, passed to SDPA as transposed views)."""
    rows = []
    for batch, kv, hq, hkv in GRID:
        g = torch.Generator(device="cuda").manual_seed(0)
        bytes_kv = 2 * batch * kv * hkv * HDIM * 2  # what a GQA-aware kernel must read
        for layout in ("bhsd", "bshd"):
            if layout == "bhsd":
                q, k, v = (torch.randn(batch, h, n, HDIM, device="cuda", dtype=torch.bfloat16, generator=g)
                           for h, n in ((hq, 1), (hkv, kv), (hkv, kv)))
            else:
                q, k, v = (torch.randn(batch, n, h, HDIM, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
                           for h, n in ((hq, 1), (hkv, kv), (hkv, kv)))
            for name, backend in PEERS.items():
                ms, graph_ms, how = None, None, None
                for how in (("native GQA", "expanded K/V") if hq != hkv else ("equal heads",)):
                    try:
                        with sdpa_kernel(backend):
                            if how == "expanded K/V":
                                ke = k.repeat_interleave(hq // hkv, dim=1)
                                ve = v.repeat_interleave(hq // hkv, dim=1)
                                if layout == "bshd":
                                    ke, ve = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (ke, ve))
                                call = lambda: F.scaled_dot_product_attention(q, ke, ve)
                                ms, graph_ms = median_ms(call), graph_replay_ms(call)
                                del ke, ve
                            else:
                                call = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
                                ms, graph_ms = median_ms(call), graph_replay_ms(call)
                        break
                    except RuntimeError as e:
                        print(f"# {name} {how} unavailable for {batch}x{kv} {hq}/{hkv} {layout}: {str(e).splitlines()[0]}",
                              file=sys.stderr)
                if ms is None:
                    continue
                rows.append(dict(grid="decode", impl=name, dtype="bf16", batch=batch, seqlen_q=1, seqlen_k=kv,
                                 heads_q=hq, heads_kv=hkv, hdim=HDIM, causal=False, page_size=None, layout=layout,
                                 ms=ms, tflops=None, tbps=bytes_kv / (ms * 1e-3) / 1e12, graph_ms=graph_ms,
                                 peer_kv=how))
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
    print(f"{'batch':>5} {'kv_len':>7} {'hq/hkv':>7} {'layout':>6} | {'ours TB/s':>9} {'%copy':>6} | {'flash ms':>8} {'cudnn ms':>8}"
          f" {'ours ms':>8} {'ratio':>6} | {'page16':>7} {'page256':>7} | {'graph ms':>8} {'%copy':>6} {'ratio':>6} | {'call ms':>8}")

    def find(impl, shape, page=None, layout="bshd"):
        for r in record["rows"]:
            if ((r["impl"], r["batch"], r["seqlen_k"], r["heads_q"], r["heads_kv"], r["page_size"]) == (impl, *shape, page)
                    and r.get("layout", "bshd") == layout):
                return r
        return None

    for shape in GRID:
        batch, kv, hq, hkv = shape
        base = find("tileattn", shape)
        p16, p256 = find("tileattn", shape, 16), find("tileattn", shape, 256)
        for layout in ("bshd", "bhsd"):
            o = find("tileattn", shape, layout=layout)
            fl, cu = find("torch-flash", shape, layout=layout), find("torch-cudnn", shape, layout=layout)
            best = min([r["ms"] for r in (fl, cu) if r] or [float("nan")])
            best_graph = min([r["graph_ms"] for r in (fl, cu) if r and r.get("graph_ms")] or [float("nan")])
            fmt = lambda r: f"{r['ms']:8.4f}" if r else f"{'n/a':>8}"
            paged = (f"{p16['ms'] / base['ms']:6.3f}x {p256['ms'] / base['ms']:6.3f}x" if layout == "bshd"
                     else f"{'':>7} {'':>7}")
            print(f"{batch:>5} {kv:>7} {hq:>3}/{hkv:<3} {layout:>6} | {o['tbps']:9.3f} {100 * o['tbps'] / copy:5.1f}% |"
                  f" {fmt(fl)} {fmt(cu)} {o['ms']:8.4f} {best / o['ms']:5.2f}x | {paged}"
                  f" | {o['graph_ms']:8.4f} {100 * o['tbps'] * o['ms'] / o['graph_ms'] / copy:5.1f}% {best_graph / o['graph_ms']:5.2f}x"
                  f" | {o['call_ms']:8.4f}")
    print("ratio = best peer time / our time on the same cache layout (> 1: we are faster); page columns =\n"
          "paged time / contiguous (bshd) time; every time but 'call' is the median of calls issued back to\n"
          "back (peers and ours alike); graph = our call replayed from a CUDA graph (device time without\n"
          "per-call host work), its ratio against the peers' calls replayed the same way; call = one call\n"
          "on an idle GPU, synchronized after each (host work and launch latency included); peers read the\n"
          "GQA cache natively (enable_gqa) where their backend takes it, else expanded K/V:")
    for r in peers:
        if r["heads_q"] != r["heads_kv"]:
            print(f"  {r['impl']} {r['batch']}x{r['seqlen_k']} {r['heads_q']}/{r['heads_kv']} {r['layout']}: {r['peer_kv']}")


if __name__ == "__main__":
    main()
