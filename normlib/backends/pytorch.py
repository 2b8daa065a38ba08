"""The PyTorch backend: any device, autograd by PyTorch, at about the cost of the sum/sumsq formula.

Values are shifted by K, frame 0's mean (per sequence, or per channel; each frame's own channel 0 for
FRAME), so that a DC offset costs no digits. A pooled norm reduces its channels first (each frame's mean
and the squares about it), so its running part is only (B, T). The running statistics follow Welford's
recurrence in parallel form, in float64: decayed sums (``cumsum``; for EMA, scaled cumsums in blocks whose
scale stays in float64's range) of the weights, of the means and of squared differences of means, which
never cancel. An incoming state joins by Chan's merge in float64. The normalization reuses x - mean and is
written in place where autograd needs nothing.

Per-channel running norms without lengths run Welford's recurrence for all frames at once in float64
(_running_chan), in blocks of channels that stay in the CPU's cache. A training step of either running family
(autograd, no lengths, no state in or out) takes an autograd.Function with the backward written out
(_ChanNorm, _PooledNorm; docs/backward.md).
"""
from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from ..state import NormState, merge
from . import cpu

_SCALE_BITS = 256  # a block of a decayed cumsum scales its terms by at most 2**256 (float64 reaches 2**1023)


def _doubling(v, d):
    """S_t = sum over tau <= t of d^(t - tau) v_tau along the last dim, in log2(T) vectorized steps."""
    k = 1
    while k < v.shape[-1]:
        v = torch.cat([v[..., :k], v[..., k:] + d**k * v[..., :-k]], dim=-1)
        k *= 2
    return v


def decayed_cumsum(v, d: float, inplace=False):
    """S_t = sum over tau <= t of d^(t - tau) v_tau along the last dim (d = 1: cumsum, d = 0: v); ``inplace``:
    written over v where it can (v contiguous, one block).

    Within a block of L frames, S = d^tau * cumsum(d^-tau * v), with L such that d^-L <= 2^256; the blocks'
    totals carry into the next blocks by a doubling scan over the (few) blocks."""
    inplace = inplace and v.is_contiguous()
    if d == 1:
        return v.cumsum_(-1) if inplace else v.cumsum(-1)
    if d == 0:
        return v
    T = v.shape[-1]
    L = max(1, min(T, int(_SCALE_BITS / -math.log2(d))))
    nb = -(-T // L)
    if nb == 1:  # one block (short chunks, streaming): no padding or reshaping
        down = _powers(d, T, v.dtype, v.device)
        if inplace:  # a float64 division costs 4 multiplications: 1 / down, once per signature
            return v.mul_(_powers(1 / d, T, v.dtype, v.device)).cumsum_(-1).mul_(down)
        return (v / down).cumsum(-1) * down
    u = F.pad(v, (0, nb * L - T)).unflatten(-1, (nb, L))
    tau = torch.arange(L, device=v.device, dtype=v.dtype)
    down = d**tau
    local = (u * (1 / down)).cumsum(-1) * down
    if nb > 1:
        ends = _doubling(local[..., -1], d**L)  # each block's total with all blocks before it
        local = local + F.pad(ends[..., :-1], (1, 0))[..., None] * (d * down)
    return local.flatten(-2)[..., :T]


def _powers(d: float, n: int, dtype, device):
    """d^0 .. d^(n-1); eager calls of one signature (a stream's chunks) reuse them."""
    if torch.compiler.is_compiling():
        return d ** torch.arange(n, device=device, dtype=dtype)
    return _powers_cached(d, n, dtype, device)


@functools.lru_cache(maxsize=256)
def _powers_cached(d, n, dtype, device):
    return d ** torch.arange(n, device=device, dtype=dtype)


def _stats_dtype(x):
    """The dtype of the general path's statistics and normalization: float64 for float64 inputs, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rstd(var, eps, eps_mode, inplace=False):
    if inplace:
        return var.add_(eps).rsqrt_() if eps_mode == "inside" else \
            var.clamp_min_(torch.finfo(var.dtype).tiny).sqrt_().add_(eps).reciprocal_()
    return torch.rsqrt(var + eps) if eps_mode == "inside" else 1 / (var.clamp_min(torch.finfo(var.dtype).tiny).sqrt()
                                                                    + eps)


def _normalize(xk, mu, r, weight, bias, inplace=False):
    """gamma (xk - mu) r + beta. ``inplace``: y is written over xk, where autograd needs neither (on a CPU a
    fresh full-size tensor costs more than its arithmetic); the same operations either way, so that y has the
    same bits with and without autograd, and with unit affine parameters as without."""
    def op(t, name, other):
        return getattr(t, name + "_")(other) if inplace and other.dtype == t.dtype \
            else getattr(t, name)(other)

    y = xk if mu is None else op(xk, "sub", mu)
    y = y if r is None else op(y, "mul", r)
    if weight is not None:
        y = op(y, "mul", weight[:, None])
    return y if bias is None else op(y, "add", bias[:, None])


def _unused(y, *tensors):
    """y, also on the graph of ``tensors`` that nothing in it reads: their gradients are zeros, not None, as
    on the Triton backend (DDP takes a None for an unused parameter). ``where`` keeps a NaN in them out of y."""
    no = torch.zeros((), dtype=torch.bool, device=y.device)
    for t in tensors:
        if t is not None and t.requires_grad:
            y = y + torch.where(no, t.sum(), 0).to(y.dtype)
    return y


def _live(var, valid, w):
    """var where a statistic holds more than one value (weight w > 1) at a valid frame; 1 elsewhere. Padding
    normalizes to 0, and so does a value that is its statistic's only one (its own mean, whatever the
    variance); 1 keeps autograd's terms there finite (0 / 0 with eps = 0) and at the scale of dy (1/sqrt(eps)
    terms cancelled in float32: ccln's dx with eps outside was 20 % off). Only the state's weight could see
    the variance there: it gets no gradient."""
    live = w > 1
    return torch.where(live if valid is None else live & valid, var, 1)


def _rstd_float(var, eps, eps_mode):
    """_rstd of a Python float, with the tensor version's infinities and NaNs."""
    if eps_mode == "inside":
        v = var + eps
        return 1 / math.sqrt(v) if v > 0 else math.inf if v == 0 else math.nan
    return 1 / (math.sqrt(max(var, _TINY64)) + eps)


_TINY64 = torch.finfo(torch.float64).tiny


