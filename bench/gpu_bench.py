#!/usr/bin/env python3
"""The forward (or, with --backward, the backward) benchmark grid of DESIGN.md on one GPU: tileattn
(through its timing program) and PyTorch SDPA's flash and cuDNN backends, timed in the same run on
the same inputs' layout. A peer's backward is timed as torch.autograd.grad of its own forward's
output; FLOPs of the backward are 2.5x the forward's.

    gpu_bench.py --bench BUILD/src/cuda/tileattn_gpu_bench --out OUT.json [--commit SHA] [--quick] [--backward]
                 [--sections mha,gqa,dv,fp16,small,window,varlen] [--hdims 64,128]

Sections: "mha" the DESIGN.md grid (bf16, 16k tokens, width 2048, head dims 64/128/256); "gqa"
grouped-query rows (32 query heads on 8 and on 4 KV heads, head dims 64 and 128); "dv" head dim
192 for Q/K with 128 for V (16 heads, on 16 and on 4 KV heads); "fp16" the mha rows at head dim 128 in fp16; "small"
grouped-query rows at a fixed small batch instead of 16k tokens (batch 2 with 8 query heads on 2 KV
heads at head dim 64, as a small Llama-style model trains; batch 1 with 32 on 8 at head dim 128);
"window" a sliding window of 1024 keys to the left (right bound 0, as Mistral-style models attend)
at 32 query heads on 8 KV heads, head dim 128, 2k and 8k tokens (SDPA takes no window: tileattn
alone, and its candidate); "varlen" packed sequences of mixed lengths (128 to 4k, 16k tokens in all,
the same draw every run) at 16 heads and head dim 128, causal off and on: tileattn on cu_seqlens,
each peer on PyTorch's jagged nested tensors and on the batch padded to the longest sequence, the
faster of the two kept (the record says "padded"); TFLOP/s count the sequences' own pairs.
Every other section has seqlen 512, 2k, 8k, 16k (512 and 2k with --quick), causal off and on.
Grouped peers run with
enable_gqa=True; a peer that refuses it is timed on K and V expanded inside its graph (the record
says "kv_expanded").

With --backward the grid also times tileattn's deterministic mode (impl "tileattn-deterministic",
its own column), the cost of bitwise-reproducible gradients; with a candidate the table also gives
its deterministic mode's ratio ("det c/o").

--candidate PATH times a second build's timing program (a kernel change under trial) beside the
first in every row, as impl "tileattn-candidate" ("tileattn-deterministic-candidate"), the two in
alternating order row by row; the table gains its TFLOP/s and "cand/ours" (>= 1.0: the candidate is
faster). A change is then judged against its baseline in one run, on one machine.

Writes the DESIGN.md benchmark record and prints a table last: TFLOP/s of each implementation and
tileattn's time ratio to the best peer (best peer time / tileattn time: >= 1.0 means at least as fast).
"""
import argparse
import datetime
import itertools
import json
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from record_commit import record_commit

TOKENS, WIDTH = 16384, 2048
HDIMS = (64, 128, 256)
SEQLENS = (512, 2048, 8192, 16384)
SETS = 3  # input sets rotated between calls so that L2 never holds a call's inputs


SECTIONS = ("mha", "gqa", "dv", "fp16", "small", "window", "varlen")
WINDOW_LEFT = 1024


def varlen_lens(seed=0, lo=128, hi=4096):
    """Sequence lengths in [lo, hi] (the last may run past hi by less than lo) summing to TOKENS."""
    import random
    rng, lens = random.Random(seed), []
    while sum(lens) < TOKENS:
        lens.append(min(rng.randint(lo, hi), TOKENS - sum(lens)))
    if len(lens) > 1 and lens[-1] < lo:
        lens[-2] += lens.pop()
    return lens


