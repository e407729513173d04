"""flash_attn's and SDPA's call forms that the Python layer adapts (head dims of any value, paged varlen,
cache_leftpad, flash_attn's rotary bound, SDPA masks and leading dimensions), the custom ops under
torch.library.opcheck, and TILEATTN_LOG. On the CPU, float32 against the float64 reference."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tileattn  # noqa: E402
from tileattn import _log, _torch_ops  # noqa: E402
from test_torch import backend_for, check_close, randn, reference, run  # noqa: E402

F32 = torch.float32


@pytest.fixture
def gen(rng):
    return torch.Generator().manual_seed(int(rng.integers(0, 2**62)))


HDIMS = [1, 3, 7, 12, 20, 33, 64, 100, 129, 191, 255, 256]


@pytest.mark.parametrize("d", HDIMS)
def test_flash_attn_any_head_dim(gen, d):
    """Forward and gradients of flash_attn_func, the varlen and packed forms and the cache, at head dims
    that are not multiples of 8 (padded) and that are."""
    b, sq, sk, hq, hk = 2, 13, 21, 4, 2
    q = randn(gen, (b, sq, hq, d), F32, "cpu", requires_grad=True)
    k, v = (randn(gen, (b, sk, hk, d), F32, "cpu", requires_grad=True) for _ in range(2))
    out = run("cpu", "forward", tileattn.flash_attn_func, q, k, v, causal=True)
    assert out.shape == (b, sq, hq, d)
    ins64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want = reference(*ins64, causal=True)
    check_close(out, want, F32)
    dout = randn(gen, out.shape, F32, "cpu")
    got = run("cpu", "backward", torch.autograd.grad, out, (q, k, v), dout)
    for g, w in zip(got, torch.autograd.grad(want, ins64, dout.double())):
        assert g.shape == w.shape
        check_close(g, w, F32)

    cu_q = torch.tensor([0, sq, 2 * sq], dtype=torch.int32)
    cu_k = torch.tensor([0, sk, 2 * sk], dtype=torch.int32)
    flat = [x.detach().reshape(-1, *x.shape[2:]) for x in (q, k, v)]
    out_v = run("cpu", "forward", tileattn.flash_attn_varlen_func, *flat, cu_q, cu_k, sq, sk, causal=True)
    check_close(out_v.reshape(out.shape), want, F32)

    qkv = torch.stack([q.detach()[:, :, :hk], k.detach()[:, :sq], v.detach()[:, :sq]], dim=2)
    out_p = run("cpu", "forward", tileattn.flash_attn_qkvpacked_func, qkv)
    check_close(out_p, reference(*(qkv[:, :, i].double() for i in range(3))), F32)

    # The cache: padded copies, the appended row written back into the caller's cache.
    cap = 16
    k_cache, v_cache = (randn(gen, (b, cap, hk, d), F32, "cpu") for _ in range(2))
    k_new, v_new = (randn(gen, (b, 1, hk, d), F32, "cpu") for _ in range(2))
    lens = torch.tensor([3, 9], dtype=torch.int32)
    q1 = q.detach()[:, :1]
    keys = [torch.cat([k_cache[i, :int(lens[i])], k_new[i]]) for i in range(b)]
    vals = [torch.cat([v_cache[i, :int(lens[i])], v_new[i]]) for i in range(b)]
    out_c = run("cpu", "decode", tileattn.flash_attn_with_kvcache, q1, k_cache, v_cache, k=k_new, v=v_new,
                cache_seqlens=lens)
    for i in range(b):
        check_close(out_c[i:i + 1], reference(q1[i:i + 1].double(), keys[i][None].double(), vals[i][None].double()),
                    F32)
        assert torch.equal(k_cache[i, int(lens[i])], k_new[i, 0]) and torch.equal(v_cache[i, int(lens[i])], v_new[i, 0])


def test_numpy_head_dim_padding(rng):
    q, k, v = (rng.standard_normal((1, 9, 2, 5)).astype(np.float32) for _ in range(3))
    with tileattn.use_backend(backend_for("cpu", "forward")):
        out = tileattn.flash_attn_func(q, k, v)
    want = reference(*(torch.from_numpy(x).double() for x in (q, k, v)))
    check_close(torch.from_numpy(out), want, F32)


def test_head_dim_out_of_range():
    q = torch.zeros(1, 2, 1, 263)
    with pytest.raises(tileattn.Error, match=r"q.shape\[-1\] \(head dim\) = 263, expected 1 to 256"):
        tileattn.flash_attn_func(q, q, q)
    q = torch.zeros(1, 2, 1, 264)  # a multiple of 8: the core's own message
    with pytest.raises(tileattn.Error, match=r"q.shape\[-1\] \(head_dim_qk\) = 264, head dims must be"):
        tileattn.flash_attn_func(q, q, q)


def _paged(gen, cache, page):
    """cache [b, cap, h, d] as randomly placed pages and its block_table."""
    b, cap = cache.shape[:2]
    n = b * cap // page
    perm = torch.randperm(n, generator=gen)
    pages = torch.empty((n, page) + tuple(cache.shape[2:]), dtype=cache.dtype)
    pages[perm] = cache.reshape((n, page) + tuple(cache.shape[2:]))
    return pages, perm.reshape(b, cap // page).to(torch.int32)


def test_varlen_with_block_table(gen):
    lens_q, lens_k, page, cap = [5, 1, 12], [9, 30, 12], 8, 32
    hq, hk, d = 4, 2, 64
    k_cache, v_cache = (randn(gen, (3, cap, hk, d), F32, "cpu") for _ in range(2))
    k_pages, table = _paged(gen, k_cache, page)
    v_pages = torch.empty_like(k_pages)
    v_pages[table.reshape(-1).long()] = v_cache.reshape(-1, page, hk, d)
    q = randn(gen, (sum(lens_q), hq, d), F32, "cpu", requires_grad=True)
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32)
    out = run("cpu", "forward", tileattn.flash_attn_varlen_func, q, k_pages, v_pages, cu_q, cu_k, max(lens_q),
              max(lens_k), causal=True, block_table=table)
    for b in range(3):
        s = slice(int(cu_q[b]), int(cu_q[b + 1]))
        want = reference(q.detach()[s][None].double(), k_cache[b:b + 1, :lens_k[b]].double(),
                         v_cache[b:b + 1, :lens_k[b]].double(), causal=True)
        check_close(out[s][None], want, F32)
    dq, = run("cpu", "backward", torch.autograd.grad, out.sum(), (q,))
    assert dq.shape == q.shape and torch.isfinite(dq).all()
    with pytest.raises(tileattn.Error, match="flash_attn_varlen_func: block_table names page 99, outside"):
        bad = table.clone()
        bad[1, 0] = 99
        tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 12, 30, block_table=bad)
    with pytest.raises(tileattn.Error, match="exceeds the 32 rows its block_table row can address"):
        tileattn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k + torch.tensor([0, 0, 5, 5], dtype=torch.int32),
                                        12, 35, block_table=table)


@pytest.mark.parametrize("entry", ["forward", "backward"])
def test_varlen_buffer_past_the_sequences(gen, entry):
    """A packed buffer of fixed size that holds fewer tokens (cu_seqlens[-1] < its rows): the rows
    past the sequences come out as an empty sequence's, so the gradients of the whole buffer, which
    reach the projections that made q, k and v, carry no uninitialized memory (every backend: the
    CUDA one's in tests/gpu/varlen_tails_test.cpp)."""
    q = randn(gen, (23, 4, 32), F32, "cpu", requires_grad=True)
    k, v = (randn(gen, (30, 2, 32), F32, "cpu", requires_grad=True) for _ in range(2))
    cu_q, cu_k = torch.tensor([0, 6, 15], dtype=torch.int32), torch.tensor([0, 11, 20], dtype=torch.int32)
    for _ in range(2):  # the second time in memory the first call's buffers may have left behind
        out, lse, _ = run("cpu", entry, tileattn.flash_attn_varlen_func, q, k, v, cu_q, cu_k, 9, 11, causal=True,
                          return_attn_probs=True)
        assert (out[15:] == 0).all() and (lse[:, 15:] == float("-inf")).all()
        for b in range(2):
            s, t = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            check_close(out[s][None], reference(q.detach()[s][None].double(), k.detach()[t][None].double(),
                                                v.detach()[t][None].double(), causal=True), F32)
        if entry == "backward":
            dq, dk, dv = run("cpu", entry, torch.autograd.grad, out.sum(), (q, k, v))
            assert (dq[15:] == 0).all() and (dk[20:] == 0).all() and (dv[20:] == 0).all()
            assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()


def _rotate(x, cos, sin, pos, interleaved):
    """The rotary oracle, in float64: pairs (2i, 2i+1) or (i, i + r/2) rotated by angle rows `pos`."""
    half = cos.shape[1]
    c, s = cos.double()[pos][:, :, None], sin.double()[pos][:, :, None]
    y = x.double().clone()
    if interleaved:
        a, b = x.double()[..., 0:2 * half:2], x.double()[..., 1:2 * half:2]
        y[..., 0:2 * half:2], y[..., 1:2 * half:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x.double()[..., :half], x.double()[..., half:2 * half]
        y[..., :half], y[..., half:2 * half] = a * c - b * s, a * s + b * c
    return y


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_cache_leftpad(gen, rotary, interleaved):
    """Sequence b's keys are rows leftpad[b] .. cache_seqlens[b] of its cache plus the appended rows;
    rotary positions are absolute cache rows (cache_seqlens + i), causal aligned to the kept keys."""
    b, cap, hq, hk, d, sq = 3, 24, 4, 2, 32, 2
    k_cache, v_cache = (randn(gen, (b, cap, hk, d), F32, "cpu") for _ in range(2))
    k0, v0 = k_cache.clone(), v_cache.clone()
    q = randn(gen, (b, sq, hq, d), F32, "cpu")
    k_new, v_new = (randn(gen, (b, sq, hk, d), F32, "cpu") for _ in range(2))
    lens = torch.tensor([5, 20, 9], dtype=torch.int32)
    leftpad = torch.tensor([2, 0, 9], dtype=torch.int32)
    angles = torch.rand((cap, 8), generator=gen) * 6.28
    cos, sin = (angles.cos(), angles.sin()) if rotary else (None, None)
    out = run("cpu", "decode", tileattn.flash_attn_with_kvcache, q, k_cache, v_cache, k=k_new, v=v_new,
              rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved, cache_seqlens=lens,
              cache_leftpad=leftpad, causal=True)
    for i in range(b):
        n, lp = int(lens[i]), int(leftpad[i])
        pos = torch.arange(n, n + sq)[None]
        kn = _rotate(k_new[i:i + 1], cos, sin, pos, interleaved) if rotary else k_new[i:i + 1].double()
        qi = _rotate(q[i:i + 1], cos, sin, pos, interleaved) if rotary else q[i:i + 1].double()
        keys = torch.cat([k0[i:i + 1, lp:n].double(), kn], dim=1)
        vals = torch.cat([v0[i:i + 1, lp:n].double(), v_new[i:i + 1].double()], dim=1)
        check_close(out[i:i + 1], reference(qi, keys, vals, causal=True), F32)
        torch.testing.assert_close(k_cache[i, n:n + sq].double(), kn[0], atol=1e-5, rtol=0)
        assert torch.equal(k_cache[i, :n], k0[i, :n]) and torch.equal(v_cache[i, n:n + sq], v_new[i])


@pytest.mark.parametrize("leftpad,error,match", [
    ([0, -3], tileattn.Error, r"cache_leftpad\[1\] = -3, expected 0 <= cache_leftpad\[b\] <= cache_seqlens\[b\] = 10"),
    ([11, 0], tileattn.Error, r"cache_leftpad\[0\] = 11, expected 0 <= cache_leftpad\[b\] <= cache_seqlens\[b\] = 10"),
    ([0, 0, 0], tileattn.Error, r"cache_leftpad has shape \(3,\), expected \(2,\) \(batch\)"),
    (torch.tensor([0, 1]), tileattn.Error, r"cache_leftpad has dtype int64, expected int32"),
    (([0, 0], [0, 2]), tileattn.Error, r"cache_batch_idx\[1\] = 2 is outside \[0, 2\) \(k_cache.shape\[0\]\)"),
    (([0, 0], [-1, 0]), tileattn.Error, r"cache_batch_idx\[0\] = -1 is outside \[0, 2\)"),
])
def test_cache_leftpad_errors_name_it(gen, leftpad, error, match):
    """A negative pad would start a sequence in the row before its own (a valid page to every later
    check), a pad past cache_seqlens a negative length: both refused, and a cache_batch_idx out of
    range named as such, before the cache is written."""
    k_cache, v_cache = (randn(gen, (2, 16, 2, 32), F32, "cpu") for _ in range(2))
    q, k_new = randn(gen, (2, 1, 2, 32), F32, "cpu"), randn(gen, (2, 1, 2, 32), F32, "cpu")
    before = k_cache.clone()
    leftpad, batch_idx = leftpad if isinstance(leftpad, tuple) else (leftpad, None)
    pad = leftpad if torch.is_tensor(leftpad) else torch.tensor(leftpad, dtype=torch.int32)
    idx = None if batch_idx is None else torch.tensor(batch_idx, dtype=torch.int32)
    with pytest.raises(error, match=f"tileattn.flash_attn_with_kvcache: {match}"):
        tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=k_new,
                                         cache_seqlens=torch.tensor([10, 10], dtype=torch.int32), cache_leftpad=pad,
                                         cache_batch_idx=idx)
    assert torch.equal(k_cache, before)


def test_rotary_table_of_capacity_rows(gen):
    """flash_attn's bound: rotary_cos.shape[0] >= the cache capacity, even for several causal query rows
    with no append (the core's own bound counts the rows past it)."""
    b, cap, h, d, sq = 2, 16, 2, 32, 3
    k_cache, v_cache = (randn(gen, (b, cap, h, d), F32, "cpu") for _ in range(2))
    q = randn(gen, (b, sq, h, d), F32, "cpu")
    angles = torch.rand((cap, 4), generator=gen)
    lens = torch.tensor([4, 11], dtype=torch.int32)
    out = run("cpu", "decode", tileattn.flash_attn_with_kvcache, q, k_cache, v_cache, rotary_cos=angles.cos(),
              rotary_sin=angles.sin(), cache_seqlens=lens, causal=True)
    assert out.shape == q.shape and torch.isfinite(out).all()


def _sdpa_math(*args, **kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(*args, **kw)


MASKS = {
    "bool-b11s": lambda keep: keep[:, None, None, :],
    "bool-bs-rows": lambda keep: keep[:, None, None, :].expand(-1, 1, 7, -1),
    "additive": lambda keep: torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))[:, None, None, :],
}


