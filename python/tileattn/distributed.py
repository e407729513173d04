"""Context parallelism: exact attention over a sequence sharded across the ranks of a torch.distributed
group (NCCL on GPUs, gloo on CPU tensors). PyTorch tensors only, with autograd.

- ring_attention: each rank holds [batch, local_seqlen, heads, head_dim] shards of q, k and v. The K/V
  shards travel around the ring (batched isend/irecv, which NCCL runs on its own stream) while each rank
  attends its queries to the block it holds; the partial outputs merge by their log-sum-exp with the
  library's combine. The backward recomputes each block from the global output and LSE; dK/dV travel
  the ring with their blocks (in fp32) and dQ stays local.
- all_gather_attention: K and V are all-gathered and each rank attends its queries to the whole
  sequence; it also takes packed documents (varlen: cu_seqlens over the whole packed sequence).
  Its backward reduce-scatters dK/dV.
- shard / unshard: a sequence to one rank's shard and the ranks' shards back to the sequence.

Every rank must make the same call on its own shard: each attention checks that (_Agreement) before its
first transfer, so that a call one rank makes differently raises on every rank.

Layouts: "contiguous" (rank r holds tokens [r L, (r + 1) L)) or "zigzag" (the sequence cut into 2P
chunks, rank r holds chunks r and 2P - 1 - r, so every rank gets the same share of causal work).

Masks, windows and ALiBi are those of the whole sequence (for varlen, of each document). Each (query
chunk, key chunk) pair becomes at most one library call on the bounding box of its visible pairs,
whose bottom-right window is then the global one shifted by the chunks' offset; pairs that are all
visible merge into one call per ring step (without ALiBi: merged pairs would need several
diagonals). Each call measures ALiBi from the global diagonal (Options.alibi_diagonal: the box's
first query position minus its first key position).
"""

import collections

import torch
import torch.distributed as dist

from . import _checks, _config, _functional
from ._arrays import contiguous_last
from ._torch_ops import first_order

LAYOUTS = ("contiguous", "zigzag")

# A piece of the global sequence held at [local, local + n) of a tensor: global positions [pos, pos + n).
_Chunk = collections.namedtuple("_Chunk", "local pos n")
# One library call: query rows [q0, q1) against keys [k0, k1) with a bottom-right window (-1 =
# unbounded); alibi_diagonal: the box's first query position minus its first key position, from
# which ALiBi measures the call's distances (None on merged calls, which have several).
_Call = collections.namedtuple("_Call", "q0 q1 k0 k1 window_left window_right alibi_diagonal")

# P2P tags: gloo matches messages by tag, NCCL by order.
_TAG_KV, _TAG_DKV = 0, 2


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"tileattn.distributed: layout = {layout!r}, expected one of {LAYOUTS}")


def _pieces(layout, world, n, dim_name="the sequence"):
    _check_layout(layout)
    parts = world if layout == "contiguous" else 2 * world
    if n % parts:
        raise ValueError(f"tileattn.distributed: {dim_name} has {n} tokens, which the {layout} layout over "
                         f"{world} ranks cannot split into {parts} equal chunks")
    return parts


def _dim(fn, x, dim, name="x"):
    dim = _checks.integer(f"distributed.{fn}", "dim", dim)
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"tileattn.distributed.{fn}: dim = {dim} is outside {name}'s {x.ndim} dimensions")
    return dim % x.ndim


def shard(x, rank, world_size, *, layout="contiguous", dim=1):
    """Rank's shard of the whole sequence x along dim: a contiguous slice, or for "zigzag" chunks rank
    and 2 * world_size - 1 - rank of 2 * world_size, concatenated."""
    rank = _checks.integer("distributed.shard", "rank", rank)
    world_size = _checks.integer("distributed.shard", "world_size", world_size)
    dim = _dim("shard", x, dim)
    if not 0 <= rank < world_size:
        raise ValueError(f"tileattn.distributed.shard: rank = {rank}, expected 0 <= rank < world_size = {world_size}")
    parts = _pieces(layout, world_size, x.shape[dim], f"x.shape[{dim}]")
    chunks = x.chunk(parts, dim)
    if layout == "contiguous":
        return chunks[rank]
    return torch.cat([chunks[rank], chunks[parts - 1 - rank]], dim)


