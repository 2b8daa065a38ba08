"""speechbrain/speechbrain, speechbrain/lobes/models/dual_path.py: a gLN with ``weight`` and ``bias`` of shape
(C, 1) for (N, C, L) inputs ((C, 1, 1) for (N, C, K, S)) and an ``eps`` (1e-8); and a "CumulativeLayerNorm"
that is nn.LayerNorm(C, eps=1e-8) applied to every frame of (N, C, L): a per-frame norm."""
import torch
from torch import nn


class GlobalLayerNorm(nn.Module):
    def __init__(self, dim, shape, eps=1e-8, elementwise_affine=True):
        super().__init__()
        self.dim, self.eps = dim, eps
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim, *(1,) * (shape - 2)))
            self.bias = nn.Parameter(torch.zeros(dim, *(1,) * (shape - 2)))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        dims = tuple(range(1, x.dim()))
        mu = x.mean(dims, keepdim=True)
        y = (x - mu) / ((x - mu).pow(2).mean(dims, keepdim=True) + self.eps).sqrt()
        return y if self.weight is None else self.weight * y + self.bias


class CumulativeLayerNorm(nn.LayerNorm):
    def __init__(self, dim, elementwise_affine=True):
        super().__init__(dim, elementwise_affine=elementwise_affine, eps=1e-8)

    def forward(self, x):
        return super().forward(x.transpose(1, 2)).transpose(1, 2)
