"""Block-sparse attention with PyTorch FlexAttention's BlockMask: tileattn.flex_attention.

The block mask says, per (batch, head, query block), which key blocks are partly visible
(kv_num_blocks / kv_indices) and which fully (full_kv_num_blocks / full_kv_indices); every other
block is skipped, so time goes with the visited blocks. FlexAttention evaluates a Python mask_mod
inside the partial blocks; tileattn cannot run Python in its kernels, so the element mask of the
partial blocks is made of its built-in rules, named by the arguments: causal, a sliding window, an
attention chunk, prefix-LM, document ids (none of them: partial blocks fully visible), and where
those cannot say it, a dense boolean mask (`mask`: a tensor, or the BlockMask's mask_mod evaluated
densely), which the kernels read in the partial blocks only. Causal and the window align to the
top-left corner by default, as mask_mods over absolute indices do. Fully visible blocks take no
element mask.

block_sparse_forward / block_sparse_backward are the array-level calls (NumPy, PyTorch, CuPy; no
autograd); flex_attention is the PyTorch function, with autograd and torch.compile through the
tileattn::flex_fwd custom op.
"""

from . import _C, _checks, _config, _dense_mask, _functional, _log
from ._arrays import empty, is_torch, native


def _prefix(fn, prefix_len):
    """prefix_len as (per call, per sequence): an int is every sequence's prefix, a 1-D int32 array
    [batch] each sequence's own."""
    if getattr(prefix_len, "ndim", 0) > 0:
        return 0, prefix_len
    return _checks.integer(fn, "prefix_len", prefix_len), None


def _options(fn, like, chunk_size, prefix_len=0, **opts):
    o = _functional.options(like, **opts)
    o.chunk_size = _checks.integer(fn, "chunk_size", chunk_size)
    o.prefix_len = prefix_len
    return o


def _block_size(fn, block_size, name="block_size"):
    """(block_q, block_k) from an int or a pair of ints."""
    if isinstance(block_size, (tuple, list)):
        if len(block_size) != 2:
            raise TypeError(f"tileattn.{fn}: {name} = {block_size!r}, expected an int or a pair "
                            "(block_q, block_k)")
        return _checks.integer(fn, f"{name}[0]", block_size[0]), _checks.integer(fn, f"{name}[1]", block_size[1])
    size = _checks.integer(fn, name, block_size)
    return size, size


def _documents(fn, document_ids):
    """(queries', keys') from one document id array for both or a pair."""
    if not isinstance(document_ids, (tuple, list)):
        return document_ids, document_ids
    if len(document_ids) != 2:
        raise TypeError(f"tileattn.{fn}: document_ids is a {type(document_ids).__name__} of {len(document_ids)}, "
                        "expected one array or a pair (queries', keys')")
    return tuple(document_ids)


def _nat(x):
    return None if x is None else native(x)


def _mask_args(fn, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, block_size, document_ids,
               prefix_lens=None, mask=None):
    block_q, block_k = _block_size(fn, block_size)
    docs_q, docs_k = _documents(fn, document_ids)
    return dict(kv_num_blocks=_nat(kv_num_blocks), kv_indices=_nat(kv_indices),
                full_kv_num_blocks=_nat(full_kv_num_blocks), full_kv_indices=_nat(full_kv_indices),
                mask=_nat(mask), block_q=block_q, block_k=block_k, document_ids_q=_nat(docs_q),
                document_ids_k=_nat(docs_k), prefix_lens=_nat(prefix_lens))


def _features(kv_num_blocks, document_ids, mask):
    """The call's block-sparse features, for the log line."""
    docs = document_ids is not None and not (isinstance(document_ids, (tuple, list)) and document_ids[0] is None)
    return _log.block_sparse(kv_num_blocks is not None, docs, mask is not None)


