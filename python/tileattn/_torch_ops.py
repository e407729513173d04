"""PyTorch custom ops (torch.library): tileattn::fwd, tileattn::bwd, tileattn::decode, and the eager path
beside them.

Each op runs the native module on the current CUDA stream, with its scratch from PyTorch's caching
allocator, so calls can be captured in a CUDA graph. Fake (meta) rules give torch.compile the output
shapes without running anything, so graphs trace with fullgraph=True. Autograd saves only q, k, v, out,
lse and the dropout seed/offset (plus the small index inputs cu_seqlens and alibi_slopes); the backward
recomputes the rest. Its gradients are first order (first_order): a double backward raises.

The ops are what torch.compile and tensor subclasses (fake tensors among them) see. Eager calls on plain
tensors skip the op dispatcher, which costs several times a small kernel's host time, and run the same
implementation: under autograd through a torch.autograd.Function, otherwise directly.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C, _checked_masks, _documents, _implied_masks, _log, _torch_calls


class _FirstOrder(torch.autograd.Function):
    """Passes the gradients of a backward through, joined to its inputs in the graph, and raises
    when something differentiates them: the kernels' backward has no derivative of its own, and a
    gradient without a graph would silently leave out attention's second-order term of whatever
    double backward (a gradient penalty, meta-learning) runs through it."""

    @staticmethod
    def forward(ctx, count, *tensors):
        return tensors[:count]

    @staticmethod
    def backward(ctx, *_):
        raise _C.Error("tileattn: the attention backward is not differentiable: a double backward (a gradient "
                       "taken with create_graph=True and differentiated again) runs through it")


def first_order(grads, *inputs):
    """grads (dq, dk, dv), made to raise if differentiated where a backward runs with create_graph and
    any of inputs (the backward's dout, q, k, v) requires grad; as they are otherwise."""
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in inputs):
        return grads
    return _FirstOrder.apply(len(grads), *grads, *inputs)


def _seed(dropout_p):
    # A fresh Philox key per call from PyTorch's CPU generator, so torch.manual_seed reproduces it.
    return int(torch.randint(0, 2**62, (), dtype=torch.int64)) if dropout_p > 0 else 0


@torch.library.custom_op("tileattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        max_seqlen_q: int, max_seqlen_k: int, alibi_slopes: Optional[Tensor], scale: Optional[float], causal: bool,
        top_left: bool, window_left: int, window_right: int, softcap: float, dropout_p: float,
        deterministic: bool, backend: str, heads_first: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Returns (out, lse, rng_state): rng_state int64 [seed, offset] on the CPU for the backward.
    heads_first: q, k, v and out are [batch, heads, seq, d] (SDPA's layout), lse [batch, heads, seq]."""
    seed = _seed(dropout_p)
    out, lse = _torch_calls.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                    scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed,
                                    deterministic, backend, heads_first)
    return out, lse, torch.tensor([seed, 0], dtype=torch.int64)


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale, causal, top_left,
      window_left, window_right, softcap, dropout_p, deterministic, backend, heads_first=False):
    out = _torch_calls.empty_out(q, v)
    lse = q.new_empty(_torch_calls.lse_shape(q, cu_seqlens_q is not None, heads_first), dtype=torch.float32)
    return out, lse, torch.empty(2, dtype=torch.int64)


@torch.library.custom_op("tileattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, rng_state: Tensor,
        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
        alibi_slopes: Optional[Tensor], scale: Optional[float], causal: bool, top_left: bool, window_left: int,
        window_right: int, softcap: float, dropout_p: float, deterministic: bool,
        backend: str, heads_first: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    seed, offset = (int(x) for x in rng_state.tolist())
    return _torch_calls.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 alibi_slopes, scale, causal, top_left, window_left, window_right, softcap, dropout_p,
                                 seed, deterministic, backend, heads_first, offset)


