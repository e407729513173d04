# Type stubs for tileattn's public functions (PEP 561; the package ships py.typed). The extension
# module's own stubs (_C.pyi) are generated from it at build time. Arrays are NumPy arrays, PyTorch
# tensors or any DLPack array, so they are typed Any. tests/python/test_install.py checks that this
# file names every entry of __all__ with the implementation's parameters.
from contextlib import AbstractContextManager
from typing import Any, Literal, Optional, Tuple, Union, overload

from ._C import Backend as Backend
from ._C import MaskAlign as MaskAlign
from ._C import MemoryStats as MemoryStats
from ._C import build_info as build_info
from ._C import Options as Options
from ._C import memory_stats as memory_stats
from ._C import num_threads as num_threads
from ._C import reset_peak_memory as reset_peak_memory

_Array = Any
_BackendName = Literal["auto", "cpu_flash", "cpu_reference", "cuda"]
_Window = Tuple[int, int]

__version__: str

# Raised for bad input with the core's message naming the argument and the values.
class Error(ValueError, RuntimeError): ...
__all__: list[str]

def use_backend(name: _BackendName) -> AbstractContextManager[None]: ...
# The CPU backend's threads: n >= 1, or 0 for the hardware concurrency.
def set_num_threads(n: int) -> None: ...

# flash_attn's functions: out, or (out, softmax_lse, None) with return_attn_probs=True.
@overload
def flash_attn_func(q: _Array, k: _Array, v: _Array, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                    causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                    alibi_slopes: Optional[_Array] = ..., deterministic: bool = ...,
                    return_attn_probs: Literal[False] = ...) -> _Array: ...
@overload
def flash_attn_func(q: _Array, k: _Array, v: _Array, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                    causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                    alibi_slopes: Optional[_Array] = ..., deterministic: bool = ...,
                    *, return_attn_probs: Literal[True]) -> Tuple[_Array, _Array, None]: ...
def flash_attn_qkvpacked_func(qkv: _Array, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                              causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                              alibi_slopes: Optional[_Array] = ..., deterministic: bool = ...,
                              return_attn_probs: bool = ...) -> Union[_Array, Tuple[_Array, _Array, None]]: ...
def flash_attn_kvpacked_func(q: _Array, kv: _Array, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                             causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                             alibi_slopes: Optional[_Array] = ..., deterministic: bool = ...,
                             return_attn_probs: bool = ...) -> Union[_Array, Tuple[_Array, _Array, None]]: ...
def flash_attn_varlen_func(q: _Array, k: _Array, v: _Array, cu_seqlens_q: _Array, cu_seqlens_k: _Array,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = ...,
                           softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: _Window = ...,
                           softcap: float = ..., alibi_slopes: Optional[_Array] = ..., deterministic: bool = ...,
                           return_attn_probs: bool = ...,
                           block_table: Optional[_Array] = ...) -> Union[_Array, Tuple[_Array, _Array, None]]: ...
def flash_attn_varlen_qkvpacked_func(qkv: _Array, cu_seqlens: _Array, max_seqlen: int, dropout_p: float = ...,
                                     softmax_scale: Optional[float] = ..., causal: bool = ...,
                                     window_size: _Window = ..., softcap: float = ...,
                                     alibi_slopes: Optional[_Array] = ..., deterministic: bool = ...,
                                     return_attn_probs: bool = ...) -> Union[_Array, Tuple[_Array, _Array, None]]: ...
def flash_attn_varlen_kvpacked_func(q: _Array, kv: _Array, cu_seqlens_q: _Array, cu_seqlens_k: _Array,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = ...,
                                    softmax_scale: Optional[float] = ..., causal: bool = ...,
                                    window_size: _Window = ..., softcap: float = ...,
                                    alibi_slopes: Optional[_Array] = ..., deterministic: bool = ...,
                                    return_attn_probs: bool = ...) -> Union[_Array, Tuple[_Array, _Array, None]]: ...
# out, or (out, softmax_lse) with return_softmax_lse=True.
def flash_attn_with_kvcache(q: _Array, k_cache: _Array, v_cache: _Array, k: Optional[_Array] = ...,
                            v: Optional[_Array] = ..., rotary_cos: Optional[_Array] = ...,
                            rotary_sin: Optional[_Array] = ..., cache_seqlens: Union[_Array, int, None] = ...,
                            cache_batch_idx: Optional[_Array] = ..., cache_leftpad: Optional[_Array] = ...,
                            block_table: Optional[_Array] = ..., softmax_scale: Optional[float] = ...,
                            causal: bool = ..., window_size: _Window = ..., softcap: float = ...,
                            rotary_interleaved: bool = ..., alibi_slopes: Optional[_Array] = ...,
                            num_splits: int = ..., return_softmax_lse: bool = ...,
                            check_device_indices: bool = ...) -> Union[_Array, Tuple[_Array, _Array]]: ...

