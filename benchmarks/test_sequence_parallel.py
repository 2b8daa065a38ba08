"""The sequence-parallel scripts in their CPU dry runs (gloo, two processes), so that they cannot rot: the two-GPU
benchmark writes its three kinds of rows on every rank; the single-GPU check passes its cases."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(script, tmp_path, *args):
    env = {**os.environ, "OUT": str(tmp_path), "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--device", "cpu", "--small", *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def test_two_gpu_benchmark_dry_run(tmp_path):
    out = _run("sequence_parallel.py", tmp_path, "--norm", "gln")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [json.loads(line) for line in (tmp_path / "sequence_parallel.jsonl").read_text().splitlines()]
    kinds = {(r["what"], r["rank"]) for r in rows}
    assert kinds == {("single device step", 0), ("sequence parallel step", 0), ("sequence parallel step", 1),
                     ("norm call", 0), ("norm call", 1)}, kinds
    split = [r for r in rows if r["what"] == "sequence parallel step"]
    assert sum(r["frames"] for r in split) == split[0]["total_frames"]
    assert all(r["ms"] > 0 for r in rows if "ms" in r)
    assert all(r["all_gather_us"] > 0 and r["parallel_us"] > 0 for r in rows if r["what"] == "norm call")


def test_single_gpu_check_dry_run(tmp_path):
    out = _run("sequence_parallel_check.py", tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUMMARY: PASS" in out.stdout, out.stdout
    row = json.loads((tmp_path / "sequence_parallel_check.jsonl").read_text().splitlines()[0])
    assert row["world"] == 2 and row["checks"] > 200 and not row["failures"]
