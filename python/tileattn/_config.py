"""The backend the high-level functions use when a call names none.

A plain module attribute rather than a context variable: torch.compile reads (and guards on) module
attributes without a graph break.
"""

import contextlib

from . import _C, _checks

backend = "auto"


@contextlib.contextmanager
def use_backend(name):
    """Runs the enclosed calls of the flash_attn-style functions and scaled_dot_product_attention
    on one backend: 'auto' (the tensors' device decides), 'cpu_flash', 'cpu_reference' or 'cuda'."""
    global backend
    saved, backend = backend, name
    try:
        yield
    finally:
        backend = saved


def set_num_threads(n):
    """The CPU backend's threads (its persistent pool): n >= 1, or 0 for the hardware concurrency."""
    _C.set_num_threads(_checks.integer("set_num_threads", "n", n, 0))
