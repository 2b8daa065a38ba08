"""``nn.Module`` layers. One base class; each norm of the family is that class bound to its spec."""
from __future__ import annotations

import functools

import torch
from torch import nn

from . import functional
from .checks import check_flag, check_num_channels, check_options, state_tag
from .functional import _meta, norm
from .names import lookup
from .spec import FAMILY, NormSpec, TimeMode
from .state import state_type


class NotCopied:
    """A context's object that its layers refer to while in it (normlib.stream's slot, sequence_parallel's
    context): a copy of a layer (copy.deepcopy, pickle) made inside the context is a plain layer, in no
    context."""

    __slots__ = ()

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return _nothing, ()


def _nothing():
    return None


class _Calls(dict):
    """A layer's prepared calls, by its inputs' signature: each one ``functional.norm``'s for that input, valid
    while norm's own are (``of``: tests replace that dict to prepare again). A copy of the layer starts
    without them."""

    __slots__ = ("of",)

    def __init__(self, of):
        super().__init__()
        self.of = of

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return _nothing, ()


class NormLayer(nn.Module):
    r"""A normalization layer of the normlib family for (batch, channels, time) sequences.

    .. math::
        y_{b,c,t} = \gamma_c \frac{x_{b,c,t} - \mu_{b,t}}{\sqrt{\sigma^2_{b,t} + \epsilon}} + \beta_c

    where :math:`\mu` and :math:`\sigma^2` are the mean and biased variance over the frames and channels
    the norm pools (see ``normlib list`` and the docs).

    Args:
        num_channels: C, the size of the channel dim.
        eps: added to the variance (``eps_mode="inside"``) or to the std (``"outside"``). Default: 1e-8.
        elementwise_affine: learn a per-channel weight (initialised to ones). Default: True.
        bias: learn a per-channel bias (initialised to zeros), when ``elementwise_affine``. Default: True.
        eps_mode: ``"inside"`` or ``"outside"`` the square root.
        decay: EMA norms only: frame tau weighs ``decay ** (t - tau)``.
        layout: ``"b c t"`` (Conv-TasNet) or ``"b t c"`` (channels last).
        backend: ``"auto"``, ``"torch"`` or ``"triton"``.

    Shape:
        - Input: (B, C, T) for ``"b c t"``, (B, T, C) for ``"b t c"``.
        - lengths: (B,) integers in [0, T]; frames ``t >= lengths[b]`` are padding (output 0).
        - state: a :class:`normlib.NormState` of (B,) or (B, C) fields, causal norms only.
        - Output: same shape and dtype as the input; with ``return_state=True``, ``(y, state)``.

    Examples::

        >>> layer = normlib.get("cln")(64)
        >>> y = layer(torch.randn(8, 64, 1000))
    """

    spec: NormSpec
    _stream = None  # inside normlib.stream(model): this layer's slot there (stream.py), which keeps its state
    _parallel = None  # inside normlib.sequence_parallel(model): that context (parallel.py), which holds the group
    _calls = None  # a model's prepared calls (forward), from the second call of a plain layer on

    def __init__(self, num_channels: int, eps: float = 1e-8, elementwise_affine: bool = True,
                 bias: bool = True, *, eps_mode: str = "inside", decay: float | None = None,
                 layout: str = "b c t", backend: str = "auto", device=None, dtype=None):
        if not isinstance(getattr(self, "spec", None), NormSpec):
            raise TypeError(f"{type(self).__name__} has no NormSpec: NormLayer is the base class; build a layer "
                            "with normlib.get(name)(num_channels) or layer_class(spec)")
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.num_channels = num_channels = check_num_channels(num_channels)
        decay, self.layout = check_options(self.spec, eps, eps_mode, decay, layout, backend)
        elementwise_affine, bias = check_flag("elementwise_affine", elementwise_affine), check_flag("bias", bias)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating dtype (of the weight and bias) or None, got {dtype!r}")
        self.decay = decay if self.spec.time is TimeMode.EMA else None
        state_type(*state_tag(self.spec, decay))  # its states' class, made here rather than in a compiled call
        self.eps, self.eps_mode, self.backend = eps, eps_mode, backend
        self.elementwise_affine = elementwise_affine
        # registered as None where absent, as nn.LayerNorm's are (state_dict and register_parameter see them)
        self.register_parameter("weight", nn.Parameter(torch.empty(num_channels, **factory_kwargs))
                                if elementwise_affine else None)
        self.register_parameter("bias", nn.Parameter(torch.empty(num_channels, **factory_kwargs))
                                if elementwise_affine and bias else None)
        self.reset_parameters()

    def __reduce_ex__(self, protocol):
        # a class that layer_class made for a registered spec is no attribute of this module, where pickle would
        # look it up: it is rebuilt from the spec. Any other class (the built-in ones, a user's subclass)
        # pickles by name, as usual.
        cls = type(self)
        if cls.__dict__.get("_from_spec") and globals().get(cls.__name__) is not cls:
            return _rebuild, (self.spec,), self.__dict__
        return super().__reduce_ex__(protocol)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        self.__dict__["_calls"] = None  # a setting may have changed: the next call goes through norm's checks

    def __delattr__(self, name):
        super().__delattr__(name)
        self.__dict__["_calls"] = None  # a parameter taken out (torch.nn.utils.parametrize), a context left

    def forward(self, x, lengths=None, state=None, return_state=False):
        if state is None and return_state is False:
            slot = self._stream
            if slot is not None:  # a stream's call: its state there
                return slot(self._norm, x, lengths)
            if lengths is None and type(x) is torch.Tensor and not torch.compiler.is_compiling():
                # A model's call: norm's prepared call for this input's signature, kept by the layer under a key of
                # what can change between its calls (norm's key holds the settings too, which __setattr__ watches)
                calls, p = self._calls, self._parameters
                if calls is not None and calls.of is functional._CALLS and "weight" in p and "bias" in p:
                    weight, bias = p["weight"], p["bias"]
                    key = (x.shape, x.stride(), x.dtype, x.device, _meta(weight), _meta(bias))
                    call = calls.get(key)
                    if call is not None:
                        return call(x, weight, bias)
                    y = self._norm(x, None, None, False)
                    call = functional.prepared(self.spec, x, weight, bias, self.eps, eps_mode=self.eps_mode,
                                               decay=self.decay, layout=self.layout, backend=self.backend,
                                               num_channels=self.num_channels)
                    if call is not None and len(calls) < 64:
                        calls[key] = call
                    return y
                if "weight" in p and "bias" in p and self._parallel is None:  # not parametrized, no group
                    self.__dict__["_calls"] = _Calls(functional._CALLS)
        return self._norm(x, lengths, state, return_state)

    def _norm(self, x, lengths, state, return_state):
        # the parameters from their dict where they are there (nn.Module's __getattr__ costs about a microsecond a
        # call); a parametrized weight (torch.nn.utils.parametrize) is a property of the class: read as one
        p = self._parameters
        weight = p["weight"] if "weight" in p else self.weight
        bias = p["bias"] if "bias" in p else self.bias
        return norm(self.spec, x, weight, bias, self.eps, eps_mode=self.eps_mode,
                    decay=self.decay, layout=self.layout, lengths=lengths, state=state,
                    return_state=return_state, backend=self.backend, num_channels=self.num_channels,
                    group=None if self._parallel is None else self._parallel.group)

    def extra_repr(self) -> str:
        s = f"{self.num_channels}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.elementwise_affine:
            s += f", bias={self.bias is not None}"
        if self.decay is not None:
            s += f", decay={self.decay}"
        if self.eps_mode != "inside":
            s += f", eps_mode={self.eps_mode!r}"
        s += f", layout={self.layout!r}"
        return s + (f", backend={self.backend!r}" if self.backend != "auto" else "")


