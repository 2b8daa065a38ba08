"""Sequence parallelism on one machine's GPU: the cases of tests/test_distributed.py (tests/dist_cases.py) with
CUDA tensors, every norm's forward and gradients against the single-device computation.

- one process (world size 1, gloo over CUDA tensors): the whole path with its one rank;
- two and three processes on the same GPU, gloo over CUDA tensors (gloo's all_gather and all_reduce take CUDA
  tensors), Triton kernels compiled: what a single GPU can show of the multi-GPU path;
- NCCL, where the machine has two GPUs (one process each).

    python benchmarks/sequence_parallel_check.py                  # on the GPU
    python benchmarks/sequence_parallel_check.py --device cpu --small   # a dry run on the CPU (Triton interpreted)

Prints one PASS/FAIL line per run and a summary; exits 1 on a failure. Writes JSON lines to $OUT (or
benchmarks/out) as sequence_parallel_check.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

TIMEOUT = 540  # seconds for one run's processes


def run(world: int, jobs: list[str], backend: str, device: str) -> dict:
    """``jobs`` of tests/dist_cases.py on ``world`` processes; returns the run's summary."""
    import dist_cases

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        results, failures = dist_cases.spawn(world, jobs, out, TIMEOUT, backend, device)
    checks = 0
    for r, result in results.items():
        for job, res in result.items():
            checks += res["checks"]
            failures += [f"rank {r}, {job}: {f}" for f in res["failures"]]
    return dict(world=world, backend=backend, device=device, jobs=jobs, checks=checks, failures=failures,
                seconds=round(time.perf_counter() - t0, 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="one two-process run of the norms (a dry run)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the spawned ranks inherit it
    elif not torch.cuda.is_available():
        print("FAIL: --device cuda but no GPU is visible")
        return 1
    if args.small:
        plan = [(2, ["norms"], "gloo")]
    else:
        plan = [(1, ["norms", "errors"], "gloo"), (2, ["norms", "errors", "model_parallel", "data_parallel"], "gloo"),
                (3, ["norms"], "gloo")]
        if args.device == "cuda" and torch.cuda.device_count() >= 2:
            plan.append((2, ["norms", "errors", "model_parallel", "data_parallel"], "nccl"))
    out_dir = pathlib.Path(os.environ.get("OUT") or ROOT / "benchmarks" / "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with open(out_dir / "sequence_parallel_check.jsonl", "a") as log:
        for world, jobs, backend in plan:
            res = run(world, jobs, backend, args.device)
            res.update(gpu=torch.cuda.get_device_name() if args.device == "cuda" else None,
                       torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
            results.append(res)
            log.write(json.dumps(res) + "\n")
            verdict = "PASS" if not res["failures"] and res["checks"] else "FAIL"
            print(f"{verdict}: {backend} world={world} on {args.device}: {res['checks']} checks, "
                  f"{len(res['failures'])} failures, {res['seconds']} s", flush=True)
            for f in res["failures"][:20]:
                print("   ", f)
    ok = all(not r["failures"] and r["checks"] for r in results)
    print(f"SUMMARY: {'PASS' if ok else 'FAIL'} ({sum(r['checks'] for r in results)} checks in {len(results)} runs)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