def block_sparse_forward(q, k, v, kv_num_blocks=None, kv_indices=None, full_kv_num_blocks=None, full_kv_indices=None, *,
                         block_size=128, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                         alibi_slopes=None, chunk_size=0, document_ids=None, prefix_len=0, mask=None, **opts):
    """Block-sparse attention forward on [batch, seq, heads, dim] arrays (any strides but a contiguous
    last dim; varlen as in forward). The mask's arrays are int32: counts [B, H, q_blocks], indices
    [B, H, q_blocks, n] (B in {1, batch}, H in {1, heads_q}); block_size an int or (block_q, block_k).
    document_ids: int32 [batch, seq] ([total] varlen) for queries and keys alike, or a pair (queries',
    keys'): a row sees only keys of its own document. prefix_len: prefix-LM, every row also sees keys
    [0, prefix_len) of its sequence (with causal or window_right; no window_left or chunk_size): an
    int for every sequence, or an int32 array [batch] per sequence. opts: as tileattn.forward's
    (causal, window_left, window_right, top_left, ...). These, chunk_size, prefix_len and
    document_ids make the element mask of the partial blocks. mask: a dense bool (or uint8) array
    [B, H, rows, cols] (B in {1, batch}, H in {1, heads_q}, any strides; rows, cols = seq_q, seq_k,
    varlen at least the longest sequence, indexed by positions within a sequence): element (i, j) of a
    partial block is visible only where it is True, besides the rules above; read in partial blocks
    only, and only with a block mask. Without a block mask (kv_num_blocks None): dense attention
    under the element rules. Returns (out, lse)."""
    prefix, prefix_lens = _prefix("block_sparse_forward", prefix_len)
    o = _options("block_sparse_forward", q, chunk_size, prefix, **opts)
    out = empty(q, tuple(q.shape[:-1]) + tuple(v.shape[-1:]))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    lse = empty(q, (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1]), "float32")
    _C.forward_block_sparse(
        native(q), native(k), native(v), native(out), lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        alibi_slopes, **_mask_args("block_sparse_forward", kv_num_blocks, kv_indices, full_kv_num_blocks,
                                   full_kv_indices, block_size, document_ids, prefix_lens, mask), options=o)
    if _log.enabled:
        _log.call("forward", q, k, varlen, o, *_features(kv_num_blocks, document_ids, mask))
    return out, lse


