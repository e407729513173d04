"""Dense boolean masks (PyTorch) for block-sparse attention: the block lists a mask implies, and a
FlexAttention mask_mod evaluated densely.

A block of the mask whose elements are all True is fully visible (it never reads the mask), one with
some True partly visible (the kernels test the mask there), one with none skipped. The mask itself
costs one byte per element of its shape: B' x H' x seq_q x seq_k bytes, where B' and H' are 1 for
the dimensions it does not vary over (stride-0 broadcasts are kept at size 1, never copied).
"""

from . import _derived


def compact(mask):
    """The mask with its batch and head dims cut to size 1 where they are broadcast (stride 0)."""
    for d in (0, 1):
        if mask.shape[d] > 1 and mask.stride(d) == 0:
            mask = mask.narrow(d, 0, 1)
    return mask


def expand(fn, mask, batch, heads, seq_q, seq_k):
    """A bool mask broadcast to [batch, heads, seq_q, seq_k] (as SDPA broadcasts attn_mask), then
    compacted: a clear error naming `mask` where it does not broadcast."""
    import torch
    from . import _C
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"tileattn.{fn}: mask must be a torch.Tensor of dtype bool, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    full = (batch, heads, seq_q, seq_k)
    try:
        return compact(mask.expand(full))
    except RuntimeError:
        raise _C.Error(f"tileattn.{fn}: mask has shape {tuple(mask.shape)}, which does not broadcast to "
                       f"{full} (batch, heads_q, seq_q, seq_k)") from None


def block_lists(mask, block_q, block_k):
    """mask: bool [B, H, seq_q, seq_k] -> (kv_num_blocks, kv_indices, full_kv_num_blocks,
    full_kv_indices), int32 on the mask's device: per (B, H, query block) its partly and fully
    visible key blocks. Remembered while the mask (the tensor it views) is unchanged (_derived)."""
    return _derived.derived(mask, ("block_lists", block_q, block_k), lambda: _block_lists(mask, block_q, block_k))


def _block_lists(mask, block_q, block_k):
    import torch
    b, h, sq, sk = mask.shape
    nq, nk = -(-sq // block_q), -(-sk // block_k)
    m = mask.to(torch.uint8)
    pad = (0, nk * block_k - sk, 0, nq * block_q - sq)

    def per_block(fill, reduce):
        x = torch.nn.functional.pad(m, pad, value=fill).view(b, h, nq, block_q, nk, block_k)
        return reduce(reduce(x, 5), 3).bool()
    some = per_block(0, lambda x, d: x.amax(d))
    full = per_block(1, lambda x, d: x.amin(d))  # padding counts as visible: it is never read

    def lists(sel):
        num = sel.sum(-1, dtype=torch.int32)
        idx = torch.argsort(sel.to(torch.uint8), dim=-1, descending=True, stable=True).to(torch.int32)
        return num, idx
    return lists(some & ~full) + lists(full)


def from_mask_mod(mask_mod, batch, heads, seq_q, seq_k, device):
    """FlexAttention's mask_mod(b, h, q_idx, kv_idx) evaluated on broadcasting index tensors (as a
    mask_mod written with tensor operations allows), as a compact bool mask."""
    import torch

    def index(n, d):
        shape = [1, 1, 1, 1]
        shape[d] = n
        return torch.arange(n, device=device).view(shape)
    m = mask_mod(index(batch, 0), index(heads, 1), index(seq_q, 2), index(seq_k, 3))
    m = torch.as_tensor(m, device=device).to(torch.bool)
    return compact(m.expand(batch, heads, seq_q, seq_k))
