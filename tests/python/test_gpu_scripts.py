"""The GPU check's helpers that run without a GPU."""
import os
import subprocess
import sys

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu")


def _source_times(*args):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, "source_times.py"), *args], check=True,
                          capture_output=True, text=True, timeout=60)


def test_source_times_gives_unchanged_files_their_build_times(tmp_path):
    tree, record = tmp_path / "tree", str(tmp_path / "record.txt")
    (tree / "src").mkdir(parents=True)
    (tree / "build-gpu").mkdir()
    for name, text in (("src/a.cpp", "a"), ("src/b.cpp", "b"), ("CMakeLists.txt", "c"), ("build-gpu/x.o", "o")):
        (tree / name).write_text(text)
        os.utime(tree / name, ns=(1_000_000_000, 1_000_000_000))
    _source_times("save", str(tree), record)
    assert "build-gpu" not in open(record).read()  # build outputs are not sources
    for name in ("src/a.cpp", "src/b.cpp", "CMakeLists.txt"):  # a fresh copy: new times
        os.utime(tree / name, ns=(2_000_000_000, 2_000_000_000))
    (tree / "src/b.cpp").write_text("b changed")
    assert "2 unchanged files" in _source_times("restore", str(tree), record).stdout
    assert os.stat(tree / "src/a.cpp").st_mtime_ns == 1_000_000_000
    assert os.stat(tree / "CMakeLists.txt").st_mtime_ns == 1_000_000_000
    assert os.stat(tree / "src/b.cpp").st_mtime_ns > 1_000_000_000
    # The record is spent: a build that fails after the restore leaves none to trust.
    assert not os.path.exists(record)
    assert "0 unchanged files" in _source_times("restore", str(tree), record).stdout


def test_gpu_pack_takes_the_programs_and_ctest_files_of_both_builds(tmp_path):
    """scripts/gpu_pack.sh packs the programs the GPU steps run and CTest's files (not the objects
    or CMake's own folders), from the build folder and its candidate, paths relative to the tree."""
    import shutil
    import tarfile
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(SCRIPTS, "..", "gpu_pack.sh"), tmp_path / "scripts" / "gpu_pack.sh")
    files = ["build-gpu/tests/tileattn_gpu_tests", "build-gpu/src/cuda/tileattn_gpu_bench",
             "build-gpu/CTestTestfile.cmake", "build-gpu/tests/CTestTestfile.cmake",
             "build-gpu/tests/tileattn_gpu_tests[1]_include.cmake", "build-gpu/tests/tileattn_gpu_tests[1]_tests.cmake",
             "build-gpu-candidate/src/cuda/tileattn_gpu_bench"]
    left_out = ["build-gpu/src/cuda/CMakeFiles/k.dir/fwd.cu.o", "build-gpu/CMakeFiles/3.28/CTestTestfile.cmake",
                "build-gpu/libtileattn.a"]
    for name in files + left_out:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    archive = tmp_path / "out" / "gpu.tar.xz"
    archive.parent.mkdir()
    subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_pack.sh"), str(archive)], check=True,
                   capture_output=True, text=True, timeout=60, cwd=tmp_path / "out")
    with tarfile.open(archive) as t:
        assert sorted(t.getnames()) == sorted(files)


def test_candidate_tree_copies_the_tree_with_the_patch_applied(tmp_path):
    """build_tree.sh's candidate_tree (the build-candidate and python-install steps' patched copy):
    the tree without its build folders, .deps linked, TILEATTN_CANDIDATE's patch applied."""
    import shutil
    root = tmp_path / "tree"
    (root / "scripts" / "gpu").mkdir(parents=True)
    shutil.copy(os.path.join(SCRIPTS, "build_tree.sh"), root / "scripts" / "gpu" / "build_tree.sh")
    (root / "src").mkdir()
    (root / "src" / "a.txt").write_text("one\n")
    (root / "build-gpu").mkdir()
    (root / "build-gpu" / "x.o").write_text("o")
    (root / ".deps").mkdir()
    (root / "c.patch").write_text("diff --git a/src/a.txt b/src/a.txt\n--- a/src/a.txt\n+++ b/src/a.txt\n"
                                  "@@ -1 +1 @@\n-one\n+two\n")
    copy = tmp_path / "copy"
    env = dict(os.environ, ROOT=str(root), TILEATTN_CANDIDATE="c.patch")
    subprocess.run(["bash", "-c", f'. "$ROOT/scripts/gpu/build_tree.sh" && candidate_tree "{copy}"'], check=True,
                   env=env, capture_output=True, text=True, timeout=60)
    assert (copy / "src" / "a.txt").read_text() == "two\n"
    assert (root / "src" / "a.txt").read_text() == "one\n"
    assert not (copy / "build-gpu").exists() and (copy / ".deps").is_symlink()


def test_sass_diff_ignores_addresses_and_namespace_hashes_only(tmp_path):
    """scripts/sass_diff.sh compares each CUDA object's SASS (here a stand-in cuobjdump that prints
    the object's text): addresses and anonymous-namespace hashes may differ, encodings may not."""
    tool = tmp_path / "cuobjdump"
    tool.write_text('#!/bin/sh\ncat "$2"\n')
    tool.chmod(0o755)
    sass = ("\t\tFunction : _ZN8tileattn4cuda47_GLOBAL__N__{h}_8_fwd_cu_k6kernelEv\n"
            "        /*{a}*/                   MOV R1, c[0x0][0x28] ;   /* {e} */\n")

    def build(name, objects):
        for path, text in objects.items():
            f = tmp_path / name / "src/cuda/CMakeFiles/tileattn_cuda_kernels.dir" / path
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        return str(tmp_path / name)

    def diff(a, b):
        return subprocess.run(["bash", os.path.join(SCRIPTS, "..", "sass_diff.sh"), a, b], capture_output=True,
                              text=True, timeout=60, env=dict(os.environ, CUOBJDUMP=str(tool)))

    before = build("before", {"gen/fwd.cu.o": sass.format(h="d03eb04d", a="0000", e="0x00000a00ff017b82"),
                              "runtime.cu.o": ""})
    same = build("same", {"gen/fwd.cu.o": sass.format(h="ade2f1f8", a="0010", e="0x00000a00ff017b82"),
                          "runtime.cu.o": ""})
    other = build("other", {"gen/fwd.cu.o": sass.format(h="d03eb04d", a="0000", e="0x00000a00ff017b83")})
    r = diff(before, same)
    assert r.returncode == 0 and "same      gen/fwd.cu.o (1 functions)" in r.stdout, r.stdout + r.stderr
    r = diff(before, other)
    assert r.returncode == 1 and "different gen/fwd.cu.o" in r.stdout and "missing   runtime.cu.o" in r.stdout
    assert diff(str(tmp_path / "nothing"), same).returncode == 2
