"""flash_attn's (v2) public functions with its names, arguments, defaults, shapes and return values,
so that switching is an import change.

PyTorch tensors go through the custom ops of _torch_ops (autograd, torch.compile, CUDA streams);
NumPy and CuPy arrays through _functional (forward only). Differences from flash_attn: head dims
must be multiples of 8 (flash_attn pads others), return_attn_probs returns (out, lse, None) since
the probabilities are never materialized, and cache_leftpad and the paged block_table of
flash_attn_varlen_func are not supported.
"""

import numpy as np

from . import _config, _functional
from ._arrays import contiguous_last, full_int32, is_torch


def _attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
            causal, window_size, softcap, alibi_slopes, deterministic, top_left=False):
    q, k, v = (contiguous_last(x) for x in (q, k, v))
    # flash_attn: causal means a right window of 0, whatever window_size[1] says.
    window_left, window_right = int(window_size[0]), -1 if causal else int(window_size[1])
    if is_torch(q):
        from . import _torch_ops
        return _torch_ops.attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                 softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p,
                                 deterministic, _config.backend)
    seed = int(np.random.randint(0, 2**62, dtype=np.int64)) if dropout_p > 0 else 0
    return _functional.forward(
        q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, alibi_slopes=alibi_slopes, scale=softmax_scale, causal=causal,
        top_left=top_left, window_left=window_left, window_right=window_right, softcap=softcap,
        dropout_p=dropout_p, seed=seed, backend=_config.backend)


def _result(out, lse, return_attn_probs):
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, nheads, d), k and v (batch, seqlen_k, nheads_k, d) -> out like q.
    With return_attn_probs: (out, softmax_lse (batch, nheads, seqlen_q), None).
    causal and window_size align to the bottom-right corner; nheads % nheads_k == 0 (GQA/MQA);
    alibi_slopes (nheads,) or (batch, nheads) fp32 add -slope * |i + seqlen_k - seqlen_q - j|."""
    out, lse = _attend(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                       alibi_slopes, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (batch, seqlen, 3, nheads, d); otherwise as flash_attn_func."""
    out, lse = _attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], None, None, 0, 0, dropout_p, softmax_scale,
                       causal, window_size, softcap, alibi_slopes, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, nheads, d), kv (batch, seqlen_k, 2, nheads_k, d); as flash_attn_func."""
    out, lse = _attend(q, kv[:, :, 0], kv[:, :, 1], None, None, 0, 0, dropout_p, softmax_scale, causal,
                       window_size, softcap, alibi_slopes, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q (total_q, nheads, d), k and v (total_k, nheads_k, d), cu_seqlens_q/k int32 (batch + 1,)
    prefix sums. Returns out (total_q, nheads, d); with return_attn_probs
    (out, softmax_lse (nheads, total_q), None)."""
    if block_table is not None:
        raise NotImplementedError(
            "tileattn: flash_attn_varlen_func(block_table=...) is not supported; a paged KV cache is read by "
            "flash_attn_with_kvcache")
    out, lse = _attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                       causal, window_size, softcap, alibi_slopes, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (total, 3, nheads, d), cu_seqlens int32 (batch + 1,); as flash_attn_varlen_func."""
    out, lse = _attend(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                       softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (total_q, nheads, d), kv (total_k, 2, nheads_k, d); as flash_attn_varlen_func."""
    out, lse = _attend(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                       softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic)
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
    at the same positions when causal or windowed, else at cache_seqlens. Returns out, or
    (out, softmax_lse) with return_softmax_lse. No backward.
    check_device_indices (tileattn's own): GPU-resident cache_seqlens and block_table are copied to
    the host and checked before launch, one synchronization per call; pass False in serving loops
    and CUDA graphs, where out-of-range values are then clamped rather than reported."""
    if cache_leftpad is not None:
        raise NotImplementedError("tileattn: flash_attn_with_kvcache(cache_leftpad=...) is not supported")
    q, k, v = (contiguous_last(x) for x in (q, k, v))
    batch = q.shape[0]
    if isinstance(cache_seqlens, int):
        cache_seqlens = full_int32(q, (batch,), cache_seqlens)
    page_table = block_table
    if cache_batch_idx is not None:
        if block_table is not None:
            raise ValueError("tileattn: flash_attn_with_kvcache takes cache_batch_idx or block_table, not both")
        # A contiguous cache is a paged one whose pages are whole rows: row cache_batch_idx[b] is the
        # single page of sequence b, read in place.
        page_table = cache_batch_idx.reshape(batch, 1)
        if cache_seqlens is None:
            cache_seqlens = full_int32(q, (batch,), k_cache.shape[1])
    window_left, window_right = int(window_size[0]), -1 if causal else int(window_size[1])
    if is_torch(q):
        from . import _torch_ops
        out, lse = _torch_ops.decode(q, k_cache, v_cache, k, v, cache_seqlens, page_table, rotary_cos, rotary_sin,
                                     rotary_interleaved, alibi_slopes, softmax_scale, causal, window_left,
                                     window_right, softcap, num_splits, check_device_indices, _config.backend)
    else:
        out, lse = _functional.decode(
            q, k_cache, v_cache, k_new=k, v_new=v, cache_seqlens=cache_seqlens, page_table=page_table,
            rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved,
            alibi_slopes=alibi_slopes, scale=softmax_scale, causal=causal, window_left=window_left,
            window_right=window_right, softcap=softcap, num_splits=num_splits,
            check_device_indices=check_device_indices, backend=_config.backend)
    return (out, lse) if return_softmax_lse else out