def unshard(shards, *, layout="contiguous", dim=1):
    """The whole sequence from every rank's shard (a list in rank order): shard's inverse."""
    _check_layout(layout)
    shards = list(shards)
    if not shards:
        raise ValueError("tileattn.distributed.unshard: shards is empty, expected every rank's shard")
    dim = _dim("unshard", shards[0], dim, "shards[0]")
    for r, s in enumerate(shards):
        if tuple(s.shape) != tuple(shards[0].shape):
            raise ValueError(f"tileattn.distributed.unshard: shards[{r}] has shape {tuple(s.shape)} and shards[0] "
                             f"{tuple(shards[0].shape)}; every rank's shard has the same shape")
    if layout == "contiguous":
        return torch.cat(shards, dim)
    for r, s in enumerate(shards):
        if s.shape[dim] % 2:
            raise ValueError(f"tileattn.distributed.unshard: shards[{r}].shape[{dim}] = {s.shape[dim]} is odd; a "
                             "zigzag shard holds two equal chunks")
    halves = [s.chunk(2, dim) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in reversed(halves)], dim)


def _chunks(layout, rank, world, n):
    """The chunks of the global sequence that rank's n local tokens hold, in local order."""
    if layout == "contiguous" or world == 1:
        return [_Chunk(0, rank * n, n)]
    c = n // 2
    return [_Chunk(0, rank * c, c), _Chunk(c, (2 * world - 1 - rank) * c, c)]


def _band(fn, causal, window_size):
    """The global mask as lo <= key position - query position <= hi (None: unbounded)."""
    left, right = _checks.window(f"distributed.{fn}", window_size, causal)
    lo = None if left < 0 else -left
    hi = 0 if causal else (None if right < 0 else right)
    return lo, hi


def _block(qc, kc, lo, hi):
    """The call for query chunk qc against key chunk kc under the band, or None when no query sees a key.

    In chunk coordinates row i sees keys j with a <= j - i <= b. The call covers the bounding box
    [i0, i1) x [j0, j1) of the visible pairs, whose bottom-right window (the diagonal at
    j - i = nk - nq) is then never negative: window_left = j1 - i1 - a, window_right = b - j1 + i1."""
    delta = qc.pos - kc.pos
    a = None if lo is None else lo + delta
    b = None if hi is None else hi + delta
    i0 = 0 if b is None else max(0, -b)
    i1 = qc.n if a is None else min(qc.n, kc.n - a)
    if i0 >= i1:
        return None
    j0 = 0 if a is None else max(0, i0 + a)
    j1 = kc.n if b is None else min(kc.n, i1 + b)
    if j0 >= j1:
        return None
    wl = -1 if a is None else j1 - i1 - a
    wr = -1 if b is None else b - j1 + i1
    return _Call(qc.local + i0, qc.local + i1, kc.local + j0, kc.local + j1, wl, wr,
                 qc.pos + i0 - (kc.pos + j0))


def _full(c):
    """Every pair of the call's box is visible (its windows reach every corner)."""
    nq, nk = c.q1 - c.q0, c.k1 - c.k0
    return (c.window_left < 0 or c.window_left >= nk - 1) and (c.window_right < 0 or c.window_right >= nq - 1)


def _unbounded(c):
    """c with -1 for a window side that reaches every key of its box, which spares the kernels the
    side's element mask (the core only folds windows reaching past the longer length)."""
    nq, nk = c.q1 - c.q0, c.k1 - c.k0
    return c._replace(window_left=-1 if c.window_left >= nk - 1 else c.window_left,
                      window_right=-1 if c.window_right >= nq - 1 else c.window_right)


def _tiles(ranges):
    """The ranges sorted, if they tile one interval without overlap; else None."""
    ranges = sorted(set(ranges))
    if all(x[1] == y[0] for x, y in zip(ranges, ranges[1:])):
        return ranges
    return None


def _fuse(calls, q_chunks, k_chunks, lo, hi):
    """Calls that one call can replace: all pairs visible over a rectangle of chunks, or the causal
    diagonal over chunks whose local order is their global order."""
    if len(calls) < 2:
        return calls
    if all(_full(c) for c in calls):
        qs = _tiles((c.q0, c.q1) for c in calls)
        ks = _tiles((c.k0, c.k1) for c in calls)
        if qs and ks and len(qs) * len(ks) == len(calls):
            return [_Call(qs[0][0], qs[-1][1], ks[0][0], ks[-1][1], -1, -1, None)]
    if q_chunks == k_chunks and lo is None and hi == 0 and _tiles((c.local, c.local + c.n) for c in q_chunks):
        # j <= i in local order is key position <= query position: the chunks are in global order.
        if all(x.pos < y.pos for x, y in zip(q_chunks, q_chunks[1:])):
            end = q_chunks[-1].local + q_chunks[-1].n
            return [_Call(q_chunks[0].local, end, q_chunks[0].local, end, -1, 0, None)]
    return calls


