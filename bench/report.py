#!/usr/bin/env python3
"""The benchmark report: DESIGN.md's forward, backward and decode grids for tileattn (through its Python
package) and PyTorch's scaled_dot_product_attention backends, timed in one run on one GPU, plus the extra
device memory each needs; writes the JSON record and PNG plots into OUTDIR.

    python bench/report.py OUTDIR [--commit SHA] [--grids fwd,bwd,decode,memory] [--budget 0.25]
    python bench/report.py OUTDIR --smoke        # a few small rows on the CPU in seconds (keeps this script alive)

Peers: torch-flash, torch-cudnn, torch-efficient, torch-math (SDPA with one backend forced; math is skipped
where its N x N matrices would pass ~20 GB); on the CPU, torch-cpu (SDPA's own choice). A row that an
implementation rejects is recorded with "skipped" and the reason (tileattn's "does not support ... yet"
included); a row that fails otherwise with "error". No row stops the run.

Timing: CUDA events around each call, after warm-up calls, the median of as many calls as --budget seconds
allow (3 to 50); inputs are random normals, rotated between 3 sets so that no call finds its inputs in L2.
FLOPs: forward 4 * batch * heads * seqlen_q * seqlen_k * hdim, halved when causal; backward 2.5x that.
Decode bandwidth: bytes of K and V read / time. Extra memory: the peak of PyTorch's allocator during a
call beyond what was allocated before it and the outputs it returns (tileattn draws its scratch from the
same allocator), for a training forward (inputs requiring grad) and for the backward.
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import tileattn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNSUPPORTED = re.compile(r"not built yet|does not support")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SETS = 3
MATH_LIMIT_BYTES = 20e9


def sdpa_backends():
    from torch.nn.attention import SDPBackend
    return {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-cudnn": SDPBackend.CUDNN_ATTENTION,
            "torch-efficient": SDPBackend.EFFICIENT_ATTENTION, "torch-math": SDPBackend.MATH}


# ---- grids ---------------------------------------------------------------------------------------------

def row(grid, batch, seqlen_q, seqlen_k, heads_q, heads_kv, hdim, causal, dtype):
    return dict(grid=grid, dtype=dtype, batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_q=heads_q,
                heads_kv=heads_kv, hdim=hdim, causal=causal, page_size=None)


def gpu_grids(names):
    """DESIGN.md: bf16, 16384 tokens per batch, model width 2048, hdim 64/128/256, seqlen 512..16384,
    causal off and on; decode: one query row against (batch, kv_len, heads_q, heads_kv), hdim 128."""
    rows = []
    for grid in ("fwd", "bwd"):
        if grid in names:
            rows += [row(grid, 16384 // s, s, s, 2048 // d, 2048 // d, d, c, "bf16")
                     for d in (64, 128, 256) for s in (512, 2048, 8192, 16384) for c in (False, True)]
    if "decode" in names:
        rows += [row("decode", b, 1, n, hq, hkv, 128, False, "bf16")
                 for b, n, hq, hkv in ((1, 32768, 32, 8), (1, 131072, 32, 8), (16, 8192, 32, 8), (64, 4096, 32, 32),
                                       (1, 65536, 16, 16))]
    return rows


def smoke_grids():
    rows = [row(grid, 1, s, s, 2, 2, 64, c, "fp32") for grid in ("cpu-fwd", "cpu-bwd") for s in (64, 128)
            for c in (False, True)]
    return rows + [row("cpu-decode", 2, 1, 256, 4, 2, 64, False, "fp32")]


def memory_grid():
    """Extra memory against seqlen at one shape: batch 1, 16 heads of 128, bf16, non-causal."""
    return [dict(pass_=p, batch=1, seqlen=s, heads=16, hdim=128, dtype="bf16")
            for p in ("fwd", "bwd") for s in (1024, 2048, 4096, 8192, 16384)]


def flops(r):
    f = 4.0 * r["batch"] * r["heads_q"] * r["seqlen_q"] * r["seqlen_k"] * r["hdim"] * (0.5 if r["causal"] else 1.0)
    return f * 2.5 if r["grid"].endswith("bwd") else f


def kv_bytes(r):
    return 2 * r["batch"] * r["seqlen_k"] * r["heads_kv"] * r["hdim"] * DTYPES[r["dtype"]].itemsize


def math_bytes(batch, heads, seqlen_q, seqlen_k, backward):
    """A rough peak of SDPA's math backend, which materializes scores and probabilities."""
    return batch * heads * seqlen_q * seqlen_k * (16 if backward else 8)