def _check_against_math(gen, q, k, v, mask, out):
    """out and the gradients of tileattn's masked SDPA call against SDPA's math backend in float64."""
    ins = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want = _sdpa_math(*ins, attn_mask=mask if mask.dtype == torch.bool else mask.double(), enable_gqa=True)
    check_close(out, want, F32)
    dout = randn(gen, out.shape, F32, "cpu")
    got = run("cpu", "backward", torch.autograd.grad, out, (q, k, v), dout)
    for g, w in zip(got, torch.autograd.grad(want, ins, dout.double())):
        check_close(g, w, F32)


@pytest.mark.parametrize("kind", sorted(MASKS))
def test_sdpa_key_padding_mask(gen, kind):
    b, hq, hk, sq, sk, d = 3, 4, 2, 7, 19, 32
    q = randn(gen, (b, hq, sq, d), F32, "cpu", requires_grad=True)
    k, v = (randn(gen, (b, hk, sk, d), F32, "cpu", requires_grad=True) for _ in range(2))
    keep = torch.rand((b, sk), generator=gen) > 0.4
    keep[0] = True
    mask = MASKS[kind](keep)
    out = run("cpu", "forward", tileattn.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=True)
    assert out.is_contiguous() and out.shape == (b, hq, sq, d)
    _check_against_math(gen, q, k, v, mask, out)


