#!/usr/bin/env python3
"""Host time per eager call: tileattn's PyTorch entry points beside torch.nn.functional's
scaled_dot_product_attention on a small problem, where the host side is the whole cost.

Each call is timed on the host alone (no synchronization inside the timed region; the GPU queue is
drained every few calls outside it), and the record keeps the median of many calls. "fwd" is one
forward call under no_grad; "fwd+bwd" a forward with inputs that require grad plus the backward's
launch (out.backward(dout)).

usage: overhead.py [--out FILE] [--device cuda|cpu] [--calls N] [--shape B,S,H,D] [--cache N] [--breakdown]
                   [--profile FILE]
Writes the DESIGN.md record (grid "overhead": impl, entry, pass, us) and prints tileattn / SDPA per
entry point and pass (target <= 1.25). Problem: batch 1, 128 tokens, 8 heads, head dim 64, bf16 on a
GPU; the decode row attends one query row to 4000 cached keys (--cache).

On the CPU (fp32) the call's compute is timed too, and the host differs from a GPU machine's: the
numbers are a proxy, for comparing commits, never against the target. A problem of a few tokens and
a short cache keeps the compute small there:
    python3 bench/overhead.py --device cpu --shape 1,8,1,8 --cache 64

--breakdown adds rows that split tileattn's time: "tileattn-native", the native call alone on
outputs allocated beforehand (argument conversion, validation, the launch or the CPU compute), and
"torch-empty", one output allocation; the rest of an entry's time is its Python.

--profile FILE runs each entry's fwd+bwd call (tileattn, then SDPA) a few hundred times under
torch.profiler and writes their tables of host time by operator and runtime call (CUDA API calls
included on a GPU: a synchronization, a pointer query or a memset per call shows there) to FILE.
"""
import argparse
import datetime
import json
import statistics
import time

import torch
import torch.nn.functional as F

import tileattn
from record_commit import record_commit

CACHE = 4000  # the decode row's cached keys
ROUNDS = 10  # alternating rounds of each entry's calls (see main)
B, S, H, D = 1, 128, 8, 64  # --shape changes them (a few tokens isolate the host cost on a CPU)


def host_us(fn, calls, device):
    for _ in range(20):
        fn()
    times = []
    for i in range(calls):
        if i % 50 == 0 and device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    if device == "cuda":
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def entries(device, dtype):
    def t(*shape, grad=False):
        return torch.randn(shape, device=device, dtype=dtype, requires_grad=grad)
    bshd = [t(B, S, H, D) for _ in range(3)]
    bshd_g = [t(B, S, H, D, grad=True) for _ in range(3)]
    bhsd = [x.transpose(1, 2) for x in bshd]
    bhsd_g = [t(B, H, S, D, grad=True) for _ in range(3)]
    cu = torch.tensor([0, S], dtype=torch.int32, device=device)
    flat = [x.reshape(B * S, H, D) for x in bshd]
    flat_g = [t(B * S, H, D, grad=True) for _ in range(3)]
    k_cache, v_cache = t(B, CACHE + 96, H, D), t(B, CACHE + 96, H, D)
    lens = torch.full((B,), CACHE, dtype=torch.int32, device=device)
    q1 = t(B, 1, H, D)
    dout = t(B, S, H, D)
    dout_h = t(B, H, S, D)
    dout_flat = t(B * S, H, D)  # made here: a view made in the timed call would be charged to tileattn
    return {
        # (entry, tileattn forward, SDPA forward, tileattn fwd+bwd, SDPA fwd+bwd); None = no backward
        "flash_attn_func": (lambda: tileattn.flash_attn_func(*bshd, causal=True),
                            lambda: F.scaled_dot_product_attention(*bhsd, is_causal=True),
                            lambda: tileattn.flash_attn_func(*bshd_g, causal=True).backward(dout),
                            lambda: F.scaled_dot_product_attention(*bhsd_g, is_causal=True).backward(dout_h)),
        "flash_attn_varlen_func": (
            lambda: tileattn.flash_attn_varlen_func(*flat, cu, cu, S, S, causal=True),
            lambda: F.scaled_dot_product_attention(*bhsd, is_causal=True),
            lambda: tileattn.flash_attn_varlen_func(*flat_g, cu, cu, S, S, causal=True).backward(dout_flat),
            lambda: F.scaled_dot_product_attention(*bhsd_g, is_causal=True).backward(dout_h)),
        "scaled_dot_product_attention": (
            lambda: tileattn.scaled_dot_product_attention(*bhsd, is_causal=True),
            lambda: F.scaled_dot_product_attention(*bhsd, is_causal=True),
            lambda: tileattn.scaled_dot_product_attention(*bhsd_g, is_causal=True).backward(dout_h),
            lambda: F.scaled_dot_product_attention(*bhsd_g, is_causal=True).backward(dout_h)),
        "flash_attn_with_kvcache": (
            lambda: tileattn.flash_attn_with_kvcache(q1, k_cache, v_cache, cache_seqlens=lens,
                                                     check_device_indices=False),
            lambda: F.scaled_dot_product_attention(q1.transpose(1, 2), k_cache[:, :CACHE].transpose(1, 2),
                                                   v_cache[:, :CACHE].transpose(1, 2)),
            None, None),
    }


