"""bench/report.py --smoke: the benchmark report's whole path (grids, timing, rejections recorded as
skipped rows, JSON record, plots where matplotlib is installed) on a few small CPU rows, in seconds."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

REPORT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "report.py")
RECORD_KEYS = {"grid", "impl", "dtype", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "hdim", "causal",
               "page_size", "ms", "tflops", "tbps"}


def test_smoke_run_writes_the_record(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")  # two OpenMP threads on a shared 2-core machine stall
    run = subprocess.run([sys.executable, REPORT, str(tmp_path), "--smoke", "--commit", "abc123"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (record,) = tmp_path.glob("*-cpu-report.json")
    doc = json.loads(record.read_text())
    assert doc["commit"] == "abc123" and doc["device"] and doc["date"]
    assert set(doc["ceilings"]) == {"matmul_bf16_tflops", "copy_tbps"}
    rows = doc["rows"]
    assert {x["grid"] for x in rows} == {"cpu-fwd", "cpu-bwd", "cpu-decode"}
    assert {x["impl"] for x in rows} == {"tileattn", "torch-cpu"}
    for x in rows:
        assert RECORD_KEYS <= set(x), x
        assert "error" not in x, x
        if x["ms"] is None:
            assert x["skipped"], x
        else:
            assert x["ms"] > 0 and (x["tbps"] if x["grid"] == "cpu-decode" else x["tflops"]) > 0, x
    assert all(x["ms"] is not None for x in rows if x["impl"] == "torch-cpu")
    if importlib.util.find_spec("matplotlib"):
        assert sorted(p.name.split("-report-")[1] for p in tmp_path.glob("*.png")) == \
            ["cpu-bwd.png", "cpu-decode.png", "cpu-fwd.png"]
