"""Example models built the way normlib is meant to be used: a builder takes a norm's name and calls
``normlib.get(name)`` for every norm layer. They serve the model benchmark (``benchmarks/models.py``) and
show how a separator is put together; they are not trained recipes.

- :func:`conv_tasnet`: a causal Conv-TasNet separator (Luo & Mesgarani 2019) with asteroid's defaults, 49
  norm layers on (B, 512, T) activations in the ``"b c t"`` layout.
- :func:`channels_last_tcn`: a causal stack of depthwise-convolution + MLP blocks on ``"b t c"``
  activations, whose norms run channels last.

``norm`` is a registered name or alias ("cln", "gln", "emaln", ...), or one of the baselines the benchmark
compares against: ``"none"`` (identity), ``"native"`` (PyTorch's own norm: ``nn.GroupNorm(1, C)``, a gLN,
on ``"b c t"``; ``nn.LayerNorm(C)``, a per-frame norm, on ``"b t c"``) and ``"formula"`` (the ten-line
sum/sumsq cumulative layer norm that Conv-TasNet implementations write). Keyword arguments in
``norm_kwargs`` go to every normlib layer (``backend="torch"``, ``decay=0.9``, ``eps=1e-5``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import get

BASELINES = ("none", "native", "formula")


def cumulative_ln_formula(x, weight=None, bias=None, eps=1e-8, *, per_channel=False, channels_last=False):
    """The cumulative layer norm as most Conv-TasNet code writes it: running sums of x and x² over time,
    the variance as E[x²] − μ² in the input's precision (it loses digits under a DC offset: the benchmarks'
    baseline, not a normlib norm). ``per_channel``: each channel alone."""
    c_dim, t_dim = (2, 1) if channels_last else (1, 2)
    C, T = (1 if per_channel else x.shape[c_dim]), x.shape[t_dim]
    s1, s2 = (x, x.square()) if per_channel else (x.sum(c_dim, keepdim=True), x.square().sum(c_dim, keepdim=True))
    count = torch.arange(1, T + 1, device=x.device, dtype=x.dtype) * C
    count = count.view(1, T, 1) if channels_last else count.view(1, 1, T)
    mean = s1.cumsum(t_dim) / count
    var = s2.cumsum(t_dim) / count - mean.square()
    y = (x - mean) / (var + eps).sqrt()
    if weight is not None:
        y = y * (weight if channels_last else weight[:, None])
    if bias is not None:
        y = y + (bias if channels_last else bias[:, None])
    return y


class CumulativeLayerNormFormula(nn.Module):
    """:func:`cumulative_ln_formula` as a layer, with a learned weight and bias."""

    def __init__(self, num_channels: int, eps: float = 1e-8, layout: str = "b c t", per_channel: bool = False):
        super().__init__()
        self.eps, self.channels_last, self.per_channel = eps, layout == "b t c", per_channel
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x):
        return cumulative_ln_formula(x, self.weight, self.bias, self.eps, per_channel=self.per_channel,
                                     channels_last=self.channels_last)


def norm_layer(norm: str, num_channels: int, layout: str = "b c t", **norm_kwargs) -> nn.Module:
    """One norm layer of a model: a normlib norm by name (through ``normlib.get``) or a baseline."""
    if norm == "none":
        return nn.Identity()
    if norm == "native":
        return nn.GroupNorm(1, num_channels) if layout == "b c t" else nn.LayerNorm(num_channels)
    if norm == "formula":
        return CumulativeLayerNormFormula(num_channels, layout=layout)
    return get(norm)(num_channels, layout=layout, **norm_kwargs)


class _CausalConv(nn.Conv1d):
    """A Conv1d padded on the left only: frame t sees frames t - (k - 1) * dilation .. t."""

    def forward(self, x):
        return super().forward(F.pad(x, ((self.kernel_size[0] - 1) * self.dilation[0], 0)))


class _TCNBlock(nn.Module):
    """Conv-TasNet's 1-D convolutional block: 1x1 conv, PReLU, norm, depthwise dilated conv, PReLU, norm;
    a residual and a skip-connection output."""

    def __init__(self, bn_chan, hid_chan, skip_chan, kernel_size, dilation, norm, norm_kwargs):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(bn_chan, hid_chan, 1), nn.PReLU(), norm_layer(norm, hid_chan, **norm_kwargs),
            _CausalConv(hid_chan, hid_chan, kernel_size, dilation=dilation, groups=hid_chan),
            nn.PReLU(), norm_layer(norm, hid_chan, **norm_kwargs))
        self.res = nn.Conv1d(hid_chan, bn_chan, 1)
        self.skip = nn.Conv1d(hid_chan, skip_chan, 1)

    def forward(self, x):
        h = self.body(x)
        return self.res(h), self.skip(h)


class ConvTasNet(nn.Module):
    """A causal Conv-TasNet: a learned encoder, a TCN separator that predicts one mask per source, a learned
    decoder. Input (B, samples) or (B, 1, samples); output (B, n_src, samples')."""

    def __init__(self, norm="cln", *, n_src=2, n_filters=512, kernel_size=16, stride=8, n_blocks=8,
                 n_repeats=3, bn_chan=128, hid_chan=512, skip_chan=128, conv_kernel_size=3, **norm_kwargs):
        super().__init__()
        self.n_src, self.n_filters = n_src, n_filters
        self.encoder = nn.Conv1d(1, n_filters, kernel_size, stride=stride, bias=False)
        self.in_norm = norm_layer(norm, n_filters, **norm_kwargs)
        self.bottleneck = nn.Conv1d(n_filters, bn_chan, 1)
        self.blocks = nn.ModuleList(
            _TCNBlock(bn_chan, hid_chan, skip_chan, conv_kernel_size, 2**b, norm, norm_kwargs)
            for _ in range(n_repeats) for b in range(n_blocks))
        self.mask = nn.Sequential(nn.PReLU(), nn.Conv1d(skip_chan, n_src * n_filters, 1))
        self.decoder = nn.ConvTranspose1d(n_filters, 1, kernel_size, stride=stride, bias=False)

    def forward(self, wav):
        wav = wav if wav.dim() == 3 else wav[:, None]
        w = F.relu(self.encoder(wav))  # (B, n_filters, frames)
        x = self.bottleneck(self.in_norm(w))
        skips = 0
        for block in self.blocks:
            res, skip = block(x)
            x, skips = x + res, skips + skip
        masks = torch.sigmoid(self.mask(skips)).view(w.shape[0], self.n_src, self.n_filters, -1)
        est = (masks * w[:, None]).flatten(0, 1)  # (B * n_src, n_filters, frames)
        return self.decoder(est).view(w.shape[0], self.n_src, -1)


def conv_tasnet(norm="cln", **kwargs) -> ConvTasNet:
    """A causal Conv-TasNet separator whose 49 norms are ``norm`` (asteroid's defaults: 512 filters of 16
    samples, stride 8; 3 repeats of 8 blocks; 128 bottleneck, 512 hidden and 128 skip channels).

    >>> model = normlib.models.conv_tasnet("cln")           # Conv-TasNet's causal configuration
    >>> est = model(torch.randn(4, 32000))                  # (4, 2, 32000): 2 sources, 4 s at 8 kHz
    """
    return ConvTasNet(norm, **kwargs)


class _ChannelsLastBlock(nn.Module):
    """norm, causal depthwise conv, norm, MLP (Linear, GELU, Linear); residual. Activations (B, T, C)."""

    def __init__(self, channels, kernel_size, mlp_ratio, norm, norm_kwargs):
        super().__init__()
        self.norm1 = norm_layer(norm, channels, layout="b t c", **norm_kwargs)
        self.conv = _CausalConv(channels, channels, kernel_size, groups=channels)
        self.norm2 = norm_layer(norm, channels, layout="b t c", **norm_kwargs)
        self.mlp = nn.Sequential(nn.Linear(channels, mlp_ratio * channels), nn.GELU(),
                                 nn.Linear(mlp_ratio * channels, channels))

    def forward(self, x):
        x = x + self.conv(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.mlp(self.norm2(x))


class ChannelsLastTCN(nn.Module):
    """A causal channels-last network: input features (B, T, in_features), output (B, T, out_features)."""

    def __init__(self, norm="cln", *, in_features=80, out_features=80, channels=256, n_blocks=8,
                 kernel_size=7, mlp_ratio=2, **norm_kwargs):
        super().__init__()
        self.proj_in = nn.Linear(in_features, channels)
        self.blocks = nn.Sequential(*(_ChannelsLastBlock(channels, kernel_size, mlp_ratio, norm, norm_kwargs)
                                      for _ in range(n_blocks)))
        self.norm = norm_layer(norm, channels, layout="b t c", **norm_kwargs)
        self.proj_out = nn.Linear(channels, out_features)

    def forward(self, x):
        return self.proj_out(self.norm(self.blocks(self.proj_in(x))))


def channels_last_tcn(norm="cln", **kwargs) -> ChannelsLastTCN:
    """A causal stack of ``n_blocks`` depthwise-conv + MLP blocks whose 2 * n_blocks + 1 norms are ``norm``,
    run channels last (``layout="b t c"``): features (B, T, 80) in, (B, T, 80) out.

    >>> model = normlib.models.channels_last_tcn("emaln", decay=0.99)
    >>> out = model(torch.randn(4, 1000, 80))
    """
    return ChannelsLastTCN(norm, **kwargs)


MODELS = {"conv_tasnet": conv_tasnet, "channels_last_tcn": channels_last_tcn}

# The benchmarks' sizes, per model: (builder kwargs, batch, one input's shape). "full": Conv-TasNet on 4 s of
# 8 kHz audio (3999 frames of 512 channels), the channels-last model on 4000 frames of 80 features; "small":
# the same architectures, narrow and short, for a run on a CPU.
SIZES = {
    "conv_tasnet": {"full": ({}, 4, (32000,)),
                    "small": (dict(n_filters=64, hid_chan=64, bn_chan=32, skip_chan=32, n_blocks=4, n_repeats=1),
                              2, (4000,))},
    "channels_last_tcn": {"full": ({}, 4, (4000, 80)), "small": (dict(channels=64, n_blocks=2), 2, (500, 80))},
}