@bwd.register_fake
def _(dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
      scale, causal, top_left, window_left, window_right, softcap, dropout_p, deterministic, backend,
      heads_first=False):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, *params) = inputs
    out, lse, rng_state = output
    ctx.save_for_backward(q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.lengths = (max_seqlen_q, max_seqlen_k)
    ctx.params = params  # bwd takes the same ones, heads_first included
    ctx.mark_non_differentiable(lse, rng_state)


def _fwd_backward(ctx, dout, _dlse, _drng):
    q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = bwd(dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, *ctx.lengths, alibi_slopes,
                     *ctx.params)
    return first_order((dq, dk, dv), dout, q, k, v) + (None,) * 15


torch.library.register_autograd("tileattn::fwd", _fwd_backward, setup_context=_fwd_setup)


class _Attention(torch.autograd.Function):
    """The eager twin of fwd + its autograd: the same calls without the op dispatcher. o: the call's
    tileattn.Options, built once and kept for the backward, which takes the same ones (the dropout
    seed included; autograd runs it on the forward's stream). args: the arguments of
    _torch_calls.forward_with after v (the index tensors and alibi_slopes among them, which nothing
    differentiates: held by the context, not saved). need_lse False: out is the node's only output
    (the LSE is made for the backward all the same), which saves autograd an output to track."""

    @staticmethod
    def forward(ctx, q, k, v, o, args, need_lse):
        out, lse = _torch_calls.forward_with(o, q, k, v, *args)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.o = o
        ctx.args = args
        if not need_lse:
            return out
        # The LSE's gradient is never used: None rather than a tensor of zeros made per backward.
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, *_dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if not dout.is_contiguous() and dout.stride(-1) != 1:
            dout = dout.contiguous()
        dq, dk, dv = _torch_calls.backward_with(ctx.o, dout, q, k, v, out, lse, *ctx.args)
        return first_order((dq, dk, dv), dout, q, k, v) + (None, None, None)


_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def _eager(*tensors):
    """Whether a call can skip the op dispatcher: plain tensors (no subclass, no fake tensor), eager."""
    for t in tensors:
        if t is not None and type(t) is not _Tensor:
            return False
    return not _is_compiling()


def attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale, causal, top_left,
           window_left, window_right, softcap, dropout_p, deterministic, backend, heads_first=False, need_lse=True):
    """(out, lse) of the forward, differentiable in q, k and v. heads_first: see fwd. need_lse False:
    the caller discards lse, which a call that nothing differentiates then neither allocates nor
    writes (lse is None)."""
    if type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor and \
            (cu_seqlens_q is None or type(cu_seqlens_q) is _Tensor) and \
            (alibi_slopes is None or type(alibi_slopes) is _Tensor) and not _is_compiling():
        seed = _seed(dropout_p) if dropout_p else 0
        o = _torch_calls.options(q, scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed, 0,
                                 deterministic, backend)
        if (q.requires_grad or k.requires_grad or v.requires_grad) and _grad_enabled():
            args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, heads_first)
            if need_lse:
                return _Attention.apply(q, k, v, o, args, True)
            return _Attention.apply(q, k, v, o, args, False), None
        return _torch_calls.forward_with(o, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                         alibi_slopes, heads_first, need_lse)
    out, lse, _ = fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale, causal,
                      top_left, window_left, window_right, softcap, dropout_p, deterministic, backend, heads_first)
    return out, lse


