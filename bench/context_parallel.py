#!/usr/bin/env python3
"""Context-parallel grid: tileattn.distributed.ring_attention (zigzag, causal) on 1, 2, 4... GPUs of
one machine against one GPU's local call at the same sequence length, with PyTorch's experimental
context_parallel on SDPA as a peer in the same run. Writes DESIGN.md's record with rows
{"grid": "context_parallel", "gpus": P, "seqlen": N, "pass": "fwd" | "fwd+bwd", "ms": ...,
"efficiency": t1(N) / (P * tP(N))}, t1 being the same implementation's one-GPU time (extrapolated as
N^2 from the longest sequence that fit one GPU where N did not; the row then names that length).

    torchrun --nproc-per-node 4 bench/context_parallel.py --out RECORD.json [--seqlens 131072,262144,524288]
        [--gpus 1,2,4] [--reps 3] [--no-peer] [--peer-rotate allgather|alltoall] [--all-gather] [--commit SHA]
    torchrun --nproc-per-node 2 bench/context_parallel.py --smoke    # CPU, gloo, tiny sizes: the path only

Every group of P ranks is ranks 0..P-1; the other ranks wait. The peer runs on the whole world (a
DeviceMesh of every rank) and on one GPU (plain SDPA). Times are host wall times of whole passes
(tens of milliseconds to seconds at these lengths), the median over --reps after one warm-up, the
slowest rank's. On H100s the default grid takes about 5 minutes on 4 GPUs (one GPU's 512k
forward+backward alone is some 15 s a pass, for ours and for the peer).
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tileattn
from tileattn import distributed as cp
from record_commit import record_commit

HEADS_Q, HEADS_KV, HDIM = 32, 8, 128


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="where to write the JSON record (rank 0)")
    ap.add_argument("--seqlens", default="131072,262144,524288")
    ap.add_argument("--gpus", help="group sizes to time (default: 1, 2, 4, ... up to the world size)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip PyTorch's context_parallel")
    ap.add_argument("--peer-rotate", choices=("allgather", "alltoall"), default="allgather",
                    help="how PyTorch's context_parallel passes K/V shards (its default: allgather)")
    ap.add_argument("--all-gather", action="store_true", help="also time all_gather_attention (impl "
                    "tileattn-allgather) on more than one GPU")
    ap.add_argument("--sm-margins", default="0", help="comma-separated sm_margin values the ring's forward calls are "
                    "timed with on several GPUs (SMs the attention kernel leaves to the transfers; rows carry "
                    "sm_margin)")
    ap.add_argument("--commit", help="the commit the record names (default: bench/record_commit.py's)")
    ap.add_argument("--smoke", action="store_true", help="CPU tensors over gloo, tiny sizes, fp32")
    return ap.parse_args()


class Setup:
    def __init__(self, smoke):
        self.smoke = smoke
        self.cuda = torch.cuda.is_available() and not smoke
        dist.init_process_group("nccl" if self.cuda else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", self.rank)))
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(1)
            tileattn.set_num_threads(1)
        self.dtype = torch.float32 if smoke else torch.bfloat16
        self.heads_q, self.heads_kv, self.hdim = (4, 2, 16) if smoke else (HEADS_Q, HEADS_KV, HDIM)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def inputs(self, n, heads_kv=None):
        """q, k, v, dout of the whole sequence [1, n, heads, d], alike on every rank (same seed)."""
        g = torch.Generator(device=self.device).manual_seed(n)
        hk = heads_kv or self.heads_kv
        return [torch.randn(1, n, h, self.hdim, generator=g, device=self.device, dtype=self.dtype)
                for h in (self.heads_q, hk, hk, self.heads_q)]


def timed(setup, group, fn, reps):
    """The slowest rank's median wall time (ms) of fn over reps runs after a warm-up; every rank of
    group calls it. None (on every rank) when any rank ran out of memory."""
    times, failed = [], 0.0
    try:
        fn()
        setup.sync()
        for _ in range(reps):
            dist.barrier(group)
            t0 = time.perf_counter()
            fn()
            setup.sync()
            times.append(1e3 * (time.perf_counter() - t0))
    except torch.OutOfMemoryError as e:
        print(f"# rank {setup.rank}: out of memory: {str(e).splitlines()[0]}", file=sys.stderr)
        failed = 1.0
        if setup.cuda:
            torch.cuda.empty_cache()
    ms = torch.tensor([sorted(times)[len(times) // 2] if times else 0.0, failed], dtype=torch.float64)
    ms = ms.to(setup.device)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=group)
    return None if ms[1] > 0 else float(ms[0])


def passes(call, q, k, v, dout):
    """{"fwd": ..., "fwd+bwd": ...} callables for call(q, k, v) -> out."""
    def fwd():
        with torch.no_grad():
            call(q, k, v)

    def fwd_bwd():
        for x in (q, k, v):
            x.grad = None
        call(q, k, v).backward(dout)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def ours(setup, group, p, n, reps, variant="ring", sm_margin=0):
    """tileattn on p ranks: the local call on one, ring_attention or all_gather_attention (zigzag) on
    more."""
    if setup.rank >= p:
        return {}
    q, k, v, dout = setup.inputs(n)
    if p == 1:
        def call(q, k, v):
            return tileattn.flash_attn_func(q, k, v, causal=True)
    else:
        q, k, v, dout = (cp.shard(x, setup.rank, p, layout="zigzag") for x in (q, k, v, dout))

        attention = cp.ring_attention if variant == "ring" else cp.all_gather_attention

        def call(q, k, v):
            return attention(q, k, v, group, causal=True, layout="zigzag", sm_margin=sm_margin)
    q, k, v = (x.contiguous().requires_grad_() for x in (q, k, v))
    out = {name: timed(setup, group, fn, reps) for name, fn in passes(call, q, k, v, dout.contiguous()).items()}
    return out


def peer(setup, group, p, n, reps):
    """PyTorch's context_parallel over SDPA (flash, else cuDNN) on the whole world, or plain SDPA on
    one GPU. K/V go in with their 8 heads (enable_gqa) where SDPA takes that, else repeated to 32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if setup.rank >= p:
        return {}, None
    q, k, v, dout = (x.transpose(1, 2) for x in setup.inputs(n))  # SDPA's [batch, heads, seq, d]
    errors = []
    for backend, impl in ((SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.CUDNN_ATTENTION, "cudnn")):
        for gqa in (True, False):
            kk, vv = (k, v) if gqa else (x.repeat_interleave(setup.heads_q // setup.heads_kv, 1) for x in (k, v))
            try:
                with sdpa_kernel(backend):
                    res = _peer_passes(setup, group, p, reps, q, kk, vv, dout, gqa)
                return res, f"torch-{'cp-' if p > 1 else ''}{impl}" + ("" if gqa else "-kv-repeated")
            except (RuntimeError, NotImplementedError, AssertionError) as e:
                errors.append(f"{impl}{'' if gqa else ' (K/V repeated)'}: {str(e).splitlines()[0][:200]}")
    if setup.rank == 0:
        print(f"# peer unavailable at {p} ranks, {n} tokens: " + "; ".join(errors), file=sys.stderr)
    return {}, None


def _peer_passes(setup, group, p, reps, q, k, v, dout, gqa):
    kw = dict(is_causal=True, enable_gqa=gqa and setup.heads_q != k.shape[1])
    if p == 1:
        q, k, v = (x.contiguous().requires_grad_() for x in (q, k, v))
        fns = passes(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v, dout.contiguous())
        return {name: timed(setup, group, fn, reps) for name, fn in fns.items()}
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    set_rotate_method(setup.peer_rotate)
    mesh = init_device_mesh(setup.device.type, (p,))
    q, k, v, dout = (x.contiguous() for x in (q, k, v, dout))
    bufs = [q, k, v, dout]
    # The buffers are sharded in place (head-tail load balancing for causal) and not restored.
    with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4, no_restore_buffers=set(bufs)):
        for x in (q, k, v):
            x.requires_grad_()
        fns = passes(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v, dout)
        return {name: timed(setup, None, fn, reps) for name, fn in fns.items()}


def flops(n, fwd_bwd, setup):
    f = 4 * setup.heads_q * n * n * setup.hdim / 2  # causal
    return f * 3.5 if fwd_bwd else f


def efficiency(rows):
    """Fills each row's efficiency from the same impl's one-GPU row (impl families: ours, the peer)."""
    def family(r):
        return "tileattn" if r["impl"].startswith("tileattn") else "peer"

    for r in rows:
        ones = sorted((x for x in rows if x["gpus"] == 1 and family(x) == family(r) and x["pass"] == r["pass"]
                       and x["ms"] is not None), key=lambda x: x["seqlen"])
        if r["ms"] is None or not ones:
            continue
        exact = [x for x in ones if x["seqlen"] == r["seqlen"]]
        base = exact[0] if exact else ones[-1]
        t1 = base["ms"] * (r["seqlen"] / base["seqlen"]) ** 2
        r["efficiency"] = t1 / (r["gpus"] * r["ms"])
        if not exact:
            r["t1_extrapolated_from"] = base["seqlen"]


def main():
    args = parse()
    setup = Setup(args.smoke)
    setup.peer_rotate = args.peer_rotate
    seqlens = [64, 96] if args.smoke else [int(s) for s in args.seqlens.split(",")]
    sizes = [int(s) for s in args.gpus.split(",")] if args.gpus else \
        [p for p in (2 ** i for i in range(8)) if p <= setup.world]
    peers = [] if args.no_peer else sorted({1, setup.world})
    # Every rank creates every group, in the same order.
    groups = {p: dist.new_group(list(range(p))) for p in sorted(set(sizes) | set(peers))}
    rows = []

    def add(impl, p, n, times, **extra):
        for name, ms in times.items():
            row = dict(grid="context_parallel", impl=impl, dtype="fp32" if args.smoke else "bf16", batch=1,
                       seqlen_q=n, seqlen_k=n, heads_q=setup.heads_q, heads_kv=setup.heads_kv, hdim=setup.hdim,
                       causal=True, page_size=None, gpus=p, seqlen=n, layout="zigzag" if p > 1 else None, ms=ms,
                       tflops=None if ms is None else flops(n, name == "fwd+bwd", setup) / ms / 1e9, tbps=None,
                       efficiency=None, **{"pass": name})
            rows.append(dict(row, **extra))

    margins = [int(m) for m in args.sm_margins.split(",")]
    for n in seqlens:
        for p in sizes:
            for m in margins if p > 1 else [0]:
                times = ours(setup, groups[p], p, n, args.reps, sm_margin=m)
                dist.barrier()
                if setup.rank == 0:
                    add("tileattn", p, n, times, sm_margin=m)
            if args.all_gather and p > 1:
                times = ours(setup, groups[p], p, n, args.reps, "all_gather")
                dist.barrier()
                if setup.rank == 0:
                    add("tileattn-allgather", p, n, times)
        for p in peers:
            times, impl = peer(setup, groups[p], p, n, args.reps)
            dist.barrier()
            if setup.rank == 0 and impl:
                add(impl, p, n, times, **({"peer_rotate": args.peer_rotate} if p > 1 else {}))
    if setup.rank == 0:
        efficiency(rows)
        name = torch.cuda.get_device_name() if setup.cuda else "cpu (gloo smoke run)"
        record = {"device": name, "date": datetime.date.today().isoformat(), "commit": args.commit or record_commit(), "ceilings": {},
                  "rows": rows}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(record, f, indent=1)
        print(f"context parallel, causal, {setup.heads_q}/{setup.heads_kv} heads, hdim {setup.hdim}; {name}")
        print(f"{'impl':>24} {'gpus':>4} {'seqlen':>8} {'pass':>8} {'ms':>10} {'TFLOP/s':>8} {'efficiency':>10}")
        for r in rows:
            ms = "n/a" if r["ms"] is None else f"{r['ms']:.2f}"
            tf = "" if r["tflops"] is None else f"{r['tflops']:.1f}"
            eff = "" if r["efficiency"] is None else f"{r['efficiency']:.3f}"
            eff += "*" if "t1_extrapolated_from" in r else ""
            print(f"{r['impl']:>24} {r['gpus']:>4} {r['seqlen']:>8} {r['pass']:>8} {ms:>10} {tf:>8} {eff:>10}")
        print("efficiency = one GPU's time of the same implementation / (gpus x time); * = one GPU's time "
              "extrapolated as seqlen^2 from the longest that fit; TFLOP/s summed over the GPUs")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
