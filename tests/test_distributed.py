"""Sequence parallelism (normlib.sequence_parallel, functional.norm's group=) and data parallel training, on gloo
with 2 and 3 processes that each test spawns (tests/dist_cases.py: what the ranks run), bounded in time; NCCL
where two GPUs are present."""
import json
import pathlib
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import normlib
import dist_cases

TIMEOUT = 300  # seconds for one spawn: a hang fails the test instead of blocking CI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world, jobs, tmp_path, minimum, backend="gloo", device="cpu"):
    """Run ``jobs`` on ``world`` ranks; assert that no rank failed and that each made ``minimum`` checks."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=dist_cases.main, args=(r, world, port, jobs, str(tmp_path), backend, device))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + TIMEOUT
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
        procs[r].join()
    assert not hung, f"ranks {hung} of {world} still running after {TIMEOUT} s (a collective that hangs)"
    for r, p in enumerate(procs):
        out = pathlib.Path(tmp_path, f"{r}.json")
        assert out.exists(), f"rank {r} wrote no result (exit code {p.exitcode})"
        result = json.loads(out.read_text())
        for job in jobs:
            assert not result[job]["failures"], f"rank {r}, {job}:\n" + "\n".join(result[job]["failures"])
            assert result[job]["checks"] >= minimum[job], f"rank {r}, {job}: {result[job]['checks']} checks"


@pytest.mark.parametrize("world", [2, 3])
def test_sequence_parallel_gloo(world, tmp_path):
    """All seven norms, both layouts, both backends: y, dx, the summed weight and bias gradients, dstate and the
    returned state equal the single process's, with uneven slices, lengths and an incoming state."""
    jobs = ["norms", "errors"] + (["model_parallel"] if world == 2 else [])
    spawn(world, jobs, tmp_path, {"norms": 210, "errors": 4, "model_parallel": 10})


def test_data_parallel_gloo(tmp_path):
    """DistributedDataParallel on 2 gloo ranks: the parameters after 3 steps are one process's on the whole batch."""
    spawn(2, ["data_parallel"], tmp_path, {"data_parallel": 20})


def test_group_refused_outside_distributed():
    x = torch.randn(1, 2, 3)
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialized in this process")
    with pytest.raises(RuntimeError, match="group=.*not initialized"):
        normlib.functional.cln(x, group=object())
    with pytest.raises(RuntimeError, match="not initialized"):
        normlib.sequence_parallel(torch.nn.Conv1d(2, 2, 1))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs: this machine has "
                    f"{torch.cuda.device_count()} (benchmarks/sequence_parallel.py runs on two)")
def test_sequence_parallel_nccl(tmp_path):  # pragma: no cover (no GPU in CI)
    """The gloo tests' cases on two GPUs through NCCL, the Triton kernels compiled (float32 on both backends too)."""
    spawn(2, ["norms", "errors", "model_parallel", "data_parallel"], tmp_path,
          {"norms": 300, "errors": 4, "model_parallel": 10, "data_parallel": 20}, backend="nccl", device="cuda")
