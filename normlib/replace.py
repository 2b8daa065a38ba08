"""Drop-in replacement: :func:`replace_norms` swaps the norms of an existing model for normlib layers, in place.

Each norm it knows is *read* (channels, eps, layout, weight, bias) and, where a normlib norm computes the same
thing, rebuilt as that layer with the weights carried over. Foreign classes (asteroid, SpeechBrain, the
Conv-TasNet code bases) are recognized by class name and checked by their parameters' names and shapes,
without importing their packages. The table, with the source each entry was checked against, is on
docs/guide/replace.md.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import sys
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase
from torch.nn.modules.instancenorm import _InstanceNorm

from .modules import NormLayer
from .registry import get


class Swapped(NamedTuple):
    """One norm swapped: its qualified name in the model (the first, if shared), its old class, the new
    layer's normlib name (a callable's result: its class name) and the new module."""
    name: str
    old: type
    new: str
    module: nn.Module


class Left(NamedTuple):
    """One norm recognized but left in place, and why."""
    name: str
    cls: type
    reason: str


@dataclass
class ReplaceReport:
    """What :func:`replace_norms` swapped and what it left, in the model's order."""
    swapped: list[Swapped] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"ReplaceReport({len(self.swapped)} swapped, {len(self.left)} left)"

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)} norm(s), left {len(self.left)}"]
        lines += [f"  swapped {s.name}: {s.old.__name__} -> {s.new}"
                  + (f"({s.module.extra_repr()})" if isinstance(s.module, NormLayer) else "") for s in self.swapped]
        lines += [f"  left    {x.name}: {x.cls.__name__}: {x.reason}" for x in self.left]
        return "\n".join(lines)


class _Read(NamedTuple):
    """What a norm computes, read off the module. ``target`` is normlib's exact counterpart (None: there is
    none, for ``reason``); the weight and bias may have any shape of C elements ((1, C, 1), (C, 1), ...)."""
    num_channels: int
    eps: float
    layout: str
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    target: str | None
    reason: str = ""
    eps_mode: str = "inside"


# ---------------------------------------------------------------------------------------------------------
# Readers. Each returns a _Read, a string (a norm, but one whose settings cannot be read: the reason) or None
# (not a norm this module knows).
# ---------------------------------------------------------------------------------------------------------

def _real(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, numbers.Real)


def _subclass_note(m, base) -> str:
    return (f"a subclass of nn.{base.__name__} whose forward may differ: not swapped unless mapped "
            f"(mapping={{{type(m).__name__}: ...}})")


def _read_torch(m):
    """PyTorch's own norms (subclasses are read as their base, but swapped only when mapped)."""
    if isinstance(m, nn.GroupNorm):
        C, G = m.num_channels, m.num_groups
        target = "gln" if G == 1 else "instln" if G == C else None
        reason = "" if target else (f"num_groups={G}: groups of {C // G} channels, and normlib pools all channels "
                                    "or each channel alone")
        base = nn.GroupNorm
    elif isinstance(m, nn.InstanceNorm1d):
        C, target, reason, base = m.num_features, "instln", "", nn.InstanceNorm1d
        if m.track_running_stats:
            target, reason = None, ("track_running_stats=True: in eval mode it normalizes with running averages, "
                                    "which normlib layers do not keep")
    elif isinstance(m, nn.BatchNorm1d):
        C, target, base = m.num_features, None, nn.BatchNorm1d
        reason = "batch statistics (running averages in eval mode): no normlib norm computes them"
    elif isinstance(m, nn.LayerNorm):
        if len(m.normalized_shape) != 1:
            return (f"normalizes the last {len(m.normalized_shape)} dims {tuple(m.normalized_shape)}; "
                    "normlib pools channels and frames of (B, C, T) inputs")
        C, target, base = m.normalized_shape[0], None, nn.LayerNorm
        # most nn.LayerNorms sit in transformer blocks, on inputs of any rank: swapped only when asked
        reason = ("normalizes the last dim of an input of any rank: on (B, T, C) inputs it is frameln with "
                  "layout 'b t c'; swap it with mapping={nn.LayerNorm: 'frameln'} (or 'cln', ...)")
    elif isinstance(m, _BatchNorm):  # BatchNorm2d/3d, SyncBatchNorm, asteroid's BatchNorm
        return "batch statistics (running averages in eval mode): no normlib norm computes them"
    elif isinstance(m, _InstanceNorm):
        return "normalizes 4-D or 5-D feature maps; normlib layers take (B, C, T)"
    elif isinstance(m, _NormBase):
        return "a batch or instance norm of another kind: no normlib counterpart"
    elif isinstance(m, getattr(nn, "RMSNorm", ())):
        return "RMS norm (no mean subtracted): no normlib counterpart"
    else:
        return None
    if type(m) is not base and target is not None:
        target, reason = None, _subclass_note(m, base)
    return _Read(C, float(m.eps), "b t c" if base is nn.LayerNorm else "b c t", m.weight, m.bias, target, reason)