# tileattn.flex_attention (_flex): block-sparse attention; mask tensors None = dense. No dropout, so
# nothing random to save.
@torch.library.custom_op("tileattn::flex_fwd", mutates_args=())
def flex_fwd(q: Tensor, k: Tensor, v: Tensor, kv_num_blocks: Optional[Tensor], kv_indices: Optional[Tensor],
             full_kv_num_blocks: Optional[Tensor], full_kv_indices: Optional[Tensor], document_ids_q: Optional[Tensor],
             document_ids_k: Optional[Tensor], prefix_lens: Optional[Tensor], mask: Optional[Tensor], block_q: int,
             block_k: int, alibi_slopes: Optional[Tensor], scale: Optional[float], causal: bool, top_left: bool,
             window_left: int,
             window_right: int, chunk_size: int, prefix_len: int, softcap: float, backend: str,
             check_device_indices: bool) -> Tuple[Tensor, Tensor]:
    from . import _flex
    return _flex.block_sparse_forward(
        q, k, v, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, block_size=(block_q, block_k),
        alibi_slopes=alibi_slopes, chunk_size=chunk_size, document_ids=(document_ids_q, document_ids_k),
        prefix_len=prefix_len if prefix_lens is None else prefix_lens, mask=mask, scale=scale, causal=causal,
        top_left=top_left, window_left=window_left, window_right=window_right, softcap=softcap, backend=backend,
        check_device_indices=check_device_indices)


@flex_fwd.register_fake
def _(q, k, v, *rest):
    out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
    return out, q.new_empty(_torch_calls.lse_shape(q, False), dtype=torch.float32)


@torch.library.custom_op("tileattn::flex_bwd", mutates_args=())
def flex_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, kv_num_blocks: Optional[Tensor],
             kv_indices: Optional[Tensor], full_kv_num_blocks: Optional[Tensor], full_kv_indices: Optional[Tensor],
             document_ids_q: Optional[Tensor], document_ids_k: Optional[Tensor], prefix_lens: Optional[Tensor],
             mask: Optional[Tensor], block_q: int, block_k: int, alibi_slopes: Optional[Tensor], scale: Optional[float],
             causal: bool,
             top_left: bool, window_left: int, window_right: int, chunk_size: int, prefix_len: int, softcap: float,
             backend: str, check_device_indices: bool) -> Tuple[Tensor, Tensor, Tensor]:
    from . import _flex
    return _flex.block_sparse_backward(
        dout, q, k, v, out, lse, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
        block_size=(block_q, block_k), alibi_slopes=alibi_slopes, chunk_size=chunk_size,
        document_ids=(document_ids_q, document_ids_k), prefix_len=prefix_len if prefix_lens is None else prefix_lens,
        mask=mask, scale=scale, causal=causal, top_left=top_left, window_left=window_left, window_right=window_right,
        softcap=softcap, backend=backend, check_device_indices=check_device_indices)


@flex_bwd.register_fake
def _(dout, q, k, v, out, lse, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _flex_setup(ctx, inputs, output):
    # mask: the block lists, document ids, prefix lengths and the dense mask
    q, k, v, *mask, block_q, block_k, alibi_slopes = inputs[:14]
    ctx.save_for_backward(q, k, v, *output, *mask, alibi_slopes)
    ctx.params = (block_q, block_k) + tuple(inputs[14:])
    ctx.mark_non_differentiable(output[1])


def _flex_backward(ctx, dout, _dlse):
    q, k, v, out, lse, *mask, alibi_slopes = ctx.saved_tensors
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    block_q, block_k, *params = ctx.params
    dq, dk, dv = flex_bwd(dout, q, k, v, out, lse, *mask, block_q, block_k, alibi_slopes, *params)
    return first_order((dq, dk, dv), dout, q, k, v) + (None,) * 21


torch.library.register_autograd("tileattn::flex_fwd", _flex_backward, setup_context=_flex_setup)


class _BlockSparse(torch.autograd.Function):
    """The eager twin of flex_fwd + its autograd, as _Attention is fwd's, on [batch, heads, seq, d]
    tensors. o: the forward's Options, o_bwd the backward's (the same with the device check of the
    block mask off: the forward checked the lists, and autograd refuses a backward whose saved lists
    were written since). mask: as _torch_calls.block_sparse_forward takes it; its tensors are saved,
    so such a write is caught."""

    @staticmethod
    def forward(ctx, q, k, v, o, o_bwd, mask, alibi_slopes):
        out, lse = _torch_calls.block_sparse_forward(o, q, k, v, mask, alibi_slopes, True)
        num, idx, full_num, full_idx, block_q, block_k, docs_q, docs_k, prefix_lens, dense = mask
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, num, idx, full_num, full_idx, docs_q, docs_k,
                              prefix_lens, dense)
        ctx.o, ctx.blocks = o_bwd, (block_q, block_k)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, alibi_slopes, num, idx, full_num, full_idx, docs_q, docs_k, prefix_lens, dense = \
            ctx.saved_tensors
        if not dout.is_contiguous() and dout.stride(-1) != 1:
            dout = dout.contiguous()
        mask = (num, idx, full_num, full_idx) + ctx.blocks + (docs_q, docs_k, prefix_lens, dense)
        dq, dk, dv = _torch_calls.block_sparse_backward(ctx.o, dout, q, k, v, out, lse, mask, alibi_slopes, True)
        return first_order((dq, dk, dv), dout, q, k, v) + (None,) * 4


