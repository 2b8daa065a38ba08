"""The Triton backend: one running-statistics kernel template (kernels.py), its launchers (launch.py),
and the autograd glue: the forward saves each tile's incoming prefix, the backward kernel recomputes the
per-frame statistics from x and runs the reverse look-back for the suffix sums."""
from __future__ import annotations

import torch

from ...state import NormState
from .launch import backward as launch_backward, forward as launch_forward, tile_size  # noqa: F401


class _RunningNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, lengths, sw, sm, sq, opts):
        state = NormState(sw, sm, sq) if sw is not None else None
        train = any(ctx.needs_input_grad)
        y, sout, (pre, plan) = launch_forward(x, weight, bias, lengths, state, save_for_backward=train, **opts)
        if train:
            ctx.save_for_backward(x, weight, lengths, sw, sm, sq, pre)
            ctx.plan = plan
        ctx.opts = opts
        ctx.has_bias = bias is not None
        if sout is None:
            return y, None, None, None
        return y, *sout

    @staticmethod
    def backward(ctx, gy, gw_out, gm_out, gq_out):
        x, weight, lengths, sw, sm, sq, pre = ctx.saved_tensors
        opts = {k: v for k, v in ctx.opts.items() if k != "return_state"}
        B, C = x.shape[:2]
        nsc = C if opts["per_channel"] else 1
        gsout = None
        if any(g is not None for g in (gw_out, gm_out, gq_out)):
            gsout = torch.stack([torch.zeros(sw.shape if sw is not None else (B, nsc)[: 1 + opts["per_channel"]],
                                             dtype=torch.float64, device=x.device) if g is None else g
                                 for g in (gw_out, gm_out, gq_out)]).reshape(3, B, nsc).contiguous()
        state = NormState(sw, sm, sq) if sw is not None else None
        need_w = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        gx, gwt, gb, gsin = launch_backward(gy, gsout, x, weight, lengths, state, pre, ctx.plan,
                                            need_weight_grads=need_w, **opts)
        gs = [None] * 3 if gsin is None else [t.reshape(sw.shape) for t in gsin.unbind(0)]
        return (gx if ctx.needs_input_grad[0] else None, gwt if ctx.needs_input_grad[1] else None,
                gb if ctx.needs_input_grad[2] and ctx.has_bias else None, None, *gs, None)


def forward(x, weight, bias, lengths, state, *, per_channel, decay, eps, eps_mode, return_state):
    """The backend contract (normlib.backends)."""
    opts = dict(per_channel=per_channel, decay=decay, eps=eps, eps_mode=eps_mode, return_state=return_state)
    sw, sm, sq = state if state is not None else (None, None, None)
    y, *sout = _RunningNorm.apply(x, weight, bias, lengths, sw, sm, sq, opts)
    return y, (NormState(*sout) if return_state else None)