def _forward_default(m, name):
    """The default of ``forward``'s argument ``name`` (asteroid: ``forward(self, x, EPS=1e-8)``)."""
    try:
        p = inspect.signature(type(m).forward).parameters.get(name)
    except (TypeError, ValueError):
        return None
    return float(p.default) if p is not None and _real(p.default) else None


def _module_eps(m):
    """The module-level ``EPS`` of the file that defines the class (kaituoxu's, SpeechBrain's conv_tasnet.py:
    1e-8; ESPnet's tcn.py: float32's machine epsilon)."""
    eps = getattr(sys.modules.get(type(m).__module__), "EPS", None)
    return float(eps) if _real(eps) else None


def _pair(m, w_name, b_name):
    """The two affine tensors (parameters or plain tensors), if both are tensors of one shape."""
    w, b = getattr(m, w_name, None), getattr(m, b_name, None)
    if isinstance(w, torch.Tensor) and isinstance(b, torch.Tensor) and w.shape == b.shape:
        return w, b
    return None


def _read_asteroid(target):
    """asteroid 0.7 ``masknn/norms.py``: gamma and beta of shape (C,), eps a default of ``forward``
    (``EPS=1e-8``) inside the sqrt, channels at dim 1."""
    def read(m):
        wb = _pair(m, "gamma", "beta")
        if wb is None or wb[0].dim() != 1:
            return "an unknown variant: asteroid's has gamma and beta of shape (C,)"
        eps = _forward_default(m, "EPS")
        if eps is None:
            return "an unknown variant: asteroid's forward(x, EPS=1e-8) gives its eps"
        return _Read(wb[0].numel(), eps, "b c t", *wb, target)
    return read


def _read_conv_tasnet_cln(m):
    """The official Conv-TasNet's ``cLN`` (naplab, utility/models.py): cumulative over channels and frames,
    ``gain`` and ``bias`` of shape (1, C, 1) (plain tensors of ones and zeros when not trainable), ``eps``."""
    wb = _pair(m, "gain", "bias")
    if wb is None or wb[0].dim() != 3 or wb[0].shape[0] != 1 or wb[0].shape[2] != 1 or not _real(
            getattr(m, "eps", None)):
        return "an unknown variant: Conv-TasNet's cLN has gain and bias of shape (1, C, 1) and an eps"
    w, b = wb
    if not isinstance(w, nn.Parameter) and bool((w == 1).all()) and bool((b == 0).all()):
        w = b = None  # trainable=False: a fixed identity affine
    return _Read(wb[0].shape[1], float(m.eps), "b c t", w, b, "cln")


def _read_tasnet_family(target):
    """``GlobalLayerNorm`` / ``ChannelwiseLayerNorm`` of kaituoxu's Conv-TasNet (gamma, beta (1, C, 1)),
    SpeechBrain's conv_tasnet.py (gamma, beta (1, 1, C): channels last) and ESPnet's tcn.py ((1, C, 1) and a
    ``shape`` of "BDT" or "BTD"): eps is the defining file's ``EPS``, inside the sqrt."""
    def read(m):
        wb = _pair(m, "gamma", "beta")
        if wb is None or wb[0].dim() != 3 or wb[0].shape[0] != 1 or 1 not in wb[0].shape[1:]:
            return None
        w, b = wb
        C = w.numel()
        shape = getattr(m, "shape", None)
        if shape in ("BDT", "BTD"):
            layout = "b c t" if shape == "BDT" else "b t c"
        elif C == 1:
            return "one channel: its gamma of shape (1, 1, 1) does not tell its layout"
        else:
            layout = "b c t" if w.shape[1] == C else "b t c"
        eps = _module_eps(m)
        if eps is None:
            return f"its eps is not readable: the file that defines {type(m).__name__} has no number EPS"
        return _Read(C, eps, layout, w, b, target)
    return read