def _ring_plan(layout, rank, world, n, lo, hi, alibi):
    """Per ring step (step s holds rank (rank - s) % world's block), the calls to make."""
    mine = _chunks(layout, rank, world, n)
    plan = []
    for step in range(world):
        theirs = _chunks(layout, (rank - step) % world, world, n)
        calls = [_unbounded(c) for qc in mine for kc in theirs if (c := _block(qc, kc, lo, hi)) is not None]
        plan.append(calls if alibi else _fuse(calls, mine, theirs, lo, hi))
    return plan


def _diagonal(c, opts):
    """The call's ALiBi diagonal where the call has ALiBi: none of the kernels' own choosing."""
    return {"alibi_diagonal": c.alibi_diagonal} if opts.get("alibi_slopes") is not None else {}


class _Ring:
    """The group's ring: P2P to the next rank and from the previous one."""

    def __init__(self, group):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise ValueError(f"tileattn.distributed: this process (global rank {dist.get_rank()}) is not a member "
                             "of the group passed")
        self.world = dist.get_world_size(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world)

    def exchange(self, tensors, tag):
        """Starts sending tensors to the next rank and receiving as many from the previous one."""
        recv = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag + i) for i, t in enumerate(tensors)]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, tag + i) for i, t in enumerate(recv)]
        return _Pending(dist.batch_isend_irecv(ops), tensors, recv)


class _Agreement:
    """The ranks' arguments checked against each other before the first transfer, so that a call the
    ranks make differently (another local length, head count, dtype, mask or layout on one rank)
    raises on every rank rather than aborting in the transport, hanging, or returning a wrong result
    on some. `with _Agreement(ring, fn, q) as a:` around the local checks, which end with
    a.fields(name=value, ...): one all_gather of every rank's values on q's device (a count of 0
    where the rank's local checks raised; that rank raises its own error) and a host read of them."""

    _SLOTS = 64  # values a call sends at most: the count, then the fields' values

    def __init__(self, ring, fn, like):
        self.ring, self.fn, self.like, self.named = ring, fn, like, None

    def __enter__(self):
        return self

    def fields(self, **named):
        self.named = {k: tuple(v) if isinstance(v, (tuple, list, torch.Size)) else (v,) for k, v in named.items()}

    def __exit__(self, kind, error, tb):
        if self.ring.world == 1:
            return False
        values = [] if kind is not None else [float(x) for v in self.named.values() for x in v]
        assert len(values) < self._SLOTS
        mine = torch.full((self._SLOTS,), float("nan"), dtype=torch.float64)
        mine[0] = len(values)
        mine[1:1 + len(values)] = torch.tensor(values, dtype=torch.float64)
        mine = mine.to(self._device())
        every = [torch.empty_like(mine) for _ in range(self.ring.world)]
        dist.all_gather(every, mine, group=self.ring.group)
        every = torch.stack(every).tolist()
        if kind is not None:
            return False  # this rank's own error
        counts = [int(x[0]) for x in every]
        if 0 in counts:
            raise ValueError(f"tileattn.distributed.{self.fn}: the call was refused on rank {counts.index(0)} (see "
                             "its error), so on every rank")
        at = 1
        for name, v in self.named.items():  # a rank that sent fewer values shows NaNs, which differ
            seen = [tuple(x[at:at + len(v)]) for x in every]
            if len(set(seen)) != 1:
                per_rank = ", ".join(f"rank {r}: {_plain(x)}" for r, x in enumerate(seen))
                raise ValueError(f"tileattn.distributed.{self.fn}: the ranks disagree on {name} ({per_rank}); "
                                 "every rank must make the same call on its own shard")
            at += len(v)
        if len(set(counts)) != 1:
            raise ValueError(f"tileattn.distributed.{self.fn}: the ranks' calls differ in form ({counts} values "
                             "per rank); every rank must make the same call on its own shard")
        return False

    def _device(self):
        if dist.get_backend(self.ring.group) != "nccl":
            return torch.device("cpu")
        if isinstance(self.like, torch.Tensor) and self.like.is_cuda:
            return self.like.device
        return torch.device("cuda", torch.cuda.current_device())


