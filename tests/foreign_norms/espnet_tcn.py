"""espnet/espnet, espnet2/enh/layers/tcn.py: gamma and beta of shape (1, N, 1), a ``shape`` of "BDT" or "BTD"
(a "BTD" input is transposed to "BDT" and back), and the file's EPS = float32's machine epsilon."""
import torch
from torch import nn

EPS = torch.finfo(torch.float32).eps


class _Affine(nn.Module):
    def __init__(self, channel_size, shape="BDT"):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(1, channel_size, 1))
        self.beta = nn.Parameter(torch.zeros(1, channel_size, 1))
        self.shape = shape

    def forward(self, y):
        y = y.transpose(1, 2) if self.shape == "BTD" else y
        mu, var = self.stats(y)
        out = self.gamma * (y - mu) / (var + EPS).sqrt() + self.beta
        return out.transpose(1, 2) if self.shape == "BTD" else out


class GlobalLayerNorm(_Affine):
    def stats(self, y):
        mu = y.mean(dim=(1, 2), keepdim=True)
        return mu, (y - mu).pow(2).mean(dim=(1, 2), keepdim=True)


class ChannelwiseLayerNorm(_Affine):
    def stats(self, y):
        return y.mean(dim=1, keepdim=True), y.var(dim=1, keepdim=True, unbiased=False)
