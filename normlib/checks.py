"""Every input check, in one place. Each error names the argument and says what was expected."""
from __future__ import annotations

import functools
import numbers
import weakref
from typing import NamedTuple

import torch
import torch.distributed as dist

from .backends import NAMES
from .spec import NormSpec, TimeMode, _check_decay, _real, normalize_layout
from .state import NormState, describe

EPS_MODES = ("inside", "outside")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


STATE_DTYPE = torch.float64  # states keep the mean in float64 so chunking loses no digits to a DC offset


class Checked(NamedTuple):
    x: torch.Tensor  # (B, C, T) view of the input
    lengths: torch.Tensor | None  # (B,) int64 on x's device
    decay: float | None
    layout: str


def check_num_channels(num_channels) -> int:
    """A layer's C: an integer >= 0 (Python's, numpy's or a 0-d integer tensor; not a bool)."""
    if isinstance(num_channels, torch.Tensor) and num_channels.dim() == 0 and not (
            num_channels.is_floating_point() or num_channels.is_complex() or num_channels.dtype == torch.bool):
        num_channels = int(num_channels)
    if (isinstance(num_channels, bool) or not isinstance(num_channels, numbers.Integral) or num_channels < 0
            or num_channels >= 2**63):
        raise ValueError(f"num_channels must be an integer in [0, 2^63), got {num_channels!r}")
    return int(num_channels)


def check_flag(name: str, value) -> bool:
    """A layer's on/off option: what reads as a bool (_bool_like), not None; a string such as "False" would
    read as True."""
    if value is None or not _bool_like(value):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_options(spec: NormSpec, eps, eps_mode, decay, layout, backend):
    """The hyper-parameters; returns (decay as the kernels use it, layout normalized). A layer passes the
    same ones on every call, so good ones are remembered (by value and type: True is not 1); not while
    dynamo traces, which warns about a cached function (and checks once per compile anyway)."""
    if torch.compiler.is_compiling():
        return _check_options(spec, eps, eps_mode, decay, layout, backend)
    try:
        return _options_seen(spec, eps, eps_mode, decay, layout, backend)
    except TypeError:  # an unhashable argument: check it uncached, which names what is wrong
        return _check_options(spec, eps, eps_mode, decay, layout, backend)


