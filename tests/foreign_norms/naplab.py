"""naplab/Conv-TasNet, utility/models.py: the cumulative LN of the paper, over channels and frames 0..t,
with running sums of x and x² (the variance as E[x²] − μ²), ``gain`` and ``bias`` of shape (1, C, 1) (plain
tensors of ones and zeros when not trainable) and an ``eps`` inside the sqrt. Its gLN is nn.GroupNorm(1, C,
eps=1e-8)."""
import torch
from torch import nn


class cLN(nn.Module):  # noqa: N801 (the original's name)
    def __init__(self, dimension, eps=1e-8, trainable=True):
        super().__init__()
        self.eps = eps
        if trainable:
            self.gain = nn.Parameter(torch.ones(1, dimension, 1))
            self.bias = nn.Parameter(torch.zeros(1, dimension, 1))
        else:
            self.gain = torch.ones(1, dimension, 1)
            self.bias = torch.zeros(1, dimension, 1)

    def forward(self, x):
        C, T = x.shape[1], x.shape[2]
        count = C * torch.arange(1, T + 1, dtype=x.dtype, device=x.device)
        mean = x.sum(1).cumsum(1) / count
        var = x.pow(2).sum(1).cumsum(1) / count - mean.pow(2)
        y = (x - mean[:, None]) / (var[:, None] + self.eps).sqrt()
        return y * self.gain + self.bias
