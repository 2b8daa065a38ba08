"""A/B of kernel versions on a CUDA GPU: the working tree's kernels against other versions of
``normlib/backends/triton/kernels.py``, each timed in several fresh processes, the variants interleaved.

    git show 2b6bb84:normlib/backends/triton/kernels.py > /tmp/k_2b6bb84.py
    PYTHONPATH=. python benchmarks/tools/ab.py --kernels /tmp/k_2b6bb84.py --procs 4 \
        cln:16,512,16000:fp32:bct cln:16,512,16000:fp32:btc

A case is norm:B,C,T:dtype:layout (layout bct or btc), with :state after it to time a streaming call (a
causal norm with an incoming state, returning the outgoing one). Every variant runs under the working tree's
launcher; a variant may force tiles as ``launch.tile_size`` does, after an @ (``tree@block_c=64,block_t=64``
or ``/tmp/k.py@warps=8``). An older kernels.py may lack constexprs that the launcher passes (LONE, STAGES,
WALK_STAGES): they are dropped where that leaves the launch as it was, and a pipelined default must be forced
back for it (``/tmp/k.py@walk_stages=1,bwd_walk_stages=1``). Its launches go through Triton's launcher every
time (only the tree's are bound to the compiled launcher): compare calls whose host path shows with --graphs. Some rows settle at one of two speeds per process (the backward of cln (1, 128, 256000) took
225 µs in one process and 437 µs in the next with the same kernel), so one process per variant cannot rank
changes: each round starts a new process per variant. ``--graphs`` times device time from CUDA graph replays
instead of eager calls (below about 250 µs an eager call times the host's path). Prints, per case and variant, the median over
processes of the forward and backward (÷ copy, as in gpu_report.py: 2N and 3N moved), their range, and
whether the outputs have the same bits as the first variant's. The bits come from a deterministic call
(``torch.use_deterministic_algorithms``): otherwise a look-back's grouping, and so its rounding, depends on
which predecessors have published when a tile polls.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = "tree"  # the working tree's kernels


def parse_case(text):
    """(norm, shape, dtype, layout, whether it streams a state)."""
    name, shape, dtype, layout, *state = text.split(":")
    if state not in ([], ["state"]):
        raise ValueError(f"a case ends in its layout or in :state, got {text!r}")
    return (name, tuple(int(v) for v in shape.split(",")), dtype, {"bct": "b c t", "btc": "b t c"}[layout],
            bool(state))


def _load_kernels(path):
    spec = importlib.util.spec_from_file_location(f"ab_kernels_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# constexprs the launcher passes that older kernels may not take, with the value that means "as before" (a
# ccemaln row against a kernels.py before EMA32: force @ema32=0)
NEWER = {"LONE": None, "STAGES": 1, "WALK_STAGES": 1, "EMA32": False, "log2d_lo": None,
         "WIDE": None}  # an older kernel's offsets are all int64 (WIDE), whatever the launcher asks


class _Older:
    """An older version's kernel under today's launcher: arguments it does not take are dropped where they
    leave the launch as it was (a forced pipeline depth on a kernel without one is an error)."""

    def __init__(self, kernel):  # no ``params``: the launcher binds no direct launch, it calls this each time
        self.kernel, self.names = kernel, set(kernel.arg_names)

    def __getitem__(self, grid):
        run = self.kernel[grid]

        def call(**kw):
            for name, same in NEWER.items():
                if name in kw and name not in self.names:
                    if same is not None and kw[name] != same:
                        raise ValueError(f"this kernel has no {name}, launched with {name}={kw[name]}: force it "
                                         f"to {same} after an @ (e.g. @walk_stages=1,bwd_walk_stages=1 or @ema32=0)")
                    del kw[name]
            return run(**kw)
        return call


def use_variant(variant):
    """Put a variant's kernels in the launcher; returns its forced tiles, for ``launch.tile_size``."""
    from normlib.backends.triton import launch

    kernels, _, tiles = variant.partition("@")
    if kernels != TREE:
        mod = _load_kernels(kernels)
        launch.running_norm_fwd, launch.running_norm_bwd = _Older(mod.running_norm_fwd), _Older(mod.running_norm_bwd)
    return {k: int(v) for k, v in (kv.split("=") for kv in tiles.split(",") if kv)}


def worker(variant, cases, dry, graphs=False):
    """Time every case with one variant (this process); one JSON line per case."""
    from normlib.backends.triton import launch

    with launch.tile_size(**use_variant(variant)):
        _time_cases(cases, dry, graphs)


