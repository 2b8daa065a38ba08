"""The running-statistics state s = (w, m, M2) and its merge (DESIGN.md section 1)."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class NormState(NamedTuple):
    """Running statistics of a causal norm: total weight ``w``, weighted mean ``m`` and weighted sum of
    squared deviations ``m2`` (so the variance is ``m2 / w``).

    Each field has shape (B,) for norms that pool all channels and (B, C) for per-channel norms, in
    float64 whatever the input dtype: a float32 mean would cost a chunked stream digits under a DC offset. A state can be saved with ``torch.save``, moved with ``.to()``,
    detached, and differentiated through (for truncated back-propagation through time).

    A state that a norm returns knows that norm: ``state.norm`` is its name and ``state.decay`` its decay (EMA
    norms only, else None), and any other norm refuses it. Its class is NormState's subclass of that tag
    (:func:`state_type`), so the tag survives ``torch.save``, pytree flattening and ``torch.compile``. A state
    built by hand, ``NormState(w, m, m2)``, has no tag (``norm`` None) and any norm whose shapes fit takes it.
    """

    w: Tensor
    m: Tensor
    m2: Tensor

    norm = None  # the tag: the name of the norm that made this state (None: untagged)
    decay = None  # and its decay, for EMA norms (a state of decay 0.9 is not one of 0.99)

    @classmethod
    def empty(cls, shape, dtype=torch.float64, device=None) -> NormState:
        """The state before any frame: weight 0."""
        z = torch.zeros(shape, dtype=dtype, device=device)
        return cls(z, z.clone(), z.clone())

    @property
    def var(self) -> Tensor:
        return self.m2 / torch.where(self.w > 0, self.w, 1)

    @property
    def shape(self) -> torch.Size:
        return self.w.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.w.dtype

    @property
    def device(self) -> torch.device:
        return self.w.device

    # each returns a state of this one's class: its tag stays
    def to(self, *args, **kwargs) -> NormState:
        return type(self)._make(t.to(*args, **kwargs) for t in self)

    def detach(self) -> NormState:
        return type(self)._make(t.detach() for t in self)

    def map(self, fn) -> NormState:
        """Apply ``fn`` to each field (indexing, unsqueezing, ...)."""
        return type(self)._make(fn(t) for t in self)

    def tagged(self, norm: str | None, decay: float | None = None) -> NormState:
        """The same tensors, tagged as a state of ``norm`` (and ``decay``); ``tagged(None)`` removes the tag."""
        return state_type(norm, decay)._make(self)

    def untagged(self) -> NormState:
        """The same tensors without a tag, which any norm of fitting shapes takes (a deliberate reuse)."""
        return NormState._make(self)


def describe(norm: str | None, decay: float | None = None) -> str:
    """A tag as messages name it: 'cln', 'emaln' (decay=0.9), or an untagged state."""
    if norm is None:
        return "an untagged state"
    return repr(norm) + ("" if decay is None else f" (decay={decay})")


_TYPES: dict = {(None, None): NormState}  # tag -> the tagged class


def state_type(norm: str | None, decay: float | None = None) -> type[NormState]:
    """The class of the states of ``norm`` (of ``decay``, for EMA norms): NormState with its tag. One class per
    tag, so that whatever keeps a tuple's class keeps the tag: pytree (the class is a namedtuple's context),
    dynamo's guards, and the functional fast path's cache key."""
    cls = _TYPES.get((norm, decay))
    if cls is None:
        if not isinstance(norm, str) or not (decay is None or isinstance(decay, float)):
            raise TypeError(f"a state's tag is a norm's name and a float decay or None, got {norm!r}, {decay!r}")
        cls = _TYPES[norm, decay] = type("NormState", (NormState,), {
            "__slots__": (), "__module__": __name__, "__qualname__": f"NormState[{describe(norm, decay)}]",
            "norm": norm, "decay": decay, "__reduce__": _reduce, "__repr__": _repr})
    return cls


def _reduce(self):
    # pickled as a call of a safe global (torch.load's weights_only accepts it), not by the class's name
    return _restore, (self.w, self.m, self.m2, self.norm, self.decay)


def _restore(w, m, m2, norm, decay):
    return state_type(norm, decay)(w, m, m2)


def _repr(self):
    return f"NormState(w={self.w!r}, m={self.m!r}, m2={self.m2!r}, norm={self.norm!r}, decay={self.decay!r})"


def merge(old: NormState, new: NormState, decay) -> NormState:
    """Chan's pairwise merge of an older summary with a newer one, the older decayed by ``decay``.

    ``new`` may be one frame (decay d) or a segment of L frames (decay d**L): the merge is associative,
    so any grouping of a span gives the same state. ``decay`` is a float or a tensor that broadcasts.
    The result has the tag of the tagged one; states of two different norms do not merge (ValueError).
    """
    cls = type(old) if old.norm is not None else type(new)
    if old.norm is not None and new.norm is not None and (old.norm, old.decay) != (new.norm, new.decay):
        raise ValueError(f"merge: old is a state of {describe(old.norm, old.decay)}, new one of "
                         f"{describe(new.norm, new.decay)}: states of different norms do not merge")
    w_old = decay * old.w
    w = w_old + new.w
    delta = new.m - old.m
    # an empty merge (w = 0) keeps the old mean; so does one whose weight decayed below the smallest normal
    # float (padding at the end of a long EMA), where 1 / w would be inf and 0 * inf a NaN that the
    # forward masks but autograd's backward carries into every frame of the sequence
    inv = 1 / torch.where(w >= torch.finfo(w.dtype).tiny, w, 1)
    frac = new.w * inv
    # from the heavier side, so that merging with an empty summary leaves the mean exact
    m = torch.where(w_old >= new.w, old.m + delta * frac, new.m - delta * (w_old * inv))
    m2 = decay * old.m2 + new.m2 + delta * delta * w_old * frac
    return cls(w, m, m2)


torch.serialization.add_safe_globals([NormState, _restore])