def _plain(values):
    """A field's values as the caller wrote them: whole numbers as ints, one value bare."""
    v = tuple(int(x) if float(x).is_integer() else x for x in values)
    return v[0] if len(v) == 1 else v


class _Pending:
    def __init__(self, works, sent, recv):
        self.works, self.sent, self.recv = works, sent, recv  # sent stays referenced until the wait

    def wait(self):
        """The received tensors; on a GPU, the current stream waits for them (the host does not)."""
        for w in self.works:
            w.wait()
        self.sent = None
        return self.recv


class _Partials:
    """One rank's output merged over key blocks by log-sum-exp with the library's combine, in fp32.

    Three fp32 slots: a row range's merged state sits in one, an arriving block is copied into the
    next and the combine writes the third, so no merge copies its state back (per output element a
    merge moves the block in and reads two slots and writes one). The state's slot is kept per row
    range, since a block may cover only some rows (zigzag steps cover all rows or the second chunk)."""

    def __init__(self, q, v, backend):
        b, n, h = q.shape[:3]
        self.shape, self.device, self.backend = (b, n, h, v.shape[-1]), q.device, backend
        self.first = None  # the first whole-rows block, as it came, while it is the only one
        self.slots = self.lses = None
        self.where = []  # [(r0, r1, slot)]: where the state of rows [r0, r1) sits, covering every row

    def _start(self):
        b, n, h, d = self.shape
        self.slots = torch.empty((3, b, n, h, d), dtype=torch.float32, device=self.device)
        self.lses = torch.empty((3, b, h, n), dtype=torch.float32, device=self.device)
        if self.first is None:
            self.slots[0].zero_()
            self.lses[0].fill_(float("-inf"))
        else:
            self.slots[0].copy_(self.first[0])
            self.lses[0].copy_(self.first[1])
            self.first = None
        self.where = [(0, n, 0)]

    def add(self, r0, r1, out, lse):
        if self.slots is None and self.first is None and (r0, r1) == (0, self.shape[1]):
            self.first = (out, lse)
            return
        if self.slots is None:
            self._start()
        where = []
        for a, b, s in self.where:
            p0, p1 = max(a, r0), min(b, r1)
            if p0 >= p1:
                where.append((a, b, s))
                continue
            blk, dst = (s + 1) % 3, (s + 2) % 3
            rows, src = slice(p0, p1), slice(p0 - r0, p1 - r0)
            self.slots[blk, :, rows].copy_(out[:, src])
            self.lses[blk, :, :, rows].copy_(lse[..., src])
            lo, hi = min(s, blk), max(s, blk)
            pair = slice(lo, hi + 1, hi - lo)  # slots s and blk as one strided view
            _, merged = _functional.combine(self.slots[pair, :, rows], self.lses[pair, :, :, rows],
                                            out=self.slots[dst, :, rows], backend=self.backend)
            self.lses[dst, :, :, rows] = merged
            where += [x for x in ((a, p0, s), (p0, p1, dst), (p1, b, s)) if x[0] < x[1]]
        self.where = where

    def result(self, dtype):
        b, n, h, d = self.shape
        if self.first is not None:
            return self.first
        if self.slots is None:  # no query sees any key
            return (torch.zeros(self.shape, dtype=dtype, device=self.device),
                    torch.full((b, h, n), float("-inf"), device=self.device))
        out = torch.empty(self.shape, dtype=dtype, device=self.device)
        lse = torch.empty((b, h, n), dtype=torch.float32, device=self.device)
        for r0, r1, s in self.where:
            out[:, r0:r1].copy_(self.slots[s, :, r0:r1])
            lse[..., r0:r1].copy_(self.lses[s, :, :, r0:r1])
        return out, lse


def _rows(x, c):
    return x[:, c.q0:c.q1]


def _keys(x, c):
    return x[:, c.k0:c.k1]


