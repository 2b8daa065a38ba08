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
    """

    w: Tensor
    m: Tensor
    m2: Tensor

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

    def to(self, *args, **kwargs) -> NormState:
        return NormState(*(t.to(*args, **kwargs) for t in self))

    def detach(self) -> NormState:
        return NormState(*(t.detach() for t in self))

    def map(self, fn) -> NormState:
        """Apply ``fn`` to each field (indexing, unsqueezing, ...)."""
        return NormState(*(fn(t) for t in self))


def merge(old: NormState, new: NormState, decay) -> NormState:
    """Chan's pairwise merge of an older summary with a newer one, the older decayed by ``decay``.

    ``new`` may be one frame (decay d) or a segment of L frames (decay d**L): the merge is associative,
    so any grouping of a span gives the same state. ``decay`` is a float or a tensor that broadcasts.
    """
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
    return NormState(w, m, m2)


torch.serialization.add_safe_globals([NormState])
