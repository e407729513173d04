"""bench/train_e2e.py --tiny, bench/overhead.py and bench/block_sparse.py on a few CPU calls: the scripts' whole paths (models,
every CPU implementation, timing, the JSON record) in seconds, so the GPU runs do not find a broken script; and
bench/ncu_stalls.py on a small source page of ncu's format."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def _run(script, *args, **env_extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *args], check=True, env=env, timeout=600,
                          capture_output=True, text=True)


def test_train_e2e_tiny(tmp_path):
    out = tmp_path / "e2e.json"
    _run("train_e2e.py", "--tiny", "--device", "cpu", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert {r["impl"] for r in rows} == {"tileattn", "torch-sdpa", "torch-math"}
    for r in rows:
        assert r["grid"] == "e2e" and r["step_ms"] > 0 and r["tokens_per_s"] > 0 and r["finite"], r
    # Same weights, same tokens: the implementations agree on the loss.
    losses = [r["loss"] for r in rows]
    assert max(losses) - min(losses) < 1e-3, losses
    if importlib.util.find_spec("matplotlib"):
        _run("report_plots.py", str(out), "--stem", str(tmp_path / "plot"))
        assert (tmp_path / "plot-e2e.png").stat().st_size > 0


def test_overhead_record(tmp_path):
    out = tmp_path / "overhead.json"
    _run("overhead.py", "--device", "cpu", "--calls", "20", "--shape", "1,4,2,16", "--out", str(out),
         TILEATTN_COMMIT="abc1234")
    record = json.loads(out.read_text())
    assert record["commit"] == "abc1234"  # the caller's commit before the checkout's
    rows = record["rows"]
    assert {(r["impl"], r["pass"]) for r in rows} >= {("tileattn", "fwd"), ("torch-sdpa", "fwd"),
                                                    ("tileattn", "fwd+bwd"), ("torch-sdpa", "fwd+bwd")}
    assert all(r["grid"] == "overhead" and r["us"] > 0 for r in rows)


def test_block_sparse_record(tmp_path):
    """Every pattern (random and dense built from their block tables), both passes, tileattn and its
    dense kernel; torch-flex is left out (compiling it takes minutes on a shared CPU)."""
    out = tmp_path / "block_sparse.json"
    _run("block_sparse.py", str(out), "--device", "cpu", "--dtype", "fp32", "--tokens", "128", "--width", "32",
         "--hdims", "16", "--seqlens", "128", "--block", "64", "--densities", "0.5", "--iters", "1", "--threads", "1",
         "--peers", "dense")
    rows = json.loads(out.read_text())["rows"]
    assert {r["pattern"] for r in rows} == {"causal", "window", "documents", "random", "dense"}
    assert {(r["impl"], r["pass"]) for r in rows} == {(i, p) for i in ("tileattn", "tileattn-dense")
                                                    for p in ("fwd", "bwd")}
    assert all(r["grid"] == "block_sparse" and r["ms"] > 0 and "error" not in r for r in rows)
    # The GPU's kernel time and allocator counts are columns of every row, empty on a CPU.
    assert all(r["kernel_ms"] is None and r["device_allocs"] is None for r in rows)


def test_block_sparse_masking_record(tmp_path):
    """Every case of both patterns and random blocks, both passes, on a few CPU calls; two runs tagged
    as an A/B's sides and merged, with the candidate / base line per case and pass."""
    small = ("--device", "cpu", "--dtype", "fp32", "--tokens", "256", "--width", "32", "--hdims", "16", "--seqlen",
             "128", "--block", "64", "--window", "64", "--iters", "1")
    out = tmp_path / "masking.json"
    _run("block_sparse_masking.py", str(out), *small, "--build", "base", "--run", "1")
    _run("block_sparse_masking.py", str(tmp_path / "cand.json"), *small, "--build", "candidate", "--run", "2")
    merged = _run("block_sparse_masking.py", "--merge", str(tmp_path / "ab.json"), str(out), str(tmp_path / "cand.json"))
    lines = merged.stdout.splitlines()
    assert len(lines) == 18 and all(": base " in x and ", candidate " in x for x in lines)
    ab = json.loads((tmp_path / "ab.json").read_text())["rows"]
    assert {(r["build"], r["run"]) for r in ab} == {("base", 1), ("candidate", 2)} and len(ab) == 36
    rows = json.loads(out.read_text())["rows"]
    assert len({r["case"] for r in rows}) == 9 and {r["pass"] for r in rows} == {"fwd", "bwd"}
    assert all(r["grid"] == "block_sparse_masking" and r["ms"] > 0 for r in rows)
    # Listing every visited block as full keeps the density of the mask it came from.
    density = {r["case"]: r["density"] for r in rows}
    assert density["documents: full"] == density["documents: rule"]
    assert density["window: full"] == density["window: rule"]
    # One case and pass alone, as an ncu profile runs it.
    part = tmp_path / "part.json"
    _run("block_sparse_masking.py", str(part), *small, "--cases", "documents:rule,random", "--passes", "fwd",
         "--no-kernel-times")
    assert {(r["case"], r["pass"]) for r in json.loads(part.read_text())["rows"]} == \
        {("documents: rule", "fwd"), ("random", "fwd")}


