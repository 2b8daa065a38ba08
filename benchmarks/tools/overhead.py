"""Where a small call's time goes, on a CUDA GPU: the host cost of each layer of the Triton path.

    PYTHONPATH=. python benchmarks/tools/overhead.py [--shape 80,64,301] [--norm cln]

Times, per call, with the GPU queue kept busy (host-bound rates) and under CUDA-graph replay (GPU only):
the copy, ``normlib.functional.norm`` (checks + dispatch + op + launch), the op
``torch.ops.normlib.running_norm_fwd`` alone and ``launch.forward`` (no op boundary); then the backward's
layers (autograd's call, a training step, ``launch.backward``, the weight-gradient reduction, an
allocation). The difference between the op and ``launch.forward`` is the op boundary's cost; ``--profile``
adds a cProfile of the eager backward's host path.
"""
from __future__ import annotations

import argparse
import time

import torch

import normlib
from normlib.backends import triton as tb
from normlib.backends.triton import launch
from normlib.functional import norm


def per_call_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def graph_us(fn, n=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n / 10 * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="80,64,301")
    p.add_argument("--norm", default="cln")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--profile", action="store_true", help="cProfile of the eager backward's host path")
    a = p.parse_args()
    B, C, T = (int(v) for v in a.shape.split(","))
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    x = torch.randn(B, C, T, device="cuda").to(dt)
    spec = normlib.get(a.norm).spec
    decay = {"frame": 0.0, "cumulative": 1.0, "ema": 0.99, "global": None}[spec.time.value]
    tiles = launch.tiles_for(x, spec.per_channel, decay)
    calls = {
        "copy (clone)": lambda: x.clone(),
        "normlib.functional.norm": lambda: norm(spec, x, backend="triton", decay=decay if spec.time.value == "ema" else None),
        "op running_norm_fwd": lambda: tb.running_norm_fwd(x, None, None, None, None, spec.per_channel, decay,
                                                           1e-8, False, False, False, tiles),
        "launch.forward": lambda: launch.forward(x, None, None, None, None, per_channel=spec.per_channel,
                                                 decay=decay, eps=1e-8, eps_outside=False, return_state=False,
                                                 save=False, tiles=tiles),
    }
    print(f"{a.norm} {a.dtype} {B}x{C}x{T}, tiles {tiles}")
    print(f"{'path':28s} {'host-bound µs/call':>20s} {'graph replay µs':>16s}")
    if a.profile:  # before any graph capture (see report)
        import cProfile
        import pstats

        fn = backward_calls(spec, x, decay, tiles)["autograd.grad (backward)"]
        per_call_us(fn, 20)  # compiled and warm before the profile
        prof = cProfile.Profile()
        prof.enable()
        per_call_us(fn)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    with torch.no_grad():
        report(calls)
    report(backward_calls(spec, x, decay, tiles))


def report(calls):
    """Every host-bound time first, then the graph replays: a failed capture (autograd's backward of a graph
    recorded outside it) may leave autograd syncing streams for every later call."""
    host = {name: per_call_us(fn) for name, fn in calls.items()}
    for name, fn in calls.items():
        try:
            g = graph_us(fn)
        except Exception as exc:  # noqa: BLE001 - capture may refuse a path; say so
            g = float("nan")
            print(f"  {name}: graph capture failed:", type(exc).__name__, str(exc)[:100])
        print(f"{name:28s} {host[name]:20.1f} {g:16.1f}", flush=True)


def backward_calls(spec, x, decay, tiles):
    """The backward's layers, as the forward's: autograd's call (what an eager training step pays), the
    training step, ``launch.backward`` (no autograd), the weight-gradient reduction alone, and an
    allocation of x's size (the backward allocates dx and the per-tile partials)."""
    B, C, T = x.shape
    xg = x.detach().requires_grad_()
    w = torch.ones(C, device=x.device, requires_grad=True)
    b = torch.zeros(C, device=x.device, requires_grad=True)
    gy = torch.randn_like(x)
    kw = dict(backend="triton", decay=decay if spec.time.value == "ema" else None)
    y = norm(spec, xg, w, b, **kw)
    _, _, pre = launch.forward(x, w.detach(), b.detach(), None, None, per_channel=spec.per_channel, decay=decay,
                               eps=1e-8, eps_outside=False, return_state=False, save=True, tiles=tiles)
    parts = torch.randn(2, B * launch.plan(x.shape, spec.per_channel, decay, tiles).nt, C, device=x.device)
    return {
        "autograd.grad (backward)": lambda: torch.autograd.grad(y, (xg, w, b), gy, retain_graph=True),
        "step (forward + backward)": lambda: torch.autograd.grad(norm(spec, xg, w, b, **kw), (xg, w, b), gy),
        "launch.backward": lambda: launch.backward(gy, None, x, w.detach(), None, None, pre,
                                                   per_channel=spec.per_channel, decay=decay, eps=1e-8,
                                                   eps_outside=False, need_weight_grads=True, tiles=tiles),
        "weight_grads (sum_partials)": lambda: launch.weight_grads(parts),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
    }


if __name__ == "__main__":
    main()
