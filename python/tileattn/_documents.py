"""Document ids of packed sequences, and dense masks of packed documents, run as a variable-length
batch.

A row that sees only keys of its own document, where each document is one run of positions, is a
row of that document's own sequence: under causal, a sliding window, softcap or ALiBi (rules that
see only positions relative to the row, and queries and keys share the documents), the call is
exactly the varlen call over the documents. That call runs the plain varlen kernels, which skip
other documents' tiles and test no id per element, where the block-sparse kernels test both ids in
every partial block. The runs are read once per ids tensor (_derived): two synchronizations (the
runs' count, then their lengths and the check), which a training step pays once for all of its
layers. A dense boolean mask (SDPA's attn_mask) that is block-diagonal, causal within each block or
not, is such a call too (from_mask).
"""

import torch

from . import _derived


def _runs(ids):
    """ids [batch, seq] -> (cu_seqlens int32 [docs + 1] over the batch's batch * seq positions, the
    longest run, each position's run start and end within its sequence [batch, seq] int64), or None
    where an id comes back after another (a document in more than one run)."""
    batch, seq = ids.shape
    if batch * seq == 0:
        return None
    change = torch.ones(batch, seq, dtype=torch.bool, device=ids.device)
    change[:, 1:] = ids[:, 1:] != ids[:, :-1]
    flat = change.reshape(-1)
    starts = flat.nonzero().reshape(-1)
    cu = torch.cat([starts, starts.new_tensor([batch * seq])])
    lens = cu[1:] - cu[:-1]
    # (sequence, id) per run as one int64: a document in two runs repeats its key.
    key = (starts // seq) * 2**32 + (ids.reshape(-1)[starts].long() + 2**31)
    ordered = key.sort().values
    repeated, longest = torch.stack([(ordered[1:] == ordered[:-1]).any().long(), lens.max()]).tolist()
    if repeated:
        return None
    run = flat.long().cumsum(0) - 1
    base = torch.arange(batch, device=ids.device).repeat_interleave(seq) * seq
    first, end = (cu[run + i] - base for i in (0, 1))
    return cu.to(torch.int32), int(longest), first.view(batch, seq), end.view(batch, seq)


def tokens(x):
    """x [batch, heads, seq, d] as the packed [batch * seq, heads, d] of a varlen call: a view where
    the memory is [batch, seq, heads, d] (_flattens), else a copy."""
    return x.transpose(1, 2).reshape(x.shape[0] * x.shape[2], x.shape[1], x.shape[3])


def _flattens(x):
    """Whether x [batch, heads, seq, d] (a [batch, seq, heads, d] layout's view) reads as
    [batch * seq, heads, d] without a copy."""
    return x.stride(-1) == 1 and (x.shape[0] == 1 or x.stride(0) == x.shape[2] * x.stride(2))


def packed(q, k, v, ids_q, ids_k, unrelative):
    """The runs of a flex_attention call's documents (_runs) where the call is the varlen call over
    them, else None. unrelative: the call has a rule on absolute positions (chunks, a prefix, a dense
    mask)."""
    if unrelative or ids_q is None or ids_q is not ids_k or type(ids_q) is not torch.Tensor:
        return None
    batch, seq = q.shape[0], q.shape[2]
    if ids_q.dtype != torch.int32 or tuple(ids_q.shape) != (batch, seq) or ids_q.device != q.device or \
            k.shape[2] != seq or not all(_flattens(x) for x in (q, k, v)):
        return None  # the block-sparse call, which names whatever is wrong with the ids
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return None  # no read-back inside a CUDA graph
    return _derived.derived(ids_q, "document_runs", lambda: _runs(ids_q))


def from_mask(mask, batch):
    """(causal, cu_seqlens, longest) where a compact bool mask [batch or 1, heads or 1, s, s] is the
    same for every head and lets each row see exactly its own document's keys (causal: those up to
    the row) for documents that are runs of positions; else None (rows that see no key included).
    Most other masks fail on their rows' first key and count (two passes over the mask)."""
    _, heads, sq, sk = mask.shape
    if sq != sk or sq == 0:
        return None
    m = mask[:, 0]
    i = torch.arange(sq, device=m.device)
    count = m.sum(-1)
    first = m.view(torch.uint8).argmax(-1)  # each row's first visible key
    end = first + count  # where its run ends if its keys are one run
    starts = first == i  # rows where a document starts
    start = torch.where(starts, i, -1).cummax(-1).values  # the start of each row's document
    runs = (count > 0) & (first == start)
    causal = bool((runs & (end == i + 1)).all())
    if not causal:
        after = torch.where(starts, i, sq).flip(-1).cummin(-1).values.flip(-1)  # the next start at or after
        following = torch.cat([after[:, 1:], after.new_full((after.shape[0], 1), sq)], -1)
        if not bool((runs & (end == following)).all()):
            return None
    # count keys from the first: they are the run exactly where none lies past its end.
    last = sk - 1 - m.flip(-1).view(torch.uint8).argmax(-1)
    if not bool((last < end).all()) or (heads > 1 and not bool((mask == mask[:, :1]).all())):
        return None
    ids = starts.int().cumsum(-1, dtype=torch.int32).expand(batch, sq).contiguous()
    return (causal,) + _runs(ids)[:2]
