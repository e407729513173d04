"""torch.nn.functional.scaled_dot_product_attention's signature on tileattn.

Tensors are [batch, heads, seq, dim]; they reach the core as [batch, seq, heads, dim] strided views
(a transpose, never a copy), and the output comes back as the same kind of view.
"""

from ._arrays import is_torch
from ._flash_api import _attend


def _swap_heads_seq(x):
    if is_torch(x):
        return x.transpose(1, 2)
    return x.swapaxes(1, 2)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """query [batch, heads_q, seq_q, d], key/value [batch, heads_kv, seq_k, d] -> [batch, heads_q, seq_q, d_v].
    is_causal aligns to the top-left corner (PyTorch's convention: query i sees keys j <= i).
    heads_kv < heads_q needs enable_gqa=True. attn_mask is not supported: the library builds its masks
    (causal, sliding window, varlen) from structure, never from an N x N tensor."""
    if attn_mask is not None:
        raise NotImplementedError(
            "tileattn.scaled_dot_product_attention: attn_mask is not supported; use is_causal, or "
            "flash_attn_func's window_size / alibi_slopes / softcap")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.ndim != 4:
            raise ValueError(f"tileattn.scaled_dot_product_attention: {name} has shape {tuple(x.shape)}, "
                             "expected [batch, heads, seq, dim]")
    if not enable_gqa and key.shape[1] != query.shape[1]:
        raise ValueError(f"tileattn.scaled_dot_product_attention: query has {query.shape[1]} heads and key "
                         f"{key.shape[1]}; pass enable_gqa=True for grouped-query attention")
    out, _ = _attend(_swap_heads_seq(query), _swap_heads_seq(key), _swap_heads_seq(value), None, None, 0, 0,
                     dropout_p, scale, is_causal, (-1, -1), 0.0, None, False, top_left=True)
    return _swap_heads_seq(out)