def _read_global_layer_norm(m):
    """kaituoxu / SpeechBrain conv_tasnet / ESPnet (above), or SpeechBrain's dual_path.py: ``weight`` and
    ``bias`` of shape (C, 1), ``eps`` (1e-8), over channels and frames of (N, C, L)."""
    read = _read_tasnet_family("gln")(m)
    if read is not None:
        return read
    if not (_real(getattr(m, "eps", None)) and isinstance(getattr(m, "dim", None), int)):
        return "an unknown variant of GlobalLayerNorm"
    wb = _pair(m, "weight", "bias")
    if wb is None:
        if getattr(m, "weight", 0) is None and getattr(m, "bias", 0) is None:  # elementwise_affine=False
            return _Read(m.dim, float(m.eps), "b c t", None, None, "gln")
        return "an unknown variant of GlobalLayerNorm"
    if wb[0].shape == (m.dim, 1, 1):
        return ("SpeechBrain's dual-path gLN for 4-D (N, C, K, S) inputs (weight of shape (C, 1, 1)); "
                "normlib layers take 3-D inputs")
    if wb[0].shape != (m.dim, 1):
        return "an unknown variant of GlobalLayerNorm"
    return _Read(m.dim, float(m.eps), "b c t", *wb, "gln")


def _read_dual_path_cln(m):
    """SpeechBrain's dual_path.py ``CumulativeLayerNorm``: despite its name an ``nn.LayerNorm(C)`` applied to
    every frame of (N, C, L) (transposed to (N, L, C) and back), so per-frame: frameln."""
    if type(m).__mro__[1:2] != (nn.LayerNorm,) or len(m.normalized_shape) != 1:
        return "an unknown variant: SpeechBrain's CumulativeLayerNorm subclasses nn.LayerNorm(C)"
    return _Read(m.normalized_shape[0], float(m.eps), "b c t", m.weight, m.bias, "frameln")


_FOREIGN = {
    # asteroid 0.7, asteroid/masknn/norms.py
    "GlobLN": _read_asteroid("gln"),
    "ChanLN": _read_asteroid("frameln"),
    "CumLN": _read_asteroid("cln"),
    "FeatsGlobLN": _read_asteroid("instln"),
    # the official Conv-TasNet (naplab), utility/models.py
    "cLN": _read_conv_tasnet_cln,
    # kaituoxu's Conv-TasNet, SpeechBrain (conv_tasnet.py, dual_path.py), ESPnet (tcn.py)
    "GlobalLayerNorm": _read_global_layer_norm,
    "ChannelwiseLayerNorm": _read_tasnet_family("frameln"),
    "CumulativeLayerNorm": _read_dual_path_cln,
}


def _read_normlib(m: NormLayer):
    # an EMA layer's decay is not carried: a target takes its own (or a partial's)
    return _Read(m.num_channels, m.eps, m.layout, m.weight, m.bias, m.spec.name, "", m.eps_mode)


def _read(m):
    if isinstance(m, NormLayer):
        return _read_normlib(m)
    reader = _FOREIGN.get(type(m).__name__)
    if reader is not None:
        read = reader(m)
        if read is not None:
            return read
    return _read_torch(m)


def _looks_like_a_norm(m) -> bool:
    """A leaf module whose class name says norm: reported as left (not recognized) so that none goes unseen."""
    return "norm" in type(m).__name__.lower() and not m._modules


# ---------------------------------------------------------------------------------------------------------
# The mapping.
# ---------------------------------------------------------------------------------------------------------

def _layer_factory(v):
    """A normlib layer class or a functools.partial of one, else None."""
    func = v.func if isinstance(v, functools.partial) else v
    return v if isinstance(func, type) and issubclass(func, NormLayer) else None


def _check_mapping(mapping) -> dict:
    """{key: None | a layer class or partial of one | a callable(module) -> module}."""
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise TypeError(f"mapping must be a dict {{class or class name: normlib name, layer class or callable}}, "
                        f"got {type(mapping).__name__}")
    out = {}
    for key, value in mapping.items():
        if not (isinstance(key, str) or (isinstance(key, type) and issubclass(key, nn.Module))):
            raise TypeError(f"mapping's keys must be nn.Module classes or class names, got {key!r}")
        what = f"mapping[{key.__name__ if isinstance(key, type) else repr(key)}]"
        if value is None or _layer_factory(value) is not None:
            out[key] = value
        elif isinstance(value, str):
            try:
                cls = get(value)
            except KeyError as e:
                raise ValueError(f"{what}: {e.args[0]}") from None
            if _layer_factory(cls) is None:
                raise TypeError(f"{what}: {value!r} is registered as {cls.__name__}, not a normlib layer class "
                                "(NormLayer); map it to a callable(module) -> module instead")
            out[key] = cls
        elif isinstance(value, type):
            raise TypeError(f"{what}: a class must be a normlib layer class (NormLayer), got {value.__name__}; "
                            "for another module pass a callable(module) -> module")
        elif callable(value):
            out[key] = value
        else:
            raise TypeError(f"{what} must be a normlib name, a normlib layer class, a callable(module) -> module "
                            f"or None, got {value!r}")
    return out


