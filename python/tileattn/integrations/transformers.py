"""tileattn as a Hugging Face transformers attention implementation.

    import tileattn.integrations.transformers as tt
    tt.register()                      # once; name "tileattn"
    model = LlamaForCausalLM(config)   # with config._attn_implementation = "tileattn", or
    model = AutoModelForCausalLM.from_config(config, attn_implementation="tileattn")

transformers calls an attention function with query [batch, heads_q, seq_q, d] and key/value
[batch, heads_kv, seq_k, d] (the module's projections, rotary applied), the model's attention_mask, and
keyword arguments (dropout, scaling, sliding_window, softcap, is_causal, position_ids, packed-sequence
offsets ...); it expects (attn_output [batch, seq_q, heads_q, d], attn_weights or None). The contract
is the one of transformers' own flash-attention path, and so is the mask: register() also installs a
mask builder that never materializes a mask. The model then hands over None when every token is real
(causality comes from the module, aligned to the bottom-right corner, which is what a KV cache needs)
or a 2D [batch, keys in use] padding mask when some are not (static caches included: their empty
slots are cut off, see mask_builder); padded batches and packed sequences (given as
cu_seq_lens_q/k or as restarting position_ids) run as variable-length batches. Grouped-query heads are
read in place (no repeat of K and V). A 4D mask that a caller builds itself ([batch or 1, heads or 1,
seq_q, seq_k], boolean or additive with 0 and the dtype's lowest value, as transformers builds them)
runs block-sparse through tileattn's SDPA, the mask read only in the blocks it cuts. Attention sinks,
position biases and finite additive biases are refused.
"""

import torch

from .. import _derived
from .._flash_api import flash_attn_func, flash_attn_varlen_func
from .._sdpa import scaled_dot_product_attention

NAME = "tileattn"


def _window(sliding_window, seq_k):
    # transformers counts a window in tokens including the current one (flash-attention's convention
    # there): (w - 1) to the left; windows at least as long as the keys are no window at all.
    if sliding_window is None or seq_k <= sliding_window:
        return (-1, -1)
    return (sliding_window - 1, sliding_window - 1)


def _cu_seqlens(lengths):
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _packed_offsets(position_ids, batch, seq_q, seq_k):
    """cu_seqlens (int32) when position_ids pack several sequences into one row, else None. Packing is
    flash-attention's padding-free format: batch 1, positions restarting at their minimum per sequence."""
    if position_ids is None or batch != 1 or seq_q != seq_k or position_ids.numel() != seq_q:
        return None
    pos = position_ids.reshape(-1)
    starts = (pos == pos.min()).nonzero().reshape(-1)
    if starts.numel() <= 1:
        return None
    return torch.cat([starts.to(torch.int32), torch.tensor([seq_q], dtype=torch.int32, device=pos.device)])


def _mask_shape_error(mask):
    return ValueError(
        f"tileattn attention: attention_mask has shape {tuple(mask.shape)}; it takes a 2D padding mask "
        "[batch, keys] or a 4D mask [batch or 1, heads or 1, seq_q, seq_k]")


def _dense(query, key, value, mask, opts):
    """A caller's 4D mask, which holds causality and any window itself: boolean, or additive with 0 where
    visible and at most half the dtype's lowest value (-inf included) where not. Runs through tileattn's
    SDPA, block-sparse with the mask in the blocks it cuts. Returns [batch, seq_q, heads_q, d]."""
    if opts["softcap"]:
        raise NotImplementedError("tileattn attention: softcap with a 4D attention_mask is not supported")
    if mask.dtype != torch.bool:  # converted and checked once per mask: transformers passes one to every layer
        mask = _derived.derived(mask, "hf_visible", lambda: _visible(mask))
    out = scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=opts["dropout_p"],
                                       scale=opts["softmax_scale"], enable_gqa=True)
    return out.transpose(1, 2)


