"""The PyTorch layer: custom ops, autograd, torch.compile, CUDA streams and graphs.

Runs on the CPU wherever PyTorch is installed and on the GPU where CUDA is available; skipped without
PyTorch. A backend that declares an entry point it has not written yet ("does not support ... yet")
skips the test that needs it, with the backend's message as the reason.
"""

import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tileattn  # noqa: E402
from conftest import CPU_BACKENDS, UNSUPPORTED  # noqa: E402
from reference import dropout_keep, visible  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# bf16 on the CPU: on a processor with AMX its tile products run there, elsewhere widened to fp32.
LOW = {"cpu": [torch.float32, torch.bfloat16], "cuda": [torch.bfloat16, torch.float16]}
# The gradient sweep's dtypes (CUDA's fp16 backward is swept by the C++ GPU tests).
GRAD = {"cpu": LOW["cpu"], "cuda": [torch.bfloat16]}


def backend_for(device, entry):
    return CPU_BACKENDS[entry] if device == "cpu" else "auto"


def run(device, entry, fn, *args, **kwargs):
    """fn under the backend tested for (device, entry); skips when that backend lacks the entry point."""
    try:
        with tileattn.use_backend(backend_for(device, entry)):
            return fn(*args, **kwargs)
    except tileattn.Error as e:
        if UNSUPPORTED.search(str(e)):
            pytest.skip(f"backend: {e}")
        raise


@pytest.fixture
def gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(0, 2**62)))


def randn(gen, shape, dtype, device, requires_grad=False):
    x = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return x.requires_grad_(requires_grad)