# ---- implementations -----------------------------------------------------------------------------------

class Rejected(Exception):
    """An implementation that does not take this row; the message says why."""


def attend(impl, q, k, v, causal):
    """Attention on [batch, seq, heads, dim] storage; the SDPA peers read it as [batch, heads, seq, dim] views."""
    if impl == "tileattn":
        return tileattn.flash_attn_func(q, k, v, causal=causal)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                         enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def decode_call(impl, q, k_cache, v_cache, cache_seqlens):
    if impl == "tileattn":
        # The serving hot path, as the C++ decode bench times it: no per-call check of the
        # device-resident lengths (a copy to the host and a synchronization).
        return tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                check_device_indices=False)
    return attend(impl, q, k_cache, v_cache, False)


class forced:
    """Runs SDPA on one backend (nothing for tileattn and torch-cpu) and turns 'no kernel' into Rejected with
    the reasons PyTorch gives as warnings."""

    def __init__(self, impl):
        self.impl = impl

    def __enter__(self):
        self.warn = warnings.catch_warnings(record=True)
        self.caught = self.warn.__enter__()
        warnings.simplefilter("always")
        self.kernel = None
        if self.impl in sdpa_backends():
            from torch.nn.attention import sdpa_kernel
            self.kernel = sdpa_kernel(sdpa_backends()[self.impl])
            self.kernel.__enter__()
        return self

    def __exit__(self, kind, err, tb):
        if self.kernel is not None:
            self.kernel.__exit__(kind, err, tb)
        self.warn.__exit__(kind, err, tb)
        if isinstance(err, RuntimeError) and re.search(r"No available kernel|No viable backend", str(err)):
            reasons = [str(w.message).strip().splitlines()[0] for w in self.caught]
            raise Rejected("; ".join(reasons) or str(err)) from None
        return False


# ---- timing --------------------------------------------------------------------------------------------

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, device, budget_s, max_reps=50):
    """fn(i) for i = 0, 1, ...: two warm-up calls (the second sizes the repeat count), then the median of
    3..max_reps timed calls."""
    fn(0)
    sync(device)
    start = time.perf_counter()
    fn(1)
    sync(device)
    reps = max(3, min(max_reps, int(budget_s / max(time.perf_counter() - start, 1e-6))))
    if device.type != "cuda":
        times = []
        for i in range(reps):
            t = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (a, b) in enumerate(events):
        a.record()
        fn(i)
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def randn(shape, dtype, device, requires_grad=False):
    return torch.randn(shape, dtype=dtype, device=device).requires_grad_(requires_grad)


