"""Run one norm's Triton forward (or backward) a few times, for a profiler:

    PYTHONPATH=. ncu --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats -k regex:running_norm --launch-skip 2 --launch-count 1 \
        python benchmarks/tools/ncu_run.py --norm ccln --shape 16,512,16000 [--bwd] [--block-c 8 --block-t 256]
"""
from __future__ import annotations

import argparse

import torch

from normlib.backends.triton import launch
from normlib.functional import norm
from ab import use_variant  # benchmarks/tools/ is the script's folder
from sweep import case, case_args


def main():
    p = argparse.ArgumentParser()
    case_args(p)
    p.add_argument("--bwd", action="store_true")
    p.add_argument("--block-c", type=int)
    p.add_argument("--block-t", type=int)
    p.add_argument("--warps", type=int)
    p.add_argument("--window", type=int)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--kernels", default="tree", help="a variant as ab.py takes it (kernels file, @tiles)")
    a = p.parse_args()
    x, spec = case(a)
    forced = use_variant(a.kernels)
    with launch.tile_size(block_c=a.block_c, block_t=a.block_t, warps=a.warps, window=a.window), \
            launch.tile_size(**forced):
        tiles = launch.tiles_for(x if a.layout == "b c t" else x.transpose(1, 2), spec.per_channel,
                                 spec.resolve_decay(None))
        print(f"tiles {tiles}" + (f" bwd {launch.backward_tiles(tiles)}" if a.bwd else ""), flush=True)
        for _ in range(a.calls):
            if a.bwd:
                xg = x.detach().requires_grad_()
                torch.autograd.grad(norm(spec, xg, layout=a.layout, backend="triton"), (xg,), torch.ones_like(x))
            else:
                with torch.no_grad():
                    norm(spec, x, layout=a.layout, backend="triton")
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
