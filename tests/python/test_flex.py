"""Block-sparse attention from Python: block_sparse_forward/backward on NumPy arrays against the float64
oracle with the block mask materialized, their errors, and tileattn.flex_attention on PyTorch CPU
tensors against torch's own flex_attention (forward, gradients, torch.compile); the PyTorch tests skip
without PyTorch."""

import numpy as np
import pytest

import tileattn
from reference import Head, assert_f32_close, visible


def random_block_mask(rng, batch, heads, sq, sk, bq, bk, density=0.5):
    """A random mask as (state [batch, heads, q_blocks, k_blocks]: 0 skip, 1 partial, 2 full) and its
    int32 lists (counts, indices, full counts, full indices), each row's blocks in random order."""
    qb, kb = -(-sq // bq), -(-sk // bk)
    state = np.where(rng.random((batch, heads, qb, kb)) < density, rng.integers(1, 3, (batch, heads, qb, kb)), 0)
    lists = []
    for want in (1, 2):
        num = (state == want).sum(axis=-1).astype(np.int32)
        idx = np.full((batch, heads, qb, max(kb, 1)), -5, dtype=np.int32)
        for b, h, q in np.ndindex(batch, heads, qb):
            blocks = rng.permutation(np.flatnonzero(state[b, h, q] == want))
            idx[b, h, q, :len(blocks)] = blocks
        lists += [num, idx]
    return state, lists


def materialize(state, b, h, sq, sk, bq, bk, element):
    """[sq, sk] bool: full blocks visible, partial blocks by the element mask, others not."""
    s = state[b if state.shape[0] > 1 else 0, h if state.shape[1] > 1 else 0]
    blocks = s[np.arange(sq)[:, None] // bq, np.arange(sk)[None, :] // bk]
    return (blocks == 2) | ((blocks == 1) & element)


@pytest.mark.parametrize("bq,bk", [(16, 16), (32, 48), (128, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_numpy_matches_oracle(bq, bk, causal):
    rng = np.random.default_rng()
    batch, hq, hk, sq, sk, d = 2, 4, 2, int(rng.integers(1, 200)), int(rng.integers(1, 200)), 24
    q = rng.standard_normal((batch, sq, hq, d)).astype(np.float32)
    k = rng.standard_normal((batch, sk, hk, d)).astype(np.float32)
    v = rng.standard_normal((batch, sk, hk, d)).astype(np.float32)
    dout = rng.standard_normal((batch, sq, hq, d)).astype(np.float32)
    state, lists = random_block_mask(rng, batch, hq, sq, sk, bq, bk)
    kw = dict(block_size=(bq, bk), causal=causal, top_left=True, backend="cpu_flash")
    out, lse = tileattn.block_sparse_forward(q, k, v, *lists, **kw)
    dq, dk, dv = tileattn.block_sparse_backward(dout, q, k, v, out, lse, *lists, **kw)
    element = visible(sq, sk, causal, top_left=True)
    want = [np.zeros(x.shape) for x in (out, q, k, v)]
    want_lse = np.zeros(lse.shape)
    for b in range(batch):
        for h in range(hq):
            g = h // (hq // hk)
            head = Head(q[b, :, h], k[b, :, g], v[b, :, g], d ** -0.5, materialize(state, b, h, sq, sk, bq, bk, element))
            want[0][b, :, h], want_lse[b, h] = head.out, head.lse
            gq, gk, gv = head.grads(dout[b, :, h])
            want[1][b, :, h] += gq
            want[2][b, :, g] += gk
            want[3][b, :, g] += gv
    for got, ref in zip((out, lse, dq, dk, dv), (want[0], want_lse, *want[1:])):
        assert_f32_close(got, ref)


def test_block_sparse_errors_name_the_argument():
    q = np.zeros((1, 40, 2, 8), np.float32)
    num = np.ones((1, 2, 3), np.int32)
    idx = np.full((1, 2, 3, 1), 5, np.int32)
    with pytest.raises(tileattn.Error, match=r"block_mask.kv_indices\[0, 0, 0, 0\] = 5 is outside \[0, 3\)"):
        tileattn.block_sparse_forward(q, q, q, num, idx, block_size=16, backend="cpu_flash")
    with pytest.raises(tileattn.Error, match=r"block_mask.block_q = 24, block_mask.block_k = 16"):
        tileattn.block_sparse_forward(q, q, q, num, idx, block_size=(24, 16), backend="cpu_flash")


@pytest.mark.parametrize("kw,error,match", [
    (dict(block_size=1.5), TypeError, r"block_size = 1.5 is a float, expected an int"),
    (dict(block_size="16"), TypeError, r"block_size = '16' is a str, expected an int"),
    (dict(block_size=(16, 16, 16)), TypeError, r"block_size = \(16, 16, 16\), expected an int or a pair"),
    (dict(block_size=(16, 2**31)), tileattn.Error, r"block_size\[1\] = 2147483648 is outside"),
    (dict(chunk_size=1.5), TypeError, r"chunk_size = 1.5 is a float"),
    (dict(chunk_size=2**31), tileattn.Error, r"chunk_size = 2147483648 is outside"),
    (dict(document_ids=(None,) * 3), TypeError, r"document_ids is a tuple of 3, expected one array or a pair"),
])
@pytest.mark.parametrize("fn", ["block_sparse_forward", "block_sparse_backward"])
def test_block_sparse_python_arguments_name_themselves(fn, kw, error, match):
    """Arguments the native module cannot even take (a float or an out-of-range int, a tuple of the
    wrong length) get an error naming them, never a truncation or nanobind's generic message."""
    q = np.zeros((1, 40, 2, 16), np.float32)
    num, idx = np.ones((1, 2, 3), np.int32), np.zeros((1, 2, 3, 1), np.int32)
    args = (q, q, q) if fn == "block_sparse_forward" else (q, q, q, q, q, np.zeros((1, 2, 40), np.float32))
    with pytest.raises(error, match=f"tileattn.{fn}: {match}"):
        getattr(tileattn, fn)(*args, num, idx, backend="cpu_flash", **kw)


@pytest.mark.parametrize("varlen", [False, True])
def test_dense_mask_numpy_matches_oracle(varlen):
    """block_sparse_forward/backward with a dense bool mask in the partial blocks: random bits, rows
    all False, a mask broadcast over heads and stored transposed; varlen masks indexed by positions
    within each sequence and longer than the longest one."""
    rng = np.random.default_rng()
    bq = bk = 16
    hq, hk, d = 4, 2, 16
    lens_q = [int(x) for x in rng.integers(1, 70, 2)]
    lens_k = [int(x) for x in rng.integers(1, 70, 2)]
    if not varlen:
        lens_q, lens_k = [lens_q[0]] * 2, [lens_k[0]] * 2
    sq, sk = max(lens_q), max(lens_k)
    rows, cols = (sq + 3, sk + 2) if varlen else (sq, sk)
    mask = (rng.random((2, 1, cols, rows)) < 0.6).transpose(0, 1, 3, 2)  # [b, 1, rows, cols], stored transposed
    mask[0, 0, rows // 2] = False  # a row that sees nothing in partial blocks (any row count, 1 included)
    state, lists = random_block_mask(rng, 2, hq, sq, sk, bq, bk, density=0.7)
    ins = [rng.standard_normal(shape).astype(np.float32) for shape in
           ((sum(lens_q), hq, d), (sum(lens_k), hk, d), (sum(lens_k), hk, d), (sum(lens_q), hq, d))]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    if varlen:
        q, k, v, dout = ins
        kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=sq, max_seqlen_k=sk)
    else:
        q, k, v, dout = (x.reshape((2, -1) + x.shape[1:]) for x in ins)
        kw = {}
    kw.update(block_size=bq, mask=mask, backend="cpu_flash")
    out, lse = tileattn.block_sparse_forward(q, k, v, *lists, **kw)
    dq, dk, dv = tileattn.block_sparse_backward(dout, q, k, v, out, lse, *lists, **kw)
    flat = [x.reshape((-1,) + x.shape[-2:]) for x in (q, k, v, dout, out, dq, dk, dv)]
    q, k, v, dout, out, dq, dk, dv = flat
    lse = lse if varlen else lse.transpose(1, 0, 2).reshape(hq, -1)
    want = [np.zeros(x.shape) for x in (out, q, k, v)]
    want_lse = np.zeros(lse.shape)
    for b in range(2):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        n, m = lens_q[b], lens_k[b]
        for h in range(hq):
            g = h // (hq // hk)
            vis = materialize(state, b, h, n, m, bq, bk, mask[b, 0, :n, :m])
            head = Head(q[rq, h], k[rk, g], v[rk, g], d ** -0.5, vis)
            want[0][rq, h], want_lse[h, rq] = head.out, head.lse
            gq, gk, gv = head.grads(dout[rq, h])
            want[1][rq, h] += gq
            want[2][rk, g] += gk
            want[3][rk, g] += gv
    for got, ref in zip((out, lse, dq, dk, dv), (want[0], want_lse, *want[1:])):
        assert_f32_close(got, ref)


def test_dense_mask_errors_name_the_argument():
    q = np.zeros((1, 40, 2, 8), np.float32)
    num, idx = np.ones((1, 2, 3), np.int32), np.zeros((1, 2, 3, 1), np.int32)
    with pytest.raises(tileattn.Error, match=r"block_mask.mask has shape \[1, 1, 40, 41\], expected"):
        tileattn.block_sparse_forward(q, q, q, num, idx, block_size=16, mask=np.ones((1, 1, 40, 41), bool),
                                      backend="cpu_flash")
    with pytest.raises(tileattn.Error, match=r"block_mask.mask has dtype f32, expected u8"):
        tileattn.block_sparse_forward(q, q, q, num, idx, block_size=16, mask=np.ones((1, 1, 40, 40), np.float32),
                                      backend="cpu_flash")
    with pytest.raises(tileattn.Error, match=r"block_mask.mask is given without block_mask.kv_num_blocks"):
        tileattn.block_sparse_forward(q, q, q, mask=np.ones((1, 1, 40, 40), bool), backend="cpu_flash")


def test_document_ids_numpy_match_oracle():
    rng = np.random.default_rng()
    sq, sk = int(rng.integers(1, 150)), int(rng.integers(1, 150))
    q = rng.standard_normal((2, sq, 2, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, sk, 2, 16)).astype(np.float32) for _ in range(2))
    ids_q = rng.integers(0, 3, (2, sq)).astype(np.int32)
    ids_k = rng.integers(0, 3, (2, sk)).astype(np.int32)
    out, lse = tileattn.block_sparse_forward(q, k, v, document_ids=(ids_q, ids_k), backend="cpu_flash")
    for b in range(2):
        vis = ids_q[b][:, None] == ids_k[b][None, :]
        for h in range(2):
            head = Head(q[b, :, h], k[b, :, h], v[b, :, h], 0.25, vis)
            assert_f32_close(out[b, :, h], head.out)
            assert_f32_close(lse[b, h], head.lse)


def test_chunked_local_numpy_matches_oracle():
    rng = np.random.default_rng()
    sq = sk = int(rng.integers(1, 150))
    chunk = int(rng.integers(1, 40))
    q, k, v = (rng.standard_normal((1, sq, 2, 16)).astype(np.float32) for _ in range(3))
    out, lse = tileattn.block_sparse_forward(q, k, v, chunk_size=chunk, causal=True, backend="cpu_flash")
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    vis = (j <= i) & (i // chunk == j // chunk)
    for h in range(2):
        head = Head(q[0, :, h], k[0, :, h], v[0, :, h], 0.25, vis)
        assert_f32_close(out[0, :, h], head.out)
        assert_f32_close(lse[0, h], head.lse)


@pytest.mark.parametrize("per_sequence", [False, True])
def test_prefix_lm_numpy_matches_oracle(per_sequence):
    rng = np.random.default_rng()
    sq, sk = int(rng.integers(1, 150)), int(rng.integers(1, 150))
    q = rng.standard_normal((2, sq, 4, 16)).astype(np.float32)
    k, v = (rng.standard_normal((2, sk, 2, 16)).astype(np.float32) for _ in range(2))
    prefix = rng.integers(0, sk + 3, 2).astype(np.int32) if per_sequence else int(rng.integers(1, sk + 3))
    out, lse = tileattn.block_sparse_forward(q, k, v, prefix_len=prefix, causal=True, backend="cpu_flash")
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    for b in range(2):
        p = prefix[b] if per_sequence else prefix
        vis = (j <= i + sk - sq) | (j < p)  # bottom-right causal, or a key of the prefix
        for h in range(4):
            head = Head(q[b, :, h], k[b, :, h // 2], v[b, :, h // 2], 0.25, vis)
            assert_f32_close(out[b, :, h], head.out)
            assert_f32_close(lse[b, h], head.lse)


def test_prefix_lm_errors_name_the_argument():
    q = np.zeros((2, 40, 2, 8), np.float32)
    with pytest.raises(tileattn.Error, match=r"options.prefix_len = -1, expected >= 0"):
        tileattn.block_sparse_forward(q, q, q, prefix_len=-1, causal=True, backend="cpu_flash")
    with pytest.raises(tileattn.Error, match=r"prefix-LM \(options.prefix_len = 4\) needs a mask beyond the prefix"):
        tileattn.block_sparse_forward(q, q, q, prefix_len=4, backend="cpu_flash")
    with pytest.raises(tileattn.Error, match=r"prefix_lens\[1\] = -3 is negative"):
        tileattn.block_sparse_forward(q, q, q, prefix_len=np.array([2, -3], np.int32), causal=True, backend="cpu_flash")
    with pytest.raises(tileattn.Error, match=r"prefix_lens has shape \[3\], expected \[2\] \(batch\)"):
        tileattn.block_sparse_forward(q, q, q, prefix_len=np.zeros(3, np.int32), causal=True, backend="cpu_flash")
    with pytest.raises(TypeError, match=r"prefix_len = 2.5 is a float"):
        tileattn.block_sparse_forward(q, q, q, prefix_len=2.5, causal=True, backend="cpu_flash")


# ---------------------------------------------------------------------------------------------------
# PyTorch: tileattn.flex_attention against torch.nn.attention.flex_attention on CPU tensors (and on
# CUDA tensors where there is a GPU).

def _flex():
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    return torch, flex


def _masks(flex, torch, kind, sq, sk, window=24, batch=2):
    """(mask_mod, tileattn keyword arguments giving the same element mask)."""
    if kind == "causal":
        return (lambda b, h, qi, ki: qi >= ki), dict(causal=True)
    if kind == "window":
        return (lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= window)), dict(causal=True, window_size=(window, 0))
    if kind == "documents":
        # Packed documents of random lengths, causal within each: partial blocks at the boundaries.
        ids = (torch.rand(batch, sq) < 0.03).to(torch.int32).cumsum(dim=1, dtype=torch.int32)
        return (lambda b, h, qi, ki: (ids[b, qi] == ids[b, ki]) & (qi >= ki)), dict(causal=True, document_ids=ids)
    if kind == "chunked":
        return (lambda b, h, qi, ki: (qi >= ki) & (qi // window == ki // window)), dict(causal=True, chunk_size=window)
    if kind == "prefix":
        return (lambda b, h, qi, ki: (qi >= ki) | (ki < 50)), dict(causal=True, prefix_len=50)
    if kind == "prefix-per-sequence":
        prefix = torch.randint(0, sk + 1, (batch,), dtype=torch.int32)
        return (lambda b, h, qi, ki: (qi >= ki) | (ki < prefix[b])), dict(causal=True, prefix_len=prefix)
    raise ValueError(kind)


def _torch_flex_with_lse(flex, q, k, v, **kw):
    if hasattr(flex, "AuxRequest"):  # return_lse's successor
        out, aux = flex.flex_attention(q, k, v, return_aux=flex.AuxRequest(lse=True), **kw)
        return out, aux.lse
    return flex.flex_attention(q, k, v, return_lse=True, **kw)


def _dense_reference(torch, q, k, v, mask):
    """float64 attention under a dense [B, H, Q, KV] (or broadcastable) bool mask, differentiable; rows
    that see no key give 0. torch's flex_attention has no CPU backward, so gradients come from this."""
    q, k, v = (x.double() for x in (q, k, v))
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~mask, float("-inf"))
    any_key = mask.any(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(any_key, s, torch.zeros_like(s)), dim=-1) * any_key
    return p @ v


@pytest.mark.parametrize("kind", ["causal", "window", "documents", "chunked", "prefix", "prefix-per-sequence"])
@pytest.mark.parametrize("gqa", [False, True])
def test_flex_attention_matches_torch(kind, gqa):
    torch, flex = _flex()
    torch.manual_seed(0)
    batch, hq, sq, d = 2, 4, 192, 32
    hk = 2 if gqa else hq
    q = torch.randn(batch, hq, sq, d, dtype=torch.float32, requires_grad=True)
    k = torch.randn(batch, hk, sq, d, dtype=torch.float32, requires_grad=True)
    v = torch.randn(batch, hk, sq, d, dtype=torch.float32, requires_grad=True)
    mask_mod, kw = _masks(flex, torch, kind, sq, sq, batch=batch)
    per_batch = batch if kind in ("documents", "prefix-per-sequence") else None
    bm = flex.create_block_mask(mask_mod, per_batch, None, sq, sq, device="cpu", BLOCK_SIZE=32)
    with torch.no_grad():
        want, want_lse = _torch_flex_with_lse(flex, q.detach(), k.detach(), v.detach(), block_mask=bm, enable_gqa=gqa)
    got, lse = tileattn.flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa, return_lse=True, **kw)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, want_lse, atol=2e-5, rtol=2e-5)
    ref = _dense_reference(torch, q, k, v, flex.create_mask(mask_mod, per_batch, None, sq, sq, device="cpu"))
    torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=2e-5)
    g = torch.randn_like(got)
    want_grads = torch.autograd.grad(ref, (q, k, v), g.double())
    got_grads = torch.autograd.grad(got, (q, k, v), g)
    for x, y in zip(got_grads, want_grads):
        torch.testing.assert_close(x.double(), y.double(), atol=5e-5, rtol=5e-5)


def _bshd(torch, batch, heads, seq, d, **kw):
    """[batch, heads, seq, d] views of [batch, seq, heads, d] tensors, as a model's projections give them."""
    return torch.randn(batch, seq, heads, d, **kw).transpose(1, 2)


def _reference_lse(torch, q, k, mask):
    k = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q.double() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)


@pytest.mark.parametrize("rule", ["causal", "window", "two-sided", "none"])
@pytest.mark.parametrize("gqa", [False, True])
def test_flex_attention_documents_run_as_sequences(rule, gqa, capsys):
    """Document ids with no block mask, each document one run of positions: the call is the varlen
    call over the documents (the log says so), with the float64 reference's out, lse and gradients.
    Ids whose document comes back after another keep the element test, with the same results."""
    torch, flex = _flex()
    from tileattn import _log
    torch.manual_seed(3)
    batch, hq, sq, d = 3, 4, 150, 32
    hk = 2 if gqa else hq
    q, k, v = (_bshd(torch, batch, h, sq, d, requires_grad=True) for h in (hq, hk, hk))
    ids = (torch.rand(batch, sq) < 0.04).to(torch.int32).cumsum(dim=1, dtype=torch.int32)
    ids[1] = 7  # one document for the whole sequence
    repeated = ids.clone()
    repeated[0, :60], repeated[0, 60:90], repeated[0, 90:] = 5, 6, 5
    kw, i, j = {}, torch.arange(sq)[:, None], torch.arange(sq)[None, :]
    if rule == "causal":
        kw, keep = dict(causal=True), i >= j
    elif rule == "window":
        kw, keep = dict(causal=True, window_size=(20, 0)), (i >= j) & (i - j <= 20)
    elif rule == "two-sided":
        kw, keep = dict(window_size=(15, 10)), (i - j <= 15) & (j - i <= 10)
    else:
        keep = torch.ones(sq, sq, dtype=torch.bool)
    for doc, routed in ((ids, True), (repeated, False)):
        _log.set_enabled(True)
        try:
            got, lse = tileattn.flex_attention(q, k, v, enable_gqa=gqa, return_lse=True, document_ids=doc, **kw)
        finally:
            _log.set_enabled(False)
        err = capsys.readouterr().err
        assert ("packed documents run as a variable-length batch" in err) == routed, err
        mask = ((doc[:, :, None] == doc[:, None, :]) & keep)[:, None]
        ref = _dense_reference(torch, q, k, v, mask)
        torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(lse.double(), _reference_lse(torch, q, k, mask), atol=2e-5, rtol=2e-5)
        g = torch.randn_like(got)
        for x, y in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g.double())):
            torch.testing.assert_close(x.double(), y.double(), atol=5e-5, rtol=5e-5)


def test_document_runs():
    """_documents._runs: the documents' prefix sums over the batch's positions, the longest, each
    position's run; None where a document comes back."""
    torch = pytest.importorskip("torch")
    from tileattn import _documents
    ids = torch.tensor([[3, 3, 1, 1, 1, 8], [0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    cu, longest, first, end = _documents._runs(ids)
    assert cu.tolist() == [0, 2, 5, 6, 12] and cu.dtype == torch.int32 and longest == 6
    assert first.tolist() == [[0, 0, 2, 2, 2, 5], [0] * 6] and end.tolist() == [[2, 2, 5, 5, 5, 6], [6] * 6]
    assert _documents._runs(torch.tensor([[1, 2, 1]], dtype=torch.int32)) is None
    assert _documents._runs(torch.tensor([[1, 2], [1, 1]], dtype=torch.int32)) is not None  # per sequence


def test_documents_from_mask():
    """_documents.from_mask against the mask built back from the documents its rows' diagonal
    neighbours give (a row that does not see the key before it starts a document): found exactly
    where the mask is that, causal or not; masks with an element changed, per-head ones and ones
    with a row that sees nothing are not."""
    torch = pytest.importorskip("torch")
    from tileattn import _documents
    gen = torch.Generator().manual_seed(5)
    for it in range(200):
        b, s = int(torch.randint(1, 3, (1,), generator=gen)), int(torch.randint(1, 40, (1,), generator=gen))
        ids = (torch.rand(b, s, generator=gen) < 0.2).cumsum(-1)
        i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
        mask = ids[:, :, None] == ids[:, None, :]
        if it % 2:
            mask &= i >= j
        if it % 3 == 0:
            x, y = torch.randint(0, s, (2,), generator=gen).tolist()
            mask[0, x, y] = ~mask[0, x, y]
        heads = 2 if it % 7 == 0 else 1
        m = mask[:, None].expand(b, heads, s, s).clone()
        if heads > 1 and it % 2:
            m[0, 1, 0, 0] = ~m[0, 1, 0, 0]
        got = _documents.from_mask(m, b)
        new = torch.ones(b, s, dtype=torch.bool)
        new[:, 1:] = ~mask[:, torch.arange(1, s), torch.arange(s - 1)]
        docs = new.cumsum(-1)
        same = docs[:, :, None] == docs[:, None, :]
        want = None
        if bool((m == m[:, :1]).all()):
            if torch.equal(mask, same & (i >= j)):
                want = True
            elif torch.equal(mask, same):
                want = False
        if want is None:
            assert got is None, (mask, got)
            continue
        assert got is not None and got[0] == want, (mask, got)
        starts = torch.nonzero(new.reshape(-1)).reshape(-1).tolist()
        assert got[1].tolist() == starts + [b * s] and got[2] == max(y - x for x, y in zip(starts, starts[1:] + [b * s]))
    eye = torch.eye(5, dtype=torch.bool)[None, None]
    assert _documents.from_mask(eye, 1)[:1] == (True,)  # five documents of one row
    assert _documents.from_mask(torch.ones(5, 5, dtype=torch.bool).triu()[None, None], 1) is None
    empty = torch.ones(5, 5, dtype=torch.bool).tril()
    empty[2] = False
    assert _documents.from_mask(empty[None, None], 1) is None


def test_flex_attention_bf16_and_random_blocks():
    torch, flex = _flex()
    torch.manual_seed(1)
    sq, sk, d = 200, 330, 64
    q, k, v = (torch.randn(1, 2, n, d) for n in (sq, sk, sk))
    # A random block pattern as a mask_mod over a per-block table.
    table = torch.rand(1, 2, -(-sq // 64), -(-sk // 64)) < 0.4
    mask_mod = lambda b, h, qi, ki: table[b, h, qi // 64, ki // 64]  # noqa: E731
    bm = flex.create_block_mask(mask_mod, 1, 2, sq, sk, device="cpu", BLOCK_SIZE=64)
    want = flex.flex_attention(q, k, v, block_mask=bm)
    got = tileattn.flex_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), block_mask=bm)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


def test_flex_attention_compiles():
    torch, flex = _flex()
    sq, d = 128, 32
    q, k, v = (torch.randn(1, 2, sq, d, requires_grad=True) for _ in range(3))
    bm = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, sq, sq, device="cpu", BLOCK_SIZE=32)

    def f(q, k, v):
        return tileattn.flex_attention(q, k, v, block_mask=bm, causal=True).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), f(q, k, v))
    torch.testing.assert_close(torch.autograd.grad(compiled(q, k, v), q)[0], torch.autograd.grad(f(q, k, v), q)[0])


@pytest.mark.parametrize("broadcast", ["full", "per-batch", "shared"])
@pytest.mark.parametrize("gqa", [False, True])
def test_flex_attention_dense_mask_matches_reference(broadcast, gqa):
    """mask= a bool tensor (no block_mask: the lists come from the mask): out, lse and gradients
    against the float64 reference under the same mask; rows that see nothing give 0 and lse -inf."""
    torch, _ = _flex()
    torch.manual_seed(3)
    batch, hq, sq, sk, d = 2, 4, 150, 290, 32
    hk = 2 if gqa else hq
    q = torch.randn(batch, hq, sq, d, requires_grad=True)
    k, v = (torch.randn(batch, hk, sk, d, requires_grad=True) for _ in range(2))
    shape = {"full": (batch, hq, sq, sk), "per-batch": (batch, 1, sq, sk), "shared": (sq, sk)}[broadcast]
    mask = torch.rand(shape) < 0.3
    mask[..., :128, :128] = True  # a whole block visible: full
    mask[..., 128:, 256:] = False  # a whole block hidden: skipped
    mask[..., 5, :] = False  # a row that sees no key
    got, lse = tileattn.flex_attention(q, k, v, mask=mask, enable_gqa=gqa, return_lse=True)
    ref = _dense_reference(torch, q, k, v, mask.expand(batch, hq, sq, sk))
    torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=2e-5)
    assert bool((got[:, :, 5] == 0).all()) and bool((lse[:, :, 5] == float("-inf")).all())
    g = torch.randn_like(got)
    for x, y in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g.double())):
        torch.testing.assert_close(x.double(), y.double(), atol=5e-5, rtol=5e-5)


