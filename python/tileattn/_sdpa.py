"""torch.nn.functional.scaled_dot_product_attention's signature on tileattn.

Tensors are [..., heads, seq, dim] with any number of leading batch dimensions (none included).
PyTorch tensors reach the native call as they are, with its heads_first flag (the core reads them as
[batch, seq, heads, dim] strided views, never a copy, and no transposed view is made here), and the
kernel writes the output straight into [..., heads, seq, dim] memory, so the result is contiguous as
SDPA's is. NumPy and CuPy arrays cross as transposed views.

attn_mask, boolean (True = attend) or additive (float), broadcast as SDPA broadcasts it: a mask that
is the same for every head and every query row is a key-padding mask, and runs exactly as a
variable-length batch of each sequence's kept keys; one that is the same for every head and
block-diagonal (packed documents, each a run of positions, causal within each or not) runs as a
variable-length batch of the documents. An additive mask of 0 and -inf is the same
boolean mask. Any other boolean mask (per head, per query row) runs block-sparse: cut into blocks of
128 x 128, an all-False block is skipped, an all-True one runs unmasked, the others read the mask
(tileattn.flex_attention with mask=); PyTorch tensors only, no dropout. A query row that sees no
key gives zeros, as SDPA's does. Finite biases are refused with an error that names attn_mask.
"""

from . import _C, _checks, _dense_mask, _derived
from ._arrays import is_torch
from ._flash_api import _attend, _plain_torch

_FN = "scaled_dot_product_attention"


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """query [..., heads_q, seq_q, d], key/value [..., heads_kv, seq_k, d] -> [..., heads_q, seq_q, d_v],
    contiguous. is_causal aligns to the top-left corner (PyTorch's convention: query i sees keys j <= i).
    heads_kv < heads_q needs enable_gqa=True. attn_mask: see the module's notes."""
    if scale is not None and type(scale) is not float:  # named as SDPA names it, before flash_attn's checks
        scale = _checks.number(_FN, "scale", scale)
    if attn_mask is None and _plain_torch(query, key, value) and query.ndim == 4 and key.ndim == 4 and \
            value.ndim == 4 and (enable_gqa or key.shape[1] == query.shape[1]):
        # The common call, with no more checks than the core's.
        return _attend(_FN, query, key, value, None, None, 0, 0, dropout_p, scale, is_causal, (-1, -1), 0.0, None,
                       False, top_left=True, heads_first=True, need_lse=False)[0]
    for name, x in (("query", query), ("key", key), ("value", value)):
        _checks.array(_FN, name, x)
        if x.ndim < 3:
            raise ValueError(f"tileattn.{_FN}: {name} has shape {tuple(x.shape)}, expected [..., heads, seq, dim]")
    if not (query.ndim == key.ndim == value.ndim):
        raise ValueError(f"tileattn.{_FN}: query, key and value have {query.ndim}, {key.ndim} and {value.ndim} "
                         "dimensions, expected the same number")
    lead = tuple(query.shape[:-3])
    if tuple(key.shape[:-3]) != lead or tuple(value.shape[:-3]) != lead:
        raise ValueError(f"tileattn.{_FN}: query, key and value have leading dimensions {lead}, "
                         f"{tuple(key.shape[:-3])} and {tuple(value.shape[:-3])}, expected the same")
    if not enable_gqa and key.shape[-3] != query.shape[-3]:
        raise ValueError(f"tileattn.{_FN}: query has {query.shape[-3]} heads and key "
                         f"{key.shape[-3]}; pass enable_gqa=True for grouped-query attention")
    if query.ndim != 4:
        q, k, v = (x.reshape((-1,) + tuple(x.shape[-3:])) for x in (query, key, value))
        out = scaled_dot_product_attention(q, k, v, _batched_mask(attn_mask, lead, query, key), dropout_p, is_causal,
                                           scale, enable_gqa)
        return out.reshape(lead + tuple(out.shape[1:]))
    if attn_mask is not None:
        if is_causal:
            raise ValueError(f"tileattn.{_FN}: attn_mask and is_causal are both set; pass one (as SDPA requires)")
        return _masked(query, key, value, attn_mask, dropout_p, scale)
    if is_torch(query):
        return _attend(_FN, query, key, value, None, None, 0, 0, dropout_p, scale, is_causal, (-1, -1), 0.0, None,
                       False, top_left=True, heads_first=True, need_lse=False)[0]
    out, _ = _attend(_FN, query.swapaxes(1, 2), key.swapaxes(1, 2), value.swapaxes(1, 2), None, None, 0, 0,
                     dropout_p, scale, is_causal, (-1, -1), 0.0, None, False, top_left=True, need_lse=False)
    return out.swapaxes(1, 2)


def _batched_mask(mask, lead, query, key):
    """The mask for the leading dimensions flattened into one batch dimension."""
    if mask is None:
        return None
    full = lead + (query.shape[-3], query.shape[-2], key.shape[-2])
    try:
        m = mask.expand(full) if is_torch(mask) else __import__("numpy").broadcast_to(mask, full)
    except (RuntimeError, ValueError):
        raise _C.Error(f"tileattn.{_FN}: attn_mask has shape {tuple(mask.shape)}, which does not broadcast to "
                       f"{full}") from None
    return m.reshape((-1,) + full[-3:])