def _welford_step(w0, m0, q0, n, mf, qf, d):
    """merge(state, frame, d) written out for a frame of weight n >= 1, so w >= 1 and the mean is exact after an
    empty state (w0 = m0 = 0). Operators only: the same lines take Python floats or tensors."""
    dw, q0 = (w0, q0) if d == 1 else (w0 * d, q0 * d)  # on arrays an op each
    w = dw + n
    delta = mf - m0
    a = delta * (n / w)
    return w, m0 + a, q0 + qf + delta * a * dw


FEW_FRAMES = 64  # a pooled call of one sequence this short, without autograd, runs its statistics as floats

# A streaming call's arrays are a few hundred values: on the CPU a torch op costs microseconds of dispatch
# whatever its size, a numpy op a fraction of that (an nn.GroupNorm call of (1, 256, 1): 13 us). Without
# autograd, the short paths below take x's values as numpy arrays there; the same lines run on tensors elsewhere.
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def _on_host(x, grad) -> bool:
    """Whether a short path's arithmetic runs on numpy arrays: plain CPU tensors (a subclass may have no numpy
    view), no autograd."""
    return x.device.type == "cpu" and not grad and type(x) in (torch.Tensor, torch.nn.Parameter)


def _quiet(host):
    """numpy's warnings off (NaN and infinities propagate silently, as in torch ops); nothing on tensors."""
    return np.errstate(all="ignore") if host else contextlib.nullcontext()


def _numpy(t):
    """A numpy view of a CPU tensor of a numpy dtype."""
    return (t.detach() if t.requires_grad else t).numpy()


def _float64(t, host):
    """t's values in float64, a copy ours to write over: a numpy array on the host."""
    if not host:
        return t.to(torch.float64, copy=True)
    return (_numpy(t) if t.dtype in _NUMPY else t.detach().to(torch.float64).numpy()).astype(np.float64)


def _values(t, host):
    """An affine parameter as the short path reads it (a numpy view on the host), or None."""
    return t if t is None or not host else _numpy(t) if t.dtype in _NUMPY else _float64(t, host)


def _output(y, x, weight, bias, host, arrange):
    """gamma y + beta (y in float64, ours to write over, C on its last dim), arranged to x's shape by ``arrange``
    (views), as a tensor of x's dtype: float32 and float64 take the affine parameters in their own dtype, others
    (bfloat16, float16) in float64 and round once."""
    if x.dtype in (torch.float32, torch.float64):
        y = y.astype(_NUMPY[x.dtype], copy=False) if host else y.to(x.dtype)
    if host:  # no autograd: in place
        if weight is not None:
            y *= _values(weight, host)
        if bias is not None:
            y += _values(bias, host)
        y = torch.from_numpy(arrange(y))
        return y if y.dtype == x.dtype else y.to(x.dtype)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return arrange(y.to(x.dtype))


def _to_bct(y):  # (T, C) -> (1, C, T)
    return y.T[None]


def _to_1c1(y):  # (C,) -> (1, C, 1)
    return y[None, :, None]


def _to_bc1(y):  # (B, C) -> (B, C, 1)
    return y[..., None]


def _state_values(state, host):
    """(w, m, m2) as the short paths read them: w detached (a count: no gradient), numpy arrays on the host."""
    return (state.w.detach(), state.m, state.m2) if not host else tuple(_numpy(t) for t in state)


def _frames_floats(x, weight, bias, state, decay, eps, eps_mode):
    """A short call (T <= FEW_FRAMES, no lengths) of one sequence (B = 1) of a pooled causal norm without autograd,
    a real-time model's call: each frame's moments in float64 (numpy on the CPU), then Welford's step frame by
    frame as Python floats, and y in a handful of array ops. The general path's scan takes some sixty tensor
    ops. Returns (y, state)."""
    C, T = x.shape[1], x.shape[2]
    host = _on_host(x, False)
    with _quiet(host):
        xd = _float64(x, host)[0]  # (C, T), ours to write over (indexing a tensor costs microseconds)
        if T == 1:  # a real-time model's hop: Python floats
            xd = xd[:, 0]
            mf = float(xd.sum()) / C
            xd -= mf  # the frame's deviations: two passes, no cancellation
            ms, qs = (mf,), (float(xd @ xd),)
        else:
            ms = xd.sum(0) / C
            xd -= ms
            ms, qs = ms.tolist(), (xd * xd).sum(0).tolist()
        w = m = q = 0.0  # _welford_step from an empty state gives the frame's mean exactly
        if state is not None and decay != 0:  # FRAME ignores the state
            w, m, q = (t.item() for t in state)
        n, shifts, rstds = float(C), [], []
        for mf, qf in zip(ms, qs):
            w, m, q = _welford_step(w, m, q, n, mf, qf, decay)
            shifts.append(mf - m)  # x - m = (x - mf) + (mf - m)
            rstds.append(_rstd_float(q / w if w > 1 else 1.0, eps, eps_mode))
        if T == 1:
            xd += shifts[0]
            xd *= rstds[0]
        else:
            new = np.array if host else functools.partial(torch.tensor, dtype=torch.float64, device=x.device)
            xd += new(shifts)
            xd *= new(rstds)
            xd = xd.T
        if host:
            state = np.array(((w,), (m,), (q,)))
            state = NormState(torch.from_numpy(state[0]), torch.from_numpy(state[1]), torch.from_numpy(state[2]))
        else:
            state = NormState(*torch.tensor((w, m, q), dtype=torch.float64, device=x.device).split(1))
        return _output(xd, x, weight, bias, host, _to_1c1 if T == 1 else _to_bct), state


# Values of a block of channels that _running_chan takes at once on the CPU: its float64 arrays (2 MB each) stay in
# the cache through its dozen passes, which over the whole of x would each go to memory ((4, 512, 4000) fp32, no
# grad: 41 ms in blocks, 141 ms whole, the per-channel formula 109)
CHAN_BLOCK = 1 << 18


@functools.lru_cache(maxsize=256)
def _frame_weights(d: float, T: int, device):
    """(d^(t+1), G_t = 1 + d + ... + d^t, 1 / G_t) for t < T, float64: the weight at frame t of an incoming state
    and of frames 0..t (each weighs 1 when it comes); eager calls of one signature (a stream's chunks) reuse
    them."""
    p = d ** torch.arange(T + 1, device=device, dtype=torch.float64)
    G = p[:-1].cumsum(0)
    return p[1:], G, 1 / G