# torch.nn.functional's signature on [batch, heads, seq, dim] tensors.
def scaled_dot_product_attention(query: _Array, key: _Array, value: _Array, attn_mask: Optional[_Array] = ...,
                                 dropout_p: float = ..., is_causal: bool = ..., scale: Optional[float] = ...,
                                 enable_gqa: bool = ...) -> _Array: ...

# The C++ entry points with allocated outputs; keyword options as tileattn.Options' fields
# (scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed, offset,
# deterministic, backend, num_splits, sm_margin, check_device_indices, alibi_diagonal).
def forward(q: _Array, k: _Array, v: _Array, *, cu_seqlens_q: Optional[_Array] = ...,
            cu_seqlens_k: Optional[_Array] = ..., max_seqlen_q: int = ..., max_seqlen_k: int = ...,
            alibi_slopes: Optional[_Array] = ..., **opts: Any) -> Tuple[_Array, Optional[_Array]]: ...
def backward(dout: _Array, q: _Array, k: _Array, v: _Array, out: _Array, lse: _Array, *,
             cu_seqlens_q: Optional[_Array] = ..., cu_seqlens_k: Optional[_Array] = ..., max_seqlen_q: int = ...,
             max_seqlen_k: int = ..., alibi_slopes: Optional[_Array] = ...,
             **opts: Any) -> Tuple[_Array, _Array, _Array]: ...
def decode(q: _Array, k_cache: _Array, v_cache: _Array, *, k_new: Optional[_Array] = ..., v_new: Optional[_Array] = ...,
           cache_seqlens: Optional[_Array] = ..., page_table: Optional[_Array] = ...,
           rotary_cos: Optional[_Array] = ..., rotary_sin: Optional[_Array] = ..., rotary_interleaved: bool = ...,
           alibi_slopes: Optional[_Array] = ..., **opts: Any) -> Tuple[_Array, Optional[_Array]]: ...
def combine(out_partial: _Array, lse_partial: _Array, *, out: Optional[_Array] = ...,
            backend: _BackendName = ...) -> Tuple[_Array, Optional[_Array]]: ...

# Block-sparse attention (FlexAttention's BlockMask or its tensors); the cuda backend takes block
# sizes that are multiples of 128.
def flex_attention(query: Any, key: Any, value: Any, score_mod: Any = ..., block_mask: Any = ..., scale: Any = ...,
                   enable_gqa: Any = ..., return_lse: Any = ..., kernel_options: Any = ..., *, return_aux: Any = ...,
                   causal: Any = ..., window_size: Any = ...,
                   chunk_size: Any = ..., document_ids: Any = ..., prefix_len: Any = ..., top_left: Any = ...,
                   softcap: Any = ..., alibi_slopes: Any = ..., mask: Any = ...,
                   check_device_indices: Any = ...) -> Any: ...
def block_sparse_forward(q: Any, k: Any, v: Any, kv_num_blocks: Any = ..., kv_indices: Any = ...,
                         full_kv_num_blocks: Any = ..., full_kv_indices: Any = ..., *, block_size: Any = ...,
                         cu_seqlens_q: Any = ..., cu_seqlens_k: Any = ..., max_seqlen_q: Any = ...,
                         max_seqlen_k: Any = ..., alibi_slopes: Any = ..., chunk_size: Any = ...,
                         document_ids: Any = ..., prefix_len: Any = ..., mask: Any = ..., **opts: Any) -> Any: ...
def block_sparse_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, kv_num_blocks: Any = ...,
                          kv_indices: Any = ..., full_kv_num_blocks: Any = ..., full_kv_indices: Any = ..., *,
                          block_size: Any = ..., cu_seqlens_q: Any = ..., cu_seqlens_k: Any = ...,
                          max_seqlen_q: Any = ..., max_seqlen_k: Any = ..., alibi_slopes: Any = ...,
                          chunk_size: Any = ..., document_ids: Any = ..., prefix_len: Any = ..., mask: Any = ...,
                          **opts: Any) -> Any: ...
