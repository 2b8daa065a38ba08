"""Functions in the style of ``torch.nn.functional.layer_norm``: one per norm, and ``norm`` for any spec."""
from __future__ import annotations

import torch

from . import backends
from .checks import check_inputs, check_num_channels, check_state_values, state_tag, vouch, vouched_meta
from .names import lookup
from .spec import FAMILY, NormSpec
from .state import NormState, state_type


_CALLS: dict = {}  # prepared calls of inputs that passed the checks, by everything the checks read


def _meta(t):
    return None if t is None else (type(t), t.shape, t.dtype, t.device)


def _key(spec, x, weight, bias, eps, eps_mode, decay, layout, backend, num_channels, stream=None):
    """A prepared call's key in _CALLS: everything check_inputs reads of these arguments (types included: True
    == 1 as a key, not as an eps); ``stream``: the state's class and its fields' meta."""
    return (spec, x.shape, x.stride(), x.dtype, x.device, _meta(weight), _meta(bias), eps, type(eps), eps_mode,
            decay, type(decay), layout, backend, num_channels, stream)


def prepared(spec: NormSpec, x, weight, bias, eps, *, eps_mode, decay, layout, backend, num_channels):
    """The prepared call that ``norm`` made for these arguments (no lengths, no state), or None (none yet, or an
    input that takes the checked path): a layer keeps it under a shorter key (modules.py)."""
    try:
        return _CALLS.get(_key(spec, x, weight, bias, eps, eps_mode, decay, layout, backend, num_channels))
    except (TypeError, AttributeError, RuntimeError):
        return None


def norm(spec: NormSpec, x: torch.Tensor, weight=None, bias=None, eps: float = 1e-8, *, eps_mode="inside",
         decay=None, layout="b c t", lengths=None, state=None, return_state=False, backend="auto",
         num_channels=None, group=None):
    """Normalize ``x`` with the norm ``spec`` (a NormSpec or a registered name); returns ``y``, or
    ``(y, state)`` with ``return_state``.

    ``group``: a ``torch.distributed`` process group whose ranks hold, in rank order, slices of the time axis;
    ``x`` is this rank's slice, ``lengths`` and ``state`` are the whole sequences' (``state`` read on the first
    rank), and ``y`` is the single-device ``y`` on this slice (normlib.distributed, the sequence-parallel guide)."""
    if group is not None:  # sequence parallelism: one collective per call (normlib.distributed)
        from . import distributed
        return distributed.norm(_spec(spec), x, weight, bias, eps, eps_mode=eps_mode, decay=decay, layout=layout,
                                lengths=lengths, state=state, return_state=return_state, backend=backend,
                                num_channels=None if num_channels is None else check_num_channels(num_channels),
                                group=group)
    # A model's call (no lengths, no state) whose signature passed the checks before goes straight to its
    # prepared call: the key holds everything check_inputs reads of these arguments (types included: True
    # == 1 as a key, not as an eps).
    # A streaming call (a state in and out) skips them too, but for the state's values (check_state_values);
    # the state's class is its tag (state.py), so a cached call takes only states of its own norm.
    # A state that normlib returned, unchanged since, brings its fields' meta from vouch (and its values need no
    # check): the key's part for a stream's state costs a lookup.
    key = None
    stream = return_state is True and isinstance(state, NormState)
    if lengths is None and (stream or (state is None and return_state is False)) and type(x) is torch.Tensor \
            and not torch.compiler.is_compiling():
        try:
            seen = vouched_meta(state) if stream else None
            key = _key(spec, x, weight, bias, eps, eps_mode, decay, layout, backend, num_channels,
                       (type(state), seen or tuple(map(_meta, state))) if stream else None)
            call = _CALLS.get(key)
        except (TypeError, AttributeError, RuntimeError):  # unhashable, not a tensor, no strides: the checks say
            key = call = None
        if call is not None:
            if not stream:
                return call(x, weight, bias)
            if seen is None:
                check_state_values(state)
            return call(x, weight, bias, state)
    spec = _spec(spec)
    if num_channels is not None:
        num_channels = check_num_channels(num_channels)
    c = check_inputs(spec, x, weight, bias, eps, eps_mode, decay, lengths, state, return_state, layout,
                     backend, num_channels)
    opts = dict(per_channel=spec.per_channel, decay=c.decay, eps=float(eps), eps_mode=eps_mode)
    if key is not None and len(_CALLS) > 4096:  # many distinct shapes (variable-length inputs): start over
        _CALLS.clear()
    if key is not None and not stream:
        call = backends.resolve(backend, x, backends.PREPARE)(c.x, **opts)
        call = _CALLS[key] = _permuted(call) if c.layout == "b t c" else call
        return call(x, weight, bias)
    tagged = state_type(*state_tag(spec, c.decay)) if return_state else None  # the returned state's class
    if key is not None:
        call = _CALLS[key] = _streaming(backends.resolve(backend, x, backends.STREAM)(c.x, **opts),
                                        c.layout == "b t c", tagged)
        return call(x, weight, bias, state)
    forward = backends.resolve(backend, x)
    y, state_out = forward(c.x, weight, bias, c.lengths, state, return_state=return_state, **opts)
    if c.layout == "b t c":
        y = y.permute(0, 2, 1)
    return (y, vouch(tagged._make(state_out))) if return_state else y


def _spec(spec):
    """A registered name's spec, a layer class's spec (not a layer's: its own settings would be dropped)."""
    if isinstance(spec, str):
        spec = lookup(spec)
    if isinstance(spec, type):
        spec = getattr(spec, "spec", spec)
    return spec


def _permuted(call):
    """A prepared call of "b c t" views for "b t c" inputs."""
    return lambda x, weight, bias: call(x.permute(0, 2, 1), weight, bias).permute(0, 2, 1)


def _streaming(prepared, permute, tagged):
    """A streaming call (state in and out) of a signature that passed the checks: the backend's prepared stream
    call, its state tagged (as the class ``tagged``) and vouched for with its fields' meta, the same at every call
    (read once)."""
    meta = None

    def call(x, weight, bias, state):
        nonlocal meta
        y, s = prepared(x.permute(0, 2, 1) if permute else x, weight, bias, state)
        s = tuple.__new__(tagged, s)  # _make, without its length check
        if meta is None:
            meta = tuple(map(_meta, s))
        return (y.permute(0, 2, 1) if permute else y), vouch(s, meta)
    return call


def _bind(spec: NormSpec):
    def fn(x, weight=None, bias=None, eps=1e-8, **kwargs):
        return norm(spec, x, weight, bias, eps, **kwargs)

    fn.__name__ = fn.__qualname__ = spec.name
    fn.__doc__ = (f"{spec.description}.\n\nSame keyword arguments as :func:`normlib.functional.norm`"
                  + (" (``decay`` included)." if spec.time.value == "ema" else "."))
    return fn


_SPECS = {s.name: s for s in FAMILY}
cln = _bind(_SPECS["cln"])
ccln = _bind(_SPECS["ccln"])
gln = _bind(_SPECS["gln"])
emaln = _bind(_SPECS["emaln"])
frameln = _bind(_SPECS["frameln"])
instln = _bind(_SPECS["instln"])
ccemaln = _bind(_SPECS["ccemaln"])
