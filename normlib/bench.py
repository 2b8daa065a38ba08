"""What the norms cost on this machine: ``python -m normlib bench`` (or ``normlib bench``).

Times, on the current device (CUDA when present, else the CPU), the forward (no grad), the forward +
backward and the streaming call (a few frames, a state in and out) of the chosen norms, each beside the
baselines a user would otherwise write or use: the ten-line sum/sumsq formula (pooled, or per channel for
the per-channel norms), PyTorch's own equivalent (``nn.GroupNorm(1, C)`` for gln, ``nn.InstanceNorm1d`` for
instln, ``nn.LayerNorm(C)`` for frameln) and a copy (``x.clone()``). Timings are medians from
``torch.utils.benchmark`` (which synchronizes CUDA); every ratio compares two timings of the same run.
"""
from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.utils import benchmark as tbench

from .models import MODELS, SIZES, CumulativeLayerNormFormula
from .registry import available, get

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
SHAPES = {"cpu": [(4, 512, 4000), (16, 512, 1000)], "cuda": [(4, 512, 4000), (16, 512, 16000)]}
QUICK_SHAPES = [(2, 64, 500)]
STREAM_CHANNELS, STREAM_FRAMES = (64, 256, 512), (1, 4, 16)
QUICK_STREAM_CHANNELS, QUICK_STREAM_FRAMES = (256,), (1, 16)


def _native(spec, C):
    """PyTorch's own layer of the same math, and how it reads a "b c t" tensor; None where there is none."""
    if spec.time.value == "global":
        return (nn.GroupNorm(1, C), None) if not spec.per_channel else (nn.InstanceNorm1d(C, affine=True), None)
    if spec.time.value == "frame":
        return nn.LayerNorm(C), lambda x: x.transpose(1, 2)
    return None


def baselines(spec, C):
    """{label: (module, input view)} that ``spec`` is compared against: the formula of its pooling (for the
    causal norms) and PyTorch's equivalent where there is one."""
    out = {}
    if spec.causal and spec.time.value != "frame":
        out["formula"] = (CumulativeLayerNormFormula(C, per_channel=spec.per_channel), None)
    native = _native(spec, C)
    if native is not None:
        out[type(native[0]).__name__] = native
    return out


@dataclass
class Row:
    what: str  # "forward", "forward+backward", "stream"
    norm: str
    shape: tuple
    dtype: str
    layout: str
    ms: dict = field(default_factory=dict)  # label -> median ms (normlib, formula, GroupNorm, ..., copy)

    def ratio(self, label):
        return self.ms["normlib"] / self.ms[label] if label in self.ms and "normlib" in self.ms else None


def _median_ms(fn, min_run_time):
    return tbench.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median * 1e3


def _calls(layer, x, view, backward):
    xv = x if view is None else view(x)
    if not backward:
        def fwd():
            with torch.no_grad():
                return layer(xv)
        return fwd
    xg = xv.detach().requires_grad_()
    params = [xg, *(p for p in layer.parameters() if p.requires_grad)]
    gy = torch.randn_like(xg)
    return lambda: torch.autograd.grad(layer(xg), params, gy)


def time_norms(norms, shapes, dtypes, layouts, backend, device, min_run_time=0.2, progress=None, rounds=1):
    """Rows of forward and forward + backward timings: each norm, its baselines and a copy, per case; ``rounds``
    alternations of the implementations."""
    rows = []
    for shape in shapes:
        B, C, T = shape
        for dt in dtypes:
            for layout in layouts:
                g = torch.Generator().manual_seed(0)
                x = torch.randn((B, C, T) if layout == "b c t" else (B, T, C), generator=g).to(device, DTYPES[dt])
                for name in norms:
                    spec = get(name).spec
                    layer = get(name)(C, layout=layout, backend=backend).to(device)
                    impls = {"normlib": (layer, None)}
                    if layout == "b c t":
                        impls.update(baselines(spec, C))
                    for what, bwd in (("forward", False), ("forward+backward", True)):
                        row = Row(what, name, shape, dt, layout)
                        calls = {}
                        for label, (module, view) in impls.items():
                            module = module.to(device) if label == "normlib" else module.to(device, DTYPES[dt])
                            calls[label] = _calls(module, x, view, bwd)
                        for _ in range(rounds):  # alternated, the best median of each: a busy machine's noise
                            for label, fn in calls.items():  # moves a ratio less
                                row.ms[label] = min(row.ms.get(label, math.inf), _median_ms(fn, min_run_time))
                        if not bwd:
                            row.ms["copy"] = _median_ms(lambda: x.clone(), min_run_time)
                        rows.append(row)
                        if progress:
                            progress()
    return rows


