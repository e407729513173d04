#!/usr/bin/env python3
"""End-to-end training: whole models trained with each attention implementation, the FlashAttention
paper's end-to-end claim checked on this library.

Models (self-contained, no downloads, randomly initialised):
  gpt2-124m   12 layers, width 768, 12 heads of 64, LayerNorm + GELU MLP, learned positions
  gpt2-350m   24 layers, width 1024, 16 heads of 64
  llama-gqa   16 layers, width 2048, 32 query heads on 8 KV heads of 64, RMSNorm + SwiGLU, rotary
Attention implementations:
  tileattn      tileattn.flash_attn_func (causal)
  torch-cudnn   torch SDPA restricted to its cuDNN backend (PyTorch's default on Hopper)
  torch-flash   torch SDPA restricted to its FlashAttention-2 backend
  torch-math    standard attention: Q K^T, softmax, P V, the N x N matrices in memory
  torch-sdpa    torch SDPA with its own backend choice (the CPU's peer)
Each (model, seqlen, implementation) trains `--steps` AdamW steps on random tokens after `--warmup`
steps, bf16 autocast on a GPU (fp32 on the CPU), `--tokens` tokens per step (batch = tokens / seqlen),
in `--rounds` rounds (a fresh model each), the implementations in turn, every other round in reverse
order: the ratios sought are within a few percent of 1, and a drift over one pass of the
implementations (clocks, memory state) would otherwise favour whichever ran first.
Reported per row: step time (median over every round's steps), tokens/s, peak GPU memory, and the
speedup over SDPA's default (cuDNN) per model and seqlen. A row that runs out of memory is recorded
as such.

usage: train_e2e.py [--out FILE] [--models ...] [--seqlens 1024 2048 4096 8192] [--impls ...]
                    [--tokens 16384] [--steps 10] [--warmup 3] [--rounds 2] [--tiny]
--tiny: a 2-layer width-64 model, seqlen 64, two steps, on the CPU unless --device says otherwise;
the smoke test of this script.
"""
import argparse
import datetime
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import tileattn
from record_commit import record_commit

MODELS = {
    "gpt2-124m": dict(kind="gpt2", layers=12, width=768, heads=12, kv_heads=12, vocab=50304),
    "gpt2-350m": dict(kind="gpt2", layers=24, width=1024, heads=16, kv_heads=16, vocab=50304),
    "llama-gqa": dict(kind="llama", layers=16, width=2048, heads=32, kv_heads=8, vocab=32000, ffn=5632),
    "tiny": dict(kind="llama", layers=2, width=64, heads=4, kv_heads=2, vocab=128, ffn=128),
}


def attention(impl, q, k, v):
    """q [b, s, hq, d], k/v [b, s, hk, d] -> [b, s, hq, d], causal."""
    if impl == "tileattn":
        return tileattn.flash_attn_func(q, k, v, causal=True)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    gqa = q.shape[2] != k.shape[2]
    if impl == "torch-math":
        if gqa:
            kt, vt = (x.repeat_interleave(q.shape[2] // k.shape[2], dim=1) for x in (kt, vt))
        s = qt @ kt.transpose(-1, -2) * q.shape[-1] ** -0.5
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        return (s.softmax(-1) @ vt).transpose(1, 2)
    if impl == "torch-sdpa":
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa).transpose(1, 2)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"torch-cudnn": SDPBackend.CUDNN_ATTENTION, "torch-flash": SDPBackend.FLASH_ATTENTION}[impl]
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa).transpose(1, 2)


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight)


def rotary(x, cos, sin):
    a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, c, impl):
        super().__init__()
        self.c, self.impl = c, impl
        w, hd = c["width"], c["width"] // c["heads"]
        self.hd = hd
        llama = c["kind"] == "llama"
        self.norm1 = RMSNorm(w) if llama else nn.LayerNorm(w)
        self.norm2 = RMSNorm(w) if llama else nn.LayerNorm(w)
        self.qkv = nn.Linear(w, (c["heads"] + 2 * c["kv_heads"]) * hd, bias=not llama)
        self.proj = nn.Linear(w, w, bias=not llama)
        if llama:
            self.gate_up = nn.Linear(w, 2 * c["ffn"], bias=False)
            self.down = nn.Linear(c["ffn"], w, bias=False)
        else:
            self.up, self.down = nn.Linear(w, 4 * w), nn.Linear(4 * w, w)

    def forward(self, x, rope):
        b, s, _ = x.shape
        c = self.c
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([c["heads"] * self.hd, c["kv_heads"] * self.hd, c["kv_heads"] * self.hd], dim=-1)
        q, k, v = (t.view(b, s, -1, self.hd) for t in (q, k, v))
        if rope is not None:
            q, k = rotary(q, *rope), rotary(k, *rope)
        x = x + self.proj(attention(self.impl, q, k, v).reshape(b, s, -1))
        h = self.norm2(x)
        if c["kind"] == "llama":
            g, u = self.gate_up(h).chunk(2, dim=-1)
            return x + self.down(F.silu(g) * u)
        return x + self.down(F.gelu(self.up(h), approximate="tanh"))


