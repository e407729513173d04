"""The package on NumPy arrays (CPU) against the float64 oracle in reference.py: every flash_attn-style
function, SDPA on BHSD views, the C++ entry points (forward, backward with dropout, decode, combine)."""

import numpy as np
import pytest

import tileattn
from conftest import CPU_BACKENDS
from reference import (assert_f32_close, attention, check_rule, f64, np_dtype, rotary, standard_attention,
                       varlen_attention)

FWD = CPU_BACKENDS["forward"]
BWD = CPU_BACKENDS["backward"]
DEC = CPU_BACKENDS["decode"]


def randn(rng, shape, dtype="f32"):
    return rng.standard_normal(shape).astype(np_dtype(dtype))


def check(x, oracle, dtype="f32", baseline=None):
    if dtype == "f32":
        assert_f32_close(x, oracle)
    else:
        check_rule(x, baseline, oracle)


CASES = [
    dict(),
    dict(causal=True),
    dict(causal=True, window=(3, 0)),
    dict(window=(2, 1)),
    dict(softcap=5.0),
    dict(alibi="heads"),
    dict(alibi="batch", causal=True),
    dict(scale=0.3, softcap=2.0, window=(4, 4)),
]


def _alibi(rng, kind, b, h):
    if kind is None:
        return None
    shape = (h,) if kind == "heads" else (b, h)
    return rng.uniform(0.05, 1.0, shape).astype(np.float32)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize("shape", [(2, 7, 9, 4, 2, 16), (1, 12, 5, 2, 2, 32)], ids=["gqa-sq<sk", "mha-sq>sk"])
def test_flash_attn_func(rng, dtype, case, shape):
    b, sq, sk, hq, hk, d = shape
    q, k, v = randn(rng, (b, sq, hq, d), dtype), randn(rng, (b, sk, hk, d), dtype), randn(rng, (b, sk, hk, d), dtype)
    alibi = _alibi(rng, case.get("alibi"), b, hq)
    kw = dict(scale=case.get("scale"), causal=case.get("causal", False), window=case.get("window", (-1, -1)),
              softcap=case.get("softcap", 0.0), alibi=alibi)
    with tileattn.use_backend(FWD):
        out, lse, probs = tileattn.flash_attn_func(
            q, k, v, softmax_scale=kw["scale"], causal=kw["causal"], window_size=kw["window"], softcap=kw["softcap"],
            alibi_slopes=alibi, return_attn_probs=True)
    assert probs is None
    assert out.shape == (b, sq, hq, d) and out.dtype == q.dtype
    assert lse.shape == (b, hq, sq) and lse.dtype == np.float32
    ref_out, ref_lse = attention(f64(q), f64(k), f64(v), **kw)
    baseline = None if dtype == "f32" else standard_attention(q, k, v, np_dtype(dtype), **kw)
    check(out, ref_out, dtype, baseline)
    assert_f32_close(lse, ref_lse, 1e-5 if dtype == "f32" else 1e-2)


def test_causal_overrides_right_window_like_flash_attn(rng):
    q, k, v = (randn(rng, (1, 6, 2, 16)) for _ in range(3))
    with tileattn.use_backend(FWD):
        out = tileattn.flash_attn_func(q, k, v, causal=True, window_size=(2, 5))
    assert_f32_close(out, attention(q, k, v, causal=True, window=(2, -1))[0])


def test_rows_without_keys_give_zero_and_minus_inf(rng):
    q, k, v = randn(rng, (1, 6, 2, 16)), randn(rng, (1, 3, 2, 16)), randn(rng, (1, 3, 2, 16))
    with tileattn.use_backend(FWD):
        out, lse, _ = tileattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[:, :3] == 0) and np.all(np.isneginf(lse[:, :, :3]))
    assert np.all(np.isfinite(out))


def test_large_logits_stay_finite(rng):
    q, k, v = (randn(rng, (1, 8, 1, 16)) for _ in range(3))
    q *= 100.0
    k *= 100.0
    with tileattn.use_backend(FWD):
        out = tileattn.flash_attn_func(q, k, v)
    assert np.all(np.isfinite(out))
    assert_f32_close(out, attention(q, k, v)[0])


