"""Tile-size sweep on a CUDA GPU: time the Triton forward (and optionally backward) of one norm over a
grid of launch choices, beside a copy of the same bytes, to pick the launcher's defaults.

    PYTHONPATH=. python benchmarks/tools/sweep.py --norm cln --dtype fp32 --layout "b c t" [--strip 0,1,2] [--span 4] \
        --shape 16,512,16000 --block-t 8,16,32 --warps 4,8 --window 8,32 [--block-c 16,64] [--bwd] \
        [--bwd-block-c 64,128] [--bwd-warps 4,8] [--stages 1,2] [--bwd-stages 1,2]

--bwd-block-c and --bwd-warps set the backward's own choices (a pooled backward may chunk channels
differently from its forward); without them the backward takes the forward's.

Prints one line per configuration: µs and the ratio to the copy (forward moves 2N, backward 3N).
"""
from __future__ import annotations

import argparse
import itertools

import torch
from triton.testing import do_bench

import normlib
from normlib.backends.triton import launch
from normlib.functional import norm

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def ints(s):
    return [None] if s is None else [int(v) for v in s.split(",")]


def case_args(p):
    """The arguments that name one case (norm, dtype, layout, shape); ``case`` builds it."""
    p.add_argument("--norm", default="cln")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--layout", default="b c t")
    p.add_argument("--shape", default="16,512,16000")


def case(a):
    """(x in the layout asked, on the GPU; the norm's spec)."""
    B, C, T = (int(v) for v in a.shape.split(","))
    x = torch.randn(B, C, T, device="cuda").to(DTYPES[a.dtype])
    return (x.transpose(1, 2).contiguous() if a.layout == "b t c" else x), normlib.get(a.norm).spec


def main():
    p = argparse.ArgumentParser()
    case_args(p)
    p.add_argument("--block-t")
    p.add_argument("--block-c")
    p.add_argument("--warps")
    p.add_argument("--window")
    p.add_argument("--strip", help="0, 1, 2: forbid or force one program per sequence, or segments (SEG)")
    p.add_argument("--span", help="tiles per segment (SEG) or per GLOBAL span")
    p.add_argument("--bwd", action="store_true")
    p.add_argument("--bwd-block-c")
    p.add_argument("--bwd-warps")
    p.add_argument("--stages", help="a pooled tile's pipeline depth over its chunks of channels (1: none)")
    p.add_argument("--bwd-stages", help="the backward's own depth")
    a = p.parse_args()
    x, spec = case(a)
    gy = torch.randn_like(x)
    t_copy = do_bench(lambda: x.clone(), warmup=5, rep=40, return_mode="median")
    print(f"{a.norm} {a.dtype} {a.layout!r} {a.shape}: copy {t_copy * 1e3:.1f} µs", flush=True)
    for bt, bc, warps, window, strip, span, bbc, bw, st, bst in itertools.product(
            ints(a.block_t), ints(a.block_c), ints(a.warps), ints(a.window), ints(a.strip), ints(a.span),
            ints(a.bwd_block_c), ints(a.bwd_warps), ints(a.stages), ints(a.bwd_stages)):
        with launch.tile_size(block_t=bt, block_c=bc, warps=warps, window=window, strip=strip, span=span,
                              bwd_block_c=bbc, bwd_warps=bw, stages=st, bwd_stages=bst):
            tiles = launch.tiles_for(x if a.layout == "b c t" else x.transpose(1, 2), spec.per_channel,
                                    spec.resolve_decay(None))
            try:
                with torch.no_grad():
                    t = do_bench(lambda: norm(spec, x, layout=a.layout, backend="triton"), warmup=5, rep=40,
                                 return_mode="median")
                line = (f"  tiles {tiles[:5]} strip {tiles[7]} bwd {launch.backward_tiles(tiles)[:3]} "
                        f"strip {tiles[12]} stages {st or '-'}/{bst or '-'}: "
                        f"fwd {t * 1e3:8.1f} µs  {t_copy / t:.2f} of copy")
                if a.bwd:
                    xg = x.detach().requires_grad_()
                    y = norm(spec, xg, layout=a.layout, backend="triton")
                    tb = do_bench(lambda: torch.autograd.grad(y, (xg,), gy, retain_graph=True), warmup=5,
                                  rep=40, return_mode="median")
                    line += f"  bwd {tb * 1e3:8.1f} µs  {1.5 * t_copy / tb:.2f} of copy"
            except Exception as exc:  # noqa: BLE001 - a configuration that does not compile or fit
                line = f"  tiles {tiles[:4]}: {type(exc).__name__} {str(exc).splitlines()[0][:120]}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
