"""Forward throughput of every norm: normlib (backend "auto"), the eager PyTorch reference, and a plain copy of
the same tensor (the memory floor: a forward reads x once and writes y once, 2*N*itemsize bytes).

    pytest benchmarks                          # time (on CUDA with CUDA events, figures in extra_info)
    pytest benchmarks --benchmark-disable      # each function once, outputs checked (what `make test` runs)

On CUDA, each test also times its function and a copy of the same bytes with CUDA events
(triton.testing.do_bench) and records in ``benchmark.extra_info``: ms, GB/s and the fraction of the copy's
bandwidth reached (``pct_of_copy``). On the CPU normlib runs its PyTorch backend and the shapes are small.
"""
import time

import pytest
import torch

import normlib
from normlib.reference import REFERENCES

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
NORMS = ("cln", "ccln", "gln", "emaln", "frameln", "instln", "ccemaln")
SHAPES = ([(16, 512, 16000), (2, 256, 64000), (1, 128, 256000), (4, 512, 4000), (80, 64, 301), (64, 128, 500)]
          if CUDA else [(4, 64, 1000), (3, 33, 501)])
IMPLS = ("normlib", "reference", "copy")


def _shape_id(shape):
    return "x".join(map(str, shape))


def _sync():
    if CUDA:
        torch.cuda.synchronize()


def _implementation(impl, name, x, weight, bias):
    if impl == "normlib":
        f = getattr(normlib.functional, name)
        return lambda: f(x, weight, bias)  # backend="auto": Triton on CUDA, PyTorch on the CPU
    if impl == "reference":
        f = REFERENCES[name]
        return lambda: f(x, weight, bias)
    return lambda: x.clone()


def _milliseconds(fn):
    """The median time of fn in ms: CUDA events on the GPU, perf_counter on the CPU."""
    if CUDA:
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[len(times) // 2]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("name", NORMS)
def test_forward(benchmark, name, shape, impl):
    B, C, T = shape
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(shape, device=DEVICE, generator=g)
    weight = 1 + 0.1 * torch.randn(C, device=DEVICE, generator=g)
    bias = 0.1 * torch.randn(C, device=DEVICE, generator=g)
    fn = _implementation(impl, name, x, weight, bias)

    def synchronized():
        out = fn()
        _sync()
        return out

    benchmark.group = f"{name}-{_shape_id(shape)}"
    benchmark.extra_info.update(norm=name, shape=list(shape), impl=impl, dtype="float32", device=str(DEVICE),
                                backend=(normlib.backends.resolve("auto", x).__module__
                                         if impl == "normlib" else "eager"))
    y = benchmark.pedantic(synchronized, rounds=20 if CUDA else 5, warmup_rounds=2, iterations=1)

    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.isfinite(y).all(), f"{impl} {name}: non-finite output"
    if impl == "normlib" and B * C * T <= 1 << 23:  # small enough to check against the float64 oracle
        expected = REFERENCES[name](x.double(), weight.double(), bias.double())
        err = float(torch.linalg.vector_norm(y.double() - expected) / torch.linalg.vector_norm(expected))
        assert err < 1e-4, f"{name}: relative error {err:.2e} against the float64 reference"

    if benchmark.enabled:  # bandwidth, and the fraction of a copy of the same bytes measured in this test
        nbytes = 2 * x.numel() * x.element_size()
        ms, ms_copy = _milliseconds(fn), _milliseconds(lambda: x.clone())
        benchmark.extra_info.update(bytes=nbytes, ms=ms, gbps=nbytes / ms / 1e6, copy_ms=ms_copy,
                                    copy_gbps=nbytes / ms_copy / 1e6, pct_of_copy=100 * ms_copy / ms)