def _visible(mask):
    """An additive mask (0 where visible, the dtype's lowest value or -inf where not) as a boolean one."""
    visible = mask == 0
    if not bool((visible | (mask <= torch.finfo(mask.dtype).min / 2)).all()):
        raise ValueError("tileattn attention: the 4D attention_mask holds finite additive biases; it takes "
                         "0 where visible and the dtype's lowest value (or -inf) where not")
    return visible


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, **kwargs):
    """transformers' attention-function contract; returns (attn_output [batch, seq_q, heads_q, d], None)."""
    for name in ("s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"tileattn attention: {name} is not supported")
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("tileattn attention: output_attentions=True needs the attention probabilities, "
                                  "which tileattn never materializes; use attn_implementation='eager'")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    batch, _, seq_q, _ = query.shape
    seq_k = key.shape[2]
    # [batch, heads, seq, d] -> [batch, seq, heads, d]: strided views, no copy.
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    opts = dict(dropout_p=float(dropout), softmax_scale=scaling, causal=causal,
                window_size=_window(sliding_window, seq_k), softcap=float(softcap or 0.0))

    if attention_mask is not None:
        if attention_mask.ndim == 4:
            return _dense(query, key, value, attention_mask, opts), None
        if attention_mask.ndim != 2:
            raise _mask_shape_error(attention_mask)
        used = attention_mask.shape[1]
        if used < seq_k:
            # A static cache's slots past the last token hold nothing yet (see mask_builder).
            q, k, v = q, k[:, :used], v[:, :used]
            opts["window_size"] = _window(sliding_window, used)
        elif used > seq_k:
            attention_mask = attention_mask[:, -seq_k:]
        if attention_mask.stride() == (0, 0):
            return flash_attn_func(q, k, v, **opts), None  # every slot in use is a real token
        return _padded(q, k, v, attention_mask.bool(), opts), None

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        cu_q, cu_k = cu_q.to(torch.int32), cu_k.to(torch.int32)
        max_q = int(max_q) if max_q is not None else int(cu_q.diff().max())
        max_k = int(max_k) if max_k is not None else int(cu_k.diff().max())
    else:
        cu_q = cu_k = _packed_offsets(kwargs.get("position_ids"), batch, seq_q, seq_k)
        max_q = max_k = int(cu_q.diff().max()) if cu_q is not None else 0
    if cu_q is not None:
        out = flash_attn_varlen_func(*(x.reshape(-1, x.shape[2], x.shape[3]) for x in (q, k, v)), cu_q, cu_k,
                                     max_q, max_k, **opts)
        return out.reshape(batch, seq_q, *out.shape[1:]), None
    return flash_attn_func(q, k, v, **opts), None


def _padded(q, k, v, mask_k, opts):
    """Attention over the real tokens of a padded batch: gather them into a variable-length batch, attend,
    scatter back (padded query rows get zeros). Each sequence's queries are the real tokens among the
    last seq_q positions, aligned to its keys' bottom-right corner, as a KV cache lays them out."""
    batch, seq_q, heads_q, d = q.shape
    seq_k = k.shape[1]
    mask_q = mask_k[:, -seq_q:]
    idx_q = mask_q.reshape(-1).nonzero().reshape(-1)
    idx_k = mask_k.reshape(-1).nonzero().reshape(-1)
    len_q, len_k = mask_q.sum(1), mask_k.sum(1)
    cu_q, cu_k = _cu_seqlens(len_q), _cu_seqlens(len_k)
    max_q, max_k = (int(x) for x in torch.stack([len_q.max(), len_k.max()]).tolist())

    def gather(x, idx, seq):
        return x.reshape(batch * seq, x.shape[2], x.shape[3]).index_select(0, idx)

    out = flash_attn_varlen_func(gather(q, idx_q, seq_q), gather(k, idx_k, seq_k), gather(v, idx_k, seq_k),
                                 cu_q, cu_k, max_q, max_k, **opts)
    full = out.new_zeros(batch * seq_q, heads_q, out.shape[-1])
    return full.index_copy(0, idx_q, out).reshape(batch, seq_q, heads_q, out.shape[-1])


def mask_builder(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
                 **kwargs):
    """The mask transformers builds once per forward for this implementation, never an N x N one (causality
    and windows come from each module): a 2D [batch, used] mask over the key slots in use, or None when every
    slot is in use and every token is real.

    Key slot j holds the token at position kv_offset + j; the queries end at position q_offset + q_length,
    so the slots in use are the first used = q_offset + q_length - kv_offset, and the last q_length of them
    are the queries (bottom-right alignment). A static cache has slots past them that hold nothing yet: the
    mask is then shorter than the keys and the attention function cuts the keys to it. When every slot in
    use is a real token the mask is all True, returned as a broadcast view (strides 0, 0) that the
    attention function reads as "no padding" without looking at its values."""
    q_end = int(q_offset) + q_length  # a static cache gives a 0-d tensor: one host read per forward
    used = min(kv_length, q_end - kv_offset)
    if used < q_length:
        used = kv_length
    device = attention_mask.device if attention_mask is not None else kwargs.get("device", "cpu")
    if attention_mask is not None:
        real = attention_mask[:, kv_offset:kv_offset + used].bool()
        if real.shape[1] < used:  # slots past the given mask are masked, as transformers' own masks pad
            real = torch.nn.functional.pad(real, (0, used - real.shape[1]), value=False)
        if not bool(real.all()):
            return real
    if used == kv_length:
        return None
    return torch.ones((1, 1), dtype=torch.bool, device=device).expand(batch_size, used)


def register(name=NAME):
    """Registers the attention function and its mask builder under name in transformers' global
    interfaces, so that attn_implementation=name works for every model that dispatches through them."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_builder)
    return name
