#!/usr/bin/env python3
"""Where a block-sparse call's time goes: tileattn.flex_attention on the block_sparse grid's documents
and window BlockMasks with their element mask, with parts of it left out, and with every partial block
listed as full (no element mask at all), beside random blocks; forward and backward.

usage: python3 bench/block_sparse_masking.py OUT.json [--device cuda|cpu] [--dtype bf16] [--tokens 16384]
           [--width 2048] [--hdims 64,128] [--seqlen 8192] [--block 128] [--window 1024] [--iters N]
           [--commit SHA] [--build NAME] [--run N] [--cases NAME,...] [--passes fwd,bwd] [--no-kernel-times]
       python3 bench/block_sparse_masking.py --merge OUT.json RECORD.json...

--cases (names as below, spaces optional: documents:rule) and --passes run a part, and
--no-kernel-times leaves out the profiler's kernel times: for an ncu profile of one case
(scripts/gpu/48-profile.sh's py: form). --build and --run tag the rows (which package ran them, in which of several processes), for an A/B
of two builds run alternately; --merge joins such records into one and prints, per case and pass,
the candidate build's time over the base's (the faster run of each side), or each row's time where
there is one build.

Shapes and patterns as bench/block_sparse.py builds them (batch = tokens / seqlen, heads = width /
hdim). Cases, each a row per pass with its `case`:
  documents: rule    causal and the document ids (the grid's documents row);
  documents: causal  causal alone (the ids' element test left out: not the same attention);
  documents: ids     the ids alone;
  documents: none    no element mask in the partial blocks;
  documents: full    every visited block listed as fully visible;
  window: rule / none / full   the same for the causal sliding window;
  random             random blocks at density 0.1, all fully visible.
The differences between a pattern's rows are what its element mask costs, and what its partial
blocks cost beyond full ones. ms: CUDA events (wall clock on a CPU); kernel_ms: the kernels' own time
(GPU only), as bench/block_sparse.py records them.
"""
import argparse
import datetime
import json
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask

import block_sparse as grid
import tileattn
from tileattn._implied_masks import cells
from record_commit import record_commit


def listed_full(bm, block, seqlen, batch, heads):
    """The BlockMask that lists every block bm visits (partly or fully) as fully visible."""
    nb = -(-seqlen // block)
    lists = (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices)
    table = (cells(lists, nb, nb) > 0).expand(batch, heads, nb, nb).contiguous()
    return grid.from_table(table, block, seqlen, None)


def cases(batch, heads, seqlen, block, window, device, gen):
    """(case, BlockMask, flex_attention keywords) per row."""
    ids = grid.documents(batch, seqlen, gen).to(device)
    docs = create_block_mask(lambda b, h, q, k: (ids[b, q] == ids[b, k]) & (q >= k), batch, 1, seqlen, seqlen,
                             device=device, BLOCK_SIZE=block)
    win = create_block_mask(lambda b, h, q, k: (q >= k) & (q - k < window), 1, 1, seqlen, seqlen, device=device,
                            BLOCK_SIZE=block)
    nb = -(-seqlen // block)
    rnd = (torch.rand(batch, heads, nb, nb, generator=gen) < 0.1).to(device)
    yield "documents: rule", docs, dict(causal=True, document_ids=ids)
    yield "documents: causal", docs, dict(causal=True)
    yield "documents: ids", docs, dict(document_ids=ids)
    yield "documents: none", docs, dict()
    yield "documents: full", listed_full(docs, block, seqlen, batch, heads), dict()
    yield "window: rule", win, dict(causal=True, window_size=(window - 1, 0))
    yield "window: none", win, dict()
    yield "window: full", listed_full(win, block, seqlen, batch, heads), dict()
    yield "random", grid.from_table(rnd, block, seqlen, None), dict()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(grid.DTYPES))
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=None, help="timed calls per row (default: 20 on a GPU, 3 on a CPU)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--build", default=None, help="the rows' build tag (an A/B's base or candidate)")
    ap.add_argument("--run", type=int, default=None, help="the rows' run number (an A/B's process)")
    ap.add_argument("--cases", default=None, help="comma list of case names (spaces optional)")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--no-kernel-times", action="store_true", help="no torch.profiler (under ncu)")
    a = ap.parse_args()
    tags = {k: v for k, v in (("build", a.build), ("run", a.run)) if v is not None}
    wanted = None if a.cases is None else {c.replace(" ", "") for c in a.cases.split(",")}
    passes = a.passes.split(",")
    device, dtype, seqlen = a.device, grid.DTYPES[a.dtype], a.seqlen
    iters = a.iters or (20 if device == "cuda" else 3)
    run = grid.timer(device, kernel_times=not a.no_kernel_times)
    gen = torch.Generator().manual_seed(0)
    rows = []
    record = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "date": datetime.date.today().isoformat(), "commit": a.commit or record_commit(),
              "torch": torch.__version__, "rows": rows}
    for hdim in (int(x) for x in a.hdims.split(",")):
        batch, heads = max(1, a.tokens // seqlen), a.width // hdim
        q, k, v = (torch.randn(batch, seqlen, heads, hdim, device=device, dtype=dtype).transpose(1, 2).requires_grad_()
                   for _ in range(3))
        dout = torch.randn_like(q)
        qd, kd, vd = (x.detach() for x in (q, k, v))
        for case, bm, kw in cases(batch, heads, seqlen, a.block, a.window, device, gen):
            if wanted is not None and case.replace(" ", "") not in wanted:
                continue
            shape = {"dtype": a.dtype, "batch": batch, "seqlen_q": seqlen, "seqlen_k": seqlen, "heads_q": heads,
                     "heads_kv": heads, "hdim": hdim, "block_size": a.block}
            out = tileattn.flex_attention(q, k, v, block_mask=bm, **kw)
            for pas, fn in (("fwd", lambda: tileattn.flex_attention(qd, kd, vd, block_mask=bm, **kw)),
                            ("bwd", lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))):
                if pas not in passes:
                    continue
                ms, more = run(fn, iters)
                rows.append(dict(grid="block_sparse_masking", impl="tileattn", case=case, **{"pass": pas}, **shape,
                                 density=round(grid.density_of(bm), 4), ms=ms, **more, **tags))
                kern = f" (kernels {more['kernel_ms']:.3f})" if more["kernel_ms"] is not None else ""
                print(f"hdim {hdim:3d} {case:20s} {pas}: {ms:8.3f} ms{kern}", file=sys.stderr)
            del out
    with open(a.out, "w") as f:
        json.dump(record, f, indent=1)


def merge(out, paths):
    """Joins the records at paths into out (the first one's header) and prints the comparison."""
    records = [json.load(open(p)) for p in paths]
    record = dict(records[0], rows=[r for rec in records for r in rec["rows"]])
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    best = {}
    for r in record["rows"]:
        key = (r["hdim"], r["case"], r["pass"], r.get("build", "base"))
        t = r["kernel_ms"] if r.get("kernel_ms") is not None else r["ms"]
        best[key] = min(best.get(key, t), t)
    for (hdim, case, pas, build), t in best.items():
        if build != "base":
            continue
        cand = best.get((hdim, case, pas, "candidate"))
        ratio = f", candidate {cand:.3f} ms: {cand / t:.3f}" if cand is not None else ""
        print(f"hdim {hdim} {case} {pas}: base {t:.3f} ms{ratio}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--merge":
        merge(sys.argv[2], sys.argv[3:])
    else:
        main()