GENERAL_MASKS = {
    "bool-per-head": lambda m: m,
    "bool-rows-shared": lambda m: m[:1, :1],
    "bool-2d": lambda m: m[0, 0],
    "additive": lambda m: torch.zeros(m.shape).masked_fill(~m, float("-inf"))[:, :1],
}


@pytest.mark.parametrize("kind", sorted(GENERAL_MASKS))
def test_sdpa_general_mask(gen, kind):
    """Boolean (and 0/-inf additive) masks that differ between heads or query rows: run block-sparse
    with the mask in the partial blocks, forward and backward against SDPA's math backend in float64.
    Rows that see no key give 0, as there."""
    b, hq, hk, sq, sk, d = 2, 4, 2, 150, 200, 32
    q = randn(gen, (b, hq, sq, d), F32, "cpu", requires_grad=True)
    k, v = (randn(gen, (b, hk, sk, d), F32, "cpu", requires_grad=True) for _ in range(2))
    keep = torch.rand((b, hq, sq, sk), generator=gen) < 0.4
    keep[..., :128, :128] = True  # a full block
    keep[..., 128:, 128:] = False  # a skipped block
    keep[..., 7, :] = False  # a row that sees no key
    mask = GENERAL_MASKS[kind](keep)
    out = run("cpu", "forward", tileattn.scaled_dot_product_attention, q, k, v, attn_mask=mask, enable_gqa=True)
    assert out.is_contiguous() and out.shape == (b, hq, sq, d)
    seen = keep.expand(b, hq, sq, sk) if kind != "additive" else keep[:, :1].expand(b, hq, sq, sk)
    empty = ~seen.any(-1)  # [b, hq, sq]
    assert bool((out[empty] == 0).all())
    _check_against_math(gen, q, k, v, mask, out)


