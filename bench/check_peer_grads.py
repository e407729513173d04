#!/usr/bin/env python3
"""A peer's outputs and gradients against PyTorch's math backend in fp64, on one shape: a benchmark
row only means something where the peer computes the same thing.

usage: python3 bench/check_peer_grads.py [--peer cudnn|flash|efficient] [--hdim 192] [--hdim-v 128]
           [--seqlen 2048] [--heads 4] [--batch 1] [--dtype bf16]
Prints, for causal and not, the largest error of out, dq, dk, dv relative to the reference's largest
magnitude.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
         "efficient": SDPBackend.EFFICIENT_ATTENTION}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", default="cudnn", choices=sorted(PEERS))
    ap.add_argument("--hdim", type=int, default=192)
    ap.add_argument("--hdim-v", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    shape = (a.batch, a.heads, a.seqlen)
    for causal in (False, True):
        q, k = (torch.randn(*shape, a.hdim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        v = torch.randn(*shape, a.hdim_v, device="cuda", dtype=dtype, requires_grad=True)
        dout = torch.randn(*shape, a.hdim_v, device="cuda", dtype=dtype)
        with sdpa_kernel(PEERS[a.peer]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal)
            ref_grads = torch.autograd.grad(ref, ref_in, dout.double())
        errs = [((x.double() - r).abs().max() / r.abs().max()).item()
                for x, r in zip((out, *grads), (ref, *ref_grads))]
        print(f"{a.peer} {a.dtype} b{a.batch} h{a.heads} s{a.seqlen} d{a.hdim}/{a.hdim_v} causal={causal}: "
              + ", ".join(f"{n} {e:.2e}" for n, e in zip(("out", "dq", "dk", "dv"), errs)))


if __name__ == "__main__":
    main()