def test_flex_attention_mask_mod_evaluated_densely():
    """A mask_mod no built-in rule says (a per-head stride pattern), given as mask="mask_mod": the
    BlockMask's lists with its mask_mod evaluated densely, against torch's flex_attention."""
    torch, flex = _flex()
    torch.manual_seed(4)
    sq, sk, d = 200, 170, 32
    q, k, v = (torch.randn(2, 2, n, d, requires_grad=True) for n in (sq, sk, sk))

    def mask_mod(b, h, qi, ki):
        return ((qi - ki) % (3 + h) != 0) & (ki <= qi + 40 * b)
    bm = flex.create_block_mask(mask_mod, 2, 2, sq, sk, device="cpu", BLOCK_SIZE=32)
    want = flex.flex_attention(q.detach(), k.detach(), v.detach(), block_mask=bm)
    got = tileattn.flex_attention(q, k, v, block_mask=bm, mask="mask_mod")
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    ref = _dense_reference(torch, q, k, v, flex.create_mask(mask_mod, 2, 2, sq, sk, device="cpu"))
    g = torch.randn_like(got)
    for x, y in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g.double())):
        torch.testing.assert_close(x.double(), y.double(), atol=5e-5, rtol=5e-5)


def test_flex_attention_dense_mask_compiles_and_errors():
    torch, flex = _flex()
    sq, d = 96, 16
    q, k, v = (torch.randn(1, 2, sq, d, requires_grad=True) for _ in range(3))
    mask = torch.rand(sq, sq) < 0.5

    def f(q, k, v):
        return tileattn.flex_attention(q, k, v, mask=mask).sum()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), f(q, k, v))
    torch.testing.assert_close(torch.autograd.grad(compiled(q, k, v), q)[0], torch.autograd.grad(f(q, k, v), q)[0])
    with pytest.raises(TypeError, match="mask must be a torch.Tensor of dtype bool"):
        tileattn.flex_attention(q, k, v, mask=mask.float())
    with pytest.raises(tileattn.Error, match=r"mask has shape \(3, 96\), which does not broadcast"):
        tileattn.flex_attention(q, k, v, mask=mask[:3])
    with pytest.raises(ValueError, match="the string form is \"mask_mod\""):
        tileattn.flex_attention(q, k, v, mask="mask_mod")


