"""Backends obey one contract and are chosen in one place.

``forward(x, weight, bias, lengths, state, *, per_channel, decay, eps, eps_mode, return_state)``
takes ``x`` as a (B, C, T) view in any strides (a "b t c" input arrives permuted, not copied), ``decay``
0 (FRAME), 1 (CUMULATIVE), alpha (EMA) or None (GLOBAL), and returns ``(y, state_out or None)`` with
``y`` of x's shape and dtype.

``prepare(x, *, per_channel, decay, eps, eps_mode)`` returns ``call(x, weight, bias) -> y``: forward without
lengths or states for inputs of x's shape, strides, dtype and device, with whatever can be decided once decided
(a model calls each layer with one signature, step after step).

``prepare_stream(x, *, per_channel, decay, eps, eps_mode)`` returns ``call(x, weight, bias, state) -> (y, state)``:
forward with a state in and out, without lengths, for inputs of x's signature (a streaming model's call, hop after
hop); a backend without one gets forward with the options bound.
"""
from __future__ import annotations

import os

import torch

from . import pytorch

def _stream_of(forward):
    """prepare_stream of a backend that has none: its forward with the options bound."""
    def prepare_stream(x, **opts):
        return lambda x, weight, bias, state: forward(x, weight, bias, None, state, return_state=True, **opts)
    return prepare_stream


BACKENDS = {"torch": pytorch.forward}
PREPARE = {"torch": pytorch.prepare}
STREAM = {"torch": pytorch.prepare_stream}
try:  # triton is optional: absent on macOS and Windows
    from . import triton as _triton_backend

    BACKENDS["triton"] = _triton_backend.forward
    PREPARE["triton"] = _triton_backend.prepare
    STREAM["triton"] = _stream_of(_triton_backend.forward)
except ImportError:  # pragma: no cover
    pass
NAMES = ("auto", "torch", "triton")


def triton_usable(x: torch.Tensor) -> bool:
    """Triton runs CUDA tensors, or CPU tensors under TRITON_INTERPRET=1."""
    if "triton" not in BACKENDS:
        return False
    return x.is_cuda or (x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def resolve(backend: str, x: torch.Tensor, table=BACKENDS):
    """The one dispatch point: the backend's forward (or, with ``table=PREPARE``, prepare) for this input."""
    if backend == "auto":
        # Under torch.compile too: Inductor launches the Triton ops' kernels from its own code (triton_op). Tracing
        # the pooled norms' PyTorch path instead, which Inductor fuses, gave the same training step and a slower
        # inference on the H100 (benchmarks/RESULTS.md, the compiled model)
        use = x.is_cuda and x.dtype != torch.float64 and triton_usable(x)
        return table["triton" if use else "torch"]
    if backend == "triton" and not triton_usable(x):
        raise ValueError(
            f"backend='triton' needs a CUDA tensor (or TRITON_INTERPRET=1 for CPU tensors) and the triton "
            f"package; got a tensor on {x.device}"
        )
    return table[backend]
