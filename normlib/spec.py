"""The family: every norm is a point of (channels pooled) x (time mode) x (decay); and the two layouts."""
from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass


class Pool(str, enum.Enum):
    ALL = "all"  # statistics over all C channels of a frame
    CHANNEL = "channel"  # statistics of each channel alone


LAYOUTS = ("b c t", "b t c")  # (batch, channels, time) as Conv-TasNet; (batch, time, channels) channels last


def normalize_layout(layout: str) -> str:
    """ "b c t", "bct" and "B, C, T" are one layout."""
    key = " ".join(str(layout).replace(",", " ").split()).lower()
    key = {"bct": "b c t", "btc": "b t c"}.get(key.replace(" ", ""), key)
    if key not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return key


class TimeMode(str, enum.Enum):
    FRAME = "frame"  # s_t = f_t
    CUMULATIVE = "cumulative"  # s_t = merge_1(s_{t-1}, f_t)
    EMA = "ema"  # s_t = merge_a(s_{t-1}, f_t)
    GLOBAL = "global"  # one state over all valid frames


def _real(v) -> bool:
    """A real number, bools aside: Python's, or numpy's scalars (np.float32(1e-5) from a config)."""
    return not isinstance(v, bool) and (isinstance(v, (int, float)) or isinstance(v, numbers.Real))


def _check_decay(spec, decay, what="decay") -> float:
    """A decay in [0, 1] as a float (not 0 for a per-channel norm); ``what`` names it in the message."""
    if not _real(decay) or not 0.0 <= decay <= 1.0:
        raise ValueError(f"{what} must be a number in [0, 1], got {decay!r}")
    decay = float(decay)
    if decay == 0 and spec.per_channel:
        raise ValueError(f"{what}=0 makes {spec.name!r} a per-channel single-frame norm (variance 0): refused")
    return decay


@dataclass(frozen=True)
class NormSpec:
    """One norm of the family.

    ``decay`` is the default EMA decay; FRAME and CUMULATIVE have a fixed decay (0 and 1), GLOBAL none.
    """

    name: str
    pool: Pool
    time: TimeMode
    class_name: str
    description: str
    decay: float | None = None

    def __post_init__(self):
        # the enums' values ("channel", "ema") are accepted too: compared by identity below, a plain string
        # would silently read as the other member
        for field, kind in (("pool", Pool), ("time", TimeMode)):
            value = getattr(self, field)
            try:
                object.__setattr__(self, field, kind(value))
            except ValueError:
                raise ValueError(f"norm {self.name!r}: {field} must be one of "
                                 f"{[m.value for m in kind]}, got {value!r}") from None
        if not isinstance(self.name, str) or not any(ch.isalnum() for ch in self.name):
            raise ValueError(f"NormSpec name must be a string with a letter or digit, got {self.name!r}")
        if not isinstance(self.class_name, str) or not self.class_name.isidentifier():
            raise ValueError(f"norm {self.name!r}: class_name must be a Python identifier (the layer class's "
                             f"name), got {self.class_name!r}")
        if not isinstance(self.description, str):
            raise TypeError(f"norm {self.name!r}: description must be a string, got {type(self.description).__name__}")
        if self.pool is Pool.CHANNEL and self.time is TimeMode.FRAME:
            raise ValueError(
                f"norm {self.name!r}: per-channel statistics of a single frame have zero variance; "
                "pool='channel' with time='frame' is degenerate and refused"
            )
        if (self.time is TimeMode.EMA) != (self.decay is not None):
            raise ValueError(f"norm {self.name!r}: a default decay is given exactly for time mode 'ema'")
        if self.decay is not None:
            _check_decay(self, self.decay, f"norm {self.name!r}: default decay")

    @property
    def causal(self) -> bool:
        return self.time is not TimeMode.GLOBAL

    @property
    def per_channel(self) -> bool:
        return self.pool is Pool.CHANNEL

    def resolve_decay(self, decay: float | None) -> float | None:
        """The decay the kernels use: 0 for FRAME, 1 for CUMULATIVE, alpha for EMA, None for GLOBAL."""
        if self.time is TimeMode.EMA:
            return self.decay if decay is None else decay
        if decay is not None:
            raise ValueError(f"decay is only accepted by EMA norms, not by {self.name!r} ({self.time.value})")
        return {TimeMode.FRAME: 0.0, TimeMode.CUMULATIVE: 1.0, TimeMode.GLOBAL: None}[self.time]


FAMILY = (
    NormSpec("cln", Pool.ALL, TimeMode.CUMULATIVE, "CumulativeLayerNorm",
             "cumulative layer norm: all channels, frames 0..t (Conv-TasNet cLN)"),
    NormSpec("ccln", Pool.CHANNEL, TimeMode.CUMULATIVE, "ChannelCumulativeLayerNorm",
             "channel-wise cumulative layer norm: each channel alone, frames 0..t"),
    NormSpec("gln", Pool.ALL, TimeMode.GLOBAL, "GlobalLayerNorm",
             "global layer norm: all channels, all frames (Conv-TasNet gLN, GroupNorm(1, C))"),
    NormSpec("emaln", Pool.ALL, TimeMode.EMA, "EMALayerNorm",
             "exponential-moving-average layer norm: all channels, frame tau weighs decay^(t-tau)", decay=0.99),
    NormSpec("frameln", Pool.ALL, TimeMode.FRAME, "FrameLayerNorm",
             "per-frame layer norm over channels (LayerNorm(C) on 'b t c')"),
    NormSpec("instln", Pool.CHANNEL, TimeMode.GLOBAL, "InstanceLayerNorm",
             "instance norm: each channel alone, all frames (InstanceNorm1d(C, affine=True))"),
    NormSpec("ccemaln", Pool.CHANNEL, TimeMode.EMA, "ChannelEMALayerNorm",
             "channel-wise EMA layer norm: each channel alone, frame tau weighs decay^(t-tau)", decay=0.99),
)