@pytest.mark.parametrize("kw,error,match", [
    (dict(block_mask="causal"), TypeError, r"block_mask is a builtins.str; expected a torch.nn.attention"),
    (dict(window_size=(1, 2, 3)), TypeError, r"window_size = \(1, 2, 3\), expected a pair"),
    (dict(window_size=(2**31, 0)), tileattn.Error, r"window_size\[0\] = 2147483648 is outside"),
    (dict(chunk_size=2.5), TypeError, r"chunk_size = 2.5 is a float"),
    (dict(scale="x"), TypeError, r"scale = 'x' is a str, expected a number"),
    (dict(softcap="x"), TypeError, r"softcap = 'x' is a str, expected a number"),
    (dict(document_ids=(None,) * 3), TypeError, r"document_ids is a tuple of 3"),
    (dict(document_ids=([0] * 32, [0] * 32)), TypeError, r"document_ids holds a list, expected an int32 torch.Tensor"),
])
def test_flex_attention_arguments_name_themselves(kw, error, match):
    torch, _ = _flex()
    q = torch.randn(1, 2, 32, 16)
    with pytest.raises(error, match=f"tileattn.flex_attention: {match}"):
        tileattn.flex_attention(q, q, q, **kw)


def test_flex_attention_takes_torchs_signature():
    """torch's flex_attention call forms: (query, key, value, score_mod, block_mask, scale, enable_gqa,
    return_lse, kernel_options) positionally, return_aux=AuxRequest(lse=True); a Python score_mod, or a
    BlockMask where score_mod goes, is refused with an error that says what to pass."""
    torch, flex = _flex()
    if not hasattr(flex, "AuxRequest"):
        pytest.skip("this PyTorch has no AuxRequest")
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 96, 16) for _ in range(3))
    bm = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 96, 96, device="cpu", BLOCK_SIZE=32)
    want, want_lse = tileattn.flex_attention(q, k, v, block_mask=bm, scale=0.3, return_lse=True, causal=True)
    got, lse = tileattn.flex_attention(q, k, v, None, bm, 0.3, False, True, {"BLOCK_M": 64}, causal=True)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=0, rtol=0)
    got, aux = tileattn.flex_attention(q, k, v, block_mask=bm, scale=0.3, causal=True,
                                       return_aux=flex.AuxRequest(lse=True))
    assert isinstance(aux, flex.AuxOutput) and aux.max_scores is None
    torch.testing.assert_close(aux.lse, want_lse, atol=0, rtol=0)
    _, aux = tileattn.flex_attention(q, k, v, return_aux=flex.AuxRequest())
    assert aux.lse is None
    for kw, error, match in [
            (dict(score_mod=lambda s, b, h, i, j: s), TypeError, "score_mod = .*; tileattn's kernels run no Python score_mod"),
            (dict(score_mod=bm), TypeError, "score_mod is a BlockMask; the fourth argument is score_mod"),
            (dict(return_aux=flex.AuxRequest(lse=True), return_lse=True), ValueError, "return_lse and return_aux"),
            (dict(return_aux=flex.AuxRequest(max_scores=True)), ValueError, "return_aux asks for max_scores"),
            (dict(return_aux=True), TypeError, "return_aux is a bool, expected a")]:
        with pytest.raises(error, match=f"tileattn.flex_attention: {match}"):
            tileattn.flex_attention(q, k, v, **kw)


