"""The native calls on PyTorch tensors, as thin as they go: what _functional does for any array
library, specialised to torch.Tensor.

An eager call's host time is what small models and decode loops pay per layer, so this path keeps
per-call Python to the minimum: outputs from torch.empty_like, no LSE where nobody reads it, SDPA's
[batch, heads, seq, d] tensors passed as they are (no transposed views), a tileattn.Options built
once per distinct set of option values (and CUDA stream) and reused, the GPU scratch allocated from
inside the native call once it knows the size (no second conversion of the arguments for a size
query, and the size itself remembered for calls like recent ones), the stream read with PyTorch's
raw accessor. bench/notes/overhead.md has the measurements.
"""

import torch

from . import _C, _log
from ._functional import _BACKENDS
_BOTTOM_RIGHT, _TOP_LEFT = _C.MaskAlign.bottom_right, _C.MaskAlign.top_left
_U8, _F32, _CONTIGUOUS = torch.uint8, torch.float32, torch.contiguous_format

# Options objects by their values. Immutable once cached: a call that needs a per-call value (a
# dropout seed) builds its own, so threads sharing an entry never see each other's values.
_options = {}


def _stream(x):
    if not x.is_cuda:
        return 0
    return torch._C._cuda_getCurrentRawStream(x.get_device())


def options(like, scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed, offset,
            deterministic, backend, num_splits=0, check_device_indices=True, chunk_size=0, prefix_len=0):
    stream = _stream(like)
    key = (scale, causal, top_left, window_left, window_right, softcap, dropout_p, deterministic, backend,
           num_splits, check_device_indices, stream, chunk_size, prefix_len)
    if seed == 0 and offset == 0:
        o = _options.get(key)
        if o is not None:
            return o
    b = _BACKENDS.get(backend)
    if b is None:
        raise ValueError(f"tileattn: backend = {backend!r}, expected one of {sorted(_BACKENDS)}")
    o = _C.Options(scale=scale, causal=causal, align=_TOP_LEFT if top_left else _BOTTOM_RIGHT,
                   window_left=window_left, window_right=window_right, softcap=softcap, dropout_p=dropout_p,
                   seed=seed, offset=offset, deterministic=deterministic, backend=b, num_splits=num_splits,
                   check_device_indices=check_device_indices, stream=stream)
    if chunk_size or prefix_len:
        o.chunk_size = chunk_size
        o.prefix_len = prefix_len
    # A torch tensor's device is torch's own record of where its memory is: the native call's pointer
    # query per tensor would only confirm it.
    o.check_residence = False
    if seed == 0 and offset == 0:
        if len(_options) > 1024:  # bounded: option values come from a program, but streams can be many
            _options.clear()
        _options[key] = o
    return o


def _scratch(like):
    # On a GPU the library's scratch comes from PyTorch's caching allocator: no cudaMalloc inside a
    # call, so calls can be captured in CUDA graphs. The CPU backends use their own.
    if not like.is_cuda:
        return None
    return lambda n: like.new_empty(n, dtype=_U8)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale, causal,
            top_left, window_left, window_right, softcap, dropout_p, seed, deterministic, backend,
            heads_first=False, need_lse=True):
    """(out, lse). heads_first: q, k, v and out are [batch, heads, seq, d] (what
    scaled_dot_product_attention takes and returns), read as such by the native call: no views.
    need_lse False: lse is None, and none is allocated or written (a forward that nothing
    differentiates and whose caller discards the LSE)."""
    o = options(q, scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed, 0,
                deterministic, backend)
    return forward_with(o, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                        heads_first, need_lse)


def forward_with(o, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, heads_first,
                 need_lse=True):
    """forward with its Options built: autograd's eager path keeps them for the backward, which
    takes the same ones (the seed included)."""
    out = empty_out(q, v)
    varlen = cu_seqlens_q is not None
    lse = None
    if need_lse:
        shape = lse_shape(q, varlen, heads_first)
        if shape is not None:
            lse = q.new_empty(shape, dtype=_F32)
    _C.forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, o,
               _scratch(q), heads_first)
    if _log.enabled:
        _log.call("forward", q, k, varlen, o)
    return out, lse


def backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale,
             causal, top_left, window_left, window_right, softcap, dropout_p, seed, deterministic, backend,
             heads_first=False, offset=0):
    """(dq, dk, dv); the arguments after lse in forward's order (heads_first as there)."""
    o = options(q, scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed, offset,
                deterministic, backend)
    return backward_with(o, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         alibi_slopes, heads_first)


