"""normlib's command line: list the norms, check them (demo), time them (bench)."""
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
    a, b = a.detach().double().cpu(), b.detach().double().cpu()  # the reference runs on the CPU
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


def _names(s: str) -> list[str]:
    names = [n.strip() for n in s.split(",") if n.strip()]
    for n in names:
        try:
            if getattr(get(n), "spec", None) is None:
                raise argparse.ArgumentTypeError(f"{n!r} is registered without a NormSpec: nothing to time")
        except KeyError as e:
            raise argparse.ArgumentTypeError(str(e).strip('"')) from None
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of norm names")
    return names


def _shapes(s: str) -> list[tuple[int, int, int]]:
    out = []
    for part in s.split(","):
        dims = part.strip().lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise argparse.ArgumentTypeError(f"expected shapes such as 4x512x4000,16x512x1000 (B x C x T), got {part!r}")
        out.append(tuple(int(d) for d in dims))
    return out


def _choices(allowed):
    def parse(s: str) -> list[str]:
        items = [v.strip() for v in s.split(",") if v.strip()]
        bad = [v for v in items if v not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(allowed)}, got {s!r}")
        return items
    return parse


def cmd_bench(args) -> int:
    from . import bench

    return bench.run(args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="normlib", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the family: name, what is pooled, time mode, causal, aliases",
                   description="Print every registered norm: name, what is pooled, time mode, causal, aliases.")
    d = sub.add_parser("demo", help="run every norm on every device and backend against the reference",
                       description="Check every norm on every device and backend against the float64 reference, "
                                   "and each causal norm streamed in uneven chunks against the whole sequence.")
    d.add_argument("--batch", type=_positive, default=4, help="B, sequences in the batch (default 4)")
    d.add_argument("--channels", type=_positive, default=64, help="C, channels (default 64)")
    d.add_argument("--frames", type=_positive, default=2000, help="T, frames a sequence (default 2000)")
    d.add_argument("--offset", type=_finite, default=100.0, help="DC offset added to the input (default 100)")
    b = sub.add_parser("bench", help="time the norms against the formula, PyTorch's norms and a copy",
                       description="Time the forward, forward + backward and streaming calls of the norms on "
                                   "this machine's device (CUDA when present, else the CPU), beside the "
                                   "sum/sumsq formula, PyTorch's equivalent norm and a copy, in one run.")
    b.add_argument("--norms", type=_names, default=None, help="comma-separated norm names (default: all)")
    b.add_argument("--shapes", type=_shapes, default=None,
                   help="comma-separated B x C x T shapes, e.g. 4x512x4000 (default: two per device)")
    b.add_argument("--dtypes", type=_choices(("fp32", "bf16", "fp16", "fp64")), default=["fp32"],
                   help="comma-separated input dtypes: fp32, bf16, fp16, fp64 (default fp32)")
    b.add_argument("--layouts", type=_choices(("b c t", "b t c")), default=["b c t"],
                   help='comma-separated layouts, "b c t" and/or "b t c" (default "b c t")')
    b.add_argument("--backend", choices=("auto", "torch", "triton"), default="auto",
                   help="normlib backend (default auto: Triton on CUDA, PyTorch elsewhere)")
    b.add_argument("--models", action="store_true",
                   help="also a training step of the example models (normlib.models) with each norm, small on the "
                        "CPU")
    b.add_argument("--quick", action="store_true", help="small shapes and short timings (under a minute on a CPU)")
    b.add_argument("--json", metavar="PATH", help="write the rows and the environment as JSON")
    b.add_argument("--plot", metavar="PNG", help="write a chart of normlib's time over each baseline's (matplotlib)")
    args = p.parse_args(argv)
    try:
        return {"list": cmd_list, "demo": cmd_demo, "bench": cmd_bench}[args.cmd](args) or 0
    except BrokenPipeError:  # the reader stopped early (`| head`): no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
