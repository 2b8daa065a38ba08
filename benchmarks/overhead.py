"""Where a small call's time goes, on a CUDA GPU: the host cost of each layer of the Triton path.

    PYTHONPATH=. python benchmarks/overhead.py [--shape 80,64,301] [--norm cln]

Times, per call, with the GPU queue kept busy (host-bound rates) and under CUDA-graph replay (GPU only):
the copy, ``normlib.functional.norm`` (checks + dispatch + op + launch), the op
``torch.ops.normlib.running_norm_fwd`` alone, ``launch.forward`` (no op boundary), and the bare kernel
launch. The difference between the op and ``launch.forward`` is the op boundary's cost.
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
    with torch.no_grad():
        for name, fn in calls.items():
            try:
                g = graph_us(fn)
            except Exception as exc:  # noqa: BLE001 - capture may refuse a path; say so
                g = float("nan")
                print("  graph capture failed:", type(exc).__name__, str(exc)[:100])
            print(f"{name:28s} {per_call_us(fn):20.1f} {g:16.1f}", flush=True)


if __name__ == "__main__":
    main()
