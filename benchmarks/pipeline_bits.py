"""On a CUDA GPU: forced pipeline depths (``tile_size(stages=, walk_stages=, ...)``) against the default. With
deterministic algorithms the look-back combines in a fixed grouping, so y, dx, dweight and dbias must be
bit-identical; without, a second default run shows the look-back's own run-to-run rounding.

    PYTHONPATH=. python benchmarks/pipeline_bits.py
"""
import torch
import normlib
from normlib.backends import triton as tb

torch.manual_seed(0)
bad = 0
VARIANTS = {"default again": {}, "stages 2": dict(stages=2, bwd_stages=2), "stages 1": dict(stages=1, bwd_stages=1),
            "walk 3": dict(walk_stages=3, bwd_walk_stages=3), "walk 1": dict(walk_stages=1, bwd_walk_stages=1)}
for det in (True, False):
    torch.use_deterministic_algorithms(det)
    for name in ("cln", "ccln", "ccemaln", "emaln"):
        for (B, C, T) in ((4, 512, 4000), (2, 300, 777)):
            for dt in (torch.float32, torch.bfloat16):
                for layout in ("bct", "btc"):
                    x = torch.randn(B, C, T, device="cuda") * 3 + 5
                    if layout == "btc":
                        x = x.transpose(1, 2).contiguous().transpose(1, 2)
                    x = x.to(dt)
                    layer = normlib.get(name)(C, backend="triton").cuda()
                    with torch.no_grad():
                        layer.weight.normal_(); layer.bias.normal_()
                    gy = torch.randn_like(x)
                    outs = {}
                    for v, force in {"default": {}, **VARIANTS}.items():
                        xr = x.detach().clone().requires_grad_()
                        layer.zero_grad()
                        with tb.tile_size(**force):
                            y = layer(xr)
                            y.backward(gy)
                        outs[v] = [y.detach(), xr.grad, layer.weight.grad.clone(), layer.bias.grad.clone()]
                    for v, o in outs.items():
                        if v == "default":
                            continue
                        d = [(a.float() - b.float()).abs().max().item() for a, b in zip(o, outs["default"])]
                        ok = all(torch.isfinite(a.float()).all() for a in o) and (not det or all(e == 0 for e in d))
                        bad += not ok
                        print(f"{'ok ' if ok else 'BAD'} det={det} {name} {B},{C},{T} {dt} {layout} {v} maxdiff={d}",
                              flush=True)
print("failed:", bad)
raise SystemExit(int(bad > 0))
