"""Functions in the style of ``torch.nn.functional.layer_norm``: one per norm, and ``norm`` for any spec."""
from __future__ import annotations

import torch

from . import backends
from .checks import check_inputs, check_num_channels
from .names import lookup
from .spec import FAMILY, NormSpec


def norm(spec: NormSpec, x: torch.Tensor, weight=None, bias=None, eps: float = 1e-8, *, eps_mode="inside",
         decay=None, layout="b c t", lengths=None, state=None, return_state=False, backend="auto",
         num_channels=None):
    """Normalize ``x`` with the norm ``spec`` (a NormSpec or a registered name); returns ``y``, or
    ``(y, state)`` with ``return_state``."""
    if isinstance(spec, str):
        spec = lookup(spec)
    if isinstance(spec, type):  # a layer class: its spec (not a layer, whose own settings would be dropped)
        spec = getattr(spec, "spec", spec)
    if num_channels is not None:
        num_channels = check_num_channels(num_channels)
    c = check_inputs(spec, x, weight, bias, eps, eps_mode, decay, lengths, state, return_state, layout,
                     backend, num_channels)
    forward = backends.resolve(backend, x)
    y, state_out = forward(c.x, weight, bias, c.lengths, state, per_channel=spec.per_channel,
                           decay=c.decay, eps=float(eps), eps_mode=eps_mode, return_state=return_state)
    if c.layout == "b t c":
        y = y.permute(0, 2, 1)
    return (y, state_out) if return_state else y


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
