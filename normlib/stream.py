"""``normlib.stream(model)``: every normlib layer of a model keeps its own state from one call to the next.

The stream gives each layer a slot (``NormLayer._stream``), which the layer's forward reads: a call without
``state=`` or ``return_state=`` then takes the slot's state and leaves the returned one there. The layer's
call signature does not change, so a model's forward needs no edit, eager or compiled.
"""
from __future__ import annotations

import types

import torch
from torch import nn

from .checks import check_state_tag
from .modules import NormLayer, NotCopied
from .state import NormState


def _module(model: nn.Module) -> nn.Module:
    """The module itself of torch.compile(model) (its ._orig_mod): its layers keep their own names, and its
    hooks run on each call."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else model


def _label(key: str) -> str:
    """A layer's name in messages: the model itself has the empty name (as in nn.Module.named_modules)."""
    return repr(key) if key else "'' (the model itself)"


class _Slot(NotCopied):
    """A layer's place in a stream: its states, one per use in a call of the streamed model (a layer that a
    model calls twice sees two sequences of activations, so it keeps two states), and the uses so far."""

    def __init__(self, stream: Stream, name: str):
        self.stream, self.name = stream, name
        self.states: list = [None]
        self.uses = 0

    def __call__(self, run, x, lengths):
        stream = self.stream
        i = self.uses if stream._in_call else 0  # a layer called on its own: its first state
        self.uses = i + 1
        if i == len(self.states):
            self.states.append(None)
        if lengths is None:
            lengths = stream._lengths
        if torch.compiler.is_compiling():  # the checks ran as the graph was traced; no try block in it
            y, self.states[i] = run(x, lengths, self.states[i], True)
            return y
        try:
            y, self.states[i] = run(x, lengths, self.states[i], True)
        except (ValueError, TypeError) as e:  # a wrong batch size, a state set by hand: name the layer
            if type(e) not in (ValueError, TypeError):  # a subclass may take other arguments
                raise
            raise type(e)(f"normlib.stream, layer {_label(self.key(i))}: {e}") from e
        return y

    def key(self, i: int) -> str:
        return self.name if i == 0 else f"{self.name}#{i}"



