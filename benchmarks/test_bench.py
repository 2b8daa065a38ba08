"""Throughput of every norm, forward, backward and a training step (forward + backward): normlib (backend
"auto"), the eager PyTorch reference, ``torch.compile`` of the reference, the sum/sumsq formula (beside the
cumulative and EMA norms), PyTorch's own equivalent (``group_norm``, ``instance_norm``, ``layer_norm``) and
a plain copy of the same tensor (the memory floor: a forward moves 2N elements, x in and y out; a backward 3N, x and dy in, dx out; a step 5N).

    pytest benchmarks                          # time (on CUDA with CUDA events, figures in extra_info)
    pytest benchmarks --benchmark-disable      # each function once, results checked (what `make test` runs)

On CUDA, each test also times its function and a copy of the same tensor with CUDA events
(triton.testing.do_bench) and records in ``benchmark.extra_info``: ms, GB/s and the fraction of the copy's
bandwidth reached (``pct_of_copy``, the copy's rate scaled to the bytes the pass moves). On the CPU, normlib
runs its PyTorch backend, the shapes are small, and torch.compile uses the "aot_eager" backend (no C++
toolchain needed) so that the suite cannot rot.
"""
import time

import pytest
import torch

import normlib
from normlib.models import cumulative_ln_formula
from normlib.reference import REFERENCES

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
NORMS = ("cln", "ccln", "gln", "emaln", "frameln", "instln", "ccemaln")
SHAPES = ([(16, 512, 16000), (2, 256, 64000), (1, 128, 256000), (4, 512, 4000), (80, 64, 301), (64, 128, 500)]
          if CUDA else [(4, 64, 1000), (3, 33, 501)])
IMPLS = ("normlib", "reference", "compile", "formula", "native", "copy")
SPECS = {n: normlib.get(n).spec for n in NORMS}
NATIVE = {  # PyTorch's own norm of the same math, as (x, weight, bias) -> y
    "gln": lambda x, w, b: torch.nn.functional.group_norm(x, 1, w, b, 1e-8),
    "instln": lambda x, w, b: torch.nn.functional.instance_norm(x, weight=w, bias=b, eps=1e-8),
    "frameln": lambda x, w, b: torch.nn.functional.layer_norm(x.transpose(1, 2), (x.shape[1],), w, b,
                                                              1e-8).transpose(1, 2),
}


def _has(impl, name):
    """The formula stands beside the cumulative and EMA norms, the native norm beside its equivalents."""
    if impl == "formula":
        return SPECS[name].causal and SPECS[name].time.value != "frame"
    return impl != "native" or name in NATIVE
PASSES = {"fwd": 2, "bwd": 3, "step": 5}  # elements moved, in units of N; the copy is timed under fwd only


def _shape_id(shape):
    return "x".join(map(str, shape))


def _sync():
    if CUDA:
        torch.cuda.synchronize()


def _function(impl, name):
    """(x, weight, bias) -> y for one implementation."""
    if impl == "normlib":
        return getattr(normlib.functional, name)  # backend="auto": Triton on CUDA, PyTorch on the CPU
    if impl == "reference":
        return REFERENCES[name]
    if impl == "compile":  # afresh for each test: one static graph per shape, as gpu_report compiles
        torch._dynamo.reset()
        return torch.compile(REFERENCES[name], dynamic=False, backend="inductor" if CUDA else "aot_eager")
    if impl == "formula":  # the sum/sumsq formula of the norm's pooling (cumulative; for EMA norms the
        # cumulative formula is the cost a user would otherwise pay, not the same math: its output is not checked)
        return lambda x, w, b: cumulative_ln_formula(x, w, b, per_channel=SPECS[name].per_channel)
    if impl == "native":
        return NATIVE[name]
    return lambda x, w, b: x.clone()