def _check_options(spec: NormSpec, eps, eps_mode, decay, layout, backend):
    if not isinstance(spec, NormSpec):
        what = spec.__name__ if isinstance(spec, type) else type(spec).__name__ if isinstance(spec, torch.nn.Module) \
            else repr(spec)
        raise TypeError(f"spec must be a normlib.NormSpec, a layer class or the name of a norm registered with a "
                        f"NormSpec (a layer: call it, or pass layer.spec), got {what}")
    layout = normalize_layout(layout)
    if backend not in NAMES:
        raise ValueError(f"backend must be one of {NAMES}, got {backend!r}")
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode must be one of {EPS_MODES}, got {eps_mode!r}")
    # eps - eps == 0: math.isfinite, which dynamo cannot trace on a symbolic float (dynamic=True); an int
    # past float's range is refused here rather than by float() later
    if (not _real(eps) or not eps - eps == 0 or eps < 0 or (isinstance(eps, numbers.Integral) and eps > 1e308)
            or not _finite_as_float(eps)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    decay = spec.resolve_decay(decay)
    if decay is not None:
        decay = _check_decay(spec, decay)
    return decay, layout


def _finite_as_float(v) -> bool:
    """Whether float(v) is finite: a Fraction, a long double or a Decimal can be finite and past float's range.
    Python's and dynamo's symbolic numbers are checked as they are."""
    if type(v) in (int, float, torch.SymInt, torch.SymFloat):
        return True
    try:
        return float(v) - float(v) == 0
    except (OverflowError, ValueError, TypeError):
        return False


_options_seen = functools.lru_cache(maxsize=1024, typed=True)(_check_options)  # errors are never cached


def check_inputs(spec: NormSpec, x, weight, bias, eps, eps_mode, decay, lengths, state, return_state,
                 layout, backend, num_channels=None) -> Checked:
    decay, layout = check_options(spec, eps, eps_mode, decay, layout, backend)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided or x.is_nested:
        raise TypeError(f"x must be a dense (strided) tensor, got {'a nested tensor' if x.is_nested else x.layout}")
    if x.dim() != 3:
        raise ValueError(f"x must have 3 dims ({layout!r}: batch, {'channels, time' if layout == 'b c t' else 'time, channels'}), "
                         f"got shape {tuple(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be a floating tensor (float16, bfloat16, float32, float64), got {x.dtype}")
    xv = x if layout == "b c t" else x.permute(0, 2, 1)
    B, C, T = xv.shape
    if num_channels is not None and C != num_channels:
        raise ValueError(f"x has {C} channels (layout {layout!r}, shape {tuple(x.shape)}) but "
                         f"num_channels={num_channels} (a layer's, or the one passed)")

    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{name} must be a tensor of shape ({C},), got {type(p).__name__}")
        if p.shape != (C,):
            raise ValueError(f"{name} must be a tensor of shape ({C},), got {tuple(p.shape)}")
        if p.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be floating, got {p.dtype}")
        if p.device != x.device:
            raise ValueError(f"{name} is on {p.device} but x is on {x.device}")

    if lengths is not None:
        if not isinstance(lengths, torch.Tensor):
            try:
                lengths = torch.as_tensor(lengths, device=x.device)
            except (TypeError, ValueError, RuntimeError, OverflowError) as e:
                if isinstance(e, OverflowError) or "Overflow" in str(e):  # integers past int64
                    raise ValueError(f"lengths must lie in [0, T={T}], got {lengths!r}") from None
                raise TypeError(f"lengths must be a tensor or a sequence of integers, got {lengths!r}") from None
            if not lengths.numel():  # [] (B = 0) reads as float32
                lengths = lengths.long()
        if lengths.shape != (B,):
            raise ValueError(f"lengths must have shape ({B},) (one length per batch item), got {tuple(lengths.shape)}")
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise TypeError(f"lengths must be an integer tensor, got {lengths.dtype}")
        if lengths.device != x.device:
            raise ValueError(f"lengths is on {lengths.device} but x is on {x.device}")
        wraps = lengths.dtype == torch.uint64  # past 2**63 it wraps negative as int64, and is refused below
        if lengths.dtype in (torch.uint16, torch.uint32, torch.uint64):  # no min/max kernels for these
            lengths = lengths.to(torch.int64)
        if B and lengths.device.type == "meta":  # shapes only: no values to check
            pass
        elif B and not torch.compiler.is_compiling():
            lo, hi = torch.stack(torch.aminmax(lengths)).tolist()  # one device sync, not two
            if wraps and lo < 0:
                raise ValueError(f"lengths must lie in [0, T={T}], got a value of 2**63 or more (uint64)")
            if lo < 0 or hi > T:
                raise ValueError(f"lengths must lie in [0, T={T}], got values in [{lo}, {hi}]")
        elif B:  # traced: no host sync, so the check runs in the graph (a device-side assert on a GPU)
            torch._assert_async(((lengths >= 0) & (lengths <= T)).all(), "lengths must lie in [0, T]")
        lengths = lengths.to(torch.int64)

    if not _bool_like(return_state):
        raise TypeError(f"return_state must be True or False, got {return_state!r}")
    if (state is not None or return_state) and not spec.causal:
        raise ValueError(f"{spec.name!r} is not causal ({spec.time.value}): it takes no state and returns none")
    if state is not None:
        if not isinstance(state, NormState):
            raise TypeError(f"state must be a normlib.NormState, got {type(state).__name__}")
        check_state_tag(spec, decay, state)
        want = (B, C) if spec.per_channel else (B,)
        for field, t in zip(NormState._fields, state):
            if not isinstance(t, torch.Tensor) or t.shape != want:
                raise ValueError(f"state.{field} must have shape {want} for {spec.name!r} on this input, "
                                 f"got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            if t.dtype != STATE_DTYPE:
                raise TypeError(f"state.{field} must be {STATE_DTYPE}, got {t.dtype}")
            if t.device != x.device:
                raise ValueError(f"state.{field} is on {t.device} but x is on {x.device}")
        check_state_values(state)
    return Checked(xv, lengths, decay, layout)


def state_tag(spec: NormSpec, decay: float | None) -> tuple:
    """The tag of the states a norm returns and takes: its name, and its decay for EMA norms (a state holds
    statistics under its norm's weighting; under another decay its weight and spread are wrong)."""
    return spec.name, decay if spec.time is TimeMode.EMA else None


def check_state_tag(spec: NormSpec, decay: float | None, state: NormState, what: str = "state"):
    """A tagged state is taken only by the norm that made it; an untagged one (built by hand) by any."""
    if state.norm is not None and (state.norm, state.decay) != state_tag(spec, decay):
        raise ValueError(f"{what} is a state of {describe(state.norm, state.decay)}; "
                         f"{describe(*state_tag(spec, decay))} refuses it (statistics under another weighting). "
                         f"state.untagged() drops the tag, to reuse them on purpose")


def _bool_like(v) -> bool:
    """A bool, or what reads as one: None (False), the integers 0 and 1 (Python's or numpy's), and numpy's and
    torch's bools of one value. Not 1.0, nor a float tensor."""
    if v is None or isinstance(v, bool):
        return True
    if isinstance(v, numbers.Integral):
        return v in (0, 1)
    dtype, size = getattr(v, "dtype", None), getattr(v, "size", None)
    one = (v.numel() if isinstance(v, torch.Tensor) else size if isinstance(size, int) else 0) == 1
    return one and str(dtype) in ("bool", "torch.bool")


_VOUCHED: dict = {}  # id of a state's w -> (weak reference to w, w's version, m, m2, m2's version, meta)


def vouch(state: NormState, meta=None) -> NormState:
    """Remember a state that normlib returned: its w and m2 pass check_state_values, without reading them again,
    as long as they are the same tensors, unchanged in place (their version counters say so). A stream that feeds
    each call's state to the next is checked once. ``meta``: what a prepared streaming call's key holds of its
    fields (types, shapes, dtypes, devices), which the next call reads back (vouched_meta) rather than again."""
    if torch.compiler.is_compiling():  # a traced state is checked in the graph (below) each time
        return state
    w, m2 = state.w, state.m2
    key = id(w)
    _VOUCHED[key] = (weakref.ref(w, lambda _, key=key: _VOUCHED.pop(key, None)), w._version, state.m, m2,
                     m2._version, meta)
    return state


def _seen(state):
    w, m2 = state.w, state.m2
    seen = _VOUCHED.get(id(w))
    if seen is not None and seen[0]() is w and seen[2] is state.m and seen[3] is m2 and seen[1] == w._version \
            and seen[4] == m2._version:
        return seen
    return None


def _vouched(state) -> bool:
    return _seen(state) is not None


def vouched_meta(state: NormState):
    """The meta that vouch recorded with a state normlib returned, its fields the same tensors and not written in
    place since; else None."""
    seen = _seen(state)
    return None if seen is None else seen[5]


def check_state_values(state: NormState):
    """A weight and a sum of squared deviations are >= 0 (a NaN passes, as in x). Checked on CPU tensors only:
    on a GPU it would cost a host sync, or in a compiled graph a device-side assert, which leaves the process
    no usable CUDA context (lengths out of range do that; a state's values are the user's to keep); not again for
    a state normlib returned, unchanged since (vouch)."""
    if state.w.device.type != "cpu":
        return
    if torch.compiler.is_compiling():  # an assert in the graph: no host sync
        torch._assert_async(~((state.w < 0) | (state.m2 < 0) | ((state.w == 0) & (state.m2 > 0))).any(),
                            "state.w and state.m2 must be >= 0, and state.m2 0 where state.w is 0")
    elif not _vouched(state):
        for field, what in (("w", "a weight"), ("m2", "a sum of squared deviations")):
            t = getattr(state, field)
            if t.numel() and bool((t < 0).any()):
                raise ValueError(f"state.{field} must be >= 0 ({what}), got a minimum of {t.min().item():.6g}")
        spread = (state.w == 0) & (state.m2 > 0)  # no values, yet a spread: it would enter every later frame
        if spread.any():
            raise ValueError(f"state.m2 must be 0 where state.w is 0 (an empty state), got "
                             f"{state.m2[spread].flatten()[0].item():.6g} there")


def check_group(group):
    """A sequence-parallel call's process group: a torch.distributed ProcessGroup of which this process is a
    member (``dist.group.WORLD``, or one from ``dist.new_group``), torch.distributed initialized. Returns it."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"group={group!r}: torch.distributed is not initialized (call "
                           "torch.distributed.init_process_group first, on every rank)")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup (dist.group.WORLD or one of "
                        f"dist.new_group(ranks)), got {type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError(f"group: this process (global rank {dist.get_rank()}) is not a member of it")
    return group


def check_sp_lengths(lengths, B: int, device):
    """A sequence-parallel call's ``lengths``, those of the whole sequences: None, or (B,) integers on x's device
    (int64 returned). Their range, [0, the whole sequences' frames], is checked once the ranks' frame counts are
    known (normlib.distributed)."""
    if lengths is None:
        return None
    if not isinstance(lengths, torch.Tensor):
        try:
            lengths = torch.as_tensor(lengths, device=device)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise TypeError(f"lengths must be a tensor or a sequence of integers, got {lengths!r}") from None
        if not lengths.numel():
            lengths = lengths.long()
    if lengths.shape != (B,):
        raise ValueError(f"lengths must have shape ({B},) (one length per batch item), got {tuple(lengths.shape)}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be an integer tensor, got {lengths.dtype}")
    if lengths.device != device:
        raise ValueError(f"lengths is on {lengths.device} but x is on {device}")
    return lengths.to(torch.int64)