_MISSING = object()


def _mapped(mapping: dict, m):
    """(key, value) of the mapping entry for ``m``'s exact class: by class, by "module.Qualname", by name."""
    cls = type(m)
    for key in (cls, f"{cls.__module__}.{cls.__qualname__}", cls.__name__):
        if key in mapping:
            return key, mapping[key]
    return None, _MISSING


# ---------------------------------------------------------------------------------------------------------
# Building the new layer.
# ---------------------------------------------------------------------------------------------------------

def _build(factory, read: _Read, old: nn.Module) -> nn.Module:
    like = read.weight if read.weight is not None else read.bias
    kwargs = dict(eps=read.eps, eps_mode=read.eps_mode, layout=read.layout,
                  elementwise_affine=like is not None, bias=read.bias is not None,
                  device=None if like is None else like.device, dtype=None if like is None else like.dtype)
    if isinstance(factory, functools.partial):  # the partial's own settings win
        kwargs = {k: v for k, v in kwargs.items() if k not in factory.keywords}
    new = factory(read.num_channels, **kwargs)
    with torch.no_grad():
        for name, src in (("weight", read.weight), ("bias", read.bias)):
            dst = getattr(new, name, None)
            if dst is None:
                continue
            if src is None:  # a bias without a weight: the weight is fixed at one
                dst.fill_(1).requires_grad_(False)
                continue
            dst.copy_(src.detach().reshape(dst.shape))
            dst.requires_grad_(isinstance(src, nn.Parameter) and src.requires_grad)
    return new.train(old.training)


def _new_name(new: nn.Module) -> str:
    return new.spec.name if isinstance(new, NormLayer) else type(new).__name__


# ---------------------------------------------------------------------------------------------------------
# The walk.
# ---------------------------------------------------------------------------------------------------------

class _Plan(NamedTuple):
    make: object  # a function () -> new module; None: leave it
    reason: str  # why it is left ('' for a normlib layer: nothing to report)
    read: _Read | None = None  # what the new layer is built from (None: a callable's)


def _plan(m, mapping):
    """What to do with one module: _Plan (a norm: swap or leave), or None (not a norm: look inside)."""
    key, value = _mapped(mapping, m)
    if value is not _MISSING:
        label = key.__name__ if isinstance(key, type) else repr(key)
        if value is None:
            return _Plan(None, f"kept: mapping[{label}] is None")
        if _layer_factory(value) is None:  # a callable(module) -> module
            def make(value=value):
                new = value(m)
                if not isinstance(new, nn.Module):
                    raise TypeError(f"mapping[{label}] must return an nn.Module, got {type(new).__name__}")
                return new
            return _Plan(make, "")
        read = _read(m)
        if not isinstance(read, _Read):
            why = read or "not a norm normlib can read"
            raise ValueError(f"mapping[{label}]: cannot read the channels, eps and weights of "
                             f"{type(m).__name__} ({why}); map it to a callable(module) -> module instead")
        return _Plan(functools.partial(_build, value, read, m), "", read)
    if isinstance(m, NormLayer):
        return _Plan(None, "")  # already normlib: nothing to say
    read = _read(m)
    if read is None:
        return _Plan(None, "not recognized: map it by class to swap it") if _looks_like_a_norm(m) else None
    if isinstance(read, str):
        return _Plan(None, read)
    if read.target is None:
        return _Plan(None, read.reason)
    return _Plan(functools.partial(_build, get(read.target), read, m), "", read)


