"""Sequence parallelism (normlib.sequence_parallel, functional.norm's group=) and data parallel training, on gloo
with 2 and 3 processes that each test spawns (tests/dist_cases.py: what the ranks run), bounded in time; NCCL
where two GPUs are present."""

import pytest
import torch
import torch.distributed as dist

import normlib
import dist_cases

TIMEOUT = 300  # seconds for one spawn: a hang fails the test instead of blocking CI


def spawn(world, jobs, tmp_path, minimum, backend="gloo", device="cpu"):
    """Run ``jobs`` on ``world`` ranks; assert that no rank failed and that each made ``minimum`` checks."""
    results, problems = dist_cases.spawn(world, jobs, tmp_path, TIMEOUT, backend, device)
    assert not problems, "\n".join(problems)
    for r, result in results.items():
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
