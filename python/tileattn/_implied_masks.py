"""Block masks that add nothing to the element rule of their call.

A FlexAttention BlockMask made for causal attention (full blocks below the diagonal, partial ones on
it) or a sliding window, used with that same rule as the partial blocks' element mask, gives
exactly the dense call under the rule: every block it skips holds no visible element, and every
block it lists as full is fully visible. Such a call runs the dense kernels instead (the plain
instantiations, with no block-mask walk), which are faster than the block-sparse ones on the same
blocks. The same holds for a mask made for packed documents (causal within each) used with their
document ids, which then run as a variable-length batch (_documents). Decided once per mask and
ids, where the mask's first use copies it to the host anyway (_checked_masks).
"""

import torch


def cells(lists, rows, cols):
    """[B, H, rows, cols] int8: 0 skipped, 1 partly visible, 2 fully visible (full lists last)."""
    num = lists[0]
    state = torch.zeros(*num.shape[:2], rows, cols + 1, dtype=torch.int8, device=num.device)
    for value, (n, idx) in ((1, lists[:2]), (2, lists[2:])):
        if n is None:
            continue
        listed = torch.arange(idx.shape[-1], device=idx.device) < n[..., None]
        # Unlisted slots point at a spare column, dropped below.
        state.scatter_(-1, torch.where(listed, idx.long(), cols), value)
    return state[..., :cols]


def _row_ranges(sq, sk, causal, top_left, left, right, device):
    """Each row's keys [begin, end) under the causal / window rule: [sq] each."""
    right = 0 if causal else right
    i = torch.arange(sq, device=device) + (0 if top_left else sk - sq)
    begin = torch.clamp(i - left, min=0) if left >= 0 else torch.zeros_like(i)
    end = torch.clamp(i + right + 1, max=sk) if right >= 0 else torch.full_like(i, sk)
    return begin, end


def _rule_blocks(begin, end, sq, sk, block_q, block_k):
    """(skip, full) [..., rows, cols] bool: the blocks rows with keys [begin, end) ([..., sq] each)
    see nothing of, and those they see whole. Each row's keys are one range whose ends never
    decrease with the row, so a block's first and last rows decide (as Variant::visit does, exactly
    for these rules)."""
    rows, cols = -(-sq // block_q), -(-sk // block_k)
    i0 = torch.arange(rows, device=begin.device) * block_q
    i1 = torch.clamp(i0 + block_q, max=sq) - 1
    j0 = torch.arange(cols, device=begin.device) * block_k
    j1 = torch.clamp(j0 + block_k, max=sk)
    first_begin, first_end = begin[..., i0, None], end[..., i0, None]
    last_begin, last_end = begin[..., i1, None], end[..., i1, None]
    skip = (j0 >= last_end) | (j1 <= first_begin)
    full = ~skip & (j0 >= last_begin) & (j1 <= first_end)
    return skip, full


def implied(lists, sq, sk, block_q, block_k, causal, top_left, left, right, documents=None):
    """Whether the block mask (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices; the
    full pair may be None) adds nothing to the causal / window rule: every skipped block is invisible
    under the rule and every full block wholly visible. documents: (first, end) [batch, seq], each
    row's document as one run of keys (_documents), which the rule then also keeps to. One
    synchronization."""
    begin, end = _row_ranges(sq, sk, causal, top_left, left, right, lists[0].device)
    if documents is not None:
        # Rows of a document see its diagonal, so the ranges stay one run that never goes back.
        begin, end = torch.maximum(begin, documents[0]), torch.minimum(end, documents[1])
    skip, full = _rule_blocks(begin, end, sq, sk, block_q, block_k)
    if skip.dim() == 3:  # per sequence: [batch, 1, rows, cols] against the lists' [B, H, ...]
        skip, full = skip[:, None], full[:, None]
    state = cells(lists, -(-sq // block_q), -(-sk // block_k))
    wrong = ((state == 0) & ~skip) | ((state == 2) & ~full)
    return not bool(wrong.any())
