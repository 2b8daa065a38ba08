"""PyTorch references, one per norm, written as DESIGN.md section 1 reads. They are the test oracle.

Inputs are (B, C, T) ("b c t"), or (B, T, C) with ``layout="b t c"``. Statistics are computed in float64
for float64 inputs (the oracle) and in float32 otherwise (the speed baseline of the benchmarks). Running
sums are shifted by a constant K per sequence (and channel): the variance does not depend on K, and the
shift keeps E[(x-K)^2] - (mu-K)^2 from cancelling catastrophically under a DC offset.
"""
from __future__ import annotations

import functools

import einops
import torch
from torch import Tensor

from .spec import normalize_layout
from .state import NormState


def decayed_cumsum(v: Tensor, d: float) -> Tensor:
    """S_t = sum over tau <= t of d^(t - tau) * v_tau, along the last dim (d = 1: cumsum, d = 0: v)."""
    if d == 1:
        return v.cumsum(-1)
    s, k = v, 1
    while k < v.shape[-1]:  # doubling: after this step S_t sums frames t-2k+1 .. t
        s = torch.cat([s[..., :k], s[..., k:] + d**k * s[..., :-k]], dim=-1)
        k *= 2
    return s


def normalize(x, mu, var, weight, bias, eps, eps_mode):
    """y = gamma (x - mu) / sqrt(var + eps) + beta, or / (sqrt(var) + eps) with eps_mode='outside'."""
    if eps_mode == "inside":
        y = (x - mu) / torch.sqrt(var + eps)
    else:
        y = (x - mu) / (var.clamp_min(torch.finfo(var.dtype).tiny).sqrt() + eps)
    if weight is not None:
        y = y * weight[:, None]
    if bias is not None:
        y = y + bias[:, None]
    return y


def _one_value(var, w):
    """var, but 1 where the statistic holds at most one value (weight w <= 1): that value is its own mean and
    normalizes to 0 whatever the variance, so y is beta there even with eps = 0 (0 / 0 otherwise)."""
    return torch.where(w > 1, var, 1)


def _valid(x, lengths):
    B, _, T = x.shape
    if lengths is None:
        return torch.ones(B, 1, T, dtype=torch.bool, device=x.device)
    return (torch.arange(T, device=x.device) < lengths[:, None])[:, None, :]


def _in_layout(fn):
    """``fn`` on (B, C, T) inputs, taking ``layout`` too: x is read in it, y (not the state) is given in it."""

    @functools.wraps(fn)
    def in_layout(x, *args, layout="b c t", **kw):
        layout = normalize_layout(layout)
        out = fn(einops.rearrange(x, f"{layout} -> b c t"), *args, **kw)
        y, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
        y = einops.rearrange(y, f"b c t -> {layout}")
        return (y, *rest) if rest else y

    return in_layout


