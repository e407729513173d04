"""The C++ entry points with allocated outputs: forward, backward, decode, combine.

Any NumPy, PyTorch or CuPy arrays in, arrays of the same library out; no autograd (the PyTorch layer
in _torch_ops builds it on these). Every check of the arguments happens in the core, so a bad call
raises tileattn.Error with the core's message; output shapes are only guessed here far enough to
allocate, and a call whose shapes make no sense gets no lse so the core reports q itself.
"""

from . import _C, _checks, _log
from ._arrays import current_stream, empty, native, on_cuda

_BACKENDS = {
    "auto": _C.Backend.automatic,
    "automatic": _C.Backend.automatic,
    "cpu": _C.Backend.cpu_flash,
    "cpu_flash": _C.Backend.cpu_flash,
    "cpu_reference": _C.Backend.cpu_reference,
    "cuda": _C.Backend.cuda,
}


def options(like, *, scale=None, causal=False, top_left=False, window_left=-1, window_right=-1,
            softcap=0.0, dropout_p=0.0, seed=0, offset=0, deterministic=False, backend="auto",
            num_splits=0, check_device_indices=True, alibi_diagonal=None, sm_margin=0):
    """A tileattn.Options for a call on like's device, ordered on its library's current stream.
    alibi_diagonal: ALiBi's distance is |i + alibi_diagonal - j| (None: the causal diagonal's offset).
    sm_margin: SMs the persistent Hopper forward leaves free for kernels beside it (0: every SM)."""
    window_left = _checks.integer("options", "window_left", window_left)
    window_right = _checks.integer("options", "window_right", window_right)
    num_splits = _checks.integer("options", "num_splits", num_splits)
    sm_margin = _checks.integer("options", "sm_margin", sm_margin)
    # Each argument by name (the binding's own error lists its whole signature instead).
    scale = None if scale is None else _checks.number("options", "scale", scale)
    softcap = _checks.number("options", "softcap", softcap)
    dropout_p = _checks.number("options", "dropout_p", dropout_p)
    seed = _checks.integer("options", "seed", seed, 0, 2**64 - 1)
    offset = _checks.integer("options", "offset", offset, 0, 2**64 - 1)
    if isinstance(backend, str):
        if backend not in _BACKENDS:
            raise ValueError(f"tileattn: backend = {backend!r}, expected one of {sorted(_BACKENDS)}")
        backend = _BACKENDS[backend]
    o = _C.Options(
        scale=scale, causal=bool(causal),
        align=_C.MaskAlign.top_left if top_left else _C.MaskAlign.bottom_right,
        window_left=window_left, window_right=window_right, softcap=softcap, dropout_p=dropout_p,
        seed=seed, offset=offset, deterministic=bool(deterministic), backend=backend,
        num_splits=num_splits, sm_margin=sm_margin, check_device_indices=bool(check_device_indices),
        stream=current_stream(like))
    if alibi_diagonal is not None:
        o.alibi_diagonal = _checks.integer("options", "alibi_diagonal", alibi_diagonal)
    return o


def _scratch(like):
    # On a GPU the library's scratch comes from the caller's allocator (PyTorch's caching
    # allocator, CuPy's pool): no cudaMalloc inside a call, so calls can be captured in CUDA graphs.
    # The native call allocates it once it knows the size: one conversion of the arguments, not two.
    return (lambda n: empty(like, (n,), "uint8")) if on_cuda(like) else None


def _arrays(fn, **named):
    for name, x in named.items():
        _checks.array(fn, name, x)


def _native(*args):
    return tuple(native(a) for a in args)


def _lse_shape(q, varlen):
    if varlen and q.ndim == 3:
        return (q.shape[1], q.shape[0])
    if not varlen and q.ndim == 4:
        return (q.shape[0], q.shape[2], q.shape[1])
    return None


def _out_like(q, v):
    return empty(q, tuple(q.shape[:-1]) + tuple(v.shape[-1:]))


def forward(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
            alibi_slopes=None, **opts):
    """Attention forward. Returns (out, lse): out shaped like q with v's head dim, lse fp32
    [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]). opts: see options()."""
    _arrays("forward", q=q, k=k, v=v)
    max_seqlen_q = _checks.integer("forward", "max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _checks.integer("forward", "max_seqlen_k", max_seqlen_k)
    o = options(q, **opts)
    out = _out_like(q, v)
    shape = _lse_shape(q, cu_seqlens_q is not None or cu_seqlens_k is not None)
    lse = empty(q, shape, "float32") if shape is not None else None
    args = _native(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, o)
    _C.forward(*args, workspace=_scratch(q))
    if _log.enabled:
        _log.call("forward", q, k, cu_seqlens_q is not None, o)
    return out, lse


def backward(dout, q, k, v, out, lse, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
             max_seqlen_k=0, alibi_slopes=None, **opts):
    """Attention backward from the forward's out and lse. Returns (dq, dk, dv), shaped like q, k, v.
    opts must match the forward's (dropout seed and offset included)."""
    _arrays("backward", dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    max_seqlen_q = _checks.integer("backward", "max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _checks.integer("backward", "max_seqlen_k", max_seqlen_k)
    o = options(q, **opts)
    dq, dk, dv = empty(q, q.shape), empty(k, k.shape), empty(v, v.shape)
    args = _native(q, k, v, out, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            alibi_slopes, o)
    _C.backward(*args, workspace=_scratch(q))
    if _log.enabled:
        _log.call("backward", q, k, cu_seqlens_q is not None, o)
    return dq, dk, dv


def decode(q, k_cache, v_cache, *, k_new=None, v_new=None, cache_seqlens=None, page_table=None,
           rotary_cos=None, rotary_sin=None, rotary_interleaved=False, alibi_slopes=None, **opts):
    """Attention of q [batch, seqlen_q, heads_q, d] against a KV cache, contiguous
    [batch, capacity, heads_kv, d] or paged [pages, page_size, heads_kv, d] with an int32 page_table
    [batch, pages_per_seq]. k_new/v_new are first written into the cache at cache_seqlens[b]...,
    rotated by rotary_cos/sin [positions, rotary_dim / 2] when given. Returns (out, lse)."""
    _arrays("decode", q=q, k_cache=k_cache, v_cache=v_cache)
    o = options(q, **opts)
    out = _out_like(q, v_cache)
    lse = empty(q, (q.shape[0], q.shape[2], q.shape[1]), "float32") if q.ndim == 4 else None
    args = _native(q, k_cache, v_cache, out, lse, page_table, cache_seqlens, k_new, v_new, rotary_cos, rotary_sin,
            rotary_interleaved, alibi_slopes, o)
    _C.decode(*args, workspace=_scratch(q))
    if _log.enabled:
        _log.call("decode", q, k_cache, page_table is not None, o)
    return out, lse


def combine(out_partial, lse_partial, *, out=None, backend="auto"):
    """Merges partial results over disjoint key sets by their log-sum-exp. out_partial fp32
    [splits, batch, seqlen_q, heads, d], lse_partial fp32 [splits, batch, heads, seqlen_q].
    Returns (out, lse); out (default: fp32) may be given to choose its dtype."""
    _arrays("combine", out_partial=out_partial, lse_partial=lse_partial)
    o = options(out_partial, backend=backend)
    if out is None:
        out = empty(out_partial, out_partial.shape[1:])
    s = out_partial.shape
    lse = empty(out_partial, (s[1], s[3], s[2]), "float32") if out_partial.ndim == 5 else None
    _C.combine(*_native(out_partial, lse_partial, out, lse, o))
    return out, lse
