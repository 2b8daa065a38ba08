"""Device time (CUDA graph replay) of small forwards under forced launch choices."""
import sys
import torch
sys.path.insert(0, "benchmarks")
from gpu_report import _graph_t, make, DTYPES, spec_of, norm
from normlib.backends.triton import launch

VARIANTS = [{}, dict(strip=1), dict(block_t=128), dict(block_t=256), dict(warps=8), dict(hold=1)]
for (B, C, T) in ((80, 64, 301), (64, 128, 500)):
    for layout in ("b c t", "b t c"):
        x = make(B, C, T, DTYPES["fp32"], layout, seed=1)
        w, b = torch.ones(C, device="cuda"), torch.zeros(C, device="cuda")
        copy = _graph_t(lambda: x.clone())
        for name in ("cln", "gln", "ccln"):
            spec = spec_of(name)
            out = []
            for v in VARIANTS:
                try:
                    with launch.tile_size(**v), torch.no_grad():
                        ms = _graph_t(lambda: norm(spec, x, w, b, layout=layout, backend="triton"))
                    out.append(f"{ms / copy:.2f}")
                except Exception as e:  # noqa: BLE001
                    out.append("err")
            print(f"{name} {B},{C},{T} {layout} copy {copy*1e3:.1f} us:", " ".join(
                f"{','.join(f'{k}={val}' for k, val in v.items()) or 'default'}={o}" for v, o in zip(VARIANTS, out)),
                flush=True)
