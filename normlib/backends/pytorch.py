"""The PyTorch backend: vectorized over time, any device, float32 Chan merges, autograd by PyTorch.

Running statistics are an inclusive scan of frame summaries under the decayed merge of ``state.merge``;
the scan doubles its span each step (log2 T vectorized steps, no Python loop over frames).
"""
from __future__ import annotations

import torch

from ..reference import normalize
from ..state import NormState, merge


def frame_stats(x, valid, per_channel) -> NormState:
    """f_t = (n, m_f, M2_f) of each frame; padding frames get weight 0. x: (B, C, T) in the stats dtype."""
    if per_channel:
        n = valid.to(x.dtype).expand_as(x)
        return NormState(n, torch.where(valid, x, 0), torch.zeros_like(x))
    m = x.mean(1)
    m2 = (x - m[:, None]).square().sum(1)
    v = valid[:, 0]
    return NormState(v.to(x.dtype) * x.shape[1], torch.where(v, m, 0), torch.where(v, m2, 0))


def _live_var(var, valid, w=None):
    """var at valid frames, and with ``w`` where a statistic holds more than one value; 1 elsewhere. Padding
    normalizes to 0, and so does a value that is its statistic's only one (frame 0 with no incoming state or
    one of weight 0, per channel or over one channel: its own mean, which nothing can move), whatever the
    variance; 1 keeps autograd's terms there finite (0 / 0 with eps = 0 at padding made weight.grad NaN, and y
    NaN after an empty state) and at the scale of dy (1/sqrt(eps) ones cancelled in float32: ccln's dx with eps
    outside was 20 % off, 100 % after an empty state). Only the state's weight could see r there: it gets no
    gradient."""
    return torch.where(valid if w is None else valid & (w > 1), var, 1)


def _unused(y, *tensors):
    """y, also on the graph of ``tensors`` that nothing in it reads: their gradients are zeros, not None, as
    on the Triton backend (DDP takes a None for an unused parameter). ``where`` keeps a NaN in them out of y."""
    no = torch.zeros((), dtype=torch.bool, device=y.device)
    for t in tensors:
        if t is not None and t.requires_grad:
            y = y + torch.where(no, t.sum(), 0).to(y.dtype)
    return y


def running_scan(s: NormState, decay: float) -> NormState:
    """Inclusive scan over the last dim: entry t becomes the merge of frames 0..t."""
    T, k = s.w.shape[-1], 1
    while k < T:
        head = s.map(lambda t: t[..., :k])
        tail = merge(s.map(lambda t: t[..., :-k]), s.map(lambda t: t[..., k:]), decay**k)
        s = NormState(*(torch.cat(pair, dim=-1) for pair in zip(head, tail)))
        k *= 2
    return s


def forward(x, weight, bias, lengths, state, *, per_channel, decay, eps, eps_mode, return_state):
    """x: (B, C, T) view in any strides; decay None means GLOBAL. Returns (y, state or None)."""
    B, C, T = x.shape
    if state is not None:  # its weight is a count, which nothing differentiable moves: no gradient
        state = NormState(state.w.detach(), state.m, state.m2)
    if T == 0 or C == 0:  # no frame or no channel: nothing to normalize, no value seen; the state passes through
        empty = NormState.empty((B, C) if per_channel else (B,), device=x.device)
        y = _unused(x.clone(), weight, bias)  # on x's graph, and on the affine parameters'
        return y, (state if state is not None else empty) if return_state else None
    sd = torch.float64 if x.dtype == torch.float64 else torch.float32
    valid = torch.ones(B, 1, T, dtype=torch.bool, device=x.device)
    if lengths is not None:
        valid = (torch.arange(T, device=x.device) < lengths[:, None])[:, None, :]
    xs = torch.where(valid, x.to(sd), 0)  # padding is never read, not even as NaN

    # Work on x - K, K frame 0's mean per sequence (per channel): x - K is exact near K (Sterbenz), so a
    # DC offset costs no digits in mu or in x - mu. The float64 state is shifted by the same K. FRAME
    # statistics (decay 0) shift each frame by its own channel 0: a frame far from frame 0 keeps its digits.
    if decay == 0:
        K = (xs if per_channel else xs[:, :1]).detach()  # (B, C|1, T)
    else:
        K = (xs[..., :1] if per_channel else xs[..., :1].mean(1, keepdim=True)).detach()  # (B, C|1, 1)
    if state is not None and decay != 0:
        Ks = K.reshape(state.m.shape).double()
        rel = NormState(state.w.to(sd), (state.m - Ks).to(sd), state.m2.to(sd))
    xs = torch.where(valid, xs - K, 0)

    if decay is None:  # GLOBAL: two passes over the valid frames, in the stats dtype
        dims = (2,) if per_channel else (1, 2)
        count = valid.to(sd).expand_as(xs).sum(dims, keepdim=True)
        mu = xs.sum(dims, keepdim=True) / torch.where(count > 0, count, 1)
        var = torch.where(valid, (xs - mu).square(), 0).sum(dims, keepdim=True) / torch.where(count > 0, count, 1)
        y = torch.where(valid, normalize(xs, mu, _live_var(var, valid, count), weight, bias, eps, eps_mode), 0)
        return y.to(x.dtype), None

    s = frame_stats(xs, valid, per_channel)  # fields (B, T) or (B, C, T)
    if decay != 0:
        s = own = running_scan(s, decay)  # own: the chunk's frames alone, merged into the state in float64 below
        if state is not None:
            d_t = decay ** torch.arange(1, T + 1, device=x.device, dtype=sd)
            s = merge(rel.map(lambda t: t[..., None]), s, d_t)

    expand = (lambda t: t) if per_channel else (lambda t: t[:, None])
    mu, var = expand(s.m), _live_var(expand(s.var), valid, expand(s.w))
    y = torch.where(valid, normalize(xs, mu, var, weight, bias, eps, eps_mode), 0).to(x.dtype)
    if decay == 0 and state is not None:  # FRAME reads no state: zero gradients into its statistics
        y = _unused(y, state.m, state.m2)
    if not return_state:
        return y, None

    # the state after frame lengths[b] - 1, in float64 with the shift added back. Picked by a mask, not a
    # gather: inductor (torch 2.13, CPU) fused gather's backward (a scatter) wrongly with the scan's, and
    # gave cln's state and x gradients 80 % off under torch.compile
    last = torch.full((B,), T, device=x.device) if lengths is None else lengths
    at = torch.arange(T, device=x.device) == (last - 1).clamp_min(0).view((B,) + (1,) * (s.w.dim() - 1))
    Ks = (K if per_channel else K[:, 0]).expand(s.m.shape)
    picked = own if decay != 0 and state is not None else s
    w, m, m2, k = (torch.where(at, t, 0).sum(-1).double() for t in (*picked, Ks))
    out = NormState(w, m + k, m2)
    if state is None:
        return y, out
    if decay != 0:
        # the chunk's own summary merged into the incoming state in float64: a float32 merge rounded a state
        # that an EMA keeps for 1 / (1 - d) calls each call (emaln, d = 0.999, one-frame chunks: 8e-6 off)
        out = merge(state, out, torch.as_tensor(decay, dtype=torch.float64, device=x.device) ** last.view(
            (B,) + (1,) * (w.dim() - 1)))
    keep = (last == 0).view((B,) + (1,) * (w.dim() - 1))  # no frame seen: the incoming state
    return y, NormState(*(torch.where(keep, p, o) for p, o in zip(state, out)))