DOCUMENT_MASKS = {
    "causal": lambda same, i, j: same & (i >= j),
    "bidirectional": lambda same, i, j: same,
    "causal-shared": lambda same, i, j: (same & (i >= j))[:1],
    "causal-additive": lambda same, i, j: torch.zeros(same.shape).masked_fill(~(same & (i >= j)), float("-inf")),
}


@pytest.mark.parametrize("kind", sorted(DOCUMENT_MASKS))
def test_sdpa_document_mask(gen, kind, capsys):
    """A block-diagonal mask (packed documents, causal within each or not) the same for every head runs
    as a variable-length batch of the documents (the log says so), forward and backward against SDPA's
    math backend in float64; one key more for one row makes it a general mask, run block-sparse."""
    b, hq, hk, s, d = 2, 4, 2, 90, 32
    q = randn(gen, (b, hq, s, d), F32, "cpu", requires_grad=True)
    k, v = (randn(gen, (b, hk, s, d), F32, "cpu", requires_grad=True) for _ in range(2))
    ids = (torch.rand((b, s), generator=gen) < 0.08).cumsum(-1)
    same = (ids[:, :, None] == ids[:, None, :])[:, None]
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    mask = DOCUMENT_MASKS[kind](same, i, j)
    broken = mask.clone()
    broken[..., s - 1, 0] = 0.0 if kind == "causal-additive" else True  # the last row sees the first key too
    for m, note in ((mask, "packed documents run as a variable-length batch"), (broken, "general mask run block-sparse")):
        _log.set_enabled(True)
        try:
            out = run("cpu", "forward", tileattn.scaled_dot_product_attention, q, k, v, attn_mask=m, enable_gqa=True)
        finally:
            _log.set_enabled(False)
        assert note in capsys.readouterr().err
        assert out.is_contiguous() and out.shape == (b, hq, s, d)
        _check_against_math(gen, q, k, v, m, out)
    out = tileattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, dropout_p=0.3)
    assert out.shape == (b, hq, s, d) and torch.isfinite(out).all()  # dropout, which block-sparse has not


