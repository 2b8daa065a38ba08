"""Host time of one eager layer call, the working tree's normlib against other trees', on a CUDA GPU:

    git archive REV normlib | tar -x -C /tmp/old     # or: git worktree add /tmp/old REV
    PYTHONPATH=. python benchmarks/tools/host_ab.py --tree /tmp/old --procs 3 cln,gln

A tree is a directory that holds a ``normlib`` package (put it in the working tree, not a git-ignored folder,
for a device call to carry it), or ``tree`` for the working tree; either may force launch choices after an @, as
``launch.tile_size`` takes them (``--tree tree@global_launches=1``: the working tree with GLOBAL in one launch). Each variant runs in fresh processes, the variants alternated, since a host's
speed moves between processes. A process times, at --shape fp32 "b c t" (default (4, 512, 4000)): ``x.clone()``,
``nn.GroupNorm(1, C)`` and each norm's layer (backend "auto"), forward without grad and forward + backward,
each the best and the median of 12 batches of 40 calls issued behind a GPU sleep (``host_batches`` in
benchmarks/models.py). Prints, per layer and variant, the best of the processes' bests and the median of their
medians. ``--dry`` runs each call once on the CPU, untimed (the plumbing's test).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from ab import run_worker  # benchmarks/tools/ is the script's directory

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TREE = "tree"  # the working tree


def worker(variant, norms, shape, dry):
    """One process: every layer with the normlib of the variant's tree, under its forced launch choices; one JSON
    object."""
    tree, _, forced = variant.partition("@")
    sys.path.insert(0, ROOT if tree == TREE else os.path.abspath(tree))
    from normlib.backends.triton import launch

    with launch.tile_size(**{k: int(v) for k, v in (kv.split("=") for kv in forced.split(",") if kv)}):
        _time_layers(tree, norms, shape, dry)


def _time_layers(tree, norms, shape, dry):
    import torch

    import normlib

    want = os.path.join(ROOT if tree == TREE else os.path.abspath(tree), "normlib")
    if os.path.dirname(os.path.abspath(normlib.__file__)) != want:
        raise SystemExit(f"host_ab.py: imported {normlib.__file__}, not {want}")
    if dry:
        def timed(fn):
            fn()
            return 0.0, 0.0
        device = "cpu"
    else:
        sys.path.insert(1, os.path.dirname(HERE))
        from models import host_batches as timed
        device = "cuda"
    B, C, T = shape
    x = torch.randn(B, C, T, device=device)
    gy = torch.randn_like(x)
    xg = x.clone().requires_grad_()
    rows = {}
    with torch.no_grad():
        rows["x.clone()"] = {"fwd": timed(lambda: x.clone())}
    layers = {"nn.GroupNorm(1, C)": torch.nn.GroupNorm(1, C)}
    layers.update({n: normlib.get(n)(C) for n in norms})
    for name, layer in layers.items():
        layer = layer.to(device)
        with torch.no_grad():
            fwd = timed(lambda: layer(x))
        rows[name] = {"fwd": fwd, "fwdbwd": timed(lambda: layer(xg).backward(gy))}
    print(json.dumps(rows), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("norms", help="comma-separated normlib names")
    p.add_argument("--tree", action="append", default=[], help="another tree holding a normlib package (repeatable)")
    p.add_argument("--procs", type=int, default=3, help="processes (rounds) per variant")
    p.add_argument("--shape", default="4,512,4000", help="B,C,T")
    p.add_argument("--dry", action="store_true", help="each call once on the CPU, untimed")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    norms = [n for n in a.norms.split(",") if n]
    shape = tuple(int(v) for v in a.shape.split(","))
    if a.worker:
        return worker(a.worker, norms, shape, a.dry)
    variants = [TREE] + a.tree
    runs = {v: [] for v in variants}
    for _ in range(a.procs):
        for v in variants:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", v, a.norms, "--shape", a.shape]
            out = run_worker(cmd + (["--dry"] if a.dry else []), None, f"host_ab.py: the worker of {v}")
            runs[v].append(json.loads(out.strip().splitlines()[-1]))
    print(f"host µs a call, {a.shape} fp32, best of bests (median of medians) over {a.procs} processes")
    for layer in runs[TREE][0]:
        for kind in ("fwd", "fwdbwd"):
            if kind not in runs[TREE][0][layer]:
                continue
            cells = []
            for v in variants:
                got = [r[layer][kind] for r in runs[v]]
                cells.append(f"{os.path.basename(v.rstrip('/'))}: {min(g[0] for g in got):.1f} "
                             f"({statistics.median(g[1] for g in got):.1f})")
            print(f"{layer} {kind}: " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
