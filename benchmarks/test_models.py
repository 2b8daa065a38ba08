"""The model benchmark as a pytest-benchmark suite: a training step and an inference of each example model
(``normlib.models``) with each norm choice. ``make test`` runs it once, untimed, on small models, so that
``benchmarks/models.py`` cannot rot; ``pytest benchmarks/test_models.py`` times it (full size on CUDA)."""
import pytest
import torch

from models import MODELS, NORMS
from normlib.bench import ModelRunner

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")


# every norm choice eager; compiled, on the CPU (aot_eager), only normlib's cln and the formula it replaces
CASES = [(m, n, mode) for m in MODELS for n in NORMS for mode in ("eager", "compile")
         if mode == "eager" or CUDA or n in ("cln", "formula")]


@pytest.mark.parametrize("model, norm, mode", CASES)
def test_model_step_and_inference(benchmark, model, norm, mode):
    r = ModelRunner(model, norm, mode, "fp32", DEVICE, small=not CUDA)
    benchmark.group = f"{model}-{mode}"
    benchmark.extra_info.update(model=model, norm=norm, mode=mode, device=str(DEVICE))
    losses = [float(benchmark.pedantic(r.step, rounds=3 if CUDA else 1, warmup_rounds=1, iterations=1))]
    losses.append(float(r.step()))
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert torch.isfinite(r.infer()).all()


@pytest.mark.parametrize("model", list(MODELS))
def test_normlib_cln_is_a_drop_in_for_the_formula(model):
    """Built from the same seed, the model with normlib's cln gives the formula's output (no DC offset here,
    where the formula keeps its digits)."""
    a = ModelRunner(model, "cln", "eager", "fp32", DEVICE, small=True)
    b = ModelRunner(model, "formula", "eager", "fp32", DEVICE, small=True)
    with torch.no_grad():
        ya, yb = a.model(a.x), b.model(b.x)
    assert ya.shape == yb.shape
    assert float((ya - yb).norm() / yb.norm()) < 1e-4
