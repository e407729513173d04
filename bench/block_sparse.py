#!/usr/bin/env python3
"""The block_sparse benchmark grid: tileattn.flex_attention on FlexAttention BlockMasks against PyTorch's
flex_attention (compiled) on the same masks and tileattn's dense kernel, forward and backward.

usage: python3 bench/block_sparse.py OUT.json [--device cuda|cpu] [--dtype bf16] [--tokens 16384]
           [--width 2048] [--hdims 64,128] [--seqlens 8192,16384] [--heads-kv-ratio 1] [--block 128]
           [--patterns causal,window,documents,random,dense] [--densities 0.1,0.25,0.5]
           [--peers flex,dense] [--iters N] [--threads N] [--commit SHA]

Shapes follow DESIGN.md's grid: batch = tokens / seqlen, heads = width / hdim (heads_kv = heads /
ratio), q, k, v stored [batch, seqlen, heads, hdim] and passed as [batch, heads, seqlen, hdim] views. Patterns, each a BlockMask of 128 x 128 blocks (--block) and the element mask tileattn applies
in its partly visible blocks:
  causal     causal as blocks: full below the diagonal, partial on it (element mask: causal);
  window     causal sliding window of 1024 keys (element mask: causal, window_size=(1023, 0));
  documents  packed documents of random lengths, causal within each (element mask: causal and the
             document ids);
  random     blocks drawn at random at each density, fully visible (no element mask);
  dense      every block fully visible (density 1.0).
density = visited blocks / all blocks of the mask. Rows (DESIGN.md's record format) carry
grid "block_sparse", pattern, density, pass (fwd or bwd), impl: tileattn (flex_attention),
torch-flex (torch.compile(flex_attention), same BlockMask and mask_mod), tileattn-dense (tileattn's
dense kernel on the pattern's dense equivalent: causal, the window, varlen documents; the full
unmasked kernel for random and dense). tflops counts the visited blocks' FLOPs (4 b h s^2 d x density
forward, 2.5x backward) for every impl of a row's pattern, so TFLOP/s compare as time does. Every
row of a file is timed in the same run. A backward is timed as torch.autograd.grad of the impl's own
forward output. On a GPU a row also carries kernel_ms (its kernels' own device time per call, from
torch.profiler: where ms exceeds it, the call waited on something besides its kernels) and the
caching allocator's cudaMalloc calls and retries during the timed calls (device_allocs,
alloc_retries). On a CPU (--device cpu) torch-flex is compiled by inductor's CPU backend, and the
CPU is shared: say so when quoting its numbers.

The random and dense patterns' BlockMasks are built from their block tables directly
(BlockMask.from_kv_blocks), never from a mask_mod evaluated over every (query, key) pair, which at
16k tokens would materialize the dense mask. torch-flex compiles one callable per shape for the
forward rows and another for the backward rows (inputs that require grad are another graph), with
dynamo's recompile limit raised and its fallback to the unfused path turned into an error, so every
torch-flex row times the compiled kernel or records why not. A row whose impl fails carries the
error instead of a time (ms null) and the run goes on; the JSON record is rewritten after every row.
tileattn's calls use the default device check of the block mask, done at a mask's first use.
"""
import argparse
import datetime
import json
import statistics
import sys
import time

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

