"""The docs' figures, made from data, never drawn by hand: ``python docs_tools/figures.py [--force]``.

- ``norm-<name>.svg``, one per norm, and ``compare.svg``: normlib itself (CPU, PyTorch backend, float64) run
  on one example signal; the running statistics are the states that normlib returns when the signal is
  streamed one frame at a time.
- ``dc-offset.svg``: normlib's float32 error against the float64 reference, beside the sum/sumsq formula's
  (``normlib.models.cumulative_ln_formula``), as the input's DC offset grows.
- ``models-gpu.svg``, ``kernels-large.svg``, ``kernels-compile.svg``, ``cpu.svg``: the tables of
  benchmarks/RESULTS.md (read by docs_tools/results.py).
- ``kernel-lookback.svg``: the Triton forward's tiles and decoupled look-back, drawn from a schedule
  computed below.

They go to build/docs-figures/ (git-ignored); `mkdocs build` calls ``build()`` through docs_tools/hooks.py,
which redraws them only when an input (this script, the RESULTS.md tables, normlib's source, the versions of
torch and matplotlib) has changed. SVGs are written without dates and with a fixed hash salt, so the same
inputs give the same files.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "build" / "docs-figures"
SITE_DIR = "figures"  # their folder in the site: pages link figures/<name>.svg
STAMP = ".inputs.sha256"

NORMS = ("cln", "ccln", "gln", "emaln", "frameln", "instln", "ccemaln")
SEGMENTS = ((0, 200, 0.0, 1.0), (200, 400, 4.0, 0.3), (400, 600, -2.0, 3.0))  # frames, level, spread
BLUE, ORANGE, GREEN, GREY, RED = "#1f77b4", "#ff7f0e", "#2ca02c", "#7f7f7f", "#d62728"


def _inputs() -> list[Path]:
    return sorted([HERE / "figures.py", HERE / "results.py", ROOT / "benchmarks" / "RESULTS.md",
                   *(ROOT / "normlib").glob("*.py"), *(ROOT / "normlib" / "backends").glob("*.py")])


def _digest() -> str:
    import matplotlib
    import torch

    h = hashlib.sha256(f"torch {torch.__version__} matplotlib {matplotlib.__version__}".encode())
    for p in _inputs():
        h.update(p.relative_to(ROOT).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def outputs() -> list[Path]:
    return sorted(OUT.glob("*.svg"))


def build(force: bool = False) -> list[Path]:
    """Draw every figure into OUT unless the stamp says its inputs are unchanged."""
    digest = _digest()
    stamp = OUT / STAMP
    if not force and stamp.exists() and stamp.read_text() == digest and outputs():
        return outputs()
    OUT.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    for name, draw in FIGURES.items():
        fig = draw(plt)
        _save(fig, OUT / name)
        plt.close(fig)
    _atomic_write(stamp, digest.encode())
    return outputs()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "normlib-docs", "svg.fonttype": "path", "font.size": 9,
                         "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 100})
    return plt


def _atomic_write(path: Path, data: bytes) -> None:
    # two builds at once (a test and `make docs`) never read half a file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _save(fig, path: Path) -> None:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    _atomic_write(path, buf.getvalue())


# ---------------------------------------------------------------- the norms on an example signal

def example_signal(C: int = 16):
    """(1, C, T) float64: three segments of different level and spread, each channel a little offset."""
    import torch

    g = torch.Generator().manual_seed(0)
    parts = [level + spread * torch.randn(C, hi - lo, generator=g, dtype=torch.float64)
             for lo, hi, level, spread in SEGMENTS]
    chan = torch.linspace(-0.5, 0.5, C, dtype=torch.float64)[:, None]
    return (torch.cat(parts, -1) + chan)[None]


def running_stats(name: str, x):
    """normlib's mean and standard deviation at every frame (channel 0's for a per-channel norm): the states
    it returns when x is streamed one frame at a time. A global norm's are those of all frames: the state
    that the cumulative norm of its pooling returns at the last frame."""
    import torch

    import normlib

    spec = normlib.get(name).spec
    F = normlib.functional
    if not spec.causal:
        _, s = F.norm("ccln" if spec.per_channel else "cln", x, return_state=True, backend="torch")
        mean, var = s.m.reshape(-1)[0].item(), s.var.reshape(-1)[0].item()
        T = x.shape[-1]
        return torch.full((T,), mean, dtype=torch.float64), torch.full((T,), math.sqrt(var), dtype=torch.float64)
    state, means, stds = None, [], []
    for t in range(x.shape[-1]):
        _, state = F.norm(name, x[..., t:t + 1], state=state, return_state=True, backend="torch")
        means.append(state.m.reshape(-1)[0].item())
        stds.append(math.sqrt(state.var.reshape(-1)[0].item()))
    return torch.tensor(means, dtype=torch.float64), torch.tensor(stds, dtype=torch.float64)


def _norm_panels(plt, axes, name, x, *, title=None):
    import normlib

    spec = normlib.get(name).spec
    y = normlib.functional.norm(name, x, backend="torch")[0]
    mean, std = running_stats(name, x)
    t = range(x.shape[-1])
    shown = [0] if spec.per_channel else range(x.shape[1])
    top, bottom = axes
    for c in shown:
        kw = dict(color=BLUE, lw=0.8) if spec.per_channel else dict(color=GREY, lw=0.4, alpha=0.35)
        top.plot(t, x[0, c], **kw)
        bottom.plot(t, y[c], **kw)
    top.plot(t, mean, color=ORANGE, lw=1.6, label="running mean μ")
    top.fill_between(t, mean - std, mean + std, color=ORANGE, alpha=0.18, lw=0, label="μ ± σ")
    top.plot(t, mean + std, color=ORANGE, lw=0.8, ls="--")
    top.plot(t, mean - std, color=ORANGE, lw=0.8, ls="--")
    for ax in axes:
        for lo, *_ in SEGMENTS[1:]:
            ax.axvline(lo, color="k", lw=0.5, ls=":")
    top.set_ylabel("x" + (" (channel 0)" if spec.per_channel else f" ({x.shape[1]} channels)"))
    bottom.set_ylabel("y")
    bottom.set_xlabel("frame t")
    bottom.set_ylim(-4.5, 4.5)
    top.set_title(title or f"{name}: {_mode_words(spec)}", loc="left")


def _mode_words(spec) -> str:
    pool = "each channel alone" if spec.per_channel else "all channels"
    mode = {"frame": "frame t alone", "cumulative": "frames 0..t", "ema": f"EMA, decay {spec.decay}",
            "global": "all frames (not causal)"}[spec.time.value]
    return f"{pool}, {mode}"


def _norm_figure(name):
    def draw(plt):
        fig, axes = plt.subplots(2, 1, figsize=(8, 4.4), sharex=True, gridspec_kw={"hspace": 0.15})
        _norm_panels(plt, axes, name, example_signal())
        axes[0].legend(loc="upper left", frameon=False, ncol=2)
        return fig
    return draw


def _compare(plt):
    fig, axes = plt.subplots(2, 3, figsize=(12, 4.6), sharex=True, sharey="row",
                             gridspec_kw={"hspace": 0.15, "wspace": 0.06})
    x = example_signal()
    for k, (name, words) in enumerate((("cln", "cumulative (cln)"), ("emaln", "EMA, decay 0.99 (emaln)"),
                                       ("gln", "global (gln)"))):
        _norm_panels(plt, axes[:, k], name, x, title=words)
        if k:
            axes[0, k].set_ylabel("")
            axes[1, k].set_ylabel("")
    axes[0, 0].legend(loc="upper left", frameon=False)
    return fig


# ---------------------------------------------------------------- numerics: the DC offset

def _dc_offset(plt):
    import numpy as np
    import torch

    import normlib
    from normlib.models import cumulative_ln_formula

    offsets = 10 ** np.arange(0, 5.01, 0.25)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(2, 64, 500, generator=g, dtype=torch.float64)
    curves = {("cln", False): [], ("cln", True): [], ("ccln", False): [], ("ccln", True): []}
    for off in offsets:
        x = (noise + off).float()  # the float32 input; the oracle runs on the same values in float64
        for (name, formula), errs in curves.items():
            ref = normlib.reference.REFERENCES[name](x.double())
            y = (cumulative_ln_formula(x, per_channel=name == "ccln") if formula
                 else normlib.functional.norm(name, x, backend="torch"))
            errs.append(float((y.double() - ref).norm() / ref.norm()))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ceiling = 3.0
    styles = {("cln", False): (BLUE, "-", "o", "normlib cln"), ("ccln", False): (GREEN, "-", "s", "normlib ccln"),
              ("cln", True): (RED, "--", "o", "formula, pooled (cln)"),
              ("ccln", True): (ORANGE, "--", "s", "formula, per channel (ccln)")}
    for key, errs in curves.items():
        color, ls, marker, label = styles[key]
        e = np.array(errs)
        bad = ~np.isfinite(e) | (e > ceiling)
        ax.plot(offsets[~bad], np.maximum(e[~bad], 1e-17), color=color, ls=ls, marker=marker, ms=3, label=label)
        if bad.any():
            ax.plot(offsets[bad], np.full(bad.sum(), ceiling), color=color, ls="none", marker="x", ms=6)
    ax.axhline(ceiling, color="k", lw=0.5, ls=":")
    ax.text(offsets[0], ceiling * 1.3, "NaN or > 3 (×)", fontsize=8, va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1e-9, 30)
    ax.set_xlabel("DC offset added to unit-variance noise")
    ax.set_ylabel("relative error of y, float32\n(against float64)")
    ax.set_title("(2, 64, 500) float32: ‖y − ref‖ / ‖ref‖", loc="left")
    ax.legend(frameon=False, fontsize=8, loc="center left")
    return fig


# ---------------------------------------------------------------- benchmarks/RESULTS.md as charts

def _results():
    sys.path.insert(0, str(HERE))
    import results

    return results, results.tables()


def _source(results, t) -> str:
    c = results.commit_of(t.section_text)
    return f"benchmarks/RESULTS.md, {t.section}" + (f", commit {c}" if c else "")


def _models_gpu(plt):
    import numpy as np

    results, tabs = _results()
    tasnet = results.find(tabs, section="Models on the GPU", caption="Causal Conv-TasNet", columns=["norm layers"])
    tcn = results.find(tabs, section="Models on the GPU", caption="Channels-last TCN", columns=["norm layers"])
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.4), gridspec_kw={"hspace": 0.55, "wspace": 0.25})
    for row, (t, what) in enumerate(((tasnet, "Conv-TasNet, 49 norms on (4, 512, 3999)"),
                                     (tcn, "channels-last TCN, 17 norms on (4, 4000, 256)"))):
        cols = [results._plain(h) for h in t.header[1:]]
        labels = [results._plain(r[0]) for r in t.rows]
        for k, part in enumerate(("training step", "inference")):
            ax = axes[row, k]
            width = 0.8 / len(labels)
            for j, r in enumerate(t.rows):
                vals = [results.pair(c) for c in r[1:]]
                xs = [i + (j - (len(labels) - 1) / 2) * width for i, v in enumerate(vals) if v]
                hs = [v[k] for v in vals if v]
                color = BLUE if "normlib" in labels[j] else (RED if "formula" in labels[j] else None)
                bars = ax.bar(xs, hs, width, label=labels[j], color=color)
                ax.bar_label(bars, fmt="%.1f", fontsize=6.5, padding=1)
            ax.set_xticks(np.arange(len(cols)), [textwrap.fill(c, 16) for c in cols], fontsize=7.5)
            ax.set_ylabel("ms (median)")
            ax.set_title(f"{what}: {part}", loc="left", fontsize=9)
        axes[row, 0].legend(frameon=False, fontsize=7, loc="upper right")
    fig.text(0.01, -0.02, f"{_source(results, tasnet)}; lower is better; an empty slot was not timed",
             fontsize=7, color=GREY)
    return fig


def _kernels_large(plt):
    import numpy as np

    results, tabs = _results()
    t = results.find(tabs, section="Kernels on the GPU", caption="Large shapes", columns=["norm", "B, C, T"])
    configs = [results._plain(h) for h in t.header[2:]]
    rows = [f"{r[0]} ({r[1]})" for r in t.rows]
    fwd = np.array([[results.pair(c)[0] for c in r[2:]] for r in t.rows])
    bwd = np.array([[results.pair(c)[1] for c in r[2:]] for r in t.rows])
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.26 * len(rows) + 1.8), sharey=True, gridspec_kw={"wspace": 0.05})
    for ax, data, what in ((axes[0], fwd, "forward"), (axes[1], bwd, "backward")):
        im = ax.imshow(data, cmap="viridis", vmin=0, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(data):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6.5, color="k" if v > 0.55 else "w")
        ax.set_xticks(range(len(configs)), configs, rotation=30, ha="right", fontsize=7.5)
        ax.set_title(f"{what}: fraction of a copy's bandwidth", loc="left", fontsize=9)
        ax.spines[:].set_visible(False)
    axes[0].set_yticks(range(len(rows)), rows, fontsize=7)
    fig.colorbar(im, ax=axes, fraction=0.025, pad=0.01, label="1.0 = x.clone()")
    fig.text(0.01, -0.01, f"{_source(results, t)}; higher is better (cells marked † in RESULTS.md were re-timed "
             "with ab.py)", fontsize=7, color=GREY)
    return fig


def _kernels_compile(plt):
    import numpy as np

    results, tabs = _results()
    t = results.find(tabs, section="Kernels on the GPU", caption="Against torch.compile", columns=["norm"])
    configs = [results._plain(h) for h in t.header[1:5]]
    norms = [results._plain(r[0]) for r in t.rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True, gridspec_kw={"wspace": 0.05})
    y = np.arange(len(norms))
    h = 0.8 / len(configs)
    for k, (ax, what) in enumerate(zip(axes, ("forward", "training step"))):
        for j, cfg in enumerate(configs):
            vals = [results.pair(r[1 + j])[k] for r in t.rows]
            ax.barh(y + (j - (len(configs) - 1) / 2) * h, vals, h, label=cfg)
        ax.axvline(1, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("× faster than torch.compile of the reference (log)")
        ax.set_title(f"{what}, (16, 512, 16000)", loc="left", fontsize=9)
    axes[0].set_yticks(y, norms)
    axes[0].invert_yaxis()
    axes[1].legend(frameon=False, fontsize=7, loc="lower right")
    fig.text(0.01, -0.03, f"{_source(results, t)}; right of the line normlib is faster", fontsize=7, color=GREY)
    return fig


def _cpu(plt):
    import numpy as np

    results, tabs = _results()
    t = results.find(tabs, section="The CPU", columns=["norm", "against"])
    cols = [results._plain(h) for h in t.header[2:]]
    rows = [f"{results._plain(r[0])} / {results._plain(r[1])}" for r in t.rows]
    ratios = np.array([[results.numbers(c)[1] for c in r[2:]] for r in t.rows])
    fig, ax = plt.subplots(figsize=(8, 4))
    y = np.arange(len(rows))
    h = 0.8 / len(cols)
    for j, c in enumerate(cols):
        ax.barh(y + (j - (len(cols) - 1) / 2) * h, ratios[:, j], h, label=c)
    ax.axvline(1, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(y, rows)
    ax.invert_yaxis()
    ax.set_xlabel("normlib's time ÷ the baseline's (log); left of the line normlib is faster")
    ax.set_title("CPU, 2 cores, PyTorch backend: normlib against the formula and PyTorch's norms", loc="left",
                 fontsize=9)
    ax.legend(frameon=False, fontsize=7, loc="lower right")
    fig.text(0.01, -0.03, _source(results, t), fontsize=7, color=GREY)
    return fig


# ---------------------------------------------------------------- the kernel: tiles and look-back

def lookback_schedule(n_tiles: int = 8, started: int = 6, window: int = 2):
    """A snapshot of one sequence's forward tiles: tiles 0..started-1 took tickets in order; a tile's status
    is 'P' (its inclusive prefix is published), 'A' (its aggregate only, still looking back) or '-' (no
    ticket yet). The last started tile looks back over windows of ``window`` records until it meets a 'P'.
    Returns the statuses and the tiles the last one reads."""
    status = ["P"] * (started - 3) + ["A", "A", "A"] + ["-"] * (n_tiles - started)
    me, read = started - 1, []
    k = me - 1
    while k >= 0:
        win = list(range(k, max(k - window, -1), -1))
        read.append(win)
        if any(status[i] == "P" for i in win):
            break
        k -= window
    return status, read


def _kernel_lookback(plt):
    from matplotlib.patches import FancyArrowPatch, Rectangle

    n_tiles, chunks = 8, 4
    status, read = lookback_schedule(n_tiles)
    me = max(i for i, s in enumerate(status) if s != "-")
    fig, ax = plt.subplots(figsize=(10, 3.9))
    colors = {"P": "#2ca02c", "A": "#bcdf9a", "-": "#eeeeee"}
    for i, s in enumerate(status):
        face = ORANGE if i == me else colors[s]
        ax.add_patch(Rectangle((i, 0), 0.94, chunks, facecolor=face, edgecolor="k", lw=0.8))
        for c in range(1, chunks):
            ax.plot([i, i + 0.94], [c, c], color="k", lw=0.4, ls=":")
        label = {"P": "inclusive\nprefix", "A": "aggregate\nonly", "-": "no ticket\nyet"}[s]
        if i == me:
            label = "looking\nback"
        ax.text(i + 0.47, chunks / 2, label, ha="center", va="center", fontsize=7.5)
        ax.text(i + 0.47, chunks + 0.25, f"ticket {i}" if s != "-" else "", ha="center", fontsize=7)
    for step, win in enumerate(read):
        lo, hi = min(win), max(win)
        ax.add_patch(FancyArrowPatch((me + 0.3, -0.3 - 0.55 * step), (lo + 0.2, -0.3 - 0.55 * step),
                                     arrowstyle="-|>", mutation_scale=10, color=RED, lw=1.2))
        ax.text(lo - 0.05, -0.3 - 0.55 * step, f"window {step + 1}: tiles {lo}..{hi}", ha="right",
                va="center", fontsize=7, color=RED)
    ax.annotate("BLOCK_C channels\n(one chunk)", xy=(n_tiles - 0.05, 0.5), xytext=(n_tiles + 0.25, 0.5),
                va="center", fontsize=7, arrowprops=dict(arrowstyle="-", lw=0.5))
    ax.annotate("", xy=(0, chunks + 0.7), xytext=(1 - 0.06, chunks + 0.7),
                arrowprops=dict(arrowstyle="<->", lw=0.6))
    ax.text(0.47, chunks + 0.85, "BLOCK_T frames", ha="center", fontsize=7)
    ax.set_xlim(-1.6, n_tiles + 1.4)
    ax.set_ylim(-0.4 - 0.55 * len(read), chunks + 1.2)
    ax.set_xlabel("frames of one sequence →  (one tile: all C channels × BLOCK_T frames)")
    ax.set_yticks([])
    ax.set_xticks([])
    ax.spines[:].set_visible(False)
    return fig


FIGURES = {**{f"norm-{n}.svg": _norm_figure(n) for n in NORMS}, "compare.svg": _compare,
           "dc-offset.svg": _dc_offset, "models-gpu.svg": _models_gpu, "kernels-large.svg": _kernels_large,
           "kernels-compile.svg": _kernels_compile, "cpu.svg": _cpu, "kernel-lookback.svg": _kernel_lookback}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--force", action="store_true", help="redraw even if the inputs are unchanged")
    args = p.parse_args(argv)
    for path in build(force=args.force):
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
