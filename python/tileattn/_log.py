"""TILEATTN_LOG: one line on standard error per native call, saying which path it took.

    TILEATTN_LOG=1 python train.py

Each line names the entry point, the backend that ran it (the automatic choice resolved: cuda for
GPU tensors, cpu_flash otherwise), the dtype and shapes, the mask and layout features that select a
kernel variant (causal, window, varlen, paged, dropout, softcap, top-left alignment; block-sparse,
document ids, a dense mask), and what the
Python layer did on the way (head dim padded to a multiple of 8, a key-padding mask run as a
variable-length batch, a paged varlen batch gathered, ...). Read once at import; set_enabled()
switches it at run time.
"""

import os
import sys

enabled = os.environ.get("TILEATTN_LOG", "") not in ("", "0")
_notes = []


def set_enabled(on=True):
    global enabled
    enabled = bool(on)


def note(text):
    """Something the Python layer did to the call about to run (reported with it)."""
    if enabled:
        _notes.append(text)


def _backend(o, device_type):
    name = o.backend.name
    if name == "automatic":
        return "cuda" if device_type in ("cuda", 2) else "cpu_flash"
    return name


def _shape(x):
    return "x".join(str(int(s)) for s in x.shape)


def block_sparse(blocks, documents, dense_mask):
    """A block-sparse call's (feature, on) pairs for call()."""
    return ("block-sparse", blocks), ("documents", documents), ("dense-mask", dense_mask)


def call(entry, q, k, indexed, o, *more):
    """more: further (feature, on) pairs of the call."""
    device = q.device.type if hasattr(q, "device") and hasattr(q.device, "type") else "cpu"
    dtype = str(q.dtype).replace("torch.", "")
    feats = [f for f, on in (("causal", o.causal), ("window", o.window_left >= 0 or o.window_right >= 0),
                             ("paged" if entry == "decode" else "varlen", indexed), ("dropout", o.dropout_p > 0),
                             ("softcap", o.softcap > 0), ("top_left", o.align.name == "top_left")) + more if on]
    line = (f"tileattn: {entry} backend={_backend(o, device)} device={device} dtype={dtype} "
            f"q={_shape(q)} k={_shape(k)} {' '.join(feats) or 'dense'}")
    if _notes:
        line += " [" + "; ".join(_notes) + "]"
        _notes.clear()
    sys.stderr.write(line + "\n")
