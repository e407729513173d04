"""flash_attn's (v2) public functions with its names, arguments, defaults, shapes and return values,
so that switching is an import change.

PyTorch tensors go through the custom ops of _torch_ops (autograd, torch.compile, CUDA streams);
NumPy and CuPy arrays through _functional (forward only). Head dims 1 to 256 of any value (padded
to a multiple of 8 here, as flash_attn does), paged varlen batches (block_table), cache_leftpad and
flash_attn's rotary table bound are all taken (see _adapt for how).

return_attn_probs: flash_attn returns (out, softmax_lse, S_dmask), where S_dmask is a debugging
aid (the dropout-masked probabilities, and only with dropout). tileattn never materializes the
probabilities, so the third element is always None; out and softmax_lse are exact.
"""

import numpy as np

from . import _C, _adapt, _checks, _config, _functional, _log
from ._arrays import contiguous_last, full_int32, is_torch


_tensor_type = None  # torch.Tensor once a call has passed one (importing torch here would slow NumPy users)


def _plain_torch(q, k, v):
    global _tensor_type
    t = type(q)
    if t is _tensor_type:
        return type(k) is t and type(v) is t
    if t is type(k) and t is type(v) and t.__name__ == "Tensor" and t.__module__ == "torch":
        _tensor_type = t
        return True
    return False


def _attend(fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
            causal, window_size, softcap, alibi_slopes, deterministic, top_left=False, heads_first=False,
            need_lse=True):
    """(out, lse). heads_first (PyTorch tensors only): q, k, v and out are [batch, heads, seq, d].
    need_lse False: the caller discards lse, which may then be None."""
    # The common case (plain tensors, default window, int lengths) is checked with a few identity
    # tests: this is the per-call host time that small models and decode loops pay.
    torch_call = _plain_torch(q, k, v)
    if not torch_call:
        _checks.array(fn, "q", q), _checks.array(fn, "k", k), _checks.array(fn, "v", v)
        torch_call = is_torch(q)
    if window_size == (-1, -1):
        window_left = window_right = -1
    else:
        window_left, window_right = _checks.window(fn, window_size, causal)
    scale = None if softmax_scale is None else _checks.number(fn, "softmax_scale", softmax_scale)
    if type(max_seqlen_q) is not int or not 0 <= max_seqlen_q <= _checks.INT_MAX:
        max_seqlen_q = _checks.integer(fn, "max_seqlen_q", max_seqlen_q, 0)
    if type(max_seqlen_k) is not int or not 0 <= max_seqlen_k <= _checks.INT_MAX:
        max_seqlen_k = _checks.integer(fn, "max_seqlen_k", max_seqlen_k, 0)
    if type(softcap) is not float:
        softcap = _checks.number(fn, "softcap", softcap)
    if type(dropout_p) is not float:
        dropout_p = _checks.number(fn, "dropout_p", dropout_p)
    if causal is not True and causal is not False:
        causal = bool(causal)
    if deterministic is not False and deterministic is not True:
        deterministic = bool(deterministic)
    try:
        dqk, dv = q.shape[-1], v.shape[-1]
    except IndexError:  # a 0-d array: the core names it
        dqk = dv = 8
    padded = dqk % 8 or dv % 8
    if padded:
        q, k, v, real_dim = _adapt.pad_heads(fn, q, k, v)
        if scale is None:
            scale = real_dim ** -0.5
    if torch_call:
        if cu_seqlens_q is not None or cu_seqlens_k is not None or alibi_slopes is not None:
            _checks.torch_tensors(fn, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, alibi_slopes=alibi_slopes)
            _checks.not_differentiated(fn, "alibi_slopes", alibi_slopes)
        # flash_attn's convention: a strided last dimension is copied. (is_contiguous first: it
        # answers a contiguous tensor in a third of stride()'s time.)
        if not q.is_contiguous() and q.stride(-1) != 1:
            q = contiguous_last(q)
        if not k.is_contiguous() and k.stride(-1) != 1:
            k = contiguous_last(k)
        if not v.is_contiguous() and v.stride(-1) != 1:
            v = contiguous_last(v)
        out, lse = (_ops or _torch_ops()).attend(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale, causal, top_left,
            window_left, window_right, softcap, dropout_p, deterministic, _config.backend, heads_first, need_lse)
    else:
        q, k, v = contiguous_last(q), contiguous_last(k), contiguous_last(v)
        seed = int(np.random.randint(0, 2**62, dtype=np.int64)) if dropout_p > 0 else 0
        out, lse = _functional.forward(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k, alibi_slopes=alibi_slopes, scale=scale, causal=causal,
            top_left=top_left, window_left=window_left, window_right=window_right, softcap=softcap,
            dropout_p=dropout_p, seed=seed, backend=_config.backend)
    if padded and out.shape[-1] != dv:
        out = out[..., :dv]
    return out, lse


