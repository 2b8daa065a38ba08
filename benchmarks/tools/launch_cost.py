"""What Triton's launch path costs a small call, on a CUDA GPU (µs per call, GPU queue kept busy):

    PYTHONPATH=. python benchmarks/tools/launch_cost.py

For each case: ``norm()`` (no grad), Triton's ``kernel[grid](**kw)`` alone, the compiled kernel's launcher
with its arguments bound once, and the same launcher behind a lookup keyed by Triton's own specialization
of every argument (what a cached direct launch would have to do on each call). The output of a direct
launch is compared with ``norm()``'s.
"""
from __future__ import annotations

import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

import normlib
from normlib.backends.triton import launch
from overhead import per_call_us  # benchmarks/tools/ is the script's directory

CASES = [("cln", (80, 64, 301)), ("gln", (64, 128, 500)), ("frameln", (64, 128, 500))]


def single_launch(spec, x):
    """The (kernel, grid, kwargs) of the one launch that ``norm(spec, x)`` makes (a prepared call's step, its
    tensors bound), or None if it makes more."""
    seen = []
    real = launch._Step.__call__

    def record(step, env, *args):
        kw = dict(step.kw)
        for name, role in step.roles:
            kw[name] = env[role]
        seen.append((step.kernel, step.grid, kw))
        return real(step, env, *args)

    launch._Step.__call__ = record
    try:
        with torch.no_grad():
            normlib.functional.norm(spec, x, backend="triton")
    finally:
        launch._Step.__call__ = real
    return seen[0] if len(seen) == 1 else None


def main():
    for name, shape in CASES:
        spec = normlib.get(name).spec
        x = torch.randn(*shape, device="cuda")
        with torch.no_grad():
            want = normlib.functional.norm(spec, x, backend="triton").clone()
        rec = single_launch(spec, x)
        if rec is None:
            print(name, "makes more than one launch: skipped")
            continue
        kernel, grid, kw = rec
        warps = kw.pop("num_warps")
        compiled = kernel[grid](**kw, num_warps=warps)
        args = [kw[n] for n in kernel.arg_names]
        const = [p.is_constexpr for p in kernel.params]

        def direct():
            compiled.run(grid[0], 1, 1, torch.cuda.current_stream().cuda_stream, compiled.function,
                         compiled.packed_metadata, None, None, None, *args)

        cache = {}

        def key():
            return tuple(v if c else native_specialize_impl(BaseBackend, v, False, True, True)
                         for c, v in zip(const, (kw[n] for n in kernel.arg_names)))

        cache[key()] = compiled

        def keyed():
            k = cache[key()]
            k.run(grid[0], 1, 1, torch.cuda.current_stream().cuda_stream, k.function, k.packed_metadata, None,
                  None, None, *(kw[n] for n in kernel.arg_names))

        kw["y_ptr"].fill_(float("nan"))
        direct()
        torch.cuda.synchronize()
        same = torch.equal(kw["y_ptr"], want)
        with torch.no_grad():
            t_norm = per_call_us(lambda: normlib.functional.norm(spec, x, backend="triton"))
        print(f"{name} {shape}: copy {per_call_us(lambda: x.clone()):.1f}, norm() {t_norm:.1f}, "
              f"kernel[grid] {per_call_us(lambda: kernel[grid](**kw, num_warps=warps)):.1f}, "
              f"compiled run {per_call_us(direct):.1f}, keyed run {per_call_us(keyed):.1f} µs; "
              f"direct output equals norm(): {same}", flush=True)


if __name__ == "__main__":
    main()
