"""Every check of the core that a Python caller can reach raises tileattn.Error with the core's own
message, through the native module and through the high-level functions; so do the bindings' own
conversions and the Python layer's argument checks."""

import re

import numpy as np
import pytest

import tileattn
from tileattn import _C

REF = _C.Options(backend=_C.Backend.cpu_reference)


def t(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def i32(*values):
    return np.array(values, np.int32)


def opts(**kw):
    return _C.Options(backend=_C.Backend.cpu_reference, **kw)


def fwd(q=None, k=None, v=None, out=None, lse=None, **kw):
    q = t(1, 4, 2, 16) if q is None else q
    k = t(1, 4, 2, 16) if k is None else k
    v = t(1, 4, 2, 16) if v is None else v
    out = t(*q.shape[:-1], v.shape[-1]) if out is None else out
    kw.setdefault("options", REF)
    _C.forward(q, k, v, out, lse, **kw)


def varlen(cu_q=i32(0, 3, 4), cu_k=i32(0, 2, 4), max_q=3, max_k=2, q=None, lse=None, **kw):
    q = t(4, 2, 16) if q is None else q
    k = v = t(4, 2, 16)
    _C.forward(q, k, v, t(*q.shape), lse, cu_q, cu_k, max_q, max_k, options=kw.pop("options", REF), **kw)


def bwd(**over):
    q = t(1, 4, 2, 16)
    a = dict(q=q, k=q, v=q, out=q, dout=q, lse=t(1, 2, 4), dq=t(1, 4, 2, 16), dk=t(1, 4, 2, 16), dv=t(1, 4, 2, 16))
    a.update(over)
    _C.backward(a["q"], a["k"], a["v"], a["out"], a["dout"], a["lse"], a["dq"], a["dk"], a["dv"], options=REF)


def dec(q=None, k_cache=None, v_cache=None, options=REF, **kw):
    q = t(2, 1, 2, 16) if q is None else q
    k_cache = t(2, 8, 2, 16) if k_cache is None else k_cache
    v_cache = t(*k_cache.shape[:-1], 16) if v_cache is None else v_cache
    _C.decode(q, k_cache, v_cache, t(*q.shape), options=options, **kw)


def paged(table, lens, pages=4, page=4, **kw):
    dec(k_cache=t(pages, page, 2, 16), page_table=table, cache_seqlens=lens, **kw)


F = "tileattn::forward: "
B = "tileattn::backward: "
D = "tileattn::decode: "
C = "tileattn::combine: "

CASES = [
    # tensors: rank, contiguity, dtype, head dims, heads
    (lambda: fwd(q=t(4, 2, 16)), F + "q must have 4 dimensions, got 3 (shape [4, 2, 16])"),
    (lambda: fwd(k=t(1, 4, 2, 32)[..., ::2]), F + "k.stride[3] = 2, the last dimension must be contiguous (stride 1)"),
    (lambda: fwd(q=t(1, 4, 2, 16, dtype=np.int32)), F + "q has dtype i32, expected f32, f16 or bf16"),
    (lambda: fwd(v=t(1, 4, 2, 16, dtype=np.float16)), F + "v has dtype f16, expected f32"),
    (lambda: fwd(out=t(1, 4, 2, 16, dtype=np.float16)), F + "out has dtype f16, expected f32"),
    (lambda: fwd(q=t(1, 4, 2, 12), k=t(1, 4, 2, 12)),
     F + "q.shape[-1] (head_dim_qk) = 12, head dims must be a multiple of 8 in [8, 256]"),
    (lambda: fwd(v=t(1, 4, 2, 264)), F + "v.shape[-1] (head_dim_v) = 264, head dims must be a multiple of 8 in [8, 256]"),
    (lambda: fwd(q=t(1, 4, 0, 16), out=t(1, 4, 0, 16)), F + "q has 0 heads, expected >= 1"),
    (lambda: fwd(q=t(1, 4, 3, 16), k=t(1, 4, 2, 16), v=t(1, 4, 2, 16)),
     F + "k heads (heads_kv) = 2 must be >= 1 and divide q heads (heads_q) = 3"),
    (lambda: fwd(k=t(2, 4, 2, 16)), F + "k has shape [2, 4, 2, 16], expected [1, 4, 2, 16]"),
    (lambda: fwd(v=t(1, 5, 2, 16)), F + "v has shape [1, 5, 2, 16], expected [1, 4, 2, 16]"),
    (lambda: fwd(out=t(1, 4, 2, 8)), F + "out has shape [1, 4, 2, 8], expected [1, 4, 2, 16]"),
    (lambda: fwd(lse=t(1, 4, 2)), F + "lse has shape [1, 4, 2], expected [1, 2, 4]"),
    (lambda: fwd(lse=t(1, 2, 4, dtype=np.float16)), F + "lse has dtype f16, expected f32"),
    # options
    (lambda: fwd(options=opts(scale=float("inf"))), F + "options.scale = inf is not finite"),
    (lambda: fwd(options=opts(window_left=-2)), F + "options.window_left = -2, expected -1 (unbounded) or >= 0"),
    (lambda: fwd(options=opts(window_right=-3)), F + "options.window_right = -3, expected -1 (unbounded) or >= 0"),
    (lambda: fwd(options=opts(causal=True, window_right=2)),
     F + "options.causal = true conflicts with options.window_right = 2 (causal means 0)"),
    (lambda: fwd(options=opts(softcap=-1.0)), F + "options.softcap = -1, expected a finite value >= 0 (0 = off)"),
    (lambda: fwd(options=opts(dropout_p=1.0)), F + "options.dropout_p = 1, expected 0 <= p < 1"),
    (lambda: fwd(options=opts(num_splits=-1)), F + "options.num_splits = -1, expected >= 0 (0 = heuristic)"),
    (lambda: fwd(options=opts(sm_margin=-1)), F + "options.sm_margin = -1, expected >= 0 (0 = every SM)"),
    (lambda: fwd(options=_C.Options(backend=_C.Backend.cuda)), F + "options.backend = cuda but the tensors are on the cpu"),
    # alibi
    (lambda: fwd(alibi_slopes=t(3)), F + "alibi_slopes has shape [3], expected [2]"),
    (lambda: fwd(alibi_slopes=t(2, 2)), F + "alibi_slopes has shape [2, 2], expected [1, 2]"),
    (lambda: fwd(alibi_slopes=t(1, 1, 2)), F + "alibi_slopes must be [heads_q] or [batch, heads_q], got shape [1, 1, 2]"),
    (lambda: fwd(alibi_slopes=t(2, dtype=np.float16)), F + "alibi_slopes has dtype f16, expected f32"),
    # varlen
    (lambda: fwd(q=t(4, 2, 16), k=t(4, 2, 16), v=t(4, 2, 16), cu_seqlens_q=i32(0, 4), max_seqlen_q=4),
     F + "cu_seqlens_q and cu_seqlens_k must be given together (cu_seqlens_k is absent)"),
    (lambda: varlen(cu_q=i32(1, 3, 4)), F + "cu_seqlens_q[0] = 1, expected 0"),
    (lambda: varlen(cu_k=i32(0, 3, 2), max_k=3),
     F + "cu_seqlens_k must be non-decreasing, but cu_seqlens_k[2] = 2 < cu_seqlens_k[1] = 3"),
    (lambda: varlen(max_q=2), F + "sequence 0 has length 3 (from cu_seqlens_q) but max_seqlen_q = 2"),
    (lambda: varlen(cu_q=i32(0, 3, 5), max_q=3), F + "cu_seqlens_q[2] = 5 exceeds the 4 packed tokens"),
    (lambda: varlen(cu_q=i32(0, 3, 4).astype(np.float32)), F + "cu_seqlens_q has dtype f32, expected i32"),
    (lambda: varlen(cu_k=i32(0, 4)), F + "cu_seqlens_k has shape [2], expected [3]"),
    (lambda: varlen(max_q=-1), F + "max_seqlen_q = -1, max_seqlen_k = 2, expected >= 0"),
    (lambda: varlen(lse=t(4, 2)), F + "lse has shape [4, 2], expected [2, 4]"),
    # backward
    (lambda: _C.backward(*(t(1, 4, 2, 16),) * 5, None, *(t(1, 4, 2, 16),) * 3, options=REF),
     B + "lse is required: pass the forward's log-sum-exp"),
    (lambda: bwd(dout=t(1, 3, 2, 16)), B + "dout has shape [1, 3, 2, 16] but out has shape [1, 4, 2, 16]"),
    (lambda: bwd(dq=t(1, 4, 2, 16, dtype=np.float16)), B + "dq has dtype f16, expected f32"),
    (lambda: bwd(dk=t(1, 4, 16)), B + "dk must have 4 dimensions, got 3 (shape [1, 4, 16])"),
    (lambda: bwd(dv=t(1, 4, 2, 32)[..., ::2]), B + "dv.stride[3] = 2, the last dimension must be contiguous (stride 1)"),
    # decode
    (lambda: dec(q=t(2, 1, 2, 16, dtype=np.float16)), D + "k_cache has dtype f32, expected f16"),
    (lambda: dec(q=t(2, 1, 2, 16, dtype=np.int32)), D + "q has dtype i32, expected f32, f16 or bf16"),
    (lambda: dec(k_cache=t(3, 8, 2, 16)),
     D + "k_cache.shape[0] = 3 must equal q.shape[0] (batch) = 2 for a contiguous cache"),
    (lambda: dec(k_cache=t(2, 8, 3, 16)), D + "k_cache heads (heads_kv) = 3 must be >= 1 and divide q heads (heads_q) = 2"),
    (lambda: dec(v_cache=t(2, 7, 2, 16)), D + "v_cache has shape [2, 7, 2, 16], expected [2, 8, 2, 16]"),
    (lambda: dec(q=t(2, 1, 2, 20), k_cache=t(2, 8, 2, 20)),
     D + "q.shape[3] (head_dim_qk) = 20, head dims must be a multiple of 8 in [8, 256]"),
    (lambda: dec(lse=t(2, 1, 2)), D + "lse has shape [2, 1, 2], expected [2, 2, 1]"),
    (lambda: dec(page_table=i32(0, 1).reshape(2, 1)), D + "cache_seqlens is required with a page_table"),
    (lambda: paged(i32(0, 1, 2).reshape(3, 1), i32(1, 1)), D + "page_table has shape [3, 1], expected 2 rows (batch)"),
    (lambda: dec(k_cache=t(4, 0, 2, 16), page_table=i32(0, 1).reshape(2, 1), cache_seqlens=i32(0, 0)),
     D + "k_cache.shape[1] (page_size) = 0, expected >= 1"),
    (lambda: paged(i32(0, 7).reshape(2, 1), i32(3, 2)), D + "page_table[1, 0] = 7 is outside [0, 4) (k_cache.shape[0] pages)"),
    (lambda: paged(i32(0, 1).reshape(2, 1), i32(3, 5)),
     D + "cache_seqlens[1] = 5 plus 0 appended rows exceeds the cache capacity of 4 (page_table.shape[1] * page_size)"),
    (lambda: dec(cache_seqlens=i32(3, -1)), D + "cache_seqlens[1] = -1 is negative"),
    (lambda: dec(cache_seqlens=i32(3, 2), k_new=t(2, 7, 2, 16), v_new=t(2, 7, 2, 16)),
     D + "cache_seqlens[0] = 3 plus 7 appended rows exceeds the cache capacity of 8 (k_cache.shape[1])"),
    (lambda: dec(cache_seqlens=i32(3)), D + "cache_seqlens has shape [1], expected [2]"),
    (lambda: dec(k_new=t(2, 1, 2, 16)), D + "k_new and v_new must be given together (v_new is absent)"),
    (lambda: dec(k_new=t(2, 1, 2, 16), v_new=t(2, 1, 2, 16)),
     D + "cache_seqlens is required with k_new/v_new (where to append)"),
    (lambda: dec(k_new=t(2, 1, 2, 16), v_new=t(2, 2, 2, 16), cache_seqlens=i32(0, 0)),
     D + "v_new has shape [2, 2, 2, 16], expected [2, 1, 2, 16]"),
    (lambda: dec(rotary_cos=t(8, 4)), D + "rotary_cos and rotary_sin must be given together (rotary_sin is absent)"),
    (lambda: dec(rotary_cos=t(8, 9), rotary_sin=t(8, 9)),
     D + "rotary_cos.shape[1] = 9 gives rotary_dim = 18, expected 2 <= rotary_dim <= head_dim_qk = 16"),
    (lambda: dec(rotary_cos=t(7, 4), rotary_sin=t(7, 4)),
     D + "rotary_cos.shape[0] = 7 positions cannot cover the cache capacity of 8 (8 needed)"),
    (lambda: dec(rotary_cos=t(8, 4), rotary_sin=t(8, 2)), D + "rotary_sin has shape [8, 2], expected [8, 4]"),
    (lambda: dec(options=opts(dropout_p=0.1)), D + "options.dropout_p = 0.1, decode does not support dropout"),
    # combine
    (lambda: _C.combine(t(0, 1, 2, 2, 16), t(0, 1, 2, 2), t(1, 2, 2, 16), options=REF),
     C + "out_partial.shape[0] (splits) = 0, expected >= 1"),
    (lambda: _C.combine(t(2, 1, 3, 2, 16), t(2, 1, 3, 2), t(1, 3, 2, 16), options=REF),
     C + "lse_partial has shape [2, 1, 3, 2], expected [2, 1, 2, 3]"),
    (lambda: _C.combine(t(2, 1, 3, 2, 16, dtype=np.float16), t(2, 1, 2, 3), t(1, 3, 2, 16), options=REF),
     C + "out_partial has dtype f16, expected f32"),
    (lambda: _C.combine(t(2, 1, 3, 2, 16), t(2, 1, 2, 3), t(1, 3, 2, 8), options=REF),
     C + "out has shape [1, 3, 2, 8], expected [1, 3, 2, 16]"),
    # the bindings' conversions
    (lambda: fwd(q=t(1, 4, 2, 16, dtype=np.float64)), F + "q has dtype float64, tileattn takes f32, f16, bf16 (and i32 for index tensors, bool or uint8 for masks)"),
    (lambda: fwd(k=t(1, 4, 2, 16, dtype=np.int64)), F + "k has dtype int64, tileattn takes f32, f16, bf16 (and i32 for index tensors, bool or uint8 for masks)"),
    (lambda: fwd(q=np.zeros(()), k=t(1)), F + "q has 0 dimensions, tileattn takes 1 to 5"),
    (lambda: fwd(q=t(1, 1, 1, 1, 1, 1)), F + "q has 6 dimensions, tileattn takes 1 to 5"),
]


@pytest.mark.parametrize("call,message", CASES, ids=[m.split(": ", 1)[1][:60] for _, m in CASES])
def test_core_message(call, message):
    with pytest.raises(tileattn.Error) as info:
        call()
    assert str(info.value) == message


def test_error_is_value_and_runtime_error():
    assert issubclass(tileattn.Error, ValueError) and issubclass(tileattn.Error, RuntimeError)
    with pytest.raises(ValueError):
        fwd(q=t(4, 2, 16))
    with pytest.raises(RuntimeError):
        fwd(q=t(4, 2, 16))


def test_high_level_functions_raise_the_core_message():
    q = t(1, 4, 2, 300)
    with pytest.raises(tileattn.Error, match=re.escape("flash_attn_func: q.shape[-1] (head dim) = 300, expected 1 to")):
        tileattn.flash_attn_func(q, q, q)
    with pytest.raises(tileattn.Error, match=re.escape(F + "q must have 3 dimensions, got 4")):
        tileattn.flash_attn_varlen_func(t(1, 4, 2, 16), t(4, 2, 16), t(4, 2, 16), i32(0, 4), i32(0, 4), 4, 4)
    with pytest.raises(tileattn.Error, match=re.escape(F + "options.dropout_p = 1.5, expected 0 <= p < 1")):
        tileattn.flash_attn_func(t(1, 4, 2, 16), t(1, 4, 2, 16), t(1, 4, 2, 16), dropout_p=1.5)
    with pytest.raises(tileattn.Error, match=re.escape(D + "cache_seqlens[0] = 9 plus 0 appended rows exceeds")):
        tileattn.flash_attn_with_kvcache(t(1, 1, 2, 16), t(1, 8, 2, 16), t(1, 8, 2, 16), cache_seqlens=9)
    with pytest.raises(tileattn.Error, match=re.escape(B + "dout has shape [1, 3, 2, 16] but out has shape")):
        q = t(1, 4, 2, 16)
        tileattn.backward(t(1, 3, 2, 16), q, q, q, q, t(1, 2, 4), backend="cpu_reference")
    with pytest.raises(tileattn.Error, match=re.escape(F + "k heads (heads_kv) = 2 must be >= 1 and divide")):
        tileattn.scaled_dot_product_attention(t(1, 3, 4, 16), t(1, 2, 4, 16), t(1, 2, 4, 16), enable_gqa=True)


def test_python_layer_checks():
    q = t(1, 2, 4, 16)
    with pytest.raises(tileattn.Error, match="attn_mask is supported for PyTorch tensors only"):
        tileattn.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((4, 4), bool))
    with pytest.raises(ValueError, match="enable_gqa"):
        tileattn.scaled_dot_product_attention(t(1, 4, 4, 16), q, q)
    with pytest.raises(ValueError, match=re.escape("expected [..., heads, seq, dim]")):
        tileattn.scaled_dot_product_attention(t(4, 16), t(4, 16), t(4, 16))
    with pytest.raises(ValueError, match="backend = 'gpu'"):
        tileattn.forward(q, q, q, backend="gpu")
    with pytest.raises(TypeError, match="tileattn.forward: q is a builtins.list; expected a NumPy"):
        tileattn.forward([[1.0]], [[1.0]], [[1.0]])
    with pytest.raises(TypeError, match="tileattn.forward: max_seqlen_q = 4.0 is a float"):
        tileattn.forward(q, q, q, max_seqlen_q=4.0)
    with pytest.raises(tileattn.Error, match="tileattn.options: window_left = 2147483648 is outside"):
        tileattn.forward(q, q, q, window_left=2**31)
    with pytest.raises(TypeError, match="tileattn.decode: k_cache is a builtins.str"):
        tileattn.decode(q, "k", q)