@pytest.mark.parametrize("size,error,match", [
    ((32.0, 32), TypeError, r"block_mask.BLOCK_SIZE\[0\] = 32.0 is a float, expected an int"),
    ((32, 2**40), tileattn.Error, r"block_mask.BLOCK_SIZE\[1\] = 1099511627776 is outside"),
    ((32, 32, 32), TypeError, r"block_mask.BLOCK_SIZE = \(32, 32, 32\), expected an int or a pair"),
])
def test_flex_attention_block_size_names_itself(size, error, match):
    """A BlockMask's BLOCK_SIZE is checked as block_size is: no float truncated, no overflow."""
    torch, flex = _flex()
    q = torch.randn(1, 2, 64, 16)
    bm = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 64, 64, device="cpu", BLOCK_SIZE=32)
    bm.BLOCK_SIZE = size
    with pytest.raises(error, match=f"tileattn.flex_attention: {match}"):
        tileattn.flex_attention(q, q, q, block_mask=bm)


@pytest.mark.parametrize("kind", ["causal", "window", "documents", "chunked", "dense-mask"])
def test_flex_attention_on_cuda_matches_reference(kind):
    """CUDA tensors in bf16: out and gradients against the float64 reference with the same mask
    materialized, each error at most 2x (plus a floor) that of torch's flex_attention in bf16, the
    same-precision baseline."""
    torch, flex = _flex()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(2)
    batch, hq, hk, sq, d = 2, 4, 2, 640, 64
    q = torch.randn(batch, hq, sq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(batch, hk, sq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    if kind == "dense-mask":  # random bits under causal: the mask_mod evaluated densely, read in partial blocks
        table = torch.rand(batch, 1, sq, sq, device="cuda") < 0.7
        mask_mod, kw = (lambda b, h, qi, ki: table[b, 0, qi, ki] & (qi >= ki)), dict(causal=True, mask="mask_mod")
    else:
        mask_mod, kw = _masks(flex, torch, kind, sq, sq, window=200, batch=batch)
    if "document_ids" in kw:
        kw["document_ids"] = kw["document_ids"].cuda()
        ids = kw["document_ids"]
        mask_mod = lambda b, h, qi, ki: (ids[b, qi] == ids[b, ki]) & (qi >= ki)  # noqa: E731
    per_batch = batch if kind in ("documents", "dense-mask") else None
    bm = flex.create_block_mask(mask_mod, per_batch, None, sq, sq, device="cuda", BLOCK_SIZE=128)
    # Half the kinds skip the host copy of the mask (check_device_indices=False): the same results.
    got = tileattn.flex_attention(q, k, v, block_mask=bm, enable_gqa=True,
                                  check_device_indices=kind in ("causal", "chunked"), **kw)
    base = flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    ref = _dense_reference(torch, q, k, v, flex.create_mask(mask_mod, per_batch, None, sq, sq, device="cuda"))
    g = torch.randn_like(got)
    grads = [torch.autograd.grad(y, (q, k, v), g.to(y.dtype)) for y in (got, base, ref)]

    def err(x, y):
        return (x.double() - y.double()).abs().max().item()

    for name, x, b, r in [("out", got, base, ref)] + [(n, *t) for n, t in zip(("dq", "dk", "dv"), zip(*grads))]:
        floor = 2 ** -8 * r.abs().max().item()
        assert err(x, r) <= 2 * err(b, r) + floor, f"{kind} {name}: {err(x, r)} against the baseline's {err(b, r)}"


def test_checked_masks_follow_identity_version_and_sizes():
    """A checked block mask is remembered by its tensors and versions and the sizes checked against:
    a write in place, other sizes or other tensors make it unchecked again."""
    torch = pytest.importorskip("torch")
    from tileattn import _checked_masks
    num, idx = torch.ones(1, 1, 2, dtype=torch.int32), torch.zeros(1, 1, 2, 2, dtype=torch.int32)
    lists, sizes = (num, idx, None, None), (64, 64, 32, 32)
    assert not _checked_masks.seen(lists, sizes)
    _checked_masks.remember(lists, sizes)
    assert _checked_masks.seen(lists, sizes)
    assert not _checked_masks.seen(lists, (64, 96, 32, 32))
    assert not _checked_masks.seen((num, idx.clone(), None, None), sizes)
    assert not _checked_masks.seen((num, idx, num, idx), sizes)
    idx[0, 0, 1, 0] = 1
    assert not _checked_masks.seen(lists, sizes)
    with torch.inference_mode():  # no version counters: never remembered, checked at every use
        frozen = (num.clone(), idx.clone(), None, None)
    _checked_masks.remember(frozen, sizes)
    assert not _checked_masks.seen(frozen, sizes)
    _checked_masks.remember(lists, sizes)
    assert not _checked_masks.seen(lists[:4] + (frozen[0],), sizes)  # document ids made under inference_mode


def test_implied_masks_agree_with_the_elements():
    """_implied_masks.implied against the rule materialized: a mask adds nothing to a causal / window
    rule exactly where each skipped block holds no visible element and each full block no invisible
    one. Masks drawn as the rule's own blocks (implied), then with cells changed at random."""
    torch = pytest.importorskip("torch")
    from tileattn import _implied_masks
    rng = np.random.default_rng()
    for it in range(300):
        sq, sk = int(rng.integers(1, 90)), int(rng.integers(1, 90))
        bq, bk = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16, 32]))
        causal, top_left = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
        left = -1 if rng.integers(0, 2) else int(rng.integers(0, 40))
        right = -1 if causal or rng.integers(0, 2) else int(rng.integers(0, 40))
        off = 0 if top_left else sk - sq
        i, j = np.arange(sq)[:, None] + off, np.arange(sk)[None, :]
        vis = (j >= i - left if left >= 0 else True) & (j <= i + (0 if causal else right) if causal or right >= 0 else True)
        vis = np.broadcast_to(vis, (sq, sk))
        qb, kb = -(-sq // bq), -(-sk // bk)
        cells = np.zeros((qb, kb, 2), dtype=bool)  # (any visible, all visible)
        for r, c in np.ndindex(qb, kb):
            blk = vis[r * bq:(r + 1) * bq, c * bk:(c + 1) * bk]
            cells[r, c] = blk.any(), blk.all()
        state = np.where(cells[..., 1], 2, np.where(cells[..., 0], 1, 0))
        if it % 3:
            flip = rng.random((qb, kb)) < 0.2
            state = np.where(flip, rng.integers(0, 3, (qb, kb)), state)
        want = not (((state == 0) & cells[..., 0]) | ((state == 2) & ~cells[..., 1])).any()
        lists = []
        for value in (1, 2):
            num = torch.tensor((state == value).sum(-1), dtype=torch.int32)[None, None]
            idx = torch.zeros(1, 1, qb, kb, dtype=torch.int32)
            for r in range(qb):
                listed = np.flatnonzero(state[r] == value)
                idx[0, 0, r, :len(listed)] = torch.tensor(listed, dtype=torch.int32)
            lists += [num, idx]
        got = _implied_masks.implied(lists, sq, sk, bq, bk, causal, top_left, left, -1 if causal else right)
        assert got == want, (sq, sk, bq, bk, causal, top_left, left, right, state)


def test_implied_masks_with_documents_agree_with_the_elements():
    """As above, with packed documents: a mask adds nothing to the rule within each document exactly
    where each skipped block holds no visible element and each full block no invisible one."""
    torch = pytest.importorskip("torch")
    from tileattn import _documents, _implied_masks
    rng = np.random.default_rng()
    for it in range(300):
        batch, s = int(rng.integers(1, 4)), int(rng.integers(1, 90))
        bq, bk = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16, 32]))
        causal = bool(rng.integers(0, 2))
        left = -1 if rng.integers(0, 2) else int(rng.integers(0, 40))
        right = -1 if causal or rng.integers(0, 2) else int(rng.integers(0, 40))
        ids = np.cumsum(rng.random((batch, s)) < rng.choice([0.02, 0.1, 0.3]), axis=1).astype(np.int32)
        i, j = np.arange(s)[:, None], np.arange(s)[None, :]
        rule = (j >= i - left if left >= 0 else True) & (j <= i + (0 if causal else right) if causal or right >= 0 else True)
        vis = rule & (ids[:, :, None] == ids[:, None, :])
        qb, kb = -(-s // bq), -(-s // bk)
        state = np.zeros((batch, 1, qb, kb), dtype=np.int64)
        want = True
        for b in range(batch):
            for r, c in np.ndindex(qb, kb):
                blk = vis[b, r * bq:(r + 1) * bq, c * bk:(c + 1) * bk]
                state[b, 0, r, c] = 2 if blk.all() else 1 if blk.any() else 0
            if it % 3:
                flip = rng.random((qb, kb)) < 0.2
                state[b, 0] = np.where(flip, rng.integers(0, 3, (qb, kb)), state[b, 0])
            for r, c in np.ndindex(qb, kb):
                blk = vis[b, r * bq:(r + 1) * bq, c * bk:(c + 1) * bk]
                want &= not ((state[b, 0, r, c] == 0 and blk.any()) or (state[b, 0, r, c] == 2 and not blk.all()))
        lists = []
        for value in (1, 2):
            num = torch.tensor((state == value).sum(-1), dtype=torch.int32)
            idx = torch.zeros(batch, 1, qb, kb, dtype=torch.int32)
            for b, r in np.ndindex(batch, qb):
                listed = np.flatnonzero(state[b, 0, r] == value)
                idx[b, 0, r, :len(listed)] = torch.tensor(listed, dtype=torch.int32)
            lists += [num, idx]
        documents = _documents._runs(torch.tensor(ids))[2:]
        got = _implied_masks.implied(lists, s, s, bq, bk, causal, True, left, -1 if causal else right, documents)
        assert got == want, (batch, s, bq, bk, causal, left, right, ids, state)


def test_flex_attention_eager_path_matches_the_op():
    """The eager call (no op dispatcher) and the tileattn::flex_fwd op that torch.compile sees give
    the same output, LSE and gradients."""
    torch, flex = _flex()
    from tileattn import _torch_ops
    torch.manual_seed(2)
    sq, d = 96, 16
    q, k, v = (torch.randn(2, 2, sq, d, requires_grad=True) for _ in range(3))
    bm = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, sq, sq, device="cpu", BLOCK_SIZE=32)
    got, lse = tileattn.flex_attention(q, k, v, block_mask=bm, causal=True, return_lse=True)
    qs, ks, vs = (x.transpose(1, 2) for x in (q, k, v))
    want, want_lse = _torch_ops.flex_fwd(qs, ks, vs, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                                         bm.full_kv_indices, None, None, None, None, 32, 32, None, None, True, True, -1,
                                         -1, 0, 0, 0.0, "auto", True)
    torch.testing.assert_close(got, want.transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=0, rtol=0)
    g = torch.randn_like(got)
    for x, y in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want.transpose(1, 2), (q, k, v), g)):
        torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_flex_attention_cuda_mask_is_checked_once_and_again_when_written():
    """A GPU block mask is copied back and checked at its first use only; bad entries raise an error
    naming the list, and a mask written in place is checked again."""
    torch, flex = _flex()
    from tileattn import _checked_masks
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    sq, d = 256, 64
    q, k, v = (torch.randn(1, 2, sq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bm = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, sq, sq, device="cuda", BLOCK_SIZE=128)
    lists = (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, None)  # no document ids
    first = tileattn.flex_attention(q, k, v, block_mask=bm, causal=True)
    assert _checked_masks.seen(lists, (sq, sq, 128, 128, True, True, -1, -1))
    # Causal as blocks adds nothing to causal: later calls are the dense kernel's causal call (its
    # tiles may differ from the block-sparse kernel's, so the first call agrees up to rounding).
    assert _checked_masks.implied(lists)
    second = tileattn.flex_attention(q, k, v, block_mask=bm, causal=True)
    torch.testing.assert_close(second, tileattn.flex_attention(q, k, v, causal=True), atol=0, rtol=0)
    torch.testing.assert_close(second, first)
    bm.kv_indices[0, 0, 0, 0] = 1000
    with pytest.raises(tileattn.Error, match=r"block_mask.kv_indices\[0, 0, 0, 0\] = 1000 is outside"):
        tileattn.flex_attention(q, k, v, block_mask=bm, causal=True)
    with pytest.raises(tileattn.Error, match=r"block_mask.kv_indices"):
        tileattn.flex_attention(q, k, v, block_mask=bm, causal=True)  # not remembered after the failure


def _cuda_documents(torch, flex, seed, batch, heads, sq, d):
    """bf16 q, k, v on the GPU ([batch, seq, heads, d] memory), packed documents' ids and the
    BlockMask of causal attention within them."""
    torch.manual_seed(seed)
    q, k, v = (_bshd(torch, batch, heads, sq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ids = (torch.rand(batch, sq, device="cuda") < 0.01).to(torch.int32).cumsum(dim=1, dtype=torch.int32)
    bm = flex.create_block_mask(lambda b, h, qi, ki: (ids[b, qi] == ids[b, ki]) & (qi >= ki), batch, None, sq, sq,
                                device="cuda", BLOCK_SIZE=128)
    return q, k, v, ids, bm


def test_flex_attention_cuda_document_mask_runs_as_sequences_once_checked(capsys):
    """A GPU block mask made for packed documents, used with their ids: its first use checks it (the
    block-sparse call); found to add nothing to causal within the documents, later calls are the
    varlen call over the documents. New ids, or the mask written, are checked again."""
    torch, flex = _flex()
    from tileattn import _checked_masks, _documents, _log
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    batch, heads, sq, d = 2, 4, 700, 64
    q, k, v, ids, bm = _cuda_documents(torch, flex, 4, batch, heads, sq, d)
    lists = (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, ids)
    sizes = (sq, sq, 128, 128, True, True, -1, -1)
    _log.set_enabled(True)
    try:
        first = tileattn.flex_attention(q, k, v, block_mask=bm, causal=True, document_ids=ids)
        assert _checked_masks.seen(lists, sizes) and _checked_masks.implied(lists)
        assert "variable-length batch" not in capsys.readouterr().err
        second = tileattn.flex_attention(q, k, v, block_mask=bm, causal=True, document_ids=ids)
        assert "packed documents run as a variable-length batch" in capsys.readouterr().err
        other = ids.clone()
        tileattn.flex_attention(q, k, v, block_mask=bm, causal=True, document_ids=other)
        assert "variable-length batch" not in capsys.readouterr().err
    finally:
        _log.set_enabled(False)
    cu, longest = _documents._runs(ids)[:2]
    flat = lambda x: x.transpose(1, 2).reshape(batch * sq, heads, d)  # noqa: E731
    want = tileattn.flash_attn_varlen_func(flat(q), flat(k), flat(v), cu, cu, longest, longest, causal=True)
    torch.testing.assert_close(second, want.view(batch, sq, heads, d).transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(second, first, atol=2 ** -7, rtol=2 ** -7)  # other kernels: bf16 rounding apart


def test_flex_attention_cuda_mask_under_inference_mode():
    """A GPU block mask and document ids made under torch.inference_mode have no version counters:
    every call checks them (none is remembered) and gives what a call outside it gives."""
    torch, flex = _flex()
    from tileattn import _checked_masks
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    sq = 384
    q, k, v, ids, bm = _cuda_documents(torch, flex, 7, 2, 2, sq, 64)
    want = tileattn.flex_attention(q, k, v, causal=True, document_ids=ids)
    with torch.inference_mode():
        frozen = ids.clone()
        lists = tuple(t.clone() for t in (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices))
        frozen_mask = flex.BlockMask.from_kv_blocks(*lists, BLOCK_SIZE=128)
        for _ in range(2):
            got = tileattn.flex_attention(q, k, v, block_mask=frozen_mask, causal=True, document_ids=frozen)
            torch.testing.assert_close(got, want, atol=2 ** -7, rtol=2 ** -7)
            used = (frozen_mask.kv_num_blocks, frozen_mask.kv_indices, frozen_mask.full_kv_num_blocks,
                    frozen_mask.full_kv_indices, frozen)
            assert not _checked_masks.seen(used, (sq, sq, 128, 128, True, True, -1, -1))