def _ring_forward(q, k, v, ring, plan, opts):
    acc = _Partials(q, v, opts["backend"])
    kv = (k, v)
    for step, calls in enumerate(plan):
        # The next block is on its way while this one is attended.
        pending = ring.exchange(kv, _TAG_KV) if step + 1 < ring.world else None
        for c in calls:
            out, lse = _functional.forward(_rows(q, c), _keys(kv[0], c), _keys(kv[1], c),
                                           window_left=c.window_left, window_right=c.window_right,
                                           **_diagonal(c, opts), **opts)
            acc.add(c.q0, c.q1, out, lse)
        if pending is not None:
            kv = tuple(pending.wait())
    return acc.result(q.dtype)


def _ring_backward(dout, q, k, v, out, lse, ring, plan, opts):
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv, dkv = (k, v), None
    for step, calls in enumerate(plan):
        pending = ring.exchange(kv, _TAG_KV) if step + 1 < ring.world else None
        grads = []
        for c in calls:
            gq, gk, gv = _functional.backward(
                _rows(dout, c), _rows(q, c), _keys(kv[0], c), _keys(kv[1], c), _rows(out, c), lse[..., c.q0:c.q1],
                window_left=c.window_left, window_right=c.window_right, **_diagonal(c, opts), **opts)
            _rows(dq, c).add_(gq)
            grads.append((c, gk, gv))
        # This block's dK/dV so far come from the previous rank (which held it one step earlier).
        if dkv is None:
            dk, dv = (torch.zeros(x.shape, dtype=torch.float32, device=x.device) for x in kv)
        else:
            dk, dv = dkv.wait()
        for c, gk, gv in grads:
            _keys(dk, c).add_(gk)
            _keys(dv, c).add_(gv)
        # After the last step the block's next rank is its owner.
        dkv = ring.exchange((dk, dv), _TAG_DKV) if ring.world > 1 else _Done((dk, dv))
        if pending is not None:
            kv = tuple(pending.wait())
    dk, dv = dkv.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _Done:
    def __init__(self, tensors):
        self.tensors = tensors

    def wait(self):
        return self.tensors


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, plan, opts):
        out, lse = _ring_forward(q, k, v, ring, plan, opts)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.plan, ctx.opts = ring, plan, opts
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(contiguous_last(dout), q, k, v, out, lse, ctx.ring, ctx.plan, ctx.opts)
        return first_order((dq, dk, dv), dout, q, k, v) + (None, None, None)


def _opts(fn, softmax_scale, softcap, sm_margin):
    """The library options every call of one attention shares (each call adds its window)."""
    fn = f"distributed.{fn}"
    return dict(scale=_checks.scale(fn, softmax_scale), softcap=_checks.number(fn, "softcap", softcap),
                sm_margin=_checks.integer(fn, "sm_margin", sm_margin, lo=0), backend=_config.backend)