def test_ncu_stalls_reads_a_source_page(tmp_path):
    page = tmp_path / "source.csv"
    page.write_text('"Kernel: k"\n'
                    '"Address","Source","Warp Stall Sampling (All Samples)","stall_wait","stall_barrier",'
                    '"stall_Not Issued"\n'
                    '"0x10","HGMMA.64x128x16.F32.BF16","10","4","6","1"\n'
                    '"0x20","BAR.SYNC.DEFER_BLOCKING 0x0","30","0","30","0"\n')
    out = _run("ncu_stalls.py", str(page), "--top", "1").stdout
    assert "samples: 40" in out and "barrier" in out and "90.0%" in out
    assert "BAR.SYNC" in out and "HGMMA" not in out.split("top 1 instructions:")[1]


def _gpu_bench_with_stand_ins(monkeypatch, peers):
    """bench/gpu_bench.py with no GPU: fixed ceilings and device name, and the peers' rows recorded
    in `peers` instead of timed."""
    sys.path.insert(0, BENCH)
    try:
        import gpu_bench
    finally:
        sys.path.remove(BENCH)
    monkeypatch.setattr(gpu_bench, "peer_rows", lambda r, *a: peers.append(r) or [])
    monkeypatch.setattr(gpu_bench, "ceilings", lambda: {})
    monkeypatch.setattr(gpu_bench.torch.cuda, "get_device_name", lambda: "stand-in")
    return gpu_bench


def _spec_logging_program(path, specs, record):
    """A stand-in timing program: appends its row spec to `specs` and prints `record`, a Python
    expression over `row` (the spec split at ':')."""
    path.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(specs)!r}, 'a').write(sys.argv[-1] + '\\n')\n"
                    f"row = sys.argv[-1].split(':')\nprint(json.dumps({record}))\n")
    path.chmod(0o755)
    return str(path)


def _run_gpu_bench(monkeypatch, gpu_bench, out, *args):
    """bench/gpu_bench.py's main with `args`, its record written to `out` (commit "base123"); the record."""
    monkeypatch.setattr(sys, "argv", ["gpu_bench.py", *args, "--out", str(out), "--commit", "base123"])
    gpu_bench.main()
    return json.loads(out.read_text())


def test_gpu_bench_times_a_candidate_build_beside_ours(tmp_path, monkeypatch, capsys):
    """bench/gpu_bench.py's row loop with stand-in timing programs and no peers: the candidate build's
    records carry their own impl names, the two builds swap order every row, and the table shows the
    candidate's ratio."""
    gpu_bench = _gpu_bench_with_stand_ins(monkeypatch, [])
    calls = tmp_path / "calls.txt"
    programs = []
    for name, ms in (("base", 2.0), ("cand", 1.0)):
        p = tmp_path / name
        p.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(calls)!r}, 'a').write({name!r} + '\\n')\n"
                     "impl = 'tileattn-deterministic' if '--deterministic' in sys.argv else 'tileattn'\n"
                     "row = sys.argv[-1].split(':')\n"
                     f"print(json.dumps({{'impl': impl, 'dtype': 'bf16', 'heads_q': 16, 'heads_kv': 16, 'hdim': 128, "
                     f"'hdim_v': 128, 'seqlen_q': int(row[1]), 'causal': row[4] == '1', 'ms': {ms}, "
                     "'tflops': 1.0}))\n")
        p.chmod(0o755)
        programs.append(str(p))
    record = _run_gpu_bench(monkeypatch, gpu_bench, tmp_path / "bwd.json", "--bench", programs[0],
                            "--candidate", programs[1], "--candidate-commit", "abc1234", "--backward", "--quick",
                            "--sections", "mha", "--hdims", "128")
    assert record["commit"] == "base123" and record["candidate_commit"] == "abc1234" and record["complete"]
    impls = [r["impl"] for r in record["rows"]]
    assert impls.count("tileattn") == impls.count("tileattn-candidate") == 4
    assert impls.count("tileattn-deterministic-candidate") == 4
    # Per row, each build runs both modes in turn; the first build alternates.
    order = calls.read_text().split()
    assert order == ["base", "base", "cand", "cand", "cand", "cand", "base", "base"] * 2
    table = capsys.readouterr().out
    assert "cand/ours" in table and "2.000" in table and "det c/o" in table