class Model(nn.Module):
    def __init__(self, c, impl, seqlen):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c["vocab"], c["width"])
        self.pos = nn.Embedding(seqlen, c["width"]) if c["kind"] == "gpt2" else None
        self.blocks = nn.ModuleList(Block(c, impl) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["width"]) if c["kind"] == "llama" else nn.LayerNorm(c["width"])
        self.head = nn.Linear(c["width"], c["vocab"], bias=False)
        self.head.weight = self.embed.weight
        for mod in self.modules():  # GPT-2's initialisation: the loss starts near log(vocab)
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, std=0.02)
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)

    def forward(self, ids):
        s = ids.shape[1]
        x = self.embed(ids)
        rope = None
        if self.pos is not None:
            x = x + self.pos(torch.arange(s, device=ids.device))
        else:
            hd = self.c["width"] // self.c["heads"]
            inv = 10000.0 ** (-torch.arange(0, hd, 2, device=ids.device, dtype=torch.float32) / hd)
            ang = torch.arange(s, device=ids.device, dtype=torch.float32)[:, None] * inv
            rope = (ang.cos()[:, None, :], ang.sin()[:, None, :])
        for blk in self.blocks:
            x = blk(x, rope)
        return self.head(self.norm(x))


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_row(model_name, impl, seqlen, tokens, steps, warmup, device):
    c = MODELS[model_name]
    batch = max(1, tokens // seqlen)
    torch.manual_seed(0)
    row = dict(grid="e2e", model=model_name, impl=impl, seqlen=seqlen, batch=batch, layers=c["layers"],
               width=c["width"], heads_q=c["heads"], heads_kv=c["kv_heads"], hdim=c["width"] // c["heads"],
               dtype="bf16" if device == "cuda" else "f32")
    model = opt = None
    try:
        model = Model(c, impl, seqlen).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
        ids = torch.randint(0, c["vocab"], (batch, seqlen + 1), device=device)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for i in range(warmup + steps):
            sync(device)
            t = time.perf_counter()
            with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - t)
                losses.append(float(loss.detach()))
        row.update(times=times, loss=round(losses[-1], 4), finite=all(math.isfinite(x) for x in losses),
                   peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3) if device == "cuda" else None)
    except torch.cuda.OutOfMemoryError:
        row.update(step_ms=None, tokens_per_s=None, peak_gib=None, error="out of memory")
    except (RuntimeError, tileattn.Error) as e:  # a backend that does not take this shape or dtype
        row.update(step_ms=None, tokens_per_s=None, peak_gib=None, error=str(e).splitlines()[0][:200])
    finally:
        del model, opt
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def merge_rounds(runs):
    """One row from an implementation's rounds: the median step over every round's steps."""
    row = dict(runs[0])
    failed = next((r for r in runs if "error" in r), None)
    if failed:
        return dict(failed, rounds=len(runs))
    times = [t for r in runs for t in r["times"]]
    step = statistics.median(times)
    del row["times"]
    row.update(step_ms=round(step * 1e3, 3), tokens_per_s=round(row["batch"] * row["seqlen"] / step, 1),
               finite=all(r["finite"] for r in runs), rounds=len(runs))
    if row["peak_gib"] is not None:
        row["peak_gib"] = max(r["peak_gib"] for r in runs)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", nargs="+", default=["gpt2-124m", "gpt2-350m", "llama-gqa"])
    ap.add_argument("--seqlens", nargs="+", type=int, default=[1024, 2048, 4096, 8192])
    ap.add_argument("--impls", nargs="+")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args(argv)
    if a.tiny:
        a.models, a.seqlens, a.tokens, a.steps, a.warmup, a.rounds = ["tiny"], [64], 128, 2, 1, 2
        if a.device == "cuda" and not torch.cuda.is_available():
            a.device = "cpu"
    if a.impls is None:
        a.impls = ["tileattn", "torch-cudnn", "torch-flash", "torch-math"] if a.device == "cuda" else \
            ["tileattn", "torch-sdpa", "torch-math"]
    rows = []
    peer = next((p for p in ("torch-cudnn", "torch-sdpa") if p in a.impls), a.impls[-1])
    print(f"{'model':10} {'seqlen':>6} {'impl':12} {'step ms':>9} {'tok/s':>10} {'peak GiB':>9} {'vs ' + peer:>10}")
    for m in a.models:
        for s in a.seqlens:
            runs = {impl: [] for impl in a.impls}
            for rnd in range(a.rounds):  # every other round in reverse, so that no implementation runs first always
                for impl in a.impls if rnd % 2 == 0 else a.impls[::-1]:
                    runs[impl].append(run_row(m, impl, s, a.tokens, a.steps, a.warmup, a.device))
            group = [merge_rounds(runs[impl]) for impl in a.impls]
            base = next((r for r in group if r["impl"] == peer), None)
            for r in group:
                if base and base.get("step_ms") and r.get("step_ms"):
                    r["speedup_vs_" + peer.replace("-", "_")] = round(base["step_ms"] / r["step_ms"], 3)
                sp = r.get("speedup_vs_" + peer.replace("-", "_"))
                print(f"{m:10} {s:6} {r['impl']:12} {r.get('step_ms') or float('nan'):9.2f} "
                      f"{r.get('tokens_per_s') or float('nan'):10.0f} {r.get('peak_gib') or float('nan'):9.3f} "
                      f"{sp if sp else r.get('error', '-')!s:>10}")
            rows += group
    record = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
              "date": datetime.date.today().isoformat(), "commit": record_commit(), "torch": torch.__version__,
              "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    return record


if __name__ == "__main__":
    main()