def layer_class(spec: NormSpec) -> type[NormLayer]:
    """The layer class of a spec: ``NormLayer`` bound to it."""
    doc = f"{spec.description}.\n\n" + (NormLayer.__doc__ or "")
    return type(spec.class_name, (NormLayer,), {"spec": spec, "__doc__": doc, "__module__": __name__,
                                                "_from_spec": True})


def _rebuild(spec: NormSpec) -> NormLayer:
    """An empty layer of ``spec`` for pickle to fill: the registered class where its spec is this one (so a
    copy in the same process has the original's class), else a class made from the spec."""
    try:
        cls = lookup(spec.name)
    except (KeyError, ValueError):
        cls = None
    if getattr(cls, "spec", None) != spec:
        cls = _unregistered_class(spec)
    return cls.__new__(cls)


@functools.lru_cache(maxsize=None)
def _unregistered_class(spec: NormSpec) -> type[NormLayer]:
    """One class per spec for the layers that unpickle where their spec is not registered."""
    return layer_class(spec)


_CLASSES = {s.name: layer_class(s) for s in FAMILY}
CumulativeLayerNorm = _CLASSES["cln"]
ChannelCumulativeLayerNorm = _CLASSES["ccln"]
GlobalLayerNorm = _CLASSES["gln"]
EMALayerNorm = _CLASSES["emaln"]
FrameLayerNorm = _CLASSES["frameln"]
InstanceLayerNorm = _CLASSES["instln"]
ChannelEMALayerNorm = _CLASSES["ccemaln"]