def test_sdpa_mask_read_once_per_mask(gen, count_calls):
    """A mask passed again (as to every layer) is not read again: its block lists, kind and kept keys come
    from the first call; written in place, it is read anew and the result follows it; freed, its entries
    go."""
    import gc
    from tileattn import _dense_mask, _derived, _sdpa
    calls = count_calls({"lists": (_dense_mask, "_block_lists"), "kind": (_sdpa, "_key_padding"),
                         "keep": (_sdpa, "_keep")})
    b, h, s, d = 2, 2, 150, 16
    q, k, v = (randn(gen, (b, h, s, d), F32, "cpu") for _ in range(3))
    keep = torch.rand((b, h, s, s), generator=gen) < 0.5
    additive = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    entries = len(_derived._memo)
    for mask in (keep, additive):
        first = tileattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        again = tileattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.equal(first, again)
    assert calls == {"lists": 2, "kind": 2, "keep": 1}
    keep[:, :, :, 100:] = False  # in place: the next call reads the mask again
    out = tileattn.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert calls["lists"] == 3 and calls["kind"] == 3
    check_close(out, _sdpa_math(q.double(), k.double(), v.double(), attn_mask=keep), F32)
    additive[0, 0, 0, 0] = 1.5  # now a bias: refused, though the mask passed before
    with pytest.raises(tileattn.Error, match="values other than 0 and -inf"):
        tileattn.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    del keep, additive, mask
    gc.collect()
    assert len(_derived._memo) == entries