def flex(q, k, v, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, document_ids_q, document_ids_k,
         prefix_lens, dense_mask, block_q, block_k, alibi_slopes, scale, causal, top_left, window_left, window_right, chunk_size,
         prefix_len, softcap, backend, check_device_indices):
    """flex_fwd's (out, lse) on [batch, heads, seq, d] q, k, v and out (FlexAttention's layout; lse
    [batch, heads, seq]), differentiable in q, k and v. Eager calls on plain tensors skip the op
    dispatcher and the transposed views (the native call reads the layout as it is), and a GPU block
    mask is checked at its first use only (_checked_masks); one that adds nothing to the causal /
    window rule of its call is left out of the later ones (_implied_masks)."""
    lists = (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)
    if not _eager(q, k, v, alibi_slopes, document_ids_q, document_ids_k, prefix_lens, dense_mask, *lists):
        out, lse = flex_fwd(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), *lists, document_ids_q,
                            document_ids_k, prefix_lens, dense_mask, block_q, block_k, alibi_slopes, scale, causal, top_left,
                            window_left, window_right, chunk_size, prefix_len, softcap, backend, check_device_indices)
        return out.transpose(1, 2), lse
    check = check_device_indices
    sizes = None
    # The mask is remembered with the document ids it was found to add nothing to.
    keyed = lists + (document_ids_q,)
    unrelative = chunk_size != 0 or prefix_len != 0 or prefix_lens is not None or dense_mask is not None or \
        (alibi_slopes is not None and alibi_slopes.dim() > 1)
    implied = kv_num_blocks is None
    if check and kv_num_blocks is not None and kv_num_blocks.is_cuda:
        sizes = (q.shape[2], k.shape[2], block_q, block_k, causal, top_left, window_left, window_right)
        check = not _checked_masks.seen(keyed, sizes)
        implied = not check and _checked_masks.implied(keyed)
    runs = _documents.packed(q, k, v, document_ids_q, document_ids_k, unrelative) if implied and \
        document_ids_q is not None else None
    if runs is not None:
        return _documents_as_sequences(q, k, v, runs, alibi_slopes, scale, causal, top_left, window_left, window_right,
                                       softcap, backend)
    if implied and document_ids_q is None:
        lists = (None,) * 4  # the dense call under the same rule (_implied_masks)
    o = _torch_calls.options(q, scale, causal, top_left, window_left, window_right, softcap, 0.0, 0, 0, False, backend,
                             0, check, chunk_size, prefix_len)
    mask = lists + (block_q, block_k, document_ids_q, document_ids_k, prefix_lens, dense_mask)
    if (q.requires_grad or k.requires_grad or v.requires_grad) and _grad_enabled():
        o_bwd = o if not check else _torch_calls.options(
            q, scale, causal, top_left, window_left, window_right, softcap, 0.0, 0, 0, False, backend, 0, False,
            chunk_size, prefix_len)
        out, lse = _BlockSparse.apply(q, k, v, o, o_bwd, mask, alibi_slopes)
    else:
        out, lse = _torch_calls.block_sparse_forward(o, q, k, v, mask, alibi_slopes, True)
    if check and sizes is not None:
        if document_ids_q is None:
            rule_only, bounds = document_ids_k is None and not unrelative, None
        else:
            runs = _documents.packed(q, k, v, document_ids_q, document_ids_k, unrelative)
            rule_only, bounds = runs is not None, runs and runs[2:]
        _checked_masks.remember(keyed, sizes, rule_only and _implied_masks.implied(
            lists, q.shape[2], k.shape[2], block_q, block_k, causal, top_left, window_left, window_right, bounds))
    return out, lse


