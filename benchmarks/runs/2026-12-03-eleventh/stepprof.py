"""Kernels of a small training step (profiler), and graph-timed steps under forced backward choices."""
import sys
import torch
sys.path.insert(0, "benchmarks")
from gpu_report import _graph_t, step_inputs, DTYPES, spec_of, norm
from normlib.backends.triton import launch
from torch.profiler import profile, ProfilerActivity

for (B, C, T) in ((64, 128, 500),):
    for layout in ("b c t", "b t c"):
        x0, x, w, b, gy = step_inputs(B, C, T, DTYPES["fp32"], layout)
        copy = _graph_t(lambda: x0.clone())
        for name in ("cln", "gln"):
            spec = spec_of(name)
            step = lambda: torch.autograd.grad(norm(spec, x, w, b, layout=layout, backend="triton"), (x, w, b), gy)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    step()
                torch.cuda.synchronize()
            print(f"== {name} {B},{C},{T} {layout} copy {copy*1e3:.1f} us")
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
                print(f"  {e.device_time_total/10:8.1f} us/step  x{e.count//10}  {e.key[:90]}")
            for v in ({}, dict(bwd_hold=1), dict(block_t=128), dict(bwd_warps=8), dict(block_t=32)):
                try:
                    with launch.tile_size(**v):
                        ms = _graph_t(step)
                    print(f"  step {v or 'default'}: {ms*1e3:.1f} us", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"  step {v}: err {type(e).__name__} {str(e)[:100]}", flush=True)