_ops = None  # tileattn._torch_ops once imported


def _torch_ops():
    """tileattn._torch_ops, imported at the first PyTorch call (importing torch slows NumPy users)."""
    global _ops
    from . import _torch_ops as ops
    _ops = ops
    return ops


def _result(out, lse, return_attn_probs):
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, nheads, d), k and v (batch, seqlen_k, nheads_k, d) -> out like q.
    With return_attn_probs: (out, softmax_lse (batch, nheads, seqlen_q), None).
    causal and window_size align to the bottom-right corner; nheads % nheads_k == 0 (GQA/MQA);
    alibi_slopes (nheads,) or (batch, nheads) fp32 add -slope * |i + seqlen_k - seqlen_q - j|."""
    out, lse = _attend("flash_attn_func", q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size,
                       softcap, alibi_slopes, deterministic, need_lse=return_attn_probs)
    return _result(out, lse, return_attn_probs)


def _packed(fn, name, x, at, count, layout):
    """Checks a packed array: its rank (layout's) and dimension `at` of size `count`, which, larger,
    would otherwise be read in part without an error."""
    _checks.array(fn, name, x)
    if len(x.shape) != layout.count(",") + 1 or x.shape[at] != count:
        raise _C.Error(f"tileattn.{fn}: {name} has shape {tuple(x.shape)}, expected {layout}")


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (batch, seqlen, 3, nheads, d); otherwise as flash_attn_func."""
    _packed("flash_attn_qkvpacked_func", "qkv", qkv, 2, 3, "(batch, seqlen, 3, nheads, d)")
    out, lse = _attend("flash_attn_qkvpacked_func", qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], None, None, 0, 0,
                       dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                       need_lse=return_attn_probs)
    return _result(out, lse, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, nheads, d), kv (batch, seqlen_k, 2, nheads_k, d); as flash_attn_func."""
    _packed("flash_attn_kvpacked_func", "kv", kv, 2, 2, "(batch, seqlen_k, 2, nheads_k, d)")
    out, lse = _attend("flash_attn_kvpacked_func", q, kv[:, :, 0], kv[:, :, 1], None, None, 0, 0, dropout_p,
                       softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                       need_lse=return_attn_probs)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q (total_q, nheads, d), k and v (total_k, nheads_k, d), cu_seqlens_q/k int32 (batch + 1,)
    prefix sums. Returns out (total_q, nheads, d); with return_attn_probs
    (out, softmax_lse (nheads, total_q), None). With block_table (batch, max_blocks_per_seq) int32,
    k and v are paged caches (num_blocks, block_size, nheads_k, d) and sequence b's keys are its
    first cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows through its row of block_table."""
    if block_table is not None:
        # Paged prefill: k and v are [num_blocks, block_size, nheads_k, d] pages.
        fn = "flash_attn_varlen_func"
        _checks.array(fn, "block_table", block_table), _checks.array(fn, "cu_seqlens_k", cu_seqlens_k)
        k = _adapt.gather_pages(fn, k, block_table, cu_seqlens_k)
        v = _adapt.gather_pages(fn, v, block_table, cu_seqlens_k)
    out, lse = _attend("flash_attn_varlen_func", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                       need_lse=return_attn_probs)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (total, 3, nheads, d), cu_seqlens int32 (batch + 1,); as flash_attn_varlen_func."""
    _packed("flash_attn_varlen_qkvpacked_func", "qkv", qkv, 1, 3, "(total, 3, nheads, d)")
    out, lse = _attend("flash_attn_varlen_qkvpacked_func", qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                       max_seqlen, max_seqlen, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                       deterministic, need_lse=return_attn_probs)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (total_q, nheads, d), kv (total_k, 2, nheads_k, d); as flash_attn_varlen_func."""
    _packed("flash_attn_varlen_kvpacked_func", "kv", kv, 1, 2, "(total_k, 2, nheads_k, d)")
    out, lse = _attend("flash_attn_varlen_kvpacked_func", q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k,
                       max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap,
                       alibi_slopes, deterministic, need_lse=return_attn_probs)
    return _result(out, lse, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            check_device_indices=True):
    """Decoding against a KV cache. q (batch, seqlen_q, nheads, d); k_cache/v_cache
    (batch_cache, capacity, nheads_k, d), or (num_blocks, block_size, nheads_k, d) with block_table
    (batch, max_blocks_per_seq) int32. k/v (batch, seqlen_new, nheads_k, d) are written into the cache
    in place at cache_seqlens[b]... before attending. cache_seqlens: int or (batch,) int32 (default:
    the whole capacity). cache_batch_idx (batch,) int32 picks each sequence's cache row. rotary_cos/sin
    (seqlen_ro >= capacity, rotary_dim / 2) in q's dtype rotate k at positions cache_seqlens + i and q
    at the same positions when causal or windowed, else at cache_seqlens. cache_leftpad (batch,) int32:
    sequence b's cache starts at row cache_leftpad[b] (rows before it are not keys; rotary positions
    stay absolute cache rows). Returns out, or (out, softmax_lse) with return_softmax_lse. No backward.
    check_device_indices (tileattn's own): GPU-resident cache_seqlens, cache_leftpad and block_table
    are copied to the host and checked before launch (one synchronization, two with cache_leftpad);
    pass False in serving loops and CUDA graphs, where out-of-range values are then clamped rather
    than reported."""
    return _with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                         cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
                         alibi_slopes, num_splits, return_softmax_lse, check_device_indices)


