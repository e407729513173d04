"""The Python layer's own argument checks: what must hold before an argument can cross into the
native module at all (a Python type, an int range), so that a bad argument gets tileattn.Error or a
TypeError naming it rather than an AttributeError or nanobind's "incompatible function arguments".
Everything else (shapes, strides, dtypes, devices, values) is the core's to check.
"""

import operator

from . import _C

INT_MIN, INT_MAX = -2**31, 2**31 - 1
_ARRAY_LIBRARIES = ("numpy", "torch", "cupy")


def array(fn, name, x, optional=False):
    """x itself when it is a NumPy, PyTorch or CuPy array (or None where optional)."""
    if x is None and optional:
        return x
    module = type(x).__module__
    if module in _ARRAY_LIBRARIES:  # torch.Tensor, numpy.ndarray, cupy.ndarray: the common case, quickly
        return x
    if module.partition(".")[0] not in _ARRAY_LIBRARIES or not hasattr(x, "shape"):
        raise TypeError(f"tileattn.{fn}: {name} is a {type(x).__module__}.{type(x).__qualname__}; expected a "
                        "NumPy, PyTorch or CuPy array")
    return x


def torch_tensors(fn, **named):
    """Each named optional argument of a PyTorch call: None or a torch.Tensor. The custom ops take
    tensors only, and a NumPy array there would fail in the dispatcher with the op's whole schema."""
    for name, x in named.items():
        if x is None or type(x).__module__ == "torch":  # None, or a plain tensor: the common case, quickly
            continue
        import torch
        if not isinstance(x, torch.Tensor):
            array(fn, name, x)
            raise TypeError(f"tileattn.{fn}: {name} is a {type(x).__module__}.{type(x).__qualname__}, but q is a "
                            "PyTorch tensor; pass every array argument as a torch.Tensor")


def not_differentiated(fn, name, x):
    """Refuses a tensor argument that requires grad where autograd records: tileattn differentiates
    q, k and v only, so its gradient (learned ALiBi slopes, say) would be silently missing."""
    if x is not None and getattr(x, "requires_grad", False):
        import torch
        if torch.is_grad_enabled():
            raise _C.Error(f"tileattn.{fn}: {name} requires grad; tileattn differentiates q, k and v only (pass "
                           f"{name}.detach())")


def integer(fn, name, value, lo=INT_MIN, hi=INT_MAX):
    """value as a Python int in [lo, hi]. Python and NumPy integers (and 0-d integer tensors) pass;
    floats and bools do not, even when whole."""
    if type(value) is int and lo <= value <= hi:
        return value
    if type(value).__name__ == "SymInt":  # a traced length under torch.compile: checked when it runs
        return value
    if isinstance(value, (bool, float)):
        raise TypeError(f"tileattn.{fn}: {name} = {value!r} is a {type(value).__name__}, expected an int")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"tileattn.{fn}: {name} = {value!r} is a {type(value).__name__}, expected an int") from None
    if not lo <= v <= hi:
        raise _C.Error(f"tileattn.{fn}: {name} = {v} is outside [{lo}, {hi}]")
    return v


def number(fn, name, value):
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"tileattn.{fn}: {name} = {value!r} is a {type(value).__name__}, expected a number")
    return float(value)


def window(fn, window_size, causal):
    """(left, right) from flash_attn's window_size, where causal means a right window of 0 whatever
    window_size[1] says; -1 = unbounded."""
    try:
        n = len(window_size)
    except TypeError:
        n = None
    if n != 2:
        raise TypeError(f"tileattn.{fn}: window_size = {window_size!r}, expected a pair (left, right)")
    left = integer(fn, "window_size[0]", window_size[0])
    right = integer(fn, "window_size[1]", window_size[1])
    return left, (-1 if causal else right)


def scale(fn, softmax_scale):
    return None if softmax_scale is None else number(fn, "softmax_scale", softmax_scale)
