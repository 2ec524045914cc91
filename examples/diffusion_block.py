"""A diffusion-UNet ResBlock as diffusion libraries write it: GroupNorm -> SiLU -> conv on one line,
the time embedding projected and broadcast over the spatial dims, a second GroupNorm -> SiLU ->
dropout -> conv, and a residual add through a 1x1 skip convolution that changes the channel count.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class DiffusionResBlock(nn.Module):  # fuselens: input=(4, 64, 32, 32) float32, input=(4, 256) float32
    def __init__(self, in_channels: int = 64, out_channels: int = 128, emb_dim: int = 256,
                 groups: int = 32, dropout: float = 0.1):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.emb_proj = nn.Linear(emb_dim, out_channels)
        self.norm2 = nn.GroupNorm(groups, out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.skip = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x, emb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.emb_proj(F.silu(emb))[:, :, None, None]
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.skip(x) + h
