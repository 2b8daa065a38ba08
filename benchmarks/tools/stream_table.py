"""One streaming call of each causal norm on the CPU (B = 1, a state in and out, no grad, one torch thread)
beside an ``nn.GroupNorm(1, C)`` call on the same tensor: the minimum over 12 batches of 100 calls, µs, for
C in 64, 256, 512 and 1, 4, 16 frames. Rows as JSON lines; ``--table`` merges runs (the best of each cell,
the time over GroupNorm's in brackets), as RESULTS.md's streaming table.

    PYTHONPATH=. python benchmarks/tools/stream_table.py benchmarks/out/stream_1.jsonl   # run it twice
    PYTHONPATH=. python benchmarks/tools/stream_table.py --table benchmarks/out/stream_*.jsonl
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import sys
import timeit

import torch

import normlib

NORMS = ("cln", "ccln", "emaln", "ccemaln", "frameln")
CHANNELS, FRAMES = (64, 256, 512), (1, 4, 16)


def best_us(fn) -> float:
    return min(timeit.repeat(fn, number=100, repeat=12)) / 100 * 1e6


def rows():
    with torch.no_grad():
        for C in CHANNELS:
            for T in FRAMES:
                x = torch.randn(1, C, T)
                gn = torch.nn.GroupNorm(1, C)
                yield dict(C=C, T=T, norm="GroupNorm", us=round(best_us(lambda: gn(x)), 2))
                for name in NORMS:
                    layer = normlib.get(name)(C)
                    _, state = layer(x, return_state=True)
                    for _ in range(50):  # warm: the prepared call, and a state that normlib returned
                        _, state = layer(x, state=state, return_state=True)
                    us = best_us(lambda: layer(x, state=state, return_state=True))
                    yield dict(C=C, T=T, norm=name, us=round(us, 2))


def table(paths) -> str:
    best = collections.defaultdict(lambda: float("inf"))
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            key = (r["C"], r["T"], r["norm"])
            best[key] = min(best[key], r["us"])
    out = ["| C, frames | GroupNorm | " + " | ".join(NORMS) + " |", "|---" * (len(NORMS) + 2) + "|"]
    for C in CHANNELS:
        for T in FRAMES:
            gn = best[(C, T, "GroupNorm")]
            out.append(f"| {C}, {T} | {gn:.1f} | " + " | ".join(
                f"{best[(C, T, n)]:.1f} ({best[(C, T, n)] / gn:.1f} ×)" for n in NORMS) + " |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="JSON lines file (default: stdout)")
    p.add_argument("--table", nargs="+", help="print the table of these runs' files and exit")
    a = p.parse_args(argv)
    if a.table:
        print(table(f for pattern in a.table for f in sorted(glob.glob(pattern))))
        return
    torch.set_num_threads(1)
    f = open(a.out, "w") if a.out else sys.stdout
    for r in rows():
        f.write(json.dumps(r) + "\n")
        f.flush()


if __name__ == "__main__":
    main()
