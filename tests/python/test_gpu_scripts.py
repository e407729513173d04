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