def grid(quick, sections, hdims=None):
    seqlens = (512, 2048) if quick else SEQLENS
    shapes = []  # (dtype, heads_q, heads_kv, hdim, hdim_v, batch; None: 16k tokens a row)
    if "mha" in sections:
        shapes += [("bf16", WIDTH // d, WIDTH // d, d, d, None) for d in HDIMS]
    if "gqa" in sections:
        shapes += [("bf16", 32, kv, d, d, None) for d in (64, 128) for kv in (8, 4)]
    if "dv" in sections:
        shapes += [("bf16", 16, 16, 192, 128, None), ("bf16", 16, 4, 192, 128, None)]
    if "fp16" in sections:
        shapes += [("f16", WIDTH // 128, WIDTH // 128, 128, 128, None)]
    if "small" in sections:
        shapes += [("bf16", 8, 2, 64, 64, 2), ("bf16", 32, 8, 128, 128, 1)]
    for dtype, hq, hkv, d, dv, batch in shapes:
        if hdims and d not in hdims:
            continue
        for s in seqlens:
            for causal in (False, True):
                yield dict(dtype=dtype, batch=batch or TOKENS // s, seqlen=s, heads=hq, heads_kv=hkv, hdim=d,
                           hdim_v=dv, causal=causal, window=None)
    if "window" in sections and (not hdims or 128 in hdims):
        for s in (2048, 8192):
            yield dict(dtype="bf16", batch=TOKENS // s, seqlen=s, heads=32, heads_kv=8, hdim=128, hdim_v=128,
                       causal=False, window=(WINDOW_LEFT, 0))
    if "varlen" in sections and (not hdims or 128 in hdims):
        lens = varlen_lens()
        for causal in (False, True):
            yield dict(dtype="bf16", batch=len(lens), seqlen=max(lens), heads=16, heads_kv=16, hdim=128, hdim_v=128,
                       causal=causal, window=None, lens=lens)


def flops(r, backward):
    squares = sum(n * n for n in r["lens"]) if r.get("lens") else r["batch"] * r["seqlen"] ** 2
    fwd = 2.0 * r["heads"] * squares * (r["hdim"] + r["hdim_v"]) * (0.5 if r["causal"] else 1.0)
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
    b, s, hq, hkv = r["batch"], r["seqlen"], r["heads"], r["heads_kv"]
    dtype = torch.float16 if r["dtype"] == "f16" else torch.bfloat16
    grouped, lens = hkv != hq, r.get("lens")

    def make_sets(form):
        # BSHD storage, as tileattn reads it, seen as SDPA's BHSD; varlen: jagged nested tensors of
        # the sequences' own lengths, or the batch padded to the longest.
        dims = [(hq, r["hdim"]), (hkv, r["hdim"]), (hkv, r["hdim_v"]), (hq, r["hdim_v"])]
        # The four tensors of a set share one offsets tensor: nested tensors are alike in shape (as
        # autograd checks a gradient against its output) only where they share their ragged size.
        def one_set():
            if form == "jagged":
                offsets = torch.tensor([0] + list(itertools.accumulate(lens)), device="cuda")
                make = lambda h, d: torch.nested.nested_tensor_from_jagged(
                    torch.randn(offsets[-1].item(), h, d, device="cuda", dtype=dtype), offsets)
            else:
                make = lambda h, d: torch.randn(b, s, h, d, device="cuda", dtype=dtype)
            return [make(h, d).transpose(1, 2).requires_grad_(backward) for h, d in dims]
        return [one_set() for _ in range(SETS)]

    # Each peer takes its first form that runs: grouped rows with enable_gqa, else K and V expanded
    # inside the graph (so that the backward sums the group's gradients too). Varlen rows: both the
    # jagged and the padded form, the faster counting (a backend may take nested tensors on a slower
    # path than the padded batch).
    forms = ("jagged", "padded") if lens else ("gqa", "expanded") if grouped else ("plain",)
    out = []
    for impl, backend in (("torch-flash", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)):
        for form in forms:
            def attend(q, k, v):
                if form == "expanded":
                    k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
                return F.scaled_dot_product_attention(q, k, v, is_causal=r["causal"], enable_gqa=form == "gqa")
            outs, sets = [], []
            try:
                sets = make_sets(form)
                if backward:
                    with sdpa_kernel(backend):
                        outs = [attend(q, k, v) for q, k, v, _ in sets]

                def call(i):
                    q, k, v, do = sets[i % SETS]
                    if backward:
                        torch.autograd.grad(outs[i % SETS], (q, k, v), do, retain_graph=True)
                        return
                    with sdpa_kernel(backend):
                        attend(q, k, v)
                ms = time_ms(call, iters)
            except Exception as e:  # a backend that refuses the shape or the form
                print(f"{impl} ({form}) failed on {r}: {str(e)[:200]}", file=sys.stderr)
                continue
            finally:
                del outs, sets
                torch.cuda.empty_cache()
            rec = record(r, impl, ms, backward)
            if form == "expanded":
                rec["kv_expanded"] = True
            if not lens:
                out.append(rec)
                break
            rec["padded"] = form == "padded"
            prev = next((x for x in out if x["impl"] == impl), None)
            if prev is None or rec["ms"] < prev["ms"]:
                out = [x for x in out if x is not prev] + [rec]
    return out


def record(r, impl, ms, backward):
    return {"grid": "bwd" if backward else "fwd", "impl": impl, "dtype": r["dtype"], "batch": r["batch"],
            "seqlen_q": r["seqlen"], "seqlen_k": r["seqlen"], "heads_q": r["heads"], "heads_kv": r["heads_kv"],
            "hdim": r["hdim"], "hdim_v": r["hdim_v"], "causal": r["causal"], "page_size": None, "ms": round(ms, 5),
            "tflops": round(flops(r, backward) / (ms * 1e-3) / 1e12, 2), "tbps": None,
            **({"varlen": True, "lens": r["lens"], "tokens": sum(r["lens"])} if r.get("lens") else {})}


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
    ap.add_argument("--commit", help="the commit the record names (default: bench/record_commit.py's)")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="seqlen 512 and 2048 only")
    ap.add_argument("--backward", action="store_true", help="the backward grid")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    ap.add_argument("--hdims", default="", help="comma-separated Q/K head dims to keep (default: all)")
    ap.add_argument("--candidate", help="a second build's tileattn_gpu_bench, timed beside --bench in every row")
    ap.add_argument("--candidate-commit", help="the commit (or description) the candidate was built from")
    args = ap.parse_args()
    sections = args.sections.split(",")
    unknown = [x for x in sections if x not in SECTIONS]
    if unknown:
        ap.error(f"unknown sections {unknown}; known: {SECTIONS}")

    hdims = {int(d) for d in args.hdims.split(",") if d}
    rows = list(grid(args.quick, sections, hdims))
    specs = [("v" + ",".join(map(str, r["lens"])) if r.get("lens") else f"{r['batch']}:{r['seqlen']}")
             + f":{r['heads']}:{r['hdim']}:{int(r['causal'])}:{r['heads_kv']}:{r['hdim_v']}"
             + (f":{r['window'][0]}:{r['window'][1]}" if r["window"] else "") for r in rows]
    # Ours and the peers row by row, each row's implementations one after the other, so that all of
    # them meet the GPU in the same state (clocks, temperature) rather than ours first for the grid.
    modes = [["--backward"], ["--backward", "--deterministic"]] if args.backward else [[]]
    builds = [(args.bench, "")] + ([(args.candidate, "-candidate")] if args.candidate else [])
    records = []
    doc = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": args.commit or record_commit(),
           "ceilings": ceilings(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "rows": records}
    if args.candidate:
        doc["candidate_commit"] = args.candidate_commit or "unknown"

    def write(done):
        # Rewritten after every row, so that a run cut short (a time limit) leaves the rows it timed,
        # marked incomplete.
        doc["complete"] = done
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)

    for i, (r, spec) in enumerate(zip(rows, specs)):
        for program, suffix in builds[::-1] if i % 2 else builds:
            for mode in modes:
                ours = subprocess.run([program, "--iters", str(args.iters), "--dtype", r["dtype"]] + mode + [spec],
                                      check=True, capture_output=True, text=True)
                for line in ours.stdout.splitlines():
                    if line.startswith("{"):
                        rec = json.loads(line)
                        rec["impl"] += suffix
                        records.append(rec)
        if not r["window"]:
            records += peer_rows(r, args.iters, args.backward)
        write(False)
        print(f"row {i + 1}/{len(rows)} timed: {r['dtype']} {spec}", flush=True)
    write(True)

    key = lambda x: (x["dtype"], x["heads_q"], x["heads_kv"], x["hdim"], x.get("hdim_v", x["hdim"]), x["seqlen_q"],
                     x["causal"], x.get("window_left", -1), x.get("window_right", -1), x.get("varlen", False))
    by = {}
    for x in records:
        by.setdefault(key(x), {})[x["impl"]] = x
    print(f"\n{doc['device']}  torch {doc['torch']}  cudnn {doc['cudnn']}  ceilings {doc['ceilings']}")
    if args.backward:
        print("backward: extra device memory per call = workspace_bytes in the JSON (D and the fp32 dQ rows)")
    else:
        print("extra device memory per call: workspace 0 B, lse only (lse_bytes per row in the JSON)")
    det = " determ." if args.backward else ""
    cand = f" {'cand.':>8}" if args.candidate else ""
    print(f"{'dtype':>5} {'heads':>5} {'hdim':>7} {'seqlen':>6} {'causal':>6} | {'tileattn':>8}{cand} {'flash':>8} "
          f"{'cudnn':>8}{det} | TFLOP/s | {'vs flash':>8} {'vs best':>8}{' det/ours' if args.backward else ''}"
          f"{' cand/ours' if args.candidate else ''}{' det c/o' if args.candidate and args.backward else ''}")
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
        hd = f"{k[3]}" if k[3] == k[4] else f"{k[3]}/{k[4]}"
        dm = row.get("tileattn-deterministic", {}).get("ms")
        det_vs = (f" {t / dm:8.3f}" if t and dm else f" {'-':>8}") if args.backward else ""
        cm = row.get("tileattn-candidate", {}).get("ms")
        cand = f" {tf('tileattn-candidate')}" if args.candidate else ""
        cand_vs = (f" {t / cm:9.3f}" if t and cm else f" {'-':>9}") if args.candidate else ""
        dcm = row.get("tileattn-deterministic-candidate", {}).get("ms")
        if args.candidate and args.backward:
            cand_vs += f" {dm / dcm:8.3f}" if dm and dcm else f" {'-':>8}"
        mask = str(k[6]) if k[7] < 0 and k[8] < 0 else f"w{k[7]},{k[8]}"
        if k[9]:  # varlen: the longest sequence in the seqlen column
            mask = f"v {mask}"
        print(f"{k[0]:>5} {f'{k[1]}/{k[2]}':>5} {hd:>7} {k[5]:>6} {mask:>6} | {tf('tileattn')}{cand} "
              f"{tf('torch-flash')} {tf('torch-cudnn')}{det} |         | {vs_flash} {vs_best}{det_vs}{cand_vs}")


if __name__ == "__main__":
    main()
