"""The Triton backend: one running-statistics kernel template (kernels.py) and its launchers (launch.py).

Gradients: until the fused backward lands, the backward recomputes the forward with the PyTorch backend
and differentiates that (same math, so the same gradients within float32 rounding).
"""
from __future__ import annotations

import torch

from ..pytorch import forward as torch_forward
from ...state import NormState
from .launch import forward as launch_forward, tile_size  # noqa: F401


class _RunningNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, lengths, sw, sm, sq, opts):
        state = NormState(sw, sm, sq) if sw is not None else None
        y, sout, _ = launch_forward(x, weight, bias, lengths, state, **opts)
        ctx.save_for_backward(x, weight, bias, lengths, sw, sm, sq)
        ctx.opts = opts
        if sout is None:
            return y, None, None, None
        return y, *sout

    @staticmethod
    def backward(ctx, gy, gw_out, gm_out, gq_out):
        x, weight, bias, lengths, sw, sm, sq = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.requires_grad) if t is not None else None
                  for t in (x, weight, bias, sw, sm, sq)]
        x_, w_, b_, sw_, sm_, sq_ = inputs
        with torch.enable_grad():
            state = NormState(sw_, sm_, sq_) if sw_ is not None else None
            y, sout = torch_forward(x_, w_, b_, lengths, state, **ctx.opts)
            outs, grads = [y], [gy]
            if sout is not None:
                for o, g in zip(sout, (gw_out, gm_out, gq_out)):
                    if g is not None:
                        outs.append(o)
                        grads.append(g)
            need = [t for t in inputs if t is not None and t.requires_grad]
            got = iter(torch.autograd.grad(outs, need, grads, allow_unused=True)) if need else iter(())
        res = [next(got) if t is not None and t.requires_grad else None for t in inputs]
        gx, gwt, gb, gsw, gsm, gsq = res
        return gx, gwt, gb, None, gsw, gsm, gsq, None


def forward(x, weight, bias, lengths, state, *, per_channel, decay, eps, eps_mode, return_state):
    """The backend contract (normlib.backends)."""
    opts = dict(per_channel=per_channel, decay=decay, eps=eps, eps_mode=eps_mode, return_state=return_state)
    sw, sm, sq = state if state is not None else (None, None, None)
    y, *sout = _RunningNorm.apply(x, weight, bias, lengths, sw, sm, sq, opts)
    return y, (NormState(*sout) if return_state else None)
