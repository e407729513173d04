"""PyTorch custom ops (torch.library): tileattn::fwd, tileattn::bwd, tileattn::decode, and the eager path
beside them.

Each op runs the native module on the current CUDA stream, with its scratch from PyTorch's caching
allocator, so calls can be captured in a CUDA graph. Fake (meta) rules give torch.compile the output
shapes without running anything, so graphs trace with fullgraph=True. Autograd saves only q, k, v, out,
lse and the dropout seed/offset (plus the small index inputs cu_seqlens and alibi_slopes); the backward
recomputes the rest.

The ops are what torch.compile and tensor subclasses (fake tensors among them) see. Eager calls on plain
tensors skip the op dispatcher, which costs several times a small kernel's host time, and run the same
implementation: under autograd through a torch.autograd.Function, otherwise directly.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _torch_calls


def _seed(dropout_p):
    # A fresh Philox key per call from PyTorch's CPU generator, so torch.manual_seed reproduces it.
    return int(torch.randint(0, 2**62, (), dtype=torch.int64)) if dropout_p > 0 else 0


@torch.library.custom_op("tileattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        max_seqlen_q: int, max_seqlen_k: int, alibi_slopes: Optional[Tensor], scale: Optional[float], causal: bool,
        top_left: bool, window_left: int, window_right: int, softcap: float, dropout_p: float,
        deterministic: bool, backend: str, heads_first: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Returns (out, lse, rng_state): rng_state int64 [seed, offset] on the CPU for the backward.
    heads_first: out is a [batch, seq, heads, d] view of [batch, heads, seq, d] memory."""
    seed = _seed(dropout_p)
    out, lse = _torch_calls.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                    scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed,
                                    deterministic, backend, heads_first)
    return out, lse, torch.tensor([seed, 0], dtype=torch.int64)


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale, causal, top_left,
      window_left, window_right, softcap, dropout_p, deterministic, backend, heads_first=False):
    out = _torch_calls.empty_out(q, v, heads_first)
    lse = q.new_empty(_torch_calls.lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return out, lse, torch.empty(2, dtype=torch.int64)


@torch.library.custom_op("tileattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, rng_state: Tensor,
        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
        alibi_slopes: Optional[Tensor], scale: Optional[float], causal: bool, top_left: bool, window_left: int,
        window_right: int, softcap: float, dropout_p: float, deterministic: bool,
        backend: str) -> Tuple[Tensor, Tensor, Tensor]:
    seed, offset = (int(x) for x in rng_state.tolist())
    return _torch_calls.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 alibi_slopes, scale, causal, top_left, window_left, window_right, softcap, dropout_p,
                                 seed, offset, deterministic, backend)