def test_sdpa_mask_refusals():
    q = torch.zeros(1, 2, 4, 16)
    with pytest.raises(tileattn.Error, match="dropout_p = 0.5 with an attn_mask that differs between heads"):
        tileattn.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool).triu(),
                                              dropout_p=0.5)
    with pytest.raises(tileattn.Error, match="attn_mask is an additive mask with values other than 0 and -inf"):
        tileattn.scaled_dot_product_attention(q, q, q, attn_mask=torch.randn(4, 4))
    with pytest.raises(tileattn.Error, match=r"attn_mask has shape \(3,\), which does not broadcast"):
        tileattn.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask and is_causal are both set"):
        tileattn.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, dtype=torch.bool), is_causal=True)
    with pytest.raises(tileattn.Error, match="attn_mask is on meta and query on cpu; expected one device"):
        tileattn.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool, device="meta"))


def test_flash_attn_refusals_name_the_argument():
    """A 0-d q, k or v, and an index or slope argument of another library than PyTorch's tensors,
    get an error naming it (they failed with an IndexError, or in the dispatcher with the op's whole
    schema); so do ALiBi slopes that require grad."""
    q = torch.zeros(2, 4, 2, 16)
    for i, name in enumerate(["q", "k", "v"]):
        args = [q, q, q]
        args[i] = torch.tensor(1.0)
        with pytest.raises(tileattn.Error, match=rf"\b{name} has 0 dimensions"):
            tileattn.flash_attn_func(*args)
    with pytest.raises(TypeError, match="alibi_slopes is a numpy.ndarray, but q is a PyTorch tensor"):
        tileattn.flash_attn_func(q, q, q, alibi_slopes=np.ones(2, np.float32))
    with pytest.raises(TypeError, match="alibi_slopes is a builtins.list"):
        tileattn.flash_attn_func(q, q, q, alibi_slopes=[1.0, 1.0])
    cu = np.array([0, 4, 8], np.int32)
    cu_t = torch.from_numpy(cu)
    for name, (cu_q, cu_k) in [("cu_seqlens_q", (cu, cu_t)), ("cu_seqlens_k", (cu_t, cu))]:
        with pytest.raises(TypeError, match=f"{name} is a numpy.ndarray, but q is a PyTorch tensor"):
            tileattn.flash_attn_varlen_func(q.view(8, 2, 16), q.view(8, 2, 16), q.view(8, 2, 16), cu_q, cu_k, 4, 4)
    for kw, name in [(dict(cache_seqlens=np.array([1, 2], np.int32)), "cache_seqlens"),
                     (dict(cache_seqlens=1, block_table=np.zeros((2, 1), np.int32)), "block_table"),
                     (dict(k=np.zeros((2, 1, 2, 16), np.float32), v=q[:, :1]), "k")]:
        with pytest.raises(TypeError, match=rf"\b{name} is a numpy.ndarray, but q is a PyTorch tensor"):
            tileattn.flash_attn_with_kvcache(q[:, :1], q, q, **kw)
    # A subclass of torch.Tensor is a tensor; slopes that require grad would get no gradient.
    slopes = torch.nn.Parameter(torch.ones(2))
    for call in (lambda: tileattn.flash_attn_func(q, q, q, alibi_slopes=slopes),
                 lambda: tileattn.flex_attention(*(q.transpose(1, 2),) * 3, alibi_slopes=slopes).transpose(1, 2)):
        with pytest.raises(tileattn.Error, match="alibi_slopes requires grad; tileattn differentiates q, k and v only"):
            call()
        with torch.no_grad():
            assert call().shape == q.shape
    assert tileattn.flash_attn_func(q, q, q, alibi_slopes=slopes.detach()).shape == q.shape