def test_packed_variants(rng):
    b, s, h, d = 2, 5, 2, 16
    qkv = randn(rng, (b, s, 3, h, d))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    ref = attention(q, k, v, causal=True)[0]
    with tileattn.use_backend(FWD):
        assert_f32_close(tileattn.flash_attn_qkvpacked_func(qkv, causal=True), ref)
        assert_f32_close(tileattn.flash_attn_kvpacked_func(np.ascontiguousarray(q), qkv[:, :, 1:], causal=True), ref)


def _varlen_inputs(rng, lens_q, lens_k, hq, hk, d, dtype="f32"):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = randn(rng, (cu_q[-1], hq, d), dtype)
    k, v = randn(rng, (cu_k[-1], hk, d), dtype), randn(rng, (cu_k[-1], hk, d), dtype)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
def test_varlen(rng, causal):
    lens_q, lens_k = [3, 1, 6, 0], [5, 4, 6, 2]
    q, k, v, cu_q, cu_k = _varlen_inputs(rng, lens_q, lens_k, 4, 2, 16)
    alibi = rng.uniform(0.1, 0.5, (4, 4)).astype(np.float32)
    with tileattn.use_backend(FWD):
        out, lse, _ = tileattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                                     alibi_slopes=alibi, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    ref_out, ref_lse = varlen_attention(q, k, v, cu_q, cu_k, causal=causal, alibi=alibi)
    assert_f32_close(out, ref_out)
    assert_f32_close(lse, ref_lse)


def test_varlen_packed_variants(rng):
    lens = [4, 7, 2]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    qkv = randn(rng, (cu[-1], 3, 2, 16))
    ref = varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, causal=True)[0]
    with tileattn.use_backend(FWD):
        assert_f32_close(tileattn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True), ref)
        assert_f32_close(tileattn.flash_attn_varlen_kvpacked_func(
            np.ascontiguousarray(qkv[:, 0]), qkv[:, 1:], cu, cu, max(lens), max(lens), causal=True), ref)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa_on_bhsd_views(rng, causal, gqa):
    b, hq, sq, sk, d = 2, 4, 9, 5, 16
    hk = 2 if gqa else hq
    q, k, v = randn(rng, (b, hq, sq, d)), randn(rng, (b, hk, sk, d)), randn(rng, (b, hk, sk, d))
    with tileattn.use_backend(FWD):
        out = tileattn.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.2, enable_gqa=gqa)
    assert out.shape == (b, hq, sq, d)
    # The output is the transposed [b, s, h, d] result, not a copy.
    assert out.base is not None and out.strides[1] == d * 4 and out.strides[2] == hq * d * 4
    t = lambda x: x.swapaxes(1, 2)  # noqa: E731
    ref = attention(t(q), t(k), t(v), scale=0.2, causal=causal, top_left=True)[0]
    assert_f32_close(t(out), ref)


def test_strided_views_without_copies(rng):
    # Every other head of a wider tensor, and sequences in reverse: strides a copy would lose.
    big = randn(rng, (2, 6, 8, 16))
    q, k, v = big[:, :, ::2], big[:, ::-1, 1::2], big[:, :, 1::4]
    assert not q.flags.c_contiguous
    k2 = np.ascontiguousarray(k[:, :, :2])
    with tileattn.use_backend(FWD):
        out, lse = tileattn.forward(q, k2, v, causal=True, backend=FWD)
    assert_f32_close(out, attention(q, k2, v, causal=True)[0])


def test_last_dim_copied_like_flash_attn(rng):
    q = randn(rng, (1, 4, 2, 32))[..., ::2]
    with tileattn.use_backend(FWD):
        out = tileattn.flash_attn_func(q, q, q)
    assert_f32_close(out, attention(q, q, q)[0])


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("case", [dict(), dict(causal=True, softcap=3.0), dict(window=(2, 1), alibi=True)],
                         ids=["plain", "causal-softcap", "window-alibi"])