def _time_cases(cases, dry, graphs=False):
    import torch

    import normlib

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if dry:  # one call of each, for tests of the plumbing (CPU: Triton's interpreter)
        def bench(fn):
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    elif graphs:  # device time: calls replayed from a CUDA graph, without the host's launch path
        sys.path.insert(0, os.path.dirname(HERE))
        from gpu_report import _graph_t

        def bench(fn):
            return _graph_t(fn) * 1e-3
    else:
        from triton.testing import do_bench

        def bench(fn):
            return do_bench(fn, warmup=5, rep=40, return_mode="median") * 1e-3
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    for text in cases:
        name, shape, dtype, layout, streams = parse_case(text)
        spec = normlib.get(name).spec
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(*shape, generator=g).to(device=device, dtype=dtypes[dtype])
        gy = torch.randn(*shape, generator=g).to(device=device, dtype=dtypes[dtype])
        if layout == "b t c":
            x, gy = x.transpose(1, 2).contiguous(), gy.transpose(1, 2).contiguous()
        xg = x.clone().requires_grad_()
        kw = dict(layout=layout, backend="triton")
        if streams:  # the state after the sequence itself, fed back in: the outgoing one is returned too
            kw.update(state=normlib.functional.norm(spec, x, return_state=True, **kw)[1], return_state=True)

        def call(t):
            out = normlib.functional.norm(spec, t, **kw)
            return out[0] if streams else out
        torch.use_deterministic_algorithms(True)  # a fixed look-back grouping: bits comparable across runs
        y = call(xg)
        (dx,) = torch.autograd.grad(y, (xg,), gy)
        bits = [int(t.detach().float().contiguous().view(torch.int32).to(torch.int64).sum()) for t in (y, dx)]
        torch.use_deterministic_algorithms(False)
        y = call(xg)
        with torch.no_grad():
            fwd = bench(lambda: call(x))
        if graphs and not dry:  # a captured step holds its own forward (autograd runs the backward on its stream),
            # from a leaf of its own: y's graph above keeps xg's AccumulateGrad node of the default stream alive, and
            # a capture that meets it fails ("would make the legacy stream depend on a capturing blocking stream")
            del y
            xc = x.clone().requires_grad_()
            bwd = bench(lambda: torch.autograd.grad(call(xc), (xc,), gy)) - fwd
        else:
            bwd = bench(lambda: torch.autograd.grad(y, (xg,), gy, retain_graph=True))
        copy = bench(lambda: x.clone())
        print(json.dumps(dict(case=text, fwd=fwd, bwd=bwd, copy=copy, bits=bits)), flush=True)


def run_worker(cmd, env, who):
    """A worker process's stdout; where it fails, its own error (stderr) and a stop, not only its exit status."""
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"{who} exited {done.returncode}")
    return done.stdout


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="+", help="norm:B,C,T:dtype:layout")
    p.add_argument("--kernels", action="append", default=[],
                   help="another kernels.py, or 'tree', each with optional @tiles (repeatable)")
    p.add_argument("--procs", type=int, default=3, help="processes (rounds) per variant")
    p.add_argument("--dry", action="store_true", help="call each function once, untimed")
    p.add_argument("--graphs", action="store_true", help="device time from CUDA graph replays (gpu_report's graphs "
                   "stage; the backward is a step's less the forward's): for calls whose host path outlasts them")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a.worker, a.cases, a.dry, a.graphs)
    variants = [TREE] + a.kernels
    runs = {v: [] for v in variants}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(HERE)), os.environ.get("PYTHONPATH", "")]))
    for _ in range(a.procs):
        for v in variants:
            cmd = ([sys.executable, os.path.abspath(__file__), "--worker", v, *a.cases] + (["--dry"] if a.dry else [])
                   + (["--graphs"] if a.graphs else []))
            out = run_worker(cmd, env, f"ab.py: the worker of {v}")
            runs[v].append({r["case"]: r for r in map(json.loads, out.splitlines()) if r})
            for r in runs[v][-1].values():  # as it goes, so that a run cut short still says something
                print(f"  {v}: {r['case']}: fwd {r['copy'] / r['fwd']:.2f} bwd {1.5 * r['copy'] / r['bwd']:.2f}",
                      file=sys.stderr, flush=True)
    for case in a.cases:
        first = runs[TREE][0][case]["bits"]
        parts = []
        for v in variants:
            rows = [r[case] for r in runs[v]]
            fwd = sorted(r["copy"] / r["fwd"] for r in rows)
            bwd = sorted(1.5 * r["copy"] / r["bwd"] for r in rows)
            same = all(r["bits"] == first for r in rows)
            label = v if v.startswith(TREE) else os.path.basename(v)
            parts.append(f"{label}: fwd {fwd[len(fwd) // 2]:.2f} [{fwd[0]:.2f}-{fwd[-1]:.2f}] "
                         f"bwd {bwd[len(bwd) // 2]:.2f} [{bwd[0]:.2f}-{bwd[-1]:.2f}]{'' if same else ' (other bits)'}")
        print(f"{case}: " + " | ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