def test_sdpa_mask_that_requires_grad_is_refused():
    """SDPA differentiates an additive mask; tileattn turns it into a boolean one, so a mask that
    requires grad is refused rather than left without its gradient (detached, it runs)."""
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    m = torch.zeros(8, 8)
    m[:, 6:] = float("-inf")
    with pytest.raises(tileattn.Error, match="attn_mask requires grad; tileattn does not differentiate the mask"):
        tileattn.scaled_dot_product_attention(q, q, q, attn_mask=m.clone().requires_grad_())
    with torch.no_grad():
        tileattn.scaled_dot_product_attention(q, q, q, attn_mask=m.clone().requires_grad_())
    tileattn.scaled_dot_product_attention(q, q, q, attn_mask=m).sum().backward()
    assert q.grad is not None


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=["3d", "4d", "5d"])
def test_sdpa_leading_dims(gen, lead):
    q, k, v = (randn(gen, lead + (2, 9, 16), F32, "cpu") for _ in range(3))
    out = run("cpu", "forward", tileattn.scaled_dot_product_attention, q, k, v, is_causal=True)
    assert out.shape == q.shape and out.is_contiguous()
    check_close(out, _sdpa_math(q.double(), k.double(), v.double(), is_causal=True), F32)


def test_sdpa_grouped_gradients_and_layouts(gen):
    """The [batch, heads, seq, d] tensors cross as they are (no transposed views): grouped heads,
    causal, a head dim padded to 16, and inputs contiguous or transposes of [batch, seq, heads, d]
    memory; the output contiguous and the gradients shaped like the inputs."""
    b, hq, hk, sq, sk, d = 2, 4, 2, 9, 13, 12
    for bshd in (False, True):
        def make(h, s):
            x = randn(gen, (b, s, h, d) if bshd else (b, h, s, d), F32, "cpu")
            return (x.transpose(1, 2) if bshd else x).requires_grad_()
        q, k, v = make(hq, sq), make(hk, sk), make(hk, sk)
        out = run("cpu", "forward", tileattn.scaled_dot_product_attention, q, k, v, is_causal=True, enable_gqa=True)
        ins = [x.detach().double().requires_grad_() for x in (q, k, v)]
        want = _sdpa_math(*ins, is_causal=True, enable_gqa=True)
        check_close(out, want, F32)
        dout = randn(gen, out.shape, F32, "cpu")
        got = run("cpu", "backward", torch.autograd.grad, out, (q, k, v), dout)
        for g, x, w in zip(got, (q, k, v), torch.autograd.grad(want, ins, dout.double())):
            assert g.shape == x.shape
            check_close(g, w, F32)


def _opcheck_inputs(gen):
    q, k, v = (randn(gen, (1, 5, 2, 16), F32, "cpu", requires_grad=True) for _ in range(3))
    return q, k, v


def test_opcheck_fwd_bwd_decode(gen):
    q, k, v = _opcheck_inputs(gen)
    b = backend_for("cpu", "forward")
    for heads_first in (False, True):
        # heads_first: the [batch, heads, seq, d] tensors of SDPA's layout.
        qh, kh, vh = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)) if heads_first \
            else (q, k, v)
        args = (None, None, 0, 0, None, None, True, False, -1, -1, 0.0, 0.0, False)
        torch.library.opcheck(_torch_ops.fwd, (qh, kh, vh) + args + (b, heads_first))
        out, lse, rng = _torch_ops.fwd(qh, kh, vh, *args, b, heads_first)
        dout = torch.randn(out.shape, generator=gen)
        torch.library.opcheck(_torch_ops.bwd, (dout, qh.detach(), kh.detach(), vh.detach(), out.detach(), lse, rng)
                              + args + (backend_for("cpu", "backward"), heads_first))
    k_cache, v_cache = (torch.randn((1, 8, 2, 16), generator=gen) for _ in range(2))
    lens = torch.tensor([3], dtype=torch.int32)
    torch.library.opcheck(_torch_ops.decode_op, (q.detach()[:, :1], k_cache, v_cache, k.detach()[:, :1],
                                                 v.detach()[:, :1], lens, None, None, None, False, None, None,
                                                 True, -1, -1, 0.0, 0, True, backend_for("cpu", "decode")))