@bwd.register_fake
def _(dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
      scale, causal, top_left, window_left, window_right, softcap, dropout_p, deterministic, backend):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _fwd_setup(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, *params) = inputs
    out, lse, rng_state = output
    ctx.save_for_backward(q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.lengths = (max_seqlen_q, max_seqlen_k)
    ctx.params = params[:-1]  # heads_first is the forward's alone
    ctx.mark_non_differentiable(lse, rng_state)


def _fwd_backward(ctx, dout, _dlse, _drng):
    q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = bwd(dout, q, k, v, out, lse, rng_state, cu_seqlens_q, cu_seqlens_k, *ctx.lengths, alibi_slopes,
                     *ctx.params)
    return (dq, dk, dv) + (None,) * 15


torch.library.register_autograd("tileattn::fwd", _fwd_backward, setup_context=_fwd_setup)


class _Attention(torch.autograd.Function):
    """The eager twin of fwd + its autograd: the same calls without the op dispatcher."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, params, seed,
                heads_first):
        out, lse = _torch_calls.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        alibi_slopes, *params[:-2], seed, *params[-2:], heads_first)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
        ctx.lengths = (max_seqlen_q, max_seqlen_k)
        ctx.params, ctx.seed = params, seed
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        p = ctx.params
        dq, dk, dv = _torch_calls.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.lengths,
                                           alibi_slopes, *p[:-2], ctx.seed, 0, *p[-2:])
        return dq, dk, dv, None, None, None, None, None, None, None, None


def _eager(*tensors):
    """Whether a call can skip the op dispatcher: plain tensors (no subclass, no fake tensor), eager."""
    for t in tensors:
        if t is not None and type(t) is not torch.Tensor:
            return False
    return not torch.compiler.is_compiling()


def attend(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale, causal, top_left,
           window_left, window_right, softcap, dropout_p, deterministic, backend, heads_first=False):
    """(out, lse) of the forward, differentiable in q, k and v."""
    if _eager(q, k, v, cu_seqlens_q, alibi_slopes):
        params = (scale, causal, top_left, window_left, window_right, softcap, dropout_p, deterministic, backend)
        seed = _seed(dropout_p)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return _Attention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                    params, seed, heads_first)
        return _torch_calls.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
                                    scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed,
                                    deterministic, backend, heads_first)
    out, lse, _ = fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, scale, causal,
                      top_left, window_left, window_right, softcap, dropout_p, deterministic, backend, heads_first)
    return out, lse


# tileattn.flex_attention (_flex): block-sparse attention; mask tensors None = dense. No dropout, so
# nothing random to save.
@torch.library.custom_op("tileattn::flex_fwd", mutates_args=())
def flex_fwd(q: Tensor, k: Tensor, v: Tensor, kv_num_blocks: Optional[Tensor], kv_indices: Optional[Tensor],
             full_kv_num_blocks: Optional[Tensor], full_kv_indices: Optional[Tensor], document_ids_q: Optional[Tensor],
             document_ids_k: Optional[Tensor], block_q: int, block_k: int, alibi_slopes: Optional[Tensor],
             scale: Optional[float], causal: bool, top_left: bool, window_left: int, window_right: int,
             chunk_size: int, softcap: float, backend: str, check_device_indices: bool) -> Tuple[Tensor, Tensor]:
    from . import _flex
    return _flex.block_sparse_forward(
        q, k, v, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, block_size=(block_q, block_k),
        alibi_slopes=alibi_slopes, chunk_size=chunk_size, document_ids=(document_ids_q, document_ids_k), scale=scale,
        causal=causal, top_left=top_left, window_left=window_left, window_right=window_right, softcap=softcap,
        backend=backend, check_device_indices=check_device_indices)


@flex_fwd.register_fake
def _(q, k, v, *rest):
    out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
    return out, q.new_empty(_torch_calls.lse_shape(q, False), dtype=torch.float32)


@torch.library.custom_op("tileattn::flex_bwd", mutates_args=())
def flex_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, kv_num_blocks: Optional[Tensor],
             kv_indices: Optional[Tensor], full_kv_num_blocks: Optional[Tensor], full_kv_indices: Optional[Tensor],
             document_ids_q: Optional[Tensor], document_ids_k: Optional[Tensor], block_q: int, block_k: int,
             alibi_slopes: Optional[Tensor], scale: Optional[float], causal: bool, top_left: bool, window_left: int,
             window_right: int, chunk_size: int, softcap: float, backend: str,
             check_device_indices: bool) -> Tuple[Tensor, Tensor, Tensor]:
    from . import _flex
    return _flex.block_sparse_backward(
        dout, q, k, v, out, lse, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
        block_size=(block_q, block_k), alibi_slopes=alibi_slopes, chunk_size=chunk_size,
        document_ids=(document_ids_q, document_ids_k), scale=scale, causal=causal, top_left=top_left,
        window_left=window_left, window_right=window_right, softcap=softcap, backend=backend,
        check_device_indices=check_device_indices)


@flex_bwd.register_fake
def _(dout, q, k, v, out, lse, *rest):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _flex_setup(ctx, inputs, output):
    q, k, v, *mask, block_q, block_k, alibi_slopes = inputs[:12]  # mask: the block lists and document ids
    ctx.save_for_backward(q, k, v, *output, *mask, alibi_slopes)
    ctx.params = (block_q, block_k) + tuple(inputs[12:])
    ctx.mark_non_differentiable(output[1])


def _flex_backward(ctx, dout, _dlse):
    q, k, v, out, lse, *mask, alibi_slopes = ctx.saved_tensors
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    block_q, block_k, *params = ctx.params
    dq, dk, dv = flex_bwd(dout, q, k, v, out, lse, *mask, block_q, block_k, alibi_slopes, *params)
    return (dq, dk, dv) + (None,) * 18


torch.library.register_autograd("tileattn::flex_fwd", _flex_backward, setup_context=_flex_setup)


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
           alibi_slopes, scale, causal, window_left, window_right, softcap, num_splits, check_device_indices, backend):
    if _eager(q, k_cache, v_cache, k_new, v_new):
        # The appended caches' version counters move as the op's declared mutation would move them.
        out, lse = _torch_calls.decode(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, rotary_cos,
                                       rotary_sin, rotary_interleaved, alibi_slopes, scale, causal, window_left,
                                       window_right, softcap, num_splits, check_device_indices, backend)
        if k_new is not None or v_new is not None:
            torch.autograd.graph.increment_version([k_cache, v_cache])
        return out, lse
    return decode_op(q, k_cache, v_cache, k_new, v_new, cache_seqlens, page_table, rotary_cos, rotary_sin,
                     rotary_interleaved, alibi_slopes, scale, causal, window_left, window_right, softcap, num_splits,
                     check_device_indices, backend)