def test_gpu_bench_window_rows_pass_the_window_and_time_no_peer(tmp_path, monkeypatch):
    """The "window" section's rows reach the timing program with their window and leave the SDPA
    peers out (SDPA takes no window)."""
    peers = []
    gpu_bench = _gpu_bench_with_stand_ins(monkeypatch, peers)
    specs = tmp_path / "specs.txt"
    program = _spec_logging_program(
        tmp_path / "base", specs,
        "{'impl': 'tileattn', 'dtype': 'bf16', 'heads_q': 32, 'heads_kv': 8, 'hdim': 128, 'hdim_v': 128, "
        "'seqlen_q': int(row[1]), 'causal': False, 'window_left': int(row[7]), 'window_right': int(row[8]), "
        "'ms': 1.0, 'tflops': 1.0}")
    record = _run_gpu_bench(monkeypatch, gpu_bench, tmp_path / "fwd.json", "--bench", program, "--sections", "window")
    assert specs.read_text().split() == ["8:2048:32:128:0:8:128:1024:0", "2:8192:32:128:0:8:128:1024:0"]
    assert not peers
    assert all(r["window_left"] == 1024 for r in record["rows"])


def test_gpu_bench_varlen_rows_pack_mixed_lengths(tmp_path, monkeypatch):
    """The "varlen" section's rows: lengths between 128 and 4k (the last may pass 4k by less than
    128) summing to 16k tokens, the same every run; the timing program gets them as a "v" row and
    the peers the row's lengths."""
    peers = []
    gpu_bench = _gpu_bench_with_stand_ins(monkeypatch, peers)
    lens = gpu_bench.varlen_lens()
    assert lens == gpu_bench.varlen_lens() and sum(lens) == gpu_bench.TOKENS
    assert all(128 <= n < 4096 + 128 for n in lens) and len(set(lens)) > 1
    specs = tmp_path / "specs.txt"
    program = _spec_logging_program(
        tmp_path / "base", specs,
        "{'impl': 'tileattn', 'dtype': 'bf16', 'heads_q': 16, 'heads_kv': 16, 'hdim': 128, 'hdim_v': 128, "
        "'seqlen_q': 4096, 'causal': row[3] == '1', 'varlen': True, 'ms': 1.0, 'tflops': 1.0}")
    _run_gpu_bench(monkeypatch, gpu_bench, tmp_path / "fwd.json", "--bench", program, "--sections", "varlen")
    want = "v" + ",".join(map(str, lens))
    assert specs.read_text().split() == [want + ":16:128:0:16:128", want + ":16:128:1:16:128"]
    assert [r["lens"] for r in peers] == [lens, lens]
    r = dict(peers[0], causal=False)
    assert gpu_bench.flops(r, False) == 2.0 * 16 * sum(n * n for n in lens) * 256
    assert gpu_bench.record(r, "torch-flash", 1.0, False)["tokens"] == gpu_bench.TOKENS


def test_bwd_schedule_model():
    lines = _run("bwd_schedule_model.py").stdout.splitlines()
    shares = [[float(v) for v in line.split("|")[1].split()] for line in lines[1:]]
    assert shares and all(0 < s <= 1 for row in shares for s in row), lines
    assert all(row[-1] >= row[0] for row in shares), lines  # longest first never fills worse than in turn


def test_bwd_det_model():
    lines = _run("bwd_det_model.py").stdout.splitlines()
    rows = [line.split("|")[1].split() for line in lines[1:]]
    assert rows, lines
    for time, ideal, speedup in rows:
        assert int(time) >= float(ideal) > 0 and float(speedup) > 0, lines  # no schedule beats all SMs busy
    assert float(rows[0][2]) == 1.0 and float(rows[1][2]) > 1.0, lines  # splitting a group of 8 shortens the tail