def backward_with(o, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                  heads_first):
    """backward with its Options built (the forward's)."""
    dq, dk, dv = _empty(q), _empty(k), _empty(v)
    _C.backward(q, k, v, out, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                alibi_slopes, o, _scratch(q), heads_first)
    if _log.enabled:
        _log.call("backward", q, k, cu_seqlens_q is not None, o)
    return dq, dk, dv


def block_sparse_forward(o, q, k, v, mask, alibi_slopes, heads_first=False):
    """(out, lse) of tileattn.flex_attention's call on [batch, seq, heads, d] tensors (heads_first:
    [batch, heads, seq, d], as forward reads them). mask: (kv_num_blocks, kv_indices,
    full_kv_num_blocks, full_kv_indices, block_q, block_k, document_ids_q, document_ids_k,
    prefix_lens, dense mask), the first four None for no block mask."""
    out = empty_out(q, v)
    lse = q.new_empty(lse_shape(q, False, heads_first), dtype=_F32)
    num, idx, full_num, full_idx, block_q, block_k, docs_q, docs_k, prefix_lens, dense = mask
    _C.forward_block_sparse(q, k, v, out, lse, None, None, 0, 0, alibi_slopes, num, idx, full_num, full_idx, dense,
                            block_q, block_k, docs_q, docs_k, prefix_lens, o, heads_first)
    if _log.enabled:
        _log.call("forward", q, k, False, o, *_features(mask))
    return out, lse


def block_sparse_backward(o, dout, q, k, v, out, lse, mask, alibi_slopes, heads_first=False):
    """(dq, dk, dv) of block_sparse_forward's call, with its mask and layout."""
    dq, dk, dv = _empty(q), _empty(k), _empty(v)
    num, idx, full_num, full_idx, block_q, block_k, docs_q, docs_k, prefix_lens, dense = mask
    _C.backward_block_sparse(q, k, v, out, dout, lse, dq, dk, dv, None, None, 0, 0, alibi_slopes, num, idx, full_num,
                             full_idx, dense, block_q, block_k, docs_q, docs_k, prefix_lens, o, heads_first)
    if _log.enabled:
        _log.call("backward", q, k, False, o, *_features(mask))
    return dq, dk, dv


def _features(mask):
    """A block-sparse call's features, for the log line."""
    num, _, _, _, _, _, docs_q, _, _, dense = mask
    return _log.block_sparse(num is not None, docs_q is not None, dense is not None)


def decode(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, rotary_cos, rotary_sin, rotary_interleaved,
           alibi_slopes, scale, causal, window_left, window_right, softcap, num_splits, check_device_indices, backend,
           need_lse=True):
    """(out, lse); need_lse False: lse is None, neither allocated nor written."""
    o = options(q, scale, causal, False, window_left, window_right, softcap, 0.0, 0, 0, False, backend,
                num_splits, check_device_indices)
    out = empty_out(q, v_cache)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_F32) if need_lse and q.ndim == 4 else None
    _C.decode(q, k_cache, v_cache, out, lse, page_table, cache_seqlens, k_new, v_new, rotary_cos, rotary_sin,
              rotary_interleaved, alibi_slopes, o, _scratch(q))
    if _log.enabled:
        _log.call("decode", q, k_cache, page_table is not None, o)
    return out, lse


def _empty(x):
    # A contiguous tensor shaped like x. empty_like takes no shape to parse: it is the cheapest
    # allocation PyTorch's Python API has. Contiguous whatever x's strides, as the fake rules say;
    # for a contiguous x its default (x's layout) is that, and skips parsing a keyword argument.
    if x.is_contiguous():
        return torch.empty_like(x)
    return torch.empty_like(x, memory_format=_CONTIGUOUS)


def empty_out(q, v):
    """The output: shaped like q with v's head dim, contiguous."""
    try:
        d = v.shape[-1]
        if q.shape[-1] == d:
            return _empty(q)
    except IndexError:  # a 0-d q or v: the core names it
        return q.new_empty(())
    return q.new_empty(q.shape[:-1] + (d,))


def lse_shape(q, varlen, heads_first=False):
    """The log-sum-exp's shape, or None where q's rank is wrong (the core then names q)."""
    if varlen:
        return (q.shape[1], q.shape[0]) if q.ndim == 3 else None
    if q.ndim != 4:
        return None
    return (q.shape[0], q.shape[1], q.shape[2]) if heads_first else (q.shape[0], q.shape[2], q.shape[1])