@_in_layout
def running_norm(x, weight=None, bias=None, eps=1e-8, *, per_channel, decay, eps_mode="inside",
                 lengths=None, state=None, return_state=False):
    """The causal norms: frame tau weighs decay^(t - tau) in the statistics of frame t."""
    y_dtype, sd = x.dtype, (torch.float64 if x.dtype == torch.float64 else torch.float32)
    x = x.to(sd)
    B, C, T = x.shape
    if state is not None:  # its weight is a count, which nothing differentiable moves: no gradient
        state = NormState(state.w.detach(), state.m, state.m2)
    if T == 0:  # no frame: the state passes through
        empty = NormState.empty((B, C) if per_channel else (B,), device=x.device)
        return (x.to(y_dtype), state if state is not None else empty) if return_state else x.to(y_dtype)
    valid = _valid(x, lengths)
    n = 1 if per_channel else max(C, 1)  # channels per frame statistic (C = 0: no value, K = 0)
    group = (lambda v: v) if per_channel else (lambda v: v.sum(1, keepdim=True))

    x = torch.where(valid, x, 0)  # padding is never read, not even as NaN
    K = group(x[..., :1]).detach() / n  # the shift: frame 0's mean
    xk = torch.where(valid, x - K, 0)
    S0 = decayed_cumsum(group(valid.to(sd).expand_as(x)), decay)  # total weight w_t
    S1 = decayed_cumsum(group(xk), decay)  # sum of weights * (x - K)
    S2 = decayed_cumsum(group(xk * xk), decay)  # sum of weights * (x - K)^2
    if state is not None:  # the incoming state counts as frame -1
        w0, m0, M0 = (t.reshape(B, -1, 1).to(sd) for t in state)
        d_t = decay ** torch.arange(1, T + 1, device=x.device, dtype=sd)
        S0 = S0 + d_t * w0
        S1 = S1 + d_t * w0 * (m0 - K)
        S2 = S2 + d_t * (M0 + w0 * (m0 - K) ** 2)

    W = torch.where(S0 > 0, S0, 1)
    mu = K + S1 / W
    var = (S2 / W - (S1 / W) ** 2).clamp_min(0)
    y = torch.where(valid, normalize(x, mu, _one_value(var, S0), weight, bias, eps, eps_mode), 0).to(y_dtype)
    if not return_state:
        return y

    # the state after frame lengths[b] - 1 (the incoming state, or empty, where lengths[b] == 0)
    last = torch.full((B,), T, device=x.device) if lengths is None else lengths.to(x.device)
    idx = (last - 1).clamp_min(0).view(B, 1, 1).expand(B, S0.shape[1], 1)
    w, m, m2 = (t.gather(2, idx)[..., 0].double() for t in (S0, mu, var * S0))
    if state is None:
        state = NormState.empty(w.shape, torch.float64, x.device)
    prev = [t.reshape(w.shape) for t in state]
    keep = (last == 0)[:, None]
    w, m, m2 = (torch.where(keep, p, s) for p, s in zip(prev, (w, m, m2)))
    if not per_channel:
        w, m, m2 = w[:, 0], m[:, 0], m2[:, 0]
    return y, NormState(w, m, m2)


@_in_layout
def global_norm(x, weight=None, bias=None, eps=1e-8, *, per_channel, eps_mode="inside", lengths=None):
    """The non-causal norms: one mean and variance over all valid frames (and channels, when pooled)."""
    y_dtype, sd = x.dtype, (torch.float64 if x.dtype == torch.float64 else torch.float32)
    valid = _valid(x, lengths)
    x = torch.where(valid, x.to(sd), 0)
    dims = (2,) if per_channel else (1, 2)
    count = valid.to(sd).expand_as(x).sum(dims, keepdim=True)
    mu = torch.where(valid, x, 0).sum(dims, keepdim=True) / count.clamp_min(1)
    var = torch.where(valid, (x - mu) ** 2, 0).sum(dims, keepdim=True) / count.clamp_min(1)
    return torch.where(valid, normalize(x, mu, _one_value(var, count), weight, bias, eps, eps_mode), 0).to(y_dtype)


def cln(x, weight=None, bias=None, eps=1e-8, **kw):
    return running_norm(x, weight, bias, eps, per_channel=False, decay=1.0, **kw)


def ccln(x, weight=None, bias=None, eps=1e-8, **kw):
    return running_norm(x, weight, bias, eps, per_channel=True, decay=1.0, **kw)


def emaln(x, weight=None, bias=None, eps=1e-8, *, decay=0.99, **kw):
    return running_norm(x, weight, bias, eps, per_channel=False, decay=decay, **kw)


def ccemaln(x, weight=None, bias=None, eps=1e-8, *, decay=0.99, **kw):
    return running_norm(x, weight, bias, eps, per_channel=True, decay=decay, **kw)


def frameln(x, weight=None, bias=None, eps=1e-8, **kw):
    return running_norm(x, weight, bias, eps, per_channel=False, decay=0.0, **kw)


def gln(x, weight=None, bias=None, eps=1e-8, **kw):
    return global_norm(x, weight, bias, eps, per_channel=False, **kw)


def instln(x, weight=None, bias=None, eps=1e-8, **kw):
    return global_norm(x, weight, bias, eps, per_channel=True, **kw)


REFERENCES = {f.__name__: f for f in (cln, ccln, gln, emaln, frameln, instln, ccemaln)}


def for_spec(spec):
    """The reference of any spec, a registered one's own included: ``fn(x, weight, bias, eps, **kw)``."""
    decay = spec.resolve_decay(None)
    if decay is None:
        return functools.partial(global_norm, per_channel=spec.per_channel)
    return functools.partial(running_norm, per_channel=spec.per_channel, decay=decay)
