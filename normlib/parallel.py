"""``normlib.sequence_parallel(model, group)``: every normlib layer of a model takes its input as this rank's slice
of the time axis (normlib.distributed does the math).

The context sets each layer's ``_parallel`` (modules.NormLayer), which the layer's call reads: it passes the
context's group to ``functional.norm``. The layers' signatures do not change, so a model's forward needs no edit.
"""
from __future__ import annotations

import torch.distributed as dist
from torch import nn

from .checks import check_group
from .modules import NormLayer, NotCopied


def _module(model: nn.Module) -> nn.Module:
    """The module itself of torch.compile(model), whose layers are the ones that run."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else model


class SequenceParallel(NotCopied):  # (a process group does not copy either)
    """The context that :func:`sequence_parallel` returns; see there."""

    def __init__(self, model: nn.Module, group: dist.ProcessGroup | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.group = check_group(dist.group.WORLD if group is None and dist.is_initialized() else group)
        self._layers = {name: layer for name, layer in _module(model).named_modules() if isinstance(layer, NormLayer)}

    def __enter__(self) -> SequenceParallel:
        busy = [name for name, layer in self._layers.items() if layer._parallel is not None]
        if busy:
            raise RuntimeError(f"normlib.sequence_parallel: layer {busy[0]!r} is in another sequence_parallel "
                               f"context already (one at a time per layer)")
        for layer in self._layers.values():
            layer._parallel = self
        return self

    def __exit__(self, *exc):
        for layer in self._layers.values():
            vars(layer).pop("_parallel", None)  # the layer as it was
        return False

    @property
    def layers(self) -> dict:
        """The normlib layers that the context covers, by their names in the model."""
        return dict(self._layers)



def sequence_parallel(model: nn.Module, group: dist.ProcessGroup | None = None) -> SequenceParallel:
    """Run ``model`` on slices of the time axis, one per rank of ``group``: inside
    ``with normlib.sequence_parallel(model, group):`` each normlib layer of ``model`` takes its input as this
    rank's slice (the ranks of ``group`` hold consecutive slices, in rank order, of any lengths) and returns
    what the single-device computation of the whole sequence gives on that slice, forward and backward.

    Each call of a layer exchanges its slice's statistics (a few floats per sequence, or per sequence and channel)
    in one ``all_gather``, and its backward in one ``all_reduce``: on gloo (CPU) and NCCL (GPU), both backends.
    ``lengths`` passed to a layer are those of the whole sequences. A causal layer's ``state`` enters on the
    first rank, and a returned state is the whole sequences' (the same on every rank).

    The layers' weight gradients are each rank's share (the gradient of its slice's outputs), as those of every
    other layer of the model whose weights each rank holds: their sum over the ranks is the single-device
    gradient. Sum them (``dist.all_reduce``), or let ``DistributedDataParallel`` over ``group`` average them with
    the loss multiplied by the group's size.

    Operations that mix frames (a convolution's receptive field) need their own halo exchange; normlib's norms
    need none. Under ``torch.compile`` the collectives are not traced: call the model eagerly.

    Args:
        model: an ``nn.Module`` (or ``torch.compile(model)``'s module).
        group: a ``torch.distributed`` ProcessGroup; None: the default group (``dist.group.WORLD``).

    Examples::

        >>> dist.init_process_group("nccl")
        >>> rank, world = dist.get_rank(), dist.get_world_size()
        >>> x_slice = x.tensor_split(world, dim=-1)[rank]          # this rank's frames
        >>> with normlib.sequence_parallel(model):
        ...     y_slice = model(x_slice)
    """
    return SequenceParallel(model, group)
