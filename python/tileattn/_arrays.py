"""Allocation and streams for the array libraries the Python functions serve: NumPy, PyTorch, CuPy.

The native module reads any DLPack array; the functions above it allocate their outputs here, in the
library and on the device of their inputs, so a call returns what it was given.
"""

from . import _C

_LIBRARIES = ("numpy", "torch", "cupy")


def library(x):
    """'numpy', 'torch' or 'cupy': the library an array belongs to."""
    root = type(x).__module__.partition(".")[0]
    if root not in _LIBRARIES:
        raise TypeError(
            f"tileattn: {type(x).__module__}.{type(x).__qualname__} arrays are not supported here; pass "
            "NumPy, PyTorch or CuPy arrays (the functions of tileattn._C take any DLPack array)")
    return root


def is_torch(x):
    return type(x).__module__.partition(".")[0] == "torch"


def empty(like, shape, dtype=None):
    """An uninitialized array in like's library and on its device; dtype None = like's, or
    'float32', 'int32', 'uint8'."""
    lib = library(like)
    shape = tuple(int(s) for s in shape)
    if lib == "numpy":
        import numpy as np
        return np.empty(shape, dtype=like.dtype if dtype is None else np.dtype(dtype))
    if lib == "torch":
        import torch
        return torch.empty(shape, dtype=like.dtype if dtype is None else getattr(torch, dtype), device=like.device)
    import cupy
    with like.device:
        return cupy.empty(shape, dtype=like.dtype if dtype is None else cupy.dtype(dtype))


def native(x):
    """x as the native module reads it: NumPy bfloat16 arrays (ml_dtypes), which NumPy cannot export,
    as their uint16 bits relabeled bfloat16; anything else unchanged."""
    if type(x).__module__ == "numpy" and x.dtype.name == "bfloat16":
        import numpy as np
        return _C.bf16_alias(x.view(np.uint16))
    return x


def full_int32(like, shape, value):
    out = empty(like, shape, "int32")
    out[...] = value
    return out


def on_cuda(x):
    lib = library(x)
    if lib == "torch":
        return x.device.type == "cuda"
    return lib == "cupy"


def current_stream(x):
    """The cudaStream_t (as an int) work on x is ordered on: PyTorch's or CuPy's current stream."""
    lib = library(x)
    if lib == "torch" and x.device.type == "cuda":
        import torch
        return torch.cuda.current_stream(x.device).cuda_stream
    if lib == "cupy":
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0


def contiguous_last(x):
    """x, or a copy of it when its last dimension is strided (flash_attn's convention)."""
    if x is None or x.ndim == 0 or x.shape[-1] <= 1:
        return x
    itemsize = x.element_size() if is_torch(x) else x.itemsize
    last_stride = x.stride(-1) if is_torch(x) else x.strides[-1] // itemsize
    if last_stride == 1:
        return x
    if is_torch(x):
        return x.contiguous()
    lib = library(x)
    if lib == "numpy":
        import numpy as np
        return np.ascontiguousarray(x)
    import cupy
    return cupy.ascontiguousarray(x)
