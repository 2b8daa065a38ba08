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
    sd = torch.float64 if x.dtype == torch.float64 else torch.float32
    # Work on x - K, K a per-sequence (per-channel) shift: x - K is exact near K (Sterbenz), so a DC
    # offset costs no digits in mu or in x - mu. K is frame 0's mean, or the incoming state's mean.
    xs = x.to(sd)
    K = xs[..., :1] if per_channel else xs[..., :1].mean(1, keepdim=True)  # (B, C|1, 1)
    if state is not None:
        K = state.m.reshape(B, -1, 1).to(sd)
        state = NormState(state.w, state.m - K.detach().reshape(state.m.shape), state.m2)
    K = K.detach()
    xs = xs - K
    valid = torch.ones(B, 1, T, dtype=torch.bool, device=x.device)
    if lengths is not None:
        valid = (torch.arange(T, device=x.device) < lengths[:, None])[:, None, :]

    if decay is None:  # GLOBAL: two passes over the valid frames, in the stats dtype
        dims = (2,) if per_channel else (1, 2)
        count = valid.to(sd).expand_as(xs).sum(dims, keepdim=True)
        count = torch.where(count > 0, count, 1)
        mu = torch.where(valid, xs, 0).sum(dims, keepdim=True) / count
        var = torch.where(valid, (xs - mu).square(), 0).sum(dims, keepdim=True) / count
        y = torch.where(valid, normalize(xs, mu, var, weight, bias, eps, eps_mode), 0)
        return y.to(x.dtype), None

    s = frame_stats(xs, valid, per_channel)  # fields (B, T) or (B, C, T)
    if decay != 0:
        s = running_scan(s, decay)
    if state is not None and decay != 0:
        d_t = decay ** torch.arange(1, T + 1, device=x.device, dtype=sd)
        s = merge(state.map(lambda t: t[..., None]), s, d_t)

    expand = (lambda t: t) if per_channel else (lambda t: t[:, None])
    mu, var = expand(s.m), expand(s.var)
    y = torch.where(valid, normalize(xs, mu, var, weight, bias, eps, eps_mode), 0).to(x.dtype)
    if not return_state:
        return y, None

    last = torch.full((B,), T, device=x.device) if lengths is None else lengths
    idx = (last - 1).clamp_min(0).view((B,) + (1,) * (s.w.dim() - 1))
    idx = idx.expand(s.w.shape[:-1] + (1,))
    out = s.map(lambda t: t.gather(-1, idx)[..., 0])
    unshift = lambda st: NormState(st.w, st.m + K.reshape(st.m.shape), st.m2)  # noqa: E731
    out = unshift(out)
    prev = NormState.empty(out.shape, sd, x.device) if state is None else unshift(state)
    keep = (last == 0).view((B,) + (1,) * (out.w.dim() - 1))  # no frame seen: the incoming state
    return y, NormState(*(torch.where(keep, p, o) for p, o in zip(prev, out)))
