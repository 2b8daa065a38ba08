"""Command line: ``python -m normlib list | demo``."""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from . import backends, reference
from .functional import norm
from .registry import aliases, available, get


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _nan_first(err: float):
    """A key under which NaN is the largest error (max() of numbers keeps whichever comes first)."""
    return (err != err, err if err == err else 0.0)


def cmd_list(_args) -> None:
    rev: dict[str, list[str]] = {}
    for a, n in aliases().items():
        rev.setdefault(n, []).append(a)
    rows = [("name", "pooled", "time mode", "causal", "aliases", "description")]
    for name, desc in available().items():
        spec = getattr(get(name), "spec", None)
        if spec is None:
            rows.append((name, "-", "-", "-", ", ".join(rev.get(name, [])), desc))
            continue
        pooled = "all channels" if not spec.per_channel else "each channel"
        mode = spec.time.value + (f" (decay {spec.decay})" if spec.decay is not None else "")
        rows.append((name, pooled, mode, "yes" if spec.causal else "no", ", ".join(rev.get(name, [])) or "-",
                     desc))
    _print_table(rows)


def _print_table(rows) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for k, r in enumerate(rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))


def _time_ms(fn, device) -> float:
    fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.2 or n < 3:
        fn()
        n += 1
    sync()
    return (time.perf_counter() - t0) / n * 1e3


def cmd_demo(args) -> int:
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    g = torch.Generator().manual_seed(0)
    B, C, T = args.batch, args.channels, args.frames
    x64 = (torch.randn(B, C, T, generator=g, dtype=torch.float64) * 2 + args.offset).float().double()
    w64, b64 = 1 + 0.1 * torch.randn(C, generator=g, dtype=torch.float64), torch.randn(C, generator=g, dtype=torch.float64)
    print(f"normlib demo: x of shape (B, C, T) = ({B}, {C}, {T}), float32, DC offset {args.offset}; "
          "errors are relative to the float64 reference")
    rows, worst = [("norm", "backend", "device", "rel. error", "chunked vs whole", "time [ms]")], 0.0
    for name in available():
        spec = getattr(get(name), "spec", None)
        if spec is None:
            continue
        ref = reference.for_spec(spec)(x64, w64, b64)  # a user's registered spec has no named reference
        for dev in devices:
            x, w, b = (t.to(dev, torch.float32) for t in (x64, w64, b64))
            names = ["torch"] + (["triton"] if backends.triton_usable(x) else [])
            for be in names:
                run = lambda xx, **kw: norm(spec, xx, w, b, backend=be, **kw)  # noqa: E731
                y = run(x)
                err = _rel(y, ref)
                stream = "-"
                if spec.causal:  # cut into uneven chunks, thread the state, compare with the whole
                    cuts = [0, T // 7, T // 7 + 1, T // 2, T]
                    state, parts = None, []
                    for lo, hi in zip(cuts, cuts[1:]):
                        yc, state = run(x[..., lo:hi], state=state, return_state=True)
                        parts.append(yc)
                    s_err = _rel(torch.cat(parts, -1), y)
                    stream, err = f"{s_err:.1e}", max(err, s_err, key=_nan_first)
                worst = max(worst, err, key=_nan_first)
                rows.append((name, be, dev.type, f"{_rel(y, ref):.1e}", stream, f"{_time_ms(lambda: run(x), dev):.2f}"))
    _print_table(rows)
    ok = worst < 1e-4  # False for NaN
    print(f"\nworst relative error {worst:.1e}: {'OK' if ok else 'FAILED'} (threshold 1e-4)")
    return 0 if ok else 1


def _positive(s: str) -> int:
    if not s.strip().isdigit() or int(s) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}")
    return int(s)


def _finite(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        v = float("nan")
    if not v - v == 0:
        raise argparse.ArgumentTypeError(f"expected a finite number, got {s!r}")
    return v


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="normlib", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the family: name, what is pooled, time mode, causal, aliases")
    d = sub.add_parser("demo", help="run every norm on every device and backend against the reference")
    d.add_argument("--batch", type=_positive, default=4)
    d.add_argument("--channels", type=_positive, default=64)
    d.add_argument("--frames", type=_positive, default=2000)
    d.add_argument("--offset", type=_finite, default=100.0)
    args = p.parse_args(argv)
    try:
        return {"list": cmd_list, "demo": cmd_demo}[args.cmd](args) or 0
    except BrokenPipeError:  # the reader stopped early (`| head`): no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