def _check_qkv(what, q, k, v, ndim):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"tileattn.distributed.{what}: {name} is a {type(x).__name__}, expected a torch.Tensor")
        if x.ndim != ndim:
            raise ValueError(f"tileattn.distributed.{what}: {name} has shape {tuple(x.shape)}, expected {ndim} "
                             "dimensions")
    lead = 2 if ndim == 4 else 1
    if not (q.shape[:lead] == k.shape[:lead] == v.shape[:lead]):
        raise ValueError(f"tileattn.distributed.{what}: q, k and v must share their leading (batch, local seqlen) "
                         f"dimensions, got shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _call_fields(q, k, v, layout, lo, hi, opts):
    """What every rank's call must agree on (see _Agreement)."""
    slopes = opts.get("alibi_slopes")
    return {"q.shape": q.shape, "k.shape": k.shape, "v.shape": v.shape,
            "dtypes (q, k, v)": [_DTYPES.index(x.dtype) if x.dtype in _DTYPES else -1 for x in (q, k, v)],
            "layout": LAYOUTS.index(layout),
            "mask (lo, hi)": tuple(float("inf") if x is None else x for x in (lo, hi)),
            "softmax_scale": -1.0 if opts["scale"] is None else opts["scale"], "softcap": opts["softcap"],
            "alibi_slopes.shape": (-1,) * 2 if slopes is None else tuple(slopes.shape) + (-1,) * (2 - slopes.ndim)}


def ring_attention(q, k, v, group=None, *, causal=False, layout="contiguous", softmax_scale=None,
                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_lse=False, sm_margin=0):
    """Attention over the sequence whose shards the ranks of group hold.

    q (batch, local_seqlen, nheads, d), k and v (batch, local_seqlen, nheads_k, d): this rank's shard in
    layout "contiguous" or "zigzag" (see shard()); every rank holds the same local_seqlen. causal,
    window_size, softcap and softmax_scale as flash_attn_func over the whole sequence. Returns out like
    q, or (out, softmax_lse (batch, nheads, local_seqlen) fp32) with return_lse. On one rank this is the
    local call. alibi_slopes (nheads,) fp32: ALiBi over the whole sequence's positions. sm_margin:
    SMs the forward's attention kernel leaves free for the ring's transfers (Options::sm_margin)."""
    ring = _Ring(group)
    with _Agreement(ring, "ring_attention", q) as agree:
        _check_qkv("ring_attention", q, k, v, 4)
        _check_layout(layout)
        n = q.shape[1]
        _pieces(layout, ring.world, n * ring.world, "the sequence (local_seqlen * world size)")
        lo, hi = _band("ring_attention", causal, window_size)
        alibi = alibi_slopes is not None
        opts = dict(_opts("ring_attention", softmax_scale, softcap, sm_margin), alibi_slopes=alibi_slopes)
        agree.fields(**_call_fields(q, k, v, layout, lo, hi, opts))
    plan = _ring_plan(layout, ring.rank, ring.world, n, lo, hi, alibi)
    # The ring sends k and v whole: P2P takes contiguous tensors.
    q, k, v = contiguous_last(q), k.contiguous(), v.contiguous()
    out, lse = _RingAttention.apply(q, k, v, ring, plan, opts)
    return (out, lse) if return_lse else out


def _gather(x, ring, layout, dim):
    """The whole sequence from every rank's shard x (an all-gather)."""
    out = torch.empty((ring.world,) + tuple(x.shape), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out.view((-1,) + tuple(x.shape[1:])), x.contiguous(), group=ring.group)
    return unshard(out.unbind(0), layout=layout, dim=dim)


def _scatter_sum(full, ring, layout, dim):
    """Each rank's shard of the sum over ranks of full (a reduce-scatter)."""
    parts = torch.stack([shard(full, r, ring.world, layout=layout, dim=dim) for r in range(ring.world)])
    out = torch.empty(parts.shape[1:], dtype=full.dtype, device=full.device)
    dist.reduce_scatter_tensor(out, parts.view((-1,) + tuple(parts.shape[2:])), group=ring.group)
    return out


def _gather_plan(q_chunks, docs, lo, hi, alibi=False):
    """The calls of queries q_chunks (local rows of the packed tensor) against their documents (global
    [start, end) ranges, keys at their global positions in the gathered sequence), grouped into varlen
    calls: one group holds calls with one window (and with alibi, one ALiBi diagonal) and increasing,
    disjoint key ranges. Returns a list of groups, each a list of (call, document index)."""
    calls = []
    for qc in q_chunks:
        for d, (s, e) in enumerate(docs):
            p0, p1 = max(s, qc.pos), min(e, qc.pos + qc.n)
            if p0 < p1:
                c = _block(_Chunk(qc.local + p0 - qc.pos, p0, p1 - p0), _Chunk(s, s, e - s), lo, hi)
                if c is not None:
                    calls.append((c, d))
    groups = []
    for c, d in sorted(calls, key=lambda cd: cd[0].q0):
        for g in groups:
            last = g[-1][0]
            if (last.window_left, last.window_right) == (c.window_left, c.window_right) and c.k0 >= last.k1 and \
                    (not alibi or last.alibi_diagonal == c.alibi_diagonal):
                g.append((c, d))
                break
        else:
            groups.append([(c, d)])
    return groups


def _covered(ranges, n, device):
    """A bool mask of [0, n) over the union of ranges, or None when they cover all of it."""
    mask = torch.zeros(n, dtype=torch.bool)
    for r0, r1 in ranges:
        mask[r0:r1] = True
    return None if bool(mask.all()) else mask.to(device)


class _Varlen:
    """One group's varlen call: the group's calls as sequences, with filler sequences (rows without
    keys, keys without rows) so that the packed rows and keys run in order over both tensors."""

    def __init__(self, group, n_q, n_k, alibi_slopes, device):
        cu_q, cu_k, docs = [0], [0], []

        def seq(nq, nk, d):
            cu_q.append(cu_q[-1] + nq)
            cu_k.append(cu_k[-1] + nk)
            docs.append(d)

        for c, d in group:
            if c.q0 > cu_q[-1]:
                seq(c.q0 - cu_q[-1], 0, 0)
            if c.k0 > cu_k[-1]:
                seq(0, c.k0 - cu_k[-1], 0)
            seq(c.q1 - c.q0, c.k1 - c.k0, d)
        if n_q > cu_q[-1]:
            seq(n_q - cu_q[-1], 0, 0)
        if n_k > cu_k[-1]:
            seq(0, n_k - cu_k[-1], 0)
        lens = [(y - x, w - z) for x, y, z, w in zip(cu_q, cu_q[1:], cu_k, cu_k[1:])]
        self.args = dict(
            cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=device),
            cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device=device),
            max_seqlen_q=max(x for x, _ in lens), max_seqlen_k=max(y for _, y in lens),
            window_left=group[0][0].window_left, window_right=group[0][0].window_right,
            alibi_slopes=alibi_slopes if alibi_slopes is None or alibi_slopes.ndim == 1 else
            alibi_slopes[torch.tensor(docs, device=alibi_slopes.device)].contiguous())
        if alibi_slopes is not None:
            self.args["alibi_diagonal"] = group[0][0].alibi_diagonal
        # Rows and keys outside the group's calls: their results are dropped rather than trusted.
        self.rows = _covered([(c.q0, c.q1) for c, _ in group], n_q, device)
        self.keys = _covered([(c.k0, c.k1) for c, _ in group], n_k, device)


