"""Sequence parallelism: a norm over a sequence whose time axis is split over the ranks of a process group.

Each rank summarizes its slice as a state (w, m, M2) in float64 (frame tau of a slice of l valid frames weighs
decay^(l - 1 - tau)); one all_gather exchanges the summaries, with each slice's frame count; then

- a causal norm runs on its slice with the merge of the earlier slices' summaries as its incoming state (the
  exclusive scan over ranks; an incoming state enters in front of the first rank's summary);
- ``gln`` and ``instln`` normalize their slice with the merge of all summaries.

The summaries merge exactly (Chan's merge with decay, state.merge), so the result is the single-device one. The
gather's backward is one all_reduce of the summaries' gradients, from which each rank takes its own: the
"carries" that flow from later ranks back to earlier ones. Only ``torch.distributed`` moves data.

``lengths`` are those of the whole sequences: a rank's own are clamp(lengths - offset, 0, T_rank), where the
offset is the frame count of the ranks before it. A rank does not know its offset before the exchange, so it
guesses it (the slices' sizes at its last call of this size, else equal slices), sends its guess along, and the
exchange is repeated once where any rank guessed wrong: one collective per call, after the first call of a size.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import backends
from .checks import check_group, check_inputs, check_sp_lengths, state_tag, vouch
from .spec import NormSpec, TimeMode
from .state import NormState, merge, state_type

_HEADER = 2  # each rank's packet starts with its frame count and the offset it guessed (-1: none)
_SIZES: dict = {}  # (group, this rank's frame count) -> every rank's frame count at the last such call


class _AllGather(torch.autograd.Function):
    """All ranks' packets, (world, P), from each rank's (P,). Backward: the gradients of every rank's use of the
    gathered packets, summed over ranks by one all_reduce (gloo has no reduce_scatter); this rank's row is the
    gradient of its packet."""

    @staticmethod
    def forward(ctx, packet, group, rank):
        ctx.group, ctx.rank = group, rank
        out = packet.new_empty((dist.get_world_size(group), packet.numel()))
        dist.all_gather(list(out.unbind(0)), packet.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()  # all_reduce writes in place; autograd may share the buffer
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None, None


class _Summary(torch.autograd.Function):
    """A slice's summary (w, m, M2) in float64: weight w = n Σ a, mean m = Σ a x / w, M2 = Σ a (x - m)², frame
    tau weighing a[b, 0, tau] (0 at padding), over its channels too for a pooled norm (n = C). Two passes in
    float64; x itself is what the backward keeps (no float64 copy): dx = a (dm / w + 2 dM2 (x - m))."""

    @staticmethod
    def forward(ctx, x, a, per_channel):
        B, C, T = x.shape
        read = a > 0  # (B, 1, T)
        xd = torch.where(read, x, 0).to(torch.float64)  # padding is never read, not even as NaN
        at = a.transpose(1, 2)  # (B, T, 1)
        w = a.sum(2, keepdim=True) * (1 if per_channel else C)  # (B, 1, 1)
        inv = 1 / torch.where(w > 0, w, 1)
        s1 = torch.bmm(xd, at)  # (B, C, 1)
        m = (s1 if per_channel else s1.sum(1, keepdim=True)) * inv
        xd = xd.sub_(m).square_()
        s2 = torch.bmm(xd, at)
        m2 = s2 if per_channel else s2.sum(1, keepdim=True)
        ctx.save_for_backward(x, a, m, inv)
        w = w.expand_as(m)
        w, m, m2 = (t[..., 0] if per_channel else t[:, 0, 0] for t in (w, m, m2))
        ctx.mark_non_differentiable(w)  # a count, as in the backends: nothing differentiable moves it
        return w.contiguous(), m, m2

    @staticmethod
    def backward(ctx, _, dm, dm2):
        x, a, m, inv = ctx.saved_tensors
        shape = m.shape  # (B, C|1, 1)
        dm = torch.zeros(shape, dtype=m.dtype, device=m.device) if dm is None else dm.reshape(shape)
        dm2 = torch.zeros(shape, dtype=m.dtype, device=m.device) if dm2 is None else dm2.reshape(shape)
        g = x.to(torch.float64).sub_(m).mul_(2 * dm2).add_(dm * inv).mul_(a)
        return torch.where(a > 0, g, 0).to(x.dtype), None, None


def _powers(decay: float, local, T, device):
    """a[b, 0, tau] = decay^(l_b - 1 - tau) for tau < l_b (l the slice's valid frames), else 0."""
    tau = torch.arange(T, device=device)
    e = (local[:, None] - 1 - tau).to(torch.float64)  # (B, T)
    d = torch.tensor(decay, dtype=torch.float64, device=device)
    return torch.where(e >= 0, d ** e.clamp_min(0), 0)[:, None, :]


def _fold(states, decays):
    """The merge of summaries, earliest first (each later one decayed by nothing, the earlier by its decay)."""
    out = states[0]
    for s, d in zip(states[1:], decays[1:]):
        out = merge(out, s, d)
    return out


def _tie(state: NormState, gathered) -> NormState:
    """``state`` on the graph of the gathered packets without changing its values: every rank's backward then
    reaches the gather and its all_reduce, which all ranks must enter (collectives match by order)."""
    no = torch.zeros((), dtype=torch.bool, device=gathered.device)
    return NormState(state.w, state.m + torch.where(no, gathered.sum(), 0), state.m2)


def norm(spec: NormSpec, x, weight, bias, eps, *, eps_mode, decay, layout, lengths, state, return_state,
         backend, num_channels, group):
    """``normlib.functional.norm`` of a slice of the time axis, the ranks of ``group`` holding the slices in
    time order; ``lengths`` and ``state`` are those of the whole sequences (``state`` read on the first rank)."""
    group = check_group(group)
    c = check_inputs(spec, x, weight, bias, eps, eps_mode, decay, None, state, return_state, layout, backend,
                     num_channels)
    xv, decay = c.x, c.decay
    B, C, T = xv.shape
    lengths = check_sp_lengths(lengths, B, x.device)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    per_channel = spec.per_channel
    forward = backends.resolve(backend, x)
    opts = dict(per_channel=per_channel, eps=float(eps), eps_mode=eps_mode)
    is_global = spec.time is TimeMode.GLOBAL
    # what crosses ranks: summaries, unless nothing reads them (FRAME's statistics are each frame's own); the
    # frame counts, where lengths need offsets
    summaries = is_global or decay != 0 or return_state
    if not summaries and lengths is None:  # frameln: no communication
        y, _ = forward(xv, weight, bias, None, None, decay=decay, return_state=False, **opts)
        return y.permute(0, 2, 1) if c.layout == "b t c" else y
    if state is not None:  # a count: no gradient, as in the backends
        state = NormState(state.w.detach(), state.m, state.m2)
    shape = (B, C) if per_channel else (B,)
    sd = dict(dtype=torch.float64, device=x.device)
    d = 1.0 if is_global else decay
    grad = torch.is_grad_enabled() and summaries

    key = (group, T)
    while True:
        if lengths is None:
            guess, local = -1, torch.full((B,), T, device=x.device)
        else:
            sizes = _SIZES.get(key)
            guess = sum(sizes[:rank]) if sizes is not None and len(sizes) == world else rank * T
            local = (lengths - guess).clamp(0, T)
        parts = [torch.tensor([T, guess], **sd)]
        if lengths is not None:
            parts.append(lengths.to(torch.float64))
        if summaries:
            own = NormState(*_Summary.apply(xv, _powers(d, local, T, x.device), per_channel))
            dl = torch.tensor(d, **sd) ** local.view((B,) + (1,) * (len(shape) - 1)).to(torch.float64)
            if rank == 0 and state is not None:  # the incoming state comes before the first slice
                own = merge(state, own, dl)
            parts += [t.reshape(-1) for t in own]
        packet = torch.cat(parts)
        if grad and not packet.requires_grad:
            packet.requires_grad_()  # the backward's all_reduce must run on every rank, or none
        gathered = _AllGather.apply(packet, group, rank) if grad else _AllGather.forward(
            _Ctx(), packet, group, rank)
        if lengths is not None:
            head = gathered[:, :_HEADER].detach().cpu().tolist()  # offsets, on the host: one sync
            sizes = [int(t) for t, _ in head]
            offsets = [sum(sizes[:r]) for r in range(world)]
            if len(_SIZES) > 4096:
                _SIZES.clear()
            _SIZES[key] = sizes
            if any(g != o for (_, g), o in zip(head, offsets)):
                continue  # a rank guessed its offset wrong: again, with the sizes now known (every rank agrees)
            _check_same_lengths(gathered[:, _HEADER:_HEADER + B], sum(sizes))
        break

    per_rank, decays = [], []
    if summaries:
        start, n = _HEADER + (0 if lengths is None else B), B * (C if per_channel else 1)
        per_rank = [NormState(*(gathered[r, start + i * n:start + (i + 1) * n].view(shape) for i in range(3)))
                    for r in range(world)]
        # each slice's decay, d^(its valid frames): without lengths from the gathered counts, on the device (no
        # host sync on a GPU)
        base = torch.tensor(d, **sd)
        decays = [base ** gathered[r, 0].detach() for r in range(world)] if lengths is None else \
            [base ** (lengths - o).clamp(0, t).to(torch.float64).view((B,) + (1,) * (len(shape) - 1))
             for t, o in zip(sizes, offsets)]
    own_lengths = None if lengths is None else local

    if is_global:
        total = _fold(per_rank, decays)
        y = _apply(xv, total, weight, bias, own_lengths, eps, eps_mode, per_channel)
    else:
        if rank == 0 or not summaries:
            incoming = state
            if grad and summaries:
                incoming = _tie(NormState.empty(shape, **sd) if state is None else state, gathered)
        else:
            incoming = _fold(per_rank[:rank], decays[:rank])
        y, _ = forward(xv, weight, bias, own_lengths, incoming, decay=decay, return_state=False, **opts)
        if grad and decay == 0:  # FRAME reads no state: y itself goes on the gather's graph
            y = y + torch.where(torch.zeros((), dtype=torch.bool, device=y.device), gathered.sum(), 0).to(y.dtype)
    if c.layout == "b t c":
        y = y.permute(0, 2, 1)
    if not return_state:
        return y
    # the whole sequences' state: the same on every rank, so that the next call's first rank can take it
    out = _fold(per_rank, decays)
    return y, vouch(state_type(*state_tag(spec, decay))._make(out))


class _Ctx:
    """A stand-in for autograd's ctx where no gradient is wanted (the gather called directly)."""


def _check_same_lengths(rows, total: int):
    """Every rank passed the same ``lengths``, within [0, total frames]: every rank sees the same gathered rows,
    so every rank raises the same error (none waits for a collective that the others left)."""
    if not bool((rows == rows[:1]).all()):
        raise ValueError("lengths differ between the ranks of group: each rank must pass the lengths of the whole "
                         "sequences (the same tensor on every rank)")
    if rows.numel():
        lo, hi = rows[0].min().item(), rows[0].max().item()
        if lo < 0 or hi > total:
            raise ValueError(f"lengths must lie in [0, T={total}] (T: the whole sequences' frames, the ranks' "
                             f"slices together), got values in [{lo:.0f}, {hi:.0f}]")


def _apply(x, total: NormState, weight, bias, lengths, eps, eps_mode, per_channel):
    """gln's and instln's y on a slice, from the whole sequences' statistics ``total``: differentiable in x, in
    the affine parameters and in ``total`` (through which the other ranks' slices get their gradients)."""
    B, C, T = x.shape
    sd = torch.float64 if x.dtype == torch.float64 else torch.float32
    view = (B, C if per_channel else 1, 1)
    w, mu, m2 = (t.reshape(view) for t in total)
    var = m2 / torch.where(w > 0, w, 1)
    var = torch.where(w > 1, var, 1)  # a statistic of one value: that value normalizes to 0 whatever the spread
    r = torch.rsqrt(var + eps) if eps_mode == "inside" else 1 / (var.clamp_min(torch.finfo(var.dtype).tiny).sqrt()
                                                                 + eps)
    # x - mu with mu in two parts: x - hi is exact near hi (Sterbenz), so a DC offset costs no digits
    hi = mu.to(sd)
    lo = (mu - hi.to(torch.float64)).to(sd)
    valid = None if lengths is None else (torch.arange(T, device=x.device) < lengths[:, None])[:, None, :]
    xs = x.to(sd) if valid is None else torch.where(valid, x, 0).to(sd)
    y = (xs - hi - lo) * r.to(sd)
    if weight is not None:
        y = y * weight[:, None].to(sd)
    if bias is not None:
        y = y + bias[:, None].to(sd)
    return (y if valid is None else torch.where(valid, y, 0)).to(x.dtype)
