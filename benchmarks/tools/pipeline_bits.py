"""On a CUDA GPU: the default pipeline depths against forced depth 1 (``tile_size(stages=1, walk_stages=1, ...)``),
in deterministic mode, where the look-back combines in a fixed grouping: y, dx, dweight and dbias must be
bit-identical (pipelining moves loads, not arithmetic). A second default run shows the call repeats itself.

    PYTHONPATH=. python benchmarks/tools/pipeline_bits.py [--norms cln,ccln,ccemaln] [--shapes 4x512x4000,2x300x777]

Rows whose defaults pipeline nothing compare depth 1 with itself (the layer's choices: see launch.stages_for
and launch.walk_stages_for); the script prints each row's default depths.
"""
from __future__ import annotations

import argparse

import torch

import normlib
from normlib.backends import triton as tb
from normlib.backends.triton import launch

VARIANTS = {"default again": {}, "chunk loops at 1": dict(stages=1, bwd_stages=1),
            "walks at 1": dict(walk_stages=1, bwd_walk_stages=1)}


def run(layer, x, gy, force):
    xr = x.detach().clone().requires_grad_()
    layer.zero_grad()
    with tb.tile_size(**force):
        y = layer(xr)
        y.backward(gy)
    return [y.detach(), xr.grad, layer.weight.grad.clone(), layer.bias.grad.clone()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--norms", default="cln,emaln,ccln,ccemaln")
    p.add_argument("--shapes", default="4x512x4000,2x300x777")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    bad = 0
    for name in a.norms.split(","):
        for shape in a.shapes.split(","):
            B, C, T = (int(v) for v in shape.split("x"))
            for dt in (torch.float32, torch.bfloat16):
                for layout in ("bct", "btc"):
                    x = torch.randn(B, C, T, device="cuda") * 3 + 5
                    if layout == "btc":
                        x = x.transpose(1, 2).contiguous().transpose(1, 2)
                    x = x.to(dt)
                    layer = normlib.get(name)(C, backend="triton").cuda()
                    with torch.no_grad():
                        layer.weight.normal_()
                        layer.bias.normal_()
                    gy = torch.randn_like(x)
                    spec = normlib.get(name).spec
                    decay = {"frame": 0.0, "cumulative": 1.0, "ema": 0.99, "global": None}[spec.time.value]
                    depths = launch.tiles_for(x, spec.per_channel, decay)[17:21]
                    want = run(layer, x, gy, {})
                    for v, force in VARIANTS.items():
                        got = run(layer, x, gy, force)
                        d = [(g.float() - w.float()).abs().max().item() for g, w in zip(got, want)]
                        ok = all(torch.isfinite(g.float()).all() for g in got) and all(e == 0 for e in d)
                        bad += not ok
                        print(f"{'ok ' if ok else 'BAD'} {name} {shape} {str(dt)[6:]} {layout} depths {depths} "
                              f"{v}: max |diff| y, dx, dw, db {d}", flush=True)
    print("failed:", bad)
    return int(bad > 0)


if __name__ == "__main__":
    raise SystemExit(main())
