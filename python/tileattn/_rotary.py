"""Rotary position embedding for flash_attn_with_kvcache, in fp32 like flash_attn, for NumPy, CuPy
and PyTorch arrays (PyTorch's ops keep it traceable by torch.compile)."""

from ._arrays import library


def _ops(x):
    lib = library(x)
    if lib == "torch":
        import torch
        return torch.cat, torch.stack, lambda a: a.float(), lambda a, like: a.to(like.dtype)
    xp = __import__(lib)
    return (lambda xs, dim: xp.concatenate(xs, axis=dim), lambda xs, dim: xp.stack(xs, axis=dim),
            lambda a: a.astype(xp.float32), lambda a, like: a.astype(like.dtype))


def positions(base, seqlen, per_row, like):
    """Rotary positions [batch, seqlen]: base[b] + i when per_row, else base[b] for every row."""
    return base.reshape(-1, 1) + _arange(like, seqlen).reshape(1, -1) * (1 if per_row else 0)


def _arange(like, n):
    if library(like) == "torch":
        import torch
        return torch.arange(n, dtype=torch.int32, device=like.device)
    xp = __import__(library(like))
    return xp.arange(n, dtype=xp.int32)


def apply(x, cos, sin, pos, interleaved):
    """x [batch, seqlen, heads, d]; cos, sin [seqlen_ro, rotary_dim / 2]; pos [batch, seqlen].
    Rotates the first rotary_dim features of x: pairs (2i, 2i+1) when interleaved, else (i, i + rotary_dim/2)
    (GPT-NeoX style); the rest pass unchanged."""
    cat, stack, f32, cast = _ops(x)
    half = cos.shape[-1]
    rd = 2 * half
    c = f32(cos[pos])[:, :, None, :]
    s = f32(sin[pos])[:, :, None, :]
    xr = f32(x[..., :rd])
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    if interleaved:
        rot = stack([y1, y2], -1).reshape(tuple(xr.shape))
    else:
        rot = cat([y1, y2], -1)
    return cat([cast(rot, x), x[..., rd:]], -1)
