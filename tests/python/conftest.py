import os
import re
import secrets
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # reference.py

import tileattn  # noqa: E402

# A backend that is declared but not written yet says so; tests then use the next one down.
UNSUPPORTED = re.compile(r"not built yet|does not support .* yet")


def _probe(call):
    try:
        call()
        return True
    except tileattn.Error as e:
        if UNSUPPORTED.search(str(e)):
            return False
        raise


def _cpu_backends():
    """The CPU backend each entry point is tested on: cpu_flash where it exists, else the fp64 reference."""
    q = np.zeros((1, 2, 1, 8), np.float32)
    out, lse = tileattn.forward(q, q, q, backend="cpu_reference")
    calls = {
        "forward": lambda b: tileattn.forward(q, q, q, backend=b),
        "backward": lambda b: tileattn.backward(q, q, q, q, out, lse, backend=b),
        "decode": lambda b: tileattn.decode(q, q.copy(), q.copy(), backend=b),
    }
    return {name: "cpu_flash" if _probe(lambda: call("cpu_flash")) else "cpu_reference"
            for name, call in calls.items()}


CPU_BACKENDS = _cpu_backends()


def pytest_report_header(config):
    return f"tileattn {tileattn.__version__}, CPU backends under test: {CPU_BACKENDS}"


@pytest.fixture
def rng():
    """Fresh inputs every run; the seed is printed with a failure (TILEATTN_TEST_SEED replays one)."""
    seed = int(os.environ.get("TILEATTN_TEST_SEED", secrets.randbits(63)))
    print(f"TILEATTN_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def count_calls(monkeypatch):
    """count_calls({name: (module, function name)}) replaces each function with one that counts its calls
    and returns the counts, a dict by name (restored after the test)."""
    def install(targets):
        calls = dict.fromkeys(targets, 0)
        for name, (module, attr) in targets.items():
            fn = getattr(module, attr)

            def counted(*a, name=name, fn=fn, **kw):
                calls[name] += 1
                return fn(*a, **kw)
            monkeypatch.setattr(module, attr, counted)
        return calls
    return install
