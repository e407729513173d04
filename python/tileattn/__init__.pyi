# Type stubs for tileattn's public functions (PEP 561; the package ships py.typed). The extension
# module's own stubs (_C.pyi) are generated from it at build time. Arrays are NumPy arrays, PyTorch
# tensors or any DLPack array, so they are typed Any. tests/python/test_install.py checks that this
# file names every entry of __all__ with the implementation's parameters.
from contextlib import AbstractContextManager
from typing import Any, Literal, Optional, Tuple, Union, overload

from ._C import Backend as Backend
from ._C import MaskAlign as MaskAlign
from ._C import MemoryStats as MemoryStats
from ._C import Options as Options
from ._C import memory_stats as memory_stats
from ._C import num_threads as num_threads
from ._C import reset_peak_memory as reset_peak_memory
from ._C import set_num_threads as set_num_threads

Array = Any
BackendName = Literal["auto", "cpu_flash", "cpu_reference", "cuda"]
Window = Tuple[int, int]

__version__: str

# Raised for bad input with the core's message naming the argument and the values.
class Error(ValueError, RuntimeError): ...
__all__: list[str]

def use_backend(name: BackendName) -> AbstractContextManager[None]: ...

# flash_attn's functions: out, or (out, softmax_lse, None) with return_attn_probs=True.
@overload
def flash_attn_func(q: Array, k: Array, v: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                    causal: bool = ..., window_size: Window = ..., softcap: float = ...,
                    alibi_slopes: Optional[Array] = ..., deterministic: bool = ...,
                    return_attn_probs: Literal[False] = ...) -> Array: ...
@overload
def flash_attn_func(q: Array, k: Array, v: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                    causal: bool = ..., window_size: Window = ..., softcap: float = ...,
                    alibi_slopes: Optional[Array] = ..., deterministic: bool = ...,
                    *, return_attn_probs: Literal[True]) -> Tuple[Array, Array, None]: ...
def flash_attn_qkvpacked_func(qkv: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                              causal: bool = ..., window_size: Window = ..., softcap: float = ...,
                              alibi_slopes: Optional[Array] = ..., deterministic: bool = ...,
                              return_attn_probs: bool = ...) -> Union[Array, Tuple[Array, Array, None]]: ...
def flash_attn_kvpacked_func(q: Array, kv: Array, dropout_p: float = ..., softmax_scale: Optional[float] = ...,
                             causal: bool = ..., window_size: Window = ..., softcap: float = ...,
                             alibi_slopes: Optional[Array] = ..., deterministic: bool = ...,
                             return_attn_probs: bool = ...) -> Union[Array, Tuple[Array, Array, None]]: ...
def flash_attn_varlen_func(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = ...,
                           softmax_scale: Optional[float] = ..., causal: bool = ..., window_size: Window = ...,
                           softcap: float = ..., alibi_slopes: Optional[Array] = ..., deterministic: bool = ...,
                           return_attn_probs: bool = ...,
                           block_table: Optional[Array] = ...) -> Union[Array, Tuple[Array, Array, None]]: ...
def flash_attn_varlen_qkvpacked_func(qkv: Array, cu_seqlens: Array, max_seqlen: int, dropout_p: float = ...,
                                     softmax_scale: Optional[float] = ..., causal: bool = ...,
                                     window_size: Window = ..., softcap: float = ...,
                                     alibi_slopes: Optional[Array] = ..., deterministic: bool = ...,
                                     return_attn_probs: bool = ...) -> Union[Array, Tuple[Array, Array, None]]: ...
def flash_attn_varlen_kvpacked_func(q: Array, kv: Array, cu_seqlens_q: Array, cu_seqlens_k: Array,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = ...,
                                    softmax_scale: Optional[float] = ..., causal: bool = ...,
                                    window_size: Window = ..., softcap: float = ...,
                                    alibi_slopes: Optional[Array] = ..., deterministic: bool = ...,
                                    return_attn_probs: bool = ...) -> Union[Array, Tuple[Array, Array, None]]: ...
# out, or (out, softmax_lse) with return_softmax_lse=True.
def flash_attn_with_kvcache(q: Array, k_cache: Array, v_cache: Array, k: Optional[Array] = ...,
                            v: Optional[Array] = ..., rotary_cos: Optional[Array] = ...,
                            rotary_sin: Optional[Array] = ..., cache_seqlens: Union[Array, int, None] = ...,
                            cache_batch_idx: Optional[Array] = ..., cache_leftpad: Optional[Array] = ...,
                            block_table: Optional[Array] = ..., softmax_scale: Optional[float] = ...,
                            causal: bool = ..., window_size: Window = ..., softcap: float = ...,
                            rotary_interleaved: bool = ..., alibi_slopes: Optional[Array] = ...,
                            num_splits: int = ..., return_softmax_lse: bool = ...,
                            check_device_indices: bool = ...) -> Union[Array, Tuple[Array, Array]]: ...

# torch.nn.functional's signature on [batch, heads, seq, dim] tensors.
def scaled_dot_product_attention(query: Array, key: Array, value: Array, attn_mask: Optional[Array] = ...,
                                 dropout_p: float = ..., is_causal: bool = ..., scale: Optional[float] = ...,
                                 enable_gqa: bool = ...) -> Array: ...

# The C++ entry points with allocated outputs; keyword options as tileattn.Options' fields
# (scale, causal, top_left, window_left, window_right, softcap, dropout_p, seed, offset,
# deterministic, backend, num_splits, check_device_indices).
def forward(q: Array, k: Array, v: Array, *, cu_seqlens_q: Optional[Array] = ...,
            cu_seqlens_k: Optional[Array] = ..., max_seqlen_q: int = ..., max_seqlen_k: int = ...,
            alibi_slopes: Optional[Array] = ..., **opts: Any) -> Tuple[Array, Optional[Array]]: ...
def backward(dout: Array, q: Array, k: Array, v: Array, out: Array, lse: Array, *,
             cu_seqlens_q: Optional[Array] = ..., cu_seqlens_k: Optional[Array] = ..., max_seqlen_q: int = ...,
             max_seqlen_k: int = ..., alibi_slopes: Optional[Array] = ...,
             **opts: Any) -> Tuple[Array, Array, Array]: ...
def decode(q: Array, k_cache: Array, v_cache: Array, *, k_new: Optional[Array] = ..., v_new: Optional[Array] = ...,
           cache_seqlens: Optional[Array] = ..., page_table: Optional[Array] = ...,
           rotary_cos: Optional[Array] = ..., rotary_sin: Optional[Array] = ..., rotary_interleaved: bool = ...,
           alibi_slopes: Optional[Array] = ..., **opts: Any) -> Tuple[Array, Optional[Array]]: ...
def combine(out_partial: Array, lse_partial: Array, *, out: Optional[Array] = ...,
            backend: BackendName = ...) -> Tuple[Array, Optional[Array]]: ...
