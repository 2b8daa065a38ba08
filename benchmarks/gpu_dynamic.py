"""torch.compile(layer, dynamic=True) on the GPU over many sequence lengths: graphs compiled, compile time, and
forward and input gradient against the eager layer (a random cotangent), per norm in its own process.

    PYTHONPATH=. python benchmarks/gpu_dynamic.py [--norms cln,ccemaln] [--lengths 3,301,20000] [--why]

``--why`` logs each recompile's guard (TORCH_LOGS=recompiles). Prints one line per (norm, T) and FAIL where y or dx
differs from eager's by more than 1e-5 or 1e-4 (relative).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

NORMS = ("cln", "ccln", "gln", "emaln", "frameln", "instln", "ccemaln")
LENGTHS = (3, 40, 301, 1000, 3999, 20000, 64000)


def one(name, lengths, why):
    import torch
    import normlib
    from torch._dynamo.utils import counters
    if why:
        torch._logging.set_logs(recompiles=True)
    layer = normlib.create(name, 64).cuda()
    compiled = torch.compile(layer, dynamic=True)
    for T in lengths:
        x = torch.randn(2, 64, T, device="cuda", requires_grad=True)
        t0 = time.perf_counter()
        y = compiled(x)
        gy = torch.randn_like(y)
        gx, = torch.autograd.grad(y, x, gy)
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        ye = layer(x)
        ge, = torch.autograd.grad(ye, x, gy)
        ey, eg = (float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in ((y, ye), (gx, ge)))
        ok = ey < 1e-5 and eg < 1e-4
        print(f"{name} T={T} first call {s:.1f} s, graphs {counters['stats']['unique_graphs']}, "
              f"y {ey:.1e}, dx {eg:.1e} {'ok' if ok else 'FAIL'}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--norms", default=",".join(NORMS))
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--why", action="store_true")
    p.add_argument("--timeout", type=float, default=150, help="seconds a norm")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    lengths = [int(t) for t in a.lengths.split(",")]
    if a.one:
        return one(a.one, lengths, a.why)
    for name in a.norms.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--lengths", a.lengths] + (["--why"] if a.why else [])
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            # the guard that failed: the log's "- 0/0: <expression>  # <source>" lines
            guards = [line.split("[__recompiles]")[1].strip() for line in r.stderr.splitlines()
                      if "[__recompiles]" in line and line.split("[__recompiles]")[1].strip().startswith("- ")]
            print(r.stdout, end="")
            print("\n".join(guards[-10:]) + ("\n" if guards else ""), end="")
            if r.returncode:
                print(f"{name} FAIL (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}", flush=True)
        except subprocess.TimeoutExpired:
            print(f"{name} FAIL: still compiling after {a.timeout:.0f} s", flush=True)


if __name__ == "__main__":
    main()