def test_log_names_the_path(gen, capsys):
    q = randn(gen, (1, 4, 2, 12), F32, "cpu")
    _log.set_enabled(True)
    try:
        run("cpu", "forward", tileattn.flash_attn_func, q, q, q, causal=True)
    finally:
        _log.set_enabled(False)
    err = capsys.readouterr().err
    assert "tileattn: forward backend=cpu_" in err and "q=1x4x2x16" in err and "causal" in err
    assert "head dims 12/12 padded to 16/16" in err


def test_log_names_the_block_sparse_path(gen, capsys):
    q = randn(gen, (1, 2, 20, 16), F32, "cpu")
    _log.set_enabled(True)
    try:
        run("cpu", "forward", tileattn.scaled_dot_product_attention, q, q, q,
            attn_mask=torch.ones(20, 20, dtype=torch.bool).triu())
    finally:
        _log.set_enabled(False)
    err = capsys.readouterr().err
    assert "tileattn: forward backend=cpu_" in err and "block-sparse dense-mask" in err
    assert "attn_mask: general mask run block-sparse" in err


def test_build_info():
    info = tileattn.build_info()
    assert info["version"] == tileattn.__version__
    assert isinstance(info["cuda"], bool) and isinstance(info["cuda_architectures"], list)
    assert isinstance(info["cpu_simd"], str) and info["cpu_simd"]
    assert isinstance(info["cpu_amx"], bool) and info["cpu_threads"] >= 1


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_decode_query_with_unaligned_strides(gen, device):
    """A query sliced out of a wider tensor (strides not multiples of 8 elements, which the GPU kernels
    cannot load 16 bytes at a time) is copied, not refused."""
    dtype = F32 if device == "cpu" else torch.bfloat16
    b, cap, h, d = 2, 32, 2, 64
    wide = randn(gen, (b, 1, h, d + 4), dtype, device)
    q = wide[..., :d]
    k_cache, v_cache = (randn(gen, (b, cap, h, d), dtype, device) for _ in range(2))
    lens = torch.tensor([7, 30], dtype=torch.int32, device=device)
    got = run(device, "decode", tileattn.flash_attn_with_kvcache, q, k_cache, v_cache, cache_seqlens=lens)
    want = run(device, "decode", tileattn.flash_attn_with_kvcache, q.contiguous(), k_cache, v_cache,
               cache_seqlens=lens)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("d", [40, 72, 100, 128])
def test_gpu_head_dims_and_masks(gen, d):
    """On the GPU (bf16): padded head dims forward and backward, a key-padding SDPA mask, cache_leftpad."""
    from test_torch import check_rule
    dt = torch.bfloat16
    q = randn(gen, (2, 33, 4, d), dt, "cuda", requires_grad=True)
    k, v = (randn(gen, (2, 47, 2, d), dt, "cuda", requires_grad=True) for _ in range(2))
    out = tileattn.flash_attn_func(q, k, v, causal=True)
    ins64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    want = reference(*ins64, causal=True)
    low = [x.detach().requires_grad_() for x in (q, k, v)]
    base = reference(*low, causal=True)
    check_rule(out, base, want)
    dout = randn(gen, out.shape, dt, "cuda")
    for g, w, bl in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(want, ins64, dout.double()),
                        torch.autograd.grad(base, low, dout)):
        check_rule(g, bl, w, floor=1e-2)
    keep = torch.rand((2, 47), generator=gen).cuda() > 0.3
    qh, kh, vh = (x.detach().transpose(1, 2) for x in (q, k, v))
    got = tileattn.scaled_dot_product_attention(qh, kh, vh, attn_mask=keep[:, None, None, :], enable_gqa=True)
    want = _sdpa_math(qh.double(), kh.double(), vh.double(), attn_mask=keep[:, None, None, :], enable_gqa=True)
    base = _sdpa_math(qh, kh, vh, attn_mask=keep[:, None, None, :], enable_gqa=True)
    check_rule(got, base, want)