def test_backward(rng, dropout_p, case):
    b, sq, sk, hq, hk, d = 2, 6, 7, 4, 2, 16
    q, k, v = randn(rng, (b, sq, hq, d)), randn(rng, (b, sk, hk, d)), randn(rng, (b, sk, hk, d))
    dout = randn(rng, (b, sq, hq, d))
    alibi = rng.uniform(0.1, 0.5, (hq,)).astype(np.float32) if case.get("alibi") else None
    seed, offset = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**40))
    opts = dict(causal=case.get("causal", False), softcap=case.get("softcap", 0.0), dropout_p=dropout_p, seed=seed,
                offset=offset)
    window = case.get("window", (-1, -1))
    out, lse = tileattn.forward(q, k, v, alibi_slopes=alibi, window_left=window[0], window_right=window[1],
                                backend=FWD, **opts)
    dq, dk, dv = tileattn.backward(dout, q, k, v, out, lse, alibi_slopes=alibi, window_left=window[0],
                                   window_right=window[1], backend=BWD, **opts)
    ref = attention(q, k, v, window=window, alibi=alibi, dout=dout, **opts)
    for got, want in zip((out, lse, dq, dk, dv), ref):
        assert_f32_close(got, want)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_dropout_keeps_expected_fraction(rng):
    q, k = randn(rng, (1, 64, 2, 16)), randn(rng, (1, 64, 2, 16))
    v = np.ones((1, 64, 2, 16), np.float32)
    out, _ = tileattn.forward(q, k, v, dropout_p=0.25, seed=int(rng.integers(0, 2**63)), backend=FWD)
    # Each output element is sum_j P_ij keep_ij / (1 - p): 1 in expectation.
    assert abs(out.mean() - 1.0) < 0.05


def test_varlen_backward(rng):
    lens_q, lens_k = [3, 5], [4, 5]
    q, k, v, cu_q, cu_k = _varlen_inputs(rng, lens_q, lens_k, 2, 1, 16)
    dout = randn(rng, q.shape)
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=5, causal=True)
    out, lse = tileattn.forward(q, k, v, backend=FWD, **args)
    dq, dk, dv = tileattn.backward(dout, q, k, v, out, lse, backend=BWD, **args)
    for b in range(2):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        _, _, rq, rk, rv = attention(q[None, qs], k[None, ks], v[None, ks], causal=True, dout=dout[None, qs])
        assert_f32_close(dq[qs], rq[0])
        assert_f32_close(dk[ks], rk[0])
        assert_f32_close(dv[ks], rv[0])