def _masked(x, mask, dim, fill=0.0):
    if mask is None:
        return x
    shape = [1] * x.ndim
    shape[dim] = -1
    return x.masked_fill(~mask.view(shape), fill)


def _gather_packed(x, ring, layout):
    """The whole packed sequence from the local shards x: [tokens, ...], or [batch, tokens, ...]
    whose batch elements are then packed one after the other."""
    if x.ndim == 3:
        return _gather(x, ring, layout, 0)
    full = _gather(x, ring, layout, 1)
    return full.view((-1,) + tuple(full.shape[2:]))


def _scatter_packed(full, like, ring, layout):
    """_gather_packed's adjoint: each rank's shard, shaped like like, of the sum over ranks of full."""
    if like.ndim == 3:
        return _scatter_sum(full, ring, layout, 0)
    return _scatter_sum(full.view((like.shape[0], -1) + tuple(full.shape[1:])), ring, layout, 1)


def _gather_forward(q, k, v, ring, layout, varlens, opts):
    """q packed [tokens, heads, d], k and v local shards (packed or batched). Returns (out, lse
    [heads, tokens])."""
    kf, vf = _gather_packed(k, ring, layout), _gather_packed(v, ring, layout)
    outs = []
    for g in varlens:
        out, lse = _functional.forward(q, kf, vf, **g.args, **opts)
        outs.append((_masked(out, g.rows, 0), _masked(lse, g.rows, 1, float("-inf"))))
    if not outs:
        return (q.new_zeros(q.shape[:-1] + v.shape[-1:]),
                torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device))
    if len(outs) == 1:
        return outs[0]
    # Each row has its keys in one group: the combine picks it (the others have lse = -inf).
    parts = torch.stack([o.float() for o, _ in outs]).unsqueeze(1)
    lses = torch.stack([l for _, l in outs]).unsqueeze(1)
    out, lse = _functional.combine(parts, lses, out=torch.empty_like(outs[0][0]).unsqueeze(0),
                                   backend=opts["backend"])
    return out[0], lse[0]


def _gather_backward(dout, q, k, v, out, lse, ring, layout, varlens, opts):
    kf, vf = _gather_packed(k, ring, layout), _gather_packed(v, ring, layout)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(kf.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(vf.shape, dtype=torch.float32, device=q.device)
    for g in varlens:
        gq, gk, gv = _functional.backward(dout, q, kf, vf, out, lse, **g.args, **opts)
        dq += _masked(gq, g.rows, 0)
        dk += _masked(gk, g.keys, 0)
        dv += _masked(gv, g.keys, 0)
    dk, dv = _scatter_packed(dk, k, ring, layout), _scatter_packed(dv, v, ring, layout)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _GatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, layout, varlens, opts):
        out, lse = _gather_forward(q, k, v, ring, layout, varlens, opts)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = ring, layout, varlens, opts
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _gather_backward(contiguous_last(dout), q, k, v, out, lse, *ctx.args)
        return first_order((dq, dk, dv), dout, q, k, v) + (None,) * 4


