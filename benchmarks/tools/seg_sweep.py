"""Device time (CUDA graph replay) of the forward and of a training step, default launch against segmented
walks (SEG, ``tile_size(strip=2)``) at 4, 8, 16 and 32 walks per SM (or those given), as ratios to a
copy's time; SEG's y and dx are checked against the default's. Few-sequence shapes first. A last argument
such as block_c=128,block_t=8,warps=1 forces the segments' tiles (the default keeps its own); layout=bct or
layout=btc keeps one layout, dtype=fp32 or dtype=bf16 one dtype.

    PYTHONPATH=.:benchmarks python benchmarks/tools/seg_sweep.py [seconds] [norm,...] [per-SM,...] [BxCxT,...] [k=v,...]

Each row: "default f/s | segN f/s (err y, err dx) ...", f = forward ÷ copy time, s = step ÷ copy time.
"""
import sys
import time

import torch
import triton

from gpu_report import DTYPES, _graph_t, norm, spec_of, step_inputs
from normlib.backends.triton import launch

def main():
    t_end = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 500)
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    per_sm = [int(k) for k in (sys.argv[3] if len(sys.argv) > 3 else "4,8,16,32").split(",")]
    shapes = [(2, 256, 64000), (1, 128, 256000), (4, 512, 4000), (16, 512, 16000)]
    if len(sys.argv) > 4:
        shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[4].split(",")]
    norms = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ccln", "cln", "ccemaln", "emaln"]
    force = dict(kv.split("=") for kv in sys.argv[5].split(",")) if len(sys.argv) > 5 else {}
    layouts = {"bct": ("b c t",), "btc": ("b t c",), "": ("b c t", "b t c")}[force.pop("layout", "")]
    dtypes = [force.pop("dtype")] if "dtype" in force else ["fp32", "bf16"]
    force = {k: int(v) for k, v in force.items()}
    for (B, C, T) in shapes:
        for name in norms:
            spec = spec_of(name)
            for dt in dtypes:
                for layout in layouts:
                    if time.time() > t_end:
                        return
                    x0, x, w, b, gy = step_inputs(B, C, T, DTYPES[dt], layout)
                    copy = _graph_t(lambda: x0.clone())
                    tiles = launch.tiles_for(x0 if layout == "b c t" else x0.transpose(1, 2), spec.per_channel,
                                             spec.resolve_decay(None))
                    bc, bt = force.get("block_c", tiles[0]), force.get("block_t", tiles[1])
                    ncb = triton.cdiv(C, bc) if spec.per_channel else 1
                    nt = triton.cdiv(T, bt)
                    res, ref = [], None
                    for v in [{}] + [dict(strip=2, span=triton.cdiv(nt, max(1, k * SMS // (B * ncb))), **force)
                                     for k in per_sm]:
                        try:
                            with launch.tile_size(**v):
                                with torch.no_grad():
                                    y = norm(spec, x0, w, b, layout=layout, backend="triton")
                                    f = _graph_t(lambda: norm(spec, x0, w, b, layout=layout, backend="triton"))
                                gx = torch.autograd.grad(norm(spec, x, w, b, layout=layout, backend="triton"), x, gy)[0]
                                s = _graph_t(lambda: torch.autograd.grad(
                                    norm(spec, x, w, b, layout=layout, backend="triton"), (x, w, b), gy))
                            if ref is None:
                                ref, err = (y.float(), gx.float()), ""
                            else:
                                e1 = ((y.float() - ref[0]).norm() / ref[0].norm()).item()
                                e2 = ((gx.float() - ref[1]).norm() / ref[1].norm()).item()
                                err = f" ({e1:.0e},{e2:.0e})"
                            lab = "default" if not v else f"seg{triton.cdiv(nt, v['span'])}"
                            res.append(f"{lab} {f / copy:.2f}/{s / copy:.2f}{err}")
                        except Exception as e:  # noqa: BLE001
                            res.append(f"{v} err {type(e).__name__} {str(e)[:80]}")
                    print(f"{name} {B},{C},{T} {dt} {layout} copy {copy * 1e3:.1f}us strip{tiles[7]} "
                          f"fwd/step ÷ copy: " + " | ".join(res), flush=True)


if __name__ == "__main__":
    main()
