"""The installed package as a user gets it: where it was imported from, its version, its type stubs,
what its module needs at run time, and one call.

scripts/python_tests.sh runs the suite against the wheel that scripts/build_wheels.sh built; the
run-time checks of the module's libraries apply to such a (manylinux-tagged) wheel.
"""

import ast
import importlib.metadata
import inspect
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import tileattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.dirname(tileattn.__file__)
# What a portable wheel's module may need: the C runtime and the dynamic loader (libstdc++ and libgcc
# are linked in, as is Highway).
RUNTIME = re.compile(r"^(libc|libm|libdl|libpthread|librt|ld-linux[-\w]*)\.so(\.\d+)*$")


def wheel_tags():
    try:
        text = importlib.metadata.distribution("tileattn").read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return []
    return re.findall(r"^Tag: (\S+)$", text, re.M)


def module_path():
    return tileattn._C.__file__


def test_imported_from_the_installed_package_not_the_source_tree():
    assert not os.path.realpath(PACKAGE).startswith(os.path.join(ROOT, "python") + os.sep), PACKAGE


def test_version_is_the_headers():
    header = open(os.path.join(ROOT, "include", "tileattn", "version.hpp")).read()
    want = re.search(r'#define TILEATTN_VERSION_STRING "([0-9.]+)"', header).group(1)
    assert tileattn.__version__ == want
    if wheel_tags():
        assert importlib.metadata.version("tileattn") == want


def test_ships_py_typed_and_stubs():
    for name in ("py.typed", "__init__.pyi", "_C.pyi"):
        assert os.path.isfile(os.path.join(PACKAGE, name)), name


def test_stubs_name_every_public_function_with_its_parameters():
    stub = ast.parse(open(os.path.join(PACKAGE, "__init__.pyi")).read())
    functions, names = {}, set()
    for node in stub.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    assert sorted(set(tileattn.__all__) - names) == []
    for name, node in functions.items():
        a = node.args
        stubbed = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
        stubbed += [f"*{a.vararg.arg}"] if a.vararg else []
        stubbed += [f"**{a.kwarg.arg}"] if a.kwarg else []
        params = inspect.signature(getattr(tileattn, name)).parameters.values()
        actual = [("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else "") + p.name
                  for p in params]
        assert sorted(stubbed) == sorted(actual), name


def test_wheel_module_needs_only_the_c_runtime():
    tags = wheel_tags()
    if not any("manylinux" in t for t in tags):
        pytest.skip(f"not installed from a release-style wheel (tags {tags})")
    if shutil.which("readelf") is None:
        pytest.skip("readelf not found")
    dynamic = subprocess.run(["readelf", "-d", module_path()], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", dynamic)
    assert needed and [n for n in needed if not RUNTIME.match(n)] == [], needed
    if any("abi3" in t for t in tags):
        assert module_path().endswith(".abi3.so"), module_path()


def test_a_call_matches_numpy():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, n, 2, 16)).astype(np.float32) for n in (5, 7, 7))
    out, lse = tileattn.forward(q, k, v, backend="cpu_flash")
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(16)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-5, atol=1e-5)
