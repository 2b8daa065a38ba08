"""Launchers: tile sizes from the shape, the look-back workspace, and the forward entry point."""
from __future__ import annotations

import contextlib
import math

import torch
import triton

from .kernels import running_norm_fwd

FRAME, CUMULATIVE, EMA, GLOBAL = 0, 1, 2, 3
_OVERRIDE: dict = {}
_WORKSPACES: dict = {}


@contextlib.contextmanager
def tile_size(block_t=None, block_c=None, window=None, span=None, walk=None):
    """Force tile sizes (tests use small tiles so that the look-back runs on small inputs)."""
    old = dict(_OVERRIDE)
    _OVERRIDE.update({k: v for k, v in dict(block_t=block_t, block_c=block_c, window=window, span=span, walk=walk).items()
                      if v is not None})
    try:
        yield
    finally:
        _OVERRIDE.clear()
        _OVERRIDE.update(old)


def time_mode(decay) -> int:
    if decay is None:
        return GLOBAL
    return FRAME if decay == 0 else CUMULATIVE if decay == 1 else EMA


def _num_sms(device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def choose_tiles(C, T, per_channel, channels_last, device):
    """(BLOCK_C, BLOCK_T, num_warps): about 8K elements per tile, all channels when pooled."""
    c2 = triton.next_power_of_2(C)
    if per_channel:
        block_c = min(c2, 64 if channels_last else 16)
    else:
        block_c = c2
    block_t = max(1, min(triton.next_power_of_2(T), 8192 // block_c, 512))
    block_c = _OVERRIDE.get("block_c", block_c)
    block_t = _OVERRIDE.get("block_t", block_t)
    warps = 8 if block_c * block_t >= 4096 else 4
    return block_c, block_t, warps


def _workspace(device, n_words, dtype):
    """A zeroed buffer kept per device (grown on demand) and the ticket counter."""
    key = (device, dtype)
    ws = _WORKSPACES.get(key)
    if ws is None or ws.numel() < n_words:
        ws = torch.zeros(max(n_words, 1 << 12), dtype=dtype, device=device)
        _WORKSPACES[key] = ws
    ctr = _WORKSPACES.get((device, "ctr"))
    if ctr is None:
        ctr = _WORKSPACES[(device, "ctr")] = torch.zeros(1, dtype=torch.int64, device=device)
    return ws, ctr


def forward(x, weight, bias, lengths, state, *, per_channel, decay, eps, eps_mode, return_state,
            save_stats=False):
    """The backend contract (see normlib.backends); with ``save_stats`` also returns the per-frame
    (mean - K, 1/std) of pooled norms as a third value."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"backend='triton' takes float16, bfloat16 or float32 inputs, got {x.dtype}")
    B, C, T = x.shape
    mode = time_mode(decay)
    y = torch.empty_like(x)
    dev = x.device
    NSC = C if per_channel else 1
    sout = None
    if return_state:
        sout = (torch.stack(list(state)).reshape(3, B, NSC).clone() if state is not None
                else torch.zeros(3, B, NSC, dtype=torch.float64, device=dev))
    stats = (torch.empty(2, B, T, dtype=torch.float32, device=dev) if save_stats and not per_channel else None)
    if B == 0 or C == 0 or T == 0:
        return y.zero_(), (None if sout is None else _state(sout, per_channel)), stats

    channels_last = x.stride(1) == 1 and x.stride(2) != 1
    BLOCK_C, BLOCK_T, warps = choose_tiles(C, T, per_channel, channels_last, dev)
    NCB = triton.cdiv(C, BLOCK_C) if per_channel else 1
    SC = BLOCK_C if per_channel else 1
    NT = triton.cdiv(T, BLOCK_T)
    window = _OVERRIDE.get("window", 32 if SC == 1 else 8)
    sin = torch.stack(list(state)).reshape(3, B, NSC).contiguous() if state is not None and mode != FRAME else None
    dummy = y
    args = dict(
        w_ptr=weight if weight is not None else dummy, b_ptr=bias if bias is not None else dummy,
        len_ptr=lengths if lengths is not None else dummy, sin_ptr=sin if sin is not None else dummy,
        sout_ptr=sout if sout is not None else dummy,
        mean_ptr=stats[0] if stats is not None else dummy, rstd_ptr=stats[1] if stats is not None else dummy,
    )
    flags = dict(POOL_ALL=not per_channel, HAS_W=weight is not None, HAS_B=bias is not None,
                 HAS_LEN=lengths is not None, HAS_SIN=sin is not None, STORE_SOUT=sout is not None,
                 STORE_STATS=stats is not None, EPS_OUTSIDE=eps_mode == "outside",
                 BLOCK_C=BLOCK_C, BLOCK_T=BLOCK_T, WINDOW=window, AGG_ONLY=bool(_OVERRIDE.get("walk")),
                 num_warps=warps)
    strides = (*x.stride(), *y.stride())
    log2d = math.log2(decay) if mode == EMA else 0.0

    if mode == GLOBAL:
        want = max(1, 4 * _num_sms(dev) // (B * NCB))
        span = _OVERRIDE.get("span", max(1, triton.cdiv(NT, want)))
        nspan = triton.cdiv(NT, span)
        ws = torch.empty(B * NCB * nspan * 3 * SC, dtype=torch.float32, device=dev)
        for phase, grid in ((1, (B * NCB, nspan)), (2, (B * NCB, NT))):
            running_norm_fwd[grid](x, y, ws_ptr=ws, ctr_ptr=ws, **args, sxb=strides[0], sxc=strides[1],
                                   sxt=strides[2], syb=strides[3], syc=strides[4], syt=strides[5], B=B, C=C,
                                   T=T, NCB=NCB, NT=NT, NSPAN=nspan, log2d=log2d, eps=eps, MODE=mode,
                                   PHASE=phase, SPAN=span, **flags)
    else:
        if mode == FRAME:
            ws, ctr, grid = y, y, (B * NCB, NT)
        else:
            ws, ctr = _workspace(dev, B * NCB * NT * 6 * SC, torch.int64)
            grid = (B * NCB * NT,)
        running_norm_fwd[grid](x, y, ws_ptr=ws, ctr_ptr=ctr, **args, sxb=strides[0], sxc=strides[1],
                               sxt=strides[2], syb=strides[3], syc=strides[4], syt=strides[5], B=B, C=C, T=T,
                               NCB=NCB, NT=NT, NSPAN=1, log2d=log2d, eps=eps, MODE=mode, PHASE=0, SPAN=1,
                               **flags)
    return y, (None if sout is None else _state(sout, per_channel)), stats


def _state(s, per_channel):
    from ...state import NormState

    s = s if per_channel else s[..., 0]
    return NormState(s[0], s[1], s[2])