def _chan_step(x) -> int:
    """Channels a block of _running_chan: all of them on a GPU or while compiling (one graph)."""
    B, C, T = x.shape
    if torch.compiler.is_compiling() or x.device.type != "cpu":
        return C
    return max(1, CHAN_BLOCK // max(1, B * T))


def _running_chan(x, weight, bias, state, decay, eps, eps_mode, return_state):
    """A per-channel causal norm without lengths (ccln, ccemaln), any T, in blocks of channels (_chan_block each).
    Under autograd without a state in or out (a model's training step), _ChanNorm: the same forward, and a
    backward of its own. Returns (y, state or None)."""
    B, C, T = x.shape
    step = _chan_step(x)
    grad = _grad(x, weight, bias, state)
    if grad and state is None and not return_state and not torch.compiler.is_compiling():
        return _ChanNorm.apply(x, weight, bias, decay, eps, eps_mode), None
    # without autograd each pass writes over its input, and y's blocks go straight into y (not while compiling:
    # dynamo takes no out= view; Inductor fuses the passes itself)
    y = None if grad or torch.compiler.is_compiling() else torch.empty_like(x)
    if step >= C:
        yb, sb = _chan_block(x, weight, bias, state, decay, eps, eps_mode, return_state, y)
        return yb, None if sb is None else NormState(*sb)
    ys, ss = [], []
    for c0 in range(0, C, step):
        part = slice(c0, c0 + step)
        yb, sb = _chan_block(x[:, part], *(None if t is None else t[part] for t in (weight, bias)),
                             None if state is None else NormState(*(t[:, part] for t in state)), decay, eps, eps_mode,
                             return_state, None if y is None else y[:, part])
        ys.append(yb)
        ss.append(sb)
    if y is None:
        y = torch.cat(ys, 1)
    return y, NormState(*torch.cat(ss, 2)) if return_state else None


def _op(t, name, inplace, *args):
    """t.name(*args), written over t where ``inplace``."""
    return getattr(t, name + "_" if inplace else name)(*args)


def _chan_moments(x, state, decay, ip):
    """Welford's recurrence for all frames at once, a fixed count of tensor ops whatever T (a block of channels of
    _running_chan). Float64, values shifted by s (u = x - s): a heavy incoming state's mean, else frame 0's value.
    The state (w0, m0, q0) is a value at e = m0 - s of weight w0 d^(t+1) at frame t, so with
    G_t = 1 + d + ... + d^t:
        W_t = w0 d^(t+1) + G_t,   mu_t = (w0 d^(t+1) e + sum_tau<=t d^(t-tau) u_tau) / W_t,
        M2_t = q0 d^(t+1) + sum_tau<=t d^(t-tau) (u_tau - mu_(tau-1)) (u_tau - mu_tau),   mu_(-1) = e.
    Welford's terms are >= 0 and differences of values near each other: a state far from the data, or frames that
    an EMA forgets, cost no digits (M2 from sums of squares lost (mean - s)^2 / var of them).
    ``ip``: autograd records nothing, and every pass writes over its input. Returns (x - mu_t, mu_t - s, M2_t,
    W_t, s)."""
    weights = _frame_weights.__wrapped__ if torch.compiler.is_compiling() else _frame_weights  # see _powers
    D, G, inv = weights(decay, x.shape[2], x.device)
    if state is None:
        s, W, e = x[..., :1].detach().to(torch.float64), G, None  # nothing depends on the shift: no gradient
    else:
        w0, m0, q0 = (t.unsqueeze(-1) for t in state)  # (B, C, 1)
        a = w0 * D  # the state's weight at each frame
        # the shift: the state's mean where it still outweighs the frames at the last one (its mean, returned,
        # keeps every digit), frame 0's value where the frames outweigh it (one an EMA forgets, 1e4 from the data,
        # cost M2 3e-12 from its mean)
        s = torch.where(a[..., -1:] > G[-1], m0, x[..., :1].to(torch.float64)).detach()
        e, W = m0 - s, a + G  # the state: a value at e
    u = _op(x.to(torch.float64, copy=ip), "sub", ip, s)  # exact (x converted in one pass, not in the op's temporary)
    mu = decayed_cumsum(u, decay)
    if state is not None:
        mu = _op(mu, "addcmul", True, a, e)  # a new tensor either way
    mu = _op(mu, "div", True, W) if state is not None else _op(mu, "mul", True, inv)
    if ip:  # u - mu_(t-1), mu_(-1) = e: frame 0's term is 0 without a state (u_0 = mu_0 = 0)
        c = torch.empty_like(u)
        torch.sub(u[..., 1:], mu[..., :-1], out=c[..., 1:])
        torch.sub(u[..., :1], 0 if e is None else e, out=c[..., :1])
    else:
        c = u - (F.pad(mu[..., :-1], (1, 0)) if e is None else torch.cat([e, mu[..., :-1]], -1))
    dev = _op(u, "sub", ip, mu)  # u is x's float64 copy: ours to write over
    M2 = decayed_cumsum(_op(c, "mul", ip, dev), decay, inplace=ip)
    if state is not None:
        M2 = _op(M2, "addcmul", ip, q0, D)
    return dev, mu, M2, W, s


def _chan_block(x, weight, bias, state, decay, eps, eps_mode, return_state, out=None):
    """y of a block of channels (_chan_moments), written into ``out`` where given (autograd records nothing).
    Returns (y, the state stacked (3, B, C) or None)."""
    ip = out is not None
    dev, mu, M2, W, s = _chan_moments(x, state, decay, ip)
    if return_state:  # (3, B, C), taken before var is written over M2
        st = torch.stack([W[..., -1].expand_as(dev[..., -1]), mu[..., -1] + s[..., 0], M2[..., -1]])
    var = _op(M2, "div", ip, W)
    if not ip or (eps == 0 and eps_mode == "inside"):
        # W <= 1 only at frame 0 after a state of no weight, where u_0 = mu_0 exactly: dev = 0 makes y = beta
        # whatever a finite rstd, so _live matters only for autograd and for an infinite rstd
        var = _live(var, None, W)
    sd = _stats_dtype(x)
    if ip:  # y = dev r gamma + beta in the statistics' dtype (float64's rsqrt costs 5 times float32's)
        r = _rstd(var.to(sd), eps, eps_mode, inplace=True)
        if weight is not None:
            r.mul_(weight[:, None])
        dev = dev.to(sd)
        if bias is None:
            torch.mul(dev, r, out=out)
        else:
            torch.addcmul(bias[:, None].to(sd), dev, r, out=out)
        y = out
    else:  # y in the statistics' dtype (as the general path), the affine parameters applied there
        y = _normalize((dev * _rstd(var, eps, eps_mode)).to(sd), None, None, weight, bias).to(x.dtype)
    return y, st if return_state else None


def _reverse_cumsum(v, d):
    """sum over t >= tau of d^(t - tau) v_t along the last dim (a block's: the flips stay in the cache)."""
    return decayed_cumsum(v.flip(-1), d, inplace=True).flip(-1)


def _chan_block_grads(x, weight, gy, decay, eps, eps_mode):
    """dx (float64), and the block's dgamma (or None) of a per-channel causal norm without a state, from x and dy
    alone: the moments recomputed (_chan_moments), then the backward page's formula with one value a frame, in
    float64. With g = gamma dy, r_t the rstd and xhat = (x - mu) r, its M_t = -r_t g_t and
    2 G_t / W_t = -q_t, q = g r xhat k, k = r / W (eps inside) or 1 / (sigma W) (outside):
        dx_tau = g_tau r_tau + sum_t>=tau d^(t - tau) (q_t mu_t - g_t r_t / W_t) - u_tau sum_t>=tau d^(t - tau) q_t,
    values shifted by s (u = x - s, mu relative to s)."""
    dev, mu, M2, W, _ = _chan_moments(x, None, decay, True)
    inv = _frame_weights(decay, x.shape[2], x.device)[2]
    var = M2.mul_(inv).masked_fill_(W <= 1, 1)  # _live: frame 0 (dev = 0 there)
    if eps_mode == "inside":
        r = var.add_(eps).rsqrt_()
        k = r * inv
    else:
        sig = var.clamp_min(_TINY64).sqrt_()
        r = sig.add(eps).reciprocal_()
        k = sig.reciprocal_().mul_(inv).masked_fill_(var < _TINY64, 0)  # clamp_min's derivative: 0 below
    gy = gy.to(torch.float64)
    xhat = dev * r
    dw = None if weight is None else torch.linalg.vecdot(gy, xhat).sum(0)
    gr = (gy * weight[:, None] if weight is not None else gy.clone()).mul_(r)
    q = (gr * xhat).mul_(k)
    A = (q * mu).sub_(gr.mul(inv))
    # frame tau's own term of the suffix sum, -g r / W, joins g r as g r (1 - 1/W): at frame 0 (W = 1) the two
    # cancel exactly, where added apart they cancelled to g r's rounding (values of 1e16: dx 7 % off, frame 0's
    # 2.4 times the mean |dx|); the later frames' terms come in decayed by d
    later = _reverse_cumsum(A, decay)
    dx = gr.mul_(1 - inv).addcmul_(q, mu)
    dx[..., :-1].add_(later[..., 1:], alpha=decay)
    u = dev.add_(mu)  # x - s again
    return dx.addcmul_(u, _reverse_cumsum(q, decay), value=-1), dw


def _save(ctx, tensors, bias, decay, eps, eps_mode):
    """What the backward of _ChanNorm and _PooledNorm reads: ``tensors``, the options and beta's dtype."""
    ctx.save_for_backward(*tensors)
    ctx.opts = (decay, eps, eps_mode)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _bias_grad(ctx, gy):
    """dL/dbeta: dy summed over batch and time (the statistics' dtype: torch.sum's cascade)."""
    return gy.sum((0, 2)).to(ctx.bias_dtype) if ctx.needs_input_grad[2] else None


class _ChanNorm(torch.autograd.Function):
    """A per-channel causal norm without lengths or a state in or out, under autograd (a model's training step):
    the forward of _running_chan, saving only x, and a backward in the same blocks of channels that recomputes
    their moments (_chan_block_grads): nothing of (B, C, T) float64 is kept between the passes, and every pass of
    the backward stays in the cache."""

    @staticmethod
    def forward(ctx, x, weight, bias, decay, eps, eps_mode):
        y, _ = _running_chan(x, weight, bias, None, decay, eps, eps_mode, False)  # no grad here: in place
        _save(ctx, (x, weight), bias, decay, eps, eps_mode)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        step = _chan_step(x)
        C = x.shape[1]
        dx = torch.empty_like(x)
        dws = []
        for c0 in range(0, C, step):
            part = slice(c0, c0 + step)
            dxb, dw = _chan_block_grads(x[:, part], None if weight is None else weight[part], gy[:, part], *ctx.opts)
            dx[:, part] = dxb
            dws.append(dw)
        dw = torch.cat(dws).to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        return dx, dw, _bias_grad(ctx, gy), None, None, None


class _PooledNorm(torch.autograd.Function):
    """A pooled causal norm (cln, emaln) without lengths or a state in or out, under autograd (a model's training
    step): the general path's forward without autograd, which keeps its per-frame statistics, and the backward
    page's formula written out in a dozen passes over (B, C, T) (autograd through the general path took some
    forty nodes, most of them full-size; a small model's step is their count). The running parts stay (B, 1, T)
    and float64: with g = gamma dy, A_t = sum_c g, S_t = sum_c g xhat,
        M_t = -r_t A_t,   2 G_t = 2 r'_t S_t / r_t,
        dx = g r + (U + mu V) + (x - mu) V,   U, V: reverse decayed cumsums of (M - 2 G mu) / W and 2 G / W,
    so that x - mu (small) multiplies V and U + mu V is taken in float64, shifted by K."""

    @staticmethod
    def forward(ctx, x, weight, bias, decay, eps, eps_mode):
        keep = {}
        y, _ = forward(x, weight, bias, None, None, per_channel=False, decay=decay, eps=eps, eps_mode=eps_mode,
                       return_state=False, keep=keep)
        _save(ctx, (weight, *(keep[k] for k in ("xhat", "mu", "var", "W"))), bias, decay, eps, eps_mode)
        ctx.x_dtype = x.dtype
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        weight, xhat, mu, var, W = ctx.saved_tensors
        decay, eps, eps_mode = ctx.opts
        sd, rd = xhat.dtype, torch.float64
        if xhat.shape[1] == 1:  # a statistic of one value (frame 0): no gradient through its variance
            var = _live(var, None, W)
        if eps_mode == "inside":
            r = torch.rsqrt(var + eps)
            half = r * r * -0.5  # r' / r = -r^2 / 2
        else:
            sig = var.clamp_min(_TINY64).sqrt()
            r = 1 / (sig + eps)
            half = torch.where(var < _TINY64, 0, r / sig * -0.5)  # r' / r = -r / (2 sigma); clamp_min's 0 below
        gy = gy.to(sd)
        gx = gy * xhat
        dw = None if weight is None or not ctx.needs_input_grad[1] else gx.sum((0, 2)).to(weight.dtype)
        # the sums over channels of gamma dy and gamma dy xhat: (B, 1, C) @ (B, C, T), no product written out
        w = None if weight is None else weight.to(sd)
        wb = None if w is None else w.expand(gy.shape[0], 1, -1)
        A, S = ((t.sum(1, keepdim=True) if w is None else torch.bmm(wb, t)).to(rd) for t in (gy, gx))
        G2 = 2 * half * S  # 2 G_t
        V = _reverse_cumsum(G2 / W, decay)
        U = _reverse_cumsum((-r * A - G2 * mu) / W, decay)
        # x - mu = xhat / r
        dx = torch.addcmul((U + mu * V).to(sd), xhat, (V / r).to(sd))
        dx.addcmul_(gy if w is None else gy * w[:, None], r.to(sd))
        return dx.to(ctx.x_dtype), dw, _bias_grad(ctx, gy), None, None, None


_EMPTY = np.empty(0)
_CPU_DTYPES = (torch.float32, torch.float64)


def _on_cpu_loops(x, weight, bias) -> bool:
    """Whether a running norm of whole sequences takes the compiled CPU loops (backends/cpu.py): plain float32 or
    float64 CPU tensors, eagerly."""
    return cpu.AVAILABLE and x.device.type == "cpu" and x.dtype in _CPU_DTYPES and type(x) is torch.Tensor \
        and _cpu_affine(weight) and _cpu_affine(bias) and not torch.compiler.is_compiling()


def _cpu_affine(t) -> bool:
    return t is None or t.dtype in _CPU_DTYPES and t.is_cpu


def _cpu_arrays(x):
    """x's (B, C, T) view as the pooled loops' arrays: (B, T, C) where channels are contiguous ("b t c"), else
    (B, C, T) (copied where neither is contiguous); and that orientation."""
    tc = _rows_of_channels(x)
    return (x.transpose(1, 2) if tc else x.contiguous()), tc


def _rows_of_channels(x) -> bool:
    """Whether each frame's channels are contiguous ("b t c" memory), as _cpu_arrays's orientation."""
    return not x.is_contiguous() and x.transpose(1, 2).is_contiguous()


def _array(t):
    """A CPU tensor's numpy view (the affine parameters in their own dtype: the loops read float32 or float64)."""
    return _EMPTY if t is None else t.numpy(force=True)


def _from64(a, dtype):
    """A float64 array as a tensor of ``dtype`` (numpy's cast: a torch op costs more at these sizes)."""
    return torch.from_numpy(a if dtype == torch.float64 else a.astype(_NUMPY[dtype]))


def _orientation(x) -> int:
    """The pooled loops' way through x's memory: 1 frame after frame ("b t c"), 0 over channel rows (contiguous),
    -1 over the rows of a contiguous copy."""
    return 1 if _rows_of_channels(x) else 0 if x.is_contiguous() else -1


def _cpu_forward(x, weight, bias, decay, eps, eps_mode, state=None, per_channel=False, keep=False, orient=None):
    """y and the state after the last frame, float64 arrays (3, B) or (3, B, C) per channel; with ``keep``, what
    the backward reads: pooled, the running mean and variance of every frame; per channel, each tile's incoming
    moments (cpu.forward_channels' ck). Numpy's arrays throughout: a torch op costs more than these calls' work
    at a streaming hop's sizes. ``orient``: x's _orientation, where a prepared call knows it."""
    B, C, T = x.shape
    xa = x.numpy(force=True)  # a view of x (detached)
    shape = (B, C) if per_channel else (B,)
    w0, m0, q0 = (np.zeros(shape),) * 3 if state is None else \
        (state.w.numpy(force=True), state.m.numpy(force=True), state.m2.numpy(force=True))
    if not w0.shape == m0.shape == q0.shape == shape:  # the loops read without bounds checks: never past an array
        raise ValueError(f"the state's fields must have shape {shape}, got {w0.shape}, {m0.shape}, {q0.shape}")
    final = np.empty((3, *shape))
    if per_channel:  # (B, T, C) views in any strides: each channel's row is one recurrence
        y = np.empty_like(xa)  # x's memory order
        inside = eps_mode == "inside"
        # with keep, the moments entering each tile of frames: the backward recomputes the tile's from them
        ck = np.empty(B * cpu._rows(T) * C) if keep else _NO_STATS  # a stream's hop: none, and no allocation
        cpu.forward_channels(xa.transpose(0, 2, 1), _array(weight), _array(bias), float(decay), float(eps), inside,
                             y.transpose(0, 2, 1), w0, m0, q0, final, ck)
        return torch.from_numpy(y), final, ck if keep else None, None
    orient = _orientation(x) if orient is None else orient
    tc = orient == 1
    xa = xa.transpose(0, 2, 1) if tc else xa if orient == 0 else np.ascontiguousarray(xa)
    y = np.empty(xa.shape, xa.dtype)
    mus, var = (np.empty((B, T)), np.empty((B, T))) if keep else (_NONE2, _NONE2)
    cpu.forward(xa, _array(weight), _array(bias), float(decay), float(eps), eps_mode == "inside", tc, y, mus, var,
                w0, m0, q0, final)
    y = torch.from_numpy(y)
    return (y.transpose(1, 2) if tc else y), final, mus, var


_NONE2 = np.empty((0, 0))  # statistics not kept
_NO_STATS = np.empty(0)  # per channel: no checkpoints kept


def _state_of(final):
    """The loops' state, (3, B) or (3, B, C) float64, as a NormState of tensors."""
    return NormState(torch.from_numpy(final[0]), torch.from_numpy(final[1]), torch.from_numpy(final[2]))


class _CpuLoops(torch.autograd.Function):
    """_PooledNorm's and _ChanNorm's case on the CPU: the forward and backward of backends/cpu.py, a few
    passes each, in place of some forty torch ops each way (a CPU's cost of a small layer is its op count)."""

    @staticmethod
    def forward(ctx, x, weight, bias, decay, eps, eps_mode, per_channel):
        y, _, mus, var = _cpu_forward(x, weight, bias, decay, eps, eps_mode, per_channel=per_channel, keep=True)
        ctx.save_for_backward(x, weight)
        # pooled: each frame's running mean and variance; per channel, each tile's incoming moments
        ctx.stats = (mus, var, decay, eps, eps_mode, per_channel)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        mus, var, decay, eps, eps_mode, per_channel = ctx.stats
        C = x.shape[1]
        dw, db = np.zeros(C), np.zeros(C)
        gy = gy if gy.dtype == x.dtype else gy.to(x.dtype)
        if per_channel:
            dx = torch.empty_like(x)
            cpu.backward_channels(x.detach().numpy().transpose(0, 2, 1), gy.numpy().transpose(0, 2, 1),
                                  _array(weight), float(decay), float(eps), eps_mode == "inside",
                                  dx.numpy().transpose(0, 2, 1), dw, db, mus)
        else:
            xv, tc = _cpu_arrays(x.detach())
            gv = (gy.transpose(1, 2) if tc else gy).contiguous()
            dx = torch.empty(xv.shape, dtype=x.dtype)
            cpu.backward(xv.numpy(), gv.numpy(), _array(weight), mus, var, float(decay), float(eps),
                         eps_mode == "inside", tc, dx.numpy(), dw, db)
            dx = dx.transpose(1, 2) if tc else dx
        dw = _from64(dw, weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        db = _from64(db, ctx.bias_dtype) if ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None, None


def _grad(x, weight, bias, state) -> bool:
    """Whether autograd records this call."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                           for t in (x, weight, bias, *(state or ())))


def _one_frame(x, weight, bias, state, *, per_channel, decay, eps, eps_mode):
    """A streaming call of one frame (T = 1, no lengths) of a causal norm: Welford's step in float64 (a real-time
    model makes one such call per layer and hop), on numpy arrays where it can (_on_host). Returns (y, state).
    One sequence of a pooled norm without autograd takes _frames_floats (see forward)."""
    C = x.shape[1]
    grad = _grad(x, weight, bias, state)
    host = _on_host(x, grad)
    xp = np if host else torch
    with _quiet(host):
        xd = _float64(x, host)[..., 0]  # (B, C)
        if per_channel:  # one value a frame: no spread
            n, mf, qf = 1.0, xd, 0.0
        else:
            mf = xd.mean(1)
            dev = xd - mf[:, None]
            n, qf = float(C), (dev * dev).sum(1)
        if state is None or decay == 0:  # nothing before, or FRAME: the frame alone
            w, m, q = xp.full_like(mf, n), mf, qf if not per_channel else xp.zeros_like(mf)
        else:
            w, m, q = _welford_step(*_state_values(state, host), n, mf, qf, decay)
        var = xp.where(w > 1, q / w, 1.0)  # _live: one value so far has no spread
        r = 1 / xp.sqrt(var + eps) if eps_mode == "inside" else 1 / (xp.sqrt(var.clip(_TINY64)) + eps)
        y = (xd - m) * r if per_channel else (xd - m[:, None]) * r[:, None]
        y = _output(y, x, weight, bias, host, _to_bc1)
        if decay == 0 and state is not None and grad:  # FRAME reads no state: zero gradients into its statistics
            y = _unused(y, state.m, state.m2)
        return y, NormState(*(map(torch.from_numpy, (w, m, q)) if host else (w, m, q)))


def _native(x, weight, bias, per_channel, decay, eps):
    """GLOBAL (gln, instln) and FRAME (frameln) without lengths or a state, eps inside the root, where every
    statistic holds more than one value (else _live's case): PyTorch's own kernels, forward and backward,
    nn.GroupNorm's (one group, or one a channel) and nn.LayerNorm's (over the channels of a frame). Their float32
    moments lose digits in the distance of the mean from 0, about 3e-8 of y per standard deviation (a DC offset
    of 1e4 cost 4e-4), so x is shifted first by K:
    - FRAME: each frame's channel 0, as the general path does; on the CPU (not while compiling) only where a
      frame's mean is more than 8 of its standard deviations from 0, which LayerNorm's own statistics tell
      (a call without the shift first: float32's rounding leaves about 8 × 6e-8 of y where it is skipped);
    - GLOBAL: the median of 17 frames spread over the sequence (of 16 channels' values for gln), within about
      a standard deviation of the mean (|mean - median| <= std), where frame 0 alone may be the outlier (silence
      before a level 1e4 high). On the CPU (no device sync there; not while compiling) the shift, a pass over x
      and a third of GroupNorm's time, is taken only where a statistic's mean is more than 8 of its standard
      deviations from 0, which GroupNorm's own statistics tell (a call without the shift first)."""
    sd = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs = x.to(sd)
    B, C, T = x.shape
    weight, bias = (None if t is None else t.to(sd) for t in (weight, bias))
    if decay == 0:  # LayerNorm over contiguous frames: "b t c" memory is; "b c t" is copied, and shifted there
        xt = xs.transpose(1, 2)
        if T and x.device.type == "cpu" and not torch.compiler.is_compiling():  # (a traced bool breaks)
            y, mean, rstd = torch.native_layer_norm(xt, (C,), weight, bias, eps)
            if bool((mean.abs() * rstd).max() <= 8):  # every frame's mean within 8 of its deviations from 0
                return y.transpose(1, 2).to(x.dtype)
        K = xs[:, :1].detach().transpose(1, 2)
        xt = xt - K if xt.is_contiguous() else xt.contiguous().sub_(K)  # the copy LayerNorm would make: ours
        return F.layer_norm(xt, (C,), weight, bias, eps).transpose(1, 2).to(x.dtype)
    if weight is None and bias is not None:  # GroupNorm's backward fails on beta without gamma (torch 2.13:
        # "tensor does not have a device"): beta added after it
        return _native(x, None, None, per_channel, decay, eps).add(bias[:, None].to(x.dtype))
    groups = C if per_channel else 1
    if x.device.type == "cpu" and not torch.compiler.is_compiling():  # as FRAME's (a traced bool breaks)
        y, mean, rstd = torch.native_group_norm(xs.contiguous(), weight, bias, B, C, T, groups, eps)  # as F.group_norm
        if bool((mean.abs() * rstd).max() <= 8):
            return y.to(x.dtype)
    seen = xs.detach()[..., ::max(1, (T - 1) // 16)]  # a strided view (index_select on time took 4 ms)
    seen = seen if per_channel else seen[:, ::max(1, C // 16)].reshape(B, 1, -1)  # 16 channels: a short sort
    return F.group_norm(xs - seen.median(2, keepdim=True).values, groups, weight, bias, eps).to(x.dtype)


@functools.lru_cache(maxsize=256)
def _pool_weights(d: float, T: int, C: int, device):
    """A pooled norm's running weights without lengths, (T,) float64: W_t = C G_t and the factor
    C d W_(t-1) / W_t of Welford's term (0 at frame 0)."""
    W = C * (_frame_weights.__wrapped__ if torch.compiler.is_compiling() else _frame_weights)(d, T, device)[1]
    return W, C * F.pad(d * W[:-1], (1, 0)) / W


def _frame_moments(xk, n, valid, inplace=False):
    """Each frame's n values of x - K: the sum s1 (float64), the float32 mean mf, the deviations dev = x - mf
    (written over xk where ``inplace``: on a CPU a fresh full-size tensor costs more than a pass), the mean m_f
    (mf corrected by dev's own sum: n times mf's rounding) and M2 about it, float64."""
    rd = torch.float64
    count = n if type(n) is float else torch.where(n > 0, n, 1)
    s1 = xk.sum(1, keepdim=True).to(rd)
    mf = (s1 / count).to(xk.dtype)
    dev = xk.sub_(mf) if inplace and valid is None else xk - mf if valid is None else torch.where(valid, xk - mf, 0)
    fix = dev.sum(1, keepdim=True).to(rd)
    m_f = mf.to(rd) + fix / count
    # M2 about m_f = mf + fix / n: the squares about mf, less n (fix / n)^2
    m2_f = ((dev * dev).sum(1, keepdim=True).to(rd) - fix * fix / count).clamp_min(0)
    return s1, mf, dev, m_f, m2_f


def forward(x, weight, bias, lengths, state, *, per_channel, decay, eps, eps_mode, return_state, keep=None):
    """x: (B, C, T) view in any strides; decay None means GLOBAL. Returns (y, state or None). ``keep``: a dict
    that a pooled running norm's general path fills with its per-frame statistics (_PooledNorm)."""
    B, C, T = x.shape
    # floats break a graph, and a test of T would guard on it: first of all, not while compiling
    if not torch.compiler.is_compiling() and B == 1 and 1 <= T <= FEW_FRAMES and C and lengths is None \
            and decay is not None and not per_channel and not _grad(x, weight, bias, state) and keep is None \
            and not _on_cpu_loops(x, weight, bias):
        y, s = _frames_floats(x, weight, bias, state, decay, eps, eps_mode)
        return y, s if return_state else None
    if state is not None:  # its weight is a count, which nothing differentiable moves: no gradient
        state = NormState(state.w.detach(), state.m, state.m2)
    if B and C and T and lengths is None and decay is not None and keep is None \
            and not (decay == 0 and state is None and not return_state and _rows_of_channels(x)) \
            and _on_cpu_loops(x, weight, bias):  # running norms on the CPU: backends/cpu.py
        # (but FRAME's whole sequences in "b t c" memory: LayerNorm's kernel runs contiguous frames faster)
        if not _grad(x, weight, bias, state):
            y, out, *_ = _cpu_forward(x, weight, bias, decay, eps, eps_mode, state, per_channel)
            return y, _state_of(out) if return_state else None
        if state is None and not return_state:  # a state's gradients are the general path's
            return _CpuLoops.apply(x, weight, bias, decay, eps, eps_mode, per_channel), None
    if B and C and lengths is None and eps_mode == "inside" and (
            decay is None and (T > 1 if per_channel else C * T > 1)
            or decay == 0 and C > 1 and state is None and not return_state):
        return _native(x, weight, bias, per_channel, decay, eps), None
    if T == 1 and C and lengths is None and decay is not None and return_state:
        return _one_frame(x, weight, bias, state, per_channel=per_channel, decay=decay, eps=eps, eps_mode=eps_mode)
    if B and C and T and lengths is None and per_channel and decay:
        return _running_chan(x, weight, bias, state, decay, eps, eps_mode, return_state)
    if B and C and T and lengths is None and decay and state is None and not return_state and keep is None \
            and not torch.compiler.is_compiling() and _grad(x, weight, bias, state):
        return _PooledNorm.apply(x, weight, bias, decay, eps, eps_mode), None
    if T == 0 or C == 0:  # no frame or no channel: nothing to normalize, no value seen; the state passes through
        empty = NormState.empty((B, C) if per_channel else (B,), device=x.device)
        y = _unused(x.clone(), weight, bias)  # on x's graph, and on the affine parameters'
        return y, (state if state is not None else empty) if return_state else None
    sd = _stats_dtype(x)
    valid = None if lengths is None else (torch.arange(T, device=x.device) < lengths[:, None])[:, None, :]
    xs = x.to(sd)
    if valid is not None:
        xs = torch.where(valid, xs, 0)  # padding is never read, not even as NaN

    # x - K is exact near K (Sterbenz): a DC offset costs no digits in mu or in x - mu. FRAME shifts each frame
    # by its own channel 0, so a frame far from frame 0 keeps its digits.
    if decay == 0:
        K = xs[:, :1].detach()  # (B, 1, T)
    else:
        K = (xs[..., :1] if per_channel else xs[..., :1].mean(1, keepdim=True)).detach()  # (B, C|1, 1)
    # autograd saves what the normalization reads: only without it may y be written over x - K
    inplace = not (torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                                   for t in (x, weight, bias, *(state or ()))))
    xk = xs - K if valid is None or decay == 0 else torch.where(valid, xs - K, 0)
    rd = torch.float64  # sums over time (and GLOBAL's moments) are taken in float64
    if decay is None:  # GLOBAL: the mean, then the squares about it (two passes; y reuses x - mu)
        dims = (2,) if per_channel else (1, 2)
        n = float(T if per_channel else C * T) if valid is None else \
            valid.sum(2, keepdim=True).to(rd) * (1 if per_channel else C)  # (B, 1, 1)
        count = torch.as_tensor(n, dtype=rd, device=x.device).clamp_min(1)
        mu = (xk.sum(dims, keepdim=True).to(rd) / count).to(sd)
        dev = xk.sub_(mu) if inplace and valid is None else \
            xk - mu if valid is None else torch.where(valid, xk - mu, 0)
        # the float32 sum of x - K rounds the mean (1e-5 of y with T = 3000 frames 1e4 from frame 0): the
        # deviations' own mean corrects it
        fix = dev.sum(dims, keepdim=True).to(rd) / count
        # torch.sum's cascade keeps a long row's sum of squares to a few ulps; vector_norm accumulated in float32
        # (gln over 24000 values: 1.1e-5 of y)
        var = (dev * dev).sum(dims, keepdim=True).to(rd) / count - fix.square()
        y = _normalize(dev, fix.to(sd), _rstd(_live(var.clamp_min(0), None, count), eps, eps_mode).to(sd),
                       weight, bias, inplace)
        y = y if valid is None else torch.where(valid, y, 0)
        return y.to(x.dtype), None

    # Each frame's (n, m, M2) relative to K, then the running ones in parallel form of Welford's recurrence:
    # W_t = d W_(t-1) + n_t, S1_t = d S1_(t-1) + n_t m_t (so mu_t = S1_t / W_t), and
    # M2_t = d M2_(t-1) + M2_t(frame) + n_t (d W_(t-1) / W_t) (m_t - mu_(t-1))^2: a decayed sum of terms >= 0,
    # each from a difference of means, so a mean far from frame 0's (an EMA that has forgotten it) costs no
    # digits (sums of (x - K)^2 lost (mu - K)^2 / var of them).
    if valid is None and not per_channel and decay != 0:  # every frame weighs C: its weights are constants
        n = float(C)
    else:
        n = (torch.ones(B, 1, T, device=x.device, dtype=rd) if valid is None else valid.to(rd))
        n = n if per_channel else n * C
    if per_channel:
        m_f, dev = xk.to(rd), xk  # one value a frame: no spread
        s1 = m_f
    else:
        s1, mf, dev, m_f, m2_f = _frame_moments(xk, n, valid, inplace)  # y reuses dev = x - m_f
    if decay == 0:  # FRAME: each frame alone
        own = NormState(n, m_f, m2_f)
    elif type(n) is float:  # the same recurrence, its weights from the cache: W_t and n d W_(t-1) / W_t
        W, coef = (_pool_weights.__wrapped__ if torch.compiler.is_compiling() else _pool_weights)(decay, T, C, x.device)
        mu = decayed_cumsum(s1, decay) / W
        c = (m_f - F.pad(mu[..., :-1], (1, 0))).square() * coef
        own = NormState(W.expand(B, 1, T), mu, decayed_cumsum(c + m2_f, decay))
    else:
        S0, S1 = decayed_cumsum(n, decay), decayed_cumsum(s1, decay)
        W = S0 if valid is None else torch.where(S0 > 0, S0, 1)  # without lengths every frame weighs n >= 1
        mu = S1 / W
        prev_w, prev_mu = (F.pad(t[..., :-1], (1, 0)) for t in (decay * S0, mu))  # frame t - 1's, 0 before 0
        c = n * prev_w / W * (m_f - prev_mu).square()
        own = NormState(S0, mu, decayed_cumsum(c if per_channel else c + m2_f, decay))
    s = own
    if state is not None and decay != 0:  # the decayed incoming state, merged in float64 (Chan: no cancellation)
        w0, m0, q0 = (t.reshape(B, -1, 1).to(rd) for t in state)
        rel = NormState(w0, m0 - K.to(rd), q0)
        s = merge(rel, own, decay ** torch.arange(1, T + 1, device=x.device, dtype=rd))
    var = s.m2 / (s.w if valid is None and decay != 0 else torch.where(s.w > 0, s.w, 1))
    # every frame of a pooled norm without lengths weighs C: W > 1 everywhere where C > 1
    r = _rstd((var if type(n) is float and n > 1 else _live(var, valid, s.w)).to(sd), eps, eps_mode)
    # x - mu_t = (x - m_f) - (mu_t - m_f), the second from two float64 means
    mu_sd = (s.m - mf.to(rd)).to(sd) if not per_channel else s.m.to(sd)
    if keep is not None:  # _PooledNorm's backward: xhat, its own tensor (y is gamma xhat + beta, the same steps)
        xhat = _normalize(dev, mu_sd, r, None, None, True)
        keep.update(xhat=xhat, mu=s.m, var=var, W=s.w)
        y = xhat if weight is None else xhat * weight[:, None]
        y = _normalize(y, None, None, None, bias, y is not xhat)  # never written over xhat
    else:
        y = _normalize(dev, mu_sd, r, weight, bias, inplace)
    y = (y if valid is None else torch.where(valid, y, 0)).to(x.dtype)
    if decay == 0 and state is not None:  # FRAME reads no state: zero gradients into its statistics
        y = _unused(y, state.m, state.m2)
    if not return_state:
        return y, None

    # the state after frame lengths[b] - 1, in float64 with the shift added back. Picked by a mask, not a
    # gather: inductor (torch 2.13, CPU) fused gather's backward (a scatter) wrongly with the scan's, and
    # gave cln's state and x gradients 80 % off under torch.compile
    if lengths is None:  # every sequence ends at frame T - 1
        # copies, not views of stride T: a compiled stream's next call would guard on (recompile for) that stride
        w, m, m2 = (t[..., -1].contiguous() for t in own)  # (B, C|1)
        k = K.to(rd)[..., -1]
    else:
        at = torch.arange(T, device=x.device) == (lengths - 1).clamp_min(0).view(B, 1, 1)
        w, m, m2 = (torch.where(at, t, 0).sum(-1) for t in own)
        k = torch.where(at, K.to(rd), 0).sum(-1) if decay == 0 else K.to(rd)[..., 0]
    w, m, m2 = (t if per_channel else t[:, 0] for t in (w, m + k, m2))
    if per_channel and w.shape != m.shape:  # one weight for all channels of a frame
        w = w.expand_as(m).contiguous()
    out = NormState(w, m, m2)
    if state is None:
        return y, out
    bshape = (B,) + (1,) * (w.dim() - 1)
    if decay != 0:
        # the chunk's own summary merged into the incoming state in float64: a float32 merge rounded a state
        # that an EMA keeps for 1 / (1 - d) calls each call (emaln, d = 0.999, one-frame chunks: 8e-6 off)
        out = merge(state, out, decay ** T if lengths is None else
                    torch.as_tensor(decay, dtype=rd, device=x.device) ** lengths.view(bshape))
    if lengths is None:  # every sequence saw T >= 1 frames
        return y, out
    keep = (lengths == 0).view(bshape)  # no frame seen: the incoming state
    return y, NormState(*(torch.where(keep, p, o) for p, o in zip(state, out)))


def prepare(x, *, per_channel, decay, eps, eps_mode):
    """The backend contract's prepared call (normlib.backends): here, forward with the options bound."""
    def call(x, weight, bias):
        return forward(x, weight, bias, None, None, per_channel=per_channel, decay=decay, eps=eps, eps_mode=eps_mode,
                       return_state=False)[0]
    return call


def prepare_stream(x, *, per_channel, decay, eps, eps_mode):
    """The backend contract's prepared streaming call (normlib.backends): a short path chosen once for x's shape
    (a real-time model's hop: one frame, or a few of one sequence), else forward."""
    B, C, T = x.shape
    opts = dict(per_channel=per_channel, decay=decay, eps=eps, eps_mode=eps_mode)

    def call(x, weight, bias, state):
        return forward(x, weight, bias, None, state, return_state=True, **opts)

    if decay is None or not C:
        return call
    if T and _on_cpu_loops(x, None, None):  # any hop: backends/cpu.py (x's dtype, device and strides are the
        orient = _orientation(x)             # signature's)

        def looped(x, weight, bias, state):
            if _grad(x, weight, bias, state) or not (_cpu_affine(weight) and _cpu_affine(bias)):
                return call(x, weight, bias, state)
            y, out, *_ = _cpu_forward(x, weight, bias, decay, eps, eps_mode, state, per_channel, orient=orient)
            return y, _state_of(out)
        return looped
    if B == 1 and 1 <= T <= FEW_FRAMES and not per_channel:
        def few(x, weight, bias, state):
            if _grad(x, weight, bias, state):
                return call(x, weight, bias, state)
            return _frames_floats(x, weight, bias, state, decay, eps, eps_mode)
        return few
    if T == 1:
        return functools.partial(_one_frame, **opts)
    return call
