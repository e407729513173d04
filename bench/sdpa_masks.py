#!/usr/bin/env python3
"""SDPA with a packed-documents attn_mask: tileattn.scaled_dot_product_attention against PyTorch's SDPA
on the same boolean mask, forward and backward.

usage: python3 bench/sdpa_masks.py OUT.json [--tokens 16384] [--seqlens 4096,8192] [--hdims 64,128]
           [--width 2048] [--iters 20] [--commit SHA]

Per row: bf16, batch = tokens / seqlen, heads = width / hdim, q, k, v contiguous [batch, heads, seq,
d] (as SDPA callers hold them); the mask [batch, 1, seq, seq] is block-diagonal over documents of
random lengths (mean seqlen / 8), causal within each ("documents-causal") or not
("documents-bidirectional"). Impls: tileattn (scaled_dot_product_attention with the mask, which it
finds to be packed documents and runs as a variable-length batch, the packing copies included),
tileattn-block-sparse (tileattn.flex_attention with the same mask as its dense element mask: the
path such masks took before), tileattn-varlen (flash_attn_varlen_func on the documents, the inputs
already packed), torch-sdpa (PyTorch's own choice of backend for the masked call) and
torch-sdpa-efficient / torch-sdpa-cudnn (those backends forced; a backend that refuses the call
leaves an error in its row). tflops counts the visible elements' FLOPs (4 d per visible (i, j) pair
forward, 2.5x that backward). A backward is timed as torch.autograd.grad of the impl's own forward.
"""
import argparse
import datetime
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileattn
from block_sparse import timer
from record_commit import record_commit


def documents(batch, seqlen, gen):
    """[batch, seqlen] document ids of random lengths (mean seqlen / 8)."""
    return (torch.rand(batch, seqlen, generator=gen) < 8 / seqlen).cumsum(-1).to(torch.int32)


def forced(backend):
    def call(q, k, v, mask):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--seqlens", default="4096,8192")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    run = timer("cuda")
    gen = torch.Generator().manual_seed(0)
    rows = []
    record = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "commit": args.commit or record_commit(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "rows": rows}
    for hdim in (int(x) for x in args.hdims.split(",")):
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            batch, heads = args.tokens // seqlen, args.width // hdim
            ids = documents(batch, seqlen, gen).cuda()
            q, k, v = (torch.randn(batch, heads, seqlen, hdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)
            same = ids[:, :, None] == ids[:, None, :]
            i = torch.arange(seqlen, device="cuda")
            change = torch.ones_like(ids, dtype=torch.bool)
            change[:, 1:] = ids[:, 1:] != ids[:, :-1]
            starts = change.reshape(-1).nonzero().reshape(-1)
            cu = torch.cat([starts, starts.new_tensor([batch * seqlen])]).to(torch.int32)
            longest = int((cu[1:] - cu[:-1]).max())
            packed = [x.detach().transpose(1, 2).reshape(batch * seqlen, heads, hdim).contiguous().requires_grad_()
                      for x in (q, k, v)]
            for pattern in ("documents-causal", "documents-bidirectional"):
                causal = pattern == "documents-causal"
                mask = (same & (i[:, None] >= i[None, :]) if causal else same)[:, None]
                visible = int(mask.sum())
                impls = {
                    "tileattn": lambda q, k, v: tileattn.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                    "tileattn-block-sparse": lambda q, k, v: tileattn.flex_attention(q, k, v, mask=mask),
                    "tileattn-varlen": lambda q, k, v: tileattn.flash_attn_varlen_func(
                        *packed, cu, cu, longest, longest, causal=causal),
                    "torch-sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                    "torch-sdpa-efficient": lambda q, k, v, f=forced(SDPBackend.EFFICIENT_ATTENTION): f(q, k, v, mask),
                    "torch-sdpa-cudnn": lambda q, k, v, f=forced(SDPBackend.CUDNN_ATTENTION): f(q, k, v, mask),
                }
                for impl, fn in impls.items():
                    grads_of = tuple(packed) if impl == "tileattn-varlen" else (q, k, v)
                    for pas in ("fwd", "bwd"):
                        row = dict(grid="sdpa_mask", impl=impl, pattern=pattern, **{"pass": pas}, dtype="bf16",
                                   batch=batch, seqlen_q=seqlen, seqlen_k=seqlen, heads_q=heads, heads_kv=heads,
                                   hdim=hdim, causal=causal, visible_fraction=visible / (batch * seqlen * seqlen))
                        try:
                            if pas == "fwd":
                                with torch.no_grad():
                                    ms, more = run(lambda: fn(q, k, v), args.iters)
                            else:
                                out = fn(q, k, v)
                                g = dout if out.dim() == 4 else dout.transpose(1, 2).reshape(out.shape)
                                ms, more = run(lambda: torch.autograd.grad(out, grads_of, g, retain_graph=True),
                                               args.iters)
                                del out
                        except Exception as e:  # a backend that refuses the call: recorded, not fatal
                            rows.append(dict(row, ms=None, tflops=None, error=f"{type(e).__name__}: {str(e)[:200]}"))
                            print(f"{impl} {pattern} {pas}: {rows[-1]['error']}", file=sys.stderr)
                            continue
                        flops = 4.0 * heads * hdim * visible * (2.5 if pas == "bwd" else 1.0)
                        rows.append(dict(row, ms=ms, tflops=flops / ms / 1e9, **more))
                        print(f"{impl:22s} {pattern:24s} {pas} hdim={hdim} s={seqlen}: {ms:8.3f} ms", file=sys.stderr)
                with open(args.out, "w") as f:
                    json.dump(record, f, indent=1)
    # tileattn's time against each other impl per (hdim, seqlen, pattern, pass): > 1 means faster.
    by = {}
    for r in rows:
        if r["ms"] is not None:
            by.setdefault((r["hdim"], r["seqlen_q"], r["pattern"], r["pass"]), {})[r["impl"]] = r["ms"]
    names = ["tileattn-block-sparse", "tileattn-varlen", "torch-sdpa", "torch-sdpa-efficient", "torch-sdpa-cudnn"]
    print(f"{'hdim':>4} {'seqlen':>6} {'pattern':24} {'pass':4} {'ms':>8} " + " ".join(f"{n[-10:]:>10}" for n in names))
    for key, m in by.items():
        t = m.get("tileattn")
        if t is None:
            continue
        print(f"{key[0]:4d} {key[1]:6d} {key[2]:24} {key[3]:4} {t:8.3f} "
              + " ".join(f"{m[n] / t:10.2f}" if n in m else f"{'-':>10}" for n in names))


if __name__ == "__main__":
    main()
