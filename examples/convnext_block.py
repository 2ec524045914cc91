"""A ConvNeXt block: a depthwise 7×7 convolution, then a LayerNorm over the channels and an
inverted-bottleneck MLP run channels-last, a learned per-channel layer scale, and the residual
added back channels-first.  A stochastic-depth drop of the branch is an identity at evaluation.
"""

import torch
import torch.nn as nn


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int = 96, layer_scale: float = 1e-6, drop_path: float = 0.0):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale * torch.ones(dim))
        self.drop_path = nn.Dropout(drop_path)

    def forward(self, x):
        shortcut = x
        x = self.dwconv(x).permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        x = (self.gamma * x).permute(0, 3, 1, 2)  # back to (N, C, H, W)
        return shortcut + self.drop_path(x)

    @classmethod
    def example_inputs(cls):
        return (torch.randn(8, 96, 56, 56),)