def block_sparse_backward(dout, q, k, v, out, lse, kv_num_blocks=None, kv_indices=None, full_kv_num_blocks=None,
                          full_kv_indices=None, *, block_size=128, cu_seqlens_q=None, cu_seqlens_k=None,
                          max_seqlen_q=0, max_seqlen_k=0, alibi_slopes=None, chunk_size=0, document_ids=None,
                          prefix_len=0, mask=None, **opts):
    """The backward of block_sparse_forward, with the same mask and options. Returns (dq, dk, dv)."""
    prefix, prefix_lens = _prefix("block_sparse_backward", prefix_len)
    o = _options("block_sparse_backward", q, chunk_size, prefix, **opts)
    dq, dk, dv = empty(q, q.shape), empty(k, k.shape), empty(v, v.shape)
    _C.backward_block_sparse(
        native(q), native(k), native(v), native(out), native(dout), lse, native(dq), native(dk), native(dv),
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
        **_mask_args("block_sparse_backward", kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
                     block_size, document_ids, prefix_lens, mask), options=o)
    if _log.enabled:
        _log.call("backward", q, k, cu_seqlens_q is not None, o, *_features(kv_num_blocks, document_ids, mask))
    return dq, dk, dv


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, return_lse=False,
                   kernel_options=None, *, return_aux=None, causal=False, window_size=(-1, -1), chunk_size=0,
                   document_ids=None, prefix_len=0, top_left=True, softcap=0.0, alibi_slopes=None, mask=None,
                   check_device_indices=True):
    """FlexAttention's call on tileattn: query [batch, heads_q, seq_q, d], key/value [batch, heads_kv,
    seq_k, d] (PyTorch tensors) -> out [batch, heads_q, seq_q, d_v], and lse [batch, heads_q, seq_q]
    (natural log) with return_lse, or (out, AuxOutput(lse=...)) with return_aux=AuxRequest(lse=True).
    The arguments before the keyword-only ones are torch's flex_attention's, in its order: score_mod
    must be None (the kernels run no Python; the score rules are scale, softcap and alibi_slopes), and
    kernel_options is accepted and ignored (tileattn picks its own tiles).
    block_mask: a torch.nn.attention.flex_attention.BlockMask (its kv_num_blocks, kv_indices, full_kv_* and BLOCK_SIZE are used; its mask_mod is not: the partial
    blocks' element mask is causal / window_size / chunk_size / prefix_len / document_ids), or None for
    dense attention under that mask. document_ids: int32 [batch, seq] for queries and keys alike (seq_q =
    seq_k), or a pair ([batch, seq_q], [batch, seq_k]). prefix_len: prefix-LM with causal, every row also
    sees keys [0, prefix_len): an int, or an int32 tensor [batch] per sequence. mask: a dense element
    mask for what the rules above cannot say: a bool tensor broadcastable to [batch, heads_q, seq_q,
    seq_k] (True = visible), or "mask_mod" for block_mask.mask_mod evaluated densely with broadcasting
    index tensors (its mask_mod must be written with tensor operations, as create_mask's is). It costs
    one byte per element of its shape (B' x H' x seq_q x seq_k, B' and H' 1 where it does not vary:
    64 MiB for one 8k x 8k mask shared by all heads); the kernels read it in partial blocks only.
    With a mask and no block_mask the block lists come from the mask (blocks of 128 x 128: all-False
    skipped, all-True full, others partial). heads_kv < heads_q needs enable_gqa=True.
    Differentiable in q, k, v; traceable by torch.compile (a mask tensor; "mask_mod" evaluates Python
    per call). check_device_indices: a GPU-resident block mask is copied to the host and checked (one
    synchronization) at its first use, and again once written in place or used at other sizes (eager
    calls; a traced call checks every time); False skips that (out-of-range entries are then ignored).
    A GPU block mask that adds nothing to the causal / window rule given with it (causal as blocks,
    a window as blocks: every skipped block invisible under the rule, every full one wholly visible)
    is found so at that first check, and later eager calls with it run the dense kernels. So is one
    made for packed documents used with their document_ids (each document one run of positions, the
    rule causal, a window or none, no chunk, prefix or dense mask, per-head ALiBi at most): later
    eager calls run the varlen kernels over the documents, as does such a call with no block_mask,
    where query, key and value are views of [batch, seq, heads, d] memory (two synchronizations per
    ids tensor, which read its runs; remembered while the tensor is unchanged).
    Block lists built here from a mask are not checked (they are valid by construction)."""
    if not is_torch(query):
        raise TypeError("tileattn.flex_attention: query must be a torch.Tensor (block_sparse_forward takes "
                        "any array)")
    if score_mod is not None:
        if hasattr(score_mod, "kv_num_blocks"):
            raise TypeError("tileattn.flex_attention: score_mod is a BlockMask; the fourth argument is score_mod, as "
                            "in torch's flex_attention: pass block_mask=")
        raise TypeError(f"tileattn.flex_attention: score_mod = {score_mod!r}; tileattn's kernels run no Python "
                        "score_mod: pass None and give the score rules as scale=, softcap= and alibi_slopes=")
    _check_aux_request(return_aux, return_lse)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.ndim != 4:
            raise ValueError(f"tileattn.flex_attention: {name} has shape {tuple(x.shape)}, expected "
                             "[batch, heads, seq, dim]")
    if not enable_gqa and key.shape[1] != query.shape[1]:
        raise ValueError(f"tileattn.flex_attention: query has {query.shape[1]} heads and key {key.shape[1]}; "
                         "pass enable_gqa=True for grouped-query attention")
    _checks.not_differentiated("flex_attention", "alibi_slopes", alibi_slopes)
    from . import _torch_ops
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (query, key, value))
    m = block_mask
    if m is not None and not all(hasattr(m, a) for a in ("BLOCK_SIZE", "kv_num_blocks", "kv_indices")):
        raise TypeError(f"tileattn.flex_attention: block_mask is a {type(m).__module__}.{type(m).__qualname__}; "
                        "expected a torch.nn.attention.flex_attention.BlockMask or None")
    fn = "flex_attention"
    block_q, block_k = _block_size(fn, m.BLOCK_SIZE, "block_mask.BLOCK_SIZE") if m is not None else (128, 128)
    lists = (None,) * 4 if m is None else (m.kv_num_blocks, m.kv_indices, m.full_kv_num_blocks, m.full_kv_indices)
    dims = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    if isinstance(mask, str):
        if mask != "mask_mod" or m is None:
            raise ValueError(f"tileattn.flex_attention: mask = {mask!r}; the string form is \"mask_mod\", with a "
                             "block_mask whose mask_mod is evaluated")
        mask = _dense_mask.from_mask_mod(m.mask_mod, *dims, query.device)
    elif mask is not None:
        mask = _dense_mask.expand("flex_attention", mask, *dims)
    if mask is not None and m is None:
        lists = _dense_mask.block_lists(mask, block_q, block_k)
        check_device_indices = False
    docs_q, docs_k = _documents(fn, document_ids)
    for x in (docs_q, docs_k):
        if x is not None and not is_torch(x):
            raise TypeError(f"tileattn.flex_attention: document_ids holds a {type(x).__name__}, expected an int32 "
                            "torch.Tensor [batch, seq] (or a pair of them, queries' and keys')")
    prefix, prefix_lens = _prefix(fn, prefix_len)
    left, right = _checks.window(fn, window_size, causal)
    out, lse = _torch_ops.flex(
        q, k, v, *lists, docs_q, docs_k, prefix_lens, mask, int(block_q), int(block_k), alibi_slopes,
        None if scale is None else _checks.number(fn, "scale", scale), bool(causal), bool(top_left), left, right,
        _checks.integer(fn, "chunk_size", chunk_size), prefix, _checks.number(fn, "softcap", softcap), _config.backend,
        bool(check_device_indices))
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput
        return out, AuxOutput(lse=lse if return_aux.lse else None)
    return (out, lse) if return_lse else out


def _check_aux_request(request, return_lse):
    """return_aux: None, or an AuxRequest for the LSE alone."""
    if request is None:
        return
    if return_lse:
        raise ValueError("tileattn.flex_attention: return_lse and return_aux are both set; pass one")
    if not hasattr(request, "lse") or not hasattr(request, "max_scores"):
        raise TypeError(f"tileattn.flex_attention: return_aux is a {type(request).__name__}, expected a "
                        "torch.nn.attention.flex_attention.AuxRequest")
    if request.max_scores:
        raise ValueError("tileattn.flex_attention: return_aux asks for max_scores, which tileattn does not compute "
                         "(lse only)")
