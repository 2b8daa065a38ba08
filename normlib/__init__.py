"""normlib: causal normalization layers for (batch, channels, time) sequence models."""
from . import functional, models, reference
from .modules import (ChannelCumulativeLayerNorm, ChannelEMALayerNorm, CumulativeLayerNorm, EMALayerNorm,
                      FrameLayerNorm, GlobalLayerNorm, InstanceLayerNorm, NormLayer, layer_class)
from .parallel import SequenceParallel, sequence_parallel
from .registry import aliases, available, create, get, register
from .replace import Left, ReplaceReport, Swapped, replace_norms
from .spec import FAMILY, NormSpec, Pool, TimeMode
from .state import NormState, merge
from .stream import Stream, stream

__version__ = "0.1.0"
__all__ = [
    "get", "create", "register", "available", "aliases", "functional", "models", "reference", "NormState", "merge",
    "NormSpec", "Pool", "TimeMode", "FAMILY", "NormLayer", "layer_class", "CumulativeLayerNorm",
    "ChannelCumulativeLayerNorm", "GlobalLayerNorm", "EMALayerNorm", "FrameLayerNorm", "InstanceLayerNorm",
    "ChannelEMALayerNorm", "replace_norms", "ReplaceReport", "Swapped", "Left", "stream", "Stream",
    "sequence_parallel", "SequenceParallel",
]