def _with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                  block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes,
                  num_splits, return_softmax_lse, check_device_indices):
    fn = "flash_attn_with_kvcache"
    # As in _attend, the common arguments (plain tensors, defaults) pass identity tests only: a
    # decode step's host time is paid once per layer and token.
    torch_call = _plain_torch(q, k_cache, v_cache)
    if not torch_call:
        for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            _checks.array(fn, name, x)
        torch_call = is_torch(q)
    for name, x in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                    ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                    ("block_table", block_table), ("alibi_slopes", alibi_slopes),
                    ("cache_seqlens", cache_seqlens if hasattr(cache_seqlens, "shape") else None)):
        if x is not None:
            _checks.array(fn, name, x)
            if torch_call and type(x).__module__ != "torch":
                _checks.torch_tensors(fn, **{name: x})
    if window_size == (-1, -1):
        window_left = window_right = -1
    else:
        window_left, window_right = _checks.window(fn, window_size, causal)
    scale = None if softmax_scale is None else _checks.number(fn, "softmax_scale", softmax_scale)
    if type(softcap) is not float:
        softcap = _checks.number(fn, "softcap", softcap)
    if causal is not True and causal is not False:
        causal = bool(causal)
    if type(num_splits) is not int or not 0 <= num_splits <= _checks.INT_MAX:
        num_splits = _checks.integer(fn, "num_splits", num_splits, 0)
    if k is not None or v is not None:
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if getattr(getattr(cache, "flags", None), "writeable", True) is False:
                raise _C.Error(f"tileattn.{fn}: {name} is read-only, but k/v are appended to it")
    if not torch_call or q.stride(-1) != 1 or k is not None:
        q, k, v = (contiguous_last(x) for x in (q, k, v))
    if torch_call and q.is_cuda:
        # The GPU kernels load 16 bytes at a time: a query, new keys or values (small) whose strides
        # are not multiples of 8 elements are copied rather than refused.
        q = _aligned(q)
        if k is not None:
            k = _aligned(k)
        if v is not None:
            v = _aligned(v)
    batch = q.shape[0]
    if cache_seqlens is not None and not hasattr(cache_seqlens, "shape"):
        cache_seqlens = full_int32(q, (batch,), _checks.integer(fn, "cache_seqlens", cache_seqlens, 0))
    if block_table is not None and cache_batch_idx is not None:
        raise ValueError(f"tileattn: {fn} takes cache_batch_idx or block_table, not both")
    if block_table is not None and cache_leftpad is not None:
        raise _C.Error(f"tileattn.{fn}: cache_leftpad with block_table is not supported (flash_attn "
                       "refuses it too)")
    page_table = block_table
    if cache_batch_idx is not None:
        # A contiguous cache is a paged one whose pages are whole rows: row cache_batch_idx[b] is the
        # single page of sequence b, read in place.
        page_table = cache_batch_idx.reshape(batch, 1)
    if (cache_batch_idx is not None or cache_leftpad is not None) and cache_seqlens is None:
        cache_seqlens = full_int32(q, (batch,), k_cache.shape[1])

    # Head dims that are not multiples of 8: padded copies, appended rows copied back after the call.
    dqk, dv = q.shape[-1], v_cache.shape[-1]
    pqk, pv = dqk, dv
    if dqk % 8 or dv % 8 or dqk > _adapt.HDIM_MAX:
        pqk, pv = _adapt.padded_dim(fn, "q", dqk), _adapt.padded_dim(fn, "v_cache", dv)
    caches = (k_cache, v_cache)
    if (pqk, pv) != (dqk, dv):
        _log.note(f"head dims {dqk}/{dv} padded to {pqk}/{pv} (cache copied)")
        q, k_cache, k = (_adapt.pad_last(x, pqk) for x in (q, k_cache, k))
        v_cache, v = _adapt.pad_last(v_cache, pv), _adapt.pad_last(v, pv)
        if scale is None:
            scale = dqk ** -0.5

    if cache_leftpad is not None:
        _checks.array(fn, "cache_seqlens", cache_seqlens)
        _adapt.check_leftpad(fn, cache_leftpad, cache_seqlens, cache_batch_idx, k_cache.shape[0], batch,
                             check_device_indices)
        # One-row pages: sequence b reads rows cache_leftpad[b] .. cache_seqlens[b] of its cache row.
        page_table = _adapt.leftpad_table(fn, k_cache, cache_leftpad, cache_batch_idx, batch)
        k_cache, v_cache = _adapt.one_row_pages(fn, "k_cache", k_cache), _adapt.one_row_pages(fn, "v_cache", v_cache)
        if rotary_cos is not None and rotary_sin is not None:
            # flash_attn's rotary positions are absolute cache rows, which one table cannot give the
            # shifted sequences: rotate here, at cache_seqlens + i.
            per_row = causal or window_left >= 0 or window_right >= 0
            if k is not None:
                k = _adapt.rotate(k, rotary_cos, rotary_sin, _adapt.positions(k, cache_seqlens, k.shape[1]),
                                  rotary_interleaved)
            pos_q = _adapt.positions(q, cache_seqlens, q.shape[1])
            if not per_row:
                pos_q = pos_q[:, :1].repeat(1, q.shape[1]) if is_torch(q) else pos_q[:, :1].repeat(q.shape[1], 1)
            q = _adapt.rotate(q, rotary_cos, rotary_sin, pos_q, rotary_interleaved)
            rotary_cos = rotary_sin = None
        cache_seqlens = cache_seqlens - cache_leftpad
        _log.note("cache_leftpad: cache read through one-row pages")
    elif rotary_cos is not None and rotary_sin is not None:
        # flash_attn asks for rows up to the capacity; the core counts the query rows past it too.
        capacity = (page_table.shape[1] * k_cache.shape[1]) if page_table is not None else k_cache.shape[1]
        per_row = causal or window_left >= 0 or window_right >= 0
        need = capacity + (q.shape[1] - 1 if per_row else 0)
        if capacity <= rotary_cos.shape[0] < need:
            rotary_cos, rotary_sin = _adapt.extend_rows(rotary_cos, need), _adapt.extend_rows(rotary_sin, need)

    try:
        if torch_call:
            out, lse = (_ops or _torch_ops()).decode(q, k_cache, v_cache, k, v, cache_seqlens, page_table, rotary_cos,
                                         rotary_sin, bool(rotary_interleaved), alibi_slopes, scale, causal,
                                         window_left, window_right, softcap, num_splits, bool(check_device_indices),
                                         _config.backend, return_softmax_lse)
        else:
            out, lse = _functional.decode(
                q, k_cache, v_cache, k_new=k, v_new=v, cache_seqlens=cache_seqlens, page_table=page_table,
                rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=bool(rotary_interleaved),
                alibi_slopes=alibi_slopes, scale=scale, causal=causal, window_left=window_left,
                window_right=window_right, softcap=softcap, num_splits=num_splits,
                check_device_indices=bool(check_device_indices), backend=_config.backend)
    except _C.Error as e:
        raise _C.Error(_named(str(e), block_table, cache_batch_idx, cache_leftpad)) from None
    if k is not None and (pqk, pv) != (dqk, dv):
        _copy_into(caches[0], k_cache[..., :dqk])
        _copy_into(caches[1], v_cache[..., :dv])
    if out.shape[-1] != dv:
        out = out[..., :dv]
    return (out, lse) if return_softmax_lse else out


def _named(message, block_table, cache_batch_idx, cache_leftpad):
    """The core's message in flash_attn's names: its page_table is block_table here (or, for a
    contiguous cache, cache_batch_idx or cache_leftpad's one-row pages)."""
    if block_table is not None:
        return message.replace("page_table", "block_table")
    if cache_leftpad is not None:
        return message.replace("page_table", "the page table of one-row pages that cache_leftpad builds")
    if cache_batch_idx is not None:
        return message.replace("page_table", "cache_batch_idx")
    return message


def _copy_into(dst, src):
    if is_torch(dst):
        dst.copy_(src)
    else:
        dst[...] = src


def _aligned(x):
    """x (a torch tensor), or a copy whose base and strides suit 16-byte loads."""
    # torch.compile traces no data_ptr(): there only the strides are checked, and a misaligned base
    # is left to the call's own check.
    if not (_ops or _torch_ops())._is_compiling() and x.data_ptr() % 16:
        return x.contiguous() if not x.is_contiguous() else x.clone()
    stride, shape = x.stride(), x.shape
    for d in range(len(stride) - 1):
        if stride[d] % 8 and shape[d] > 1:
            return x.contiguous() if not x.is_contiguous() else x.clone()
    return x
