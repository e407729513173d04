"""GPU block masks whose values the core has checked, so that a mask used again skips the check.

Checking a device-resident block mask's counts and indices copies them to the host: one
synchronization per call, which a training loop reusing one BlockMask for every layer and step pays
for nothing after the first. The first call with a mask checks it (bad values raise the core's
error naming the list and the entry); once that call has passed, the mask is remembered by its
tensors' identities and version counters together with the sizes its values were checked against,
and later calls with the same mask run with the device check off. A mask written in place bumps a
version counter and is checked again; so is one used with other sequence lengths, block sizes or
element rule. A mask found to add nothing to its rule (_implied_masks) is then left out of the
calls altogether.
Writes that bypass PyTorch (another library writing the memory through DLPack) are not seen.
"""

import weakref

_LIMIT = 256  # masks remembered at once; past it the record starts afresh

# id(kv_num_blocks) -> (weak references to the four lists, their versions, the sizes checked against,
# whether the mask adds nothing to its call's element rule: _implied_masks)
_checked = {}


def _state(lists):
    """The tensors' version counters, or None where one has none (an inference-mode tensor: such
    masks are checked at every use)."""
    try:
        return tuple(None if t is None else t._version for t in lists)
    except RuntimeError:
        return None


def seen(lists, sizes):
    """Whether lists (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices; the full
    pair may be None; then the document ids of the call, or None) passed the check against sizes
    and are unchanged since."""
    entry = _checked.get(id(lists[0]))
    if entry is None:
        return False
    refs, versions, checked_sizes, _ = entry
    state = _state(lists)
    if state is None or checked_sizes != sizes or versions != state:
        return False
    return all((r is None and t is None) or (r is not None and r() is t) for r, t in zip(refs, lists))


def remember(lists, sizes, implied=False):
    """Records lists as checked against sizes (called after a call that checked them passed), and
    whether they add nothing to the call's element rule."""
    state = _state(lists)
    if state is None:
        return
    if len(_checked) >= _LIMIT:
        _checked.clear()
    refs = tuple(None if t is None else weakref.ref(t) for t in lists)
    _checked[id(lists[0])] = (refs, state, sizes, implied)


def implied(lists):
    """Whether remembered lists (seen) add nothing to their call's element rule."""
    return _checked[id(lists[0])][3]
