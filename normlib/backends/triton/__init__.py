"""The Triton backend: one running-statistics kernel template (kernels.py), its launchers (launch.py),
and two PyTorch ops, ``normlib::running_norm_fwd`` and ``normlib::running_norm_bwd``, with the autograd
formula. They are ``triton_op``s: ``torch.compile`` (``fullgraph=True`` too) traces into them and Inductor
launches the kernels from its own code, as it launches its own (no Python launcher at run time; CUDA graphs
replay them). A traced call is a nested compile region, compiled once for every layer that repeats it.

The forward saves each tile's incoming prefix; the backward kernel recomputes the per-frame statistics
from x and runs the reverse look-back for the suffix sums. States cross the op boundary stacked as one
(3, B, C or 1) float64 tensor.

Eager calls skip the op dispatcher (it costs more than a small kernel): without autograd they call the
launcher directly, with autograd an ``autograd.Function`` that shares the ops' setup and backward. Under
``torch.compile`` the ops are used.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ...state import NormState
from torch.fx.experimental.symbolic_shapes import guard_scalar
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


@torch.compiler.nested_compile_region
def _traced_fwd(*args):
    """The forward op as one nested compile region: Inductor compiles each distinct call (and its backward)
    once and stamps it out in every layer that repeats it, rather than once a layer (Conv-TasNet's 49 layers:
    about 66 s to its first step on the H100 where it took about 300 s)."""
    return running_norm_fwd(*args)


@torch.compiler.assume_constant_result
def _in_a_region() -> bool:
    """Whether the trace puts the op in its nested region, read at trace time from Dynamo's settings. Not under
    ``backend="eager"``, whose backward of a region fails in torch ("fake_mode should be enabled for HOPs"), nor
    under ``dynamic=True``, where eps is a symbolic float, which torch 2.11's region does not take as an operand
    ("invoke_subgraph operands must be a list of tensors/ints/SymInts"; torch 2.13 inlines such a call itself).
    Where Dynamo's internals differ (another torch): the region."""
    try:
        from torch._dynamo import config
        from torch._dynamo.symbolic_convert import InstructionTranslator
        backend = getattr(InstructionTranslator.current_tx().output.compiler_fn, "compiler_name", None)
        return backend != "eager" and config.assume_static_by_default
    except Exception:  # noqa: BLE001
        return True


def _constant(v):
    """A float as a constant of the trace, guarded (a change recompiles): Dynamo makes a float that changed
    between compiles symbolic (automatic dynamic), and the region takes no symbolic float."""
    return v if v is None else guard_scalar(v)


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
        if _in_a_region():  # eps and decay as constants: one that changed between compiles is a symbolic float
            args = (*args[:6], _constant(decay), _constant(args[7]), *args[8:])
            y, sout, _ = _traced_fwd(*args)
            if return_state and not (x.requires_grad or sin is not None and sin.requires_grad):
                # a region's outputs all take its autograd (torch 2.11 ignores the op's mark_non_differentiable):
                # the state out depends on x and the state in only, so here it is a constant, as in eager
                sout = sout.detach()
        else:
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