def native_calls(device, dtype):
    """(impl, entry, pass, call) of the --breakdown rows: the native forward and backward of the
    flash_attn_func problem on outputs allocated beforehand, with the scratch allocator the PyTorch
    layer passes, and one output allocation."""
    from tileattn import _C

    def t(*shape):
        return torch.randn(shape, device=device, dtype=dtype)
    q, k, v, dout = (t(B, S, H, D) for _ in range(4))
    out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty((B, H, S), device=device, dtype=torch.float32)
    o = _C.Options(causal=True, stream=torch.cuda.current_stream().cuda_stream if device == "cuda" else 0)
    scratch = (lambda n: q.new_empty(n, dtype=torch.uint8)) if device == "cuda" else None
    _C.forward(q, k, v, out, lse, options=o, workspace=scratch)  # a real lse for the backward
    return [("tileattn-native", "native", "fwd", lambda: _C.forward(q, k, v, out, lse, options=o, workspace=scratch)),
            ("tileattn-native", "native", "bwd",
             lambda: _C.backward(q, k, v, out, dout, lse, dq, dk, dv, options=o, workspace=scratch)),
            ("torch-empty", "alloc", "fwd", lambda: torch.empty_like(q))]


def profile(path, device, dtype, calls):
    """Host time by operator and CUDA runtime call of each fwd+bwd entry (see --profile)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with open(path, "w") as f:
        for entry, (_, _, ours_b, sdpa_b) in entries(device, dtype).items():
            for impl, fn in (("tileattn", ours_b), ("torch-sdpa", sdpa_b)):
                if fn is None:
                    continue
                for _ in range(20):
                    fn()
                with torch_profile(activities=activities) as prof:
                    for _ in range(calls):
                        fn()
                    if device == "cuda":
                        torch.cuda.synchronize()
                f.write(f"== {entry} fwd+bwd {impl}: {calls} calls\n")
                f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
    print(f"profile: {path}")


def main():
    global B, S, H, D, CACHE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the JSON record to write")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--shape", help="batch,tokens,heads,head_dim (default 1,128,8,64)")
    ap.add_argument("--cache", type=int, default=CACHE, help=f"the decode row's cached keys (default {CACHE})")
    ap.add_argument("--breakdown", action="store_true", help="also time the native calls alone (see above)")
    ap.add_argument("--profile", metavar="FILE", help="write torch.profiler tables of the fwd+bwd calls (see above)")
    a = ap.parse_args()
    if a.shape:
        B, S, H, D = (int(x) for x in a.shape.split(","))
    CACHE = a.cache
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    if a.device == "cpu":
        # One thread each: on a shared host a pool of several only adds noise to a host-time figure.
        torch.set_num_threads(1)
        tileattn.set_num_threads(1)
    rows = []
    print(f"{'entry':30} {'pass':8} {'tileattn us':>12} {'sdpa us':>10} {'ratio':>7}")
    for entry, (ours, sdpa, ours_b, sdpa_b) in entries(a.device, dtype).items():
        for pass_, fo, fs in (("fwd", ours, sdpa), ("fwd+bwd", ours_b, sdpa_b)):
            if fo is None:
                continue
            ctx = torch.no_grad() if pass_ == "fwd" else torch.enable_grad()
            with ctx:
                # Interleaved in ROUNDS short rounds, so that drift on a shared host hits both alike
                # (two long rounds left the ratio to the host's moods: bench/notes/overhead.md). Each
                # side's figure is the median of its rounds, the ratio the median of the rounds' ratios.
                us_s, us_o = [], []
                for _ in range(ROUNDS):
                    us_s.append(host_us(fs, max(a.calls // ROUNDS, 20), a.device))
                    us_o.append(host_us(fo, max(a.calls // ROUNDS, 20), a.device))
                ratio = statistics.median(o / s for o, s in zip(us_o, us_s))
                us_s, us_o = statistics.median(us_s), statistics.median(us_o)
            base = dict(grid="overhead", entry=entry, dtype=str(dtype).replace("torch.", ""), batch=B, seqlen_q=S,
                        seqlen_k=S if entry != "flash_attn_with_kvcache" else CACHE, heads_q=H, heads_kv=H, hdim=D,
                        causal=entry != "flash_attn_with_kvcache")
            rows.append(dict(base, impl="tileattn", **{"pass": pass_}, us=round(us_o, 2), ratio=round(ratio, 3)))
            rows.append(dict(base, impl="torch-sdpa", **{"pass": pass_}, us=round(us_s, 2)))
            print(f"{entry:30} {pass_:8} {us_o:12.1f} {us_s:10.1f} {ratio:7.2f}")
    if a.breakdown:
        with torch.no_grad():
            for impl, entry, pass_, fn in native_calls(a.device, dtype):
                us = min(host_us(fn, a.calls // 2, a.device) for _ in range(2))
                rows.append(dict(grid="overhead", entry=entry, dtype=str(dtype).replace("torch.", ""), batch=B,
                                 seqlen_q=S, seqlen_k=S, heads_q=H, heads_kv=H, hdim=D, causal=True, impl=impl,
                                 **{"pass": pass_}, us=round(us, 2)))
                print(f"{impl + ' ' + entry:30} {pass_:8} {us:12.1f}")
    if a.profile:
        with torch.enable_grad():
            profile(a.profile, a.device, dtype, 200)
    device = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    record = {"device": device, "date": datetime.date.today().isoformat(), "commit": record_commit(),
              "torch": torch.__version__, "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
