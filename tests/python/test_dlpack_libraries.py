"""Arrays of other DLPack libraries: CuPy through the high-level functions, JAX (read-only) through the
native module. Skipped where the library (or a GPU for CuPy) is absent."""

import numpy as np
import pytest

import tileattn
from conftest import CPU_BACKENDS
from reference import assert_f32_close, attention


def test_cupy_forward():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"no usable CUDA device: {e}")
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 33, 4, 64)).astype(np.float16) for _ in range(3))
    out, lse, _ = tileattn.flash_attn_func(*(cupy.asarray(x) for x in (q, k, v)), causal=True,
                                           return_attn_probs=True)
    assert isinstance(out, cupy.ndarray) and out.dtype == np.float16 and lse.shape == (2, 4, 33)
    ref = attention(q, k, v, causal=True)[0]
    assert np.max(np.abs(cupy.asnumpy(out).astype(np.float64) - ref)) < 1e-2


def test_jax_inputs_read_only():
    jnp = pytest.importorskip("jax.numpy")
    import jax
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 7, 2, 16)).astype(np.float32) for _ in range(3))
    cpu = jax.devices("cpu")[0]
    jq, jk, jv = (jax.device_put(jnp.asarray(x), cpu) for x in (q, k, v))
    out = np.empty_like(q)
    options = tileattn.Options(backend=getattr(tileattn.Backend, CPU_BACKENDS["forward"]))
    tileattn._C.forward(jq, jk, jv, out, options=options)
    assert_f32_close(out, attention(q, k, v)[0])
