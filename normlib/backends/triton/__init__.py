"""The Triton backend: one running-statistics kernel template (kernels.py), its launchers (launch.py),
and two PyTorch ops, ``normlib::running_norm_fwd`` and ``normlib::running_norm_bwd``, with the autograd
formula. They are ``triton_op``s: ``torch.compile`` (``fullgraph=True`` too) traces into them and Inductor
launches the kernels from its own code, as it launches its own (no Python launcher at run time; CUDA graphs
replay them).

The forward saves each tile's incoming prefix; the backward kernel recomputes the per-frame statistics
from x and runs the reverse look-back for the suffix sums. States cross the op boundary stacked as one
(3, B, C or 1) float64 tensor.

Eager calls skip the op dispatcher (it costs more than a small kernel): without autograd they call the
launcher directly, with autograd an ``autograd.Function`` that shares the ops' setup and backward. Under
``torch.compile`` the ops are used.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Optional

import torch
from torch import Tensor

from ...state import NormState
from triton.runtime.jit import JITFunction

from . import kernels, launch
from .launch import tile_size  # noqa: F401

_EMPTY = (0,)
# Triton's interpreter (TRITON_INTERPRET=1, CPU tests) runs Python functions that Inductor cannot launch: there
# the ops stay opaque, with their own bodies as fake implementations (launch._run_traced skips fake tensors)
_TRACEABLE = isinstance(kernels.running_norm_fwd, JITFunction)


def _op(name):
    def make(fn):
        if _TRACEABLE:
            return torch.library.triton_op(name, fn, mutates_args=())
        op = torch.library.custom_op(name, fn, mutates_args=())
        op.register_fake(fn)
        return op
    return make


def _access_key(kernel, kwargs):
    """What torch's access analysis of a launch of ``kernel`` depends on: the constexprs' values, each other
    argument's kind (a tensor's dtype, an int's specializations) and nothing of the tensors themselves.
    None where an argument is of a kind not foreseen (then no memo)."""
    key = [kernel]
    for p in kernel.params:
        v = kwargs.get(p.name)
        if p.is_constexpr or v is None or isinstance(v, (bool, str)):
            key.append(v)
        elif type(v) is int:
            key.append((int, v == 1, v % 16 == 0))  # Triton specializes on these
        elif isinstance(v, float):
            key.append(float)
        elif hasattr(v, "get_dtype") or isinstance(v, torch.Tensor):  # an Inductor buffer, or a (fake) tensor
            key.append(v.get_dtype() if hasattr(v, "get_dtype") else v.dtype)
        elif isinstance(v, torch.SymInt) or type(v).__module__.startswith("sympy"):
            key.append("symbolic")
        else:
            return None
    try:
        hash(tuple(key))
    except TypeError:
        return None
    return tuple(key)


def _holds(result, values) -> bool:
    """Whether ``result`` (names of arguments, in lists, sets and dataclasses) holds one of ``values``."""
    if any(result is v for v in values):
        return True
    if isinstance(result, (str, bytes, int, float, type(None))):
        return False
    if dataclasses.is_dataclass(result):
        return any(_holds(getattr(result, f.name), values) for f in dataclasses.fields(result))
    if isinstance(result, dict):
        return any(_holds(k, values) or _holds(v, values) for k, v in result.items())
    try:
        return any(_holds(r, values) for r in result)
    except TypeError:
        return False


def _memoized(analysis, ours):
    """``analysis`` (torch's question: which arguments does this kernel launch read and write?) asked once per
    ``_access_key`` for the kernels in ``ours``. Answers that hold the launch's own arguments (a fallback's
    "all of them") are not kept."""
    cache = {}

    @functools.wraps(analysis)
    def memo(kernel, kwargs, *args, **kw):
        # (a launch with TMA descriptors, which these kernels have none of, is asked each time)
        key = _access_key(kernel, kwargs) if kernel in ours and not any(args) and not any(kw.values()) else None
        if key is None:
            return analysis(kernel, kwargs, *args, **kw)
        if key not in cache:
            result = analysis(kernel, kwargs, *args, **kw)
            if _holds(result, [v for v in kwargs.values() if not isinstance(v, (bool, int, float, str))]):
                return result
            cache[key] = result
        return copy.deepcopy(cache[key])

    memo.normlib_memo = True
    return memo


def _memoize_access_analysis():
    """torch.compile asks which arguments of a user kernel's launch it reads and writes at four stages of each
    launch site (functionalization, two of Inductor's lowering steps, its IR node), each time compiling the
    kernel to TTIR and walking it: about 0.3 s for these kernels, over 3 minutes for a model of 49 norm layers
    (pytorch/pytorch#193227 asks once upstream). The answer depends on the kernel and its constexprs, not on
    the tensors, so normlib's kernels are asked once per ``_access_key``."""
    try:
        from torch._higher_order_ops import triton_kernel_wrap as tkw
    except ImportError:
        return
    ours = (kernels.running_norm_fwd, kernels.running_norm_bwd, kernels.sum_partials, kernels.span_scan)
    for name in ("identify_accessed_tensors", "identify_mutated_tensors"):
        fn = getattr(tkw, name, None)
        if callable(fn) and not getattr(fn, "normlib_memo", False):
            setattr(tkw, name, _memoized(fn, ours))


if _TRACEABLE:
    _memoize_access_analysis()


@_op("normlib::running_norm_fwd")
def running_norm_fwd(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], lengths: Optional[Tensor],
                     state: Optional[Tensor], per_channel: bool, decay: Optional[float], eps: float,
                     eps_outside: bool, return_state: bool, save: bool,
                     tiles: list[int]) -> tuple[Tensor, Tensor, Tensor]:
    """(y, outgoing state or an empty tensor, saved prefixes or an empty tensor)."""
    y, sout, pre = launch.forward(x, weight, bias, lengths, state, per_channel=per_channel, decay=decay,
                                  eps=eps, eps_outside=eps_outside, return_state=return_state, save=save,
                                  tiles=tiles, traced=True)
    return (y, sout if sout is not None else x.new_empty(_EMPTY, dtype=torch.float64),
            pre if pre is not None else x.new_empty(_EMPTY, dtype=torch.float32))


@_op("normlib::running_norm_bwd")
def running_norm_bwd(gy: Tensor, gsout: Optional[Tensor], x: Tensor, weight: Optional[Tensor],
                     lengths: Optional[Tensor], state: Optional[Tensor], pre: Tensor, per_channel: bool,
                     decay: Optional[float], eps: float, eps_outside: bool, need_weight_grads: bool,
                     tiles: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias, dstate), empty tensors for what was not asked."""
    gx, gw, gb, gs = launch.backward(gy, gsout, x, weight, lengths, state, pre, per_channel=per_channel,
                                     decay=decay, eps=eps, eps_outside=eps_outside,
                                     need_weight_grads=need_weight_grads, tiles=tiles, traced=True)

    def empty(dtype):  # one fresh tensor per missing output: outputs may not alias each other
        return x.new_empty(_EMPTY, dtype=dtype)

    return (gx, empty(torch.float32) if gw is None else gw, empty(torch.float32) if gb is None else gb,
            empty(torch.float64) if gs is None else gs)


def _setup(ctx, inputs, output):
    x, weight, bias, lengths, state, per_channel, decay, eps, eps_outside, return_state, save, tiles = inputs
    ctx.save_for_backward(x, weight, lengths, state, output[2])
    ctx.opts = dict(per_channel=per_channel, decay=decay, eps=eps, eps_outside=eps_outside, tiles=tiles)
    ctx.has_bias = bias is not None
    ctx.return_state = return_state
    # the state out depends on x and the state in only: with just weight or bias to train, it is a
    # constant (as on the PyTorch backend), not a graph kept alive by a stream of chunks
    const = output[2:] if ctx.needs_input_grad[0] or ctx.needs_input_grad[4] else output[1:]
    ctx.mark_non_differentiable(*(t for t in const if t is not None))


def _grads(bwd, ctx, gy, gsout):
    x, weight, lengths, state, pre = ctx.saved_tensors
    if gy is None:  # only the state was used (eager calls do not materialize unused gradients)
        gy = torch.zeros_like(x)
    need_w = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    if not ctx.return_state:
        gsout = None
    gx, gw, gb, gs = bwd(gy, gsout, x, weight, lengths, state, pre, need_weight_grads=need_w, **ctx.opts)
    return (gx, gw if ctx.needs_input_grad[1] else None,
            gb if ctx.needs_input_grad[2] and ctx.has_bias else None, None,
            gs if state is not None and ctx.needs_input_grad[4] else None,
            None, None, None, None, None, None, None)


def _backward(ctx, gy, gsout, _gpre):
    return _grads(running_norm_bwd, ctx, gy, gsout)


running_norm_fwd.register_autograd(_backward, setup_context=_setup)


class _EagerNorm(torch.autograd.Function):
    """The same forward and backward as the ops, without the dispatcher. The forward takes ctx itself: with
    a separate setup_context, apply() binds its arguments through inspect.signature on every call
    (about 100 µs)."""

    @staticmethod
    def forward(ctx, *inputs):
        x, weight, bias, lengths, state, per_channel, decay, eps, eps_outside, return_state, save, tiles = inputs
        out = launch.forward(x, weight, bias, lengths, state, per_channel=per_channel, decay=decay, eps=eps,
                             eps_outside=eps_outside, return_state=return_state, save=save, tiles=tiles)
        _setup(ctx, inputs, out)
        ctx.set_materialize_grads(False)  # no zero-filled gradients of the state and prefixes to launch
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy, gsout, _gpre):
        return _grads(launch.backward, ctx, gy, gsout)


class _PreparedNorm(torch.autograd.Function):
    """_EagerNorm for a prepared call: no lengths, no state, the forward and backward prepared."""

    @staticmethod
    def forward(ctx, x, weight, bias, prep):
        y, _, pre = prep.forward(True, weight is not None, bias is not None)(x, weight, bias, None, None)
        ctx.save_for_backward(x, weight, pre)
        ctx.prep = prep
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy):
        x, weight, pre = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx, gw, gb, _ = ctx.prep.backward(need[1] or need[2], weight is not None)(gy, None, x, weight, None, None,
                                                                                   pre)
        return gx, gw if need[1] else None, gb if need[2] else None, None


class Prepared:
    """``forward`` for one input signature without lengths or states (a model's call): the launch choices and
    both passes prepared once. Stale (rebuilt) where launch choices may have changed: tile_size, a launch
    module name set, deterministic algorithms switched."""

    def __init__(self, x, per_channel, decay, eps, eps_mode):
        self.x_meta = x.shape, x.stride(), x.dtype, x.device
        self.opts = per_channel, decay, float(eps), eps_mode == "outside"
        self._prepare(x)

    def _prepare(self, x):
        self.epoch, self.det = launch.EPOCH[0], torch.are_deterministic_algorithms_enabled()
        self.tiles = tuple(launch.tiles_for(x, self.opts[0], self.opts[1]))
        self.calls = {}

    def forward(self, save, has_w, has_b):
        key = ("f", save, has_w, has_b)
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = launch._Forward(*self.x_meta, *self.opts, has_w, has_b, False, False, False,
                                                     save, self.tiles)
        return call

    def backward(self, need_w, has_w):
        key = ("b", need_w, has_w)
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = launch._Backward(*self.x_meta, *self.opts, has_w, False, False, False, need_w,
                                                      self.tiles)
        return call

    def __call__(self, x, weight, bias):
        if launch.EPOCH[0] != self.epoch or torch.are_deterministic_algorithms_enabled() != self.det:
            self._prepare(x)
        weight = weight if weight is None or weight.is_contiguous() else weight.contiguous()
        bias = bias if bias is None or bias.is_contiguous() else bias.contiguous()
        if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)
                                        or (bias is not None and bias.requires_grad)):
            return _PreparedNorm.apply(x, weight, bias, self)
        return self.forward(False, weight is not None, bias is not None)(x, weight, bias, None, None)[0]


def prepare(x, *, per_channel, decay, eps, eps_mode):
    """The backend contract's prepared call (normlib.backends)."""
    launch.check_input(x)
    return Prepared(x, per_channel, decay, eps, eps_mode)


def forward(x, weight, bias, lengths, state, *, per_channel, decay, eps, eps_mode, return_state):
    """The backend contract (normlib.backends)."""
    launch.check_input(x)
    B, C = x.shape[:2]
    nsc = C if per_channel else 1
    # the state's weight is a count, which nothing differentiable moves: no gradient (None, as on the PyTorch backend)
    sin = None if state is None else torch.stack([state.w.detach(), state.m, state.m2]).reshape(3, B, nsc)
    save = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias, sin))
    args = (x, weight, bias, lengths, sin, per_channel, decay, float(eps), eps_mode == "outside", return_state,
            save, launch.tiles_for(x, per_channel, decay))
    if torch.compiler.is_compiling():
        y, sout, _ = running_norm_fwd(*args)
    elif save:
        y, sout, _ = _EagerNorm.apply(*args)
    else:
        y, sout, _ = launch.forward(*args[:5], per_channel=per_channel, decay=decay, eps=args[7],
                                    eps_outside=args[8], return_state=return_state, save=False, tiles=args[11])
    if not return_state:
        return y, None
    s = sout if per_channel else sout[..., 0]
    return y, NormState(s[0], s[1], s[2])