def _documents_as_sequences(q, k, v, runs, alibi_slopes, scale, causal, top_left, window_left, window_right, softcap,
                            backend):
    """flex's (out, lse) for documents that are each one run of positions: the varlen call over the
    documents (_documents), on [batch * seq, heads, d] views of the [batch, heads, seq, d] ones."""
    cu, longest = runs[:2]
    batch, heads, seq = q.shape[:3]
    _log.note("document_ids: packed documents run as a variable-length batch")
    flat = _documents.tokens
    out, lse = attend(flat(q), flat(k), flat(v), cu, cu, longest, longest, alibi_slopes, scale, causal, top_left,
                      window_left, window_right, softcap, 0.0, False, backend)
    return out.view(batch, seq, heads, -1).transpose(1, 2), lse.view(heads, batch, seq).transpose(0, 1)


@torch.library.custom_op("tileattn::decode", mutates_args=("k_cache", "v_cache"))
def decode_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_new: Optional[Tensor], v_new: Optional[Tensor],
              cache_seqlens: Optional[Tensor], page_table: Optional[Tensor], rotary_cos: Optional[Tensor],
              rotary_sin: Optional[Tensor], rotary_interleaved: bool, alibi_slopes: Optional[Tensor],
              scale: Optional[float], causal: bool, window_left: int, window_right: int, softcap: float,
              num_splits: int, check_device_indices: bool, backend: str) -> Tuple[Tensor, Tensor]:
    """Returns (out, lse); writes k_new/v_new into the caches when given."""
    return _torch_calls.decode(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, rotary_cos, rotary_sin,
                               rotary_interleaved, alibi_slopes, scale, causal, window_left, window_right, softcap,
                               num_splits, check_device_indices, backend)


@decode_op.register_fake
def _(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, rotary_cos, rotary_sin, rotary_interleaved,
      alibi_slopes, scale, causal, window_left, window_right, softcap, num_splits, check_device_indices, backend):
    out = q.new_empty(tuple(q.shape[:-1]) + (v_cache.shape[-1],))
    return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def decode(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, rotary_cos, rotary_sin, rotary_interleaved,
           alibi_slopes, scale, causal, window_left, window_right, softcap, num_splits, check_device_indices, backend,
           need_lse=True):
    """(out, lse); need_lse False: the caller discards lse, which an eager call then neither
    allocates nor writes (None)."""
    if _eager(q, k_cache, v_cache, k_new, v_new):
        # The appended caches' version counters move as the op's declared mutation would move them.
        out, lse = _torch_calls.decode(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, rotary_cos,
                                       rotary_sin, rotary_interleaved, alibi_slopes, scale, causal, window_left,
                                       window_right, softcap, num_splits, check_device_indices, backend, need_lse)
        if k_new is not None or v_new is not None:
            torch.autograd.graph.increment_version([k_cache, v_cache])
        return out, lse
    return decode_op(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, rotary_cos, rotary_sin,
                     rotary_interleaved, alibi_slopes, scale, causal, window_left, window_right, softcap, num_splits,
                     check_device_indices, backend)