def time_row(impl, r, device, budget_s):
    dtype = DTYPES[r["dtype"]]
    b, sq, sk, hq, hkv, d = (r[x] for x in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "hdim"))
    backward = r["grid"].endswith("bwd")
    if impl == "torch-math" and math_bytes(b, hq, sq, sk, backward) > MATH_LIMIT_BYTES:
        raise Rejected(f"math backend would need ~{math_bytes(b, hq, sq, sk, backward) / 1e9:.0f} GB")
    if r["grid"].endswith("decode"):
        sets = [(randn((b, 1, hq, d), dtype, device), randn((b, sk, hkv, d), dtype, device),
                 randn((b, sk, hkv, d), dtype, device)) for _ in range(SETS)]
        seqlens = torch.full((b,), sk, dtype=torch.int32, device=device)
        with forced(impl):
            return median_ms(lambda i: decode_call(impl, *sets[i % SETS], seqlens), device, budget_s)
    sets = [tuple(randn((b, s, h, d), dtype, device, backward) for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
            for _ in range(SETS)]
    with forced(impl):
        if not backward:
            return median_ms(lambda i: attend(impl, *sets[i % SETS], r["causal"]), device, budget_s)
        graphs = []
        for q, k, v in sets:
            out = attend(impl, q, k, v, r["causal"])
            graphs.append((out, torch.randn_like(out), (q, k, v)))
        return median_ms(lambda i: torch.autograd.grad(graphs[i % SETS][0], graphs[i % SETS][2], graphs[i % SETS][1],
                                                       retain_graph=True), device, budget_s)


def extra_memory(impl, m, device):
    """Bytes PyTorch's allocator peaks at during one call beyond what was allocated before it (inputs,
    and for the backward the forward's outputs and saved tensors) and the tensors the call returns."""
    dtype = DTYPES[m["dtype"]]
    backward = m["pass_"] == "bwd"
    if impl == "torch-math" and math_bytes(m["batch"], m["heads"], m["seqlen"], m["seqlen"], backward) > MATH_LIMIT_BYTES:
        raise Rejected("math backend would need more than 20 GB")
    shape = (m["batch"], m["seqlen"], m["heads"], m["hdim"])
    q, k, v = (randn(shape, dtype, device, True) for _ in range(3))
    with forced(impl):
        if backward:
            out = attend(impl, q, k, v, False)
            dout = torch.randn_like(out)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = torch.autograd.grad(out, (q, k, v), dout) if backward else (attend(impl, q, k, v, False),)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base - sum(x.untyped_storage().nbytes() for x in result)


# ---- the run -------------------------------------------------------------------------------------------

class Progress:
    """tqdm when the machine has it, else a bar of our own on stderr (a line per 10% when not a terminal)."""

    def __init__(self, total):
        self.total, self.done, self.shown = total, 0, -1
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="row", file=sys.stderr, mininterval=0.5, dynamic_ncols=True)
        except ImportError:
            self.bar = None

    def step(self, label):
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update()
            return
        tty = sys.stderr.isatty()
        tenth = 10 * self.done // self.total
        if tty or tenth != self.shown or self.done == self.total:
            self.shown = tenth
            filled = 30 * self.done // self.total
            line = f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {label}"
            sys.stderr.write(("\r" + line.ljust(100)) if tty else line + "\n")
            sys.stderr.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif sys.stderr.isatty():
            sys.stderr.write("\n")


def attempt(fn):
    """(value, None) or (None, {'skipped' | 'error': message}); never raises for one row."""
    try:
        return fn(), None
    except Rejected as e:
        return None, {"skipped": str(e)}
    except Exception as e:  # noqa: BLE001 - one failing row must not end the run
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if isinstance(e, torch.OutOfMemoryError):
            return None, {"skipped": "out of memory"}
        return None, {"skipped" if UNSUPPORTED.search(str(e)) else "error": msg}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def label(r, impl):
    if r["grid"].endswith("decode"):
        return f"{r['grid']} b={r['batch']} kv={r['seqlen_k']} {r['heads_q']}/{r['heads_kv']} {impl}"
    return f"{r['grid']} d={r['hdim']} s={r['seqlen_q']}{' causal' if r['causal'] else ''} {impl}"


def measure(rows, mem, impls, device, budget_s):
    records, memory = [], []
    progress = Progress(len(rows) * len(impls) + len(mem) * len(impls))
    for r in rows:
        for impl in impls:
            ms, failure = attempt(lambda: time_row(impl, r, device, budget_s))
            rec = dict(r, impl=impl, ms=None, tflops=None, tbps=None)
            if ms is not None:
                rec["ms"] = round(ms, 5)
                if r["grid"].endswith("decode"):
                    rec["tbps"] = float(f"{kv_bytes(r) / (ms * 1e-3) / 1e12:.4g}")
                else:
                    rec["tflops"] = float(f"{flops(r) / (ms * 1e-3) / 1e12:.4g}")
            rec.update(failure or {})
            records.append(rec)
            progress.step(label(r, impl))
    for m in mem:
        for impl in impls:
            extra, failure = attempt(lambda: extra_memory(impl, m, device))
            rec = {"pass": m["pass_"], "impl": impl, "dtype": m["dtype"], "batch": m["batch"], "seqlen": m["seqlen"],
                   "heads": m["heads"], "hdim": m["hdim"], "causal": False, "extra_bytes": extra}
            rec.update(failure or {})
            memory.append(rec)
            progress.step(f"memory {m['pass_']} s={m['seqlen']} {impl}")
    progress.close()
    return records, memory


