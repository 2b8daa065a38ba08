"""Graph-timed forward and step under BLOCK_T 32/64/128, small and mid shapes."""
import sys
import torch
sys.path.insert(0, "benchmarks")
from gpu_report import _graph_t, step_inputs, DTYPES, spec_of, norm
from normlib.backends.triton import launch

for (B, C, T) in ((80, 64, 301), (64, 128, 500), (4, 512, 4000)):
    for dt in ("fp32", "bf16"):
        for layout in ("b c t", "b t c"):
            x0, x, w, b, gy = step_inputs(B, C, T, DTYPES[dt], layout)
            copy = _graph_t(lambda: x0.clone())
            for name in ("cln", "gln"):
                spec = spec_of(name)
                res = []
                for bt in (32, 64, 128):
                    try:
                        with launch.tile_size(block_t=bt):
                            with torch.no_grad():
                                f = _graph_t(lambda: norm(spec, x, w, b, layout=layout, backend="triton"))
                            s = _graph_t(lambda: torch.autograd.grad(
                                norm(spec, x, w, b, layout=layout, backend="triton"), (x, w, b), gy))
                        res.append(f"bt{bt} {f/copy:.2f}/{s/copy:.1f}")
                    except Exception:  # noqa: BLE001
                        res.append(f"bt{bt} err")
                print(f"{name} {B},{C},{T} {dt} {layout} copy {copy*1e3:.1f}us fwd/step÷copy:", " | ".join(res), flush=True)
