"""A diffusion-style residual conv block: GroupNorm + SiLU around two convolutions, with a
time embedding broadcast over the spatial dims.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    def __init__(self, channels: int = 128, emb_dim: int = 512, groups: int = 32):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.emb = nn.Linear(emb_dim, channels)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.dropout = nn.Dropout(0.1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, t):
        h = F.silu(self.norm1(x))
        h = self.conv1(h)
        e = self.emb(F.silu(t))
        h = h + e[:, :, None, None]
        h = F.silu(self.norm2(h))
        h = self.conv2(self.dropout(h))
        return (x + h) * 0.7071

    @classmethod
    def example_inputs(cls):
        return torch.randn(8, 128, 64, 64), torch.randn(8, 512)