def _probe(model, example_inputs, modules):
    """The shapes each of ``modules`` is called with when the model runs on ``example_inputs`` (in eval mode,
    without autograd; every module's mode is restored)."""
    seen = {id(m): [] for m in modules}

    def hook(module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        seen[id(module)].append(tuple(x.shape) if isinstance(x, torch.Tensor) else None)

    modes = [(m, m.training) for m in model.modules()]
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        model.eval()
        with torch.no_grad():
            args = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
            model(*args)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes:
            m.training = mode
    return seen


def _fits(read: _Read, shapes) -> str:
    """Why the swap would fail on the shapes seen ('' if it fits)."""
    for shape in shapes:
        if shape is None or len(shape) != 3:
            return f"called on an input of shape {shape}: normlib layers take 3-D (B, C, T) or (B, T, C)"
        c = shape[1] if read.layout == "b c t" else shape[2]
        if c != read.num_channels:
            return f"called on shape {shape}, whose channel dim (layout {read.layout!r}) is not {read.num_channels}"
    return ""


def replace_norms(model: nn.Module, mapping: dict | None = None, *,
                  example_inputs: object = None) -> ReplaceReport:
    """Swap the norms of ``model`` for normlib layers, in place, with their weights; returns a report.

    Without ``mapping`` a norm is swapped only where a normlib norm computes the same thing, so the model's
    outputs are unchanged (within float rounding): ``nn.GroupNorm(1, C)`` → ``gln``; ``nn.GroupNorm(C, C)``
    and ``nn.InstanceNorm1d(C)`` → ``instln``; asteroid's ``GlobLN``, ``ChanLN``, ``CumLN``, ``FeatsGlobLN``
    → ``gln``, ``frameln``, ``cln``, ``instln``; the official Conv-TasNet's ``cLN`` → ``cln``; kaituoxu's,
    SpeechBrain's and ESPnet's ``GlobalLayerNorm`` → ``gln`` and ``ChannelwiseLayerNorm`` → ``frameln``;
    SpeechBrain's dual-path ``CumulativeLayerNorm`` (a per-frame norm) → ``frameln``. Each keeps its eps, its
    layout and its parameters' values, device, dtype and ``requires_grad``, and the module's training mode.
    Other norms are left and reported (``nn.GroupNorm(4, C)``, ``nn.BatchNorm1d``, ``nn.LayerNorm``, ...).

    Args:
        model: the model; its sub-modules are replaced. A module shared under several names is swapped once
            and the same new layer takes every place. ``model`` itself being a norm is refused
            (``ValueError``): there is no place to put the new layer.
        mapping: ``{key: target}`` to choose other targets. A key is a class (matched exactly, not its
            subclasses) or a class name (``"GlobLN"``, or ``"module.Qualname"``). A target is a normlib
            name (``"cln"``), a normlib layer class or a ``functools.partial`` of one (its keywords win), a
            ``callable(module) -> module``, or None (keep the module). A name or class target takes the
            module's channels, eps, layout and weights, even where the math changes
            (``{nn.GroupNorm: "cln"}`` makes a Conv-TasNet causal).
        example_inputs: optional inputs of ``model`` (a tensor or a tuple of positional arguments). The
            model runs once on them (eval mode, no autograd, modes restored) and a norm called on an
            input that is not 3-D with its channels where its layout puts them is left instead of swapped.

    Returns:
        A :class:`ReplaceReport`: ``.swapped`` (name, old class, new name, new module) and ``.left``
        (name, class, reason); ``print(report)`` shows both.

    The new layers have new parameter objects: build the optimizer after the swap, and load an old
    checkpoint before it (the parameter names change, ``gamma`` → ``weight``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    mapping = _check_mapping(mapping)
    root = _plan(model, mapping)
    if root is not None and (root.make is not None or (not isinstance(model, NormLayer) and _read(model) is not None)):
        raise ValueError(f"model is itself a norm ({type(model).__name__}): replace_norms replaces the norms "
                         "inside a model; build the layer directly, or wrap it (nn.Sequential(norm)) and take "
                         "the swapped module back out")

    # one entry per distinct module, in the order of the walk; every (parent, name) place it holds
    plans: dict[int, tuple[str, nn.Module, _Plan]] = {}
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    visited = {id(model)}

    def walk(parent, prefix):
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) in places:
                places[id(child)].append((parent, name))
                continue
            if id(child) in visited:
                continue
            visited.add(id(child))
            plan = _plan(child, mapping)
            if plan is None:
                walk(child, f"{prefix}{name}.")
                continue
            plans[id(child)] = (prefix + name, child, plan)
            places[id(child)] = [(parent, name)]

    walk(model, "")

    misfits = {}
    if example_inputs is not None:
        swaps = [m for _, m, p in plans.values() if p.make is not None]
        seen = _probe(model, example_inputs, swaps)
        for _, m, p in plans.values():
            if p.make is not None and p.read is not None and (why := _fits(p.read, seen[id(m)])):
                misfits[id(m)] = why

    report = ReplaceReport()
    for key, (qual, old, plan) in plans.items():
        if plan.make is None or key in misfits:
            if plan.reason or key in misfits:
                report.left.append(Left(qual, type(old), misfits.get(key, plan.reason)))
            continue
        new = plan.make()
        for parent, name in places[key]:
            setattr(parent, name, new)
        report.swapped.append(Swapped(qual, type(old), _new_name(new), new))
    return report
