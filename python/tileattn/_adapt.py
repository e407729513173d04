"""flash_attn's call forms that the core has no direct entry for, turned into ones it has, exactly:

- head dims that are not multiples of 8: zero columns appended to q, k and v (and to a cache),
  which change no score and no output column; the output is cut back (flash_attn pads the same way);
- flash_attn_varlen_func(block_table=...): the paged K/V of each sequence gathered into a packed
  variable-length batch;
- flash_attn_with_kvcache(cache_leftpad=...): the cache read through a page table of one-row pages
  that starts each sequence at its first valid row, in place (appends land where flash_attn writes
  them); rotary then applied here, at flash_attn's absolute cache positions;
- a rotary table shorter than the core's bound (flash_attn asks only for rows up to the cache
  capacity): extended with rows no valid position reads.

NumPy and CuPy arrays and PyTorch tensors alike; PyTorch's autograd flows through every step.
"""

from . import _C, _log
from ._arrays import is_torch, library

HDIM_MAX = 256


def _np(x):
    if library(x) == "cupy":
        import cupy
        return cupy
    import numpy
    return numpy


def padded_dim(fn, name, d):
    if not 1 <= d <= HDIM_MAX:
        raise _C.Error(f"tileattn.{fn}: {name}.shape[-1] (head dim) = {d}, expected 1 to {HDIM_MAX}")
    return (d + 7) // 8 * 8


def pad_last(x, to):
    """x with zero columns appended to its last dimension up to `to` (a copy), or x."""
    if x is None or x.shape[-1] == to:
        return x
    extra = to - x.shape[-1]
    if is_torch(x):
        import torch
        return torch.nn.functional.pad(x, (0, extra))
    xp = _np(x)
    return xp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


def pad_heads(fn, q, k, v):
    """(q, k, v, scale_dim) with head dims padded to multiples of 8; scale_dim is q's real head dim
    (the default scale's), None where nothing was padded."""
    dqk, dv = q.shape[-1], v.shape[-1]
    pqk, pv = padded_dim(fn, "q", dqk), padded_dim(fn, "v", dv)
    if pqk == dqk and pv == dv:
        return q, k, v, None
    _log.note(f"head dims {dqk}/{dv} padded to {pqk}/{pv}")
    return pad_last(q, pqk), pad_last(k, pqk if k.shape[-1] == dqk else k.shape[-1]), pad_last(v, pv), dqk


def gather_pages(fn, pages, block_table, cu_seqlens_k):
    """K or V [num_pages, page_size, heads, d] read through block_table [batch, pages_per_seq] as a
    packed [total_k, heads, d] batch with the lengths of cu_seqlens_k."""
    page = pages.shape[1]
    rows = _page_rows(fn, pages, block_table, cu_seqlens_k)
    flat = pages.reshape((pages.shape[0] * page,) + tuple(pages.shape[2:]))
    return flat[rows]