def ceilings(device):
    """matmul_bf16_tflops: torch.matmul 8192^3 in bf16; copy_tbps: bytes read + written by a 1 GiB copy."""
    if device.type != "cuda":
        return {"matmul_bf16_tflops": None, "copy_tbps": None}
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    mm = median_ms(lambda i: torch.matmul(a, b), device, 0.2)
    x = torch.randn(1 << 28, device=device)
    y = torch.empty_like(x)
    cp = median_ms(lambda i: y.copy_(x), device, 0.2)
    return {"matmul_bf16_tflops": round(2 * 8192 ** 3 / (mm * 1e-3) / 1e12, 1),
            "copy_tbps": round(2 * x.numel() * x.element_size() / (cp * 1e-3) / 1e12, 3)}


def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_slug(name, device):
    if device.type != "cuda":
        return "cpu"
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return found.group(1).lower() if found else "gpu"


def summary(records):
    """Our time over the best peer's time per row (what DESIGN asks to report): below 1.0 we are faster."""
    key = lambda x: tuple(x[k] for k in ("grid", "hdim", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv",
                                         "causal"))
    by = {}
    for x in records:
        by.setdefault(key(x), {})[x["impl"]] = x
    lines = [f"{'grid':<10} {'shape':<32} {'tileattn':>10} {'best peer':>24} {'ours/best':>9}"]
    for k, impls in by.items():
        ours = impls.get("tileattn", {})
        peers = [(x["ms"], name) for name, x in impls.items() if name != "tileattn" and x["ms"] is not None]
        best = min(peers) if peers else None
        shape = f"d={k[1]} b={k[2]} s={k[3]}/{k[4]} h={k[5]}/{k[6]}{' c' if k[7] else ''}"
        mine = f"{ours['ms']:.4f}ms" if ours.get("ms") else next((k for k in ("skipped", "error") if k in ours), "-")
        peer = f"{best[1]} {best[0]:.4f}ms" if best else "-"
        ratio = f"{ours['ms'] / best[0]:.3f}" if best and ours.get("ms") else "-"
        lines.append(f"{k[0]:<10} {shape:<32} {mine:>10} {peer:>24} {ratio:>9}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD of this checkout)")
    ap.add_argument("--smoke", action="store_true", help="a few small fp32 rows on the CPU, in seconds")
    ap.add_argument("--grids", default="fwd,bwd,decode,memory", help="subset of fwd,bwd,decode,memory (GPU)")
    ap.add_argument("--impls", help="comma-separated subset of the implementations")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds of timed calls per row and implementation (default 0.25, smoke 0.02)")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()

    if args.smoke:
        device, rows, mem, impls = torch.device("cpu"), smoke_grids(), [], ["tileattn", "torch-cpu"]
    else:
        if not torch.cuda.is_available():
            sys.exit("report.py: no CUDA device; --smoke runs the CPU rows")
        names = set(args.grids.split(","))
        device, rows = torch.device("cuda"), gpu_grids(names)
        mem = memory_grid() if "memory" in names else []
        impls = ["tileattn"] + list(sdpa_backends())
    if args.impls:
        impls = [i for i in impls if i in args.impls.split(",")]
    budget = args.budget if args.budget is not None else (0.02 if args.smoke else 0.25)

    os.makedirs(args.outdir, exist_ok=True)
    started = time.time()
    name = device_name(device)
    doc = {"device": name, "date": datetime.date.today().isoformat(), "commit": args.commit or git_commit(),
           "ceilings": ceilings(device), "tileattn": tileattn.__version__, "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None}
    doc["rows"], doc["memory"] = measure(rows, mem, impls, device, budget)
    stem = os.path.join(args.outdir, f"{doc['date']}-{device_slug(name, device)}-report")
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\n{name}, torch {doc['torch']}, ceilings {doc['ceilings']}, {time.time() - started:.0f} s")
    print(summary(doc["rows"]))
    for x in doc["rows"] + doc["memory"]:
        if "error" in x:
            print(f"error: {x['impl']} {x.get('grid', 'memory')}: {x['error']}")
    print(f"wrote {stem}.json")
    if not args.no_plots:
        try:
            import report_plots
        except ImportError as e:
            print(f"no plots: {e}")
            return
        try:
            for path in report_plots.draw(doc, stem):
                print(f"wrote {path}")
        except Exception as e:  # noqa: BLE001 - the JSON is written; a plot's failure is reported, not fatal
            print(f"plots failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
