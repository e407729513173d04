"""The float64 NumPy oracle for the Python tests: attention that materializes S and P, its analytic
gradients, the Philox dropout mask, rotary embedding, and a same-precision standard implementation
(the baseline of DESIGN.md's tolerance rule)."""

import numpy as np
import pytest

try:
    import ml_dtypes
except ImportError:  # bf16 tests skip without it
    ml_dtypes = None


def np_dtype(name):
    if name == "bf16":
        if ml_dtypes is None:
            pytest.skip("bfloat16 NumPy arrays need ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"f32": np.float32, "f16": np.float16}[name])


def f64(x):
    return np.asarray(x).astype(np.float64)


# Philox 4x32-10 on uint64 arrays holding 32-bit values (mirrors src/common/philox.hpp).
_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF


def _philox(c0, c1, c2, c3, k0, k1):
    c = [np.asarray(x, dtype=np.uint64) for x in np.broadcast_arrays(c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(10):
        p0 = np.uint64(_M0) * c[0]
        p1 = np.uint64(_M1) * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(_MASK)
        hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(_MASK)
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0 = (k0 + np.uint64(_W0)) & np.uint64(_MASK)
        k1 = (k1 + np.uint64(_W1)) & np.uint64(_MASK)
    return c


def dropout_keep(p, seed, offset, bh, sq, sk):
    """Keep mask [sq, sk] of (batch * heads_q + head) = bh: the library's Dropout::keep."""
    threshold = int(float(np.float32(p)) * 4294967296.0)
    k0 = seed & _MASK
    k1 = ((seed >> 32) + (offset >> 32)) & _MASK
    i = np.arange(sq, dtype=np.uint64)[:, None]
    j = np.arange(sk, dtype=np.uint64)[None, :]
    words = _philox(j >> np.uint64(2), i, np.uint64(bh), np.uint64(offset & _MASK), k0, k1)
    word = np.choose((j & np.uint64(3)).astype(np.int64) + np.zeros((sq, 1), dtype=np.int64), words)
    return word >= threshold


def visible(sq, sk, causal=False, window=(-1, -1), top_left=False):
    """[sq, sk] bool: key j visible to query row i (src/common/mask.hpp)."""
    diag = 0 if top_left else sk - sq
    left, right = window
    if causal:
        right = 0
    i = np.arange(sq)[:, None] + diag
    j = np.arange(sk)[None, :]
    vis = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis


class Head:
    """Attention of one (sequence, query head) in float64, keeping what the backward needs."""

    def __init__(self, q, k, v, scale, vis, softcap=0.0, slope=0.0, diag=0, keep=None, p=0.0):
        self.q, self.k, self.v = f64(q), f64(k), f64(v)
        self.scale, self.softcap, self.vis = scale, softcap, vis
        raw = self.q @ self.k.T * scale
        s = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
        self.capped = s
        if slope:
            i = np.arange(s.shape[0])[:, None] + diag
            s = s - slope * np.abs(i - np.arange(s.shape[1])[None, :])
        s = np.where(vis, s, -np.inf)
        m = s.max(axis=1, keepdims=True) if s.shape[1] else np.full((s.shape[0], 1), -np.inf)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        e = np.where(vis, np.exp(s - m_safe), 0.0)
        l = e.sum(axis=1, keepdims=True)
        self.lse = np.where(l > 0, np.log(np.where(l > 0, l, 1.0)) + m_safe, -np.inf)[:, 0]
        self.p = e / np.where(l > 0, l, 1.0)
        self.drop = np.ones_like(self.p) if keep is None else keep / (1.0 - float(np.float32(p)))
        self.out = (self.p * self.drop) @ self.v

    def grads(self, dout):
        dout = f64(dout)
        dv = (self.p * self.drop).T @ dout
        dpd = dout @ self.v.T * self.drop
        ds = self.p * (dpd - (dpd * self.p).sum(axis=1, keepdims=True))  # d/d(modified score)
        if self.softcap > 0:
            ds = ds * (1.0 - (self.capped / self.softcap) ** 2)
        ds = ds * self.scale
        return ds @ self.k, ds.T @ self.q, dv


def attention(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None, top_left=False,
              dropout_p=0.0, seed=0, offset=0, dout=None):
    """Batched [b, s, h, d] oracle. Returns (out, lse) or, with dout, (out, lse, dq, dk, dv); float64."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    out = np.zeros((b, sq, hq, v.shape[3]))
    lse = np.zeros((b, hq, sq))
    grads = [np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)]
    vis = visible(sq, sk, causal, window, top_left)
    diag = 0 if top_left else sk - sq
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hk)
            slope = 0.0 if alibi is None else float(np.asarray(alibi).reshape(-1, hq)[bi if np.ndim(alibi) == 2 else 0, h])
            keep = dropout_keep(dropout_p, seed, offset, bi * hq + h, sq, sk) if dropout_p > 0 else None
            head = Head(q[bi, :, h], k[bi, :, kh], v[bi, :, kh], scale, vis, softcap, slope, diag, keep, dropout_p)
            out[bi, :, h] = head.out
            lse[bi, h] = head.lse
            if dout is not None:
                dq, dk, dv = head.grads(dout[bi, :, h])
                grads[0][bi, :, h] += dq
                grads[1][bi, :, kh] += dk
                grads[2][bi, :, kh] += dv
    return (out, lse) if dout is None else (out, lse, *grads)


def varlen_attention(q, k, v, cu_q, cu_k, **kw):
    """Packed [total, h, d] oracle: each sequence on its own. Returns (out [total_q, h, dv], lse [h, total_q])."""
    out = np.zeros(q.shape[:2] + (v.shape[2],))
    lse = np.zeros((q.shape[1], q.shape[0]))
    for b in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        alibi = kw.get("alibi")
        kwb = dict(kw, alibi=None if alibi is None else np.asarray(alibi).reshape(-1, q.shape[1])[b if np.ndim(alibi) == 2 else 0])
        o, l = attention(q[None, qs], k[None, ks], v[None, ks], **kwb)
        out[qs], lse[:, qs] = o[0], l[0]
    return out, lse


def rotary(x, cos, sin, pos, interleaved):
    """x [b, s, h, d] rotated at positions pos [b, s] by cos/sin [positions, rotary_dim / 2]; float64."""
    x = f64(x).copy()
    half = cos.shape[1]
    c, s = f64(cos)[pos][:, :, None, :], f64(sin)[pos][:, :, None, :]
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = x1 * c - x2 * s, x1 * s + x2 * c
    return x


def standard_attention(q, k, v, dtype, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
                       top_left=False):
    """The same-precision baseline: inputs, S, P and the output rounded to dtype, arithmetic in fp32."""
    rd = lambda x: np.asarray(x).astype(dtype).astype(np.float32)  # noqa: E731
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    vis = visible(sq, sk, causal, window, top_left)
    dist = np.abs(np.arange(sq)[:, None] + (0 if top_left else sk - sq) - np.arange(sk)[None, :]).astype(np.float32)
    out = np.zeros((b, sq, hq, v.shape[3]), dtype=np.float32)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hk)
            s = rd(rd(q[bi, :, h]) @ rd(k[bi, :, kh]).T * np.float32(scale))
            if softcap > 0:
                s = np.float32(softcap) * np.tanh(s / np.float32(softcap))
            if alibi is not None:
                s = s - np.float32(np.asarray(alibi).reshape(-1, hq)[bi if np.ndim(alibi) == 2 else 0, h]) * dist
            s = np.where(vis, s, -np.inf)
            m = np.max(s, axis=1, keepdims=True)
            e = np.where(vis, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
            p = rd(e / np.maximum(e.sum(axis=1, keepdims=True), np.finfo(np.float32).tiny))
            out[bi, :, h] = rd(p @ rd(v[bi, :, kh]))
    return out.astype(np.float64)


def check_rule(x, baseline, oracle, floor=1e-3):
    """DESIGN.md: |x - oracle| <= 2 |baseline - oracle| + floor (max norms)."""
    e = np.max(np.abs(f64(x) - oracle))
    eb = np.max(np.abs(f64(baseline) - oracle))
    assert e <= 2 * eb + floor, f"max abs error {e} vs bound {2 * eb + floor} (2 x baseline {eb} + floor {floor})"


def assert_f32_close(x, oracle, tol=1e-5):
    x, oracle = f64(x), f64(oracle)
    assert np.array_equal(np.isinf(x), np.isinf(oracle)), "infinities differ"
    fin = np.isfinite(oracle)
    scale = max(1.0, float(np.max(np.abs(oracle[fin]))) if fin.any() else 1.0)
    err = float(np.max(np.abs(x[fin] - oracle[fin]))) if fin.any() else 0.0
    assert err <= tol * scale, f"max abs error {err} > {tol} x {scale}"