def _kv_reference(q, k_cache, v_cache, lens, k_new=None, v_new=None, **kw):
    """Decode oracle: sequence b attends to its cache rows [0, lens[b]) plus the appended rows."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        keys, vals = f64(k_cache[b, :lens[b]]), f64(v_cache[b, :lens[b]])
        if k_new is not None:
            keys, vals = np.concatenate([keys, f64(k_new[b])]), np.concatenate([vals, f64(v_new[b])])
        o, l = attention(f64(q[b:b + 1]), keys[None], vals[None], **kw)
        outs.append(o[0])
        lses.append(l[0])
    return np.stack(outs), np.stack(lses)


@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_append_in_place(rng, causal):
    b, cap, hq, hk, d, sq = 3, 12, 4, 2, 16, 2
    k_cache, v_cache = randn(rng, (b, cap, hk, d)), randn(rng, (b, cap, hk, d))
    q, k_new, v_new = randn(rng, (b, sq, hq, d)), randn(rng, (b, sq, hk, d)), randn(rng, (b, sq, hk, d))
    lens = np.array([0, 5, 10], np.int32)
    ref_out, ref_lse = _kv_reference(q, k_cache, v_cache, lens, k_new, v_new, causal=causal)
    k_before = k_cache.copy()
    with tileattn.use_backend(DEC):
        out, lse = tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens,
                                                    causal=causal, return_softmax_lse=True)
    assert_f32_close(out, ref_out)
    assert_f32_close(lse, ref_lse)
    for i in range(b):  # appended rows written in place, nothing else touched
        np.testing.assert_array_equal(k_cache[i, lens[i]:lens[i] + sq], k_new[i])
        np.testing.assert_array_equal(v_cache[i, lens[i]:lens[i] + sq], v_new[i])
        np.testing.assert_array_equal(k_cache[i, :lens[i]], k_before[i, :lens[i]])


def test_kvcache_int_seqlens_and_full_capacity(rng):
    b, cap, h, d = 2, 8, 2, 16
    k_cache, v_cache, q = randn(rng, (b, cap, h, d)), randn(rng, (b, cap, h, d)), randn(rng, (b, 1, h, d))
    with tileattn.use_backend(DEC):
        assert_f32_close(tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=5),
                         _kv_reference(q, k_cache, v_cache, [5, 5])[0])
        assert_f32_close(tileattn.flash_attn_with_kvcache(q, k_cache, v_cache),
                         _kv_reference(q, k_cache, v_cache, [cap, cap])[0])


def test_kvcache_paged(rng):
    b, page, pages_per_seq, hk, hq, d = 2, 4, 3, 1, 2, 16
    num_pages = 7
    k_pages, v_pages = randn(rng, (num_pages, page, hk, d)), randn(rng, (num_pages, page, hk, d))
    table = rng.permutation(num_pages)[:b * pages_per_seq].reshape(b, pages_per_seq).astype(np.int32)
    lens = np.array([9, 4], np.int32)
    q, k_new, v_new = randn(rng, (b, 2, hq, d)), randn(rng, (b, 2, hk, d)), randn(rng, (b, 2, hk, d))
    k_flat, v_flat = k_pages[table].reshape(b, -1, hk, d), v_pages[table].reshape(b, -1, hk, d)
    ref = _kv_reference(q, k_flat, v_flat, lens, k_new, v_new, causal=True)[0]
    with tileattn.use_backend(DEC):
        out = tileattn.flash_attn_with_kvcache(q, k_pages, v_pages, k=k_new, v=v_new, cache_seqlens=lens,
                                               block_table=table, causal=True)
    assert_f32_close(out, ref)
    np.testing.assert_array_equal(k_pages[table[0, 2], 1:3], k_new[0])


def test_kvcache_batch_idx(rng):
    rows, cap, h, d = 4, 6, 2, 16
    k_cache, v_cache = randn(rng, (rows, cap, h, d)), randn(rng, (rows, cap, h, d))
    idx = np.array([2, 0], np.int32)
    q, lens = randn(rng, (2, 1, h, d)), np.array([3, 6], np.int32)
    with tileattn.use_backend(DEC):
        out = tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, cache_batch_idx=idx)
    assert_f32_close(out, _kv_reference(q, k_cache[idx], v_cache[idx], lens)[0])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_rotary(rng, interleaved, causal):
    b, cap, h, d, rot, sq = 2, 10, 2, 32, 16, 3
    k_cache, v_cache = randn(rng, (b, cap, h, d)), randn(rng, (b, cap, h, d))
    q, k_new, v_new = randn(rng, (b, sq, h, d)), randn(rng, (b, sq, h, d)), randn(rng, (b, sq, h, d))
    angle = rng.uniform(0, 6.3, (cap + sq - 1, rot // 2))  # causal: query row i sits at length + i
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    lens = np.array([2, 7], np.int32)
    k_rot = rotary(k_new, cos, sin, lens[:, None] + np.arange(sq)[None], interleaved)
    q_pos = lens[:, None] + (np.arange(sq)[None] if causal else 0 * np.arange(sq)[None])
    q_rot = rotary(q, cos, sin, q_pos, interleaved)
    ref = _kv_reference(q_rot, k_cache, v_cache, lens, k_rot, v_new, causal=causal)[0]
    with tileattn.use_backend(DEC):
        out = tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                                               cache_seqlens=lens, causal=causal, rotary_interleaved=interleaved)
    assert_f32_close(out, ref)
    assert_f32_close(k_cache[1, 7:10], k_rot[1])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_kvcache_low_precision(rng, dtype):
    b, cap, h, d = 2, 16, 2, 64
    k_cache, v_cache, q = randn(rng, (b, cap, h, d), dtype), randn(rng, (b, cap, h, d), dtype), randn(rng, (b, 1, h, d), dtype)
    with tileattn.use_backend(DEC):
        out = tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=3)
    assert out.dtype == q.dtype
    check(out, _kv_reference(q, k_cache, v_cache, [cap, cap])[0], dtype,
          standard_attention(q, k_cache, v_cache, np_dtype(dtype)))


def test_combine_merges_key_splits(rng):
    q, k, v = randn(rng, (2, 3, 2, 16)), randn(rng, (2, 10, 2, 16)), randn(rng, (2, 10, 2, 16))
    parts = [tileattn.forward(q, k[:, s], v[:, s], backend=FWD) for s in (slice(0, 4), slice(4, 10))]
    out_partial = np.stack([p[0] for p in parts])
    lse_partial = np.stack([p[1] for p in parts])
    out, lse = tileattn.combine(out_partial, lse_partial)
    ref_out, ref_lse = attention(q, k, v)
    assert_f32_close(out, ref_out)
    assert_f32_close(lse, ref_lse)
    half, _ = tileattn.combine(out_partial, lse_partial, out=np.empty(q.shape, np.float16))
    assert half.dtype == np.float16


def test_scratch_callable_gets_the_reported_size(rng):
    """A workspace callable is asked for what *_workspace_size reports, call after call (the native
    module keeps recent sizes rather than query them each time) and after the arguments change."""
    asked = []

    def scratch(n):
        asked.append(n)
        return np.empty(n, np.uint8)
    for s, causal in ((16, True), (16, True), (40, True), (40, False), (16, True)):
        q, k, v, dout = (randn(rng, (1, s, 2, 16)) for _ in range(4))
        out, lse = np.empty_like(q), np.empty((1, 2, s), np.float32)
        dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
        opts = tileattn.Options(backend=tileattn.Backend.cpu_flash, causal=causal)
        for want, call in ((tileattn._C.forward_workspace_size(q, k, v, out, lse, options=opts),
                            lambda: tileattn._C.forward(q, k, v, out, lse, options=opts, workspace=scratch)),
                           (tileattn._C.backward_workspace_size(q, k, v, out, dout, lse, dq, dk, dv, options=opts),
                            lambda: tileattn._C.backward(q, k, v, out, dout, lse, dq, dk, dv, options=opts,
                                                         workspace=scratch))):
            asked.clear()
            call()
            assert asked == ([want] if want > 0 else [])
        ref_out, _ = attention(q, k, v, causal=causal)
        assert_f32_close(out, ref_out)


def test_workspace_sizes_and_runtime():
    q = np.zeros((1, 4, 2, 16), np.float32)
    out = np.empty_like(q)
    lse = np.empty((1, 2, 4), np.float32)
    opts = tileattn.Options(backend=tileattn.Backend.cpu_reference, causal=True)
    assert tileattn._C.forward_workspace_size(q, q, q, out, lse, options=opts) >= 0
    assert tileattn._C.backward_workspace_size(q, q, q, out, q, lse, out.copy(), out.copy(), out.copy(),
                                               options=opts) >= 0
    assert tileattn._C.decode_workspace_size(q, q.copy(), q.copy(), out, lse, options=opts) >= 0
    assert opts.causal and opts.scale is None and opts.window_left == -1 and opts.stream == 0
    opts.scale = 0.5
    assert opts.scale == 0.5
    stats = tileattn.memory_stats()
    assert stats.peak_bytes >= stats.current_bytes >= 0
    tileattn.reset_peak_memory()
    saved = tileattn.num_threads()
    tileattn.set_num_threads(1)
    assert tileattn.num_threads() == 1
    with pytest.raises(tileattn.Error, match=r"set_num_threads: n = -1 is outside \[0, 2147483647\]"):
        tileattn.set_num_threads(-1)
    with pytest.raises(TypeError, match=r"set_num_threads: n = 1.5 is a float, expected an int"):
        tileattn.set_num_threads(1.5)
    assert tileattn.num_threads() == 1
    tileattn.set_num_threads(saved)


def test_empty_inputs(rng):
    q, kv = randn(rng, (2, 0, 2, 16)), randn(rng, (2, 5, 2, 16))
    with tileattn.use_backend(FWD):
        assert tileattn.flash_attn_func(q, kv, kv).shape == (2, 0, 2, 16)
        out, lse, _ = tileattn.flash_attn_func(randn(rng, (1, 3, 2, 16)), q[:1], q[:1], return_attn_probs=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