def reference(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None, top_left=False, keep=None,
              dropout_p=0.0):
    """Attention on [b, s, h, d] tensors computed in their dtype (float64 = the oracle), differentiable."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    k, v = (x.repeat_interleave(hq // hk, dim=2) for x in (k, v))
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    vis = torch.from_numpy(visible(sq, sk, causal, window, top_left)).to(q.device)
    if alibi is not None:
        diag = 0 if top_left else sk - sq
        dist = (torch.arange(sq, device=q.device)[:, None] + diag - torch.arange(sk, device=q.device)[None]).abs()
        slopes = alibi.reshape(-1, hq, 1, 1).to(s.dtype)
        s = s - slopes * dist.to(s.dtype)
    s = s.masked_fill(~vis, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if keep is not None:
        p = p * keep.to(p.dtype) / (1 - dropout_p)
    return torch.einsum("bhij,bjhd->bihd", p, v)


def check_rule(x, baseline, oracle, floor=1e-3):
    """DESIGN.md: |x - oracle| <= 2 |baseline - oracle| + floor."""
    e = (x.double() - oracle).abs().max().item()
    eb = (baseline.double() - oracle).abs().max().item()
    assert e <= 2 * eb + floor, f"max abs error {e} vs bound {2 * eb + floor} (2 x baseline {eb} + floor {floor})"


def check_close(x, oracle, dtype):
    if dtype == torch.float32:
        err = (x.double() - oracle).abs().max().item()
        assert err <= 1e-5 * max(1.0, oracle.abs().max().item()), f"max abs error {err}"
    else:
        raise AssertionError("low precision results go through check_rule")


def compare(x, args64, kw, dtype, args_low=None):
    oracle = reference(*args64, **kw)
    if dtype == torch.float32:
        check_close(x, oracle, dtype)
    else:
        check_rule(x, reference(*args_low, **kw), oracle)


CASES = [
    dict(),
    dict(causal=True),
    dict(window=(5, 2)),
    dict(causal=True, window=(7, -1)),
    dict(softcap=8.0),
    dict(alibi=True, causal=True),
    dict(scale=0.2),
]


def case_id(c):
    return "-".join(f"{k}={v}" for k, v in c.items()) or "plain"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("shape", [(2, 33, 47, 4, 2, 64), (1, 40, 16, 2, 2, 128)], ids=["gqa", "sq>sk"])
def test_flash_attn_func_forward(gen, device, case, shape):
    for dtype in LOW[device]:
        b, sq, sk, hq, hk, d = shape
        q, k, v = randn(gen, (b, sq, hq, d), dtype, device), randn(gen, (b, sk, hk, d), dtype, device), \
            randn(gen, (b, sk, hk, d), dtype, device)
        alibi = torch.rand((b, hq), generator=gen).to(device) * 0.5 if case.get("alibi") else None
        kw = dict(scale=case.get("scale"), causal=case.get("causal", False), window=case.get("window", (-1, -1)),
                  softcap=case.get("softcap", 0.0), alibi=alibi)
        out, lse, probs = run(device, "forward", tileattn.flash_attn_func, q, k, v, softmax_scale=kw["scale"],
                              causal=kw["causal"], window_size=kw["window"], softcap=kw["softcap"],
                              alibi_slopes=alibi, return_attn_probs=True)
        assert probs is None and out.dtype == dtype and out.device == q.device and lse.dtype == torch.float32
        assert lse.shape == (b, hq, sq)
        compare(out, [x.double() for x in (q, k, v)], kw, dtype, [q, k, v])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa_matches_torch_math(gen, device, causal, gqa):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for dtype in LOW[device]:
        b, hq, sq, sk, d = 2, 4, 37, 53, 64
        hk = 2 if gqa else hq
        q, k, v = randn(gen, (b, hq, sq, d), dtype, device), randn(gen, (b, hk, sk, d), dtype, device), \
            randn(gen, (b, hk, sk, d), dtype, device)
        out = run(device, "forward", tileattn.scaled_dot_product_attention, q, k, v, is_causal=causal,
                  enable_gqa=gqa)
        assert out.shape == (b, hq, sq, d) and out.is_contiguous()  # written in place, as SDPA returns it
        with sdpa_kernel(SDPBackend.MATH):
            oracle = torch.nn.functional.scaled_dot_product_attention(
                q.double(), k.double(), v.double(), is_causal=causal, enable_gqa=gqa)
            baseline = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        if dtype == torch.float32:
            check_close(out, oracle, dtype)
        else:
            check_rule(out, baseline, oracle)


def _grads(fn, inputs, dout):
    out = fn(*inputs)
    return torch.autograd.grad(out, inputs, dout)


def _packed_varlen(fn, q, k, v, pack, **kw):
    """A batch of equal-length sequences through a varlen function: [b, s, h, d] <-> [b * s, h, d]."""
    b, s = q.shape[:2]
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=q.device)
    flat = [x.reshape(b * s, *x.shape[2:]) for x in (q, k, v)]
    return fn(*pack(*flat), cu, *(() if fn is tileattn.flash_attn_varlen_qkvpacked_func else (cu,)), s,
              *(() if fn is tileattn.flash_attn_varlen_qkvpacked_func else (s,)), **kw).reshape(q.shape)


PUBLIC = {
    "flash_attn_func": lambda q, k, v, **kw: tileattn.flash_attn_func(q, k, v, **kw),
    "varlen": lambda q, k, v, **kw: _packed_varlen(tileattn.flash_attn_varlen_func, q, k, v,
                                                   lambda *x: x, **kw),
    "varlen_qkvpacked": lambda q, k, v, **kw: _packed_varlen(tileattn.flash_attn_varlen_qkvpacked_func, q, k, v,
                                                             lambda *x: (torch.stack(x, dim=1),), **kw),
    "varlen_kvpacked": lambda q, k, v, **kw: _packed_varlen(tileattn.flash_attn_varlen_kvpacked_func, q, k, v,
                                                            lambda q, k, v: (q, torch.stack([k, v], dim=1)), **kw),
    "qkvpacked": lambda q, k, v, **kw: tileattn.flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2), **kw),
    "kvpacked": lambda q, k, v, **kw: tileattn.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), **kw),
    "sdpa": lambda q, k, v, causal=False, **kw: tileattn.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(PUBLIC))
@pytest.mark.parametrize("case", [dict(), dict(causal=True), dict(softcap=5.0, window=(6, 3))], ids=case_id)
def test_gradients_against_float64(gen, device, name, case):
    if name == "sdpa" and "softcap" in case:
        pytest.skip("scaled_dot_product_attention has no softcap or window")
    fn = lambda q, k, v: PUBLIC[name](q, k, v, **{("window_size" if a == "window" else a): x for a, x in case.items()})  # noqa: E731
    kw = dict(causal=case.get("causal", False), window=case.get("window", (-1, -1)), softcap=case.get("softcap", 0.0),
              top_left=name == "sdpa")
    for dtype in GRAD[device]:
        shape = (2, 29, 2, 64)
        q, k, v = (randn(gen, shape, dtype, device, requires_grad=True) for _ in range(3))
        dout = randn(gen, shape, dtype, device)
        got = run(device, "backward", _grads, fn, (q, k, v), dout)
        inputs64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
        want = torch.autograd.grad(reference(*inputs64, **kw), inputs64, dout.double())
        inputs_low = [x.detach().requires_grad_() for x in (q, k, v)]
        base = torch.autograd.grad(reference(*inputs_low, **kw), inputs_low, dout)
        for g, w, bl in zip(got, want, base):
            assert g.shape == w.shape and g.dtype == dtype
            if dtype == torch.float32:
                check_close(g, w, dtype)
            else:
                check_rule(g, bl, w, floor=1e-2)


@pytest.mark.parametrize("path", ["eager", "op", "flex"])
def test_double_backward_is_refused(gen, path):
    """The first-order gradients under create_graph=True are the usual ones; differentiating them
    again (a gradient penalty here) raises tileattn.Error instead of silently dropping attention's
    second-order term (it returned gradients without a graph: autograd.grad with respect to weights
    before q, k, v went through)."""
    from tileattn import _torch_ops
    calls = {
        "eager": lambda q, k, v: tileattn.flash_attn_func(q, k, v, causal=True),
        "op": lambda q, k, v: _torch_ops.fwd(q, k, v, None, None, 0, 0, None, None, True, False, -1, -1, 0.0, 0.0,
                                             False, "auto")[0],
        "flex": lambda q, k, v: tileattn.flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                        causal=True).transpose(1, 2),
    }
    x = randn(gen, (2, 9, 2, 16), torch.float32, "cpu")
    w = randn(gen, (16, 16), torch.float32, "cpu", requires_grad=True)
    with tileattn.use_backend(CPU_BACKENDS["backward"]):
        loss = torch.tanh(calls[path](x @ w, x @ w.t(), x)).sum()
        g, = torch.autograd.grad(loss, w, create_graph=True)
        w64 = w.detach().double().requires_grad_()
        loss64 = torch.tanh(reference(x.double() @ w64, x.double() @ w64.t(), x.double(), causal=True)).sum()
        check_close(g, torch.autograd.grad(loss64, w64)[0], torch.float32)
        with pytest.raises(tileattn.Error, match="the attention backward is not differentiable: a double backward"):
            torch.autograd.grad(g.square().sum(), w)
        # Without create_graph, nothing changes.
        loss = torch.tanh(calls[path](x @ w, x @ w.t(), x)).sum()
        loss.backward()
        assert w.grad is not None and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_forward_and_gradients(gen, device):
    dtype = LOW[device][0]
    lens_q, lens_k = [17, 1, 30], [20, 9, 30]
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32, device=device)
    q = randn(gen, (sum(lens_q), 4, 64), dtype, device, requires_grad=True)
    k, v = (randn(gen, (sum(lens_k), 2, 64), dtype, device, requires_grad=True) for _ in range(2))
    out = run(device, "forward", tileattn.flash_attn_varlen_func, q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
              causal=True)
    dout = randn(gen, out.shape, dtype, device)
    grads = run(device, "backward", torch.autograd.grad, out, (q, k, v), dout)
    for b in range(3):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        ins = [x.detach()[s][None].double().requires_grad_() for x, s in ((q, qs), (k, ks), (v, ks))]
        ref = reference(*ins, causal=True)
        want = torch.autograd.grad(ref, ins, dout[qs][None].double())
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(out[qs].double(), ref[0], atol=tol, rtol=0)
        for g, w, s in zip(grads, want, (qs, ks, ks)):
            torch.testing.assert_close(g[s].double(), w[0], atol=tol * 10, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_mask_and_gradients(gen, device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    b, s, h, d, p = 1, 24, 2, 32, 0.3
    q, k, v = (randn(gen, (b, s, h, d), dtype, device, requires_grad=True) for _ in range(3))
    torch.manual_seed(1234)
    out = run(device, "forward", tileattn.flash_attn_func, q, k, v, dropout_p=p, causal=True)
    dout = randn(gen, out.shape, dtype, device)
    grads = run(device, "backward", torch.autograd.grad, out, (q, k, v), dout)
    torch.manual_seed(1234)  # the op drew its Philox key from the CPU generator: draw it again
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    keep = torch.from_numpy(np.stack([dropout_keep(p, seed, 0, hh, s, s) for hh in range(h)]))[None].to(device)
    ins = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = reference(*ins, causal=True, keep=keep, dropout_p=p)
    want = torch.autograd.grad(ref, ins, dout.double())
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=0)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g.double(), w, atol=tol * 10, rtol=0)


def _cache_inputs(gen, device, dtype, b=3, cap=64, hq=8, hk=2, d=128, sq=1, s_new=1):
    k_cache, v_cache = (randn(gen, (b, cap, hk, d), dtype, device) for _ in range(2))
    q = randn(gen, (b, sq, hq, d), dtype, device)
    k_new, v_new = (randn(gen, (b, s_new, hk, d), dtype, device) for _ in range(2))
    lens = torch.tensor([0, 17, cap - s_new][:b], dtype=torch.int32, device=device)
    return q, k_cache, v_cache, k_new, v_new, lens


def _kv_oracle(q, k_cache, v_cache, lens, k_new, v_new, **kw):
    outs = []
    for b in range(q.shape[0]):
        n = int(lens[b])
        keys = torch.cat([k_cache[b, :n], k_new[b]]).double()[None]
        vals = torch.cat([v_cache[b, :n], v_new[b]]).double()[None]
        outs.append(reference(q[b:b + 1].double(), keys, vals, **kw)[0])
    return torch.stack(outs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache(gen, device, paged):
    dtype = LOW[device][0]
    q, k_cache, v_cache, k_new, v_new, lens = _cache_inputs(gen, device, dtype, sq=2, s_new=2)
    oracle = _kv_oracle(q, k_cache, v_cache, lens, k_new, v_new, causal=True)
    kw = dict(k=k_new, v=v_new, cache_seqlens=lens, causal=True, return_softmax_lse=True)
    if paged:
        page = 16
        b, cap = k_cache.shape[:2]
        perm = torch.randperm(b * cap // page, generator=gen).to(device)
        table = perm.reshape(b, cap // page).to(torch.int32)
        k_pages = torch.empty_like(k_cache.reshape(-1, page, *k_cache.shape[2:]))
        v_pages = torch.empty_like(k_pages)
        k_pages[perm] = k_cache.reshape(-1, page, *k_cache.shape[2:])
        v_pages[perm] = v_cache.reshape(-1, page, *v_cache.shape[2:])
        out, lse = run(device, "decode", tileattn.flash_attn_with_kvcache, q, k_pages, v_pages, block_table=table, **kw)
        written = k_pages[table[2, -1].long(), page - 2:]
    else:
        out, lse = run(device, "decode", tileattn.flash_attn_with_kvcache, q, k_cache, v_cache, **kw)
        written = k_cache[2, -2:]
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    torch.testing.assert_close(written, k_new[2])
    baseline = _kv_oracle(q, k_cache, v_cache, lens, k_new, v_new, causal=True).to(dtype) if dtype != torch.float32 \
        else None
    if dtype == torch.float32:
        check_close(out, oracle, dtype)
    else:
        check_rule(out, baseline, oracle, floor=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(gen, device):
    dtype = LOW[device][0]
    compile_backend = "inductor" if device == "cuda" else "aot_eager"

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, qkv, k_cache, v_cache, lens):
            a = tileattn.flash_attn_func(q, k, v, causal=True)
            b = tileattn.flash_attn_qkvpacked_func(qkv, causal=True)
            c = tileattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            d = tileattn.flash_attn_with_kvcache(q[:, -1:].detach(), k_cache, v_cache, cache_seqlens=lens)
            return a.float().sum() + b.float().sum() + c.float().sum() + d.float().sum()

    q, k, v = (randn(gen, (2, 16, 2, 64), dtype, device, requires_grad=True) for _ in range(3))
    qkv = randn(gen, (2, 16, 3, 2, 64), dtype, device, requires_grad=True)
    k_cache, v_cache = (randn(gen, (2, 32, 2, 64), dtype, device) for _ in range(2))
    lens = torch.tensor([5, 32], dtype=torch.int32, device=device)
    model = Attention()
    compiled = torch.compile(model, fullgraph=True, backend=compile_backend)
    args = (q, k, v, qkv, k_cache, v_cache, lens)
    want = run(device, "decode", model, *args)
    got = run(device, "decode", compiled, *args)
    torch.testing.assert_close(got, want)
    grads = run(device, "backward", torch.autograd.grad, got, (q, k, v, qkv))
    want_grads = run(device, "backward", torch.autograd.grad, run(device, "decode", model, *args), (q, k, v, qkv))
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w)


def test_fake_tensors_give_shapes_without_running():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 8, 4, 64, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
        k = torch.empty(2, 12, 2, 64, dtype=q.dtype, device=q.device)
        out, lse, _ = tileattn.flash_attn_func(q, k, k, return_attn_probs=True)
        assert out.shape == (2, 8, 4, 64) and lse.shape == (2, 4, 8) and lse.dtype == torch.float32
        cu = torch.empty(3, dtype=torch.int32, device=q.device)
        out = tileattn.flash_attn_varlen_func(q[0], k[0], k[0], cu, cu, 8, 12)
        assert out.shape == (8, 4, 64)
        out, lse = tileattn.flash_attn_with_kvcache(q[:, :1], k, k, return_softmax_lse=True)
        assert out.shape == (2, 1, 4, 64) and lse.shape == (2, 4, 1)
        out = tileattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2),
                                                    enable_gqa=True)
        assert out.shape == (2, 4, 8, 64) and out.is_contiguous()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_current_stream_is_used(gen):
    q, k, v = (randn(gen, (4, 256, 8, 128), torch.bfloat16, "cuda") for _ in range(3))
    want = run("cuda", "forward", tileattn.flash_attn_func, q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = run("cuda", "forward", tileattn.flash_attn_func, q, k, v, causal=True)
    side.synchronize()
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_unchecked_device_indices(gen):
    """check_device_indices=False skips the host copy of GPU-resident lengths: the same answer for
    valid ones, and a length past the capacity is clamped to it instead of raising."""
    dtype = torch.bfloat16
    q, k_cache, v_cache, _, _, lens = _cache_inputs(gen, "cuda", dtype, b=3, cap=64)
    call = lambda lens, check: tileattn.flash_attn_with_kvcache(  # noqa: E731
        q, k_cache, v_cache, cache_seqlens=lens, check_device_indices=check)
    torch.testing.assert_close(call(lens, False), call(lens, True), atol=0, rtol=0)
    too_long = torch.tensor([0, 17, 64 + 5], dtype=torch.int32, device="cuda")
    with pytest.raises(tileattn.Error, match=re.escape("cache_seqlens[2] = 69 plus 0 appended rows exceeds")):
        call(too_long, True)
    full = torch.tensor([0, 17, 64], dtype=torch.int32, device="cuda")
    torch.testing.assert_close(call(too_long, False), call(full, True), atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_graph_capture_of_decode(gen):
    dtype = torch.bfloat16
    q, k_cache, v_cache, k_new, v_new, lens = _cache_inputs(gen, "cuda", dtype, b=2, cap=256)
    lens = torch.tensor([100, 7], dtype=torch.int32, device="cuda")
    step = lambda: tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run("cuda", "decode", step)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        q.copy_(torch.randn(q.shape, generator=gen).to(q))
        k_new.copy_(torch.randn(k_new.shape, generator=gen).to(k_new))
        lens += 1
        graph.replay()
        torch.cuda.synchronize()
        oracle = _kv_oracle(q, k_cache, v_cache, lens, k_new, v_new)
        baseline = oracle.to(dtype)
        check_rule(out, baseline, oracle, floor=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_numpy_and_torch_agree(gen, device):
    dtype = torch.float32 if device == "cpu" else torch.float16  # the CUDA backend takes 16-bit inputs
    q, k, v = (randn(gen, (1, 9, 2, 32), dtype, device) for _ in range(3))
    with tileattn.use_backend(backend_for(device, "forward")):
        t_out = run(device, "forward", tileattn.flash_attn_func, q, k, v, causal=True)
    n_out = run("cpu", "forward", tileattn.flash_attn_func, *(x.float().cpu().numpy() for x in (q, k, v)), causal=True)
    assert isinstance(n_out, np.ndarray)
    np.testing.assert_allclose(t_out.float().cpu().numpy(), n_out, atol=1e-5 if device == "cpu" else 4e-3)
    assert math.isfinite(float(t_out.sum()))