def _masked(query, key, value, attn_mask, dropout_p, scale):
    if not is_torch(query) or not is_torch(attn_mask):
        raise _C.Error(f"tileattn.{_FN}: attn_mask is supported for PyTorch tensors only")
    if attn_mask.device != query.device:
        raise _C.Error(f"tileattn.{_FN}: attn_mask is on {attn_mask.device} and query on {query.device}; expected "
                       "one device")
    import torch
    b, hq, sq, _ = query.shape
    sk = key.shape[-2]
    full = (b, hq, sq, sk)
    # What the mask's values decide (its kind, the kept keys) is read once per mask (_derived): a mask
    # passed to every layer would otherwise cost its reads and their synchronizations in each.
    mask = attn_mask
    if mask.dtype != torch.bool:  # on the mask's own shape: broadcasting first would materialize it whole
        if not mask.is_floating_point():
            raise _C.Error(f"tileattn.{_FN}: attn_mask has dtype {mask.dtype}, expected bool or a float dtype")
        if mask.requires_grad and torch.is_grad_enabled():
            # SDPA differentiates an additive mask; here it becomes a boolean one, whose gradient would
            # be silently missing.
            raise _C.Error(f"tileattn.{_FN}: attn_mask requires grad; tileattn does not differentiate the mask "
                           "(pass attn_mask.detach() or a boolean mask)")
        mask = _derived.derived(mask, "sdpa_keep", lambda: _keep(attn_mask))
    try:
        mask = _dense_mask.compact(mask.expand(full))  # [b or 1, hq or 1, sq, sk]
    except RuntimeError:
        raise _C.Error(f"tileattn.{_FN}: attn_mask has shape {tuple(attn_mask.shape)}, which does not broadcast "
                       f"to {full}") from None
    from . import _documents, _log
    tokens = _documents.tokens

    def unpacked(out):
        return out.reshape(b, sq, hq, out.shape[-1]).transpose(1, 2).contiguous()
    if not _derived.derived(mask, "sdpa_padding", lambda: _key_padding(mask)):
        docs = _derived.derived(mask, ("sdpa_documents", b), lambda: _documents.from_mask(mask, b))
        if docs is None:
            return _block_sparse(query, key, value, mask, dropout_p, scale)
        causal, cu, longest = docs
        _log.note("attn_mask: packed documents run as a variable-length batch")
        out, _ = _attend(_FN, tokens(query), tokens(key), tokens(value), cu, cu, longest, longest, dropout_p, scale,
                         causal, (-1, -1), 0.0, None, False, top_left=True)
        return unpacked(out)
    _log.note("attn_mask: key-padding mask run as a variable-length batch")
    idx, cu_k, max_k = _derived.derived(mask, ("sdpa_keys", b), lambda: _kept_keys(mask, b, sk))
    cu_q = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=query.device)
    k, v = (tokens(x).index_select(0, idx) for x in (key, value))
    out, _ = _attend(_FN, tokens(query), k, v, cu_q, cu_k, sq, max_k, dropout_p, scale, False, (-1, -1), 0.0,
                     None, False, top_left=True)
    return unpacked(out)


def _keep(mask):
    """An additive mask of 0 and -inf as a boolean one; other values (a bias, +inf, NaN) are refused."""
    keep = mask == 0
    if not bool((keep | (mask == float("-inf"))).all()):
        raise _C.Error(f"tileattn.{_FN}: attn_mask is an additive mask with values other than 0 and -inf (a bias, "
                       "+inf or NaN); tileattn takes boolean masks and additive masks of 0 and -inf only")
    return keep


def _key_padding(mask):
    """Whether a compact bool mask [b or 1, hq or 1, sq, sk] is the same for every head and query row."""
    same_rows = mask.stride(2) == 0 or bool((mask == mask[:, :, :1]).all())
    return same_rows and bool((mask == mask[:, :1]).all())


def _kept_keys(mask, b, sk):
    """A key-padding mask's kept keys as a packed batch: their indices among the b * sk keys, the
    cumulative lengths and the longest."""
    import torch
    keys = mask[:, 0, 0, :].expand(b, sk)
    idx = keys.reshape(-1).nonzero().reshape(-1)
    lens = keys.sum(1, dtype=torch.int32)
    cu_k = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    return idx, cu_k, int(lens.max()) if b else 0


def _block_sparse(query, key, value, mask, dropout_p, scale):
    """A general boolean mask [b or 1, hq or 1, sq, sk] (broadcast dims of stride 0): block-sparse
    attention with the mask as the partial blocks' element mask."""
    if dropout_p:
        raise _C.Error(f"tileattn.{_FN}: dropout_p = {dropout_p} with an attn_mask that differs between heads or "
                       "query rows: block-sparse attention has no dropout (key-padding masks take it)")
    from . import _log
    from ._flex import flex_attention
    _log.note("attn_mask: general mask run block-sparse (blocks of 128 x 128, the mask read in partial blocks)")
    return flex_attention(query, key, value, scale=scale, enable_gqa=True, mask=mask).contiguous()