def time_streaming(norms, channels, frames, backend, device, min_run_time=0.2, progress=None):
    """Rows of one streaming call (B = 1, a state in and out, no grad) per causal norm, beside an
    ``nn.GroupNorm(1, C)`` call on the same tensor."""
    rows = []
    for C in channels:
        for t in frames:
            x = torch.randn(1, C, t, device=device)
            gn = nn.GroupNorm(1, C).to(device)
            for name in norms:
                spec = get(name).spec
                if not spec.causal:
                    continue
                layer = get(name)(C, backend=backend).to(device)
                with torch.no_grad():
                    _, state = layer(x, return_state=True)

                    def call(layer=layer, state=state):
                        with torch.no_grad():
                            return layer(x, state=state, return_state=True)
                row = Row("stream", name, (1, C, t), "fp32", "b c t")
                row.ms["normlib"] = _median_ms(call, min_run_time)
                row.ms["GroupNorm"] = _median_ms(_calls(gn, x, None, False), min_run_time)
                rows.append(row)
                if progress:
                    progress()
    return rows


class ModelRunner:
    """One example model (``normlib.models``) with ``norm`` in every norm slot (``name:backend`` picks a
    normlib backend), in a mode (``eager``, ``compile``, ``reduce-overhead``) and a dtype (``fp32``, or
    ``bf16`` autocast): ``step()`` runs a training step (forward, MSE, backward, Adam), ``infer()`` a
    forward under no_grad."""

    def __init__(self, model, norm, mode="eager", dtype="fp32", device="cpu", small=False):
        device = torch.device(device)
        self.mode = mode
        kwargs, B, shape = SIZES[model]["small" if small else "full"]
        name, _, backend = norm.partition(":")
        torch.manual_seed(0)
        self.model = MODELS[model](name, **kwargs, **({"backend": backend} if backend else {})).to(device)
        self.x = torch.randn((B, *shape), generator=torch.Generator().manual_seed(1)).to(device)
        with torch.no_grad():
            self.target = torch.randn_like(self.model(self.x))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")
        self.fwd = self.model if mode == "eager" else torch.compile(
            self.model, mode="reduce-overhead" if mode == "reduce-overhead" else None,
            backend="inductor" if device.type == "cuda" else "aot_eager")

    def _mark(self):
        if self.mode == "reduce-overhead":  # a new step: the CUDA graph may reuse last step's outputs
            torch.compiler.cudagraph_mark_step_begin()

    def step(self):
        self._mark()
        with self.autocast:
            loss = torch.nn.functional.mse_loss(self.fwd(self.x).float(), self.target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def infer(self):
        self._mark()
        with torch.no_grad(), self.autocast:
            return self.fwd(self.x).clone()


def time_models(models, device, small, min_run_time=0.5, progress=None, rounds=1, norms=("cln",)):
    """Rows of an eager fp32 training step of each example model with each of normlib's ``norms``, against the
    same model with the formula, PyTorch's native norm and no norm (``rounds`` alternations of all of them, as
    time_norms; the baselines are timed once a model and shared by its rows)."""
    rows = []
    for model in models:
        _, B, shape = SIZES[model]["small" if small else "full"]
        layout = "b c t" if model == "conv_tasnet" else "b t c"
        steps = {label: ModelRunner(model, label, device=device, small=small).step
                 for label in (*norms, "formula", "native", "none")}
        ms = {}
        for _ in range(rounds):
            for label, step in steps.items():
                ms[label] = min(ms.get(label, math.inf), _median_ms(step, min_run_time))
        base = {k: ms[k] for k in ("formula", "native", "none")}
        rows += [Row("model step", f"{model}: {norm}", (B, *shape), "fp32", layout, dict(normlib=ms[norm], **base))
                 for norm in norms]
        if progress:
            progress()
    return rows


def table(rows) -> str:
    """A Markdown table per kind of row: ms of normlib and of each baseline, and normlib's ratio to each."""
    out = []
    for what in dict.fromkeys(r.what for r in rows):
        mine = [r for r in rows if r.what == what]
        labels = sorted(dict.fromkeys(k for r in mine for k in r.ms if k != "normlib"), key=lambda k: k == "copy")
        out += [f"**{what}** (median ms; in brackets normlib's time over the baseline's)", "",
                "| norm | shape | dtype | layout | normlib | " + " | ".join(labels) + " |",
                "|---|---|---|---|---|" + "---|" * len(labels)]
        for r in mine:
            cells = [f"{r.ms[k]:.3f} ({r.ratio(k):.2f}×)" if k in r.ms else "" for k in labels]
            out.append(f"| {r.norm} | {'x'.join(map(str, r.shape))} | {r.dtype} | {r.layout} | "
                       f"{r.ms['normlib']:.3f} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def plot(rows, path):
    """normlib's time over each baseline's, one bar a (norm, case), for each kind of row."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install 'normlib[bench]'") from e
    kinds = list(dict.fromkeys(r.what for r in rows))
    fig, axes = plt.subplots(len(kinds), 1, figsize=(10, 3.2 * len(kinds)), squeeze=False)
    for ax, what in zip(axes[:, 0], kinds):
        mine = [r for r in rows if r.what == what]
        labels = [k for k in dict.fromkeys(k for r in mine for k in r.ms) if k not in ("normlib", "copy")]
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            xs = [j + i * width for j, r in enumerate(mine) if label in r.ms]
            ax.bar(xs, [r.ratio(label) for r in mine if label in r.ms], width, label=f"vs {label}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(mine))])
        ax.set_xticklabels([f"{r.norm}\n{'x'.join(map(str, r.shape))}" for r in mine], fontsize=7)
        ax.set_ylabel("normlib time / baseline")
        ax.set_title(what)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def environment(device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return dict(device=name, torch=torch.__version__, python=platform.python_version(),
                threads=torch.get_num_threads())


def run(args) -> int:
    """The ``bench`` command (arguments parsed by ``normlib.__main__``)."""
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety
        tqdm = None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    norms = args.norms or [n for n in available() if getattr(get(n), "spec", None) is not None]
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES[device.type])
    channels = QUICK_STREAM_CHANNELS if args.quick else STREAM_CHANNELS
    frames = QUICK_STREAM_FRAMES if args.quick else STREAM_FRAMES
    min_run_time = 0.05 if args.quick else 0.2
    causal = [n for n in norms if get(n).spec.causal]
    total = 2 * len(shapes) * len(args.dtypes) * len(args.layouts) * len(norms) \
        + len(channels) * len(frames) * len(causal) + (len(MODELS) if args.models else 0)
    bar = tqdm(total=total, desc="normlib bench", unit="case") if tqdm else None
    tick = bar.update if bar else None
    rows = time_norms(norms, shapes, args.dtypes, args.layouts, args.backend, device, min_run_time, tick,
                      rounds=1 if args.quick else 3)
    rows += time_streaming(norms, channels, frames, args.backend, device, min_run_time, tick)
    if args.models:
        rows += time_models(list(MODELS), device, small=args.quick or device.type == "cpu", progress=tick,
                            rounds=1 if args.quick else 3, norms=norms)
    if bar:
        bar.close()
    env = environment(device)
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(environment=env, rows=[dict(asdict(r), shape=list(r.shape)) for r in rows]), f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0
