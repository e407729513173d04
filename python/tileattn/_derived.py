"""Values computed from a tensor's contents, remembered for as long as the tensor lives and is not
written: a mask passed to every layer and every step (as transformers passes its 4D mask, or a
training loop its SDPA attn_mask) is then read once, not once per call, and the device
synchronizations its checks take (a bool read back to the host) happen once.

An entry is keyed by the tensor a view was made from (the view made anew per call, but its root the
same), the view's geometry and what was computed, and holds the root's version counter: a write
through PyTorch bumps it and the value is computed again. Writes that bypass PyTorch (another library
writing the memory through DLPack) are not seen. An entry goes when its root is freed; the values
(derived masks, block lists) live that long, so a value must not hold the tensor itself (a view of it
would keep it, and the entry with it, for good). Traced calls (torch.compile) and inference-mode
tensors, which have no version counter, compute every time.
"""

import weakref

_memo = {}  # (id(root), geometry, what) -> (weak reference to the root, its version, value)


def derived(t, what, compute):
    """compute(), or the value remembered for (t, what) while t's root tensor is unchanged. what: a
    hashable naming the computation and its parameters."""
    import torch
    if torch.compiler.is_compiling():
        return compute()
    root = t if t._base is None else t._base
    try:
        version = root._version
    except RuntimeError:  # an inference tensor
        return compute()
    key = (id(root), tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, what)
    entry = _memo.get(key)
    if entry is not None and entry[0]() is root and entry[1] == version:
        return entry[2]
    value = compute()
    _memo[key] = (weakref.ref(root, lambda _, key=key: _memo.pop(key, None)), version, value)
    return value