def _page_rows(fn, pages, block_table, cu):
    page, num = pages.shape[1], pages.shape[0]
    batch, per_seq = block_table.shape
    if cu.shape[0] != batch + 1:
        raise _C.Error(f"tileattn.{fn}: cu_seqlens_k has {cu.shape[0]} entries, expected {batch + 1} "
                       f"(block_table has {batch} rows)")
    if is_torch(block_table):
        import torch
        lens = (cu[1:] - cu[:-1]).long()
        total = int(cu[-1])
        seq = torch.repeat_interleave(torch.arange(batch, device=cu.device), lens, output_size=total)
        j = torch.arange(total, device=cu.device) - cu[:-1].long()[seq]
        longest = int(lens.max()) if batch else 0
        entry = block_table.long()[seq, torch.clamp(j // page, max=per_seq - 1)]
        lo, hi = (int(x) for x in torch.stack([entry.min(), entry.max()]).tolist()) if total else (0, 0)
        rows = entry * page + j % page
    else:
        xp = _np(block_table)
        lens = (cu[1:] - cu[:-1]).astype(xp.int64)
        total = int(cu[-1])
        seq = xp.repeat(xp.arange(batch), lens)
        j = xp.arange(total) - cu[:-1].astype(xp.int64)[seq]
        longest = int(lens.max()) if batch else 0
        entry = block_table.astype(xp.int64)[seq, xp.minimum(j // page, per_seq - 1)]
        lo, hi = (int(entry.min()), int(entry.max())) if total else (0, 0)
        rows = entry * page + j % page
    if longest > per_seq * page:
        raise _C.Error(f"tileattn.{fn}: a sequence of {longest} keys (from cu_seqlens_k) exceeds the "
                       f"{per_seq * page} rows its block_table row can address (block_table.shape[1] = {per_seq} "
                       f"pages of {page})")
    if lo < 0 or hi >= num:
        bad = lo if lo < 0 else hi
        raise _C.Error(f"tileattn.{fn}: block_table names page {bad}, outside [0, {num}) (k_cache.shape[0] pages)")
    _log.note(f"paged varlen: {total} keys gathered from {num} pages of {page}")
    return rows



def check_leftpad(fn, cache_leftpad, cache_seqlens, cache_batch_idx, rows, batch, check_device_values):
    """cache_leftpad int32 [batch] with 0 <= cache_leftpad[b] <= cache_seqlens[b], and cache_batch_idx
    (where given) in [0, rows): the page table built from them would otherwise start a sequence in
    another one's rows, which no later check can tell from a valid table, or name a page that only
    its own error would name. Values on a GPU are read (one synchronization) only where
    check_device_values, as the core reads cache_seqlens."""
    named = [("cache_leftpad", cache_leftpad), ("cache_seqlens", cache_seqlens)]
    if cache_batch_idx is not None:
        named.append(("cache_batch_idx", cache_batch_idx))
    for name, x in named:
        if tuple(x.shape) != (batch,):
            raise _C.Error(f"tileattn.{fn}: {name} has shape {tuple(x.shape)}, expected ({batch},) (batch)")
    dtype = str(cache_leftpad.dtype).rpartition(".")[2]
    if dtype != "int32":
        raise _C.Error(f"tileattn.{fn}: cache_leftpad has dtype {dtype}, expected int32")
    on_host = library(cache_leftpad) == "numpy" or (is_torch(cache_leftpad) and cache_leftpad.device.type == "cpu")
    if not (on_host or check_device_values):
        return
    if is_torch(cache_leftpad):
        import torch
        both = torch.stack([x.to(cache_leftpad.device, torch.int32) for _, x in named])
    else:
        xp = _np(cache_leftpad)
        both = xp.stack([xp.asarray(x, dtype=xp.int32) for _, x in named])
    values = (both.get() if library(both) == "cupy" else both).tolist()  # one copy
    for b, (pad, n) in enumerate(zip(values[0], values[1])):
        if not 0 <= pad <= n:
            raise _C.Error(f"tileattn.{fn}: cache_leftpad[{b}] = {pad}, expected 0 <= cache_leftpad[b] <= "
                           f"cache_seqlens[b] = {n}")
    for b, i in enumerate(values[2] if cache_batch_idx is not None else ()):
        if not 0 <= i < rows:
            raise _C.Error(f"tileattn.{fn}: cache_batch_idx[{b}] = {i} is outside [0, {rows}) (k_cache.shape[0])")


def leftpad_table(fn, k_cache, cache_leftpad, cache_batch_idx, batch):
    """The cache as one-row pages and the page table that starts sequence b at row cache_leftpad[b]
    of its cache row: (k_pages view, page_table [batch, capacity] int32). Unchecked values (GPU,
    check_device_indices=False) are clamped into the sequence's own row."""
    cap = k_cache.shape[1]
    if is_torch(k_cache):
        import torch
        base = (cache_batch_idx.long() if cache_batch_idx is not None else
                torch.arange(batch, device=k_cache.device)) * cap
        j = torch.arange(cap, device=k_cache.device)
        table = torch.minimum(base[:, None] + cache_leftpad.long().clamp(min=0)[:, None] + j, base[:, None] + cap - 1)
        return table.to(torch.int32)
    xp = _np(k_cache)
    base = (cache_batch_idx.astype(xp.int64) if cache_batch_idx is not None else xp.arange(batch)) * cap
    j = xp.arange(cap)
    table = xp.minimum(base[:, None] + xp.maximum(cache_leftpad.astype(xp.int64), 0)[:, None] + j,
                       base[:, None] + cap - 1)
    return table.astype(xp.int32)


def one_row_pages(fn, name, cache):
    """cache [rows, capacity, heads, d] as [rows * capacity, 1, heads, d], the same memory."""
    shape = (cache.shape[0] * cache.shape[1], 1) + tuple(cache.shape[2:])
    st = _strides(cache)
    # Dimensions 0 and 1 merge into one without a copy exactly when this holds; reshape then views.
    if cache.shape[0] == 1 or cache.shape[1] == 1 or st[0] == cache.shape[1] * st[1]:
        return cache.reshape(shape)
    raise _C.Error(f"tileattn.{fn}: cache_leftpad needs {name} whose batch and position dimensions flatten "
                   f"without a copy, got strides {tuple(st)}")


def _strides(x):
    return x.stride() if is_torch(x) else tuple(s // x.itemsize for s in x.strides)


def rotate(x, cos, sin, positions, interleaved):
    """flash_attn's rotary embedding of x [batch, seq, heads, d] at positions [batch, seq] (a copy):
    the first 2 * cos.shape[1] columns rotated in pairs (interleaved: adjacent columns; else the two
    halves), computed in fp32."""
    half = cos.shape[1]
    if is_torch(x):
        import torch
        c = cos[positions.long()].float()[:, :, None, :]
        s = sin[positions.long()].float()[:, :, None, :]
        xf = x.float()
        if interleaved:
            a, b = xf[..., 0:2 * half:2], xf[..., 1:2 * half:2]
            rot = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
        else:
            a, b = xf[..., :half], xf[..., half:2 * half]
            rot = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
        return torch.cat([rot.to(x.dtype), x[..., 2 * half:]], dim=-1)
    xp = _np(x)
    c = cos[positions].astype(xp.float32)[:, :, None, :]
    s = sin[positions].astype(xp.float32)[:, :, None, :]
    xf = x.astype(xp.float32)
    if interleaved:
        a, b = xf[..., 0:2 * half:2], xf[..., 1:2 * half:2]
        rot = xp.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(a.shape[:-1] + (2 * half,))
    else:
        a, b = xf[..., :half], xf[..., half:2 * half]
        rot = xp.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    return xp.concatenate([rot.astype(x.dtype), x[..., 2 * half:]], axis=-1)


def positions(like, start, count):
    """[batch, count] positions start[b] + i."""
    if is_torch(like):
        import torch
        return start.long()[:, None] + torch.arange(count, device=start.device)
    xp = _np(like)
    return start.astype(xp.int64)[:, None] + xp.arange(count)


def extend_rows(table, rows):
    """table [n, r] with rows appended up to `rows` (copies of its last row): positions past the
    cache capacity, which flash_attn never reads and the core's bound counts."""
    n = table.shape[0]
    if n >= rows or n == 0:
        return table
    if is_torch(table):
        import torch
        return torch.cat([table, table[-1:].expand(rows - n, table.shape[1])])
    xp = _np(table)
    return xp.concatenate([table, xp.repeat(table[-1:], rows - n, axis=0)])