FA = "tileattn.flash_attn_func: "
KV = "tileattn.flash_attn_with_kvcache: "
VL = "tileattn.flash_attn_varlen_func: "


def _q():
    return t(1, 4, 2, 16)


BAD_ARGUMENTS = [
    # issue: ints past 2^31, floats for ints, the wrong window, non-arrays
    (lambda: tileattn.flash_attn_func(_q(), _q(), _q(), window_size=(2**31, -1)),
     tileattn.Error, FA + "window_size[0] = 2147483648 is outside [-2147483648, 2147483647]"),
    (lambda: tileattn.flash_attn_func(_q(), _q(), _q(), window_size=(-1, -2**40)),
     tileattn.Error, FA + "window_size[1] = -1099511627776 is outside"),
    (lambda: tileattn.flash_attn_func(_q(), _q(), _q(), window_size=(1, 2, 3)),
     TypeError, FA + "window_size = (1, 2, 3), expected a pair (left, right)"),
    (lambda: tileattn.flash_attn_func(_q(), _q(), _q(), window_size=4),
     TypeError, FA + "window_size = 4, expected a pair"),
    (lambda: tileattn.flash_attn_func(_q(), _q(), _q(), window_size=(1.5, 2)),
     TypeError, FA + "window_size[0] = 1.5 is a float, expected an int"),
    (lambda: tileattn.flash_attn_func([[1.0]], _q(), _q()), TypeError, FA + "q is a builtins.list; expected a"),
    (lambda: tileattn.flash_attn_func(_q(), "k", _q()), TypeError, FA + "k is a builtins.str; expected a"),
    (lambda: tileattn.flash_attn_qkvpacked_func([1, 2]), TypeError, "flash_attn_qkvpacked_func: qkv is a builtins.list"),
    # a packed dimension larger than 3 (or 2) was read in part
    (lambda: tileattn.flash_attn_qkvpacked_func(t(1, 4, 4, 2, 16)), tileattn.Error,
     "flash_attn_qkvpacked_func: qkv has shape (1, 4, 4, 2, 16), expected (batch, seqlen, 3, nheads, d)"),
    (lambda: tileattn.flash_attn_kvpacked_func(_q(), t(1, 4, 1, 2, 16)), tileattn.Error,
     "flash_attn_kvpacked_func: kv has shape (1, 4, 1, 2, 16), expected (batch, seqlen_k, 2, nheads_k, d)"),
    (lambda: tileattn.flash_attn_varlen_qkvpacked_func(t(4, 3, 2), i32(0, 4), 4), tileattn.Error,
     "flash_attn_varlen_qkvpacked_func: qkv has shape (4, 3, 2), expected (total, 3, nheads, d)"),
    (lambda: tileattn.flash_attn_varlen_kvpacked_func(t(4, 2, 16), t(4, 3, 2, 16), i32(0, 4), i32(0, 4), 4, 4),
     tileattn.Error, "flash_attn_varlen_kvpacked_func: kv has shape (4, 3, 2, 16), expected (total_k, 2, nheads_k, d)"),
    (lambda: tileattn.set_num_threads(2**40), tileattn.Error, "tileattn.set_num_threads: n = 1099511627776 is outside"),
    # the array-level calls' options by name (the binding's error listed its whole signature)
    (lambda: tileattn.forward(_q(), _q(), _q(), dropout_p="0.1"), TypeError,
     "tileattn.options: dropout_p = '0.1' is a str, expected a number"),
    (lambda: tileattn.forward(_q(), _q(), _q(), seed=-1), tileattn.Error,
     "tileattn.options: seed = -1 is outside [0, 18446744073709551615]"),
    (lambda: tileattn.forward(_q(), _q(), _q(), offset=2**64), tileattn.Error, "tileattn.options: offset = 18446744073709551616"),
    (lambda: tileattn.forward(_q(), _q(), _q(), scale=[1.0]), TypeError, "tileattn.options: scale = [1.0] is a list"),
    (lambda: tileattn.flash_attn_func(_q(), _q(), _q(), softmax_scale="x"), TypeError, FA + "softmax_scale = 'x'"),
    (lambda: tileattn.scaled_dot_product_attention(_q(), _q(), _q(), scale="x"), TypeError,
     "tileattn.scaled_dot_product_attention: scale = 'x' is a str, expected a number"),
    (lambda: tileattn.flash_attn_varlen_func(t(4, 2, 16), t(4, 2, 16), t(4, 2, 16), i32(0, 4), i32(0, 4), 2**31, 4),
     tileattn.Error, VL + "max_seqlen_q = 2147483648 is outside [0, 2147483647]"),
    (lambda: tileattn.flash_attn_varlen_func(t(4, 2, 16), t(4, 2, 16), t(4, 2, 16), i32(0, 4), i32(0, 4), 4, 4.0),
     TypeError, VL + "max_seqlen_k = 4.0 is a float, expected an int"),
    (lambda: tileattn.flash_attn_varlen_func(t(4, 2, 16), t(4, 2, 16), t(4, 2, 16), i32(0, 4), i32(0, 4), -3, 4),
     tileattn.Error, VL + "max_seqlen_q = -3 is outside [0, 2147483647]"),
    (lambda: tileattn.flash_attn_with_kvcache(t(1, 1, 2, 16), _ro(t(1, 8, 2, 16)), t(1, 8, 2, 16), k=t(1, 1, 2, 16),
                                              v=t(1, 1, 2, 16), cache_seqlens=0),
     tileattn.Error, KV + "k_cache is read-only, but k/v are appended to it"),
    (lambda: tileattn.flash_attn_with_kvcache(t(1, 1, 2, 16), t(1, 8, 2, 16), t(1, 8, 2, 16), cache_seqlens=2**33),
     tileattn.Error, KV + "cache_seqlens = 8589934592 is outside [0, 2147483647]"),
    (lambda: tileattn.flash_attn_with_kvcache(t(1, 1, 2, 16), t(1, 8, 2, 16), t(1, 8, 2, 16), num_splits=1.0),
     TypeError, KV + "num_splits = 1.0 is a float"),
    (lambda: tileattn.flash_attn_with_kvcache(t(1, 1, 2, 16), t(1, 8, 2, 16), t(1, 8, 2, 16), window_size=(0,)),
     TypeError, KV + "window_size = (0,), expected a pair"),
    (lambda: tileattn.flash_attn_with_kvcache("q", t(1, 8, 2, 16), t(1, 8, 2, 16)), TypeError, KV + "q is a builtins.str"),
    (lambda: tileattn.flash_attn_with_kvcache(t(1, 1, 2, 16), t(4, 4, 2, 16), t(4, 4, 2, 16), cache_seqlens=i32(6),
                                              block_table=i32(0, 9).reshape(1, 2)),
     tileattn.Error, "tileattn::decode: block_table[0, 1] = 9 is outside [0, 4) (k_cache.shape[0] pages)"),
    # the native module's own: 64-bit values checked, read-only caches refused only for appends
    (lambda: _C.forward(_q(), _q(), _q(), _q(), None, max_seqlen_q=2**31),
     tileattn.Error, "tileattn::forward: max_seqlen_q = 2147483648 does not fit a 32-bit int"),
    (lambda: _C.Options(window_left=2**32), tileattn.Error, "tileattn::Options: window_left = 4294967296 does not fit"),
    (lambda: _C.decode(t(1, 1, 2, 16), t(1, 8, 2, 16), _ro(t(1, 8, 2, 16)), t(1, 1, 2, 16), k_new=t(1, 1, 2, 16),
                       v_new=t(1, 1, 2, 16), cache_seqlens=i32(0), options=REF),
     tileattn.Error, "tileattn::decode: v_cache is read-only, but k_new/v_new are appended to it"),
]


def _ro(x):
    x.flags.writeable = False
    return x


@pytest.mark.parametrize("call,kind,message", BAD_ARGUMENTS, ids=[m[:70] for _, _, m in BAD_ARGUMENTS])
def test_bad_python_arguments(call, kind, message):
    with pytest.raises(kind) as info:
        call()
    assert message in str(info.value)


def test_read_only_cache_without_append_is_read():
    q = np.random.default_rng().standard_normal((1, 1, 2, 16)).astype(np.float32)
    cache = _ro(np.random.default_rng().standard_normal((1, 8, 2, 16)).astype(np.float32))
    out = tileattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=5)
    assert out.shape == (1, 1, 2, 16) and np.isfinite(out).all()


def test_nothing_written_when_validation_fails():
    q = t(1, 4, 2, 16)
    out = np.full((1, 4, 2, 16), 7.0, np.float32)
    with pytest.raises(tileattn.Error):
        _C.forward(q, q, q, out, t(1, 4, 2), options=REF)
    assert np.all(out == 7.0)
