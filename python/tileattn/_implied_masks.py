"""Block masks that add nothing to the element rule of their call.

A FlexAttention BlockMask made for causal attention (full blocks below the diagonal, partial ones on
it) or a sliding window, used with that same rule as the partial blocks' element mask, gives
exactly the dense call under the rule: every block it skips holds no visible element, and every
block it lists as full is fully visible. Such a call runs the dense kernels instead (the plain
instantiations, with no block-mask walk), which are faster than the block-sparse ones on the same
blocks. Decided once per mask, where its first use copies it to the host anyway (_checked_masks).
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


def _rule_blocks(sq, sk, block_q, block_k, causal, top_left, left, right, device):
    """(skip, full) [rows, cols] bool: the blocks a causal / window rule sees nothing of, and those
    it sees whole. Each row's keys are one range whose ends never decrease with the row, so a
    block's first and last rows decide (as Variant::visit does, exactly for these rules)."""
    right = 0 if causal else right
    off = 0 if top_left else sk - sq
    rows, cols = -(-sq // block_q), -(-sk // block_k)
    i0 = torch.arange(rows, device=device) * block_q
    i1 = torch.clamp(i0 + block_q, max=sq)
    j0 = torch.arange(cols, device=device) * block_k
    j1 = torch.clamp(j0 + block_k, max=sk)

    def key_begin(i):
        return torch.clamp(i + off - left, min=0) if left >= 0 else torch.zeros_like(i)

    def key_end(i):
        return torch.clamp(i + off + right + 1, max=sk) if right >= 0 else torch.full_like(i, sk)

    first_begin, first_end = key_begin(i0)[:, None], key_end(i0)[:, None]
    last_begin, last_end = key_begin(i1 - 1)[:, None], key_end(i1 - 1)[:, None]
    skip = (j0[None, :] >= last_end) | (j1[None, :] <= first_begin)
    full = ~skip & (j0[None, :] >= last_begin) & (j1[None, :] <= first_end)
    return skip, full


def implied(lists, sq, sk, block_q, block_k, causal, top_left, left, right):
    """Whether the block mask (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices; the
    full pair may be None) adds nothing to the causal / window rule: every skipped block is invisible
    under the rule and every full block wholly visible. One synchronization."""
    rows, cols = -(-sq // block_q), -(-sk // block_k)
    skip, full = _rule_blocks(sq, sk, block_q, block_k, causal, top_left, left, right, lists[0].device)
    state = cells(lists, rows, cols)
    wrong = ((state == 0) & ~skip) | ((state == 2) & ~full)
    return not bool(wrong.any())