def _pass(fn, pass_, x, weight, bias, gy):
    """The callable that a test times: the forward (no autograd), the backward of one forward, or both."""
    if pass_ == "fwd":
        def run():
            with torch.no_grad():
                return fn(x, weight, bias)
        return run
    xs = (x.detach().requires_grad_(), weight.detach().requires_grad_(), bias.detach().requires_grad_())
    if pass_ == "bwd":
        y = fn(*xs)
        return lambda: torch.autograd.grad(y, xs, gy, retain_graph=True)
    return lambda: torch.autograd.grad(fn(*xs), xs, gy)


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


def _rel(a, b):
    return float(torch.linalg.vector_norm(a.double() - b) / torch.linalg.vector_norm(b).clamp_min(1e-300))


# on the CPU (an untimed smoke run in `make test`) the baselines run at the first shape only
@pytest.mark.parametrize("name, shape, impl, pass_", [
    pytest.param(n, sh, i, p, id=f"{n}-{i}-{p}-{_shape_id(sh)}") for n in NORMS for sh in SHAPES for i in IMPLS
    for p in PASSES if _has(i, n) and (i != "copy" or p == "fwd")
    and (CUDA or i not in ("formula", "native") or sh == SHAPES[0])])
def test_throughput(benchmark, name, shape, impl, pass_):
    B, C, T = shape
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(shape, device=DEVICE, generator=g)
    weight = 1 + 0.1 * torch.randn(C, device=DEVICE, generator=g)
    bias = 0.1 * torch.randn(C, device=DEVICE, generator=g)
    gy = torch.randn(shape, device=DEVICE, generator=g)
    fn = _pass(_function(impl, name), pass_, x, weight, bias, gy)

    def synchronized():
        out = fn()
        _sync()
        return out

    benchmark.group = f"{name}-{_shape_id(shape)}-{pass_}"
    benchmark.extra_info.update(norm=name, shape=list(shape), impl=impl, pass_=pass_, dtype="float32",
                                device=str(DEVICE), backend=(normlib.backends.resolve("auto", x).__module__
                                                             if impl == "normlib" else impl))
    out = benchmark.pedantic(synchronized, rounds=20 if CUDA else 3, warmup_rounds=2, iterations=1)

    # the formula computes cln's and ccln's math, but its per-channel gradients at frame 0 (one value, variance
    # 0) are 1/sqrt(eps) large where the norms' are 0: those are not compared
    exact = impl != "copy" and (impl != "formula" or SPECS[name].time.value == "cumulative" and (
        pass_ == "fwd" or not SPECS[name].per_channel))
    if B * C * T <= 1 << 23 and exact:  # small enough to check against the float64 oracle
        ins = (x.double().requires_grad_(), weight.double().requires_grad_(), bias.double().requires_grad_())
        want = REFERENCES[name](*ins)
        if pass_ != "fwd":
            want = torch.autograd.grad(want, ins, gy.double())
        got = out if pass_ != "fwd" else (out,)
        want = want if pass_ != "fwd" else (want,)
        for what, a, b in zip(("x", "weight", "bias"), got, want):
            assert a.shape == b.shape and a.dtype == torch.float32
            err = _rel(a, b)
            tol = 1e-4 if impl == "normlib" else 1e-2  # the reference's formulas evaluated in float32 drift
            assert err < tol, f"{impl} {name} {pass_}: relative error {err:.2e} in d{what} (or y)"

    if benchmark.enabled:  # bandwidth, and the fraction of a copy's rate, measured in this test
        nbytes = PASSES[pass_] * x.numel() * x.element_size()
        ms, ms_copy = _milliseconds(fn), _milliseconds(lambda: x.clone())
        copy_scaled = ms_copy * PASSES[pass_] / 2  # the copy moves 2N
        benchmark.extra_info.update(bytes=nbytes, ms=ms, gbps=nbytes / ms / 1e6, copy_ms=ms_copy,
                                    copy_gbps=2 * x.numel() * x.element_size() / ms_copy / 1e6,
                                    pct_of_copy=100 * copy_scaled / ms)