import tileattn
from record_commit import record_commit

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def timer(device, kernel_times=True):
    """fn() per call: (ms, more). ms: the median of iters after warm-ups, CUDA events on a GPU, wall
    clock on a CPU. more, on a GPU: kernel_ms, the device time of the kernels a call launched
    (torch.profiler over a few more calls: the events also count any wait inside a call, such as a
    synchronizing allocation; None without kernel_times, as under ncu, which holds the profiling
    interface), and the caching allocator's cudaMalloc calls and retries during the timed calls
    (device_allocs, alloc_retries); None on a CPU."""
    def run(fn, iters):
        for _ in range(2):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
            before = torch.cuda.memory_stats()
            start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            stop = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            for i in range(iters):
                start[i].record()
                fn()
                stop[i].record()
            torch.cuda.synchronize()
            after = torch.cuda.memory_stats()
            ms = statistics.median(a.elapsed_time(b) for a, b in zip(start, stop))
            more = {"kernel_ms": kernel_ms(fn) if kernel_times else None,
                     "device_allocs": after.get("num_device_alloc", 0) - before.get("num_device_alloc", 0),
                     "alloc_retries": after.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0)}
            return ms, more
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), {"kernel_ms": None, "device_allocs": None, "alloc_retries": None}
    return run


def kernel_ms(fn, calls=5):
    """The GPU kernels' own time per call of fn (ms): their device time summed over a few calls."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for ev in prof.key_averages():
        total += getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0) or 0
    return total / calls / 1e3


def documents(batch, seqlen, gen):
    """Per sequence, document ids of random lengths (mean seqlen / 8 tokens): [batch, seqlen] int32."""
    starts = torch.rand(batch, seqlen, generator=gen) < 8.0 / seqlen
    starts[:, 0] = False
    return starts.to(torch.int32).cumsum(dim=1, dtype=torch.int32)


def from_table(table, block, seqlen, mask_mod):
    """The BlockMask whose visited blocks are table's True cells ([batch, heads, q blocks, k blocks]),
    all fully visible, built from the lists (no dense mask)."""
    full_num = table.sum(dim=-1, dtype=torch.int32)
    # The listed blocks first, in key order: a stable sort of the cells by visited, descending.
    full_idx = torch.sort(table.to(torch.int8), dim=-1, descending=True, stable=True)[1].to(torch.int32)
    return BlockMask.from_kv_blocks(torch.zeros_like(full_num), torch.zeros_like(full_idx), full_num, full_idx,
                                    BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(seqlen, seqlen))


def patterns(names, densities, batch, heads, seqlen, block, device, gen):
    """(name, mask_mod, tileattn kwargs, (dense call kind, its argument), table) per pattern (random: one
    per density); table: the block table of a pattern built from one (from_table), else None."""
    for name in names:
        if name == "causal":
            yield name, lambda b, h, q, k: q >= k, dict(causal=True), ("causal", None), None
        elif name == "window":
            yield name, lambda b, h, q, k: (q >= k) & (q - k < 1024), dict(causal=True, window_size=(1023, 0)), \
                ("window", 1023), None
        elif name == "documents":
            ids = documents(batch, seqlen, gen).to(device)
            # The dense equivalent: the documents as a varlen batch, each its own sequence.
            lens = [int(n) for row in ids.cpu() for n in torch.unique_consecutive(row, return_counts=True)[1]]
            cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
            yield name, lambda b, h, q, k: (ids[b, q] == ids[b, k]) & (q >= k), dict(causal=True, document_ids=ids), \
                ("documents", (cu, max(lens))), None
        elif name == "random":
            qb = kb = seqlen // block
            for d in densities:
                table = (torch.rand(batch, heads, qb, kb, generator=gen) < d).to(device)
                yield "random", (lambda t: lambda b, h, q, k: t[b, h, q // block, k // block])(table), dict(), \
                    ("full", None), table
        elif name == "dense":
            qb = kb = -(-seqlen // block)
            yield name, lambda b, h, q, k: q >= 0, dict(), ("full", None), \
                torch.ones(batch, heads, qb, kb, dtype=torch.bool, device=device)
        else:
            sys.exit(f"block_sparse: unknown pattern {name!r}")


def density_of(bm):
    visited = bm.kv_num_blocks.sum().item() + (bm.full_kv_num_blocks.sum().item() if bm.full_kv_num_blocks is not None else 0)
    return visited / bm.kv_indices.numel()


def dense_call(kind, extra, q, k, v):
    """tileattn's dense kernel on the pattern's dense equivalent ([b, h, s, d] in and out)."""
    qs, ks, vs = (x.transpose(1, 2) for x in (q, k, v))
    if kind == "documents":
        cu, longest = extra
        flat = lambda x: x.reshape(-1, x.shape[2], x.shape[3])  # noqa: E731
        out = tileattn.flash_attn_varlen_func(flat(qs), flat(ks), flat(vs), cu, cu, longest, longest, causal=True)
        return out.reshape(qs.shape[0], qs.shape[1], qs.shape[2], -1).transpose(1, 2)
    window = (extra, 0) if kind == "window" else (-1, -1)
    return tileattn.flash_attn_func(qs, ks, vs, causal=kind in ("causal", "window", "documents"),
                                    window_size=window).transpose(1, 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--seqlens", default="8192,16384")
    ap.add_argument("--heads-kv-ratio", type=int, default=1, help="heads_q / heads_kv (grouped-query rows)")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--patterns", default="causal,window,documents,random,dense")
    ap.add_argument("--densities", default="0.1,0.25,0.5")
    ap.add_argument("--passes", default="fwd,bwd")
    ap.add_argument("--peers", default="flex,dense", help="comma list of flex, dense, or empty")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per row (default: 20 on a GPU, 3 on a CPU)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for both sides")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    device, dtype = args.device, DTYPES[args.dtype]
    iters = args.iters or (20 if device == "cuda" else 3)
    peers = [p for p in args.peers.split(",") if p]
    if args.threads:
        torch.set_num_threads(args.threads)
        tileattn.set_num_threads(args.threads)
    run = timer(device)
    # Every pattern, density and pass is another graph for dynamo (mask_mod, the lists' shapes,
    # inputs that require grad): room for all of them, and an error rather than the unfused fallback.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    gen = torch.Generator().manual_seed(0)
    rows = []
    record = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "date": datetime.date.today().isoformat(), "commit": args.commit or record_commit(), "ceilings": None,
              "torch": torch.__version__, "threads": torch.get_num_threads() if device == "cpu" else None, "rows": rows}

    def save():
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)

    def error(e):
        if device == "cuda":
            torch.cuda.empty_cache()
        return f"{type(e).__name__}: {str(e)[:300]}"

    for hdim in (int(x) for x in args.hdims.split(",")):
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            batch, heads = max(1, args.tokens // seqlen), args.width // hdim
            heads_kv = heads // args.heads_kv_ratio
            shape = {"dtype": args.dtype, "batch": batch, "seqlen_q": seqlen, "seqlen_k": seqlen, "heads_q": heads,
                     "heads_kv": heads_kv, "hdim": hdim, "block_size": args.block, "page_size": None}
            torch._dynamo.reset()
            flex_fwd = torch.compile(flex_attention, dynamic=False)
            flex_bwd = torch.compile(flex_attention, dynamic=False)
            # [b, h, s, d] views of [b, s, h, d] memory (DESIGN.md's storage; the varlen call reads it as is).
            bshd = lambda h: torch.randn(batch, seqlen, h, hdim, device=device, dtype=dtype).transpose(1, 2)  # noqa: E731
            q, k, v = (bshd(n).requires_grad_() for n in (heads, heads_kv, heads_kv))
            dout = torch.randn_like(q)
            gqa = heads_kv != heads
            for name, mask_mod, kw, (dense_kind, extra), table in patterns(
                    args.patterns.split(","), [float(x) for x in args.densities.split(",")], batch, heads, seqlen,
                    args.block, device, gen):
                bm = None
                try:
                    if table is not None:
                        bm = from_table(table, args.block, seqlen, mask_mod)
                    else:
                        # One mask for every head (and, but for documents, every sequence): per head,
                        # create_block_mask would evaluate mask_mod over heads x seqlen^2 pairs (64 GiB
                        # at 16k tokens and 32 heads).
                        bm = create_block_mask(mask_mod, batch if name == "documents" else 1, 1, seqlen, seqlen,
                                               device=device, BLOCK_SIZE=args.block)
                    density = density_of(bm)
                except Exception as e:  # the pattern cannot be built at this size: one row says so
                    print(f"{name}: building its BlockMask failed: {error(e)}", file=sys.stderr)
                    rows.append(dict(grid="block_sparse", impl="tileattn", pattern=name, density=None, **{"pass": None}, **shape,
                                     causal=kw.get("causal", False), ms=None, tflops=None, tbps=None,
                                     error=f"BlockMask: {error(e)}"))
                    save()
                    continue
                # Per impl and pass, its call on (q, k, v); the forward is timed on detached inputs (torch's
                # flex_attention refuses inputs that require grad on a CPU), the backward on q, k, v.
                impls = {"tileattn": lambda q, k, v, bwd: tileattn.flex_attention(q, k, v, block_mask=bm,
                                                                                  enable_gqa=gqa, **kw)}
                if "flex" in peers:
                    impls["torch-flex"] = lambda q, k, v, bwd: (flex_bwd if bwd else flex_fwd)(
                        q, k, v, block_mask=bm, enable_gqa=gqa)
                if "dense" in peers:
                    impls["tileattn-dense"] = lambda q, k, v, bwd: dense_call(dense_kind, extra, q, k, v)
                fwd_flops = 4.0 * batch * heads * seqlen * seqlen * hdim * density
                for impl, fn in impls.items():
                    for pas in args.passes.split(","):
                        row = dict(grid="block_sparse", impl=impl, pattern=name, density=round(density, 4),
                                   **{"pass": pas}, **shape, causal=kw.get("causal", False))
                        try:
                            if pas == "fwd":
                                qd, kd, vd = (x.detach() for x in (q, k, v))
                                ms, more = run(lambda: fn(qd, kd, vd, False), iters)
                            else:
                                out = fn(q, k, v, True)
                                ms, more = run(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                                                iters)
                                del out
                        except Exception as e:  # an impl that cannot run this row: recorded, not fatal
                            msg = error(e)
                            print(f"{impl} {name} {pas}: {msg}", file=sys.stderr)
                            rows.append(dict(row, ms=None, tflops=None, tbps=None, error=msg))
                            save()
                            continue
                        flops = fwd_flops * (2.5 if pas == "bwd" else 1.0)
                        rows.append(dict(row, ms=ms, tflops=flops / ms / 1e9, tbps=None, **more))
                        save()
                        kern = f" (kernels {more['kernel_ms']:.3f} ms)" if more["kernel_ms"] is not None else ""
                        print(f"{impl:15s} {name:10s} d={density:.3f} {pas} hdim={hdim} s={seqlen}: {ms:9.3f} ms{kern}",
                              file=sys.stderr)
                del bm
    save()
    # tileattn's time against each peer per (shape, pattern, density, pass): >= 1.0 means faster.
    key = lambda r: (r["hdim"], r["seqlen_q"], r["pattern"], r["density"], r["pass"])  # noqa: E731
    by = {}
    for r in rows:
        if r["ms"] is not None:
            by.setdefault(key(r), {})[r["impl"]] = r["ms"]
    print(f"{'hdim':>4} {'seqlen':>6} {'pattern':10} {'density':>7} {'pass':4} {'ms':>9} {'vs flex':>8} {'vs dense':>8}")
    for k_, m in by.items():
        if "tileattn" not in m:
            continue
        t = m["tileattn"]
        vs = lambda p: f"{m[p] / t:8.2f}" if p in m else f"{'-':>8}"  # noqa: E731
        print(f"{k_[0]:4d} {k_[1]:6d} {k_[2]:10} {k_[3]:7.3f} {k_[4]:4} {t:9.3f} {vs('torch-flex')} {vs('tileattn-dense')}")


if __name__ == "__main__":
    main()