def _documents(cu_seqlens, total):
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.ndim != 1 or cu_seqlens.dtype != torch.int32:
        raise ValueError("tileattn.distributed.all_gather_attention: cu_seqlens must be a 1-D int32 tensor, got "
                         f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)} with shape "
                         f"{tuple(getattr(cu_seqlens, 'shape', ()))}")
    cu = cu_seqlens.tolist()
    if not cu or cu[0] != 0 or any(y < x for x, y in zip(cu, cu[1:])) or cu[-1] > total:
        raise ValueError(f"tileattn.distributed.all_gather_attention: cu_seqlens = {cu} must start at 0, never "
                         f"decrease and end at most at the {total} packed tokens of all ranks")
    return list(zip(cu, cu[1:]))


def all_gather_attention(q, k, v, group=None, *, causal=False, layout="contiguous", cu_seqlens=None,
                         softmax_scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                         return_lse=False, sm_margin=0):
    """ring_attention's result with K and V all-gathered instead of passed around the ring (no overlap
    of the transfer with compute), for packed documents too.

    Batched: q (batch, local_seqlen, nheads, d), k and v (batch, local_seqlen, nheads_k, d); returns
    out like q (and softmax_lse (batch, nheads, local_seqlen) with return_lse).
    Varlen: q (local_tokens, nheads, d), k and v (local_tokens, nheads_k, d), the ranks' shards of one
    packed sequence of world_size * local_tokens tokens, and cu_seqlens int32 (docs + 1,): the
    documents' prefix sums over the whole packed sequence (the same on every rank; tokens past
    cu_seqlens[-1] belong to no document and output zeros). Returns out (local_tokens, nheads, d)
    (and softmax_lse (nheads, local_tokens)). Masks and ALiBi apply per document, as in
    flash_attn_varlen_func; alibi_slopes (nheads,) or (docs, nheads)."""
    varlen = cu_seqlens is not None
    ring = _Ring(group)
    with _Agreement(ring, "all_gather_attention", q) as agree:
        _check_qkv("all_gather_attention", q, k, v, 3 if varlen else 4)
        _check_layout(layout)
        lo, hi = _band("all_gather_attention", causal, window_size)
        opts = _opts("all_gather_attention", softmax_scale, softcap, sm_margin)
        if varlen:
            n = q.shape[0]
            _pieces(layout, ring.world, n * ring.world, "the packed sequence (local tokens * world size)")
            docs = _documents(cu_seqlens, n * ring.world)
        else:
            batch, n = q.shape[:2]
            _pieces(layout, ring.world, n * ring.world, "the sequence (local_seqlen * world size)")
        # cu_seqlens by its length and a weighted sum of its ends (-1: batched).
        cu = (len(docs), sum(end * (i + 1) for i, (_, end) in enumerate(docs))) if varlen else (-1, -1)
        agree.fields(**_call_fields(q, k, v, layout, lo, hi, dict(opts, alibi_slopes=alibi_slopes)), cu_seqlens=cu)
    if varlen:

        def chunks(rank):
            return _chunks(layout, rank, ring.world, n)
    else:
        length = n * ring.world
        docs = [(b * length, (b + 1) * length) for b in range(batch)]

        def chunks(rank):
            # Batch element b's rows and keys packed after those of b - 1.
            return [_Chunk(b * n + c.local, b * length + c.pos, c.n) for b in range(batch)
                    for c in _chunks(layout, rank, ring.world, n)]

    groups = _gather_plan(chunks(ring.rank), docs, lo, hi, alibi_slopes is not None)
    q, k, v = (contiguous_last(x) for x in (q, k, v))
    if not varlen:
        q = q.reshape((-1,) + tuple(q.shape[2:]))  # batch element b's rows after those of b - 1
    varlens = [_Varlen(g, q.shape[0], q.shape[0] * ring.world, alibi_slopes, q.device) for g in groups]
    out, lse = _GatherAttention.apply(q, k, v, ring, layout, varlens, opts)
    if not varlen:
        out = out.view(batch, n, *out.shape[1:])
        lse = lse.view(lse.shape[0], batch, n).transpose(0, 1).contiguous()
    return (out, lse) if return_lse else out
