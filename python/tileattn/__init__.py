"""tileattn: exact, IO-aware attention (FlashAttention) for CPUs and NVIDIA GPUs.

- flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func, flash_attn_varlen_func (and its
  packed variants), flash_attn_with_kvcache: flash_attn's functions, for PyTorch tensors (with autograd
  and torch.compile) and NumPy/CuPy arrays (forward).
- scaled_dot_product_attention: torch.nn.functional's signature on [batch, heads, seq, dim] tensors.
- flex_attention: block-sparse attention with PyTorch FlexAttention's BlockMask (autograd, torch.compile);
  block_sparse_forward / block_sparse_backward: the same for any arrays.
- forward, backward, decode, combine: the C++ entry points with allocated outputs, for NumPy, PyTorch
  and CuPy arrays; tileattn._C has them with caller-allocated outputs for any DLPack array.
- Error: raised for bad input with the core's message (a ValueError and a RuntimeError).
- build_info(): version, CUDA (built, architectures), the CPU features in use.
- TILEATTN_LOG=1 in the environment: one line on standard error per call saying which path it took.
"""

import sys

from . import _C
from ._C import Backend, Error, MaskAlign, MemoryStats, Options, build_info, memory_stats, num_threads, \
    reset_peak_memory
from ._config import set_num_threads, use_backend
from ._flash_api import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, \
    flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, \
    flash_attn_with_kvcache
from ._flex import block_sparse_backward, block_sparse_forward, flex_attention
from ._functional import backward, combine, decode, forward
from ._sdpa import scaled_dot_product_attention

__version__ = _C.__version__

# The custom ops must exist before torch.compile traces a first call; register them now when PyTorch is
# already loaded, and otherwise at the first call with a tensor (importing torch here would slow every
# NumPy user's import).
if "torch" in sys.modules:
    _flash_api._torch_ops()

__all__ = [
    "Backend", "Error", "MaskAlign", "MemoryStats", "Options", "backward", "build_info", "combine", "decode",
    "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache", "forward",
    "memory_stats", "num_threads", "reset_peak_memory", "scaled_dot_product_attention", "set_num_threads",
    "use_backend",
]
__all__ += ["block_sparse_backward", "block_sparse_forward", "flex_attention"]