class Stream:
    """The context that :func:`stream` returns; see there."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self._lengths = None
        self._in_call = False
        self._hooks = ()
        self._layers: dict[str, NormLayer] = {}
        for name, layer in _module(model).named_modules():
            if not isinstance(layer, NormLayer):
                continue
            if not layer.spec.causal:
                raise ValueError(
                    f"normlib.stream: layer {_label(name)} is {layer.spec.name!r}, which is not causal "
                    f"({layer.spec.time.value} statistics need the whole sequence): it cannot run chunk by chunk. "
                    f"Stream a model whose norms are causal (cln, ccln, emaln, ccemaln, frameln)")
            self._layers[name] = layer
        self._slots = {name: _Slot(self, name) for name in self._layers}

    # ----------------------------------------------------------------------------------------------
    def __enter__(self) -> Stream:
        busy = [name for name, layer in self._layers.items() if layer._stream is not None]
        if busy:
            raise RuntimeError(f"normlib.stream: layer {_label(busy[0])} is in another stream already (one stream "
                               f"per layer at a time)")
        for name, layer in self._layers.items():
            layer._stream = self._slots[name]
        root = _module(self.model)
        self._hooks = (root.register_forward_pre_hook(self._begin),
                       root.register_forward_hook(self._end, always_call=True))
        return self

    def __exit__(self, *exc):
        for layer in self._layers.values():
            vars(layer).pop("_stream", None)  # the layer as it was: no reference to the stream left
        for h in self._hooks:
            h.remove()
        self._hooks, self._in_call = (), False
        return False

    # a copy of the model made inside the stream copies its hooks, bound to this stream: theirs is a stream of
    # no layer, which does nothing
    def __deepcopy__(self, memo):
        return _inert()

    def __reduce__(self):
        return _inert, ()

    def _begin(self, module, args):  # a call of the model: each layer's uses count from 0
        self._in_call = True
        for slot in self._slots.values():
            slot.uses = 0

    def _end(self, module, args, out):
        self._in_call = False

    # ----------------------------------------------------------------------------------------------
    @property
    def lengths(self):
        """The valid frames of each sequence in the next calls' chunks: a (B,) integer tensor, or None (every
        frame valid). It stays until set again. A sequence that has ended gets 0: its state passes through.
        Every layer of the stream takes it, unless the model passes a layer ``lengths`` itself."""
        return self._lengths

    @lengths.setter
    def lengths(self, lengths):
        if lengths is not None:
            if not isinstance(lengths, torch.Tensor):
                try:
                    lengths = torch.as_tensor(lengths, device=self._device())
                except (TypeError, ValueError, RuntimeError, OverflowError):
                    raise TypeError(f"lengths must be a (B,) integer tensor, a sequence of integers or None, got "
                                    f"{lengths!r}") from None
            if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype.is_complex \
                    or lengths.dtype == torch.bool:
                raise ValueError(f"lengths must be a (B,) integer tensor (one length per sequence), got "
                                 f"{lengths.dtype} of shape {tuple(lengths.shape)}")
        self._lengths = lengths

    def _device(self):
        t = next(iter(self.model.parameters()), None)
        return t.device if t is not None else None

    @property
    def states(self):
        """Each layer's state (None before its first call, or after reset), by the layer's name in the model;
        a layer that the model calls k > 1 times has k entries: ``name``, ``name#1``, ... Read-only: set them
        with :meth:`load_state_dict`."""
        return types.MappingProxyType({slot.key(i): s for slot in self._slots.values()
                                       for i, s in enumerate(slot.states)})

    def state_dict(self) -> dict:
        """The states to save (``torch.save`` keeps their tags; ``torch.load`` reads them back with
        ``weights_only=True``): those of :attr:`states` that are not None."""
        return {k: s for k, s in self.states.items() if s is not None}

    def load_state_dict(self, states) -> None:
        """Restore a stream to what :meth:`state_dict` returned: each layer takes its state from ``states``,
        and a layer missing from it starts afresh (None). Each state must be a NormState of the layer's norm
        (or untagged); its shapes are checked at the layer's next call."""
        if not hasattr(states, "items"):
            raise TypeError(f"states must be a mapping of layer names to NormState, got {type(states).__name__}")
        new = {name: [None] for name in self._slots}
        for key, state in states.items():
            name, _, i = str(key).partition("#")
            if name not in self._slots or (i and not (i.isdigit() and int(i) > 0)):
                raise KeyError(f"states has {key!r}, which is no normlib layer of this stream's model; its layers: "
                               f"{list(self._slots)}")
            if state is not None:
                if not isinstance(state, NormState):
                    raise TypeError(f"states[{key!r}] must be a normlib.NormState or None, got "
                                    f"{type(state).__name__}")
                layer = self._layers[name]
                check_state_tag(layer.spec, layer.decay, state, f"states[{key!r}]")
            i = int(i or 0)
            new[name] += [None] * (i + 1 - len(new[name]))
            new[name][i] = state
        for name, slot in self._slots.items():
            slot.states = new[name]

    # ----------------------------------------------------------------------------------------------
    def reset(self, mask=None) -> None:
        """Start new sequences: every state is dropped; or, with ``mask`` a (B,) bool tensor, only those of the
        sequences where it is True (their statistics become empty, the others' stay)."""
        if mask is None:
            for slot in self._slots.values():
                slot.states = [None] * len(slot.states)
            return
        if not isinstance(mask, torch.Tensor):
            mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool or mask.dim() != 1:
            raise ValueError(f"mask must be a (B,) bool tensor (True: reset that sequence), got {mask.dtype} of "
                             f"shape {tuple(mask.shape)}")
        for slot in self._slots.values():
            for i, s in enumerate(slot.states):
                if s is None:
                    continue
                if s.shape[0] != mask.shape[0]:
                    raise ValueError(f"mask has {mask.shape[0]} items but layer {_label(slot.key(i))} streams "
                                     f"{s.shape[0]} sequences")
                keep = mask.to(s.device).view((-1,) + (1,) * (len(s.shape) - 1))
                slot.states[i] = s.map(lambda t: torch.where(keep, 0, t))  # weight 0: the empty state

    def detach(self) -> None:
        """Cut the states' graphs, keep their values: the next chunk's backward stops here (truncated
        back-propagation through time)."""
        for slot in self._slots.values():
            slot.states = [None if s is None else s.detach() for s in slot.states]


def _inert() -> Stream:
    s = Stream(nn.Module())
    s.model = None
    return s


def stream(model: nn.Module) -> Stream:
    """Run ``model`` chunk by chunk: inside ``with normlib.stream(model) as s:`` each normlib layer of ``model``
    keeps its state between calls, so that the chunks' outputs are, chunk for chunk, those of the whole
    sequence (the norms' part of streaming: a model's causal convolutions keep their own buffers).

    Outside the context the layers behave as always. A layer called with ``state=`` or ``return_state=True``
    inside it is the caller's to thread, and the stream leaves it alone.

    Args:
        model: an ``nn.Module`` (or ``torch.compile(model)``'s module) whose normlib layers are all causal;
            a ``gln`` or ``instln`` layer is refused, by name (ValueError).

    The stream ``s``:
        - ``s.reset()`` starts new sequences; ``s.reset(mask)`` only those where the (B,) bool mask is True.
        - ``s.detach()`` keeps the states and cuts their graphs (truncated back-propagation through time).
        - ``s.lengths = lengths`` ((B,) ints, or None): each sequence's valid frames in the next chunks.
        - ``s.states`` reads the states by layer name; ``s.state_dict()`` and ``s.load_state_dict()`` save and
          restore them.

    Examples::

        >>> with normlib.stream(model) as s:
        ...     for chunk in x.split(160, dim=-1):
        ...         y = model(chunk)
    """
    return Stream(model)
