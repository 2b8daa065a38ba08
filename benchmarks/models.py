"""What a norm costs inside a model: the training step and the inference of the example models
(``normlib.models``) with every norm choice, eager and compiled, fp32 and bf16 autocast, in one run.

    PYTHONPATH=. python benchmarks/models.py                       # everything (CUDA: several minutes)
    PYTHONPATH=. python benchmarks/models.py --modes eager --dtypes fp32 --norms none,formula,cln
    PYTHONPATH=. python benchmarks/models.py --table benchmarks/out/models-*.jsonl   # merge runs' rows

Norm choices: ``none`` (identity), ``native`` (``nn.GroupNorm(1, C)`` on "b c t", ``nn.LayerNorm(C)`` on
"b t c"), ``formula`` (the sum/sumsq cumulative LN), a normlib name (backend "auto"), or ``name:torch``
(normlib's PyTorch backend). Modes: ``eager``, ``compile`` (``torch.compile(model)``) and
``reduce-overhead`` (``torch.compile(model, mode="reduce-overhead")``, CUDA graphs). A step is forward,
MSE loss, backward and an Adam step; inference is a forward under ``no_grad``. Each figure is the median
of timed repetitions after warm-up (which includes compilation). A configuration that raises is recorded
with its error, not skipped. Rows (JSON lines) and a Markdown table go to ``--out`` (default
``benchmarks/out/``, git-ignored).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

import normlib
from normlib.bench import ModelRunner
from normlib.models import MODELS

NORMS = ("none", "native", "formula", "cln", "cln:torch")
MODES = ("eager", "compile", "reduce-overhead")
DTYPES = ("fp32", "bf16")


def median_ms(fn, device, warmup=3, reps=15, first=None):
    """The median of ``reps`` timed calls after ``warmup`` (compilation happens there); the first call's
    seconds go in ``first["s"]`` (a compiled model's compile time)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for i in range(warmup):
        fn()
        if i == 0:
            sync()
            if first is not None:
                first["s"] = time.perf_counter() - t0
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def run_one(model, norm, mode, dtype, device, small=False, warmup=3, reps=15):
    row = dict(model=model, norm=norm, mode=mode, dtype=dtype)
    torch._dynamo.reset()
    try:
        r = ModelRunner(model, norm, mode, dtype, device, small)
        f1, f2 = {}, {}
        row["step_ms"] = median_ms(r.step, device, warmup, reps, f1)
        row["infer_ms"] = median_ms(r.infer, device, warmup, reps, f2)
        row["first_s"] = round(f1["s"] + f2["s"], 2)  # the first step's and inference's: compile time
    except Exception as e:  # recorded in the table: "fails" is a result
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def host_us(fn, n=40) -> float:
    """The host's time of one call, µs, with the GPU's queue kept busy: the calls are issued behind a long
    GPU sleep, so that what is timed is the host's path to the launches, not the kernels. ``n`` stays small:
    past the launch queue's depth (about 1000 kernels) a launch waits for the sleep to end."""
    return host_batches(fn, n, 1, int(2e9))[0]  # about a second of GPU time: longer than issuing the calls


def host_batches(fn, n=40, batches=12, cycles=int(1.2e8)) -> tuple[float, float]:
    """host_us over several batches, each of n calls issued behind a GPU sleep of ``cycles`` (1.2e8: some 60 ms,
    longer than 40 calls of a layer's forward and backward): (best, median) µs a call. A host's noise moves single
    batches by tens of percent; the best of a dozen holds."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return min(times), statistics.median(times)


def host_rows(device, shape=(4, 512, 4000), chain=8) -> list[dict]:
    """Host time of one eager layer call at ``shape`` fp32, forward under no_grad and forward + backward,
    for a copy, ``nn.GroupNorm(1, C)`` and each normlib norm (backend "auto"): alone, and per layer in a chain of
    ``chain`` such layers, as in a model, where the autograd engine's start is spread over them."""
    B, C, T = shape
    x = torch.randn(shape, device=device)
    gy = torch.randn_like(x)
    makers = {"x.clone()": None, "nn.GroupNorm(1, C)": lambda: torch.nn.GroupNorm(1, C)}
    makers.update({name: (lambda name=name: normlib.get(name)(C)) for name in normlib.available()
                   if getattr(normlib.get(name), "spec", None) is not None})
    rows = []
    for name, make in makers.items():
        if make is None:
            with torch.no_grad():
                rows.append(dict(layer=name, shape=list(shape), fwd_us=host_us(lambda: x.clone())))
            continue
        row = dict(layer=name, shape=list(shape))
        for key, n, model in (("", 1, make().to(device)),
                              ("_chain", chain, torch.nn.Sequential(*(make() for _ in range(chain))).to(device))):
            xg = x.detach().requires_grad_()
            with torch.no_grad():
                row["fwd" + key + "_us"] = host_us(lambda model=model: model(x), n=40 // n + 1) / n
            row["step" + key + "_us"] = host_us(lambda model=model, xg=xg: model(xg).backward(gy), n=40 // n + 1) / n
        rows.append(row)
    return rows


def host_table(rows) -> str:
    shape = "x".join(map(str, rows[0]["shape"])) if rows else ""
    out = [f"Host time of one eager call, GPU queue busy ({shape} fp32, µs): alone, and per layer in a chain", "",
           "| layer | forward (no grad) | in a chain | forward + backward | in a chain |", "|---|---|---|---|---|"]
    for r in rows:
        cells = [f"{r[k]:.1f}" if k in r else "" for k in ("fwd_us", "fwd_chain_us", "step_us", "step_chain_us")]
        out.append(f"| {r['layer']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def environment(device) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        commit = ""
    try:
        import triton  # noqa: F401 (its version, where installed)
    except ImportError:
        pass
    return dict(date=datetime.date.today().isoformat(), commit=commit or os.environ.get("COMMIT", "?"),
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
                torch=torch.__version__, triton=getattr(sys.modules.get("triton"), "__version__", "-"),
                python=platform.python_version())


def _fmt(row, key):
    if "error" in row:
        return "fails"
    return f"{row[key]:.1f}"


def table(rows) -> str:
    """One table per model: a line per norm choice, a column per (mode, dtype) for the step and inference."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        cols = [(m, d) for m in MODES for d in DTYPES if any(r["mode"] == m and r["dtype"] == d for r in mine)]
        out += [f"**{model}** (median ms; step = forward, MSE, backward, Adam)", "",
                "| norm | " + " | ".join(f"{m} {d} step / inference" for m, d in cols) + " |",
                "|---|" + "---|" * len(cols)]
        for norm in dict.fromkeys(r["norm"] for r in mine):
            cells = []
            for m, d in cols:
                hit = [r for r in mine if r["norm"] == norm and r["mode"] == m and r["dtype"] == d]
                cells.append(f"{_fmt(hit[-1], 'step_ms')} / {_fmt(hit[-1], 'infer_ms')}" if hit else "")
            out.append(f"| {norm} | " + " | ".join(cells) + " |")
        errors = {r["error"] for r in mine if "error" in r}
        out += [""] + [f"- fails: `{e}`" for e in sorted(errors)] + ([""] if errors else [])
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--norms", default=",".join(NORMS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--small", action="store_true", help="small models and inputs (a smoke run on the CPU)")
    p.add_argument("--host", action="store_true", help="also the host time of one layer call (CUDA only)")
    p.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                       "out")))
    p.add_argument("--table", nargs="*", help="print the table of these rows files (JSON lines) and exit")
    a = p.parse_args(argv)
    if a.table is not None:
        rows = [json.loads(line) for f in a.table for g in glob.glob(f) for line in open(g) if line.strip()]
        print(table(rows))
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = environment(device)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"models-{env['commit']}-{int(time.time())}.jsonl")
    print(" ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    if a.host and device.type == "cuda":
        hrows = [dict(r, **env) for r in host_rows(device)]
        with open(os.path.join(a.out, f"host-{env['commit']}-{int(time.time())}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in hrows)
        print(host_table(hrows) + "\n", flush=True)
    rows = []
    for model in a.models.split(","):
        for dtype in a.dtypes.split(","):
            for mode in a.modes.split(","):
                for norm in a.norms.split(","):
                    row = dict(run_one(model, norm, mode, dtype, device, a.small, reps=a.reps), **env)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    with open(path, "a") as f:
                        f.write(json.dumps(row) + "\n")
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
